//! What a collective call reads and writes ([`Buffer`], [`BufferMut`]) and where it runs
//! ([`Exec`]): the one generic form every operation of [`Collectives`](super::Collectives)
//! takes, over cudarc slices and views, host slices and vectors, and raw pointers
//! ([`RawBuffer`]).

use super::{DataType, Element};
use crate::communicator::CommError;
use crate::cuda::CudaStream;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, SyncOnDrop};

/// Where a call runs and how it is ordered.
///
/// A `&CudaStream` converts into [`Exec::Gpu`], so GPU calls read
/// `c.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)`; Host-backend calls pass
/// [`Exec::Host`].
#[derive(Debug, Clone, Copy)]
pub enum Exec<'a> {
    /// Host backend: the call blocks this thread until it is done (CPU threads run the
    /// kernels over shared memory). The buffers are host memory.
    Host,
    /// GPU backend: the call is queued on this stream and returns at launch (it may be
    /// captured into a CUDA graph). The buffers are device memory.
    Gpu(&'a CudaStream),
}

impl<'a> From<&'a CudaStream> for Exec<'a> {
    fn from(stream: &'a CudaStream) -> Self {
        Exec::Gpu(stream)
    }
}

impl<'a> From<&'a std::sync::Arc<CudaStream>> for Exec<'a> {
    fn from(stream: &'a std::sync::Arc<CudaStream>) -> Self {
        Exec::Gpu(stream)
    }
}

impl Exec<'_> {
    /// The call's name in messages: `name` on a GPU, `name_host` on the Host backend
    /// (`op_host_in_place` for `op_in_place`). A table, not a `format!`: every call takes
    /// its name, and the Host backend's small calls take about a microsecond.
    pub(super) fn name(self, name: &'static str) -> &'static str {
        match self {
            Exec::Gpu(_) => name,
            Exec::Host => HOST_NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(name, |(_, host)| host),
        }
    }

    /// The memory a buffer of a call run this way must be in.
    fn memory(self) -> Memory {
        match self {
            Exec::Host => Memory::Host,
            Exec::Gpu(_) => Memory::Device,
        }
    }
}

/// The Host backend's names of the calls ([`Exec::name`]).
const HOST_NAMES: [(&str, &str); 15] = [
    ("all_reduce", "all_reduce_host"),
    ("all_reduce_in_place", "all_reduce_host_in_place"),
    ("all_gather", "all_gather_host"),
    ("all_gather_in_place", "all_gather_host_in_place"),
    ("reduce_scatter", "reduce_scatter_host"),
    ("reduce_scatter_in_place", "reduce_scatter_host_in_place"),
    ("broadcast", "broadcast_host"),
    ("broadcast_in_place", "broadcast_host_in_place"),
    ("reduce", "reduce_host"),
    ("reduce_in_place", "reduce_host_in_place"),
    ("all_to_all", "all_to_all_host"),
    ("all_to_all_in_place", "all_to_all_host_in_place"),
    ("send", "send_host"),
    ("recv", "recv_host"),
    ("group", "group_host"),
];

/// Which memory a buffer is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Device memory of the communicator's GPU (a GPU-backend call).
    Device,
    /// Host memory of this process (a Host-backend call).
    Host,
}

/// A buffer's address for one call, with what must stay alive until the call is queued
/// (cudarc's stream synchronisation of its slices).
#[derive(Debug)]
pub struct Place<'a> {
    addr: u64,
    memory: Memory,
    _sync: Option<SyncOnDrop<'a>>,
}

impl Place<'static> {
    /// Device memory at `addr`.
    pub fn device(addr: u64) -> Self {
        Place {
            addr,
            memory: Memory::Device,
            _sync: None,
        }
    }

    /// Host memory at `addr`.
    pub fn host(addr: u64) -> Self {
        Place {
            addr,
            memory: Memory::Host,
            _sync: None,
        }
    }
}

/// Memory a collective reads: a typed element count at an address.
///
/// # Safety
/// [`place`](Buffer::place) must give an address valid for reading
/// `count() * dtype().size()` bytes in the memory it names, for as long as the borrow of
/// `self` lasts (and, on a GPU, until the work queued on the stream with it completes,
/// which the caller of a collective arranges as with any stream-ordered use).
pub unsafe trait Buffer {
    /// The element type.
    fn dtype(&self) -> DataType;
    /// The number of elements.
    fn count(&self) -> usize;
    /// The address for a call run as `exec`. `call` names the call in errors.
    fn place<'a>(&'a self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError>;
}

/// Memory a collective writes.
///
/// # Safety
/// As [`Buffer`], and [`place_mut`](BufferMut::place_mut)'s address must be valid for
/// writing, with nothing else reading or writing it while the borrow lasts.
pub unsafe trait BufferMut: Buffer {
    /// The address for a call run as `exec` that writes the buffer.
    fn place_mut<'a>(&'a mut self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError>;
}

/// The error of a buffer given to a call run the other way.
fn wrong_memory(call: &str, what: Memory, exec: Exec<'_>) -> CommError {
    let (have, need) = match what {
        Memory::Device => ("device memory", "a stream (Exec::Gpu)"),
        Memory::Host => ("host memory", "Exec::Host"),
    };
    let given = match exec {
        Exec::Host => "Exec::Host",
        Exec::Gpu(_) => "a stream",
    };
    CommError::InvalidArgument(format!(
        "{call}: a buffer in {have} needs {need}, but the call was given {given}"
    ))
}

/// The stream of a device buffer's call (refused under capture when cudarc would add
/// event waits: `gpu::check_capture`).
fn device_stream<'a>(call: &str, exec: Exec<'a>) -> Result<&'a CudaStream, CommError> {
    match exec {
        Exec::Gpu(stream) => {
            super::gpu::check_capture(call, stream)?;
            Ok(stream)
        }
        Exec::Host => Err(wrong_memory(call, Memory::Device, exec)),
    }
}

/// A cudarc buffer's place: its address on `exec`'s stream (from `ptr`, cudarc's
/// `device_ptr` or `device_ptr_mut`) with the guard that orders other streams' uses.
fn device_place<'a>(
    call: &str,
    exec: Exec<'a>,
    ptr: impl FnOnce(&'a CudaStream) -> (u64, SyncOnDrop<'a>),
) -> Result<Place<'a>, CommError> {
    let (addr, sync) = ptr(device_stream(call, exec)?);
    Ok(Place {
        addr,
        memory: Memory::Device,
        _sync: Some(sync),
    })
}

/// `Buffer` (and, with `mut`, `BufferMut`) for a cudarc slice type.
macro_rules! device_buffer {
    ($ty:ty) => {
        // SAFETY: cudarc's slices and views own or borrow `len()` elements of device memory
        // of their context, and their guards order other streams' uses after this stream's.
        unsafe impl<T: Element> Buffer for $ty {
            fn dtype(&self) -> DataType {
                T::DTYPE
            }
            fn count(&self) -> usize {
                cudarc::driver::DeviceSlice::len(self)
            }
            fn place<'a>(&'a self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError> {
                device_place(call, exec, |s| self.device_ptr(s))
            }
        }
    };
    ($ty:ty, mut) => {
        device_buffer!($ty);
        // SAFETY: as for `Buffer`; `&mut` gives exclusive use of the range.
        unsafe impl<T: Element> BufferMut for $ty {
            fn place_mut<'a>(
                &'a mut self,
                call: &str,
                exec: Exec<'a>,
            ) -> Result<Place<'a>, CommError> {
                device_place(call, exec, |s| self.device_ptr_mut(s))
            }
        }
    };
}

device_buffer!(CudaSlice<T>, mut);
device_buffer!(CudaView<'_, T>);
device_buffer!(CudaViewMut<'_, T>, mut);

/// The address of a host buffer for a call run as `exec`.
fn host_place<'a>(call: &str, addr: u64, exec: Exec<'a>) -> Result<Place<'a>, CommError> {
    match exec {
        Exec::Host => Ok(Place::host(addr)),
        Exec::Gpu(_) => Err(wrong_memory(call, Memory::Host, exec)),
    }
}

// SAFETY: a slice is `len()` valid elements of host memory, borrowed for the call.
unsafe impl<T: Element> Buffer for [T] {
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    fn count(&self) -> usize {
        self.len()
    }
    fn place<'a>(&'a self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError> {
        host_place(call, self.as_ptr() as u64, exec)
    }
}

// SAFETY: `&mut [T]` is exclusive.
unsafe impl<T: Element> BufferMut for [T] {
    fn place_mut<'a>(&'a mut self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError> {
        host_place(call, self.as_mut_ptr() as u64, exec)
    }
}

// SAFETY: as for slices (a vector's elements are its slice).
unsafe impl<T: Element> Buffer for Vec<T> {
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    fn count(&self) -> usize {
        self.len()
    }
    fn place<'a>(&'a self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError> {
        self.as_slice().place(call, exec)
    }
}

// SAFETY: as for slices.
unsafe impl<T: Element> BufferMut for Vec<T> {
    fn place_mut<'a>(&'a mut self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError> {
        self.as_mut_slice().place_mut(call, exec)
    }
}

// SAFETY: as for slices (an array's elements are its slice).
unsafe impl<T: Element, const N: usize> Buffer for [T; N] {
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    fn count(&self) -> usize {
        N
    }
    fn place<'a>(&'a self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError> {
        self.as_slice().place(call, exec)
    }
}

// SAFETY: as for slices.
unsafe impl<T: Element, const N: usize> BufferMut for [T; N] {
    fn place_mut<'a>(&'a mut self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError> {
        self.as_mut_slice().place_mut(call, exec)
    }
}

/// A buffer given by address, element count and type: a device pointer from another
/// library (PyTorch, the NCCL API) or host memory. Device ranges are still checked to be
/// device memory of this context and aligned (`cuMemGetAddressRange`) by every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBuffer {
    addr: u64,
    count: usize,
    dtype: DataType,
    memory: Memory,
}

impl RawBuffer {
    /// `count` elements of `dtype` of device memory at `addr`.
    ///
    /// # Safety
    /// The range must stay valid (not freed) until every call given it completes on its
    /// stream, and not be written by others meanwhile; a call's send and receive ranges are
    /// equal (in place) or disjoint.
    pub unsafe fn device(addr: u64, count: usize, dtype: DataType) -> Self {
        RawBuffer {
            addr,
            count,
            dtype,
            memory: Memory::Device,
        }
    }

    /// `count` elements of `dtype` of host memory at `addr`.
    ///
    /// # Safety
    /// The range must be valid host memory of this process for the calls given it, not
    /// used by others meanwhile; send and receive ranges are equal or disjoint.
    pub unsafe fn host(addr: u64, count: usize, dtype: DataType) -> Self {
        RawBuffer {
            addr,
            count,
            dtype,
            memory: Memory::Host,
        }
    }

    /// The address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

// SAFETY: the constructors' contracts.
unsafe impl Buffer for RawBuffer {
    fn dtype(&self) -> DataType {
        self.dtype
    }
    fn count(&self) -> usize {
        self.count
    }
    /// Its address in its memory (a call run on the other memory refuses it).
    fn place<'a>(&'a self, _call: &str, _exec: Exec<'a>) -> Result<Place<'a>, CommError> {
        Ok(Place {
            addr: self.addr,
            memory: self.memory,
            _sync: None,
        })
    }
}

// SAFETY: the constructors' contracts (exclusive use during a call).
unsafe impl BufferMut for RawBuffer {
    fn place_mut<'a>(&'a mut self, call: &str, exec: Exec<'a>) -> Result<Place<'a>, CommError> {
        self.place(call, exec)
    }
}

/// `place` unless it is in other memory than `exec` runs on (a [`Buffer`] of another
/// crate may answer so).
fn checked<'a>(call: &str, place: Place<'a>, exec: Exec<'_>) -> Result<Place<'a>, CommError> {
    if place.memory != exec.memory() {
        return Err(wrong_memory(call, place.memory, exec));
    }
    Ok(place)
}

/// A call's send and receive buffers, checked against each other and `exec`.
pub(super) struct Pair<'a> {
    /// The send address.
    pub(super) send: u64,
    /// The receive address.
    pub(super) recv: u64,
    /// The send buffer's element count.
    pub(super) send_count: usize,
    /// The receive buffer's element count.
    pub(super) recv_count: usize,
    /// Their element type.
    pub(super) dtype: DataType,
    _places: (Place<'a>, Place<'a>),
}

impl<'a> Pair<'a> {
    /// Places `send` and `recv` for `call` run as `exec`; their types must match.
    pub(super) fn new<S, R>(
        call: &str,
        send: &'a S,
        recv: &'a mut R,
        exec: Exec<'a>,
    ) -> Result<Self, CommError>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let (dtype, send_count, recv_count) = (send.dtype(), send.count(), recv.count());
        if recv.dtype() != dtype {
            return Err(CommError::InvalidArgument(format!(
                "{call}: send holds {dtype}, recv {}",
                recv.dtype()
            )));
        }
        let s = checked(call, send.place(call, exec)?, exec)?;
        let r = checked(call, recv.place_mut(call, exec)?, exec)?;
        Ok(Pair {
            send: s.addr,
            recv: r.addr,
            send_count,
            recv_count,
            dtype,
            _places: (s, r),
        })
    }

    /// Errors unless the two counts are equal (`what` names the call).
    pub(super) fn same_count(&self, call: &str) -> Result<usize, CommError> {
        if self.send_count != self.recv_count {
            return Err(CommError::InvalidArgument(format!(
                "{call}: send has {} elements, recv {}",
                self.send_count, self.recv_count
            )));
        }
        Ok(self.send_count)
    }
}

/// One buffer, read and written in place.
pub(super) fn in_place<'a, B: BufferMut + ?Sized>(
    call: &str,
    buf: &'a mut B,
    exec: Exec<'a>,
) -> Result<(u64, usize, DataType, Place<'a>), CommError> {
    let (count, dtype) = (buf.count(), buf.dtype());
    let p = checked(call, buf.place_mut(call, exec)?, exec)?;
    Ok((p.addr, count, dtype, p))
}

/// One buffer, read only.
pub(super) fn read<'a, B: Buffer + ?Sized>(
    call: &str,
    buf: &'a B,
    exec: Exec<'a>,
) -> Result<(u64, usize, DataType, Place<'a>), CommError> {
    let (count, dtype) = (buf.count(), buf.dtype());
    let p = checked(call, buf.place(call, exec)?, exec)?;
    Ok((p.addr, count, dtype, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffers_give_their_own_addresses_and_counts() {
        let send = vec![1.0f32; 6];
        let mut recv = [0.0f32; 3];
        let (send_addr, recv_addr) = (send.as_ptr() as u64, recv.as_ptr() as u64);
        let p = Pair::new("all_reduce_host", &send, &mut recv, Exec::Host).unwrap();
        assert_eq!((p.send, p.recv), (send_addr, recv_addr));
        assert_eq!((p.send_count, p.recv_count, p.dtype), (6, 3, DataType::F32));
        let e = p.same_count("all_reduce_host").unwrap_err().to_string();
        assert!(
            e.contains("all_reduce_host: send has 6 elements, recv 3"),
            "{e}"
        );
    }

    #[test]
    fn element_types_must_match() {
        let send = [1u8; 4];
        let mut recv = [0.0f32; 4];
        let e = Pair::new("broadcast_host", &send[..], &mut recv[..], Exec::Host);
        let e = e.err().expect("refused").to_string();
        assert!(
            e.contains("broadcast_host: send holds uint8, recv float"),
            "{e}"
        );
    }

    #[test]
    fn device_memory_on_the_host_path_is_refused_by_name() {
        // SAFETY: never dereferenced: the call is refused before any use.
        let mut raw = unsafe { RawBuffer::device(0x1000, 8, DataType::F32) };
        let e = in_place("all_reduce_host_in_place", &mut raw, Exec::Host);
        let e = e.expect_err("refused").to_string();
        assert!(
            e.contains("a buffer in device memory needs a stream (Exec::Gpu)")
                && e.contains("given Exec::Host"),
            "{e}"
        );
        // A host range is accepted as host memory, at its address.
        let mut v = vec![0i64; 2];
        // SAFETY: `v` holds 2 i64 for the duration of the borrow below.
        let raw = unsafe { RawBuffer::host(v.as_mut_ptr() as u64, 2, DataType::I64) };
        let (addr, count, dtype, _p) = read("send_host", &raw, Exec::Host).unwrap();
        assert_eq!((addr, count, dtype), (v.as_ptr() as u64, 2, DataType::I64));
    }

    #[test]
    fn call_names_follow_the_backend() {
        assert_eq!(Exec::Host.name("all_gather"), "all_gather_host");
        assert_eq!(Exec::Host.name("reduce_in_place"), "reduce_host_in_place");
        // Every entry is the GPU name with `_host` before any `_in_place`.
        for (gpu, host) in HOST_NAMES {
            let want = match gpu.strip_suffix("_in_place") {
                Some(op) => format!("{op}_host_in_place"),
                None => format!("{gpu}_host"),
            };
            assert_eq!(host, want);
        }
    }
}
