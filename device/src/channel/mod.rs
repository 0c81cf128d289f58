//! Channels: the device side of a connection between two ranks.
//!
//! - [`proxy`]: [`DevConn`], the seed's proxy channel: the GPU pushes triggers into a FIFO
//!   and a CPU proxy moves the data (copy engine, RDMA or memcpy).
//! - [`memory`]: [`MemoryChannel`]: the peer's memory is mapped and the GPU's threads move
//!   the data themselves with loads and stores.

pub mod memory;
pub mod proxy;

pub use memory::{MemoryChannel, PlainData};
pub use proxy::DevConn;

pub use crate::fault::ChannelError;
