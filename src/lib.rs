//! mscclpp: a GPU communication library after MSCCL++.
pub use mscclpp_device as device;
pub use mscclpp_host as host;
