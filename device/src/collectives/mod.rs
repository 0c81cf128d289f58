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
//! - [`proxy`]: both collectives over proxy channels
//!   ([`DevConn`](crate::channel::DevConn)): the copy engine (or RDMA) moves the data
//!   between scratches, for peers whose memory cannot be mapped; pipelined (several chunks
//!   in flight per peer and block, the peers' data signals doubling as credits), one lane
//!   of channels per block.
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

mod barrier;
mod context;
mod desc_exchange;
mod layout;
mod waits;

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;
#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests_fp8;
#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests_scatter_rooted;
#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests_send_recv;

pub use context::{Call, CollContext};
pub use layout::{
    block_share, one_shot_max_bytes, packet_half, peer_at, rotated_rank, round_share, two_shot_slot,
};
pub use types::{Bf16, Bytes, Dyn, F16, F32, F64, I8, I32, I64, Reduce, U8, U32, U64, op};

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
pub mod local_fault;
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

/// Bits of [`CollContext::guards`].
pub mod guard;

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
pub mod desc;
