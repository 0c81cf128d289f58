//! Stream-ordered operations the proxy issues (copy engine, flag writes) and peer access.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr, CUresult, CUstreamWriteValue_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::{CudaError, Gpu, Result, check};

/// Queues a copy of `bytes` from `src` to `dst` on `stream` (`cuMemcpyAsync`; with unified
/// addressing this is a peer copy over NVLink/PCIe when the two are on different GPUs).
///
/// # Safety
/// `dst` and `src` must be valid device (or mapped) ranges of `bytes` bytes that stay valid
/// until the stream has executed the copy, and nothing may write `src` or access `dst`
/// concurrently in a way that races with it.
pub unsafe fn memcpy_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    // SAFETY: the caller guarantees both ranges; the stream is live.
    check("cuMemcpyAsync", unsafe {
        sys::cuMemcpyAsync(dst, src, bytes, stream.cu_stream())
    })
}

/// Queues a write of the 64-bit `value` to `addr` on `stream`, after everything queued
/// before it (`cuStreamWriteValue64`). The value is captured now, so later calls cannot
/// change what an earlier write stores.
///
/// # Safety
/// `addr` must be a valid, 8-byte aligned device (or mapped peer) address that stays valid
/// until the stream has executed the write.
pub unsafe fn write_u64_async(addr: CUdeviceptr, value: u64, stream: &CudaStream) -> Result<()> {
    // SAFETY: the caller guarantees the address; the stream is live.
    check("cuStreamWriteValue64", unsafe {
        sys::cuStreamWriteValue64_v2(
            stream.cu_stream(),
            addr,
            value,
            CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
        )
    })
}

/// Whether everything queued on `stream` has finished (`cuStreamQuery`), without waiting.
pub fn stream_idle(stream: &CudaStream) -> Result<bool> {
    // SAFETY: the stream is live.
    match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => check("cuStreamQuery", other).map(|()| false),
    }
}

/// A new event without timing (`cuEventCreate(CU_EVENT_DISABLE_TIMING)`), for completion
/// marks on a stream.
pub fn new_event(ctx: &Arc<CudaContext>) -> Result<CudaEvent> {
    ctx.new_event(None)
        .map_err(|e| CudaError::driver("cuEventCreate", e))
}

/// Records `event` on `stream` (`cuEventRecord`): it is reached once everything queued on the
/// stream before it has completed. Re-recording an event moves it to the new point.
pub fn record_event(event: &CudaEvent, stream: &CudaStream) -> Result<()> {
    event
        .record(stream)
        .map_err(|e| CudaError::driver("cuEventRecord", e))
}

/// Whether the work before `event`'s last record has completed (`cuEventQuery`), without
/// waiting; an error of that work (or of the context) is returned.
pub fn event_reached(event: &CudaEvent) -> Result<bool> {
    event
        .try_is_complete()
        .map_err(|e| CudaError::driver("cuEventQuery", e))
}

impl Gpu {
    /// Whether this device can map `peer`'s memory directly (NVLink or PCIe peer).
    pub fn can_access_peer(&self, peer: &Gpu) -> Result<bool> {
        let mut can = 0;
        // SAFETY: `can` is a valid out-pointer; both devices are valid handles.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(
                &mut can,
                self.context().cu_device(),
                peer.context().cu_device(),
            )
        })?;
        Ok(can != 0)
    }

    /// Lets this device's context access `peer`'s memory (same process); enabling twice is
    /// fine.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<()> {
        if self.info().ordinal == peer.info().ordinal {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both contexts are live primary contexts.
        match unsafe { sys::cuCtxEnablePeerAccess(peer.context().cu_ctx(), 0) } {
            CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            other => Err(CudaError::driver(
                "cuCtxEnablePeerAccess",
                cudarc::driver::DriverError(other),
            )),
        }
    }
}
