//! Collectives across hosts, GPU and Host backends: ranks of one host keep the
//! memory channels and kernels of a one-host [`Collectives`] (over the *local group*: the
//! host's ranks, indexed by local index), and reach the other hosts through proxy channels
//! ([`TransportKind::Tcp`] or [`TransportKind::Ib`], `CollConfig::cross_transport`) to
//! their *partners*: the ranks with the same local index on the other hosts (one per host).
//! Design notes and the order of summation: docs/guide/06-design.md §8, "Across hosts".
//!
//! Every cross-host step is one *round* of `mscclpp_device::collectives::cross::step`: this
//! rank puts a 32-byte header (the round number and the call's descriptor) and a payload
//! from a send slot of its cross buffer into its slot of every partner's receive area, with
//! the signal, waits for every partner's signal (fault-aware: abort word, device timeout),
//! checks their headers, and reduces the hosts' payloads in host order (or gathers them).
//! Receive slots alternate between two halves by round: a rank writes a partner's half of
//! round `k + 2` only after it has received that partner's round `k + 1`, which the partner
//! sends only after its round `k` ended, so no acknowledgement is needed. The ranks of one
//! cross group (one local index) exchange among themselves only; different groups never
//! meet, so a group whose ranks all take fewer rounds than another's (a broadcast's groups
//! other than the root's trade one header round) stays in step.
//!
//! One orchestration ([`Exec`]) serves both backends: on a GPU the step is the one-block
//! `cross_step` kernel and the copies are `cuMemcpyAsync`, all queued on the caller's
//! stream (no host synchronisation, no allocation: capturable into a CUDA graph; the round
//! counter lives in device memory, so graph replays keep alternating); on the Host backend
//! the same step runs in the calling thread and the calls block. A cross-host failure (a
//! timeout, an abort, a lost peer, calls that differ between hosts) is sticky: the rounds of
//! the partners no longer agree, so every later call returns it (a fault record that is
//! never cleared, and `fault::CROSS_BROKEN`, which makes every later step skip its work).
//!
//! This file holds the cross context (buffers, channels, the step's kernels) and the step;
//! the collectives built from it are in `cross_collectives.rs`, where the ranks are in
//! `topology.rs`, and the reading of a cross-host failure in `failure.rs`.

use super::descriptor::all_reduce_tag;

use super::launch::one_shot_grid;
use super::select::MAPPED_GRID_REDUCE_BYTES;
use super::topology::Topology;
use super::{AllGatherAlgo, AllReduceAlgo, CollConfig, Collectives, DataType, ReduceOp, gpu};
use crate::communicator::{Backend, Buffer, CommError, Communicator};
use crate::cuda::{CudaFunction, CudaStream, DeviceBuffer, Gpu, memcpy_async};
use crate::transport::TransportKind;
use crate::transport::tags::TAG_CROSS;
use cudarc::driver::LaunchConfig;
use cudarc::driver::PushKernelArg;
use mscclpp_device::channel::DevConn;
use mscclpp_device::collectives::cross::{HEADER_ONLY, REDUCE};
use mscclpp_device::collectives::{CollContext, MAX_RANKS, STATE_WORDS, cross as xk, desc, fault};
use std::sync::Mutex;

/// Bytes of the header before every payload: round, descriptor (`n`, tag), payload bytes.
const HDR: usize = xk::HDR as usize;

/// Environment variable: where the cross buffer of a GPU rank whose partners are all
/// reached over TCP lives ([`CollConfig::cross_buffer_host`]): `host` (the default: pinned
/// host memory mapped into the device, which the sockets read and write directly) or
/// `device` (device memory, staged through pinned slots by the copy engine).
pub const CROSS_BUFFER_ENV: &str = "MSCCLPP_CROSS_BUFFER";

/// Allocates the buffer of the proxy channels across hosts (`bytes`): host-mapped when
/// the backend is a GPU, every channel of it goes over TCP (`transports`), and the config
/// asks for it; else the backend's connection memory.
pub(super) fn alloc_cross_buffer(
    comm: &Communicator,
    config: &CollConfig,
    transports: impl IntoIterator<Item = TransportKind>,
    bytes: usize,
) -> Result<Buffer, CommError> {
    let mapped = config.cross_buffer_host
        && matches!(comm.backend(), Backend::Gpu(_))
        && transports.into_iter().all(|t| t == TransportKind::Tcp);
    if mapped {
        comm.alloc_mapped_buffer(bytes)
    } else {
        comm.alloc_buffer(bytes)
    }
}

/// Most reducing blocks beside the step's (each reads host memory at a fraction of PCIe's
/// rate).
const MAPPED_REDUCE_BLOCKS: u32 = 16;

/// The driver's variable for the hardware work queues of a process's streams.
pub(super) const WORK_QUEUES_ENV: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// What a timeout across hosts should add when `CUDA_DEVICE_MAX_CONNECTIONS` (`value`) is
/// set below 4: the step kernel spins while the proxy's copies and flag writes run on
/// streams of their own, and with fewer queues than streams they can wait behind the kernel
/// that waits for them (docs/guide/04-several-machines.md). `None` when unset or at least 4.
pub(super) fn work_queue_hint(value: Option<&str>) -> Option<String> {
    let v = value?;
    match v.trim().parse::<u32>() {
        Ok(n) if n >= 4 => None,
        _ => Some(format!(
            "{WORK_QUEUES_ENV}={v} is set: with that few hardware work queues the proxy's \
             copies can wait behind the kernel that waits for them; unset it or set it to 8"
        )),
    }
}

/// What a Host-backend call holds while it runs: the staging memory.
#[derive(Debug)]
struct State {
    /// A reduced shard / the gathered pieces of one round (`payload` bytes).
    shard: Vec<u8>,
    /// The local group's side of one round (`nlocal * payload` bytes).
    stage: Vec<u8>,
    /// Set once a cross-host step failed: every later call returns it.
    broken: Option<CommError>,
}

/// The GPU side of a [`Cross`]: the cross context and the staging in device memory, and
/// the step kernel.
#[derive(Debug)]
struct GpuCross {
    /// The cross context (the step kernel takes its address).
    ctx: DeviceBuffer,
    /// The partners' handles (the context points at them).
    _conns: DeviceBuffer,
    /// The step's state words (the context points at them).
    _state: DeviceBuffer,
    /// A reduced shard / the gathered pieces of one round (`payload` bytes).
    shard: DeviceBuffer,
    /// The local group's side of one round (`nlocal * payload` bytes).
    stage: DeviceBuffer,
    /// `cross_step` of the loaded module.
    step: CudaFunction,
}

/// The cross-host state of a [`Collectives`] spanning hosts.
#[derive(Debug)]
pub(super) struct Cross {
    pub(super) topo: Topology,
    /// `conns[h]`: the proxy channel (TCP) to this rank's partner on host `h`; the own
    /// host's entry repeats another (unused). The host copy of the context points here.
    _conns: Vec<DevConn<'static>>,
    /// The cross context (`mscclpp_device::collectives::cross`) with host addresses: the
    /// Host backend runs the step over it in the calling thread.
    ctx: Box<CollContext>,
    /// The step's state words on the Host backend (the host context points here).
    _host_state: Box<[u64]>,
    /// Address of the cross buffer (host or device): `hosts` send slots, then two halves
    /// of `hosts` receive slots, `slot` bytes each.
    base: u64,
    slot: usize,
    /// Payload bytes a round carries: a slot's, on the Host backend at most
    /// [`CollConfig::host_cross_round_bytes`].
    round: usize,
    state: Mutex<State>,
    gpu: Option<GpuCross>,
    buf: Buffer,
}

/// Bytes of each slot of the cross buffer for `hosts` hosts: the buffer holds `3 * hosts`
/// slots in `scratch_bytes / 2` (so its size does not grow with the job), each at least
/// 4 KiB and at least 16 payload bytes per host (an all-gather round gathers a piece of 16
/// bytes or more from every host into one slot's worth).
fn slot_bytes(config: &CollConfig, hosts: usize) -> usize {
    (config.scratch_bytes / 2 / (3 * hosts))
        .max(4096)
        .max(16 * hosts + HDR)
        .next_multiple_of(16)
}

/// Payload bytes a round across hosts carries with slots of `slot` bytes for `hosts` hosts:
/// a slot's payload, on the Host backend at most [`CollConfig::host_cross_round_bytes`]
/// (a multiple of 16, at least 16 bytes per host). Every rank must carry the same, or a
/// round of one would pair with part of a partner's: the ranks compare theirs (a bootstrap
/// all-gather) and fail the set-up naming both settings when they differ.
fn round_bytes(
    comm: &Communicator,
    config: &CollConfig,
    slot: usize,
    hosts: usize,
) -> Result<usize, CommError> {
    let payload = slot - HDR;
    let round = match comm.backend() {
        Backend::Gpu(_) => payload,
        _ => payload.min((config.host_cross_round_bytes / 16 * 16).max(16 * hosts)),
    };
    let all = comm.bootstrap_all_gather(&(round as u64).to_le_bytes())?;
    let rounds: Vec<u64> = all
        .iter()
        .map(|b| {
            b.get(..8)
                .and_then(|w| w.try_into().ok())
                .map_or(0, u64::from_le_bytes)
        })
        .collect();
    if rounds.iter().any(|&r| r != round as u64) {
        let list = rounds
            .iter()
            .enumerate()
            .map(|(r, b)| format!("rank {r}: {b}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(CommError::InvalidArgument(format!(
            "collectives across hosts: the ranks carry different bytes per round ({list}); \
             set MSCCLPP_COLL_SCRATCH_BYTES and MSCCLPP_HOST_CROSS_ROUND_BYTES \
             (CollConfig::scratch_bytes, host_cross_round_bytes) alike on every rank"
        )));
    }
    Ok(round)
}

/// A connection request made before the communicator's setup, completed by
/// [`Cross::finish`].
pub(super) struct Pending {
    topo: Topology,
    buf: Buffer,
    slot: usize,
    /// Payload bytes a round carries (see [`round_bytes`]).
    round: usize,
    /// `(host, index in device_connections)` of each partner's channel.
    channels: Vec<(usize, usize)>,
}

/// The algorithm code (the descriptor's [`desc::ALGO_SHIFT`] field) of the two-shot forms
/// across hosts, for all-reduce, reduce and broadcast alike (one-shot's is 0).
pub(super) fn two_shot_code() -> u64 {
    let tag = all_reduce_tag(AllReduceAlgo::TwoShot, DataType::F32, ReduceOp::Sum);
    desc::field(tag, desc::ALGO_SHIFT)
}

/// The address of a registered buffer (device or host memory).
pub(super) fn buffer_addr(b: &Buffer) -> u64 {
    b.device_ptr()
        .or_else(|| b.host_ptr().map(|a| a as u64))
        .expect("a buffer has an address")
}

/// A [`CollContext`] for a step over proxy channels alone (the cross-host step, the remote_p2p
/// transfers): `(rank, nranks)` as the step counts them, the buffer's `(address, slot
/// bytes)` as its scratch, its own state words and handles, the communicator's timeout and
/// fault area; the memory-channel fields null.
pub(super) fn proxy_context(
    comm: &Communicator,
    (rank, nranks): (usize, usize),
    (base, slot): (u64, usize),
    state: *mut u64,
    conns: *const DevConn<'static>,
) -> CollContext {
    CollContext {
        rank: rank as u32,
        nranks: nranks as u32,
        timeout_ns: comm.device_timeout().as_nanos().min(u64::MAX as u128) as u64,
        scratch_len: slot as u64,
        packets_len: 0,
        scratch: base as *mut u8,
        peer_scratch: [std::ptr::null_mut(); MAX_RANKS],
        packets_in: [std::ptr::null_mut(); MAX_RANKS],
        packets_out: [std::ptr::null_mut(); MAX_RANKS],
        sems: std::ptr::null_mut(),
        peer_sems: [std::ptr::null_mut(); MAX_RANKS],
        expected: std::ptr::null_mut(),
        state,
        conns,
        fault: comm.fault_area().kernel_ptr(),
        // The step has its own handling of a failed round, and counts rounds, not the
        // collectives' calls.
        guards: 0,
        coll: std::ptr::null(),
    }
}

/// The device side of a [`proxy_context`]: copies `conns` to device memory and allocates
/// zeroed state words there, and points `ctx` at both (the buffers must outlive its use).
pub(super) fn proxy_context_on_device(
    gpu: &Gpu,
    ctx: &mut CollContext,
    conns: &[DevConn<'static>],
) -> Result<(DeviceBuffer, DeviceBuffer), CommError> {
    let conn_mem = DeviceBuffer::zeroed(gpu, std::mem::size_of_val(conns).max(8))?;
    conn_mem.copy_from_host(0, conns)?;
    ctx.conns = conn_mem.device_ptr() as *const DevConn<'static>;
    let state = DeviceBuffer::zeroed(gpu, STATE_WORDS * 8)?;
    ctx.state = state.device_ptr() as *mut u64;
    Ok((conn_mem, state))
}

/// Whether a fault record is a cross-host step's.
pub(super) fn is_cross(place: u64) -> bool {
    matches!(
        place,
        fault::AT_CROSS | fault::AT_CROSS_ROUND | fault::AT_CROSS_GONE | fault::AT_CROSS_REDUCE
    )
}

impl Cross {
    /// Registers the cross buffer and asks for a proxy channel over `network` (TCP or IB)
    /// to every partner (the setup itself is the caller's `connection_setup`).
    pub(super) fn connect(
        comm: &mut Communicator,
        config: &CollConfig,
        topo: Topology,
        network: TransportKind,
    ) -> Result<Pending, CommError> {
        let nh = topo.hosts.len();
        let slot = slot_bytes(config, nh);
        let round = round_bytes(comm, config, slot, nh)?;
        let partners: Vec<(usize, usize, TransportKind)> = (0..nh)
            .filter(|&h| h != topo.host)
            .map(|h| {
                let p = topo.rank_at(h, topo.local);
                (
                    h,
                    p,
                    topo.transport_to(p, network, comm.backend().transport()),
                )
            })
            .collect();
        let bytes = xk::buffer_bytes(slot as u64, nh as u64) as usize;
        let buf = alloc_cross_buffer(comm, config, partners.iter().map(|&(_, _, t)| t), bytes)?;
        let mut channels = Vec::new();
        for (h, p, t) in partners {
            channels.push((h, comm.connect(p, &buf, TAG_CROSS, t)?));
        }
        Ok(Pending {
            topo,
            buf,
            slot,
            round,
            channels,
        })
    }

    /// After the setup: takes the channels' handles and builds the cross context (on a GPU,
    /// its device copy, the device staging and the step kernel of `kernels`).
    pub(super) fn finish(
        comm: &Communicator,
        p: Pending,
        kernels: Option<&gpu::Kernels>,
    ) -> Result<Cross, CommError> {
        // SAFETY: the handles are kept in the Cross, which lives in the Collectives next to
        // `comm` (which owns their memory), and are used only while it lives.
        let all = unsafe { comm.device_connections_detached() };
        let nh = p.topo.hosts.len();
        let any = all[p.channels[0].1];
        let mut conns = vec![any; nh];
        for &(h, i) in &p.channels {
            conns[h] = all[i];
        }
        let nlocal = p.topo.group().len();
        let payload = p.slot - HDR;
        let base = buffer_addr(&p.buf);
        let mut host_state = vec![0u64; STATE_WORDS].into_boxed_slice();
        let ctx = proxy_context(
            comm,
            (p.topo.host, nh),
            (base, p.slot),
            host_state.as_mut_ptr(),
            conns.as_ptr(),
        );
        let gpu = match (comm.backend(), kernels) {
            (Backend::Gpu(g), Some(k)) => {
                Some(GpuCross::load(g, k, &ctx, &conns, payload, nlocal)?)
            }
            _ => None,
        };
        let round = p.round;
        let (shard, stage) = if gpu.is_some() {
            (Vec::new(), Vec::new())
        } else {
            (vec![0; round], vec![0; nlocal * round])
        };
        Ok(Cross {
            ctx: Box::new(ctx),
            _host_state: host_state,
            _conns: conns,
            base,
            slot: p.slot,
            round,
            state: Mutex::new(State {
                shard,
                stage,
                broken: None,
            }),
            gpu,
            topo: p.topo,
            buf: p.buf,
        })
    }

    pub(super) fn hosts(&self) -> usize {
        self.topo.hosts.len()
    }

    /// Whether the cross buffer is host-mapped memory.
    pub(super) fn buffer_mapped(&self) -> bool {
        self.buf.is_mapped()
    }

    pub(super) fn nlocal(&self) -> usize {
        self.topo.group().len()
    }

    /// Payload bytes a round carries (a multiple of 16): a slot's, on the Host backend at
    /// most [`CollConfig::host_cross_round_bytes`].
    pub(super) fn payload(&self) -> usize {
        self.round
    }

    /// Payload address of send slot `h`.
    pub(super) fn send_payload(&self, h: usize) -> u64 {
        self.base + xk::send_slot(self.slot as u64, h as u64) + HDR as u64
    }
}

impl GpuCross {
    fn load(
        gpu: &Gpu,
        kernels: &gpu::Kernels,
        host_ctx: &CollContext,
        conns: &[DevConn<'static>],
        payload: usize,
        nlocal: usize,
    ) -> Result<GpuCross, CommError> {
        let mut ctx = *host_ctx;
        let (conn_mem, state) = proxy_context_on_device(gpu, &mut ctx, conns)?;
        let mem = DeviceBuffer::zeroed(gpu, std::mem::size_of::<CollContext>())?;
        mem.copy_from_host(0, std::slice::from_ref(&ctx))?;
        Ok(GpuCross {
            ctx: mem,
            _conns: conn_mem,
            _state: state,
            shard: DeviceBuffer::zeroed(gpu, payload)?,
            stage: DeviceBuffer::zeroed(gpu, nlocal * payload)?,
            step: kernels.function("cross_step")?,
        })
    }
}

impl Collectives {
    /// A collective call of no elements (`kind`: its [`desc`] collective code; `dtype`,
    /// `op` and `root` where it has them), on `ex`. It moves nothing but still takes part in
    /// the exchange of call descriptors, so that a rank that called with no elements while
    /// the others called with some fails the call on every rank it shares a check with (a
    /// [`CommError::CallMismatch`] naming both sides) instead of pairing with their next
    /// call; when every rank calls with none, it passes and the ranks stay in step. In the
    /// local group: the one-shot all-reduce kernel with no elements carrying the call's
    /// descriptor; across hosts, then a round with the partners carrying the header alone.
    pub(super) fn empty_call(
        &self,
        ex: Exec<'_>,
        call: &str,
        kind: u64,
        dtype: DataType,
        op: Option<ReduceOp>,
        root: Option<usize>,
    ) -> Result<(), CommError> {
        let tag = desc::rooted_tag(
            kind,
            super::descriptor::dtype_code(dtype),
            op.map_or(0, super::descriptor::op_desc),
            0,
            root.map_or(0, |r| r as u64),
        );
        let local = || -> Result<(), CommError> {
            if self.ctx.nranks < 2 {
                return Ok(());
            }
            match ex {
                Exec::Gpu(stream) => {
                    let kernels = self.gpu_kernels(call)?;
                    let f =
                        kernels.all_reduce(AllReduceAlgo::OneShot, DataType::F32, ReduceOp::Sum);
                    let (blocks, threads) = one_shot_grid(0, self.config.threads, self.block_cap);
                    // SAFETY: no elements: the kernel touches no user memory, only this
                    // communicator's registered memory, which the context holds.
                    self.noted(unsafe {
                        kernels.launch(stream, f, 0, 0, 0, tag, blocks, threads, true)
                    })
                }
                Exec::Host => {
                    let f = super::kernel_table::all_reduce_host_kernel(
                        AllReduceAlgo::OneShot,
                        DataType::F32,
                        ReduceOp::Sum,
                    );
                    let ctx = &*self.ctx as *const CollContext as u64;
                    self.run_host_alone(call, || {
                        // SAFETY: the context holds this communicator's shared memory; no
                        // elements, so no user memory is touched; one-shot takes a block
                        // of one thread.
                        unsafe {
                            f(
                                ctx as *const CollContext,
                                std::ptr::null(),
                                std::ptr::null_mut(),
                                0,
                                tag,
                            )
                        }
                    })
                }
            }
        };
        if self.cross().is_none() {
            return local();
        }
        self.cross_call(call, ex, |cross, _, _| {
            local()?;
            let flags = xk::flags(xk::NONE, 0) | HEADER_ONLY;
            // SAFETY: no bytes: the step copies nothing in or out.
            unsafe { self.x_step(ex, cross, call, 0, 0, [0, tag], 0, flags, 0) }
        })
    }

    /// Runs `body` with the cross state locked, after the pending errors; a failure of the
    /// body is kept and returned by every later call (see the [module](self)). The body gets
    /// the shard's and the stage's addresses (host or device memory, by `ex`).
    pub(super) fn cross_call(
        &self,
        call: &str,
        ex: Exec<'_>,
        body: impl FnOnce(&Cross, u64, u64) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        if matches!(ex, Exec::Host) {
            self.host_only(call)?;
        }
        let cross = self.cross().expect("a cross-host Collectives");
        let mut st = cross.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = &st.broken {
            return Err(copy_error(call, e));
        }
        // On a GPU, a local kernel's mismatch record is left for async_error (see there).
        self.check_fault(call, matches!(ex, Exec::Host))?;
        let (shard, stage) = match (ex, &cross.gpu) {
            (Exec::Gpu(_), Some(g)) => (g.shard.device_ptr(), g.stage.device_ptr()),
            _ => (st.shard.as_mut_ptr() as u64, st.stage.as_mut_ptr() as u64),
        };
        // A mismatch found by a step inside the host names that step's part of the call,
        // and says the collectives stay usable, which across hosts they do not.
        let r = body(cross, shard, stage).map_err(|e| match e {
            CommError::CallMismatch(m) => CommError::CallMismatch(format!(
                "{}; that was the part inside this host of a call across hosts (collectives \
                 are numbered by such parts), so the collectives cannot be used any more: the \
                 hosts' rounds no longer pair, and the ranks of other hosts fail when this \
                 host's round does not come",
                m.strip_suffix("; the collectives stay usable")
                    .unwrap_or(&m)
            )),
            other => other,
        });
        // Any failure inside (a local step's too) may leave this rank's rounds behind its
        // partners': the next exchange would pair different rounds.
        if let Err(e) = &r {
            // Kept as it was (every later call says "an earlier call failed" once).
            st.broken = Some(keep_kind(e, e.to_string()));
        }
        r
    }

    /// One round with the partners on `ex` ([`host_step`](Self::host_step) or
    /// [`gpu_step`](Self::gpu_step)).
    ///
    /// # Safety
    /// As for [`xk::step`], with memory of `ex`'s kind.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn x_step(
        &self,
        ex: Exec<'_>,
        cross: &Cross,
        call: &str,
        src: u64,
        out: u64,
        descr: [u64; 2],
        len: usize,
        flags: u64,
        stride: usize,
    ) -> Result<(), CommError> {
        // SAFETY: caller contract.
        unsafe {
            match ex {
                Exec::Host => self.host_step(cross, call, src, out, descr, len, flags, stride),
                Exec::Gpu(s) => self.gpu_step(cross, s, src, out, descr, len, flags, stride),
            }
        }
    }

    /// Copies `bytes` from `src` to `dst` on `ex` (`memcpy`, or `cuMemcpyAsync` on the
    /// stream); nothing when they are equal.
    ///
    /// # Safety
    /// Both ranges valid memory of `ex`'s kind (until the stream ran the copy), disjoint or
    /// equal.
    pub(super) unsafe fn x_copy(
        &self,
        ex: Exec<'_>,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> Result<(), CommError> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        match ex {
            Exec::Host => {
                // SAFETY: caller contract.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
                Ok(())
            }
            Exec::Gpu(stream) => {
                // SAFETY: caller contract.
                let r = unsafe { memcpy_async(dst, src, bytes, stream) };
                self.noted(r.map_err(CommError::from))
            }
        }
    }

    /// The local group's all-gather of `bytes` per rank (rank `l`'s at `recv + l * bytes`)
    /// on `ex`: memory channels or LL packets (never the proxy channels).
    ///
    /// # Safety
    /// `send` valid for `bytes`, `recv` for `nlocal * bytes`, disjoint.
    pub(super) unsafe fn local_all_gather(
        &self,
        ex: Exec<'_>,
        call: &str,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let algo = match self.choose_all_gather(bytes) {
            AllGatherAlgo::Packets if bytes > self.one_shot_max_bytes() => AllGatherAlgo::Memory,
            AllGatherAlgo::Proxy | AllGatherAlgo::Auto => AllGatherAlgo::Memory,
            a => a,
        };
        // SAFETY: caller contract.
        unsafe {
            match ex {
                Exec::Host => {
                    self.run_all_gather_kernel(call, send, recv, bytes as u64, dtype, algo)
                }
                Exec::Gpu(s) => self.launch_all_gather(send, recv, bytes, dtype, algo, s),
            }
        }
    }

    /// Host backend: one round with the partners ([`xk::step`], in this thread as a block of
    /// one), then its failure if one was recorded.
    ///
    /// # Safety
    /// As for [`xk::step`]: `src` (0: none) valid for `len` bytes, `out` (0: none) for what
    /// the mode writes; the caller holds the state lock.
    #[allow(clippy::too_many_arguments)]
    unsafe fn host_step(
        &self,
        cross: &Cross,
        call: &str,
        src: u64,
        out: u64,
        descr: [u64; 2],
        len: usize,
        flags: u64,
        stride: usize,
    ) -> Result<(), CommError> {
        // SAFETY: the host context holds this communicator's live memory (the cross buffer,
        // the partners' handles, the state words, the fault area); caller contract for the
        // ranges; outside a launch the step runs as a block of one thread.
        unsafe {
            xk::step(
                &cross.ctx,
                src as *const u8,
                out as *mut u8,
                descr[0],
                descr[1],
                len as u64,
                flags,
                stride as u64,
            )
        };
        self.cross_fault(call)
    }

    /// GPU backend: queues one round with the partners (the `cross_step` kernel, one block)
    /// on `stream`.
    ///
    /// # Safety
    /// As for [`host_step`](Self::host_step), device addresses valid until the kernel ran.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gpu_step(
        &self,
        cross: &Cross,
        stream: &CudaStream,
        src: u64,
        out: u64,
        descr: [u64; 2],
        len: usize,
        flags: u64,
        stride: usize,
    ) -> Result<(), CommError> {
        let g = cross.gpu.as_ref().expect("the GPU backend");
        let ctx = g.ctx.device_ptr();
        // Over a host-mapped buffer, a large reduction runs on blocks of its own beside the
        // step's, piece by piece as the partners' pieces land.
        let grid_reduce = cross.buffer_mapped()
            && flags & 0xf == REDUCE
            && out != 0
            && len >= MAPPED_GRID_REDUCE_BYTES;
        let reducers = if grid_reduce {
            (len as u64 / MAPPED_GRID_REDUCE_BYTES as u64 * 4)
                .clamp(1, MAPPED_REDUCE_BLOCKS.min(self.config.max_blocks) as u64)
                as u32
        } else {
            0
        };
        let (n, tag, len, stride) = (descr[0], descr[1], len as u64, stride as u64);
        // At most the kernel's launch bound (`.maxntid 512`: registers without spills).
        let threads = self.config.threads.clamp(32, 512);
        let mut l = stream.launch_builder(&g.step);
        l.arg(&ctx)
            .arg(&src)
            .arg(&out)
            .arg(&n)
            .arg(&tag)
            .arg(&len)
            .arg(&flags)
            .arg(&stride);
        let cfg = LaunchConfig {
            grid_dim: (1 + reducers, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: caller contract for the ranges; the context in device memory holds this
        // communicator's registered memory; the argument list matches `cross_step`'s
        // signature (*const CollContext, *const u8, *mut u8, u64, u64, u64, u64, u64).
        self.noted(
            unsafe { l.launch(cfg) }
                .map(|_| ())
                .map_err(|e| gpu::classify("launch", "cuLaunchKernel", e)),
        )
    }
}

pub(super) use super::buffer::Exec;

/// A sticky error again, for another call.
fn copy_error(call: &str, e: &CommError) -> CommError {
    keep_kind(e, format!("{call}: an earlier call failed: {e}"))
}

/// `m` as an error of `e`'s kind (timeout, abort, else state).
fn keep_kind(e: &CommError, m: String) -> CommError {
    match e {
        CommError::Timeout(_) => CommError::Timeout(m),
        CommError::Aborted(_) => CommError::Aborted(m),
        _ => CommError::State(m),
    }
}
