//! [`Buffer`]: the memory connections read from and write to.

use std::sync::Arc;

use crate::cuda::{DeviceBuffer, MappedHostBuffer};

use super::error::CommError;
use super::shm::ShmSegment;

/// Memory that connections read from and write to: GPU memory on a GPU backend, shared
/// memory on the host backend, or (for TCP connections on a GPU backend) pinned host memory
/// mapped into the device. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Buffer {
    mem: Arc<BufferMem>,
}

/// The memory behind a [`Buffer`].
#[derive(Debug)]
pub(crate) enum BufferMem {
    /// GPU memory (GPU backend).
    Device(DeviceBuffer),
    /// Shared memory (Host backend).
    Host(ShmSegment),
    /// Pinned host memory the device reads and writes over PCIe, and the TCP transport's
    /// sockets directly (no staging copies, no stream-ordered flag write).
    Mapped(MappedHostBuffer),
}

impl Buffer {
    /// A buffer over `mem` (the communicator allocates it).
    pub(crate) fn new(mem: BufferMem) -> Buffer {
        Buffer { mem: Arc::new(mem) }
    }

    /// The memory behind the buffer.
    pub(crate) fn mem(&self) -> &BufferMem {
        &self.mem
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        match &*self.mem {
            BufferMem::Device(d) => d.len(),
            BufferMem::Host(s) => s.len(),
            BufferMem::Mapped(m) => m.len(),
        }
    }

    /// Never true (empty buffers are refused).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The device address, for a GPU buffer (or a host-mapped one: its device address).
    pub fn device_ptr(&self) -> Option<u64> {
        match &*self.mem {
            BufferMem::Device(d) => Some(d.device_ptr()),
            BufferMem::Host(_) => None,
            BufferMem::Mapped(m) => Some(m.device_ptr()),
        }
    }

    /// The host address, for a host (shared-memory) buffer or a host-mapped one.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        match &*self.mem {
            BufferMem::Device(_) => None,
            BufferMem::Host(s) => Some(s.as_ptr()),
            BufferMem::Mapped(m) => Some(m.host_ptr()),
        }
    }

    /// Whether this is pinned host memory mapped into the device
    /// ([`Communicator::alloc_mapped_buffer`]).
    ///
    /// [`Communicator::alloc_mapped_buffer`]: crate::communicator::Communicator::alloc_mapped_buffer
    pub fn is_mapped(&self) -> bool {
        matches!(&*self.mem, BufferMem::Mapped(_))
    }

    /// The address connections use: device address (host-mapped memory: its device
    /// address) or host address.
    pub(crate) fn addr(&self) -> u64 {
        match &*self.mem {
            BufferMem::Device(d) => d.device_ptr(),
            BufferMem::Host(s) => s.as_ptr() as u64,
            BufferMem::Mapped(m) => m.device_ptr(),
        }
    }

    /// The host address of host-mapped memory (what the TCP transport's sockets use).
    pub(crate) fn mapped_host_addr(&self) -> Option<u64> {
        match &*self.mem {
            BufferMem::Mapped(m) => Some(m.host_ptr() as u64),
            _ => None,
        }
    }

    /// Copies `src` into the buffer at `offset` (synchronous; for a host buffer, a memcpy
    /// that must not race with a peer's puts into the same range).
    pub fn write<T: Copy>(&self, offset: usize, src: &[T]) -> Result<(), CommError> {
        let bytes = std::mem::size_of_val(src);
        self.check(offset, bytes)?;
        match (&*self.mem, self.host_ptr()) {
            (BufferMem::Device(d), _) => Ok(d.copy_from_host(offset, src)?),
            (_, Some(p)) => {
                // SAFETY: the range is inside the mapping (checked); concurrent access is
                // excluded by the caller per the doc.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr() as *const u8, p.add(offset), bytes)
                };
                Ok(())
            }
            (_, None) => unreachable!("every buffer but a device one has a host address"),
        }
    }

    /// Copies from the buffer at `offset` into `dst` (synchronous).
    pub fn read<T: Copy>(&self, offset: usize, dst: &mut [T]) -> Result<(), CommError> {
        let bytes = std::mem::size_of_val(dst);
        self.check(offset, bytes)?;
        match (&*self.mem, self.host_ptr()) {
            (BufferMem::Device(d), _) => Ok(d.copy_to_host(offset, dst)?),
            (_, Some(p)) => {
                // SAFETY: as in `write`; `T: Copy` plain data is what callers store here.
                unsafe {
                    std::ptr::copy_nonoverlapping(p.add(offset), dst.as_mut_ptr() as *mut u8, bytes)
                };
                Ok(())
            }
            (_, None) => unreachable!("every buffer but a device one has a host address"),
        }
    }

    fn check(&self, offset: usize, bytes: usize) -> Result<(), CommError> {
        if offset.checked_add(bytes).is_some_and(|e| e <= self.len()) {
            Ok(())
        } else {
            Err(CommError::InvalidArgument(format!(
                "offset {offset} + size {bytes} is beyond the buffer of {} bytes",
                self.len()
            )))
        }
    }
}
