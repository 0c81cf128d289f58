//! Collectives across hosts (issue #17), GPU and Host backends: ranks of one host keep the
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

use super::descriptor::{all_gather_tag, all_reduce_tag};

use super::launch::one_shot_grid;
use super::select::{MAPPED_GRID_REDUCE_BYTES, two_shot_pays};
use super::{AllGatherAlgo, AllReduceAlgo, CollConfig, Collectives, DataType, ReduceOp, gpu};
use crate::communicator::{Backend, Buffer, CommError, Communicator, FaultRecord};
use crate::cuda::{CudaFunction, CudaStream, DeviceBuffer, Gpu, memcpy_async};
use crate::transport::TransportKind;
use crate::transport::tags::TAG_CROSS;
use cudarc::driver::LaunchConfig;
use cudarc::driver::PushKernelArg;
use mscclpp_device::channel::DevConn;
use mscclpp_device::collectives::cross::{GATHER, HEADER_ONLY, PER_DEST, PICK, REDUCE};
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

/// Most blocks of that reduction (each reads host memory at a fraction of PCIe's rate).
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

/// The groups of ranks the collectives treat as hosts, from the machines' ranks (`machines[m]`:
/// the ranks of the machine with bootstrap host id `ids[m]`, ascending): the machines
/// themselves when they are alike and of at most [`MAX_RANKS`] ranks (no note); otherwise
/// every machine cut into groups of `g` consecutive ranks, `g` the largest number of at most
/// [`MAX_RANKS`] that divides every machine's rank count (1 at worst: every rank its own
/// host), in the order of their lowest rank, with a note saying why.
pub(super) fn group_hosts(
    machines: Vec<Vec<usize>>,
    ids: &[String],
) -> (Vec<Vec<usize>>, Option<String>) {
    let max = mscclpp_device::collectives::MAX_RANKS;
    let oversized = machines.iter().position(|r| r.len() > max);
    let unequal = machines.iter().position(|r| r.len() != machines[0].len());
    let reason = match (oversized, unequal) {
        (Some(h), _) => format!(
            "host {:?} has {} ranks, more than the {max} a host's memory channels serve",
            ids[h],
            machines[h].len()
        ),
        (None, Some(h)) => format!(
            "host {:?} has {} ranks and host {:?} {} (each rank's partners on the other hosts \
             are the ranks of its local index, so hosts must be alike)",
            ids[0],
            machines[0].len(),
            ids[h],
            machines[h].len()
        ),
        (None, None) => return (machines, None),
    };
    let common = machines.iter().fold(0, |g, r| gcd(g, r.len()));
    let g = (1..=max.min(common))
        .rev()
        .find(|d| common % d == 0)
        .unwrap_or(1);
    let mut groups: Vec<Vec<usize>> = machines
        .iter()
        .flat_map(|r| r.chunks(g).map(<[usize]>::to_vec))
        .collect();
    groups.sort_by_key(|r| r[0]);
    let note = if g == 1 {
        format!(
            "{reason}: every rank is its own host for the collectives, all their traffic goes \
             over proxy channels (the network transport between machines, the copy engine or \
             shared memory inside one; no memory-channel kernels), and sums are in rank order"
        )
    } else {
        format!(
            "{reason}: the collectives treat each host as groups of {g} ranks (the largest \
             size of at most {max} that divides every host's rank count; {} groups in all): \
             ranks of a group talk over memory channels, groups over proxy channels (the \
             network transport between machines, the copy engine or shared memory inside \
             one), and sums are per group in rank order, then across groups",
            groups.len()
        )
    };
    (groups, Some(note))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The hosts of a communicator: its ranks grouped by bootstrap host id, hosts in the order of
/// their lowest rank, ranks ascending within a host (machines that are not alike, or of more
/// than [`MAX_RANKS`] ranks, cut into groups that are: [`group_hosts`]).
#[derive(Debug, Clone)]
pub(super) struct Topology {
    /// `hosts[h]`: the ranks of host `h`.
    pub(super) hosts: Vec<Vec<usize>>,
    /// This rank's host.
    pub(super) host: usize,
    /// This rank's index in its host's ranks.
    pub(super) local: usize,
    /// Why the hosts are not used as such, if they are not: hosts of different sizes, or
    /// one with more ranks than [`MAX_RANKS`]; each is then cut into groups of one size
    /// ([`group_hosts`]), at worst every rank its own host.
    pub(super) flat: Option<String>,
    /// The machine (bootstrap host id, numbered in order of first rank) of every rank: when
    /// machines are cut into groups, ranks of one machine are different hosts but need no
    /// network.
    machine: Vec<usize>,
    /// The host (index into `hosts`) of every rank.
    host_index: Vec<usize>,
    /// This rank.
    rank: usize,
}

impl Topology {
    /// Reads every rank's host id from the bootstrap (every rank reads the same table, so
    /// every rank builds the same topology). Hosts of different sizes, or one of more than
    /// [`MAX_RANKS`] ranks, are cut into groups of one size ([`group_hosts`]).
    pub(super) fn of(comm: &Communicator) -> Result<Topology, CommError> {
        let bs = comm.bootstrap().as_async();
        let mut ids: Vec<String> = Vec::new();
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        let mut machine = Vec::with_capacity(comm.nranks());
        for r in 0..comm.nranks() {
            let id = bs.host_id(r).unwrap_or("?").to_string();
            match ids.iter().position(|x| *x == id) {
                Some(h) => {
                    hosts[h].push(r);
                    machine.push(h);
                }
                None => {
                    machine.push(ids.len());
                    ids.push(id);
                    hosts.push(vec![r]);
                }
            }
        }
        let me = comm.rank();
        let (hosts, flat) = group_hosts(hosts, &ids);
        let mut host_index = vec![0; comm.nranks()];
        for (h, ranks) in hosts.iter().enumerate() {
            for &r in ranks {
                host_index[r] = h;
            }
        }
        let host = host_index[me];
        let local = hosts[host].iter().position(|&r| r == me).expect("listed");
        Ok(Topology {
            hosts,
            host,
            local,
            flat,
            machine,
            host_index,
            rank: me,
        })
    }

    /// The transport of a proxy channel to rank `p`: `local` (the backend's own, P2P or
    /// Host) when `p` shares this rank's machine (only in a flat topology), else `network`.
    pub(super) fn transport_to(
        &self,
        p: usize,
        network: TransportKind,
        local: TransportKind,
    ) -> TransportKind {
        if self.machine[p] == self.machine[self.rank] {
            local
        } else {
            network
        }
    }

    /// Ranks of this rank's host (the local group), ascending.
    pub(super) fn group(&self) -> &[usize] {
        &self.hosts[self.host]
    }

    /// The host of rank `r`.
    pub(super) fn host_of(&self, r: usize) -> usize {
        self.host_index[r]
    }

    /// Whether ranks `a` and `b` are on one machine (one bootstrap host id), which they may
    /// be on different hosts of the collectives when machines are cut into groups.
    pub(super) fn same_machine(&self, a: usize, b: usize) -> bool {
        self.machine[a] == self.machine[b]
    }

    /// Host `h` in words for errors: `host 1`, or, where machines are cut into groups (the
    /// collectives' hosts are then not the user's), `host 1, group 3` (the machine numbered
    /// in order of first rank, as the user's host ids are).
    pub(super) fn host_name(&self, h: usize) -> String {
        match self.hosts.get(h) {
            Some(ranks) if self.flat.is_some() => {
                format!("host {}, group {h}", self.machine[ranks[0]])
            }
            _ => format!("host {h}"),
        }
    }

    /// The rank of local index `local` on host `h`.
    pub(super) fn rank_at(&self, h: usize, local: usize) -> usize {
        self.hosts[h][local]
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
    /// `cross_reduce` of the loaded module (large reductions over a host-mapped buffer).
    reduce: CudaFunction,
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

/// Refuses an average of 8-bit integers over more ranks than the type holds (the quotient's
/// divisor is the rank count in the type, as in the kernels).
fn check_avg(call: &str, op: ReduceOp, dtype: DataType, nranks: usize) -> Result<(), CommError> {
    let max = match dtype {
        DataType::I8 => i8::MAX as usize,
        DataType::U8 => u8::MAX as usize,
        _ => usize::MAX,
    };
    if op == ReduceOp::Avg && nranks > max {
        return Err(CommError::InvalidArgument(format!(
            "{call}: the average of {dtype} over {nranks} ranks is not supported (the rank \
             count does not fit the type); sum, then divide"
        )));
    }
    Ok(())
}

/// A connection request made before the communicator's setup, completed by
/// [`Cross::finish`].
pub(super) struct Pending {
    topo: Topology,
    buf: Buffer,
    slot: usize,
    /// `(host, index in device_connections)` of each partner's channel.
    channels: Vec<(usize, usize)>,
}

/// The algorithm code (the descriptor's [`desc::ALGO_SHIFT`] field) of the two-shot forms
/// across hosts, for all-reduce, reduce and broadcast alike (one-shot's is 0).
fn two_shot_code() -> u64 {
    let tag = all_reduce_tag(AllReduceAlgo::TwoShot, DataType::F32, ReduceOp::Sum);
    desc::field(tag, desc::ALGO_SHIFT)
}

/// The address of a registered buffer (device or host memory).
pub(super) fn buffer_addr(b: &Buffer) -> u64 {
    b.device_ptr()
        .or_else(|| b.host_ptr().map(|a| a as u64))
        .expect("a buffer has an address")
}

/// A [`CollContext`] for a step over proxy channels alone (the cross-host step, the xp2p
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
        fault::AT_CROSS | fault::AT_CROSS_ROUND | fault::AT_CROSS_GONE
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
        let (shard, stage) = if gpu.is_some() {
            (Vec::new(), Vec::new())
        } else {
            (vec![0; payload], vec![0; nlocal * payload])
        };
        Ok(Cross {
            ctx: Box::new(ctx),
            _host_state: host_state,
            _conns: conns,
            base,
            slot: p.slot,
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

    /// Payload bytes of a slot (a multiple of 16).
    fn payload(&self) -> usize {
        self.slot - HDR
    }

    /// Payload address of send slot `h`.
    fn send_payload(&self, h: usize) -> u64 {
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
            reduce: kernels.function("cross_reduce")?,
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
                    self.run_host_blocks(call, 1, || {
                        // SAFETY: the context holds this communicator's shared memory; no
                        // elements, so no user memory is touched; blocks of >= nranks
                        // threads.
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
        if self.cross.is_none() {
            return local();
        }
        self.cross_call(call, ex, |cross, _, _| {
            local()?;
            let flags = xk::flags(xk::NONE, 0) | HEADER_ONLY;
            // SAFETY: no bytes: the step copies nothing in or out.
            unsafe { self.x_step(ex, cross, call, 0, 0, [0, tag], 0, flags, 0) }
        })
    }

    /// The cross-host state, or `None` for a one-host `Collectives`.
    pub(super) fn cross(&self) -> Option<&Cross> {
        self.cross.as_ref()
    }

    /// Runs `body` with the cross state locked, after the pending errors; a failure of the
    /// body is kept and returned by every later call (see the [module](self)). The body gets
    /// the shard's and the stage's addresses (host or device memory, by `ex`).
    fn cross_call(
        &self,
        call: &str,
        ex: Exec<'_>,
        body: impl FnOnce(&Cross, u64, u64) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        if matches!(ex, Exec::Host) {
            self.host_only(call)?;
        }
        let cross = self.cross.as_ref().expect("a cross-host Collectives");
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
    unsafe fn x_step(
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
    unsafe fn local_all_gather(
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
        // Over a host-mapped buffer, a large reduction runs on a grid after the step.
        let grid_reduce = cross.buffer_mapped()
            && flags & 0xf == REDUCE
            && out != 0
            && len >= MAPPED_GRID_REDUCE_BYTES;
        let (step_out, reduce_out) = if grid_reduce { (0, out) } else { (out, 0) };
        let out = step_out;
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
            grid_dim: (1, 1, 1),
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
        )?;
        if reduce_out == 0 {
            return Ok(());
        }
        let blocks = (len / MAPPED_GRID_REDUCE_BYTES as u64 * 4)
            .clamp(1, MAPPED_REDUCE_BLOCKS.min(self.config.max_blocks) as u64)
            as u32;
        let mut l = stream.launch_builder(&g.reduce);
        l.arg(&ctx)
            .arg(&src)
            .arg(&reduce_out)
            .arg(&tag)
            .arg(&len)
            .arg(&flags);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as above (the step's ranges, `reduce_out` its `out`), on the stream right
        // after the step; the argument list matches `cross_reduce`'s signature
        // (*const CollContext, *const u8, *mut u8, u64, u64, u64).
        self.noted(
            unsafe { l.launch(cfg) }
                .map(|_| ())
                .map_err(|e| gpu::classify("launch", "cuLaunchKernel", e)),
        )
    }

    /// A cross-host failure recorded in the fault area, as `call`'s error.
    pub(super) fn cross_fault(&self, call: &str) -> Result<(), CommError> {
        let area = self.comm.fault_area();
        if let Some(rec) = area.record().filter(|r| is_cross(r.place)) {
            return Err(self.cross_error(call, &rec));
        }
        if area.cross_broken() {
            return Err(CommError::State(format!(
                "{call}: rank {}: a round across hosts failed earlier (another failure holds \
                 the fault record); the collectives cannot be used any more",
                self.rank()
            )));
        }
        Ok(())
    }

    /// The communicator's abort reason, waiting up to
    /// [`LOSS_NEWS_GRACE`](crate::bootstrap::LOSS_NEWS_GRACE) for one: a
    /// partner whose TCP sockets ended has most likely died, and the bootstrap's news of it
    /// (which sets the abort) can trail the sockets' end on a loaded machine; `None` if no
    /// abort came (the partner left politely, or is gone for another reason).
    fn abort_reason_soon(&self) -> Option<crate::communicator::AbortReason> {
        let deadline = std::time::Instant::now() + crate::bootstrap::LOSS_NEWS_GRACE;
        loop {
            if let Some(r) = self.comm.abort_reason() {
                return Some(r);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The error a cross-host step's record stands for (never cleared: the partners' rounds
    /// may no longer pair).
    pub(super) fn cross_error(&self, call: &str, rec: &FaultRecord) -> CommError {
        let me = self.rank();
        let h = rec.peer;
        let (peer, host) = match &self.cross {
            Some(c) if h < c.hosts() => (
                c.topo.rank_at(h, c.topo.local).to_string(),
                c.topo.host_name(h),
            ),
            _ => ("?".into(), format!("host {h}")),
        };
        match rec.kind {
            _ if rec.place == fault::AT_CROSS_GONE
                && let Some(reason) = self.abort_reason_soon() =>
            {
                // The partner's sockets ended because it died: say so as the loss the
                // bootstrap reports (as every other wait of this rank does), not as a
                // departure.
                CommError::Aborted(format!(
                    "{call}: rank {me}: {reason} (while waiting for rank {peer} on {host}, \
                     across hosts); the collectives cannot be used any more"
                ))
            }
            _ if rec.place == fault::AT_CROSS_GONE => {
                let proxy = self
                    .comm
                    .proxy_error()
                    .map_or(String::new(), |e| format!(": {e}"));
                CommError::State(format!(
                    "{call}: rank {me} lost its connection across hosts to rank {peer} \
                     ({host}): that rank left or failed before its part of this call \
                     arrived{proxy}; the collectives cannot be used any more"
                ))
            }
            fault::MISMATCH if rec.place == fault::AT_CROSS_ROUND => CommError::State(format!(
                "{call}: the ranks called collectives differently across hosts: rank {peer} \
                 ({host}) is at its round {} across hosts where rank {me} is at {}; the \
                 collectives cannot be used any more",
                rec.theirs[0], rec.own[0]
            )),
            fault::MISMATCH => CommError::State(format!(
                "{call}: the ranks called collectives differently across hosts: rank {me} \
                 called {}, rank {peer} ({host}) {}; the collectives cannot be used any more",
                describe(rec.own),
                describe(rec.theirs)
            )),
            fault::TIMEOUT => {
                let proxy = self
                    .comm
                    .proxy_error()
                    .map_or(String::new(), |e| format!(" (the proxy reported: {e})"));
                let queues = match self.comm.backend() {
                    Backend::Gpu(_) => {
                        work_queue_hint(std::env::var(WORK_QUEUES_ENV).ok().as_deref())
                    }
                    Backend::Host => None,
                }
                .map_or(String::new(), |hint| format!("; {hint}"));
                let (left, (behind, stuck)) = match &self.cross {
                    Some(c) if h < c.hosts() => {
                        let rank = c.topo.rank_at(h, c.topo.local);
                        let what = format!("{} across hosts", describe(rec.own));
                        (self.left_note(rank), self.stall_texts(rank, &what))
                    }
                    _ => (String::new(), (String::new(), self.stuck_note())),
                };
                CommError::Timeout(format!(
                    "{call}: rank {me} waited {:?} for rank {peer} ({host}, across hosts){behind} \
                     in {} and gave up: that rank did not take part, or is \
                     stuck{left}{proxy}{queues}{stuck}; the collectives cannot be used any more",
                    self.comm.device_timeout(),
                    describe(rec.own)
                ))
            }
            _ => {
                let reason = self
                    .comm
                    .abort_reason()
                    .map_or("the communicator was aborted".into(), |r| r.to_string());
                CommError::Aborted(format!(
                    "{call}: rank {me}: {reason} (while waiting for rank {peer} on {host}); \
                     the collectives cannot be used any more"
                ))
            }
        }
    }

    /// The call descriptor and step flags of an all-reduce (`root`: a reduce) across hosts
    /// with `algo` (one-shot or two-shot; a reduce's is unused), and the local steps'
    /// operation (an average sums; the step divides once).
    fn all_reduce_plan(
        &self,
        cross: &Cross,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: Option<usize>,
        algo: AllReduceAlgo,
    ) -> ([u64; 2], u64, ReduceOp) {
        // The one-shot descriptor keeps the `Auto` code it always had.
        let code = if algo == AllReduceAlgo::TwoShot {
            algo
        } else {
            AllReduceAlgo::Auto
        };
        let descr = [
            count as u64,
            match root {
                None => all_reduce_tag(code, dtype, op),
                Some(r) => desc::rooted_tag(
                    desc::REDUCE,
                    super::descriptor::dtype_code(dtype),
                    super::descriptor::op_desc(op),
                    if algo == AllReduceAlgo::TwoShot {
                        two_shot_code()
                    } else {
                        0
                    },
                    r as u64,
                ),
            },
        ];
        let mut flags = xk::flags(REDUCE, self.nranks() as u32);
        if let Some(r) = root {
            flags = xk::to_host(flags, cross.topo.host_of(r) as u32);
        }
        let step_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        (descr, flags, step_op)
    }

    /// Across hosts: hierarchical all-reduce (see the [module](self)) on `ex`; with `root`,
    /// a reduce: the partners send to the root's host only, whose ranks reduce and gather
    /// the shards, and only the root writes `recv`.
    ///
    /// Per round, `L * c` elements (`L` ranks per host): the local reduce-scatter leaves
    /// this host's partial of the shard of this local index (`c` elements, summed in local
    /// rank order; one rank per host: the input itself), the exchange with the partners
    /// reduces it over the hosts in host order, and the local all-gather spreads the shards.
    /// The exchange is
    /// - one-shot (any `algo` but [`AllReduceAlgo::TwoShot`]): the partial goes whole to
    ///   every partner (a reduce: to the root's host only) and each reduces all of them:
    ///   `(H - 1) * c` elements sent per rank for `H` hosts, one round;
    /// - two-shot: `c` is a multiple of `H`, piece `h` of the partial goes to host `h`
    ///   ([`PER_DEST`]), which reduces it over the hosts, then a [`GATHER`] step hands every
    ///   partner (a reduce: the root's host only) every reduced piece: `2 * (H - 1) * c / H`
    ///   elements per rank (a reduce: the root's host receives that instead of
    ///   `(H - 1) * c`), two rounds. The same sources in the same order: the same bits.
    ///
    /// # Safety
    /// `send`/`recv` valid memory of `ex`'s kind for `count` elements (equal or disjoint;
    /// `recv` on the root only for a reduce), until the stream ran the call.
    #[allow(clippy::too_many_arguments)]
    // Long (~140 lines): one closure runs the local reduce-scatter, the rounds across hosts
    // (one-shot or two-shot, all-reduce or reduce) and the local all-gather on one staged
    // shard; cut apart, the pieces would pass that shard's pointers and offsets around.
    pub(super) unsafe fn cross_all_reduce(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: Option<usize>,
        algo: AllReduceAlgo,
    ) -> Result<(), CommError> {
        let call = ex.name(if root.is_some() {
            "reduce"
        } else {
            "all_reduce"
        });
        let call = call.as_str();
        check_avg(call, op, dtype, self.nranks())?;
        let two_shot = algo == AllReduceAlgo::TwoShot;
        let algo = if two_shot {
            algo
        } else {
            AllReduceAlgo::OneShot
        };
        let s = dtype.size();
        self.cross_call(call, ex, |cross, shard, stage| {
            let (descr, flags, step_op) = self.all_reduce_plan(cross, count, dtype, op, root, algo);
            let (nl, nh, me) = (cross.nlocal(), cross.hosts(), cross.topo.host);
            // Reduce: the root's host reduces, the root keeps the result.
            let root_host = root.map(|r| cross.topo.host_of(r));
            let reducing = root_host.is_none_or(|h| h == me);
            let is_root = root.is_none_or(|r| r == self.rank());
            // Two-shot's pieces and exchanges (one-shot's step is `flags`).
            let scatter = xk::flags(REDUCE | PER_DEST, self.nranks() as u32);
            let gather = match root_host {
                None => xk::flags(GATHER, 0),
                Some(h) => xk::to_host(xk::flags(GATHER, 0), h as u32),
            };
            // A shard fills at most a slot's payload (one-shot) or the shard buffer, in nh
            // pieces of at most a slot's payload (two-shot).
            let unit = if two_shot { nh } else { 1 };
            let most = cross.payload() / s / unit * unit;
            let mut off = 0usize;
            while off < count {
                let rem = count - off;
                let c = rem.div_ceil(nl).next_multiple_of(unit).min(most);
                let (q, len) = (c / unit, rem.min(nl * c));
                let at = |b: u64| b + (off * s) as u64;
                // The reduced shard: straight into recv when this rank keeps a whole round
                // of one shard, else the shard buffer.
                let res = if nl == 1 && len == c && is_root {
                    at(recv)
                } else {
                    shard
                };
                let out = if reducing { res } else { 0 };
                // SAFETY (every step below): send and recv hold count elements (caller
                // contract); the stage holds nl * payload >= nl * c elements, the shard
                // payload >= c, a send slot's payload >= q.
                unsafe {
                    // 1. This host's partial of the shard of this local index (past len,
                    // the stage's stale bytes, reduced but never written out).
                    let input = if len == nl * c {
                        at(send)
                    } else {
                        self.x_copy(ex, stage, at(send), len * s)?;
                        stage
                    };
                    let rs =
                        |to: u64| self.local_reduce_scatter(ex, call, input, to, c, dtype, step_op);
                    if two_shot {
                        let partial = if nl == 1 {
                            input
                        } else {
                            rs(shard)?;
                            shard
                        };
                        for h in 0..nh {
                            let from = partial + (h * q * s) as u64;
                            self.x_copy(ex, cross.send_payload(h), from, q * s)?;
                        }
                        // 2. This host's piece, reduced over the hosts in host order (the
                        // average's quotient included) into its place in the result.
                        let mine = res + (me * q * s) as u64;
                        self.x_step(ex, cross, call, 0, mine, descr, q * s, scatter, 0)?;
                        // 3. Every host's reduced piece to every partner (a reduce: to the
                        // root's host only): the whole shard.
                        self.x_step(ex, cross, call, mine, out, descr, q * s, gather, q * s)?;
                    } else {
                        // Into the own send slot (one rank per host: the step copies the
                        // input there).
                        let src = if nl == 1 {
                            input
                        } else {
                            rs(cross.send_payload(me))?;
                            0
                        };
                        // 2, 3. Every host's partial from the partners (a reduce: to the
                        // root's host only), reduced in host order (the average's quotient
                        // included).
                        self.x_step(ex, cross, call, src, out, descr, c * s, flags, 0)?;
                    }
                    // 4. Every local index's shard to every local rank (a reduce: on the
                    // root's host, kept by the root only).
                    if reducing && nl == 1 && is_root {
                        self.x_copy(ex, at(recv), res, len * s)?;
                    } else if reducing && nl > 1 {
                        let whole = len == nl * c && root.is_none();
                        let at_recv = is_root.then(|| at(recv));
                        let shape = (c * s, len * s, whole);
                        self.spread(ex, call, (shard, stage), at_recv, shape, dtype)?;
                    }
                }
                off += len;
            }
            Ok(())
        })
    }

    /// The last step of an all-reduce round with several ranks per host: the local
    /// all-gather of every local index's `shard` (`(shard bytes, round bytes, whole)`),
    /// straight into `recv` when the round is `whole` (a full round of an all-reduce), else
    /// through `stage` and a copy of the round's bytes into `recv` (`None`: a reduce's
    /// non-root, which keeps nothing).
    ///
    /// # Safety
    /// `shard` valid for its bytes, `stage` for the local ranks' shards, `recv` for the
    /// round's bytes (`L` shards when `whole`), memory of `ex`'s kind.
    unsafe fn spread(
        &self,
        ex: Exec<'_>,
        call: &str,
        (shard, stage): (u64, u64),
        recv: Option<u64>,
        (shard_bytes, round_bytes, whole): (usize, usize, bool),
        dtype: DataType,
    ) -> Result<(), CommError> {
        // SAFETY: caller contract.
        unsafe {
            match recv {
                Some(r) if whole => self.local_all_gather(ex, call, shard, r, shard_bytes, dtype),
                _ => {
                    self.local_all_gather(ex, call, shard, stage, shard_bytes, dtype)?;
                    match recv {
                        Some(r) => self.x_copy(ex, r, stage, round_bytes),
                        None => Ok(()),
                    }
                }
            }
        }
    }

    /// Across hosts: all-gather of `bytes` per rank on `ex` (see the [module](self)). Per
    /// round, a piece of every rank's input goes to the partners (the step gathers the
    /// hosts' pieces), then the local all-gather and copies to their places.
    ///
    /// # Safety
    /// `send` valid for `bytes`, `recv` for `nranks * bytes` (in place as the one-host call),
    /// memory of `ex`'s kind until the stream ran the call.
    pub(super) unsafe fn cross_all_gather(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let call = ex.name("all_gather");
        let call = call.as_str();
        let descr = [bytes as u64, all_gather_tag(AllGatherAlgo::Auto, dtype)];
        let flags = xk::flags(GATHER, 0);
        self.cross_call(call, ex, |cross, shard, stage| {
            let (nl, nh) = (cross.nlocal(), cross.hosts());
            // Each round: a piece of every rank's data; nh pieces gathered per local rank.
            let piece = cross.payload() / nh / 16 * 16;
            let mut off = 0usize;
            while off < bytes {
                let p = piece.min(bytes - off);
                let src = send + off as u64;
                // SAFETY (every step below): send holds bytes, recv nranks * bytes (caller
                // contract); the shard holds payload >= nh * p bytes, the stage nl *
                // payload >= nl * nh * p.
                unsafe {
                    if nl == 1 {
                        // One rank per host: rank h is host h; the pieces go to their places.
                        let out = recv + off as u64;
                        self.x_step(ex, cross, call, src, out, descr, p, flags, bytes)?;
                    } else {
                        self.x_step(ex, cross, call, src, shard, descr, p, flags, p)?;
                        self.local_all_gather(ex, call, shard, stage, nh * p, dtype)?;
                        for lq in 0..nl {
                            for h in 0..nh {
                                let to = recv + (cross.topo.rank_at(h, lq) * bytes + off) as u64;
                                let from = stage + ((lq * nh + h) * p) as u64;
                                self.x_copy(ex, to, from, p)?;
                            }
                        }
                    }
                }
                off += p;
            }
            Ok(())
        })
    }

    /// Across hosts: reduce-scatter of `count` elements per rank on `ex` (`send` holds
    /// `nranks * count`, block `g` for rank `g`). Each round: the blocks are arranged by
    /// local index (local index `l` gets, in host order, the blocks of the ranks of local
    /// index `l`), reduce-scattered inside the host (local order), and each host's partial of
    /// block `g` sent to `g`'s host, where the step reduces them in host order.
    ///
    /// # Safety
    /// `send` valid for `nranks * count` elements, `recv` for `count` (in place as the
    /// one-host call), memory of `ex`'s kind until the stream ran the call.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn cross_reduce_scatter(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = ex.name("reduce_scatter");
        let call = call.as_str();
        check_avg(call, op, dtype, self.nranks())?;
        let s = dtype.size();
        let step_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let tag = desc::tag(
            desc::REDUCE_SCATTER,
            super::descriptor::dtype_code(dtype),
            super::descriptor::op_desc(op),
            0,
        );
        let descr = [count as u64, tag];
        let flags = xk::flags(REDUCE | PER_DEST, self.nranks() as u32);
        self.cross_call(call, ex, |cross, shard, stage| {
            let (nl, nh) = (cross.nlocal(), cross.hosts());
            // Per round, c elements of every block: the stage holds nl * nh * c of them, the
            // local result nh * c (the shard), then one piece per send slot.
            let cap = cross.payload() / nh / s;
            let mut off = 0usize;
            while off < count {
                let c = (count - off).min(cap);
                // SAFETY (every step below): send holds nranks * count elements, recv count
                // (caller contract); the stage holds nl * payload >= nl * nh * c elements,
                // the shard payload >= nh * c, each send slot's payload >= c.
                unsafe {
                    for lq in 0..nl {
                        for h in 0..nh {
                            let g = cross.topo.rank_at(h, lq);
                            let from = send + ((g * count + off) * s) as u64;
                            let to = stage + ((lq * nh + h) * c * s) as u64;
                            self.x_copy(ex, to, from, c * s)?;
                        }
                    }
                    // This host's partial of the blocks of this local index, host by host.
                    let partial = if nl == 1 {
                        stage
                    } else {
                        self.local_reduce_scatter(ex, call, stage, shard, nh * c, dtype, step_op)?;
                        shard
                    };
                    for h in 0..nh {
                        let from = partial + (h * c * s) as u64;
                        self.x_copy(ex, cross.send_payload(h), from, c * s)?;
                    }
                    let out = recv + (off * s) as u64;
                    self.x_step(ex, cross, call, 0, out, descr, c * s, flags, 0)?;
                }
                off += c;
            }
            Ok(())
        })
    }

    /// Across hosts: broadcast of `bytes` from `root` on `ex`: the root's data goes to the
    /// ranks of its local index on the other hosts (the other local indexes do not exchange),
    /// then each host broadcasts it from that local index.
    ///
    /// # Safety
    /// `send` valid for `bytes` on the root, `recv` for `bytes` everywhere, memory of `ex`'s
    /// kind until the stream ran the call.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn cross_broadcast(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<(), CommError> {
        let call = ex.name("broadcast");
        let call = call.as_str();
        self.cross_call(call, ex, |cross, shard, _| {
            let topo = &cross.topo;
            let root_host = topo.host_of(root);
            let root_local = topo.hosts[root_host]
                .iter()
                .position(|&r| r == root)
                .expect("listed");
            let two_shot = two_shot_pays(cross.hosts(), bytes);
            let code = if two_shot { two_shot_code() } else { 0 };
            let tag = desc::rooted_tag(
                desc::BROADCAST,
                super::descriptor::dtype_code(dtype),
                0,
                code,
                root as u64,
            );
            let descr = [bytes as u64, tag];
            if topo.local == root_local && two_shot {
                // SAFETY: caller contract; the shard is the cross state's.
                unsafe {
                    self.broadcast_two_shot(
                        ex, call, cross, send, recv, bytes, root_host, descr, shard,
                    )?
                };
            } else if topo.local == root_local {
                let me = topo.host;
                let mut off = 0;
                while off < bytes {
                    let p = cross.payload().min(bytes - off);
                    // The root puts its piece; the others send headers and copy the root's.
                    let (src, flags) = if me == root_host {
                        (send + off as u64, xk::flags(PICK, 0))
                    } else {
                        (0, xk::flags(PICK | HEADER_ONLY, 0))
                    };
                    let out = if me == root_host && send == recv {
                        0
                    } else {
                        recv + off as u64
                    };
                    // SAFETY: send holds bytes on the root, recv bytes (caller contract).
                    unsafe { self.x_step(ex, cross, call, src, out, descr, p, flags, root_host)? };
                    off += p;
                }
            } else {
                // The other local indices carry nothing across hosts, but trade the call's
                // header with their partners once: hosts that disagree on the root (or the
                // size) then find it on every rank, where before the root's group waited for
                // a round that another host's ranks of its index never sent.
                let flags = xk::flags(xk::NONE, 0) | HEADER_ONLY;
                // SAFETY: no bytes: the step copies nothing in or out.
                unsafe { self.x_step(ex, cross, call, 0, 0, descr, 0, flags, 0)? };
            }
            if cross.nlocal() > 1 {
                // SAFETY: recv holds bytes; on the local root it holds the data now.
                unsafe { self.local_broadcast(ex, call, recv, bytes, dtype, root_local)? };
            }
            Ok(())
        })
    }

    /// The cross-host part of a two-shot broadcast from host `root_host` (its rank of this
    /// local index is the root): per round, `p` bytes in `H` pieces of `q`; the root puts
    /// piece `h` to host `h` alone (a [`PER_DEST`] [`PICK`] step, the others send headers),
    /// then a [`GATHER`] step hands every partner every piece. The root's link carries `2 *
    /// (H - 1) / H` of the bytes instead of `H - 1` times them.
    ///
    /// # Safety
    /// As for [`cross_broadcast`](Self::cross_broadcast); `shard` the cross state's.
    #[allow(clippy::too_many_arguments)]
    unsafe fn broadcast_two_shot(
        &self,
        ex: Exec<'_>,
        call: &str,
        cross: &Cross,
        send: u64,
        recv: u64,
        bytes: usize,
        root_host: usize,
        descr: [u64; 2],
        shard: u64,
    ) -> Result<(), CommError> {
        let (nh, me) = (cross.hosts(), cross.topo.host);
        let most = cross.payload() / nh;
        let scatter = if me == root_host {
            xk::flags(PICK | PER_DEST, 0)
        } else {
            xk::flags(PICK | PER_DEST | HEADER_ONLY, 0)
        };
        let gather = xk::flags(GATHER, 0);
        let mut off = 0;
        while off < bytes {
            let p = (bytes - off).min(nh * most);
            let q = p.div_ceil(nh);
            // Straight into recv when the pieces fill it exactly, else through the shard
            // (payload >= nh * q bytes).
            let direct = p == nh * q;
            let whole = if direct { recv + off as u64 } else { shard };
            let mine = whole + (me * q) as u64;
            // SAFETY (every step below): send holds bytes on the root, recv bytes (caller
            // contract); a send slot's payload holds q bytes.
            unsafe {
                if me == root_host {
                    for h in 0..nh {
                        // The last pieces may be short (or empty) past p.
                        let valid = p.saturating_sub(h * q).min(q);
                        let from = send + (off + h * q) as u64;
                        self.x_copy(ex, cross.send_payload(h), from, valid)?;
                    }
                }
                self.x_step(ex, cross, call, 0, mine, descr, q, scatter, root_host)?;
                self.x_step(ex, cross, call, mine, whole, descr, q, gather, q)?;
                if !direct {
                    self.x_copy(ex, recv + off as u64, shard, p)?;
                }
            }
            off += p;
        }
        Ok(())
    }

    /// Across hosts: all-to-all of `bytes` per pair on `ex` (`send` and `recv` hold `nranks *
    /// bytes`). Each round, a piece of every block: an all-to-all inside the host hands local
    /// index `l` every block of this host meant for the ranks of local index `l` (on every
    /// host); each rank puts its partner on host `h` the blocks for it (a send slot per
    /// host, the own host's too), the step gathers every host's blocks, and they are copied
    /// to their places by source rank.
    ///
    /// # Safety
    /// `send` and `recv` valid for `nranks * bytes`, disjoint, memory of `ex`'s kind until the
    /// stream ran the call.
    pub(super) unsafe fn cross_all_to_all(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let call = ex.name("all_to_all");
        let call = call.as_str();
        let tag = desc::tag(desc::ALL_TO_ALL, super::descriptor::dtype_code(dtype), 0, 0);
        let descr = [bytes as u64, tag];
        let flags = xk::flags(GATHER | PER_DEST, 0);
        self.cross_call(call, ex, |cross, _, stage| {
            let (nl, nh) = (cross.nlocal(), cross.hosts());
            // Pieces of p bytes (whole elements): the stage holds the arranged input and the
            // local all-to-all's output (nl * nh * p each), later the gathered blocks; a
            // slot nl * p.
            let s = dtype.size();
            let p_max = ((cross.payload() / (2 * nh)).min(cross.payload() / nl) / s * s).max(s);
            let mut off = 0usize;
            while off < bytes {
                let p = p_max.min(bytes - off);
                let half = (nl * nh * p) as u64;
                // SAFETY (every step below): send and recv hold nranks * bytes (caller
                // contract); the stage holds nl * payload >= 2 * nl * nh * p bytes; a send
                // slot's payload >= nl * p.
                unsafe {
                    // Input arranged by destination local index, then host.
                    for ld in 0..nl {
                        for hd in 0..nh {
                            let g = cross.topo.rank_at(hd, ld);
                            let from = send + (g * bytes + off) as u64;
                            let to = stage + ((ld * nh + hd) * p) as u64;
                            self.x_copy(ex, to, from, p)?;
                        }
                    }
                    // From every local rank ls: its blocks for (hd, l), hd in host order.
                    let local_out = if nl == 1 {
                        stage
                    } else {
                        let out = stage + half;
                        self.local_all_to_all(ex, call, stage, out, nh * p, dtype)?;
                        out
                    };
                    for hd in 0..nh {
                        for ls in 0..nl {
                            let from = local_out + ((ls * nh + hd) * p) as u64;
                            let to = cross.send_payload(hd) + (ls * p) as u64;
                            self.x_copy(ex, to, from, p)?;
                        }
                    }
                    // Host hs's blocks (nl * p bytes, by source local index) at stage +
                    // hs * nl * p.
                    self.x_step(ex, cross, call, 0, stage, descr, nl * p, flags, nl * p)?;
                    for hs in 0..nh {
                        for ls in 0..nl {
                            let g = cross.topo.rank_at(hs, ls);
                            let from = stage + ((hs * nl + ls) * p) as u64;
                            self.x_copy(ex, recv + (g * bytes + off) as u64, from, p)?;
                        }
                    }
                }
                off += p;
            }
            Ok(())
        })
    }
}

/// Where a cross-host call runs: on the calling thread (Host backend) or queued on a stream
/// (GPU backend).
#[derive(Debug, Clone, Copy)]
pub(super) enum Exec<'a> {
    /// Host backend: blocking, in this thread.
    Host,
    /// GPU backend: stream-ordered launches and copies.
    Gpu(&'a CudaStream),
}

impl Exec<'_> {
    /// The call's name in messages: `name` on a GPU, `name_host` on the Host backend.
    pub(super) fn name(self, name: &str) -> String {
        match self {
            Exec::Host => format!("{name}_host"),
            Exec::Gpu(_) => name.to_string(),
        }
    }
}

/// A cross-host call descriptor in words (`super::descriptor::describe`, whose algorithm names are the
/// one-host kernels'; these calls carry none).
fn describe(d: [u64; 2]) -> String {
    let [n, tag] = d;
    // The two-shot forms' descriptors hold what one-shot's hold: their algorithm code is
    // read here, and the rest as one-shot's.
    let kind = desc::field(tag, desc::KIND_SHIFT);
    let two_shot = matches!(kind, desc::ALL_REDUCE | desc::REDUCE | desc::BROADCAST)
        && desc::field(tag, desc::ALGO_SHIFT) == two_shot_code();
    let (tag, how) = if two_shot {
        (tag & !(0xff << desc::ALGO_SHIFT), "two-shot across hosts")
    } else {
        (tag, "across hosts")
    };
    let s = super::descriptor::describe([n, tag]);
    match s.strip_suffix(" (?)").or_else(|| s.strip_suffix(" (put)")) {
        Some(head) => format!("{head} ({how})"),
        None => s,
    }
}

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
