//! Sends and receives with ranks on other hosts, GPU and Host backends: the
//! transfers of a send/recv group whose peer is on another host run through
//! [`mscclpp_device::collectives::remote_p2p`] over proxy channels (two per remote rank; TCP or IB
//! between machines), beside the group's transfers inside the host (memory channels, as on
//! one machine): on the Host backend in a thread of their own, on a GPU as the next kernel
//! on the stream, after them. The remote ranks are those the ranks agreed on at set-up ([`agree`]): every
//! rank on another host while there are at most [`CollConfig::p2p_remote_max`] of them, or
//! the pairs named in [`CollConfig::p2p_peers`] / [`P2P_PEERS_ENV`] by either rank. On a
//! GPU that is the one-block `remote_p2p` kernel queued on the caller's stream (no host
//! synchronisation, no allocation: capturable); on the Host backend the same function runs
//! in a thread beside the local part. Design notes: docs/guide/06-design.md §8, "Across
//! hosts".

use crate::transport::tags::{TAG_DOWN, TAG_UP};
use std::sync::Mutex;

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use mscclpp_device::channel::DevConn;
use mscclpp_device::collectives::STATE_WORDS;
use mscclpp_device::collectives::send_recv_proxy::{
    self as xk, COUNTERS, ProxyContext, RemoteOp, RemoteOps,
};

use super::cross::{alloc_cross_buffer, buffer_addr, proxy_context, proxy_context_on_device};
use super::topology::Topology;
use super::{CollConfig, gpu};
use crate::communicator::{Backend, Buffer, CommError, Communicator};
use crate::cuda::{CudaFunction, CudaStream, DeviceBuffer, Gpu};
use crate::settings::{PeerList, PeerRank};
use crate::transport::TransportKind;

/// Send (and receive) slots per remote rank and direction.
const DEPTH: u64 = 4;

/// Bytes of a slot for a config: `scratch_bytes / 64` between 4 KiB and 256 KiB, a multiple
/// of 16 (the default config: 256 KiB, so 2 MiB of buffer per remote rank).
fn slot_bytes(config: &CollConfig) -> usize {
    (config.scratch_bytes / 64).clamp(4 << 10, 256 << 10) / 16 * 16
}

/// The remote ranks of `rank` (every rank on another host), ascending.
fn remotes_of(topo: &Topology, rank: usize) -> Vec<usize> {
    let host = topo.host_of(rank);
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

/// The variable naming the ranks on other hosts a rank sends to or receives from
/// (overrides [`CollConfig::p2p_peers`]; read by `Collectives::new`): ranks separated by
/// commas or spaces, each absolute (`13`) or relative to the rank (`+8`, `-8`; a relative
/// rank outside the job is skipped, so one value suits every rank); `all` or empty: the
/// default; `none`: no rank.
pub const P2P_PEERS_ENV: &str = "MSCCLPP_P2P_PEERS";

/// The ranks [`P2P_PEERS_ENV`] (`list`, [`Settings::p2p_peers`]) names for `rank` of
/// `nranks`: `None` for all; relative ranks outside `0..nranks` are skipped (so one value
/// suits every rank), an absolute rank outside it is an error naming the variable.
///
/// [`Settings::p2p_peers`]: crate::settings::Settings::p2p_peers
pub(super) fn peers_of(
    list: &PeerList,
    rank: usize,
    nranks: usize,
) -> Result<Option<Vec<usize>>, CommError> {
    let PeerList::Ranks(ranks) = list else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for r in ranks {
        match *r {
            PeerRank::Absolute(n) if n >= nranks as u64 => {
                return Err(CommError::InvalidArgument(format!(
                    "{P2P_PEERS_ENV}: rank {n} is not a rank (there are {nranks} ranks)"
                )));
            }
            PeerRank::Absolute(n) => out.push(n as usize),
            PeerRank::Relative(d) => {
                let p = rank as i128 + d as i128;
                if (0..nranks as i128).contains(&p) {
                    out.push(p as usize);
                }
            }
        }
    }
    Ok(Some(out))
}

/// The ranks on other hosts that a rank sets send/recv channels up with, as every rank
/// agreed at set-up ([`agree`]).
#[derive(Debug)]
pub(super) struct Peers {
    /// This rank's, ascending.
    pub(super) remotes: Vec<usize>,
    /// This rank's number among each one's (in the order of `remotes`).
    at_peer: Vec<u32>,
    /// The most remote ranks any rank has: every rank's remote_p2p buffer holds that many
    /// regions, so that the buffers a channel joins are of one size on both sides.
    most: usize,
    /// Why not every rank on another host is among them, if not.
    pub(super) off: Option<String>,
}

/// Declaration kinds in the agreement's messages.
const DECLARED_NONE: u8 = 0;
const DECLARED_ALL: u8 = 1;
const DECLARED_LIST: u8 = 2;

/// Agrees over the bootstrap (collective) on the send/recv peers across hosts. Each rank
/// declares its own: `declared` (the ranks named in [`CollConfig::p2p_peers`] or
/// [`P2P_PEERS_ENV`]; ranks on its own host ignored), else every rank on another host while
/// there are at most [`CollConfig::p2p_remote_max`] of them on other machines, else none. A
/// pair is connected when either rank declares the other, or when both are on one machine
/// (on different hosts of the collectives where machines are cut into groups: no network
/// between them), so every rank ends up with the same pairs.
// Long (~125 lines): one exchange of declarations and its reading back; the message
// layout is written and read in the same function so that the two stay in step.
pub(super) fn agree(
    comm: &Communicator,
    config: &CollConfig,
    topo: &Topology,
    declared: Option<&[usize]>,
) -> Result<Peers, CommError> {
    let (me, n) = (comm.rank(), comm.nranks());
    let host = |r: usize| topo.host_of(r);
    let mine = remotes_of(topo, me);
    // Ranks of other hosts on this machine (machines cut into groups) need no network:
    // every such pair is connected, whatever was declared, and none counts against the
    // limit or in the messages, which speak of other machines.
    let far = |q: usize, p: usize| !topo.same_machine(q, p);
    let mine_far = mine.iter().filter(|&&p| far(me, p)).count();
    let mut msg = Vec::new();
    match declared {
        Some(list) => {
            if let Some(&p) = list.iter().find(|&&p| p >= n) {
                return Err(CommError::InvalidArgument(format!(
                    "collectives: p2p_peers names rank {p}, which is not a rank (there are \
                     {n} ranks)"
                )));
            }
            msg.push(DECLARED_LIST);
            let mut list: Vec<usize> = list
                .iter()
                .copied()
                .filter(|&p| host(p) != host(me))
                .collect();
            list.sort_unstable();
            list.dedup();
            for p in list {
                msg.extend_from_slice(&(p as u32).to_le_bytes());
            }
        }
        None if mine_far <= config.p2p_remote_max => msg.push(DECLARED_ALL),
        None => msg.push(DECLARED_NONE),
    }
    let said = comm.bootstrap_all_gather(&msg)?;
    // Each rank's declaration, then the pairs either side declared.
    let mut pairs: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut any_list = false;
    for (q, m) in said.iter().enumerate() {
        let malformed = || {
            CommError::State(format!(
                "rank {q} sent a malformed list of send/recv peers across hosts ({} bytes)",
                m.len()
            ))
        };
        let (&kind, rest) = m.split_first().ok_or_else(malformed)?;
        let list: Vec<usize> = match kind {
            DECLARED_NONE if rest.is_empty() => Vec::new(),
            DECLARED_ALL if rest.is_empty() => remotes_of(topo, q),
            DECLARED_LIST if rest.len() % 4 == 0 => {
                any_list = true;
                let list: Vec<usize> = rest
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                    .collect();
                if list.iter().any(|&p| p >= n || host(p) == host(q)) {
                    return Err(malformed());
                }
                list
            }
            _ => return Err(malformed()),
        };
        let near = remotes_of(topo, q).into_iter().filter(|&p| !far(q, p));
        for p in list.into_iter().chain(near) {
            pairs[q].push(p);
            pairs[p].push(q);
        }
    }
    for l in &mut pairs {
        l.sort_unstable();
        l.dedup();
    }
    let most = pairs.iter().map(Vec::len).max().unwrap_or(0);
    let remotes = std::mem::take(&mut pairs[me]);
    let at_peer = remotes
        .iter()
        .map(|&p| pairs[p].binary_search(&me).expect("pairs are symmetric") as u32)
        .collect();
    let off = (remotes.len() < mine.len()).then(|| {
        let remotes: Vec<usize> = remotes.iter().copied().filter(|&p| far(me, p)).collect();
        if any_list {
            let shown: Vec<String> = remotes.iter().take(16).map(|r| r.to_string()).collect();
            format!(
                "send/recv across hosts reaches only the ranks agreed at set-up ({} of the \
                 {} ranks on other hosts{}{}{}); name a rank in CollConfig::p2p_peers or \
                 MSCCLPP_P2P_PEERS on either side of the pair",
                remotes.len(),
                mine_far,
                if remotes.is_empty() { "" } else { ": " },
                shown.join(", "),
                if remotes.len() > shown.len() {
                    ", ..."
                } else {
                    ""
                }
            )
        } else {
            format!(
                "send/recv across hosts is off for this Collectives ({} ranks on other hosts, \
                 more than CollConfig::p2p_remote_max = {}; each would take two network \
                 channels); raise it (MSCCLPP_P2P_REMOTE_MAX) on every rank, or name the ranks \
                 each rank sends to or receives from (CollConfig::p2p_peers, \
                 MSCCLPP_P2P_PEERS)",
                mine_far, config.p2p_remote_max
            )
        }
    });
    Ok(Peers {
        remotes,
        at_peer,
        most,
        off,
    })
}

/// The operations of a launch as a kernel parameter (by value).
#[repr(transparent)]
struct OpsArg(RemoteOps);

// SAFETY: plain `#[repr(C)]` integers, the kernel's parameter type.
unsafe impl DeviceRepr for OpsArg {}

/// Connection requests made before the communicator's setup, completed by [`RemoteP2p::finish`].
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
pub(super) struct RemoteP2p {
    /// The host copy of the context (the Host backend runs on it).
    ctx: Box<ProxyContext>,
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

impl RemoteP2p {
    /// Registers the remote_p2p buffer and asks for the two proxy channels over `network` (TCP or
    /// IB) to every rank of `peers` (the setup itself is the caller's `connection_setup`).
    pub(super) fn connect(
        comm: &mut Communicator,
        config: &CollConfig,
        topo: &Topology,
        peers: Peers,
        network: TransportKind,
    ) -> Result<Pending, CommError> {
        let me = comm.rank();
        let Peers {
            remotes,
            at_peer,
            most,
            ..
        } = peers;
        let slot = slot_bytes(config);
        // Regions for the most remote ranks of any rank (see `Peers::most`): a channel's
        // two buffers must be of one size.
        let bytes = xk::buffer_bytes(slot as u64, DEPTH, most as u64) as usize;
        let transports: Vec<TransportKind> = remotes
            .iter()
            .map(|&p| topo.transport_to(p, network, comm.backend().transport()))
            .collect();
        // As the cross buffer: host-mapped where every remote rank is reached over TCP.
        let buf = alloc_cross_buffer(comm, config, transports.iter().copied(), bytes)?;
        let mut channels = Vec::with_capacity(remotes.len());
        for (&p, &t) in remotes.iter().zip(&transports) {
            let (out_tag, in_tag) = if me < p {
                (TAG_UP, TAG_DOWN)
            } else {
                (TAG_DOWN, TAG_UP)
            };
            let out = comm.connect(p, &buf, out_tag, t)?;
            let inc = comm.connect(p, &buf, in_tag, t)?;
            channels.push((out, inc));
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
    ) -> Result<RemoteP2p, CommError> {
        // SAFETY: the handles are kept in the RemoteP2p, which lives in the Collectives next to
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
        let ctx = ProxyContext {
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
        Ok(RemoteP2p {
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

    /// Whether send/recv channels to rank `peer` (on another host) were set up.
    pub(super) fn reaches(&self, peer: usize) -> bool {
        self.remote.get(peer).is_some_and(Option::is_some)
    }

    /// The operation of a transfer with rank `peer`, or `None` for a rank of this host
    /// (which the p2p kernel serves).
    pub(super) fn op(&self, buf: u64, bytes: u64, peer: usize, send: bool) -> Option<RemoteOp> {
        let (index, at_peer) = self.remote.get(peer).copied().flatten()?;
        Some(RemoteOp {
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
    pub(super) unsafe fn run_host(&self, ops: &RemoteOps) {
        let _turn = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the host context holds this communicator's live memory (the remote_p2p buffer,
        // the handles, counters, state words and fault area); caller contract for the
        // ranges; outside a launch the function runs as a block of one thread.
        unsafe { xk::run(&self.ctx, ops) }
    }

    /// GPU backend: queues `ops` on `stream` (the `remote_p2p` kernel, one block of `threads`).
    ///
    /// # Safety
    /// Every operation's range valid device memory until the stream ran the kernel.
    pub(super) unsafe fn launch(
        &self,
        call: &str,
        ops: RemoteOps,
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
        // communicator's registered memory; the arguments match `remote_p2p`'s signature
        // (*const ProxyContext, RemoteOps by value).
        unsafe { l.launch(cfg) }
            .map(|_| ())
            .map_err(|e| gpu::classify(call, "cuLaunchKernel", e))
    }
}

impl GpuX {
    fn load(
        gpu: &Gpu,
        kernels: &gpu::Kernels,
        host_ctx: &ProxyContext,
        conns: &[DevConn<'static>],
        counters: usize,
    ) -> Result<GpuX, CommError> {
        let mut ctx = *host_ctx;
        let (conn_mem, state) = proxy_context_on_device(gpu, &mut ctx.coll, conns)?;
        let count = DeviceBuffer::zeroed(gpu, counters * 8)?;
        ctx.counters = count.device_ptr() as *mut u64;
        let mem = DeviceBuffer::zeroed(gpu, std::mem::size_of::<ProxyContext>())?;
        mem.copy_from_host(0, std::slice::from_ref(&ctx))?;
        Ok(GpuX {
            ctx: mem,
            _conns: conn_mem,
            _state: state,
            _counters: count,
            kernel: kernels.function("remote_p2p")?,
        })
    }
}
