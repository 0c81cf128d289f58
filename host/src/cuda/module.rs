//! Loading the embedded kernels for a device: machine code (cubin) built for its arch, else
//! the best PTX the device can run.

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

/// The environment variable that picks the kind of kernel image [`KernelModule::load_images`]
/// loads: `auto` (the default: machine code when it was built for the device, else PTX),
/// `ptx` (always PTX: the driver compiles it, once per machine and driver, and caches it) or
/// `cubin` (machine code or an error).
pub const KERNEL_IMAGE_ENV: &str = "MSCCLPP_KERNEL_IMAGE";

/// What [`KERNEL_IMAGE_ENV`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImagePolicy {
    /// A cubin when one fits the device and the driver takes it, else PTX.
    Auto,
    /// PTX only.
    Ptx,
    /// A cubin only.
    Cubin,
}

impl ImagePolicy {
    /// Reads `value` (of [`KERNEL_IMAGE_ENV`]; `None` or blank: `auto`).
    pub fn parse(value: Option<&str>) -> Result<ImagePolicy> {
        match value.map(str::trim) {
            None | Some("") | Some("auto") => Ok(ImagePolicy::Auto),
            Some("ptx") => Ok(ImagePolicy::Ptx),
            Some("cubin") => Ok(ImagePolicy::Cubin),
            Some(v) => Err(CudaError::InvalidArgument(format!(
                "{KERNEL_IMAGE_ENV}={v:?}: expected auto, ptx or cubin"
            ))),
        }
    }

    fn from_env() -> Result<ImagePolicy> {
        match std::env::var(KERNEL_IMAGE_ENV) {
            Ok(v) => ImagePolicy::parse(Some(&v)),
            Err(std::env::VarError::NotPresent) => Ok(ImagePolicy::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(CudaError::InvalidArgument(format!(
                "{KERNEL_IMAGE_ENV}={v:?}: expected auto, ptx or cubin"
            ))),
        }
    }
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
    /// `mscclpp-device-builder` generates) for `gpu`. PTX is compiled by the driver on the
    /// first load on each machine: prefer [`load_images`](Self::load_images) with the cubins
    /// the builder also generates.
    pub fn load(gpu: &Gpu, ptx: &[(u32, &str)]) -> Result<KernelModule> {
        KernelModule::load_images(gpu, ptx, &[])
    }

    /// Loads the kernels for `gpu` from the builder's `PTX` and `CUBIN` lists: the cubin
    /// built for the device's arch when there is one (no JIT compilation: the first run on
    /// a machine starts as fast as the next ones), else the best PTX; as
    /// [`KERNEL_IMAGE_ENV`] says. With `auto`, a cubin the driver refuses (one from a
    /// ptxas newer than the driver) is replaced by the PTX, and
    /// [`cubin_refused`](Self::cubin_refused) says why.
    pub fn load_images(
        gpu: &Gpu,
        ptx: &[(u32, &str)],
        cubin: &[(u32, &[u8])],
    ) -> Result<KernelModule> {
        let policy = ImagePolicy::from_env()?;
        let (major, minor) = gpu.info().compute_capability;
        let cc = major * 10 + minor;
        let mut cubin_refused = None;
        if policy != ImagePolicy::Ptx {
            match select_cubin(cubin, cc) {
                Some((arch, image)) => {
                    match gpu.context().load_module(Ptx::from_binary(image.to_vec())) {
                        Ok(module) => {
                            return Ok(KernelModule {
                                module,
                                arch,
                                image: ImageKind::Cubin,
                                cubin_refused: None,
                            });
                        }
                        Err(e) if policy == ImagePolicy::Cubin => {
                            return Err(CudaError::driver("cuModuleLoadData (cubin)", e));
                        }
                        Err(e) => {
                            cubin_refused = Some(format!(
                                "the driver refused the sm_{arch} cubin \
                                 ({}); loaded the PTX instead",
                                CudaError::driver("cuModuleLoadData", e)
                            ))
                        }
                    }
                }
                None if policy == ImagePolicy::Cubin => {
                    return Err(CudaError::InvalidArgument(format!(
                        "{KERNEL_IMAGE_ENV}=cubin: no cubin for sm_{major}{minor} is embedded \
                         (built: {:?}; a build without ptxas embeds none)",
                        cubin.iter().map(|(c, _)| *c).collect::<Vec<_>>()
                    )));
                }
                None => {}
            }
        }
        let (arch, text) = select_ptx(ptx, cc).ok_or_else(|| CudaError::NoPtxForArch {
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
