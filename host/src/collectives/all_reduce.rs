//! All-reduce: the generic call, its in-place form and the GPU and Host paths.

use super::buffer::{self, Buffer, BufferMut, Exec, Pair};
use super::descriptor::all_reduce_tag;
use super::gpu;
use super::kernel_table;
use super::select::route;
use super::staged;
use super::{AllReduceAlgo, Collectives, DataType, ReduceOp, checked_bytes};
use crate::communicator::CommError;
use crate::cuda::CudaStream;
use mscclpp_device::collectives::{CollContext, desc};

impl Collectives {
    /// All-reduce: every rank's `recv` becomes the element-wise `op` of every rank's
    /// `send` (same type and count on every rank).
    ///
    /// `send` and `recv` are any [`Buffer`]s of one element type and count: cudarc slices
    /// and views or [`RawBuffer::device`](super::RawBuffer::device)s with a stream (`&stream`, GPU backend:
    /// stream-ordered, returns at launch, capturable into a CUDA graph), host slices,
    /// vectors or arrays with [`Exec::Host`] (Host backend: blocks until done).
    ///
    /// cudarc orders its slices' uses across streams with events when its event tracking is
    /// on and the context has several streams; those event waits cannot be captured into a
    /// CUDA graph, so under capture such a call is refused with that reason: call
    /// `CudaContext::disable_event_tracking` first, or pass [`RawBuffer`](super::RawBuffer)s.
    pub fn all_reduce<'a, S, R>(
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
        self.all_reduce_using(AllReduceAlgo::Auto, send, recv, op, exec)
    }

    /// [`all_reduce`](Self::all_reduce) with `recv` as its own input.
    pub fn all_reduce_in_place<'a, B>(
        &self,
        buf: &'a mut B,
        op: ReduceOp,
        exec: impl Into<Exec<'a>>,
    ) -> Result<(), CommError>
    where
        B: BufferMut + ?Sized,
    {
        let exec = exec.into();
        let call = exec.name("all_reduce_in_place");
        let (p, count, dtype, _place) = buffer::in_place(&call, buf, exec)?;
        // SAFETY: the buffer is borrowed for the call (and, on a GPU, its guard orders
        // later uses after this stream's work).
        unsafe { self.all_reduce_at(exec, p, p, count, dtype, op, AllReduceAlgo::Auto) }
    }

    /// [`all_reduce`](Self::all_reduce) by the given algorithm instead of the one
    /// [`select`](Self::choose_all_reduce) takes (benchmarks and tests of one algorithm;
    /// across hosts it picks one-shot or two-shot only).
    pub fn all_reduce_using<'a, S, R>(
        &self,
        algo: AllReduceAlgo,
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
        let call = exec.name("all_reduce");
        let pair = Pair::new(&call, send, recv, exec)?;
        let count = pair.same_count(&call)?;
        // SAFETY: both buffers are borrowed for the call (their guards order later uses).
        unsafe { self.all_reduce_at(exec, pair.send, pair.recv, count, pair.dtype, op, algo) }
    }

    /// # Safety
    /// `send`/`recv` valid memory of `exec`'s kind for `count` elements (equal or disjoint).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn all_reduce_at(
        &self,
        exec: Exec<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        algo: AllReduceAlgo,
    ) -> Result<(), CommError> {
        match exec {
            // SAFETY: forwarded (caller contract).
            Exec::Gpu(stream) => unsafe {
                self.all_reduce_device(send, recv, count, dtype, op, algo, stream)
            },
            // SAFETY: forwarded (caller contract).
            Exec::Host => unsafe { self.host_all_reduce(send, recv, count, dtype, op, algo) },
        }
    }

    /// GPU backend: all-reduce of `count` elements from device address `send` into `recv`.
    /// Checks that both ranges are device memory (`cuMemGetAddressRange`) and aligned to
    /// the element size; allocates nothing and does not synchronise.
    ///
    /// # Safety
    /// `send` and `recv` must stay valid until the operation completes on `stream`, and not
    /// be written by others meanwhile; partially overlapping ranges are not allowed.
    #[allow(clippy::too_many_arguments)]
    unsafe fn all_reduce_device(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        algo: AllReduceAlgo,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        if staged::is_staged(dtype, op) {
            let (ex, what) = (Exec::Gpu(stream), staged::Staged::AllReduce);
            // SAFETY: forwarded (caller contract).
            return unsafe { self.staged(ex, what, send, recv, count, dtype, op) };
        }
        let kernels = self.gpu_kernels("all_reduce")?;
        self.check_fault("all_reduce", false)?;
        let bytes = checked_bytes("all_reduce", count, dtype.size())?;
        self.noted(gpu::check_stream(
            "all_reduce",
            self.gpu().expect("GPU backend"),
            stream,
        ))?;
        let _order = self.ordered("all_reduce", stream)?;
        if count == 0 {
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, "all_reduce", desc::ALL_REDUCE, dtype, Some(op), None);
        }
        self.noted((|| {
            gpu::check_range("all_reduce: send", send, bytes, dtype.size())?;
            gpu::check_range("all_reduce: recv", recv, bytes, dtype.size())
        })())?;
        if let Some(c) = self.cross() {
            let algo = self.cross_all_reduce_algo(c, algo, bytes);
            let ex = Exec::Gpu(stream);
            // SAFETY: the ranges were checked above; the caller keeps them valid.
            return unsafe { self.cross_all_reduce(ex, send, recv, count, dtype, op, None, algo) };
        }
        let algo = route(self.resolve(algo, bytes)?, dtype, op);
        let (blocks, threads) = self.grid(Some(algo), bytes);
        let f = kernels.all_reduce(algo, dtype, op);
        let tag = self.plan_tag(all_reduce_tag(algo, dtype, op), algo, bytes);
        // SAFETY: the context holds this communicator's registered memory; the user ranges
        // were checked above and the caller keeps them valid.
        self.noted(unsafe {
            kernels.launch(
                stream,
                f,
                send,
                recv,
                count as u64,
                tag,
                blocks,
                threads,
                algo == AllReduceAlgo::OneShot,
            )
        })
    }

    /// # Safety
    /// `send`/`recv` valid host memory for `count` elements (equal or disjoint).
    pub(super) unsafe fn host_all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        algo: AllReduceAlgo,
    ) -> Result<(), CommError> {
        if staged::is_staged(dtype, op) {
            let (ex, what) = (Exec::Host, staged::Staged::AllReduce);
            // SAFETY: forwarded (caller contract).
            return unsafe { self.staged(ex, what, send, recv, count, dtype, op) };
        }
        self.host_only("all_reduce_host")?;
        let bytes = checked_bytes("all_reduce_host", count, dtype.size())?;
        if count == 0 {
            let ex = Exec::Host;
            return self.empty_call(
                ex,
                "all_reduce_host",
                desc::ALL_REDUCE,
                dtype,
                Some(op),
                None,
            );
        }
        if let Some(c) = self.cross() {
            let algo = self.cross_all_reduce_algo(c, algo, bytes);
            let ex = Exec::Host;
            // SAFETY: caller contract.
            return unsafe { self.cross_all_reduce(ex, send, recv, count, dtype, op, None, algo) };
        }
        let algo = route(self.resolve(algo, bytes)?, dtype, op);
        let f = kernel_table::all_reduce_host_kernel(algo, dtype, op);
        let tag = self.plan_tag(all_reduce_tag(algo, dtype, op), algo, bytes);
        let ctx = &*self.ctx as *const CollContext as u64;
        let body = || {
            // SAFETY: the context (boxed, alive as long as self) holds this communicator's
            // shared memory; the slices are valid (caller contract) and the grid is one
            // thread (the memory kernels take blocks of any size), or for the proxy kernel
            // blocks of >= nranks threads (at most the lanes built: proxy_plan).
            unsafe {
                f(
                    ctx as *const CollContext,
                    send as *const u8,
                    recv as *mut u8,
                    count as u64,
                    tag,
                )
            }
        };
        match algo {
            AllReduceAlgo::Proxy => {
                self.run_host_blocks("all_reduce_host", self.proxy_plan(bytes).0, body)
            }
            _ => self.run_host_alone("all_reduce_host", body),
        }
    }

    /// `tag` of an all-reduce of `bytes` with the resolved `algo`'s plan (proxy calls carry
    /// theirs: [`Collectives::proxy_tag`]).
    fn plan_tag(&self, tag: u64, algo: AllReduceAlgo, bytes: usize) -> u64 {
        match algo {
            AllReduceAlgo::Proxy => self.proxy_tag(tag, bytes),
            _ => tag,
        }
    }
}
