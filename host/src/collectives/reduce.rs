//! Reduce to a root: raw, typed, host and in-place calls (paths in `scatter_rooted.rs`).

use super::cross::Exec;

use super::scatter_rooted::{Kind, Plan, check_overlap, same_len};
use super::{Collectives, DataType, Element, ReduceOp, checked_bytes, gpu};
use crate::communicator::CommError;
use crate::cuda::{CudaSlice, CudaStream};
use mscclpp_device::collectives::desc;

impl Collectives {
    /// Reduce (sum) to `root`: the root's `recv` gets the rank-order sum of every rank's
    /// `send` (`count` elements each); `recv` is neither checked nor touched on the other
    /// ranks (pass 0). In place when `send == recv` on the root. As
    /// [`reduce_scatter_raw`](Self::reduce_scatter_raw) otherwise; `root >= nranks` is an
    /// error.
    ///
    /// # Safety
    /// As for [`reduce_scatter_raw`](Self::reduce_scatter_raw).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        if super::staged::is_staged(dtype, op) {
            let (ex, what) = (Exec::Gpu(stream), super::staged::Staged::Reduce(root));
            // SAFETY: forwarded (caller contract).
            return unsafe { self.staged(ex, what, send, recv, count, dtype, op) };
        }
        let call = "reduce";
        let _order = self.plan_gpu_call(call, stream)?;
        self.check_root(call, root)?;
        let word = count as u64;
        let es = dtype.size();
        let bytes = checked_bytes(call, count, es)?;
        if count == 0 {
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, call, desc::REDUCE, dtype, Some(op), Some(root));
        }
        gpu::check_range("reduce: send", send, bytes, es)?;
        if self.rank() == root {
            gpu::check_range("reduce: recv", recv, bytes, es)?;
            check_overlap(call, send, bytes, recv, bytes, 0)?;
        }
        let p = Plan {
            kind: Kind::Reduce,
            dtype,
            op: Some(op),
            count: word,
            pair_bytes: bytes,
            total_bytes: bytes,
            root,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.run_plan_gpu(p, send, recv, stream) }
    }

    /// Reduce of cudarc slices to `root` (equal lengths; `recv` is written on the root only).
    pub fn reduce<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        same_len("reduce", send.len(), recv.len())?;
        gpu::check_capture("reduce", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.reduce_raw(s, r, send.len(), T::DTYPE, op, root, stream) }
    }

    /// In-place reduce to `root` (the root's `buf` gets the sum; others' is not written).
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::DevicePtrMut;
        gpu::check_capture("reduce_in_place", stream)?;
        let count = buf.len();
        let (p, _g) = buf.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.reduce_raw(p, p, count, T::DTYPE, op, root, stream) }
    }

    /// Host backend: reduce to `root` (equal lengths; `recv` is written on the root only).
    pub fn reduce_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError> {
        let call = "reduce_host";
        same_len(call, send.len(), recv.len())?;
        self.check_root(call, root)?;
        let plan = self.plan_rooted(send.len(), T::DTYPE, Some(op), root);
        // SAFETY: both slices are valid for their length and borrowed for the call.
        unsafe { self.run_plan_host(call, plan, send.as_ptr() as u64, recv.as_mut_ptr() as u64) }
    }

    /// Host backend: in-place reduce to `root`.
    pub fn reduce_host_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError> {
        let call = "reduce_host_in_place";
        self.check_root(call, root)?;
        let plan = self.plan_rooted(buf.len(), T::DTYPE, Some(op), root);
        let p = buf.as_mut_ptr() as u64;
        // SAFETY: the slice is valid for its length and borrowed for the call.
        unsafe { self.run_plan_host(call, plan, p, p) }
    }

    /// Host backend: reduce to `root` of raw host ranges (`count` elements each).
    ///
    /// # Safety
    /// Both ranges valid host memory for those elements (`recv` on the root).
    pub(super) unsafe fn host_reduce_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError> {
        let call = "reduce_host";
        self.check_root(call, root)?;
        let plan = self.plan_rooted(count, dtype, Some(op), root);
        // SAFETY: caller contract.
        unsafe { self.run_plan_host(call, plan, send, recv) }
    }
}
