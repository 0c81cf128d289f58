//! Host staging: IB connections whose GPU buffer cannot be registered with the adapter
//! (neither dma-buf nor nvidia-peermem works), or that are forced to stage
//! ([`StagingMode::Always`], `MSCCLPP_IB_STAGING=1`).
//!
//! A staged side registers a pinned host *mirror* of its buffer (same size, same offsets)
//! and the NIC only ever touches the mirror:
//!
//! - **Sending from a staged buffer**: the proxy copies the put's source range GPU → mirror
//!   (on its stream, waiting for the copy) and posts the RDMA WRITE from the mirror.
//! - **Receiving into a staged buffer**: the peer's writes land in the mirror. The peer must
//!   not write its flag into our GPU-visible inbound counter (the data is not in GPU memory
//!   yet), so a staged side advertises the *epoch word* of its control block as its flag.
//!   For every put the sender also writes an 8-byte *record* (destination offset, size) into
//!   a ring in the receiver's control block, and at every signal the number of records
//!   written (the *count* word) before the epoch. The receiving proxy polls the epoch and
//!   count ([`DataPlane::progress`](super::super::DataPlane::progress)), copies exactly the
//!   recorded ranges mirror → GPU, then writes the epoch to the GPU inbound counter on the
//!   same stream, so the GPU sees the flag only after the data. It returns *credits*
//!   (records consumed) by an inline write into the sender's control block; a sender whose
//!   ring is full publishes its count and waits for them (with the plane's timeout, driving
//!   its own inbound side meanwhile so that two proxies waiting on each other progress).
//!
//! Only the recorded ranges are copied, never the whole buffer: bytes that the receiving
//! GPU wrote itself elsewhere in its buffer are not overwritten with stale mirror contents.
//!
//! Cost per put: one GPU → host copy on the sender (synchronised: the RDMA WRITE must read
//! finished bytes) when the sender is staged; one extra 8-byte inline write (the record)
//! when the receiver is staged, plus one per signal (the count) and one credit write per
//! [`RING`]/4 records back. On the receiver, one host → GPU copy per put, issued by its
//! proxy when it sees the next count or epoch: the data arrives a proxy poll later than
//! with GPUDirect RDMA, and only while the receiving proxy runs.
//!
//! Wire format of every word (flag, epoch, count, credit, record): little endian.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cuda::{CudaStream, memcpy_async, write_u64_async};
use crate::transport::TransportError;

use super::IbError;
use crate::settings::Settings;

/// Environment variable overriding [`IbConfig::staging`](super::IbConfig::staging): `1`
/// forces host staging for every IB connection, `0` never stages (GPU memory must register),
/// `auto` stages only GPU buffers that cannot be registered.
pub const IB_STAGING_ENV: &str = "MSCCLPP_IB_STAGING";

/// Records in a control block's ring.
pub const RING: u64 = 256;

/// Word offsets in a control block.
pub(crate) const EPOCH_WORD: u64 = 0;
pub(crate) const COUNT_WORD: u64 = 1;
pub(crate) const CREDIT_WORD: u64 = 2;
pub(crate) const RING_WORD: u64 = 4;
/// Size of a control block in bytes.
pub const CONTROL_BYTES: u64 = (RING_WORD + RING) * 8;

/// When an IB connection stages its buffer through host memory ([`Settings::ib_staging`]).
pub use crate::settings::StagingMode;

impl StagingMode {
    /// The mode [`IB_STAGING_ENV`] asks for, if it is set; an unknown value is an error.
    pub fn from_env() -> Result<Option<StagingMode>, IbError> {
        Settings::global()
            .map(|s| s.ib_staging)
            .map_err(|e| IbError::InvalidConfig(e.to_string()))
    }
}

/// A put record: destination offset in the low 32 bits, size in the high 32 (sizes and
/// offsets of triggers are 32-bit; a zero-size put is not recorded).
pub(crate) fn encode_record(offset: u64, size: u64) -> Option<u64> {
    (offset <= u32::MAX as u64 && size <= u32::MAX as u64 && size > 0)
        .then_some(offset | (size << 32))
}

/// The (offset, size) of a record.
pub(crate) fn decode_record(r: u64) -> (u64, u64) {
    (r & 0xffff_ffff, r >> 32)
}

/// Reads a little-endian word that a NIC writes.
///
/// # Safety
/// `addr` must be an 8-byte aligned word that stays allocated and is accessed only
/// atomically (or by the NIC) while this runs.
pub(crate) unsafe fn load_le(addr: u64) -> u64 {
    // SAFETY: guaranteed by the caller.
    let w = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
    // Acquire: pairs with the (release-ordered, RC in-order) write of this word by the NIC,
    // so the data and records written before it are visible.
    u64::from_le(w.load(Ordering::Acquire))
}

/// Host memory the NIC reads and writes for staging: a buffer mirror or a control block.
/// Page-aligned, zeroed, freed on drop; only addressed through raw pointers.
#[derive(Debug)]
pub(crate) struct HostMemory {
    kind: HostKind,
    len: usize,
}

#[derive(Debug)]
enum HostKind {
    /// Pinned and device-mapped (GPU backends: fast, asynchronous copies).
    Pinned(crate::cuda::MappedHostBuffer),
    /// Plain heap memory (host backends, control blocks).
    Heap(std::ptr::NonNull<u8>, std::alloc::Layout),
}

// SAFETY: the memory is owned by this value and only handed out as an address; concurrent
// access goes through raw pointers whose users state their own synchronisation.
unsafe impl Send for HostMemory {}
// SAFETY: as above; `&self` only gives addresses.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// `len` (> 0) zeroed bytes on the heap, page-aligned.
    pub(crate) fn heap(len: usize) -> Result<HostMemory, IbError> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| IbError::InvalidConfig(format!("staging memory of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).ok_or_else(|| {
            IbError::InvalidConfig(format!("cannot allocate {len} bytes of staging memory"))
        })?;
        Ok(HostMemory {
            kind: HostKind::Heap(ptr, layout),
            len,
        })
    }

    /// `len` bytes of pinned, device-mapped host memory on `gpu`.
    pub(crate) fn pinned(gpu: &crate::cuda::Gpu, len: usize) -> crate::cuda::Result<HostMemory> {
        Ok(HostMemory {
            kind: HostKind::Pinned(crate::cuda::MappedHostBuffer::alloc(gpu, len)?),
            len,
        })
    }

    /// Start address.
    pub(crate) fn addr(&self) -> u64 {
        match &self.kind {
            HostKind::Pinned(b) => b.host_ptr() as u64,
            HostKind::Heap(p, _) => p.as_ptr() as u64,
        }
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        if let HostKind::Heap(p, layout) = &self.kind {
            // SAFETY: allocated in `heap` with this layout, freed once.
            unsafe { std::alloc::dealloc(p.as_ptr(), *layout) };
        }
    }
}

/// Progress of one connection's staging, kept by the connection so that a relaunched proxy
/// continues where the last one stopped. Only the running proxy thread changes it (Relaxed;
/// the join in `proxy_stop` orders it before the next proxy).
#[derive(Debug, Default)]
pub struct StagingProgress {
    /// Records written into the peer's ring.
    pub(crate) sent: AtomicU64,
    /// Records the peer has been told about (count word written).
    pub(crate) published: AtomicU64,
    /// Records of the peer consumed (copied to the GPU) here.
    pub(crate) consumed: AtomicU64,
    /// Last epoch written to the local inbound counter.
    pub(crate) delivered: AtomicU64,
    /// Last credit written to the peer.
    pub(crate) credited: AtomicU64,
}

/// What an IB link needs for staging, when either side stages.
#[derive(Debug, Clone)]
pub struct LinkStaging {
    /// This side's buffer is staged: its mirror's address and local key (sources of our
    /// writes; the peer's writes land there).
    pub mirror: Option<(u64, u32)>,
    /// The peer's buffer is staged: we write records and counts into its control block.
    pub peer_staged: bool,
    /// This side's buffer (GPU address on a GPU backend).
    pub buffer: u64,
    /// Its size in bytes.
    pub buffer_len: u64,
    /// This side's inbound counter (what the GPU waits on).
    pub inbound: u64,
    /// This side's control block (host address).
    pub control: u64,
    /// The peer's control block (its address) and its remote key.
    pub peer_control: (u64, u32),
    /// Persistent progress (shared with the connection).
    pub progress: Arc<StagingProgress>,
}

/// Copies between a buffer and its staging mirror, and the stream-ordered flag write after
/// them. Operations complete (or are ordered) in the order they are issued.
pub trait StagingCopy: Send + std::fmt::Debug {
    /// Copies `len` bytes from the buffer at `src` into the mirror at `dst`; done when this
    /// returns (the NIC reads the mirror next).
    fn to_mirror(&mut self, dst: u64, src: u64, len: u64) -> Result<(), TransportError>;
    /// Queues a copy of `len` bytes from the mirror at `src` into the buffer at `dst`.
    fn to_buffer(&mut self, dst: u64, src: u64, len: u64) -> Result<(), TransportError>;
    /// Queues the write of `epoch` to the inbound counter at `flag`, after every copy queued
    /// before it.
    fn write_flag(&mut self, flag: u64, epoch: u64) -> Result<(), TransportError>;
    /// Returns once every copy and flag write queued so far is done. The default is for
    /// copiers whose work is done when queued.
    fn settle(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}

/// [`StagingCopy`] for host buffers (the Host backend, tests): memcpy and a release store.
#[derive(Debug, Default)]
pub struct HostStagingCopy;

impl StagingCopy for HostStagingCopy {
    fn to_mirror(&mut self, dst: u64, src: u64, len: u64) -> Result<(), TransportError> {
        // SAFETY: the plane passes ranges inside the buffer and its mirror (the proxy checked
        // the route; the mirror has the buffer's size), both kept alive while it runs; they
        // are distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len as usize) };
        Ok(())
    }

    fn to_buffer(&mut self, dst: u64, src: u64, len: u64) -> Result<(), TransportError> {
        // SAFETY: as in `to_mirror`; the range was checked against the buffer's size.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len as usize) };
        Ok(())
    }

    fn write_flag(&mut self, flag: u64, epoch: u64) -> Result<(), TransportError> {
        // SAFETY: `flag` is the connection's aligned inbound counter, alive while the proxy
        // runs and accessed only atomically.
        let w = unsafe { AtomicU64::from_ptr(flag as *mut u64) };
        // Release: the waiter's acquire load of the epoch sees the bytes copied above.
        w.store(epoch, Ordering::Release);
        Ok(())
    }
}

/// [`StagingCopy`] for GPU buffers: `cuMemcpyAsync` on the proxy's stream (synchronised for
/// GPU → mirror), the flag with `cuStreamWriteValue64` on the same stream after the copies.
#[derive(Debug)]
pub struct CudaStagingCopy {
    stream: Arc<CudaStream>,
}

impl CudaStagingCopy {
    /// Copies on `stream` (whose context the proxy thread binds).
    pub fn new(stream: Arc<CudaStream>) -> CudaStagingCopy {
        CudaStagingCopy { stream }
    }
}

impl StagingCopy for CudaStagingCopy {
    fn to_mirror(&mut self, dst: u64, src: u64, len: u64) -> Result<(), TransportError> {
        // SAFETY: `src` is a checked range of the connection's device buffer, `dst` the same
        // range of its pinned, device-mapped mirror (unified addressing); both outlive the
        // proxy. We wait for the copy before returning.
        unsafe { memcpy_async(dst, src, len as usize, &self.stream)? };
        self.stream
            .synchronize()
            .map_err(|e| crate::cuda::CudaError::driver("cuStreamSynchronize", e))?;
        Ok(())
    }

    fn to_buffer(&mut self, dst: u64, src: u64, len: u64) -> Result<(), TransportError> {
        // SAFETY: as in `to_mirror`, the other way; the peer does not rewrite this mirror
        // range before our GPU has seen the flag queued after this copy.
        unsafe { memcpy_async(dst, src, len as usize, &self.stream)? };
        Ok(())
    }

    fn write_flag(&mut self, flag: u64, epoch: u64) -> Result<(), TransportError> {
        // SAFETY: `flag` is the connection's aligned inbound counter in device memory, alive
        // while the proxy runs.
        unsafe { write_u64_async(flag, epoch, &self.stream)? };
        Ok(())
    }

    fn settle(&mut self) -> Result<(), TransportError> {
        self.stream
            .synchronize()
            .map_err(|e| crate::cuda::CudaError::driver("cuStreamSynchronize", e))?;
        Ok(())
    }
}
