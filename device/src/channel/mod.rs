//! Channels: the device side of a connection between two ranks.
//!
//! - [`proxy`]: [`DevConn`], the seed's proxy channel: the GPU pushes triggers into a FIFO
//!   and a CPU proxy moves the data (copy engine, RDMA or memcpy).

pub mod proxy;

pub use proxy::DevConn;
