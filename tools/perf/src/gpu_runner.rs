//! Running and timing on a GPU: the rank's buffers and stream, CUDA events (or a CUDA graph
//! with `-G`) around the timed iterations.

use cudarc::driver::DriverError;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use mscclpp::host::collectives::RawBuffer;

use crate::host::collectives::{AllReduceAlgo, Collectives, DataType, P2pOp, ReduceOp};
use crate::host::cuda::{CUevent_flags, CudaError, CudaStream, DeviceBuffer, Gpu};

use super::PerfError;
use super::args::{Collective, Config};
use super::check::{Elem, Strictness};
use super::nccl::Nccl;
use super::report::Shape;
use super::sweep::{
    Lib, Placement, Timed, buffer_bytes, check_inputs, effective, host_vec, out_range, reference,
};

fn drv(call: &'static str) -> impl Fn(DriverError) -> PerfError {
    move |e| PerfError::Cuda(CudaError::driver(call, e))
}

pub(super) struct GpuRunner<'a, T: Elem> {
    coll: &'a Collectives,
    gpu: Gpu,
    nccl: Option<&'a Nccl>,
    stream: std::sync::Arc<CudaStream>,
    send: DeviceBuffer,
    recv: DeviceBuffer,
    _elem: std::marker::PhantomData<T>,
}

impl<'a, T: Elem> GpuRunner<'a, T> {
    pub(super) fn new(
        gpu: &Gpu,
        coll: &'a Collectives,
        nccl: Option<&'a Nccl>,
        largest: &Shape,
    ) -> Result<Self, PerfError> {
        let elt = T::DTYPE.size();
        Ok(GpuRunner {
            coll,
            gpu: gpu.clone(),
            nccl,
            stream: gpu.new_stream()?,
            send: DeviceBuffer::zeroed(gpu, buffer_bytes(largest.send_count, elt, "send")?)?,
            recv: DeviceBuffer::zeroed(gpu, buffer_bytes(largest.count, elt, "receive")?)?,
            _elem: std::marker::PhantomData,
        })
    }

    /// (send, recv) device addresses of `placement`.
    fn pointers(&self, placement: Placement, shape: &Shape, c: Collective) -> (u64, u64) {
        let recv = self.recv.device_ptr();
        match placement {
            Placement::OutOfPlace => (self.send.device_ptr(), recv),
            Placement::InPlace => match c {
                Collective::AllGather => {
                    let slot = self.coll.rank() as u64 * shape.send_count * T::DTYPE.size() as u64;
                    (recv + slot, recv)
                }
                Collective::ReduceScatter => {
                    let per = shape.count / self.coll.nranks() as u64;
                    let slot = self.coll.rank() as u64 * per * T::DTYPE.size() as u64;
                    (recv, recv + slot)
                }
                Collective::SendRecv => (self.send.device_ptr(), recv),
                _ => (recv, recv),
            },
        }
    }

    /// Queues one operation on the stream.
    fn enqueue(
        &self,
        config: &Config,
        lib: Lib,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(), PerfError> {
        let (send, recv) = self.pointers(placement, shape, config.args.collective);
        let (n, rank) = (self.coll.nranks(), self.coll.rank());
        let dtype = config.args.dtype;
        let call = Call {
            collective: config.args.collective,
            algo: config.args.algo.all_reduce(),
            nranks: n,
            send,
            recv,
            dtype,
            op: config.args.redop.reduce_op(dtype, rank),
            root: config.args.root,
            count: shape.count as usize,
            per: shape.count as usize / n,
            send_count: shape.send_count as usize,
            next: (rank + 1) % n,
            prev: (rank + n - 1) % n,
        };
        match lib {
            Lib::Mscclpp => self.enqueue_ours(&call),
            Lib::Nccl => self.enqueue_nccl(&call),
        }
    }

    /// [`enqueue`](Self::enqueue) of our collectives.
    fn enqueue_ours(&self, call: &Call) -> Result<(), PerfError> {
        let Call {
            collective: c,
            algo,
            send,
            recv,
            dtype,
            op,
            root,
            count,
            per,
            send_count,
            next,
            prev,
            ..
        } = *call;
        // SAFETY (every arm): the buffers hold the largest shape of the sweep and live in
        // `self` until the stream is synchronised in `measure`.
        match c {
            Collective::ReduceScatter => unsafe {
                self.coll.reduce_scatter(
                    &RawBuffer::device(send, per.saturating_mul(self.coll.nranks()), dtype),
                    &mut RawBuffer::device(recv, per, dtype),
                    op,
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            Collective::Broadcast => unsafe {
                self.coll.broadcast(
                    &RawBuffer::device(send, count, dtype),
                    &mut RawBuffer::device(recv, count, dtype),
                    root,
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            Collective::Reduce => unsafe {
                self.coll.reduce(
                    &RawBuffer::device(send, count, dtype),
                    &mut RawBuffer::device(recv, count, dtype),
                    op,
                    root,
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            Collective::AllToAll => unsafe {
                self.coll.all_to_all(
                    &RawBuffer::device(send, per.saturating_mul(self.coll.nranks()), dtype),
                    &mut RawBuffer::device(recv, per.saturating_mul(self.coll.nranks()), dtype),
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            Collective::SendRecv => {
                let ops = [
                    P2pOp::Send {
                        buf: send,
                        count,
                        dtype,
                        peer: next,
                    },
                    P2pOp::Recv {
                        buf: recv,
                        count,
                        dtype,
                        peer: prev,
                    },
                ];
                // SAFETY: as above.
                unsafe { self.coll.group(&ops, &self.stream) }.map_err(PerfError::from)
            }
            Collective::AllReduce => unsafe {
                self.coll.all_reduce_using(
                    algo,
                    &RawBuffer::device(send, count, dtype),
                    &mut RawBuffer::device(recv, count, dtype),
                    op,
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            Collective::AllGather => unsafe {
                self.coll.all_gather(
                    &RawBuffer::device(send, send_count, dtype),
                    &mut RawBuffer::device(
                        recv,
                        send_count.saturating_mul(self.coll.nranks()),
                        dtype,
                    ),
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
        }
    }

    /// [`enqueue`](Self::enqueue) of NCCL's collectives.
    fn enqueue_nccl(&self, call: &Call) -> Result<(), PerfError> {
        let Call {
            collective: c,
            nranks,
            send,
            recv,
            dtype,
            op,
            root,
            count,
            per,
            send_count,
            next,
            prev,
            ..
        } = *call;
        let nccl = || {
            self.nccl
                .ok_or_else(|| PerfError::Nccl("NCCL is not initialised".into()))
        };
        // SAFETY (every arm): the buffers hold the largest shape of the sweep and live in
        // `self` until the stream is synchronised in `measure`.
        match c {
            Collective::ReduceScatter => unsafe {
                nccl()?.reduce_scatter(send, recv, per, dtype, op, &self.stream)
            },
            Collective::Broadcast => unsafe {
                nccl()?.broadcast(send, recv, count, dtype, root, &self.stream)
            },
            Collective::Reduce => unsafe {
                nccl()?.reduce(send, recv, count, dtype, op, root, &self.stream)
            },
            Collective::AllToAll => unsafe {
                nccl()?.all_to_all(send, recv, per, dtype, nranks, &self.stream)
            },
            Collective::SendRecv => unsafe {
                nccl()?.send_recv(send, recv, count, dtype, next, prev, &self.stream)
            },
            Collective::AllReduce => unsafe {
                nccl()?.all_reduce(send, recv, count, dtype, op, &self.stream)
            },
            Collective::AllGather => unsafe {
                nccl()?.all_gather(send, recv, send_count, dtype, &self.stream)
            },
        }
    }

    /// Synchronises the stream and the GPU, then returns what the collectives' kernels
    /// recorded (`Collectives::synchronize`): calls are asynchronous, so a mismatch between
    /// the ranks, a timeout or an abort (a lost rank) of a timed loop surfaces here, as an
    /// error that ends the run with a non-zero exit status, rather than as bad timings.
    fn sync(&self) -> Result<(), PerfError> {
        self.coll.synchronize(&self.stream)?;
        self.gpu.synchronize()?;
        Ok(self.coll.async_error()?)
    }

    /// Writes the check inputs (every rank; peers are idle: barriers on both sides).
    fn load_inputs(
        &self,
        config: &Config,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(), PerfError> {
        let bs = self.coll.communicator().bootstrap();
        self.sync()?;
        bs.barrier()?;
        let (input, recv) = check_inputs::<T>(
            config,
            self.coll.nranks(),
            self.coll.rank(),
            placement,
            shape,
        )?;
        self.recv.copy_from_host(0, &recv)?;
        if effective(config.args.collective, placement) == Placement::OutOfPlace {
            self.send.copy_from_host(0, &input)?;
        }
        self.sync()?;
        bs.barrier()?;
        Ok(())
    }

    fn time(
        &self,
        config: &Config,
        lib: Lib,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(f64, Option<f64>), PerfError> {
        let bs = self.coll.communicator().bootstrap();
        let a = &config.args;
        for _ in 0..a.warmup_iters {
            self.enqueue(config, lib, placement, shape)?;
        }
        self.sync()?;
        let ctx = self.stream.context();
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(timing).map_err(drv("cuEventCreate"))?;
        let stop = ctx.new_event(timing).map_err(drv("cuEventCreate"))?;
        let mut host_us = None;
        let ops = if a.graph_launches == 0 {
            bs.barrier()?;
            // Ranks leave the host barrier microseconds apart. One untimed call first waits
            // on the GPU for the last of them, so the timed calls start together (nccl-tests'
            // timed loop likewise follows its warm-up on the stream, with no host barrier).
            self.enqueue(config, lib, placement, shape)?;
            start.record(&self.stream).map_err(drv("cuEventRecord"))?;
            let queued_at = std::time::Instant::now();
            for _ in 0..a.iters {
                self.enqueue(config, lib, placement, shape)?;
            }
            host_us = Some(queued_at.elapsed().as_secs_f64() * 1e6 / a.iters.max(1) as f64);
            stop.record(&self.stream).map_err(drv("cuEventRecord"))?;
            a.iters as f64
        } else {
            if a.warmup_iters == 0 {
                // fp8 reductions and pre-multiplied sums allocate the communicator's staging
                // buffer at their first call, which cannot be under capture.
                self.enqueue(config, lib, placement, shape)?;
                self.sync()?;
            }
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(drv("cuStreamBeginCapture"))?;
            let queued = (0..a.iters).try_for_each(|_| self.enqueue(config, lib, placement, shape));
            // End the capture even when a call failed, so the stream is usable again.
            let graph = self
                .stream
                .end_capture(CUgraphInstantiate_flags(0))
                .map_err(drv("cuStreamEndCapture"));
            queued?;
            let graph = graph?.ok_or_else(|| {
                PerfError::Cuda(CudaError::InvalidArgument(
                    "the captured CUDA graph is empty".into(),
                ))
            })?;
            graph.upload().map_err(drv("cuGraphUpload"))?;
            graph.launch().map_err(drv("cuGraphLaunch"))?;
            self.sync()?;
            bs.barrier()?;
            // As above: one untimed call aligns the ranks.
            self.enqueue(config, lib, placement, shape)?;
            start.record(&self.stream).map_err(drv("cuEventRecord"))?;
            for _ in 0..a.graph_launches {
                graph.launch().map_err(drv("cuGraphLaunch"))?;
            }
            stop.record(&self.stream).map_err(drv("cuEventRecord"))?;
            a.iters as f64 * a.graph_launches as f64
        };
        stop.synchronize().map_err(drv("cuEventSynchronize"))?;
        let ms = start.elapsed_ms(&stop).map_err(drv("cuEventElapsedTime"))? as f64;
        self.sync()?;
        Ok((ms * 1e3 / ops, host_us))
    }

    pub(super) fn measure(
        &mut self,
        config: &Config,
        lib: Lib,
        placement: Placement,
        shape: &Shape,
    ) -> Result<Timed, PerfError> {
        if config.check() {
            self.load_inputs(config, placement, shape)?;
        }
        let (us, host_us) = self.time(config, lib, placement, shape)?;
        // NCCL's all-to-all does not support in place (it is grouped sends and receives
        // of the same buffer): timed as nccl-tests does, not checked.
        let unsupported = lib == Lib::Nccl
            && placement == Placement::InPlace
            && config.args.collective == Collective::AllToAll;
        let wrong = if config.check() && !unsupported {
            // Fresh inputs: in-place iterations have overwritten them.
            self.load_inputs(config, placement, shape)?;
            self.enqueue(config, lib, placement, shape)?;
            self.sync()?;
            let mut got = host_vec(shape.count, T::default(), "the check's copy of the output")?;
            self.recv.copy_to_host(0, &mut got)?;
            let (c, n, rank) = (config.args.collective, self.coll.nranks(), self.coll.rank());
            let strictness = match lib {
                Lib::Mscclpp => Strictness::Exact,
                Lib::Nccl => Strictness::Nccl,
            };
            Some(reference(config, n).count_wrong(
                strictness,
                rank,
                shape.send_count,
                &got[out_range(c, placement, shape, rank, n)],
            ))
        } else {
            None
        };
        Ok(Timed { us, host_us, wrong })
    }
}

/// One operation of a sweep, as both libraries' calls take it.
#[derive(Clone, Copy)]
struct Call {
    collective: Collective,
    /// Our all-reduce's algorithm (`--algo`).
    algo: AllReduceAlgo,
    nranks: usize,
    send: u64,
    recv: u64,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
    /// Elements of the size column.
    count: usize,
    /// `count / nranks`.
    per: usize,
    /// Elements each rank sends.
    send_count: usize,
    /// The send/recv ring's neighbours.
    next: usize,
    prev: usize,
}
