//! The command line and the resolved run configuration.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::cpu::AdamW;

/// Data-parallel MLP training over mscclpp's all-reduce, one process per GPU.
///
/// Started alone it spawns one rank per local GPU (`--nranks` to choose; two ranks on the
/// Host transport without a GPU); under mpirun / torchrun / srun each process is one rank.
/// `--batch` is the *global* batch, split evenly over the ranks.
#[derive(Parser, Debug, Clone)]
// `--lr -1` is a bad learning rate, not an unknown flag `-1`.
#[command(name = "train-dp", version, allow_negative_numbers = true)]
pub struct Args {
    /// Size preset: `comm` (communication-heavy: 4 x 8192 wide, 268 M parameters, 32
    /// samples per rank), `compute` (compute-heavy: 4 x 2048 wide, 16.8 M parameters, 8192
    /// samples per rank). Explicit size flags override it.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// Number of layers (each `width x width`).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Features per layer (input and output too).
    #[arg(long)]
    pub width: Option<usize>,
    /// Global batch (samples per step over all ranks; a multiple of the rank count).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Training steps.
    #[arg(long)]
    pub steps: Option<usize>,
    /// Hidden width of the teacher MLP `[width, hidden, width]` that labels the data.
    #[arg(long, default_value_t = 64)]
    pub teacher_hidden: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3, allow_hyphen_values = true)]
    pub lr: f32,
    /// AdamW's decoupled weight decay.
    #[arg(long, default_value_t = 0.01, allow_hyphen_values = true)]
    pub weight_decay: f32,
    /// Clip the averaged gradient to this global L2 norm (0: no clipping).
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true)]
    pub clip: f32,
    /// Gradient bucket size in MiB (as PyTorch DDP's `bucket_cap_mb`; fractions allowed).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// All-reduce every bucket after the whole backward pass instead of as soon as it is
    /// ready (for comparison).
    #[arg(long)]
    pub no_overlap: bool,
    /// Element type the gradients are all-reduced in (`bf16`: converted before and after).
    #[arg(long, value_enum, default_value = "f32")]
    pub grad_dtype: GradDtype,
    /// Capture the whole step (both streams) in a CUDA graph and replay it (GPU only).
    #[arg(long)]
    pub graph: bool,
    /// Also run the same training with NCCL's all-reduce, in the same run (GPU only).
    #[arg(long, value_enum)]
    pub compare: Option<Compare>,
    /// Print a line every N steps.
    #[arg(long, default_value_t = 10)]
    pub log_every: usize,
    /// Steps left out of the timing summary (the first ones: allocation, graph upload);
    /// below `--steps` (default 3, or `--steps - 1` when that is fewer).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Write a JSON report here (rank 0).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seed of the data, the teacher and the initial parameters.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Local ranks to start (default: one per GPU; 2 without a GPU).
    #[arg(long)]
    pub nranks: Option<usize>,
    /// Check the first step's averaged gradient against the CPU reference over the global
    /// batch (default: on when the model is small enough for the CPU; see `--no-check`).
    #[arg(long, conflicts_with = "no_check")]
    pub check_grads: bool,
    /// Skip the gradient check.
    #[arg(long)]
    pub no_check: bool,
    /// Rank 0 writes the final parameters here (raw little-endian f32, flat layout).
    #[arg(long)]
    pub dump_params: Option<PathBuf>,
    /// Run on the Host transport with the CPU reference even when a GPU is present.
    #[arg(long)]
    pub host: bool,
    /// Measure the 1-rank reference of the scaling efficiency in this run: before the
    /// multi-rank training, rank 0 trains the same model alone at the same per-rank batch
    /// for the same steps (no all-reduce) while the other ranks wait; the lines and the
    /// summary then report `samples/s / (nranks x 1-rank samples/s)`.
    #[arg(long)]
    pub baseline: bool,
    /// Most blocks of each all-reduce kernel (`CollConfig::max_blocks`, 1..=128; default
    /// `MSCCLPP_COLL_MAX_BLOCKS` or 128). Fewer blocks leave more SMs and memory bandwidth
    /// to the overlapped backward GEMMs. GPU only: the Host transport checks and records it.
    #[arg(long)]
    pub allreduce_blocks: Option<u32>,
    /// Split the ranks into N simulated hosts (rank r on `simhost{r * N / nranks}`, as
    /// `MSCCLPP_HOST_ID` would on real machines), so the gradient all-reduce runs across
    /// hosts: the ranks of a host over memory channels, the hosts over TCP on loopback. N
    /// must divide the rank count.
    #[arg(long, value_name = "N")]
    pub simulate_hosts: Option<usize>,
    /// Use TF32 tensor cores in cuBLAS (faster; the gradient check's bound then does not
    /// hold and the check is skipped unless `--check-grads`).
    #[arg(long)]
    pub tf32: bool,
}

/// Size presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Communication-heavy: 268 M parameters, a small batch.
    Comm,
    /// Compute-heavy: 16.8 M parameters, a large batch.
    Compute,
}

/// Gradient element type on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GradDtype {
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
}

/// What `--compare` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Compare {
    /// NCCL's all-reduce.
    Nccl,
}

/// A resolved configuration (sizes known, checked against the rank count).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// Layers.
    pub layers: usize,
    /// Width.
    pub width: usize,
    /// Global batch.
    pub batch: usize,
    /// Samples per rank.
    pub rank_batch: usize,
    /// Steps.
    pub steps: usize,
    /// Teacher's hidden width.
    pub teacher_hidden: usize,
    /// Bucket cap in bytes (of f32 gradients).
    pub bucket_bytes: usize,
    /// Buckets launched as they become ready.
    pub overlap: bool,
    /// Wire type of the gradients.
    pub grad_dtype: GradDtype,
    /// CUDA graph.
    pub graph: bool,
    /// Seed.
    pub seed: u64,
    /// Ranks.
    pub nranks: usize,
    /// Print every N steps.
    pub log_every: usize,
    /// Steps left out of the summary.
    pub warmup: usize,
    /// Check the first step's gradient.
    pub check_grads: bool,
    /// TF32 GEMMs.
    pub tf32: bool,
    /// Where rank 0 writes the final parameters (the report shows the file name only).
    #[serde(serialize_with = "file_name_only")]
    pub dump_params: Option<PathBuf>,
    /// Rank 0 trains alone first (`--baseline`).
    pub baseline: bool,
    /// `--allreduce-blocks`: the collectives' `max_blocks`, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allreduce_blocks: Option<u32>,
    /// Optimizer settings (in the report too: learning rate, decay, clipping).
    pub adamw: AdamW,
    /// Why the gradient check is off when it is not asked off (`--no-check`), if it is.
    #[serde(skip)]
    pub check_skipped: Option<String>,
}

/// A path as its file name (a report names no folder of the machine that ran it).
fn file_name_only<S: serde::Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some(p) => s.serialize_some(&p.file_name().map(|f| f.to_string_lossy().into_owned())),
        None => s.serialize_none(),
    }
}

/// Checks of the arguments that need no rank count or device: made before any rank starts
/// (by the launcher too), so a bad value is refused once, by name.
pub fn check_args(a: &Args) -> Result<(), String> {
    if a.nranks == Some(0) {
        return Err("--nranks must be at least 1".into());
    }
    if a.steps == Some(0) {
        return Err("--steps must be at least 1".into());
    }
    if !(a.lr.is_finite() && a.lr > 0.0) {
        return Err(format!("--lr {} must be a positive finite number", a.lr));
    }
    if !(a.weight_decay.is_finite() && a.weight_decay >= 0.0) {
        return Err(format!(
            "--weight-decay {} must be a finite number, at least 0",
            a.weight_decay
        ));
    }
    if !(a.clip.is_finite() && a.clip >= 0.0) {
        return Err(format!(
            "--clip {} must be a finite number, at least 0 (0: no clipping)",
            a.clip
        ));
    }
    Ok(())
}

/// Bytes the Host transport's training takes at least for `params` parameters, `batch`
/// samples per rank, `layers` of `width` (parameters, gradients and two AdamW moments in
/// f32, and the activations of the forward pass kept for the backward one), or `None` when
/// that does not fit in 64 bits.
fn host_bytes(params: usize, batch: usize, layers: usize, width: usize) -> Option<u128> {
    let p = (params as u128).checked_mul(4 * 4)?;
    let acts = (batch as u128)
        .checked_mul(width as u128)?
        .checked_mul(layers as u128 + 1)?
        .checked_mul(4 * 2)?;
    p.checked_add(acts).filter(|&b| b <= u64::MAX as u128)
}

/// `MemAvailable` of this machine in bytes (Linux), if it can be read.
fn available_memory() -> Option<u128> {
    mscclpp::host::launch::mem_available().map(u128::from)
}

impl Config {
    /// Checks the output files (`--json`, `--dump-params`), written after the training, so
    /// that a bad path loses no run (see `mscclpp_perf::json::check_outputs`): once, in the
    /// process that writes them.
    pub fn check_outputs(a: &Args) -> Result<(), String> {
        mscclpp_perf::json::check_outputs(&[
            ("--json", a.json.as_deref()),
            ("--dump-params", a.dump_params.as_deref()),
        ])
    }

    /// Resolves sizes for `nranks` ranks, `local` of them on this machine, on a GPU or not
    /// (the defaults differ).
    pub fn new(a: &Args, nranks: usize, local: usize, gpu: bool) -> Result<Config, String> {
        check_args(a)?;
        if a.nranks.is_some_and(|n| n != nranks) {
            return Err(format!(
                "--nranks {} but the launcher started {nranks} ranks (under mpirun, torchrun \
                 or srun the launcher sets the rank count: leave --nranks out)",
                a.nranks.unwrap_or(0)
            ));
        }
        let (layers, width, per_rank, steps) = match (a.preset, gpu) {
            (Some(Preset::Comm), _) => (4, 8192, 32, 50),
            (Some(Preset::Compute), _) => (4, 2048, 8192, 50),
            (None, true) => (4, 1024, 256, 100),
            (None, false) => (3, 32, 24, 40),
        };
        let layers = a.layers.unwrap_or(layers);
        let width = a.width.unwrap_or(width);
        let batch = a.batch.unwrap_or(per_rank * nranks);
        let steps = a.steps.unwrap_or(steps);
        if layers == 0 || width == 0 || a.teacher_hidden == 0 {
            return Err("--layers, --width and --teacher-hidden must be positive".into());
        }
        if batch == 0 || !batch.is_multiple_of(nranks) {
            return Err(format!(
                "--batch {batch} is the global batch: a positive multiple of the {nranks} ranks"
            ));
        }
        if a.bucket_mb.is_nan() || a.bucket_mb <= 0.0 {
            return Err("--bucket-mb must be positive".into());
        }
        let max_blocks = mscclpp::device::collectives::MAX_BLOCKS as u32;
        if let Some(b) = a.allreduce_blocks
            && !(1..=max_blocks).contains(&b)
        {
            return Err(format!("--allreduce-blocks {b} is not in 1..={max_blocks}"));
        }
        if a.log_every == 0 {
            return Err("--log-every must be positive".into());
        }
        let params = width
            .checked_mul(width)
            .and_then(|w| w.checked_add(width))
            .and_then(|w| w.checked_mul(layers))
            .filter(|&p| p <= u32::MAX as usize)
            .ok_or_else(|| {
                format!(
                    "--layers {layers} of --width {width}: more than 2^32 parameters, beyond \
                     what this example's flat f32 layout holds"
                )
            })?;
        let rank_batch = batch / nranks;
        if !gpu {
            // The ranks of this machine share its memory.
            let need = host_bytes(params, rank_batch, layers, width)
                .and_then(|n| n.checked_mul(local.max(1) as u128));
            let have = available_memory();
            if need.is_none_or(|n| have.is_some_and(|h| n > h)) {
                let gib = |b: u128| format!("{:.1}", b as f64 / (1u64 << 30) as f64);
                return Err(format!(
                    "a model of {params} parameters with {rank_batch} samples per rank needs \
                     at least {} GiB for the {} ranks of this machine on the Host transport; \
                     it has {} GiB available: choose a smaller --width, --layers, --batch or \
                     --preset",
                    need.map_or("2^64".into(), gib),
                    local.max(1),
                    have.map_or("?".into(), gib)
                ));
            }
        }
        let warmup = a.warmup.unwrap_or(3.min(steps - 1));
        if warmup >= steps {
            return Err(format!(
                "--warmup {warmup} leaves no step of the {steps} to time: it must be below --steps"
            ));
        }
        // The CPU reference costs about 3 * 2 * batch * params flops (plus the bound's pass).
        let cpu_flops = 12.0 * batch as f64 * params as f64;
        // TF32 exists on GPUs only: the Host transport computes in f32 whatever it says.
        let tf32 = a.tf32 && gpu;
        let check_grads = !a.no_check && (a.check_grads || (cpu_flops < 4e9 && !tf32));
        let check_skipped = (!a.no_check && !check_grads).then(|| {
            if tf32 {
                "TF32 GEMMs (--tf32): the check's bound does not hold for them; --check-grads \
                 forces it"
                    .to_string()
            } else {
                format!(
                    "the CPU reference would take about {:.0} Gflop for this model and batch \
                     (the limit is 4); --check-grads forces it",
                    cpu_flops / 1e9
                )
            }
        });
        Ok(Config {
            layers,
            width,
            batch,
            rank_batch,
            steps,
            teacher_hidden: a.teacher_hidden,
            bucket_bytes: ((a.bucket_mb * 1048576.0) as usize).max(4),
            overlap: !a.no_overlap,
            grad_dtype: a.grad_dtype,
            graph: a.graph,
            seed: a.seed,
            nranks,
            log_every: a.log_every,
            warmup,
            check_grads,
            tf32,
            dump_params: a.dump_params.clone(),
            baseline: a.baseline,
            allreduce_blocks: a.allreduce_blocks,
            adamw: AdamW {
                lr: a.lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: a.weight_decay,
                max_norm: a.clip,
            },
            check_skipped,
        })
    }

    /// The configuration of the `--baseline` run: one rank with this run's per-rank batch
    /// (same model, steps, warm-up, optimizer and buckets); it writes no parameters.
    pub fn solo(&self) -> Config {
        Config {
            batch: self.rank_batch,
            nranks: 1,
            dump_params: None,
            baseline: false,
            ..self.clone()
        }
    }
}
