//! mscclpp: a GPU communication library after MSCCL++.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

pub use mscclpp_device as device;
pub use mscclpp_host as host;
pub use mscclpp_host::bootstrap::{
    BlockingBootstrap, Bootstrap, BootstrapConfig, BootstrapError, UniqueId, create_unique_id,
};
pub use mscclpp_host::launch::{Launch, LocalLauncher};
