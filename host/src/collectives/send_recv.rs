//! Sends and receives between ranks: [`Collectives::send`], [`Collectives::recv`] and
//! [`Collectives::group`], and the p2p context they run over.
//!
//! They go through a separate registered p2p buffer (per source rank: a
//! slot of `scratch_bytes / 16` clamped to 1 KiB..32 MiB, a packet scratch of `4 *`
//! [`CollConfig::p2p_packet_max_bytes`](super::CollConfig::p2p_packet_max_bytes); its own
//! semaphores), so they never meet a collective's scratch: see
//! `mscclpp_device::collectives::send_recv`. A transfer of up to `p2p_packet_max_bytes` goes
//! as LL packets: the send ends once its packets are written (eager, as NCCL's small
//! messages), unless the receiver has yet to read the send two before it between the pair.
//! A larger send ends once the receiver has copied its data out (rendezvous, pipelined
//! through `p2p_depth` pieces per block). Either way a rank that sends to and receives from
//! the same peer must post both in one [`group`](Collectives::group). Sends and receives
//! between a pair match in call order and must have equal sizes. Sending to the own rank is
//! refused (copy locally instead).

use super::buffer::{self, Buffer, BufferMut, Exec};
use super::scatter_rooted::invalid;
use super::{CollConfig, Collectives, DataType, MAX_P2P_OPS, checked_bytes, gpu};
use crate::communicator::{Backend, Buffer as Registered, CommError, Communicator};
use crate::cuda::{CudaEvent, CudaStream, DeviceBuffer};
use crate::transport::tags::TAG_P2P;
use cudarc::driver::PushKernelArg;
use cudarc::driver::{DeviceRepr, LaunchConfig};
use mscclpp_device::arch::{Dim3, launch};
use mscclpp_device::collectives::send_recv::{
    P2P_MAX_BLOCKS, P2P_STATE_WORDS, P2P_TAIL_BYTES, P2pOp as DevP2pOp, P2pOps, p2p_piece,
};
use mscclpp_device::collectives::send_recv_proxy::RemoteOps;
use mscclpp_device::collectives::{
    CollContext, EXPECTED_WORDS, MAX_BLOCKS, MAX_RANKS, SEMAPHORE_WORDS, STATE_WORDS, guard,
};
use std::sync::Mutex;

/// Bytes of each source rank's slot of the p2p buffer for a config.
fn p2p_slot(config: &CollConfig) -> usize {
    (config.scratch_bytes / 16).clamp(1 << 10, 32 << 20) / 1024 * 1024
}

/// Bytes of each source rank's packet scratch of the p2p buffer for a config: two halves
/// for LL transfers of `p2p_packet_max_bytes` (16-byte packets of 8 data bytes), then the
/// done words (see `send_recv`).
fn p2p_packets(config: &CollConfig) -> usize {
    4 * config.p2p_packet_max_bytes.div_ceil(8) * 8 + P2P_TAIL_BYTES as usize
}

/// The p2p context (a [`CollContext`] over the p2p buffer) and its memory.
#[derive(Debug)]
pub(super) struct P2p {
    /// On the host (host backend kernels read it here).
    ctx: Box<CollContext>,
    /// In device memory (GPU backend).
    dev: Option<DeviceBuffer>,
    /// GPU backend: where the sends of a group that a receive of the same group overlaps
    /// (an in-place exchange) are copied first; grown on demand (not under capture).
    stage: Mutex<Option<Stage>>,
    _buf: Registered,
    _local: Registered,
}

/// A staging buffer for sends and the event recorded after the last launch that read it.
#[derive(Debug)]
struct Stage {
    buf: DeviceBuffer,
    bytes: usize,
    done: CudaEvent,
}

/// Bytes a staged send takes in the staging buffer (16-byte aligned pieces).
fn staged_len(bytes: u64) -> u64 {
    bytes.div_ceil(16) * 16
}

/// The ops of a launch as a kernel parameter (by value).
#[repr(transparent)]
struct OpsArg(P2pOps);

// SAFETY: plain `#[repr(C)]` integers, the kernel's parameter type.
unsafe impl DeviceRepr for OpsArg {}

impl P2p {
    /// Registers the p2p buffer (one slot per source rank, then the semaphores) and connects
    /// it to every peer (collective; after the communicator's first connection setup and
    /// before its proxy starts). `base`: the collectives' context, whose fields the p2p
    /// context shares except the scratch, semaphores and expected words.
    ///
    /// Across hosts the context spans this rank's host: `group` holds its ranks (ascending,
    /// `group[local]` this rank), and the kernel's peers are local indexes.
    pub(super) fn new(
        comm: &mut Communicator,
        config: &CollConfig,
        base: &CollContext,
        group: &[usize],
        local: usize,
    ) -> Result<P2p, CommError> {
        let (n, rank) = (group.len(), local);
        let slot = p2p_slot(config);
        let packets = p2p_packets(config);
        // n slots, n packet scratches, the semaphores.
        let packets_at = n * slot;
        let sems_at = packets_at + n * packets;
        let buf = comm.alloc_buffer(sems_at + SEMAPHORE_WORDS * 8)?;
        // Expected words, then the p2p context's own state (call counter, local fault words,
        // the LL sequence numbers).
        let local = comm.alloc_buffer((EXPECTED_WORDS + STATE_WORDS + P2P_STATE_WORDS) * 8)?;
        let transport = comm.backend().transport();
        let mut channels = Vec::new();
        for p in (0..n).filter(|&p| p != rank) {
            channels.push((
                p,
                comm.connect_memory(group[p], &buf, TAG_P2P, transport, 0)?,
            ));
        }
        comm.connection_setup()?;
        let all = comm.memory_channels();
        let addr = |b: &Registered| {
            b.device_ptr()
                .unwrap_or_else(|| b.host_ptr().unwrap() as u64)
        };
        let mine = addr(&buf);
        let mut ctx = CollContext {
            scratch_len: slot as u64,
            packets_len: packets as u64,
            packets_in: [std::ptr::null_mut(); MAX_RANKS],
            packets_out: [std::ptr::null_mut(); MAX_RANKS],
            scratch: mine as *mut u8,
            peer_scratch: [std::ptr::null_mut(); MAX_RANKS],
            sems: (mine + sems_at as u64) as *mut u64,
            peer_sems: [std::ptr::null_mut(); MAX_RANKS],
            expected: addr(&local) as *mut u64,
            state: (addr(&local) + EXPECTED_WORDS as u64 * 8) as *mut u64,
            // Sends and receives count their own operations, not the collectives' calls;
            // their waits give up on a peer that left (see `guard::PEERS`).
            guards: (base.guards & !guard::LEFT) | guard::PEERS,
            ..*base
        };
        ctx.peer_scratch[rank] = ctx.scratch;
        ctx.peer_sems[rank] = ctx.sems;
        for q in 0..n {
            // This rank's packet scratch that rank q writes into.
            ctx.packets_in[q] = (mine + (packets_at + q * packets) as u64) as *mut u8;
        }
        for (p, c) in channels {
            let remote = all[c].remote_ptr();
            // SAFETY: the peer's buffer is mapped whole: its packet scratch for this rank
            // follows its slots.
            ctx.packets_out[p] = unsafe { remote.add(packets_at + rank * packets) };
            ctx.peer_scratch[p] = remote;
            // SAFETY: the peer's buffer is mapped whole: its semaphores follow its slots.
            ctx.peer_sems[p] = unsafe { remote.add(sems_at) } as *mut u64;
        }
        let dev = match comm.backend() {
            Backend::Gpu(g) => {
                let mem = DeviceBuffer::zeroed(g, std::mem::size_of::<CollContext>())?;
                mem.copy_from_host(0, std::slice::from_ref(&ctx))?;
                Some(mem)
            }
            Backend::Host => None,
        };
        Ok(P2p {
            ctx: Box::new(ctx),
            dev,
            stage: Mutex::new(None),
            _buf: buf,
            _local: local,
        })
    }
}

impl P2p {
    /// Points the send/receive context at the collectives' context `coll` (the address the
    /// kernels read: in device memory on a GPU), see `CollContext::coll`.
    pub(super) fn link_collectives(&mut self, coll: *const CollContext) -> Result<(), CommError> {
        self.ctx.coll = coll;
        if let Some(dev) = &self.dev {
            dev.copy_from_host(0, std::slice::from_ref(&*self.ctx))?;
        }
        Ok(())
    }
}

/// One operation of a [`Collectives::group`]: `count` elements of `dtype` at device (or, with
/// [`Exec::Host`], host) address `buf`, sent to or received from `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pOp {
    /// Send `buf` to `peer` (matched by its next receive from this rank).
    Send {
        /// The data.
        buf: u64,
        /// Elements.
        count: usize,
        /// Element type (sets the size and the alignment checked).
        dtype: DataType,
        /// The receiving rank.
        peer: usize,
    },
    /// Receive into `buf` from `peer` (matched by its next send to this rank).
    Recv {
        /// Where the data lands.
        buf: u64,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// The sending rank.
        peer: usize,
    },
}

impl Collectives {
    /// Checks `ops` and builds the kernel's operations (empty ones left out); `gpu`: check
    /// the device ranges too. Also returns the mask of the (kernel) operations that are sends
    /// whose range a receive of the group overlaps: they must be staged (copied elsewhere
    /// first), or the receive could overwrite data not yet sent.
    fn p2p_ops(
        &self,
        call: &str,
        ops: &[P2pOp],
        gpu_ranges: bool,
    ) -> Result<(P2pOps, u32), CommError> {
        if ops.len() > MAX_P2P_OPS {
            return Err(invalid(format!(
                "{call}: {} operations; at most {MAX_P2P_OPS} in one group",
                ops.len()
            )));
        }
        let mut out = P2pOps::default();
        for op in ops {
            let (send, buf, count, dtype, peer) = match *op {
                P2pOp::Send {
                    buf,
                    count,
                    dtype,
                    peer,
                } => (true, buf, count, dtype, peer),
                P2pOp::Recv {
                    buf,
                    count,
                    dtype,
                    peer,
                } => (false, buf, count, dtype, peer),
            };
            let what = if send { "send to" } else { "receive from" };
            if peer >= self.nranks() {
                return Err(invalid(format!(
                    "{call}: {what} rank {peer}, which is not a rank (there are {} ranks)",
                    self.nranks()
                )));
            }
            if peer == self.rank() {
                return Err(invalid(format!(
                    "{call}: {what} the own rank {peer} is not supported; copy locally instead"
                )));
            }
            if !self.send_recv_reaches(peer) {
                let off = self
                    .across_hosts()
                    .and_then(|a| a.p2p_off.as_deref())
                    .unwrap_or("no channel to it");
                return Err(invalid(format!(
                    "{call}: {what} rank {peer}, on another host: {off}"
                )));
            }
            let bytes = checked_bytes(call, count, dtype.size())?;
            // A transfer of no bytes is still one (matched in order with the peer's, as
            // NCCL's since 2.12.10): it carries its size, so a receive of some bytes fails
            // against it, and a receive of none returns once the send was posted.
            if gpu_ranges && bytes > 0 {
                let name = format!("{call}: {what} rank {peer}");
                gpu::check_range(&name, buf, bytes, dtype.size())?;
            }
            out.ops[out.count as usize] = DevP2pOp {
                buf,
                bytes: bytes as u64,
                peer: peer as u32,
                send: send as u32,
                first_block: 0,
                blocks: 0,
            };
            out.count += 1;
        }
        // A receive may not overlap another receive's range; a send whose range a receive
        // overlaps (an in-place exchange, as nccl-tests' sendrecv in place) is staged.
        let live = &out.ops[..out.count as usize];
        let mut stage = 0u32;
        for (i, a) in live.iter().enumerate() {
            for (j, b) in live.iter().enumerate() {
                // A transfer of no bytes touches no memory: it overlaps nothing, wherever it
                // points (a zero count's address inside another peer's range, as
                // all-to-all-v code passes it, is neither refused nor a cause to stage).
                let overlap = a.bytes > 0
                    && b.bytes > 0
                    && a.buf < b.buf + b.bytes
                    && b.buf < a.buf + a.bytes;
                if i != j && a.send == 0 && overlap {
                    if b.send != 0 {
                        stage |= 1 << j;
                    } else {
                        return Err(invalid(format!(
                            "{call}: the receive from rank {} overlaps the receive from rank {}",
                            a.peer, b.peer
                        )));
                    }
                }
            }
        }
        Ok((out, stage))
    }

    /// The p2p state of this rank's host (every Collectives has it).
    fn p2p_one_host(&self) -> &P2p {
        &self.p2p
    }

    /// Splits checked operations (peers as job ranks) into those with ranks of this host
    /// (peers as local indexes, for the p2p kernel) and those with ranks on other hosts
    /// (for [`remote_p2p`](super::remote_p2p)); each keeps the call order.
    fn p2p_split(&self, ops: &P2pOps) -> (P2pOps, RemoteOps) {
        let mut local = P2pOps { count: 0, ..*ops };
        let mut remote = RemoteOps::default();
        for op in &ops.ops[..ops.count as usize] {
            let g = op.peer as usize;
            let xop = self
                .remote_p2p()
                .and_then(|x| x.op(op.buf, op.bytes, g, op.send != 0));
            if let Some(x) = xop {
                remote.ops[remote.count as usize] = x;
                remote.count += 1;
            } else {
                let peer = self.cross().map_or(g, |c| {
                    c.topo
                        .group()
                        .iter()
                        .position(|&r| r == g)
                        .expect("checked")
                });
                local.ops[local.count as usize] = DevP2pOp {
                    peer: peer as u32,
                    ..*op
                };
                local.count += 1;
            }
        }
        (local, remote)
    }

    /// Most blocks of one transfer on a GPU ([`p2p_transfer_blocks`] of this communicator).
    fn p2p_max_blocks(&self) -> u32 {
        p2p_transfer_blocks(
            self.ctx.nranks as usize,
            self.block_cap,
            self.config.max_blocks,
        )
    }

    /// Sets how `ops` are cut (the config's, equal on every rank) and plans the launch with
    /// at most `max_blocks` blocks per transfer; returns the grid's blocks.
    fn p2p_plan(&self, ops: &mut P2pOps, max_blocks: u32) -> u32 {
        let c = &self.config;
        ops.depth = c.p2p_depth;
        ops.ll_max = c.p2p_packet_max_bytes as u64;
        ops.ll_blocks = c.p2p_packet_blocks.min(max_blocks);
        // The rows of an LL transfer: fixed by the config (equal on every rank), so a launch
        // may run its LL transfers with smaller blocks (see `p2p_threads`).
        ops.ll_row = c.threads;
        ops.plan(
            p2p_piece(self.p2p_one_host().ctx.scratch_len, c.p2p_depth),
            max_blocks,
        )
    }

    /// Posts the sends and receives of `ops` as one launch on `stream` (NCCL's grouped
    /// `ncclSend`/`ncclRecv`): all of them progress together, so a rank may send to and
    /// receive from the same peer in one group. Operations with the same peer and direction
    /// run in order; at most 16 per group. Each send must be matched by the peer's receive of
    /// the same size (in call order per pair and direction), posted concurrently: a send
    /// completes only once the peer has copied its data out. A send or receive of no
    /// elements is a transfer too (as NCCL's): it pairs with the peer's, and a receive of
    /// none completes once the peer's send of none was posted. GPU backend; checks every range
    /// as `all_reduce_device` does; refuses the own rank and ranks out of
    /// range, and a receive whose range overlaps another operation's (no in-place
    /// exchange: a chunk received could overwrite data not yet sent). Allocates nothing:
    /// capturable into CUDA graphs.
    ///
    /// A send and a receive of different sizes (the same number of operations per pair and
    /// direction, in the same order, but other byte counts) fail that transfer alone, without
    /// a timeout: [`async_error`](Self::async_error) / [`synchronize`](Self::synchronize)
    /// return [`CommError::CallMismatch`] ("rank 1 sent 4000 bytes to rank 0, which expected
    /// 6000") on the receiver and on a pipelined sender; an LL sender (at most
    /// `p2p_packet_max_bytes`: eager, done before the receiver looks) learns of it from a note
    /// the receiver leaves, at the end of that send if it is there, else at its next send to
    /// that peer, whose call then reports it (once). The receive buffer is undefined; the
    /// group's other operations and the pair's later transfers work.
    ///
    /// With [`Exec::Host`] (Host backend) the group runs on host addresses and blocks until
    /// done.
    ///
    /// # Safety
    /// Every buffer must be memory of `exec`'s kind and stay valid until the operation
    /// completes (on a GPU: on the stream), receive buffers not be accessed by others
    /// meanwhile, and send buffers not written.
    pub unsafe fn group<'a>(
        &self,
        ops: &[P2pOp],
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError> {
        match exec.into() {
            // SAFETY: forwarded (caller contract).
            Exec::Gpu(stream) => unsafe { self.group_device(ops, stream) },
            // SAFETY: forwarded (caller contract).
            Exec::Host => unsafe { self.group_on_host(ops) },
        }
    }

    /// GPU backend: [`group`](Self::group) on `stream`.
    ///
    /// # Safety
    /// As for [`group`](Self::group).
    unsafe fn group_device(&self, ops: &[P2pOp], stream: &CudaStream) -> Result<(), CommError> {
        let call = "group";
        let _order = self.plan_gpu_call(call, stream)?;
        let (ops, stage) = self.p2p_ops(call, ops, true)?;
        if ops.count == 0 {
            return Ok(());
        }
        if stage != 0 {
            return self.noted(self.group_staged(call, ops, stage, stream));
        }
        self.p2p_launch(call, ops, stream)
    }

    /// [`group`](Self::group) with the sends of `mask` copied into the staging buffer first
    /// (stream-ordered, after the last launch that read it), their addresses replaced.
    fn group_staged(
        &self,
        call: &str,
        mut ops: P2pOps,
        mask: u32,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let total: u64 = (0..ops.count as usize)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| staged_len(ops.ops[i].bytes))
            .sum();
        let capturing = gpu::is_capturing(stream);
        let mut stage = self
            .p2p_one_host()
            .stage
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if stage.as_ref().is_none_or(|s| (s.bytes as u64) < total) {
            if capturing {
                return Err(invalid(format!(
                    "{call}: an in-place exchange of {total} bytes under CUDA graph capture \
                     needs a staging buffer that is not there yet; run the same group once \
                     outside capture first"
                )));
            }
            let gpu = self.gpu().expect("GPU backend");
            if let Some(old) = stage.take() {
                // The last launch that read it must be done before it is freed.
                old.done
                    .synchronize()
                    .map_err(|e| gpu::classify(call, "cuEventSynchronize", e))?;
            }
            let bytes = (total as usize).next_power_of_two();
            let done = gpu
                .context()
                .new_event(None)
                .map_err(|e| gpu::classify(call, "cuEventCreate", e))?;
            *stage = Some(Stage {
                buf: DeviceBuffer::alloc(gpu, bytes)?,
                bytes,
                done,
            });
        }
        let s = stage.as_ref().expect("set above");
        if !capturing {
            // A launch on another stream may still read it. (Under capture the graph's
            // replays are ordered on the stream they are launched on.)
            stream
                .wait(&s.done)
                .map_err(|e| gpu::classify(call, "cuStreamWaitEvent", e))?;
        }
        let mut at = s.buf.device_ptr();
        for i in (0..ops.count as usize).filter(|i| mask & (1 << i) != 0) {
            let op = &mut ops.ops[i];
            // SAFETY: the send's range was checked (caller contract keeps it valid); the
            // staging piece holds its bytes and no launch reads it now (the wait above).
            unsafe { crate::cuda::memcpy_async(at, op.buf, op.bytes as usize, stream) }?;
            op.buf = at;
            at += staged_len(op.bytes);
        }
        self.p2p_launch(call, ops, stream)?;
        if !capturing {
            s.done
                .record(stream)
                .map_err(|e| gpu::classify(call, "cuEventRecord", e))?;
        }
        Ok(())
    }

    /// Queues `ops` on `stream`: the p2p kernel for the transfers inside this host, then
    /// the `remote_p2p` kernel for those with other hosts.
    fn p2p_launch(&self, call: &str, ops: P2pOps, stream: &CudaStream) -> Result<(), CommError> {
        let (local, remote) = self.p2p_split(&ops);
        if local.count > 0 {
            self.p2p_launch_local(call, local, stream)?;
        }
        if remote.count > 0 {
            let x = self
                .remote_p2p()
                .expect("remote operations need it (p2p_ops)");
            // SAFETY: the ranges were checked (p2p_ops) and the caller keeps them valid.
            self.noted(unsafe { x.launch(call, remote, self.config.threads, stream) })?;
        }
        Ok(())
    }

    /// Launches the p2p kernel for `ops` (peers as local indexes) on `stream`.
    fn p2p_launch_local(
        &self,
        call: &str,
        mut ops: P2pOps,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let blocks = self.p2p_plan(&mut ops, self.p2p_max_blocks());
        let (threads, ll_only) = p2p_threads(&ops, self.config.threads);
        let kernels = &self.on_gpu().scatter_rooted;
        let ctx = self
            .p2p_one_host()
            .dev
            .as_ref()
            .expect("GPU backend")
            .device_ptr();
        let arg = OpsArg(ops);
        let mut params = [
            &ctx as *const u64 as *mut std::ffi::c_void,
            &arg as *const OpsArg as *mut std::ffi::c_void,
        ];
        // Dependent only when every transfer goes as LL packets (the latency case, checked
        // on GPUs; see `mod.rs`, "Launches").
        if ll_only
            && gpu::dependent_grid(blocks, threads)
            && let Some(r) = kernels.pdl.launch(|| {
                // SAFETY: the p2p kernel calls dependent_launch_entry first; the parameters
                // (*const CollContext, P2pOps by value) point at live locals; the rest as below.
                unsafe {
                    gpu::launch_dependent_params(
                        stream,
                        &kernels.p2p,
                        &mut params,
                        (blocks, threads),
                    )
                }
            })
        {
            return self.noted(r);
        }
        let mut l = stream.launch_builder(&kernels.p2p);
        l.arg(&ctx).arg(&arg);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the p2p context in device memory holds this communicator's registered
        // memory; the ranges were checked and the caller keeps them valid; the arguments
        // match the kernel's (*const CollContext, P2pOps).
        self.noted(
            unsafe { l.launch(cfg) }
                .map(|_| ())
                .map_err(|e| gpu::classify(call, "cuLaunchKernel", e)),
        )
    }

    /// Sends `buf` to `peer` (matched by its next receive from this rank): a group of one
    /// (see [`group`](Self::group)). Buffers and `exec` as in
    /// [`all_reduce`](Self::all_reduce).
    pub fn send<'a, B: Buffer + ?Sized>(
        &self,
        buf: &'a B,
        peer: usize,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError> {
        let exec = exec.into();
        let call = exec.name("send");
        let (addr, count, dtype, _place) = buffer::read(call, buf, exec)?;
        let op = P2pOp::Send {
            buf: addr,
            count,
            dtype,
            peer,
        };
        // SAFETY: the buffer is borrowed for the call (its guard orders later uses).
        unsafe { self.group(&[op], exec) }
    }

    /// Receives into `buf` from `peer` (matched by its next send to this rank): a group of
    /// one.
    pub fn recv<'a, B: BufferMut + ?Sized>(
        &self,
        buf: &'a mut B,
        peer: usize,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError> {
        let exec = exec.into();
        let call = exec.name("recv");
        let (addr, count, dtype, _place) = buffer::in_place(call, buf, exec)?;
        let op = P2pOp::Recv {
            buf: addr,
            count,
            dtype,
            peer,
        };
        // SAFETY: as in send.
        unsafe { self.group(&[op], exec) }
    }

    /// Host backend: runs a group of sends and receives on host addresses (blocking; see
    /// [`group`](Self::group)).
    ///
    /// # Safety
    /// Every buffer valid host memory for its operation during the call.
    unsafe fn group_on_host(&self, ops: &[P2pOp]) -> Result<(), CommError> {
        let call = "group_host";
        self.host_only(call)?;
        let (mut ops, stage) = self.p2p_ops(call, ops, false)?;
        if ops.count == 0 {
            return Ok(());
        }
        self.check_fault(call, true)?;
        // Sends a receive of the group overlaps: copied first (kept alive for the call).
        let mut staged: Vec<Vec<u8>> = Vec::new();
        for op in ops.ops[..ops.count as usize]
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| stage & (1 << i) != 0)
            .map(|(_, op)| op)
        {
            // SAFETY: the caller keeps the send's range valid host memory for the call.
            let data =
                unsafe { std::slice::from_raw_parts(op.buf as *const u8, op.bytes as usize) };
            staged.push(data.to_vec());
            op.buf = staged.last().expect("pushed").as_ptr() as u64;
        }
        let (mut local, remote) = self.p2p_split(&ops);
        let local_ops = local.count;
        let mut run_local = || -> Result<(), CommError> {
            if local.count == 0 {
                return Ok(());
            }
            // Two blocks per transfer at most: CPU threads.
            let blocks = self.p2p_plan(&mut local, 2);
            let ctx = &*self.p2p_one_host().ctx as *const CollContext as u64;
            launch(Dim3::x(blocks), Dim3::x(2), || {
                // SAFETY: the p2p context (boxed, alive as long as self) holds this
                // communicator's shared memory; the buffers are valid (caller contract).
                unsafe { mscclpp_device::kernels::send_recv::p2p(ctx as *const CollContext, local) }
            })
            .map_err(|e| {
                CommError::State(format!(
                    "{call}: the transfer kernel failed on this rank ({e}): a bug or a broken \
                     contract, not a peer's doing"
                ))
            })
        };
        let remote_panicked = || {
            CommError::State(format!(
                "{call}: the transfers with other hosts panicked on this rank: a bug, not a \
                 peer's doing"
            ))
        };
        if remote.count == 0 {
            run_local()?;
        } else {
            let x = self
                .remote_p2p()
                .expect("remote operations need it (p2p_ops)");
            // SAFETY: the buffers are valid host memory for the call (caller contract;
            // staged sends kept alive above).
            let run_remote = || unsafe { x.run_host(&remote) };
            if local_ops == 0 {
                // On this thread: starting one for the transfers took most of a small
                // send/recv's time (Host backend, two ranks as two hosts, 2 cores: 45-55 us
                // at 8 B).
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(run_remote))
                    .map_err(|_| remote_panicked())?;
            } else {
                // The group's transfers with other hosts progress beside those inside the
                // host, as a group's transfers do (one after the other, a peer whose local
                // transfer waits for this rank's remote one would wait until the device
                // timeout).
                std::thread::scope(|scope| {
                    let remote_part = scope.spawn(run_remote);
                    let r = run_local();
                    if remote_part.join().is_err() {
                        return Err(remote_panicked());
                    }
                    r
                })?;
            }
        }
        // A transfer of another size than the peer's, or a wait that gave up (a peer did not
        // post the matching operation within the device timeout, or an abort), recorded why.
        self.check_fault(call, true)
    }
}

const _: () = assert!(2 * P2P_MAX_BLOCKS as usize <= MAX_BLOCKS);

/// Threads per block of a p2p launch of `ops` (planned) with blocks of `most` threads, and
/// whether every transfer of it goes as LL packets: such a group takes half a thread per
/// unit of its largest block share, in warps, at least 128 (on 2x H200, an 8 B send/recv
/// under a CUDA graph took 7.1 us with 512 threads per block and 5.7 us with 128, and 32 KB
/// 7.5 and 6.6 us: the blocks of the p2p kernel take a whole SM's registers at 512); any
/// other launch `most`. Only this rank's launch depends on it ([`P2pOps::ll_row`] fixes
/// what each block moves).
fn p2p_threads(ops: &P2pOps, most: u32) -> (u32, bool) {
    let n = (ops.count as usize).min(ops.ops.len());
    let mut units_per_block = 0u64;
    for op in &ops.ops[..n] {
        if op.bytes > ops.ll_max {
            return (most, false);
        }
        let per = op.bytes.div_ceil(8).div_ceil(ops.ll_blocks.max(1) as u64);
        units_per_block = units_per_block.max(per);
    }
    let want = units_per_block.div_ceil(2).next_multiple_of(32).max(128);
    (want.min(most as u64) as u32, true)
}

/// Most blocks of one transfer of a send/receive group on a GPU, for `nranks` ranks: a group
/// has up to `2 * (nranks - 1)` lanes side by side, and every block of it must be resident at
/// once (a send's blocks wait for the peer's receive, which may wait for other lanes), so
/// the lanes share 128 blocks (the kernel takes 128 registers per thread, one block of 512
/// threads per SM, and an H100/H200 has 132), or `block_cap` when ranks share the GPU (every
/// rank's kernel must fit beside the others'; see `shared_gpu_block_cap`); then at most
/// [`P2P_MAX_BLOCKS`] and `max_blocks`, and at least one. Equal on every rank (it depends
/// only on the rank count, the cap every rank computes alike and the config), as both sides
/// of a transfer must cut it alike.
pub(super) fn p2p_transfer_blocks(nranks: usize, block_cap: u32, max_blocks: u32) -> u32 {
    let lanes = 2 * (nranks.max(2) as u32 - 1);
    (block_cap.min(128) / lanes).clamp(1, P2P_MAX_BLOCKS.min(max_blocks).max(1))
}

#[cfg(test)]
#[path = "send_recv_tests.rs"]
mod tests;
