//! Reduce-scatter: raw, typed, host and in-place calls (paths in `scatter_rooted.rs`).

use super::cross::Exec;

use super::scatter_rooted::{Kind, Plan, check_overlap, invalid};
use super::{Collectives, DataType, Element, ReduceOp, checked_bytes, gpu};
use crate::communicator::CommError;
use crate::cuda::{CudaSlice, CudaStream};
use mscclpp_device::collectives::desc;

impl Collectives {
    /// Reduce-scatter: `send` holds `nranks * recv_count` elements (block `p` for rank `p`);
    /// rank `r`'s `recv` gets the sum over the ranks of their block `r` (in rank order, so
    /// bit-identical to a CPU sum in that order). In place when `recv == send + rank *
    /// recv_count` elements. Stream-ordered on `stream`; GPU backend; checks as
    /// [`all_reduce_raw`](Self::all_reduce_raw) (device memory, bounds, alignment) and
    /// refuses other overlaps. Allocates nothing: capturable into CUDA graphs.
    ///
    /// # Safety
    /// `send` and `recv` must stay valid until the operation completes on `stream`, and not
    /// be written by others meanwhile.
    pub unsafe fn reduce_scatter_raw(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        if super::staged::is_staged(dtype, op) {
            let (ex, what) = (Exec::Gpu(stream), super::staged::Staged::ReduceScatter);
            // SAFETY: forwarded (caller contract).
            return unsafe { self.staged(ex, what, send, recv, recv_count, dtype, op) };
        }
        let call = "reduce_scatter";
        let _order = self.plan_gpu_call(call, stream)?;
        let word = recv_count as u64;
        let (n, es) = (self.nranks(), dtype.size());
        let bytes = checked_bytes(call, recv_count, es)?;
        let total = checked_bytes(call, bytes, n)?;
        if recv_count == 0 {
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, call, desc::REDUCE_SCATTER, dtype, Some(op), None);
        }
        gpu::check_range("reduce_scatter: send", send, total, es)?;
        gpu::check_range("reduce_scatter: recv", recv, bytes, es)?;
        check_overlap(call, send, total, recv, bytes, (self.rank() * bytes) as u64)?;
        let p = Plan {
            kind: Kind::ReduceScatter,
            dtype,
            op: Some(op),
            count: word,
            pair_bytes: bytes,
            total_bytes: total,
            root: 0,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.run_plan_gpu(p, send, recv, stream) }
    }

    /// Reduce-scatter of cudarc slices (`send.len() == nranks * recv.len()`), on `stream`
    /// (graph capture as in [`all_reduce`](Self::all_reduce)).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let n = self.nranks();
        if send.len() != n * recv.len() {
            return Err(invalid(format!(
                "reduce_scatter: send has {} elements; {n} ranks x recv's {} expected",
                send.len(),
                recv.len()
            )));
        }
        let count = recv.len();
        gpu::check_capture("reduce_scatter", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: the slices are borrowed across the launch and cudarc's guards order later
        // uses of them after this stream's work.
        unsafe { self.reduce_scatter_raw(s, r, count, T::DTYPE, op, stream) }
    }

    /// In-place reduce-scatter: `buf` holds `nranks` blocks; this rank's block (at element
    /// `rank * buf.len() / nranks`) gets the sum. The length must be a multiple of `nranks`.
    pub fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::DevicePtrMut;
        let count = self.blocks_of("reduce_scatter_in_place", buf.len())?;
        gpu::check_capture("reduce_scatter_in_place", stream)?;
        let off = (self.rank() * count * std::mem::size_of::<T>()) as u64;
        let (p, _g) = buf.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.reduce_scatter_raw(p, p + off, count, T::DTYPE, op, stream) }
    }

    /// Host backend: reduce-scatter of host slices (`send.len() == nranks * recv.len()`;
    /// blocking, CPU threads run the kernel).
    pub fn reduce_scatter_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = "reduce_scatter_host";
        let n = self.nranks();
        if send.len() != n * recv.len() {
            return Err(invalid(format!(
                "{call}: send has {} elements; {n} ranks x recv's {} expected",
                send.len(),
                recv.len()
            )));
        }
        let plan = self.plan_rs(recv.len(), T::DTYPE, op);
        // SAFETY: both slices are valid for their length and borrowed for the call.
        unsafe { self.run_plan_host(call, plan, send.as_ptr() as u64, recv.as_mut_ptr() as u64) }
    }

    /// Host backend: in-place reduce-scatter (see
    /// [`reduce_scatter_in_place`](Self::reduce_scatter_in_place)).
    pub fn reduce_scatter_host_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = "reduce_scatter_host_in_place";
        let count = self.blocks_of(call, buf.len())?;
        let plan = self.plan_rs(count, T::DTYPE, op);
        let p = buf.as_mut_ptr();
        // SAFETY: the slice is valid for its length and borrowed for the call; this rank's
        // block lies in it.
        unsafe {
            let r = p.add(self.rank() * count);
            self.run_plan_host(call, plan, p as u64, r as u64)
        }
    }

    /// Host backend: reduce-scatter of raw host ranges (`send`: `nranks * count` elements).
    ///
    /// # Safety
    /// Both ranges valid host memory for those elements.
    pub(super) unsafe fn host_reduce_scatter_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = "reduce_scatter_host";
        let plan = self.plan_rs(count, dtype, op);
        // SAFETY: caller contract.
        unsafe { self.run_plan_host(call, plan, send, recv) }
    }
}
