//! [`Backend`]: where a communicator runs, and so which transport its connections use.

use crate::cuda::{CudaError, Gpu, device_count};

use super::TransportKind;
use super::error::CommError;

/// Where a communicator runs.
#[derive(Debug, Clone)]
pub enum Backend {
    /// This GPU: P2P connections, GPU kernels.
    Gpu(Gpu),
    /// No GPU: Host connections, CPU-thread kernels.
    Host,
}

impl Backend {
    /// GPU `local_rank % device count` when a driver and a GPU are present, else the host.
    pub fn auto(local_rank: usize) -> Result<Backend, CommError> {
        match device_count() {
            Ok(n) if n > 0 => Ok(Backend::Gpu(Gpu::open(local_rank % n)?)),
            Ok(_) | Err(CudaError::NoDriver) | Err(CudaError::NoGpu(_)) => Ok(Backend::Host),
            Err(e) => Err(e.into()),
        }
    }

    /// The transport connections of this backend use.
    pub fn transport(&self) -> TransportKind {
        match self {
            Backend::Gpu(_) => TransportKind::P2p,
            Backend::Host => TransportKind::Host,
        }
    }
}
