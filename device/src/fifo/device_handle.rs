//! The producer side: [`FifoDeviceHandle`], passed by value to kernels.

use core::fmt;

use super::trigger::Trigger;
use crate::arch;

/// Fewest slots a FIFO may have.
pub const MIN_SLOTS: u64 = 2;
/// Most slots a FIFO may have (a 1 MiB ring).
pub const MAX_SLOTS: u64 = 1 << 16;
/// Longest wait a [`FifoDeviceHandle`] accepts for one push or sync: one hour, in ns.
pub const MAX_TIMEOUT_NS: u64 = 3_600_000_000_000;

/// Bit of the published tail that the consumer sets once the proxy has refused a trigger
/// (a put outside the buffers, an unknown connection) or failed one: from then on every
/// [`FifoDeviceHandle::try_sync_status`] reports [`SyncStatus::ProxyFaulted`], and the
/// caller looks at the fault area to see whether its own connection is concerned.
/// Sequence numbers never reach 2⁶³, so the bit never collides with a count; every reader
/// of the tail masks it. It costs the fast path of `sync` nothing: the loaded tail is
/// tested for it only once the wait is over.
pub const TAIL_FAULT: u64 = 1 << 63;

/// What a [`FifoDeviceHandle::try_sync_status`] saw besides the trigger being popped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStatus {
    /// The proxy has reported no error.
    Clean,
    /// The proxy has refused or failed some trigger of this FIFO (see [`TAIL_FAULT`]).
    ProxyFaulted,
}

/// Why a wait of the FIFO that also looks at an abort word gave up
/// ([`FifoDeviceHandle::try_sync_status_or_abort`], [`FifoDeviceHandle::try_push_or_abort`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStop {
    /// The proxy did not pop the trigger (or, for a push, free a slot) within the handle's
    /// timeout.
    Timeout(FifoTimeout),
    /// The abort word was set (its value).
    Aborted(u64),
}

/// How [`FifoDeviceHandle::try_push_as`] publishes a trigger: the library's way
/// ([`try_push`](FifoDeviceHandle::try_push)) or a deliberately weakened one, which only the
/// litmus kernel uses (to show that the test can see what the library's way prevents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    /// `fence.acq_rel.sys`, then one 16-byte store of both words.
    Library,
    /// The 16-byte store without the fence before it: the data written before the push is
    /// not released with the trigger.
    NoFence,
    /// The fence, then the high word (with the commit bit) and the low word as two 8-byte
    /// stores in that order: the proxy may see the commit bit with the previous lap's low
    /// word.
    HighWordFirst,
}

/// The commit bit the producer of sequence `seq` stores in its slot: 1 on even laps, 0 on
/// odd ones. Slots start zeroed, which reads as "committed in lap -1", so lap 0 needs a 1.
#[inline(always)]
pub(crate) const fn commit_bit(seq: u64, slots: u64) -> u64 {
    // `slots` is a power of two: `seq & slots` is bit 0 of the lap `seq / slots`.
    ((seq & slots) == 0) as u64
}

/// Why FIFO memory or parameters were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FifoConfigError {
    /// The slot count is not a power of two.
    SlotsNotPowerOfTwo {
        /// The count given.
        slots: u64,
    },
    /// The slot count is outside [`MIN_SLOTS`]`..=`[`MAX_SLOTS`].
    SlotsOutOfRange {
        /// The count given.
        slots: u64,
    },
    /// A pointer is null.
    NullPointer {
        /// Which one.
        what: &'static str,
    },
    /// A pointer is not aligned as the FIFO needs (16 for the ring, 8 for counters).
    Misaligned {
        /// Which one.
        what: &'static str,
        /// Its address.
        addr: u64,
        /// The alignment it needs.
        align: u64,
    },
    /// The timeout is zero or above [`MAX_TIMEOUT_NS`].
    TimeoutOutOfRange {
        /// The timeout given, in ns.
        timeout_ns: u64,
    },
}

impl fmt::Display for FifoConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FifoConfigError::SlotsNotPowerOfTwo { slots } => {
                write!(f, "FIFO slot count {slots} is not a power of two")
            }
            FifoConfigError::SlotsOutOfRange { slots } => write!(
                f,
                "FIFO slot count {slots} is out of range ({MIN_SLOTS}..={MAX_SLOTS})"
            ),
            FifoConfigError::NullPointer { what } => write!(f, "FIFO {what} pointer is null"),
            FifoConfigError::Misaligned { what, addr, align } => write!(
                f,
                "FIFO {what} pointer {addr:#x} is not {align}-byte aligned"
            ),
            FifoConfigError::TimeoutOutOfRange { timeout_ns } => write!(
                f,
                "FIFO timeout of {timeout_ns} ns is out of range (1..={MAX_TIMEOUT_NS} ns)"
            ),
        }
    }
}

impl core::error::Error for FifoConfigError {}

/// Checks a slot count: a power of two in [`MIN_SLOTS`]`..=`[`MAX_SLOTS`].
pub const fn check_slots(slots: u64) -> Result<(), FifoConfigError> {
    if !slots.is_power_of_two() {
        return Err(FifoConfigError::SlotsNotPowerOfTwo { slots });
    }
    if slots < MIN_SLOTS || slots > MAX_SLOTS {
        return Err(FifoConfigError::SlotsOutOfRange { slots });
    }
    Ok(())
}

pub(crate) fn check_ptr<T>(what: &'static str, p: *const T) -> Result<(), FifoConfigError> {
    if p.is_null() {
        return Err(FifoConfigError::NullPointer { what });
    }
    let align = core::mem::align_of::<T>() as u64;
    let addr = p as usize as u64;
    if !addr.is_multiple_of(align) {
        return Err(FifoConfigError::Misaligned { what, addr, align });
    }
    Ok(())
}

/// Which wait gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FifoWait {
    /// A push waiting for a free slot (the ring was full).
    Push,
    /// A sync or flush waiting for the proxy to pop.
    Sync,
}

/// A push or sync waited longer than the handle's timeout for the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FifoTimeout {
    /// What was waiting.
    pub wait: FifoWait,
    /// The sequence number pushed or waited for.
    pub seq: u64,
    /// The proxy's tail at the last look.
    pub tail: u64,
    /// The timeout, in ns.
    pub timeout_ns: u64,
}

impl fmt::Display for FifoTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let FifoTimeout {
            seq,
            tail,
            timeout_ns,
            ..
        } = *self;
        match self.wait {
            FifoWait::Push => write!(
                f,
                "FIFO push of sequence {seq} found the ring full for {timeout_ns} ns (proxy \
                 tail {tail}): is the proxy running? The claimed slot can never be published, \
                 so this FIFO is unusable from now on"
            ),
            FifoWait::Sync => write!(
                f,
                "FIFO sync on sequence {seq} timed out after {timeout_ns} ns (proxy tail {tail}): \
                 is the proxy running?"
            ),
        }
    }
}

impl core::error::Error for FifoTimeout {}

/// The GPU side of a trigger FIFO: a `#[repr(C)]`, `Copy` value passed by value as a kernel
/// argument, through which any number of threads push [`Trigger`]s at once.
///
/// It points at:
/// - the ring of `slots` triggers (a power of two), in host-pinned, device-mapped memory
///   that the proxy reads;
/// - the head, the count of sequence numbers handed out, in device memory: every push adds
///   one with a relaxed GPU-scope atomic;
/// - the tail, the count of triggers the proxy has popped, in host-mapped memory, written
///   only by the proxy with release stores;
/// - a cached copy of the tail in device memory, so that a push reads host memory only when
///   the ring looks full.
///
/// Every wait (a full ring, [`sync`](Self::sync), [`flush`](Self::flush)) gives up after
/// the handle's timeout, measured with `%globaltimer`: the `try_` methods return a
/// [`FifoTimeout`], the others trap (the kernel fails and the host sees a launch error).
/// A push that timed out has claimed a sequence number it can never publish, so the proxy
/// stops at that slot: treat the FIFO as broken.
///
/// [`FifoDeviceHandle::new`] validates what it is given (see [`FifoConfigError`]); nothing
/// else is checked at run time. Handles are made by the host's `Fifo`, which owns the
/// memory.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FifoDeviceHandle {
    triggers: *mut Trigger,
    head: *mut u64,
    tail: *mut u64,
    tail_cache: *mut u64,
    slots: u64,
    timeout_ns: u64,
}

const _: () = assert!(core::mem::size_of::<FifoDeviceHandle>() == 48);
const _: () = assert!(core::mem::align_of::<FifoDeviceHandle>() == 8);

// SAFETY: the handle is only addresses and two numbers; the memory behind them is accessed
// only through atomic operations (`arch`), from any thread, and the `unsafe` methods that
// do so require it to be live.
unsafe impl Send for FifoDeviceHandle {}
// SAFETY: as above; no method takes `&mut self`.
unsafe impl Sync for FifoDeviceHandle {}

impl fmt::Debug for FifoDeviceHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FifoDeviceHandle")
            .field("triggers", &self.triggers)
            .field("head", &self.head)
            .field("tail", &self.tail)
            .field("tail_cache", &self.tail_cache)
            .field("slots", &self.slots)
            .field("timeout_ns", &self.timeout_ns)
            .finish()
    }
}

impl FifoDeviceHandle {
    /// A handle over FIFO memory, after checking the slot count ([`check_slots`]), the
    /// pointers (non-null; the ring 16-byte and the counters 8-byte aligned) and the
    /// timeout (`1..=`[`MAX_TIMEOUT_NS`]). The pointers are addresses in the producer's
    /// address space (device addresses for a GPU). Building a handle is safe; using it is
    /// not (see [`try_push`](Self::try_push)).
    pub fn new(
        triggers: *mut Trigger,
        head: *mut u64,
        tail: *mut u64,
        tail_cache: *mut u64,
        slots: u64,
        timeout_ns: u64,
    ) -> Result<FifoDeviceHandle, FifoConfigError> {
        check_slots(slots)?;
        check_ptr("trigger ring", triggers as *const Trigger)?;
        check_ptr("head", head as *const u64)?;
        check_ptr("tail", tail as *const u64)?;
        check_ptr("tail cache", tail_cache as *const u64)?;
        if timeout_ns == 0 || timeout_ns > MAX_TIMEOUT_NS {
            return Err(FifoConfigError::TimeoutOutOfRange { timeout_ns });
        }
        Ok(FifoDeviceHandle {
            triggers,
            head,
            tail,
            tail_cache,
            slots,
            timeout_ns,
        })
    }

    /// Number of trigger slots.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// How long one push or sync waits before giving up, in ns.
    pub fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// The first word of the slot of sequence number `seq`.
    #[inline(always)]
    fn slot(&self, seq: u64) -> *mut u64 {
        self.triggers
            .wrapping_add((seq & (self.slots - 1)) as usize) as *mut u64
    }

    /// Pushes `trigger` and returns its sequence number; waits while the ring is full, and
    /// traps after the timeout (see [`try_push`](Self::try_push)).
    ///
    /// # Safety
    /// As for [`try_push`](Self::try_push).
    #[inline]
    pub unsafe fn push(&self, trigger: Trigger) -> u64 {
        // SAFETY: forwarded to the caller.
        match unsafe { self.try_push(trigger) } {
            Ok(seq) => seq,
            Err(_) => arch::trap(),
        }
    }

    /// Pushes `trigger` and returns its sequence number (0, 1, 2, ... in the order threads
    /// claimed slots). When the ring is full it waits for the proxy to pop, for at most the
    /// handle's timeout; then it returns [`FifoTimeout`] and the FIFO is broken (the claimed
    /// slot is never published). Every write this thread made before the push is visible
    /// to the proxy once it sees the trigger.
    ///
    /// # Safety
    /// The memory this handle was built over must be a live FIFO (made by the host's `Fifo`
    /// or laid out as it does: zeroed ring and counters, one consumer popping it) and stay
    /// live while the call runs.
    #[inline]
    pub unsafe fn try_push(&self, trigger: Trigger) -> Result<u64, FifoTimeout> {
        // SAFETY: forwarded to the caller.
        unsafe { self.try_push_as(trigger, Publish::Library) }
    }

    /// [`try_push`](Self::try_push) whose wait for a free slot (only when the ring is
    /// full) also gives up when the word at `abort` (null: none) is non-zero, looking at it
    /// at most once per [`ABORT_LOOK_NS`](crate::fault::ABORT_LOOK_NS), as
    /// [`try_sync_status_or_abort`](Self::try_sync_status_or_abort) does: a proxy that
    /// stopped serving an aborted communicator does not hold the pushing thread for the
    /// whole timeout. After either error the FIFO is broken, as after a timeout.
    ///
    /// # Safety
    /// As for [`try_push`](Self::try_push); `abort` null, or a live aligned word written
    /// atomically.
    #[inline]
    pub unsafe fn try_push_or_abort(
        &self,
        trigger: Trigger,
        abort: *const u64,
    ) -> Result<u64, SyncStop> {
        // SAFETY: forwarded to the caller.
        unsafe { self.push_with(trigger, Publish::Library, abort) }
    }

    /// [`try_push`](Self::try_push) with the slot store done as `publish` says: the
    /// library's way, or one of the weakened ways the litmus test
    /// (`kernels::litmus::litmus_fifo_publish`) runs beside it to show what it would catch.
    ///
    /// # Safety
    /// As for [`try_push`](Self::try_push).
    #[inline(always)]
    pub(crate) unsafe fn try_push_as(
        &self,
        trigger: Trigger,
        publish: Publish,
    ) -> Result<u64, FifoTimeout> {
        // SAFETY: forwarded to the caller; no abort word, so only a timeout stops the wait.
        unsafe { self.push_with(trigger, publish, core::ptr::null()) }.map_err(|e| match e {
            SyncStop::Timeout(t) => t,
            // Cannot happen without an abort word.
            SyncStop::Aborted(_) => arch::trap(),
        })
    }

    /// The push itself: [`try_push_as`](Self::try_push_as) with an abort word (null: none)
    /// for the wait for room.
    ///
    /// # Safety
    /// As for [`try_push_or_abort`](Self::try_push_or_abort).
    #[inline(always)]
    unsafe fn push_with(
        &self,
        trigger: Trigger,
        publish: Publish,
        abort: *const u64,
    ) -> Result<u64, SyncStop> {
        // Relaxed: the head only hands out distinct sequence numbers; nothing is published
        // through it (the slot store below and the tail do the ordering).
        // SAFETY: `head` is a live aligned counter (caller contract).
        let seq = unsafe { arch::atomic_add_relaxed_gpu_u64(self.head, 1) };
        // Relaxed: a cheap device-memory read. It may be stale, which is safe: the cache
        // only ever holds values read from the tail, which only grows, so cache <= tail
        // and a stale value only sends us to the slow path. The fence below upgrades this
        // load to an acquire of the release store that wrote the cache.
        // SAFETY: as above, for the cache.
        let cached = unsafe { arch::ld_relaxed_sys_u64(self.tail_cache) };
        // cached <= tail <= seq (the proxy cannot pop a slot we have not written), so the
        // subtraction does not wrap.
        if seq.wrapping_sub(cached) >= self.slots {
            // SAFETY: forwarded to the caller.
            unsafe {
                wait_for_room(
                    self.tail,
                    self.tail_cache,
                    self.slots,
                    self.timeout_ns,
                    seq,
                    abort,
                )?
            };
        }
        // Acquire-release fence, two jobs. Acquire: with the tail (or cache) load above it
        // synchronises with the proxy's release of the tail, so the proxy's reads of this
        // slot's previous lap happen before our store overwrites it. Release: the data a
        // trigger refers to (written by this thread before the push) is visible to the
        // proxy once it acquires the slot's high word. The 16-byte store itself is
        // `st.volatile` (relaxed, system scope) on the GPU; the fence makes it a release.
        if publish != Publish::NoFence {
            arch::fence_acq_rel_sys();
        }
        let [lo, _] = trigger.to_words();
        let hi = trigger.hi_with_commit(commit_bit(seq, self.slots));
        let slot = self.slot(seq);
        // SAFETY: the slot is inside the live ring (index masked by the power-of-two slot
        // count) and 16-byte aligned; tail > seq - slots, so no consumer reads it until
        // the commit bit of this lap appears, and no other producer holds `seq`.
        unsafe {
            if publish == Publish::HighWordFirst {
                // Weakened: the commit bit can be seen before the low word lands.
                arch::st_volatile_u64(slot.wrapping_add(1), hi);
                arch::st_volatile_u64(slot, lo);
            } else {
                arch::st_volatile_v2_u64(slot, lo, hi);
            }
        }
        Ok(seq)
    }

    /// Waits until the proxy has popped sequence number `seq`; traps after the timeout
    /// (see [`try_sync`](Self::try_sync)).
    ///
    /// # Safety
    /// As for [`try_push`](Self::try_push).
    #[inline]
    pub unsafe fn sync(&self, seq: u64) {
        // SAFETY: forwarded to the caller.
        if unsafe { self.try_sync(seq) }.is_err() {
            arch::trap()
        }
    }

    /// Waits until the proxy's tail has passed `seq` (it popped that trigger, after acting
    /// on it), for at most the handle's timeout. What the proxy did before popping happens
    /// before what this thread does after.
    ///
    /// # Safety
    /// As for [`try_push`](Self::try_push).
    pub unsafe fn try_sync(&self, seq: u64) -> Result<(), FifoTimeout> {
        // SAFETY: forwarded to the caller.
        unsafe { self.try_sync_status(seq) }.map(|_| ())
    }

    /// [`try_sync`](Self::try_sync) that also says whether the proxy has refused or failed
    /// a trigger of this FIFO so far ([`TAIL_FAULT`] in the tail it acquired).
    ///
    /// # Safety
    /// As for [`try_push`](Self::try_push).
    #[inline]
    pub unsafe fn try_sync_status(&self, seq: u64) -> Result<SyncStatus, FifoTimeout> {
        // SAFETY: forwarded to the caller; no abort word.
        unsafe { self.try_sync_status_or_abort(seq, core::ptr::null()) }.map_err(|e| match e {
            SyncStop::Timeout(t) => t,
            // Not without an abort word; reported as the timeout it stands in for.
            SyncStop::Aborted(_) => FifoTimeout {
                wait: FifoWait::Sync,
                seq,
                tail: 0,
                timeout_ns: self.timeout_ns,
            },
        })
    }

    /// [`try_sync_status`](Self::try_sync_status) that also gives up when the word at
    /// `abort` (null: none) is non-zero, looking at it at most once per
    /// [`ABORT_LOOK_NS`](crate::fault::ABORT_LOOK_NS), as the channels' waits do: a
    /// communicator that was aborted (or lost a rank) does not hold a sync for the proxy to
    /// its whole timeout.
    ///
    /// # Safety
    /// As for [`try_push`](Self::try_push); `abort` null, or a live aligned word written
    /// atomically.
    #[inline]
    pub unsafe fn try_sync_status_or_abort(
        &self,
        seq: u64,
        abort: *const u64,
    ) -> Result<SyncStatus, SyncStop> {
        let start = arch::global_timer_ns();
        let mut last_look = start;
        let mut round = 0u32;
        loop {
            // Acquire: pairs with the proxy's release store of the tail (see above).
            // SAFETY: `tail` is a live aligned word (caller contract).
            let tail = unsafe { arch::ld_acquire_sys_u64(self.tail) };
            // With TAIL_FAULT set this holds at once, so the count is checked again below.
            if tail > seq {
                if tail & TAIL_FAULT == 0 {
                    return Ok(SyncStatus::Clean);
                }
                if tail & !TAIL_FAULT > seq {
                    return Ok(SyncStatus::ProxyFaulted);
                }
            }
            let now = arch::global_timer_ns();
            if now.wrapping_sub(start) > self.timeout_ns {
                return Err(SyncStop::Timeout(FifoTimeout {
                    wait: FifoWait::Sync,
                    seq,
                    tail: tail & !TAIL_FAULT,
                    timeout_ns: self.timeout_ns,
                }));
            }
            if !abort.is_null() && now.wrapping_sub(last_look) >= crate::fault::ABORT_LOOK_NS {
                last_look = now;
                // SAFETY: `abort` live and aligned (caller contract).
                let word = unsafe { arch::ld_acquire_sys_u64(abort) };
                if word != 0 {
                    return Err(SyncStop::Aborted(word));
                }
            }
            arch::spin_backoff(round);
            round = round.saturating_add(1);
        }
    }

    /// Waits until the proxy has popped every trigger claimed so far (by any thread);
    /// traps after the timeout.
    ///
    /// # Safety
    /// As for [`try_push`](Self::try_push).
    #[inline]
    pub unsafe fn flush(&self) {
        // SAFETY: forwarded to the caller.
        if unsafe { self.try_flush() }.is_err() {
            arch::trap()
        }
    }

    /// Waits until the proxy has popped every trigger claimed so far (by any thread), for
    /// at most the handle's timeout.
    ///
    /// # Safety
    /// As for [`try_push`](Self::try_push).
    pub unsafe fn try_flush(&self) -> Result<(), FifoTimeout> {
        // Relaxed: only the count is needed; the tail acquire in `try_sync` orders what
        // follows.
        // SAFETY: `head` is a live aligned counter (caller contract).
        let head = unsafe { arch::ld_relaxed_sys_u64(self.head) };
        match head.checked_sub(1) {
            // SAFETY: forwarded to the caller.
            Some(last) => unsafe { self.try_sync(last) },
            None => Ok(()),
        }
    }
}

/// Slow path of a push: the cached tail says the ring is full for `seq`, so re-read the
/// proxy's tail until `seq` has a free slot, `timeout_ns` passes or the word at `abort` (null:
/// none) is set. Out of line and with scalar arguments, so the fast path stays small and the
/// handle is not spilled to local memory on the GPU.
///
/// # Safety
/// `tail` and `tail_cache` are the live words of a FIFO of `slots` slots (see
/// [`FifoDeviceHandle::try_push`]); `abort` null or a live aligned word written atomically.
#[cold]
#[inline(never)]
unsafe fn wait_for_room(
    tail: *mut u64,
    tail_cache: *mut u64,
    slots: u64,
    timeout_ns: u64,
    seq: u64,
    abort: *const u64,
) -> Result<(), SyncStop> {
    let start = arch::global_timer_ns();
    // The first round looks at the abort word: after an abort, a push gives up at once.
    let mut last_look = start.wrapping_sub(crate::fault::ABORT_LOOK_NS);
    let mut round = 0u32;
    loop {
        // Acquire: pairs with the proxy's release store of the tail, so its reads of the
        // slot we will overwrite happen before our store.
        // SAFETY: `tail` is a live aligned word (caller contract).
        let seen = unsafe { arch::ld_acquire_sys_u64(tail) } & !TAIL_FAULT;
        if seq.wrapping_sub(seen) < slots {
            // Release: a thread that later reads this value (relaxed, then the fence in
            // `try_push`) acquires what we acquired from the tail. Concurrent refreshes
            // may land out of order and move the cache back; harmless, as every value
            // stored was read from the ever-growing tail.
            // SAFETY: `tail_cache` is a live aligned word (caller contract).
            unsafe { arch::st_release_sys_u64(tail_cache, seen) };
            return Ok(());
        }
        let now = arch::global_timer_ns();
        if now.wrapping_sub(start) > timeout_ns {
            return Err(SyncStop::Timeout(FifoTimeout {
                wait: FifoWait::Push,
                seq,
                tail: seen,
                timeout_ns,
            }));
        }
        if !abort.is_null() && now.wrapping_sub(last_look) >= crate::fault::ABORT_LOOK_NS {
            last_look = now;
            // SAFETY: `abort` live and aligned (caller contract).
            let word = unsafe { arch::ld_acquire_sys_u64(abort) };
            if word != 0 {
                return Err(SyncStop::Aborted(word));
            }
        }
        arch::spin_backoff(round);
        round = round.saturating_add(1);
    }
}
