//! Reduce to a root: the generic call, its in-place form and the GPU path (paths in `scatter_rooted.rs`).

use super::buffer::{self, Buffer, BufferMut, Exec, Pair};
use super::scatter_rooted::{Kind, Plan, check_overlap};
use super::{Collectives, DataType, ReduceOp, checked_bytes, gpu};
use crate::communicator::CommError;
use crate::cuda::CudaStream;
use mscclpp_device::collectives::desc;

impl Collectives {
    /// GPU backend: reduce to `root` from device address `send` (`count` elements) into
    /// the root's `recv` (neither checked nor touched on the other ranks). In place when
    /// `send == recv` on the root. Checks as `reduce_scatter_device`.
    ///
    /// # Safety
    /// As for `reduce_scatter_device`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn reduce_device(
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

    /// Reduce to `root`: the root's `recv` gets the `op` over every rank's `send` (in rank
    /// order); the other ranks' `recv` is not written. Equal counts; buffers and `exec` as
    /// in [`all_reduce`](Self::all_reduce); `root >= nranks` is an error.
    pub fn reduce<'a, S, R>(
        &self,
        send: &'a S,
        recv: &'a mut R,
        op: ReduceOp,
        root: usize,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let exec = exec.into();
        let call = exec.name("reduce");
        let pair = Pair::new(call, send, recv, exec)?;
        let count = pair.same_count(call)?;
        let (s, r, dtype) = (pair.send, pair.recv, pair.dtype);
        // SAFETY: both buffers are borrowed for the call (their guards order later uses).
        unsafe { self.reduce_at(exec, call, s, r, count, dtype, op, root) }
    }

    /// In-place reduce to `root` (the root's `buf` gets the result; others' is not written).
    pub fn reduce_in_place<'a, B>(
        &self,
        buf: &'a mut B,
        op: ReduceOp,
        root: usize,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        B: BufferMut + ?Sized,
    {
        let exec = exec.into();
        let call = exec.name("reduce_in_place");
        let (p, count, dtype, _place) = buffer::in_place(call, buf, exec)?;
        // SAFETY: the buffer is borrowed for the call.
        unsafe { self.reduce_at(exec, call, p, p, count, dtype, op, root) }
    }

    /// # Safety
    /// `send` and `recv` (`count` elements, `recv` on the root) valid memory of `exec`'s
    /// kind, equal or disjoint.
    #[allow(clippy::too_many_arguments)]
    unsafe fn reduce_at(
        &self,
        exec: Exec<'_>,
        call: &str,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError> {
        match exec {
            // SAFETY: forwarded (caller contract).
            Exec::Gpu(stream) => unsafe {
                self.reduce_device(send, recv, count, dtype, op, root, stream)
            },
            Exec::Host => {
                self.check_root(call, root)?;
                let plan = self.plan_rooted(count, dtype, Some(op), root);
                // SAFETY: forwarded (caller contract).
                unsafe { self.run_plan_host(call, plan, send, recv) }
            }
        }
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
