//! [`DeviceSemaphore`]: a GPU-to-GPU semaphore (docs/guide/06-design.md §7), the synchronisation
//! of memory channels.
//!
//! Each side owns an *inbound* counter in its own memory; the peer has it mapped and adds
//! to it. A signal is one system-scope atomic add of 1 to the peer's inbound counter; a wait
//! polls this side's inbound counter with acquire loads until it reaches one more than the
//! signals already claimed, which this side remembers in its *expected* word. Counters are
//! 64-bit and only grow, so they never wrap in practice (2⁶⁴ signals) and a stale value is
//! never mistaken for a new one.
//!
//! # Ordering contract
//!
//! - [`signal`](DeviceSemaphore::signal) is a *release* add
//!   (`atom.add.release.sys.u64`): every access the signalling thread made before it (and,
//!   because a block barrier orders the block's accesses before the barrier with those
//!   after it, every access its block made before a `sync_threads` that precedes the
//!   signal) happens before whatever the peer does after the [`wait`](DeviceSemaphore::wait)
//!   that consumes this signal. That covers writes (data the peer may now read) and reads
//!   (a buffer the peer may now overwrite).
//! - [`wait`](DeviceSemaphore::wait) polls with *acquire* loads (`ld.acquire.sys.u64`):
//!   what the waiting thread does after it happens after what the signaller did before
//!   its signal; a `sync_threads` after the wait extends this to the waiter's block.
//! - [`relaxed_signal`](DeviceSemaphore::relaxed_signal) is a *relaxed* add: it orders
//!   nothing. It is enough when the peer uses the signal only to count (e.g. "this many
//!   blocks have finished" when the data needs no ordering, or for timing), when the data
//!   travelled in self-validating LL packets ([`crate::packet`]), or when the signalling
//!   thread ran [`fence_acq_rel_sys`](crate::arch::fence_acq_rel_sys) after the accesses
//!   to publish (a release fence followed by a relaxed add is a release pattern).
//!
//! # Threads and timeouts
//!
//! Any number of threads may signal at once, and any number may wait at once: the
//! handle is `Copy` and `Sync`, so every thread of a kernel can reach the waits, and they
//! are correct from any number of threads. Each signal is taken by exactly one wait:
//!
//! - [`wait`](DeviceSemaphore::wait), [`wait_timeout`](DeviceSemaphore::wait_timeout) and
//!   [`try_wait`](DeviceSemaphore::try_wait) first take a *ticket*, the next epoch, with an
//!   atomic add to the expected word, then wait until the inbound counter reaches it. `k`
//!   threads that wait at once wait for `k` different signals, in the order they took their
//!   tickets (so a block whose threads all call `wait` waits for as many signals as it has
//!   threads: the usual pattern is one thread waiting, then `sync_threads`).
//! - [`poll`](DeviceSemaphore::poll) takes a ticket only for a signal that is there and that
//!   no wait holds a ticket for (a compare-and-swap), so a poll that returns `false` has
//!   taken nothing.
//! - A wait that gives up (timeout, abort) hands its ticket back, so a later wait waits for
//!   the same signal. While a wait that started later still holds a ticket, the earlier one
//!   cannot hand its own back: it goes on waiting until the later ones have returned theirs
//!   (it may then return later than its timeout), or until its signal comes, which it then
//!   takes and returns `true`. With one waiting thread at a time (the usual case) a wait
//!   that gives up returns at once.
//!
//! `wait` traps after the handle's timeout so a lost signal fails the kernel visibly
//! instead of hanging it; `wait_timeout` returns `false` instead and consumes nothing, and
//! [`try_wait`](DeviceSemaphore::try_wait) says why ([`ChannelError`]).
//!
//! On a GPU the ticket costs a GPU-scope atomic add to a word in local memory, issued
//! before the first poll of the peer's counter and overlapping it, where a plain load was
//! before; a wait that finds its signal writes nothing after that (before, a plain store).
//!
//! # Abort
//!
//! A handle made by a communicator carries the address of its peer's abort word (host
//! memory the host raises on `Communicator::abort` or when the bootstrap loses a rank, and
//! sets to [`left_word`](crate::collectives::fault::left_word) when that peer leaves after
//! all of its work ended; null for none). Waits read it in their slow path only, beside the
//! clock (every 64 failed polls) and at most once per [`ABORT_LOOK_NS`] per waiting thread,
//! look at the counter once more after a non-zero word, and give up with
//! [`ChannelError::Aborted`] (or [`ChannelError::PeerLeft`]): an aborted communicator's
//! waits, and the waits for a rank that left without sending what they wait for, end within
//! a fraction of a millisecond instead of at their timeout, and a wait whose signal is there
//! costs nothing more.
//!
//! Nothing is validated here: the host builds handles from memory it owns and checks.

use core::fmt;
use core::marker::PhantomData;

use crate::arch;
use crate::fault::ChannelError;

pub use crate::fault::ABORT_LOOK_NS;

/// One side of a GPU-to-GPU semaphore, passed by value to kernels (`#[repr(C)]`, `Copy`,
/// 40 bytes: `inbound`, `remote`, `expected`, `timeout_ns`, `abort`). See the
/// [module](self) for the ordering contract.
///
/// Every method may be called from any number of threads at once: concurrent waits each
/// take a signal of their own ("Threads and timeouts" in the [module](self)).
///
/// `'a` is the lifetime of the counters the handle points at (a zero-sized marker): a
/// handle obtained from a memory channel borrows what the channel borrows.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DeviceSemaphore<'a> {
    inbound: *mut u64,
    remote: *mut u64,
    expected: *mut u64,
    timeout_ns: u64,
    abort: *const u64,
    _memory: PhantomData<&'a ()>,
}

const _: () = assert!(core::mem::size_of::<DeviceSemaphore<'static>>() == 40);

// SAFETY: addresses and a number only; every access to the memory behind them is atomic
// (the expected word's too: tickets, see the module), under the contract of `from_raw_parts`,
// so copies used from any number of threads at once do not race.
unsafe impl Send for DeviceSemaphore<'_> {}
// SAFETY: as above.
unsafe impl Sync for DeviceSemaphore<'_> {}

impl fmt::Debug for DeviceSemaphore<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSemaphore")
            .field("inbound", &self.inbound)
            .field("remote", &self.remote)
            .field("expected", &self.expected)
            .field("timeout_ns", &self.timeout_ns)
            .field("abort", &self.abort)
            .finish()
    }
}

impl<'a> DeviceSemaphore<'a> {
    /// Assembles a handle (the host's communicator does this). `inbound`: this side's
    /// counter (the peer adds to it); `remote`: the peer's inbound counter mapped here;
    /// `expected`: a local zeroed word used only by this side's waits; `timeout_ns`: how long
    /// [`wait`](Self::wait) waits before it traps; `abort`: the abort word of the peer
    /// (non-zero: give up, see the [module](self)), or null.
    ///
    /// # Safety
    /// `inbound` and `remote` must be live, 8-byte aligned counters, accessed only atomically
    /// while shared, that start equal to the peer's and this side's expected words (zero);
    /// `expected` a live, 8-byte aligned word, zero at first, used by this side's waits only
    /// and accessed only atomically while they may run (it is shared by every copy of the
    /// handle);
    /// `abort` null or a live, 8-byte aligned word written only atomically.
    /// All must stay live for `'a` (the caller picks `'a`; nothing checks it).
    pub unsafe fn from_raw_parts(
        inbound: *mut u64,
        remote: *mut u64,
        expected: *mut u64,
        timeout_ns: u64,
        abort: *const u64,
    ) -> DeviceSemaphore<'a> {
        DeviceSemaphore {
            inbound,
            remote,
            expected,
            timeout_ns,
            abort,
            _memory: PhantomData,
        }
    }

    /// How long [`wait`](Self::wait) waits before trapping, in ns.
    #[inline]
    pub fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// The abort word the waits look at (null: none), for the packet waits of the memory
    /// channel that holds this semaphore.
    #[inline]
    pub(crate) fn abort_word(&self) -> *const u64 {
        self.abort
    }

    /// `(inbound, remote, expected)`: the counters behind the handle, for the latency
    /// variants (`kernels::latency`) that signal and wait with other instructions than
    /// [`signal`](Self::signal) and [`wait`](Self::wait) on the same counters.
    #[cfg(any(test, feature = "test-kernels"))]
    #[inline]
    pub(crate) fn counters(&self) -> (*mut u64, *mut u64, *mut u64) {
        (self.inbound, self.remote, self.expected)
    }

    /// Adds 1 to the peer's inbound counter with release semantics: every access this
    /// thread made before (and its block's, after a `sync_threads`) happens before what the
    /// peer does after the matching wait.
    #[inline]
    pub fn signal(&self) {
        // Release at system scope: publishes this thread's earlier accesses (cumulatively,
        // those its block ordered before it with bar.sync) to the peer GPU that acquires
        // the new count.
        // SAFETY: `remote` is the peer's live aligned counter (constructor contract).
        unsafe { arch::red_add_release_sys_u64(self.remote, 1) };
    }

    /// Adds 1 to the peer's inbound counter, ordering nothing (see the [module](self) for
    /// when that is enough).
    #[inline]
    pub fn relaxed_signal(&self) {
        // Relaxed: atomic (no signal is lost) but publishes nothing.
        // SAFETY: `remote` is the peer's live aligned counter (constructor contract).
        unsafe { arch::red_add_relaxed_sys_u64(self.remote, 1) };
    }

    /// Waits for the peer's next signal and consumes it (with other waits at once: a
    /// signal of its own, see the [module](self)); traps after the handle's timeout or when
    /// the communicator is aborted ([`try_wait`](Self::try_wait) returns instead).
    #[inline]
    pub fn wait(&self) {
        if self.try_wait(self.timeout_ns).is_err() {
            arch::trap();
        }
    }

    /// Waits at most `timeout_ns` for the peer's next signal; `false` if it did not come
    /// or the communicator was aborted (nothing is consumed then, so a later wait waits for
    /// the same signal).
    #[inline]
    pub fn wait_timeout(&self, timeout_ns: u64) -> bool {
        self.try_wait(timeout_ns).is_ok()
    }

    /// [`wait_timeout`](Self::wait_timeout) that says why it gave up:
    /// [`ChannelError::Timeout`], or [`ChannelError::Aborted`] or
    /// [`ChannelError::PeerLeft`] within about [`ABORT_LOOK_NS`] of the news.
    #[inline]
    pub fn try_wait(&self, timeout_ns: u64) -> Result<(), ChannelError> {
        // SAFETY: `inbound` is this side's live aligned counter and `expected` its live word,
        // accessed only atomically; `abort` null or live (constructor contract).
        unsafe { wait_inbound(self.inbound, self.expected, timeout_ns, self.abort) }
    }

    /// If the peer's next signal has arrived and no other wait holds a ticket for it,
    /// consumes it and returns `true` (with the ordering of [`wait`](Self::wait)); never
    /// waits. Of polls that race for one signal, exactly one takes it.
    #[inline]
    pub fn poll(&self) -> bool {
        // SAFETY: as in `wait_timeout`.
        unsafe { poll_inbound(self.inbound, self.expected) }
    }
}

/// The receive side shared by [`DeviceSemaphore`] and the proxy channel's `DevConn`: takes
/// the next ticket from `*expected` and waits at most `timeout_ns` until `*inbound` reaches
/// it; on timeout, or when `*abort` (if not null) is non-zero, hands the ticket back
/// ([`give_back`]) and returns the error, having consumed nothing.
///
/// Tickets make concurrent waits correct: each wait of one counter pair waits for a
/// signal of its own, so `k` waits at once need `k` signals (see the module's "Threads and
/// timeouts"). The ticket is a relaxed add at GPU scope: `expected` lives in this GPU's
/// memory and only its threads touch it, and it orders nothing: what the signaller
/// published is acquired by the loads of `inbound`. The add is issued before the first poll
/// and does not depend on it, so on a GPU it overlaps that load as the plain load of
/// `expected` it replaces did; a wait that finds its signal writes nothing more.
///
/// Acquire at system scope on `inbound`: pairs with the writer's release (a peer's release
/// add, a proxy's release store, or on P2P the stream write after the copies, which
/// completes after them), so what the writer published before is visible after this
/// returns. (Relaxed polls with one fence.acq_rel.sys after them measured slower on 2xH200:
/// 3.7 against 2.5 us per signal/wait round trip.) The clock is read every 64 polls only,
/// and the abort word at most once per [`ABORT_LOOK_NS`] after that (the first time at the
/// first look).
///
/// # Safety
/// `inbound` must be a live, 8-byte aligned counter; `expected` a live, aligned word
/// accessed only atomically while shared; `abort` null or a live, aligned word written
/// atomically.
#[inline]
pub(crate) unsafe fn wait_inbound(
    inbound: *const u64,
    expected: *mut u64,
    timeout_ns: u64,
    abort: *const u64,
) -> Result<(), ChannelError> {
    // SAFETY: caller contract. Relaxed, GPU scope: see above.
    let want = unsafe { arch::atomic_add_relaxed_gpu_u64(expected, 1) } + 1;
    let mut polls = 0u32;
    let mut start = None;
    let mut last_look = None;
    // SAFETY: caller contract.
    while unsafe { arch::ld_acquire_sys_u64(inbound) } < want {
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(64) {
            let now = arch::global_timer_ns();
            let t0 = *start.get_or_insert(now);
            let stop = if now.wrapping_sub(t0) > timeout_ns {
                Err(ChannelError::Timeout)
            } else {
                // SAFETY: caller contract.
                unsafe { look_at_abort(abort, now, &mut last_look, inbound, want) }
            };
            if let Err(e) = stop {
                // SAFETY: caller contract; `want` is this wait's ticket.
                return unsafe { give_back(inbound, expected, want, e) };
            }
        }
        arch::spin_backoff(polls);
    }
    Ok(())
}

/// The end of a wait that gave up with `error` holding ticket `want`: hands the ticket back
/// (`*expected` from `want` to `want - 1`, so that the next wait waits for the same
/// signal) and returns `error`. Only the last ticket taken can be handed back: while a
/// later wait holds one, this waits until that wait has handed its own back (waits give up
/// in the reverse order of their tickets), or until signal `want` arrives, which it then
/// takes (`Ok`): a ticket is never dropped, so no signal is ever lost to a wait that gave
/// up. A single waiter hands its ticket back at once.
///
/// Relaxed compare-and-swap at GPU scope, as the add that took the ticket; the look at
/// `inbound` is an acquire, as the wait's polls.
///
/// # Safety
/// As for [`wait_inbound`]; `want` a ticket this thread took and still holds.
#[cold]
#[inline(never)]
unsafe fn give_back(
    inbound: *const u64,
    expected: *mut u64,
    want: u64,
    error: ChannelError,
) -> Result<(), ChannelError> {
    let mut polls = 0u32;
    loop {
        // SAFETY: caller contract.
        if unsafe { arch::ld_acquire_sys_u64(inbound) } >= want {
            return Ok(());
        }
        // SAFETY: caller contract.
        if unsafe { arch::atomic_cas_relaxed_gpu_u64(expected, want, want - 1) } == want {
            return Err(error);
        }
        polls = polls.wrapping_add(1);
        arch::spin_backoff(polls);
    }
}

/// The slow-path look of a wait at the abort word `abort` (null: none), at most once per
/// [`ABORT_LOOK_NS`] (`last_look`: this wait's last look; `now`: the clock). On a non-zero
/// word it looks at `*inbound` once more, after the word: `Ok` if it reached `want` by then
/// (the wait's next poll takes it), else the word's error
/// ([`ChannelError::from_abort_word`]). The second look is what makes a
/// [`left_word`](crate::collectives::fault::left_word) safe to act on: the host writes it
/// only after everything the peer sent had landed.
///
/// # Safety
/// `abort` null or a live, aligned word written atomically; `inbound` a live, aligned
/// counter.
#[cold]
#[inline(never)]
pub(crate) unsafe fn look_at_abort(
    abort: *const u64,
    now: u64,
    last_look: &mut Option<u64>,
    inbound: *const u64,
    want: u64,
) -> Result<(), ChannelError> {
    if abort.is_null() {
        return Ok(());
    }
    if let Some(last) = *last_look
        && now.wrapping_sub(last) < ABORT_LOOK_NS
    {
        return Ok(());
    }
    *last_look = Some(now);
    // Acquire: a word that says the peer left is written after the host learnt that
    // everything the peer sent had landed; the look at `inbound` below must see that.
    // SAFETY: caller contract.
    let word = unsafe { arch::ld_acquire_sys_u64(abort) };
    // SAFETY: caller contract.
    if word == 0 || unsafe { arch::ld_acquire_sys_u64(inbound) } >= want {
        Ok(())
    } else {
        Err(ChannelError::from_abort_word(word))
    }
}

/// [`wait_inbound`] without waiting: takes the next signal if it has arrived and no other
/// wait holds a ticket for it.
///
/// A poll takes a ticket only for a signal that is there, by compare-and-swap (relaxed,
/// GPU scope, as the wait's add): a failed poll writes nothing, and of polls that race for
/// one signal exactly one takes it. The load of `expected` is a relaxed one (at system
/// scope, the narrowest the `arch` module has; for a word in this GPU's memory it costs
/// what a GPU-scope load costs); the acquire on `inbound` is as in [`wait_inbound`].
///
/// # Safety
/// As for [`wait_inbound`].
#[inline]
pub(crate) unsafe fn poll_inbound(inbound: *const u64, expected: *mut u64) -> bool {
    // SAFETY: caller contract.
    let mut taken = unsafe { arch::ld_relaxed_sys_u64(expected) };
    // SAFETY: caller contract.
    while unsafe { arch::ld_acquire_sys_u64(inbound) } > taken {
        // SAFETY: caller contract.
        let was = unsafe { arch::atomic_cas_relaxed_gpu_u64(expected, taken, taken + 1) };
        if was == taken {
            return true;
        }
        // Another wait or poll took a ticket first: is there a signal beyond it?
        taken = was;
    }
    false
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;
