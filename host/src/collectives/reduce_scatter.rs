//! Reduce-scatter: the generic call, its in-place form and the GPU path (paths in `scatter_rooted.rs`).

use super::buffer::{self, Buffer, BufferMut, Exec, Pair};
use super::scatter_rooted::{Kind, Plan, check_overlap, invalid};
use super::{Collectives, DataType, ReduceOp, checked_bytes, gpu};
use crate::communicator::CommError;
use crate::cuda::CudaStream;
use mscclpp_device::collectives::desc;

impl Collectives {
    /// GPU backend: reduce-scatter from device address `send` (`nranks * recv_count`
    /// elements) into `recv`; in place when `recv == send + rank * recv_count` elements.
    /// Checks the ranges as `all_reduce_device` does and refuses other overlaps.
    ///
    /// # Safety
    /// `send` and `recv` must stay valid until the operation completes on `stream`, and not
    /// be written by others meanwhile.
    pub(super) unsafe fn reduce_scatter_device(
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

    /// Reduce-scatter: `send` holds `nranks * recv.count()` elements (block `p` for rank
    /// `p`); rank `r`'s `recv` gets the `op` over the ranks of their block `r` (in rank
    /// order, so bit-identical to a CPU sum in that order). Buffers and `exec` as in
    /// [`all_reduce`](Self::all_reduce).
    pub fn reduce_scatter<'a, S, R>(
        &self,
        send: &'a S,
        recv: &'a mut R,
        op: ReduceOp,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let exec = exec.into();
        let call = exec.name("reduce_scatter");
        let pair = Pair::new(call, send, recv, exec)?;
        let n = self.nranks();
        if pair.send_count != pair.recv_count.saturating_mul(n) {
            return Err(invalid(format!(
                "{call}: send has {} elements; {n} ranks x recv's {} expected",
                pair.send_count, pair.recv_count
            )));
        }
        let (s, r, count, dtype) = (pair.send, pair.recv, pair.recv_count, pair.dtype);
        // SAFETY: both buffers are borrowed for the call (their guards order later uses).
        unsafe { self.reduce_scatter_at(exec, call, s, r, count, dtype, op) }
    }

    /// In-place reduce-scatter: `buf` holds `nranks` blocks; this rank's block (at element
    /// `rank * buf.count() / nranks`) gets the result. The count must be a multiple of
    /// `nranks`.
    pub fn reduce_scatter_in_place<'a, B>(
        &self,
        buf: &'a mut B,
        op: ReduceOp,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        B: BufferMut + ?Sized,
    {
        let exec = exec.into();
        let call = exec.name("reduce_scatter_in_place");
        let (p, total, dtype, _place) = buffer::in_place(call, buf, exec)?;
        let count = self.blocks_of(call, total)?;
        let off = (self.rank() * count * dtype.size()) as u64;
        // SAFETY: the buffer is borrowed for the call; this rank's block lies in it.
        unsafe { self.reduce_scatter_at(exec, call, p, p + off, count, dtype, op) }
    }

    /// # Safety
    /// `send` (`nranks * count` elements) and `recv` (`count`) valid memory of `exec`'s
    /// kind; equal to this rank's block or disjoint.
    #[allow(clippy::too_many_arguments)]
    unsafe fn reduce_scatter_at(
        &self,
        exec: Exec<'_>,
        call: &str,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        match exec {
            // SAFETY: forwarded (caller contract).
            Exec::Gpu(stream) => unsafe {
                self.reduce_scatter_device(send, recv, count, dtype, op, stream)
            },
            Exec::Host => {
                let plan = self.plan_rs(count, dtype, op);
                // SAFETY: forwarded (caller contract).
                unsafe { self.run_plan_host(call, plan, send, recv) }
            }
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
