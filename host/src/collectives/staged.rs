//! Staged reductions: the reductions of the 8-bit float types and the pre-multiplied sums
//! ([`ReduceOp::PreMulSum`]) run as an element-wise pass into a staging buffer, an ordinary
//! collective over it, and (fp8) a pass back (the device crate's `collectives::staging`).
//!
//! - **fp8** ([`DataType::Fp8E4M3`], [`DataType::Fp8E5M2`], every operation): the inputs are
//!   widened to f32 (times the scalar for a pre-multiplied sum, exactly), the collective
//!   reduces f32 (sums in rank order, per host then in host order across hosts, as for f32),
//!   and each result is rounded to fp8 once, to nearest even and saturating to the largest
//!   finite value (as CUDA's `__NV_SATFINITE`; NaN stays NaN). So every algorithm, across
//!   hosts too, keeps the wider type between its steps: no partial sum is stored in fp8.
//!   The price is four bytes on the wire per element, not one.
//! - **Pre-multiplied sums** of the other types: each rank's input times its own scalar, in
//!   the type (as NCCL: the product rounded to the type), then the sum of those in rank
//!   order. An all-reduce scales into the output and reduces it in place (no staging); a
//!   reduce-scatter or reduce scales into the staging buffer.
//!
//! The staging buffer holds [`STAGING_BYTES`] (device memory on a GPU, allocated by the
//! first staged call and kept; a call needing it first under CUDA graph capture is refused:
//! make one such call before capturing). Larger calls run in pieces, one collective per
//! piece, cut alike on every rank. The call descriptors name the call's own type and
//! operation ("all_reduce (premulsum) with 4096 fp8e4m3 (in f32) ..."), per piece.

use std::cell::Cell;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{LaunchConfig, PushKernelArg};
use mscclpp_device::collectives::desc;
use mscclpp_device::collectives::staging::mode;
use mscclpp_device::kernels::staging as k;

use super::cross::Exec;
use super::descriptor::dtype_code;
use super::{AllReduceAlgo, Collectives, DataType, Element, ReduceOp, gpu};
use crate::communicator::CommError;
use crate::cuda::{CudaFunction, DeviceBuffer};

/// Bytes of the staging buffer of a communicator (device memory on a GPU, allocated at the
/// first staged call).
pub const STAGING_BYTES: usize = 16 << 20;

/// The scalar of a pre-multiplied sum ([`ReduceOp::PreMulSum`]): one element of the call's
/// data type, each rank its own (NCCL's `ncclRedOpCreatePreMulSum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreMulScalar {
    /// A value given now (NCCL's `ncclScalarHostImmediate`): the element's bits in the low
    /// bytes of `bits`, of type `dtype`.
    Host {
        /// The scalar's type (the call's must equal it).
        dtype: DataType,
        /// Its bits (little-endian low bytes).
        bits: u64,
    },
    /// An element in memory read when the call runs (NCCL's `ncclScalarDevice`): a device
    /// address on a GPU (read by the GPU, in stream order, so it may change between CUDA
    /// graph replays), a host address on the Host backend. It must stay valid until then.
    Device {
        /// The scalar's type (the call's must equal it).
        dtype: DataType,
        /// Its address.
        ptr: u64,
    },
}

impl PreMulScalar {
    /// The scalar's type.
    pub fn dtype(self) -> DataType {
        match self {
            PreMulScalar::Host { dtype, .. } | PreMulScalar::Device { dtype, .. } => dtype,
        }
    }
}

impl ReduceOp {
    /// A pre-multiplied sum with the host scalar `scalar`: every rank's input times its own
    /// scalar, then summed (`ReduceOp::pre_mul_sum(0.5f32)` averages two ranks' f32).
    pub fn pre_mul_sum<T: Element>(scalar: T) -> ReduceOp {
        const { assert!(std::mem::size_of::<T>() <= 8) };
        let mut bits = 0u64;
        // SAFETY: T is Copy, at most 8 bytes (checked above), plain data of a reducing type;
        // its bytes land in the low bytes of `bits` (little-endian, as the kernels read).
        unsafe {
            std::ptr::copy_nonoverlapping(
                &scalar as *const T as *const u8,
                &mut bits as *mut u64 as *mut u8,
                std::mem::size_of::<T>(),
            )
        };
        ReduceOp::PreMulSum(PreMulScalar::Host {
            dtype: T::DTYPE,
            bits,
        })
    }

    /// A pre-multiplied sum whose scalar (one element of `dtype`) is read at `ptr` when the
    /// call runs (device memory on a GPU; see [`PreMulScalar::Device`]).
    pub fn pre_mul_sum_at(dtype: DataType, ptr: u64) -> ReduceOp {
        ReduceOp::PreMulSum(PreMulScalar::Device { dtype, ptr })
    }
}

/// 8-bit float e4m3 (`ncclFloat8e4m3`, CUDA's `__nv_fp8_e4m3`): its bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Fp8E4M3(pub u8);
/// 8-bit float e5m2 (`ncclFloat8e5m2`, CUDA's `__nv_fp8_e5m2`): its bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Fp8E5M2(pub u8);

macro_rules! fp8_type {
    ($t:ident, $k:ident) => {
        impl $t {
            /// `x` rounded to nearest even, saturated to the largest finite value.
            pub fn from_f32(x: f32) -> $t {
                $t(mscclpp_device::collectives::fp8::from_f32(
                    mscclpp_device::collectives::fp8::Fp8::$k,
                    x,
                ))
            }
            /// The value, exactly.
            pub fn to_f32(self) -> f32 {
                mscclpp_device::collectives::fp8::to_f32(
                    mscclpp_device::collectives::fp8::Fp8::$k,
                    self.0,
                )
            }
        }
        impl Element for $t {
            const DTYPE: DataType = DataType::$t;
        }
        // SAFETY: one byte, any bit pattern valid.
        unsafe impl cudarc::driver::DeviceRepr for $t {}
        // SAFETY: zero is the value +0.
        unsafe impl cudarc::driver::ValidAsZeroBits for $t {}
    };
}
fp8_type!(Fp8E4M3, E4M3);
fp8_type!(Fp8E5M2, E5M2);

/// Whether a reduction of `dtype` with `op` is staged (see the [module](self)).
pub(super) fn is_staged(dtype: DataType, op: ReduceOp) -> bool {
    is_fp8(dtype) || matches!(op, ReduceOp::PreMulSum(_))
}

fn is_fp8(dtype: DataType) -> bool {
    matches!(dtype, DataType::Fp8E4M3 | DataType::Fp8E5M2)
}

thread_local! {
    /// While a staged call runs its collective: the inner type and operation it passes to
    /// the collective, and the call's own, which [`dtype_code`] and [`op_desc`] give for
    /// those (and only those) instead.
    static DESCRIBED_AS: Cell<Option<Describing>> = const { Cell::new(None) };
}

/// The type a call descriptor names for `dtype`: the staged call's own for its inner type
/// while its collective runs on this thread ([`DESCRIBED_AS`]), else `dtype`.
pub(super) fn described_dtype(dtype: DataType) -> DataType {
    match DESCRIBED_AS.with(Cell::get) {
        Some(d) if d.inner.0 == dtype => d.outer.0,
        _ => dtype,
    }
}

/// The operation a call descriptor names for `op`, as [`described_dtype`]. Only the inner
/// operation is renamed: a step that reduces with another one (the sum of an average across
/// hosts, divided once at the end) keeps its own, since the kernels reduce by it.
pub(super) fn described_op(op: ReduceOp) -> ReduceOp {
    match DESCRIBED_AS.with(Cell::get) {
        Some(d) if d.inner.1 == op => d.outer.1,
        _ => op,
    }
}

/// The staged call's inner and own (type, operation); sets [`DESCRIBED_AS`] while alive.
#[derive(Debug, Clone, Copy)]
struct Describing {
    inner: (DataType, ReduceOp),
    outer: (DataType, ReduceOp),
}

impl Describing {
    fn set(inner: (DataType, ReduceOp), outer: (DataType, ReduceOp)) -> DescribingGuard {
        DESCRIBED_AS.with(|c| c.set(Some(Describing { inner, outer })));
        DescribingGuard
    }
}

/// Clears [`DESCRIBED_AS`] when dropped.
struct DescribingGuard;

impl Drop for DescribingGuard {
    fn drop(&mut self) {
        DESCRIBED_AS.with(|c| c.set(None));
    }
}

/// A communicator's staging buffer and pass kernel (see the [module](self)).
#[derive(Debug)]
pub(super) struct Staging {
    /// Bytes per piece ([`STAGING_BYTES`]; smaller in tests, equal on every rank).
    capacity: usize,
    /// The GPU's buffer, once allocated.
    buffer: Mutex<Option<DeviceBuffer>>,
    function: OnceLock<CudaFunction>,
}

impl Staging {
    pub(super) fn new() -> Staging {
        Staging {
            capacity: STAGING_BYTES,
            buffer: Mutex::new(None),
            function: OnceLock::new(),
        }
    }
}

/// The reducing collectives a staged call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Staged {
    AllReduce,
    ReduceScatter,
    Reduce(usize),
}

impl Staged {
    fn name(self) -> &'static str {
        match self {
            Staged::AllReduce => "all_reduce",
            Staged::ReduceScatter => "reduce_scatter",
            Staged::Reduce(_) => "reduce",
        }
    }
}

/// Where the staging lives during one call: device memory or a host vector.
enum Area {
    Gpu(u64),
    Host(Vec<u64>),
}

impl Area {
    fn ptr(&mut self) -> u64 {
        match self {
            Area::Gpu(p) => *p,
            Area::Host(v) => v.as_mut_ptr() as u64,
        }
    }
}

impl Collectives {
    /// Sets the staging piece size (tests: many pieces with small calls). Every rank must
    /// set the same.
    #[cfg(test)]
    pub(super) fn set_staging_capacity(&mut self, bytes: usize) {
        self.staging.capacity = bytes.max(64);
    }

    /// Runs a staged reduction (see the [module](self)): `count` elements per rank of the
    /// output (all-reduce and reduce: of the input too; reduce-scatter: `send` holds
    /// `nranks * count`), `recv` written on the root only for a reduce.
    ///
    /// # Safety
    /// `send` and `recv` valid memory of `ex`'s kind for those elements (until the stream
    /// ran the call on a GPU), not written by others meanwhile; in place as the collective
    /// allows.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn staged(
        &self,
        ex: Exec<'_>,
        what: Staged,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = ex.name(what.name());
        if let ReduceOp::PreMulSum(s) = op
            && s.dtype() != dtype
        {
            return Err(CommError::InvalidArgument(format!(
                "{call}: the pre-multiplied sum's scalar is {}, the data {dtype}",
                s.dtype()
            )));
        }
        let rank = self.rank();
        let es = dtype.size();
        let blocks = if what == Staged::ReduceScatter {
            self.nranks()
        } else {
            1
        };
        // The staging passes share one buffer: the whole sequence (widen, collective, narrow)
        // is ordered after the communicator's previous calls, whatever their streams.
        let _order = self.staged_checks(ex, call, what, send, recv, count, dtype)?;
        if count == 0 {
            let kind = match what {
                Staged::AllReduce => desc::ALL_REDUCE,
                Staged::ReduceScatter => desc::REDUCE_SCATTER,
                Staged::Reduce(_) => desc::REDUCE,
            };
            let root = match what {
                Staged::Reduce(r) => Some(r),
                _ => None,
            };
            return self.empty_call(ex, call, kind, dtype, Some(op), root);
        }
        let fp8 = is_fp8(dtype);
        let scalar = match op {
            ReduceOp::PreMulSum(PreMulScalar::Host { bits, .. }) => Some((bits, 0)),
            ReduceOp::PreMulSum(PreMulScalar::Device { ptr, .. }) => Some((0, ptr)),
            _ => None,
        };
        let inner_op = match op {
            ReduceOp::PreMulSum(_) => ReduceOp::Sum,
            o => o,
        };
        let (inner_dtype, ses) = if fp8 { (DataType::F32, 4) } else { (dtype, es) };
        let code = dtype_code(dtype);
        let pre = match (fp8, scalar) {
            (true, Some(_)) => mode::WIDEN | mode::SCALED,
            (true, None) => mode::WIDEN,
            (false, _) => mode::PRE_MUL | mode::SCALED,
        } | code;
        let (bits, sptr) = scalar.unwrap_or((0, 0));
        let _describing = Describing::set((inner_dtype, inner_op), (dtype, op));
        if what == Staged::AllReduce && !fp8 {
            // Scale into the output, then sum it in place: no staging.
            // SAFETY: send and recv hold count elements (caller contract); equal or
            // disjoint, and the pass reads each element before writing it.
            unsafe { self.stage_pass(ex, call, send, recv, count, pre, bits, sptr)? };
            // SAFETY: recv holds count elements.
            return unsafe {
                self.staged_collective(ex, what, recv, recv, count, inner_dtype, inner_op)
            };
        }
        let piece = (self.staging.capacity / (ses * blocks)).max(1).min(count);
        let mut area = self.staging_area(ex, call, piece * ses * blocks)?;
        let st = area.ptr();
        let mut off = 0;
        while off < count {
            let c = piece.min(count - off);
            for q in 0..blocks {
                let src = send + ((q * count + off) * es) as u64;
                let dst = st + (q * c * ses) as u64;
                // SAFETY: c elements of block q of send (caller contract) and of the
                // staging area (sized for blocks * piece elements of ses bytes).
                unsafe { self.stage_pass(ex, call, src, dst, c, pre, bits, sptr)? };
            }
            // SAFETY: the staging area holds blocks * c elements of the inner type.
            unsafe { self.staged_collective(ex, what, st, st, c, inner_dtype, inner_op)? };
            let (from, out) = match what {
                Staged::AllReduce => (st, true),
                Staged::ReduceScatter => (st + (rank * c * ses) as u64, true),
                Staged::Reduce(root) => (st, rank == root),
            };
            if out {
                let to = recv + (off * es) as u64;
                if fp8 {
                    // SAFETY: c f32 results in the area, c fp8 elements of recv.
                    unsafe { self.stage_pass(ex, call, from, to, c, mode::NARROW | code, 0, 0)? };
                } else {
                    // SAFETY: c elements of es bytes each.
                    unsafe { self.x_copy(ex, to, from, c * es)? };
                }
            }
            off += c;
        }
        drop(area);
        Ok(())
    }

    /// The checks of a staged call `call` (see [`staged`](Self::staged)): on a GPU, the
    /// stream, the fault state and the buffers' ranges, then the ordering guard that the
    /// whole call holds; a reduce's root.
    #[allow(clippy::too_many_arguments)]
    fn staged_checks(
        &self,
        ex: Exec<'_>,
        call: &str,
        what: Staged,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
    ) -> Result<Option<super::order::Ordered<'_>>, CommError> {
        let (n, rank) = (self.nranks(), self.rank());
        let es = dtype.size();
        let blocks = if what == Staged::ReduceScatter { n } else { 1 };
        let mut order = None;
        if let Exec::Gpu(stream) = ex {
            self.gpu_kernels(call)?;
            self.check_fault(call, false)?;
            self.noted(gpu::check_stream(call, self.gpu().expect("GPU"), stream))?;
            order = Some(self.ordered(call, stream)?);
            if count > 0 {
                let bytes = super::checked_bytes(call, count, es)?;
                gpu::check_range(&format!("{call}: send"), send, bytes * blocks, es)?;
                let out = match what {
                    Staged::Reduce(root) => rank == root,
                    _ => true,
                };
                if out {
                    gpu::check_range(&format!("{call}: recv"), recv, bytes, es)?;
                }
            }
        } else {
            self.host_only(call)?;
        }
        if let Staged::Reduce(root) = what
            && root >= n
        {
            return Err(CommError::InvalidArgument(format!(
                "{call}: root {root} is out of range (0..{})",
                n - 1
            )));
        }
        Ok(order)
    }

    /// The collective of a staged call, in place over `buf` (`count` elements per rank of
    /// the output of `dtype`), reducing with `op`.
    ///
    /// # Safety
    /// `buf` holds the collective's input (reduce-scatter: `nranks * count`).
    #[allow(clippy::too_many_arguments)]
    unsafe fn staged_collective(
        &self,
        ex: Exec<'_>,
        what: Staged,
        buf: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let rank_off = (self.rank() * count * dtype.size()) as u64;
        // SAFETY (each): forwarded (caller contract); reduce-scatter in place at this
        // rank's block.
        match (ex, what) {
            (_, Staged::AllReduce) => unsafe {
                self.all_reduce_at(ex, buf, recv, count, dtype, op, AllReduceAlgo::Auto)
            },
            (Exec::Gpu(s), Staged::ReduceScatter) => unsafe {
                self.reduce_scatter_device(buf, buf + rank_off, count, dtype, op, s)
            },
            (Exec::Gpu(s), Staged::Reduce(root)) => unsafe {
                self.reduce_device(buf, recv, count, dtype, op, root, s)
            },
            (Exec::Host, Staged::ReduceScatter) => unsafe {
                self.host_reduce_scatter_raw(buf, buf + rank_off, count, dtype, op)
            },
            (Exec::Host, Staged::Reduce(root)) => unsafe {
                self.host_reduce_raw(buf, recv, count, dtype, op, root)
            },
        }
    }

    /// The staging area of a call: the GPU's buffer (allocated now if none yet: refused
    /// under graph capture), or a host vector.
    fn staging_area(&self, ex: Exec<'_>, call: &str, bytes: usize) -> Result<Area, CommError> {
        let Exec::Gpu(stream) = ex else {
            return Ok(Area::Host(vec![0u64; bytes.div_ceil(8)]));
        };
        let mut b = self
            .staging
            .buffer
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if b.is_none() {
            if gpu::is_capturing(stream) {
                return Err(CommError::InvalidArgument(format!(
                    "{call}: fp8 reductions and pre-multiplied sums need the communicator's \
                     staging buffer ({} bytes of device memory), allocated by the first such \
                     call; that call cannot be under CUDA graph capture: make one before \
                     capturing",
                    self.staging.capacity
                )));
            }
            let gpu = self.gpu().expect("GPU backend");
            *b =
                Some(self.noted(
                    DeviceBuffer::alloc(gpu, self.staging.capacity).map_err(CommError::from),
                )?);
        }
        Ok(Area::Gpu(b.as_ref().expect("allocated").device_ptr()))
    }

    /// Runs the element pass `mode` over `count` elements from `src` to `dst`.
    ///
    /// # Safety
    /// The ranges valid for the pass (see `staging::pass`) in memory of `ex`'s kind.
    #[allow(clippy::too_many_arguments)]
    unsafe fn stage_pass(
        &self,
        ex: Exec<'_>,
        call: &str,
        src: u64,
        dst: u64,
        count: usize,
        mode: u64,
        bits: u64,
        sptr: u64,
    ) -> Result<(), CommError> {
        let count = count as u64;
        let Exec::Gpu(stream) = ex else {
            // SAFETY: caller contract; this thread takes every element.
            unsafe {
                k::stage_elements(
                    src as *const u8,
                    dst as *mut u8,
                    count,
                    mode,
                    bits,
                    sptr as *const u8,
                )
            };
            return Ok(());
        };
        let kernels = self.gpu_kernels(call)?;
        let f = match self.staging.function.get() {
            Some(f) => f,
            None => {
                let f = self.noted(kernels.function("stage_elements").map_err(CommError::from))?;
                self.staging.function.get_or_init(|| f)
            }
        };
        let threads = 512u32;
        let blocks = count.div_ceil(threads as u64).clamp(1, 1024) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(f);
        l.arg(&src)
            .arg(&dst)
            .arg(&count)
            .arg(&mode)
            .arg(&bits)
            .arg(&sptr);
        // SAFETY: the arguments match `stage_elements(*const u8, *mut u8, u64, u64, u64,
        // *const u8)`; the ranges are valid (caller contract).
        self.noted(
            unsafe { l.launch(cfg) }
                .map(|_| ())
                .map_err(|e| gpu::classify("launch", "cuLaunchKernel", e)),
        )
    }
}

#[cfg(test)]
#[path = "staged_tests.rs"]
mod tests;
