//! [`Communicator`]: the seed's `mscclppComm` in idiomatic Rust.
//!
//! ```text
//! init_rank / from_unique_id / from_bootstrap
//!   -> alloc_buffer, connect(remote_rank, &buffer, tag, transport)   (any number)
//!   -> connection_setup()                                           (collective)
//!   -> device_connections()  → DevConn handles for kernels
//!   -> proxy_launch() … kernels … proxy_stop()
//!   -> drop: proxy stopped, peers unmapped, memory freed
//! ```
//!
//! A communicator runs on one backend: a GPU (connections use the P2P transport; the proxy
//! FIFO is host-mapped, the counters in device memory) or the host (connections use the Host
//! transport; "kernels" are CPU threads calling the same `DevConn` methods, buffers are
//! shared memory). [`Backend::auto`] picks GPU `local_rank` when there is one. Either backend
//! can also make proxy channels over InfiniBand ([`TransportKind::Ib`], cargo feature `ib`):
//! the first such `connect` opens the RDMA device (`MSCCLPP_IB_DEVICE`) and fails with
//! [`CommError::TransportUnavailable`], saying what was found, when there is none. The Host
//! backend can make proxy channels over TCP sockets too ([`TransportKind::Tcp`]; see
//! `transport::tcp`), to ranks on any machine.
//!
//! Validation, all with errors naming the problem: an unknown or own rank, a buffer of 0
//! bytes or larger than a trigger can address, a tag used twice towards one peer, a
//! transport this backend does not have, a peer on another machine for Host/P2P, buffer
//! sizes or transports that differ between the two sides (found during setup, reported on
//! both), connections beyond the trigger's id space. Offsets + sizes of puts are checked by
//! the proxy against both buffers, never performed, and reported at once: to the host
//! ([`Communicator::proxy_error`], [`Communicator::proxy_errors`], and all of them by
//! [`Communicator::proxy_stop`]) and to the kernel, whose next `try_signal`/`try_flush` on
//! that connection fails (see `mscclpp_device::channel::proxy`).
//!
//! [`TransportKind::Ib`]: crate::transport::TransportKind::Ib
//! [`TransportKind::Tcp`]: crate::transport::TransportKind::Tcp

mod close;
mod connect;
mod fault;
mod handles;
mod proxy;
pub(crate) mod setup;

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::bootstrap::{BlockingBootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use crate::cuda::{DeviceBuffer, MappedHostBuffer};
use crate::proxy::{Fifo, FifoConfig, ProxyService};
use crate::settings::Settings;
use crate::transport::buffer::BufferMem;
use crate::transport::ib::{self, IbConfig};
use crate::transport::p2p::ProxyFlagMode;
use crate::transport::setup::{FlagMemory, PendingConnection, SetupContext};
use crate::transport::shm::ShmSegment;

pub use crate::transport::backend::Backend;
pub use crate::transport::buffer::Buffer;
pub use crate::transport::error::CommError;
pub use crate::transport::setup::{ChannelKind, Connection};
pub use crate::transport::tags::ConnTag;
pub use fault::AbortReason;
pub use handles::{DevConnArg, MemoryChannelArg};

pub(crate) use close::idle_within;
pub(crate) use fault::{FaultArea, FaultRecord};

/// Settings of a communicator.
#[derive(Debug, Clone)]
pub struct CommConfig {
    /// Slots of the proxy FIFO (power of two; the seed used 8).
    pub fifo_slots: usize,
    /// How long a device-side push, sync or wait spins before giving up (and host-backend
    /// kernels wait). [`DEVICE_TIMEOUT_ENV`] overrides it when set.
    pub device_timeout: Duration,
    /// The bootstrap's settings (timeouts, message size).
    pub bootstrap: BootstrapConfig,
    /// Queue-pair depth, signalling interval and completion timeout of IB connections.
    pub ib: IbConfig,
    /// How the proxy raises the peer's flag on P2P proxy channels (GPU backend): a
    /// stream-ordered write (default) or a CPU store into host memory the peer polls.
    /// `MSCCLPP_PROXY_FLAG=stream|cpu` overrides it. Every rank must use the same mode.
    pub proxy_flag: ProxyFlagMode,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            fifo_slots: 512,
            device_timeout: Duration::from_secs(30),
            bootstrap: BootstrapConfig::default(),
            ib: IbConfig::default(),
            proxy_flag: ProxyFlagMode::default(),
        }
    }
}

/// The seed's communicator. See the module docs.
#[derive(Debug)]
pub struct Communicator {
    bootstrap: BlockingBootstrap,
    backend: Backend,
    fifo: Fifo,
    pending: Vec<PendingConnection>,
    tags: HashSet<(usize, u32)>,
    connections: Vec<Connection>,
    /// The running proxy. Behind a lock so that starting and stopping it takes `&self`:
    /// handles borrow the communicator and stay valid across both.
    proxy: Mutex<Option<ProxyService>>,
    /// Flag memory of every setup round, kept alive while connections use it.
    flag_memory: Vec<FlagMemory>,
    /// Signals sent on each connection (see `ProxyTask::epochs`).
    epochs: Arc<[AtomicU64]>,
    /// The RDMA device, opened by the first `connect` with
    /// [`TransportKind::Ib`](crate::transport::TransportKind::Ib).
    ib: Option<ib::setup::IbSession>,
    /// Settings of IB connections.
    ib_config: IbConfig,
    /// How P2P proxies raise flags (the config's, or the environment's when set).
    proxy_flag: ProxyFlagMode,
    /// The abort word and failure records shared with kernels.
    fault: Arc<FaultArea>,
}

/// `result`, having told `bootstrap` to say, when it closes, that `what` ("finding its GPU")
/// failed on this rank and why ([`Bootstrap::set_leaving_why`](crate::bootstrap::Bootstrap::set_leaving_why)):
/// the bootstrap drops with the error, and the other ranks' errors then show it.
fn said_why<T>(
    bootstrap: &BlockingBootstrap,
    what: &str,
    result: Result<T, CommError>,
) -> Result<T, CommError> {
    if let Err(e) = &result {
        let why = format!("{what} failed on it: {e}");
        bootstrap.as_async().set_leaving_why(&why);
    }
    result
}

impl Communicator {
    /// The seed's `mscclppCommInitRank(comm, nranks, rank, "ip:port")`: rank 0 runs the
    /// root at `addr`; also accepts a unique id string. Backend: [`Backend::auto`].
    pub fn init_rank(nranks: usize, rank: usize, addr: &str) -> Result<Communicator, CommError> {
        let root: BootstrapRoot = addr.parse()?;
        let config = CommConfig::default();
        let bootstrap =
            BlockingBootstrap::init_with_config(nranks, rank, root, config.bootstrap.clone())?;
        let backend = said_why(
            &bootstrap,
            "finding its GPU",
            Backend::auto(bootstrap.local_rank()),
        )?;
        Communicator::from_bootstrap(bootstrap, backend, config)
    }

    /// Joins the ranks of `id` (from `create_unique_id`). Backend: [`Backend::auto`].
    pub fn from_unique_id(
        nranks: usize,
        rank: usize,
        id: UniqueId,
    ) -> Result<Communicator, CommError> {
        let config = CommConfig::default();
        let bootstrap =
            BlockingBootstrap::init_with_config(nranks, rank, id, config.bootstrap.clone())?;
        let backend = said_why(
            &bootstrap,
            "finding its GPU",
            Backend::auto(bootstrap.local_rank()),
        )?;
        Communicator::from_bootstrap(bootstrap, backend, config)
    }

    /// A communicator over an existing bootstrap, on `backend`.
    pub fn from_bootstrap(
        bootstrap: BlockingBootstrap,
        backend: Backend,
        config: CommConfig,
    ) -> Result<Communicator, CommError> {
        let parts = || -> Result<_, CommError> {
            config
                .ib
                .validate()
                .map_err(|e| CommError::InvalidArgument(e.to_string()))?;
            let settings =
                Settings::global().map_err(|e| CommError::InvalidArgument(e.to_string()))?;
            let proxy_flag = settings.proxy_flag.unwrap_or(config.proxy_flag);
            let device_timeout = settings.device_timeout.unwrap_or(config.device_timeout);
            let fifo_config = FifoConfig {
                slots: config.fifo_slots,
                timeout: device_timeout,
            };
            let fifo = match &backend {
                Backend::Gpu(gpu) => Fifo::new_gpu(gpu, fifo_config),
                Backend::Host => Fifo::new_host(fifo_config),
            }
            .map_err(|e| CommError::InvalidArgument(format!("proxy FIFO: {e}")))?;
            let fault = FaultArea::new(
                match &backend {
                    Backend::Gpu(g) => Some(g),
                    Backend::Host => None,
                },
                bootstrap.nranks(),
            )?;
            Ok((proxy_flag, fifo, fault))
        };
        let (proxy_flag, fifo, fault) =
            said_why(&bootstrap, "setting up its communicator", parts())?;
        fault.watch(&bootstrap);
        Ok(Communicator {
            bootstrap,
            backend,
            fifo,
            pending: Vec::new(),
            tags: HashSet::new(),
            connections: Vec::new(),
            proxy: Mutex::new(None),
            flag_memory: Vec::new(),
            epochs: Arc::from(Vec::new()),
            ib: None,
            ib_config: config.ib,
            proxy_flag,
            fault,
        })
    }

    /// How this communicator's P2P proxies raise the peer's flag ([`CommConfig::proxy_flag`],
    /// or `MSCCLPP_PROXY_FLAG` when set).
    pub fn proxy_flag_mode(&self) -> ProxyFlagMode {
        self.proxy_flag
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.bootstrap.rank()
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.bootstrap.nranks()
    }

    /// The backend.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The bootstrap (control plane), for exchanging anything else.
    pub fn bootstrap(&self) -> &BlockingBootstrap {
        &self.bootstrap
    }

    /// The seed's `mscclppBootStrapAllGather`: every rank's `data`, in rank order.
    pub fn bootstrap_all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        Ok(self.bootstrap.all_gather(data)?)
    }

    /// Allocates `bytes` of connection memory on this backend (zeroed).
    pub fn alloc_buffer(&self, bytes: usize) -> Result<Buffer, CommError> {
        if bytes == 0 {
            return Err(CommError::InvalidArgument("buffer of 0 bytes".into()));
        }
        let mem = match &self.backend {
            Backend::Gpu(gpu) => BufferMem::Device(DeviceBuffer::zeroed(gpu, bytes)?),
            Backend::Host => BufferMem::Host(ShmSegment::create(bytes)?),
        };
        Ok(Buffer::new(mem))
    }

    /// Allocates `bytes` of connection memory for TCP connections: on a GPU backend, pinned
    /// host memory mapped into the device (zeroed), which kernels read and write over PCIe
    /// and the TCP transport's sockets read and write directly, so a put needs no copy out
    /// of the device, and a signal no stream-ordered flag write (the receiver stores the
    /// flag into host memory the kernel polls). On the Host backend, [`alloc_buffer`]'s
    /// memory. Such a buffer serves [`TransportKind::Tcp`] connections only.
    ///
    /// [`TransportKind::Tcp`]: crate::transport::TransportKind::Tcp
    ///
    /// [`alloc_buffer`]: Self::alloc_buffer
    pub fn alloc_mapped_buffer(&self, bytes: usize) -> Result<Buffer, CommError> {
        match &self.backend {
            Backend::Gpu(gpu) => {
                if bytes == 0 {
                    return Err(CommError::InvalidArgument("buffer of 0 bytes".into()));
                }
                let mem = BufferMem::Mapped(MappedHostBuffer::alloc(gpu, bytes)?);
                Ok(Buffer::new(mem))
            }
            Backend::Host => self.alloc_buffer(bytes),
        }
    }

    /// Aborts the communicator (NCCL's `ncclCommAbort`, without freeing anything): raises
    /// the abort word that the collective kernels' waits look at, so every collective of
    /// this communicator in flight on this rank stops within milliseconds and fails with
    /// [`CommError::Aborted`], as does every later one. The waits of the handles from
    /// [`device_connections`](Self::device_connections) and
    /// [`memory_channels`](Self::memory_channels) look at the same word and give up with
    /// `ChannelError::Aborted` (their `wait` traps). The bootstrap does the same by
    /// itself when a rank dies. Other ranks are not told: they see this rank's kernels stop
    /// taking part (abort them too, or let their timeouts or the bootstrap report it).
    pub fn abort(&self) {
        self.fault.abort(AbortReason::Requested);
    }

    /// Why the communicator was aborted, if it was (a lost rank or [`abort`](Self::abort)).
    pub fn abort_reason(&self) -> Option<AbortReason> {
        self.fault.abort_reason()
    }

    /// The fault area shared with the collective kernels.
    pub(crate) fn fault_area(&self) -> &Arc<FaultArea> {
        &self.fault
    }

    /// How long device-side waits (and host-backend kernels) wait before giving up.
    pub fn device_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.fifo.device_handle().timeout_ns())
    }

    /// The set-up connections.
    pub fn connections(&self) -> &[Connection] {
        &self.connections
    }
}

/// What the transports' setup sees of a communicator.
impl SetupContext for Communicator {
    fn rank(&self) -> usize {
        Communicator::rank(self)
    }

    fn backend(&self) -> &Backend {
        Communicator::backend(self)
    }

    fn bootstrap(&self) -> &BlockingBootstrap {
        Communicator::bootstrap(self)
    }

    fn proxy_flag_mode(&self) -> ProxyFlagMode {
        Communicator::proxy_flag_mode(self)
    }

    fn ib_session(&self) -> Option<&ib::setup::IbSession> {
        self.ib.as_ref()
    }

    fn ib_config(&self) -> IbConfig {
        self.ib_config
    }

    fn connections(&self) -> &[Connection] {
        Communicator::connections(self)
    }
}

/// Environment variable: the device timeout in seconds ([`CommConfig::device_timeout`],
/// [`Settings::device_timeout`]),
/// e.g. `10` or `2.5`; it overrides the config. Lowering it on one rank makes that rank
/// report first when ranks wait for each other (which rank waits for whom, and where).
pub const DEVICE_TIMEOUT_ENV: &str = "MSCCLPP_DEVICE_TIMEOUT";

#[cfg(test)]
mod tests;
