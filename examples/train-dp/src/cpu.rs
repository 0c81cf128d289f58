//! The CPU reference: forward, MSE loss, backward and AdamW in plain f32 loops. It trains
//! the model on the Host transport (no GPU) and checks the GPU's gradients.
//!
//! # The gradient tolerance
//!
//! Two f32 computations of the same gradient (one rank over the whole batch, or N ranks
//! over shards summed by the all-reduce and scaled by 1/N; or cuBLAS against these loops)
//! differ only in the order and fusion of their roundings. By the standard forward error
//! analysis (Higham, *Accuracy and Stability of Numerical Algorithms*, ch. 3), a value
//! computed through a chain of at most `k` roundings of unit roundoff `u = 2^-24` differs
//! from the exact value by at most `gamma_k * A`, with `gamma_k = k u / (1 - k u)` and `A`
//! the same computation done on absolute values (every subtraction an addition, every
//! weight `|W|`, ReLU masks dropped, which only enlarges `A`). [`abs_gradient`] computes
//! `A` for every gradient element. The longest chain of a gradient element is
//!
//! - forward, layer `l`: a dot product of `dims[l]` terms and the bias: `dims[l] + 1`;
//! - the labels (teacher forward, the same way) and the loss `scale * (y - t)`: 2 more;
//! - backward, layer `l`: a dot product of `dims[l + 1]` terms for the input gradient;
//! - the sum over the batch (`B` samples) for `dW` and `db`;
//! - the all-reduce over N ranks and the `1/N` scale: `N + 1`.
//!
//! Both computations are within `gamma_k * A` of the exact gradient, so they are within
//! `2 gamma_k * A` of each other: [`grad_tolerance`]. This catches a wrong averaging scale
//! (an error of the gradient's own size) everywhere except where the gradient is below
//! `2 gamma_k` (about `1e-5` here) of its absolute value.
//!
//! # The first step's parameters
//!
//! Both runs start from the same parameters `p0`, so after the first AdamW step (moments
//! zero before it) they differ only through the update `lr * f(c g)`, where `c = min(1, M /
//! |g|)` is the clipping factor of the global norm and `f(x) = x / (|x| + eps)` (the first
//! step's bias-corrected `m / (sqrt(v) + eps)`). With `|g_run - g_ref| <= t` per element
//! (the gradient bound above), `|c_run g_run - c_ref g_ref| <= t + |c_run - c_ref| |g_ref|`
//! and `|c_run - c_ref| <= M |n_run - n_ref| / (n_run n_ref)` with `|n_run - n_ref| <= |t|`
//! (the norm of the bounds), so the clipped gradients differ by at most `dt`; `f` is
//! increasing, so the updates differ by at most `max(f(x + dt) - f(x), f(x) - f(x - dt))`
//! at `x = c_ref g_ref`. Each run computes its update in f32 within `gamma_16` of `f`
//! (products, quotients, the square root and the sums of the moments and bias corrections,
//! counted generously) and its new parameter within `gamma_4 (|p0| + lr (1 + wd |p0|))`.
//! [`first_step_bounds`] adds these per element. The training program knows both
//! gradients, so it passes their measured difference as `t` (after the gradient check has
//! found it within its bound): the worst-case `t` of every element at once has a 2-norm
//! close to the gradient's own in the default configuration, which makes the clipping
//! factor's bound, and with it every parameter's, as loose as `2 lr` (a learning rate off
//! by 3x passes). The bound is tight where `|g|` is well
//! above `eps` and `dt` (about `1e-8` for `lr = 1e-3`: a change of the learning rate by one
//! part in a thousand exceeds it) and loose (up to `2 lr`) where the gradient is within
//! `dt` of zero. Past the first step Adam divides by running averages of the gradients'
//! squares, so there is no such bound; the loss curves and parameters of two runs over
//! many steps are compared with the empirical margins documented in the integration tests.

use crate::model::Mlp;

/// Hyper-parameters of AdamW with gradient clipping by global norm.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// Largest global gradient norm (<= 0: no clipping).
    pub max_norm: f32,
}

/// Optimizer state: moments and the beta powers (`beta^t`, kept as running products in f32
/// as the GPU kernel does).
#[derive(Debug, Clone)]
pub struct AdamState {
    /// First moments.
    pub m: Vec<f32>,
    /// Second moments.
    pub v: Vec<f32>,
    /// `beta1^t`.
    pub beta1_pow: f32,
    /// `beta2^t`.
    pub beta2_pow: f32,
}

impl AdamState {
    /// Zero moments for `n` parameters.
    pub fn new(n: usize) -> AdamState {
        AdamState {
            m: vec![0.0; n],
            v: vec![0.0; n],
            beta1_pow: 1.0,
            beta2_pow: 1.0,
        }
    }
}

/// Forward pass over `rows` samples `x` (row-major `rows x input`). Returns the
/// activations: `acts[0] = x`, `acts[l + 1]` the output of layer `l` (after ReLU; the last
/// is the model's output).
pub fn forward(mlp: &Mlp, p: &[f32], x: &[f32], rows: usize) -> Vec<Vec<f32>> {
    forward_impl(mlp, p, x, rows, false)
}

fn forward_impl(mlp: &Mlp, p: &[f32], x: &[f32], rows: usize, abs: bool) -> Vec<Vec<f32>> {
    assert_eq!(x.len(), rows * mlp.input());
    let mut acts = vec![x.to_vec()];
    for l in 0..mlp.layers() {
        let (din, dout) = (mlp.dims[l], mlp.dims[l + 1]);
        let w = &p[mlp.w_off[l]..mlp.w_off[l] + din * dout];
        let b = &p[mlp.b_off[l]..mlp.b_off[l] + dout];
        let h = &acts[l];
        let relu = l + 1 < mlp.layers() && !abs;
        let mut z = vec![0.0f32; rows * dout];
        for r in 0..rows {
            let hr = &h[r * din..(r + 1) * din];
            for o in 0..dout {
                let wo = &w[o * din..(o + 1) * din];
                let mut acc = 0.0f32;
                for i in 0..din {
                    acc += if abs {
                        wo[i].abs() * hr[i]
                    } else {
                        wo[i] * hr[i]
                    };
                }
                let v = acc + if abs { b[o].abs() } else { b[o] };
                z[r * dout + o] = if relu && v < 0.0 { 0.0 } else { v };
            }
        }
        acts.push(z);
    }
    acts
}

/// MSE over `y` against `t`: returns `(sum of squared differences, dy)` with
/// `dy = scale * (y - t)`.
pub fn loss_grad(y: &[f32], t: &[f32], scale: f32) -> (f64, Vec<f32>) {
    let mut sum = 0.0f64;
    let dy = y
        .iter()
        .zip(t)
        .map(|(a, b)| {
            let d = a - b;
            sum += (d * d) as f64;
            scale * d
        })
        .collect();
    (sum, dy)
}

/// Backward pass: from the activations and the output gradient `dy`, produces each layer's
/// gradient (weight then bias, the layer's range of the flat vector) in backward order,
/// handing each to `emit(layer, grad)` as soon as it is complete.
pub fn backward(
    mlp: &Mlp,
    p: &[f32],
    acts: &[Vec<f32>],
    dy: Vec<f32>,
    rows: usize,
    emit: impl FnMut(usize, Vec<f32>),
) {
    backward_impl(mlp, p, acts, dy, rows, false, emit)
}

fn backward_impl(
    mlp: &Mlp,
    p: &[f32],
    acts: &[Vec<f32>],
    dy: Vec<f32>,
    rows: usize,
    abs: bool,
    mut emit: impl FnMut(usize, Vec<f32>),
) {
    let mut g = dy;
    for l in (0..mlp.layers()).rev() {
        let (din, dout) = (mlp.dims[l], mlp.dims[l + 1]);
        let w = &p[mlp.w_off[l]..mlp.w_off[l] + din * dout];
        let h = &acts[l];
        let mut grad = vec![0.0f32; din * dout + dout];
        // dW[o][i] = sum_r g[r][o] * h[r][i], summed over r in order.
        for o in 0..dout {
            for i in 0..din {
                let mut acc = 0.0f32;
                for r in 0..rows {
                    acc += g[r * dout + o] * h[r * din + i];
                }
                grad[o * din + i] = acc;
            }
        }
        for o in 0..dout {
            let mut acc = 0.0f32;
            for r in 0..rows {
                acc += g[r * dout + o];
            }
            grad[din * dout + o] = acc;
        }
        if l > 0 {
            // dh[r][i] = sum_o g[r][o] * W[o][i], then the ReLU mask of layer l-1's output.
            let mut dh = vec![0.0f32; rows * din];
            for r in 0..rows {
                for i in 0..din {
                    let mut acc = 0.0f32;
                    for o in 0..dout {
                        let wv = if abs {
                            w[o * din + i].abs()
                        } else {
                            w[o * din + i]
                        };
                        acc += g[r * dout + o] * wv;
                    }
                    dh[r * din + i] = if !abs && h[r * din + i] <= 0.0 {
                        0.0
                    } else {
                        acc
                    };
                }
            }
            g = dh;
        }
        emit(l, grad);
    }
}

/// Gradient of the mean squared error over `rows` samples, in the flat layout (the
/// one-rank computation of the whole batch).
pub fn gradient(mlp: &Mlp, p: &[f32], x: &[f32], t: &[f32], rows: usize) -> Vec<f32> {
    let acts = forward(mlp, p, x, rows);
    let scale = 2.0 / (rows * mlp.output()) as f32;
    let (_, dy) = loss_grad(&acts[mlp.layers()], t, scale);
    let mut g = vec![0.0f32; mlp.params];
    backward(mlp, p, &acts, dy, rows, |l, lg| {
        g[mlp.layer_range(l)].copy_from_slice(&lg)
    });
    g
}

/// The absolute-value computation `A` of every gradient element (see the
/// [module](self)): inputs, weights, biases and labels by magnitude (labels through the
/// teacher's absolute-value forward), ReLU masks dropped.
pub fn abs_gradient(
    mlp: &Mlp,
    p: &[f32],
    teacher: &Mlp,
    tp: &[f32],
    x: &[f32],
    rows: usize,
) -> Vec<f32> {
    let xa: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let acts = forward_impl(mlp, p, &xa, rows, true);
    let ta = forward_impl(teacher, tp, &xa, rows, true);
    let scale = 2.0 / (rows * mlp.output()) as f32;
    let dy: Vec<f32> = acts[mlp.layers()]
        .iter()
        .zip(&ta[teacher.layers()])
        .map(|(y, t)| scale * (y + t))
        .collect();
    let mut g = vec![0.0f32; mlp.params];
    backward_impl(mlp, p, &acts, dy, rows, true, |l, lg| {
        g[mlp.layer_range(l)].copy_from_slice(&lg)
    });
    g
}

/// The longest rounding chain `k` of a gradient element (see the [module](self)).
pub fn rounding_depth(mlp: &Mlp, teacher: &Mlp, rows: usize, nranks: usize) -> usize {
    let fwd = |m: &Mlp| (0..m.layers()).map(|l| m.dims[l] + 1).sum::<usize>();
    let bwd: usize = (1..mlp.layers()).map(|l| mlp.dims[l + 1]).sum();
    fwd(mlp) + fwd(teacher) + 2 + bwd + rows + nranks + 1
}

/// Tolerance of one gradient element: `2 gamma_k * A` (see the [module](self)).
pub fn grad_tolerance(k: usize, abs: f32) -> f32 {
    let u = f64::from(f32::EPSILON) / 2.0;
    let gamma = k as f64 * u / (1.0 - k as f64 * u);
    (2.0 * gamma * abs as f64) as f32
}

/// Global L2 norm of `g`, accumulated in f64 in order.
pub fn norm(g: &[f32]) -> f32 {
    g.iter()
        .map(|&v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt() as f32
}

/// Per-element bounds on `|p_run - p_ref|` after the first AdamW step of two runs from the
/// same parameters `p0`, whose averaged gradients differ by at most `tol` per element
/// around the reference `g_ref` (see the [module](self), "The first step's parameters").
///
/// `norm_rel`: how far, relative to the norm, each run's computed global norm may be from
/// the exact one (the clipping factor's input): `2^-24` for [`norm`]'s f64 sum rounded to
/// f32; more for a GPU's f32 reduction.
pub fn first_step_bounds(
    h: &AdamW,
    p0: &[f32],
    g_ref: &[f32],
    tol: &[f32],
    norm_rel: f64,
) -> Vec<f32> {
    let u = f64::from(f32::EPSILON) / 2.0;
    let gamma = |k: f64| k * u / (1.0 - k * u);
    let n_ref = norm(g_ref) as f64;
    // |n_run - n_ref| <= |tol| (triangle inequality), plus both norms' rounding.
    let dn = tol.iter().map(|&t| (t as f64).powi(2)).sum::<f64>().sqrt() + 2.0 * norm_rel * n_ref;
    let m = h.max_norm as f64;
    let (c_ref, dc) = if h.max_norm <= 0.0 || n_ref + dn < m {
        // Neither run clips.
        (1.0, 0.0)
    } else {
        let n_lo = n_ref - dn;
        let dc = if n_lo > 0.0 {
            (m * dn / (n_lo * n_ref)).min(1.0)
        } else {
            1.0
        };
        ((m / n_ref).min(1.0), dc)
    };
    let (lr, eps, wd) = (h.lr as f64, h.eps as f64, h.weight_decay as f64);
    let f = |x: f64| x / (x.abs() + eps);
    p0.iter()
        .zip(g_ref)
        .zip(tol)
        .map(|((&p, &g), &t)| {
            let (p, g, t) = (p.abs() as f64, g as f64, t as f64);
            let x = c_ref * g;
            let dt = t + dc * g.abs();
            let df = (f(x + dt) - f(x)).max(f(x) - f(x - dt));
            let rounding = 2.0 * (lr * gamma(16.0) + gamma(4.0) * (p + lr * (1.0 + wd * p)));
            (lr * df + rounding) as f32 + f32::MIN_POSITIVE
        })
        .collect()
}

/// One AdamW step on `p` with the averaged gradient `g`: clips by the global norm, then
/// updates the moments and parameters like the GPU kernel. Returns the norm before
/// clipping.
pub fn adamw_step(h: &AdamW, p: &mut [f32], g: &[f32], s: &mut AdamState) -> f32 {
    let n = norm(g);
    let clip = if h.max_norm > 0.0 && n > h.max_norm {
        h.max_norm / n
    } else {
        1.0
    };
    s.beta1_pow *= h.beta1;
    s.beta2_pow *= h.beta2;
    let (bc1, bc2) = (1.0 - s.beta1_pow, 1.0 - s.beta2_pow);
    for k in 0..p.len() {
        let gk = g[k] * clip;
        let mk = h.beta1 * s.m[k] + (1.0 - h.beta1) * gk;
        let vk = h.beta2 * s.v[k] + (1.0 - h.beta2) * gk * gk;
        s.m[k] = mk;
        s.v[k] = vk;
        let upd = (mk / bc1) / ((vk / bc2).sqrt() + h.eps);
        p[k] -= h.lr * (upd + h.weight_decay * p[k]);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{self, seeds};

    /// Student, its parameters, teacher, its parameters, inputs, labels, rows.
    type Setup = (Mlp, Vec<f32>, Mlp, Vec<f32>, Vec<f32>, Vec<f32>, usize);

    fn setup() -> Setup {
        let mlp = Mlp::new(vec![6, 5, 4, 3]);
        let teacher = Mlp::new(vec![6, 4, 3]);
        let p = mlp.init(seeds::student(7), 1.0);
        let tp = teacher.init(seeds::teacher(7), 1.0);
        let rows = 5;
        let x = model::inputs(seeds::data(7), 0, rows, 6);
        let t = forward(&teacher, &tp, &x, rows).pop().unwrap();
        (mlp, p, teacher, tp, x, t, rows)
    }

    fn loss(mlp: &Mlp, p: &[f32], x: &[f32], t: &[f32], rows: usize) -> f64 {
        let y = forward(mlp, p, x, rows).pop().unwrap();
        loss_grad(&y, t, 1.0).0 / (rows * mlp.output()) as f64
    }

    /// The backward pass against central finite differences of the loss (steps of 1e-3:
    /// small enough not to cross a ReLU kink for this seed; a check of signs, layout, scale).
    #[test]
    fn gradient_matches_finite_differences() {
        let (mlp, p, _, _, x, t, rows) = setup();
        let g = gradient(&mlp, &p, &x, &t, rows);
        let h = 1e-3f32;
        let mut worst = 0.0f64;
        for k in 0..mlp.params {
            let (mut a, mut b) = (p.clone(), p.clone());
            a[k] += h;
            b[k] -= h;
            let fd =
                (loss(&mlp, &a, &x, &t, rows) - loss(&mlp, &b, &x, &t, rows)) / (2.0 * h as f64);
            let err = (fd - g[k] as f64).abs() / (fd.abs().max(g[k].abs() as f64) + 1e-2);
            worst = worst.max(err);
        }
        assert!(worst < 2e-2, "worst relative error {worst}");
    }

    /// Averaging shard gradients (the data-parallel computation) matches the whole-batch
    /// gradient within the derived tolerance, and a wrong averaging factor does not.
    #[test]
    fn sharded_average_within_tolerance() {
        let (mlp, p, teacher, tp, x, t, rows) = setup();
        let whole = gradient(&mlp, &p, &x, &t, rows);
        let abs = abs_gradient(&mlp, &p, &teacher, &tp, &x, rows);
        let k = rounding_depth(&mlp, &teacher, rows, 5);
        // Five ranks of one sample each.
        let (din, dout) = (mlp.input(), mlp.output());
        let mut sum = vec![0.0f32; mlp.params];
        for r in 0..rows {
            let g = gradient(
                &mlp,
                &p,
                &x[r * din..(r + 1) * din],
                &t[r * dout..(r + 1) * dout],
                1,
            );
            for (s, v) in sum.iter_mut().zip(g) {
                *s += v;
            }
        }
        let ok = |scale: f32| {
            sum.iter()
                .zip(&whole)
                .zip(&abs)
                .all(|((s, w), a)| (s * scale - w).abs() <= grad_tolerance(k, *a))
        };
        assert!(ok(1.0 / rows as f32));
        assert!(!ok(1.0 / (rows - 1) as f32));
        assert!(!ok(1.0));
    }

    #[test]
    fn first_step_bounds_hold_and_catch_a_changed_learning_rate() {
        let (mlp, p, teacher, tp, x, t, rows) = setup();
        let g = gradient(&mlp, &p, &x, &t, rows);
        let abs = abs_gradient(&mlp, &p, &teacher, &tp, &x, rows);
        let k = rounding_depth(&mlp, &teacher, rows, 3);
        let tol: Vec<f32> = abs.iter().map(|&a| grad_tolerance(k, a)).collect();
        for max_norm in [0.0f32, 0.05, 1e3] {
            let h = AdamW {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                max_norm,
            };
            let bounds = first_step_bounds(&h, &p, &g, &tol, f64::from(f32::EPSILON) / 2.0);
            let step = |h: &AdamW, g: &[f32]| {
                let mut q = p.clone();
                let mut s = AdamState::new(q.len());
                adamw_step(h, &mut q, g, &mut s);
                q
            };
            let reference = step(&h, &g);
            // Gradients moved by up to their bound, with alternating signs (a run of
            // another rank count at its worst).
            let moved: Vec<f32> = g
                .iter()
                .zip(&tol)
                .enumerate()
                .map(|(i, (v, t))| if i % 2 == 0 { v + t } else { v - t })
                .collect();
            let run = step(&h, &moved);
            for i in 0..p.len() {
                assert!(
                    (run[i] - reference[i]).abs() <= bounds[i],
                    "max_norm {max_norm} element {i}: {} > {}",
                    (run[i] - reference[i]).abs(),
                    bounds[i]
                );
            }
            // A learning rate off by one part in a thousand is caught on most elements (not
            // where the gradient is within its bound of zero, where the bound is loose).
            let off = step(&AdamW { lr: 1.001e-3, ..h }, &g);
            let caught = (0..p.len())
                .filter(|&i| (off[i] - reference[i]).abs() > bounds[i])
                .count();
            assert!(caught * 4 >= p.len() * 3, "only {caught} of {}", p.len());
        }
    }

    #[test]
    fn adamw_first_step_moves_by_lr() {
        let h = AdamW {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            max_norm: 0.0,
        };
        let mut p = vec![1.0f32, 1.0, 1.0];
        let mut s = AdamState::new(3);
        adamw_step(&h, &mut p, &[2.0, -3.0, 0.0], &mut s);
        assert!((p[0] - 0.9).abs() < 1e-6 && (p[1] - 1.1).abs() < 1e-6 && p[2] == 1.0);
        // Clipping: the norm 5 clipped to 1 scales the moments, not the first update.
        let h2 = AdamW { max_norm: 1.0, ..h };
        let mut s2 = AdamState::new(2);
        let mut q = vec![0.0f32; 2];
        assert_eq!(adamw_step(&h2, &mut q, &[3.0, 4.0], &mut s2), 5.0);
        assert!((s2.m[0] - 0.1 * 0.6).abs() < 1e-7);
    }
}
