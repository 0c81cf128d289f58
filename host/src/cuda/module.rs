//! Loading the embedded kernels for a device: machine code (cubin) built for its arch, else
//! the best PTX the device can run.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::{CudaError, Gpu, Result};
use crate::settings::Settings;

/// Picks the PTX with the highest compute capability not above `device_cc` (both × 10):
/// PTX for sm_80 runs on sm_90 (the driver JIT-compiles it), not the other way round.
pub fn select_ptx<'a>(ptx: &[(u32, &'a str)], device_cc: u32) -> Option<(u32, &'a str)> {
    ptx.iter()
        .copied()
        .filter(|(cc, _)| *cc <= device_cc)
        .max_by_key(|(cc, _)| *cc)
}

/// Picks the cubin a device of compute capability `device_cc` runs (both × 10): machine
/// code for sm_XY runs on X.Z with Z ≥ Y only (same major version), so the newest one of
/// the device's major version not above it.
pub fn select_cubin<'a>(cubin: &[(u32, &'a [u8])], device_cc: u32) -> Option<(u32, &'a [u8])> {
    cubin
        .iter()
        .copied()
        .filter(|(cc, _)| *cc <= device_cc && *cc / 10 == device_cc / 10)
        .max_by_key(|(cc, _)| *cc)
}

/// Whether `code`, from loading a cubin, says the image does not suit this driver or device
/// (then the PTX may still load), rather than that loading failed (memory, context).
pub fn is_image_error(code: cudarc::driver::sys::CUresult) -> bool {
    use cudarc::driver::sys::CUresult as R;
    matches!(
        code,
        R::CUDA_ERROR_NO_BINARY_FOR_GPU
            | R::CUDA_ERROR_INVALID_IMAGE
            | R::CUDA_ERROR_INVALID_SOURCE
            | R::CUDA_ERROR_INVALID_PTX
            | R::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            | R::CUDA_ERROR_NOT_SUPPORTED
    )
}

/// The environment variable that picks the kind of kernel image [`KernelModule::load_images`]
/// loads: `auto` (the default: machine code when it was built for the device, else PTX),
/// `ptx` (always PTX: the driver compiles it, once per machine and driver, and caches it) or
/// `cubin` (machine code or an error).
pub const KERNEL_IMAGE_ENV: &str = "MSCCLPP_KERNEL_IMAGE";

/// What [`KERNEL_IMAGE_ENV`] asks for ([`Settings::kernel_image`]).
pub use crate::settings::ImagePolicy;

/// The kernel image this process's settings ask for.
fn image_policy() -> Result<ImagePolicy> {
    Settings::global()
        .map(|s| s.kernel_image)
        .map_err(|e| CudaError::InvalidArgument(e.to_string()))
}

/// The kind of image a [`KernelModule`] was loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// Machine code compiled by ptxas when the program was built.
    Cubin,
    /// PTX, compiled by the driver when loaded (its JIT cache keeps the result).
    Ptx,
}

/// A loaded kernel module, the arch it was built for and the kind of image it came from.
#[derive(Debug, Clone)]
pub struct KernelModule {
    module: Arc<CudaModule>,
    arch: u32,
    image: ImageKind,
    cubin_refused: Option<String>,
}

impl KernelModule {
    /// Loads the best of `ptx` (pairs of compute capability × 10 and PTX text, as
    /// `mscclpp-device-builder` generates) for `gpu`, whatever [`KERNEL_IMAGE_ENV`] says. PTX
    /// is compiled by the driver on the first load on each machine: prefer
    /// [`load_images`](Self::load_images) with the cubins the builder also generates.
    pub fn load(gpu: &Gpu, ptx: &[(u32, &str)]) -> Result<KernelModule> {
        KernelModule::load_ptx(gpu, ptx, None)
    }

    /// Loads the kernels for `gpu` from the builder's `PTX` and `CUBIN` lists: the cubin
    /// built for the device's arch when there is one (no JIT compilation: the first run on
    /// a machine starts as fast as the next ones), else the best PTX; as
    /// [`KERNEL_IMAGE_ENV`] says. With `auto`, a cubin the driver cannot use (one from a
    /// ptxas newer than the driver: an image error) is replaced by the PTX, said once per
    /// process on stderr, and [`cubin_refused`](Self::cubin_refused) says why; any other
    /// failure to load it (out of memory, a lost context) is returned as it is.
    pub fn load_images(
        gpu: &Gpu,
        ptx: &[(u32, &str)],
        cubin: &[(u32, &[u8])],
    ) -> Result<KernelModule> {
        let policy = image_policy()?;
        let (major, minor) = gpu.info().compute_capability;
        let cc = major * 10 + minor;
        if policy == ImagePolicy::Ptx {
            return KernelModule::load_ptx(gpu, ptx, None);
        }
        let Some((arch, image)) = select_cubin(cubin, cc) else {
            if policy == ImagePolicy::Cubin {
                return Err(CudaError::InvalidArgument(format!(
                    "{KERNEL_IMAGE_ENV}=cubin: no cubin for sm_{major}{minor} was given \
                     (cubins for: {:?}; a build without ptxas embeds none)",
                    cubin.iter().map(|(c, _)| *c).collect::<Vec<_>>()
                )));
            }
            return KernelModule::load_ptx(gpu, ptx, None);
        };
        let e = match gpu.context().load_module(Ptx::from_binary(image.to_vec())) {
            Ok(module) => {
                return Ok(KernelModule {
                    module,
                    arch,
                    image: ImageKind::Cubin,
                    cubin_refused: None,
                });
            }
            Err(e) => e,
        };
        let code = e.0;
        let refused = CudaError::driver("cuModuleLoadData (cubin)", e);
        if policy == ImagePolicy::Cubin || !is_image_error(code) {
            return Err(refused);
        }
        let why = format!("the driver cannot use the sm_{arch} cubin ({refused})");
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            crate::diag::eprint_line(&format!(
                "mscclpp: {why}; loading the PTX instead, which the driver compiles on the \
                 first run on each machine (about 30 s; set {KERNEL_IMAGE_ENV}=ptx to skip \
                 the cubin)"
            ))
        });
        KernelModule::load_ptx(gpu, ptx, Some(why))
    }

    /// The best PTX of `ptx` for `gpu`; `cubin_refused`: why a cubin was not used (kept
    /// for [`cubin_refused`](Self::cubin_refused); already said on stderr).
    fn load_ptx(
        gpu: &Gpu,
        ptx: &[(u32, &str)],
        cubin_refused: Option<String>,
    ) -> Result<KernelModule> {
        let (major, minor) = gpu.info().compute_capability;
        let (arch, text) =
            select_ptx(ptx, major * 10 + minor).ok_or_else(|| CudaError::NoPtxForArch {
                major,
                minor,
                built: ptx.iter().map(|(c, _)| *c).collect(),
            })?;
        let module = gpu
            .context()
            .load_module(Ptx::from_src(text))
            .map_err(|e| CudaError::driver("cuModuleLoadData", e))?;
        Ok(KernelModule {
            module,
            arch,
            image: ImageKind::Ptx,
            cubin_refused,
        })
    }

    /// Loads our own device crate's kernels ([`load_images`](Self::load_images)).
    pub fn load_builtin(gpu: &Gpu) -> Result<KernelModule> {
        KernelModule::load_images(gpu, crate::ptx::PTX, crate::ptx::CUBIN)
    }

    /// The arch (compute capability × 10) of the image that was loaded.
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// Whether machine code or PTX was loaded.
    pub fn image(&self) -> ImageKind {
        self.image
    }

    /// Why a fitting cubin was not used (the driver refused it), when PTX was loaded in its
    /// place.
    pub fn cubin_refused(&self) -> Option<&str> {
        self.cubin_refused.as_deref()
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
