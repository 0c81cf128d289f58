//! Kernels of the device crate. Each is an `extern "ptx-kernel"` entry point in the PTX the
//! host embeds (symbol = function name) and a plain `unsafe fn` on the host.

pub mod arch_check;
pub mod collectives;
pub mod fifo_test;
pub mod latency;
pub mod litmus;
pub mod memory_test;
pub mod proxy_test;
pub mod scatter_rooted;
pub mod send_recv;
pub mod smoke;
pub mod staging;
