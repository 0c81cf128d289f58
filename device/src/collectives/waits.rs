//! How a wait polls and when it gives up: the slow-path look at the clock and the fault
//! words every [`SLOW_POLLS`] failed polls, and the record of why a call failed.

use super::desc_exchange::desc_fault;
use super::{
    Call, CollContext, IN_COLLECTIVE_SEEN, LEFT_SEEN, SLOW_POLLS, all_reduce, fault, guard,
    local_fault,
};
use crate::arch;
use crate::packet::LlPacket;

impl CollContext {
    /// On the send/receive context ([`coll`](Self::coll) set): the descriptor of the
    /// collective call rank `peer` is in, if it has entered the call this rank makes next
    /// (its descriptor for it is here), which this rank cannot reach while it waits in a
    /// send or receive.
    ///
    /// # Safety
    /// The context valid; `peer` a peer.
    #[inline(always)]
    unsafe fn peer_in_collective(&self, peer: u32) -> Option<[u64; 2]> {
        if self.coll.is_null() {
            return None;
        }
        // SAFETY: a set `coll` is a live context of the same ranks (field contract).
        let coll = unsafe { &*self.coll };
        if peer >= coll.nranks || peer == coll.rank {
            return None;
        }
        // SAFETY: the collectives' call counter, settled: none of their calls runs while
        // this rank's send/receive does (a rank's calls run in order).
        let seq = unsafe { all_reduce::read_counter(coll.state, 0) };
        let next = Call {
            seq,
            desc: [0; 2],
            failed: false,
            desc_pending: false,
        };
        // SAFETY: `peer` a peer of the collectives' context; its own packet scratch.
        unsafe { coll.read_desc(&next, peer) }
    }

    /// Fails send/receive `call`, whose wait for `peer` found it inside collective
    /// `theirs`, and leaves the send/receive group's descriptor in place of this rank's
    /// for that collective at every peer, so that every rank in it fails at once too (see
    /// [`fault::AT_P2P_COLLECTIVE`]).
    ///
    /// # Safety
    /// As for [`peer_in_collective`](Self::peer_in_collective), which returned `theirs`.
    #[cold]
    #[inline(never)]
    unsafe fn block_collective(&self, call: &Call, peer: u32, theirs: [u64; 2]) {
        // SAFETY: the context valid (caller contract).
        unsafe {
            self.fail(
                *call,
                fault::ABORTED,
                peer,
                theirs,
                fault::AT_P2P_COLLECTIVE,
            )
        };
        // SAFETY: set, as `peer_in_collective` found (caller contract).
        let coll = unsafe { &*self.coll };
        // SAFETY: as in `peer_in_collective`.
        let seq = unsafe { all_reduce::read_counter(coll.state, 0) };
        let instead = Call {
            seq,
            desc: call.desc,
            failed: false,
            desc_pending: false,
        };
        for q in (0..coll.nranks).filter(|&q| q != coll.rank) {
            // SAFETY: `q` a peer of the collectives' context.
            unsafe { coll.send_desc(&instead, q) };
        }
    }

    /// Whether a rank of the group left (closed its communicator) before it made `call`,
    /// which it therefore never will: the local copy of [`fault::LEFT`] (the fewest calls
    /// of a rank that left, plus one; taken at the looks at the host's abort word).
    ///
    /// # Safety
    /// The context valid.
    #[inline(always)]
    pub(super) unsafe fn after_left(&self, call: &Call) -> bool {
        // SAFETY: the local fault words are live and accessed atomically.
        let left = unsafe { arch::ld_relaxed_sys_u64(self.state.add(local_fault::LEFT)) };
        left != 0 && call.seq + 1 >= left
    }

    /// The slow-path look at the fault area of a wait for rank `peer` that started at `t0`
    /// (the clock now: `now`): 0 when the wait must give up (abort, timeout, a call that a
    /// rank which left never made, a rank waited for that left, or the call already failed
    /// on this rank), after recording why (first writer wins); else the `t0` to pass to the
    /// wait's next look.
    ///
    /// `t0` is the wait's own: 0 before its first look, which returns the clock. On a
    /// context with [`guard::PEERS`], a look that first finds `peer` among the ranks that
    /// left ([`local_fault::LEFT_PEERS`]) marks the wait ([`LEFT_SEEN`] in the returned `t0`)
    /// and lets it poll again: whatever `peer` wrote before it left is visible to a poll
    /// ordered after that look, so only a wait still unanswered at its next look gives up.
    /// (By value, not by reference: the waits' inline poll loops keep it in a register.)
    ///
    /// # Safety
    /// The context valid.
    #[cold]
    #[inline(never)]
    pub unsafe fn keep_waiting(&self, call: Call, peer: u32, place: u64, t0: u64) -> u64 {
        let now = arch::global_timer_ns();
        let t0 = if t0 == 0 {
            now.max(1) & !(LEFT_SEEN | IN_COLLECTIVE_SEEN)
        } else {
            t0
        };
        // SAFETY: the context is valid (caller contract); the local fault words are live.
        let (abort, stop, after_left, peer_left) = unsafe {
            (
                self.abort_word(now),
                arch::ld_relaxed_sys_u64(self.state.add(local_fault::STOP)),
                self.after_left(&call),
                self.peer_left(peer),
            )
        };
        let kind = if abort != 0 {
            fault::ABORTED
        } else if stop == call.seq + 1 {
            return 0;
        } else if place == fault::AT_PACKET
            // SAFETY: a packet wait is for a peer (`peer != rank`).
            && let Some(d) = unsafe { self.read_desc(&call, peer) }
            && d != call.desc
        {
            // One-shot: data that will never come because the peer called another size (or
            // waits in a send or receive: it may have left since, which says less).
            let (kind, place) = desc_fault(d, fault::AT_PACKET);
            // SAFETY: as above.
            unsafe { self.fail(call, kind, peer, d, place) };
            return 0;
        } else if after_left || (peer_left && t0 & LEFT_SEEN != 0) {
            // SAFETY: as above.
            unsafe { self.fail(call, fault::ABORTED, peer, [0; 2], fault::AT_LEFT) };
            return 0;
        } else if peer_left {
            // Poll once more, after this look (see above).
            return t0 | LEFT_SEEN;
        // SAFETY: as above.
        } else if let Some(theirs) = unsafe { self.peer_in_collective(peer) } {
            // Seen on two looks with a poll between them: whatever the peer did before its
            // collective (the send or receive this wait needs, had it made it) is visible
            // by the second.
            if t0 & IN_COLLECTIVE_SEEN == 0 {
                return t0 | IN_COLLECTIVE_SEEN;
            }
            // SAFETY: as above.
            unsafe { self.block_collective(&call, peer, theirs) };
            return 0;
        } else if now.wrapping_sub(t0 & !(LEFT_SEEN | IN_COLLECTIVE_SEEN)) > self.timeout_ns {
            fault::TIMEOUT
        } else {
            return t0;
        };
        // SAFETY: as above.
        unsafe { self.fail(call, kind, peer, [0; 2], place) };
        0
    }

    /// Whether rank `peer` left with its work done, as this rank's waits know it
    /// ([`local_fault::LEFT_PEERS`]; contexts with [`guard::PEERS`] only). Acquire: a poll
    /// after a `true` sees what `peer` wrote before it left.
    ///
    /// # Safety
    /// The context valid.
    #[inline(always)]
    unsafe fn peer_left(&self, peer: u32) -> bool {
        self.guards & guard::PEERS != 0
            // SAFETY: the local fault words are live and accessed atomically.
            && unsafe { arch::ld_acquire_sys_u64(self.state.add(local_fault::LEFT_PEERS)) }
                >> (peer & 63)
                & 1
                != 0
    }

    /// Polls the LL packet at `slot` (written by rank `peer`) until it carries `flag` and
    /// returns its data: inline polls, and every [`SLOW_POLLS`] failed ones
    /// [`keep_waiting`](Self::keep_waiting) (the clock, the fault words and, at
    /// [`fault::AT_PACKET`], the peer's descriptor). 0 once the call failed (the value is
    /// undefined then).
    ///
    /// # Safety
    /// `slot` a live packet slot of this context, accessed by packets only; `peer` a peer.
    #[inline(always)]
    pub(crate) unsafe fn poll_packet(
        &self,
        call: &mut Call,
        slot: *const LlPacket,
        flag: u32,
        peer: u32,
        place: u64,
    ) -> u64 {
        let (mut polls, mut t0) = (0u32, 0u64);
        loop {
            // SAFETY: caller contract.
            if let Some(v) = unsafe { LlPacket::read(slot, flag) } {
                return v;
            }
            if call.failed {
                return 0;
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(SLOW_POLLS) {
                // SAFETY: the context valid (caller contract).
                t0 = unsafe { self.keep_waiting(*call, peer, place, t0) };
                if t0 == 0 {
                    call.failed = true;
                    return 0;
                }
            }
            // Nothing on a GPU; on the host, hands the core over once the packet is late.
            arch::spin_backoff(polls);
        }
    }

    /// The abort word as this rank's waits see it: the local copy, and, at most once per
    /// [`local_fault::HOST_LOOK_NS`] for the whole rank (the thread that wins a
    /// compare-and-swap of the last look's time), the host's word, copied locally once set;
    /// at the same look, a record of a call that gave up for good counts as an abort
    /// ([`local_fault::AFTER_FAILURE`]).
    ///
    /// # Safety
    /// The context valid.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn abort_word(&self, now: u64) -> u64 {
        // SAFETY: the local fault words are live, local and accessed atomically.
        unsafe {
            let local = arch::ld_relaxed_sys_u64(self.state.add(local_fault::ABORT));
            if local != 0 {
                return local;
            }
            let last_at = self.state.add(local_fault::LAST_LOOK);
            let last = arch::ld_relaxed_sys_u64(last_at);
            if now.wrapping_sub(last) < local_fault::HOST_LOOK_NS
                || arch::atomic_cas_relaxed_gpu_u64(last_at, last, now) != last
            {
                return 0;
            }
            // The fault area is live (context contract).
            let host = arch::ld_relaxed_sys_u64(self.fault.add(fault::ABORT));
            if host != 0 {
                arch::st_release_sys_u64(self.state.add(local_fault::ABORT), host);
            }
            if self.guards & guard::LEFT != 0 {
                let left = arch::ld_relaxed_sys_u64(self.fault.add(fault::LEFT));
                if left != 0 {
                    arch::st_relaxed_sys_u64(self.state.add(local_fault::LEFT), left);
                }
            }
            if self.guards & guard::PEERS != 0 {
                // Acquire, then release: a wait that reads the local copy with acquire
                // (`peer_left`) is ordered after the host's news, which came after the
                // departed rank's last writes.
                let left = arch::ld_acquire_sys_u64(self.fault.add(fault::LEFT_PEERS));
                if left != 0 {
                    arch::st_release_sys_u64(self.state.add(local_fault::LEFT_PEERS), left);
                }
            }
            if host != 0 {
                return host;
            }
            // A call of this rank gave up for good (its record stays): every later wait
            // gives up too (`AFTER_FAILURE`). The record's first writer keeps it, so the
            // host still reports that call's failure.
            let record = arch::ld_acquire_sys_u64(self.fault.add(fault::RECORD));
            if matches!(record, fault::TIMEOUT | fault::ABORTED) {
                arch::st_release_sys_u64(
                    self.state.add(local_fault::ABORT),
                    local_fault::AFTER_FAILURE,
                );
                return local_fault::AFTER_FAILURE;
            }
            0
        }
    }

    /// Records that `call` failed on this rank (`kind`, the peer and its descriptor, what
    /// was waited for) and stops the call's other waits on this rank: the first failing
    /// thread of the call claims it in the local [`STOP`](local_fault::STOP) word and tries
    /// the record (first writer wins); the call's other failing threads stop at that claim.
    ///
    /// The claim is a compare-and-swap in the rank's own memory. Before it, every failing
    /// thread added to the fault area's claim word, an atomic on host memory across PCIe:
    /// once a call had given up for good, each call queued behind it on the stream had
    /// thousands of threads give up at once, one such atomic each, and a rank with a
    /// stream full of calls spent seconds draining them (8 s between a 2 s device timeout
    /// and the error, on one H100).
    ///
    /// # Safety
    /// The context valid.
    #[cold]
    #[inline(never)]
    pub unsafe fn fail(&self, call: Call, kind: u64, peer: u32, theirs: [u64; 2], place: u64) {
        let stop = self.state.wrapping_add(local_fault::STOP);
        let mine = call.seq + 1;
        // SAFETY: the local fault words are live and accessed atomically (context contract).
        let mut seen = unsafe { arch::ld_relaxed_sys_u64(stop) };
        // Another call's threads may write the word too (a kernel of another stream): only
        // this call's value ends the loop without the claim.
        while seen != mine {
            // SAFETY: as above.
            let was = unsafe { arch::atomic_cas_relaxed_gpu_u64(stop, seen, mine) };
            if was == seen {
                // SAFETY: the context valid (caller contract).
                unsafe { self.record(call.seq, kind, peer, call.desc, theirs, place) };
                return;
            }
            seen = was;
        }
    }

    /// Writes a record into the fault area if none is there (first writer wins), without
    /// stopping the call's other waits: for a failure that concerns one operation only (a
    /// send and a receive of different sizes, see [`send_recv`](super::send_recv)). `own`
    /// and `theirs` are the two sides' descriptors.
    ///
    /// # Safety
    /// The context valid.
    #[cold]
    #[inline(never)]
    pub unsafe fn record(
        &self,
        seq: u64,
        kind: u64,
        peer: u32,
        own: [u64; 2],
        theirs: [u64; 2],
        place: u64,
    ) {
        let f = self.fault;
        // SAFETY: the fault area is live and FAULT_WORDS long (context contract); the
        // claim makes this thread the only writer of the details until the host clears the
        // record, which it does only while no kernel of this communicator runs.
        unsafe {
            if arch::atomic_add_relaxed_sys_u64(f.add(fault::CLAIM), 1) == 0 {
                core::ptr::write_volatile(f.add(fault::SEQ), seq);
                core::ptr::write_volatile(f.add(fault::PEER), peer as u64);
                core::ptr::write_volatile(f.add(fault::OWN), own[0]);
                core::ptr::write_volatile(f.add(fault::OWN + 1), own[1]);
                core::ptr::write_volatile(f.add(fault::THEIRS), theirs[0]);
                core::ptr::write_volatile(f.add(fault::THEIRS + 1), theirs[1]);
                core::ptr::write_volatile(f.add(fault::PLACE), place);
                arch::st_release_sys_u64(f.add(fault::RECORD), kind);
            }
        }
    }

    /// Polls `ready` until it returns `true`, looking at the clock and the fault area every
    /// [`SLOW_POLLS`] failed polls ([`keep_waiting`](Self::keep_waiting)); `false` (and
    /// `call.failed` set) when the wait gave up, at once when the call already failed.
    ///
    /// # Safety
    /// The context valid.
    #[inline(always)]
    pub unsafe fn wait_until(
        &self,
        call: &mut Call,
        peer: u32,
        place: u64,
        mut ready: impl FnMut() -> bool,
    ) -> bool {
        if call.failed {
            return false;
        }
        let (mut polls, mut t0) = (0u32, 0u64);
        while !ready() {
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(SLOW_POLLS) {
                // SAFETY: caller contract.
                t0 = unsafe { self.keep_waiting(*call, peer, place, t0) };
                if t0 == 0 {
                    call.failed = true;
                    return false;
                }
            }
            arch::spin_backoff(polls);
        }
        true
    }
}
