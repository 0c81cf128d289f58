//! Semaphore signals and waits between the same block of two ranks, the block's agreement
//! on a failure, and the barrier of a block with the same block of every rank.

use super::{Call, CollContext, MAX_BLOCKS, MAX_RANKS, fault};
use crate::arch;

/// Calls `f(p)` for every rank `p` that thread `thread` of its block stands for in the
/// per-rank duties (descriptors, barrier signals and waits, the block's agreement): ranks
/// `thread`, `thread + block_dim_x()`, ... below `nranks`. GPU blocks have at least
/// `nranks` threads, so a thread stands for its own index at most; the Host backend runs
/// the all-reduce kernels on blocks of one thread, which stands for every rank (emulated
/// threads that wait for each other at block barriers cost a scheduler round each when
/// ranks outnumber cores).
#[inline(always)]
pub(crate) fn for_ranks_of(thread: u32, nranks: u32, mut f: impl FnMut(u32)) {
    if !arch::NARROW_BLOCKS {
        if thread < nranks {
            f(thread);
        }
        return;
    }
    let nt = arch::block_dim_x();
    let mut p = thread;
    while p < nranks {
        f(p);
        p += nt;
    }
}

impl CollContext {
    /// Signals rank `peer`'s semaphore of this rank and `block`, with release semantics
    /// (publishes what this thread, and its block before a barrier, did).
    ///
    /// # Safety
    /// `peer < nranks`, `peer != rank`, `block < MAX_BLOCKS`; the context valid.
    #[inline(always)]
    pub unsafe fn signal(&self, peer: u32, block: u32) {
        let idx = self.rank as usize * MAX_BLOCKS + block as usize;
        // SAFETY: the peer's semaphore array is mapped and holds SEMAPHORE_WORDS counters
        // (caller contract); release at system scope as in `DeviceSemaphore::signal`.
        unsafe { arch::red_add_release_sys_u64(self.peer_sems[peer as usize].add(idx), 1) };
    }

    /// Waits for rank `peer`'s next signal to this rank and `block` (acquire, as
    /// `DeviceSemaphore::wait`); `false` when the wait gave up (abort, timeout, or the call
    /// failed on this rank: see [`wait_until`](Self::wait_until)), consuming nothing.
    ///
    /// # Safety
    /// As for [`signal`](Self::signal); one thread at a time per (peer, block).
    #[inline(always)]
    pub unsafe fn wait(&self, call: &mut Call, peer: u32, block: u32) -> bool {
        let idx = peer as usize * MAX_BLOCKS + block as usize;
        // SAFETY: our own counter and expected word (caller contract), one waiter.
        let (inbound, expected) = unsafe { (self.sems.add(idx), self.expected.add(idx)) };
        // SAFETY: as above.
        let want = unsafe { *expected } + 1;
        // SAFETY: as above; acquire at system scope pairs with the peer's release add.
        let ok = unsafe {
            self.wait_until(call, peer, fault::AT_SEMAPHORE, || {
                arch::ld_acquire_sys_u64(inbound) >= want
            })
        };
        if ok {
            // SAFETY: as above.
            unsafe { *expected = want };
        }
        ok
    }

    /// Makes `call.failed` the same on every thread of the block: each thread publishes its
    /// own in the slots of the ranks it stands for (`for_ranks_of`: the threads that
    /// wait), after which the block syncs and every thread takes the OR. Returns
    /// `!call.failed`.
    ///
    /// Called by every thread of the block, with no other use of the slots in between
    /// (a `sync_threads` separates two uses: every caller of this syncs before it).
    #[inline(always)]
    pub fn block_agree(&self, call: &mut Call, thread: u32) -> bool {
        let slots = crate::shared_array!(COLL_FAILED: u32; MAX_RANKS);
        let failed = call.failed as u32;
        for_ranks_of(thread, self.nranks, |p| {
            // SAFETY: slot p < nranks <= MAX_RANKS, this thread's own.
            unsafe { slots.add(p as usize).write_volatile(failed) };
        });
        arch::sync_threads();
        let mut any = 0;
        for q in 0..self.nranks as usize {
            // SAFETY: written before the barrier above by thread q.
            any |= unsafe { slots.add(q).read_volatile() };
        }
        call.failed = any != 0;
        !call.failed
    }

    /// A barrier of block `block` with the same block of every other rank: the block's
    /// threads sync, thread `p` signals rank `p` and waits for its signal (a block of fewer
    /// threads: `for_ranks_of`), the block syncs again. What the block did before happens
    /// before what the peers' blocks do after.
    /// Returns `false` on every thread of the block when a wait of the block gave up (the
    /// call failed: skip the rest; nothing is signalled once failed).
    ///
    /// # Safety
    /// Called by every thread of the block; `block < MAX_BLOCKS`; the context valid.
    #[inline(always)]
    pub unsafe fn barrier(&self, call: &mut Call, block: u32, thread: u32) -> bool {
        arch::sync_threads();
        if call.desc_pending {
            // SAFETY: every thread of the block, just synced (caller contract).
            if !unsafe { self.check_pending(call, thread) } {
                return false;
            }
            // Every thread has read the slots of that agreement before the agreement below
            // writes them again: without this, a thread whose wait below failed at once
            // (say on an abort) could overwrite its slot while a slower thread still read
            // the first agreement, which then saw a failure the others did not, left the
            // kernel early and left them waiting at a barrier it never reached (seen on CPU
            // threads: a survivor of a killed rank hung in `a_killed_rank_is_named_...`).
            arch::sync_threads();
        }
        if !call.failed {
            // Every signal before the first wait: a thread that stands for several peers
            // must not make one wait for its signal behind another's.
            for_ranks_of(thread, self.nranks, |p| {
                if p != self.rank {
                    // SAFETY: p is a valid peer.
                    unsafe { self.signal(p, block) };
                }
            });
            for_ranks_of(thread, self.nranks, |p| {
                if p != self.rank && !call.failed {
                    // SAFETY: p is a valid peer; one waiter per (peer, block).
                    unsafe { self.wait(call, p, block) };
                }
            });
        }
        self.block_agree(call, thread)
    }
}
