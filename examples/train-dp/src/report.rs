//! Per-step timings, the printed lines, the summary and the JSON report.

use serde::Serialize;

/// Timings of one step, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTime {
    /// The whole step (data, forward, backward, communication, optimizer).
    pub step_ms: f64,
    /// Communication not hidden behind the backward pass: from the end of the backward
    /// compute to the end of the last bucket's all-reduce.
    pub exposed_ms: f64,
    /// From the first bucket's all-reduce start to the last one's end (the comm stream's
    /// busy span).
    pub comm_ms: f64,
}

/// One printed line.
#[derive(Debug, Clone, Serialize)]
pub struct LogRow {
    /// Steps done.
    pub step: usize,
    /// Loss of the last step, mean over the ranks.
    pub loss: f64,
    /// Averaged gradient's global norm of the last step (before clipping).
    pub grad_norm: f64,
    /// Mean step time since the last line.
    pub step_ms: f64,
    /// Global samples per second since the last line.
    pub samples_per_s: f64,
    /// Mean exposed communication since the last line.
    pub exposed_comm_ms: f64,
    /// Mean communication span since the last line.
    pub comm_ms: f64,
    /// With `--baseline`: this line's samples/s over `nranks x` the baseline's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaling: Option<f64>,
}

/// Averages over the timed steps.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Summary {
    /// Steps averaged (after the warm-up).
    pub timed_steps: usize,
    /// Mean step time.
    pub step_ms: f64,
    /// Global samples per second.
    pub samples_per_s: f64,
    /// Mean exposed communication per step.
    pub exposed_comm_ms: f64,
    /// Mean communication span per step.
    pub comm_ms: f64,
    /// Loss after the first step.
    pub first_loss: f64,
    /// Loss after the last step.
    pub last_loss: f64,
    /// With `--baseline`: samples/s of rank 0 training alone in the same run (same model,
    /// same per-rank batch, same steps and warm-up).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_samples_per_s: Option<f64>,
    /// With `--baseline`: `samples_per_s / (nranks * baseline_samples_per_s)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaling_efficiency: Option<f64>,
}

/// Result of the first step's gradient check.
#[derive(Debug, Clone, Serialize)]
pub struct GradCheck {
    /// Elements compared.
    pub elements: usize,
    /// Elements outside their tolerance.
    pub violations: usize,
    /// Largest `|difference| / tolerance` (below 1 passes).
    pub max_ratio: f64,
    /// Largest absolute difference.
    pub max_abs_diff: f64,
    /// The rounding depth `k` of the bound.
    pub depth: usize,
    /// The parameters after the first step against the reference's, within
    /// `cpu::first_step_bounds` (Host transport only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<ParamCheck>,
}

/// Result of the first step's parameter check.
#[derive(Debug, Clone, Serialize)]
pub struct ParamCheck {
    /// Parameters compared.
    pub elements: usize,
    /// Parameters outside their bound.
    pub violations: usize,
    /// Largest `|difference| / bound` (below 1 passes).
    pub max_ratio: f64,
    /// Largest absolute difference.
    pub max_abs_diff: f64,
}

/// One training run (ours, or NCCL's with `--compare`).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Whose all-reduce: `mscclpp`, `nccl`, or `none` (one rank).
    pub library: String,
    /// `gpu` or `host`.
    pub backend: String,
    /// The printed lines.
    pub log: Vec<LogRow>,
    /// Averages.
    pub summary: Summary,
    /// The parameter checksum every rank reported.
    pub checksum: String,
    /// Whether every rank's parameters were bit-identical.
    pub identical: bool,
    /// The gradient check, when run.
    pub grad_check: Option<GradCheck>,
}

/// Collects step timings and losses into lines and a summary.
#[derive(Debug, Default)]
pub struct Recorder {
    times: Vec<StepTime>,
    since: usize,
    /// Lines so far.
    pub log: Vec<LogRow>,
    first_loss: Option<f64>,
    last_loss: f64,
    /// `(1-rank samples/s, ranks)` when a baseline was measured.
    baseline: Option<(f64, usize)>,
}

impl Recorder {
    /// A recorder whose lines and summary also report the scaling efficiency against a
    /// 1-rank baseline of `baseline_samples_per_s` (when given) over `nranks` ranks.
    pub fn new(baseline_samples_per_s: Option<f64>, nranks: usize) -> Recorder {
        Recorder {
            baseline: baseline_samples_per_s.map(|b| (b, nranks)),
            ..Recorder::default()
        }
    }

    /// `samples_per_s / (nranks * baseline)`, with a baseline.
    fn scaling(&self, samples_per_s: f64) -> Option<f64> {
        self.baseline.map(|(b, n)| samples_per_s / (n as f64 * b))
    }

    /// Records a step's timings.
    pub fn step(&mut self, t: StepTime) {
        self.times.push(t);
    }

    /// Makes a line from the steps since the last one (and prints it on rank 0).
    pub fn line(&mut self, label: &str, loss: f64, grad_norm: f64, batch: usize, print: bool) {
        let ts = &self.times[self.since..];
        self.since = self.times.len();
        let mean = |f: fn(&StepTime) -> f64| ts.iter().map(f).sum::<f64>() / ts.len().max(1) as f64;
        let row = LogRow {
            step: self.times.len(),
            loss,
            grad_norm,
            step_ms: mean(|t| t.step_ms),
            samples_per_s: batch as f64 / (mean(|t| t.step_ms) / 1e3),
            exposed_comm_ms: mean(|t| t.exposed_ms),
            comm_ms: mean(|t| t.comm_ms),
            scaling: None,
        };
        let row = LogRow {
            scaling: self.scaling(row.samples_per_s),
            ..row
        };
        if print {
            println!(
                "[{label}] step {:>5}  loss {:>11.6}  |g| {:>9.4}  step {:>9.3} ms  {:>11.1} samples/s  exposed comm {:>8.3} ms  comm {:>8.3} ms{}",
                row.step,
                row.loss,
                row.grad_norm,
                row.step_ms,
                row.samples_per_s,
                row.exposed_comm_ms,
                row.comm_ms,
                row.scaling
                    .map(|s| format!("  scaling {s:.3}"))
                    .unwrap_or_default()
            );
        }
        self.first_loss.get_or_insert(loss);
        self.last_loss = loss;
        self.log.push(row);
    }

    /// Sets the loss after the first step (when no line was made then).
    pub fn first_loss(&mut self, loss: f64) {
        self.first_loss.get_or_insert(loss);
    }

    /// Averages over the steps after `warmup` (all steps when there are no more).
    pub fn summary(&self, warmup: usize, batch: usize) -> Summary {
        let ts = if self.times.len() > warmup {
            &self.times[warmup..]
        } else {
            &self.times[..]
        };
        let n = ts.len().max(1) as f64;
        let step_ms = ts.iter().map(|t| t.step_ms).sum::<f64>() / n;
        let samples_per_s = batch as f64 / (step_ms / 1e3);
        Summary {
            timed_steps: ts.len(),
            step_ms,
            samples_per_s,
            exposed_comm_ms: ts.iter().map(|t| t.exposed_ms).sum::<f64>() / n,
            comm_ms: ts.iter().map(|t| t.comm_ms).sum::<f64>() / n,
            first_loss: self.first_loss.unwrap_or(f64::NAN),
            last_loss: self.last_loss,
            baseline_samples_per_s: self.baseline.map(|(b, _)| b),
            scaling_efficiency: self.scaling(samples_per_s),
        }
    }
}

/// Prints a summary line for a run of `nranks` ranks (with `--baseline`, ending with the
/// scaling efficiency).
pub fn print_summary(r: &RunReport, nranks: usize) {
    let s = &r.summary;
    let scaling = match (s.baseline_samples_per_s, s.scaling_efficiency) {
        (Some(b), Some(e)) => format!(
            "; scaling efficiency {e:.4} = {:.1} samples/s / ({nranks} x {b:.1} samples/s of the 1-rank baseline in this run)",
            s.samples_per_s
        ),
        _ => String::new(),
    };
    println!(
        "[{}] summary: {} timed steps, {:.3} ms/step, {:.1} samples/s, exposed comm {:.3} ms/step ({:.1}% of the step), comm span {:.3} ms/step; loss {:.6} -> {:.6}; parameters {} (checksum {}){scaling}",
        r.library,
        s.timed_steps,
        s.step_ms,
        s.samples_per_s,
        s.exposed_comm_ms,
        100.0 * s.exposed_comm_ms / s.step_ms.max(1e-12),
        s.comm_ms,
        s.first_loss,
        s.last_loss,
        match (nranks, r.identical) {
            // One rank: nothing to compare.
            (1, _) => "of the one rank",
            (_, true) => "bit-identical across ranks",
            (_, false) => "DIFFERENT across ranks",
        },
        r.checksum
    );
}
