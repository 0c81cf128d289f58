//! All-to-all: raw, typed and host calls (paths in `scatter_rooted.rs`).

use super::cross::Exec;

use super::scatter_rooted::{Kind, Plan, check_overlap, same_len};
use super::{Collectives, DataType, Element, checked_bytes, gpu};
use crate::communicator::CommError;
use crate::cuda::{CudaSlice, CudaStream};
use mscclpp_device::collectives::desc;

impl Collectives {
    /// All-to-all: `send` and `recv` hold `nranks` blocks of `count` elements; block `p` of
    /// this rank's `send` lands in block `rank` of rank `p`'s `recv`. In place when `send ==
    /// recv`. As [`reduce_scatter_raw`](Self::reduce_scatter_raw) otherwise.
    ///
    /// # Safety
    /// As for [`reduce_scatter_raw`](Self::reduce_scatter_raw).
    pub unsafe fn all_to_all_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let call = "all_to_all";
        let _order = self.plan_gpu_call(call, stream)?;
        let es = dtype.size();
        let bytes = checked_bytes(call, count, es)?;
        let total = checked_bytes(call, bytes, self.nranks())?;
        if count == 0 {
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, call, desc::ALL_TO_ALL, dtype, None, None);
        }
        gpu::check_range("all_to_all: send", send, total, es)?;
        gpu::check_range("all_to_all: recv", recv, total, es)?;
        check_overlap(call, send, total, recv, total, 0)?;
        let p = Plan {
            kind: Kind::AllToAll,
            dtype,
            op: None,
            count: bytes as u64,
            pair_bytes: bytes,
            total_bytes: total,
            root: 0,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.run_plan_gpu(p, send, recv, stream) }
    }

    /// All-to-all of cudarc slices (equal lengths, a multiple of `nranks`).
    pub fn all_to_all<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        same_len("all_to_all", send.len(), recv.len())?;
        let count = self.blocks_of("all_to_all", send.len())?;
        gpu::check_capture("all_to_all", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.all_to_all_raw(s, r, count, T::DTYPE, stream) }
    }

    /// Host backend: all-to-all (equal lengths, a multiple of `nranks`).
    pub fn all_to_all_host<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        let call = "all_to_all_host";
        same_len(call, send.len(), recv.len())?;
        let count = self.blocks_of(call, send.len())?;
        let bytes = count * T::DTYPE.size();
        let plan = Plan {
            kind: Kind::AllToAll,
            dtype: T::DTYPE,
            op: None,
            count: bytes as u64,
            pair_bytes: bytes,
            total_bytes: bytes * self.nranks(),
            root: 0,
        };
        // SAFETY: both slices are valid for their length and borrowed for the call.
        unsafe { self.run_plan_host(call, plan, send.as_ptr() as u64, recv.as_mut_ptr() as u64) }
    }
}
