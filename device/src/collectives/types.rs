//! Element types and reduction operations of the reducing collectives, on raw bits.
//!
//! The algorithms take the operation as an argument ([`op`] codes). The sum-only all-reduce
//! kernels pass [`op::SUM`] as a constant, which folds every test of it away (their code is
//! that of a plain sum); the other kernels read it from the call's tag at run time
//! (`desc::op_code`): a kernel per (algorithm, type), not per operation. Sum (and the sum of
//! average) stays inline on their fast path; the other operations go through one
//! out-of-line function per type ([`lanes8`]), so they do not multiply the kernels' code.
//!
//! Definitions, identical on the GPU and the CPU (so every rank's result equals a CPU
//! reference that applies them in rank order):
//! - sum and product: IEEE operations rounded to nearest even in the type (f16 and bf16
//!   products and sums are exact in f32 and rounded once); integers wrap;
//! - min and max: floats by IEEE 754 `totalOrder` on the bits (−0 < +0, NaNs ordered by sign
//!   and payload), integers by value; on ties the earlier rank's value is kept;
//! - average: the sum, divided once at the end by the number of ranks (floats: the quotient
//!   rounded to the type, f16 and bf16 through an f32 quotient; integers: division truncating
//!   toward zero, after the wrapping sum).

use crate::arch;

/// Reduction operation codes, as kernels take them.
pub mod op {
    /// Sum.
    pub const SUM: u32 = 0;
    /// Product.
    pub const PROD: u32 = 1;
    /// Minimum.
    pub const MIN: u32 = 2;
    /// Maximum.
    pub const MAX: u32 = 3;
    /// Sum divided by the number of ranks.
    pub const AVG: u32 = 4;
    /// A pre-multiplied sum: each rank's input scaled by its own scalar before the call's
    /// kernels run (the host's staging pass), so the kernels sum, as for [`SUM`]. A code of
    /// its own so that the call descriptor names it.
    pub const PRE_MUL_SUM: u32 = 5;
    /// Codes are below this.
    pub const COUNT: u32 = 6;
}

/// Element types the reductions support, as lane-wise operations on raw bits.
pub trait Reduce: Copy {
    /// Bytes per element (1, 2, 4 or 8).
    const SIZE: u64;
    /// Adds the lanes of two 8-byte words (`8 / SIZE` elements each): the fast path.
    fn add8(a: u64, b: u64) -> u64;
    /// `op` on two single elements held in the low `SIZE` bytes (average: the sum).
    fn op1(op: u32, a: u64, b: u64) -> u64;
    /// The last step of `op` on one element: average divides by `n`; others keep it.
    fn finish1(op: u32, a: u64, n: u32) -> u64;

    /// `op` on the lanes of two 8-byte words.
    #[inline(always)]
    fn op8(op: u32, a: u64, b: u64) -> u64 {
        if op == op::SUM || op == op::AVG || op == op::PRE_MUL_SUM {
            Self::add8(a, b)
        } else {
            lanes8::<Self>(op, a, b)
        }
    }

    /// `all_reduce::reduce_sources` out of line, for the
    /// any-operation kernels (one copy per type).
    ///
    /// # Safety
    /// As for `reduce_sources`.
    #[inline(always)]
    unsafe fn reduce_out(
        srcs: &[*const u8],
        out: *mut u8,
        reduced: *mut u8,
        len: u64,
        thread: u32,
        op: u32,
    ) {
        // SAFETY: forwarded.
        unsafe {
            super::all_reduce::reduce_sources_out::<Self>(srcs, out, reduced, len, thread, op)
        }
    }

    /// [`finish1`](Self::finish1) on the lanes of an 8-byte word.
    #[inline(always)]
    fn finish8(op: u32, a: u64, n: u32) -> u64 {
        if op == op::AVG {
            finish_lanes8::<Self>(a, n)
        } else {
            a
        }
    }
}

/// Mask of the low `size` bytes.
#[inline(always)]
const fn mask(size: u64) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1 << (size * 8)) - 1
    }
}

/// [`Reduce::op1`] lane by lane, out of line (the operations other than sum).
#[inline(never)]
pub fn lanes8<T: Reduce>(op: u32, a: u64, b: u64) -> u64 {
    let (bits, m) = (T::SIZE * 8, mask(T::SIZE));
    let mut out = 0;
    let mut shift = 0;
    while shift < 64 {
        out |= (T::op1(op, a >> shift & m, b >> shift & m) & m) << shift;
        shift += bits;
    }
    out
}

/// [`Reduce::finish1`] of average lane by lane, out of line.
#[inline(never)]
fn finish_lanes8<T: Reduce>(a: u64, n: u32) -> u64 {
    let (bits, m) = (T::SIZE * 8, mask(T::SIZE));
    let mut out = 0;
    let mut shift = 0;
    while shift < 64 {
        out |= (T::finish1(op::AVG, a >> shift & m, n) & m) << shift;
        shift += bits;
    }
    out
}

/// The key of IEEE 754 `totalOrder` for a float of `bits` bits: ordered as unsigned.
#[inline(always)]
fn total_key(x: u64, bits: u32) -> u64 {
    let sign = 1u64 << (bits - 1);
    let m = mask(bits as u64 / 8);
    if x & sign != 0 { !x & m } else { x | sign }
}

/// Min or max by `key` (ties keep `a`).
#[inline(always)]
fn pick(op: u32, a: u64, b: u64, ka: u64, kb: u64) -> u64 {
    let take_b = if op == op::MIN { kb < ka } else { kb > ka };
    if take_b { b } else { a }
}

/// bfloat16 bits to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(b: u64) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 to bfloat16 bits, rounded to nearest even (NaN stays NaN, quiet).
#[inline(always)]
pub fn f32_to_bf16(f: f32) -> u64 {
    let x = f.to_bits();
    if f.is_nan() {
        return ((x >> 16) | 0x40) as u64;
    }
    (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u64
}

/// f16 bits to f32 (exact).
#[inline(always)]
fn f16_to_f32(h: u64) -> f32 {
    arch::f16_to_f32(h as u16)
}

/// 32-bit float.
#[derive(Clone, Copy, Debug)]
pub struct F32;
/// 64-bit float.
#[derive(Clone, Copy, Debug)]
pub struct F64;
/// IEEE half float.
#[derive(Clone, Copy, Debug)]
pub struct F16;
/// bfloat16.
#[derive(Clone, Copy, Debug)]
pub struct Bf16;

impl Reduce for F32 {
    const SIZE: u64 = 4;
    #[inline(always)]
    fn add8(a: u64, b: u64) -> u64 {
        let lo = Self::op1(op::SUM, a & 0xffff_ffff, b & 0xffff_ffff);
        let hi = Self::op1(op::SUM, a >> 32, b >> 32);
        lo | hi << 32
    }
    #[inline(always)]
    fn op1(op: u32, a: u64, b: u64) -> u64 {
        let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
        match op {
            op::PROD => (x * y).to_bits() as u64,
            op::MIN | op::MAX => pick(op, a, b, total_key(a, 32), total_key(b, 32)),
            _ => (x + y).to_bits() as u64,
        }
    }
    #[inline(always)]
    fn finish1(op: u32, a: u64, n: u32) -> u64 {
        if op != op::AVG {
            return a;
        }
        (f32::from_bits(a as u32) / n as f32).to_bits() as u64
    }
}

impl Reduce for F64 {
    const SIZE: u64 = 8;
    #[inline(always)]
    fn add8(a: u64, b: u64) -> u64 {
        Self::op1(op::SUM, a, b)
    }
    #[inline(always)]
    fn op1(op: u32, a: u64, b: u64) -> u64 {
        let (x, y) = (f64::from_bits(a), f64::from_bits(b));
        match op {
            op::PROD => (x * y).to_bits(),
            op::MIN | op::MAX => pick(op, a, b, total_key(a, 64), total_key(b, 64)),
            _ => (x + y).to_bits(),
        }
    }
    #[inline(always)]
    fn finish1(op: u32, a: u64, n: u32) -> u64 {
        if op != op::AVG {
            return a;
        }
        (f64::from_bits(a) / n as f64).to_bits()
    }
}

/// The two 16-bit float types: sums in lane pairs by `$add` (one `u32` holds two).
macro_rules! half_reduce {
    ($t:ty, $add:path, $mul:expr, $to:expr, $from:expr) => {
        impl Reduce for $t {
            const SIZE: u64 = 2;
            #[inline(always)]
            fn add8(a: u64, b: u64) -> u64 {
                let lo = $add(a as u32, b as u32);
                let hi = $add((a >> 32) as u32, (b >> 32) as u32);
                lo as u64 | (hi as u64) << 32
            }
            #[inline(always)]
            fn op1(op: u32, a: u64, b: u64) -> u64 {
                match op {
                    op::PROD => $mul(a, b) & 0xffff,
                    op::MIN | op::MAX => pick(op, a, b, total_key(a, 16), total_key(b, 16)),
                    _ => $add(a as u32, b as u32) as u64 & 0xffff,
                }
            }
            #[inline(always)]
            fn finish1(op: u32, a: u64, n: u32) -> u64 {
                if op != op::AVG {
                    return a;
                }
                $from($to(a) / n as f32)
            }
        }
    };
}
half_reduce!(
    F16,
    arch::add_f16x2,
    |a: u64, b: u64| arch::mul_f16x2(a as u32, b as u32) as u64,
    f16_to_f32,
    |f: f32| arch::f32_to_f16(f) as u64
);
half_reduce!(
    Bf16,
    arch::add_bf16x2,
    |a: u64, b: u64| f32_to_bf16(bf16_to_f32(a) * bf16_to_f32(b)),
    bf16_to_f32,
    f32_to_bf16
);

/// The integer types: `$t` the element type marker, `$i` its Rust type.
macro_rules! int_reduce {
    ($($(#[$m:meta])* $t:ident, $i:ty, $u:ty);* $(;)?) => {$(
        $(#[$m])*
        #[derive(Clone, Copy, Debug)]
        pub struct $t;
        impl Reduce for $t {
            const SIZE: u64 = core::mem::size_of::<$i>() as u64;
            #[inline(always)]
            fn add8(a: u64, b: u64) -> u64 {
                if Self::SIZE == 8 {
                    return a.wrapping_add(b);
                }
                // Lane-wise wrapping add: add without the lanes' top bits, then put them
                // back with xor (no carry crosses a lane).
                let bits = Self::SIZE * 8;
                let mut high = 0u64;
                let mut s = bits - 1;
                while s < 64 {
                    high |= 1 << s;
                    s += bits;
                }
                ((a & !high).wrapping_add(b & !high)) ^ ((a ^ b) & high)
            }
            #[inline(always)]
            fn op1(op: u32, a: u64, b: u64) -> u64 {
                let (x, y) = (a as $u as $i, b as $u as $i);
                let r = match op {
                    op::PROD => x.wrapping_mul(y),
                    op::MIN => if y < x { y } else { x },
                    op::MAX => if y > x { y } else { x },
                    _ => x.wrapping_add(y),
                };
                r as $u as u64
            }
            #[inline(always)]
            fn finish1(op: u32, a: u64, n: u32) -> u64 {
                if op != op::AVG {
                    return a;
                }
                let x = a as $u as $i;
                // n <= MAX_RANKS fits every type.
                (x / (n as $i)) as $u as u64
            }
        }
    )*};
}

int_reduce! {
    /// Signed 8-bit integer.
    I8, i8, u8;
    /// Unsigned 8-bit integer.
    U8, u8, u8;
    /// Signed 32-bit integer.
    I32, i32, u32;
    /// Unsigned 32-bit integer.
    U32, u32, u32;
    /// Signed 64-bit integer.
    I64, i64, u64;
    /// Unsigned 64-bit integer.
    U64, u64, u64;
}

/// The descriptor codes of the reducing types (`desc::DTYPE_SHIFT` field), as the host
/// writes them.
pub mod dtype {
    /// f32.
    pub const F32: u32 = 1;
    /// f16.
    pub const F16: u32 = 2;
    /// bf16.
    pub const BF16: u32 = 3;
    /// f64.
    pub const F64: u32 = 4;
    /// i8.
    pub const I8: u32 = 5;
    /// u8.
    pub const U8: u32 = 6;
    /// i32.
    pub const I32: u32 = 7;
    /// u32.
    pub const U32: u32 = 8;
    /// i64.
    pub const I64: u32 = 9;
    /// u64.
    pub const U64: u32 = 10;
    /// fp8 e4m3. The reducing kernels see it only in calls whose data the host widened to
    /// f32 (`mscclpp_host`'s staged reductions: the kernels reduce f32, one rounding to fp8
    /// at the end), so they reduce it as [`F32`] (4 bytes); the code keeps the type's name
    /// in the call descriptor.
    pub const FP8E4M3: u32 = 11;
    /// fp8 e5m2, as [`FP8E4M3`].
    pub const FP8E5M2: u32 = 12;
}

/// Any reducing type of `S` bytes, chosen at run time: the any-operation kernels are built
/// once per element size (1, 2, 4, 8 bytes), not per type, and take `op | dtype << 8` (see
/// `desc::type_op`) as their operation. Moving data needs only the size; every reduction
/// step dispatches on the type out of line ([`dyn_op8`] per 8-byte unit on the LL paths,
/// once per chunk into the type's own `all_reduce::reduce_sources_out`
/// on the put paths).
#[derive(Clone, Copy, Debug)]
pub struct Dyn<const S: u64>;

/// `$e` with `$t` the reducing type of code `$dt` if its size is `S`; `$none` otherwise.
macro_rules! by_dtype {
    ($s:expr, $dt:expr, $t:ident => $e:expr, $none:expr) => {
        match $dt {
            dtype::F32 | dtype::FP8E4M3 | dtype::FP8E5M2 if F32::SIZE == $s => {
                type $t = F32;
                $e
            }
            dtype::F16 if F16::SIZE == $s => {
                type $t = F16;
                $e
            }
            dtype::BF16 if Bf16::SIZE == $s => {
                type $t = Bf16;
                $e
            }
            dtype::F64 if F64::SIZE == $s => {
                type $t = F64;
                $e
            }
            dtype::I8 if I8::SIZE == $s => {
                type $t = I8;
                $e
            }
            dtype::U8 if U8::SIZE == $s => {
                type $t = U8;
                $e
            }
            dtype::I32 if I32::SIZE == $s => {
                type $t = I32;
                $e
            }
            dtype::U32 if U32::SIZE == $s => {
                type $t = U32;
                $e
            }
            dtype::I64 if I64::SIZE == $s => {
                type $t = I64;
                $e
            }
            dtype::U64 if U64::SIZE == $s => {
                type $t = U64;
                $e
            }
            _ => $none,
        }
    };
}

/// [`Reduce::op8`] of the type of `op >> 8` (size `S`), out of line.
#[inline(never)]
pub fn dyn_op8<const S: u64>(op: u32, a: u64, b: u64) -> u64 {
    by_dtype!(S, op >> 8, T => T::op8(op & 0xff, a, b), a)
}

/// [`Reduce::finish8`] of the type of `op >> 8` (size `S`), out of line.
#[inline(never)]
fn dyn_finish8<const S: u64>(op: u32, a: u64, n: u32) -> u64 {
    by_dtype!(S, op >> 8, T => T::finish8(op & 0xff, a, n), a)
}

/// [`Reduce::op1`] of the type of `op >> 8` (size `S`), out of line.
#[inline(never)]
fn dyn_op1<const S: u64>(op: u32, a: u64, b: u64) -> u64 {
    by_dtype!(S, op >> 8, T => T::op1(op & 0xff, a, b), a)
}

/// [`Reduce::finish1`] of the type of `op >> 8` (size `S`), out of line.
#[inline(never)]
fn dyn_finish1<const S: u64>(op: u32, a: u64, n: u32) -> u64 {
    by_dtype!(S, op >> 8, T => T::finish1(op & 0xff, a, n), a)
}

impl<const S: u64> Reduce for Dyn<S> {
    const SIZE: u64 = S;
    #[inline(always)]
    fn add8(a: u64, b: u64) -> u64 {
        // Not reached: `op8` below dispatches every operation, the sum included.
        a.wrapping_add(b)
    }
    #[inline(always)]
    fn op1(op: u32, a: u64, b: u64) -> u64 {
        dyn_op1::<S>(op, a, b)
    }
    #[inline(always)]
    fn finish1(op: u32, a: u64, n: u32) -> u64 {
        if op & 0xff != op::AVG {
            return a;
        }
        dyn_finish1::<S>(op, a, n)
    }
    #[inline(always)]
    fn op8(op: u32, a: u64, b: u64) -> u64 {
        dyn_op8::<S>(op, a, b)
    }
    #[inline(always)]
    fn finish8(op: u32, a: u64, n: u32) -> u64 {
        if op & 0xff != op::AVG {
            return a;
        }
        dyn_finish8::<S>(op, a, n)
    }
    #[inline(always)]
    unsafe fn reduce_out(
        srcs: &[*const u8],
        out: *mut u8,
        reduced: *mut u8,
        len: u64,
        thread: u32,
        op: u32,
    ) {
        // SAFETY: forwarded; the type has this size, so the ranges are the same bytes.
        unsafe {
            by_dtype!(
                S,
                op >> 8,
                T => super::all_reduce::reduce_sources_out::<T>(
                    srcs,
                    out,
                    reduced,
                    len,
                    thread,
                    op & 0xff
                ),
                ()
            )
        }
    }
}

/// The size of the reducing type of code `dt` ([`dtype`]); 0 for none.
#[inline(always)]
pub const fn dtype_size(dt: u32) -> u64 {
    match dt {
        dtype::F64 | dtype::I64 | dtype::U64 => 8,
        dtype::F32 | dtype::I32 | dtype::U32 | dtype::FP8E4M3 | dtype::FP8E5M2 => 4,
        dtype::F16 | dtype::BF16 => 2,
        dtype::I8 | dtype::U8 => 1,
        _ => 0,
    }
}

/// Any reducing type, counted in bytes: the put paths of the any-operation kernels
/// (two-shot, proxy, reduce-scatter and reduce through the scratch) move bytes, and cut them
/// at multiples of 16 bytes (shares of `16 / SIZE` units), so every cut falls between
/// elements of any type; their one reduction step per chunk dispatches on the type
/// ([`reduce_out`](Reduce::reduce_out), `op | dtype << 8` as for [`Dyn`]) with the chunk's
/// length in elements. One kernel per algorithm serves every type. Their call descriptors
/// hold the byte count (`desc`).
#[derive(Clone, Copy, Debug)]
pub struct Bytes;

impl Reduce for Bytes {
    const SIZE: u64 = 1;
    // Not reached: only `reduce_out` reduces these.
    #[inline(always)]
    fn add8(a: u64, _: u64) -> u64 {
        a
    }
    #[inline(always)]
    fn op1(_: u32, a: u64, _: u64) -> u64 {
        a
    }
    #[inline(always)]
    fn finish1(_: u32, a: u64, _: u32) -> u64 {
        a
    }
    #[inline(always)]
    unsafe fn reduce_out(
        srcs: &[*const u8],
        out: *mut u8,
        reduced: *mut u8,
        len: u64,
        thread: u32,
        op: u32,
    ) {
        macro_rules! each {
            ($($code:path => $t:ty),*) => {
                match op >> 8 {
                    $($code => {
                        // SAFETY: forwarded; `len` bytes are whole elements of the type
                        // (the callers cut at multiples of 16 bytes or at the end).
                        unsafe {
                            super::all_reduce::reduce_sources_out::<$t>(
                                srcs,
                                out,
                                reduced,
                                len / <$t>::SIZE,
                                thread,
                                op & 0xff,
                            )
                        }
                    })*
                    _ => {}
                }
            };
        }
        each!(
            dtype::F32 => F32, dtype::F16 => F16, dtype::BF16 => Bf16, dtype::F64 => F64,
            dtype::I8 => I8, dtype::U8 => U8, dtype::I32 => I32, dtype::U32 => U32,
            dtype::I64 => I64, dtype::U64 => U64,
            dtype::FP8E4M3 => F32, dtype::FP8E5M2 => F32
        )
    }
}
