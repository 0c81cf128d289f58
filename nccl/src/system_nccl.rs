//! The real NCCL, loaded at run time for what is not native.
//!
//! # Finding it
//!
//! 1. `MSCCLPP_NCCL_LIB`: the library file, or a folder holding `libnccl.so.2` (or
//!    `libnccl.so`); `none` (or `off`, `0`) turns the fallback off. When set, nothing else is
//!    tried.
//! 2. A `libnccl.so.2` (or `libnccl.so`) the process has already loaded (the program's own
//!    dependency: nccl-tests, PyTorch): `dlopen(RTLD_NOLOAD)` returns it.
//! 3. `libnccl.so.2` on the library search path (`LD_LIBRARY_PATH`, `ld.so.cache`).
//! 4. The `nvidia/nccl/lib` (also `nvidia/cu13/lib`, `nvidia/cu12/lib`) folder of Python
//!    site-packages (`lib/python3*/site-packages` under `VIRTUAL_ENV`, `CONDA_PREFIX`, the
//!    prefix of the running executable, `/usr`, `/usr/local`, `~/.local`, and `PYTHONPATH`),
//!    then `NCCL_HOME/lib`, `CUDA_HOME/lib64`, `/usr/local/cuda/lib64` and the system library
//!    folders. (The same places as the perf tool's finder, `tools/perf/src/nccl.rs`, without
//!    running `python3` from inside the host process.)
//!
//! A library we open ourselves is opened `RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND`, and every
//! symbol is looked up on its handle (`dlsym(handle, ..)`), so that under `LD_PRELOAD` neither
//! we nor it resolve NCCL's names to this library. A candidate that is this library (it
//! exports [`MARKER`]) is refused.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::os::unix::Library;
use mscclpp_host::settings::Settings;

use crate::error::Failure;
use crate::types::{NcclConfig, NcclResult, result};

/// A symbol only this library exports, to recognise it among candidates.
pub const MARKER: &str = "mscclpp_nccl_is_not_nccl";

/// `ncclUniqueId` by value (128 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawUniqueId {
    /// The bytes.
    pub internal: [c_char; 128],
}

/// `ncclTeam_t` (NCCL 2.28's device API): returned by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Team {
    /// Ranks in the team.
    pub n_ranks: c_int,
    /// This rank's place.
    pub rank: c_int,
    /// Stride between team ranks in the world.
    pub stride: c_int,
}

/// An opaque pointer (communicator, stream, window, ...).
pub type Ptr = *mut c_void;
type R = c_int;

macro_rules! real_fns {
    ($($field:ident = $sym:literal : fn($($t:ty),*) -> $r:ty;)*) => {
        /// The real NCCL's entry points (`None`: not exported by that version).
        #[allow(missing_docs)]
        #[derive(Debug, Clone, Copy)]
        pub struct RealFns {
            $(pub $field: Option<unsafe extern "C" fn($($t),*) -> $r>,)*
        }

        impl RealFns {
            /// Looks every entry point up on the handle.
            ///
            /// # Safety
            /// `lib` is an NCCL 2.x library (the types above are its ABI) and outlives the
            /// pointers.
            unsafe fn load(lib: &Library) -> RealFns {
                RealFns {
                    $(
                        // SAFETY: dlsym on the handle; the type is NCCL's signature.
                        $field: unsafe {
                            lib.get::<unsafe extern "C" fn($($t),*) -> $r>($sym)
                                .ok()
                                .map(|s| *s)
                        },
                    )*
                }
            }
        }
    };
}

real_fns! {
    get_version = "ncclGetVersion": fn(*mut c_int) -> R;
    get_unique_id = "ncclGetUniqueId": fn(*mut RawUniqueId) -> R;
    comm_init_rank = "ncclCommInitRank": fn(*mut Ptr, c_int, RawUniqueId, c_int) -> R;
    comm_init_rank_config = "ncclCommInitRankConfig":
        fn(*mut Ptr, c_int, RawUniqueId, c_int, *mut NcclConfig) -> R;
    comm_init_rank_scalable = "ncclCommInitRankScalable":
        fn(*mut Ptr, c_int, c_int, c_int, *mut RawUniqueId, *mut NcclConfig) -> R;
    comm_split = "ncclCommSplit": fn(Ptr, c_int, c_int, *mut Ptr, *mut NcclConfig) -> R;
    comm_shrink = "ncclCommShrink":
        fn(Ptr, *mut c_int, c_int, *mut Ptr, *mut NcclConfig, c_int) -> R;
    comm_finalize = "ncclCommFinalize": fn(Ptr) -> R;
    comm_destroy = "ncclCommDestroy": fn(Ptr) -> R;
    comm_abort = "ncclCommAbort": fn(Ptr) -> R;
    comm_revoke = "ncclCommRevoke": fn(Ptr, c_int) -> R;
    comm_get_async_error = "ncclCommGetAsyncError": fn(Ptr, *mut c_int) -> R;
    comm_count = "ncclCommCount": fn(Ptr, *mut c_int) -> R;
    comm_cu_device = "ncclCommCuDevice": fn(Ptr, *mut c_int) -> R;
    comm_user_rank = "ncclCommUserRank": fn(Ptr, *mut c_int) -> R;
    get_last_error = "ncclGetLastError": fn(Ptr) -> *const c_char;
    reset_debug_init = "ncclResetDebugInit": fn() -> ();
    comm_register = "ncclCommRegister": fn(Ptr, Ptr, usize, *mut Ptr) -> R;
    comm_deregister = "ncclCommDeregister": fn(Ptr, Ptr) -> R;
    comm_window_register = "ncclCommWindowRegister": fn(Ptr, Ptr, usize, *mut Ptr, c_int) -> R;
    comm_window_deregister = "ncclCommWindowDeregister": fn(Ptr, Ptr) -> R;
    mem_alloc = "ncclMemAlloc": fn(*mut Ptr, usize) -> R;
    mem_free = "ncclMemFree": fn(Ptr) -> R;
    red_op_create_pre_mul_sum = "ncclRedOpCreatePreMulSum":
        fn(*mut c_int, Ptr, c_int, c_int, Ptr) -> R;
    red_op_destroy = "ncclRedOpDestroy": fn(c_int, Ptr) -> R;
    reduce = "ncclReduce": fn(Ptr, Ptr, usize, c_int, c_int, c_int, Ptr, Ptr) -> R;
    bcast = "ncclBcast": fn(Ptr, usize, c_int, c_int, Ptr, Ptr) -> R;
    broadcast = "ncclBroadcast": fn(Ptr, Ptr, usize, c_int, c_int, Ptr, Ptr) -> R;
    all_reduce = "ncclAllReduce": fn(Ptr, Ptr, usize, c_int, c_int, Ptr, Ptr) -> R;
    reduce_scatter = "ncclReduceScatter": fn(Ptr, Ptr, usize, c_int, c_int, Ptr, Ptr) -> R;
    all_gather = "ncclAllGather": fn(Ptr, Ptr, usize, c_int, Ptr, Ptr) -> R;
    all_to_all = "ncclAlltoAll": fn(Ptr, Ptr, usize, c_int, Ptr, Ptr) -> R;
    gather = "ncclGather": fn(Ptr, Ptr, usize, c_int, c_int, Ptr, Ptr) -> R;
    scatter = "ncclScatter": fn(Ptr, Ptr, usize, c_int, c_int, Ptr, Ptr) -> R;
    send = "ncclSend": fn(Ptr, usize, c_int, c_int, Ptr, Ptr) -> R;
    recv = "ncclRecv": fn(Ptr, usize, c_int, c_int, Ptr, Ptr) -> R;
    group_start = "ncclGroupStart": fn() -> R;
    group_end = "ncclGroupEnd": fn() -> R;
    group_simulate_end = "ncclGroupSimulateEnd": fn(Ptr) -> R;
    dev_comm_create = "ncclDevCommCreate": fn(Ptr, *const c_void, Ptr) -> R;
    dev_comm_destroy = "ncclDevCommDestroy": fn(Ptr, *const c_void) -> R;
    comm_query_properties = "ncclCommQueryProperties": fn(Ptr, Ptr) -> R;
    team_world = "ncclTeamWorld": fn(Ptr) -> Team;
    team_lsa = "ncclTeamLsa": fn(Ptr) -> Team;
    team_rail = "ncclTeamRail": fn(Ptr) -> Team;
    team_rank_to_world = "ncclTeamRankToWorld": fn(Ptr, Team, c_int) -> c_int;
    team_rank_to_lsa = "ncclTeamRankToLsa": fn(Ptr, Team, c_int) -> c_int;
    gin_barrier_create_requirement = "ncclGinBarrierCreateRequirement":
        fn(Ptr, Team, c_int, Ptr, Ptr) -> R;
}

/// The loaded real NCCL.
#[derive(Debug)]
pub struct Real {
    /// Kept open for the life of the process (never closed: its pointers are stored).
    _lib: Library,
    /// The file (or the name it was found by).
    pub path: String,
    /// Its version code (`ncclGetVersion`).
    pub version: c_int,
    /// Its entry points.
    pub fns: RealFns,
}

impl Real {
    /// The last error text of the real NCCL for `comm` (may be null).
    ///
    /// # Safety
    /// `comm` is null or a communicator of the real NCCL.
    pub unsafe fn last_error(&self, comm: Ptr) -> String {
        let Some(f) = self.fns.get_last_error else {
            return String::new();
        };
        // SAFETY: NCCL's ncclGetLastError accepts any communicator, null included, and
        // returns a NUL-terminated string or null.
        let p = unsafe { f(comm) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated (NCCL's contract).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The real NCCL, loaded on the first call (see the [module](self)); `Err` says why none is
/// available.
pub fn real() -> Result<&'static Real, &'static str> {
    static REAL: OnceLock<Result<Real, String>> = OnceLock::new();
    REAL.get_or_init(load).as_ref().map_err(|e| e.as_str())
}

/// The real NCCL if one was already loaded or can be (same as [`real`], as an `Option`).
pub fn real_opt() -> Option<&'static Real> {
    real().ok()
}

const FILE_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];
const WHEEL_DIRS: [&str; 3] = ["nvidia/nccl/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"];

fn lib_in(dir: &Path) -> Option<PathBuf> {
    mscclpp_host::runtime_libs::file_in(dir, &FILE_NAMES)
}

/// Every folder searched in step 4, in order (no Python is started: this library runs
/// inside someone else's process).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut extra: Vec<PathBuf> = std::env::var_os("NCCL_HOME")
        .map(|h| PathBuf::from(h).join("lib"))
        .into_iter()
        .collect();
    extra.push(PathBuf::from("/usr/local/nccl/lib"));
    mscclpp_host::runtime_libs::search_dirs(&WHEEL_DIRS, false, &extra)
}

/// What `MSCCLPP_NCCL_LIB` asks for ([`Settings::nccl_lib`]): unset or empty, search; `none`,
/// `off`, `no` or `0`, no fallback; else this file or folder.
pub use mscclpp_host::settings::NcclLib as EnvChoice;

fn open_flags() -> c_int {
    libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND
}

/// Opens `name` with `flags` and checks it is an NCCL other than this library.
fn try_open(name: &str, flags: c_int) -> Result<Real, String> {
    // SAFETY: loading NCCL runs its initialisers, which have no requirements on us.
    let lib = unsafe { Library::open(Some(name), flags) }.map_err(|e| e.to_string())?;
    // SAFETY: only asks whether the symbol exists.
    if unsafe { lib.get::<*const c_void>(MARKER) }.is_ok() {
        return Err(format!(
            "{name} is this library (libmscclpp_nccl), not NCCL"
        ));
    }
    // SAFETY: the handle stays open in `Real` (never closed) for as long as the pointers.
    let fns = unsafe { RealFns::load(&lib) };
    let Some(get_version) = fns.get_version else {
        return Err(format!("{name} has no ncclGetVersion: not NCCL"));
    };
    if fns.comm_init_rank.is_none() || fns.get_unique_id.is_none() {
        return Err(format!("{name} lacks ncclCommInitRank/ncclGetUniqueId"));
    }
    let mut version = 0;
    // SAFETY: NCCL's signature; an out-pointer to a local.
    let r = unsafe { get_version(&mut version) };
    if r != 0 {
        return Err(format!("{name}: ncclGetVersion failed ({r})"));
    }
    let path = file_of(get_version as *const c_void).unwrap_or_else(|| name.to_string());
    Ok(Real {
        _lib: lib,
        path,
        version,
        fns,
    })
}

/// The file holding `addr` (dladdr).
fn file_of(addr: *const c_void) -> Option<String> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads its tables; `info` is a live out-parameter.
    let ok = unsafe { libc::dladdr(addr, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, owned by the loader.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

fn load() -> Result<Real, String> {
    let settings = Settings::global().map_err(|e| e.to_string())?;
    let real = load_choice(&settings.nccl_lib)?;
    crate::log::info(&format!(
        "fallback NCCL: {} (version {})",
        real.path, real.version
    ));
    Ok(real)
}

fn load_choice(choice: &EnvChoice) -> Result<Real, String> {
    match choice {
        EnvChoice::Off => {
            Err("the fallback to the real NCCL is off (MSCCLPP_NCCL_LIB=none)".to_string())
        }
        EnvChoice::Path(p) => {
            let file = if p.is_dir() {
                lib_in(p)
            } else {
                Some(p.clone())
            };
            let Some(file) = file.filter(|f| f.is_file()) else {
                return Err(format!(
                    "MSCCLPP_NCCL_LIB={}: no such library (give the path of libnccl.so.2, or a \
                     folder holding it)",
                    p.display()
                ));
            };
            let name = file.to_string_lossy().into_owned();
            try_open(&name, open_flags()).map_err(|e| format!("MSCCLPP_NCCL_LIB: {e}"))
        }
        EnvChoice::Search => {
            let mut why = Vec::new();
            for name in FILE_NAMES {
                match try_open(name, libc::RTLD_NOW | libc::RTLD_NOLOAD) {
                    Ok(r) => return Ok(r),
                    Err(e) if e.contains("this library") => why.push(e),
                    Err(_) => {}
                }
            }
            match try_open("libnccl.so.2", open_flags()) {
                Ok(r) => return Ok(r),
                Err(e) => why.push(e),
            }
            let dirs = search_dirs();
            for dir in &dirs {
                if let Some(f) = lib_in(dir) {
                    match try_open(&f.to_string_lossy(), open_flags()) {
                        Ok(r) => return Ok(r),
                        Err(e) => why.push(e),
                    }
                }
            }
            let shown: Vec<String> = dirs
                .iter()
                .filter(|d| d.parent().is_some_and(Path::exists))
                .map(|d| d.display().to_string())
                .collect();
            Err(format!(
                "no real NCCL found (not loaded by the program, not on the library path, not \
                 in {}){}; install it (`pip install nvidia-nccl-cu13`) or set \
                 MSCCLPP_NCCL_LIB=/path/to/libnccl.so.2",
                if shown.is_empty() {
                    "the usual places".to_string()
                } else {
                    shown.join(", ")
                },
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", why.join("; "))
                }
            ))
        }
    }
}

/// `f`, a function of the real NCCL, or a usage error saying that it does not export `call`.
pub(crate) fn need<F: Copy>(call: &str, real: &Real, f: Option<F>) -> Result<F, Failure> {
    f.ok_or_else(|| {
        Failure::usage(format!(
            "{call}: the real NCCL ({}, version {}) does not export it",
            real.path, real.version
        ))
    })
}

/// The real NCCL's communicator beside ours.
#[derive(Debug, Clone, Copy)]
pub struct RealComm(pub Ptr);

// SAFETY: an NCCL communicator handle; NCCL allows using it from any thread (one at a time,
// as the NCCL API requires of its callers).
unsafe impl Send for RealComm {}
// SAFETY: as above.
unsafe impl Sync for RealComm {}

/// `Ok` for success or in-progress, else a failure with the real NCCL's last error (`comm`:
/// the real communicator the call was made on, or null).
pub(crate) fn real_result(
    call: &str,
    real: &Real,
    comm: Ptr,
    code: NcclResult,
) -> Result<NcclResult, Failure> {
    if code == result::SUCCESS || code == result::IN_PROGRESS {
        return Ok(code);
    }
    // SAFETY: the real communicator the call was made on (or null).
    let text = unsafe { real.last_error(comm) };
    Err(Failure::new(
        code,
        format!("{call} (real NCCL {}): error {code}: {text}", real.version),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values() {
        let read = |v: &str| {
            Settings::from_vars([("MSCCLPP_NCCL_LIB", v)])
                .unwrap()
                .nccl_lib
        };
        assert_eq!(Settings::default().nccl_lib, EnvChoice::Search);
        assert_eq!(read(" "), EnvChoice::Search);
        assert_eq!(read("OFF"), EnvChoice::Off);
        assert_eq!(
            read("/x/libnccl.so.2"),
            EnvChoice::Path(PathBuf::from("/x/libnccl.so.2"))
        );
    }

    #[test]
    fn explicit_path_that_is_missing_or_not_nccl() {
        let e = load_choice(&EnvChoice::Path("/nonexistent/libnccl.so.2".into())).unwrap_err();
        assert!(e.contains("no such library"), "{e}");
        let e = load_choice(&EnvChoice::Off).unwrap_err();
        assert!(e.contains("off"), "{e}");
        // A real shared library that is not NCCL.
        let e = load_choice(&EnvChoice::Path(libc_path())).unwrap_err();
        assert!(e.contains("not NCCL"), "{e}");
    }

    fn libc_path() -> PathBuf {
        let p = file_of(libc::malloc as *const c_void).expect("dladdr(malloc)");
        PathBuf::from(p)
    }

    #[test]
    fn search_dirs_include_wheels() {
        let d = search_dirs();
        assert!(d.iter().any(|p| p.ends_with("nvidia/nccl/lib")));
        assert!(d.iter().any(|p| p.ends_with("lib64")));
    }
}
