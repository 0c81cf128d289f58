//! Staged reductions over the Host transport, ranks as threads: fp8 with every operation and
//! pre-multiplied sums with host and device scalars, against CPU references that decode and
//! round fp8 by the formats' definitions (not by the library's conversions), on 2 and 3
//! ranks, across several staging pieces.

use super::Exec;
use half::f16;

use super::super::tests::{ranks, small};
use super::*;

/// An fp8 format by its definition: (exponent bits, mantissa bits, bias, has infinities).
#[derive(Clone, Copy, Debug)]
struct Format(u32, u32, i32, bool);

const E4M3: Format = Format(4, 3, 7, false);
const E5M2: Format = Format(5, 2, 15, true);

impl Format {
    /// The value of `code` (NaN as NaN).
    fn value(self, code: u8) -> f64 {
        let Format(eb, mb, bias, inf) = self;
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((code & 0x7f) >> mb) as i32;
        let m = (code & ((1 << mb) - 1)) as f64;
        let top = (1 << eb) - 1;
        if (!inf && e == top && m as u32 == (1 << mb) - 1) || (inf && e == top && m != 0.0) {
            return f64::NAN;
        }
        if inf && e == top {
            return sign * f64::INFINITY;
        }
        let frac = m / (1u32 << mb) as f64;
        if e == 0 {
            sign * frac * 2f64.powi(1 - bias)
        } else {
            sign * (1.0 + frac) * 2f64.powi(e - bias)
        }
    }

    /// `x` rounded to the nearest finite code (ties to the even code), saturated.
    fn encode(self, x: f32) -> u8 {
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        if x.is_nan() {
            return sign | 0x7f;
        }
        let a = (x as f64).abs();
        let (mut best, mut best_d) = (0u8, f64::INFINITY);
        let mut max = 0u8;
        for c in 0u8..0x80 {
            let v = self.value(c);
            if !v.is_finite() {
                continue;
            }
            max = max.max(c);
            let d = (v - a).abs();
            if d < best_d || (d == best_d && c & 1 == 0) {
                (best, best_d) = (c, d);
            }
        }
        if a >= self.value(max) {
            best = max;
        }
        sign | best
    }

    fn is_nan(self, code: u8) -> bool {
        self.value(code).is_nan()
    }
}

/// Rank `q`'s fp8 code at `i` of call `k`: finite codes over the whole range, NaN rarely.
fn code(f: Format, q: usize, i: usize, k: usize) -> u8 {
    let h =
        ((q * 1_000_003 + i * 7919 + k * 104_729) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    let c = h as u8;
    if i % 53 == 7 {
        return c | 0x7f;
    }
    if f.value(c).is_finite() { c } else { c & 0xbf }
}

/// The reference of `op` over the ranks' f32 values in rank order, rounded once to `f`.
fn reduce_fp8(f: Format, op: ReduceOp, xs: &[f32], scalars: &[f32]) -> u8 {
    let n = xs.len();
    let x = |q: usize| match op {
        ReduceOp::PreMulSum(_) => xs[q] * scalars[q],
        _ => xs[q],
    };
    let mut acc = x(0);
    for q in 1..n {
        let v = x(q);
        acc = match op {
            ReduceOp::Prod => acc * v,
            ReduceOp::Min => {
                if v.total_cmp(&acc).is_lt() {
                    v
                } else {
                    acc
                }
            }
            ReduceOp::Max => {
                if v.total_cmp(&acc).is_gt() {
                    v
                } else {
                    acc
                }
            }
            _ => acc + v,
        };
    }
    if op == ReduceOp::Avg {
        acc /= n as f32;
    }
    f.encode(acc)
}

trait Fp8: Element + std::fmt::Debug {
    const FORMAT: Format;
    fn of(code: u8) -> Self;
    fn code(self) -> u8;
}
impl Fp8 for Fp8E4M3 {
    const FORMAT: Format = E4M3;
    fn of(code: u8) -> Self {
        Fp8E4M3(code)
    }
    fn code(self) -> u8 {
        self.0
    }
}
impl Fp8 for Fp8E5M2 {
    const FORMAT: Format = E5M2;
    fn of(code: u8) -> Self {
        Fp8E5M2(code)
    }
    fn code(self) -> u8 {
        self.0
    }
}

fn check_codes<T: Fp8>(got: &[T], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, &w)) in got.iter().zip(want).enumerate() {
        let f = T::FORMAT;
        if f.is_nan(w) {
            assert!(
                f.is_nan(g.code()),
                "{what}: [{i}] {:#x}, want NaN",
                g.code()
            );
        } else {
            assert_eq!(g.code(), w, "{what}: [{i}] {:#x}, want {w:#x}", g.code());
        }
    }
}

/// Every reducing collective of fp8 `T` with `op` on rank `c`, in and out of place;
/// `scalar(q)` is rank `q`'s scalar code for a pre-multiplied sum.
fn fp8_collectives<T: Fp8>(c: &Collectives, op: ReduceOp, k: usize, count: usize) {
    let (n, r) = (c.nranks(), c.rank());
    let f = T::FORMAT;
    let scalar = |q: usize| [0x38u8, 0x40, 0x30, 0xb8][q % 4];
    let scalars: Vec<f32> = (0..n).map(|q| f.value(scalar(q)) as f32).collect();
    let op = match op {
        ReduceOp::PreMulSum(_) => ReduceOp::PreMulSum(PreMulScalar::Host {
            dtype: T::DTYPE,
            bits: scalar(r) as u64,
        }),
        o => o,
    };
    let want_at = |i: usize| {
        let xs: Vec<f32> = (0..n).map(|q| f.value(code(f, q, i, k)) as f32).collect();
        reduce_fp8(f, op, &xs, &scalars)
    };
    let what = format!(
        "rank {r}/{n} {:?} {} count {count} call {k}",
        T::DTYPE,
        op.name()
    );
    let input: Vec<T> = (0..count).map(|i| T::of(code(f, r, i, k))).collect();
    let want: Vec<u8> = (0..count).map(want_at).collect();
    let mut out = vec![T::of(0); count];
    c.all_reduce(&input, &mut out, op, Exec::Host).unwrap();
    check_codes(&out, &want, &format!("all_reduce {what}"));
    let mut buf = input.clone();
    c.all_reduce_in_place(&mut buf, op, Exec::Host).unwrap();
    check_codes(&buf, &want, &format!("all_reduce in place {what}"));
    // Reduce-scatter: block q of the input is elements q * count.. of the pattern.
    let input: Vec<T> = (0..n * count).map(|i| T::of(code(f, r, i, k))).collect();
    let want: Vec<u8> = (0..count).map(|i| want_at(r * count + i)).collect();
    let mut out = vec![T::of(0); count];
    c.reduce_scatter(&input, &mut out, op, Exec::Host).unwrap();
    check_codes(&out, &want, &format!("reduce_scatter {what}"));
    let mut buf = input.clone();
    c.reduce_scatter_in_place(&mut buf, op, Exec::Host).unwrap();
    check_codes(
        &buf[r * count..(r + 1) * count],
        &want,
        &format!("reduce_scatter in place {what}"),
    );
    // Reduce to each root; the others' output untouched.
    let input: Vec<T> = (0..count).map(|i| T::of(code(f, r, i, k))).collect();
    for root in 0..n {
        let mut out = vec![T::of(0x11); count];
        c.reduce(&input, &mut out, op, root, Exec::Host).unwrap();
        let want: Vec<u8> = if r == root {
            (0..count).map(want_at).collect()
        } else {
            vec![0x11; count]
        };
        check_codes(&out, &want, &format!("reduce to {root} {what}"));
    }
}

/// Every operation NCCL takes for fp8, both formats, 2 and 3 ranks, several staging pieces.
#[test]
fn fp8_reductions_round_once_for_every_operation() {
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::pre_mul_sum(Fp8E4M3(0x38)),
    ];
    for n in [2, 3] {
        ranks(n, small(), |mut c| {
            // 64 bytes of staging: pieces of 16 f32 (reduce-scatter: 16 / n).
            c.set_staging_capacity(64);
            for (k, op) in ops.into_iter().enumerate() {
                for count in [1, 37, 300] {
                    fp8_collectives::<Fp8E4M3>(&c, op, k, count);
                    fp8_collectives::<Fp8E5M2>(&c, op, k, count);
                }
            }
        });
    }
}

/// A sum whose exact value needs more than one rounding step: fp8 sums that NCCL's
/// pairwise rounding would get wrong come out as the single rounding of the exact sum.
#[test]
fn an_fp8_sum_is_rounded_once_not_per_step() {
    ranks(3, small(), |c| {
        // e4m3: 1 + 1/16 + 1/16: rounded per step (1 + 1/16 ties to 1, then again) it is 1;
        // rounded once, 1.125 (0x39).
        let x = [0x38u8, 0x18, 0x18][c.rank()];
        assert_eq!(E4M3.value(0x18), 0.0625);
        let mut out = [Fp8E4M3(0)];
        c.all_reduce(&[Fp8E4M3(x)], &mut out, ReduceOp::Sum, Exec::Host)
            .unwrap();
        assert_eq!(out[0], Fp8E4M3(0x39));
        // Saturation: 448 * 3 is 448, not NaN.
        let mut out = [Fp8E4M3(0)];
        c.all_reduce(&[Fp8E4M3(0x7e)], &mut out, ReduceOp::Sum, Exec::Host)
            .unwrap();
        assert_eq!(out[0], Fp8E4M3(0x7e));
    });
}

/// Pre-multiplied sums of f32, f16 and i32 with each rank's own host scalar: the product
/// rounded to the type, then summed in rank order.
#[test]
fn pre_multiplied_sums_scale_each_rank_by_its_own_scalar() {
    for n in [2, 3] {
        ranks(n, small(), |mut c| {
            c.set_staging_capacity(64);
            let r = c.rank();
            let count = 41;
            let x = |q: usize, i: usize| ((q * 5 + i * 3) % 11) as f32 * 0.3 - 1.1;
            let s = |q: usize| 0.7 + q as f32;
            // f32.
            let input: Vec<f32> = (0..n * count).map(|i| x(r, i)).collect();
            let want = |i: usize| (1..n).fold(x(0, i) * s(0), |a, q| a + x(q, i) * s(q));
            let op = ReduceOp::pre_mul_sum(s(r));
            let mut out = vec![0f32; count];
            c.all_reduce(&input[..count], &mut out, op, Exec::Host)
                .unwrap();
            assert_eq!(
                out,
                (0..count).map(want).collect::<Vec<_>>(),
                "f32 all_reduce"
            );
            c.reduce_scatter(&input, &mut out, op, Exec::Host).unwrap();
            let rs: Vec<f32> = (0..count).map(|i| want(r * count + i)).collect();
            assert_eq!(out, rs, "f32 reduce_scatter");
            for root in 0..n {
                let mut out = vec![5f32; count];
                c.reduce(&input[..count], &mut out, op, root, Exec::Host)
                    .unwrap();
                let want: Vec<f32> = if r == root {
                    (0..count).map(want).collect()
                } else {
                    vec![5.0; count]
                };
                assert_eq!(out, want, "f32 reduce to {root}");
            }
            // f16: each product rounded to f16, the sums too.
            let h = |v: f32| f16::from_f32(v);
            let input: Vec<f16> = (0..count).map(|i| h(x(r, i))).collect();
            let scaled = |q: usize, i: usize| h(h(x(q, i)).to_f32() * h(s(q)).to_f32());
            let want: Vec<f16> = (0..count)
                .map(|i| (1..n).fold(scaled(0, i), |a, q| h(a.to_f32() + scaled(q, i).to_f32())))
                .collect();
            let mut out = vec![f16::ZERO; count];
            c.all_reduce(&input, &mut out, ReduceOp::pre_mul_sum(h(s(r))), Exec::Host)
                .unwrap();
            assert_eq!(out, want, "f16 all_reduce");
            // i32: wrapping products.
            let input: Vec<i32> = (0..count as i32)
                .map(|i| i * 1_000_003 + r as i32)
                .collect();
            let si = |q: usize| [3, -7, 1 << 20][q];
            let want: Vec<i32> = (0..count as i32)
                .map(|i| {
                    (0..n).fold(0i32, |a, q| {
                        a.wrapping_add((i * 1_000_003 + q as i32).wrapping_mul(si(q)))
                    })
                })
                .collect();
            let mut buf = input.clone();
            c.all_reduce_in_place(&mut buf, ReduceOp::pre_mul_sum(si(r)), Exec::Host)
                .unwrap();
            assert_eq!(buf, want, "i32 all_reduce in place");
        });
    }
}

/// A device scalar is read when the call runs: changed between two calls, the second uses
/// the new value (as a CUDA graph replayed after the scalar changed).
#[test]
fn a_device_scalar_is_read_by_every_call() {
    ranks(2, small(), |c| {
        let r = c.rank();
        let mut scalar = Box::new(2.0f32 + r as f32);
        let op = ReduceOp::pre_mul_sum_at(DataType::F32, &mut *scalar as *mut f32 as u64);
        let input = vec![1.5f32; 9];
        let mut out = vec![0f32; 9];
        c.all_reduce(&input, &mut out, op, Exec::Host).unwrap();
        assert_eq!(out, vec![1.5 * 2.0 + 1.5 * 3.0; 9]);
        *scalar = 10.0 * (r + 1) as f32;
        c.reduce(&input, &mut out, op, 0, Exec::Host).unwrap();
        if r == 0 {
            assert_eq!(out, vec![1.5 * 10.0 + 1.5 * 20.0; 9]);
        }
        // fp8 e5m2 with a device scalar: 1 (0x3c) times 2 (0x40) and 4 (0x44).
        let s8 = Box::new([0x40u8, 0x44][r]);
        let op = ReduceOp::pre_mul_sum_at(DataType::Fp8E5M2, &*s8 as *const u8 as u64);
        let mut out = [Fp8E5M2(0)];
        c.all_reduce(&[Fp8E5M2(0x3c)], &mut out, op, Exec::Host)
            .unwrap();
        assert_eq!(E5M2.value(out[0].0), 6.0);
    });
}

#[test]
fn a_scalar_of_another_type_is_refused() {
    ranks(2, small(), |c| {
        let mut out = [0f32; 4];
        let e = c
            .all_reduce(
                &[1f32; 4],
                &mut out,
                ReduceOp::pre_mul_sum(2i32),
                Exec::Host,
            )
            .unwrap_err();
        assert!(matches!(e, CommError::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("scalar is int32"), "{e}");
    });
}

/// The call descriptor of a staged call names its own type and operation, so a mismatch
/// with a plain f32 sum of as many elements is found and said.
#[test]
fn a_mismatch_names_fp8_and_premulsum() {
    ranks(2, small(), |c| {
        let e = if c.rank() == 0 {
            let op = ReduceOp::pre_mul_sum(Fp8E4M3(0x38));
            let mut out = [Fp8E4M3(0); 8];
            c.all_reduce(&[Fp8E4M3(0x38); 8], &mut out, op, Exec::Host)
                .unwrap_err()
        } else {
            let mut out = [0f32; 8];
            c.all_reduce(&[1f32; 8], &mut out, ReduceOp::Sum, Exec::Host)
                .unwrap_err()
        };
        let m = e.to_string();
        assert!(
            m.contains("all_reduce (premulsum) with 8 fp8e4m3 (in f32)"),
            "{m}"
        );
        assert!(m.contains("all_reduce (sum) with 8 f32"), "{m}");
    });
}
