//! All-reduce: raw, typed, host and in-place calls.

use super::cross;
use super::descriptor::all_reduce_tag;
use super::gpu;
use super::kernel_table;
use super::select::route;
use super::staged;
use super::{AllReduceAlgo, Collectives, DataType, Element, ReduceOp, checked_bytes};
use crate::communicator::CommError;
use crate::cuda::{CudaSlice, CudaStream};
use mscclpp_device::collectives::{CollContext, desc};

impl Collectives {
    /// All-reduce of `count` elements from device address `send` into `recv` (equal for in
    /// place), stream-ordered on `stream`. GPU backend only. Checks that both ranges are
    /// device memory (`cuMemGetAddressRange`) and aligned to the element size; allocates
    /// nothing and does not synchronise, so it may be captured into a CUDA graph.
    ///
    /// # Safety
    /// `send` and `recv` must stay valid (not freed) until the operation completes on
    /// `stream`, and not be written by others meanwhile; partially overlapping ranges are
    /// not allowed.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_raw(
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
            let (ex, what) = (cross::Exec::Gpu(stream), staged::Staged::AllReduce);
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
            let ex = cross::Exec::Gpu(stream);
            return self.empty_call(ex, "all_reduce", desc::ALL_REDUCE, dtype, Some(op), None);
        }
        self.noted((|| {
            gpu::check_range("all_reduce: send", send, bytes, dtype.size())?;
            gpu::check_range("all_reduce: recv", recv, bytes, dtype.size())
        })())?;
        if let Some(c) = self.cross() {
            let algo = self.cross_all_reduce_algo(c, algo, bytes);
            let ex = cross::Exec::Gpu(stream);
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

    /// Out-of-place all-reduce of cudarc slices (lengths must match), on `stream`.
    ///
    /// cudarc orders slice uses across streams with events when its event tracking is on
    /// and the context has several streams; those event waits cannot be captured into a
    /// CUDA graph. Under capture, such a call is refused with that reason: call
    /// `CudaContext::disable_event_tracking` first, or use
    /// [`all_reduce_raw`](Self::all_reduce_raw).
    pub fn all_reduce<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        if send.len() != recv.len() {
            return Err(CommError::InvalidArgument(format!(
                "all_reduce: send has {} elements, recv {}",
                send.len(),
                recv.len()
            )));
        }
        let count = send.len();
        gpu::check_capture("all_reduce", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: the slices are borrowed across the launch and cudarc's guards order later
        // uses of them after this stream's work.
        unsafe { self.all_reduce_raw(s, r, count, T::DTYPE, op, AllReduceAlgo::Auto, stream) }
    }

    /// In-place all-reduce of a cudarc slice, on `stream` (graph capture as in
    /// [`all_reduce`](Self::all_reduce)).
    pub fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::DevicePtrMut;
        let count = buf.len();
        gpu::check_capture("all_reduce_in_place", stream)?;
        let (p, _g) = buf.device_ptr_mut(stream);
        // SAFETY: as in all_reduce.
        unsafe { self.all_reduce_raw(p, p, count, T::DTYPE, op, AllReduceAlgo::Auto, stream) }
    }

    /// Host backend: all-reduce of host slices (blocking; CPU threads run the kernel).
    pub fn all_reduce_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        if send.len() != recv.len() {
            return Err(CommError::InvalidArgument(format!(
                "all_reduce_host: send has {} elements, recv {}",
                send.len(),
                recv.len()
            )));
        }
        // SAFETY: both slices are valid for their length and borrowed for the call.
        unsafe {
            self.host_all_reduce(
                send.as_ptr() as u64,
                recv.as_mut_ptr() as u64,
                send.len(),
                T::DTYPE,
                op,
            )
        }
    }

    /// Host backend: in-place all-reduce.
    pub fn all_reduce_host_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let p = buf.as_mut_ptr() as u64;
        // SAFETY: the slice is valid for its length and borrowed for the call.
        unsafe { self.host_all_reduce(p, p, buf.len(), T::DTYPE, op) }
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
    ) -> Result<(), CommError> {
        if staged::is_staged(dtype, op) {
            let (ex, what) = (cross::Exec::Host, staged::Staged::AllReduce);
            // SAFETY: forwarded (caller contract).
            return unsafe { self.staged(ex, what, send, recv, count, dtype, op) };
        }
        self.host_only("all_reduce_host")?;
        let bytes = checked_bytes("all_reduce_host", count, dtype.size())?;
        if count == 0 {
            let ex = cross::Exec::Host;
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
            let algo = self.cross_all_reduce_algo(c, AllReduceAlgo::Auto, bytes);
            let ex = cross::Exec::Host;
            // SAFETY: caller contract.
            return unsafe { self.cross_all_reduce(ex, send, recv, count, dtype, op, None, algo) };
        }
        let algo = route(self.resolve(AllReduceAlgo::Auto, bytes)?, dtype, op);
        let f = kernel_table::all_reduce_host_kernel(algo, dtype, op);
        let tag = self.plan_tag(all_reduce_tag(algo, dtype, op), algo, bytes);
        let blocks = match algo {
            AllReduceAlgo::Proxy => self.proxy_plan(bytes).0,
            _ => 1,
        };
        let ctx = &*self.ctx as *const CollContext as u64;
        self.run_host_blocks("all_reduce_host", blocks, || {
            // SAFETY: the context (boxed, alive as long as self) holds this communicator's
            // shared memory; the slices are valid (caller contract) and the grid is blocks
            // of >= nranks threads (at most the lanes built: proxy_plan).
            unsafe {
                f(
                    ctx as *const CollContext,
                    send as *const u8,
                    recv as *mut u8,
                    count as u64,
                    tag,
                )
            }
        })
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
