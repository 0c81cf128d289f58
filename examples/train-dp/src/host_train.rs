//! Training on the Host transport (no GPU): the CPU reference does the math, and
//! `Collectives::all_reduce` on the Host backend averages the gradient buckets across the rank processes.
//!
//! The overlap is real here too: each step's backward pass runs on a worker thread and
//! hands every bucket over as soon as its lowest layer is done; this thread all-reduces
//! the buckets in order while the worker computes the remaining layers.

use mscclpp::host::collectives::Exec;
use std::sync::mpsc;
use std::time::Instant;

use mscclpp::host::collectives::{Collectives, ReduceOp};

use crate::baseline::Mode;
use crate::config::{Config, GradDtype};
use crate::cpu::{self, AdamState, AdamW};
use crate::model::{self, Bucket, Mlp, seeds};
use crate::report::{GradCheck, ParamCheck, RunReport, StepTime};
use crate::{Error, Ranks};

/// Faults the integration tests inject (`TRAIN_DP_FAULT`) to show that the checks fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `sum-not-mean`: the buckets are summed but not divided by the rank count.
    SumNotMean,
    /// `no-allreduce`: every rank keeps its own gradient.
    NoAllReduce,
    /// `lr-off`: the optimizer runs with the learning rate one part in a thousand too
    /// high (the first step's parameter check must catch it, on either backend).
    LrOff,
}

fn fault() -> Option<Fault> {
    static F: std::sync::OnceLock<Option<Fault>> = std::sync::OnceLock::new();
    *F.get_or_init(|| match std::env::var("TRAIN_DP_FAULT").as_deref() {
        Ok("sum-not-mean") => Some(Fault::SumNotMean),
        Ok("no-allreduce") => Some(Fault::NoAllReduce),
        Ok("lr-off") => Some(Fault::LrOff),
        _ => None,
    })
}

/// The optimizer's hyper-parameters as this run applies them: `cfg`'s, unless the
/// `lr-off` fault is injected (`TRAIN_DP_FAULT`).
pub fn applied_adamw(cfg: &Config) -> AdamW {
    let mut h = cfg.adamw;
    if fault() == Some(Fault::LrOff) {
        h.lr *= 1.001;
    }
    h
}

/// All-reduces `g` in place (sum over the `n` ranks) in the configured wire type, then
/// scales by `1 / n`. One rank (also rank 0 alone, `--baseline`) does nothing.
fn average(coll: &Collectives, n: usize, g: &mut [f32], dtype: GradDtype) -> Result<(), Error> {
    let f = fault();
    if n > 1 && f != Some(Fault::NoAllReduce) {
        match dtype {
            GradDtype::F32 => coll.all_reduce_in_place(g, ReduceOp::Sum, Exec::Host)?,
            GradDtype::Bf16 => {
                let mut b: Vec<half::bf16> = g
                    .iter()
                    .map(|&v| half::bf16::from_bits(train_dp_kernels::f32_to_bf16_bits(v)))
                    .collect();
                coll.all_reduce_in_place(&mut b, ReduceOp::Sum, Exec::Host)?;
                for (d, s) in g.iter_mut().zip(&b) {
                    *d = s.to_f32();
                }
            }
        }
    }
    let inv = if f == Some(Fault::SumNotMean) {
        1.0
    } else {
        1.0 / n as f32
    };
    if n > 1 {
        for v in g.iter_mut() {
            *v *= inv;
        }
    }
    Ok(())
}

/// The first step's check: this rank's averaged gradient against the CPU reference of the
/// whole global batch, within the bound of [`cpu`]'s module docs (plus the bf16 rounding
/// when the gradients travel as bf16).
pub fn check_gradient(
    cfg: &Config,
    mlp: &Mlp,
    p: &[f32],
    teacher: &Mlp,
    tp: &[f32],
    step: usize,
    avg: &[f32],
) -> (GradCheck, FirstStep) {
    let x = model::inputs(
        seeds::data(cfg.seed),
        (step * cfg.batch) as u64,
        cfg.batch,
        cfg.width,
    );
    let t = cpu::forward(teacher, tp, &x, cfg.batch).pop().unwrap();
    let reference = cpu::gradient(mlp, p, &x, &t, cfg.batch);
    let abs = cpu::abs_gradient(mlp, p, teacher, tp, &x, cfg.batch);
    let k = cpu::rounding_depth(mlp, teacher, cfg.batch, cfg.nranks);
    // bf16: each shard's gradient rounded once (2^-9 relative) and n - 1 rounded adds; the
    // shards' magnitudes average to at most `abs`.
    let bf16 = if cfg.grad_dtype == GradDtype::Bf16 && cfg.nranks > 1 {
        (cfg.nranks + 1) as f32 * 2f32.powi(-8)
    } else {
        0.0
    };
    let mut out = GradCheck {
        elements: avg.len(),
        violations: 0,
        max_ratio: 0.0,
        max_abs_diff: 0.0,
        depth: k,
        params: None,
    };
    for ((g, r), a) in avg.iter().zip(&reference).zip(&abs) {
        let tol = cpu::grad_tolerance(k, *a) + bf16 * a + f32::MIN_POSITIVE;
        let d = (g - r).abs();
        if d > tol || !d.is_finite() {
            out.violations += 1;
        }
        out.max_ratio = out.max_ratio.max((d / tol) as f64);
        out.max_abs_diff = out.max_abs_diff.max(d as f64);
    }
    let first = FirstStep {
        p0: p.to_vec(),
        reference,
        run: avg.to_vec(),
    };
    (out, first)
}

/// What the first step's parameter check needs from the gradient check: the parameters
/// before the step, the reference gradient and this run's (which the gradient check found
/// within its bound).
pub struct FirstStep {
    p0: Vec<f32>,
    reference: Vec<f32>,
    run: Vec<f32>,
}

/// The first step's parameter check of this run's parameters `p1` against `cfg`'s
/// optimizer (see [`FirstStep::check`]): printed on rank 0 (prefixed with `label`, if
/// any), an error naming the rank on any violation.
pub fn check_first_step(
    first: &FirstStep,
    cfg: &Config,
    p1: &[f32],
    norm_rel: f64,
    rank: usize,
    label: Option<&str>,
) -> Result<ParamCheck, Error> {
    let pc = first.check(&cfg.adamw, p1, norm_rel);
    let tag = label.map_or(String::new(), |l| format!("[{l}] "));
    if rank == 0 {
        println!(
            "{tag}parameter check (step 1, against the same step on the CPU reference's gradient): {} parameters, {} outside the bound, max |diff|/bound {:.3e}, max |diff| {:.3e}",
            pc.elements, pc.violations, pc.max_ratio, pc.max_abs_diff
        );
    }
    if pc.violations > 0 {
        return Err(format!(
            "rank {rank}: {tag}parameter check failed: {} of {} parameters outside the bound",
            pc.violations, pc.elements
        )
        .into());
    }
    Ok(pc)
}

impl FirstStep {
    /// Compares `p1`, this run's parameters after the first step, with the reference run's
    /// (the same AdamW step on the reference gradient) within `cpu::first_step_bounds`.
    /// `norm_rel`: see `cpu::first_step_bounds`.
    pub fn check(&self, h: &AdamW, p1: &[f32], norm_rel: f64) -> ParamCheck {
        let mut reference = self.p0.clone();
        cpu::adamw_step(
            h,
            &mut reference,
            &self.reference,
            &mut AdamState::new(p1.len()),
        );
        // Both gradients are known here: the bound takes their measured difference (the
        // f64 difference rounded up to f32), not the gradient check's worst-case bound,
        // whose 2-norm can reach the gradient's own and then make the clipping factor, and
        // so every parameter's bound, as loose as `2 lr`.
        let diffs: Vec<f32> = self
            .run
            .iter()
            .zip(&self.reference)
            .map(|(&a, &b)| ((f64::from(a) - f64::from(b)).abs() as f32).next_up())
            .collect();
        let bounds = cpu::first_step_bounds(h, &self.p0, &self.reference, &diffs, norm_rel);
        let mut out = ParamCheck {
            elements: p1.len(),
            violations: 0,
            max_ratio: 0.0,
            max_abs_diff: 0.0,
        };
        for ((a, b), t) in p1.iter().zip(&reference).zip(&bounds) {
            let d = (a - b).abs();
            if d > *t || !d.is_finite() {
                out.violations += 1;
            }
            out.max_ratio = out.max_ratio.max((d / t) as f64);
            out.max_abs_diff = out.max_abs_diff.max(d as f64);
        }
        out
    }
}

/// Trains on this rank; returns the report (rank 0's lines printed). `mode`: with the
/// other ranks, or rank 0 alone (`--baseline`; then `cfg` and `ranks` are one rank's).
pub fn run(
    cfg: &Config,
    coll: &Collectives,
    ranks: &Ranks,
    mode: &mut Mode<'_>,
) -> Result<RunReport, Error> {
    let (rank, n) = (ranks.rank, ranks.nranks);
    let mlp = Mlp::square(cfg.layers, cfg.width);
    let teacher = model::teacher(cfg.width, cfg.teacher_hidden);
    let tp = teacher.init(seeds::teacher(cfg.seed), 1.0);
    let mut p = mlp.init(seeds::student(cfg.seed), 1.0);
    let mut adam = AdamState::new(mlp.params);
    let buckets = model::buckets(&mlp, cfg.bucket_bytes / 4);
    if rank == 0 {
        println!(
            "no GPU: training on the Host transport (CPU reference math, all_reduce_host): {n} ranks, {} layers x {} wide ({} parameters), global batch {} ({} per rank), {} buckets of <= {:.3} KiB ({}), gradients as {:?}",
            cfg.layers,
            cfg.width,
            mlp.params,
            cfg.batch,
            cfg.rank_batch,
            buckets.len(),
            cfg.bucket_bytes as f64 / 1024.0,
            if cfg.overlap {
                "overlapped with backward"
            } else {
                "after backward"
            },
            cfg.grad_dtype
        );
    }
    let b = cfg.rank_batch;
    let scale = 2.0 / (b * mlp.output()) as f32;
    let mut rec = mode.recorder(n);
    let mut grad = vec![0.0f32; mlp.params];
    let mut grad_check = None;
    let label = mode.label(if n > 1 { "mscclpp" } else { "none" });
    for step in 0..cfg.steps {
        let t0 = Instant::now();
        let first = (step * cfg.batch + rank * b) as u64;
        let x = model::inputs(seeds::data(cfg.seed), first, b, cfg.width);
        let t = cpu::forward(&teacher, &tp, &x, b).pop().unwrap();
        let acts = cpu::forward(&mlp, &p, &x, b);
        let (sumsq, dy) = cpu::loss_grad(&acts[mlp.layers()], &t, scale);
        let loss = sumsq / (b * mlp.output()) as f64;
        let (bwd_end, comm_start, comm_end) =
            backward_and_average(cfg, coll, &mlp, &p, &acts, dy, b, &buckets, &mut grad)?;
        let exposed = comm_end.saturating_duration_since(bwd_end);
        let mut first_step = None;
        if step == 0 && cfg.check_grads {
            let (c, first) = check_gradient(cfg, &mlp, &p, &teacher, &tp, step, &grad);
            first_step = Some(first);
            if rank == 0 {
                println!(
                    "gradient check (step 1, global batch vs CPU reference): {} elements, {} outside the bound (k = {}), max |diff|/tol {:.3e}, max |diff| {:.3e}",
                    c.elements, c.violations, c.depth, c.max_ratio, c.max_abs_diff
                );
            }
            if c.violations > 0 {
                return Err(format!(
                    "rank {rank}: gradient check failed: {} of {} elements outside the bound",
                    c.violations, c.elements
                )
                .into());
            }
            grad_check = Some(c);
        }
        let norm = cpu::adamw_step(&applied_adamw(cfg), &mut p, &grad, &mut adam);
        if let (Some(first), Some(c)) = (&first_step, grad_check.as_mut()) {
            // Both runs' norms are `cpu::norm`: an f64 sum rounded once to f32.
            let norm_rel = f64::from(f32::EPSILON) / 2.0;
            c.params = Some(check_first_step(first, cfg, &p, norm_rel, rank, None)?);
        }
        rec.step(StepTime {
            step_ms: t0.elapsed().as_secs_f64() * 1e3,
            exposed_ms: exposed.as_secs_f64() * 1e3,
            comm_ms: comm_end.saturating_duration_since(comm_start).as_secs_f64() * 1e3,
        });
        if (step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps || step == 0 {
            let mean = ranks.mean(coll, loss)?;
            if step == 0 {
                rec.first_loss(mean);
            }
            if (step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps {
                rec.line(label, mean, norm as f64, cfg.batch, rank == 0);
            }
        }
        mode.between_steps()?;
    }
    crate::finish(cfg, coll, ranks, label, "host", &p, rec, grad_check)
}

/// One step's backward pass on a worker thread, the buckets averaged on this thread as the
/// worker hands them over (or all after it, without overlap). Returns when the backward
/// compute ended, when the first bucket's all-reduce started and when the last ended.
#[allow(clippy::too_many_arguments)]
fn backward_and_average(
    cfg: &Config,
    coll: &Collectives,
    mlp: &Mlp,
    p: &[f32],
    acts: &[Vec<f32>],
    dy: Vec<f32>,
    rows: usize,
    buckets: &[Bucket],
    grad: &mut [f32],
) -> Result<(Instant, Instant, Instant), Error> {
    let (tx, rx) = mpsc::channel::<(usize, Vec<f32>)>();
    let overlap = cfg.overlap;
    std::thread::scope(|s| {
        let worker = s.spawn(move || {
            let mut held = Vec::new();
            let mut cur = Vec::new();
            let mut k = 0;
            cpu::backward(mlp, p, acts, dy, rows, |l, lg| {
                // Layers arrive in backward order = the flat order inside a bucket.
                cur.extend_from_slice(&lg);
                if l == buckets[k].lo {
                    debug_assert_eq!(cur.len(), buckets[k].len());
                    let done = (k, std::mem::take(&mut cur));
                    if overlap {
                        // The receiver lives until every bucket has come.
                        let _ = tx.send(done);
                    } else {
                        held.push(done);
                    }
                    k += 1;
                }
            });
            let end = Instant::now();
            for h in held {
                let _ = tx.send(h);
            }
            end
        });
        let mut first = None;
        let mut result = Ok(());
        for want in 0..buckets.len() {
            let Ok((k, mut g)) = rx.recv() else {
                result = Err("the backward worker stopped early".into());
                break;
            };
            if k != want {
                result = Err(format!("bucket {k} arrived when {want} was due").into());
                break;
            }
            first.get_or_insert_with(Instant::now);
            if let Err(e) = average(coll, cfg.nranks, &mut g, cfg.grad_dtype) {
                result = Err(e);
                break;
            }
            grad[buckets[k].start..buckets[k].end].copy_from_slice(&g);
        }
        let comm_end = Instant::now();
        let bwd_end = worker.join().map_err(|_| "the backward worker panicked")?;
        result.map(|()| (bwd_end, first.unwrap_or(comm_end), comm_end))
    })
}
