//! Collectives: all-reduce, all-gather, reduce-scatter, reduce, broadcast and all-to-all over
//! memory channels (docs/guide/06-design.md §8), and sends and receives.
//!
//! Every operation is one generic call over [`Buffer`]s (and an in-place form), in a file of
//! its own: `all_reduce.rs`, `all_gather.rs`, `reduce_scatter.rs`, `reduce.rs`,
//! `broadcast.rs`, `all_to_all.rs`, `send_recv.rs` and `ll_exchange.rs` (a benchmark
//! reference). What a call reads and writes and where it runs are in `buffer.rs`
//! ([`Buffer`], [`RawBuffer`], [`Exec`]); what runs the kernels (GPU or Host) and which
//! ranks they span (one host or several) in `engine.rs`; every choice among algorithms in
//! `select.rs`. What they share is in files named for it: `types.rs` (element types and
//! operations), `config.rs` ([`CollConfig`]), `set_up.rs` ([`Collectives::new`]),
//! `launch.rs` (grids, the host backend's CPU threads, the local all-gather), `gpu.rs` (the
//! loaded module, stream checks, dependent launch), `kernel_table.rs` (which kernel runs a
//! type), `scatter_rooted.rs` (the paths of reduce-scatter, reduce, broadcast and
//! all-to-all), `descriptor.rs` (call descriptors), `failure.rs` (why a call failed),
//! `topology.rs` (hosts and groups), `cross.rs` (the step across hosts),
//! `cross_collectives.rs` (the collectives across hosts), `send_recv_proxy.rs` (send/recv
//! with other hosts), `proxy.rs` (the proxy all-reduce's pipeline), `staged.rs` (fp8 and
//! pre-multiplied sums) and `order.rs` (call order across streams).
//!
//! [`Collectives`] takes a set-up-less [`Communicator`], connects a memory channel to every
//! other rank over a scratch buffer registered once (plus LL-packet scratch and an array of
//! semaphores), and then runs the collective kernels of the device crate. Calls allocate
//! nothing and never synchronise with the host, so they may be captured into a CUDA graph.
//!
//! On the GPU backend the buffers are device memory (cudarc
//! [`CudaSlice`](crate::cuda::CudaSlice)s and views, or [`RawBuffer::device`]) and calls are
//! stream-ordered on the caller's [`CudaStream`]. On the host backend (no GPU) the buffers are
//! host memory, the same kernels run on CPU threads over shared memory, and calls
//! ([`Exec::Host`]) block until done.
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
mod config;
mod cross;
mod cross_collectives;
mod descriptor;
mod engine;
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
mod set_up;
mod staged;
mod topology;
mod types;

pub use buffer::{Buffer, BufferMut, Exec, Memory, Place, RawBuffer};
pub use config::CollConfig;
pub use cross::CROSS_BUFFER_ENV;
/// Most sends and receives in one [`Collectives::group`].
pub use mscclpp_device::collectives::send_recv::MAX_P2P_OPS;
pub use select::{
    CROSS_TWO_SHOT_SAVES, HOST_ALL_PAIRS_MAX, HOST_ONE_SHOT_MAX, HOST_TWO_RANK_ONE_SHOT_MAX,
    ROOTED_PIPELINED_ABOVE, TWO_RANK_ONE_SHOT_MAX,
};
pub use send_recv::P2pOp;
pub use send_recv_proxy::P2P_PEERS_ENV;
pub use staged::{Fp8E4M3, Fp8E5M2, PreMulScalar, STAGING_BYTES};
pub use types::{DataType, Element, ReduceOp};

use crate::communicator::{Backend, Buffer as Registered, CommError, Communicator, idle_within};
use crate::cuda::{CudaStream, Gpu};
use mscclpp_device::channel::DevConn;
use mscclpp_device::collectives::{COUNTER_WORDS, CollContext, EXPECTED_WORDS, one_shot_max_bytes};
use std::fmt;

/// All-reduce, all-gather and rooted algorithms and the network between hosts
/// ([`CollConfig::cross_transport`]): defined with the settings that choose them
/// (`MSCCLPP_ALLREDUCE_ALGO`, ...).
pub use crate::settings::{AllGatherAlgo, AllReduceAlgo, CrossTransport, RootedAlgo};

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
    /// What runs the kernels: the GPU's loaded modules, or CPU threads.
    engine: engine::Engine,
    /// One host, or several (with the cross-host state).
    span: engine::Span,
    /// Sends and receives between the ranks of this host (or group).
    p2p: send_recv::P2p,
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

impl Collectives {
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
        self.cross().map_or(1, |c| c.topo.hosts.len())
    }

    /// Across hosts: whether the cross buffer (the memory the rounds across hosts pass
    /// through) is pinned host memory mapped into the device, which the TCP transport's
    /// sockets read and write directly (see [`CROSS_BUFFER_ENV`]). `false` on one host, on
    /// the Host backend, over IB, and with `MSCCLPP_CROSS_BUFFER=device`.
    pub fn cross_buffer_mapped(&self) -> bool {
        self.cross().is_some_and(|c| c.buffer_mapped())
    }

    /// Why the ranks' hosts are not used as such, if they are not: hosts with different
    /// rank counts, or one with more than 8 ranks, are cut into groups of one size (at most
    /// 8, dividing every host's count; at worst every rank its own group) that take the
    /// hosts' place (proxy channels between groups: the network between machines, the copy
    /// engine or shared memory inside one). `None` on one host and on alike hosts. Tools
    /// print it (`mscclpp-perf` does); [`hosts`](Self::hosts) counts the groups.
    pub fn layout_note(&self) -> Option<&str> {
        self.cross().and_then(|c| c.topo.flat.as_deref())
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
        self.across_hosts().and_then(|a| a.p2p_off.clone())
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
                c.topo.group().contains(&peer) || self.remote_p2p().is_some_and(|x| x.reaches(peer))
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
