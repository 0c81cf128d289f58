//! Broadcast from a root: the generic call, its in-place form and the GPU path (paths in `scatter_rooted.rs`).

use super::buffer::{self, Buffer, BufferMut, Exec, Pair};
use super::scatter_rooted::{Kind, Plan, check_overlap};
use super::{Collectives, DataType, checked_bytes, gpu};
use crate::communicator::CommError;
use crate::cuda::CudaStream;
use mscclpp_device::collectives::desc;

impl Collectives {
    /// GPU backend: broadcast from `root` of `count` elements at device address `send`
    /// (read on the root only) into every rank's `recv`; in place when `send == recv` on
    /// the root. Checks as `reduce_scatter_device`.
    ///
    /// # Safety
    /// As for `reduce_scatter_device`.
    unsafe fn broadcast_device(
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

    /// Broadcast from `root`: every rank's `recv` gets the root's `send` (equal counts;
    /// `send` is read on the root only). Buffers and `exec` as in
    /// [`all_reduce`](Self::all_reduce); `root >= nranks` is an error.
    pub fn broadcast<'a, S, R>(
        &self,
        send: &'a S,
        recv: &'a mut R,
        root: usize,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let exec = exec.into();
        let call = exec.name("broadcast");
        let pair = Pair::new(call, send, recv, exec)?;
        let count = pair.same_count(call)?;
        // SAFETY: both buffers are borrowed for the call (their guards order later uses).
        unsafe { self.broadcast_at(exec, call, pair.send, pair.recv, count, pair.dtype, root) }
    }

    /// In-place broadcast from `root`: every rank's `buf` gets the root's.
    pub fn broadcast_in_place<'a, B>(
        &self,
        buf: &'a mut B,
        root: usize,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        B: BufferMut + ?Sized,
    {
        let exec = exec.into();
        let call = exec.name("broadcast_in_place");
        let (p, count, dtype, _place) = buffer::in_place(call, buf, exec)?;
        // SAFETY: the buffer is borrowed for the call.
        unsafe { self.broadcast_at(exec, call, p, p, count, dtype, root) }
    }

    /// # Safety
    /// `send` (on the root) and `recv` (`count` elements) valid memory of `exec`'s kind,
    /// equal or disjoint.
    #[allow(clippy::too_many_arguments)]
    unsafe fn broadcast_at(
        &self,
        exec: Exec<'_>,
        call: &str,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<(), CommError> {
        match exec {
            // SAFETY: forwarded (caller contract).
            Exec::Gpu(stream) => unsafe {
                self.broadcast_device(send, recv, count, dtype, root, stream)
            },
            Exec::Host => {
                self.check_root(call, root)?;
                let plan = self.plan_rooted(count, dtype, None, root);
                // SAFETY: forwarded (caller contract).
                unsafe { self.run_plan_host(call, plan, send, recv) }
            }
        }
    }
}
