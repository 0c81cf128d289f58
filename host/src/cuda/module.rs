//! Loading the embedded PTX for the best arch a device can run.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::{CudaError, Gpu, Result};

/// Picks the PTX with the highest compute capability not above `device_cc` (both × 10):
/// PTX for sm_80 runs on sm_90 (the driver JIT-compiles it), not the other way round.
pub fn select_ptx<'a>(ptx: &[(u32, &'a str)], device_cc: u32) -> Option<(u32, &'a str)> {
    ptx.iter()
        .copied()
        .filter(|(cc, _)| *cc <= device_cc)
        .max_by_key(|(cc, _)| *cc)
}

/// A loaded PTX module and the arch it was built for.
#[derive(Debug, Clone)]
pub struct KernelModule {
    module: Arc<CudaModule>,
    arch: u32,
}

impl KernelModule {
    /// Loads the best of `ptx` (pairs of compute capability × 10 and PTX text, as
    /// `mscclpp-device-builder` generates) for `gpu`.
    pub fn load(gpu: &Gpu, ptx: &[(u32, &str)]) -> Result<KernelModule> {
        let (major, minor) = gpu.info().compute_capability;
        let cc = major * 10 + minor;
        let (arch, text) = select_ptx(ptx, cc).ok_or_else(|| CudaError::NoPtxForArch {
            major,
            minor,
            built: ptx.iter().map(|(c, _)| *c).collect(),
        })?;
        let module = gpu
            .context()
            .load_module(Ptx::from_src(text))
            .map_err(|e| CudaError::driver("cuModuleLoadData", e))?;
        Ok(KernelModule { module, arch })
    }

    /// Loads our own device crate's kernels.
    pub fn load_builtin(gpu: &Gpu) -> Result<KernelModule> {
        KernelModule::load(gpu, crate::ptx::PTX)
    }

    /// The arch (compute capability × 10) of the PTX that was loaded.
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// A kernel by its symbol (the function name given to `kernel!`).
    pub fn function(&self, name: &str) -> Result<CudaFunction> {
        self.module.load_function(name).map_err(|e| match e.0 {
            cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_FOUND => {
                CudaError::InvalidArgument(format!("no kernel named `{name}` in the module"))
            }
            _ => CudaError::driver("cuModuleGetFunction", e),
        })
    }
}
