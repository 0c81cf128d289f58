//! All-gather: the generic call and its GPU and Host paths (the local launch is in `launch.rs`, shared with
//! the across-hosts all-reduce).

use super::buffer::{Buffer, BufferMut, Exec, Pair};
use super::gpu;
use super::{AllGatherAlgo, Collectives, DataType, checked_bytes};
use crate::communicator::CommError;
use crate::cuda::CudaStream;
use mscclpp_device::collectives::desc;

impl Collectives {
    /// All-gather: `send.count()` elements from every rank land in `recv` (rank `r`'s at
    /// element `r * send.count()`; `recv.count() == nranks * send.count()`). Buffers and
    /// `exec` as in [`all_reduce`](Self::all_reduce); a [`RawBuffer`](super::RawBuffer)
    /// `send` at `recv`'s address plus `rank * send.count()` elements is in place.
    pub fn all_gather<'a, S, R>(
        &self,
        send: &'a S,
        recv: &'a mut R,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        self.all_gather_using(AllGatherAlgo::Auto, send, recv, exec)
    }

    /// [`all_gather`](Self::all_gather) by the given algorithm (one host only; benchmarks
    /// and tests of one algorithm).
    pub fn all_gather_using<'a, S, R>(
        &self,
        algo: AllGatherAlgo,
        send: &'a S,
        recv: &'a mut R,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        S: Buffer + ?Sized,
        R: BufferMut + ?Sized,
    {
        let exec = exec.into();
        let call = exec.name("all_gather");
        let pair = Pair::new(call, send, recv, exec)?;
        if pair.recv_count != pair.send_count.saturating_mul(self.nranks()) {
            return Err(CommError::InvalidArgument(format!(
                "{call}: recv has {} elements; {} ranks x {} expected",
                pair.recv_count,
                self.nranks(),
                pair.send_count
            )));
        }
        let (s, r, n, dtype) = (pair.send, pair.recv, pair.send_count, pair.dtype);
        match exec {
            // SAFETY: both buffers are borrowed for the call (their guards order later uses).
            Exec::Gpu(stream) => unsafe { self.all_gather_device(s, r, n, dtype, algo, stream) },
            // SAFETY: as above.
            Exec::Host => unsafe { self.host_all_gather(s, r, n, dtype, algo) },
        }
    }

    /// GPU backend: all-gather of `send_count` elements at device address `send` into
    /// `recv`; in place when `send == recv + rank * send_count` elements. Checks the ranges
    /// as `all_reduce_device` does.
    ///
    /// # Safety
    /// As for `all_reduce_device`.
    unsafe fn all_gather_device(
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
        if self.cross().is_none() {
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
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, "all_gather", desc::ALL_GATHER, dtype, None, None);
        }
        self.noted((|| {
            gpu::check_range("all_gather: send", send, bytes, dtype.size())?;
            gpu::check_range("all_gather: recv", recv, total, dtype.size())
        })())?;
        if self.cross().is_some() {
            // SAFETY: the ranges were checked above; the caller keeps them valid.
            return unsafe { self.cross_all_gather(Exec::Gpu(stream), send, recv, bytes, dtype) };
        }
        let algo = self.resolve_all_gather("all_gather", algo, bytes)?;
        // SAFETY: as in all_reduce_device.
        unsafe { self.launch_all_gather(send, recv, bytes, dtype, algo, stream) }
    }

    /// Host backend: all-gather of `send_count` elements at host address `send` into
    /// `recv` (`nranks * send_count` elements, checked by the caller).
    ///
    /// # Safety
    /// Both ranges valid host memory of their sizes, borrowed for the call.
    unsafe fn host_all_gather(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        dtype: DataType,
        algo: AllGatherAlgo,
    ) -> Result<(), CommError> {
        self.host_only("all_gather_host")?;
        let bytes = checked_bytes("all_gather_host", send_count, dtype.size())? as u64;
        if bytes == 0 {
            let ex = Exec::Host;
            return self.empty_call(ex, "all_gather_host", desc::ALL_GATHER, dtype, None, None);
        }
        let (s, r) = (send, recv);
        if self.cross().is_some() {
            // SAFETY: send holds bytes, recv nranks * bytes (caller contract).
            return unsafe { self.cross_all_gather(Exec::Host, s, r, bytes as usize, dtype) };
        }
        let algo = self.resolve_all_gather("all_gather_host", algo, bytes as usize)?;
        // SAFETY: as above.
        unsafe { self.run_all_gather_kernel("all_gather_host", s, r, bytes, dtype, algo) }
    }
}
