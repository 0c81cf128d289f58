//! The bare LL-packet exchange of one-shot all-reduce, as a benchmark reference.

use super::gpu;
use super::{AllReduceAlgo, Collectives};
use crate::communicator::CommError;
use crate::cuda::CudaStream;

impl Collectives {
    /// The bare LL-packet exchange that one-shot all-reduce is made of, as a benchmark
    /// reference (not a collective; `benches/ll_exchange.rs` times the two in one run): every
    /// rank sends `bytes` from `send` to every peer as LL packets, over the same scratch,
    /// grid, call counter and flags as [`AllReduceAlgo::OneShot`], without the call
    /// descriptors and the reduction, and `recv` gets the XOR of every rank's bytes. Nothing
    /// is compared between the ranks: every rank must pass the same `bytes`. GPU backend,
    /// ranks of one host, at most [`one_shot_max_bytes`](Self::one_shot_max_bytes).
    ///
    /// # Safety
    /// As for `all_reduce_device`, both ranges of `bytes`.
    pub unsafe fn ll_exchange_raw(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let kernels = self.gpu_kernels("ll_exchange")?;
        self.check_fault("ll_exchange", false)?;
        if self.cross().is_some() {
            return Err(CommError::InvalidArgument(
                "ll_exchange: for ranks of one host (memory channels) only".into(),
            ));
        }
        if bytes > self.one_shot_max_bytes() {
            return Err(CommError::InvalidArgument(format!(
                "ll_exchange: at most {} bytes (one-shot's packet scratch); {bytes} asked",
                self.one_shot_max_bytes()
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        self.noted((|| {
            gpu::check_stream("ll_exchange", self.gpu().expect("GPU backend"), stream)?;
            gpu::check_range("ll_exchange: send", send, bytes, 1)?;
            gpu::check_range("ll_exchange: recv", recv, bytes, 1)
        })())?;
        let _order = self.ordered("ll_exchange", stream)?;
        let (blocks, threads) = self.grid(Some(AllReduceAlgo::OneShot), bytes);
        // SAFETY: the context holds this communicator's registered memory; the user ranges
        // were checked above and the caller keeps them valid.
        self.noted(unsafe {
            kernels.launch(
                stream,
                &kernels.ll_exchange,
                send,
                recv,
                bytes as u64,
                0,
                blocks,
                threads,
                true,
            )
        })
    }
}
