//! The context every collective kernel gets by value ([`CollContext`]), one call of a
//! kernel as a thread sees it ([`Call`]), and a call's entry, start and end.

use super::{MAX_RANKS, all_reduce, desc, fault, guard};
use crate::arch;
use crate::channel::DevConn;

/// What the collective kernels need to reach every rank, passed by value (`#[repr(C)]`,
/// `Copy`, 352 bytes). Built by the host (`mscclpp_host::collectives`); kernels trust it,
/// which is why launching them is `unsafe`. Entries for ranks ≥ `nranks` are null; the own
/// rank's `peer_*` entries are unused.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollContext {
    /// This rank.
    pub rank: u32,
    /// Number of ranks (1..=[`MAX_RANKS`]).
    pub nranks: u32,
    /// How long a wait spins before the kernel traps.
    pub timeout_ns: u64,
    /// Bytes of each of the two regions of every rank's scratch (equal on all ranks; a
    /// multiple of 16). A scratch holds `2 * scratch_len` bytes: the first region is shared
    /// by two-shot, read-reduce, all-gather and the proxy paths, the second is all-pairs'
    /// own (see `all_reduce::all_pairs`).
    pub scratch_len: u64,
    /// Bytes of each packet scratch (equal everywhere; a multiple of 32).
    pub packets_len: u64,
    /// This rank's scratch (`2 * scratch_len` bytes).
    pub scratch: *mut u8,
    /// Each rank's scratch, mapped here (`2 * scratch_len` bytes).
    pub peer_scratch: [*mut u8; MAX_RANKS],
    /// `packets_in[p]`: this rank's packet scratch that rank `p` writes into.
    pub packets_in: [*mut u8; MAX_RANKS],
    /// `packets_out[p]`: rank `p`'s packet scratch for this rank, mapped here.
    pub packets_out: [*mut u8; MAX_RANKS],
    /// This rank's semaphore array (`SEMAPHORE_WORDS` counters, index `src * MAX_BLOCKS +
    /// block`), which peers add to.
    pub sems: *mut u64,
    /// Each rank's semaphore array, mapped here.
    pub peer_sems: [*mut u64; MAX_RANKS],
    /// This rank's expected words, one per semaphore (local, zeroed at first).
    pub expected: *mut u64,
    /// This rank's state words ([`STATE_WORDS`](super::STATE_WORDS), local, zeroed at
    /// first).
    pub state: *mut u64,
    /// `conns[b * nranks + p]`: lane `b`'s proxy channel to rank `p`, over the scratch on
    /// both sides (an array of `lanes * nranks` handles, `lanes` at most
    /// [`proxy::MAX_PROXY_LANES`](super::proxy::MAX_PROXY_LANES) and at least the grid of
    /// every proxy kernel; the own entries are unused; block `b` of a proxy kernel uses
    /// lane `b`). Null when proxy channels are not set up.
    pub conns: *const DevConn<'static>,
    /// The fault area ([`FAULT_WORDS`](super::FAULT_WORDS) words, see [`fault`]): memory
    /// that this rank's host and kernels both read and write while kernels run (mapped
    /// pinned host memory on a GPU). The host raises [`fault::ABORT`] in it; kernels record
    /// why a call failed.
    pub fault: *mut u64,
    /// Which of the optional fault checks this context's kernels make ([`guard`] bits).
    pub guards: u64,
    /// On the send/receive context of one host: the collectives' context of the same
    /// ranks, whose descriptors show a peer that is inside a collective call, so that a
    /// send or receive waiting for such a peer fails at once (see
    /// [`fault::AT_P2P_COLLECTIVE`]). Null on every other context.
    pub coll: *const CollContext,
}

const _: () = assert!(core::mem::size_of::<CollContext>() == 352);

// SAFETY: addresses and numbers only; the memory behind them is accessed under the
// protocols of this module.
unsafe impl Send for CollContext {}
// SAFETY: as above.
unsafe impl Sync for CollContext {}

/// One call of a collective kernel as one thread sees it: the call's sequence number (one
/// counter of every collective kernel of this rank, [`CollContext::state`]), its
/// descriptor, and whether a wait of this thread (or, after a block-wide check, of its
/// block) failed. Once failed, the thread's waits return `false` at once.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// The call's sequence number (0 for the first call of a communicator).
    pub seq: u64,
    /// This rank's descriptor: `[n, tag]` (see [`desc`]).
    pub desc: [u64; 2],
    /// A wait failed (or the ranks disagree); skip the remaining work.
    pub failed: bool,
    /// The peers' descriptors are still to be checked, at the first barrier (see
    /// [`CollContext::begin_deferred`]).
    pub desc_pending: bool,
}

impl Call {
    /// The LL flag of the call's packets (never 0).
    #[inline(always)]
    pub fn flag(&self) -> u32 {
        (self.seq % u32::MAX as u64) as u32 + 1
    }
}

impl CollContext {
    /// The entry of a kernel the host may launch with programmatic stream serialization
    /// (programmatic dependent launch, PDL, sm_90; `mscclpp_host` does for one-shot
    /// all-reduce and packet all-gather unless `MSCCLPP_PDL=0`): such a kernel may start
    /// while the previous kernel on the stream still runs. Here it first touches only what
    /// no kernel writes (the context's lines into L1, the call counters' line into L2), then
    /// waits for the previous kernel's completion ([`arch::grid_dependency_wait`]), then
    /// lets the next kernel launch ([`arch::launch_dependents`]), whose start thereby
    /// overlaps this call. On the host and on older arches only the prefetch hints remain
    /// (nothing).
    ///
    /// # Safety
    /// The context valid; called by every thread before it accesses any memory an earlier
    /// kernel may write (reading the kernel's parameters and writing the block's shared
    /// memory may come first, as the p2p kernel's copy of its operations does).
    #[inline(always)]
    pub unsafe fn dependent_launch_entry(&self) {
        let base = self as *const CollContext as *const u8;
        let mut off = 0;
        while off < core::mem::size_of::<CollContext>() {
            arch::prefetch_l1(base.wrapping_add(off));
            off += 128;
        }
        arch::prefetch_l2(self.state as *const u8);
        arch::grid_dependency_wait();
        arch::launch_dependents();
    }

    /// Starts call `seq` of a kernel: reads the call counter as block `block` sees it.
    ///
    /// # Safety
    /// The context valid; `block < MAX_BLOCKS`; every block of the grid calls
    /// [`finish`](Self::finish) once at the end.
    #[inline(always)]
    pub unsafe fn call(&self, block: u32, n: u64, tag: u64) -> Call {
        // SAFETY: the call counter is the first of the state's two (caller contract).
        let seq = unsafe { all_reduce::read_counter(self.state, block) };
        // SAFETY: the fault area is live (context contract); read only when guarded.
        let broken = self.guards & guard::CROSS != 0
            && unsafe { arch::ld_relaxed_sys_u64(self.fault.add(fault::CROSS_BROKEN)) } != 0;
        Call {
            seq,
            desc: [n, if broken { desc::BROKEN } else { tag }],
            failed: false,
            desc_pending: false,
        }
    }

    /// Ends a call: advances the call counter (every thread of every block, once).
    ///
    /// # Safety
    /// As for [`call`](Self::call).
    #[inline(always)]
    pub unsafe fn finish(&self, call: &Call) {
        let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
        let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
        // SAFETY: caller contract.
        unsafe { all_reduce::advance_counter(self.state, call.seq + 1, t, nt, b, nb) };
    }
}
