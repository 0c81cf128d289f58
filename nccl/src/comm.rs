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
use crate::real::{self, Ptr, RawUniqueId, Real, RealComm, real_result};
use crate::rescue;
use crate::types::{Fallback, NcclConfig, NcclResult, result};

/// Tells our communicators from other pointers.
const COMM_MAGIC: u64 = 0x6d73_6363_6c70_7031; // "msccl pp1"

/// A set-up communicator.
pub struct Inner {
    /// Our collectives, with the communicator and bootstrap; or, when ours could not be set
    /// up on some rank and every call runs on the real NCCL ([`crate::rescue`]), why (the
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

/// A copy of a caller's config (the fields of our 2.28 layout within its `size`), so that a
/// set-up deferred to `ncclGroupEnd` does not read the caller's memory later.
#[derive(Clone, Copy)]
pub struct ConfigCopy(Option<NcclConfig>);

// SAFETY: the two string pointers in a config are the caller's (valid through the set-up,
// as NCCL requires); the copy only carries them to the real NCCL.
unsafe impl Send for ConfigCopy {}

impl ConfigCopy {
    /// No config.
    pub const NONE: ConfigCopy = ConfigCopy(None);

    /// Copies `cfg` (already checked by `read_config`).
    ///
    /// # Safety
    /// `cfg` is null or a valid config of `size` bytes.
    pub unsafe fn new(cfg: *const NcclConfig) -> ConfigCopy {
        if cfg.is_null() {
            return ConfigCopy(None);
        }
        let ours = std::mem::size_of::<NcclConfig>();
        // SAFETY: the header is readable (caller contract).
        let size = unsafe { (*cfg).size }.min(ours);
        // SAFETY: all-zero bytes are a valid NcclConfig (integers and null pointers).
        let mut copy: NcclConfig = unsafe { std::mem::zeroed() };
        // SAFETY: `size` bytes are readable at `cfg` and writable in `copy`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                cfg.cast::<u8>(),
                (&mut copy as *mut NcclConfig).cast::<u8>(),
                size,
            )
        };
        copy.size = size;
        ConfigCopy(Some(copy))
    }
}

impl ConfigCopy {
    /// A child's config: `cfg` (a caller's config, checked by `read_config`), else, when it
    /// is NULL, `parent`'s (the one the parent was made with, as NCCL's children inherit it).
    ///
    /// # Safety
    /// `cfg` is null or a valid config of its `size` bytes.
    pub unsafe fn for_child(cfg: *const NcclConfig, parent: ConfigCopy) -> ConfigCopy {
        if cfg.is_null() {
            return parent;
        }
        // SAFETY: caller contract.
        unsafe { ConfigCopy::new(cfg) }
    }

    /// The copy without its two strings (`netName`, `commName`: the caller's memory, which
    /// NCCL reads during the call only), to keep beyond it.
    fn without_strings(&self) -> ConfigCopy {
        ConfigCopy(self.0.map(|mut c| {
            c.net_name = std::ptr::null();
            c.comm_name = std::ptr::null();
            c
        }))
    }

    /// The copy with `blocking` set (NCCL's initializer where there was no config).
    fn blocking(self) -> NcclConfig {
        let mut c = self.0.unwrap_or_else(NcclConfig::initializer);
        c.blocking = 1;
        // A short (older) config that ends before the field grows to hold it.
        c.size = c.size.max(std::mem::offset_of!(NcclConfig, blocking) + 4);
        c
    }
}

/// How long a real split or shrink that answered "in progress" may take to settle.
const CHILD_WAIT: Duration = Duration::from_secs(120);

/// Whether the real communicator `comm`'s work in progress (a nonblocking split's) has
/// settled within `limit`, polling `ncclCommGetAsyncError`.
fn settles(real: &Real, comm: RealComm, limit: Duration) -> bool {
    let Some(f) = real.fns.comm_get_async_error else {
        return false;
    };
    let start = std::time::Instant::now();
    loop {
        let mut state: c_int = result::IN_PROGRESS;
        // SAFETY: NCCL's signature; the real communicator; a live out-parameter.
        let r = unsafe { f(comm.0, &mut state) };
        if r != result::SUCCESS || state != result::IN_PROGRESS {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Which real call makes a child communicator.
pub enum RealChild {
    /// `ncclCommSplit(parent, color, key, ..)`.
    Split {
        /// The caller's color.
        color: c_int,
        /// The caller's key.
        key: c_int,
    },
    /// `ncclCommShrink(parent, exclude, .., flags)`.
    Shrink {
        /// The ranks left out.
        exclude: Vec<c_int>,
        /// The caller's shrink flags.
        flags: c_int,
    },
}

/// Makes the real NCCL's child of `parent` (split or shrink, collective over the parent's
/// ranks), done when this returns: on a thread of its own with `gpu`'s context current, and
/// with `blocking` 1 in the config it gets (`cfg`'s other settings kept: the caller's, or
/// the parent's, see [`ConfigCopy::for_child`]). The real NCCL writes the child's handle when
/// the child is made: inside a group (the real NCCL's group is per thread, and ours is
/// mirrored on it) that is at the real `ncclGroupEnd`, and for a nonblocking parent (whose
/// mode a split takes, whatever the child's config says) later still: both after the call
/// has returned, with no child for our communicator. Parents are blocking (`create_real`),
/// and the thread has no group. Should the real NCCL still answer "in progress", its work is
/// waited for (at most `CHILD_WAIT`), and the slot it writes into outlives it. `None`: the
/// real NCCL made none for this rank.
pub fn real_child(
    call: &str,
    real: &'static Real,
    parent: RealComm,
    gpu: &Gpu,
    cfg: ConfigCopy,
    how: RealChild,
) -> Result<Option<RealComm>, Failure> {
    let (split, shrink) = match &how {
        RealChild::Split { .. } => (
            Some(crate::real::need(call, real, real.fns.comm_split)?),
            None,
        ),
        RealChild::Shrink { .. } => (
            None,
            Some(crate::real::need(call, real, real.fns.comm_shrink)?),
        ),
    };
    let gpu = gpu.clone();
    let job = move || -> Result<(NcclResult, RealComm), CudaError> {
        // The whole handle (Send), not its pointer field alone.
        let parent: RealComm = parent;
        gpu.bind()?;
        let mut cfg = cfg.blocking();
        // On the heap: if the real NCCL still answers "in progress" (its split takes the
        // parent's mode, and `create_real` makes parents blocking, so it should not), it
        // writes the handle later; the slot is then kept for that write (below).
        let out: Box<Ptr> = Box::new(std::ptr::null_mut());
        let slot = Box::into_raw(out);
        let r = match (how, split, shrink) {
            // SAFETY: NCCL's signature; the parent is the real NCCL's; `slot` lives until
            // the real NCCL has written it (below); `cfg` through the call, which is
            // outside any group (a thread of its own) and blocking (above), so the real
            // NCCL has copied the config when it returns.
            (RealChild::Split { color, key }, Some(f), _) => unsafe {
                f(parent.0, color, key, slot, &mut cfg)
            },
            (RealChild::Shrink { mut exclude, flags }, _, Some(f)) => {
                let n = exclude.len() as c_int;
                // SAFETY: as above; `exclude` holds `n` ranks.
                unsafe { f(parent.0, exclude.as_mut_ptr(), n, slot, &mut cfg, flags) }
            }
            _ => result::INTERNAL_ERROR,
        };
        let done = r != result::IN_PROGRESS || settles(real, parent, CHILD_WAIT);
        if !done {
            // The real NCCL may still write the slot: it stays (8 bytes), and this rank's
            // child has no real communicator.
            return Ok((r, RealComm(std::ptr::null_mut())));
        }
        // SAFETY: from Box::into_raw above; the real NCCL is done with it (it returned, or
        // its work settled).
        let out = unsafe { Box::from_raw(slot) };
        Ok((r, RealComm(*out)))
    };
    let done = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("mscclpp-nccl-child".into())
            .spawn_scoped(s, job)
            .map(|h| h.join())
    });
    let (code, child) = match done {
        Err(e) => {
            return Err(Failure::new(
                result::SYSTEM_ERROR,
                format!("{call}: starting a thread for the real NCCL's child: {e}"),
            ));
        }
        Ok(Err(_)) => {
            return Err(Failure::new(
                result::INTERNAL_ERROR,
                format!("{call}: the real NCCL's child: its thread panicked"),
            ));
        }
        Ok(Ok(Err(e))) => {
            return Err(Failure::new(
                result::UNHANDLED_CUDA_ERROR,
                format!("{call}: {e}"),
            ));
        }
        Ok(Ok(Ok(v))) => v,
    };
    real_result(call, real, parent.0, code)?;
    Ok((!child.0.is_null()).then_some(child))
}

/// How the real communicator of a new communicator comes about.
pub enum RealSetup {
    /// Rank 0 gets a real unique id and broadcasts it over our bootstrap; every rank calls
    /// the real `ncclCommInitRankConfig`.
    Create(ConfigCopy),
    /// Already made (by a real split or shrink).
    Given(Option<RealComm>, Option<String>),
}

/// Sets up a communicator (collective over the ranks of `id`): the bootstrap, the real
/// NCCL's communicator, then ours. When ours fails on some rank and every rank has a real
/// communicator, the communicator runs on the real NCCL alone ([`crate::rescue`]). Runs on a
/// thread where `gpu`'s context is (made) current.
pub fn set_up(
    call: &str,
    nranks: usize,
    rank: usize,
    id: UniqueId,
    gpu: &Gpu,
    real_setup: RealSetup,
) -> Result<Inner, Failure> {
    gpu.bind()
        .map_err(|e| Failure::new(result::UNHANDLED_CUDA_ERROR, format!("{call}: {e}")))?;
    let config = CommConfig {
        bootstrap: bootstrap_config(call)?,
        ..CommConfig::default()
    };
    let root = bootstrap_root(id, env_comm_id(call, &config.bootstrap)?);
    let bootstrap =
        BlockingBootstrap::init_with_config(nranks, rank, root, config.bootstrap.clone())
            .map_err(|e| Failure::from_comm(call, &e.into()))?;
    let boot = |e: mscclpp_host::bootstrap::BootstrapError| Failure::from_comm(call, &e.into());
    let mut fallback = Fallback::parse(&settings_of(call)?.nccl_fallback.join(","));
    if !fallback.unknown.is_empty() {
        log::warn(&format!(
            "MSCCLPP_NCCL_FALLBACK: unknown operation(s) {:?} (known: all, allreduce, \
             allgather, reducescatter, broadcast, reduce, alltoall, sendrecv)",
            fallback.unknown
        ));
    }
    // Every rank must send a call the same way (see `dispatch`): a call forwarded on any
    // rank is forwarded on all. Likewise a set-up failure of ours is fatal if any rank
    // says so.
    let strict_here = !rescue::enabled();
    let agreed = bootstrap
        .all_gather(&[fallback.mask, strict_here as u8])
        .map_err(boot)?;
    let union = agreed
        .iter()
        .fold(0, |m, b| m | b.first().copied().unwrap_or(0));
    let strict = agreed.iter().any(|b| b.get(1).is_some_and(|&s| s != 0));
    if union != fallback.mask {
        log::warn(&format!(
            "MSCCLPP_NCCL_FALLBACK differs between the ranks: forwarding what any rank names \
             (mask {union:#x}, this rank {:#x})",
            fallback.mask
        ));
        fallback.mask = union;
    }
    // The real communicator first, so that it is there if ours cannot be made.
    let (real, real_missing) = match real_setup {
        RealSetup::Given(r, why) => (r, why),
        RealSetup::Create(cfg) => match create_real(call, &bootstrap, cfg) {
            Ok(made) => made,
            Err(f) => {
                // Said as this rank's bootstrap closes (it drops with the error).
                let why = format!(
                    "creating its real NCCL communicator failed on it: {}",
                    f.msg
                );
                bootstrap.as_async().set_leaving_why(&why);
                return Err(f);
            }
        },
    };
    let deadline = config.bootstrap.timeout;
    let ours = Communicator::from_bootstrap(bootstrap, Backend::Gpu(gpu.clone()), config)
        .and_then(|comm| match CollConfig::from_env() {
            Ok(c) => Collectives::new(comm, c),
            Err(e) => {
                let why = format!("reading its collectives' settings failed on it: {e}");
                comm.bootstrap().as_async().set_leaving_why(&why);
                Err(e)
            }
        })
        .and_then(|coll| {
            // Ours is up on every rank only once every rank says so; in the same step the
            // ranks agree whether sends and receives go to the real NCCL (ours cannot reach
            // some ranks on other hosts).
            let off = coll.send_recv_across_hosts_off();
            let said = coll
                .communicator()
                .bootstrap()
                .all_gather(&[off.is_some() as u8])?;
            let any = said.iter().any(|b| b.first().is_some_and(|&o| o != 0));
            Ok((
                coll,
                any.then(|| off.unwrap_or_else(|| "so says another rank".into())),
            ))
        });
    let coll = match ours {
        Ok((coll, None)) => coll,
        Ok((coll, Some(why))) => {
            fallback.p2p_off = true;
            log::warn(&format!(
                "rank {rank}/{nranks}: sends and receives (and gather, scatter) go to the real \
                 NCCL{}: {why}",
                if real.is_some() {
                    ""
                } else {
                    ", which is unavailable, so they fail"
                }
            ));
            coll
        }
        Err(e) => return fall_back(call, rank, nranks, real, real_missing, strict, deadline, &e),
    };
    // Across hosts, say on which: a simulated split (MSCCLPP_SIMULATE_HOSTS) shows here.
    let hosts = match coll.hosts() {
        1 => String::new(),
        n => format!(
            ", host {} (one of {n})",
            coll.communicator()
                .bootstrap()
                .as_async()
                .host_id(rank)
                .unwrap_or("?")
        ),
    };
    log::info(&format!(
        "rank {rank}/{nranks} on CUDA device {} ({}){hosts}: native {}; fallback: {}",
        gpu.info().ordinal,
        gpu.info().name,
        fallback.native_names(),
        match (&real, &real_missing, real::real_opt()) {
            (Some(_), _, Some(r)) => format!("{} (version {})", r.path, r.version),
            (_, Some(why), _) => format!("unavailable: {why}"),
            _ => "unavailable".into(),
        }
    ));
    Ok(Inner::new(Ok(coll), real, real_missing, fallback))
}

/// After our set-up failed with `e` on this rank (or a peer's failure reached it): the
/// communicator on the real NCCL alone when there is a real communicator and no rank is
/// strict, else the failure (the real communicator aborted).
#[allow(clippy::too_many_arguments)]
fn fall_back(
    call: &str,
    rank: usize,
    nranks: usize,
    real: Option<RealComm>,
    real_missing: Option<String>,
    strict: bool,
    deadline: std::time::Duration,
    e: &mscclpp_host::communicator::CommError,
) -> Result<Inner, Failure> {
    let mut own = Failure::from_comm(call, e);
    let (Some(rc), Ok(r), false) = (real, real::real(), strict) else {
        if let (Some(rc), Ok(r)) = (real, real::real())
            && let Some(abort) = r.fns.comm_abort
        {
            // SAFETY: NCCL's signature; the real communicator, not used after this.
            let _ = unsafe { abort(rc.0) };
        }
        own.msg = match (strict, real_missing) {
            (true, _) => format!(
                "{} (not falling back to the real NCCL: {}=0 on some rank)",
                own.msg,
                rescue::SETUP_FALLBACK_ENV
            ),
            (false, Some(why)) => format!("{} (no real NCCL to fall back to: {why})", own.msg),
            (false, None) => own.msg,
        };
        return Err(own);
    };
    let mine = rescue::encode_report(rescue::is_peer_loss(e), &e.to_string());
    let reports =
        rescue::gather_reports(call, r, rc, rank, nranks, &mine, deadline).map_err(|f| {
            Failure::new(
                own.code,
                format!(
                    "{}; and falling back to the real NCCL failed: {}",
                    own.msg, f.msg
                ),
            )
        })?;
    let why = rescue::summarize(&reports);
    log::warn(&format!(
        "rank {rank}/{nranks}: mscclpp could not set up this communicator ({why}); every call \
         on it runs on the real NCCL ({}, version {})",
        r.path, r.version
    ));
    Ok(Inner::real_only(rc, why))
}

/// Creates the real communicator when every rank has a real NCCL (agreed over `bs`);
/// `(None, why)` otherwise.
fn create_real(
    call: &str,
    bs: &BlockingBootstrap,
    cfg: ConfigCopy,
) -> Result<(Option<RealComm>, Option<String>), Failure> {
    let boot = |e: mscclpp_host::bootstrap::BootstrapError| Failure::from_comm(call, &e.into());
    let mine = real::real();
    let have = bs.all_gather(&[mine.is_ok() as u8]).map_err(boot)?;
    let Ok(real) = mine else {
        return Ok((None, Some(mine.err().unwrap_or_default().to_string())));
    };
    let without: Vec<usize> = (0..have.len())
        .filter(|&r| have[r].first() != Some(&1))
        .collect();
    if !without.is_empty() {
        return Ok((None, Some(format!("no real NCCL on rank(s) {without:?}"))));
    }
    let mut id = RawUniqueId { internal: [0; 128] };
    let mut payload = Vec::new();
    if bs.rank() == 0 {
        let get = real.fns.get_unique_id.expect("checked at load");
        // SAFETY: NCCL's signature; `id` is a live out-parameter.
        let r = unsafe { get(&mut id) };
        if r == result::SUCCESS {
            payload = id.internal.iter().map(|&c| c as u8).collect();
        }
    }
    let got = bs.broadcast(0, &payload).map_err(boot)?;
    if got.len() != 128 {
        return Err(Failure::new(
            result::SYSTEM_ERROR,
            format!(
                "{call}: rank 0 could not get a unique id from the real NCCL: {}",
                // SAFETY: null is allowed.
                unsafe { real.last_error(std::ptr::null_mut()) }
            ),
        ));
    }
    for (d, s) in id.internal.iter_mut().zip(&got) {
        *d = *s as _;
    }
    let mut out: Ptr = std::ptr::null_mut();
    let (n, r) = (bs.nranks() as c_int, bs.rank() as c_int);
    // Blocking, whatever the caller's config (or NCCL_COMM_BLOCKING) says: our calls block
    // anyway, and a nonblocking real communicator would make its splits and shrinks
    // nonblocking too (they take the parent's mode), writing their child's handle later.
    let mut blocking = cfg.blocking();
    let code = match real.fns.comm_init_rank_config {
        Some(f) => {
            // SAFETY: NCCL's signature; out-pointer to a local, a config alive here.
            unsafe { f(&mut out, n, id, r, &mut blocking) }
        }
        None => {
            let f = real.fns.comm_init_rank.expect("checked at load");
            // SAFETY: NCCL's signature; out-pointer to a local.
            unsafe { f(&mut out, n, id, r) }
        }
    };
    real_result(call, real, std::ptr::null_mut(), code)?;
    Ok((Some(RealComm(out)), None))
}

/// Runs `set_up` for several ranks of this process at once (one thread each, each on its
/// own GPU), as `ncclCommInitAll` and a group of set-ups need.
pub fn set_up_many(
    call: &str,
    jobs: Vec<(usize, usize, UniqueId, Gpu, ConfigCopy)>,
) -> Vec<Result<Inner, Failure>> {
    /// A result carried back across threads.
    struct Carry(Result<Inner, Failure>);
    // SAFETY: see `Comm`'s Send: the inner is only handed from the set-up thread to ours.
    unsafe impl Send for Carry {}
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(nranks, rank, id, gpu, cfg)| {
                s.spawn(move || Carry(set_up(call, nranks, rank, id, &gpu, RealSetup::Create(cfg))))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(c) => c.0,
                Err(_) => Err(Failure::new(
                    result::INTERNAL_ERROR,
                    format!("{call}: a set-up thread panicked"),
                )),
            })
            .collect()
    })
}

/// How long a communicator's rendezvous waits for its last rank when
/// `MSCCLPP_RENDEZVOUS_TIMEOUT` is not set: NCCL waits for ever, and programs call
/// `ncclCommInitRank` far apart (PyTorch creates a communicator at its first collective on
/// each group, and a rank may first download data or load a checkpoint), so the 30 s of the
/// other bootstrap waits would fail jobs NCCL runs. 30 minutes is PyTorch's default timeout
/// for its other backends (10 for NCCL); a rank that never comes is named when it passes.
pub const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The bootstrap settings of this library's communicators: `MSCCLPP_BOOTSTRAP_TIMEOUT` and
/// `MSCCLPP_RENDEZVOUS_TIMEOUT` (seconds) where set, else 30 s and [`RENDEZVOUS_TIMEOUT`];
/// a bad value is an invalid-argument error naming the variable.
pub fn bootstrap_config(call: &str) -> Result<BootstrapConfig, Failure> {
    Ok(bootstrap_config_of(settings_of(call)?))
}

/// This process's settings, or an invalid-argument failure of `call` naming the variables
/// that do not parse.
pub fn settings_of(call: &str) -> Result<&'static Settings, Failure> {
    Settings::global().map_err(|e| Failure::arg(format!("{call}: {e}")))
}

/// [`bootstrap_config`] of `settings`.
fn bootstrap_config_of(settings: &Settings) -> BootstrapConfig {
    let config = mscclpp_host::launch::bootstrap_config_from(settings);
    match config.rendezvous_timeout {
        Some(_) => config,
        None => config.with_rendezvous_timeout(RENDEZVOUS_TIMEOUT),
    }
}

/// A fresh bootstrap id. Its root runs in this process and listens where ranks on other
/// machines can reach it, as NCCL's does: on the interface `MSCCLPP_SOCKET_IFNAME` or
/// `NCCL_SOCKET_IFNAME` names, else on NCCL's default choice
/// ([`mscclpp_host::transport::tcp::root_ip`]: `ib*`, then any but `docker*`/`lo*`, ...).
pub fn new_id(call: &str) -> Result<UniqueId, Failure> {
    let ip = root_ip().map_err(|e| {
        Failure::new(
            result::SYSTEM_ERROR,
            format!("{call}: where the bootstrap root should listen: {e}"),
        )
    })?;
    let id = create_unique_id_at(SocketAddr::new(ip, 0), bootstrap_config(call)?).map_err(|e| {
        Failure::new(
            result::SYSTEM_ERROR,
            format!("{call}: bootstrap root on {ip}: {e}"),
        )
    })?;
    log::info(&format!(
        "{call}: bootstrap root listening on {}",
        id.root_addr()
    ));
    Ok(id)
}

/// NCCL's variable for a fixed root address (`ip:port`, `[ipv6]:port` or `host:port`):
/// `ncclGetUniqueId` then starts no root and returns an id every rank can compute alike, and
/// rank 0 of a communicator made from that id hosts the root, as with NCCL; ours listens on
/// the port after the one named, which the real NCCL's root (when one is loaded beside ours)
/// takes itself.
pub const COMM_ID_ENV: &str = "NCCL_COMM_ID";

/// The id of the fixed root address `value` (`NCCL_COMM_ID`'s forms; our root on the next
/// port): the bootstrap's `"ip:port"` form under `config`
/// ([`BootstrapConfig::address_id`]: its secret, else `MSCCLPP_BOOTSTRAP_SECRET`).
pub fn comm_id_from(
    call: &str,
    value: &str,
    config: &BootstrapConfig,
) -> Result<UniqueId, Failure> {
    use std::net::ToSocketAddrs;
    let bad = |why: String| {
        Failure::arg(format!(
            "{call}: {COMM_ID_ENV}={value:?}: {why} (expected ip:port, [ipv6]:port or host:port)"
        ))
    };
    let mut addr = value
        .trim()
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("names no address".into()))?;
    if addr.port() == 0 {
        return Err(bad("port 0 names no port the ranks could reach".into()));
    }
    // The real NCCL, when loaded beside ours, hosts its own root on the port itself.
    let ours = addr
        .port()
        .checked_add(1)
        .ok_or_else(|| bad("our root takes the next port, and there is none after 65535".into()))?;
    addr.set_port(ours);
    Ok(config.address_id(addr))
}

/// The fixed-root id of the environment (`NCCL_COMM_ID`), if it is set, under `config`.
pub fn env_comm_id(call: &str, config: &BootstrapConfig) -> Result<Option<UniqueId>, Failure> {
    match &settings_of(call)?.nccl_comm_id {
        Some(v) => comm_id_from(call, v, config).map(Some),
        None => Ok(None),
    }
}

/// Where a communicator's bootstrap finds its root: when `id` is the fixed-root id
/// (`fixed`, from `NCCL_COMM_ID`), rank 0 hosts the root at its address (the bootstrap's
/// `"ip:port"` form, which derives the same id); else the root that made `id`.
pub fn bootstrap_root(id: UniqueId, fixed: Option<UniqueId>) -> BootstrapRoot {
    match fixed {
        Some(f) if f == id => BootstrapRoot::Addr(id.root_addr()),
        _ => BootstrapRoot::Id(id),
    }
}

/// Reads our id from the bytes of an `ncclUniqueId`.
pub fn parse_id(call: &str, bytes: &[u8]) -> Result<UniqueId, Failure> {
    UniqueId::from_bytes(bytes).map_err(|e| {
        Failure::arg(format!(
            "{call}: the ncclUniqueId was not made by this library's ncclGetUniqueId ({e}); \
             every rank must load the same library"
        ))
    })
}

/// Everything every rank sends in a split: color and key.
pub fn encode_color_key(color: c_int, key: c_int) -> Vec<u8> {
    let mut v = color.to_le_bytes().to_vec();
    v.extend_from_slice(&key.to_le_bytes());
    v
}

/// The inverse of [`encode_color_key`].
pub fn decode_color_key(b: &[u8]) -> Option<(c_int, c_int)> {
    if b.len() != 8 {
        return None;
    }
    let c = c_int::from_le_bytes(b[0..4].try_into().ok()?);
    let k = c_int::from_le_bytes(b[4..8].try_into().ok()?);
    Some((c, k))
}

/// The real NCCL's communicator pointer of `inner`, or why there is none.
pub fn real_of(call: &str, inner: &Inner, what: &str) -> Result<(&'static Real, Ptr), Failure> {
    let why = |w: &str| {
        Failure::usage(format!(
            "{call}: {what} is not served by mscclpp, and there is no real NCCL to fall back to: \
             {w}"
        ))
    };
    match (real::real(), inner.real) {
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
mod tests {
    use super::*;

    /// The config a real split or shrink gets: blocking whatever the caller asked, the
    /// caller's other settings kept; NCCL's initializer without one; a short (older) config
    /// grown to hold the field.
    #[test]
    fn a_real_childs_config_is_blocking() {
        let c = ConfigCopy::NONE.blocking();
        assert_eq!((c.blocking, c.magic, c.size), (1, 0xcafe_beef, 80));
        assert_eq!(c.min_ctas, crate::types::CONFIG_UNDEF_INT);
        let mut mine = NcclConfig::initializer();
        mine.blocking = 0;
        mine.min_ctas = 4;
        // SAFETY: a live config of its size.
        let c = unsafe { ConfigCopy::new(&mine) }.blocking();
        assert_eq!((c.blocking, c.min_ctas, c.size), (1, 4, 80));
        mine.size = 16;
        // SAFETY: as above (16 bytes are read).
        let c = unsafe { ConfigCopy::new(&mine) }.blocking();
        assert_eq!((c.blocking, c.min_ctas, c.size), (1, 0, 20));
    }

    /// A split or shrink without a config passes on the parent's (as NCCL's children inherit
    /// it), kept without its strings; with one, the caller's.
    #[test]
    fn a_child_without_a_config_inherits_the_parents() {
        let mut parent = NcclConfig::initializer();
        parent.min_ctas = 8;
        parent.comm_name = c"trainer".as_ptr();
        // SAFETY: a live config of its size.
        let kept = unsafe { ConfigCopy::new(&parent) }.without_strings();
        // SAFETY: NULL: the parent's.
        let c = unsafe { ConfigCopy::for_child(std::ptr::null(), kept) }.blocking();
        assert_eq!((c.min_ctas, c.blocking), (8, 1));
        assert!(c.comm_name.is_null() && c.net_name.is_null());
        let mut mine = NcclConfig::initializer();
        mine.min_ctas = 2;
        // SAFETY: a live config of its size.
        let c = unsafe { ConfigCopy::for_child(&mine, kept) }.blocking();
        assert_eq!(c.min_ctas, 2);
        assert_eq!(
            ConfigCopy::NONE.without_strings().blocking().min_ctas,
            crate::types::CONFIG_UNDEF_INT
        );
    }

    #[test]
    fn communicators_wait_long_for_late_ranks_unless_told_otherwise() {
        let of = |pairs: &[(&str, &str)]| {
            bootstrap_config_of(&Settings::from_vars(pairs.iter().copied()).unwrap())
        };
        let c = of(&[]);
        assert_eq!(c.timeout, Duration::from_secs(30));
        assert_eq!(c.rendezvous_wait(), Duration::from_secs(1800));
        let c = of(&[
            ("MSCCLPP_BOOTSTRAP_TIMEOUT", "12"),
            ("MSCCLPP_RENDEZVOUS_TIMEOUT", "90.5"),
        ]);
        assert_eq!(c.timeout, Duration::from_secs(12));
        assert_eq!(c.rendezvous_wait(), Duration::from_millis(90_500));
        assert_eq!(c.late_wait(), Duration::from_millis(90_500));
        // A rendezvous bound below the bootstrap timeout never shortens the waits for late
        // ranks at teardown, split and shrink.
        let c = of(&[
            ("MSCCLPP_BOOTSTRAP_TIMEOUT", "12"),
            ("MSCCLPP_RENDEZVOUS_TIMEOUT", "5"),
        ]);
        assert_eq!(c.late_wait(), Duration::from_secs(12));
        for (var, bad) in [
            ("MSCCLPP_BOOTSTRAP_TIMEOUT", "0"),
            ("MSCCLPP_RENDEZVOUS_TIMEOUT", "forever"),
        ] {
            let e = Settings::from_vars([(var, bad)]).unwrap_err().to_string();
            assert!(e.contains(&format!("{var}=\"{bad}\"")), "{e}");
        }
    }

    #[test]
    fn color_key_roundtrip() {
        for (c, k) in [(0, 0), (-1, 7), (i32::MAX, i32::MIN)] {
            assert_eq!(decode_color_key(&encode_color_key(c, k)), Some((c, k)));
        }
        assert_eq!(decode_color_key(&[1, 2, 3]), None);
    }

    #[test]
    fn foreign_and_null_handles() {
        assert!(matches!(lookup(std::ptr::null_mut()), Handle::Null));
        let x = 5u64;
        assert!(matches!(
            lookup(&x as *const u64 as Ptr),
            Handle::Foreign(_)
        ));
        assert!(unregister(&x as *const u64 as Ptr).is_none());
    }

    #[test]
    fn ids_from_elsewhere_are_refused() {
        let e = parse_id("t", &[0u8; 128]).err().unwrap();
        assert_eq!(e.code, result::INVALID_ARGUMENT);
        let id = new_id("t").unwrap();
        assert_eq!(parse_id("t", id.as_bytes()).unwrap(), id);
    }

    #[test]
    fn nccl_comm_id_gives_every_rank_the_same_id_and_rank_0_hosts_the_root() {
        // No secret (an empty one counts as none, whatever MSCCLPP_BOOTSTRAP_SECRET says).
        let plain_config = BootstrapConfig::default().with_secret("");
        let plain = comm_id_from("t", "127.0.0.1:50123", &plain_config).unwrap();
        // Ours on the next port: the real NCCL's root may take the one named.
        assert_eq!(plain.root_addr(), "127.0.0.1:50124".parse().unwrap());
        assert_eq!(
            plain,
            comm_id_from("t", " 127.0.0.1:50123 ", &plain_config).unwrap()
        );
        let secret = comm_id_from(
            "t",
            "127.0.0.1:50123",
            &BootstrapConfig::default().with_secret("s3"),
        )
        .unwrap();
        assert_ne!(secret, plain, "the secret enters the id");
        assert_eq!(
            secret,
            comm_id_from(
                "t",
                "127.0.0.1:50123",
                &BootstrapConfig::default().with_secret("s3")
            )
            .unwrap()
        );
        let v6 = comm_id_from("t", "[::1]:50123", &plain_config).unwrap();
        assert!(v6.root_addr().is_ipv6());
        assert!(comm_id_from("t", "localhost:50123", &plain_config).is_ok());
        for bad in [
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:99999",
            "127.0.0.1:65535",
            "",
        ] {
            let e = comm_id_from("t", bad, &plain_config).unwrap_err();
            assert_eq!(e.code, result::INVALID_ARGUMENT, "{bad}");
            assert!(e.msg.contains("NCCL_COMM_ID"), "{}", e.msg);
        }
        // Only the fixed id makes rank 0 host the root; any other id keeps its own root.
        let other = new_id("t").unwrap();
        assert_eq!(bootstrap_root(other, Some(plain)), BootstrapRoot::Id(other));
        assert_eq!(bootstrap_root(other, None), BootstrapRoot::Id(other));
        // Two ranks meet through a fixed address, rank 0 hosting the root there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let id = comm_id_from("t", &format!("127.0.0.1:{}", port - 1), &plain_config).unwrap();
        assert_eq!(id.root_addr().port(), port);
        assert_eq!(
            bootstrap_root(id, Some(id)),
            BootstrapRoot::Addr(id.root_addr())
        );
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let b = BlockingBootstrap::init(2, rank, bootstrap_root(id, Some(id))).unwrap();
                    b.all_gather(&[rank as u8 + 10]).unwrap()
                })
            })
            .collect();
        for r in ranks {
            assert_eq!(r.join().unwrap(), vec![vec![10u8], vec![11u8]]);
        }
    }

    #[test]
    fn a_new_ids_root_listens_where_other_machines_can_reach_it_and_ranks_join() {
        let id = new_id("t").unwrap();
        // Not 127.0.0.1 unless this machine has nothing else (root_ip's own tests check
        // the order); here, where it is, two ranks meet through it.
        assert_eq!(id.root_addr().ip(), root_ip().unwrap());
        assert_ne!(id.root_addr().port(), 0);
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let b = BlockingBootstrap::init(2, rank, id).unwrap();
                    b.all_gather(&[rank as u8]).unwrap()
                })
            })
            .collect();
        for r in ranks {
            assert_eq!(r.join().unwrap(), vec![vec![0u8], vec![1u8]]);
        }
    }
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
