//! Collectives (DESIGN §8): all-reduce and all-gather written with the memory-channel
//! primitives, for up to [`MAX_RANKS`] ranks whose memory is mapped into each other.
//!
//! # Shared state
//!
//! Every rank registers, once, a *scratch* buffer that all peers map, one LL-packet scratch
//! per peer pair (from the memory channel's packet buffers), and an array of semaphore
//! counters ([`MAX_RANKS`] × [`MAX_BLOCKS`]: one per source rank and block index) that all
//! peers map. [`CollContext`] carries these addresses to the kernels by value. The user's
//! send and receive buffers are never mapped by peers: data reaches a peer through its
//! scratch, so calls take any device pointers and need no registration (and so no host
//! work that would break CUDA-graph capture).
//!
//! # Algorithms
//!
//! - [`all_reduce::one_shot`]: every rank writes its whole input as LL packets into each
//!   peer's packet scratch and reduces what it receives. One kernel, no semaphore; the
//!   packet flag is a per-rank call counter kept in device memory ([`CollContext::state`]),
//!   advanced with no synchronisation between blocks (one word for one-block calls, one
//!   copy per block index for others), and the scratch has two halves used on alternate
//!   calls, so a call never overwrites packets a peer may still read.
//! - [`all_reduce::two_shot`]: reduce-scatter (each rank puts the peers' chunks of its input
//!   into their scratch), a reduction of the own chunk (written to the output and to the
//!   own scratch), an all-gather (each rank gets the peers' reduced chunks from their
//!   scratch), pipelined through the scratch in rounds.
//! - [`all_reduce::all_pairs`]: each rank puts its whole input into every peer's scratch
//!   (one slot per source rank) and reduces all of it locally; one barrier per round. For
//!   two ranks it moves the same bytes as two-shot with two barriers less. It has its own
//!   region of the scratch, in two halves used on alternate rounds (a round counter kept
//!   like one-shot's), so it needs no barrier at the end of a call.
//! - [`all_gather::all_gather`]: each rank puts its input into its slot of every peer's
//!   scratch, and each rank copies the peers' slots out into its output; in rounds, each
//!   block's share cut into pieces whose puts and copies overlap.
//! - [`reduce_scatter`], [`reduce`], [`broadcast`], [`all_to_all`]: each with an LL path
//!   (packets, no barrier, on one-shot's call counter and halves through [`ll`]; the rooted
//!   ones exchange a token per peer pair) and a put path (the peers' scratch in rounds, per-block
//!   barriers, a last barrier like two-shot).
//! - [`send_recv`]: point-to-point sends and receives, alone or grouped into one launch,
//!   through a separate p2p scratch with its own semaphores (a second context).
//! - [`proxy`]: both collectives over proxy channels ([`DevConn`]): the copy engine (or
//!   RDMA) moves the data between scratches, for peers whose memory cannot be mapped.
//!
//! Reductions add in rank order 0, 1, …, n−1 on every rank, so all ranks get bit-identical
//! results.
//!
//! # Ordering between calls
//!
//! Every semaphore kernel but all-pairs ends with no peer still touching the scratch region
//! they share (a last barrier), so consecutive calls of any of them may share it; all-pairs
//! alternates halves of its own region instead. Calls on one rank are ordered by its
//! stream. All ranks must make the same sequence of calls with the same
//! sizes (grids are derived from them), as with NCCL.

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod broadcast;
pub mod ll;
pub mod proxy;
pub mod reduce;
pub mod reduce_scatter;
pub mod send_recv;
pub mod types;

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;
#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests_more;

pub use types::{Bf16, F16, F32, F64, I8, I32, I64, Reduce, U8, U32, U64, op};

use crate::arch;
use crate::channel::DevConn;
use crate::semaphore::wait_inbound;

/// Most ranks a [`CollContext`] holds.
pub const MAX_RANKS: usize = 8;
/// Most blocks a semaphore kernel may be launched with (semaphores per source rank).
pub const MAX_BLOCKS: usize = 128;
/// `u64` words of the local state ([`CollContext::expected`] then [`CollContext::state`]).
pub const EXPECTED_WORDS: usize = MAX_RANKS * MAX_BLOCKS;
/// `u64` words of one counter of [`CollContext::state`]: one for calls of one block, then
/// one copy per block index (see `all_reduce::advance_counter`).
pub const COUNTER_WORDS: usize = 1 + MAX_BLOCKS;
/// `u64` words of [`CollContext::state`]: the one-shot call counter, then the all-pairs
/// round counter.
pub const STATE_WORDS: usize = 2 * COUNTER_WORDS;
/// `u64` words of the semaphore array each rank exposes.
pub const SEMAPHORE_WORDS: usize = MAX_RANKS * MAX_BLOCKS;

/// What the collective kernels need to reach every rank, passed by value (`#[repr(C)]`,
/// `Copy`, 328 bytes). Built by the host (`mscclpp_host::collectives`); kernels trust it,
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
    /// This rank's state words ([`STATE_WORDS`], local, zeroed at first).
    pub state: *mut u64,
    /// `conns[p]`: the proxy channel to rank `p`, over the scratch on both sides (an array
    /// of `nranks` handles; the own entry is unused). Null when proxy channels are not set up.
    pub conns: *const DevConn,
}

const _: () = assert!(core::mem::size_of::<CollContext>() == 328);

// SAFETY: addresses and numbers only; the memory behind them is accessed under the
// protocols of this module.
unsafe impl Send for CollContext {}
// SAFETY: as above.
unsafe impl Sync for CollContext {}

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

    /// Waits for rank `peer`'s next signal to this rank and `block`; traps on timeout.
    ///
    /// # Safety
    /// As for [`signal`](Self::signal); one thread at a time per (peer, block).
    #[inline(always)]
    pub unsafe fn wait(&self, peer: u32, block: u32) {
        let idx = peer as usize * MAX_BLOCKS + block as usize;
        // SAFETY: our own counter and expected word (caller contract), one waiter.
        let ok =
            unsafe { wait_inbound(self.sems.add(idx), self.expected.add(idx), self.timeout_ns) };
        if !ok {
            arch::trap();
        }
    }

    /// A barrier of block `block` with the same block of every other rank: the block's
    /// threads sync, thread `p` signals rank `p` and waits for its signal, the block syncs
    /// again. What the block did before happens before what the peers' blocks do after.
    ///
    /// # Safety
    /// Called by every thread of the block (`block_dim_x() >= nranks`); `block <
    /// MAX_BLOCKS`; the context valid.
    #[inline(always)]
    pub unsafe fn barrier(&self, block: u32, thread: u32) {
        arch::sync_threads();
        if thread < self.nranks && thread != self.rank {
            // SAFETY: thread is a valid peer; one waiter per (peer, block).
            unsafe {
                self.signal(thread, block);
                self.wait(thread, block);
            }
        }
        arch::sync_threads();
    }
}

/// The `k`-th peer (`k < nranks - 1`) that lane `lane` (a block or unit index) of rank `rank`
/// talks to: every peer once over `k`, and for each `k` a different peer per lane and per rank,
/// so that at any moment the ranks' writes spread over every destination instead of all
/// ranks writing to rank 0 first (on NVSwitch machines that incast halved the bandwidth of
/// more than two ranks).
#[inline(always)]
pub fn peer_at(rank: u32, nranks: u32, lane: u32, k: u32) -> u32 {
    let others = nranks - 1;
    (rank + 1 + (lane % others + k) % others) % nranks
}

/// For `k` in `0..nranks`: [`peer_at`] for `k < nranks - 1`, then `rank` itself, so loops
/// written over all ranks (skipping the own) visit the peers in rotated order.
#[inline(always)]
pub fn rotated_rank(rank: u32, nranks: u32, lane: u32, k: u32) -> u32 {
    if k + 1 < nranks {
        peer_at(rank, nranks, lane, k)
    } else {
        rank
    }
}

/// Block `b` of `nb`'s share of `len` units, in multiples of `align`: `(start, end)`, empty
/// for blocks past the end.
#[inline(always)]
pub fn block_share(len: u64, align: u64, b: u64, nb: u64) -> (u64, u64) {
    let share = len.div_ceil(nb).next_multiple_of(align);
    let start = b.saturating_mul(share).min(len);
    (start, start.saturating_add(share).min(len))
}

/// Block `b` of `nb`'s share `[start, end)` of round `j` of `total` units moved through
/// slots of `slot` units (`slot > 0`): cut from the first (longest) round, so a block owns
/// the same part of the slot in every round of a call (no block overwrites a region another
/// block's peer may still use); the last round may leave a block less or nothing. Shares
/// start at multiples of `align`.
#[inline(always)]
pub fn round_share(slot: u64, total: u64, j: u64, align: u64, b: u64, nb: u64) -> (u64, u64) {
    let round_len = slot.min(total - j * slot);
    let (s, e) = block_share(slot.min(total), align, b, nb);
    let e = e.min(round_len);
    (s.min(e), e)
}

/// Bytes of each rank's slot in the two-shot layout of a scratch of `scratch_len` bytes
/// for `nranks` ranks: `nranks` receive slots then one slot of reduced data, each a
/// multiple of 16 bytes.
#[inline(always)]
pub fn two_shot_slot(scratch_len: u64, nranks: u64) -> u64 {
    (scratch_len / (nranks + 1)) / 16 * 16
}

/// Bytes of each half of a packet scratch of `packets_len` bytes (the halves alternate
/// between calls).
#[inline(always)]
pub fn packet_half(packets_len: u64) -> u64 {
    packets_len / 2 / 16 * 16
}

/// The largest message (bytes per rank) the one-shot packet path carries in a packet
/// scratch of `packets_len` bytes: 8 data bytes per 16-byte packet, in one half.
#[inline(always)]
pub fn one_shot_max_bytes(packets_len: u64) -> u64 {
    packet_half(packets_len) / 2
}
