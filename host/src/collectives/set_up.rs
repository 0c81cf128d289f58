//! Setting up [`Collectives`]: scratch, channels, contexts and kernels, in the order the
//! peers' bootstrap exchanges need.

use super::failure::caused_by_another_rank;
use super::{AllGatherAlgo, AllReduceAlgo, RootedAlgo};
use super::{CollConfig, Collectives};
use super::{
    cross, engine, gpu, order, proxy, scatter_rooted, send_recv, send_recv_proxy, staged, topology,
};
use crate::communicator::{Backend, Buffer as Registered, CommError, Communicator};
use crate::settings::{PdlMode, Settings};
use crate::transport::TransportKind;
use crate::transport::tags::{TAG_PROXY, TAG_SCRATCH, TAG_SEMAPHORES};
use mscclpp_device::channel::DevConn;
use mscclpp_device::collectives::{
    CollContext, DESC_BYTES, EXPECTED_WORDS, MAX_RANKS, SEMAPHORE_WORDS, STATE_WORDS, guard,
};
use std::collections::HashMap;
use std::sync::Arc;

/// This process's settings, or the error naming the variables that do not parse.
pub(super) fn settings() -> Result<&'static Settings, CommError> {
    Settings::global().map_err(|e| CommError::InvalidArgument(e.to_string()))
}

/// A setting's algorithm: `None` for `Auto` (the config decides).
fn forced<T: PartialEq>(value: T, auto: T) -> Option<T> {
    (value != auto).then_some(value)
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
pub(super) fn block_cap_of(devices: &[Vec<u8>]) -> u32 {
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
pub(super) fn share_cap(sharing: u32, multiprocessors: u32) -> u32 {
    if sharing <= 1 {
        u32::MAX
    } else {
        (multiprocessors / sharing).max(1)
    }
}

impl Collectives {
    /// Registers scratch and connects every pair of ranks of a host, and each rank to the
    /// ranks of its local index on the other hosts (over TCP; see [Across
    /// hosts](super#across-hosts)) (collective: every rank calls it, with equal configs).
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
        let (remote_p2p, p2p_off) = if spans_hosts {
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
                Some(send_recv_proxy::RemoteP2p::connect(
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
        let cross = cross
            .map(|c| cross::Cross::finish(comm, c, gpu.as_ref()))
            .transpose()?;
        let remote_p2p = remote_p2p
            .map(|x| send_recv_proxy::RemoteP2p::finish(comm, x, gpu.as_ref()))
            .transpose()?;
        let span = match cross {
            Some(cross) => engine::Span::AcrossHosts(Box::new(engine::AcrossHosts {
                cross,
                remote_p2p,
                p2p_off,
            })),
            None => engine::Span::OneHost,
        };
        let engine = match gpu {
            Some(core) => engine::Engine::Gpu(Box::new(engine::GpuKernels {
                scatter_rooted: scatter_rooted::Kernels::load(&core)?,
                core,
            })),
            None => engine::Engine::Host,
        };
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
            engine,
            span,
            p2p,
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
}

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
