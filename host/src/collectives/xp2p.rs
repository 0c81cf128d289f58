//! Sends and receives with ranks on other hosts (issue #17), GPU and Host backends: the
//! transfers of a send/recv group whose peer is on another host run through
//! [`mscclpp_device::collectives::xp2p`] over proxy channels (two per remote rank; TCP or IB
//! between machines), after the group's transfers inside the host (memory channels, as on
//! one machine). On a
//! GPU that is the one-block `xp2p` kernel queued on the caller's stream (no host
//! synchronisation, no allocation: capturable); on the Host backend the same function runs
//! in the calling thread. Design notes: `docs/tcp-transport.md`, "Send and receive across
//! hosts".

use std::sync::Mutex;

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use mscclpp_device::channel::DevConn;
use mscclpp_device::collectives::STATE_WORDS;
use mscclpp_device::collectives::xp2p::{self as xk, COUNTERS, XContext, XOp, XOps};

use super::cross::{
    Topology, alloc_cross_buffer, buffer_addr, proxy_context, proxy_context_on_device,
};
use super::{CollConfig, gpu};
use crate::communicator::{Backend, Buffer, CommError, Communicator};
use crate::cuda::{CudaFunction, CudaStream, DeviceBuffer, Gpu};
use crate::transport::TransportKind;

/// Connection tag of the channel carrying data from the lower rank of a pair to the higher
/// (and the higher rank's credits back).
pub(super) const TAG_UP: u32 = 0xC011_0006;
/// Connection tag of the channel carrying data from the higher rank to the lower.
pub(super) const TAG_DOWN: u32 = 0xC011_0007;
/// Send (and receive) slots per remote rank and direction.
const DEPTH: u64 = 4;

/// Bytes of a slot for a config: `scratch_bytes / 64` between 4 KiB and 256 KiB, a multiple
/// of 16 (the default config: 256 KiB, so 2 MiB of buffer per remote rank).
fn slot_bytes(config: &CollConfig) -> usize {
    (config.scratch_bytes / 64).clamp(4 << 10, 256 << 10) / 16 * 16
}

/// The remote ranks of `rank` (every rank on another host), ascending.
fn remotes_of(topo: &Topology, rank: usize) -> Vec<usize> {
    let host = topo
        .hosts
        .iter()
        .position(|h| h.contains(&rank))
        .expect("every rank is on a host");
    let mut r: Vec<usize> = topo
        .hosts
        .iter()
        .enumerate()
        .filter(|&(h, _)| h != host)
        .flat_map(|(_, ranks)| ranks.iter().copied())
        .collect();
    r.sort_unstable();
    r
}

/// The operations of a launch as a kernel parameter (by value).
#[repr(transparent)]
struct OpsArg(XOps);

// SAFETY: plain `#[repr(C)]` integers, the kernel's parameter type.
unsafe impl DeviceRepr for OpsArg {}

/// Connection requests made before the communicator's setup, completed by [`XP2p::finish`].
pub(super) struct Pending {
    remotes: Vec<usize>,
    /// Per remote rank, the indexes of its out and in channels in `device_connections`.
    channels: Vec<(usize, usize)>,
    /// This rank's number among each remote rank's remote ranks.
    at_peer: Vec<u32>,
    buf: Buffer,
    slot: usize,
}

/// The cross-host send/recv state of a [`Collectives`](super::Collectives).
#[derive(Debug)]
pub(super) struct XP2p {
    /// The host copy of the context (the Host backend runs on it).
    ctx: Box<XContext>,
    /// `remote[g]`: rank `g`'s number among this rank's remote ranks and this rank's among
    /// its (`None` for ranks of this host).
    remote: Vec<Option<(u32, u32)>>,
    gpu: Option<GpuX>,
    /// Host calls from several threads take turns (the counters are one caller's).
    lock: Mutex<()>,
    _state: Box<[u64]>,
    _counters: Box<[u64]>,
    _conns: Vec<DevConn<'static>>,
    _buf: Buffer,
}

/// The GPU backend's copies: the context in device memory (its handles, counters and state
/// words in device memory too) and the kernel.
#[derive(Debug)]
struct GpuX {
    ctx: DeviceBuffer,
    _conns: DeviceBuffer,
    _state: DeviceBuffer,
    _counters: DeviceBuffer,
    kernel: CudaFunction,
}

impl XP2p {
    /// Registers the xp2p buffer and asks for the two proxy channels over `network` (TCP or
    /// IB) to every remote rank (the setup itself is the caller's `connection_setup`).
    pub(super) fn connect(
        comm: &mut Communicator,
        config: &CollConfig,
        topo: &Topology,
        network: TransportKind,
    ) -> Result<Pending, CommError> {
        let me = comm.rank();
        let remotes = remotes_of(topo, me);
        let slot = slot_bytes(config);
        let bytes = xk::buffer_bytes(slot as u64, DEPTH, remotes.len() as u64) as usize;
        let transports: Vec<TransportKind> = remotes
            .iter()
            .map(|&p| topo.transport_to(p, network, comm.backend().transport()))
            .collect();
        // As the cross buffer: host-mapped where every remote rank is reached over TCP.
        let buf = alloc_cross_buffer(comm, config, transports.iter().copied(), bytes)?;
        let mut channels = Vec::with_capacity(remotes.len());
        let mut at_peer = Vec::with_capacity(remotes.len());
        for (&p, &t) in remotes.iter().zip(&transports) {
            let (out_tag, in_tag) = if me < p {
                (TAG_UP, TAG_DOWN)
            } else {
                (TAG_DOWN, TAG_UP)
            };
            let out = comm.connect(p, &buf, out_tag, t)?;
            let inc = comm.connect(p, &buf, in_tag, t)?;
            channels.push((out, inc));
            let theirs = remotes_of(topo, p);
            let at = theirs
                .iter()
                .position(|&r| r == me)
                .expect("remote both ways");
            at_peer.push(at as u32);
        }
        Ok(Pending {
            remotes,
            channels,
            at_peer,
            buf,
            slot,
        })
    }

    /// After the setup: takes the channels' handles and builds the context (on a GPU, its
    /// device copy and the kernel of `kernels`).
    pub(super) fn finish(
        comm: &Communicator,
        p: Pending,
        kernels: Option<&gpu::Kernels>,
    ) -> Result<XP2p, CommError> {
        // SAFETY: the handles are kept in the XP2p, which lives in the Collectives next to
        // `comm` (which owns their memory), and are used only while it lives.
        let all = unsafe { comm.device_connections_detached() };
        let conns: Vec<DevConn<'static>> = p
            .channels
            .iter()
            .flat_map(|&(o, i)| [all[o], all[i]])
            .collect();
        let mut remote = vec![None; comm.nranks()];
        for (j, &g) in p.remotes.iter().enumerate() {
            remote[g] = Some((j as u32, p.at_peer[j]));
        }
        let mut state = vec![0u64; STATE_WORDS].into_boxed_slice();
        let mut counters = vec![0u64; COUNTERS * p.remotes.len().max(1)].into_boxed_slice();
        let ctx = XContext {
            coll: proxy_context(
                comm,
                (comm.rank(), comm.nranks()),
                (buffer_addr(&p.buf), p.slot),
                state.as_mut_ptr(),
                conns.as_ptr(),
            ),
            counters: counters.as_mut_ptr(),
            depth: DEPTH,
        };
        let gpu = match (comm.backend(), kernels) {
            (Backend::Gpu(g), Some(k)) => Some(GpuX::load(g, k, &ctx, &conns, counters.len())?),
            _ => None,
        };
        Ok(XP2p {
            ctx: Box::new(ctx),
            remote,
            gpu,
            lock: Mutex::new(()),
            _state: state,
            _counters: counters,
            _conns: conns,
            _buf: p.buf,
        })
    }

    /// The operation of a transfer with rank `peer`, or `None` for a rank of this host
    /// (which the p2p kernel serves).
    pub(super) fn op(&self, buf: u64, bytes: u64, peer: usize, send: bool) -> Option<XOp> {
        let (index, at_peer) = self.remote.get(peer).copied().flatten()?;
        Some(XOp {
            buf,
            bytes,
            peer: peer as u32,
            send: send as u32,
            index,
            at_peer,
        })
    }

    /// Host backend: runs `ops` in the calling thread (blocks until they are done or failed;
    /// the failure is in the fault area).
    ///
    /// # Safety
    /// Every operation's range valid host memory for the call (receives disjoint).
    pub(super) unsafe fn run_host(&self, ops: &XOps) {
        let _turn = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the host context holds this communicator's live memory (the xp2p buffer,
        // the handles, counters, state words and fault area); caller contract for the
        // ranges; outside a launch the function runs as a block of one thread.
        unsafe { xk::run(&self.ctx, ops) }
    }

    /// GPU backend: queues `ops` on `stream` (the `xp2p` kernel, one block of `threads`).
    ///
    /// # Safety
    /// Every operation's range valid device memory until the stream ran the kernel.
    pub(super) unsafe fn launch(
        &self,
        call: &str,
        ops: XOps,
        threads: u32,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let g = self.gpu.as_ref().expect("the GPU backend");
        let ctx = g.ctx.device_ptr();
        let arg = OpsArg(ops);
        let mut l = stream.launch_builder(&g.kernel);
        l.arg(&ctx).arg(&arg);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads.clamp(32, 512), 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: caller contract for the ranges; the context in device memory holds this
        // communicator's registered memory; the arguments match `xp2p`'s signature
        // (*const XContext, XOps by value).
        unsafe { l.launch(cfg) }
            .map(|_| ())
            .map_err(|e| gpu::classify(call, "cuLaunchKernel", e))
    }
}

impl GpuX {
    fn load(
        gpu: &Gpu,
        kernels: &gpu::Kernels,
        host_ctx: &XContext,
        conns: &[DevConn<'static>],
        counters: usize,
    ) -> Result<GpuX, CommError> {
        let mut ctx = *host_ctx;
        let (conn_mem, state) = proxy_context_on_device(gpu, &mut ctx.coll, conns)?;
        let count = DeviceBuffer::zeroed(gpu, counters * 8)?;
        ctx.counters = count.device_ptr() as *mut u64;
        let mem = DeviceBuffer::zeroed(gpu, std::mem::size_of::<XContext>())?;
        mem.copy_from_host(0, std::slice::from_ref(&ctx))?;
        Ok(GpuX {
            ctx: mem,
            _conns: conn_mem,
            _state: state,
            _counters: count,
            kernel: kernels.function("xp2p")?,
        })
    }
}
