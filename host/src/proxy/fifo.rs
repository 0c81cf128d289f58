//! The host side of the trigger FIFO: [`Fifo`] owns the ring and counters and gives out
//! the producers' [`FifoDeviceHandle`] and the proxy's [`OwnedFifoConsumer`].
//!
//! Validated here: the slot count, the timeout, allocation failures (typed errors, see
//! [`FifoError`]), a second consumer while one is alive, and a [`pop`](OwnedFifoConsumer::pop)
//! with nothing to pop. Not validated: that the kernels and CPU threads holding a
//! [`FifoDeviceHandle`] stop using it before the `Fifo` is dropped; launching a kernel is
//! `unsafe` for that reason. The consumer keeps the memory alive by itself.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cudarc::driver::DeviceRepr;
use mscclpp_device::fifo::{
    FifoConfigError, FifoConsumer, FifoDeviceHandle, MAX_TIMEOUT_NS, Trigger, check_slots,
};

use crate::cuda::{CudaError, DeviceBuffer, Gpu, MappedHostBuffer};

/// Slot count of [`FifoConfig::default`] (MSCCL++'s default FIFO size).
pub const DEFAULT_SLOTS: usize = 512;
/// How long a push or sync on the device waits for the proxy by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Layout: the ring at the start of the host-side memory, the tail on its own 128-byte
/// line after it; the head and the tail cache on separate lines of the device-side memory
/// (the head is hammered by atomics, the cache read by every push).
const LINE: usize = 128;
const HEAD_OFFSET: usize = 0;
const TAIL_CACHE_OFFSET: usize = LINE;
const DEVICE_SIDE_BYTES: usize = 2 * LINE;

fn tail_offset(slots: usize) -> usize {
    (slots * size_of::<Trigger>()).next_multiple_of(LINE)
}

/// Size and patience of a [`Fifo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FifoConfig {
    /// Trigger slots: a power of two in `MIN_SLOTS..=MAX_SLOTS` (2..=65536).
    pub slots: usize,
    /// How long a push (ring full) or a sync waits for the proxy before giving up
    /// (`1 ns..=1 h`).
    pub timeout: Duration,
}

impl Default for FifoConfig {
    fn default() -> FifoConfig {
        FifoConfig {
            slots: DEFAULT_SLOTS,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl FifoConfig {
    /// `slots` slots with the default timeout.
    pub fn with_slots(slots: usize) -> FifoConfig {
        FifoConfig {
            slots,
            ..FifoConfig::default()
        }
    }

    /// Checks both fields; returns the timeout in ns.
    fn check(&self) -> Result<u64, FifoConfigError> {
        check_slots(self.slots as u64)?;
        let timeout_ns = self.timeout.as_nanos().min(u64::MAX as u128) as u64;
        if timeout_ns == 0 || timeout_ns > MAX_TIMEOUT_NS {
            return Err(FifoConfigError::TimeoutOutOfRange { timeout_ns });
        }
        Ok(timeout_ns)
    }
}

/// What went wrong with a [`Fifo`].
#[derive(Debug, thiserror::Error)]
pub enum FifoError {
    /// A bad slot count or timeout.
    #[error("invalid FIFO configuration: {0}")]
    Config(#[from] FifoConfigError),
    /// Allocating the FIFO's GPU or pinned memory failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// Allocating the FIFO's host memory (Host transport) failed.
    #[error("allocating {bytes} bytes of FIFO memory failed")]
    HostAlloc {
        /// The size asked for.
        bytes: usize,
    },
    /// [`Fifo::consumer`] while another consumer of the FIFO is alive.
    #[error("the FIFO already has a consumer (drop it before taking another)")]
    ConsumerTaken,
    /// [`OwnedFifoConsumer::pop`] found no published trigger at the tail.
    #[error(
        "nothing to pop at FIFO tail {tail}: the trigger there is not published yet (pop only \
         after poll returned it)"
    )]
    NothingToPop {
        /// The tail (sequence number of the next trigger).
        tail: u64,
    },
}

/// Zeroed host memory with a 128-byte alignment, freed on drop (the Host transport's
/// stand-in for pinned and device memory).
#[derive(Debug)]
struct HostMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl HostMemory {
    fn zeroed(bytes: usize) -> Result<HostMemory, FifoError> {
        let layout =
            Layout::from_size_align(bytes, LINE).map_err(|_| FifoError::HostAlloc { bytes })?;
        // SAFETY: `bytes` > 0 for every FIFO region (a ring of at least 2 slots, or the
        // two counter lines).
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or(FifoError::HostAlloc { bytes })?;
        Ok(HostMemory { ptr, layout })
    }
}

// SAFETY: plain memory owned by this value; concurrent access to it goes through the
// FIFO's atomics.
unsafe impl Send for HostMemory {}
// SAFETY: as above; `&self` gives out nothing.
unsafe impl Sync for HostMemory {}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Who owns the FIFO's memory.
#[derive(Debug)]
enum Memory {
    /// Ring + tail pinned and device-mapped (the CPU reads it), head + cache on the GPU.
    Gpu {
        _host_side: MappedHostBuffer,
        _device_side: DeviceBuffer,
    },
    /// The same layout in ordinary host memory.
    Host {
        _host_side: HostMemory,
        _device_side: HostMemory,
    },
}

/// The memory and what the consumer side needs of it, shared by the [`Fifo`] and its
/// consumer so that either may be dropped first.
#[derive(Debug)]
struct Shared {
    /// The ring and the tail, as the host addresses them.
    ring: *const Trigger,
    tail: *mut u64,
    slots: u64,
    /// Whether an [`OwnedFifoConsumer`] is alive: a FIFO has one consumer at a time.
    consumer_taken: AtomicBool,
    memory: Memory,
}

// SAFETY: `ring` and `tail` point into `memory`, which this value owns; the memory is only
// accessed through the FIFO's atomics (`arch`).
unsafe impl Send for Shared {}
// SAFETY: as above; `&self` accesses are atomic.
unsafe impl Sync for Shared {}

/// A trigger FIFO: owns the ring (`slots` × 16 bytes) and its head, tail and cached tail;
/// gives kernels (or CPU threads) a [`FifoDeviceHandle`] and the proxy thread its single
/// consumer, an [`OwnedFifoConsumer`].
///
/// On a GPU ([`Fifo::new_gpu`]) the ring and the tail are pinned host memory mapped into
/// the device, not write-combined (the proxy reads the ring; the GPU reads the tail only
/// when its cached copy says the ring is full); the head and the cached tail are device
/// memory. On the Host transport ([`Fifo::new_host`]) the same layout lives in ordinary
/// host memory and the handle's pushers are CPU threads.
///
/// ```
/// use mscclpp_host::proxy::{Fifo, FifoConfig, Trigger, TriggerOp};
///
/// let fifo = Fifo::new_host(FifoConfig::with_slots(8))?;
/// let handle = fifo.device_handle();
/// let mut consumer = fifo.consumer()?;
/// let t = Trigger::new(TriggerOp::DATA, 3, 4096, 0, 1024)?;
/// // SAFETY: `fifo` outlives the push.
/// let seq = unsafe { handle.try_push(t) }?;
/// assert_eq!(consumer.poll(), Some(t));
/// assert_eq!(consumer.pop()?, seq);
/// assert_eq!(consumer.poll(), None);
/// assert_eq!(fifo.tail(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Fifo {
    handle: FifoDeviceHandle,
    shared: Arc<Shared>,
}

impl Fifo {
    /// A FIFO for kernels on `gpu`, popped by a host thread.
    pub fn new_gpu(gpu: &Gpu, config: FifoConfig) -> Result<Fifo, FifoError> {
        let timeout_ns = config.check()?;
        let tail_off = tail_offset(config.slots);
        let host_side = MappedHostBuffer::alloc(gpu, tail_off + LINE)?;
        let device_side = DeviceBuffer::zeroed(gpu, DEVICE_SIDE_BYTES)?;
        let (h, d) = (host_side.device_ptr(), device_side.device_ptr());
        let handle = FifoDeviceHandle::new(
            h as *mut Trigger,
            (d + HEAD_OFFSET as u64) as *mut u64,
            (h + tail_off as u64) as *mut u64,
            (d + TAIL_CACHE_OFFSET as u64) as *mut u64,
            config.slots as u64,
            timeout_ns,
        )?;
        let host = host_side.host_ptr();
        Ok(Fifo {
            handle,
            shared: Arc::new(Shared {
                ring: host as *const Trigger,
                tail: host.wrapping_add(tail_off) as *mut u64,
                slots: config.slots as u64,
                consumer_taken: AtomicBool::new(false),
                memory: Memory::Gpu {
                    _host_side: host_side,
                    _device_side: device_side,
                },
            }),
        })
    }

    /// A FIFO in ordinary host memory, pushed by CPU threads (the Host transport).
    pub fn new_host(config: FifoConfig) -> Result<Fifo, FifoError> {
        let timeout_ns = config.check()?;
        let tail_off = tail_offset(config.slots);
        let host_side = HostMemory::zeroed(tail_off + LINE)?;
        let device_side = HostMemory::zeroed(DEVICE_SIDE_BYTES)?;
        let (h, d) = (host_side.ptr.as_ptr(), device_side.ptr.as_ptr());
        let tail = h.wrapping_add(tail_off) as *mut u64;
        let handle = FifoDeviceHandle::new(
            h as *mut Trigger,
            d.wrapping_add(HEAD_OFFSET) as *mut u64,
            tail,
            d.wrapping_add(TAIL_CACHE_OFFSET) as *mut u64,
            config.slots as u64,
            timeout_ns,
        )?;
        Ok(Fifo {
            handle,
            shared: Arc::new(Shared {
                ring: h as *const Trigger,
                tail,
                slots: config.slots as u64,
                consumer_taken: AtomicBool::new(false),
                memory: Memory::Host {
                    _host_side: host_side,
                    _device_side: device_side,
                },
            }),
        })
    }

    /// Whether the FIFO was made for a GPU ([`Fifo::new_gpu`]).
    pub fn is_on_gpu(&self) -> bool {
        matches!(self.shared.memory, Memory::Gpu { .. })
    }

    /// The producer handle, for kernels (as a [`kernel_arg`](Fifo::kernel_arg)) or CPU
    /// threads. Its pointers stay valid only while this `Fifo` lives.
    pub fn device_handle(&self) -> FifoDeviceHandle {
        self.handle
    }

    /// The producer handle as a cudarc kernel argument (passed by value).
    pub fn kernel_arg(&self) -> FifoKernelArg {
        FifoKernelArg(self.handle)
    }

    /// Number of trigger slots.
    pub fn slots(&self) -> usize {
        self.shared.slots as usize
    }

    /// The published tail: the number of triggers popped so far.
    pub fn tail(&self) -> u64 {
        // SAFETY: `tail` is a live aligned word of the shared memory, accessed atomically.
        let tail = unsafe { mscclpp_device::arch::ld_acquire_sys_u64(self.shared.tail) };
        tail & !mscclpp_device::fifo::TAIL_FAULT
    }

    /// The FIFO's consumer, for the proxy thread: it starts at the published tail and
    /// keeps the memory alive. One at a time: while it lives another call returns
    /// [`FifoError::ConsumerTaken`]; once it is dropped (say the proxy stopped) the next
    /// consumer carries on where it left off.
    pub fn consumer(&self) -> Result<OwnedFifoConsumer, FifoError> {
        // Acquire: pairs with the release in the previous consumer's drop, so its last
        // tail store is seen by the new consumer's read of the tail.
        if self.shared.consumer_taken.swap(true, Ordering::AcqRel) {
            return Err(FifoError::ConsumerTaken);
        }
        // SAFETY: the ring and tail are live in `shared`, which the consumer keeps alive;
        // the flag above makes it the only consumer.
        let consumer =
            unsafe { FifoConsumer::new(self.shared.ring, self.shared.tail, self.shared.slots) };
        match consumer {
            Ok(consumer) => Ok(OwnedFifoConsumer {
                consumer,
                shared: self.shared.clone(),
            }),
            Err(e) => {
                // Release: as in `OwnedFifoConsumer::drop`.
                self.shared.consumer_taken.store(false, Ordering::Release);
                Err(e.into())
            }
        }
    }
}

/// The single consumer of a [`Fifo`] (from [`Fifo::consumer`]), for the proxy thread:
/// [`poll`](Self::poll) looks at the next trigger, [`pop`](Self::pop) consumes it and
/// publishes the tail at once (a release store; publication is not batched, see
/// [`FifoConsumer`]). It shares the FIFO's memory, so it stays valid if the `Fifo` is
/// dropped first (though then nobody pushes).
#[derive(Debug)]
pub struct OwnedFifoConsumer {
    consumer: FifoConsumer,
    shared: Arc<Shared>,
}

impl OwnedFifoConsumer {
    /// Number of trigger slots.
    pub fn slots(&self) -> usize {
        self.consumer.slots() as usize
    }

    /// The tail: sequence number of the next trigger to pop (= the number popped).
    pub fn tail(&self) -> u64 {
        self.consumer.tail()
    }

    /// The next trigger if its producer has published it, without consuming it.
    pub fn poll(&self) -> Option<Trigger> {
        self.consumer.poll()
    }

    /// Consumes the next trigger and publishes the new tail; returns its sequence number.
    /// Call it once the trigger has been acted on: from then on producers may reuse its
    /// slot and a `sync` on it returns.
    pub fn pop(&mut self) -> Result<u64, FifoError> {
        self.consumer.pop().ok_or(FifoError::NothingToPop {
            tail: self.consumer.tail(),
        })
    }

    /// Flags every tail published from now on: the proxy refused or failed a trigger (see
    /// `mscclpp_device::fifo::TAIL_FAULT`). A later consumer of the FIFO starts clean.
    pub fn mark_fault(&mut self) {
        self.consumer.mark_fault();
    }
}

impl Drop for OwnedFifoConsumer {
    fn drop(&mut self) {
        // Release: the next consumer (which acquires the flag) sees our last tail store.
        self.shared.consumer_taken.store(false, Ordering::Release);
    }
}

/// A [`FifoDeviceHandle`] as a kernel argument for cudarc's launch builder
/// (`builder.arg(&fifo.kernel_arg())`); the kernel declares the parameter as
/// `FifoDeviceHandle`.
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct FifoKernelArg(pub FifoDeviceHandle);

// SAFETY: `FifoDeviceHandle` is `#[repr(C)]`, 48 bytes of pointers and integers with the
// same layout in the host and the nvptx64 build (size and alignment asserted in the device
// crate), so its bytes are a valid by-value kernel parameter.
unsafe impl DeviceRepr for FifoKernelArg {}

#[cfg(test)]
mod tests;
