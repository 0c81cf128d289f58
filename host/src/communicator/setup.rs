//! Connection setup: what two ranks exchange over the bootstrap, and each transport's part
//! of it.
//!
//! For each pending connection, both sides send a [`ConnInfo`] (bincode over the bootstrap's
//! tagged send/recv) describing their buffer and the inbound counter the peer's proxy must
//! write, check the peer's against their own (transport, buffer size, machine), finish the
//! connection, then send an acknowledgement. The round (flag memory, the exchange, the
//! acknowledgements, error handling) is the same for every transport; what a transport
//! puts into its description, how it finishes a connection from the peer's, and which data
//! plane its proxy drives are behind [`TransportSetup`], one implementation per transport
//! ([`setup_of`] is the registry):
//!
//! - P2P and Host ([`MappedSetup`], here): map the peer's memory (CUDA IPC, peer access in
//!   one process, or shared memory);
//! - IB (`transport::ib::setup`): register memory, connect queue pairs;
//! - TCP (`transport::tcp`): listen, connect sockets, start the receivers.
//!
//! Shared memory (Host backend) has no name until a setup round shares it: each segment is
//! given a fresh name per peer just before the description carrying it is sent; the peer
//! removes the name as soon as it has mapped the segment, and removes the names of every
//! description it received but did not map; this side removes every name it published
//! when the round ends (acknowledged, failed, or unwound). A bootstrap error (a peer that
//! died) does not cut the exchange short: every description still goes out and every one
//! that arrived is read, so names sent by a rank that died are removed by their receivers.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::{Backend, Buffer, ChannelKind, CommError, Communicator, ConnTag, PendingConnection};
use crate::cuda::{DeviceBuffer, Gpu, HostRegistration, IpcMemHandle, PeerMapping};
use crate::proxy::{ProxyTask, RefusedHook, SettleHook, StartHook};
use crate::transport::host::HostPlane;
use crate::transport::ib::setup::IbSetup;
use crate::transport::p2p::{P2pPlane, PROXY_FLAG_ENV, ProxyFlagMode};
use crate::transport::shm::{ShmError, ShmSegment, remove_name};
use crate::transport::tcp::TcpSetup;
use crate::transport::{DataPlane, PlaneSet, Route, TransportKind};

/// Bootstrap tags of setup messages: a high marker | the connection's tag.
const INFO_TAG: u64 = 0x4d53_4350_0000_0000;
const ACK_TAG: u64 = 0x4d53_4341_0000_0000;

/// Memory one side describes to the other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) enum MemHandle {
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
    /// Memory reached over the network (IB, TCP): nothing to map; what the peer needs
    /// travels in the transport's handshake ([`ConnInfo::wire`]).
    Remote { len: u64 },
}

/// One side's description of a connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ConnInfo {
    pub(crate) tag: u32,
    pub(crate) transport: TransportKind,
    pub(crate) kind: ChannelKind,
    /// The packet scratch the peer writes into (memory channels with packets).
    pub(crate) packets: Option<MemHandle>,
    pub(crate) packets_len: u64,
    pub(crate) pid: u32,
    pub(crate) buffer_len: u64,
    pub(crate) buffer: MemHandle,
    pub(crate) flags: MemHandle,
    pub(crate) flag_index: u32,
    /// The transport's own handshake, if it has one (IB: the encoded `IbHandshake`; TCP:
    /// the listening address and connection count).
    pub(crate) wire: Option<Vec<u8>>,
    /// The sender could not prepare its side (the other fields are placeholders): why. Sent
    /// instead of nothing, so that the peer fails at once naming the reason instead of
    /// waiting for the bootstrap's timeout.
    pub(crate) failed: Option<String>,
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
        /// The inbound counters of the round's P2P proxy channels in the `cpu` flag mode.
        host: Option<HostFlags>,
    },
    Host {
        _inbound: ShmSegment,
        _expected: Box<[AtomicU64]>,
    },
    None,
}

/// Inbound counters in host memory that this GPU polls and the peers' proxies store into
/// (the P2P `cpu` flag mode): a shared-memory segment registered with the device.
#[derive(Debug)]
pub(crate) struct HostFlags {
    /// Declared first, so dropped first: unregistered before the segment is unmapped.
    registration: HostRegistration,
    segment: ShmSegment,
}

impl HostFlags {
    fn new(gpu: &Gpu, n: usize) -> Result<HostFlags, CommError> {
        let segment = ShmSegment::create(n * 8)?;
        // SAFETY: the segment is a fresh mapping of `len` bytes, registered once, and it
        // outlives the registration (field order above).
        let registration = unsafe { HostRegistration::new(gpu, segment.as_ptr(), segment.len()) }?;
        Ok(HostFlags {
            registration,
            segment,
        })
    }

    /// Connection `k`'s counter, as the device reaches it.
    fn device_addr(&self, k: usize) -> u64 {
        self.registration.device_ptr() + k as u64 * 8
    }
}

impl FlagMemory {
    fn host_flags(&self) -> Option<&HostFlags> {
        match self {
            FlagMemory::Device { host, .. } => host.as_ref(),
            _ => None,
        }
    }
}

/// Whether `p`'s inbound counter is a host one in this round (a P2P proxy channel in the
/// `cpu` flag mode).
fn host_flags_for<'a>(round: &Round<'a>, p: &PendingConnection) -> Option<&'a HostFlags> {
    (p.kind == ChannelKind::Proxy && p.transport == TransportKind::P2p)
        .then(|| round.flags.host_flags())
        .flatten()
}

/// A peer's memory mapped into this process, unmapped when the last user goes.
#[derive(Debug)]
pub(crate) enum PeerMem {
    Ipc {
        _mapping: PeerMapping,
    },
    Shm {
        _segment: ShmSegment,
    },
    /// Same process: the peer's own allocation, addressed directly.
    Direct,
    /// Reached over the network (IB, TCP): nothing mapped here.
    Remote,
}

/// What one setup round gives a transport: the communicator, and where this round's
/// connection `k` finds its inbound counter and expected epoch.
#[derive(Debug)]
pub(crate) struct Round<'a> {
    pub(crate) comm: &'a Communicator,
    /// This process (a peer with the same pid on the same host is in this process).
    pub(crate) pid: u32,
    /// The id of the round's connection 0.
    pub(crate) first_id: u32,
    /// This round's inbound counters (8 bytes per connection), and their size.
    pub(crate) inbound_base: u64,
    pub(crate) flag_bytes: u64,
    /// This round's expected epochs (8 bytes per connection).
    pub(crate) expected_base: u64,
    flags: &'a FlagMemory,
    flags_handle: &'a MemHandle,
}

impl Round<'_> {
    /// Connection `k`'s inbound counter (the peer's signals land there).
    pub(crate) fn inbound(&self, k: usize) -> u64 {
        self.inbound_base + k as u64 * 8
    }

    /// Connection `k`'s expected epoch (local waits).
    pub(crate) fn expected(&self, k: usize) -> u64 {
        self.expected_base + k as u64 * 8
    }

    /// Connection `k`'s id.
    pub(crate) fn id(&self, k: usize) -> u32 {
        self.first_id + k as u32
    }
}

/// One transport's part of connection setup and of starting the proxy. A setup object
/// lives for one round (it may keep state across the round's connections: a listener,
/// registrations, mappings); [`setup_of`] makes one.
pub(crate) trait TransportSetup {
    /// Whether this transport connects ranks of different machines (else the peer must be
    /// on this host).
    fn crosses_hosts(&self) -> bool;

    /// Prepares this side of connection `k` of the round (everything that must happen
    /// before the exchange) and returns the description the peer gets.
    fn describe(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        k: usize,
    ) -> Result<ConnInfo, CommError>;

    /// Finishes connection `k` from the peer's description (already checked against ours:
    /// tag, transport, kind, sizes, host).
    fn connect(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        peer: &ConnInfo,
        k: usize,
    ) -> Result<Connection, CommError>;

    /// The data plane serving this transport's connections of `comm` (it is handed only
    /// routes of connections of this transport). `epochs`: signals already sent on each
    /// connection (the proxy is stopped, so they are stable).
    fn plane(&self, comm: &Communicator, epochs: &[u64]) -> Result<Box<dyn DataPlane>, CommError>;
}

/// The registry: the setup of each transport.
pub(crate) fn setup_of(kind: TransportKind) -> Box<dyn TransportSetup> {
    match kind {
        TransportKind::P2p | TransportKind::Host => Box::new(MappedSetup::default()),
        TransportKind::Ib => Box::new(IbSetup::default()),
        TransportKind::Tcp => Box::new(TcpSetup::default()),
    }
}

/// Transport state a connection keeps alive (IB: queue pair and registrations; TCP:
/// sockets and receivers), reached by the transport's own code through `Any`.
pub(crate) trait Link: Any + Send + Sync + std::fmt::Debug {}

/// What a side that could not prepare a connection sends instead of its description.
fn failed_info(p: &PendingConnection, pid: u32, reason: String) -> ConnInfo {
    ConnInfo {
        failed: Some(reason),
        ..remote_info(p, pid)
    }
}

/// The description of a connection whose memory the peer reaches remotely (IB, TCP): no
/// packets, no handshake and no flag memory yet (callers fill them in).
pub(crate) fn remote_info(p: &PendingConnection, pid: u32) -> ConnInfo {
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
        wire: None,
        failed: None,
    }
}

/// A set-up connection.
#[derive(Debug)]
pub struct Connection {
    /// Transport state (dropped first: receivers stop before the memory they write goes).
    pub(crate) link: Option<Box<dyn Link>>,
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
}

impl Connection {
    /// A proxy-channel connection whose peer is reached over the network (IB, TCP): the
    /// route's remote addresses are whatever the transport's plane understands.
    pub(crate) fn remote(
        round: &Round<'_>,
        p: &PendingConnection,
        k: usize,
        remote: u64,
        remote_len: u64,
        remote_flag: u64,
        link: Box<dyn Link>,
    ) -> Connection {
        let id = round.id(k);
        Connection {
            link: Some(link),
            id,
            remote_rank: p.remote_rank,
            tag: p.tag,
            transport: p.transport,
            route: Route {
                id,
                local: p.buffer.addr(),
                local_len: p.buffer.len() as u64,
                remote,
                remote_len,
                remote_flag,
            },
            inbound: round.inbound(k),
            expected: round.expected(k),
            kind: p.kind,
            packets_in: 0,
            packets_out: 0,
            packets_len: 0,
            _local: p.buffer.clone(),
            _local_packets: None,
            _peer_buffer: Arc::new(PeerMem::Remote),
            _peer_flags: Arc::new(PeerMem::Remote),
            _peer_packets: None,
        }
    }

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
        self.link_as::<crate::transport::ib::setup::IbConnection>()
            .is_some_and(|i| i.staged())
    }

    /// The transport state, if it is a `T`.
    pub(crate) fn link_as<T: Link>(&self) -> Option<&T> {
        let link: &dyn Any = self.link.as_deref()?;
        link.downcast_ref::<T>()
    }
}

pub(crate) fn mismatch(peer: usize, tag: u32, reason: impl Into<String>) -> CommError {
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
/// handle for peers, and the two base addresses; with `host_inbound` (GPU backend), also
/// host inbound counters for the round's P2P proxy channels (`cpu` flag mode).
fn alloc_flags(
    backend: &Backend,
    n: usize,
    host_inbound: bool,
) -> Result<(FlagMemory, MemHandle, u64, u64), CommError> {
    let bytes = n * 8;
    Ok(match backend {
        Backend::Gpu(gpu) => {
            let inbound = DeviceBuffer::zeroed(gpu, bytes)?;
            let expected = DeviceBuffer::zeroed(gpu, bytes)?;
            let handle = ipc_handle(&inbound, gpu)?;
            let host = host_inbound.then(|| HostFlags::new(gpu, n)).transpose()?;
            let (i, e) = (inbound.device_ptr(), expected.device_ptr());
            (
                FlagMemory::Device {
                    _inbound: inbound,
                    _expected: expected,
                    host,
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

/// The P2P and Host transports' setup: describe the buffer, flags and packet scratch as
/// memory the peer maps (IPC handles, shared-memory names published for that peer), and map
/// the peer's.
#[derive(Debug, Default)]
pub(crate) struct MappedSetup {
    /// Every name published this round, removed when the round ends.
    published: Published,
    /// The peers' memory mapped this round, one mapping per handle.
    cache: HashMap<MemHandle, (Arc<PeerMem>, u64)>,
}

impl TransportSetup for MappedSetup {
    fn crosses_hosts(&self) -> bool {
        false
    }

    fn describe(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        k: usize,
    ) -> Result<ConnInfo, CommError> {
        let backend = &round.comm.backend;
        let published = &mut self.published;
        Ok(ConnInfo {
            tag: p.tag,
            transport: p.transport,
            kind: p.kind,
            packets: p
                .packets
                .as_ref()
                .map(|b| describe(b, backend, p.remote_rank, published))
                .transpose()?,
            packets_len: p.packets.as_ref().map_or(0, |b| b.len() as u64),
            pid: round.pid,
            buffer_len: p.buffer.len() as u64,
            buffer: describe(&p.buffer, backend, p.remote_rank, published)?,
            flags: match (round.flags, host_flags_for(round, p)) {
                (FlagMemory::Host { _inbound: s, .. }, _) => published.handle(s, p.remote_rank)?,
                (_, Some(h)) => published.handle(&h.segment, p.remote_rank)?,
                _ => round.flags_handle.clone(),
            },
            flag_index: k as u32,
            wire: None,
            failed: None,
        })
    }

    fn connect(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        peer: &ConnInfo,
        k: usize,
    ) -> Result<Connection, CommError> {
        let comm = round.comm;
        let bs = comm.bootstrap.as_async();
        let same_process =
            peer.pid == round.pid && bs.host_id(p.remote_rank) == bs.host_id(comm.rank());
        let host_flags = host_flags_for(round, p);
        if let (Backend::Gpu(_), ChannelKind::Proxy, TransportKind::P2p) =
            (&comm.backend, p.kind, p.transport)
        {
            // The peer's proxy stores where this rank's kernels poll, and the reverse: both
            // ends must use the same mode.
            let peer_mode = match peer.flags {
                MemHandle::Shm { .. } => ProxyFlagMode::Cpu,
                _ => ProxyFlagMode::Stream,
            };
            if peer_mode != comm.proxy_flag {
                return Err(mismatch(
                    p.remote_rank,
                    p.tag,
                    format!(
                        "proxy flag modes differ: {} here, {peer_mode} on the peer (set \
                         {PROXY_FLAG_ENV} or CommConfig::proxy_flag alike on every rank)",
                        comm.proxy_flag
                    ),
                ));
            }
        }
        let cache = &mut self.cache;
        let (buf_mem, buf_addr) = map_peer(&peer.buffer, same_process, &comm.backend, cache)?;
        let (flag_mem, flag_addr) = map_peer(&peer.flags, same_process, &comm.backend, cache)?;
        let flags_len = match &peer.flags {
            MemHandle::Ipc { len, .. } | MemHandle::Shm { len, .. } | MemHandle::Remote { len } => {
                *len
            }
        };
        if (peer.flag_index as u64 + 1) * 8 > flags_len {
            return Err(mismatch(
                p.remote_rank,
                p.tag,
                "peer's flag index is outside its flag memory",
            ));
        }
        let peer_packets = match &peer.packets {
            Some(h) => Some(map_peer(h, same_process, &comm.backend, cache)?),
            None => None,
        };
        let id = round.id(k);
        Ok(Connection {
            link: None,
            id,
            remote_rank: p.remote_rank,
            tag: p.tag,
            transport: p.transport,
            route: Route {
                id,
                local: p.buffer.addr(),
                local_len: p.buffer.len() as u64,
                remote: buf_addr,
                remote_len: peer.buffer_len,
                remote_flag: flag_addr + peer.flag_index as u64 * 8,
            },
            inbound: host_flags.map_or(round.inbound(k), |h| h.device_addr(k)),
            expected: round.expected(k),
            kind: p.kind,
            packets_in: p.packets.as_ref().map_or(0, |b| b.addr()),
            packets_out: peer_packets.as_ref().map_or(0, |(_, a)| *a),
            packets_len: p.packets.as_ref().map_or(0, |b| b.len() as u64),
            _local: p.buffer.clone(),
            _local_packets: p.packets.clone(),
            _peer_buffer: buf_mem,
            _peer_flags: flag_mem,
            _peer_packets: peer_packets.map(|(m, _)| m),
        })
    }

    fn plane(&self, comm: &Communicator, _: &[u64]) -> Result<Box<dyn DataPlane>, CommError> {
        Ok(match &comm.backend {
            Backend::Gpu(gpu) => Box::new(P2pPlane::with_mode(gpu.new_stream()?, comm.proxy_flag)),
            Backend::Host => Box::new(HostPlane),
        })
    }
}

/// Sets up `pending` (ids from `first_id`): describe, exchange, check, connect (each
/// transport its own way), acknowledge.
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
        match alloc_flags(&comm.backend, n, {
            // Host inbound counters only when a P2P proxy channel of the round needs them.
            comm.proxy_flag == ProxyFlagMode::Cpu
                && pending
                    .iter()
                    .any(|p| p.kind == ChannelKind::Proxy && p.transport == TransportKind::P2p)
        }) {
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
    let my_host = bs.as_async().host_id(me).map(str::to_string);
    let pid = std::process::id();
    let round = Round {
        comm,
        pid,
        first_id,
        inbound_base,
        flag_bytes: bytes as u64,
        expected_base,
        flags: &flags,
        flags_handle: &flags_handle,
    };
    // One setup per transport of the round. Dropped when the round ends, on every path
    // out (the mapped transports remove the names they published then).
    let mut setups: HashMap<TransportKind, Box<dyn TransportSetup>> = HashMap::new();
    for p in &pending {
        setups
            .entry(p.transport)
            .or_insert_with(|| setup_of(p.transport));
    }

    // 1. Describe every connection (every name published, every queue pair created, every
    // listener open) before any description is sent: a peer removes a name as soon as it
    // has mapped the segment, and a segment whose names are all gone cannot be given
    // another (tmpfs links an unnamed file only until its first link goes).
    let mut first_error: Option<CommError> = None;
    let mut local_errors: Vec<Option<CommError>> = Vec::with_capacity(n);
    let code = |info: &ConnInfo| {
        bincode::serde::encode_to_vec(info, bincode::config::standard())
            .map_err(|e| CommError::InvalidArgument(format!("encoding connection info: {e}")))
    };
    let mut outgoing = Vec::with_capacity(n);
    for (k, p) in pending.iter().enumerate() {
        let built = match &round_error {
            Some(e) => Err(CommError::State(e.to_string())),
            None => setups
                .get_mut(&p.transport)
                .expect("a setup per transport of the round")
                .describe(&round, p, k),
        };
        let info = match built {
            Ok(info) => {
                local_errors.push(None);
                info
            }
            Err(e) => {
                local_errors.push(Some(e));
                failed_info(
                    p,
                    pid,
                    local_errors[k]
                        .as_ref()
                        .map(|e| e.to_string())
                        .unwrap_or_default(),
                )
            }
        };
        outgoing.push((p.remote_rank, p.tag, code(&info)?));
    }
    // 2. Send every description first (sends are buffered by the receiver), then receive.
    for (peer, tag, bytes) in outgoing {
        // A peer that is gone is not a reason to stop: the others still get theirs.
        let what = format!("the setup info of the connection ({})", ConnTag(tag));
        if let Err(e) = bs.send_named(peer, INFO_TAG | tag as u64, &what, &bytes) {
            first_error.get_or_insert(e.into());
        }
    }
    let mut conns = Vec::with_capacity(n);
    for (k, p) in pending.into_iter().enumerate() {
        // What a peer sent before dying is still delivered; what it did not send fails at
        // once (the bootstrap names the lost rank).
        let (peer_info, recv_error) = match bs.recv_named(
            p.remote_rank,
            INFO_TAG | p.tag as u64,
            &format!("the setup info of the connection ({})", ConnTag(p.tag)),
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
            let setup = setups
                .get_mut(&p.transport)
                .expect("a setup per transport of the round");
            check_peer(
                &p,
                peer,
                setup.crosses_hosts(),
                my_host.as_deref(),
                bs.as_async().host_id(p.remote_rank),
            )?;
            setup.connect(&round, &p, peer, k)
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
        let what = format!(
            "the setup acknowledgement of the connection ({})",
            ConnTag(p.tag)
        );
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
    // 3. Wait for every peer's acknowledgement, then end the round (our shared-memory names
    // are removed).
    for c in &conns {
        let what = format!(
            "the setup acknowledgement of the connection ({})",
            ConnTag(c.tag)
        );
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
    drop(setups);
    if let Some(e) = round_error.or(first_error) {
        return Err(e);
    }
    Ok((conns, flags))
}

fn check_peer(
    mine: &PendingConnection,
    peer: &ConnInfo,
    crosses_hosts: bool,
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
    // Network transports connect machines; the others need the peer's memory mapped here.
    if my_host != peer_host && !crosses_hosts {
        return Err(CommError::TransportUnavailable {
            transport: mine.transport,
            reason: format!(
                "rank {rank} is on another machine ({} vs {}); {} connects ranks of one machine (IB or TCP is needed across machines)",
                peer_host.unwrap_or("?"),
                my_host.unwrap_or("?"),
                mine.transport
            ),
        });
    }
    Ok(())
}

/// The proxy's task for `comm`'s connections: one data plane per transport in use (a
/// [`PlaneSet`] when there are several).
pub(super) fn proxy_task(comm: &Communicator) -> Result<ProxyTask, CommError> {
    let routes = comm.connections.iter().map(|c| c.route).collect();
    let consumer = comm
        .fifo
        .consumer()
        .map_err(|e| CommError::State(format!("proxy FIFO: {e}")))?;
    // The proxy is stopped (the caller checks), so the epochs are stable.
    let epochs: Vec<u64> = comm
        .epochs
        .iter()
        .map(|e| e.load(Ordering::Relaxed))
        .collect();
    // Transports in order of first use; with no connection, the backend's own.
    let mut kinds: Vec<TransportKind> = Vec::new();
    for c in &comm.connections {
        if !kinds.contains(&c.transport) {
            kinds.push(c.transport);
        }
    }
    if kinds.is_empty() {
        kinds.push(comm.backend.transport());
    }
    let mut planes = Vec::with_capacity(kinds.len());
    for &kind in &kinds {
        planes.push(setup_of(kind).plane(comm, &epochs)?);
    }
    let plane = if planes.len() == 1 {
        planes.pop().expect("one plane")
    } else {
        let plane_of = comm
            .connections
            .iter()
            .map(|c| kinds.iter().position(|&k| k == c.transport).unwrap_or(0))
            .collect();
        Box::new(PlaneSet::new(planes, plane_of))
    };
    let on_start: Option<StartHook> = match &comm.backend {
        Backend::Gpu(gpu) => {
            let g = gpu.clone();
            Some(Box::new(move || {
                let _ = g.bind();
            }))
        }
        Backend::Host => None,
    };
    // The new consumer starts with a clean tail; so do the refused connections.
    comm.fault.clear_proxy_refused();
    let fault = comm.fault.clone();
    let on_refused: RefusedHook = Box::new(move |id| fault.mark_proxy_refused(id));
    // A peer's TCP connections still to be drained (closed by the peer after all it sent
    // landed); when the last one is, the fault area learns that the peer is drained.
    let fault = comm.fault.clone();
    let peer_of: Vec<usize> = comm.connections.iter().map(|c| c.remote_rank).collect();
    let mut open = vec![0usize; comm.nranks()];
    for c in comm
        .connections
        .iter()
        .filter(|c| c.transport == TransportKind::Tcp)
    {
        open[c.remote_rank] += 1;
    }
    let on_drained: RefusedHook = Box::new(move |id| {
        if let Some(&peer) = peer_of.get(id as usize)
            && let Some(n) = open.get_mut(peer)
            && *n > 0
        {
            *n -= 1;
            if *n == 0 {
                fault.note_peer_drained(peer);
            }
        }
    });
    // Peers that left are settled (what they wrote into staged buffers delivered) before
    // their "left" words are written.
    let (asks, fault) = (comm.fault.clone(), comm.fault.clone());
    let settle = SettleHook {
        asked: Box::new(move || asks.settle_asked()),
        done: Box::new(move |n| fault.note_settled(n)),
    };
    Ok(ProxyTask {
        consumer,
        routes,
        epochs: comm.epochs.clone(),
        plane,
        on_start,
        peers: comm.connections.iter().map(|c| c.remote_rank).collect(),
        on_refused: Some(on_refused),
        on_drained: Some(on_drained),
        settle: Some(settle),
        stats: crate::proxy::stats_wanted(),
    })
}
