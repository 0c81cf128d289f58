//! Device allocations that can be exported over CUDA IPC, peer mappings of them, and pinned
//! host memory mapped into the device.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::driver::sys::{self, CUdeviceptr, CUipcMem_flags};

use super::{CudaError, Gpu, Result, check};

fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread()
        .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))
}

/// Runs `work` (asynchronous copies or sets of device memory on the stream it is given) on a
/// non-blocking stream of its own in `ctx`'s context and waits for it there. The
/// "synchronous" driver calls are not enough for [`DeviceBuffer`]'s copies: `cuMemsetD8` may
/// return before the device memory is set, and `cuMemcpyHtoD` from pageable memory once the
/// data is staged, before its DMA lands, both on the legacy stream, which kernels on
/// non-blocking streams (ours, cudarc's) do not wait for. A stream of our own waits for our
/// work alone, never for the caller's on other streams.
fn on_own_stream(
    ctx: &CudaContext,
    what: &'static str,
    work: impl FnOnce(sys::CUstream) -> sys::CUresult,
) -> Result<()> {
    bind(ctx)?;
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the context is current.
    check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(
            &mut stream,
            sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
        )
    })?;
    let done = check(what, work(stream)).and_then(|()| {
        // SAFETY: the stream made above.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(stream)
        })
    });
    // SAFETY: the stream made above; its work is done or failed, and nothing else uses it.
    unsafe { sys::cuStreamDestroy_v2(stream) };
    done
}

fn check_range(what: &str, len: usize, offset: usize, bytes: usize) -> Result<()> {
    match offset.checked_add(bytes) {
        Some(end) if end <= len => Ok(()),
        _ => Err(CudaError::InvalidArgument(format!(
            "{what}: offset {offset} + size {bytes} is beyond the buffer of {len} bytes"
        ))),
    }
}

/// Device memory from `cuMemAlloc`: exportable with [`DeviceBuffer::ipc_handle`], freed on
/// drop. Zero-sized buffers are refused.
#[derive(Debug)]
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` (> 0) of device memory on `gpu`, uninitialised.
    pub fn alloc(gpu: &Gpu, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(CudaError::InvalidArgument(
                "device buffer of 0 bytes".into(),
            ));
        }
        bind(gpu.context())?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the context is current.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) })?;
        Ok(DeviceBuffer {
            ctx: gpu.context().clone(),
            ptr,
            len: bytes,
        })
    }

    /// Allocates `bytes` and sets them to zero.
    pub fn zeroed(gpu: &Gpu, bytes: usize) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::alloc(gpu, bytes)?;
        on_own_stream(&b.ctx, "cuMemsetD8Async", |stream| {
            // SAFETY: the range is the whole live allocation; the context is current.
            unsafe { sys::cuMemsetD8Async(b.ptr, 0, b.len, stream) }
        })?;
        Ok(b)
    }

    /// The device address (a kernel argument).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty buffers are refused at allocation.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Copies `src` to `offset` bytes into the buffer; the data is in device memory when it
    /// returns, for kernels on any stream.
    pub fn copy_from_host<T: Copy>(&self, offset: usize, src: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(src);
        check_range("copy to device", self.len, offset, bytes)?;
        on_own_stream(&self.ctx, "cuMemcpyHtoDAsync", |stream| {
            // SAFETY: the destination range is inside the allocation (checked) and `src` is
            // `bytes` readable bytes, borrowed until the stream is synchronized.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    self.ptr + offset as u64,
                    src.as_ptr() as *const c_void,
                    bytes,
                    stream,
                )
            }
        })
    }

    /// Copies from `offset` bytes into the buffer into `dst` (synchronous). It does not wait
    /// for kernels on non-blocking streams: synchronize the streams that write the buffer
    /// first.
    pub fn copy_to_host<T: Copy>(&self, offset: usize, dst: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(dst);
        check_range("copy from device", self.len, offset, bytes)?;
        bind(&self.ctx)?;
        // SAFETY: the source range is inside the allocation (checked) and `dst` is `bytes`
        // writable bytes of a `Copy` type for which any bit pattern the GPU wrote is the
        // caller's responsibility (plain numbers in practice).
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(
                dst.as_mut_ptr() as *mut c_void,
                self.ptr + offset as u64,
                bytes,
            )
        })
    }

    /// The CUDA IPC handle another process opens with [`PeerMapping::open`].
    pub fn ipc_handle(&self) -> Result<IpcMemHandle> {
        bind(&self.ctx)?;
        let mut h = sys::CUipcMemHandle {
            reserved: [0; sys::CU_IPC_HANDLE_SIZE as usize],
        };
        // SAFETY: `h` is a valid out-pointer and `ptr` the base of a cuMemAlloc allocation.
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut h, self.ptr)
        })?;
        let mut bytes = [0u8; 64];
        for (b, c) in bytes.iter_mut().zip(h.reserved) {
            *b = c as u8;
        }
        Ok(IpcMemHandle {
            bytes,
            len: self.len as u64,
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// A CUDA IPC memory handle with the size of the buffer it names; plain bytes, to send over
/// the bootstrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcMemHandle {
    /// The driver's 64 opaque bytes.
    pub bytes: [u8; 64],
    /// Size of the exported buffer in bytes.
    pub len: u64,
}

/// Another process's [`DeviceBuffer`] mapped into this one through its [`IpcMemHandle`];
/// unmapped on drop.
#[derive(Debug)]
pub struct PeerMapping {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
    len: usize,
}

impl PeerMapping {
    /// Maps `handle` into `gpu`'s address space (peer access enabled lazily).
    pub fn open(gpu: &Gpu, handle: &IpcMemHandle) -> Result<PeerMapping> {
        bind(gpu.context())?;
        let mut raw = sys::CUipcMemHandle {
            reserved: [0; sys::CU_IPC_HANDLE_SIZE as usize],
        };
        for (c, b) in raw.reserved.iter_mut().zip(handle.bytes) {
            *c = b as _;
        }
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the driver validates the handle.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                raw,
                CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(PeerMapping {
            ctx: gpu.context().clone(),
            ptr,
            len: handle.len as usize,
        })
    }

    /// The mapped address in this process.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes of the peer's buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the peer's buffer is empty (never, for handles of [`DeviceBuffer`]s).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle and is closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

/// Pinned host memory mapped into the device's address space, not write-combined (the CPU
/// reads it at full speed: FIFOs, flags, probes). Zeroed at allocation, freed on drop.
#[derive(Debug)]
pub struct MappedHostBuffer {
    ctx: Arc<CudaContext>,
    host: *mut u8,
    device: CUdeviceptr,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; the raw pointer is only an
// address. Concurrent access through it is governed by the `unsafe` accessors' contracts.
unsafe impl Send for MappedHostBuffer {}
// SAFETY: as above; `&self` methods only hand out addresses.
unsafe impl Sync for MappedHostBuffer {}

impl MappedHostBuffer {
    /// Allocates `bytes` (> 0) with `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`.
    pub fn alloc(gpu: &Gpu, bytes: usize) -> Result<MappedHostBuffer> {
        if bytes == 0 {
            return Err(CudaError::InvalidArgument(
                "mapped host buffer of 0 bytes".into(),
            ));
        }
        bind(gpu.context())?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: `host` is a valid out-pointer; the context is current.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut host, bytes, flags)
        })?;
        let mut device: CUdeviceptr = 0;
        // SAFETY: `host` was just allocated with DEVICEMAP.
        let r = check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0)
        });
        if let Err(e) = r {
            // SAFETY: `host` came from cuMemHostAlloc and is not used again.
            let _ = unsafe { sys::cuMemFreeHost(host) };
            return Err(e);
        }
        // SAFETY: `host` points to `bytes` writable bytes that nothing else uses yet.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, bytes) };
        Ok(MappedHostBuffer {
            ctx: gpu.context().clone(),
            host: host as *mut u8,
            device,
            len: bytes,
        })
    }

    /// The host address.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The device address of the same memory (a kernel argument).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.device
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty buffers are refused at allocation.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for MappedHostBuffer {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: `host` came from cuMemHostAlloc and is freed once.
            let _ = unsafe { sys::cuMemFreeHost(self.host as *mut c_void) };
        }
    }
}

/// Host memory the caller owns (e.g. a shared-memory segment), page-locked and mapped into
/// the device with `cuMemHostRegister(DEVICEMAP | PORTABLE)`: kernels reach it at
/// [`device_ptr`](Self::device_ptr) while the CPU keeps using its own address.
/// Unregistered on drop (the memory itself stays the caller's).
#[derive(Debug)]
pub struct HostRegistration {
    ctx: Arc<CudaContext>,
    host: *mut u8,
    device: CUdeviceptr,
    len: usize,
}

// SAFETY: the value holds only addresses of memory it does not own and the context that
// registered it; unregistering from any thread is allowed by the driver.
unsafe impl Send for HostRegistration {}
// SAFETY: as above; `&self` methods only hand out addresses.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` (> 0) bytes at `host` with the device of `gpu`.
    ///
    /// # Safety
    /// `host..host + len` must be mapped, readable and writable memory (page-aligned, as a
    /// mapping is) that stays mapped until the returned value is dropped, and must not be
    /// registered already.
    pub unsafe fn new(gpu: &Gpu, host: *mut u8, len: usize) -> Result<HostRegistration> {
        if len == 0 {
            return Err(CudaError::InvalidArgument(
                "host registration of 0 bytes".into(),
            ));
        }
        bind(gpu.context())?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller guarantees the range is mapped and not yet registered; the
        // context is current.
        check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(host as *mut c_void, len, flags)
        })?;
        let mut device: CUdeviceptr = 0;
        // SAFETY: `host` was just registered with DEVICEMAP; `device` is a valid out-pointer.
        let r = check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0)
        });
        if let Err(e) = r {
            // SAFETY: registered above and not used again.
            let _ = unsafe { sys::cuMemHostUnregister(host as *mut c_void) };
            return Err(e);
        }
        Ok(HostRegistration {
            ctx: gpu.context().clone(),
            host,
            device,
            len,
        })
    }

    /// The device address of the registered memory (a kernel argument).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.device
    }

    /// The host address given at registration.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty registrations are refused.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: `host` was registered by `new` and is unregistered once; the caller
            // of `new` keeps it mapped until now.
            let _ = unsafe { sys::cuMemHostUnregister(self.host as *mut c_void) };
        }
    }
}

/// A dma-buf file descriptor exporting the device allocation around a range (for RDMA
/// registration with `ibv_reg_dmabuf_mr`), and the range's offset inside it. The fd closes on
/// drop; registrations made from it keep their own reference.
#[derive(Debug)]
pub struct DmaBuf {
    /// The dma-buf.
    pub fd: std::os::fd::OwnedFd,
    /// Offset of the requested address from the start of the exported range.
    pub offset: u64,
}

/// Exports the `cuMemAlloc` allocation containing `[addr, addr + len)` as a dma-buf
/// (`cuMemGetHandleForAddressRange`, CUDA 11.7+, needs a kernel >= 5.12 and a driver with
/// dma-buf support). The calling thread must have the allocation's context current.
pub fn dmabuf_for_range(addr: u64, len: u64) -> Result<DmaBuf> {
    let mut base: CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: valid out-pointers; the driver validates `addr`.
    check("cuMemGetAddressRange", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr)
    })?;
    if addr + len > base + size as u64 {
        return Err(CudaError::InvalidArgument(format!(
            "dma-buf export: {len} bytes at {addr:#x} leave the allocation at {base:#x} of {size} bytes"
        )));
    }
    // The range must be aligned to the host page size; cuMemAlloc allocations start aligned
    // and are backed in 2 MiB granules, so rounding the size up stays inside them.
    let page = rustix::param::page_size();
    let aligned = size.div_ceil(page) * page;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: `fd` is a valid out-pointer for the int the driver writes; the range is the
    // page-aligned allocation found above.
    check("cuMemGetHandleForAddressRange", unsafe {
        sys::cuMemGetHandleForAddressRange(
            (&mut fd as *mut std::ffi::c_int).cast(),
            base,
            aligned,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    })?;
    if fd < 0 {
        return Err(CudaError::InvalidArgument(
            "cuMemGetHandleForAddressRange returned no file descriptor".into(),
        ));
    }
    // SAFETY: the driver just created this descriptor for us; nothing else owns it.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    Ok(DmaBuf {
        fd,
        offset: addr - base,
    })
}
