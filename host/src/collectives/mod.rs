//! Collectives: all-reduce, all-gather, reduce-scatter, reduce, broadcast and all-to-all over
//! memory channels (docs/guide/06-design.md §8), and sends and receives.
//!
//! Each operation's calls (raw, typed, host, in place) are in a file of their own:
//! `all_reduce.rs`, `all_gather.rs`, `reduce_scatter.rs`, `reduce.rs`, `broadcast.rs`,
//! `all_to_all.rs`, `send_recv.rs` and `ll_exchange.rs` (a benchmark reference). Every choice
//! among algorithms is in `select.rs`. What they share is in files named for it: `launch.rs`
//! (grids, the host backend's CPU threads, the local all-gather), `gpu.rs` (the loaded
//! module, stream checks, dependent launch), `kernel_table.rs` (which kernel runs a type),
//! `scatter_rooted.rs` (the paths of reduce-scatter, reduce, broadcast and all-to-all),
//! `descriptor.rs` (call descriptors), `failure.rs` (why a call failed), `topology.rs`
//! (hosts and groups), `cross.rs` (the step across hosts), `cross_collectives.rs` (the
//! collectives across hosts), `send_recv_proxy.rs` (send/recv with other hosts), `proxy.rs` (the
//! proxy all-reduce's pipeline), `staged.rs` (fp8 and pre-multiplied sums) and `order.rs`
//! (call order across streams).
//!
//! [`Collectives`] takes a set-up-less [`Communicator`], connects a memory channel to every
//! other rank over a scratch buffer registered once (plus LL-packet scratch and an array of
//! semaphores), and then runs the collective kernels of the device crate. Calls allocate
//! nothing and never synchronise with the host, so they may be captured into a CUDA graph.
//!
//! On the GPU backend the buffers are device pointers (raw, or cudarc
//! [`CudaSlice`](crate::cuda::CudaSlice)s) and calls are stream-ordered on the caller's [`CudaStream`]. On the host backend (no GPU)
//! the same kernels run on CPU threads over shared memory, and calls block until done.
//!
//! # Across hosts
//!
//! Ranks on several hosts (bootstrap host ids, `MSCCLPP_HOST_ID`) are accepted on both
//! backends. With the same number of ranks (at most 8) on every host, the kernels run over
//! this rank's host (memory channels, as on one machine), and the ranks of the same local
//! index on the other hosts are reached over TCP (or IB) proxy channels. Otherwise (hosts of
//! different sizes, or one of more than 8 ranks) every host is cut into groups of one size,
//! the largest of at most 8 that divides every host's rank count (4 + 2 ranks: three groups
//! of 2; at worst every rank its own group), and the groups take the hosts' place: memory
//! channels inside a group, proxy channels between groups (the network between machines,
//! the backend's transport between the groups of one machine); [`Collectives::layout_note`]
//! says why. All-reduce is hierarchical
//! (reduce-scatter in the host, the cross-host step, all-gather in the host), and every
//! other collective is built across hosts. Send/recv with a rank on another host goes over
//! two network channels (TCP or IB) per such rank, set up while there are at most
//! [`CollConfig::p2p_remote_max`] of them, or with the ranks named in
//! [`CollConfig::p2p_peers`] / [`P2P_PEERS_ENV`] (a pair when either rank names the other);
//! a transfer with any other rank on another host is refused with
//! [`CommError::InvalidArgument`]. The cross-host step is a device kernel
//! (`cross_step`, one block) on GPUs and the same code on a CPU thread on the Host backend;
//! GPU calls stay stream-ordered and capturable. Every rank gets bit-identical results;
//! sums are formed per host in rank order, then across hosts in host order
//! (docs/guide/06-design.md §8, "Across hosts"). The cross-host part of an
//! all-reduce is one-shot (each rank sends its whole shard to every partner: one round) or,
//! from three hosts up and once it saves [`CROSS_TWO_SHOT_SAVES`] bytes per rank, two-shot
//! (the shard reduce-scattered across hosts, then all-gathered: two rounds, `2 / H` of the
//! bytes for `H` hosts); [`AllReduceAlgo::OneShot`] / [`AllReduceAlgo::TwoShot`] (argument,
//! `MSCCLPP_ALLREDUCE_ALGO`, config) force one, and both give the same bits.
//! [`Collectives::choose_all_reduce`] tells which `Auto` takes. A reduce takes the same
//! choice (its two-shot form gathers the reduced pieces on the root's host only), and a
//! broadcast of at least as many bytes goes two-shot too (the root scatters one piece to
//! each host, then the hosts all-gather them). The other algorithm arguments and
//! `MSCCLPP_*_ALGO` choose nothing across hosts.
//!
//! # Ordering and failures
//!
//! As with NCCL, every rank must make the same calls in the same order. The GPU calls of
//! one [`Collectives`] run in the order they were made, whatever their streams: a call on
//! another stream than the previous call's first waits for an event recorded after it
//! (calls captured into one CUDA graph are ordered by its edges; a captured and an
//! uncaptured call are not ordered with each other).
//!
//! **Mismatched calls are found on every call.** Every kernel sends a 16-byte descriptor of
//! its call (collective, count, data type, operation, algorithm) to every peer as two LL
//! packets, and compares the peers' with its own: the semaphore algorithms before their first
//! signal (so on a mismatch no rank signals or moves data, and the semaphores stay
//! consistent), one-shot after its reduction and whenever a data packet is late. Every rank
//! sees the same descriptors, so every rank fails the call, with
//! [`CommError::CallMismatch`] naming both sides (e.g. "rank 1 called all_reduce with 400000
//! f32 (two-shot), rank 0 all_reduce with 300000 f32 (two-shot)"); the output is undefined
//! and the next, matching call works. A call of no elements moves nothing but is checked
//! all the same (a small kernel carrying its descriptor; across hosts also a round of
//! headers), so a rank that calls with none while the others call with some fails with
//! them instead of pairing with their next call.
//!
//! **Waits do not trap.** Every device wait (LL packets, semaphores, proxy channels) looks,
//! every 64 failed polls, at the clock and at a fault area in memory the host and the
//! kernels share (mapped pinned host memory on a GPU). It gives up on the communicator's
//! abort word, on the device timeout (`CommConfig::device_timeout`, 30 s by default), or
//! once another wait of the same call on this rank gave up; the first to give up records
//! why. The kernel then skips its remaining waits and work (keeping its block barriers) and
//! ends. The abort word is raised by [`Collectives::abort`] / [`Communicator::abort`] and by
//! the bootstrap as soon as it sees a rank die (milliseconds: its TCP connection ends), so a
//! collective whose peer died fails with [`CommError::Aborted`] "rank 1 is gone: ...". A rank
//! that *left* (dropped its collectives: a goodbye, not a death) names in its goodbye the
//! calls it made; a call of a later number can never complete, so its waits give up as soon
//! as the goodbye is in ([`CommError::Aborted`] "collective #3 (...) cannot complete: rank 1
//! left (it closed its communicator) after 2 collective calls ..."), while the calls it made
//! complete as usual. Sends and receives count their own transfers: such a goodbye also says
//! that the leaver's work had ended, so a send/recv wait for it still unanswered after it
//! (and one more poll) gives up ("send/recv launch #5 (...) cannot complete: rank 1 left
//! ... without the matching send or receive"); what it sent before it left still arrives.
//! After a timeout, an abort or such a departure the collectives are
//! unusable (ranks no longer agree on what was signalled): every later call returns the
//! same error.
//!
//! **Where errors surface.** On the host backend each call returns its own error. On a GPU,
//! calls return at launch: a kernel's failure is read by [`Collectives::async_error`]
//! (NCCL's `ncclCommGetAsyncError`) and [`Collectives::synchronize`] (the stream, then
//! that); every call also checks the fatal ones (abort, timeout, lost context) before
//! launching, so *such an error of an earlier call is returned by the next call* if nothing
//! asked before. A mismatch is only returned by those two (see
//! [`Collectives::async_error`] for why). A lost CUDA context (a kernel trapped
//! or faulted: a bad pointer) is reported as [`CommError::ContextLost`] by every later call,
//! instead of blaming its arguments.
//!
//! # Launches
//!
//! The latency kernels (one-shot all-reduce, packet all-gather, the LL paths of the other
//! collectives, send/recv groups of LL-sized transfers) are launched with programmatic
//! stream serialization (programmatic dependent
//! launch, sm_90 PTX only; `MSCCLPP_PDL=0` turns it off, read when the collectives are
//! created; off when ranks share the GPU unless `MSCCLPP_PDL=1`, see below): such a kernel may start while the previous kernel on the stream ends, waits for
//! it on the GPU before touching memory, and lets the next one start likewise, so
//! back-to-back calls overlap their launch latency. Stream order and graph capture are
//! unchanged for every other kernel. The other memory-channel kernels are launched plainly:
//! with every kernel launched dependent, two ranks sharing
//! one GPU (MPS) hung in all-pairs all-reduce at 4 MB (the waiting blocks of a dependent
//! kernel take room on the GPU while it runs the previous one). That is likely the
//! shared-GPU hang explained below (a rank's current and next grids resident at once), not
//! re-tried since.
//!
//! **Ranks sharing a GPU** (several processes on one device under MPS: tests, simulated
//! hosts) get at most `multiprocessors / k` blocks per kernel, for `k` ranks on the most
//! shared device of the communicator (read from the bootstrap when the collectives are
//! created; `max_blocks` and the one-shot grid are capped). A kernel's blocks wait for its
//! peers' blocks, so the kernels of the ranks on one device must fit on it together; the
//! kernels take one 512-thread block per multiprocessor. Without the cap, four ranks on one
//! H200 (two simulated hosts of two) hung in all-gather at 4 MiB, and ran with one block.
//! Programmatic dependent launch is off for them: it lets a rank's next grid become
//! resident beside its current one, so a rank that runs ahead holds twice its share (four
//! ranks hung in broadcast at 256 KiB with it; see `gpu::pdl_plan`). `MSCCLPP_PDL=1` turns
//! it on for them with half the cap (to check the dependent path on one GPU).
//!
//! # Algorithms
//!
//! [`AllReduceAlgo::Auto`] picks by message size and rank count; the environment variables
//! `MSCCLPP_ALLREDUCE_ALGO` (`oneshot`, `twoshot`, `readreduce`, `allpairs`, `proxy`) and
//! `MSCCLPP_ALLGATHER_ALGO` (`memory`, `proxy`)
//! override the choice, and an explicit algorithm argument overrides both. Broadcast and
//! reduce above the LL size take [`RootedAlgo`] from `MSCCLPP_BROADCAST_ALGO` and
//! `MSCCLPP_REDUCE_ALGO` (`rounds`, `pipelined`), else from the config.

mod all_gather;
mod all_reduce;
mod all_to_all;
mod broadcast;
mod buffer;
mod cross;
mod cross_collectives;
mod descriptor;
mod failure;
mod gpu;
mod kernel_table;
mod launch;
mod ll_exchange;
mod order;
mod proxy;
mod reduce;
mod reduce_scatter;
mod scatter_rooted;
mod select;
mod send_recv;
mod send_recv_proxy;
mod staged;
mod topology;

pub use buffer::{Buffer, BufferMut, Exec, Memory, Place, RawBuffer};
pub use cross::CROSS_BUFFER_ENV;
/// Most sends and receives in one [`Collectives::group`].
pub use mscclpp_device::collectives::send_recv::MAX_P2P_OPS;
pub use select::{CROSS_TWO_SHOT_SAVES, ROOTED_PIPELINED_ABOVE, TWO_RANK_ONE_SHOT_MAX};
pub use send_recv::P2pOp;
pub use send_recv_proxy::P2P_PEERS_ENV;
pub use staged::{Fp8E4M3, Fp8E5M2, PreMulScalar, STAGING_BYTES};

use self::failure::caused_by_another_rank;
use crate::communicator::{Backend, Buffer as Registered, CommError, Communicator, idle_within};
use crate::cuda::{CudaStream, Gpu};
use crate::settings::{CrossBuffer, PdlMode, Settings};
use crate::transport::TransportKind;
use crate::transport::tags::{TAG_PROXY, TAG_SCRATCH, TAG_SEMAPHORES};
use mscclpp_device::channel::DevConn;
use mscclpp_device::collectives::{
    COUNTER_WORDS, CollContext, DESC_BYTES, EXPECTED_WORDS, MAX_RANKS, SEMAPHORE_WORDS,
    STATE_WORDS, guard, one_shot_max_bytes,
};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Element type of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    Bf16,
    /// 64-bit IEEE float.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// 8-bit float e4m3 ([`Fp8E4M3`]); its reductions accumulate in f32 and round once
    /// (see [`STAGING_BYTES`]'s module, "Staged reductions").
    Fp8E4M3,
    /// 8-bit float e5m2 ([`Fp8E5M2`]), reduced as e4m3.
    Fp8E5M2,
}

impl DataType {
    /// Every type.
    pub const ALL: [DataType; 12] = [
        DataType::F32,
        DataType::F16,
        DataType::Bf16,
        DataType::F64,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::Fp8E4M3,
        DataType::Fp8E5M2,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I8 | DataType::U8 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => 1,
        }
    }

    /// The name nccl-tests prints (`float`, `half`, `bfloat16`, `double`, `int8`, `uint8`,
    /// `int32`, `uint32`, `int64`, `uint64`, `f8e4m3`, `f8e5m2`).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
            DataType::F64 => "double",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::Fp8E4M3 => "f8e4m3",
            DataType::Fp8E5M2 => "f8e5m2",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise product.
    Prod,
    /// Element-wise minimum (floats by IEEE `totalOrder`: -0 < +0).
    Min,
    /// Element-wise maximum (floats by IEEE `totalOrder`).
    Max,
    /// The sum divided once, at the end, by the number of ranks (integers: truncated).
    Avg,
    /// Every rank's input times its own scalar (in the type), then summed in rank order:
    /// NCCL's `ncclRedOpCreatePreMulSum`. Made by [`ReduceOp::pre_mul_sum`] (a host value)
    /// or [`ReduceOp::pre_mul_sum_at`] (read from memory when the call runs).
    PreMulSum(PreMulScalar),
}

impl ReduceOp {
    /// Every built-in operation (all but [`PreMulSum`](ReduceOp::PreMulSum)).
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
        }
    }
}

/// All-reduce, all-gather and rooted algorithms and the network between hosts
/// ([`CollConfig::cross_transport`]): defined with the settings that choose them
/// (`MSCCLPP_ALLREDUCE_ALGO`, ...).
pub use crate::settings::{AllGatherAlgo, AllReduceAlgo, CrossTransport, RootedAlgo};

impl CrossTransport {
    /// The transport this setting takes on this machine.
    pub fn resolve(self) -> TransportKind {
        match self {
            CrossTransport::Tcp => TransportKind::Tcp,
            CrossTransport::Ib => TransportKind::Ib,
            CrossTransport::Auto => match crate::transport::ib::list_devices() {
                Ok(d) if !d.is_empty() => TransportKind::Ib,
                _ => TransportKind::Tcp,
            },
        }
    }
}

/// Element types the typed calls accept.
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching [`DataType`].
    const DTYPE: DataType;
}

impl Element for f32 {
    const DTYPE: DataType = DataType::F32;
}
impl Element for half::f16 {
    const DTYPE: DataType = DataType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DataType = DataType::Bf16;
}
impl Element for f64 {
    const DTYPE: DataType = DataType::F64;
}
impl Element for i8 {
    const DTYPE: DataType = DataType::I8;
}
impl Element for u8 {
    const DTYPE: DataType = DataType::U8;
}
impl Element for i32 {
    const DTYPE: DataType = DataType::I32;
}
impl Element for u32 {
    const DTYPE: DataType = DataType::U32;
}
impl Element for i64 {
    const DTYPE: DataType = DataType::I64;
}
impl Element for u64 {
    const DTYPE: DataType = DataType::U64;
}
// The fp8 types' `Element` impls are beside them, in `staged.rs`.

/// Settings of [`Collectives`].
#[derive(Debug, Clone)]
pub struct CollConfig {
    /// Bytes of the scratch buffer each rank registers, in two equal regions: one for
    /// all-pairs, one shared by the other algorithms (each pipelines larger messages
    /// through its region, in rounds). All-pairs has its own so that it needs no barrier at
    /// the end of a call.
    pub scratch_bytes: usize,
    /// Largest message (bytes per rank) the one-shot packet path serves; [`Auto`] uses it
    /// up to this size. Each peer pair gets `4 *` this in packet scratch.
    ///
    /// [`Auto`]: AllReduceAlgo::Auto
    pub packet_max_bytes: usize,
    /// Most blocks of a two-shot or all-gather kernel (1..=128; GPU only).
    pub max_blocks: u32,
    /// Threads per block of the GPU kernels (a multiple of 32, 32..=512).
    pub threads: u32,
    /// The all-reduce algorithm of calls that pass [`AllReduceAlgo::Auto`] (the typed and
    /// host calls), unless `MSCCLPP_ALLREDUCE_ALGO` is set.
    pub all_reduce_algo: AllReduceAlgo,
    /// The all-gather algorithm of calls that pass [`AllGatherAlgo::Auto`], unless
    /// `MSCCLPP_ALLGATHER_ALGO` is set.
    pub all_gather_algo: AllGatherAlgo,
    /// Sends and receives of at most this many bytes go as LL packets, with no rendezvous
    /// (0: never). Each peer pair gets `4 *` this in packet scratch. Must be equal on every
    /// rank, as the two following.
    pub p2p_packet_max_bytes: usize,
    /// Blocks of every LL send and receive on a GPU (1..=16; at most the blocks a transfer
    /// may use).
    pub p2p_packet_blocks: u32,
    /// Larger sends and receives: pieces in flight per block (1..=4): the sender fills the
    /// next while the receiver copies one out.
    pub p2p_depth: u32,
    /// The broadcast algorithm above the LL size, unless `MSCCLPP_BROADCAST_ALGO` is set.
    pub broadcast_algo: RootedAlgo,
    /// The reduce algorithm above the LL size, unless `MSCCLPP_REDUCE_ALGO` is set.
    pub reduce_algo: RootedAlgo,
    /// [`RootedAlgo::Pipelined`]: pieces in flight per block and link (1..=8).
    pub rooted_depth: u32,
    /// [`RootedAlgo::Pipelined`]: the smallest piece (bytes; pieces aim at 8 per block,
    /// capped by what the scratch holds per block and depth). At most 16 MiB.
    pub rooted_piece_bytes: usize,
    /// Across hosts: the network transport of the proxy channels between hosts (the
    /// cross-host steps and send/recv with other hosts). Must agree on every rank.
    pub cross_transport: CrossTransport,
    /// Across hosts: send/recv with ranks on other hosts is set up (two network channels,
    /// TCP or IB, and `scratch_bytes / 8`, between 32 KiB and 2 MiB, of buffer per such
    /// rank) when there are at most this many of them; above, such sends and receives are
    /// refused. Must be equal on every rank. Ignored once any rank names its peers
    /// ([`p2p_peers`](Self::p2p_peers)). Ranks of this rank's machine that the collectives
    /// put in another group (machines of different sizes) are always reached and not
    /// counted: they need no network.
    pub p2p_remote_max: usize,
    /// Across hosts: the ranks on other hosts this rank sends to or receives from, when
    /// known (a pipeline stage's neighbours, say). `None` (the default): every rank on
    /// another host, while there are at most [`p2p_remote_max`](Self::p2p_remote_max).
    /// `Some(ranks)`: these (ranks of this rank's host are always reached and ignored
    /// here). A pair is connected when either of its ranks names the other, so ranks may
    /// name different lists, and the limit does not apply. Every rank's buffer for these
    /// holds a region (`scratch_bytes / 8`, between 32 KiB and 2 MiB) per peer of the rank
    /// with the most peers, so a rank that names many makes every rank's buffer that large
    /// (the two buffers a channel joins are of one size). `MSCCLPP_P2P_PEERS` overrides
    /// it ([`P2P_PEERS_ENV`]: `13,+8,-8`, absolute ranks and ranks relative to this one;
    /// `all`, `none`).
    pub p2p_peers: Option<Vec<usize>>,
    /// Across hosts, on a GPU whose partners are all reached over TCP: the cross buffer and
    /// the send/recv buffer are pinned host memory mapped into the device (`true`, the
    /// default; the sockets read and write them directly, and a signal is a CPU store the
    /// kernel polls) rather than device memory staged by the copy engine (`false`). Each
    /// rank may choose for itself (the wire is the same); `MSCCLPP_CROSS_BUFFER=host|device`
    /// ([`CROSS_BUFFER_ENV`]) sets it in [`from_env`](Self::from_env).
    pub cross_buffer_host: bool,
}

impl Default for CollConfig {
    /// The defaults of the settings ([`Settings::default`]), with no environment.
    fn default() -> Self {
        CollConfig::from_settings(&Settings::default())
    }
}

impl CollConfig {
    /// The defaults, with `MSCCLPP_COLL_SCRATCH_BYTES`, `MSCCLPP_COLL_PACKET_MAX_BYTES`,
    /// `MSCCLPP_COLL_MAX_BLOCKS`, `MSCCLPP_COLL_THREADS`, `MSCCLPP_P2P_PACKET_MAX_BYTES`,
    /// `MSCCLPP_P2P_PACKET_BLOCKS`, `MSCCLPP_P2P_DEPTH`, `MSCCLPP_ROOTED_DEPTH`,
    /// `MSCCLPP_ROOTED_PIECE_BYTES`, `MSCCLPP_P2P_REMOTE_MAX`, `MSCCLPP_CROSS_TRANSPORT`
    /// (`auto`, `tcp`, `ib`) and `MSCCLPP_CROSS_BUFFER` (`host`, `device`) applied when set.
    pub fn from_env() -> Result<CollConfig, CommError> {
        Ok(CollConfig::from_settings(settings()?))
    }

    /// The values of `settings` (see [`from_env`](Self::from_env)); the algorithms stay
    /// `Auto` and the peers `None` (their variables override the config when the
    /// collectives are made).
    pub fn from_settings(s: &Settings) -> CollConfig {
        CollConfig {
            scratch_bytes: s.coll_scratch_bytes,
            packet_max_bytes: s.coll_packet_max_bytes,
            max_blocks: s.coll_max_blocks,
            threads: s.coll_threads,
            all_reduce_algo: AllReduceAlgo::Auto,
            all_gather_algo: AllGatherAlgo::Auto,
            p2p_packet_max_bytes: s.p2p_packet_max_bytes,
            p2p_packet_blocks: s.p2p_packet_blocks,
            p2p_depth: s.p2p_depth,
            broadcast_algo: RootedAlgo::Auto,
            reduce_algo: RootedAlgo::Auto,
            rooted_depth: s.rooted_depth,
            rooted_piece_bytes: s.rooted_piece_bytes,
            p2p_remote_max: s.p2p_remote_max,
            p2p_peers: None,
            cross_transport: s.cross_transport,
            cross_buffer_host: s.cross_buffer == CrossBuffer::Host,
        }
    }

    fn validate(&self) -> Result<(), CommError> {
        let bad = |m: String| Err(CommError::InvalidArgument(format!("collectives: {m}")));
        if self.scratch_bytes < 4096 {
            return bad(format!(
                "scratch of {} bytes; at least 4096",
                self.scratch_bytes
            ));
        }
        if self.packet_max_bytes == 0 || self.packet_max_bytes > 1 << 30 {
            return bad(format!(
                "packet_max_bytes {} is not in 1..=1 GiB",
                self.packet_max_bytes
            ));
        }
        if !(1..=mscclpp_device::collectives::MAX_BLOCKS as u32).contains(&self.max_blocks) {
            return bad(format!(
                "max_blocks {} is not in 1..={}",
                self.max_blocks,
                mscclpp_device::collectives::MAX_BLOCKS
            ));
        }
        if !(32..=512).contains(&self.threads) || !self.threads.is_multiple_of(32) {
            return bad(format!(
                "threads {} is not a multiple of 32 in 32..=512",
                self.threads
            ));
        }
        if self.p2p_packet_max_bytes > 4 << 20 {
            return bad(format!(
                "p2p_packet_max_bytes {} is above 4 MiB",
                self.p2p_packet_max_bytes
            ));
        }
        use mscclpp_device::collectives::send_recv::{P2P_LL_BLOCKS, P2P_MAX_DEPTH};
        if !(1..=P2P_LL_BLOCKS).contains(&self.p2p_packet_blocks) {
            return bad(format!(
                "p2p_packet_blocks {} is not in 1..={P2P_LL_BLOCKS}",
                self.p2p_packet_blocks
            ));
        }
        if !(1..=P2P_MAX_DEPTH).contains(&self.p2p_depth) {
            return bad(format!(
                "p2p_depth {} is not in 1..={P2P_MAX_DEPTH}",
                self.p2p_depth
            ));
        }
        use mscclpp_device::collectives::pipe::{PIPE_MAX_DEPTH, PIPE_MAX_PIECE};
        if !(1..=PIPE_MAX_DEPTH).contains(&self.rooted_depth) {
            return bad(format!(
                "rooted_depth {} is not in 1..={PIPE_MAX_DEPTH}",
                self.rooted_depth
            ));
        }
        if self.rooted_piece_bytes as u64 > PIPE_MAX_PIECE {
            return bad(format!(
                "rooted_piece_bytes {} is above {PIPE_MAX_PIECE}",
                self.rooted_piece_bytes
            ));
        }
        Ok(())
    }
}

/// All-reduce and all-gather over one communicator. See the [module](self).
pub struct Collectives {
    comm: Communicator,
    config: CollConfig,
    /// The most blocks of any kernel when ranks share this rank's GPU
    /// ([`shared_gpu_block_cap`]; `u32::MAX` when they do not).
    block_cap: u32,
    /// The context on the host (host backend kernels read it here).
    ctx: Box<CollContext>,
    env_all_reduce: Option<AllReduceAlgo>,
    env_all_gather: Option<AllGatherAlgo>,
    /// `MSCCLPP_BROADCAST_ALGO`, `MSCCLPP_REDUCE_ALGO`.
    env_broadcast: Option<RootedAlgo>,
    env_reduce: Option<RootedAlgo>,
    /// How proxy calls are cut (`MSCCLPP_PROXY_BLOCKS`, `MSCCLPP_PROXY_CHUNK_BYTES`,
    /// [`Collectives::set_proxy_pipeline`]).
    proxy_pipe: proxy::ProxyPipe,
    gpu: Option<gpu::Kernels>,
    /// The reduce-scatter, reduce, broadcast, all-to-all and send/recv kernels (GPU backend).
    scatter_rooted: Option<scatter_rooted::Kernels>,
    /// Sends and receives between the ranks of this host (every Collectives has it).
    p2p: Option<send_recv::P2p>,
    /// Sends and receives with ranks on other hosts (across hosts, with the ranks agreed at
    /// set-up: see `send_recv_proxy::agree`; `None` when there are none).
    xp2p: Option<send_recv_proxy::XP2p>,
    /// Across hosts: why send/recv does not reach every rank on another host, if it does not.
    p2p_off: Option<String>,
    /// Across hosts: the TCP channels to the partners and the staging (see `cross.rs`).
    cross: Option<cross::Cross>,
    /// The proxy channels' handles on the host (host backend kernels read them here).
    _host_conns: Vec<DevConn<'static>>,
    _scratch: Registered,
    _semaphores: Registered,
    _local: Registered,
    /// Set once a CUDA call reported a sticky error: every later call returns it.
    context_lost: std::sync::Mutex<Option<String>>,
    /// The stall note of this rank's first device timeout ([`Collectives::stall_note`]):
    /// the peer waited for and the note.
    stall_noted: std::sync::Mutex<Option<(usize, Option<crate::bootstrap::GaveUp>)>>,
    /// Whether the goodbye names the calls this rank made (see `Drop`); off only in a test
    /// of what peers see without it.
    name_calls_at_close: bool,
    /// Keeps the GPU calls in call order across streams ([`order`]).
    order: order::CallOrder,
    /// The staging of fp8 reductions and pre-multiplied sums (`staged.rs`).
    staging: staged::Staging,
}

impl fmt::Debug for Collectives {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collectives")
            .field("rank", &self.comm.rank())
            .field("nranks", &self.comm.nranks())
            .field("config", &self.config)
            .finish()
    }
}

/// This process's settings, or the error naming the variables that do not parse.
fn settings() -> Result<&'static Settings, CommError> {
    Settings::global().map_err(|e| CommError::InvalidArgument(e.to_string()))
}

/// A setting's algorithm: `None` for `Auto` (the config decides).
fn forced<T: PartialEq>(value: T, auto: T) -> Option<T> {
    (value != auto).then_some(value)
}

/// How [`wait_idle`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    /// The stream is idle, or querying it failed (the caller synchronises to learn why).
    Done,
    /// The communicator was aborted first.
    Aborted,
}

/// Waits until `idle` says the stream is idle (or fails), or `aborted` says the communicator
/// was aborted: spins for the first 200 us (short collectives return at once), then
/// yields until 20 ms, then sleeps 50 us between queries; the abort is looked at from the
/// first yield on.
fn wait_idle<E>(
    mut idle: impl FnMut() -> Result<bool, E>,
    mut aborted: impl FnMut() -> bool,
) -> Waited {
    const SPIN: std::time::Duration = std::time::Duration::from_micros(200);
    const YIELD: std::time::Duration = std::time::Duration::from_millis(20);
    let start = std::time::Instant::now();
    loop {
        if idle().unwrap_or(true) {
            return Waited::Done;
        }
        let waited = start.elapsed();
        if waited < SPIN {
            std::hint::spin_loop();
            continue;
        }
        if aborted() {
            return Waited::Aborted;
        }
        if waited < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
}

/// The most blocks a collective kernel may have when ranks share a GPU (several processes on
/// one device under MPS), else `u32::MAX`. The kernels' blocks wait for their peers' blocks,
/// so every kernel of the ranks on one device must fit on it at once: a kernel that fills the
/// device while its local peer's kernel waits for room never ends (seen with four ranks on
/// one H200: two simulated hosts of two, all-gather at 4 MiB). The kernels are built for 512
/// threads at 128 registers, one block per multiprocessor, so each of `k` ranks sharing a
/// device gets `multiprocessors / k` blocks. Every rank computes the same cap from the same
/// table (the most ranks on any one device of the communicator), so grids stay equal on
/// every rank.
fn shared_gpu_block_cap(comm: &Communicator) -> Result<u32, CommError> {
    // Each rank's device as "multiprocessors pci-bus-id machine" (empty on the host
    // backend). The machine, not the bootstrap's host id: simulated hosts
    // (`MSCCLPP_HOST_ID`) split one machine, and their ranks may share its devices.
    let me = match comm.backend() {
        Backend::Gpu(g) => format!(
            "{} {} {}",
            g.info().multiprocessors,
            g.info().pci_bus_id,
            crate::bootstrap::machine_id()
        ),
        Backend::Host => String::new(),
    };
    let table = comm.bootstrap_all_gather(me.as_bytes())?;
    Ok(block_cap_of(&table))
}

/// The cap from every rank's device (as "multiprocessors pci-bus-id machine", empty
/// without a GPU): the most ranks on one device, over the smallest device. The same on
/// every rank, which reads the same table.
fn block_cap_of(devices: &[Vec<u8>]) -> u32 {
    let mut per_device: HashMap<&[u8], u32> = HashMap::new();
    let mut sms = u32::MAX;
    for dev in devices {
        let text = String::from_utf8_lossy(dev);
        if let Some(n) = text.split(' ').next().and_then(|n| n.parse::<u32>().ok()) {
            sms = sms.min(n);
            *per_device.entry(dev.as_slice()).or_default() += 1;
        }
    }
    share_cap(per_device.values().copied().max().unwrap_or(1), sms)
}

/// The block cap for `sharing` ranks on a device of `multiprocessors` (see
/// [`shared_gpu_block_cap`]): no cap for one rank.
fn share_cap(sharing: u32, multiprocessors: u32) -> u32 {
    if sharing <= 1 {
        u32::MAX
    } else {
        (multiprocessors / sharing).max(1)
    }
}

impl Collectives {
    /// Registers scratch and connects every pair of ranks of a host, and each rank to the
    /// ranks of its local index on the other hosts (over TCP; see [Across
    /// hosts](self#across-hosts)) (collective: every rank calls it, with equal configs).
    /// `comm` must have no pending connections of its own; it keeps working for the
    /// caller's own channels afterwards through [`communicator`] (read-only).
    ///
    /// [`communicator`]: Self::communicator
    pub fn new(mut comm: Communicator, config: CollConfig) -> Result<Collectives, CommError> {
        match Self::set_up(&mut comm, config) {
            Ok(assemble) => Ok(assemble(comm)),
            Err(e) => {
                // The communicator drops here, and its bootstrap's goodbye says why: the
                // other ranks, whose set-up fails because this rank left, show this error
                // beside its rank, not only "closed its bootstrap". Not for a failure
                // another rank caused (that rank is named to everyone as it is).
                if !caused_by_another_rank(&e) {
                    let why = format!("setting up its collectives failed on it: {e}");
                    comm.bootstrap().as_async().set_leaving_why(&why);
                }
                Err(e)
            }
        }
    }

    /// [`new`](Self::new) up to the last step: what it returns makes the collectives of the
    /// communicator it is given.
    // Long (~200 lines): the set-up steps run in the order the peers' bootstrap exchanges
    // need (topology, registrations, connections, contexts); cut into functions they would
    // pass most of the half-built state between them.
    fn set_up(
        comm: &mut Communicator,
        mut config: CollConfig,
    ) -> Result<impl FnOnce(Communicator) -> Collectives + use<>, CommError> {
        config.validate()?;
        let settings = settings()?;
        let pdl_env = settings.pdl;
        let block_cap = shared_gpu_block_cap(comm)?;
        // Ranks sharing a GPU agree whether any asked for dependent launch (the same cap
        // everywhere); every rank sees the same cap, so all or none take this step.
        let one_anywhere = block_cap != u32::MAX && {
            let one = pdl_env == PdlMode::On;
            let said = comm.bootstrap_all_gather(&[one as u8])?;
            said.iter().any(|b| b.first() == Some(&1))
        };
        let (pdl, block_cap) = gpu::pdl_plan(pdl_env, block_cap, one_anywhere);
        config.max_blocks = config.max_blocks.min(block_cap);
        let env_all_reduce = forced(settings.allreduce_algo, AllReduceAlgo::Auto);
        let env_all_gather = forced(settings.allgather_algo, AllGatherAlgo::Auto);
        let env_broadcast = forced(settings.broadcast_algo, RootedAlgo::Auto);
        let env_reduce = forced(settings.reduce_algo, RootedAlgo::Auto);
        let proxy_pipe = proxy::ProxyPipe::from_settings(settings)?;
        // The kernels' context spans the local group: this rank's host (every rank, on one
        // host), indexed by local index; other hosts are reached through `cross`.
        let topo = topology::Topology::of(comm)?;
        let spans_hosts = topo.hosts.len() > 1;
        let group: Vec<usize> = topo.group().to_vec();
        let (n, rank) = (group.len(), topo.local);
        let transport = comm.backend().transport();
        // Each of the two regions (see CollContext::scratch_len).
        let region = config.scratch_bytes / 2 / 16 * 16;
        // Two halves of 2 x packet_max_bytes of packets, then the call descriptors.
        let packets_len = (config.packet_max_bytes * 4).next_multiple_of(32) + DESC_BYTES as usize;
        let scratch = comm.alloc_buffer(2 * region)?;
        let semaphores = comm.alloc_buffer(SEMAPHORE_WORDS * 8)?;
        let local = comm.alloc_buffer((EXPECTED_WORDS + STATE_WORDS) * 8)?;
        let mut channels = Vec::new();
        for p in (0..n).filter(|&p| p != rank) {
            let g = group[p];
            let data = comm.connect_memory(g, &scratch, TAG_SCRATCH, transport, packets_len)?;
            let sems = comm.connect_memory(g, &semaphores, TAG_SEMAPHORES, transport, 0)?;
            // One proxy channel per lane (block of a proxy kernel).
            let proxy = (0..proxy_pipe.lanes)
                .map(|l| comm.connect(g, &scratch, TAG_PROXY + l, transport))
                .collect::<Result<Vec<_>, _>>()?;
            channels.push((p, data, sems, proxy));
        }
        let network = if spans_hosts {
            config.cross_transport.resolve()
        } else {
            TransportKind::Tcp
        };
        let (xp2p, p2p_off) = if spans_hosts {
            let declared =
                match send_recv_proxy::peers_of(&settings.p2p_peers, comm.rank(), comm.nranks())? {
                    Some(list) => Some(list),
                    None => config.p2p_peers.clone(),
                };
            let peers = send_recv_proxy::agree(comm, &config, &topo, declared.as_deref())?;
            let off = peers.off.clone();
            let x = if peers.remotes.is_empty() {
                None
            } else {
                Some(send_recv_proxy::XP2p::connect(
                    comm, &config, &topo, peers, network,
                )?)
            };
            (x, off)
        } else {
            (None, None)
        };
        let cross = if spans_hosts {
            Some(cross::Cross::connect(comm, &config, topo, network)?)
        } else {
            None
        };
        comm.connection_setup()?;
        let all = comm.memory_channels();
        // SAFETY: the handles are kept in `_host_conns` (and copied to `gpu`) next to `comm`,
        // which owns their memory, and are used only while `self` lives.
        let proxies = unsafe { comm.device_connections_detached() };
        // conns[l * n + p] = lane l's proxy channel to rank p; the own entries repeat
        // another (unused).
        let host_conns: Vec<DevConn<'static>> = match channels.first() {
            Some((_, _, _, any)) => (0..proxy_pipe.lanes as usize * n)
                .map(|i| {
                    let (l, q) = (i / n, i % n);
                    let lane = channels.iter().find(|c| c.0 == q).map_or(any, |c| &c.3);
                    proxies[lane[l]]
                })
                .collect(),
            None => Vec::new(),
        };
        let base = |b: &Registered| {
            b.device_ptr()
                .unwrap_or_else(|| b.host_ptr().unwrap() as u64)
        };
        let local_base = base(&local);
        let mut ctx = CollContext {
            rank: rank as u32,
            nranks: n as u32,
            timeout_ns: comm.device_timeout().as_nanos().min(u64::MAX as u128) as u64,
            scratch_len: region as u64,
            packets_len: packets_len as u64,
            scratch: base(&scratch) as *mut u8,
            peer_scratch: [std::ptr::null_mut(); MAX_RANKS],
            packets_in: [std::ptr::null_mut(); MAX_RANKS],
            packets_out: [std::ptr::null_mut(); MAX_RANKS],
            sems: base(&semaphores) as *mut u64,
            peer_sems: [std::ptr::null_mut(); MAX_RANKS],
            expected: local_base as *mut u64,
            state: (local_base + EXPECTED_WORDS as u64 * 8) as *mut u64,
            conns: if host_conns.is_empty() {
                std::ptr::null()
            } else {
                host_conns.as_ptr()
            },
            fault: comm.fault_area().kernel_ptr(),
            // The kernels inside a host fail, rather than pass on whatever this rank holds,
            // once a round across hosts failed on this rank; every rank of the group
            // advances this call counter alike, so a call beyond what a rank that left made
            // fails at once (see `guard`).
            guards: guard::LEFT | if cross.is_some() { guard::CROSS } else { 0 },
            coll: std::ptr::null(),
        };
        ctx.peer_scratch[rank] = ctx.scratch;
        ctx.peer_sems[rank] = ctx.sems;
        for &(p, data, sems, _) in &channels {
            let (d, s) = (&all[data], &all[sems]);
            ctx.peer_scratch[p] = d.remote_ptr();
            ctx.packets_in[p] = d.packets_in_ptr();
            ctx.packets_out[p] = d.packets_out_ptr();
            ctx.peer_sems[p] = s.remote_ptr() as *mut u64;
        }
        let mut p2p = send_recv::P2p::new(comm, &config, &ctx, &group, rank)?;
        let gpu = match comm.backend() {
            Backend::Gpu(g) => Some(gpu::Kernels::load(g, &ctx, &host_conns, pdl)?),
            Backend::Host => None,
        };
        let ctx = Box::new(ctx);
        // A send or receive waiting for a rank inside a collective fails at once (one host:
        // the two contexts index the same ranks alike; across hosts the collectives run in
        // rounds the local context does not describe).
        if cross.is_none() {
            let coll = gpu.as_ref().map_or(&*ctx as *const CollContext, |k| {
                k.ctx_ptr() as *const CollContext
            });
            p2p.link_collectives(coll)?;
        }
        let p2p = Some(p2p);
        let cross = cross
            .map(|c| cross::Cross::finish(comm, c, gpu.as_ref()))
            .transpose()?;
        let xp2p = xp2p
            .map(|x| send_recv_proxy::XP2p::finish(comm, x, gpu.as_ref()))
            .transpose()?;
        let scatter_rooted = gpu
            .as_ref()
            .map(scatter_rooted::Kernels::load)
            .transpose()?;
        // Up on every rank or on none: a rank whose set-up failed above (a setting that
        // differs from its peers', say) leaves, and the others learn it here (the
        // bootstrap's error naming it, a peer's loss as callers such as the NCCL library's
        // fallback read it), rather than from their first call.
        comm.bootstrap_all_gather(&[1])?;
        if comm.nranks() > 1 {
            comm.proxy_launch()?;
        }
        watch_departures(comm, &group);
        Ok(move |comm| Collectives {
            comm,
            config,
            block_cap,
            ctx,
            env_all_reduce,
            env_all_gather,
            env_broadcast,
            env_reduce,
            proxy_pipe,
            gpu,
            scatter_rooted,
            p2p,
            xp2p,
            p2p_off,
            cross,
            _host_conns: host_conns,
            _scratch: scratch,
            _semaphores: semaphores,
            _local: local,
            context_lost: std::sync::Mutex::new(None),
            stall_noted: std::sync::Mutex::new(None),
            name_calls_at_close: true,
            order: order::CallOrder::new(),
            staging: staged::Staging::new(),
        })
    }

    /// The communicator underneath.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// Aborts the collectives (and their communicator, see [`Communicator::abort`]): the
    /// waits of every collective in flight on this rank give up within milliseconds, and
    /// this and every later call returns [`CommError::Aborted`]. Other ranks are not told.
    pub fn abort(&self) {
        self.comm.abort();
    }

    /// The error of an earlier call, if one failed (NCCL's `ncclCommGetAsyncError`).
    ///
    /// GPU calls return when the kernel is launched; a kernel that finds the ranks
    /// disagree about the call ([`CommError::CallMismatch`]), whose wait times out
    /// ([`CommError::Timeout`]) or is aborted ([`CommError::Aborted`]: a rank died, or
    /// [`abort`](Self::abort)) writes a record into memory the host reads without
    /// synchronising. This returns it: a mismatch once (it is cleared when returned, and the
    /// communicator stays usable), a timeout or an abort every time (the communicator is
    /// unusable: after them, ranks no longer agree on what was signalled). A lost CUDA
    /// context ([`CommError::ContextLost`]) is also returned every time once a call has
    /// seen it.
    ///
    /// Every GPU call checks the fatal ones (abort, timeout, lost context) before it
    /// launches, so such an error of an earlier call is returned by the next call if nobody
    /// asked before, and nothing more is launched. A pending *mismatch* does not stop the
    /// next call: whether a rank's host has seen its kernel's record yet depends on timing,
    /// so refusing would make some ranks launch and others not (and the launched ones time
    /// out). Mismatches are returned here and by [`synchronize`](Self::synchronize): call
    /// one of them after the work (as `mscclpp-perf` does) to learn of them. Do not call it
    /// while a collective of this communicator may still run (a mismatch record being
    /// cleared then could lose a newer one); after synchronising the stream is right.
    pub fn async_error(&self) -> Result<(), CommError> {
        self.check_fault("async_error", true)
    }

    /// Synchronises `stream`, then returns [`async_error`](Self::async_error): the
    /// outcome of every collective queued on it. GPU backend only. A sticky CUDA error
    /// (an earlier kernel trapped or faulted) is returned as [`CommError::ContextLost`].
    ///
    /// The wait has a way out: an abort of the communicator (a rank lost, or
    /// [`abort`](Self::abort)) ends it with [`CommError::Aborted`] even while work on the
    /// stream has not run, e.g. kernels that cannot start because ranks sharing one GPU
    /// hold it (the work stays queued; memory freed stream-ordered after it is safe).
    pub fn synchronize(&self, stream: &CudaStream) -> Result<(), CommError> {
        self.gpu_kernels("synchronize")?;
        let area = self.comm.fault_area();
        let idle = || crate::cuda::stream_idle(stream);
        let aborted = || area.abort_reason().is_some();
        if !matches!(wait_idle(idle, aborted), Waited::Aborted) {
            return self.synchronize_now(stream);
        }
        match self.check_fault("synchronize", true) {
            Err(e) => Err(e),
            Ok(()) => Err(CommError::Aborted(
                "synchronize: the communicator was aborted".into(),
            )),
        }
    }

    /// [`synchronize`](Self::synchronize) once the stream is idle (or its query failed:
    /// `cuStreamSynchronize` then returns the same error, classified).
    fn synchronize_now(&self, stream: &CudaStream) -> Result<(), CommError> {
        if let Err(e) = stream.synchronize() {
            let e = gpu::classify("synchronize", "cuStreamSynchronize", e);
            self.note_lost(&e);
            // A kernel of ours that failed in a wait records why; say so first.
            self.check_fault("synchronize", true)?;
            return Err(e);
        }
        self.check_fault("synchronize", true)
    }

    /// `r`, remembering a lost context.
    /// Orders a GPU call on `stream` after this communicator's previous calls, whatever
    /// their streams ([`order`]); its work must be queued while the returned guard lives.
    /// The stream's context must be bound ([`gpu::check_stream`]).
    fn ordered(&self, call: &str, stream: &CudaStream) -> Result<order::Ordered<'_>, CommError> {
        self.noted(self.order.enter(call, stream))
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.comm.nranks()
    }

    /// The number of hosts the ranks are on (bootstrap host ids), or of the groups the
    /// hosts are cut into when they are not alike (see
    /// [`layout_note`](Self::layout_note)); above 1 the collectives run across hosts (see
    /// [Across hosts](self#across-hosts)).
    pub fn hosts(&self) -> usize {
        self.cross.as_ref().map_or(1, |c| c.topo.hosts.len())
    }

    /// Across hosts: whether the cross buffer (the memory the rounds across hosts pass
    /// through) is pinned host memory mapped into the device, which the TCP transport's
    /// sockets read and write directly (see [`CROSS_BUFFER_ENV`]). `false` on one host, on
    /// the Host backend, over IB, and with `MSCCLPP_CROSS_BUFFER=device`.
    pub fn cross_buffer_mapped(&self) -> bool {
        self.cross.as_ref().is_some_and(|c| c.buffer_mapped())
    }

    /// Why the ranks' hosts are not used as such, if they are not: hosts with different
    /// rank counts, or one with more than 8 ranks, are cut into groups of one size (at most
    /// 8, dividing every host's count; at worst every rank its own group) that take the
    /// hosts' place (proxy channels between groups: the network between machines, the copy
    /// engine or shared memory inside one). `None` on one host and on alike hosts. Tools
    /// print it (`mscclpp-perf` does); [`hosts`](Self::hosts) counts the groups.
    pub fn layout_note(&self) -> Option<&str> {
        self.cross.as_ref().and_then(|c| c.topo.flat.as_deref())
    }

    /// Why send/recv does not reach every rank on other hosts for this `Collectives`, if it
    /// does not: it spans hosts, and either has more ranks on other hosts than
    /// [`CollConfig::p2p_remote_max`] (each would take two network channels) with no peers
    /// named, or reaches only the pairs named in [`CollConfig::p2p_peers`] /
    /// `MSCCLPP_P2P_PEERS`; a send or receive naming another rank on another host is
    /// refused. `None` on one host, and when every rank can be reached. Callers that can
    /// send such transfers another way (the NCCL library forwards them to the real NCCL)
    /// ask this at set-up.
    pub fn send_recv_across_hosts_off(&self) -> Option<String> {
        self.p2p_off.clone()
    }

    /// Whether a send to or receive from rank `peer` is served: a rank of this host (any
    /// rank, on one host), or one on another host that send/recv across hosts reaches
    /// (see [`send_recv_across_hosts_off`](Self::send_recv_across_hosts_off)). `false` for
    /// this rank and for a number that is not a rank.
    pub fn send_recv_reaches(&self, peer: usize) -> bool {
        if peer >= self.nranks() || peer == self.rank() {
            return false;
        }
        match self.cross() {
            None => true,
            Some(c) => {
                c.topo.group().contains(&peer)
                    || self.xp2p.as_ref().is_some_and(|x| x.reaches(peer))
            }
        }
    }

    /// The settings.
    pub fn config(&self) -> &CollConfig {
        &self.config
    }

    /// The GPU of a GPU-backend communicator.
    pub fn gpu(&self) -> Option<&Gpu> {
        match self.comm.backend() {
            Backend::Gpu(g) => Some(g),
            Backend::Host => None,
        }
    }

    /// Largest all-reduce (bytes per rank) the one-shot algorithm can carry.
    pub fn one_shot_max_bytes(&self) -> usize {
        one_shot_max_bytes(self.ctx.packets_len) as usize
    }
}

/// How long a dropped [`Collectives`] waits for the work of its GPU context to end before
/// its goodbye names the calls it made ([`Collectives::calls_made`]); past it, the goodbye
/// names none and peers waiting for a call it never made wait for their timeout.
const CALLS_AT_CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Makes the waits of this rank's kernels give up on a call that a rank of `group` (the
/// ranks whose kernels advance this rank's call counter alike) never made because it left
/// first: its goodbye names its calls ([`Collectives::calls_made`]), and the fault area's
/// [`fault::LEFT`] word takes the fewest. A goodbye that names its calls also says that
/// the rank's work had ended, so everything it wrote has landed: the send/receive waits for
/// it give up too ([`fault::LEFT_PEERS`]). (Ranks on other hosts count their own kernels;
/// their departures are seen by the rounds across hosts.)
fn watch_departures(comm: &Communicator, group: &[usize]) {
    let area = Arc::downgrade(comm.fault_area());
    let group = group.to_vec();
    comm.bootstrap()
        .as_async()
        .on_peer_left(move |rank, calls| {
            if let (Some(calls), Some(area)) = (calls, area.upgrade())
                && let Some(index) = group.iter().position(|&r| r == rank)
            {
                area.note_left(rank, calls);
                area.note_left_peer(index);
            }
        });
}

impl Collectives {
    /// The collective calls this rank's kernels made (its call counter), every one finished:
    /// on a GPU once no work of the context is left (waiting at most
    /// [`CALLS_AT_CLOSE_WAIT`]); `None` when that wait ran out or the counter cannot be read.
    fn calls_made(&self) -> Option<u64> {
        if let Some(g) = self.gpu()
            && !idle_within(g, CALLS_AT_CLOSE_WAIT)
        {
            return None;
        }
        let mut words = [0u64; COUNTER_WORDS];
        self._local.read(EXPECTED_WORDS * 8, &mut words).ok()?;
        words.into_iter().max()
    }
}

#[cfg(test)]
impl Collectives {
    /// Drops without naming this rank's calls in the goodbye (as when its GPU work did not
    /// end in time): peers' waits then run to their timeout.
    pub(crate) fn drop_without_naming_calls(mut self) {
        self.name_calls_at_close = false;
    }
}

impl Drop for Collectives {
    fn drop(&mut self) {
        // The goodbye (sent when the communicator drops, next) names the calls this rank
        // made, so that peers stop waiting for a call it never makes (`watch_departures`).
        if self.name_calls_at_close
            && let Some(calls) = self.calls_made()
        {
            self.comm.bootstrap().as_async().set_calls_at_close(calls);
        }
    }
}

/// `count * size` or an error naming the call.
fn checked_bytes(call: &str, count: usize, size: usize) -> Result<usize, CommError> {
    count
        .checked_mul(size)
        .filter(|&b| b as u64 <= u64::MAX / 4)
        .ok_or_else(|| CommError::InvalidArgument(format!("{call}: count {count} is too large")))
}

#[cfg(test)]
mod proxy_tests;
#[cfg(test)]
mod tests;
