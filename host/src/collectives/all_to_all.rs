//! All-to-all: the generic call and its GPU path (paths in `scatter_rooted.rs`).

use super::buffer::{Buffer, BufferMut, Exec, Pair};
use super::scatter_rooted::{Kind, Plan, check_overlap};
use super::{Collectives, DataType, checked_bytes, gpu};
use crate::communicator::CommError;
use crate::cuda::CudaStream;
use mscclpp_device::collectives::desc;

impl Collectives {
    /// GPU backend: all-to-all of `nranks` blocks of `count` elements at device addresses
    /// `send` and `recv` (in place when equal). Checks as `reduce_scatter_device`.
    ///
    /// # Safety
    /// As for `reduce_scatter_device`.
    unsafe fn all_to_all_device(
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

    /// All-to-all: `send` and `recv` hold `nranks` blocks of equal counts (a multiple of
    /// `nranks`); block `p` of this rank's `send` lands in block `rank` of rank `p`'s
    /// `recv`. Buffers and `exec` as in [`all_reduce`](Self::all_reduce).
    pub fn all_to_all<'a, S, R>(
        &self,
        send: &'a S,
        recv: &'a mut R,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let exec = exec.into();
        let call = exec.name("all_to_all");
        let pair = Pair::new(call, send, recv, exec)?;
        let count = self.blocks_of(call, pair.same_count(call)?)?;
        let (s, r, dtype) = (pair.send, pair.recv, pair.dtype);
        match exec {
            // SAFETY: both buffers are borrowed for the call (their guards order later uses).
            Exec::Gpu(stream) => unsafe { self.all_to_all_device(s, r, count, dtype, stream) },
            Exec::Host => {
                let bytes = count * dtype.size();
                let plan = Plan {
                    kind: Kind::AllToAll,
                    dtype,
                    op: None,
                    count: bytes as u64,
                    pair_bytes: bytes,
                    total_bytes: bytes * self.nranks(),
                    root: 0,
                };
                // SAFETY: as above.
                unsafe { self.run_plan_host(call, plan, s, r) }
            }
        }
    }
}
