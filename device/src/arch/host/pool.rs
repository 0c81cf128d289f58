//! The CPU threads that run [`launch`](super::launch)'s emulated GPU threads: kept alive
//! between launches and handed the next one's work, so a launch costs a wake-up per thread
//! instead of an OS thread's creation and exit (hundreds of microseconds on a loaded
//! 2-core machine, which every Host-backend collective call paid once per emulated thread).
//!
//! [`run`] runs `f(0)` on the calling thread and `f(1..n)` on pooled threads, and returns
//! when all have returned. A thread with no work spins briefly, then sleeps on its own
//! condition variable; at most [`MAX_IDLE`] idle threads are kept, the rest exit.

use core::hint::spin_loop;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::vec::Vec;

/// Most idle threads kept for later launches (more than any launch of the collectives
/// needs: they use a few blocks of a few threads).
pub(super) const MAX_IDLE: usize = 256;

/// How long a thread polls (spinning, then yielding its core) before it sleeps, waiting
/// for work or for the other threads of a launch: longer than the gap between two calls of
/// a rank that calls collectives back to back, short enough not to keep a core from others
/// for long.
const POLL_FOR: std::time::Duration = std::time::Duration::from_micros(500);

/// Polls `ready` for up to [`POLL_FOR`]: spins first, then yields the core (the thread it
/// waits for may need it). Whether `ready` became true.
fn poll(ready: impl Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    for round in 0u32.. {
        if ready() {
            return true;
        }
        if round < 64 {
            spin_loop();
        } else {
            if round % 16 == 0 && start.elapsed() > POLL_FOR {
                return false;
            }
            std::thread::yield_now();
        }
    }
    false
}

/// One unit of work: `call(data, index)`, where `data` points at the launcher's closure.
struct Task {
    call: unsafe fn(*const (), usize),
    data: *const (),
    index: usize,
    done: Arc<Done>,
}

// SAFETY: `data` points at a `Sync` closure that the launcher keeps alive until every task
// it handed out has counted itself done in `done` (see `run`).
unsafe impl Send for Task {}

/// Counts the tasks of one launch still running.
struct Done {
    left: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

struct Worker {
    ready: AtomicBool,
    slot: Mutex<Option<Task>>,
    cv: Condvar,
}

static IDLE: Mutex<Vec<Arc<Worker>>> = Mutex::new(Vec::new());

/// Runs `f(i)` for every `i` in `0..n`, `f(0)` on this thread and the others on pooled
/// threads, and returns when all have returned. `f` must not unwind (callers catch panics
/// inside it). Fails, running nothing, when a needed thread cannot be started.
pub(super) fn run<F: Fn(usize) + Sync>(n: usize, f: &F) -> Result<(), std::io::Error> {
    /// # Safety
    /// `data` points at a live `F`.
    unsafe fn call<F: Fn(usize) + Sync>(data: *const (), index: usize) {
        // SAFETY: caller contract.
        unsafe { (*(data as *const F))(index) }
    }
    if n <= 1 {
        if n == 1 {
            f(0);
        }
        return Ok(());
    }
    // Every thread first, so that no task starts unless all can (they may wait on each
    // other at a barrier).
    let mut workers: Vec<Arc<Worker>> = {
        let mut g = IDLE.lock().unwrap_or_else(|e| e.into_inner());
        let at = g.len() - g.len().min(n - 1);
        g.split_off(at)
    };
    while workers.len() < n - 1 {
        match spawn() {
            Ok(w) => workers.push(w),
            Err(e) => {
                let mut g = IDLE.lock().unwrap_or_else(|e| e.into_inner());
                g.extend(workers);
                return Err(e);
            }
        }
    }
    let done = Arc::new(Done {
        left: AtomicUsize::new(n - 1),
        lock: Mutex::new(()),
        cv: Condvar::new(),
    });
    for (w, index) in workers.iter().zip(1..n) {
        w.give(Task {
            call: call::<F>,
            data: f as *const F as *const (),
            index,
            done: done.clone(),
        });
    }
    drop(workers);
    f(0);
    if poll(|| done.left.load(Ordering::Acquire) == 0) {
        return Ok(());
    }
    let mut g = done.lock.lock().unwrap_or_else(|e| e.into_inner());
    while done.left.load(Ordering::Acquire) != 0 {
        g = done.cv.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    Ok(())
}

impl Worker {
    fn give(&self, task: Task) {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        self.ready.store(true, Ordering::Release);
        self.cv.notify_one();
    }

    fn next(&self) -> Task {
        poll(|| self.ready.load(Ordering::Acquire));
        let mut g = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(t) = g.take() {
                self.ready.store(false, Ordering::Relaxed);
                return t;
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Starts an idle pooled thread.
fn spawn() -> Result<Arc<Worker>, std::io::Error> {
    let w = Arc::new(Worker {
        ready: AtomicBool::new(false),
        slot: Mutex::new(None),
        cv: Condvar::new(),
    });
    let mine = w.clone();
    std::thread::Builder::new()
        .name("mscclpp-host-kernel".into())
        .spawn(move || {
            loop {
                let Task {
                    call,
                    data,
                    index,
                    done,
                } = mine.next();
                // SAFETY: the launcher keeps the closure alive until this task counts
                // itself done below (`run` waits for `left` to reach 0); it is `Sync`.
                unsafe { call(data, index) };
                // Back to the idle list before counting done, so a launch that follows at
                // once finds this thread instead of starting another.
                let keep = {
                    let mut g = IDLE.lock().unwrap_or_else(|e| e.into_inner());
                    let keep = g.len() < MAX_IDLE;
                    if keep {
                        g.push(mine.clone());
                    }
                    keep
                };
                if done.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let _g = done.lock.lock().unwrap_or_else(|e| e.into_inner());
                    done.cv.notify_all();
                }
                if !keep {
                    return;
                }
            }
        })?;
    Ok(w)
}
