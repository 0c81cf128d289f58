//! The host side of the trigger FIFO: [`Fifo`] owns the ring and counters and is the
//! proxy's consumer.
//!
//! Validated here: the slot count, the timeout, allocation failures (typed errors, see
//! [`FifoError`]), and a [`pop`](Fifo::pop) with nothing to pop. Not validated: that the
//! kernels and CPU threads holding a [`FifoDeviceHandle`] stop using it before the `Fifo`
//! is dropped; launching a kernel is `unsafe` for that reason.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
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
    /// [`Fifo::pop`] found no published trigger at the tail.
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

/// Who owns the FIFO's memory. Only held so that it lives as long as the `Fifo`.
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

/// A trigger FIFO: owns the ring (`slots` × 16 bytes) and its head, tail and cached tail;
/// gives kernels (or CPU threads) a [`FifoDeviceHandle`] and is itself the single
/// consumer, for the proxy thread.
///
/// On a GPU ([`Fifo::on_gpu`]) the ring and the tail are pinned host memory mapped into
/// the device, not write-combined (the proxy reads the ring; the GPU reads the tail only
/// when its cached copy says the ring is full); the head and the cached tail are device
/// memory. On the Host transport ([`Fifo::on_host`]) the same layout lives in ordinary
/// host memory and the handle's pushers are CPU threads.
///
/// The consumer API is [`poll`](Fifo::poll) (look at the next trigger) and
/// [`pop`](Fifo::pop) (consume it and publish the tail, at once: publication is not
/// batched, see [`FifoConsumer`]).
///
/// ```
/// use mscclpp_host::proxy::{Fifo, FifoConfig, Trigger, TriggerOp};
///
/// let mut fifo = Fifo::on_host(FifoConfig::with_slots(8))?;
/// let handle = fifo.device_handle();
/// let t = Trigger::new(TriggerOp::DATA, 3, 4096, 0, 1024)?;
/// // SAFETY: `fifo` outlives the push.
/// let seq = unsafe { handle.try_push(t) }?;
/// assert_eq!(fifo.poll(), Some(t));
/// assert_eq!(fifo.pop()?, seq);
/// assert_eq!(fifo.poll(), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Fifo {
    handle: FifoDeviceHandle,
    consumer: FifoConsumer,
    // Last: dropped after the handle and consumer that point into it.
    memory: Memory,
}

impl Fifo {
    /// A FIFO for kernels on `gpu`, popped by a host thread.
    pub fn on_gpu(gpu: &Gpu, config: FifoConfig) -> Result<Fifo, FifoError> {
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
        // SAFETY: the ring and tail are in `host_side`, zeroed, kept alive by the `Fifo`
        // for as long as the consumer; the `Fifo` owns the only consumer.
        let consumer = unsafe {
            FifoConsumer::new(
                host as *const Trigger,
                host.wrapping_add(tail_off) as *mut u64,
                config.slots as u64,
            )
        }?;
        Ok(Fifo {
            handle,
            consumer,
            memory: Memory::Gpu {
                _host_side: host_side,
                _device_side: device_side,
            },
        })
    }

    /// A FIFO in ordinary host memory, pushed by CPU threads (the Host transport).
    pub fn on_host(config: FifoConfig) -> Result<Fifo, FifoError> {
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
        // SAFETY: as in `on_gpu`, with `host_side`.
        let consumer =
            unsafe { FifoConsumer::new(h as *const Trigger, tail, config.slots as u64) }?;
        Ok(Fifo {
            handle,
            consumer,
            memory: Memory::Host {
                _host_side: host_side,
                _device_side: device_side,
            },
        })
    }

    /// Whether the FIFO was made for a GPU ([`Fifo::on_gpu`]).
    pub fn is_on_gpu(&self) -> bool {
        matches!(self.memory, Memory::Gpu { .. })
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

    /// Consumes the next trigger and publishes the new tail (a release store, not
    /// batched); returns its sequence number. Call it once the trigger has been acted on:
    /// from then on producers may reuse its slot and a `sync` on it returns.
    pub fn pop(&mut self) -> Result<u64, FifoError> {
        self.consumer.pop().ok_or(FifoError::NothingToPop {
            tail: self.consumer.tail(),
        })
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
