//! [`DevConn`]: one side of a proxy channel, the seed's `mscclppDevConn`.
//!
//! Semantics (docs/guide/06-design.md §4):
//! - [`put`](DevConn::put) / [`put_at`](DevConn::put_at) queue a copy from the local
//!   buffer to the peer's and return at once;
//! - [`signal`](DevConn::signal): after every put queued before it has landed, the peer's
//!   inbound counter is raised; when it returns, the source data may be reused (it waits
//!   until the proxy has acted on it);
//! - [`wait`](DevConn::wait): waits until the inbound counter reaches the next expected
//!   epoch; when it returns, the data the peer put before its matching signal is visible;
//! - extras: [`flush`](DevConn::flush) (all queued puts of this FIFO done),
//!   [`poll`](DevConn::poll) (a wait that does not block),
//!   [`put_with_signal`](DevConn::put_with_signal),
//!   [`put_with_signal_and_flush`](DevConn::put_with_signal_and_flush) and
//!   [`try_put_with_signal_queued`](DevConn::try_put_with_signal_queued) (a put and a
//!   signal that do not wait for the proxy: for pipelines that know by other means when
//!   the source is free again).
//!
//! The inbound counter holds the number of signals the peer has sent on this connection; the
//! peer's proxy writes it after the data, in the same ordered engine, so a value is never
//! seen before the data it follows, and writing it again is harmless.
//!
//! Threads: every method may be called from any number of threads at once, on one handle
//! or its copies. Puts and signals may (the FIFO is multi-producer); so may waits and polls,
//! and each signal is taken by exactly one of them: a wait takes a *ticket* (the next
//! expected epoch, an atomic add to the connection's expected word) and waits for that
//! epoch, so `k` waits at once wait for `k` signals; a poll takes one only for a signal
//! that is there and that no wait holds a ticket for. The usual pattern remains one thread
//! waiting, then a block barrier: a block whose threads all call `wait` waits for one
//! signal per thread. A wait that gives up consumes nothing (it hands its ticket back; with
//! other waits at once it may return late for that: see "Threads and timeouts" in
//! [`crate::semaphore`], whose waits these are).
//!
//! Waits time out (`wait` after the handle's timeout traps, so the kernel fails visibly;
//! [`wait_timeout`](DevConn::wait_timeout) returns `false`,
//! [`try_wait`](DevConn::try_wait) says why) and give up when the communicator is aborted
//! or the peer left without sending what they wait for (the handle carries the address of
//! its fault area and the index of its abort word in it; see [`crate::semaphore`] for how
//! often a wait looks at it). Field limits of the triggers are those of [`Trigger`]; a put
//! beyond them traps.
//!
//! Offsets beyond the buffers (and unknown connection ids) are refused by the proxy, which
//! records the error for the host at once (`Communicator::proxy_errors`), sets this
//! connection's bit in the fault area and flags the FIFO's tail
//! ([`TAIL_FAULT`](crate::fifo::TAIL_FAULT)): the next [`try_signal`](DevConn::try_signal),
//! [`try_flush`](DevConn::try_flush) or [`try_put_with_signal`](DevConn::try_put_with_signal)
//! on the connection returns [`ChannelError::ProxyRefused`] (and [`signal`](DevConn::signal),
//! [`flush`](DevConn::flush), [`put_with_signal`](DevConn::put_with_signal) trap), as does
//! every later one until the proxy is launched again. A refused put is not performed; the
//! signal after it is still sent, so the peer is not left waiting. Connections are told
//! apart by their id modulo 64 (one word of bits), so with more than 64 connections a fault
//! may also be reported on a connection 64 ids away. Checking costs nothing while the
//! proxy has reported nothing: the flag travels in the tail word that `sync` reads anyway.

use core::fmt;
use core::marker::PhantomData;

use super::ChannelError;
use crate::arch;
use crate::fault;
use crate::fifo::{FifoDeviceHandle, SyncStatus, SyncStop, Trigger, TriggerOp};
use crate::semaphore::{poll_inbound, wait_inbound};

/// One side of a proxy channel, passed by value to kernels (`#[repr(C)]`, `Copy`).
///
/// Every method may be called from any number of threads at once; concurrent waits each
/// take a signal of their own (see the [module](self)), so `k` threads waiting at once
/// need `k` signals:
///
/// ```
/// # use mscclpp_device::channel::DevConn;
/// /// Thread `t < n` of a block takes one of the `n` signals the peer sent.
/// fn take_one_each(conn: &DevConn<'_>, t: u32, n: u32) -> bool {
///     t >= n || conn.wait_timeout(1_000_000_000)
/// }
/// ```
///
/// `'a` is the lifetime of the memory the handle points at (the FIFO, the counters): a
/// handle from `Communicator::device_connections` borrows its communicator, so it cannot
/// be used after the communicator is dropped. The lifetime is a zero-sized marker; the
/// layout kernels see is that of the addresses and numbers alone.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DevConn<'a> {
    fifo: FifoDeviceHandle,
    inbound: *mut u64,
    expected: *mut u64,
    connection_id: u32,
    /// Index in the fault area of the abort word the waits look at ([`fault::ABORT`], or
    /// the peer's [`fault::PEER_ABORT`] word).
    abort_index: u32,
    wait_timeout_ns: u64,
    fault: *mut u64,
    _memory: PhantomData<&'a ()>,
}

const _: () = assert!(
    core::mem::size_of::<DevConn<'static>>()
        == core::mem::size_of::<FifoDeviceHandle>() + 4 * 8 + 2 * 4
);

// SAFETY: addresses and numbers only; every access to the memory behind them is atomic (the
// expected word's too: tickets, see the module), under the contracts of the `unsafe`
// methods, so copies used from any number of threads at once do not race.
unsafe impl Send for DevConn<'_> {}
// SAFETY: as above.
unsafe impl Sync for DevConn<'_> {}

impl fmt::Debug for DevConn<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevConn")
            .field("connection_id", &self.connection_id)
            .field("inbound", &self.inbound)
            .field("expected", &self.expected)
            .field("wait_timeout_ns", &self.wait_timeout_ns)
            .field("fault", &self.fault)
            .field("fifo", &self.fifo)
            .finish()
    }
}

impl<'a> DevConn<'a> {
    /// Assembles a handle (the host's communicator does this).
    ///
    /// # Safety
    /// `fifo` must be the live FIFO of the proxy that serves `connection_id`; `inbound` the
    /// live, 8-byte aligned counter the peer's proxy writes for this connection; `expected`
    /// a live, 8-byte aligned, zero-initialised word used by this connection's waits only
    /// and accessed only atomically while they may run (every copy of the handle shares it);
    /// `fault` null or the communicator's fault area
    /// ([`FAULT_WORDS`](crate::collectives::FAULT_WORDS) live, aligned words written only
    /// atomically while kernels run: its abort word and the proxy's refused connections).
    /// All must stay live for `'a` (the caller picks `'a`; nothing checks it).
    pub unsafe fn from_raw_parts(
        fifo: FifoDeviceHandle,
        connection_id: u32,
        inbound: *mut u64,
        expected: *mut u64,
        wait_timeout_ns: u64,
        fault: *mut u64,
    ) -> DevConn<'a> {
        DevConn {
            fifo,
            inbound,
            expected,
            connection_id,
            abort_index: fault::ABORT as u32,
            wait_timeout_ns,
            fault,
            _memory: PhantomData,
        }
    }

    /// The same handle with a lifetime the caller picks, for code that keeps handles next
    /// to the owner of their memory (e.g. in one struct with the communicator).
    ///
    /// # Safety
    /// The memory the handle points at must stay live for `'b`: the handle (and every copy)
    /// must not be used after its owner (e.g. the communicator) is dropped.
    pub unsafe fn detach<'b>(self) -> DevConn<'b> {
        DevConn {
            fifo: self.fifo,
            inbound: self.inbound,
            expected: self.expected,
            connection_id: self.connection_id,
            abort_index: self.abort_index,
            wait_timeout_ns: self.wait_timeout_ns,
            fault: self.fault,
            _memory: PhantomData,
        }
    }

    /// The same handle with its waits looking at word `index` of the fault area instead of
    /// the communicator's abort word ([`fault::ABORT`]): the host gives each user handle
    /// its peer's word ([`fault::PEER_ABORT`]), which also says when that peer left.
    ///
    /// # Safety
    /// The handle's fault area (null: nothing is looked at) must have a live, aligned word
    /// at `index`, written only atomically, for as long as the handle is used.
    pub unsafe fn with_abort_index(self, index: u32) -> DevConn<'a> {
        DevConn {
            abort_index: index,
            ..self
        }
    }

    /// The connection's id in its proxy.
    pub fn connection_id(&self) -> u32 {
        self.connection_id
    }

    /// The abort word this handle's waits look at (null without a fault area).
    #[inline(always)]
    fn abort_word(&self) -> *const u64 {
        if self.fault.is_null() {
            core::ptr::null()
        } else {
            self.fault.wrapping_add(self.abort_index as usize) as *const u64
        }
    }

    /// Pushes a trigger; while the ring is full waits for a slot, giving up at the
    /// FIFO's timeout or at the communicator's abort word ([`fault::ABORT`], not this
    /// handle's per-peer word: a peer that left leaves the proxy running, so room comes,
    /// and a push that gave up would break the FIFO for every connection, as its claimed
    /// slot is never published). Traps on a trigger that cannot be encoded.
    #[inline(always)]
    fn push(
        &self,
        op: TriggerOp,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<u64, ChannelError> {
        let t = match Trigger::new(op, self.connection_id, dst_offset, src_offset, size) {
            Ok(t) => t,
            Err(_) => arch::trap(),
        };
        // The communicator's abort word is the fault area's first (null without one).
        const _: () = assert!(fault::ABORT == 0);
        // SAFETY: the FIFO is live (constructor contract); the fault area null or live.
        match unsafe { self.fifo.try_push_or_abort(t, self.fault) } {
            Ok(seq) => Ok(seq),
            Err(SyncStop::Aborted(word)) => Err(ChannelError::from_abort_word(word)),
            Err(SyncStop::Timeout(_)) => Err(ChannelError::Timeout),
        }
    }

    /// Queues a copy of `size` bytes at `offset` of the local buffer to the same offset of
    /// the peer's buffer (see [`put_at`](Self::put_at)).
    #[inline]
    pub fn put(&self, offset: u64, size: u64) {
        self.put_at(offset, offset, size);
    }

    /// Queues a copy of `size` bytes from `src_offset` of the local buffer to `dst_offset`
    /// of the peer's. While the FIFO is full this waits for the proxy to free a slot and
    /// traps if none comes within the FIFO's timeout; once the communicator is aborted
    /// (`abort()`, or a lost rank) it stops waiting and drops the put, and the FIFO is then
    /// broken for every connection (the slot it claimed is never published): the handle's
    /// next [`try_signal`](Self::try_signal), [`try_flush`](Self::try_flush) or
    /// [`try_wait`](Self::try_wait) reports the abort.
    #[inline]
    pub fn put_at(&self, dst_offset: u64, src_offset: u64, size: u64) {
        if let Err(ChannelError::Timeout) = self.push(TriggerOp::DATA, dst_offset, src_offset, size)
        {
            arch::trap();
        }
    }

    /// [`put_at`](Self::put_at) that returns an error instead of trapping:
    /// [`ChannelError::Timeout`] when the FIFO stayed full for its timeout,
    /// [`ChannelError::Aborted`] when the communicator was aborted while it waited for a
    /// slot (either way the put is not queued and the FIFO is broken, as there). A put the
    /// proxy refuses is reported by the connection's next signal or flush.
    #[inline]
    pub fn try_put_at(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), ChannelError> {
        self.push(TriggerOp::DATA, dst_offset, src_offset, size)
            .map(|_| ())
    }

    /// Raises the peer's inbound counter after every put queued before it has landed;
    /// returns once the proxy has done so (the sources of those puts may then be reused).
    /// Traps where [`try_signal`](Self::try_signal) returns an error.
    #[inline]
    pub fn signal(&self) {
        if self.try_signal().is_err() {
            arch::trap();
        }
    }

    /// [`signal`](Self::signal) that returns an error instead of trapping:
    /// [`ChannelError::ProxyRefused`] when the proxy has refused a trigger of this
    /// connection (see the [module](self)), [`ChannelError::Timeout`] when the proxy did not
    /// act within the FIFO's timeout. The signal itself is sent in the first case.
    #[inline]
    pub fn try_signal(&self) -> Result<(), ChannelError> {
        let seq = self.push(TriggerOp::FLAG.union(TriggerOp::SYNC), 0, 0, 0)?;
        self.sync(seq)
    }

    /// [`put_at`](Self::put_at) then [`signal`](Self::signal), as one trigger.
    #[inline]
    pub fn put_with_signal(&self, dst_offset: u64, src_offset: u64, size: u64) {
        if self
            .try_put_with_signal(dst_offset, src_offset, size)
            .is_err()
        {
            arch::trap();
        }
    }

    /// [`put_with_signal`](Self::put_with_signal) that returns an error instead of trapping
    /// (as [`try_signal`](Self::try_signal)).
    #[inline]
    pub fn try_put_with_signal(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), ChannelError> {
        let op = TriggerOp::DATA
            .union(TriggerOp::FLAG)
            .union(TriggerOp::SYNC);
        let seq = self.push(op, dst_offset, src_offset, size)?;
        self.sync(seq)
    }

    /// [`put_at`](Self::put_at) then a signal, as one trigger, *without* waiting for the
    /// proxy: returns once the trigger is queued. The peer's inbound counter is raised after
    /// the data has landed, as with [`put_with_signal`](Self::put_with_signal), but on return
    /// the proxy may not have read the source yet: reuse it only after a
    /// [`flush`](Self::flush), or after the peer has shown that the data arrived (e.g. a
    /// signal it sent after waiting for this one). A refused put is reported by this
    /// connection's next [`try_signal`](Self::try_signal) or [`try_flush`](Self::try_flush).
    /// [`ChannelError::Timeout`] when the FIFO stayed full for its timeout (the FIFO is then
    /// broken: the claimed slot is never published); [`ChannelError::Aborted`] when the
    /// communicator was aborted while it waited for a slot (the trigger is then not queued
    /// and the FIFO is broken likewise, for every connection).
    #[inline]
    pub fn try_put_with_signal_queued(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), ChannelError> {
        self.push(
            TriggerOp::DATA.union(TriggerOp::FLAG),
            dst_offset,
            src_offset,
            size,
        )
        .map(|_| ())
    }

    /// [`put_with_signal`](Self::put_with_signal); the name states that on return every
    /// earlier put of this FIFO has completed too (the proxy completes in order).
    #[inline]
    pub fn put_with_signal_and_flush(&self, dst_offset: u64, src_offset: u64, size: u64) {
        self.put_with_signal(dst_offset, src_offset, size);
    }

    /// Waits until the proxy has completed every put queued so far on this FIFO. Traps
    /// where [`try_flush`](Self::try_flush) returns an error.
    #[inline]
    pub fn flush(&self) {
        if self.try_flush().is_err() {
            arch::trap();
        }
    }

    /// [`flush`](Self::flush) that returns an error instead of trapping (as
    /// [`try_signal`](Self::try_signal)).
    #[inline]
    pub fn try_flush(&self) -> Result<(), ChannelError> {
        let seq = self.push(TriggerOp::SYNC, 0, 0, 0)?;
        self.sync(seq)
    }

    /// Waits until the proxy has popped `seq`, then reports a fault it flagged for this
    /// connection.
    /// Gives up at the communicator's abort (or a lost rank) as the channel's waits do.
    #[inline(always)]
    fn sync(&self, seq: u64) -> Result<(), ChannelError> {
        // SAFETY: the FIFO is live (constructor contract); the fault area null or live.
        match unsafe { self.fifo.try_sync_status_or_abort(seq, self.abort_word()) } {
            Ok(SyncStatus::Clean) => Ok(()),
            Ok(SyncStatus::ProxyFaulted) => self.proxy_fault(),
            Err(SyncStop::Aborted(word)) => Err(ChannelError::from_abort_word(word)),
            Err(SyncStop::Timeout(_)) => Err(ChannelError::Timeout),
        }
    }

    /// The FIFO's tail says the proxy refused or failed some trigger: was it one of this
    /// connection's?
    #[cold]
    #[inline(never)]
    fn proxy_fault(&self) -> Result<(), ChannelError> {
        let refused = ChannelError::ProxyRefused {
            connection: self.connection_id,
        };
        // Relaxed (in `refused`): the proxy wrote the bit before the tail store this thread
        // acquired.
        if self.fault.is_null() || self.refused() {
            Err(refused)
        } else {
            Ok(())
        }
    }

    /// The peer's signals that waits and polls of this handle have taken tickets for so far
    /// (a relaxed load). Read before any wait of a phase, it is the count that phase's
    /// signals add to.
    #[inline]
    pub fn tickets(&self) -> u64 {
        // SAFETY: `expected` is this connection's live word, accessed only atomically
        // (constructor contract).
        unsafe { arch::ld_relaxed_sys_u64(self.expected) }
    }

    /// The peer's signals that have arrived so far (an acquire load: what the peer put
    /// before one of them is visible after it has been seen), taken or not. Reading it
    /// takes no ticket: a wait still waits for the next signal its ticket names.
    #[inline]
    pub fn arrived(&self) -> u64 {
        // SAFETY: `inbound` is a live aligned counter, accessed only atomically
        // (constructor contract).
        unsafe { arch::ld_acquire_sys_u64(self.inbound) }
    }

    /// Whether the proxy has refused or failed a trigger of this connection since it was
    /// launched, or found its peer gone (its bit in the fault area: e.g. a put to a peer
    /// whose connection closed, or a TCP stream from the peer that ended).
    /// `false` for a handle without a fault area. A relaxed load: a bit the proxy set before
    /// a tail this thread acquired is seen.
    #[inline]
    pub fn refused(&self) -> bool {
        if self.fault.is_null() {
            return false;
        }
        let (word, mask) = fault::refused_bit(self.connection_id);
        // SAFETY: the fault area is live and FAULT_WORDS long (constructor contract), and
        // refused_bit's word lies below FAULT_WORDS.
        let bits = unsafe { arch::ld_relaxed_sys_u64(self.fault.add(word)) };
        bits & mask != 0
    }

    /// Waits for the peer's next signal (with other waits at once: a signal of its own, see
    /// the [module](self)); traps after the handle's timeout or when the communicator is
    /// aborted ([`try_wait`](Self::try_wait) returns instead).
    #[inline]
    pub fn wait(&self) {
        if self.try_wait(self.wait_timeout_ns).is_err() {
            arch::trap();
        }
    }

    /// Waits at most `timeout_ns` for the peer's next signal; `false` if it did not come or
    /// the communicator was aborted (the expected epoch is then not advanced, so a later
    /// wait waits for the same one).
    #[inline]
    pub fn wait_timeout(&self, timeout_ns: u64) -> bool {
        self.try_wait(timeout_ns).is_ok()
    }

    /// [`wait_timeout`](Self::wait_timeout) that says why it gave up:
    /// [`ChannelError::Timeout`], or [`ChannelError::Aborted`] (the communicator's abort)
    /// or [`ChannelError::PeerLeft`] (the peer left without sending it) within about
    /// [`ABORT_LOOK_NS`](crate::semaphore::ABORT_LOOK_NS) of the news.
    #[inline]
    pub fn try_wait(&self, timeout_ns: u64) -> Result<(), ChannelError> {
        let abort = self.abort_word();
        // SAFETY: `inbound` is a live aligned counter and `expected` this connection's live
        // word, accessed only atomically; the fault area null or live (constructor
        // contract).
        unsafe { wait_inbound(self.inbound, self.expected, timeout_ns, abort) }
    }

    /// If the peer's next signal has arrived and no other wait holds a ticket for it,
    /// consumes it and returns `true`; never waits. Of polls that race for one signal,
    /// exactly one takes it.
    #[inline]
    pub fn poll(&self) -> bool {
        // SAFETY: as in `try_wait`.
        unsafe { poll_inbound(self.inbound, self.expected) }
    }
}
