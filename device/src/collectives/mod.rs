//! Collectives (docs/guide/06-design.md §8): all-reduce and all-gather written with the
//! memory-channel primitives, for up to [`MAX_RANKS`] ranks whose memory is mapped into each
//! other.
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
//!   (packets, no barrier, on one-shot's call counter, halves and descriptor checks through
//!   [`ll`]) and a put path (the peers' scratch in rounds, per-block
//!   barriers, a last barrier like two-shot).
//! - [`pipe`]: the pipelined broadcast and reduce (a selectable variant of their put
//!   paths): pieces streamed through the scratch with a signal and an acknowledgement per
//!   piece and no barrier per round.
//! - [`send_recv`]: point-to-point sends and receives, alone or grouped into one launch,
//!   through a separate p2p scratch with its own semaphores (a second context).
//! - [`cross`]: the cross-host step of the hierarchical collectives (an exchange of one
//!   round with the partners on the other hosts over proxy channels, then a reduction in
//!   host order or a gather), run by the GPU and by the Host backend alike.
//! - [`proxy`]: both collectives over proxy channels ([`DevConn`]): the copy engine (or
//!   RDMA) moves the data between scratches, for peers whose memory cannot be mapped;
//!   pipelined (several chunks in flight per peer and block, the peers' data signals doubling
//!   as credits), one lane of channels per block.
//!
//! Reductions add in rank order 0, 1, …, n−1 on every rank, so all ranks get bit-identical
//! results.
//!
//! # Ordering between calls
//!
//! Every semaphore kernel but all-pairs ends with no peer still touching the scratch region
//! they share (a last barrier), so consecutive calls of any of them may share it; all-pairs
//! alternates halves of its own region instead. Calls on one rank are ordered by its
//! stream. All ranks must make the same sequence of calls (grids are derived from sizes), as
//! with NCCL.
//!
//! # Calls, descriptors and faults
//!
//! Every kernel is one *call* ([`Call`]): it reads a per-rank call counter (the first
//! counter of [`CollContext::state`]), advances it at its end, and sends its descriptor
//! (`n` and a tag naming the collective, type, operation and algorithm: [`desc`]) to every
//! peer as two LL packets with the call's flag, in a [`DESC_BYTES`] area at the end of the
//! peer's packet scratch (two parities). The semaphore kernels wait for every peer's
//! descriptor before anything else ([`CollContext::begin`], or at their first barrier:
//! [`CollContext::begin_deferred`]) and do nothing but advance the counter when one
//! differs; one-shot and the LL paths of the other collectives ([`ll`]) send their
//! descriptor with their data and check the peers' after their work (and when a data packet
//! is late), off the critical path. Send/recv ([`send_recv`]) run on a p2p context with its
//! own counter and exchange no descriptor (each transfer carries its size instead). A
//! rank that has read a peer's descriptor of call `k` knows that the peer finished call
//! `k - 1`, which is what the scratch reuse (one-shot's halves, descriptor parities) needs
//! even after a mismatch skipped the barriers.
//!
//! Waits never trap: they look at the clock and the [`fault`] area every [`SLOW_POLLS`]
//! failed polls, and give up (returning `false`, recording why once) on the host's abort
//! word, on the timeout, or once another wait of the call on this rank has given up. Blocks
//! agree on a failure at their barriers ([`CollContext::block_agree`]) and skip the rest of
//! the call, keeping every `sync_threads`. `arch::trap` is left only for grids that break
//! the launch contract.

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod broadcast;
pub mod cross;
pub mod fp8;
pub mod ll;
pub mod pipe;
pub mod proxy;
pub mod reduce;
pub mod reduce_scatter;
pub mod send_recv;
pub mod send_recv_proxy;
pub mod staging;
pub mod types;

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;
#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests_fp8;
#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests_scatter_rooted;
#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests_send_recv;

pub use types::{Bf16, Bytes, Dyn, F16, F32, F64, I8, I32, I64, Reduce, U8, U32, U64, op};

use crate::arch;
use crate::channel::DevConn;
use crate::packet::LlPacket;

/// Most ranks a [`CollContext`] holds.
pub const MAX_RANKS: usize = 8;
/// Most blocks a semaphore kernel may be launched with (semaphores per source rank).
pub const MAX_BLOCKS: usize = 128;
/// `u64` words of the local state ([`CollContext::expected`] then [`CollContext::state`]).
pub const EXPECTED_WORDS: usize = MAX_RANKS * MAX_BLOCKS;
/// `u64` words of one counter of [`CollContext::state`]: one for calls of one block, then
/// one copy per block index (see `all_reduce::advance_counter`).
pub const COUNTER_WORDS: usize = 1 + MAX_BLOCKS;
/// `u64` words of [`CollContext::state`]: the call counter (every collective kernel
/// advances it; see [`Call`]), then the all-pairs round counter, then the
/// [`LOCAL_FAULT_WORDS`] local fault words ([`local_fault`]), then the
/// [`PROXY_SYNC_WORDS`] words the blocks of one lane of a proxy collective meet at
/// ([`proxy`]).
pub const STATE_WORDS: usize = PROXY_SYNC_BASE + PROXY_SYNC_WORDS;
/// Index in [`CollContext::state`] of the first of the [`PROXY_SYNC_WORDS`].
pub const PROXY_SYNC_BASE: usize = 2 * COUNTER_WORDS + LOCAL_FAULT_WORDS;
/// `u64` words the proxy collectives' blocks meet at: one per block ("staged up to chunk
/// ..."), then one per lane ("the peers' chunks arrived up to ...").
pub const PROXY_SYNC_WORDS: usize = MAX_BLOCKS + proxy::MAX_PROXY_LANES;
/// `u64` words of the local fault words at the end of [`CollContext::state`].
pub const LOCAL_FAULT_WORDS: usize = 5;

/// The fault words kept in this rank's own (device) memory, at the end of
/// [`CollContext::state`]: waits poll these, not the [`fault`] area, which on a GPU is host
/// memory behind PCIe (a read there is a round trip of about a microsecond, and thousands of
/// waiting threads reading it at once queued behind each other for milliseconds).
pub mod local_fault {
    /// Index of the first local fault word in [`super::CollContext::state`].
    pub const BASE: usize = 2 * super::COUNTER_WORDS;
    /// A copy of the host's abort word, once a wait has seen it set.
    pub const ABORT: usize = BASE;
    /// `seq + 1` of the call whose waits must stop on this rank.
    pub const STOP: usize = BASE + 1;
    /// `%globaltimer` of the last look at the host's abort word: one waiting thread at a
    /// time looks, at most every [`HOST_LOOK_NS`].
    pub const LAST_LOOK: usize = BASE + 2;
    /// Least time between two looks at the host's abort word by this rank's waits.
    pub const HOST_LOOK_NS: u64 = 50_000;
    /// The value of the local [`ABORT`] copy when a look found, instead of the host's abort
    /// word, the record of a call that gave up for good ([`fault::TIMEOUT`] or
    /// [`fault::ABORTED`](super::fault::ABORTED), never cleared): the communicator cannot
    /// be used any more, so the waits of the calls already queued behind that one give up at
    /// once (before, each waited a device timeout of its own, and a rank with a thousand
    /// calls queued on its stream behind a stalled peer took a thousand timeouts to report
    /// it or to close).
    ///
    /// [`fault::TIMEOUT`]: super::fault::TIMEOUT
    pub const AFTER_FAILURE: u64 = u64::MAX - 1;
    /// A copy of the host's [`fault::LEFT`](super::fault::LEFT) word (contexts with
    /// [`guard::LEFT`](super::guard::LEFT)), taken at the same looks as the abort word.
    pub const LEFT: usize = BASE + 3;
    /// A copy of the host's [`fault::LEFT_PEERS`](super::fault::LEFT_PEERS) word (contexts
    /// with [`guard::PEERS`](super::guard::PEERS)), taken at the same looks as the abort
    /// word.
    pub const LEFT_PEERS: usize = BASE + 4;
}
/// The bit of a wait's start time (the `t0` of [`CollContext::keep_waiting`]) that marks a
/// wait which has seen the rank it waits for among the ranks that left
/// ([`guard::PEERS`]): its next look gives up. (Clock values stay far below it.)
pub const LEFT_SEEN: u64 = 1 << 63;
/// The bit of a wait's start time that marks a wait of the send/receive context which has
/// seen the rank it waits for inside a collective call ([`CollContext::coll`]): its next
/// look, if it still finds it there, gives up.
pub const IN_COLLECTIVE_SEEN: u64 = 1 << 62;
/// `u64` words of the semaphore array each rank exposes.
pub const SEMAPHORE_WORDS: usize = MAX_RANKS * MAX_BLOCKS;

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
    /// This rank's state words ([`STATE_WORDS`], local, zeroed at first).
    pub state: *mut u64,
    /// `conns[b * nranks + p]`: lane `b`'s proxy channel to rank `p`, over the scratch on
    /// both sides (an array of `lanes * nranks` handles, `lanes` at most
    /// [`proxy::MAX_PROXY_LANES`] and at least the grid of every proxy kernel; the own
    /// entries are unused; block `b` of a proxy kernel uses lane `b`). Null when proxy
    /// channels are not set up.
    pub conns: *const DevConn<'static>,
    /// The fault area ([`FAULT_WORDS`] words, see [`fault`]): memory that this rank's host
    /// and kernels both read and write while kernels run (mapped pinned host memory on a
    /// GPU). The host raises [`fault::ABORT`] in it; kernels record why a call failed.
    pub fault: *mut u64,
    /// Which of the optional fault checks this context's kernels make ([`guard`] bits).
    pub guards: u64,
    /// On the send/receive context of one host: the collectives' context of the same
    /// ranks, whose descriptors show a peer that is inside a collective call, so that a
    /// send or receive waiting for such a peer fails at once (see
    /// [`fault::AT_P2P_COLLECTIVE`]). Null on every other context.
    pub coll: *const CollContext,
}

/// The record of a collective whose peer's descriptor `theirs` differs from its own, found
/// at `place`: a mismatch, or, where the peer left a send/receive group's descriptor
/// instead (it waits in a send or receive, see [`fault::AT_P2P_COLLECTIVE`]), an abort.
#[inline(always)]
fn desc_fault(theirs: [u64; 2], place: u64) -> (u64, u64) {
    if desc::field(theirs[1], desc::KIND_SHIFT) == desc::SEND_RECV {
        (fault::ABORTED, fault::AT_P2P_COLLECTIVE)
    } else {
        (fault::MISMATCH, place)
    }
}

/// Bits of [`CollContext::guards`].
pub mod guard {
    /// For the kernels inside a host of a communicator that spans hosts: every call first
    /// reads [`fault::CROSS_BROKEN`](super::fault::CROSS_BROKEN), and once a round across
    /// hosts failed on this rank its descriptor is [`desc::BROKEN`](super::desc::BROKEN), so
    /// the host's other ranks fail the call (a mismatch) instead of taking what this rank's
    /// buffers hold. On a GPU the whole of a call across hosts is queued at once, so the
    /// local kernels after a failed round still run. Off elsewhere (the word lives in pinned
    /// host memory: a read costs a PCIe round trip that one-host calls do not pay).
    pub const CROSS: u64 = 1;
    /// For the context whose call counter every rank of the group advances alike (the
    /// collectives', not the send/receive or cross-host step contexts, which count their
    /// own operations): its waits give up on a call that a rank which left never made
    /// ([`fault::LEFT`](super::fault::LEFT)).
    pub const LEFT: u64 = 2;
    /// For the send/receive context: a wait for a rank that left with its work done
    /// ([`fault::LEFT_PEERS`](super::fault::LEFT_PEERS)) gives up once it has polled again
    /// after learning of the departure (whatever that rank wrote before it left is visible
    /// by then, so what is still missing will never come).
    pub const PEERS: u64 = 4;
}

const _: () = assert!(core::mem::size_of::<CollContext>() == 352);

// SAFETY: addresses and numbers only; the memory behind them is accessed under the
// protocols of this module.
unsafe impl Send for CollContext {}
// SAFETY: as above.
unsafe impl Sync for CollContext {}

pub use crate::fault;

pub use crate::fault::FAULT_WORDS;
/// Failed polls between two looks at the clock and the fault area.
pub const SLOW_POLLS: u32 = 64;
/// Bytes at the end of every packet scratch reserved for call descriptors: two parities of
/// two LL packets (8 data bytes each).
pub const DESC_BYTES: u64 = 64;

/// The call descriptor every collective kernel sends to every peer before it touches
/// shared state: word 0 is the kernel's `n` argument (elements for all-reduce, bytes per
/// rank for all-gather), word 1 the *tag*, built by the host from the fields below.
/// Kernels only compare descriptors; the host decodes them for messages.
pub mod desc {
    /// Bits 0..8 of the tag: the collective.
    pub const KIND_SHIFT: u32 = 0;
    /// Bits 8..16: the element type (1 f32, 2 f16, 3 bf16, 4 f64, 5 i8, 6 u8, 7 i32, 8 u32,
    /// 9 i64, 10 u64, 11 fp8 e4m3, 12 fp8 e5m2; 0 for byte movers that take none). A
    /// reducing call of fp8 carries its data widened to f32 (see
    /// [`staging`](super::staging)).
    pub const DTYPE_SHIFT: u32 = 8;
    /// Bits 16..24: the reduction, [`op`](super::op) code + 1 (1 sum, 2 prod, 3 min, 4 max,
    /// 5 avg, 6 pre-multiplied sum; 0 for the collectives that do not reduce). Reducing kernels built for any
    /// operation read theirs here ([`op_code`]).
    pub const OP_SHIFT: u32 = 16;
    /// Bits 24..32: the algorithm.
    pub const ALGO_SHIFT: u32 = 24;
    /// Bits 32..40: the root of a rooted collective (reduce, broadcast), which its kernels
    /// read here ([`root`]); the peer of a send/receive.
    pub const ROOT_SHIFT: u32 = 32;
    /// Collective: all-reduce.
    pub const ALL_REDUCE: u64 = 1;
    /// Collective: all-gather.
    pub const ALL_GATHER: u64 = 2;
    /// Collective: reduce-scatter.
    pub const REDUCE_SCATTER: u64 = 3;
    /// Collective: reduce (to a root).
    pub const REDUCE: u64 = 4;
    /// Collective: broadcast (from a root).
    pub const BROADCAST: u64 = 5;
    /// Collective: all-to-all.
    pub const ALL_TO_ALL: u64 = 6;
    /// Point-to-point sends and receives (a group; no descriptor exchange, see
    /// [`send_recv`](super::send_recv)).
    pub const SEND_RECV: u64 = 7;
    /// The descriptor tag of a rank whose round across hosts failed earlier
    /// ([`guard::CROSS`](super::guard::CROSS)): no call's tag (its
    /// kind field would be 0xff).
    pub const BROKEN: u64 = u64::MAX;
    /// Builds a tag.
    #[inline(always)]
    pub const fn tag(kind: u64, dtype: u64, op: u64, algo: u64) -> u64 {
        kind << KIND_SHIFT | dtype << DTYPE_SHIFT | op << OP_SHIFT | algo << ALGO_SHIFT
    }
    /// A tag with a root (see [`ROOT_SHIFT`]).
    #[inline(always)]
    pub const fn rooted_tag(kind: u64, dtype: u64, op: u64, algo: u64, root: u64) -> u64 {
        tag(kind, dtype, op, algo) | (root & 0xff) << ROOT_SHIFT
    }
    /// Algorithm code ([`ALGO_SHIFT`]) of the pipelined broadcast and reduce
    /// ([`pipe`](super::pipe)); 1 is their LL path, 2 their rounds through the scratch.
    pub const PIPELINED: u64 = 3;
    /// Bits 40..60 of a pipelined call's tag: its piece size in 16-byte units.
    pub const PIECE_SHIFT: u32 = 40;
    /// Bits 60..64: its depth (pieces in flight per block and link).
    pub const DEPTH_SHIFT: u32 = 60;
    /// `tag` with a pipelined call's `piece` (bytes, a multiple of 16, below 16 MiB) and
    /// `depth` (below 16).
    #[inline(always)]
    pub const fn with_pipe(tag: u64, piece: u64, depth: u32) -> u64 {
        tag | ((piece / 16) & 0xf_ffff) << PIECE_SHIFT | (depth as u64 & 0xf) << DEPTH_SHIFT
    }
    /// The piece size (bytes) of a pipelined call's tag ([`with_pipe`]).
    #[inline(always)]
    pub const fn piece(tag: u64) -> u64 {
        (tag >> PIECE_SHIFT & 0xf_ffff) * 16
    }
    /// The depth of a pipelined call's tag ([`with_pipe`]).
    #[inline(always)]
    pub const fn depth(tag: u64) -> u32 {
        (tag >> DEPTH_SHIFT & 0xf) as u32
    }
    /// Field `shift` of a tag.
    #[inline(always)]
    pub const fn field(tag: u64, shift: u32) -> u64 {
        (tag >> shift) & 0xff
    }
    /// The [`op`](super::op) code of a tag (its [`OP_SHIFT`] field less one).
    #[inline(always)]
    pub const fn op_code(tag: u64) -> u32 {
        (field(tag, OP_SHIFT) as u32).wrapping_sub(1)
    }
    /// The operation argument of the any-type kernels ([`Dyn`](super::types::Dyn)): the
    /// [`op_code`] with the type's code ([`DTYPE_SHIFT`]) above it, `op | dtype << 8`.
    #[inline(always)]
    pub const fn type_op(tag: u64) -> u32 {
        op_code(tag) & 0xff | (field(tag, DTYPE_SHIFT) as u32) << 8
    }
    /// The element size of the tag's type ([`DTYPE_SHIFT`]; 0 for a type that is not
    /// reduced).
    #[inline(always)]
    pub const fn type_size(tag: u64) -> u64 {
        super::types::dtype_size(field(tag, DTYPE_SHIFT) as u32)
    }
    /// The root of a tag ([`ROOT_SHIFT`]).
    #[inline(always)]
    pub const fn root(tag: u64) -> u32 {
        field(tag, ROOT_SHIFT) as u32
    }
}

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
    unsafe fn read_desc(&self, call: &Call, peer: u32) -> Option<[u64; 2]> {
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
    unsafe fn after_left(&self, call: &Call) -> bool {
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
    unsafe fn abort_word(&self, now: u64) -> u64 {
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
    /// send and a receive of different sizes, see [`send_recv`]). `own` and `theirs` are
    /// the two sides' descriptors.
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

    /// Makes `call.failed` the same on every thread of the block: each thread `t <
    /// nranks` (the only ones that wait) publishes its own, after which the block syncs and
    /// every thread takes the OR. Returns `!call.failed`.
    ///
    /// Called by every thread of the block, with no other use of the slots in between
    /// (a `sync_threads` separates two uses: every caller of this syncs before it).
    #[inline(always)]
    pub fn block_agree(&self, call: &mut Call, thread: u32) -> bool {
        let slots = crate::shared_array!(COLL_FAILED: u32; MAX_RANKS);
        if thread < self.nranks {
            // SAFETY: slot thread < nranks <= MAX_RANKS, this thread's own.
            unsafe {
                slots
                    .add(thread as usize)
                    .write_volatile(call.failed as u32)
            };
        }
        arch::sync_threads();
        let mut any = 0;
        for q in 0..self.nranks as usize {
            // SAFETY: written before the barrier above by thread q.
            any |= unsafe { slots.add(q).read_volatile() };
        }
        call.failed = any != 0;
        !call.failed
    }

    /// The start of a semaphore kernel's call (every thread of every block): block 0's
    /// threads `p < nranks` send this rank's descriptor to rank `p`; every block's threads
    /// `p` wait for rank `p`'s and compare; the block agrees. `false` (every thread) when
    /// the ranks disagree or a wait gave up: the kernel then skips every access to shared
    /// state (no signal, so the semaphores stay consistent on all ranks: every rank sees
    /// the same descriptors, so either all proceed or none does).
    ///
    /// # Safety
    /// Every thread of the block (`block_dim_x() >= nranks`); the context valid.
    #[inline(always)]
    pub unsafe fn begin(&self, call: &mut Call, block: u32, thread: u32) -> bool {
        if thread < self.nranks && thread != self.rank {
            // SAFETY: thread is a peer (caller contract).
            unsafe {
                if block == 0 {
                    self.send_desc(call, thread);
                }
                self.check_desc(call, thread);
            }
        }
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
        if block == 0 && thread < self.nranks && thread != self.rank {
            // SAFETY: thread is a peer (caller contract).
            unsafe { self.send_desc(call, thread) };
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
        if thread < self.nranks && thread != self.rank {
            // SAFETY: thread is a peer (caller contract).
            unsafe { self.check_desc(call, thread) };
        }
        arch::sync_threads();
        self.block_agree(call, thread)
    }

    /// A barrier of block `block` with the same block of every other rank: the block's
    /// threads sync, thread `p` signals rank `p` and waits for its signal, the block syncs
    /// again. What the block did before happens before what the peers' blocks do after.
    /// Returns `false` on every thread of the block when a wait of the block gave up (the
    /// call failed: skip the rest; nothing is signalled once failed).
    ///
    /// # Safety
    /// Called by every thread of the block (`block_dim_x() >= nranks`); `block <
    /// MAX_BLOCKS`; the context valid.
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
        if thread < self.nranks && thread != self.rank && !call.failed {
            // SAFETY: thread is a valid peer; one waiter per (peer, block).
            unsafe {
                self.signal(thread, block);
                self.wait(call, thread, block);
            }
        }
        self.block_agree(call, thread)
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
/// between calls), past the [`DESC_BYTES`] of descriptors at its end.
#[inline(always)]
pub fn packet_half(packets_len: u64) -> u64 {
    packets_len.saturating_sub(DESC_BYTES) / 2 / 16 * 16
}

/// The largest message (bytes per rank) the one-shot packet path carries in a packet
/// scratch of `packets_len` bytes: 8 data bytes per 16-byte packet, in one half.
#[inline(always)]
pub fn one_shot_max_bytes(packets_len: u64) -> u64 {
    packet_half(packets_len) / 2
}
