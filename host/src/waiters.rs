//! Work that a CPU thread does while it waits: the device crate's `spin_backoff` (every
//! polling wait of a CPU kernel, and of the host code that shares the device protocol)
//! calls [`help_waiting`] each round, which runs every offered [`Help`] of the process.
//! The Host backend's proxies offer their FIFO ([`crate::proxy`]): a kernel that waits for
//! a peer's signal sends its own put instead of waiting for the proxy thread to get a core
//! (on a machine of few cores, a few microseconds a hand-off).
//!
//! Tried and left: the TCP receivers offering the frames they have not applied (stripe 0's
//! thread waiting in `poll` without the lock, waiters reading the socket each round) took
//! 1.17-1.5x the time from 8 B to 256 KB (Host backend, two ranks as two hosts on
//! loopback, 2 cores): a `recv` per round of every wait, and a woken receiver thread
//! contending for the frames.
//!
//! Below every module that offers help: imports nothing of this crate.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Work a waiting thread may do. `help` must not block for long, must take its locks
/// with `try_lock` (the owner of the work may hold them, and a wait inside `help` on this
/// thread comes back here: [`help_waiting`] then returns at once), and says whether it did
/// anything.
pub(crate) trait Help: Send + Sync {
    /// Does the work there is, if nobody else is at it: whether there was any.
    fn help(&self) -> bool;
}

/// Everything offered, and a count of changes to the list.
static OFFERED: Mutex<Vec<Weak<dyn Help>>> = Mutex::new(Vec::new());
static VERSION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's copy of [`OFFERED`] and the version it copied. It holds what it
    /// copied until its next wait after a change: a [`Help`] lets go of its resources when
    /// its owner is done with it, not when it is dropped.
    static HERE: RefCell<(u64, Vec<Arc<dyn Help>>)> = const { RefCell::new((u64::MAX, Vec::new())) };
    /// Whether this thread is inside [`help_waiting`].
    static HELPING: Cell<bool> = const { Cell::new(false) };
}

fn offered() -> std::sync::MutexGuard<'static, Vec<Weak<dyn Help>>> {
    OFFERED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Offers `help` to every waiting thread of the process until [`withdraw`] (or until it
/// is dropped).
pub(crate) fn offer(help: &Arc<dyn Help>) {
    let mut list = offered();
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(help));
    // Release: a waiter that reads the new version copies the list after this push.
    VERSION.fetch_add(1, Ordering::Release);
    mscclpp_device::arch::set_wait_helper(help_waiting);
}

/// Takes back what [`offer`] offered.
pub(crate) fn withdraw(help: &Arc<dyn Help>) {
    let me = Arc::as_ptr(help) as *const ();
    let mut list = offered();
    list.retain(|w| w.strong_count() > 0 && w.as_ptr() as *const () != me);
    VERSION.fetch_add(1, Ordering::Release);
}

/// Runs every offered [`Help`] once (none when this thread is already inside one): whether
/// any did work.
pub(crate) fn help_waiting() -> bool {
    if HELPING.get() {
        return false;
    }
    // Cleared on the way out, also when a `Help` panics (a thread that catches the panic
    // and waits again still helps).
    struct Helping;
    impl Drop for Helping {
        fn drop(&mut self) {
            HELPING.set(false);
        }
    }
    HELPING.set(true);
    let _helping = Helping;
    // Acquire: pairs with the release in `offer`/`withdraw`.
    let version = VERSION.load(Ordering::Acquire);
    // A panic inside a `Help` leaves `HERE` borrowed no longer: the borrow ends with the
    // unwinding closure.
    HERE.with_borrow_mut(|(seen, here)| {
        if *seen != version {
            *here = offered().iter().filter_map(Weak::upgrade).collect();
            *seen = version;
        }
        let mut found = false;
        for h in here.iter() {
            found |= h.help();
        }
        found
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Counts its calls; panics on the first when asked to.
    struct Counting {
        calls: AtomicU32,
        panic_first: bool,
    }

    impl Help for Counting {
        fn help(&self) -> bool {
            let n = self.calls.fetch_add(1, Ordering::Relaxed);
            assert!(!(self.panic_first && n == 0), "the first help panics");
            true
        }
    }

    /// A `Help` that panics does not leave its thread marked as helping: the next wait on
    /// that thread runs the offered help again.
    #[test]
    fn a_help_that_panics_leaves_the_thread_helping_again() {
        let c = Arc::new(Counting {
            calls: AtomicU32::new(0),
            panic_first: true,
        });
        let help: Arc<dyn Help> = c.clone();
        offer(&help);
        // On a thread of its own; other tests may offer helps meanwhile, so only this
        // help's count is looked at.
        let c2 = c.clone();
        std::thread::spawn(move || {
            let first = std::panic::catch_unwind(help_waiting);
            assert!(first.is_err(), "the first help should have panicked");
            assert!(help_waiting(), "the help ran again after the panic");
            assert_eq!(c2.calls.load(Ordering::Relaxed), 2);
        })
        .join()
        .unwrap();
        withdraw(&help);
        assert_eq!(c.calls.load(Ordering::Relaxed), 2);
    }
}
