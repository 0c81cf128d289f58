//! The call descriptors between the ranks (see the [module](super), "Calls, descriptors
//! and faults"): sending this rank's, waiting for and checking the peers', and the start of
//! a semaphore kernel's call that does both.

use super::barrier::for_ranks_of;
use super::{Call, CollContext, DESC_BYTES, MAX_RANKS, SLOW_POLLS, desc, fault};
use crate::arch;
use crate::packet::LlPacket;

/// The record of a collective whose peer's descriptor `theirs` differs from its own, found
/// at `place`: a mismatch, or, where the peer left a send/receive group's descriptor
/// instead (it waits in a send or receive, see [`fault::AT_P2P_COLLECTIVE`]), an abort.
#[inline(always)]
pub(super) fn desc_fault(theirs: [u64; 2], place: u64) -> (u64, u64) {
    if desc::field(theirs[1], desc::KIND_SHIFT) == desc::SEND_RECV {
        (fault::ABORTED, fault::AT_P2P_COLLECTIVE)
    } else {
        (fault::MISMATCH, place)
    }
}

impl CollContext {
    /// The descriptor slot of parity `seq & 1` in packet scratch `base`.
    #[inline(always)]
    fn desc_slot(&self, base: *mut u8, seq: u64) -> *mut LlPacket {
        base.wrapping_add((self.packets_len - DESC_BYTES + 32 * (seq & 1)) as usize)
            as *mut LlPacket
    }

    /// Writes this rank's descriptor of `call` into rank `peer`'s packet scratch.
    ///
    /// # Safety
    /// `peer < nranks`, `peer != rank`; the context valid.
    #[inline(always)]
    pub unsafe fn send_desc(&self, call: &Call, peer: u32) {
        let slot = self.desc_slot(self.packets_out[peer as usize & (MAX_RANKS - 1)], call.seq);
        // SAFETY: the descriptor area at the end of the peer's packet scratch for this
        // rank, accessed by packets only.
        unsafe {
            LlPacket::write(slot, call.desc[0], call.flag());
            LlPacket::write(slot.add(1), call.desc[1], call.flag());
        }
    }

    /// Rank `peer`'s descriptor of `call` if it has arrived.
    ///
    /// # Safety
    /// As for [`send_desc`](Self::send_desc).
    #[inline(always)]
    pub(super) unsafe fn read_desc(&self, call: &Call, peer: u32) -> Option<[u64; 2]> {
        let slot = self.desc_slot(self.packets_in[peer as usize & (MAX_RANKS - 1)], call.seq);
        // SAFETY: as in send_desc, this rank's own packet scratch.
        unsafe {
            match (
                LlPacket::read(slot, call.flag()),
                LlPacket::read(slot.add(1), call.flag()),
            ) {
                (Some(a), Some(b)) => Some([a, b]),
                _ => None,
            }
        }
    }

    /// Waits for rank `peer`'s descriptor of `call` and compares it with this rank's;
    /// records a mismatch. Stops only on abort, timeout, a call that a rank which left
    /// never made, or a failure that leaves the collectives unusable (a timeout or an abort
    /// of this call or an earlier one, which the waits' look at the abort word counts as an
    /// abort: its record is never cleared, so no later call runs); not on a mismatch found
    /// by another thread: having read every peer's descriptor, a
    /// rank knows its peers have finished their previous calls, which the scratch reuse of
    /// the next, matching call relies on. `false` when the descriptors differ or the wait
    /// failed.
    ///
    /// # Safety
    /// As for [`send_desc`](Self::send_desc).
    #[inline(always)]
    pub unsafe fn check_desc(&self, call: &mut Call, peer: u32) -> bool {
        // SAFETY: caller contract.
        let first = unsafe { self.read_desc(call, peer) };
        let theirs = match first {
            Some(d) => d,
            // SAFETY: as above.
            None => match unsafe { self.wait_desc(*call, peer) } {
                Some(d) => d,
                None => {
                    call.failed = true;
                    return false;
                }
            },
        };
        if theirs != call.desc {
            let (kind, place) = desc_fault(theirs, fault::AT_DESCRIPTOR);
            // SAFETY: the context valid.
            unsafe { self.fail(*call, kind, peer, theirs, place) };
            call.failed = true;
            return false;
        }
        true
    }

    /// The slow path of [`check_desc`](Self::check_desc).
    ///
    /// # Safety
    /// As for [`send_desc`](Self::send_desc).
    #[cold]
    #[inline(never)]
    unsafe fn wait_desc(&self, call: Call, peer: u32) -> Option<[u64; 2]> {
        let mut polls = 0u32;
        let mut start = None;
        loop {
            // SAFETY: caller contract.
            if let Some(d) = unsafe { self.read_desc(&call, peer) } {
                return Some(d);
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(SLOW_POLLS) {
                let now = arch::global_timer_ns();
                let t0 = *start.get_or_insert(now);
                // SAFETY: the context is valid (caller contract).
                let abort = unsafe { self.abort_word(now) };
                // A wait of this call (or an earlier one) that gave up for good counts as an
                // abort here too (`abort_word`): before, this wait ran to a timeout of its
                // own after the packet wait's, doubling the time a stalled peer held this
                // rank.
                // SAFETY: as above.
                let (kind, place) = if abort != 0 {
                    (fault::ABORTED, fault::AT_DESCRIPTOR)
                } else if unsafe { self.after_left(&call) } {
                    (fault::ABORTED, fault::AT_LEFT)
                } else if now.wrapping_sub(t0) > self.timeout_ns {
                    (fault::TIMEOUT, fault::AT_DESCRIPTOR)
                } else {
                    (0, 0)
                };
                if kind != 0 {
                    // SAFETY: as above.
                    unsafe { self.fail(call, kind, peer, [0; 2], place) };
                    return None;
                }
            }
            arch::spin_backoff(polls);
        }
    }

    /// Sends this rank's descriptor of `call` to every peer thread `thread` of its block
    /// stands for (`for_ranks_of`: rank `thread` on a GPU).
    ///
    /// # Safety
    /// The context valid.
    #[inline(always)]
    pub(crate) unsafe fn send_descs(&self, call: &Call, thread: u32) {
        for_ranks_of(thread, self.nranks, |p| {
            if p != self.rank {
                // SAFETY: p is a peer; the context valid (caller contract).
                unsafe { self.send_desc(call, p) };
            }
        });
    }

    /// Waits for and checks ([`check_desc`](Self::check_desc)) the descriptor of every peer
    /// thread `thread` of its block stands for (`for_ranks_of`).
    ///
    /// # Safety
    /// The context valid.
    #[inline(always)]
    pub(crate) unsafe fn check_descs(&self, call: &mut Call, thread: u32) {
        for_ranks_of(thread, self.nranks, |p| {
            if p != self.rank {
                // SAFETY: p is a peer; the context valid (caller contract).
                unsafe { self.check_desc(call, p) };
            }
        });
    }

    /// The start of a semaphore kernel's call (every thread of every block): block 0's
    /// threads `p < nranks` (a block of fewer threads: `for_ranks_of`) send this rank's
    /// descriptor to rank `p`; every block's threads
    /// `p` wait for rank `p`'s and compare; the block agrees. `false` (every thread) when
    /// the ranks disagree or a wait gave up: the kernel then skips every access to shared
    /// state (no signal, so the semaphores stay consistent on all ranks: every rank sees
    /// the same descriptors, so either all proceed or none does).
    ///
    /// # Safety
    /// Every thread of the block; the context valid.
    #[inline(always)]
    pub unsafe fn begin(&self, call: &mut Call, block: u32, thread: u32) -> bool {
        if block == 0 {
            // SAFETY: the context valid (caller contract).
            unsafe { self.send_descs(call, thread) };
        }
        // SAFETY: the context valid (caller contract).
        unsafe { self.check_descs(call, thread) };
        arch::sync_threads();
        self.block_agree(call, thread)
    }

    /// [`begin`](Self::begin) for kernels whose first access to shared state is a write into
    /// the peers' scratch followed by a [`barrier`](Self::barrier): block 0 sends the
    /// descriptors now, and the first barrier checks the peers' before it signals (so the
    /// descriptors' one-way trip overlaps the first puts). On a mismatch nobody signals, as
    /// with `begin`; the puts already made land in slots the peers read only after a barrier
    /// of a later call, which rewrites them first. A kernel with no barrier must call
    /// [`check_pending`](Self::check_pending) before it ends.
    ///
    /// # Safety
    /// As for [`begin`](Self::begin).
    #[inline(always)]
    pub unsafe fn begin_deferred(&self, call: &mut Call, block: u32, thread: u32) {
        if block == 0 {
            // SAFETY: the context valid (caller contract).
            unsafe { self.send_descs(call, thread) };
        }
        call.desc_pending = true;
    }

    /// Checks the peers' descriptors if [`begin_deferred`](Self::begin_deferred) left them
    /// pending: threads `p < nranks` wait for rank `p`'s, the block agrees. `false` (every
    /// thread) when the ranks disagree or a wait gave up.
    ///
    /// # Safety
    /// Every thread of the block, after a `sync_threads` since the last use of
    /// [`block_agree`](Self::block_agree); the context valid.
    #[inline(always)]
    pub unsafe fn check_pending(&self, call: &mut Call, thread: u32) -> bool {
        if !call.desc_pending {
            return !call.failed;
        }
        call.desc_pending = false;
        // SAFETY: the context valid (caller contract).
        unsafe { self.check_descs(call, thread) };
        arch::sync_threads();
        self.block_agree(call, thread)
    }
}
