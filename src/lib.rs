//! mscclpp: a GPU communication library after MSCCL++, in Rust.
//!
//! GPU kernels move data between GPUs with one-sided `put` / `signal` / `wait`; collectives
//! are built on top. Without a GPU the same code runs on CPU threads over shared memory (the
//! Host transport), which is how the tests run. The guide (`docs/guide/` in the repository)
//! explains each part with examples that are compiled and run as this crate's doc tests.
//!
//! # Where to start
//!
//! | you want to | start with |
//! |---|---|
//! | run collectives from Rust | [`host::collectives::Collectives`] over a [`host::communicator::Communicator`] |
//! | find the other ranks | [`create_unique_id`] + [`BlockingBootstrap`], or [`Launch::from_env`] under mpirun / torchrun / Slurm |
//! | start ranks on this machine | [`LocalLauncher`] |
//! | write your own kernels | [`device::channel::DevConn`] (proxy channels), [`device::channel::MemoryChannel`] (memory channels), [`device::kernel!`] |
//! | use it from C or PyTorch | the `mscclpp-nccl` crate (`libmscclpp_nccl.so`), not this one |
//!
//! # Map
//!
//! - [`host`] (crate `mscclpp-host`), bottom up:
//!   - [`host::cuda`]: the driver through cudarc (loaded at run time): [`host::cuda::Gpu`],
//!     device buffers with IPC handles, mapped host memory, [`host::cuda::KernelModule`];
//!   - [`host::bootstrap`]: the control plane over TCP: [`UniqueId`], [`Bootstrap`] (async)
//!     and [`BlockingBootstrap`], all-gather / barrier / send / recv between ranks, dead
//!     ranks named;
//!   - [`host::launch`]: who is which rank ([`Launch`]), and [`LocalLauncher`];
//!   - [`host::transport`]: how bytes move, [`host::transport::TransportKind`] `P2p`
//!     (NVLink/PCIe, copy engine), `Host` (shared memory), `Tcp`, `Ib` (feature `ib`);
//!   - [`host::proxy`]: the trigger FIFO and the proxy thread that serves it;
//!   - [`host::communicator`]: [`host::communicator::Communicator`] (buffers, connections,
//!     [`host::communicator::Backend`] GPU or Host) and [`host::communicator::CommError`];
//!   - [`host::collectives`]: [`host::collectives::Collectives`], every collective and
//!     send/recv on raw pointers, cudarc slices (`&CudaSlice<T>` + stream) or host slices.
//! - [`device`] (crate `mscclpp-device`, `no_std`, built for nvptx and for the host):
//!   [`device::arch`] (the one place for nvptx specifics, and [`device::arch::launch`] to run
//!   a kernel on CPU threads), [`device::fifo`], [`device::channel`], [`device::semaphore`],
//!   [`device::packet`], [`device::fault`], [`device::collectives`] (the kernels' code).
//!
//! # Example
//!
//! Two ranks as threads on the Host transport (on GPUs: one process per GPU and
//! `Backend::auto(local_rank)`):
//!
//! ```
//! use mscclpp::host::collectives::{CollConfig, Collectives, Exec, ReduceOp};
//! use mscclpp::host::communicator::{Backend, CommConfig, CommError, Communicator};
//! use mscclpp::{BlockingBootstrap, create_unique_id};
//!
//! let id = create_unique_id().unwrap();
//! let rank = |r: usize| -> Result<f32, CommError> {
//!     let bootstrap = BlockingBootstrap::init(2, r, id)?;
//!     let comm = Communicator::from_bootstrap(bootstrap, Backend::Host, CommConfig::default())?;
//!     let coll = Collectives::new(comm, CollConfig { scratch_bytes: 1 << 20, ..Default::default() })?;
//!     let mut x = [r as f32 + 1.0; 4];
//!     coll.all_reduce_in_place(&mut x, ReduceOp::Sum, Exec::Host)?;
//!     Ok(x[0])
//! };
//! let sums = std::thread::scope(|s| [s.spawn(|| rank(0)), s.spawn(|| rank(1))].map(|h| h.join()));
//! assert!(sums.into_iter().all(|s| s.unwrap().unwrap() == 3.0));
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

pub use mscclpp_device as device;
pub use mscclpp_host as host;
pub use mscclpp_host::bootstrap::{
    BlockingBootstrap, Bootstrap, BootstrapConfig, BootstrapError, UniqueId, create_unique_id,
};
pub use mscclpp_host::launch::{Launch, LocalLauncher};

// The README and the guide's chapters, compiled and run as doc tests (`cargo test --doc`):
// their examples stay true to the API. GPU-only snippets are `no_run`.

/// README.md's example.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// docs/guide/01-collectives.md.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/01-collectives.md")]
pub struct GuideCollectives;

/// docs/guide/02-own-kernels.md.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/02-own-kernels.md")]
pub struct GuideOwnKernels;

/// docs/guide/03-nccl-library.md.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/03-nccl-library.md")]
pub struct GuideNcclLibrary;

/// docs/guide/04-several-machines.md.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/04-several-machines.md")]
pub struct GuideSeveralMachines;

/// docs/guide/05-faults.md.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/05-faults.md")]
pub struct GuideFaults;

/// docs/guide/06-design.md.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/06-design.md")]
pub struct GuideDesign;
