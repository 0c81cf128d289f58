//! GPU staging of the TCP transport: sockets read and write host memory, so a GPU
//! connection's bytes pass through two pinned host slots, copied to or from the device on a
//! copy stream. While the socket works on one slot, the copy engine works on the other.
//!
//! The sender (the proxy's plane) fills a slot from the device, waits for it, and writes it
//! to a socket, having queued the next slot's copy before the wait. A receiver reads a frame
//! into a slot and queues its copy to the device; the slot is taken again only once that
//! copy is done. The receivers share one stream (every connection's, on one device), and
//! the flag that follows the data is written on that stream after every copy queued before
//! it (`cuStreamWriteValue64`), so a kernel that sees the flag sees the data.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::cuda::{CudaError, Gpu, MappedHostBuffer, memcpy_async};

/// Two pinned host slots and the copy stream they are copied on.
#[derive(Debug)]
pub(crate) struct Slots {
    stream: Arc<CudaStream>,
    slots: [MappedHostBuffer; 2],
    events: [CudaEvent; 2],
    /// A copy from or to the slot is queued and not yet waited for.
    pending: [bool; 2],
    next: usize,
}

fn driver(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::driver(call, e)
}

impl Slots {
    /// Two slots of `len` bytes each, copied on `stream` (a stream of `gpu`).
    pub(crate) fn new(gpu: &Gpu, stream: Arc<CudaStream>, len: usize) -> Result<Slots, CudaError> {
        let event = || {
            gpu.context()
                .new_event(None)
                .map_err(driver("cuEventCreate"))
        };
        Ok(Slots {
            slots: [
                MappedHostBuffer::alloc(gpu, len)?,
                MappedHostBuffer::alloc(gpu, len)?,
            ],
            events: [event()?, event()?],
            stream,
            pending: [false; 2],
            next: 0,
        })
    }

    /// The copy stream.
    pub(crate) fn stream(&self) -> &CudaStream {
        &self.stream
    }

    /// Waits for everything queued on the copy stream so far (this slot pair's copies and
    /// whatever else shares the stream).
    pub(crate) fn synchronize(&mut self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))?;
        self.pending = [false; 2];
        Ok(())
    }

    /// Bytes per slot.
    pub(crate) fn len(&self) -> usize {
        self.slots[0].len()
    }

    /// The next slot (they alternate), once the copy last queued on it is done.
    pub(crate) fn take(&mut self) -> Result<usize, CudaError> {
        let i = self.next;
        self.next ^= 1;
        self.wait(i)?;
        Ok(i)
    }

    /// Waits for the copy queued on slot `i`, if any.
    pub(crate) fn wait(&mut self, i: usize) -> Result<(), CudaError> {
        if self.pending[i] {
            self.events[i]
                .synchronize()
                .map_err(driver("cuEventSynchronize"))?;
            self.pending[i] = false;
        }
        Ok(())
    }

    /// The first `n` bytes of slot `i`, which has no copy pending.
    pub(crate) fn bytes(&mut self, i: usize, n: usize) -> &mut [u8] {
        assert!(
            !self.pending[i] && n <= self.len(),
            "TCP staging: slot {i} is busy or {n} bytes exceed it"
        );
        // SAFETY: the slot is `len` bytes of pinned host memory owned by `self`; no copy
        // touches it (none pending) and the `&mut self` borrow excludes other access.
        unsafe { std::slice::from_raw_parts_mut(self.slots[i].host_ptr(), n) }
    }

    fn queued(&mut self, i: usize) -> Result<(), CudaError> {
        self.pending[i] = true;
        self.events[i]
            .record(&self.stream)
            .map_err(driver("cuEventRecord"))
    }

    /// Queues a copy of `n` bytes from device address `src` into slot `i` (taken).
    ///
    /// # Safety
    /// `src..src + n` must be device memory that stays valid and unwritten until the slot
    /// has been waited for.
    pub(crate) unsafe fn fill(&mut self, i: usize, src: u64, n: usize) -> Result<(), CudaError> {
        assert!(!self.pending[i] && n <= self.len());
        // SAFETY: the slot is pinned host memory (a valid address under unified addressing)
        // of at least `n` bytes with no copy pending; the caller guarantees `src`.
        unsafe { memcpy_async(self.slots[i].host_ptr() as u64, src, n, &self.stream)? };
        self.queued(i)
    }

    /// Queues a copy of the first `n` bytes of slot `i` to device address `dst`.
    ///
    /// # Safety
    /// `dst..dst + n` must be device memory that stays valid until the stream has run the
    /// copy, and that nothing else accesses meanwhile.
    pub(crate) unsafe fn drain(&mut self, i: usize, dst: u64, n: usize) -> Result<(), CudaError> {
        assert!(!self.pending[i] && n <= self.len());
        // SAFETY: as in `fill`, the other way; the caller guarantees `dst`.
        unsafe { memcpy_async(dst, self.slots[i].host_ptr() as u64, n, &self.stream)? };
        self.queued(i)
    }
}
