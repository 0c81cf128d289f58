//! The errors of connection setup and of the proxy: [`CommError`], the communicator's error,
//! which the transports' setup returns too, and [`ProxyError`], which it carries. Both are
//! defined here, below the communicator and the proxy that re-export them
//! (`communicator::CommError`, `proxy::ProxyError`), so that the transports need neither.

use crate::bootstrap::BootstrapError;
use crate::cuda::CudaError;

use super::ib::IbError;
use super::shm::ShmError;
use super::tags::ConnTag;
use super::{TransportError, TransportKind};

/// Errors of the communicator.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// The control plane failed (a peer gone, wrong secret, timeout, ...).
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A shared-memory segment could not be made or mapped.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// A bad argument, with what is wrong.
    #[error("{0}")]
    InvalidArgument(String),
    /// The two sides of a connection disagree (size, transport), or a peer sent garbage.
    #[error("connection with rank {peer} ({}): {reason}", ConnTag(*tag))]
    Mismatch {
        /// The peer.
        peer: usize,
        /// The connection's tag.
        tag: u32,
        /// What differs.
        reason: String,
    },
    /// The transport cannot be used here.
    #[error("transport {transport} is not available: {reason}")]
    TransportUnavailable {
        /// The transport asked for.
        transport: TransportKind,
        /// Why, and what would work.
        reason: String,
    },
    /// An InfiniBand operation failed (registration, queue pair setup).
    #[error(transparent)]
    Ib(#[from] IbError),
    /// The proxy reported errors.
    #[error("proxy reported {} error(s); first: {}", .0.len(), .0.first().map(|e| e.to_string()).unwrap_or_default())]
    Proxy(Vec<ProxyError>),
    /// A call in the wrong state (e.g. `connect` after the proxy started).
    #[error("{0}")]
    State(String),
    /// The ranks called a collective differently (kind, count, type, operation or
    /// algorithm): every rank gets this error, names the disagreement, and the communicator
    /// stays usable for the next call.
    #[error("{0}")]
    CallMismatch(String),
    /// The communicator was aborted (a rank was lost, or [`Communicator::abort`]): every
    /// later call fails the same way.
    ///
    /// [`Communicator::abort`]: crate::communicator::Communicator::abort
    #[error("{0}")]
    Aborted(String),
    /// A device wait of a collective ran out of time (a rank did not take part): the
    /// communicator is unusable.
    #[error("{0}")]
    Timeout(String),
    /// The CUDA context is lost (a kernel trapped or faulted): every later CUDA call fails.
    #[error("{0}")]
    ContextLost(String),
}

/// What went wrong in a proxy, reported instead of crashing or corrupting memory.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A trigger named a connection this proxy does not serve.
    #[error(
        "proxy: trigger {seq} names connection {connection}, but only {known} connection(s) exist"
    )]
    UnknownConnection {
        /// Sequence number of the trigger.
        seq: u64,
        /// The id it carried.
        connection: u32,
        /// How many connections the proxy serves.
        known: usize,
    },
    /// A put leaving one of the buffers (not performed).
    #[error("proxy: trigger {seq} on connection {connection} (to rank {peer}): {error}")]
    OutOfBounds {
        /// Sequence number of the trigger.
        seq: u64,
        /// The connection.
        connection: u32,
        /// The rank at the other end of the connection.
        peer: usize,
        /// The bounds error.
        error: TransportError,
    },
    /// The data plane's own work failed (IB host staging: a record or copy of arrived data).
    #[error("proxy: {error}")]
    Progress {
        /// The error.
        error: TransportError,
    },
    /// The data plane failed (e.g. a CUDA call).
    #[error("proxy: trigger {seq} on connection {connection} (to rank {peer}): {error}")]
    Transport {
        /// Sequence number of the trigger.
        seq: u64,
        /// The connection.
        connection: u32,
        /// The rank at the other end of the connection.
        peer: usize,
        /// The error.
        error: TransportError,
    },
}
