//! Result checking: inputs derived from rank and index, the expected output computed on the
//! host, and the count of mismatching elements (`#wrong`).
//!
//! The reference ([`Reference`]) applies the library's definitions (see
//! `mscclpp_device::collectives::types` and `mscclpp::host::collectives::staged`) in rank
//! order, written here independently on Rust's own types: sums and products rounded in the
//! type (integers wrap), min and max by IEEE `totalOrder` with ties keeping the earlier rank's
//! value, average as the sum divided once at the end (f16 and bf16 through an f32 quotient,
//! integers truncating toward zero), a pre-multiplied sum (`mulsum`) as each rank's input
//! times its scalar ([`premul_scalar`]) in the type, then the sum. fp8 reductions widen every
//! input to f32 (times the scalar, exactly, for `mulsum`), apply the operation in f32 and
//! round the result once to fp8 (the library's own conversions, [`Fp8E4M3`] and [`Fp8E5M2`]:
//! nearest even, saturating).
//!
//! Inputs are chosen, as nccl-tests does, so that a correct result does not depend on the
//! summation order: floats take small integers (every partial sum stays below what the type
//! holds exactly: 2^24 for float, 2048 for half, 256 for bfloat16, halved for `mulsum`, whose
//! scalars reach 2), or for products ±1, ±2 and ±1/2 on at most eight ranks (exact powers of
//! two); min and max see both signed zeros. fp8 sums take non-negative fp8 values of 1/16 to
//! 256 (or zero), whose f32 sums are exact and do not reach the type's largest value, but
//! round to fp8 at the end; fp8 products ±{1/2, 3/4, 1, 3/2, 2}, min and max any finite fp8
//! value. Integer inputs span the whole type, so sums and products wrap. Moved data (every
//! type of the non-reducing collectives) is compared bit for bit.
//!
//! This library's results are compared bit for bit ([`Strictness::Exact`]). NCCL's
//! ([`Strictness::Nccl`]) by value: NCCL's min and max may return either zero of a
//! ±0 tie, its float average multiplies each input by `1/nranks` before the sum, so that
//! one is allowed a few units in the last place, and its fp8 reductions round every step to
//! fp8, so those are allowed one unit in the last place per rank.

use half::{bf16, f16};

use crate::host::collectives::{DataType, Element, Fp8E4M3, Fp8E5M2, ReduceOp};

use super::args::{Collective, Redop};

/// An element type the tool can fill and check, seen as its bits (the low
/// `size_of::<Self>()` bytes of a `u64`).
pub trait Elem: Element + Default + std::fmt::Debug {
    /// The bits of this element.
    fn to_bits(self) -> u64;
    /// The element of these bits (higher bits ignored).
    fn from_bits(bits: u64) -> Self;
}

macro_rules! int_elem {
    ($($t:ty, $u:ty);*) => {$(
        impl Elem for $t {
            fn to_bits(self) -> u64 {
                self as $u as u64
            }
            fn from_bits(bits: u64) -> Self {
                bits as $u as $t
            }
        }
    )*};
}
int_elem!(i8, u8; u8, u8; i32, u32; u32, u32; i64, u64; u64, u64);

impl Elem for Fp8E4M3 {
    fn to_bits(self) -> u64 {
        self.0 as u64
    }
    fn from_bits(bits: u64) -> Self {
        Fp8E4M3(bits as u8)
    }
}

impl Elem for Fp8E5M2 {
    fn to_bits(self) -> u64 {
        self.0 as u64
    }
    fn from_bits(bits: u64) -> Self {
        Fp8E5M2(bits as u8)
    }
}

impl Elem for f32 {
    fn to_bits(self) -> u64 {
        f32::to_bits(self) as u64
    }
    fn from_bits(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
}

impl Elem for f64 {
    fn to_bits(self) -> u64 {
        f64::to_bits(self)
    }
    fn from_bits(bits: u64) -> Self {
        f64::from_bits(bits)
    }
}

impl Elem for f16 {
    fn to_bits(self) -> u64 {
        f16::to_bits(self) as u64
    }
    fn from_bits(bits: u64) -> Self {
        f16::from_bits(bits as u16)
    }
}

impl Elem for bf16 {
    fn to_bits(self) -> u64 {
        bf16::to_bits(self) as u64
    }
    fn from_bits(bits: u64) -> Self {
        bf16::from_bits(bits as u16)
    }
}

/// Whether `dtype` is one of the floats the collectives reduce.
pub fn is_float(dtype: DataType) -> bool {
    matches!(
        dtype,
        DataType::F32 | DataType::F16 | DataType::Bf16 | DataType::F64
    )
}

/// Whether `dtype` is an 8-bit float (reduced through f32).
pub fn is_fp8(dtype: DataType) -> bool {
    matches!(dtype, DataType::Fp8E4M3 | DataType::Fp8E5M2)
}

/// The value of fp8 bits, exactly (the library's conversion).
pub fn fp8_to_f32(dtype: DataType, bits: u64) -> f32 {
    match dtype {
        DataType::Fp8E4M3 => Fp8E4M3(bits as u8).to_f32(),
        DataType::Fp8E5M2 => Fp8E5M2(bits as u8).to_f32(),
        _ => unreachable!("fp8_to_f32 of an fp8 type"),
    }
}

/// `x` rounded once to the fp8 type `dtype` (the library's conversion: nearest even,
/// saturating to the largest finite value, NaN kept), as bits.
pub fn fp8_from_f32(dtype: DataType, x: f32) -> u64 {
    match dtype {
        DataType::Fp8E4M3 => Fp8E4M3::from_f32(x).0 as u64,
        DataType::Fp8E5M2 => Fp8E5M2::from_f32(x).0 as u64,
        _ => unreachable!("fp8_from_f32 of an fp8 type"),
    }
}

/// Explicit mantissa bits of an fp8 type.
fn fp8_mantissa_bits(dtype: DataType) -> i32 {
    if dtype == DataType::Fp8E4M3 { 3 } else { 2 }
}

/// The distance from `x` to the next fp8 value of `dtype` away from zero (subnormals: the
/// smallest step).
fn fp8_ulp(dtype: DataType, x: f64) -> f64 {
    let min_normal_exp = if dtype == DataType::Fp8E4M3 { -6 } else { -14 };
    let exp = if x == 0.0 {
        min_normal_exp
    } else {
        (x.abs().log2().floor() as i32).max(min_normal_exp)
    };
    2f64.powi(exp - fp8_mantissa_bits(dtype))
}

/// The scalar of rank `rank`'s pre-multiplied sum (`-o mulsum`), as bits of `dtype`:
/// nccl-tests' `ncclVerifiablePremulScalar`, 1 on even ranks and 2 on odd ones (exact in
/// every type, so products stay exact).
pub fn premul_scalar(dtype: DataType, rank: usize) -> u64 {
    let v = if rank.is_multiple_of(2) { 1.0 } else { 2.0 };
    match dtype {
        d if is_float(d) => float_bits(d, v),
        d if is_fp8(d) => fp8_from_f32(d, v as f32),
        _ => v as u64,
    }
}

/// The largest integer magnitude up to which every integer is exact in a float `dtype`
/// (integers: their whole range is exact; this bounds nothing).
pub fn exact_limit(dtype: DataType) -> u64 {
    match dtype {
        DataType::F32 => 1 << 24,
        DataType::F16 => 1 << 11,
        DataType::Bf16 => 1 << 8,
        DataType::F64 => 1 << 53,
        _ => u64::MAX,
    }
}

/// Mask of a `dtype` element's bits.
fn mask(dtype: DataType) -> u64 {
    match dtype.size() {
        8 => u64::MAX,
        s => (1u64 << (8 * s)) - 1,
    }
}

/// splitmix64 of (index, rank): well-spread input bits.
fn mix(index: u64, rank: usize) -> u64 {
    let mut z = index
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add((rank as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The bits of `v` in the float type `dtype` (exact for the values used here).
fn float_bits(dtype: DataType, v: f64) -> u64 {
    match dtype {
        DataType::F32 => (v as f32).to_bits() as u64,
        DataType::F64 => v.to_bits(),
        DataType::F16 => f16::from_f64(v).to_bits() as u64,
        DataType::Bf16 => bf16::from_f64(v).to_bits() as u64,
        _ => unreachable!("float_bits of a float type"),
    }
}

/// The value of float bits as an f64 (exact).
fn float_value(dtype: DataType, b: u64) -> f64 {
    match dtype {
        DataType::F32 => f32::from_bits(b as u32) as f64,
        DataType::F64 => f64::from_bits(b),
        DataType::F16 => f16::from_bits(b as u16).to_f64(),
        DataType::Bf16 => bf16::from_bits(b as u16).to_f64(),
        _ => unreachable!("float_value of a float type"),
    }
}

/// `op` on two elements of `dtype` (average and pre-multiplied sum: the sum), as the library
/// defines it.
pub fn combine(dtype: DataType, op: ReduceOp, a: u64, b: u64) -> u64 {
    use std::cmp::Ordering::{Greater, Less};
    macro_rules! float {
        ($t:ty, $from:expr, $to:expr) => {{
            let (x, y): ($t, $t) = ($from(a), $from(b));
            let r = match op {
                ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => x + y,
                ReduceOp::Prod => x * y,
                ReduceOp::Min => {
                    if y.total_cmp(&x) == Less {
                        y
                    } else {
                        x
                    }
                }
                ReduceOp::Max => {
                    if y.total_cmp(&x) == Greater {
                        y
                    } else {
                        x
                    }
                }
            };
            $to(r)
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let (x, y) = (<$t>::from_bits(a), <$t>::from_bits(b));
            let r = match op {
                ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => x.wrapping_add(y),
                ReduceOp::Prod => x.wrapping_mul(y),
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
            };
            r.to_bits()
        }};
    }
    match dtype {
        DataType::F32 => float!(f32, |b: u64| f32::from_bits(b as u32), |r: f32| r.to_bits()
            as u64),
        DataType::F64 => float!(f64, f64::from_bits, f64::to_bits),
        // Exact in f32, rounded once to the type (half's arithmetic goes through f32).
        DataType::F16 => float!(f16, |b: u64| f16::from_bits(b as u16), |r: f16| r.to_bits()
            as u64),
        DataType::Bf16 => float!(
            bf16,
            |b: u64| bf16::from_bits(b as u16),
            |r: bf16| r.to_bits() as u64
        ),
        DataType::I8 => int!(i8),
        DataType::U8 => int!(u8),
        DataType::I32 => int!(i32),
        DataType::U32 => int!(u32),
        DataType::I64 => int!(i64),
        DataType::U64 => int!(u64),
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => {
            unreachable!("fp8 reduces through f32: see `reduce`")
        }
    }
}

/// The last step of `op` on a combined element: average divides once by `nranks`.
pub fn finish(dtype: DataType, op: ReduceOp, a: u64, nranks: usize) -> u64 {
    if op != ReduceOp::Avg {
        return a;
    }
    let n = nranks as u64;
    match dtype {
        DataType::F32 => (f32::from_bits(a as u32) / n as f32).to_bits() as u64,
        DataType::F64 => (f64::from_bits(a) / n as f64).to_bits(),
        DataType::F16 => {
            f16::from_f32(f16::from_bits(a as u16).to_f32() / n as f32).to_bits() as u64
        }
        DataType::Bf16 => {
            bf16::from_f32(bf16::from_bits(a as u16).to_f32() / n as f32).to_bits() as u64
        }
        DataType::I8 => (i8::from_bits(a) / n as i8).to_bits(),
        DataType::U8 => (u8::from_bits(a) / n as u8).to_bits(),
        DataType::I32 => (i32::from_bits(a) / n as i32).to_bits(),
        DataType::U32 => (u32::from_bits(a) / n as u32).to_bits(),
        DataType::I64 => (i64::from_bits(a) / n as i64).to_bits(),
        DataType::U64 => (a / n).to_bits(),
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => {
            unreachable!("fp8 reduces through f32: see `reduce`")
        }
    }
}

/// `op` over `nranks` inputs of `dtype` (rank r's is `input(r)`), as the library defines it:
/// a pre-multiplied sum scales each input by its rank's [`premul_scalar`] first; fp8 widens
/// to f32, reduces in f32 (in rank order) and rounds the result once.
pub fn reduce(dtype: DataType, op: Redop, nranks: usize, input: impl Fn(usize) -> u64) -> u64 {
    let fp8 = is_fp8(dtype);
    let acc_type = if fp8 { DataType::F32 } else { dtype };
    let combining = op.combining();
    let lifted = |rank: usize| {
        let bits = input(rank);
        let v = if fp8 {
            fp8_to_f32(dtype, bits).to_bits() as u64
        } else {
            bits
        };
        if op == Redop::MulSum {
            combine(acc_type, ReduceOp::Prod, v, premul_scalar(acc_type, rank))
        } else {
            v
        }
    };
    let n = nranks.max(1);
    let acc = (1..n).fold(lifted(0), |acc, r| {
        combine(acc_type, combining, acc, lifted(r))
    });
    let result = finish(acc_type, combining, acc, n);
    if fp8 {
        fp8_from_f32(dtype, f32::from_bits(result as u32))
    } else {
        result
    }
}

/// How results are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// Bit for bit (this library: its definitions are exact and the same on every rank).
    Exact,
    /// By value, floats' average within a few units in the last place (NCCL).
    Nccl,
}

/// The bits written into receive-buffer elements that the collective should overwrite, so a
/// collective that writes nothing fails: a quiet NaN for floats (never an expected value),
/// `0xA5…` otherwise.
pub fn unwritten(dtype: DataType) -> u64 {
    match dtype {
        DataType::F32 => f32::NAN.to_bits() as u64,
        DataType::F64 => f64::NAN.to_bits(),
        DataType::F16 => f16::NAN.to_bits() as u64,
        DataType::Bf16 => bf16::NAN.to_bits() as u64,
        d => 0xa5a5_a5a5_a5a5_a5a5 & mask(d),
    }
}

/// One run's inputs and expected outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference {
    /// The collective.
    pub collective: Collective,
    /// The element type.
    pub dtype: DataType,
    /// The reduction (ignored by the collectives that do not reduce).
    pub op: Redop,
    /// Number of ranks.
    pub nranks: usize,
    /// Root of broadcast and reduce.
    pub root: usize,
}

impl Reference {
    /// Whether this run reduces (a reducing collective; the type is then a reducing one).
    fn reduces(&self) -> bool {
        self.collective.reduces()
    }

    /// Bits of input element `index` of `rank`'s send buffer.
    pub fn input(&self, rank: usize, index: u64) -> u64 {
        let h = mix(index, rank);
        let d = self.dtype;
        if is_fp8(d) && self.reduces() {
            return self.fp8_input(rank, h);
        }
        if !is_float(d) {
            // Integers and moved fp8: any bits (integer sums and products wrap).
            return h & mask(d);
        }
        let op = if self.reduces() { Some(self.op) } else { None };
        let v = match op {
            Some(op @ (Redop::Sum | Redop::Avg | Redop::MulSum)) => {
                // Every partial sum of `nranks` of them (times a scalar of up to 2 for
                // mulsum) stays exact.
                let scaled = if op == Redop::MulSum { 2 } else { 1 };
                let bound = (exact_limit(d) / (scaled * self.nranks.max(1) as u64)).clamp(1, 16);
                ((h >> 8) % (2 * bound + 1)) as f64 - bound as f64
            }
            Some(Redop::Prod) => {
                // ±2^e, e in -1..=1 on ranks below 8 (|product| within 2^±8), ±1 above.
                let e = if rank < 8 { (h >> 8) % 3 } else { 1 } as i32 - 1;
                let sign = if h & 1 == 1 { -1.0 } else { 1.0 };
                sign * 2f64.powi(e)
            }
            // Min, max and moved data: small integers, zero with either sign.
            _ => {
                let v = ((h >> 8) % 255) as f64 - 127.0;
                if v == 0.0 && h & 1 == 1 { -0.0 } else { v }
            }
        };
        float_bits(d, v)
    }

    /// An fp8 input of a reduction (see the [module](self)): every f32 partial result
    /// exact, whatever the order (across hosts the library sums per host first).
    fn fp8_input(&self, rank: usize, h: u64) -> u64 {
        let d = self.dtype;
        if self.op == Redop::Prod {
            // |product| within 2^±8 on up to eight such ranks, ±1 above.
            const FACTORS: [f32; 5] = [0.5, 1.0, 2.0, 0.75, 1.5];
            let f = if rank < 8 {
                FACTORS[((h >> 8) % 5) as usize]
            } else {
                1.0
            };
            let sign = if h & 1 == 1 { -1.0 } else { 1.0 };
            return fp8_from_f32(d, sign * f);
        }
        let sums = self.op != Redop::Min && self.op != Redop::Max;
        // Sums: no partial sum (times a scalar of up to 2) passes the largest finite value.
        let largest = fp8_to_f32(d, fp8_from_f32(d, f32::MAX));
        let bound = (largest / (2 * self.nranks.max(1)) as f32).min(256.0);
        let accept = |bits: u64| {
            let v = fp8_to_f32(d, bits);
            if sums {
                v == 0.0 || (1.0 / 16.0..=bound).contains(&v)
            } else {
                v.is_finite()
            }
        };
        // The first acceptable byte of h, then of its remixes.
        let mut z = h;
        for _ in 0..8 {
            for k in 0..8 {
                let b = (z >> (8 * k)) & if sums { 0x7f } else { 0xff };
                if accept(b) {
                    return b;
                }
            }
            z = mix(z, rank);
        }
        fp8_from_f32(d, 1.0)
    }

    /// Expected bits of element `index` of rank `rank`'s output (`send_count`: elements of
    /// one rank's send buffer); `None` where nothing is expected (a reduce's other ranks).
    pub fn expected(&self, rank: usize, send_count: u64, index: u64) -> Option<u64> {
        let n = self.nranks.max(1);
        let v = |r: usize, i: u64| self.input(r, i);
        let reduced = |i: u64| reduce(self.dtype, self.op, n, |r| v(r, i));
        // Elements per block of the input (reduce-scatter, all-to-all).
        let per = send_count / n as u64;
        Some(match self.collective {
            Collective::AllReduce => reduced(index),
            Collective::AllGather => {
                let r = (index / send_count.max(1)) as usize;
                v(r, index % send_count.max(1))
            }
            Collective::ReduceScatter => reduced(rank as u64 * per + index),
            Collective::Reduce if rank == self.root => reduced(index),
            Collective::Reduce => return None,
            Collective::Broadcast => v(self.root, index),
            Collective::AllToAll => v(
                (index / per.max(1)) as usize,
                rank as u64 * per + index % per.max(1),
            ),
            Collective::SendRecv => v((rank + n - 1) % n, index),
        })
    }

    /// Whether `got` passes for `want`.
    pub fn matches(&self, strictness: Strictness, got: u64, want: u64) -> bool {
        let d = self.dtype;
        if is_fp8(d) && self.reduces() && strictness == Strictness::Nccl {
            let (g, w) = (fp8_to_f32(d, got) as f64, fp8_to_f32(d, want) as f64);
            return match self.op {
                // -0 == +0; NaN never matches.
                Redop::Min | Redop::Max => g == w,
                // Rounded to fp8 at every step: one unit in the last place per rank.
                _ => (g - w).abs() <= self.nranks.max(1) as f64 * fp8_ulp(d, w),
            };
        }
        if strictness == Strictness::Exact || !is_float(d) {
            return got & mask(d) == want & mask(d);
        }
        let (g, w) = (float_value(d, got), float_value(d, want));
        if self.reduces() && self.op == Redop::Avg {
            let ulps = match d {
                DataType::F32 => 1e-6,
                DataType::F64 => 1e-14,
                DataType::F16 => 4e-3,
                _ => 3e-2,
            };
            (g - w).abs() <= ulps * w.abs().max(1.0)
        } else {
            // -0 == +0; NaN never matches.
            g == w
        }
    }

    /// Elements of rank `rank`'s output `got` that differ from [`expected`](Self::expected)
    /// (elements with nothing expected are not counted).
    pub fn count_wrong<T: Elem>(
        &self,
        strictness: Strictness,
        rank: usize,
        send_count: u64,
        got: &[T],
    ) -> u64 {
        got.iter()
            .enumerate()
            .filter(|(i, g)| {
                self.expected(rank, send_count, *i as u64)
                    .is_some_and(|want| !self.matches(strictness, g.to_bits(), want))
            })
            .count() as u64
    }

    /// `rank`'s inputs.
    pub fn fill<T: Elem>(&self, rank: usize, out: &mut [T]) {
        for (i, x) in out.iter_mut().enumerate() {
            *x = T::from_bits(self.input(rank, i as u64));
        }
    }
}
