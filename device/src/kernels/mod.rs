//! Kernels of the device crate. Each is an `extern "ptx-kernel"` entry point in the PTX the
//! host embeds (symbol = function name) and a plain `unsafe fn` on the host.
//!
//! The collectives' kernels ship; the test kernels (`arch_check`, `fifo_test`, `latency`,
//! `litmus`, `memory_test`, `proxy_test`, `smoke`) exist only with the `test-kernels` feature
//! (and in this crate's own unit tests), so the shipped PTX carries none of them.

#[cfg(any(test, feature = "test-kernels"))]
pub mod arch_check;
pub mod collectives;
#[cfg(any(test, feature = "test-kernels"))]
pub mod fifo_test;
#[cfg(any(test, feature = "test-kernels"))]
pub mod latency;
#[cfg(any(test, feature = "test-kernels"))]
pub mod litmus;
#[cfg(any(test, feature = "test-kernels"))]
pub mod memory_test;
#[cfg(any(test, feature = "test-kernels"))]
pub mod proxy_test;
pub mod scatter_rooted;
pub mod send_recv;
#[cfg(any(test, feature = "test-kernels"))]
pub mod smoke;
pub mod staging;
