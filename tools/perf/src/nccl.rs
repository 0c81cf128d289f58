//! NCCL for `--compare nccl`: found at run time, loaded through cudarc, initialised with a
//! unique id broadcast over our bootstrap, run on the same device buffers as ours.
//!
//! # Finding the library
//!
//! cudarc's loader tries `libnccl.so` and a few versioned names (`libnccl.so.12`, `.11`,
//! `.10`, `.9`, `.1`) on the ordinary library search path, but never `libnccl.so.2`, the
//! only name NCCL's runtime packages ship (Debian's `libnccl2`, PyPI's
//! `nvidia-nccl-cu12`/`cu13`). So, when cudarc's names do not load, or when
//! `MSCCLPP_NCCL_LIB` names a library, the tool finds the file itself:
//!
//! 1. `MSCCLPP_NCCL_LIB`: the library file, or a directory holding `libnccl.so.2`;
//! 2. the `nvidia/nccl/lib` (also `nvidia/cu13/lib`, `nvidia/cu12/lib`) folder of every Python
//!    site-packages (`python3`'s `sys.path`, `VIRTUAL_ENV`, `CONDA_PREFIX`, the usual
//!    system and user folders);
//! 3. `NCCL_HOME/lib`, `CUDA_HOME/lib64`, `/usr/local/cuda/lib64`, the system library folders.
//!
//! It then links `libnccl.so` to that file in a private folder of the temp directory and
//! puts the folder first on `LD_LIBRARY_PATH` of the ranks: the local launcher's children
//! get it in their environment; a rank started by another launcher re-executes itself once
//! with it (the dynamic loader reads `LD_LIBRARY_PATH` only at process start).

use std::cell::Cell;
use std::ffi::{CStr, OsString};
use std::path::{Path, PathBuf};

use cudarc::nccl::{result, sys};

use crate::host::bootstrap::BlockingBootstrap;
use crate::host::collectives::{DataType, PreMulScalar, ReduceOp};
use crate::host::cuda::{CudaStream, Gpu};

use super::PerfError;
use crate::host::settings::{NcclLib as NcclChoice, Settings};

/// Names the NCCL library (a file, or a directory holding `libnccl.so.2`).
pub const ENV_NCCL_LIB: &str = "MSCCLPP_NCCL_LIB";
/// Set in the environment once the ranks' `LD_LIBRARY_PATH` has been prepared.
const ENV_PREPARED: &str = "MSCCLPP_PERF_NCCL_PREPARED";
/// The file found, for the header.
const ENV_FOUND: &str = "MSCCLPP_PERF_NCCL_PATH";

/// Where NCCL comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NcclLib {
    /// One of cudarc's names loads as it is.
    ByName,
    /// This file, which cudarc's names do not reach.
    File(PathBuf),
}

/// Whether one of cudarc's library names loads now.
pub fn loadable_by_name() -> bool {
    // SAFETY: only dlopens (and closes) candidate libraries; no NCCL symbol is called.
    unsafe { sys::is_culib_present() }
}

/// The file names tried in a folder.
const FILE_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];
/// Sub-folders of a Python site-packages holding NCCL's PyPI wheels.
const WHEEL_DIRS: [&str; 3] = ["nvidia/nccl/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"];

fn lib_in(dir: &Path) -> Option<PathBuf> {
    crate::host::runtime_libs::file_in(dir, &FILE_NAMES)
}

/// Every folder searched, in order.
fn search_dirs() -> Vec<PathBuf> {
    let mut extra: Vec<PathBuf> = std::env::var_os("NCCL_HOME")
        .map(|h| PathBuf::from(h).join("lib"))
        .into_iter()
        .collect();
    extra.push(PathBuf::from("/usr/local/nccl/lib"));
    crate::host::runtime_libs::search_dirs(&WHEEL_DIRS, true, &extra)
}

/// This process's settings, or the error naming the variables that do not parse.
fn settings() -> Result<&'static Settings, PerfError> {
    Settings::global().map_err(|e| PerfError::Nccl(e.to_string()))
}

/// The library `MSCCLPP_NCCL_LIB` names: the file, or `libnccl.so.2` in the folder.
fn lib_at(p: &Path) -> Result<NcclLib, PerfError> {
    if p.is_file() {
        return Ok(NcclLib::File(p.to_path_buf()));
    }
    if p.is_dir()
        && let Some(f) = lib_in(p)
    {
        return Ok(NcclLib::File(f));
    }
    Err(PerfError::Nccl(format!(
        "{ENV_NCCL_LIB}={}: no such library (give the path of libnccl.so.2, or a folder \
         holding it)",
        p.display()
    )))
}

/// Finds NCCL (see the [module](self) for the order).
pub fn locate() -> Result<NcclLib, PerfError> {
    match &settings()?.nccl_lib {
        NcclChoice::Search => {}
        NcclChoice::Off => {
            return Err(PerfError::Nccl(format!(
                "{ENV_NCCL_LIB} says none, but comparing with NCCL needs it (unset it, or give \
                 the path of libnccl.so.2)"
            )));
        }
        NcclChoice::Path(p) => return lib_at(p),
    }
    if loadable_by_name() {
        return Ok(NcclLib::ByName);
    }
    let dirs = search_dirs();
    if let Some(f) = dirs.iter().find_map(|d| lib_in(d)) {
        return Ok(NcclLib::File(f));
    }
    let shown: Vec<String> = dirs
        .iter()
        .filter(|d| d.parent().is_some_and(Path::exists))
        .map(|d| d.display().to_string())
        .collect();
    Err(PerfError::Nccl(format!(
        "--compare nccl: NCCL not found. cudarc loads libnccl.so (or libnccl.so.12/.11/.10/.9/.1) \
         from the library search path (LD_LIBRARY_PATH, ld.so.cache) and none loaded; no \
         libnccl.so.2 in {}{}. Install NCCL (`pip install nvidia-nccl-cu12`, or the libnccl2 \
         package) or set {ENV_NCCL_LIB}=/path/to/libnccl.so.2",
        if shown.is_empty() {
            "the usual places".to_string()
        } else {
            shown.join(", ")
        },
        if std::process::Command::new("python3")
            .arg("-V")
            .output()
            .is_err()
        {
            " (python3 not found, so no Python site-packages were asked for)"
        } else {
            ""
        }
    )))
}

/// Our uid, read from `/proc/self` (owned by the process's user).
#[cfg(target_os = "linux")]
fn own_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// A private folder in which `libnccl.so` links to `lib`, for `LD_LIBRARY_PATH`.
#[cfg(target_os = "linux")]
pub fn shim_dir(lib: &Path) -> Result<PathBuf, PerfError> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let lib = std::fs::canonicalize(lib).unwrap_or_else(|_| lib.to_path_buf());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    lib.hash(&mut h);
    let uid = own_uid().unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("mscclpp-nccl-{uid}-{:016x}", h.finish()));
    let io = |what: String| move |e| PerfError::Io { what, source: e };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(format!("cannot create {}", dir.display()))(e)),
    }
    // Only a folder of ours, writable by us alone, may decide which library loads.
    let meta = std::fs::symlink_metadata(&dir).map_err(io(format!("{}", dir.display())))?;
    if !meta.is_dir() || Some(meta.uid()) != own_uid() || meta.mode() & 0o022 != 0 {
        return Err(PerfError::Nccl(format!(
            "{} is not a private folder of this user; remove it",
            dir.display()
        )));
    }
    let tmp = dir.join(format!("libnccl.so.tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&lib, &tmp).map_err(io(format!("cannot link {}", tmp.display())))?;
    std::fs::rename(&tmp, dir.join("libnccl.so"))
        .map_err(io(format!("cannot link {}/libnccl.so", dir.display())))?;
    Ok(dir)
}

/// Not Linux: no shim; cudarc's names must load as they are.
#[cfg(not(target_os = "linux"))]
pub fn shim_dir(lib: &Path) -> Result<PathBuf, PerfError> {
    Err(PerfError::Nccl(format!(
        "found {} but cannot make it loadable on this platform; put it on the library path \
         as libnccl.so",
        lib.display()
    )))
}

/// Environment that makes NCCL loadable in processes started with it; empty when cudarc's
/// names already load (and `MSCCLPP_NCCL_LIB` is not set).
pub fn child_env() -> Result<Vec<(OsString, OsString)>, PerfError> {
    if settings()?.perf_nccl_prepared {
        return Ok(Vec::new());
    }
    match locate()? {
        NcclLib::ByName => Ok(Vec::new()),
        NcclLib::File(lib) => {
            let dir = shim_dir(&lib)?;
            let mut path = OsString::from(dir.as_os_str());
            if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
                path.push(":");
                path.push(old);
            }
            Ok(vec![
                ("LD_LIBRARY_PATH".into(), path),
                (ENV_PREPARED.into(), "1".into()),
                (ENV_FOUND.into(), lib.into_os_string()),
            ])
        }
    }
}

/// For a rank started by another launcher: when NCCL needs `LD_LIBRARY_PATH`, re-executes
/// this program with it (returns only on error or when nothing was needed). Call before any
/// thread starts.
#[cfg(unix)]
pub fn reexec_if_needed() -> Result<(), PerfError> {
    use std::os::unix::process::CommandExt;
    let env = child_env()?;
    if env.is_empty() {
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(|e| PerfError::Io {
        what: "cannot find the current executable".into(),
        source: e,
    })?;
    let err = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .envs(env)
        .exec();
    Err(PerfError::Io {
        what: format!("cannot re-execute {} with NCCL's folder", exe.display()),
        source: err,
    })
}

/// Not Unix: nothing to do; loading fails with the reason if the names do not load.
#[cfg(not(unix))]
pub fn reexec_if_needed() -> Result<(), PerfError> {
    Ok(())
}

/// The library file the ranks were prepared with, if any (for the header).
pub fn found_path() -> Option<String> {
    Settings::global_or_default().perf_nccl_path.clone()
}

fn nccl_err(call: &str, e: result::NcclError) -> PerfError {
    // SAFETY: ncclGetErrorString returns a static string for any code.
    let msg = unsafe { CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    PerfError::Nccl(format!("{call}: {:?}: {}", e.0, msg.to_string_lossy()))
}

fn ensure_loadable() -> Result<(), PerfError> {
    if loadable_by_name() {
        Ok(())
    } else {
        Err(PerfError::Nccl(
            "NCCL does not load in this rank (libnccl.so is not on its library path); run \
             mscclpp-perf alone (it prepares its ranks), or set MSCCLPP_NCCL_LIB, or put a \
             libnccl.so on LD_LIBRARY_PATH"
                .into(),
        ))
    }
}

/// NCCL's version as `major.minor.patch`.
pub fn version() -> Result<String, PerfError> {
    ensure_loadable()?;
    let v = result::get_nccl_version().map_err(|e| nccl_err("ncclGetVersion", e))?;
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    Ok(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100))
}

/// An NCCL communicator over the same ranks as our bootstrap.
#[derive(Debug)]
pub struct Nccl {
    comm: sys::ncclComm_t,
    /// The pre-multiplied sum of `-o mulsum` (its scalar, and NCCL's operation), made by the
    /// first call that needs it and destroyed with the communicator.
    premul: Cell<Option<(PreMulScalar, sys::ncclRedOp_t)>>,
}

/// NCCL's type for `dtype`.
pub fn nccl_type(dtype: DataType) -> sys::ncclDataType_t {
    match dtype {
        DataType::F32 => sys::ncclDataType_t::ncclFloat32,
        DataType::F16 => sys::ncclDataType_t::ncclFloat16,
        DataType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        DataType::F64 => sys::ncclDataType_t::ncclFloat64,
        DataType::I8 => sys::ncclDataType_t::ncclInt8,
        DataType::U8 => sys::ncclDataType_t::ncclUint8,
        DataType::I32 => sys::ncclDataType_t::ncclInt32,
        DataType::U32 => sys::ncclDataType_t::ncclUint32,
        DataType::I64 => sys::ncclDataType_t::ncclInt64,
        DataType::U64 => sys::ncclDataType_t::ncclUint64,
        // NCCL 2.24 and later.
        DataType::Fp8E4M3 => sys::ncclDataType_t::ncclFloat8e4m3,
        DataType::Fp8E5M2 => sys::ncclDataType_t::ncclFloat8e5m2,
    }
}

/// NCCL's built-in operation for `op` (NCCL's average, like ours, is the sum divided by the
/// number of ranks; for floats it multiplies each input by `1/nranks` first); `None` for a
/// pre-multiplied sum, which NCCL makes per communicator (`Nccl` makes it at its first
/// call).
pub fn nccl_op(op: ReduceOp) -> Option<sys::ncclRedOp_t> {
    Some(match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Prod => sys::ncclRedOp_t::ncclProd,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::PreMulSum(_) => return None,
    })
}

impl Nccl {
    /// `ncclCommInitRank` on `gpu` with a unique id made by rank 0 and broadcast over
    /// `bootstrap` (collective: every rank calls it).
    pub fn init(bootstrap: &BlockingBootstrap, gpu: &Gpu) -> Result<Nccl, PerfError> {
        ensure_loadable()?;
        gpu.bind()?;
        let mine = if bootstrap.rank() == 0 {
            let id = result::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
            id.internal.iter().map(|&c| c as u8).collect()
        } else {
            Vec::new()
        };
        let bytes = bootstrap.broadcast(0, &mine)?;
        let mut internal = [0 as std::ffi::c_char; 128];
        if bytes.len() != internal.len() {
            return Err(PerfError::Nccl(format!(
                "NCCL unique id of {} bytes from rank 0 (expected 128)",
                bytes.len()
            )));
        }
        for (d, s) in internal.iter_mut().zip(&bytes) {
            *d = *s as std::ffi::c_char;
        }
        let id = sys::ncclUniqueId { internal };
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the id is the one rank 0 created; the
        // device's context is current on this thread.
        unsafe {
            result::comm_init_rank(
                &mut comm,
                bootstrap.nranks() as i32,
                id,
                bootstrap.rank() as i32,
            )
        }
        .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        Ok(Nccl {
            comm,
            premul: Cell::new(None),
        })
    }

    /// NCCL's operation for `op`: a built-in one, or for a pre-multiplied sum by a host
    /// scalar `ncclRedOpCreatePreMulSum` (`ncclScalarHostImmediate`), made once. The tool
    /// runs one scalar per communicator (`-o mulsum`: the rank's own).
    fn op(&self, op: ReduceOp) -> Result<sys::ncclRedOp_t, PerfError> {
        let scalar = match (nccl_op(op), op) {
            (Some(builtin), _) => return Ok(builtin),
            (None, ReduceOp::PreMulSum(scalar)) => scalar,
            (None, _) => unreachable!("nccl_op names every operation but PreMulSum"),
        };
        match self.premul.get() {
            Some((made_for, made)) if made_for == scalar => return Ok(made),
            Some(_) => {
                return Err(PerfError::Nccl(
                    "one pre-multiplied sum per NCCL communicator: the tool made one with \
                     another scalar"
                        .into(),
                ));
            }
            None => {}
        }
        let PreMulScalar::Host { dtype, mut bits } = scalar else {
            return Err(PerfError::Nccl(
                "the tool compares pre-multiplied sums by a host scalar only".into(),
            ));
        };
        // NCCL writes an int: read as u32 first, since cudarc's enum names only some values.
        let mut raw: u32 = u32::MAX;
        // SAFETY: `raw` is a valid out-pointer of the enum's size (repr(u32)) and is read
        // only as a u32; `bits` holds the scalar in its low bytes (little-endian), read
        // before the call returns (host immediate); the communicator is live.
        let r = unsafe {
            sys::ncclRedOpCreatePreMulSum(
                &mut raw as *mut u32 as *mut sys::ncclRedOp_t,
                &mut bits as *mut u64 as *mut std::ffi::c_void,
                nccl_type(dtype),
                sys::ncclScalarResidence_t::ncclScalarHostImmediate,
                self.comm,
            )
        };
        if r != sys::ncclResult_t::ncclSuccess {
            return Err(nccl_err("ncclRedOpCreatePreMulSum", result::NcclError(r)));
        }
        // A communicator's first user operation is ncclNumOps (NCCL numbers them from it).
        if raw != sys::ncclRedOp_t::ncclNumOps as u32 {
            return Err(PerfError::Nccl(format!(
                "ncclRedOpCreatePreMulSum made operation {raw}; the tool expects the \
                 communicator's first, {}",
                sys::ncclRedOp_t::ncclNumOps as u32
            )));
        }
        let made = sys::ncclRedOp_t::ncclNumOps;
        self.premul.set(Some((scalar, made)));
        Ok(made)
    }

    /// `ncclAllReduce` (`op`) of `count` elements, stream-ordered.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory valid for `count` elements until the stream
    /// has run the operation.
    pub unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), PerfError> {
        let op = self.op(op)?;
        // SAFETY: the caller guarantees the buffers; the communicator and stream are live.
        unsafe {
            result::all_reduce(
                send as *const _,
                recv as *mut _,
                count,
                nccl_type(dtype),
                op,
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_err("ncclAllReduce", e))
    }

    /// `ncclReduceScatter` (`op`) of `recv_count` elements per rank, stream-ordered.
    ///
    /// # Safety
    /// `send` valid for `nranks * recv_count` elements and `recv` for `recv_count`, until
    /// the stream has run the operation.
    pub unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), PerfError> {
        let op = self.op(op)?;
        // SAFETY: as for `all_reduce`.
        unsafe {
            result::reduce_scatter(
                send as *const _,
                recv as *mut _,
                recv_count,
                nccl_type(dtype),
                op,
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_err("ncclReduceScatter", e))
    }

    /// `ncclBroadcast` of `count` elements from `root`, stream-ordered.
    ///
    /// # Safety
    /// As for `all_reduce`.
    pub unsafe fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), PerfError> {
        // SAFETY: as for `all_reduce`.
        unsafe {
            result::broadcast(
                send as *const _,
                recv as *mut _,
                count,
                nccl_type(dtype),
                root as i32,
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_err("ncclBroadcast", e))
    }

    /// `ncclReduce` (`op`) of `count` elements to `root`, stream-ordered.
    ///
    /// # Safety
    /// As for `all_reduce`.
    #[allow(clippy::too_many_arguments)] // NCCL's own parameters, one each
    pub unsafe fn reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), PerfError> {
        let op = self.op(op)?;
        // SAFETY: as for `all_reduce`.
        unsafe {
            result::reduce(
                send as *const _,
                recv as *mut _,
                count,
                nccl_type(dtype),
                op,
                root as i32,
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_err("ncclReduce", e))
    }

    /// All-to-all of `count` elements per peer as nccl-tests runs it: one group of a send
    /// and a receive per rank, stream-ordered.
    ///
    /// # Safety
    /// `send` and `recv` valid for `nranks * count` elements, until the stream has run the
    /// operation.
    pub unsafe fn all_to_all(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        nranks: usize,
        stream: &CudaStream,
    ) -> Result<(), PerfError> {
        let bytes = (count * dtype.size()) as u64;
        let ops: Vec<(bool, u64, usize)> = (0..nranks)
            .flat_map(|p| {
                [
                    (true, send + p as u64 * bytes, p),
                    (false, recv + p as u64 * bytes, p),
                ]
            })
            .collect();
        // SAFETY: as for `all_reduce`; every block lies in its buffer.
        unsafe { self.group(&ops, count, dtype, stream) }
    }

    /// Send to `next` and receive from `prev` in one group, stream-ordered.
    ///
    /// # Safety
    /// `send` and `recv` valid for `count` elements until the stream has run the operation.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn send_recv(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        next: usize,
        prev: usize,
        stream: &CudaStream,
    ) -> Result<(), PerfError> {
        // SAFETY: forwarded.
        unsafe {
            self.group(
                &[(true, send, next), (false, recv, prev)],
                count,
                dtype,
                stream,
            )
        }
    }

    /// `ncclSend`/`ncclRecv` of `count` elements each (`(send, address, peer)`) between
    /// `ncclGroupStart` and `ncclGroupEnd`.
    ///
    /// # Safety
    /// Every address valid for `count` elements until the stream has run the group.
    unsafe fn group(
        &self,
        ops: &[(bool, u64, usize)],
        count: usize,
        dtype: DataType,
        stream: &CudaStream,
    ) -> Result<(), PerfError> {
        let s = stream.cu_stream() as sys::cudaStream_t;
        result::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let mut first_err = None;
        for &(is_send, buf, peer) in ops {
            // SAFETY: caller contract; the communicator and stream are live.
            let r = unsafe {
                if is_send {
                    result::send(
                        buf as *const _,
                        count,
                        nccl_type(dtype),
                        peer as i32,
                        self.comm,
                        s,
                    )
                    .map_err(|e| nccl_err("ncclSend", e))
                } else {
                    result::recv(
                        buf as *mut _,
                        count,
                        nccl_type(dtype),
                        peer as i32,
                        self.comm,
                        s,
                    )
                    .map_err(|e| nccl_err("ncclRecv", e))
                }
            };
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        // End the group whatever happened, so NCCL leaves group mode.
        let end = result::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        match first_err {
            Some(e) => Err(e),
            None => end.map(|_| ()),
        }
    }

    /// `ncclAllGather` of `send_count` elements per rank, stream-ordered.
    ///
    /// # Safety
    /// `send` valid for `send_count` elements and `recv` for `nranks * send_count`, until
    /// the stream has run the operation.
    pub unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        dtype: DataType,
        stream: &CudaStream,
    ) -> Result<(), PerfError> {
        // SAFETY: as for `all_reduce`.
        unsafe {
            result::all_gather(
                send as *const _,
                recv as *mut _,
                send_count,
                nccl_type(dtype),
                self.comm,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map(|_| ())
        .map_err(|e| nccl_err("ncclAllGather", e))
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if let Some((_, op)) = self.premul.get() {
            // SAFETY: made on this communicator, used by no call after this.
            let _ = unsafe { sys::ncclRedOpDestroy(op, self.comm) };
        }
        // SAFETY: the communicator is live and used by nothing else after this.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}
