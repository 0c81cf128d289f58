//! Host side of mscclpp.
//!
//! Feature `testing` adds the test drivers (`smoke`, `testing`, `proxy::fifo_check`,
//! `proxy::fifo_litmus`) and the device crate's test kernels to the embedded PTX (built with
//! the pinned nightly then); the default build has neither.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

/// PTX of the device crate, one entry per compiled arch.
pub mod ptx {
    include!(concat!(env!("OUT_DIR"), "/device_ptx.rs"));
}

pub mod bootstrap;
pub mod collectives;
pub mod communicator;
pub mod cuda;
pub mod diag;
pub mod launch;
mod machine;
mod procfs;
pub mod proxy;
pub mod runtime_libs;
pub mod settings;
#[cfg(feature = "testing")]
pub mod smoke;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;
pub mod units;
mod waiters;
