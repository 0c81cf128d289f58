//! All-gather: raw, typed and host calls (the local launch is in `launch.rs`, shared with
//! the across-hosts all-reduce).

use super::cross;
use super::gpu;
use super::{AllGatherAlgo, Collectives, DataType, Element, checked_bytes};
use crate::communicator::CommError;
use crate::cuda::{CudaSlice, CudaStream};
use mscclpp_device::collectives::desc;

impl Collectives {
    /// All-gather: `send_count` elements from every rank land in `recv` (rank `r`'s at
    /// element `r * send_count`); in place when `send == recv + rank * send_count`
    /// elements. GPU backend only; checks as [`all_reduce_raw`](Self::all_reduce_raw).
    ///
    /// # Safety
    /// As for [`all_reduce_raw`](Self::all_reduce_raw).
    pub unsafe fn all_gather_raw(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        dtype: DataType,
        algo: AllGatherAlgo,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        self.gpu_kernels("all_gather")?;
        self.check_fault("all_gather", false)?;
        let bytes = checked_bytes("all_gather", send_count, dtype.size())?;
        if self.cross.is_none() {
            self.resolve_all_gather("all_gather", algo, bytes)?;
        }
        let total = checked_bytes("all_gather", bytes, self.nranks())?;
        self.noted(gpu::check_stream(
            "all_gather",
            self.gpu().expect("GPU backend"),
            stream,
        ))?;
        let _order = self.ordered("all_gather", stream)?;
        if send_count == 0 {
            let ex = cross::Exec::Gpu(stream);
            return self.empty_call(ex, "all_gather", desc::ALL_GATHER, dtype, None, None);
        }
        self.noted((|| {
            gpu::check_range("all_gather: send", send, bytes, dtype.size())?;
            gpu::check_range("all_gather: recv", recv, total, dtype.size())
        })())?;
        if self.cross.is_some() {
            // SAFETY: the ranges were checked above; the caller keeps them valid.
            return unsafe {
                self.cross_all_gather(cross::Exec::Gpu(stream), send, recv, bytes, dtype)
            };
        }
        let algo = self.resolve_all_gather("all_gather", algo, bytes)?;
        // SAFETY: as in all_reduce_raw.
        unsafe { self.launch_all_gather(send, recv, bytes, dtype, algo, stream) }
    }

    /// All-gather of cudarc slices (`recv.len() == nranks * send.len()`), on `stream`
    /// (graph capture as in [`all_reduce`](Self::all_reduce)).
    pub fn all_gather<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        if recv.len() != send.len() * self.nranks() {
            return Err(CommError::InvalidArgument(format!(
                "all_gather: recv has {} elements; {} ranks x {} expected",
                recv.len(),
                self.nranks(),
                send.len()
            )));
        }
        let count = send.len();
        gpu::check_capture("all_gather", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: as in all_reduce.
        unsafe { self.all_gather_raw(s, r, count, T::DTYPE, AllGatherAlgo::Auto, stream) }
    }

    /// Host backend: all-gather of host slices (`recv.len() == nranks * send.len()`).
    pub fn all_gather_host<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        self.host_only("all_gather_host")?;
        if recv.len() != send.len() * self.nranks() {
            return Err(CommError::InvalidArgument(format!(
                "all_gather_host: recv has {} elements; {} ranks x {} expected",
                recv.len(),
                self.nranks(),
                send.len()
            )));
        }
        let bytes = std::mem::size_of_val(send) as u64;
        if bytes == 0 {
            let ex = cross::Exec::Host;
            return self.empty_call(
                ex,
                "all_gather_host",
                desc::ALL_GATHER,
                T::DTYPE,
                None,
                None,
            );
        }
        let (s, r) = (send.as_ptr() as u64, recv.as_mut_ptr() as u64);
        if self.cross.is_some() {
            // SAFETY: send holds bytes, recv nranks * bytes (checked), both borrowed.
            return unsafe {
                self.cross_all_gather(cross::Exec::Host, s, r, bytes as usize, T::DTYPE)
            };
        }
        let algo =
            self.resolve_all_gather("all_gather_host", AllGatherAlgo::Auto, bytes as usize)?;
        // SAFETY: as above.
        unsafe { self.run_all_gather_kernel("all_gather_host", s, r, bytes, T::DTYPE, algo) }
    }
}
