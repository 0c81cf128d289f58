//! Communicators: the object behind an `ncclComm_t`, the table of live handles, set-up
//! (ours and the real NCCL's beside it), split and shrink.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::driver::{result as cu, sys as cusys};

use mscclpp_host::bootstrap::{
    BlockingBootstrap, BootstrapConfig, BootstrapRoot, UniqueId, create_unique_id_at,
};
use mscclpp_host::collectives::{CollConfig, Collectives, PreMulScalar};
use mscclpp_host::communicator::{Backend, CommConfig, Communicator};
use mscclpp_host::cuda::{CudaError, CudaStream, Gpu, device_count};
use mscclpp_host::settings::Settings;
use mscclpp_host::transport::tcp::root_ip;

use crate::dispatch::Launch;
use crate::error::Failure;
use crate::log;
use crate::setup_fallback;
use crate::system_nccl::{self, Ptr, RawUniqueId, Real, RealComm, real_result};
use crate::types::{Fallback, NcclConfig, NcclResult, result};

mod ids;
mod setup;
#[cfg(test)]
mod tests;

pub use ids::*;
pub use setup::*;

/// Tells our communicators from other pointers.
const COMM_MAGIC: u64 = 0x6d73_6363_6c70_7031; // "msccl pp1"

/// A set-up communicator.
pub struct Inner {
    /// Our collectives, with the communicator and bootstrap; or, when ours could not be set
    /// up on some rank and every call runs on the real NCCL ([`crate::setup_fallback`]), why (the
    /// failing ranks and their messages).
    pub coll: Result<Collectives, String>,
    /// The real NCCL's communicator over the same ranks, when a real NCCL is available on
    /// every rank.
    pub real: Option<RealComm>,
    /// Why there is no real communicator, when there is none.
    pub real_missing: Option<String>,
    /// `MSCCLPP_NCCL_FALLBACK` at set-up, OR-ed over the ranks (see `dispatch`).
    pub fallback: Fallback,
    /// `ncclCommFinalize` ran (the final barrier is done).
    pub finalized: AtomicBool,
    /// Sequence of shrinks, for bootstrap message tags.
    pub shrink_seq: AtomicU64,
    /// Operations made by `ncclRedOpCreatePreMulSum` on this communicator.
    pub premul_ops: PreMulOps,
    /// `ncclCommGetAsyncError` has printed its error (once: callers poll it).
    pub async_warned: AtomicBool,
    /// `ncclCommRevoke` ran: our collectives are aborted; only destroy, abort, split and
    /// shrink may follow.
    pub revoked: AtomicBool,
    /// After a revoke: this GPU's work has ended (set by a thread of its own).
    pub revoke_quiet: Arc<AtomicBool>,
}

/// The pre-multiplied sums made by `ncclRedOpCreatePreMulSum` on one communicator: their
/// operation numbers (from `ncclNumOps` up, as NCCL) and scalars.
#[derive(Debug, Default)]
pub struct PreMulOps(Mutex<HashMap<c_int, PreMulScalar>>);

impl PreMulOps {
    /// Records `scalar` under the smallest free number; that number.
    pub fn create(&self, scalar: PreMulScalar) -> Result<c_int, String> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let op = (crate::types::NUM_OPS..=crate::types::MAX_RED_OP)
            .find(|op| !m.contains_key(op))
            .ok_or_else(|| "every operation number is taken".to_string())?;
        m.insert(op, scalar);
        Ok(op)
    }

    /// The scalar of operation `op`, if this communicator made it (and did not destroy it).
    pub fn get(&self, op: c_int) -> Option<PreMulScalar> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&op)
            .copied()
    }

    /// Forgets operation `op`; an error unless this communicator made it and it is live.
    pub fn destroy(&self, op: c_int) -> Result<(), String> {
        let gone = self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&op);
        match gone {
            Some(_) => Ok(()),
            None if crate::types::is_builtin_op(op) => Err(format!(
                "operation {op} is a built-in one (only ncclRedOpCreatePreMulSum's are destroyed)"
            )),
            None => Err(format!(
                "operation {op} was not made by ncclRedOpCreatePreMulSum on this communicator, \
                 or is destroyed already"
            )),
        }
    }
}

impl Inner {
    /// A set-up communicator: ours (or why there is none), the real one beside it (or why
    /// there is none), and the calls forwarded.
    pub fn new(
        coll: Result<Collectives, String>,
        real: Option<RealComm>,
        real_missing: Option<String>,
        fallback: Fallback,
    ) -> Inner {
        Inner {
            coll,
            real,
            real_missing,
            fallback,
            finalized: AtomicBool::new(false),
            shrink_seq: AtomicU64::new(0),
            premul_ops: PreMulOps::default(),
            async_warned: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            revoke_quiet: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A communicator on the real NCCL alone (ours could not be set up: `why`): every call
    /// forwarded to `real`.
    pub fn real_only(real: RealComm, why: String) -> Inner {
        let all = Fallback {
            mask: Fallback::ALL_MASK,
            ..Fallback::default()
        };
        Inner::new(Err(why), Some(real), None, all)
    }

    /// Our collectives, or why this communicator has none.
    pub fn ours(&self, call: &str) -> Result<&Collectives, Failure> {
        self.coll.as_ref().map_err(|why| {
            Failure::new(
                result::INTERNAL_ERROR,
                format!("{call}: this communicator runs on the real NCCL only ({why})"),
            )
        })
    }
}

/// What an `ncclComm_t` points to.
pub struct Comm {
    magic: u64,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// Its GPU (the primary context of the device current at set-up, as the CUDA runtime
    /// uses).
    pub gpu: Gpu,
    /// From the config: blocking calls (we always block; kept for split children).
    pub blocking: bool,
    /// The config it was made with, its two strings left out: what a split or shrink
    /// without a config passes on to the real NCCL (as NCCL's children inherit the
    /// parent's).
    config: ConfigCopy,
    /// Set once set-up ends (at once, or at `ncclGroupEnd` for a set-up inside a group).
    pub state: OnceLock<Result<Inner, Failure>>,
}

// SAFETY: the collectives' context holds raw device addresses that are fixed after set-up
// and only read (the config's string pointers are null); NCCL's rules (one thread at a time per communicator, calls ordered on
// streams) are the callers' duty, as for NCCL itself.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Comm {
    /// Launches a native collective on the caller's `stream` (at its call, or at the end
    /// of its group).
    pub(crate) fn launch_native(
        &self,
        call: &'static str,
        inner: &Inner,
        launch: Launch,
        stream: Ptr,
    ) -> Result<NcclResult, Failure> {
        // SAFETY: the caller's stream of this device.
        let s = unsafe { self.stream(stream) };
        let coll = inner.ours(call)?;
        // SAFETY: the caller's device buffers, sized as NCCL's call says (checked by the
        // collectives against the device's allocations).
        self.on_device(|| unsafe { launch.run(coll, &s) })
            .map_err(|e| Failure::from_comm(call, &e))?;
        Ok(result::SUCCESS)
    }

    /// A communicator whose set-up has not run yet.
    pub fn new(rank: usize, nranks: usize, gpu: Gpu, blocking: bool) -> Comm {
        Comm {
            magic: COMM_MAGIC,
            rank,
            nranks,
            gpu,
            blocking,
            config: ConfigCopy::NONE,
            state: OnceLock::new(),
        }
    }

    /// With `cfg` as the config it was made with (see the field).
    pub fn with_config(mut self, cfg: &ConfigCopy) -> Comm {
        self.config = cfg.without_strings();
        self
    }

    /// The config it was made with, without its strings (see the field).
    pub fn config(&self) -> ConfigCopy {
        self.config
    }

    /// The CUDA device ordinal.
    pub fn device(&self) -> usize {
        self.gpu.info().ordinal
    }

    /// The set-up state, or why it cannot be used.
    pub fn ready(&self, call: &str) -> Result<&Inner, Failure> {
        match self.state.get() {
            None => Err(Failure::usage(format!(
                "{call}: the communicator is still being set up (initialised inside a group: \
                 call ncclGroupEnd first)"
            ))),
            Some(Err(f)) => Err(Failure::new(
                f.code,
                format!("{call}: the communicator's set-up failed: {}", f.msg),
            )),
            Some(Ok(inner)) => Ok(inner),
        }
    }

    /// [`ready`](Self::ready), for an operation (a collective, a send or receive): not on a
    /// revoked communicator.
    pub fn usable(&self, call: &str) -> Result<&Inner, Failure> {
        let inner = self.ready(call)?;
        if inner.revoked.load(Ordering::Acquire) {
            return Err(Failure::usage(format!(
                "{call}: the communicator was revoked (ncclCommRevoke): only ncclCommDestroy, \
                 ncclCommAbort, ncclCommSplit and ncclCommShrink may follow"
            )));
        }
        Ok(inner)
    }

    /// A stream handle (a `cudaStream_t` is a `CUstream`) wrapped without ownership.
    ///
    /// # Safety
    /// `stream` is a live stream of this device's primary context (or 0, 1, 2: the legacy
    /// and per-thread default streams) for as long as the wrapper is used.
    pub unsafe fn stream(&self, stream: Ptr) -> Arc<CudaStream> {
        // SAFETY: caller contract; dropping the wrapper leaves the stream alone.
        unsafe {
            self.gpu
                .context()
                .wrap_borrowed_stream(stream as cusys::CUstream)
        }
    }

    /// Runs `f` with this device's context current, then restores the caller's.
    pub fn on_device<T>(&self, f: impl FnOnce() -> T) -> T {
        on_gpu(&self.gpu, f)
    }
}

/// Runs `f` (which makes `gpu`'s context current as needed), then restores the context
/// that was current on this thread (the CUDA runtime's device stays the caller's).
pub fn on_gpu<T>(gpu: &Gpu, f: impl FnOnce() -> T) -> T {
    let prev = cu::ctx::get_current().ok().flatten();
    let ours = gpu.context().cu_ctx();
    let out = f();
    if prev != Some(ours) {
        // SAFETY: restores the context that was current (or none) on this thread.
        let _ = unsafe { cu::ctx::set_current(prev.unwrap_or(std::ptr::null_mut())) };
    }
    out
}

/// The live communicators' addresses.
static COMMS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

/// Bumped (under the `COMMS` lock) whenever the table changes: a thread's cached answer of
/// [`lookup`] holds while the generation it was read at is current.
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last handle this thread looked up: (address, generation, ours).
    static LAST: Cell<(usize, u64, bool)> = const { Cell::new((0, u64::MAX, false)) };
}

/// Registers a communicator and returns its handle.
pub fn register(comm: Box<Comm>) -> Ptr {
    let p = Box::into_raw(comm);
    let mut t = COMMS.lock().unwrap_or_else(|e| e.into_inner());
    t.insert(p as usize);
    GENERATION.fetch_add(1, Ordering::Release);
    p.cast()
}

/// What a handle is.
pub enum Handle {
    /// Null.
    Null,
    /// One of ours.
    Ours(&'static Comm),
    /// Not ours: the real NCCL's own (or garbage).
    Foreign(Ptr),
}

/// Looks a handle up. Every call of the C API does: the common case, the handle of the
/// previous call on this thread with no communicator made or destroyed since, costs one
/// atomic load and a thread-local read, no lock.
pub fn lookup(p: Ptr) -> Handle {
    if p.is_null() {
        return Handle::Null;
    }
    let generation = GENERATION.load(Ordering::Acquire);
    let (last, at, ours) = LAST.with(Cell::get);
    let ours = if last == p as usize && at == generation {
        ours
    } else {
        let ours = COMMS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(p as usize));
        // Cached with the generation read before the lock: if the table changed since, the
        // next lookup misses and asks again.
        LAST.with(|l| l.set((p as usize, generation, ours)));
        ours
    };
    if ours {
        // SAFETY: registered handles are live boxes until `unregister` (using a handle
        // while another thread destroys it is the caller's breach, as in NCCL).
        let c: &'static Comm = unsafe { &*(p as *const Comm) };
        debug_assert_eq!(c.magic, COMM_MAGIC);
        Handle::Ours(c)
    } else {
        Handle::Foreign(p)
    }
}

/// Takes a communicator out of the table (for destroy/abort).
pub fn unregister(p: Ptr) -> Option<Box<Comm>> {
    let removed = {
        let mut t = COMMS.lock().unwrap_or_else(|e| e.into_inner());
        let removed = t.remove(&(p as usize));
        GENERATION.fetch_add(1, Ordering::Release);
        removed
    };
    // SAFETY: it was registered, so it is a box from `register`, now removed from the table
    // (no new lookups can return it).
    removed.then(|| unsafe { Box::from_raw(p as *mut Comm) })
}

/// The GPU a set-up on this thread uses: the device of the current context (what
/// `cudaGetDevice` returns; device 0 when none is current). Fails fast, naming "no GPU",
/// without a driver or a device.
pub fn current_gpu(call: &str) -> Result<Gpu, Failure> {
    let no_gpu = |why: String| Failure::new(result::SYSTEM_ERROR, format!("{call}: no GPU: {why}"));
    match device_count() {
        Err(CudaError::NoDriver) => {
            return Err(no_gpu(
                "no CUDA driver (libcuda.so.1 could not be loaded)".into(),
            ));
        }
        Err(e) => return Err(no_gpu(e.to_string())),
        Ok(0) => return Err(no_gpu("the CUDA driver reports no device".into())),
        Ok(_) => {}
    }
    let ordinal = match cu::ctx::get_current() {
        Ok(Some(_)) => {
            let mut dev: cusys::CUdevice = 0;
            // SAFETY: a context is current; `dev` is a live out-parameter.
            let r = unsafe { cusys::cuCtxGetDevice(&mut dev) };
            if r != cusys::CUresult::CUDA_SUCCESS {
                return Err(Failure::new(
                    result::UNHANDLED_CUDA_ERROR,
                    format!("{call}: cuCtxGetDevice failed: {r:?}"),
                ));
            }
            dev as usize
        }
        _ => 0,
    };
    open_gpu(call, ordinal)
}

/// Opens device `ordinal` (its primary context).
pub fn open_gpu(call: &str, ordinal: usize) -> Result<Gpu, Failure> {
    Gpu::open(ordinal).map_err(|e| {
        let code = match e {
            CudaError::Driver { .. } => result::UNHANDLED_CUDA_ERROR,
            CudaError::NoSuchGpu { .. } => result::INVALID_ARGUMENT,
            _ => result::SYSTEM_ERROR,
        };
        Failure::new(code, format!("{call}: cannot open GPU {ordinal}: {e}"))
    })
}

/// The real NCCL's communicator pointer of `inner`, or why there is none.
pub fn real_of(call: &str, inner: &Inner, what: &str) -> Result<(&'static Real, Ptr), Failure> {
    let why = |w: &str| {
        Failure::usage(format!(
            "{call}: {what} is not served by mscclpp, and there is no real NCCL to fall back to: \
             {w}"
        ))
    };
    match (system_nccl::real(), inner.real) {
        (Ok(r), Some(rc)) => Ok((r, rc.0)),
        (Err(e), _) => Err(why(e)),
        (Ok(_), None) => Err(why(inner
            .real_missing
            .as_deref()
            .unwrap_or("no real communicator was set up"))),
    }
}

/// Null pointer of `c_void` (short name for the API module).
pub fn null() -> Ptr {
    std::ptr::null_mut::<c_void>()
}

#[cfg(test)]
mod premul_tests {
    use super::PreMulOps;
    use crate::types::NUM_OPS;
    use mscclpp_host::collectives::{DataType, PreMulScalar};

    #[test]
    fn operations_are_numbered_from_num_ops_reused_and_destroyed_once() {
        let ops = PreMulOps::default();
        let s = |bits| PreMulScalar::Host {
            dtype: DataType::F32,
            bits,
        };
        let a = ops.create(s(1)).unwrap();
        let b = ops.create(s(2)).unwrap();
        assert_eq!((a, b), (NUM_OPS, NUM_OPS + 1));
        assert_eq!(ops.get(b), Some(s(2)));
        ops.destroy(a).unwrap();
        assert_eq!(ops.get(a), None);
        let e = ops.destroy(a).unwrap_err();
        assert!(e.contains("destroyed already"), "{e}");
        let e = ops.destroy(0).unwrap_err();
        assert!(e.contains("built-in"), "{e}");
        // The freed number is taken again.
        assert_eq!(ops.create(s(3)).unwrap(), a);
    }
}
