//! Broadcast from a root: raw, typed, host and in-place calls (paths in `scatter_rooted.rs`).

use super::cross::Exec;

use super::scatter_rooted::{Kind, Plan, check_overlap, same_len};
use super::{Collectives, DataType, Element, checked_bytes, gpu};
use crate::communicator::CommError;
use crate::cuda::{CudaSlice, CudaStream};
use mscclpp_device::collectives::desc;

impl Collectives {
    /// Broadcast from `root`: every rank's `recv` gets the root's `send` (`count` elements of
    /// `dtype`; any byte count). `send` is read on the root only (other ranks may pass 0); in
    /// place when `send == recv` on the root. As
    /// [`reduce_scatter_raw`](Self::reduce_scatter_raw) otherwise; `root >= nranks` is an
    /// error.
    ///
    /// # Safety
    /// As for [`reduce_scatter_raw`](Self::reduce_scatter_raw).
    pub unsafe fn broadcast_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let call = "broadcast";
        let _order = self.plan_gpu_call(call, stream)?;
        self.check_root(call, root)?;
        let es = dtype.size();
        let bytes = checked_bytes(call, count, es)?;
        if count == 0 {
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, call, desc::BROADCAST, dtype, None, Some(root));
        }
        gpu::check_range("broadcast: recv", recv, bytes, es)?;
        if self.rank() == root {
            gpu::check_range("broadcast: send", send, bytes, es)?;
            check_overlap(call, send, bytes, recv, bytes, 0)?;
        }
        let p = Plan {
            kind: Kind::Broadcast,
            dtype,
            op: None,
            count: bytes as u64,
            pair_bytes: bytes,
            total_bytes: bytes,
            root,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.run_plan_gpu(p, send, recv, stream) }
    }

    /// Broadcast of cudarc slices from `root` (equal lengths; `send` is read on the root
    /// only).
    pub fn broadcast<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        same_len("broadcast", send.len(), recv.len())?;
        gpu::check_capture("broadcast", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.broadcast_raw(s, r, send.len(), T::DTYPE, root, stream) }
    }

    /// In-place broadcast from `root`: every rank's `buf` gets the root's.
    pub fn broadcast_in_place<T: Element>(
        &self,
        buf: &mut CudaSlice<T>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::DevicePtrMut;
        gpu::check_capture("broadcast_in_place", stream)?;
        let count = buf.len();
        let (p, _g) = buf.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.broadcast_raw(p, p, count, T::DTYPE, root, stream) }
    }

    /// Host backend: broadcast from `root` (equal lengths; `send` is read on the root only).
    pub fn broadcast_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        root: usize,
    ) -> Result<(), CommError> {
        let call = "broadcast_host";
        same_len(call, send.len(), recv.len())?;
        self.check_root(call, root)?;
        let plan = self.plan_rooted(send.len(), T::DTYPE, None, root);
        // SAFETY: both slices are valid for their length and borrowed for the call.
        unsafe { self.run_plan_host(call, plan, send.as_ptr() as u64, recv.as_mut_ptr() as u64) }
    }

    /// Host backend: in-place broadcast from `root`.
    pub fn broadcast_host_in_place<T: Element>(
        &self,
        buf: &mut [T],
        root: usize,
    ) -> Result<(), CommError> {
        let call = "broadcast_host_in_place";
        self.check_root(call, root)?;
        let plan = self.plan_rooted(buf.len(), T::DTYPE, None, root);
        let p = buf.as_mut_ptr() as u64;
        // SAFETY: the slice is valid for its length and borrowed for the call.
        unsafe { self.run_plan_host(call, plan, p, p) }
    }
}
