//! Host implementation: the same functions over `core::sync::atomic`, and [`launch`], which
//! runs a kernel body on CPU threads with per-block barriers and shared memory.
//!
//! Outside [`launch`] a calling thread is a grid of one thread in one block: ids are 0,
//! dims are 1 and [`sync_threads`] returns at once. This is how the Host transport's CPU
//! "kernels" call device protocol functions.

use core::cell::RefCell;
use core::sync::atomic::Ordering;
#[cfg(not(mscclpp_loom))]
use core::sync::atomic::{AtomicU32, AtomicU64, fence};
use std::boxed::Box;
use std::sync::{Condvar, Mutex};
use std::vec::Vec;

/// Launch dimensions (x, y, z), as in CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim3 {
    /// Extent along x.
    pub x: u32,
    /// Extent along y.
    pub y: u32,
    /// Extent along z.
    pub z: u32,
}

impl Dim3 {
    /// `(x, 1, 1)`.
    pub const fn x(x: u32) -> Dim3 {
        Dim3 { x, y: 1, z: 1 }
    }
    fn count(&self) -> u64 {
        self.x as u64 * self.y as u64 * self.z as u64
    }
    fn unflatten(&self, i: u32) -> [u32; 3] {
        [i % self.x, (i / self.x) % self.y, i / (self.x * self.y)]
    }
}

/// Whether kernels may run on blocks of fewer threads than ranks: yes on the host, where
/// the Host backend runs the all-reduce kernels on one thread a rank (the collectives'
/// `for_ranks_of`); GPU launches give a block at least `nranks` threads, and there the
/// per-rank duties keep their one-thread-per-rank form.
pub const NARROW_BLOCKS: bool = true;

/// The most CPU threads one [`launch`] may start (one per emulated GPU thread).
pub const MAX_HOST_THREADS: u64 = 4096;

/// Why [`launch`] refused or failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchError {
    /// A dimension is zero or the grid needs more than [`MAX_HOST_THREADS`] threads.
    BadDimensions {
        /// Grid size.
        grid: Dim3,
        /// Block size.
        block: Dim3,
    },
    /// A thread of the kernel panicked (or called [`trap`]); the message of the first.
    Panicked(std::string::String),
    /// The CPU threads to run the kernel could not be started (the system's error); no
    /// thread of the kernel ran.
    NoThreads(std::string::String),
}

impl core::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LaunchError::BadDimensions { grid, block } => write!(
                f,
                "host launch of grid {grid:?} x block {block:?}: every dimension must be \
                 non-zero and the total at most {MAX_HOST_THREADS} threads"
            ),
            LaunchError::Panicked(m) => write!(f, "host kernel panicked: {m}"),
            LaunchError::NoThreads(e) => write!(f, "host launch: cannot start CPU threads: {e}"),
        }
    }
}

impl std::error::Error for LaunchError {}

/// Barrier of one emulated block; poisoned when one of its threads panics, so the others
/// panic too instead of waiting forever.
#[derive(Debug)]
struct BlockBarrier {
    state: Mutex<BarrierState>,
    cv: Condvar,
    size: u32,
    /// `state.generation`, readable without the lock: a waiter polls it briefly before it
    /// sleeps (a block's threads usually arrive within microseconds of each other).
    generation: core::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct BarrierState {
    arrived: u32,
    generation: u64,
    poisoned: bool,
}

/// Rounds a barrier waiter polls before it sleeps.
const BARRIER_SPIN_ROUNDS: u32 = 2000;

impl BlockBarrier {
    fn wait(&self) {
        if self.size == 1 {
            // A block of one thread (the Host backend's all-reduce) has no one to wait
            // for, and the lock and wake-up below would cost a system call.
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.poisoned {
            panic!("another thread of this block panicked");
        }
        s.arrived += 1;
        if s.arrived == self.size {
            s.arrived = 0;
            s.generation += 1;
            self.generation.store(s.generation, Ordering::Release);
            self.cv.notify_all();
            return;
        }
        let gen_at_entry = s.generation;
        drop(s);
        for _ in 0..BARRIER_SPIN_ROUNDS {
            if self.generation.load(Ordering::Acquire) != gen_at_entry {
                return;
            }
            core::hint::spin_loop();
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while s.generation == gen_at_entry && !s.poisoned {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.generation == gen_at_entry {
            panic!("another thread of this block panicked");
        }
    }
    fn poison(&self) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .poisoned = true;
        self.cv.notify_all();
    }
}

#[derive(Debug)]
struct Block {
    barrier: BlockBarrier,
    shared: Mutex<Vec<(u64, Box<[u128]>)>>,
}

impl Block {
    fn new(size: u32) -> Block {
        Block {
            barrier: BlockBarrier {
                state: Mutex::new(BarrierState::default()),
                cv: Condvar::new(),
                size,
                generation: core::sync::atomic::AtomicU64::new(0),
            },
            shared: Mutex::new(Vec::new()),
        }
    }
    fn shared(&self, site: u64, bytes: usize) -> *mut u8 {
        let mut v = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, b)) = v.iter_mut().find(|(s, _)| *s == site) {
            return b.as_mut_ptr() as *mut u8;
        }
        let words = bytes.div_ceil(16).max(1);
        let mut b: Box<[u128]> = std::vec![0u128; words].into_boxed_slice();
        let p = b.as_mut_ptr() as *mut u8;
        // The box's heap allocation does not move when the box is moved into the vector.
        v.push((site, b));
        p
    }
}

#[derive(Clone, Copy)]
struct Ctx {
    tid: [u32; 3],
    bid: [u32; 3],
    bdim: Dim3,
    gdim: Dim3,
    block: *const Block,
}

std::thread_local! {
    static CTX: RefCell<Option<Ctx>> = const { RefCell::new(None) };
    static SOLO: Block = Block::new(1);
}

fn ctx() -> Option<Ctx> {
    CTX.with(|c| *c.borrow())
}

/// Runs `body` once per thread of a `grid` × `block` launch on CPU threads (all at once, so
/// blocks may wait on each other as GPU blocks of a small grid can: the calling thread runs
/// the first and threads kept from earlier launches the rest), and returns when all have
/// finished. A panic or [`trap`] in any thread is returned as an error after the
/// others stop (threads waiting at a barrier of that block panic too).
pub fn launch<F>(grid: Dim3, block: Dim3, body: F) -> Result<(), LaunchError>
where
    F: Fn() + Sync,
{
    let total = grid.count() * block.count();
    if grid.count() == 0 || block.count() == 0 || total > MAX_HOST_THREADS {
        return Err(LaunchError::BadDimensions { grid, block });
    }
    let blocks: Vec<Block> = (0..grid.count())
        .map(|_| Block::new(block.count() as u32))
        .collect();
    let per_block = block.count() as usize;
    let first_panic: Mutex<Option<std::string::String>> = Mutex::new(None);
    let run_one = |i: usize| {
        let (b, t) = (i / per_block, i % per_block);
        let blk = &blocks[b];
        let c = Ctx {
            tid: block.unflatten(t as u32),
            bid: grid.unflatten(b as u32),
            bdim: block,
            gdim: grid,
            block: blk,
        };
        // The launching thread runs index 0: put back whatever context it had.
        let outer = CTX.with(|x| x.borrow_mut().replace(c));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&body));
        CTX.with(|x| *x.borrow_mut() = outer);
        if let Err(p) = r {
            blk.barrier.poison();
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| std::string::String::from(*s))
                .or_else(|| p.downcast_ref::<std::string::String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            let mut fp = first_panic.lock().unwrap_or_else(|e| e.into_inner());
            // A barrier's "another thread panicked" is a consequence, not a cause.
            if fp.is_none() || fp.as_deref().is_some_and(|m| m.starts_with("another")) {
                *fp = Some(msg);
            }
        }
    };
    pool::run(total as usize, &run_one).map_err(|e| LaunchError::NoThreads(std::format!("{e}")))?;
    match first_panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(m) => Err(LaunchError::Panicked(m)),
        None => Ok(()),
    }
}

macro_rules! sreg {
    ($(#[$m:meta])* $name:ident, $field:ident, $i:tt, $solo:expr) => {
        $(#[$m])*
        #[inline]
        pub fn $name() -> u32 {
            ctx().map_or($solo, |c| sreg!(@get c, $field, $i))
        }
    };
    (@get $c:ident, tid, $i:tt) => { $c.tid[$i] };
    (@get $c:ident, bid, $i:tt) => { $c.bid[$i] };
    (@get $c:ident, bdim, 0) => { $c.bdim.x };
    (@get $c:ident, bdim, 1) => { $c.bdim.y };
    (@get $c:ident, bdim, 2) => { $c.bdim.z };
    (@get $c:ident, gdim, 0) => { $c.gdim.x };
    (@get $c:ident, gdim, 1) => { $c.gdim.y };
    (@get $c:ident, gdim, 2) => { $c.gdim.z };
}

sreg!(/// Thread index within the block, x.
    thread_idx_x, tid, 0, 0);
sreg!(/// Thread index within the block, y.
    thread_idx_y, tid, 1, 0);
sreg!(/// Thread index within the block, z.
    thread_idx_z, tid, 2, 0);
sreg!(/// Block index within the grid, x.
    block_idx_x, bid, 0, 0);
sreg!(/// Block index within the grid, y.
    block_idx_y, bid, 1, 0);
sreg!(/// Block index within the grid, z.
    block_idx_z, bid, 2, 0);
sreg!(/// Threads per block, x.
    block_dim_x, bdim, 0, 1);
sreg!(/// Threads per block, y.
    block_dim_y, bdim, 1, 1);
sreg!(/// Threads per block, z.
    block_dim_z, bdim, 2, 1);
sreg!(/// Blocks in the grid, x.
    grid_dim_x, gdim, 0, 1);
sreg!(/// Blocks in the grid, y.
    grid_dim_y, gdim, 1, 1);
sreg!(/// Blocks in the grid, z.
    grid_dim_z, gdim, 2, 1);

/// Block-wide barrier: waits for every thread of the emulated block; the mutex hand-off
/// orders memory like `bar.sync`. Outside [`launch`] it returns at once.
pub fn sync_threads() {
    if let Some(c) = ctx() {
        // SAFETY: `block` points into the `blocks` vector that `launch` keeps alive until
        // every thread of the scope has returned, and this thread is one of them.
        unsafe { &*c.block }.barrier.wait();
    }
}

/// Programmatic dependent launch, waiting side: nothing on the host (emulated kernels run
/// one launch at a time).
pub fn grid_dependency_wait() {}

/// A store into the emulated block's shared memory.
///
/// # Safety
/// `p` points into this block's shared memory, 8-aligned, not accessed concurrently.
pub unsafe fn st_shared_u64(p: *mut u64, v: u64) {
    // SAFETY: caller contract.
    unsafe { p.write_volatile(v) }
}

/// A cache hint: nothing on the host.
pub fn prefetch_l1(_p: *const u8) {}

/// A cache hint: nothing on the host.
pub fn prefetch_l2(_p: *const u8) {}

/// Programmatic dependent launch, triggering side: nothing on the host.
pub fn launch_dependents() {}

/// Ends the emulated kernel with a panic, which [`launch`] reports as an error.
pub fn trap() -> ! {
    panic!("trap")
}

/// Storage of one [`shared_array!`](crate::shared_array) site for the calling block.
#[doc(hidden)]
pub fn block_shared(site: u64, bytes: usize) -> *mut u8 {
    match ctx() {
        // SAFETY: as in `sync_threads`, the block outlives this thread's kernel body.
        Some(c) => unsafe { &*c.block }.shared(site, bytes),
        None => SOLO.with(|b| b.shared(site, bytes)),
    }
}

// The model-checking seam. Every memory-model access below goes through `atomic_u64` /
// `atomic_u32` (and `fence`): normally the word itself viewed as a `core` atomic; under
// `--cfg mscclpp_loom` the loom atomic that [`shadow`] registered for that address, since
// loom atomics cannot live in memory that protocol code addresses by raw pointer.
#[cfg(mscclpp_loom)]
pub mod shadow;
#[cfg(mscclpp_loom)]
use ::loom::sync::atomic::fence;
#[cfg(mscclpp_loom)]
use shadow::{atomic_u32, atomic_u64};

/// The `u64` at `p` as an atomic.
///
/// # Safety
/// `p` must be valid and 8-byte aligned for `'a`, and only accessed atomically while shared.
#[cfg(not(mscclpp_loom))]
#[inline(always)]
unsafe fn atomic_u64<'a>(p: *mut u64) -> &'a AtomicU64 {
    // SAFETY: forwarded to the caller.
    unsafe { AtomicU64::from_ptr(p) }
}

/// The `u32` at `p` as an atomic.
///
/// # Safety
/// `p` must be valid and 4-byte aligned for `'a`, and only accessed atomically while shared.
#[cfg(not(mscclpp_loom))]
#[inline(always)]
unsafe fn atomic_u32<'a>(p: *mut u32) -> &'a AtomicU32 {
    // SAFETY: forwarded to the caller.
    unsafe { AtomicU32::from_ptr(p) }
}

/// Acquire load (`ld.acquire.sys.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn ld_acquire_sys_u64(p: *const u64) -> u64 {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u64(p as *mut u64) }.load(Ordering::Acquire)
}

/// Acquire load (`ld.acquire.sys.u32` on the GPU).
///
/// # Safety
/// `p` must be valid and 4-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn ld_acquire_sys_u32(p: *const u32) -> u32 {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u32(p as *mut u32) }.load(Ordering::Acquire)
}

/// Relaxed load (`ld.relaxed.sys.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn ld_relaxed_sys_u64(p: *const u64) -> u64 {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u64(p as *mut u64) }.load(Ordering::Relaxed)
}

/// Release store (`st.release.sys.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn st_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u64(p) }.store(v, Ordering::Release)
}

/// Relaxed store (`st.relaxed.sys.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn st_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u64(p) }.store(v, Ordering::Relaxed)
}

/// Release store (`st.release.sys.u32` on the GPU).
///
/// # Safety
/// `p` must be valid and 4-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn st_release_sys_u32(p: *mut u32, v: u32) {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u32(p) }.store(v, Ordering::Release)
}

/// Release add returning the old value (`atom.add.release.sys.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn atomic_add_release_sys_u64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u64(p) }.fetch_add(v, Ordering::Release)
}

/// Relaxed add returning the old value (`atom.add.relaxed.sys.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn atomic_add_relaxed_sys_u64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u64(p) }.fetch_add(v, Ordering::Relaxed)
}

/// Relaxed add returning the old value (`atom.add.relaxed.gpu.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn atomic_add_relaxed_gpu_u64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u64(p) }.fetch_add(v, Ordering::Relaxed)
}

/// Compare-and-swap (`atom.cas.relaxed.gpu.b64` on the GPU): stores `new` if `*p == cmp`;
/// returns the old value.
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
pub unsafe fn atomic_cas_relaxed_gpu_u64(p: *mut u64, cmp: u64, new: u64) -> u64 {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    match unsafe { atomic_u64(p) }.compare_exchange(cmp, new, Ordering::Relaxed, Ordering::Relaxed)
    {
        Ok(v) | Err(v) => v,
    }
}

/// Release add without a result (`red.release.sys.global.add.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn red_add_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: forwarded to the caller.
    unsafe { atomic_add_release_sys_u64(p, v) };
}

/// Relaxed maximum without a result (`red.relaxed.sys.global.max.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn red_max_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees validity, alignment and atomic-only shared access.
    unsafe { atomic_u64(p) }.fetch_max(v, Ordering::Relaxed);
}

/// Relaxed add without a result (`red.relaxed.sys.global.add.u64` on the GPU).
///
/// # Safety
/// `p` must be valid and 8-byte aligned, and only accessed atomically while shared.
#[inline]
pub unsafe fn red_add_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: forwarded to the caller.
    unsafe { atomic_add_relaxed_sys_u64(p, v) };
}

/// Acquire-release fence (`fence.acq_rel.sys` on the GPU).
#[inline]
pub fn fence_acq_rel_sys() {
    fence(Ordering::AcqRel)
}

/// Acquire-release fence among threads of one GPU (`fence.acq_rel.gpu` on the GPU).
#[inline]
pub fn fence_acq_rel_gpu() {
    fence(Ordering::AcqRel)
}

/// Sequentially consistent fence (`fence.sc.sys` on the GPU).
#[inline]
pub fn fence_sc_sys() {
    fence(Ordering::SeqCst)
}

/// The 16-byte store of `[lo, hi]` (`st.volatile.global.v2.u64` on the GPU). The CPU has no
/// portable 16-byte atomic store, so the host writes `lo` relaxed and then `hi` with
/// release: a reader that acquires `hi` (where protocols keep their commit bit) sees `lo`.
///
/// # Safety
/// `p` must point to 16 valid, 16-byte aligned bytes accessed only atomically while shared.
#[inline]
pub unsafe fn st_volatile_v2_u64(p: *mut u64, lo: u64, hi: u64) {
    // SAFETY: caller guarantees 16 valid aligned bytes with atomic-only shared access.
    unsafe {
        atomic_u64(p).store(lo, Ordering::Relaxed);
        atomic_u64(p.add(1)).store(hi, Ordering::Release);
    }
}

/// The 8-byte volatile store (`st.volatile.global.u64` on the GPU): a relaxed atomic store.
///
/// # Safety
/// `p` must point to 8 valid, 8-byte aligned bytes accessed only atomically while shared.
#[inline]
pub unsafe fn st_volatile_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees 8 valid aligned bytes with atomic-only shared access.
    unsafe { atomic_u64(p) }.store(v, Ordering::Relaxed)
}

/// The 8-byte volatile load (`ld.volatile.global.u64` on the GPU): a relaxed atomic load.
///
/// # Safety
/// `p` must point to 8 valid, 8-byte aligned bytes accessed only atomically while shared.
#[inline]
pub unsafe fn ld_volatile_u64(p: *const u64) -> u64 {
    // SAFETY: caller guarantees 8 valid aligned bytes with atomic-only shared access.
    unsafe { atomic_u64(p as *mut u64) }.load(Ordering::Relaxed)
}

/// The 16-byte volatile load (`ld.volatile.global.v2.u64` on the GPU): each word with a
/// relaxed atomic load, `lo` first. Like the GPU's, each word is read whole and nothing is
/// ordered, so a reader must validate each word on its own (LL packets carry a flag in both).
///
/// # Safety
/// `p` must point to 16 valid, 16-byte aligned bytes accessed only atomically while shared.
#[inline]
pub unsafe fn ld_volatile_v2_u64(p: *const u64) -> [u64; 2] {
    let p = p as *mut u64;
    // SAFETY: caller guarantees 16 valid aligned bytes with atomic-only shared access.
    unsafe {
        [
            atomic_u64(p).load(Ordering::Relaxed),
            atomic_u64(p.add(1)).load(Ordering::Relaxed),
        ]
    }
}

/// The 16-byte weak load (`ld.v2.u64` on the GPU): a plain, non-atomic read.
///
/// # Safety
/// `p` must point to 16 valid, 16-byte aligned bytes not written concurrently.
#[inline]
pub unsafe fn ld_weak_v2_u64(p: *const u64) -> [u64; 2] {
    // SAFETY: caller guarantees validity, alignment and the absence of a racing write.
    unsafe { (p as *const [u64; 2]).read() }
}

/// The 16-byte weak store (`st.v2.u64` on the GPU): a plain, non-atomic write.
///
/// # Safety
/// `p` must point to 16 valid, 16-byte aligned bytes not accessed concurrently.
#[inline]
pub unsafe fn st_weak_v2_u64(p: *mut u64, lo: u64, hi: u64) {
    // SAFETY: caller guarantees validity, alignment and the absence of a racing access.
    unsafe { (p as *mut [u64; 2]).write([lo, hi]) }
}

/// Nanoseconds since the first call in this process (`%globaltimer` on the GPU). Under
/// loom it is always 0: time does not pass in a model, so no timeout fires there (timeouts
/// are tested on real threads).
pub fn global_timer_ns() -> u64 {
    #[cfg(mscclpp_loom)]
    return 0;
    #[cfg(not(mscclpp_loom))]
    {
        use std::sync::OnceLock;
        use std::time::Instant;
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Rounds of one wait that loom explores. A failed round of a polling loop only reads, so
/// further rounds revisit the same states; and with two threads waiting, a schedule that
/// alternates between them starves the thread they wait for without spending loom's
/// preemption bound (switching after a yield is free), so the model would never end.
/// After this many rounds the execution finishes on loom's default schedule, which runs
/// the least-yielded thread; interleavings after a long wait are still explored from the
/// shorter waits that reach the same state.
#[cfg(mscclpp_loom)]
pub const LOOM_EXPLORED_ROUNDS: u32 = 2;

/// Called once per round of a polling loop, `round` counting from 0. On the host it spins
/// for the first rounds, then yields the OS thread, and after [`SLEEP_AFTER_ROUNDS`] sleeps
/// [`BACKOFF_SLEEP`] a round: CPU "kernels" often have more threads than there are cores,
/// and the thread they wait for (a peer's, the proxy's, a TCP receiver's) may need this
/// one's core. Yielding alone was not enough on a 2-core machine running many ranks'
/// kernels: threads that yield keep every core busy, and a proxy thread waking from its
/// idle sleep waited behind them until a rank fell 30 s behind its peers (in a loop of
/// cross-host runs on the Host transport). Before any of that it runs the
/// [`set_wait_helper`] function, which may do the awaited work on this thread.
/// Under loom it yields to the model's scheduler (which must know the thread is waiting),
/// and from round `LOOM_EXPLORED_ROUNDS` on stops loom from branching further in this
/// execution (see there).
#[inline]
pub fn spin_backoff(round: u32) {
    #[cfg(mscclpp_loom)]
    {
        if round >= LOOM_EXPLORED_ROUNDS {
            ::loom::skip_branch();
        }
        ::loom::thread::yield_now();
    }
    #[cfg(not(mscclpp_loom))]
    if help_waiting() {
        // The waiter did work someone else would have had to wake up for.
    } else if round < 64 {
        core::hint::spin_loop();
    } else if round < SLEEP_AFTER_ROUNDS {
        std::thread::yield_now();
    } else {
        std::thread::sleep(BACKOFF_SLEEP);
    }
}

/// What a waiting CPU thread may do itself: a function that does some of the work other
/// threads of the process would do (the Host backend's proxies serve their FIFOs) and says
/// whether it found any. Set once, by the host side, with [`set_wait_helper`].
#[cfg(not(mscclpp_loom))]
static WAIT_HELPER: std::sync::OnceLock<fn() -> bool> = std::sync::OnceLock::new();

/// Makes every round of [`spin_backoff`] call `helper` first (and skip its spin, yield or
/// sleep when `helper` found work): a CPU kernel that waits for a peer's signal then serves
/// the trigger it pushed itself instead of waiting for the proxy thread to be scheduled.
/// Only the first call sets it; later calls are ignored. `helper` must be cheap when there
/// is nothing to do, must not block, and must tolerate being called from inside itself.
#[cfg(not(mscclpp_loom))]
pub fn set_wait_helper(helper: fn() -> bool) {
    let _ = WAIT_HELPER.set(helper);
}

/// Runs the [`set_wait_helper`] function, if any: whether it found work.
#[cfg(not(mscclpp_loom))]
#[inline]
fn help_waiting() -> bool {
    WAIT_HELPER.get().is_some_and(|h| h())
}

/// Rounds of [`spin_backoff`] before it sleeps (a few milliseconds of yielding).
#[cfg(not(mscclpp_loom))]
pub const SLEEP_AFTER_ROUNDS: u32 = 4096;

/// How long [`spin_backoff`] sleeps a round after [`SLEEP_AFTER_ROUNDS`]: short against
/// every timeout and grace of the waits, long enough to hand the core over.
#[cfg(not(mscclpp_loom))]
pub const BACKOFF_SLEEP: std::time::Duration = std::time::Duration::from_micros(50);

mod pool;
#[cfg(test)]
mod tests;

/// Adds two pairs of IEEE half floats lane by lane, rounding to nearest even (the GPU's
/// `add.rn.f16x2`). Each `u32` holds two f16 bit patterns, lane 0 in the low half. The sum
/// is formed in f32, which holds it exactly enough: with 24 >= 2 * 11 + 2 bits, rounding to
/// f32 and then to f16 gives the correctly rounded f16 sum.
#[inline]
pub fn add_f16x2(a: u32, b: u32) -> u32 {
    use half::f16;
    let lane = |x: u32, y: u32| {
        let s = f16::from_bits(x as u16).to_f32() + f16::from_bits(y as u16).to_f32();
        f16::from_f32(s).to_bits() as u32
    };
    lane(a & 0xffff, b & 0xffff) | lane(a >> 16, b >> 16) << 16
}

/// Adds two pairs of bfloat16 lane by lane, rounding to nearest even (the GPU's
/// `fma.rn.bf16x2` with 1.0). As for [`add_f16x2`], the f32 sum rounds correctly
/// (24 >= 2 * 8 + 2).
#[inline]
pub fn add_bf16x2(a: u32, b: u32) -> u32 {
    use half::bf16;
    let lane = |x: u32, y: u32| {
        let s = bf16::from_bits(x as u16).to_f32() + bf16::from_bits(y as u16).to_f32();
        bf16::from_f32(s).to_bits() as u32
    };
    lane(a & 0xffff, b & 0xffff) | lane(a >> 16, b >> 16) << 16
}

/// Multiplies two pairs of IEEE half floats lane by lane, rounding to nearest even (the
/// GPU's `mul.rn.f16x2`): the f32 product of two f16 values is exact (2 * 11 <= 24 bits),
/// so rounding it to f16 rounds once.
#[inline]
pub fn mul_f16x2(a: u32, b: u32) -> u32 {
    use half::f16;
    let lane = |x: u32, y: u32| {
        let s = f16::from_bits(x as u16).to_f32() * f16::from_bits(y as u16).to_f32();
        f16::from_f32(s).to_bits() as u32
    };
    lane(a & 0xffff, b & 0xffff) | lane(a >> 16, b >> 16) << 16
}

/// An IEEE half float's bits to f32 (exact; the GPU's `cvt.f32.f16`).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// f32 to IEEE half float bits, rounded to nearest even (the GPU's `cvt.rn.f16.f32`).
#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    half::f16::from_f32(f).to_bits()
}
