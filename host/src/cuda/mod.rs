//! The CUDA layer: what the rest of the host crate needs from the driver, on `cudarc`.
//!
//! cudarc (driver API, loaded at run time, so the crate builds and runs without CUDA)
//! already gives safe contexts, streams, events, modules and launches; they are re-exported
//! here. This module wraps what cudarc leaves raw, in the three layers cudarc itself uses:
//! the `sys` calls, [`check`] turning a status into a [`CudaError`] that prints the
//! driver's own name and message, and RAII types:
//!
//! - [`Gpu`]: one device, its primary context and facts ([`GpuInfo`]);
//! - [`DeviceBuffer`]: `cuMemAlloc` memory (never the async pool, whose memory cannot be
//!   exported), with its CUDA IPC handle ([`IpcMemHandle`]) and [`PeerMapping`] to open one;
//! - [`MappedHostBuffer`]: pinned host memory mapped into the device, *not*
//!   write-combined (the CPU reads it: FIFOs, flags), with its device pointer;
//! - [`HostRegistration`]: memory the caller owns (a shared-memory segment) registered and
//!   mapped into the device (the P2P transport's `cpu` flag mode puts inbound counters
//!   there);
//! - [`KernelModule`]: the embedded kernels for a device: its cubin, else the best PTX.
//!
//! What is validated: driver presence and device ordinals (typed errors: [`CudaError::NoDriver`],
//! [`CudaError::NoGpu`], [`CudaError::NoSuchGpu`]), sizes and copy bounds of our buffers,
//! PTX availability for the device's arch. What is not: raw device pointers handed to
//! kernels; kernels are `unsafe` to launch for that reason.

mod device;
mod memory;
mod module;
mod ops;

pub use cudarc::driver::sys::CUevent_flags;
pub use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig,
    PushKernelArg,
};
pub(crate) use device::StreamRole;
pub use device::{Gpu, GpuInfo, device_count, driver_present, list_gpus};
pub use memory::{
    DeviceBuffer, DmaBuf, HostRegistration, IpcMemHandle, MappedHostBuffer, PeerMapping,
    dmabuf_for_range,
};
pub use module::{
    ImageKind, ImagePolicy, KERNEL_IMAGE_ENV, KernelModule, is_image_error, select_cubin,
    select_ptx,
};
pub use ops::{event_reached, memcpy_async, new_event, record_event, stream_idle, write_u64_async};

use cudarc::driver::DriverError;
use cudarc::driver::sys::CUresult;

/// Errors of the CUDA layer.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libcuda could not be loaded: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver: libcuda.so could not be loaded; install the NVIDIA driver, or use the \
         Host transport (which needs no GPU)"
    )]
    NoDriver,
    /// The driver loaded but reports no device.
    #[error("no GPU: the CUDA driver is present but reports no device ({0})")]
    NoGpu(String),
    /// A device ordinal beyond the devices present.
    #[error("no GPU with ordinal {ordinal}: {count} device(s) visible")]
    NoSuchGpu {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// A driver call failed.
    #[error("{call} failed: {name}: {message}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The status, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The driver's description of it.
        message: String,
        /// The raw status.
        code: CUresult,
    },
    /// The embedded PTX has no variant this device can run.
    #[error(
        "no PTX for compute capability {major}.{minor}: the device crate was built for {built:?}; \
         rebuild with MSCCLPP_PTX_ARCHES including sm_{major}{minor}"
    )]
    NoPtxForArch {
        /// Device major version.
        major: u32,
        /// Device minor version.
        minor: u32,
        /// The compute capabilities (× 10) the PTX was built for.
        built: Vec<u32>,
    },
    /// A bad size, offset or argument passed to this layer.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl CudaError {
    /// The error for a failed driver call, with the driver's name and message.
    pub fn driver(call: &'static str, err: DriverError) -> CudaError {
        // Asking the driver for its strings needs the driver: without one, the enum name.
        let present = device::driver_present();
        let name = present
            .then(|| err.error_name().ok())
            .flatten()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| format!("{:?}", err.0));
        let message = present
            .then(|| err.error_string().ok())
            .flatten()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        CudaError::Driver {
            call,
            name,
            message,
            code: err.0,
        }
    }
}

/// Turns a raw driver status into a `Result`, naming the call.
pub fn check(call: &'static str, status: CUresult) -> Result<(), CudaError> {
    status.result().map_err(|e| CudaError::driver(call, e))
}

/// Result of this layer.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;
