//! Result checking: inputs derived from rank and index, the expected output computed on the
//! host, and the count of mismatching elements (`#wrong`).
//!
//! Inputs are small integers: every partial sum of an all-reduce stays an integer no larger
//! than the type holds exactly (2^24 for float, 2048 for half, 256 for bfloat16), so a
//! correct result is exact in any summation order and the tolerance is only a margin.

use half::{bf16, f16};

use crate::host::collectives::{DataType, Element};

use super::args::Collective;

/// An element type the tool can fill and check.
pub trait Elem: Element + Default + std::fmt::Debug {
    /// From an `f32` (exact for the values used here).
    fn from_f32(v: f32) -> Self;
    /// To an `f32`.
    fn to_f32(self) -> f32;
}

impl Elem for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Elem for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Elem for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// The largest integer magnitude up to which every integer is exact in `dtype`.
pub fn exact_limit(dtype: DataType) -> u64 {
    match dtype {
        DataType::F32 => 1 << 24,
        DataType::F16 => 1 << 11,
        DataType::Bf16 => 1 << 8,
        DataType::F64 => 1 << 53,
        DataType::I8 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => 1 << 3,
        DataType::U8 => 1 << 7,
        DataType::I32 | DataType::U32 | DataType::I64 | DataType::U64 => 1 << 24,
    }
}

/// Relative tolerance of the check: a margin only (correct results are exact), kept below
/// one unit at the largest result the inputs make (at most 16 per rank, and at most
/// [`exact_limit`]), so an integer off by one always counts as wrong.
pub fn tolerance(dtype: DataType) -> f32 {
    match dtype {
        DataType::F32 => 1e-6,
        DataType::F16 => 2e-4,
        DataType::Bf16 => 2e-3,
        _ => 1e-6,
    }
}

/// Input element `index` of `rank`'s send buffer.
pub fn input_value(
    collective: Collective,
    dtype: DataType,
    nranks: usize,
    rank: usize,
    index: u64,
) -> f32 {
    // Magnitude bound: the reductions sum `nranks` of them, the others copy them.
    let bound = if collective.reduces() {
        (exact_limit(dtype) / nranks.max(1) as u64).clamp(1, 16)
    } else {
        127
    };
    let modulus = 2 * bound + 1;
    let v = (index.wrapping_mul(7) + (rank as u64).wrapping_mul(13)) % modulus;
    v as f32 - bound as f32
}

/// Fills `out` with `rank`'s inputs.
pub fn fill<T: Elem>(collective: Collective, nranks: usize, rank: usize, out: &mut [T]) {
    for (i, x) in out.iter_mut().enumerate() {
        *x = T::from_f32(input_value(collective, T::DTYPE, nranks, rank, i as u64));
    }
}

/// Expected element `index` of the output (all-gather: of the whole `nranks * send_count`
/// buffer).
pub fn expected(
    collective: Collective,
    dtype: DataType,
    nranks: usize,
    send_count: u64,
    index: u64,
) -> f32 {
    expected_at(collective, dtype, nranks, 0, 0, send_count, index).unwrap_or(f32::NAN)
}

/// Expected element `index` of rank `rank`'s output (`root`: of broadcast and reduce);
/// `None` where nothing is expected (a reduce's other ranks).
pub fn expected_at(
    collective: Collective,
    dtype: DataType,
    nranks: usize,
    rank: usize,
    root: usize,
    send_count: u64,
    index: u64,
) -> Option<f32> {
    let n = nranks.max(1);
    let v = |r: usize, i: u64| input_value(collective, dtype, nranks, r, i);
    let sum = |i: u64| -> f32 { (0..nranks).map(|r| v(r, i)).sum() };
    // Elements per block of the input (reduce-scatter, all-to-all).
    let per = send_count / n as u64;
    Some(match collective {
        Collective::AllReduce => sum(index),
        Collective::AllGather => {
            let r = (index / send_count.max(1)) as usize;
            v(r, index % send_count.max(1))
        }
        Collective::ReduceScatter => sum(rank as u64 * per + index),
        Collective::Reduce if rank == root => sum(index),
        Collective::Reduce => return None,
        Collective::Broadcast => v(root, index),
        Collective::AllToAll => v(
            (index / per.max(1)) as usize,
            rank as u64 * per + index % per.max(1),
        ),
        Collective::SendRecv => v((rank + n - 1) % n, index),
    })
}

/// Whether `got` passes for `want`.
pub fn matches(dtype: DataType, got: f32, want: f32) -> bool {
    (got - want).abs() <= tolerance(dtype) * want.abs().max(1.0)
}

/// Elements of `got` (an output buffer) that differ from [`expected`]; NaN never matches.
pub fn count_wrong<T: Elem>(
    collective: Collective,
    nranks: usize,
    send_count: u64,
    got: &[T],
) -> u64 {
    got.iter()
        .enumerate()
        .filter(|(i, g)| {
            let want = expected(collective, T::DTYPE, nranks, send_count, *i as u64);
            !matches(T::DTYPE, g.to_f32(), want)
        })
        .count() as u64
}

/// Elements of rank `rank`'s output `got` that differ from [`expected_at`] (elements with
/// nothing expected are not counted).
pub fn count_wrong_at<T: Elem>(
    collective: Collective,
    nranks: usize,
    rank: usize,
    root: usize,
    send_count: u64,
    got: &[T],
) -> u64 {
    got.iter()
        .enumerate()
        .filter(|(i, g)| {
            expected_at(
                collective,
                T::DTYPE,
                nranks,
                rank,
                root,
                send_count,
                *i as u64,
            )
            .is_some_and(|want| !matches(T::DTYPE, g.to_f32(), want))
        })
        .count() as u64
}
