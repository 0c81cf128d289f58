//! The proxy: the host threads that carry out what GPU kernels ask for
//! (docs/guide/06-design.md §4).
//!
//! - the trigger FIFO between a kernel and the proxy: [`Fifo`] owns its memory, hands
//!   kernels a [`FifoDeviceHandle`] and the proxy thread an [`OwnedFifoConsumer`]
//!   (`poll` / `pop`); with feature `testing`, `fifo_check` drives the `fifo_push_test`
//!   kernel against it for tests and benchmarks, and `fifo_litmus` its `litmus_fifo_publish`
//!   kernel (the data a trigger names is seen with it, and a trigger is never seen torn);
//! - [`ProxyService`]: the thread that pops triggers and drives a transport's data plane.

mod fifo;
#[cfg(feature = "testing")]
pub mod fifo_check;
#[cfg(feature = "testing")]
pub mod fifo_litmus;
mod service;

pub use crate::transport::error::ProxyError;
pub use service::{PROXY_STATS_ENV, ProxyService, ProxyStats};
pub(crate) use service::{ProxyTask, RefusedHook, SettleHook, StartHook, stats_wanted};

pub use fifo::{
    DEFAULT_SLOTS, DEFAULT_TIMEOUT, Fifo, FifoConfig, FifoError, FifoKernelArg, OwnedFifoConsumer,
};
pub use mscclpp_device::fifo::{
    FifoConfigError, FifoDeviceHandle, FifoTimeout, FifoWait, Trigger, TriggerError, TriggerField,
    TriggerOp,
};
