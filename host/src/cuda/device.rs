//! Devices: presence, enumeration, primary contexts.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use cudarc::driver::sys::{CUdevice_attribute, CUresult};
use cudarc::driver::{CudaContext, CudaStream, DriverError, result};

use super::{CudaError, Result};

/// Whether libcuda can be loaded on this machine (no call into it is made otherwise).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn init() -> Result<()> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    match result::init() {
        Ok(()) => Ok(()),
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => {
            Err(CudaError::NoGpu("cuInit: CUDA_ERROR_NO_DEVICE".into()))
        }
        Err(e) => Err(CudaError::driver("cuInit", e)),
    }
}

/// Number of visible devices; [`CudaError::NoDriver`] without a driver, 0 devices is `Ok(0)`.
pub fn device_count() -> Result<usize> {
    match init() {
        Ok(()) => {}
        Err(CudaError::NoGpu(_)) => return Ok(0),
        Err(e) => return Err(e),
    }
    let n = result::device::get_count().map_err(|e| CudaError::driver("cuDeviceGetCount", e))?;
    Ok(n.max(0) as usize)
}

/// What the driver says about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Ordinal (as `CUDA_VISIBLE_DEVICES` numbers them).
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Global memory in bytes.
    pub total_memory: usize,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// PCI bus id, `domain:bus:device`.
    pub pci_bus_id: String,
}

/// Every visible device's [`GpuInfo`]; [`CudaError::NoDriver`] or [`CudaError::NoGpu`] when
/// there is nothing to list.
pub fn list_gpus() -> Result<Vec<GpuInfo>> {
    let n = device_count()?;
    if n == 0 {
        return Err(CudaError::NoGpu("cuDeviceGetCount returned 0".into()));
    }
    (0..n)
        .map(|i| Gpu::open(i).map(|g| g.info().clone()))
        .collect()
}

/// What a stream of [`Gpu::shared_stream`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamRole {
    /// Copies from device memory into host staging before a send (TCP puts).
    StageOut,
    /// Copies from host staging into device memory after a receive, and the flag writes
    /// that follow them (TCP receivers).
    StageIn,
}

/// One device with its primary context (shared with cudarc and the runtime API).
#[derive(Debug, Clone)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    info: GpuInfo,
}

impl Gpu {
    /// Opens device `ordinal`: typed errors when there is no driver, no device, or no
    /// device with that ordinal.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let count = device_count()?;
        if count == 0 {
            return Err(CudaError::NoGpu("cuDeviceGetCount returned 0".into()));
        }
        if ordinal >= count {
            return Err(CudaError::NoSuchGpu { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| CudaError::driver("cuDevicePrimaryCtxRetain", e))?;
        let attr = |a| {
            ctx.attribute(a)
                .map_err(|e| CudaError::driver("cuDeviceGetAttribute", e))
        };
        let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32;
        let minor = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32;
        let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let pci = format!(
            "{:04x}:{:02x}:{:02x}",
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
        );
        let info = GpuInfo {
            ordinal,
            name: ctx
                .name()
                .map_err(|e| CudaError::driver("cuDeviceGetName", e))?,
            compute_capability: (major, minor),
            total_memory: ctx
                .total_mem()
                .map_err(|e| CudaError::driver("cuDeviceTotalMem", e))?,
            multiprocessors: sms,
            pci_bus_id: pci,
        };
        Ok(Gpu { ctx, info })
    }

    /// The device's facts.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// The cudarc context (primary context of this device).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes this device's context current on the calling thread (raw driver calls need it).
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))
    }

    /// A new non-blocking stream on this device.
    pub fn new_stream(&self) -> Result<Arc<cudarc::driver::CudaStream>> {
        self.ctx
            .new_stream()
            .map_err(|e| CudaError::driver("cuStreamCreate", e))
    }

    /// The process's one stream for `role` on this device's context, created on first use
    /// and shared by every caller while any holds it.
    ///
    /// Why shared: the driver maps a process's streams onto a few hardware work queues
    /// (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default; fewer under MPS, whose clients share one
    /// pool). Beyond that many streams, two streams share a queue, and work queued on one
    /// waits for the other's. A proxy that queues copies and flag writes for a kernel that
    /// spins on another stream must not share that kernel's queue, or neither finishes. A
    /// stream per connection (as the TCP transport had: one per peer) passes that count from
    /// a few peers on; one stream per role keeps the process's streams few.
    pub(crate) fn shared_stream(&self, role: StreamRole) -> Result<Arc<CudaStream>> {
        static STREAMS: Mutex<Vec<(StreamRole, Weak<CudaStream>)>> = Mutex::new(Vec::new());
        let mut streams = STREAMS.lock().unwrap_or_else(PoisonError::into_inner);
        streams.retain(|(_, w)| w.strong_count() > 0);
        let found = streams
            .iter()
            .filter(|(r, _)| *r == role)
            .filter_map(|(_, w)| w.upgrade())
            .find(|s| **s.context() == *self.ctx);
        if let Some(s) = found {
            return Ok(s);
        }
        let s = self.new_stream()?;
        streams.push((role, Arc::downgrade(&s)));
        Ok(s)
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx
            .synchronize()
            .map_err(|e| CudaError::driver("cuCtxSynchronize", e))
    }
}
