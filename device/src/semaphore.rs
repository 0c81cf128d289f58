//! [`DeviceSemaphore`]: a GPU-to-GPU semaphore (DESIGN §7), the synchronisation of memory
//! channels.
//!
//! Each side owns an *inbound* counter in its own memory; the peer has it mapped and adds
//! to it. A signal is one system-scope atomic add of 1 to the peer's inbound counter; a wait
//! polls this side's inbound counter with acquire loads until it reaches one more than the
//! signals already consumed, which this side remembers in its *expected* word. Counters are
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
//! Any number of threads may signal at once. The waits ([`wait`](DeviceSemaphore::wait),
//! [`wait_timeout`](DeviceSemaphore::wait_timeout), [`poll`](DeviceSemaphore::poll)) of
//! one semaphore must come from one thread at a time: they advance the plain expected word.
//! `wait` traps after the handle's timeout so a lost signal fails the kernel visibly
//! instead of hanging it; `wait_timeout` returns `false` instead and consumes nothing, and
//! [`try_wait`](DeviceSemaphore::try_wait) says why ([`ChannelError`]).
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
use crate::channel::ChannelError;

/// Least time between two looks at the host's abort word by one waiting thread (a read of
/// mapped host memory is a PCIe round trip on a GPU).
pub const ABORT_LOOK_NS: u64 = 50_000;

/// One side of a GPU-to-GPU semaphore, passed by value to kernels (`#[repr(C)]`, `Copy`,
/// 40 bytes: `inbound`, `remote`, `expected`, `timeout_ns`, `abort`). See the
/// [module](self) for the ordering contract.
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

// SAFETY: addresses and a number only; the memory behind them is accessed atomically (or by
// the one waiting thread, for `expected`) under the contracts of `from_raw_parts`.
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
    /// `expected`: a local zeroed word used only by this side's waiter; `timeout_ns`: how long
    /// [`wait`](Self::wait) waits before it traps; `abort`: the abort word of the peer
    /// (non-zero: give up, see the [module](self)), or null.
    ///
    /// # Safety
    /// `inbound` and `remote` must be live, 8-byte aligned counters, accessed only atomically
    /// while shared, that start equal to the peer's and this side's expected words (zero);
    /// `expected` a live, 8-byte aligned word, zero at first, used by this side's waits only;
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

    /// Waits for the peer's next signal and consumes it; traps after the handle's timeout
    /// or when the communicator is aborted ([`try_wait`](Self::try_wait) returns instead).
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
        // used by one waiting thread at a time; `abort` null or live (constructor and module
        // contract).
        unsafe { wait_inbound(self.inbound, self.expected, timeout_ns, self.abort) }
    }

    /// If the peer's next signal has arrived, consumes it and returns `true` (with the
    /// ordering of [`wait`](Self::wait)); never waits.
    #[inline]
    pub fn poll(&self) -> bool {
        // SAFETY: as in `wait_timeout`.
        unsafe { poll_inbound(self.inbound, self.expected) }
    }
}

/// The receive side shared by [`DeviceSemaphore`] and the proxy channel's `DevConn`: waits
/// at most `timeout_ns` until `*inbound` reaches `*expected + 1`, then stores that in
/// `*expected`; an error (nothing consumed) on timeout or when `*abort` (if not null) is
/// non-zero.
///
/// Acquire at system scope: pairs with the writer's release (a peer's release add, a proxy's
/// release store, or on P2P the stream write after the copies, which completes after them),
/// so what the writer published before is visible after this returns. (Relaxed polls with
/// one fence.acq_rel.sys after them measured slower on 2xH200: 3.7 against 2.5 us per
/// signal/wait round trip.) The clock is read every 64 polls only, and the abort word at
/// most once per [`ABORT_LOOK_NS`] after that (the first time at the first look).
///
/// # Safety
/// `inbound` must be a live, 8-byte aligned counter; `expected` a live, aligned word that
/// only this waiting thread uses; `abort` null or a live, aligned word written atomically.
#[inline]
pub(crate) unsafe fn wait_inbound(
    inbound: *const u64,
    expected: *mut u64,
    timeout_ns: u64,
    abort: *const u64,
) -> Result<(), ChannelError> {
    // SAFETY: caller contract.
    let want = unsafe { *expected } + 1;
    let mut polls = 0u32;
    let mut start = None;
    let mut last_look = None;
    // SAFETY: caller contract.
    while unsafe { arch::ld_acquire_sys_u64(inbound) } < want {
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(64) {
            let now = arch::global_timer_ns();
            let t0 = *start.get_or_insert(now);
            if now.wrapping_sub(t0) > timeout_ns {
                return Err(ChannelError::Timeout);
            }
            // SAFETY: caller contract.
            unsafe { look_at_abort(abort, now, &mut last_look, inbound, want) }?;
        }
        arch::spin_backoff(polls);
    }
    // SAFETY: caller contract.
    unsafe { *expected = want };
    Ok(())
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

/// [`wait_inbound`] without waiting: consumes the next signal if it has arrived.
///
/// # Safety
/// As for [`wait_inbound`].
#[inline]
pub(crate) unsafe fn poll_inbound(inbound: *const u64, expected: *mut u64) -> bool {
    // SAFETY: caller contract; the acquire is as in `wait_inbound`.
    unsafe {
        let want = *expected + 1;
        if arch::ld_acquire_sys_u64(inbound) >= want {
            *expected = want;
            true
        } else {
            false
        }
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;
