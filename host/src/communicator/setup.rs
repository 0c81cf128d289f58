//! Connection setup: what two ranks exchange over the bootstrap, and mapping the peer's
//! memory.
//!
//! For each pending connection, both sides send a [`ConnInfo`] (bincode over the bootstrap's
//! tagged send/recv) describing their buffer and the inbound counter the peer's proxy must
//! write, check the peer's against their own (transport, buffer size, machine), map the
//! peer's memory (CUDA IPC, peer access in one process, or shared memory), then send an
//! acknowledgement.
//!
//! Shared memory (Host backend) has no name until a setup round shares it: each segment is
//! given a fresh name per peer just before the description carrying it is sent; the peer
//! removes the name as soon as it has mapped the segment, and removes the names of every
//! description it received but did not map; this side removes every name it published
//! when the round ends (acknowledged, failed, or unwound). A bootstrap error (a peer that
//! died) does not cut the exchange short: every description still goes out and every one
//! that arrived is read, so names sent by a rank that died are removed by their receivers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{Backend, Buffer, ChannelKind, CommError, Communicator, PendingConnection};
use crate::cuda::{DeviceBuffer, Gpu, IpcMemHandle, PeerMapping};
use crate::proxy::{ProxyTask, RefusedHook, StartHook};
use crate::transport::host::HostPlane;
use crate::transport::ib::{
    CONTROL_BYTES, CudaStagingCopy, HostMemory, HostStagingCopy, IbEndpoint, IbHandshake, IbLink,
    IbPlane, LinkStaging, MemoryKind, MemoryRegistration, QpTransition, QueuePair, RdmaRegion,
    StagingMode, Verbs, decode_handshake, encode_handshake,
};
use crate::transport::p2p::P2pPlane;
use crate::transport::shm::{ShmError, ShmSegment, remove_name};
use crate::transport::{DataPlane, PlaneSet, Route, TransportKind};

/// Bootstrap tags of setup messages: a high marker | the connection's tag.
const INFO_TAG: u64 = 0x4d53_4350_0000_0000;
const ACK_TAG: u64 = 0x4d53_4341_0000_0000;

/// Memory one side describes to the other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum MemHandle {
    /// A `cuMemAlloc` buffer: its IPC handle, plus its address and device for a peer in the
    /// same process (which uses peer access instead of IPC).
    Ipc {
        handle: Vec<u8>,
        len: u64,
        device_ptr: u64,
        ordinal: u32,
    },
    /// A shared-memory segment.
    Shm { name: String, len: u64 },
    /// Memory reached through RDMA (IB): nothing to map; addresses and keys travel in the
    /// IB handshake.
    Remote { len: u64 },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ConnInfo {
    tag: u32,
    transport: TransportKind,
    kind: ChannelKind,
    /// The packet scratch the peer writes into (memory channels with packets).
    packets: Option<MemHandle>,
    packets_len: u64,
    pid: u32,
    buffer_len: u64,
    buffer: MemHandle,
    flags: MemHandle,
    flag_index: u32,
    /// IB connections: the encoded [`IbHandshake`].
    ib: Option<Vec<u8>>,
    /// The sender could not prepare its side (the other fields are placeholders): why. Sent
    /// instead of nothing, so that the peer fails at once naming the reason instead of
    /// waiting for the bootstrap's timeout.
    failed: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Ack {
    Mapped,
    Failed(String),
}

/// The inbound counters (peers write them) and expected epochs (local waits) of one setup
/// round, one of each per connection.
#[derive(Debug)]
pub(crate) enum FlagMemory {
    Device {
        _inbound: DeviceBuffer,
        _expected: DeviceBuffer,
    },
    Host {
        _inbound: ShmSegment,
        _expected: Box<[AtomicU64]>,
    },
    None,
}

/// A peer's memory mapped into this process, unmapped when the last user goes.
#[derive(Debug)]
enum PeerMem {
    Ipc {
        _mapping: PeerMapping,
    },
    Shm {
        _segment: ShmSegment,
    },
    /// Same process: the peer's own allocation, addressed directly.
    Direct,
    /// Reached through RDMA (IB): nothing mapped here.
    Remote,
}

/// The RDMA device of a communicator's IB connections.
#[derive(Debug)]
pub(crate) struct IbSession {
    verbs: Arc<dyn Verbs>,
}

impl IbSession {
    pub(crate) fn new(verbs: Arc<dyn Verbs>) -> IbSession {
        IbSession { verbs }
    }
}

/// The IB side of a set-up connection: its queue pair (shared with the proxy's plane) and the
/// keys, with the registrations kept alive as long as the connection.
#[derive(Debug)]
pub(crate) struct IbConnection {
    qp: Arc<Mutex<Box<dyn QueuePair>>>,
    lkey: u32,
    rkey: u32,
    flag_rkey: u32,
    /// Host staging on either side (see `transport::ib::staging`).
    staging: Option<LinkStaging>,
    /// Dropped before `_memory` (field order): deregister, then free.
    _registrations: Vec<Arc<MemoryRegistration>>,
    _memory: Vec<Arc<HostMemory>>,
}

/// An IB connection between sending its handshake and connecting its queue pair.
struct IbPrep {
    qp: Box<dyn QueuePair>,
    psn: u32,
    /// What the NIC addresses for our buffer: the buffer's registration, or its mirror's.
    local: Arc<MemoryRegistration>,
    /// The inbound counters' registration (None when staged: our proxy writes the counter).
    flags: Option<Arc<MemoryRegistration>>,
    /// The staging mirror of our buffer, when staged.
    mirror: Option<Arc<HostMemory>>,
    control: Arc<HostMemory>,
    control_reg: Arc<MemoryRegistration>,
}

/// A mirror of a staged buffer with its registration.
type Mirror = (Arc<HostMemory>, Arc<MemoryRegistration>);

/// Registers `[addr, addr + len)` once per setup round.
fn register_once(
    verbs: &dyn Verbs,
    registrations: &mut HashMap<(u64, u64), Arc<MemoryRegistration>>,
    addr: u64,
    len: u64,
    kind: MemoryKind,
) -> Result<Arc<MemoryRegistration>, CommError> {
    if let Some(r) = registrations.get(&(addr, len)) {
        return Ok(r.clone());
    }
    // SAFETY: callers pass memory of this communicator that outlives the registration: a
    // connection's buffer or staging memory (the connection keeps them and drops the
    // registrations first), or the round's flag memory (kept in `flag_memory`, which
    // outlives every connection of the round: connections are dropped first).
    let r = Arc::new(unsafe { verbs.register(addr, len, kind) }?);
    registrations.insert((addr, len), r.clone());
    Ok(r)
}

/// Registers an IB connection's memory (staging its buffer when asked to, or when a GPU
/// buffer cannot be registered in [`StagingMode::Auto`]) and creates its queue pair (INIT).
fn prepare_ib(
    comm: &Communicator,
    p: &PendingConnection,
    inbound_base: u64,
    flag_bytes: u64,
    registrations: &mut HashMap<(u64, u64), Arc<MemoryRegistration>>,
    mirrors: &mut HashMap<(u64, u64), Mirror>,
) -> Result<IbPrep, CommError> {
    let session = comm
        .ib
        .as_ref()
        .ok_or_else(|| CommError::State("IB connection without an opened RDMA device".into()))?;
    let verbs = session.verbs.as_ref();
    let mode = StagingMode::from_env()?.unwrap_or(comm.ib_config.staging);
    let (addr, len) = (p.buffer.addr(), p.buffer.len() as u64);
    let direct = match (&comm.backend, mode) {
        (_, StagingMode::Always) => None,
        (_, _) if mirrors.contains_key(&(addr, len)) => None,
        (Backend::Host, _) => Some(register_once(
            verbs,
            registrations,
            addr,
            len,
            MemoryKind::Host,
        )?),
        (Backend::Gpu(_), StagingMode::Never) => Some(register_once(
            verbs,
            registrations,
            addr,
            len,
            MemoryKind::Gpu,
        )?),
        // Auto: GPUDirect RDMA when the adapter takes the GPU memory, else host staging.
        (Backend::Gpu(_), StagingMode::Auto) => {
            register_once(verbs, registrations, addr, len, MemoryKind::Gpu).ok()
        }
    };
    let (local, flags, mirror) = match direct {
        Some(local) => {
            let flags_kind = match &comm.backend {
                Backend::Gpu(_) => MemoryKind::Gpu,
                Backend::Host => MemoryKind::Host,
            };
            let flags = register_once(verbs, registrations, inbound_base, flag_bytes, flags_kind)?;
            (local, Some(flags), None)
        }
        None => {
            let (mem, reg) = match mirrors.get(&(addr, len)) {
                Some(m) => m.clone(),
                None => {
                    let mem = Arc::new(match &comm.backend {
                        Backend::Gpu(gpu) => HostMemory::pinned(gpu, len as usize)?,
                        Backend::Host => HostMemory::heap(len as usize)?,
                    });
                    let reg =
                        register_once(verbs, registrations, mem.addr(), len, MemoryKind::Host)?;
                    mirrors.insert((addr, len), (mem.clone(), reg.clone()));
                    (mem, reg)
                }
            };
            (reg, None, Some(mem))
        }
    };
    let control = Arc::new(HostMemory::heap(CONTROL_BYTES as usize)?);
    let control_reg = register_once(
        verbs,
        registrations,
        control.addr(),
        control.len(),
        MemoryKind::Host,
    )?;
    let mut qp = verbs.create_qp(comm.ib_config.depth)?;
    qp.modify(QpTransition::Init)?;
    let psn = rand::random::<u32>() & 0xff_ffff;
    Ok(IbPrep {
        qp,
        psn,
        local,
        flags,
        mirror,
        control,
        control_reg,
    })
}

/// What a side that could not prepare a connection sends instead of its description.
fn failed_info(p: &PendingConnection, pid: u32, reason: String) -> ConnInfo {
    ConnInfo {
        failed: Some(reason),
        ..remote_info(p, pid)
    }
}

/// The description of a connection whose memory the peer reaches remotely (IB): no packets,
/// no handshake and no flag memory yet (callers fill them in).
fn remote_info(p: &PendingConnection, pid: u32) -> ConnInfo {
    let len = p.buffer.len() as u64;
    ConnInfo {
        tag: p.tag,
        transport: p.transport,
        kind: p.kind,
        packets: None,
        packets_len: 0,
        pid,
        buffer_len: len,
        buffer: MemHandle::Remote { len },
        flags: MemHandle::Remote { len: 0 },
        flag_index: 0,
        ib: None,
        failed: None,
    }
}

/// A set-up connection.
#[derive(Debug)]
pub struct Connection {
    pub(crate) id: u32,
    remote_rank: usize,
    tag: u32,
    transport: TransportKind,
    pub(crate) route: Route,
    pub(crate) inbound: u64,
    pub(crate) expected: u64,
    kind: ChannelKind,
    /// This side's packet scratch (the peer writes packets into it), 0 if none.
    pub(crate) packets_in: u64,
    /// The peer's packet scratch mapped here, 0 if none.
    pub(crate) packets_out: u64,
    pub(crate) packets_len: u64,
    _local: Buffer,
    _local_packets: Option<Buffer>,
    _peer_buffer: Arc<PeerMem>,
    _peer_flags: Arc<PeerMem>,
    _peer_packets: Option<Arc<PeerMem>>,
    /// IB connections: queue pair and keys.
    pub(crate) ib: Option<IbConnection>,
}

impl Connection {
    /// The peer.
    pub fn remote_rank(&self) -> usize {
        self.remote_rank
    }
    /// The tag given to `connect`.
    pub fn tag(&self) -> u32 {
        self.tag
    }
    /// The transport.
    pub fn transport(&self) -> TransportKind {
        self.transport
    }
    /// Proxy or memory channel.
    pub fn kind(&self) -> ChannelKind {
        self.kind
    }
    /// Size of the buffers (equal on both sides).
    pub fn buffer_len(&self) -> u64 {
        self.route.local_len
    }
    /// Whether this side's buffer goes through a host staging mirror (IB connections whose
    /// GPU memory could not be registered, or with staging forced).
    pub fn ib_staged(&self) -> bool {
        self.ib
            .as_ref()
            .and_then(|i| i.staging.as_ref())
            .is_some_and(|s| s.mirror.is_some())
    }
}

fn mismatch(peer: usize, tag: u32, reason: impl Into<String>) -> CommError {
    CommError::Mismatch {
        peer,
        tag,
        reason: reason.into(),
    }
}

/// Shared-memory names this side published in one setup round, one per segment and peer;
/// every one is removed when this drops (the round's end, on every path).
#[derive(Debug, Default)]
struct Published {
    names: HashMap<(usize, usize), String>,
}

impl Published {
    /// The handle of `seg` for `peer`: a name published for this peer in this round.
    fn handle(&mut self, seg: &ShmSegment, peer: usize) -> Result<MemHandle, ShmError> {
        let key = (seg.as_ptr() as usize, peer);
        let name = match self.names.get(&key) {
            Some(n) => n.clone(),
            None => {
                let n = seg.publish()?;
                self.names.insert(key, n.clone());
                n
            }
        };
        Ok(MemHandle::Shm {
            name,
            len: seg.len() as u64,
        })
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        for name in self.names.values() {
            // A peer that mapped the segment removed the name already.
            let _ = remove_name(name);
        }
    }
}

/// Removes the shared-memory names in a peer's description (they were published for this
/// rank alone), whether or not this rank mapped them.
fn remove_names(info: &ConnInfo) {
    for h in [Some(&info.buffer), Some(&info.flags), info.packets.as_ref()]
        .into_iter()
        .flatten()
    {
        if let MemHandle::Shm { name, .. } = h {
            let _ = remove_name(name);
        }
    }
}

fn describe(
    buffer: &Buffer,
    backend: &Backend,
    peer: usize,
    published: &mut Published,
) -> Result<MemHandle, CommError> {
    match (&*buffer.mem, backend) {
        (super::BufferMem::Device(d), Backend::Gpu(gpu)) => Ok(ipc_handle(d, gpu)?),
        (super::BufferMem::Host(s), _) => Ok(published.handle(s, peer)?),
        _ => Err(CommError::InvalidArgument(
            "buffer does not belong to this backend".into(),
        )),
    }
}

fn ipc_handle(d: &DeviceBuffer, gpu: &Gpu) -> Result<MemHandle, CommError> {
    let h = d.ipc_handle()?;
    Ok(MemHandle::Ipc {
        handle: h.bytes.to_vec(),
        len: h.len,
        device_ptr: d.device_ptr(),
        ordinal: gpu.info().ordinal as u32,
    })
}

/// Maps a peer's memory (deduplicated per handle: CUDA cannot open one IPC handle twice in
/// a process).
fn map_peer(
    handle: &MemHandle,
    same_process: bool,
    backend: &Backend,
    cache: &mut HashMap<MemHandle, (Arc<PeerMem>, u64)>,
) -> Result<(Arc<PeerMem>, u64), CommError> {
    if let Some(m) = cache.get(handle) {
        return Ok(m.clone());
    }
    let mapped = match (handle, backend) {
        (MemHandle::Shm { name, len }, _) => {
            let seg = ShmSegment::open(name, *len as usize)?;
            // Mapped: the name (published for this rank alone) has done its job.
            remove_name(name)?;
            let addr = seg.as_ptr() as u64;
            (Arc::new(PeerMem::Shm { _segment: seg }), addr)
        }
        (
            MemHandle::Ipc {
                device_ptr,
                ordinal,
                ..
            },
            Backend::Gpu(gpu),
        ) if same_process => {
            if *ordinal as usize != gpu.info().ordinal {
                let peer = Gpu::open(*ordinal as usize)?;
                gpu.enable_peer_access(&peer)?;
            }
            (Arc::new(PeerMem::Direct), *device_ptr)
        }
        (MemHandle::Ipc { handle, len, .. }, Backend::Gpu(gpu)) => {
            let mut bytes = [0u8; 64];
            if handle.len() != 64 {
                return Err(CommError::InvalidArgument(format!(
                    "peer sent an IPC handle of {} bytes (64 expected)",
                    handle.len()
                )));
            }
            bytes.copy_from_slice(handle);
            let m = PeerMapping::open(gpu, &IpcMemHandle { bytes, len: *len })?;
            let addr = m.device_ptr();
            (Arc::new(PeerMem::Ipc { _mapping: m }), addr)
        }
        (MemHandle::Remote { .. }, _) => {
            return Err(CommError::InvalidArgument(
                "peer described RDMA memory for a connection that is not IB".into(),
            ));
        }
        (MemHandle::Ipc { .. }, Backend::Host) => {
            return Err(CommError::InvalidArgument(
                "peer described GPU memory but this communicator has no GPU".into(),
            ));
        }
    };
    cache.insert(handle.clone(), mapped.clone());
    Ok(mapped)
}

/// The inbound counters and expected epochs of a round of `n` connections: the memory, its
/// handle for peers, and the two base addresses.
fn alloc_flags(
    backend: &Backend,
    n: usize,
) -> Result<(FlagMemory, MemHandle, u64, u64), CommError> {
    let bytes = n * 8;
    Ok(match backend {
        Backend::Gpu(gpu) => {
            let inbound = DeviceBuffer::zeroed(gpu, bytes)?;
            let expected = DeviceBuffer::zeroed(gpu, bytes)?;
            let handle = ipc_handle(&inbound, gpu)?;
            let (i, e) = (inbound.device_ptr(), expected.device_ptr());
            (
                FlagMemory::Device {
                    _inbound: inbound,
                    _expected: expected,
                },
                handle,
                i,
                e,
            )
        }
        Backend::Host => {
            let inbound = ShmSegment::create(bytes)?;
            let expected: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
            // Placeholder: each peer gets a name of its own (`flags_for`).
            let handle = MemHandle::Shm {
                name: String::new(),
                len: inbound.len() as u64,
            };
            let (i, e) = (inbound.as_ptr() as u64, expected.as_ptr() as u64);
            (
                FlagMemory::Host {
                    _inbound: inbound,
                    _expected: expected,
                },
                handle,
                i,
                e,
            )
        }
    })
}

/// The description of an IB connection: its handshake (queue pair, the buffer or its
/// mirror, where the flag goes, the control block) wrapped in a [`ConnInfo`].
fn ib_info(
    comm: &Communicator,
    p: &PendingConnection,
    prep: &IbPrep,
    k: usize,
    inbound_base: u64,
    flag_bytes: usize,
    pid: u32,
) -> Result<ConnInfo, CommError> {
    let port = comm.ib.as_ref().map(|s| s.verbs.port());
    let port = port.ok_or_else(|| CommError::State("no RDMA device".into()))?;
    let len = p.buffer.len() as u64;
    let control = RdmaRegion {
        addr: prep.control.addr(),
        len: prep.control.len(),
        rkey: prep.control_reg.rkey,
    };
    let (buffer, flag) = match (&prep.mirror, &prep.flags) {
        // Staged: the peer writes into the mirror and its flag into the control block.
        (Some(mirror), _) => (
            RdmaRegion {
                addr: mirror.addr(),
                len,
                rkey: prep.local.rkey,
            },
            RdmaRegion {
                addr: control.addr,
                len: 8,
                rkey: control.rkey,
            },
        ),
        (None, Some(flags)) => (
            RdmaRegion {
                addr: p.buffer.addr(),
                len,
                rkey: prep.local.rkey,
            },
            RdmaRegion {
                addr: inbound_base + k as u64 * 8,
                len: 8,
                rkey: flags.rkey,
            },
        ),
        (None, None) => {
            return Err(CommError::State(
                "IB connection prepared without flag memory".into(),
            ));
        }
    };
    let handshake = IbHandshake {
        endpoint: IbEndpoint {
            lid: port.lid,
            gid: port.gid,
            mtu: port.mtu,
            qpn: prep.qp.qpn(),
            psn: prep.psn,
        },
        buffer,
        flag,
        staged: prep.mirror.is_some(),
        control,
    };
    Ok(ConnInfo {
        flags: MemHandle::Remote {
            len: flag_bytes as u64,
        },
        flag_index: k as u32,
        ib: Some(encode_handshake(&handshake)),
        ..remote_info(p, pid)
    })
}

/// Sets up `pending` (ids from `first_id`): exchange, check, map, acknowledge, unlink.
pub(super) fn establish(
    comm: &Communicator,
    pending: Vec<PendingConnection>,
    first_id: u32,
) -> Result<(Vec<Connection>, FlagMemory), CommError> {
    let n = pending.len();
    if n == 0 {
        return Ok((Vec::new(), FlagMemory::None));
    }
    let bytes = n * 8;
    // A failure before the exchange is not returned at once: every peer still gets a
    // description (marked failed, with the reason), so it fails promptly too.
    let (flags, flags_handle, inbound_base, expected_base, round_error) =
        match alloc_flags(&comm.backend, n) {
            Ok((f, h, i, e)) => (f, h, i, e, None),
            Err(e) => (
                FlagMemory::None,
                MemHandle::Remote { len: 0 },
                0,
                0,
                Some(e),
            ),
        };
    let bs = &comm.bootstrap;
    let me = comm.rank();
    // Every name published below is removed when this goes, on every path out.
    let mut published = Published::default();
    let flags_for = |peer: usize, published: &mut Published| -> Result<MemHandle, CommError> {
        match &flags {
            FlagMemory::Host { _inbound: s, .. } => Ok(published.handle(s, peer)?),
            _ => Ok(flags_handle.clone()),
        }
    };
    let my_host = bs.as_async().host_id(me).map(str::to_string);
    let pid = std::process::id();

    // IB connections: register the buffer (or its staging mirror), the flag memory and the
    // control block, create the queue pair (INIT).
    let mut ib_preps: Vec<Option<IbPrep>> = Vec::with_capacity(n);
    let mut local_errors: Vec<Option<CommError>> = Vec::with_capacity(n);
    let mut registrations: HashMap<(u64, u64), Arc<MemoryRegistration>> = HashMap::new();
    let mut mirrors: HashMap<(u64, u64), Mirror> = HashMap::new();
    for p in &pending {
        if let Some(e) = &round_error {
            ib_preps.push(None);
            local_errors.push(Some(CommError::State(e.to_string())));
            continue;
        }
        if p.transport != TransportKind::Ib {
            ib_preps.push(None);
            local_errors.push(None);
            continue;
        }
        match prepare_ib(
            comm,
            p,
            inbound_base,
            bytes as u64,
            &mut registrations,
            &mut mirrors,
        ) {
            Ok(prep) => {
                ib_preps.push(Some(prep));
                local_errors.push(None);
            }
            Err(e) => {
                ib_preps.push(None);
                local_errors.push(Some(e));
            }
        }
    }
    drop(registrations);
    drop(mirrors);

    // 1. Send every description first (sends are buffered by the receiver), then receive.
    let mut first_error: Option<CommError> = None;
    let code = |info: &ConnInfo| {
        bincode::serde::encode_to_vec(info, bincode::config::standard())
            .map_err(|e| CommError::InvalidArgument(format!("encoding connection info: {e}")))
    };
    // Every description is built (every name published) before any is sent: a peer removes
    // a name as soon as it has mapped the segment, and a segment whose names are all gone
    // cannot be given another (tmpfs links an unnamed file only until its first link goes).
    let mut outgoing = Vec::with_capacity(n);
    for (k, p) in pending.iter().enumerate() {
        let built = match (&local_errors[k], &ib_preps[k]) {
            (Some(e), _) => Err(CommError::State(e.to_string())),
            (None, Some(prep)) => ib_info(comm, p, prep, k, inbound_base, bytes, pid),
            (None, None) => (|| -> Result<ConnInfo, CommError> {
                Ok(ConnInfo {
                    tag: p.tag,
                    transport: p.transport,
                    kind: p.kind,
                    packets: p
                        .packets
                        .as_ref()
                        .map(|b| describe(b, &comm.backend, p.remote_rank, &mut published))
                        .transpose()?,
                    packets_len: p.packets.as_ref().map_or(0, |b| b.len() as u64),
                    pid,
                    buffer_len: p.buffer.len() as u64,
                    buffer: describe(&p.buffer, &comm.backend, p.remote_rank, &mut published)?,
                    flags: flags_for(p.remote_rank, &mut published)?,
                    flag_index: k as u32,
                    ib: None,
                    failed: None,
                })
            })(),
        };
        let info = match built {
            Ok(info) => info,
            Err(e) => {
                let info = failed_info(p, pid, e.to_string());
                local_errors[k].get_or_insert(e);
                info
            }
        };
        outgoing.push((p.remote_rank, p.tag, code(&info)?));
    }
    for (peer, tag, bytes) in outgoing {
        // A peer that is gone is not a reason to stop: the others still get theirs.
        let what = format!("the setup info of connection tag {tag}");
        if let Err(e) = bs.send_named(peer, INFO_TAG | tag as u64, &what, &bytes) {
            first_error.get_or_insert(e.into());
        }
    }
    let mut cache = HashMap::new();
    let mut conns = Vec::with_capacity(n);
    for (k, p) in pending.into_iter().enumerate() {
        // What a peer sent before dying is still delivered; what it did not send fails at
        // once (the bootstrap names the lost rank).
        let (peer_info, recv_error) = match bs.recv_named(
            p.remote_rank,
            INFO_TAG | p.tag as u64,
            &format!("the setup info of connection tag {}", p.tag),
        ) {
            Ok(raw) => {
                match bincode::serde::decode_from_slice::<ConnInfo, _>(
                    &raw,
                    bincode::config::standard(),
                ) {
                    Ok((info, _)) => (Some(info), None),
                    Err(e) => (
                        None,
                        Some(mismatch(
                            p.remote_rank,
                            p.tag,
                            format!("undecodable connection info: {e}"),
                        )),
                    ),
                }
            }
            Err(e) => (None, Some(CommError::from(e))),
        };
        let result = (|| {
            if let Some(e) = local_errors[k].take() {
                return Err(e);
            }
            let (Some(peer), None) = (peer_info.as_ref(), &recv_error) else {
                return Err(recv_error.unwrap_or_else(|| {
                    CommError::State("connection info neither received nor failed".into())
                }));
            };
            if let Some(reason) = &peer.failed {
                return Err(mismatch(
                    p.remote_rank,
                    p.tag,
                    format!("rank {} could not set up its side: {reason}", p.remote_rank),
                ));
            }
            check_peer(
                &p,
                peer,
                my_host.as_deref(),
                bs.as_async().host_id(p.remote_rank),
            )?;
            if let Some(prep) = ib_preps[k].take() {
                return connect_ib(
                    &p,
                    peer,
                    prep,
                    first_id + k as u32,
                    inbound_base,
                    expected_base,
                    k,
                );
            }
            let same_process =
                peer.pid == pid && bs.as_async().host_id(p.remote_rank) == my_host.as_deref();
            let (buf_mem, buf_addr) =
                map_peer(&peer.buffer, same_process, &comm.backend, &mut cache)?;
            let (flag_mem, flag_addr) =
                map_peer(&peer.flags, same_process, &comm.backend, &mut cache)?;
            let flags_len = match &peer.flags {
                MemHandle::Ipc { len, .. }
                | MemHandle::Shm { len, .. }
                | MemHandle::Remote { len } => *len,
            };
            if (peer.flag_index as u64 + 1) * 8 > flags_len {
                return Err(mismatch(
                    p.remote_rank,
                    p.tag,
                    "peer's flag index is outside its flag memory",
                ));
            }
            let peer_packets = match &peer.packets {
                Some(h) => Some(map_peer(h, same_process, &comm.backend, &mut cache)?),
                None => None,
            };
            Ok(Connection {
                id: first_id + k as u32,
                remote_rank: p.remote_rank,
                tag: p.tag,
                transport: p.transport,
                route: Route {
                    id: first_id + k as u32,
                    local: p.buffer.addr(),
                    local_len: p.buffer.len() as u64,
                    remote: buf_addr,
                    remote_len: peer.buffer_len,
                    remote_flag: flag_addr + peer.flag_index as u64 * 8,
                },
                inbound: inbound_base + k as u64 * 8,
                expected: expected_base + k as u64 * 8,
                kind: p.kind,
                packets_in: p.packets.as_ref().map_or(0, |b| b.addr()),
                packets_out: peer_packets.as_ref().map_or(0, |(_, a)| *a),
                packets_len: p.packets.as_ref().map_or(0, |b| b.len() as u64),
                _local: p.buffer.clone(),
                _local_packets: p.packets.clone(),
                _peer_buffer: buf_mem,
                _peer_flags: flag_mem,
                _peer_packets: peer_packets.map(|(m, _)| m),
                ib: None,
            })
        })();
        if let Some(info) = &peer_info {
            remove_names(info);
        }
        let ack = match &result {
            Ok(_) => Ack::Mapped,
            Err(e) => Ack::Failed(e.to_string()),
        };
        let ack = bincode::serde::encode_to_vec(&ack, bincode::config::standard())
            .map_err(|e| CommError::InvalidArgument(format!("encoding ack: {e}")))?;
        let what = format!("the setup acknowledgement of connection tag {}", p.tag);
        if let Err(e) = bs.send_named(p.remote_rank, ACK_TAG | p.tag as u64, &what, &ack) {
            first_error.get_or_insert(e.into());
        }
        match result {
            Ok(c) => conns.push(c),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    // 2. Wait for every peer's acknowledgement, then remove our shared-memory names.
    for c in &conns {
        let what = format!("the setup acknowledgement of connection tag {}", c.tag);
        let raw = match bs.recv_named(c.remote_rank, ACK_TAG | c.tag as u64, &what) {
            Ok(raw) => raw,
            Err(e) => {
                first_error.get_or_insert(e.into());
                continue;
            }
        };
        let ack: Ack = bincode::serde::decode_from_slice(&raw, bincode::config::standard())
            .map(|(a, _)| a)
            .unwrap_or_else(|e| Ack::Failed(format!("undecodable acknowledgement: {e}")));
        if let Ack::Failed(reason) = ack {
            first_error.get_or_insert(mismatch(
                c.remote_rank,
                c.tag,
                format!("the peer could not set up its side: {reason}"),
            ));
        }
    }
    // Every peer has mapped (or will not map) what it was sent: no name is needed any more.
    drop(published);
    if let Some(e) = round_error.or(first_error) {
        return Err(e);
    }
    Ok((conns, flags))
}

fn check_peer(
    mine: &PendingConnection,
    peer: &ConnInfo,
    my_host: Option<&str>,
    peer_host: Option<&str>,
) -> Result<(), CommError> {
    let (rank, tag) = (mine.remote_rank, mine.tag);
    if peer.tag != tag {
        return Err(mismatch(
            rank,
            tag,
            format!("peer answered for tag {}", peer.tag),
        ));
    }
    if peer.transport != mine.transport {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "transports differ: {} here, {} on the peer",
                mine.transport, peer.transport
            ),
        ));
    }
    if peer.kind != mine.kind {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "channel kinds differ: {:?} here, {:?} on the peer",
                mine.kind, peer.kind
            ),
        ));
    }
    let my_packets = mine.packets.as_ref().map_or(0, |b| b.len() as u64);
    if peer.packets_len != my_packets {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "packet scratch sizes differ: {my_packets} bytes here, {} bytes on the peer",
                peer.packets_len
            ),
        ));
    }
    if peer.buffer_len != mine.buffer.len() as u64 {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "buffer sizes differ: {} bytes here, {} bytes on the peer",
                mine.buffer.len(),
                peer.buffer_len
            ),
        ));
    }
    // RDMA connects machines; the others need the peer's memory mapped here.
    if my_host != peer_host && mine.transport != TransportKind::Ib {
        return Err(CommError::TransportUnavailable {
            transport: mine.transport,
            reason: format!(
                "rank {rank} is on another machine ({} vs {}); {} connects ranks of one machine (IB is needed across machines)",
                peer_host.unwrap_or("?"),
                my_host.unwrap_or("?"),
                mine.transport
            ),
        });
    }
    Ok(())
}

/// Connects an IB connection's queue pair to the peer's (RTR, RTS) from its handshake.
fn connect_ib(
    p: &PendingConnection,
    peer: &ConnInfo,
    mut prep: IbPrep,
    id: u32,
    inbound_base: u64,
    expected_base: u64,
    k: usize,
) -> Result<Connection, CommError> {
    let (rank, tag) = (p.remote_rank, p.tag);
    let raw = peer
        .ib
        .as_ref()
        .ok_or_else(|| mismatch(rank, tag, "the peer sent no InfiniBand handshake"))?;
    let hs = decode_handshake(raw).map_err(|e| mismatch(rank, tag, e.to_string()))?;
    if hs.buffer.len != peer.buffer_len {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "the peer's IB buffer region ({} bytes) differs from its buffer ({} bytes)",
                hs.buffer.len, peer.buffer_len
            ),
        ));
    }
    prep.qp.modify(QpTransition::ReadyToReceive(&hs.endpoint))?;
    prep.qp
        .modify(QpTransition::ReadyToSend { psn: prep.psn })?;
    let staging = (prep.mirror.is_some() || hs.staged).then(|| LinkStaging {
        mirror: prep.mirror.as_ref().map(|m| (m.addr(), prep.local.lkey)),
        peer_staged: hs.staged,
        buffer: p.buffer.addr(),
        buffer_len: p.buffer.len() as u64,
        inbound: inbound_base + k as u64 * 8,
        control: prep.control.addr(),
        peer_control: (hs.control.addr, hs.control.rkey),
        progress: Arc::default(),
    });
    let lkey = prep.local.lkey;
    let mut registrations = vec![prep.local, prep.control_reg];
    registrations.extend(prep.flags);
    let mut memory = vec![prep.control];
    memory.extend(prep.mirror);
    Ok(Connection {
        id,
        remote_rank: rank,
        tag,
        transport: TransportKind::Ib,
        route: Route {
            id,
            local: p.buffer.addr(),
            local_len: p.buffer.len() as u64,
            remote: hs.buffer.addr,
            remote_len: hs.buffer.len,
            remote_flag: hs.flag.addr,
        },
        inbound: inbound_base + k as u64 * 8,
        expected: expected_base + k as u64 * 8,
        kind: p.kind,
        packets_in: 0,
        packets_out: 0,
        packets_len: 0,
        _local: p.buffer.clone(),
        _local_packets: None,
        _peer_buffer: Arc::new(PeerMem::Remote),
        _peer_flags: Arc::new(PeerMem::Remote),
        _peer_packets: None,
        ib: Some(IbConnection {
            qp: Arc::new(Mutex::new(prep.qp)),
            lkey,
            rkey: hs.buffer.rkey,
            flag_rkey: hs.flag.rkey,
            staging,
            _registrations: registrations,
            _memory: memory,
        }),
    })
}

/// The proxy's task for `comm`'s connections.
pub(super) fn proxy_task(comm: &Communicator) -> Result<ProxyTask, CommError> {
    let routes = comm.connections.iter().map(|c| c.route).collect();
    let consumer = comm
        .fifo
        .consumer()
        .map_err(|e| CommError::State(format!("proxy FIFO: {e}")))?;
    let (plane, on_start): (Box<dyn DataPlane>, Option<StartHook>) = match &comm.backend {
        Backend::Gpu(gpu) => {
            let stream = gpu.new_stream()?;
            let g = gpu.clone();
            (
                Box::new(P2pPlane::new(stream)),
                Some(Box::new(move || {
                    let _ = g.bind();
                })),
            )
        }
        Backend::Host => (Box::new(HostPlane), None),
    };
    let plane = if comm.connections.iter().any(|c| c.ib.is_some()) {
        let links = comm
            .connections
            .iter()
            .map(|c| {
                c.ib.as_ref().map(|i| IbLink {
                    qp: i.qp.clone(),
                    peer: c.remote_rank,
                    tag: c.tag,
                    lkey: i.lkey,
                    rkey: i.rkey,
                    flag_rkey: i.flag_rkey,
                    staging: i.staging.clone(),
                })
            })
            .collect();
        // The proxy is stopped (the caller checks), so the epochs are stable.
        let epochs: Vec<u64> = comm
            .epochs
            .iter()
            .map(|e| e.load(Ordering::Relaxed))
            .collect();
        let mut ib_plane = IbPlane::new(links, &epochs, comm.ib_config)?;
        if comm.connections.iter().any(Connection::ib_staged) {
            ib_plane = ib_plane.with_staging_copy(match &comm.backend {
                Backend::Gpu(gpu) => Box::new(CudaStagingCopy::new(gpu.new_stream()?)),
                Backend::Host => Box::new(HostStagingCopy),
            });
        }
        let ib_plane: Box<dyn DataPlane> = Box::new(ib_plane);
        if comm.connections.iter().all(|c| c.ib.is_some()) {
            ib_plane
        } else {
            let plane_of = comm
                .connections
                .iter()
                .map(|c| usize::from(c.ib.is_some()))
                .collect();
            Box::new(PlaneSet::new(vec![plane, ib_plane], plane_of))
        }
    } else {
        plane
    };
    // The new consumer starts with a clean tail; so do the refused connections.
    comm.fault.clear_proxy_refused();
    let fault = comm.fault.clone();
    let on_refused: RefusedHook = Box::new(move |id| fault.mark_proxy_refused(id));
    Ok(ProxyTask {
        consumer,
        routes,
        epochs: comm.epochs.clone(),
        plane,
        on_start,
        peers: comm.connections.iter().map(|c| c.remote_rank).collect(),
        on_refused: Some(on_refused),
    })
}
