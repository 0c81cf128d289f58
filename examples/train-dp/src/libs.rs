//! Finding cuBLAS (and, for `--compare nccl`, NCCL) at run time.
//!
//! cudarc 0.19 built for CUDA 12.8 opens cuBLAS by name only: `libcublas.so`, then
//! `libcublas.so.12`, `.11`, `.10`, `.9`, `.1` (and some Windows-style names), through
//! `libloading` = `dlopen(name, RTLD_LAZY | RTLD_LOCAL)`. CUDA 13's runtime packages (the
//! PyPI wheels PyTorch installs, `nvidia/cu13/lib/libcublas.so.13`) have none of those
//! names. Loading the file first with `RTLD_GLOBAL` does not help: glibc matches a later
//! `dlopen("libcublas.so")` against loaded objects by the name they were opened with and
//! their `DT_SONAME` (`libcublas.so.13`), so it would still search the path and fail. So,
//! as the perf tool does for NCCL, this module finds the file:
//!
//! 1. `MSCCLPP_CUBLAS_LIB`: the library file, or a folder holding `libcublas.so.13` /
//!    `.so.12` / `.so`;
//! 2. nothing, when one of cudarc's names already loads;
//! 3. `nvidia/cu13/lib`, `nvidia/cublas/lib`, `nvidia/cu12/lib` of every Python
//!    site-packages (`python3`'s `sys.path`, `VIRTUAL_ENV`, `CONDA_PREFIX`,
//!    `/opt/*/.venv` and `/opt/*` environments, the system and user folders);
//! 4. `CUDA_HOME/lib64`, `/usr/local/cuda*/lib64`, the system library folders;
//!
//! links `libcublas.so` (and `libcublasLt.so`) to it in a private folder of the temp
//! directory, and puts that folder and the file's own folder (for its `libcublasLt.so.13`
//! dependency) first on `LD_LIBRARY_PATH`. The local launcher's children get it in their
//! environment; a rank started by another launcher re-executes itself once with it (the
//! dynamic loader reads `LD_LIBRARY_PATH` only at process start). NCCL's part is the perf
//! tool's ([`mscclpp_perf::nccl`]), merged into the same variable.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::Error;

/// Names the cuBLAS library (a file, or a folder holding it).
pub const ENV_CUBLAS_LIB: &str = "MSCCLPP_CUBLAS_LIB";
/// Set once the ranks' environment has been prepared.
const ENV_PREPARED: &str = "TRAIN_DP_LIBS_PREPARED";
/// The cuBLAS file found, for the header.
pub const ENV_CUBLAS_FOUND: &str = "TRAIN_DP_CUBLAS_PATH";

const FILE_NAMES: [&str; 3] = ["libcublas.so.13", "libcublas.so.12", "libcublas.so"];
const WHEEL_DIRS: [&str; 3] = ["nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/cu12/lib"];

/// Whether one of cudarc's cuBLAS names loads in this process.
pub fn cublas_loadable() -> bool {
    // SAFETY: only dlopens (and closes) candidate libraries; no cuBLAS symbol is called.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

fn lib_in(dir: &Path) -> Option<PathBuf> {
    mscclpp::host::runtime_libs::file_in(dir, &FILE_NAMES)
}

fn search_dirs() -> Vec<PathBuf> {
    mscclpp::host::runtime_libs::search_dirs(&WHEEL_DIRS, true, &[])
}

/// Finds cuBLAS: `Ok(None)` when cudarc's names load as they are (see the
/// [module](self) for the order).
pub fn locate_cublas() -> Result<Option<PathBuf>, Error> {
    if let Some(v) = std::env::var_os(ENV_CUBLAS_LIB).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        if p.is_file() {
            return Ok(Some(p));
        }
        if p.is_dir()
            && let Some(f) = lib_in(&p)
        {
            return Ok(Some(f));
        }
        return Err(format!(
            "{ENV_CUBLAS_LIB}={}: no such library (give libcublas.so.13, or its folder)",
            p.display()
        )
        .into());
    }
    if cublas_loadable() {
        return Ok(None);
    }
    Ok(search_dirs().iter().find_map(|d| lib_in(d)))
}

/// Why cuBLAS cannot be loaded, with where it was looked for.
pub fn cublas_missing() -> String {
    let looked: Vec<String> = search_dirs()
        .iter()
        .filter(|d| d.parent().is_some_and(Path::exists))
        .map(|d| d.display().to_string())
        .collect();
    format!(
        "cuBLAS does not load: cudarc opens libcublas.so / libcublas.so.12 / .11 ... by name \
         (never .so.13), none is on this process's library path, and no libcublas.so.13/.12 \
         was found in {}. Set {ENV_CUBLAS_LIB}=/path/to/libcublas.so.13 (e.g. PyTorch's \
         site-packages/nvidia/cu13/lib) and start train-dp alone, or put a libcublas.so on \
         LD_LIBRARY_PATH",
        if looked.is_empty() {
            "the usual places".to_string()
        } else {
            looked.join(", ")
        }
    )
}

#[cfg(target_os = "linux")]
fn own_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// A private folder where `libcublas.so` (and `libcublasLt.so`, when a sibling exists)
/// link to `lib` and its sibling.
#[cfg(target_os = "linux")]
fn shim_dir(lib: &Path) -> Result<PathBuf, Error> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let lib = std::fs::canonicalize(lib).unwrap_or_else(|_| lib.to_path_buf());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    lib.hash(&mut h);
    let uid = own_uid().unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("train-dp-cublas-{uid}-{:016x}", h.finish()));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display()).into()),
    }
    // Only a folder of ours, writable by us alone, may decide which library loads.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || Some(meta.uid()) != own_uid() || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a private folder of this user; remove it",
            dir.display()
        )
        .into());
    }
    let mut links = vec![("libcublas.so", lib.clone())];
    let name = lib.file_name().map(|n| n.to_string_lossy().to_string());
    if let (Some(parent), Some(name)) = (lib.parent(), name) {
        let lt = parent.join(name.replace("libcublas", "libcublasLt"));
        if lt.is_file() {
            links.push(("libcublasLt.so", lt));
        }
    }
    for (link, target) in links {
        let tmp = dir.join(format!("{link}.tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)
            .map_err(|e| format!("cannot link {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join(link))
            .map_err(|e| format!("cannot link {}/{link}: {e}", dir.display()))?;
    }
    Ok(dir)
}

#[cfg(not(target_os = "linux"))]
fn shim_dir(lib: &Path) -> Result<PathBuf, Error> {
    Err(format!(
        "found {} but cannot make it loadable on this platform",
        lib.display()
    )
    .into())
}

/// Environment that makes cuBLAS (and NCCL with `nccl`) loadable in processes started with
/// it; empty when nothing is needed.
pub fn child_env(nccl: bool) -> Result<Vec<(OsString, OsString)>, Error> {
    if std::env::var_os(ENV_PREPARED).is_some() {
        return Ok(Vec::new());
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    if let Some(lib) = locate_cublas()? {
        dirs.push(shim_dir(&lib)?);
        if let Some(parent) = lib.parent() {
            dirs.push(parent.to_path_buf());
        }
        env.push((ENV_CUBLAS_FOUND.into(), lib.into_os_string()));
    }
    let mut rest = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty());
    if nccl {
        for (k, v) in mscclpp_perf::nccl::child_env()? {
            if k == "LD_LIBRARY_PATH" {
                // NCCL's folder first, then the old path.
                rest = Some(v);
            } else {
                env.push((k, v));
            }
        }
    }
    if dirs.is_empty() && env.is_empty() {
        return Ok(Vec::new());
    }
    let mut path = OsString::new();
    for d in &dirs {
        if !path.is_empty() {
            path.push(":");
        }
        path.push(d.as_os_str());
    }
    if let Some(r) = rest {
        if !path.is_empty() {
            path.push(":");
        }
        path.push(r);
    }
    env.push(("LD_LIBRARY_PATH".into(), path));
    env.push((ENV_PREPARED.into(), "1".into()));
    Ok(env)
}

/// For a rank started by another launcher: when the libraries need `LD_LIBRARY_PATH`,
/// re-executes this program with it (returns only on error or when nothing was needed).
/// Call before any thread starts.
#[cfg(unix)]
pub fn reexec_if_needed(nccl: bool) -> Result<(), Error> {
    use std::os::unix::process::CommandExt;
    let env = child_env(nccl)?;
    if env.is_empty() {
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let err = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .envs(env)
        .exec();
    Err(format!(
        "cannot re-execute {} with the libraries' folders: {err}",
        exe.display()
    )
    .into())
}

#[cfg(not(unix))]
pub fn reexec_if_needed(_nccl: bool) -> Result<(), Error> {
    Ok(())
}
