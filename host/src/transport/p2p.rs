//! The P2P transport's data plane: copy-engine copies on the proxy's stream and the flag as a
//! stream-ordered 64-bit write after them.

use std::sync::Arc;

use crate::cuda::{CudaStream, memcpy_async, write_u64_async};

use super::{DataPlane, Route, TransportError};

/// `cuMemcpyAsync` + `cuStreamWriteValue64` on one stream (the proxy's), so every flag lands
/// after the data queued before it.
#[derive(Debug)]
pub struct P2pPlane {
    stream: Arc<CudaStream>,
}

impl P2pPlane {
    /// A plane issuing on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> P2pPlane {
        P2pPlane { stream }
    }
}

impl DataPlane for P2pPlane {
    fn put(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), TransportError> {
        route.check(dst_offset, src_offset, size)?;
        if size == 0 {
            return Ok(());
        }
        // SAFETY: the route's addresses are device (or peer-mapped) ranges that the
        // communicator keeps alive while the proxy runs; the range was checked above.
        unsafe {
            memcpy_async(
                route.remote + dst_offset,
                route.local + src_offset,
                size as usize,
                &self.stream,
            )?
        };
        Ok(())
    }

    fn signal(&mut self, route: &Route, epoch: u64) -> Result<(), TransportError> {
        // SAFETY: `remote_flag` is an aligned word of the peer's flag buffer, mapped and kept
        // alive by the communicator while the proxy runs.
        unsafe { write_u64_async(route.remote_flag, epoch, &self.stream)? };
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        self.stream
            .synchronize()
            .map_err(|e| crate::cuda::CudaError::driver("cuStreamSynchronize", e))?;
        Ok(())
    }
}
