//! The 8-bit float types of NCCL (`ncclFloat8e4m3`, `ncclFloat8e5m2`, as CUDA's
//! `__nv_fp8_e4m3` / `__nv_fp8_e5m2`), converted to and from f32 in software: plain integer
//! and f32 arithmetic, the same on every GPU arch and on the host.
//!
//! - E4M3 (OCP E4M3FN): bias 7, 3 mantissa bits, no infinities; `S.1111.111` is NaN, the
//!   largest finite magnitude 448 (`0x7e`), the smallest subnormal 2^-9.
//! - E5M2: bias 15, 2 mantissa bits, IEEE-like: `S.11111.00` is infinity, `S.11111.xx`
//!   (xx ≠ 0) NaN, the largest finite magnitude 57344 (`0x7b`), the smallest subnormal 2^-16.
//!
//! To fp8 ([`from_f32`]): rounded to nearest, ties to even, and saturating to the largest
//! finite magnitude (CUDA's `__NV_SATFINITE`, which NCCL's fp8 reductions use when they
//! convert a result back): every finite or infinite value beyond it becomes ±max (so e5m2
//! never produces an infinity); NaN becomes the NaN `S.1111.111` (e4m3) or `S.11111.11`
//! (e5m2) with the input's sign. To f32 ([`to_f32`]): exact; NaN stays NaN (quiet, signed).

/// Which 8-bit float.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8 {
    /// E4M3 (no infinities, max 448).
    E4M3,
    /// E5M2 (max 57344).
    E5M2,
}

impl Fp8 {
    /// Mantissa bits.
    #[inline(always)]
    const fn man_bits(self) -> u32 {
        match self {
            Fp8::E4M3 => 3,
            Fp8::E5M2 => 2,
        }
    }
    /// Exponent bias.
    #[inline(always)]
    const fn bias(self) -> i32 {
        match self {
            Fp8::E4M3 => 7,
            Fp8::E5M2 => 15,
        }
    }
    /// The code of the largest finite magnitude.
    #[inline(always)]
    pub const fn max_code(self) -> u8 {
        match self {
            Fp8::E4M3 => 0x7e,
            Fp8::E5M2 => 0x7b,
        }
    }
    /// The code of the NaN this module produces (positive; the sign bit is the input's).
    #[inline(always)]
    pub const fn nan_code(self) -> u8 {
        0x7f
    }
}

/// `code` (an 8-bit float of kind `k`) as f32, exactly.
#[inline(always)]
pub fn to_f32(k: Fp8, code: u8) -> f32 {
    let sign = ((code & 0x80) as u32) << 24;
    let m_bits = k.man_bits();
    let mag = (code & 0x7f) as u32;
    let e = mag >> m_bits;
    let m = mag & ((1 << m_bits) - 1);
    let top = 0x7f >> m_bits;
    match k {
        Fp8::E4M3 if mag == 0x7f => return f32::from_bits(sign | 0x7fc0_0000),
        Fp8::E5M2 if e == top => {
            return f32::from_bits(sign | if m == 0 { 0x7f80_0000 } else { 0x7fc0_0000 });
        }
        _ => {}
    }
    if e == 0 {
        // Subnormal: m units of 2^(1 - bias - man_bits), exact in f32.
        let unit = f32::from_bits(((127 + 1 - k.bias() - m_bits as i32) as u32) << 23);
        let v = m as f32 * unit;
        return f32::from_bits(v.to_bits() | sign);
    }
    let exp = (e as i32 - k.bias() + 127) as u32;
    f32::from_bits(sign | exp << 23 | m << (23 - m_bits))
}

/// `f` as an 8-bit float of kind `k`: rounded to nearest even, saturated to ±max (see the
/// [module](self)).
#[inline(always)]
pub fn from_f32(k: Fp8, f: f32) -> u8 {
    let bits = f.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    if f.is_nan() {
        return sign | k.nan_code();
    }
    let mag = bits & 0x7fff_ffff;
    let m_bits = k.man_bits();
    // The smallest normal exponent of the fp8 type, as an f32 biased exponent.
    let min_normal = (127 + 1 - k.bias()) as u32;
    let code = if mag >> 23 >= min_normal {
        // Normal: round the f32 mantissa to m_bits (ties to even; a carry moves into the
        // exponent), then rebias. Infinity lands above the maximum, and is saturated below.
        let shift = 23 - m_bits;
        let half = 1u32 << (shift - 1);
        let rounded = (mag + half - 1 + ((mag >> shift) & 1)) >> shift;
        let rebias = (127 - k.bias() as u32) << m_bits;
        rounded - rebias
    } else {
        // Subnormal or zero: count units of 2^(1 - bias - man_bits) (a power-of-two scaling,
        // exact), rounded to an integer, ties to even, by the 2^23 trick (exact below 2^23).
        let scale = f32::from_bits((127 + m_bits as i32 + k.bias() - 1) as u32 * (1 << 23));
        let q = f32::from_bits(mag) * scale;
        ((q + 8_388_608.0) - 8_388_608.0) as u32
    };
    let code = if code > k.max_code() as u32 {
        k.max_code()
    } else {
        code as u8
    };
    sign | code
}

/// The kind of a reducing type code (`types::dtype`), if it is an 8-bit float.
#[inline(always)]
pub const fn kind_of(dtype: u32) -> Option<Fp8> {
    match dtype {
        super::types::dtype::FP8E4M3 => Some(Fp8::E4M3),
        super::types::dtype::FP8E5M2 => Some(Fp8::E5M2),
        _ => None,
    }
}
