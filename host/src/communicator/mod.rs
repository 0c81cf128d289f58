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

mod fault;
pub(crate) mod setup;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use mscclpp_device::channel::{DevConn, MemoryChannel};
use mscclpp_device::fifo;
use mscclpp_device::semaphore::DeviceSemaphore;

use crate::bootstrap::{BlockingBootstrap, BootstrapConfig, BootstrapRoot, UniqueId};
use crate::cuda::{DeviceBuffer, Gpu, MappedHostBuffer};
use crate::proxy::{Fifo, FifoConfig, ProxyService};
use crate::settings::Settings;
use crate::transport::TransportKind;
use crate::transport::buffer::BufferMem;
use crate::transport::ib::{self, IbConfig, IbError};
use crate::transport::p2p::ProxyFlagMode;
use crate::transport::setup::{FlagMemory, PendingConnection, SetupContext};
use crate::transport::shm::ShmSegment;

pub use crate::transport::backend::Backend;
pub use crate::transport::buffer::Buffer;
pub use crate::transport::error::CommError;
pub use crate::transport::setup::{ChannelKind, Connection};
pub use crate::transport::tags::ConnTag;
pub use fault::AbortReason;

pub(crate) use fault::{FaultArea, FaultRecord};

/// A [`DevConn`] as a kernel argument for cudarc's launch builder (passed by value). It
/// borrows what the handle borrows (the communicator).
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct DevConnArg<'a>(pub DevConn<'a>);

// SAFETY: DevConn is `#[repr(C)]`, `Copy`, and holds only addresses and integers (its
// lifetime is a zero-sized marker), which is what a by-value kernel parameter of the same
// Rust type expects.
unsafe impl cudarc::driver::DeviceRepr for DevConnArg<'_> {}

/// A [`MemoryChannel`] as a kernel argument for cudarc's launch builder (passed by value).
/// It borrows what the handle borrows (the communicator).
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct MemoryChannelArg<'a>(pub MemoryChannel<'a>);

// SAFETY: MemoryChannel is `#[repr(C)]`, `Copy`, addresses and integers only (its lifetime
// is a zero-sized marker).
unsafe impl cudarc::driver::DeviceRepr for MemoryChannelArg<'_> {}

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
    /// The RDMA device, opened by the first `connect` with [`TransportKind::Ib`].
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

    /// Asks for a proxy channel to `remote_rank` whose puts copy from `buffer` into the
    /// peer's buffer of its matching `connect(this rank, _, tag, _)`. Returns the channel's
    /// index in [`device_connections`](Self::device_connections). Nothing is exchanged until
    /// [`connection_setup`](Self::connection_setup).
    pub fn connect(
        &mut self,
        remote_rank: usize,
        buffer: &Buffer,
        tag: u32,
        transport: TransportKind,
    ) -> Result<usize, CommError> {
        self.add_pending(remote_rank, buffer, tag, transport, ChannelKind::Proxy, 0)
    }

    /// Asks for a memory channel to `remote_rank` over `buffer` (the peer's matching
    /// `connect_memory` buffer must have the same size) with a packet scratch of
    /// `packet_bytes` on each side (0 for none; a multiple of 16). Returns the channel's
    /// index in [`memory_channels`](Self::memory_channels). Set up by
    /// [`connection_setup`](Self::connection_setup) together with proxy channels; tags are
    /// shared with `connect`.
    pub fn connect_memory(
        &mut self,
        remote_rank: usize,
        buffer: &Buffer,
        tag: u32,
        transport: TransportKind,
        packet_bytes: usize,
    ) -> Result<usize, CommError> {
        if !packet_bytes.is_multiple_of(16) {
            return Err(CommError::InvalidArgument(format!(
                "connect_memory: packet scratch of {packet_bytes} bytes is not a multiple of 16"
            )));
        }
        self.add_pending(
            remote_rank,
            buffer,
            tag,
            transport,
            ChannelKind::Memory,
            packet_bytes,
        )
    }

    fn add_pending(
        &mut self,
        remote_rank: usize,
        buffer: &Buffer,
        tag: u32,
        transport: TransportKind,
        kind: ChannelKind,
        packet_bytes: usize,
    ) -> Result<usize, CommError> {
        if self.proxy_mut().is_some() {
            return Err(CommError::State(
                "connect after proxy_launch: stop the proxy first".into(),
            ));
        }
        let nranks = self.nranks();
        if remote_rank >= nranks {
            return Err(CommError::InvalidArgument(format!(
                "connect: remote rank {remote_rank} does not exist ({nranks} ranks)"
            )));
        }
        if remote_rank == self.rank() {
            return Err(CommError::InvalidArgument(format!(
                "connect: rank {remote_rank} is this rank; connections go to other ranks"
            )));
        }
        if buffer.len() as u64 > fifo::MAX_OFFSET + 1 {
            return Err(CommError::InvalidArgument(format!(
                "connect: buffer of {} bytes is larger than a trigger can address ({} bytes)",
                buffer.len(),
                fifo::MAX_OFFSET + 1
            )));
        }
        let ours = self.backend.transport();
        if transport == TransportKind::Tcp {
            if kind == ChannelKind::Memory {
                return Err(CommError::TransportUnavailable {
                    transport,
                    reason: "memory channels load and store the peer's memory, which TCP cannot \
                             map; use a proxy channel (connect) over TCP"
                        .into(),
                });
            }
        } else if transport == TransportKind::Ib {
            if kind == ChannelKind::Memory {
                return Err(CommError::TransportUnavailable {
                    transport,
                    reason: "memory channels load and store the peer's memory, which RDMA cannot \
                             map; use a proxy channel (connect) over IB"
                        .into(),
                });
            }
            self.open_ib()?;
        } else if transport != ours {
            let reason = match (transport, &self.backend) {
                (TransportKind::P2p, Backend::Host) => "this communicator runs without a GPU; use TransportKind::Host (or TransportKind::Tcp or TransportKind::Ib across machines)".to_string(),
                _ => format!("this communicator runs on a GPU; use TransportKind::{ours:?} (or TransportKind::Ib across machines)"),
            };
            return Err(CommError::TransportUnavailable { transport, reason });
        }
        if buffer.is_mapped() && (transport != TransportKind::Tcp || kind != ChannelKind::Proxy) {
            return Err(CommError::InvalidArgument(format!(
                "connect: a host-mapped buffer (alloc_mapped_buffer) serves TCP proxy channels \
                 only, not {transport:?}"
            )));
        }
        let matches_backend = matches!(
            (buffer.mem(), &self.backend),
            (BufferMem::Device(_) | BufferMem::Mapped(_), Backend::Gpu(_))
                | (BufferMem::Host(_), Backend::Host)
        );
        if !matches_backend {
            return Err(CommError::InvalidArgument(
                "connect: the buffer was not allocated by this communicator's backend".into(),
            ));
        }
        // Peers map shared memory by name, except over IB (nothing is mapped); a segment gets
        // names in one setup round only.
        if let BufferMem::Host(s) = buffer.mem()
            && s.was_shared()
            && !matches!(transport, TransportKind::Ib | TransportKind::Tcp)
        {
            return Err(CommError::InvalidArgument(
                "connect: this shared-memory buffer was already shared in an earlier setup; allocate a new buffer".into(),
            ));
        }
        if !self.tags.insert((remote_rank, tag)) {
            return Err(CommError::InvalidArgument(format!(
                "connect: tag {tag} is already used for a connection to rank {remote_rank}"
            )));
        }
        let total = self.connections.len() + self.pending.len();
        if total as u32 > fifo::MAX_CONNECTION_ID {
            self.tags.remove(&(remote_rank, tag));
            return Err(CommError::InvalidArgument(format!(
                "connect: at most {} connections per communicator",
                fifo::MAX_CONNECTION_ID + 1
            )));
        }
        let packets = match packet_bytes {
            0 => None,
            n => match self.alloc_buffer(n) {
                Ok(b) => Some(b),
                Err(e) => {
                    self.tags.remove(&(remote_rank, tag));
                    return Err(e);
                }
            },
        };
        let index = self.connections.iter().filter(|c| c.kind() == kind).count()
            + self.pending.iter().filter(|p| p.kind == kind).count();
        self.pending.push(PendingConnection {
            remote_rank,
            tag,
            buffer: buffer.clone(),
            transport,
            kind,
            packets,
        });
        Ok(index)
    }

    /// Opens the RDMA device (once) for IB connections.
    fn open_ib(&mut self) -> Result<(), CommError> {
        if self.ib.is_none() {
            let verbs = ib::open_from_env().map_err(|e| match e {
                IbError::Unavailable(_) | IbError::NoSuchDevice { .. } => {
                    CommError::TransportUnavailable {
                        transport: TransportKind::Ib,
                        reason: e.to_string(),
                    }
                }
                e => CommError::Ib(e),
            })?;
            self.ib = Some(ib::setup::IbSession::new(verbs));
        }
        Ok(())
    }

    /// Uses `verbs` for IB connections instead of opening a device (tests: the fake).
    #[cfg(test)]
    pub(crate) fn use_ib_verbs(&mut self, verbs: Arc<dyn ib::Verbs>) {
        self.ib = Some(ib::setup::IbSession::new(verbs));
    }

    /// Exchanges the pending connections' memory with their peers and maps the peers'
    /// (collective over the ranks that connect to each other; every rank should call it).
    pub fn connection_setup(&mut self) -> Result<(), CommError> {
        if self.proxy_mut().is_some() {
            return Err(CommError::State(
                "connection_setup after proxy_launch: stop the proxy first".into(),
            ));
        }
        let pending = std::mem::take(&mut self.pending);
        let first_id = self.connections.len() as u32;
        let (conns, flags) = setup::establish(self, pending, first_id)?;
        for c in &conns {
            if c.transport() == TransportKind::Tcp {
                self.fault.await_drain(c.remote_rank());
            }
            if c.ib_staged() {
                self.fault.await_settle(c.remote_rank());
            }
        }
        self.connections.extend(conns);
        self.flag_memory.push(flags);
        // The proxy is stopped (checked above), so nobody changes the epochs meanwhile.
        let epochs: Vec<AtomicU64> = (0..self.connections.len())
            .map(|i| AtomicU64::new(self.epochs.get(i).map_or(0, |e| e.load(Ordering::Relaxed))))
            .collect();
        self.epochs = Arc::from(epochs);
        Ok(())
    }

    /// The device handles of every set-up proxy channel, in `connect` order (pass them to
    /// kernels by value, or copy them to device memory).
    ///
    /// The handles borrow the communicator: the memory they point at (the proxy FIFO, the
    /// counters) is freed when it is dropped, so dropping it while a handle is still used
    /// does not compile (error E0505):
    ///
    /// ```compile_fail,E0505
    /// use mscclpp_device::arch::{Dim3, launch};
    /// use mscclpp_host::communicator::Communicator;
    ///
    /// fn misuse(comm: Communicator) {
    ///     let conns = comm.device_connections();
    ///     drop(comm); // frees the FIFO and the counters
    ///     launch(Dim3::x(1), Dim3::x(1), || {
    ///         conns[0].wait_timeout(1000);
    ///         conns[0].signal();
    ///     })
    ///     .unwrap();
    /// }
    /// ```
    ///
    /// Using them while the communicator lives (starting and stopping the proxy included)
    /// is fine:
    ///
    /// ```no_run
    /// use mscclpp_device::arch::{Dim3, launch};
    /// use mscclpp_host::communicator::Communicator;
    ///
    /// fn good(comm: Communicator) {
    ///     let conns = comm.device_connections();
    ///     comm.proxy_launch().unwrap();
    ///     launch(Dim3::x(1), Dim3::x(1), || {
    ///         conns[0].wait_timeout(1000);
    ///         conns[0].signal();
    ///     })
    ///     .unwrap();
    ///     comm.proxy_stop().unwrap();
    ///     drop(comm);
    /// }
    /// ```
    pub fn device_connections(&self) -> Vec<DevConn<'_>> {
        // SAFETY: the handles borrow `self`, which owns their memory.
        unsafe { self.proxy_handles(true) }
    }

    /// The abort word (its index in the fault area) that the user handles of `c` look at:
    /// the peer's own word ([`FaultArea::note_peer_left`]), written once this side can tell
    /// that everything the peer sent on its connections here has landed. Memory channels,
    /// P2P and Host proxy channels: at its goodbye (the peer itself writes, so all has
    /// landed once its work ended). TCP: once, in addition, the peer closed every stream of
    /// every TCP connection to this rank after its last frame
    /// ([`FaultArea::note_peer_drained`]). IB: the peer's proxy completed its writes before
    /// the goodbye (its plane's `finish`), and where this side stages IB arrivals, its proxy
    /// delivered them in a pass after the goodbye ([`FaultArea::note_settled`]).
    fn user_abort_index(&self, c: &Connection) -> usize {
        self.fault.peer_abort_index(c.remote_rank())
    }

    /// [`device_connections`](Self::device_connections) with a lifetime the caller picks,
    /// for code that keeps the handles next to the communicator (e.g. in one struct).
    ///
    /// # Safety
    /// The handles (and their copies) must not be used after this communicator is dropped
    /// (moving it is fine: the memory they point at is owned through heap allocations and
    /// mappings that do not move with it).
    pub(crate) unsafe fn device_connections_detached<'a>(&self) -> Vec<DevConn<'a>> {
        // SAFETY: forwarded to the caller.
        unsafe { self.proxy_handles(false) }
    }

    /// The handles of every set-up proxy channel; `user`: each looks at its peer's abort
    /// word ([`user_abort_index`](Self::user_abort_index)), else at the communicator's (the
    /// collectives, which track departures themselves).
    ///
    /// # Safety
    /// As for [`device_connections_detached`](Self::device_connections_detached).
    unsafe fn proxy_handles<'a>(&self, user: bool) -> Vec<DevConn<'a>> {
        let timeout_ns = self.fifo.device_handle().timeout_ns();
        self.connections
            .iter()
            .filter(|c| c.kind() == ChannelKind::Proxy)
            .map(|c| {
                // SAFETY: the FIFO, the inbound counter and the expected word are owned by
                // this communicator (flag memory is kept in `flag_memory`) and live as long
                // as it; the connection id is the route's index in the proxy; the abort
                // index is a word of the fault area, which holds a per-peer abort word for
                // every rank.
                unsafe {
                    let h = DevConn::from_raw_parts(
                        self.fifo.device_handle(),
                        c.id,
                        c.inbound as *mut u64,
                        c.expected as *mut u64,
                        timeout_ns,
                        self.fault.kernel_ptr(),
                    );
                    if user {
                        h.with_abort_index(self.user_abort_index(c) as u32)
                    } else {
                        h
                    }
                }
            })
            .collect()
    }

    /// The device handles of every set-up memory channel, in `connect_memory` order.
    ///
    /// The handles borrow the communicator (it owns or maps every address in them), so
    /// dropping it while a handle is still used does not compile (error E0505):
    ///
    /// ```compile_fail,E0505
    /// use mscclpp_device::arch::{Dim3, launch};
    /// use mscclpp_host::communicator::Communicator;
    ///
    /// fn misuse(comm: Communicator) {
    ///     let channels = comm.memory_channels();
    ///     drop(comm); // unmaps the peer's buffer and counters
    ///     launch(Dim3::x(1), Dim3::x(1), || channels[0].write::<u64>(0, 1)).unwrap();
    /// }
    /// ```
    ///
    /// ```no_run
    /// use mscclpp_device::arch::{Dim3, launch};
    /// use mscclpp_host::communicator::Communicator;
    ///
    /// fn good(comm: Communicator) {
    ///     let channels = comm.memory_channels();
    ///     launch(Dim3::x(1), Dim3::x(1), || channels[0].write::<u64>(0, 1)).unwrap();
    ///     drop(comm);
    /// }
    /// ```
    pub fn memory_channels(&self) -> Vec<MemoryChannel<'_>> {
        let timeout_ns = self.fifo.device_handle().timeout_ns();
        self.connections
            .iter()
            .filter(|c| c.kind() == ChannelKind::Memory)
            .map(|c| {
                // SAFETY: every address is owned or mapped by this communicator for as long
                // as it lives: the local buffer and packet scratch (kept by the connection),
                // the peer's buffer, scratch and inbound counter (mapped by the connection),
                // and our inbound counter and expected word (flag memory).
                unsafe {
                    let sem = DeviceSemaphore::from_raw_parts(
                        c.inbound as *mut u64,
                        c.route.remote_flag as *mut u64,
                        c.expected as *mut u64,
                        timeout_ns,
                        self.fault
                            .kernel_ptr()
                            .wrapping_add(self.user_abort_index(c)),
                    );
                    MemoryChannel::from_raw_parts(
                        c.route.local as *mut u8,
                        c.route.local_len,
                        c.route.remote as *mut u8,
                        c.route.remote_len,
                        c.packets_in as *mut u8,
                        c.packets_out as *mut u8,
                        c.packets_len,
                        sem,
                    )
                }
            })
            .collect()
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

    /// Starts the proxy thread serving this communicator's FIFO. Takes `&self` so that
    /// handles from [`device_connections`](Self::device_connections), which borrow the
    /// communicator, may be taken before it.
    pub fn proxy_launch(&self) -> Result<(), CommError> {
        let mut proxy = self.proxy_lock();
        if proxy.is_some() {
            return Err(CommError::State(
                "proxy_launch: the proxy is already running".into(),
            ));
        }
        let task = setup::proxy_task(self)?;
        let name = format!("mscclpp-proxy-{}", self.rank());
        *proxy = Some(
            ProxyService::launch(task, name)
                .map_err(|e| CommError::State(format!("cannot start the proxy thread: {e}")))?,
        );
        Ok(())
    }

    /// Stops the proxy after it has served every trigger already pushed (joining its
    /// thread); returns the errors it reported (malformed triggers, failed copies), if any.
    pub fn proxy_stop(&self) -> Result<(), CommError> {
        let taken = self.proxy_lock().take();
        let Some(p) = taken else {
            return Err(CommError::State(
                "proxy_stop: the proxy is not running".into(),
            ));
        };
        let errors = p.stop();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CommError::Proxy(errors))
        }
    }

    /// The running proxy's first error, as text, if it has reported one (a put outside the
    /// buffers names the connection, the peer rank, the offsets, the size and both buffer
    /// sizes). Available as soon as the proxy has refused the trigger, without stopping it;
    /// [`proxy_stop`](Self::proxy_stop) returns every error as [`CommError::Proxy`].
    pub fn proxy_error(&self) -> Option<String> {
        self.proxy_lock().as_ref().and_then(|p| p.first_error())
    }

    /// Errors the running proxy has reported so far (as text) and how many were dropped.
    /// An error is recorded before the trigger that caused it is popped, so it is here by
    /// the time the kernel's `signal`/`flush` after that trigger returns (or fails: see
    /// `DevConn::try_signal`), without stopping the proxy.
    pub fn proxy_errors(&self) -> (Vec<String>, u64) {
        self.proxy_lock()
            .as_ref()
            .map(|p| p.errors())
            .unwrap_or_default()
    }

    /// The proxy slot (a panic while it was held leaves nothing half-done in it).
    fn proxy_lock(&self) -> MutexGuard<'_, Option<ProxyService>> {
        self.proxy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The proxy slot, without locking.
    fn proxy_mut(&mut self) -> &mut Option<ProxyService> {
        self.proxy.get_mut().unwrap_or_else(PoisonError::into_inner)
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

/// Whether every piece of work of `gpu`'s context ended within `wait` (a helper thread
/// synchronises the context; past `wait` it is left to finish on its own).
pub(crate) fn idle_within(gpu: &Gpu, wait: Duration) -> bool {
    let ctx = Arc::clone(gpu.context());
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("mscclpp-close-sync".into())
        .spawn(move || {
            let _ = tx.send(ctx.synchronize().is_ok());
        });
    spawned.is_ok() && rx.recv_timeout(wait).unwrap_or(false)
}

/// Environment variable: the device timeout in seconds ([`CommConfig::device_timeout`],
/// [`Settings::device_timeout`]),
/// e.g. `10` or `2.5`; it overrides the config. Lowering it on one rank makes that rank
/// report first when ranks wait for each other (which rank waits for whom, and where).
pub const DEVICE_TIMEOUT_ENV: &str = "MSCCLPP_DEVICE_TIMEOUT";

/// How long a dropped [`Communicator`] waits for the work of its GPU context to end before
/// its goodbye says so ([`Bootstrap::set_work_ended_at_close`]); past it, the goodbye says
/// nothing and peers' waits for this rank run to their timeout.
const WORK_ENDED_AT_CLOSE_WAIT: Duration = Duration::from_secs(1);

impl Drop for Communicator {
    fn drop(&mut self) {
        // Stop the proxy (joining its thread) before the memory it uses goes (fields drop
        // after this).
        if let Some(p) = self.proxy_mut().take() {
            let _ = p.stop();
        }
        // With the proxy stopped, nothing new is issued; once the context has no work left
        // (kernels' stores, the proxy's copies and flags), everything this rank sent has
        // landed, and the goodbye (sent when the bootstrap drops, below) says so: the
        // peers' user channels then stop waiting for what never comes (`ChannelError::
        // PeerLeft`). On the host backend the proxy's copies are done when it stops, and
        // kernels are threads that ended before the handles' borrow of `self` did.
        let ended = match &self.backend {
            Backend::Gpu(g) => idle_within(g, WORK_ENDED_AT_CLOSE_WAIT),
            Backend::Host => true,
        };
        if ended {
            self.bootstrap.as_async().set_work_ended_at_close();
        }
        // Drop peer mappings before our own memory and before the bootstrap goes.
        self.connections.clear();
        // A peer of this host that died (lost, not departed) may have published names for
        // us that we never received (killed between publishing and sending them): nobody
        // else knows them, so remove its names here.
        let bs = self.bootstrap.as_async();
        let me = self.rank();
        for r in (0..self.nranks()).filter(|&r| r != me && bs.was_lost(r)) {
            if let Some(pid) = bs.pid(r)
                && bs.host_id(r) == bs.host_id(me)
            {
                crate::transport::shm::remove_names_of_dead(pid);
            }
        }
    }
}

#[cfg(test)]
mod tests;
