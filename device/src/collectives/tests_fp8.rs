//! The 8-bit float conversions ([`fp8`](super::fp8)) against a reference built from the
//! formats' definitions in f64 (not from the conversions), and the staging passes
//! ([`staging`](super::staging)).

use std::vec::Vec;

use super::fp8::{Fp8, from_f32, to_f32};
use super::staging::{self, mode};
use super::types::dtype;

/// The value of `code` by the format's definition, in f64 (`None` for NaN).
fn reference_value(k: Fp8, code: u8) -> Option<f64> {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e_bits, m_bits, bias) = match k {
        Fp8::E4M3 => (4, 3, 7),
        Fp8::E5M2 => (5, 2, 15),
    };
    let e = ((code & 0x7f) >> m_bits) as i32;
    let m = (code & ((1 << m_bits) - 1)) as f64;
    let top = (1 << e_bits) - 1;
    let frac = m / (1 << m_bits) as f64;
    match k {
        Fp8::E4M3 if e == top && m == 7.0 => return None,
        Fp8::E5M2 if e == top && m == 0.0 => return Some(sign * f64::INFINITY),
        Fp8::E5M2 if e == top => return None,
        _ => {}
    }
    Some(if e == 0 {
        sign * frac * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + frac) * 2f64.powi(e - bias)
    })
}

/// The finite non-negative codes of `k`, ascending in value.
fn finite_codes(k: Fp8) -> Vec<u8> {
    (0u8..0x80)
        .filter(|&c| reference_value(k, c).is_some_and(f64::is_finite))
        .collect()
}

/// The reference encoding: the nearest finite code, ties to the even code, beyond the
/// largest finite value the largest (saturation), NaN the NaN with the sign.
fn reference_encode(k: Fp8, x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return sign | 0x7f;
    }
    let a = (x as f64).abs();
    let codes = finite_codes(k);
    let max = *codes.last().unwrap();
    if a >= reference_value(k, max).unwrap() {
        return sign | max;
    }
    let mut best = codes[0];
    let mut best_d = f64::INFINITY;
    for &c in &codes {
        let d = (reference_value(k, c).unwrap() - a).abs();
        if d < best_d || (d == best_d && c & 1 == 0) {
            best = c;
            best_d = d;
        }
    }
    sign | best
}

const KINDS: [Fp8; 2] = [Fp8::E4M3, Fp8::E5M2];

#[test]
fn every_code_decodes_to_its_defined_value() {
    for k in KINDS {
        for c in 0..=255u8 {
            let got = to_f32(k, c);
            match reference_value(k, c) {
                None => assert!(got.is_nan(), "{k:?} {c:#x} -> {got}"),
                Some(v) => {
                    assert_eq!(got as f64, v, "{k:?} {c:#x}");
                    assert_eq!(got.is_sign_negative(), c & 0x80 != 0, "{k:?} {c:#x} sign");
                }
            }
        }
    }
}

#[test]
fn every_finite_code_round_trips_and_nan_and_infinity_are_mapped() {
    for k in KINDS {
        for c in 0..=255u8 {
            let back = from_f32(k, to_f32(k, c));
            match reference_value(k, c) {
                None => assert_eq!(back, (c & 0x80) | 0x7f, "{k:?} NaN {c:#x}"),
                Some(v) if v.is_infinite() => {
                    // Saturating: an infinity becomes the largest finite value.
                    assert_eq!(back, (c & 0x80) | 0x7b, "{k:?} inf {c:#x}")
                }
                Some(_) => assert_eq!(back, c, "{k:?} {c:#x}"),
            }
        }
    }
}

#[test]
fn known_values() {
    assert_eq!(to_f32(Fp8::E4M3, 0x7e), 448.0);
    assert_eq!(to_f32(Fp8::E5M2, 0x7b), 57344.0);
    assert_eq!(to_f32(Fp8::E4M3, 0x01), 2f32.powi(-9));
    assert_eq!(to_f32(Fp8::E5M2, 0x01), 2f32.powi(-16));
    assert_eq!(to_f32(Fp8::E4M3, 0x38), 1.0);
    assert_eq!(to_f32(Fp8::E5M2, 0x3c), 1.0);
    assert_eq!(to_f32(Fp8::E5M2, 0x7c), f32::INFINITY);
    assert_eq!(to_f32(Fp8::E5M2, 0xfc), f32::NEG_INFINITY);
    // Saturation.
    for (k, max) in [(Fp8::E4M3, 0x7e), (Fp8::E5M2, 0x7b)] {
        for x in [1e9f32, f32::MAX, f32::INFINITY] {
            assert_eq!(from_f32(k, x), max, "{k:?} {x}");
            assert_eq!(from_f32(k, -x), 0x80 | max, "{k:?} -{x}");
        }
        assert_eq!(from_f32(k, f32::NAN), 0x7f);
        assert_eq!(from_f32(k, -f32::NAN), 0xff);
        assert_eq!(from_f32(k, -0.0), 0x80);
        assert_eq!(from_f32(k, 0.0), 0x00);
    }
    // e4m3: 464 is halfway between 448 (mantissa 110, even) and 480 (would be 0x7f): 448.
    assert_eq!(from_f32(Fp8::E4M3, 464.0), 0x7e);
    assert_eq!(from_f32(Fp8::E4M3, 449.0), 0x7e);
    // Ties to even: 1 + 1/16 is halfway between 1 (0x38) and 1.125 (0x39).
    assert_eq!(from_f32(Fp8::E4M3, 1.0625), 0x38);
    assert_eq!(from_f32(Fp8::E4M3, 1.1875), 0x3a);
    // Subnormal ties: half the smallest subnormal rounds to 0, one and a half to 2 units.
    assert_eq!(from_f32(Fp8::E4M3, 2f32.powi(-10)), 0x00);
    assert_eq!(from_f32(Fp8::E4M3, 3.0 * 2f32.powi(-10)), 0x02);
    assert_eq!(from_f32(Fp8::E5M2, 2f32.powi(-17) * 1.0001), 0x01);
    // The largest subnormal rounding up into the smallest normal.
    assert_eq!(from_f32(Fp8::E4M3, 7.75 * 2f32.powi(-9)), 0x08);
}

#[test]
fn conversion_matches_the_reference_on_midpoints_and_many_values() {
    for k in KINDS {
        let codes = finite_codes(k);
        let mut xs: Vec<f32> = Vec::new();
        for w in codes.windows(2) {
            let (a, b) = (
                reference_value(k, w[0]).unwrap(),
                reference_value(k, w[1]).unwrap(),
            );
            let mid = (a + b) / 2.0;
            xs.extend([a as f32, mid as f32, (mid * (1.0 + 1e-6)) as f32]);
            xs.push((mid * (1.0 - 1e-6)) as f32);
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Exponents over the whole fp8 range and beyond, both signs.
            let bits = (state >> 32) as u32;
            let e = 90 + (bits >> 23) % 80;
            xs.push(f32::from_bits((bits & 0x807f_ffff) | e << 23));
        }
        for x in xs {
            for x in [x, -x] {
                assert_eq!(from_f32(k, x), reference_encode(k, x), "{k:?} {x:e}");
            }
        }
    }
}

#[test]
fn staging_passes_widen_scale_narrow_and_pre_multiply() {
    // fp8 e4m3 1.5 (0x3c) and -3 (0xc4), times the scalar 2 (0x40), widened.
    let src = [0x3cu8, 0xc4];
    let mut wide = [0f32; 2];
    let two = 0x40u8;
    // SAFETY: two elements each; the scalar pointer valid for one byte.
    unsafe {
        staging::pass(
            src.as_ptr(),
            wide.as_mut_ptr() as *mut u8,
            2,
            mode::WIDEN | mode::SCALED | dtype::FP8E4M3 as u64,
            0,
            &two,
            0,
            1,
        );
    }
    assert_eq!(wide, [3.0, -6.0]);
    // Narrowed: 3 and -6 exactly; 1000 saturates.
    let wide = [3.0f32, -6.0, 1000.0];
    let mut out = [0u8; 3];
    // SAFETY: three elements each.
    unsafe {
        staging::pass(
            wide.as_ptr() as *const u8,
            out.as_mut_ptr(),
            3,
            mode::NARROW | dtype::FP8E4M3 as u64,
            0,
            core::ptr::null(),
            0,
            1,
        );
    }
    assert_eq!(out, [0x44, 0xcc, 0x7e]);
    // Pre-multiplied i32 (wrapping) with the scalar given by value.
    let src = [3i32, -7, i32::MAX];
    let mut out = [0i32; 3];
    // SAFETY: three elements each.
    unsafe {
        staging::pass(
            src.as_ptr() as *const u8,
            out.as_mut_ptr() as *mut u8,
            3,
            mode::PRE_MUL | mode::SCALED | dtype::I32 as u64,
            (-2i32) as u32 as u64,
            core::ptr::null(),
            0,
            1,
        );
    }
    assert_eq!(out, [-6, 14, i32::MAX.wrapping_mul(-2)]);
    // Pre-multiplied f16: 0.1 * 3 rounded once to f16, the scalar read from memory.
    let x = half::f16::from_f32(0.1);
    let s = half::f16::from_f32(3.0);
    let mut out = [half::f16::ZERO; 1];
    // SAFETY: one element each; the scalar pointer valid for two bytes.
    unsafe {
        staging::pass(
            &x as *const half::f16 as *const u8,
            out.as_mut_ptr() as *mut u8,
            1,
            mode::PRE_MUL | mode::SCALED | dtype::F16 as u64,
            0,
            &s as *const half::f16 as *const u8,
            0,
            1,
        );
    }
    assert_eq!(out[0], half::f16::from_f64(x.to_f64() * 3.0));
}
