//! Connection setup, the transports' part: what two ranks exchange about a connection
//! ([`ConnInfo`]), what a set-up connection is ([`Connection`]), and [`TransportSetup`], one
//! implementation per transport ([`setup_of`] is the registry):
//!
//! - P2P and Host (`transport::mapped`): map the peer's memory (CUDA IPC, peer access in
//!   one process, or shared memory);
//! - IB (`transport::ib::setup`): register memory, connect queue pairs;
//! - TCP (`transport::tcp`): listen, connect sockets, start the receivers.
//!
//! The round that drives them (flag memory, the exchange, the acknowledgements, error
//! handling) is the communicator's (`communicator::setup`); the transports see the
//! communicator only through [`SetupContext`].

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use serde::{Deserialize, Serialize};

use crate::bootstrap::BlockingBootstrap;
use crate::cuda::{DeviceBuffer, Gpu, HostRegistration, PeerMapping};

use super::backend::Backend;
use super::buffer::Buffer;
use super::error::CommError;
use super::ib::IbConfig;
use super::ib::setup::{IbSession, IbSetup};
use super::mapped::MappedSetup;
use super::p2p::ProxyFlagMode;
use super::shm::ShmSegment;
use super::tcp::TcpSetup;
use super::{DataPlane, Route, TransportKind};

/// What the transports' setup asks of the communicator that sets connections up (the
/// communicator implements it; the transports know nothing else of it).
pub(crate) trait SetupContext: std::fmt::Debug {
    /// This rank.
    fn rank(&self) -> usize;
    /// Where the communicator runs.
    fn backend(&self) -> &Backend;
    /// The control plane (hosts, pids and liveness of the ranks, the listen address).
    fn bootstrap(&self) -> &BlockingBootstrap;
    /// How P2P proxies raise the peer's flag.
    fn proxy_flag_mode(&self) -> ProxyFlagMode;
    /// The RDMA device of IB connections, once opened.
    fn ib_session(&self) -> Option<&IbSession>;
    /// Settings of IB connections.
    fn ib_config(&self) -> IbConfig;
    /// The connections set up so far (what a data plane serves).
    fn connections(&self) -> &[Connection];
}

/// A connection asked for with [`Communicator::connect`], set up by
/// [`Communicator::connection_setup`].
///
/// [`Communicator::connect`]: crate::communicator::Communicator::connect
/// [`Communicator::connection_setup`]: crate::communicator::Communicator::connection_setup
#[derive(Debug)]
pub(crate) struct PendingConnection {
    pub(crate) remote_rank: usize,
    pub(crate) tag: u32,
    pub(crate) buffer: Buffer,
    pub(crate) transport: TransportKind,
    pub(crate) kind: ChannelKind,
    /// This side's packet scratch (memory channels).
    pub(crate) packets: Option<Buffer>,
}

/// What a connection is used as: a proxy channel ([`DevConn`]) or a memory channel
/// ([`MemoryChannel`]). They keep separate index spaces, and a connection's inbound counter
/// serves only its own kind (the proxy writes absolute epochs, a memory channel adds).
///
/// [`DevConn`]: mscclpp_device::channel::DevConn
/// [`MemoryChannel`]: mscclpp_device::channel::MemoryChannel
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ChannelKind {
    /// GPU threads push triggers; the proxy copies.
    Proxy,
    /// GPU threads load and store the peer's memory themselves.
    Memory,
}

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
    /// The counters (peers map it by a name published for them).
    pub(crate) segment: ShmSegment,
}

impl HostFlags {
    pub(crate) fn new(gpu: &Gpu, n: usize) -> Result<HostFlags, CommError> {
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
    pub(crate) fn device_addr(&self, k: usize) -> u64 {
        self.registration.device_ptr() + k as u64 * 8
    }
}

impl FlagMemory {
    /// The round's host inbound counters, if it has them (`cpu` flag mode).
    pub(crate) fn host_flags(&self) -> Option<&HostFlags> {
        match self {
            FlagMemory::Device { host, .. } => host.as_ref(),
            _ => None,
        }
    }
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

/// What one setup round gives a transport: the communicator's [`SetupContext`], and where
/// this round's connection `k` finds its inbound counter and expected epoch.
#[derive(Debug)]
pub(crate) struct Round<'a> {
    /// The communicator setting up the round.
    pub(crate) ctx: &'a dyn SetupContext,
    /// This process (a peer with the same pid on the same host is in this process).
    pub(crate) pid: u32,
    /// The id of the round's connection 0.
    pub(crate) first_id: u32,
    /// This round's inbound counters (8 bytes per connection), and their size.
    pub(crate) inbound_base: u64,
    pub(crate) flag_bytes: u64,
    /// This round's expected epochs (8 bytes per connection).
    pub(crate) expected_base: u64,
    /// This round's flag memory (inbound counters and expected epochs).
    pub(crate) flags: &'a FlagMemory,
    /// The handle of the inbound counters that peers map (GPU backend).
    pub(crate) flags_handle: &'a MemHandle,
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

    /// The data plane serving this transport's connections of `ctx` (it is handed only
    /// routes of connections of this transport). `epochs`: signals already sent on each
    /// connection (the proxy is stopped, so they are stable).
    fn plane(
        &self,
        ctx: &dyn SetupContext,
        epochs: &[u64],
    ) -> Result<Box<dyn DataPlane>, CommError>;
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
    pub(super) remote_rank: usize,
    pub(super) tag: u32,
    pub(super) transport: TransportKind,
    pub(crate) route: Route,
    pub(crate) inbound: u64,
    pub(crate) expected: u64,
    pub(super) kind: ChannelKind,
    /// This side's packet scratch (the peer writes packets into it), 0 if none.
    pub(crate) packets_in: u64,
    /// The peer's packet scratch mapped here, 0 if none.
    pub(crate) packets_out: u64,
    pub(crate) packets_len: u64,
    pub(super) _local: Buffer,
    pub(super) _local_packets: Option<Buffer>,
    pub(super) _peer_buffer: Arc<PeerMem>,
    pub(super) _peer_flags: Arc<PeerMem>,
    pub(super) _peer_packets: Option<Arc<PeerMem>>,
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
        self.link_as::<super::ib::setup::IbConnection>()
            .is_some_and(|i| i.staged())
    }

    /// The transport state, if it is a `T`.
    pub(crate) fn link_as<T: Link>(&self) -> Option<&T> {
        let link: &dyn Any = self.link.as_deref()?;
        link.downcast_ref::<T>()
    }
}

/// The error of a connection whose two sides disagree, or whose peer sent garbage.
pub(crate) fn mismatch(peer: usize, tag: u32, reason: impl Into<String>) -> CommError {
    CommError::Mismatch {
        peer,
        tag,
        reason: reason.into(),
    }
}
