//! [`DevConn`]: one side of a proxy channel, the seed's `mscclppDevConn`.
//!
//! Semantics (DESIGN §4):
//! - [`put`](DevConn::put) / [`put_at`](DevConn::put_at) queue a copy from the local
//!   buffer to the peer's and return at once;
//! - [`signal`](DevConn::signal): after every put queued before it has landed, the peer's
//!   inbound counter is raised; when it returns, the source data may be reused (it waits
//!   until the proxy has acted on it);
//! - [`wait`](DevConn::wait): waits until the inbound counter reaches the next expected
//!   epoch; when it returns, the data the peer put before its matching signal is visible;
//! - extras: [`flush`](DevConn::flush) (all queued puts of this FIFO done),
//!   [`poll`](DevConn::poll) (a wait that does not block),
//!   [`put_with_signal`](DevConn::put_with_signal) and
//!   [`put_with_signal_and_flush`](DevConn::put_with_signal_and_flush).
//!
//! The inbound counter holds the number of signals the peer has sent on this connection; the
//! peer's proxy writes it after the data, in the same ordered engine, so a value is never
//! seen before the data it follows, and writing it again is harmless.
//!
//! Threads: puts and signals may come from any number of threads at once (the FIFO is
//! multi-producer); `wait`/`poll` of one connection must come from one thread at a time
//! (they advance a plain expected-epoch counter).
//!
//! Waits time out (`wait` after the handle's timeout traps, so the kernel fails visibly;
//! [`wait_timeout`](DevConn::wait_timeout) returns `false`). Field limits of the triggers
//! are those of [`Trigger`]; a put beyond them traps; offsets beyond the buffers are
//! refused by the proxy, which reports them to the host.

use core::fmt;
use core::marker::PhantomData;

use crate::arch;
use crate::fifo::{FifoDeviceHandle, Trigger, TriggerOp};
use crate::semaphore::{poll_inbound, wait_inbound};

/// One side of a proxy channel, passed by value to kernels (`#[repr(C)]`, `Copy`).
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
    reserved: u32,
    wait_timeout_ns: u64,
    _memory: PhantomData<&'a ()>,
}

const _: () = assert!(
    core::mem::size_of::<DevConn<'static>>()
        == core::mem::size_of::<FifoDeviceHandle>() + 3 * 8 + 2 * 4
);

// SAFETY: addresses and numbers only; the memory behind them is accessed atomically (or by
// the one waiting thread, for `expected`) under the contracts of the `unsafe` methods.
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
    /// a live, 8-byte aligned, zero-initialised word used by this connection's waits only.
    /// All must stay live for `'a` (the caller picks `'a`; nothing checks it).
    pub unsafe fn from_raw_parts(
        fifo: FifoDeviceHandle,
        connection_id: u32,
        inbound: *mut u64,
        expected: *mut u64,
        wait_timeout_ns: u64,
    ) -> DevConn<'a> {
        DevConn {
            fifo,
            inbound,
            expected,
            connection_id,
            reserved: 0,
            wait_timeout_ns,
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
            reserved: self.reserved,
            wait_timeout_ns: self.wait_timeout_ns,
            _memory: PhantomData,
        }
    }

    /// The connection's id in its proxy.
    pub fn connection_id(&self) -> u32 {
        self.connection_id
    }

    #[inline(always)]
    fn push(&self, op: TriggerOp, dst_offset: u64, src_offset: u64, size: u64) -> u64 {
        match Trigger::new(op, self.connection_id, dst_offset, src_offset, size) {
            // SAFETY: the FIFO is live (constructor contract).
            Ok(t) => unsafe { self.fifo.push(t) },
            Err(_) => arch::trap(),
        }
    }

    /// Queues a copy of `size` bytes at `offset` of the local buffer to the same offset of
    /// the peer's buffer.
    #[inline]
    pub fn put(&self, offset: u64, size: u64) {
        self.put_at(offset, offset, size);
    }

    /// Queues a copy of `size` bytes from `src_offset` of the local buffer to `dst_offset`
    /// of the peer's.
    #[inline]
    pub fn put_at(&self, dst_offset: u64, src_offset: u64, size: u64) {
        self.push(TriggerOp::DATA, dst_offset, src_offset, size);
    }

    /// Raises the peer's inbound counter after every put queued before it has landed;
    /// returns once the proxy has done so (the sources of those puts may then be reused).
    #[inline]
    pub fn signal(&self) {
        let seq = self.push(TriggerOp::FLAG.union(TriggerOp::SYNC), 0, 0, 0);
        // SAFETY: the FIFO is live (constructor contract).
        unsafe { self.fifo.sync(seq) };
    }

    /// [`put_at`](Self::put_at) then [`signal`](Self::signal), as one trigger.
    #[inline]
    pub fn put_with_signal(&self, dst_offset: u64, src_offset: u64, size: u64) {
        let op = TriggerOp::DATA
            .union(TriggerOp::FLAG)
            .union(TriggerOp::SYNC);
        let seq = self.push(op, dst_offset, src_offset, size);
        // SAFETY: the FIFO is live (constructor contract).
        unsafe { self.fifo.sync(seq) };
    }

    /// [`put_with_signal`](Self::put_with_signal); the name states that on return every
    /// earlier put of this FIFO has completed too (the proxy completes in order).
    #[inline]
    pub fn put_with_signal_and_flush(&self, dst_offset: u64, src_offset: u64, size: u64) {
        self.put_with_signal(dst_offset, src_offset, size);
    }

    /// Waits until the proxy has completed every put queued so far on this FIFO.
    #[inline]
    pub fn flush(&self) {
        let seq = self.push(TriggerOp::SYNC, 0, 0, 0);
        // SAFETY: the FIFO is live (constructor contract).
        unsafe { self.fifo.sync(seq) };
    }

    /// Waits for the peer's next signal; traps after the handle's timeout.
    #[inline]
    pub fn wait(&self) {
        if !self.wait_timeout(self.wait_timeout_ns) {
            arch::trap();
        }
    }

    /// Waits at most `timeout_ns` for the peer's next signal; `false` if it did not come
    /// (the expected epoch is then not advanced, so a later wait waits for the same one).
    #[inline]
    pub fn wait_timeout(&self, timeout_ns: u64) -> bool {
        // SAFETY: `inbound` is a live aligned counter and `expected` this connection's live
        // word, used by one waiting thread at a time (constructor and module contract).
        unsafe { wait_inbound(self.inbound, self.expected, timeout_ns) }
    }

    /// If the peer's next signal has arrived, consumes it and returns `true`; never waits.
    #[inline]
    pub fn poll(&self) -> bool {
        // SAFETY: as in `wait_timeout`.
        unsafe { poll_inbound(self.inbound, self.expected) }
    }
}
