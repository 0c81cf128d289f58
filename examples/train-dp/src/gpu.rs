//! Training on a GPU: GEMMs with cuBLAS (cudarc, loaded at run time), everything else with
//! the example's own kernels, gradients averaged bucket by bucket on a second stream.
//!
//! One step, on the compute stream `s` and the communication stream `c`:
//!
//! ```text
//! s: inputs | teacher fwd | fwd L layers | loss | bwd layer L-1 | ev[0] | bwd ... | ev[k] | ... | wait(done) | norm | finalize | AdamW
//! c:                                               wait(ev[0]) all-reduce b0 | wait(ev[1]) all-reduce b1 ... | done
//! ```
//!
//! Bucket `k` is complete once the backward pass has produced its lowest layer; an event
//! recorded on `s` there is waited on by `c`, which all-reduces the bucket (sum) while `s`
//! computes the remaining layers. The optimizer waits for `c`'s last all-reduce, and folds
//! the `1 / nranks` of the average and the clipping factor into its gradient scale
//! (`finalize`). Everything is stream-ordered, with no host synchronisation inside a step,
//! so `--graph` captures the step (both streams: `c` joins the capture through the events)
//! and replays it; the step counter, the data position and Adam's bias corrections live in
//! device memory for that reason.
//!
//! Timing (CUDA events, recorded as external events so that they also time graph replays):
//! the step from its first to its last kernel; the exposed communication from the end of
//! the backward compute to the moment `s` may continue past its wait for `c`; the
//! communication span from the first bucket's start on `c` to the last one's end. The
//! host reads each step's events before enqueuing the next, so steps do not pipeline on
//! the host side (launch overhead between steps is outside the measured step time).

use mscclpp::host::collectives::RawBuffer;
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::sys::{CUevent_record_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use mscclpp::host::collectives::{Collectives, DataType, ReduceOp};
use mscclpp::host::cuda::{
    CUevent_flags, CudaEvent, CudaFunction, CudaStream, DeviceBuffer, Gpu, KernelModule,
    LaunchConfig, PushKernelArg,
};
use mscclpp_perf::nccl::Nccl;
use train_dp_kernels::{REDUCE_BLOCKS, REDUCE_THREADS, slot};

use crate::baseline::Mode;
use crate::config::{Args, Compare, Config, GradDtype};
use crate::host_train::{applied_adamw, check_first_step, check_gradient};
use crate::model::{self, Bucket, Mlp, seeds};
use crate::report::{GradCheck, RunReport, StepTime};
use crate::{Error, Ranks};

mod ptx {
    include!(concat!(env!("OUT_DIR"), "/kernels_ptx.rs"));
}

/// Threads per block of the element-wise kernels.
const THREADS: u32 = 256;

fn grid_for(n: usize) -> u32 {
    n.div_ceil(THREADS as usize).clamp(1, 16384) as u32
}

/// Launches kernel `$f` on `$s` with `$grid` blocks of `$block` threads and the given
/// arguments (each bound to a local first, so the builder's references stay valid).
macro_rules! launch {
    ($s:expr, $f:expr, $grid:expr, $block:expr; $($a:expr),* $(,)?) => {{
        let mut lb = $s.launch_builder($f);
        launch!(@args lb; $($a),*);
        let cfg = LaunchConfig {
            grid_dim: ($grid, 1, 1),
            block_dim: ($block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every pointer argument is a live device buffer of this GPU, sized for
        // the element counts passed alongside it (the callers' invariant: buffers are
        // allocated from the model's shape in `Net::new`).
        unsafe { lb.launch(cfg) }.map(|_| ())
    }};
    (@args $lb:ident; $a:expr $(, $rest:expr)*) => {
        let v = $a;
        $lb.arg(&v);
        launch!(@args $lb; $($rest),*);
    };
    (@args $lb:ident;) => {};
}

/// The example's kernels.
struct Kernels {
    gen_inputs: CudaFunction,
    bias_act: CudaFunction,
    loss_grad: CudaFunction,
    relu_backward: CudaFunction,
    sum_squares: CudaFunction,
    finalize: CudaFunction,
    adamw: CudaFunction,
    to_bf16: CudaFunction,
    from_bf16: CudaFunction,
}

impl Kernels {
    fn load(gpu: &Gpu) -> Result<Kernels, Error> {
        let m = KernelModule::load_images(gpu, ptx::PTX, ptx::CUBIN)?;
        Ok(Kernels {
            gen_inputs: m.function("gen_inputs")?,
            bias_act: m.function("bias_act")?,
            loss_grad: m.function("loss_grad")?,
            relu_backward: m.function("relu_backward")?,
            sum_squares: m.function("sum_squares")?,
            finalize: m.function("finalize")?,
            adamw: m.function("adamw")?,
            to_bf16: m.function("to_bf16")?,
            from_bf16: m.function("from_bf16")?,
        })
    }
}

/// A cuBLAS handle bound to one stream.
struct Blas {
    handle: blas_sys::cublasHandle_t,
}

impl Blas {
    fn new(stream: &CudaStream, tf32: bool) -> Result<Blas, Error> {
        if !crate::libs::cublas_loadable() {
            return Err(crate::libs::cublas_missing().into());
        }
        let handle = blas::create_handle().map_err(|e| format!("cublasCreate: {e:?}"))?;
        let b = Blas { handle };
        // SAFETY: the handle was just created; the stream outlives it (both live in `Gpu
        // run`'s scope and the handle is dropped first).
        unsafe { blas::set_stream(handle, stream.cu_stream() as blas_sys::cudaStream_t) }
            .map_err(|e| format!("cublasSetStream: {e:?}"))?;
        if tf32 {
            // SAFETY: a live handle.
            unsafe {
                blas_sys::cublasSetMathMode(
                    handle,
                    blas_sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
                )
            }
            .result()
            .map_err(|e| format!("cublasSetMathMode: {e:?}"))?;
        }
        Ok(b)
    }

    /// Column-major `C (m x n) = op(A) op(B)` with `beta = 0`.
    ///
    /// # Safety
    /// The pointers must be device memory of this GPU holding the matrices the dimensions
    /// and leading dimensions describe.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        &self,
        ta: bool,
        tb: bool,
        m: usize,
        n: usize,
        k: usize,
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        c: u64,
        ldc: usize,
    ) -> Result<(), Error> {
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller guarantees the matrices; alpha and beta are host values read
        // during the call (default pointer mode).
        unsafe {
            blas::sgemm(
                self.handle,
                op(ta),
                op(tb),
                m as i32,
                n as i32,
                k as i32,
                &alpha,
                a as *const f32,
                lda as i32,
                b as *const f32,
                ldb as i32,
                &beta,
                c as *mut f32,
                ldc as i32,
            )
        }
        .map_err(|e| format!("cublasSgemm {m}x{n}x{k}: {e:?}").into())
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle is live and used by nothing after this.
        let _ = unsafe { blas::destroy_handle(self.handle) };
    }
}

/// Whose all-reduce averages the buckets.
enum Comm<'a> {
    Ours(&'a Collectives),
    Nccl(&'a Nccl),
}

impl Comm<'_> {
    fn name(&self) -> &'static str {
        match self {
            Comm::Ours(_) => "mscclpp",
            Comm::Nccl(_) => "nccl",
        }
    }

    /// In-place sum of `count` elements at `ptr`, on `stream`.
    ///
    /// # Safety
    /// `ptr` must be device memory valid for `count` elements until the stream has run it.
    unsafe fn all_reduce(
        &self,
        ptr: u64,
        count: usize,
        dtype: DataType,
        stream: &CudaStream,
    ) -> Result<(), Error> {
        match self {
            // SAFETY: the caller keeps the range valid.
            Comm::Ours(c) => unsafe {
                c.all_reduce(
                    &RawBuffer::device(ptr, count, dtype),
                    &mut RawBuffer::device(ptr, count, dtype),
                    ReduceOp::Sum,
                    stream,
                )?
            },
            // SAFETY: the caller keeps the range valid.
            Comm::Nccl(n) => unsafe {
                n.all_reduce(ptr, ptr, count, dtype, ReduceOp::Sum, stream)?
            },
        }
        Ok(())
    }
}

/// Events of one step.
struct StepEvents {
    start: CudaEvent,
    bwd_end: CudaEvent,
    after_wait: CudaEvent,
    comm_start: CudaEvent,
    comm_end: CudaEvent,
    end: CudaEvent,
}

/// Records `ev` on `stream`: under capture as an external event (an event-record node, so
/// it times graph replays too), else plainly (the driver refuses the external flag outside
/// capture with CUDA_ERROR_ILLEGAL_STATE).
fn record_timing(ev: &CudaEvent, stream: &CudaStream) -> Result<(), Error> {
    let mut status = cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream; `status` is a valid out-pointer.
    unsafe { cudarc::driver::sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) }
        .result()
        .map_err(|e| format!("cuStreamIsCapturing: {e:?}"))?;
    let flags =
        if status == cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32
        } else {
            CUevent_record_flags::CU_EVENT_RECORD_DEFAULT as u32
        };
    // SAFETY: a live event and stream of the same context.
    let r = unsafe {
        cudarc::driver::sys::cuEventRecordWithFlags(ev.cu_event(), stream.cu_stream(), flags)
    };
    r.result()
        .map_err(|e| format!("cuEventRecordWithFlags: {e:?}").into())
}

/// Device memory and launch plan of one rank's model.
struct Net<'a> {
    cfg: &'a Config,
    mlp: Mlp,
    teacher: Mlp,
    buckets: Vec<Bucket>,
    k: Kernels,
    blas: Blas,
    s: Arc<CudaStream>,
    c: Arc<CudaStream>,
    params: DeviceBuffer,
    grads: DeviceBuffer,
    m: DeviceBuffer,
    v: DeviceBuffer,
    grads_bf16: Option<DeviceBuffer>,
    tparams: DeviceBuffer,
    /// `acts[0]` = inputs, `acts[l + 1]` = layer `l`'s output.
    acts: Vec<DeviceBuffer>,
    t_hidden: DeviceBuffer,
    /// `rank_batch` ones (bias gradients as a GEMM).
    ones: DeviceBuffer,
    labels: DeviceBuffer,
    dy: [DeviceBuffer; 2],
    loss_partial: DeviceBuffer,
    grad_partial: DeviceBuffer,
    scalars: DeviceBuffer,
    step: DeviceBuffer,
    ready: Vec<CudaEvent>,
    comm_done: CudaEvent,
    ev: StepEvents,
    rank: usize,
}

fn f32s(gpu: &Gpu, n: usize) -> Result<DeviceBuffer, Error> {
    Ok(DeviceBuffer::zeroed(gpu, n.max(1) * 4)?)
}

impl<'a> Net<'a> {
    fn new(cfg: &'a Config, gpu: &Gpu, rank: usize) -> Result<Net<'a>, Error> {
        let mlp = Mlp::square(cfg.layers, cfg.width);
        let teacher = model::teacher(cfg.width, cfg.teacher_hidden);
        let buckets = model::buckets(&mlp, cfg.bucket_bytes / 4);
        let s = gpu.new_stream()?;
        let c = gpu.new_stream()?;
        let b = cfg.rank_batch;
        let ctx = gpu.context();
        let timing = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        let plain = || ctx.new_event(None);
        let ones = f32s(gpu, b)?;
        ones.copy_from_host(0, &vec![1.0f32; b])?;
        let tparams = f32s(gpu, teacher.params)?;
        tparams.copy_from_host(0, &teacher.init(seeds::teacher(cfg.seed), 1.0))?;
        let net = Net {
            k: Kernels::load(gpu)?,
            blas: Blas::new(&s, cfg.tf32)?,
            params: f32s(gpu, mlp.params)?,
            grads: f32s(gpu, mlp.params)?,
            m: f32s(gpu, mlp.params)?,
            v: f32s(gpu, mlp.params)?,
            grads_bf16: match cfg.grad_dtype {
                GradDtype::Bf16 => Some(DeviceBuffer::zeroed(gpu, mlp.params * 2)?),
                GradDtype::F32 => None,
            },
            tparams,
            acts: (0..=mlp.layers())
                .map(|l| f32s(gpu, b * mlp.dims[l]))
                .collect::<Result<_, _>>()?,
            t_hidden: f32s(gpu, b * cfg.teacher_hidden)?,
            ones,
            labels: f32s(gpu, b * cfg.width)?,
            dy: [f32s(gpu, b * cfg.width)?, f32s(gpu, b * cfg.width)?],
            loss_partial: f32s(gpu, REDUCE_BLOCKS as usize)?,
            grad_partial: f32s(gpu, REDUCE_BLOCKS as usize)?,
            scalars: f32s(gpu, slot::COUNT)?,
            step: DeviceBuffer::zeroed(gpu, 8)?,
            ready: (0..buckets.len())
                .map(|_| plain())
                .collect::<Result<_, _>>()?,
            comm_done: plain()?,
            ev: StepEvents {
                start: timing()?,
                bwd_end: timing()?,
                after_wait: timing()?,
                comm_start: timing()?,
                comm_end: timing()?,
                end: timing()?,
            },
            mlp,
            teacher,
            buckets,
            s,
            c,
            cfg,
            rank,
        };
        Ok(net)
    }

    /// Initial state: parameters from the seed, zero moments, step 0.
    fn reset(&self) -> Result<Vec<f32>, Error> {
        let p = self.mlp.init(seeds::student(self.cfg.seed), 1.0);
        self.params.copy_from_host(0, &p)?;
        let zeros = vec![0.0f32; self.mlp.params];
        self.m.copy_from_host(0, &zeros)?;
        self.v.copy_from_host(0, &zeros)?;
        let mut sc = vec![0.0f32; slot::COUNT];
        sc[slot::BETA1_POW] = 1.0;
        sc[slot::BETA2_POW] = 1.0;
        self.scalars.copy_from_host(0, &sc)?;
        self.step.copy_from_host(0, &[0u64])?;
        Ok(p)
    }

    /// `out (rows x dout) = act(inp (rows x din) W^T + b)` for the MLP `m` with
    /// parameters at `p`.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        m: &Mlp,
        p: u64,
        l: usize,
        inp: u64,
        out: u64,
        rows: usize,
        relu: bool,
    ) -> Result<(), Error> {
        let (din, dout) = (m.dims[l], m.dims[l + 1]);
        let w = p + 4 * m.w_off[l] as u64;
        let b = p + 4 * m.b_off[l] as u64;
        // Row-major Y = X W^T is column-major Y^T (dout x rows) = W^T(col) ... see below:
        // W's memory is column-major W^T (din x dout, ld din), so Y^T = (W^T)^T X^T.
        // SAFETY: w, inp, out hold dout x din, rows x din, rows x dout f32 (Net::new).
        unsafe {
            self.blas
                .gemm(true, false, dout, rows, din, w, din, inp, din, out, dout)?
        };
        launch!(self.s, &self.k.bias_act, grid_for(rows * dout), THREADS;
            out, b, rows as u64, dout as u64, relu as u32)?;
        Ok(())
    }

    /// Issues bucket `k`'s average on the comm stream (after its ready event).
    fn issue_bucket(&self, comm: &Comm<'_>, k: usize) -> Result<(), Error> {
        let bk = self.buckets[k];
        self.c.wait(&self.ready[k])?;
        if k == 0 {
            record_timing(&self.ev.comm_start, &self.c)?;
        }
        if self.cfg.nranks > 1 {
            let g = self.grads.device_ptr() + 4 * bk.start as u64;
            let n = bk.len();
            match &self.grads_bf16 {
                None => {
                    // SAFETY: the range lies inside `grads`, which outlives the step.
                    unsafe { comm.all_reduce(g, n, DataType::F32, &self.c)? }
                }
                Some(h) => {
                    let hb = h.device_ptr() + 2 * bk.start as u64;
                    launch!(self.c, &self.k.to_bf16, grid_for(n), THREADS; hb, g, n as u64)?;
                    // SAFETY: the range lies inside `grads_bf16`.
                    unsafe { comm.all_reduce(hb, n, DataType::Bf16, &self.c)? };
                    launch!(self.c, &self.k.from_bf16, grid_for(n), THREADS; g, hb, n as u64)?;
                }
            }
        }
        Ok(())
    }

    /// Enqueues one training step on the two streams (no host synchronisation).
    fn step(&self, comm: &Comm<'_>) -> Result<(), Error> {
        let cfg = self.cfg;
        let (mlp, s) = (&self.mlp, &self.s);
        let b = cfg.rank_batch;
        let layers = mlp.layers();
        let p = self.params.device_ptr();
        let gr = self.grads.device_ptr();
        record_timing(&self.ev.start, s)?;
        // Data: this rank's shard of the global batch at the device-side step counter.
        let x = self.acts[0].device_ptr();
        launch!(s, &self.k.gen_inputs, grid_for(b * cfg.width), THREADS;
            x, b as u64, cfg.width as u64, seeds::data(cfg.seed), self.step.device_ptr(),
            cfg.batch as u64, (self.rank * b) as u64)?;
        let tp = self.tparams.device_ptr();
        self.linear(&self.teacher, tp, 0, x, self.t_hidden.device_ptr(), b, true)?;
        self.linear(
            &self.teacher,
            tp,
            1,
            self.t_hidden.device_ptr(),
            self.labels.device_ptr(),
            b,
            false,
        )?;
        for l in 0..layers {
            self.linear(
                mlp,
                p,
                l,
                self.acts[l].device_ptr(),
                self.acts[l + 1].device_ptr(),
                b,
                l + 1 < layers,
            )?;
        }
        let out = mlp.output();
        let scale = 2.0f32 / (b * out) as f32;
        let mut g = self.dy[0].device_ptr();
        launch!(s, &self.k.loss_grad, REDUCE_BLOCKS, REDUCE_THREADS;
            self.acts[layers].device_ptr(), self.labels.device_ptr(), g, (b * out) as u64,
            scale, self.loss_partial.device_ptr())?;
        // Backward, last layer first; buckets handed to the comm stream as they complete.
        let mut k = 0;
        for l in (0..layers).rev() {
            let (din, dout) = (mlp.dims[l], mlp.dims[l + 1]);
            let h = self.acts[l].device_ptr();
            // dW (row-major dout x din) = g^T h: column-major dW^T (din x dout) = h^T g.
            // SAFETY: h: b x din, g: b x dout, the weight gradient: dout x din (Net::new).
            unsafe {
                self.blas.gemm(
                    false,
                    true,
                    din,
                    dout,
                    b,
                    h,
                    din,
                    g,
                    dout,
                    gr + 4 * mlp.w_off[l] as u64,
                    din,
                )?
            };
            // db (dout) = g^T 1: column-major g^T (dout x b) times a column of ones.
            // SAFETY: g: b x dout, ones: b, the bias gradient: dout.
            unsafe {
                self.blas.gemm(
                    false,
                    false,
                    dout,
                    1,
                    b,
                    g,
                    dout,
                    self.ones.device_ptr(),
                    b,
                    gr + 4 * mlp.b_off[l] as u64,
                    dout,
                )?
            };
            if l == self.buckets[k].lo {
                self.ready[k].record(s)?;
                if cfg.overlap {
                    self.issue_bucket(comm, k)?;
                }
                k += 1;
            }
            if l > 0 {
                // dh (b x din) = g W: column-major dh^T = W^T(col, din x dout) g^T.
                let dh = self.dy[(layers - l) % 2].device_ptr();
                // SAFETY: W: dout x din, g: b x dout, dh: b x din (width-sized buffers).
                unsafe {
                    self.blas.gemm(
                        false,
                        false,
                        din,
                        b,
                        dout,
                        p + 4 * mlp.w_off[l] as u64,
                        din,
                        g,
                        dout,
                        dh,
                        din,
                    )?
                };
                launch!(s, &self.k.relu_backward, grid_for(b * din), THREADS;
                    dh, h, (b * din) as u64)?;
                g = dh;
            }
        }
        record_timing(&self.ev.bwd_end, s)?;
        if !cfg.overlap {
            for k in 0..self.buckets.len() {
                self.issue_bucket(comm, k)?;
            }
        }
        record_timing(&self.ev.comm_end, &self.c)?;
        self.comm_done.record(&self.c)?;
        s.wait(&self.comm_done)?;
        record_timing(&self.ev.after_wait, s)?;
        // Optimizer: norm of the summed gradient, clip and 1/n folded into its scale.
        launch!(s, &self.k.sum_squares, REDUCE_BLOCKS, REDUCE_THREADS;
            gr, mlp.params as u64, self.grad_partial.device_ptr())?;
        let a = &applied_adamw(cfg);
        launch!(s, &self.k.finalize, 1, REDUCE_THREADS;
            self.loss_partial.device_ptr(), REDUCE_BLOCKS, 1.0f32 / (b * out) as f32,
            self.grad_partial.device_ptr(), REDUCE_BLOCKS, 1.0f32 / cfg.nranks as f32,
            a.max_norm, a.beta1, a.beta2, self.scalars.device_ptr(), self.step.device_ptr())?;
        launch!(s, &self.k.adamw, grid_for(mlp.params), THREADS;
            p, gr, self.m.device_ptr(), self.v.device_ptr(), mlp.params as u64,
            self.scalars.device_ptr(), a.lr, a.beta1, a.beta2, a.eps, a.weight_decay)?;
        record_timing(&self.ev.end, s)?;
        Ok(())
    }

    /// The last step's timings (waits for it).
    fn times(&self) -> StepTime {
        let e = &self.ev;
        let ms = |a: &CudaEvent, b: &CudaEvent| a.elapsed_ms(b).map(f64::from).unwrap_or(f64::NAN);
        StepTime {
            step_ms: ms(&e.start, &e.end),
            // Clamped at 0 (event resolution), NaN kept (an unreadable event).
            exposed_ms: {
                let x = ms(&e.bwd_end, &e.after_wait);
                if x < 0.0 { 0.0 } else { x }
            },
            comm_ms: if self.cfg.nranks > 1 {
                ms(&e.comm_start, &e.comm_end)
            } else {
                0.0
            },
        }
    }

    fn scalars(&self) -> Result<Vec<f32>, Error> {
        self.s.synchronize()?;
        let mut v = vec![0.0f32; slot::COUNT];
        self.scalars.copy_to_host(0, &mut v)?;
        Ok(v)
    }

    fn download(&self, buf: &DeviceBuffer) -> Result<Vec<f32>, Error> {
        self.s.synchronize()?;
        self.c.synchronize()?;
        let mut v = vec![0.0f32; self.mlp.params];
        buf.copy_to_host(0, &mut v)?;
        Ok(v)
    }
}

/// How far, relative to the norm, the GPU's global gradient norm may be from the exact norm
/// of the averaged gradient it stands for (`norm_rel` of `cpu::first_step_bounds`), for
/// `params` parameters. `sum_squares` squares (1 rounding), sums each thread's elements
/// serially (at most `params / (REDUCE_BLOCKS * REDUCE_THREADS)` rounded adds, rounded up)
/// and the block's threads in a tree (`log2 REDUCE_THREADS`); `finalize` sums the blocks'
/// partials the same way (`REDUCE_BLOCKS / REDUCE_THREADS` serial adds, rounded up, and the
/// tree). Every term is non-negative, so the sum is within `gamma_k` of the exact sum of
/// squares, `k` the longest chain (Higham, ch. 3; a fused multiply-add only shortens it);
/// the square root halves that relative error. The root, the `1 / n` factor, its product,
/// and the averaged gradient's own rounding (`avg = sum * (1/n)`, against which the
/// gradient bound is stated) add at most four roundings: `gamma_4`.
fn gpu_norm_rel(params: usize) -> f64 {
    let u = f64::from(f32::EPSILON) / 2.0;
    let gamma = |k: f64| k * u / (1.0 - k * u);
    let lanes = (REDUCE_BLOCKS * REDUCE_THREADS) as usize;
    let tree = f64::from(REDUCE_THREADS.ilog2());
    let serial = params.div_ceil(lanes) as f64;
    let partials = REDUCE_BLOCKS.div_ceil(REDUCE_THREADS) as f64;
    let k = 1.0 + serial + tree + partials + tree;
    gamma(k) / 2.0 + gamma(4.0)
}

/// One training run with `comm` (rank 0 alone with `--baseline`: a one-rank
/// configuration, so `comm` is never called).
fn train(
    net: &Net<'_>,
    comm: &Comm<'_>,
    coll: &Collectives,
    ranks: &Ranks,
    mode: &mut Mode<'_>,
) -> Result<RunReport, Error> {
    let cfg = net.cfg;
    let p0 = net.reset()?;
    let label = mode.label(if cfg.nranks > 1 { comm.name() } else { "none" });
    let mut rec = mode.recorder(cfg.nranks);
    let mut grad_check: Option<GradCheck> = None;
    let mut graph = None;
    for step in 0..cfg.steps {
        if step > 0 && cfg.graph && graph.is_none() {
            // Step 0 ran eagerly (cuBLAS and the kernels set up, the gradient checked);
            // from here on the step is one graph.
            net.s.synchronize()?;
            net.s
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            let r = net.step(comm);
            let g = net.s.end_capture(
                CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
            );
            r?;
            let g = g?.ok_or("nothing captured")?;
            g.upload()?;
            graph = Some(g);
        }
        match &graph {
            Some(g) => g.launch()?,
            None => net.step(comm)?,
        }
        rec.step(net.times());
        if step == 0 && cfg.check_grads {
            let mut avg = net.download(&net.grads)?;
            let inv = 1.0 / cfg.nranks as f32;
            for v in &mut avg {
                *v *= inv;
            }
            let tp = net.teacher.init(seeds::teacher(cfg.seed), 1.0);
            let (mut c, first) = check_gradient(cfg, &net.mlp, &p0, &net.teacher, &tp, 0, &avg);
            if ranks.rank == 0 {
                println!(
                    "[{label}] gradient check (step 1, GPU averaged gradient vs CPU reference over the global batch): {} elements, {} outside the bound (k = {}), max |diff|/tol {:.3e}, max |diff| {:.3e}",
                    c.elements, c.violations, c.depth, c.max_ratio, c.max_abs_diff
                );
            }
            if c.violations > 0 {
                return Err(format!(
                    "rank {}: gradient check failed ({label}): {} of {} elements outside the bound",
                    ranks.rank, c.violations, c.elements
                )
                .into());
            }
            let p1 = net.download(&net.params)?;
            let norm_rel = gpu_norm_rel(net.mlp.params);
            c.params = Some(check_first_step(
                &first,
                cfg,
                &p1,
                norm_rel,
                ranks.rank,
                Some(label),
            )?);
            grad_check = Some(c);
        }
        let log = (step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps;
        if log || step == 0 {
            let sc = net.scalars()?;
            let loss = ranks.mean(coll, sc[slot::LOSS] as f64)?;
            if step == 0 {
                rec.first_loss(loss);
            }
            if log {
                rec.line(
                    label,
                    loss,
                    sc[slot::GRAD_NORM] as f64,
                    cfg.batch,
                    ranks.rank == 0,
                );
            }
        }
        mode.between_steps()?;
    }
    let params = net.download(&net.params)?;
    drop(graph);
    crate::finish(cfg, coll, ranks, label, "gpu", &params, rec, grad_check)
}

/// `--baseline` on rank 0: the same training alone (`cfg` and `ranks` are one rank's), on
/// a network of its own that is freed before the multi-rank run allocates its own.
pub fn baseline(
    cfg: &Config,
    coll: &Collectives,
    gpu: &Gpu,
    ranks: &Ranks,
    mode: &mut Mode<'_>,
) -> Result<RunReport, Error> {
    gpu.bind()?;
    let net = Net::new(cfg, gpu, ranks.rank)?;
    train(&net, &Comm::Ours(coll), coll, ranks, mode)
}

/// Trains on this rank's GPU with our all-reduce, then (with `--compare nccl`) again from
/// the same start with NCCL's.
pub fn run(
    cfg: &Config,
    args: &Args,
    coll: &Collectives,
    gpu: &Gpu,
    ranks: &Ranks,
    mode: &mut Mode<'_>,
) -> Result<Vec<RunReport>, Error> {
    gpu.bind()?;
    let net = Net::new(cfg, gpu, ranks.rank)?;
    if ranks.rank == 0 {
        let info = gpu.info();
        println!(
            "{} ranks on {} ({}), {} layers x {} wide: {} parameters ({:.1} MiB of f32 gradients), global batch {} ({} per rank), {} buckets (cap {:.1} MiB, {}), gradients all-reduced as {:?}{}{}{}; cuBLAS {}",
            cfg.nranks,
            info.name,
            ptx_note(),
            cfg.layers,
            cfg.width,
            net.mlp.params,
            net.mlp.params as f64 * 4.0 / 1048576.0,
            cfg.batch,
            cfg.rank_batch,
            net.buckets.len(),
            cfg.bucket_bytes as f64 / 1048576.0,
            if cfg.overlap {
                "overlapped with backward"
            } else {
                "after backward"
            },
            cfg.grad_dtype,
            if cfg.graph { ", CUDA graph" } else { "" },
            cfg.allreduce_blocks
                .map(|b| format!(", all-reduce kernels of <= {b} blocks"))
                .unwrap_or_default(),
            if cfg.tf32 { ", TF32 GEMMs" } else { "" },
            std::env::var(crate::libs::ENV_CUBLAS_FOUND)
                .unwrap_or_else(|_| "from the library path".into())
        );
    }
    let mut out = vec![train(&net, &Comm::Ours(coll), coll, ranks, mode)?];
    if args.compare == Some(Compare::Nccl) {
        let nccl = Nccl::init(coll.communicator().bootstrap(), gpu)?;
        if ranks.rank == 0 {
            println!(
                "NCCL {} ({}): the same training from the same start",
                mscclpp_perf::nccl::version()?,
                mscclpp_perf::nccl::found_path().unwrap_or_else(|| "from the library path".into())
            );
        }
        out.push(train(&net, &Comm::Nccl(&nccl), coll, ranks, mode)?);
    }
    Ok(out)
}

fn ptx_note() -> String {
    let arches = |list: &mut dyn Iterator<Item = u32>| {
        let v: Vec<String> = list.map(|a| format!("sm_{a}")).collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(",")
        }
    };
    format!(
        "kernels: PTX {}, cubin {}",
        arches(&mut ptx::PTX.iter().map(|(a, _)| *a)),
        arches(&mut ptx::CUBIN.iter().map(|(a, _)| *a))
    )
}
