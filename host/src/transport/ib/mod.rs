//! The InfiniBand (RDMA) transport: one reliable-connected queue pair per connection, a put
//! is an RDMA WRITE, the flag an 8-byte inline RDMA WRITE of the epoch on the same queue pair
//! after the data (RC queue pairs execute writes in order, so the flag lands last).
//!
//! Layers, like the rest of the crate's backends:
//! - [`Verbs`] / [`QueuePair`]: the few verbs this transport uses (register memory, create a
//!   queue pair with its own completion queue, move it through INIT → RTR → RTS, post a
//!   write, poll completions), as object-safe traits. The real implementation is over the
//!   `sideway` crate (cargo feature `ib`, module `sideway`); tests use an in-process fake
//!   (`fake::FakeVerbs`) that really moves bytes between registered regions.
//! - [`IbHandshake`]: what two ranks exchange over the bootstrap (address, queue pair number,
//!   packet sequence number, remote keys and addresses), with a decoder that refuses
//!   garbage ([`decode_handshake`]).
//! - [`IbPlane`]: the [`DataPlane`](super::DataPlane) the proxy drives, with selective
//!   signalling (one signalled work request every [`IbConfig::signal_every`]) and
//!   [`flush`](super::DataPlane::flush) waiting for every posted request, with a timeout.
//!
//! What is validated here: queue-pair state transitions ([`check_transition`]), every field
//! of a peer's handshake, put bounds (by the proxy's [`Route::check`](super::Route::check)),
//! completion statuses (an error completion names the connection, peer rank and tag). What
//! is not: the remote side's memory beyond its keys (the NIC checks those).
//!
//! Tested only against the fake and for its error paths on machines without an RDMA device;
//! see docs/guide/04-several-machines.md, "InfiniBand / RoCE", for what that means.

mod handshake;
mod plane;
pub(crate) mod setup;
mod staging;

#[cfg(feature = "ib")]
mod sideway;

#[cfg(test)]
pub(crate) mod fake;

#[cfg(test)]
mod tests;

use super::tags::ConnTag;
use std::fmt;
use std::sync::Arc;

pub use handshake::{
    HANDSHAKE_MAGIC, HANDSHAKE_VERSION, IbEndpoint, IbHandshake, RdmaRegion, decode_handshake,
    encode_handshake,
};
pub use plane::{IbConfig, IbLink, IbPlane, MAX_WRITE};
pub(crate) use staging::HostMemory;
pub use staging::{
    CONTROL_BYTES, CudaStagingCopy, HostStagingCopy, IB_STAGING_ENV, LinkStaging, RING,
    StagingCopy, StagingMode, StagingProgress,
};

/// Environment variable choosing the RDMA device: a name (`mlx5_0`) or an index into the
/// device list. Unset: the first device.
pub const IB_DEVICE_ENV: &str = "MSCCLPP_IB_DEVICE";
/// Environment variable choosing the port of the device (default 1).
pub const IB_PORT_ENV: &str = "MSCCLPP_IB_PORT";
/// Environment variable choosing the GID index (default 0; RoCE v2 usually needs the index of
/// an IPv4-mapped RoCE v2 GID, often 3).
pub const IB_GID_INDEX_ENV: &str = "MSCCLPP_IB_GID_INDEX";
/// Environment variable that turns "no RDMA device" from a skip into a failure in tests.
pub const REQUIRE_IB_ENV: &str = "MSCCLPP_REQUIRE_IB";

/// What works without InfiniBand, for error messages.
const ALTERNATIVES: &str = "TransportKind::P2p connects GPUs of one machine and \
     TransportKind::Host connects ranks of one machine without a GPU";

/// Errors of the InfiniBand transport.
#[derive(Debug, thiserror::Error)]
pub enum IbError {
    /// InfiniBand cannot be used here (not built in, no libibverbs, no device), with what was
    /// found and what would work instead.
    #[error("InfiniBand is not available: {0}")]
    Unavailable(String),
    /// `MSCCLPP_IB_DEVICE` names no device.
    #[error(
        "no RDMA device matches {IB_DEVICE_ENV}={wanted:?}; found {found}; set it to one of \
         these names or to an index below their count"
    )]
    NoSuchDevice {
        /// The name or index asked for.
        wanted: String,
        /// The devices found (names with their index).
        found: String,
    },
    /// A verbs call failed.
    #[error("{call} on {device} failed: {reason}")]
    Verbs {
        /// The RDMA device.
        device: String,
        /// The verb, e.g. `ibv_create_qp`.
        call: &'static str,
        /// The provider's error.
        reason: String,
    },
    /// Memory could not be registered with the device.
    #[error("cannot register {len} bytes of {memory} memory at {addr:#x} with {device}: {reason}")]
    Registration {
        /// The RDMA device.
        device: String,
        /// `host` or `GPU`.
        memory: &'static str,
        /// Start address.
        addr: u64,
        /// Length in bytes.
        len: u64,
        /// Why (every method tried).
        reason: String,
    },
    /// A queue-pair state change that the verbs state machine does not allow.
    #[error("queue pair {qpn}: illegal state transition {from:?} -> {to:?}")]
    IllegalTransition {
        /// Queue pair number.
        qpn: u32,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Posting on a queue pair that is not ready to send.
    #[error("queue pair {qpn} is in state {state:?}; work requests need ReadyToSend")]
    NotReadyToSend {
        /// Queue pair number.
        qpn: u32,
        /// Its state.
        state: QpState,
    },
    /// A work request completed with an error (the queue pair is unusable afterwards).
    #[error(
        "connection {connection} (rank {peer}, {}, queue pair {qpn}): work request \
         {wr_id} completed with error: {status}",
        ConnTag(*tag)
    )]
    Completion {
        /// The connection id.
        connection: u32,
        /// The peer's rank.
        peer: usize,
        /// The connection's tag.
        tag: u32,
        /// Local queue pair number.
        qpn: u32,
        /// The failed work request.
        wr_id: u64,
        /// The completion status, as the provider names it.
        status: String,
    },
    /// Work requests that did not complete in time.
    #[error(
        "connection {connection} (rank {peer}, {}): {pending} work request(s) not \
         completed after {waited:?} (peer gone, or link down?)",
        ConnTag(*tag)
    )]
    Timeout {
        /// The connection id.
        connection: u32,
        /// The peer's rank.
        peer: usize,
        /// The connection's tag.
        tag: u32,
        /// Requests still outstanding.
        pending: u64,
        /// How long we waited.
        waited: std::time::Duration,
    },
    /// Host staging of a connection failed (a full ring that the peer does not drain, a
    /// malformed record, a failed copy); the connection is unusable afterwards.
    #[error("connection {connection} (rank {peer}, {}): host staging: {reason}", ConnTag(*tag))]
    Staging {
        /// The connection id.
        connection: u32,
        /// The peer's rank.
        peer: usize,
        /// The connection's tag.
        tag: u32,
        /// What went wrong.
        reason: String,
    },
    /// A call into the verbs library panicked (caught; e.g. a value the bindings do not
    /// know, reported by a newer driver).
    #[error("{call} on {device} panicked inside the verbs bindings: {message}")]
    Panicked {
        /// The RDMA device (or `?` before one is chosen).
        device: String,
        /// What was being done.
        call: &'static str,
        /// The panic's message.
        message: String,
    },
    /// A route whose connection has no queue pair in this plane.
    #[error("connection {0} has no InfiniBand queue pair in this proxy")]
    UnknownConnection(u32),
    /// Settings that cannot work ([`IbConfig::validate`]).
    #[error("invalid InfiniBand settings: {0}")]
    InvalidConfig(String),
    /// A peer's handshake could not be decoded or is invalid.
    #[error("bad InfiniBand handshake: {0}")]
    BadHandshake(String),
}

/// Queue-pair states of the verbs state machine (the subset this transport uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Just created.
    Reset,
    /// Port, partition and access flags set.
    Init,
    /// Ready to receive: the remote queue pair is known.
    ReadyToReceive,
    /// Ready to send.
    ReadyToSend,
    /// A work request failed; everything after it is flushed.
    Error,
}

/// Whether a queue pair may go from `from` to `to` (the transitions of `ibv_modify_qp` that
/// this transport uses; any state may go to Reset or Error).
pub fn check_transition(qpn: u32, from: QpState, to: QpState) -> Result<(), IbError> {
    use QpState::*;
    let ok = matches!(
        (from, to),
        (_, Reset)
            | (_, Error)
            | (Reset, Init)
            | (Init, Init)
            | (Init, ReadyToReceive)
            | (ReadyToReceive, ReadyToSend)
            | (ReadyToSend, ReadyToSend)
    );
    if ok {
        Ok(())
    } else {
        Err(IbError::IllegalTransition { qpn, from, to })
    }
}

/// A queue-pair state change with what it needs.
#[derive(Debug, Clone, Copy)]
pub enum QpTransition<'a> {
    /// RESET → INIT: port, partition 0, remote-write access.
    Init,
    /// INIT → RTR: the peer's address, queue pair number and starting packet sequence number.
    ReadyToReceive(&'a IbEndpoint),
    /// RTR → RTS: our own starting packet sequence number, retry and timeout settings.
    ReadyToSend {
        /// The PSN our first packet carries (the peer's `rq_psn`).
        psn: u32,
    },
}

impl QpTransition<'_> {
    /// The state this transition goes to.
    pub fn target(&self) -> QpState {
        match self {
            QpTransition::Init => QpState::Init,
            QpTransition::ReadyToReceive(_) => QpState::ReadyToReceive,
            QpTransition::ReadyToSend { .. } => QpState::ReadyToSend,
        }
    }
}

/// Where a write's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteSource {
    /// A range of registered memory.
    Registered {
        /// Start address (host address, or GPU virtual address for dma-buf registrations).
        addr: u64,
        /// Length in bytes.
        len: u32,
        /// The registration's local key.
        lkey: u32,
    },
    /// Eight bytes carried in the work request itself (the flag).
    Inline([u8; 8]),
}

impl WriteSource {
    /// Bytes this source writes.
    pub fn len(&self) -> u64 {
        match self {
            WriteSource::Registered { len, .. } => *len as u64,
            WriteSource::Inline(b) => b.len() as u64,
        }
    }

    /// Whether it writes nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One RDMA WRITE work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRequest {
    /// Identifies the request in its completion.
    pub wr_id: u64,
    /// The local bytes.
    pub source: WriteSource,
    /// Destination address in the peer's registration.
    pub remote_addr: u64,
    /// The peer registration's remote key.
    pub rkey: u32,
    /// Whether a completion is generated (selective signalling).
    pub signaled: bool,
}

/// A work completion: the request it belongs to and, for a failed one, the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// `None` on success, else the status as the provider names it.
    pub error: Option<String>,
}

/// What kind of memory is registered (decides how it is registered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host memory (shared-memory buffers, pinned memory).
    Host,
    /// GPU memory (`cuMemAlloc`), registered through dma-buf, or nvidia-peermem as fallback.
    Gpu,
}

/// A registration of memory with a protection domain: keys and range. Deregistered when
/// dropped (the owner keeps whatever the implementation needs alive).
pub struct MemoryRegistration {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key (used in our work requests).
    pub lkey: u32,
    /// Remote key (sent to the peer).
    pub rkey: u32,
    /// How it was registered (`host`, `dma-buf`, `peermem`, `fake`), for diagnostics.
    pub method: &'static str,
    _owner: Box<dyn std::any::Any + Send + Sync>,
}

impl MemoryRegistration {
    /// A registration whose resources `owner` holds (dropped with it).
    pub fn new(
        addr: u64,
        len: u64,
        lkey: u32,
        rkey: u32,
        method: &'static str,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> MemoryRegistration {
        MemoryRegistration {
            addr,
            len,
            lkey,
            rkey,
            method,
            _owner: owner,
        }
    }

    /// The region as the peer sees it.
    pub fn region(&self) -> RdmaRegion {
        RdmaRegion {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
        }
    }

    /// Whether `[addr, addr + len)` lies inside this registration.
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

impl fmt::Debug for MemoryRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegistration")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .field("method", &self.method)
            .finish()
    }
}

/// The local port's addressing facts, sent to peers in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The GID at `gid_index`.
    pub gid: [u8; 16],
    /// GID index used as the source GID.
    pub gid_index: u8,
    /// Active MTU in bytes (256..=4096).
    pub mtu: u32,
    /// Whether the link layer is Ethernet (RoCE: the global route header is required).
    pub ethernet: bool,
}

/// An opened RDMA device with its protection domain: the verbs this transport needs.
pub trait Verbs: Send + Sync + fmt::Debug {
    /// The device's name (`mlx5_0`).
    fn device_name(&self) -> &str;

    /// The port used and its address.
    fn port(&self) -> PortInfo;

    /// Registers `len` bytes at `addr` for local use and remote writes.
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` must be memory of `kind` that stays allocated for as long as the
    /// returned registration lives: the device (or the fake) writes into it on behalf of
    /// peers at any time until then.
    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        kind: MemoryKind,
    ) -> Result<MemoryRegistration, IbError>;

    /// Creates a reliable-connected queue pair in RESET with its own completion queue, able
    /// to hold `depth` outstanding send work requests.
    fn create_qp(&self, depth: u32) -> Result<Box<dyn QueuePair>, IbError>;
}

/// A reliable-connected queue pair and its completion queue.
pub trait QueuePair: Send + fmt::Debug {
    /// Queue pair number.
    fn qpn(&self) -> u32;

    /// Current state (as this side last set or observed it).
    fn state(&self) -> QpState;

    /// Moves the queue pair to the transition's state; illegal transitions are refused
    /// ([`check_transition`]) before the device is asked.
    fn modify(&mut self, transition: QpTransition<'_>) -> Result<(), IbError>;

    /// Posts one RDMA WRITE. Refused unless the queue pair is ReadyToSend.
    fn post_write(&mut self, wr: &WriteRequest) -> Result<(), IbError>;

    /// Appends the completions available now to `out` (does not wait).
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), IbError>;
}

/// The name of a verbs work-completion status (`ibv_wc_status`, a stable ABI), with its
/// number, for messages.
pub fn wc_status_name(status: u32) -> String {
    const NAMES: [&str; 24] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "work request flushed",
        "memory window bind error",
        "bad response",
        "local access error",
        "remote invalid request",
        "remote access error (bad rkey or address)",
        "remote operation error",
        "transport retry counter exceeded (peer unreachable?)",
        "RNR retry counter exceeded",
        "local RDD violation",
        "remote invalid RD request",
        "remote aborted",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout",
        "general error",
        "tag matching error",
        "tag matching rendezvous incomplete",
    ];
    match NAMES.get(status as usize) {
        Some(n) => format!("{n} (status {status})"),
        None => format!("status {status}"),
    }
}

/// Opens the RDMA device chosen by [`IB_DEVICE_ENV`] (port [`IB_PORT_ENV`], GID index
/// [`IB_GID_INDEX_ENV`]). Errors say what was found and which transports would work.
pub fn open_from_env() -> Result<Arc<dyn Verbs>, IbError> {
    #[cfg(feature = "ib")]
    {
        let sel = Selection::from_env()?;
        Ok(Arc::new(sideway::SidewayVerbs::open(&sel)?))
    }
    #[cfg(not(feature = "ib"))]
    {
        Err(IbError::Unavailable(format!(
            "this build of mscclpp has no InfiniBand: it was built without the cargo feature \
             `ib` (enable `mscclpp/ib` or `mscclpp-host/ib`; building needs cmake, clang and \
             libibverbs-dev); {ALTERNATIVES}"
        )))
    }
}

/// The RDMA devices this machine has, by name, or why none can be listed (no libibverbs,
/// built without `ib`). For tests that skip without a device, and for diagnostics.
pub fn list_devices() -> Result<Vec<String>, IbError> {
    #[cfg(feature = "ib")]
    {
        sideway::list_devices()
    }
    #[cfg(not(feature = "ib"))]
    {
        Err(IbError::Unavailable(
            "built without the cargo feature `ib`".into(),
        ))
    }
}

/// Device, port and GID index to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Name or index; `None` for the first device.
    pub device: Option<String>,
    /// Port number (from 1).
    pub port: u8,
    /// GID index.
    pub gid_index: u8,
}

impl Selection {
    /// From [`IB_DEVICE_ENV`], [`IB_PORT_ENV`] and [`IB_GID_INDEX_ENV`]
    /// ([`Settings::ib_device`](crate::settings::Settings::ib_device) and the two after it).
    pub fn from_env() -> Result<Selection, IbError> {
        let s =
            crate::settings::Settings::global().map_err(|e| IbError::Unavailable(e.to_string()))?;
        Ok(Selection {
            device: s.ib_device.clone(),
            port: s.ib_port,
            gid_index: s.ib_gid_index,
        })
    }

    /// Picks the index of the wanted device among `names` (a name, or an index).
    pub fn pick(&self, names: &[String]) -> Result<usize, IbError> {
        if names.is_empty() {
            return Err(no_device());
        }
        let Some(wanted) = &self.device else {
            return Ok(0);
        };
        let wanted = wanted.trim();
        let by_name = names.iter().position(|n| n == wanted);
        let by_index = wanted.parse::<usize>().ok().filter(|i| *i < names.len());
        by_name.or(by_index).ok_or_else(|| IbError::NoSuchDevice {
            wanted: wanted.to_string(),
            found: describe_devices(names),
        })
    }
}

fn describe_devices(names: &[String]) -> String {
    if names.is_empty() {
        return "no RDMA device".into();
    }
    let list: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{i}: {n}"))
        .collect();
    format!("{} device(s) [{}]", names.len(), list.join(", "))
}

fn no_device() -> IbError {
    IbError::Unavailable(format!(
        "libibverbs is installed but reports no RDMA device (no InfiniBand/RoCE adapter, or \
         its driver is not loaded: check `ibv_devices`); {ALTERNATIVES}"
    ))
}
