//! Data-parallel training of an MLP over mscclpp's all-reduce (issue #16): one process per
//! GPU, gradients averaged in DDP-style buckets on a communication stream while the
//! backward pass still runs, optional bf16 gradients, CUDA graphs and NCCL side by side.
//! Without a GPU the same program trains a small model on the Host transport with the CPU
//! reference, so the bucketing, ordering and averaging run in CI.
//!
//! ```text
//! cargo run --release -p train-dp-example -- --preset comm --compare nccl --json out.json
//! ```
//!
//! Modules: [`model`] (shape, flat layout, buckets, data), [`cpu`] (reference math and the
//! gradient tolerance), [`host_train`] (Host transport), [`gpu`] (cuBLAS + our kernels),
//! [`libs`] (finding cuBLAS and NCCL at run time), [`baseline`] (`--baseline`: the 1-rank
//! reference of the scaling efficiency), [`report`], [`config`].

mod baseline;
mod config;
mod cpu;
mod gpu;
mod host_train;
mod libs;
mod model;
mod report;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use mscclpp::host::bootstrap::BlockingBootstrap;
use mscclpp::host::collectives::{CollConfig, Collectives};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::cuda::device_count;
use mscclpp::host::launch::{Launch, LaunchError, LocalLauncher};

use config::{Args, Config};
use report::{GradCheck, Recorder, RunReport};

/// The example's error type.
pub type Error = Box<dyn std::error::Error>;

/// This rank's place, and the small exchanges over the bootstrap.
#[derive(Debug, Clone, Copy)]
pub struct Ranks {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
}

impl Ranks {
    /// Every rank's `bytes`, in rank order (over the bootstrap, not the data path). One
    /// rank (also rank 0 alone in a job of several, `--baseline`) needs no bootstrap.
    pub fn gather(&self, coll: &Collectives, bytes: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        if self.nranks == 1 {
            return Ok(vec![bytes.to_vec()]);
        }
        Ok(coll.communicator().bootstrap().all_gather(bytes)?)
    }

    /// Mean of `v` over the ranks.
    pub fn mean(&self, coll: &Collectives, v: f64) -> Result<f64, Error> {
        let all = self.gather(coll, &v.to_le_bytes())?;
        let mut s = 0.0;
        for b in all {
            s += f64::from_le_bytes(b.as_slice().try_into().map_err(|_| "bad loss bytes")?);
        }
        Ok(s / self.nranks as f64)
    }
}

/// End of a run: parameter checksums exchanged and compared, `--dump-params`, the report.
#[allow(clippy::too_many_arguments)]
pub fn finish(
    cfg: &Config,
    coll: &Collectives,
    ranks: &Ranks,
    library: &str,
    backend: &str,
    params: &[f32],
    rec: Recorder,
    grad_check: Option<GradCheck>,
) -> Result<RunReport, Error> {
    let sum = model::checksum(params);
    let all = ranks.gather(coll, &sum.to_le_bytes())?;
    let sums: Vec<u64> = all
        .iter()
        .map(|b| u64::from_le_bytes(b.as_slice().try_into().unwrap_or([0; 8])))
        .collect();
    let identical = sums.iter().all(|&s| s == sum);

    let report = RunReport {
        library: library.to_string(),
        backend: backend.to_string(),
        log: rec.log.clone(),
        summary: rec.summary(cfg.warmup, cfg.batch),
        checksum: format!("{sum:016x}"),
        identical,
        grad_check,
    };
    if ranks.rank == 0 {
        report::print_summary(&report, cfg.nranks);
        if let Some(path) = cfg.dump_params.as_ref().filter(|_| library != "nccl") {
            let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(path, bytes)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    if !identical {
        let list: Vec<String> = sums
            .iter()
            .enumerate()
            .map(|(r, s)| format!("rank {r}: {s:016x}"))
            .collect();
        return Err(format!(
            "parameters differ across ranks after training: {}",
            list.join(", ")
        )
        .into());
    }
    // Every rank has the same loss (the mean over the ranks): all fail, or none.
    let s = &report.summary;
    if !s.last_loss.is_finite() {
        return Err(format!(
            "training diverged: the loss is {} after the last step ({} after the first); lower \
             --lr",
            s.last_loss, s.first_loss
        )
        .into());
    }
    Ok(report)
}

fn main() -> ExitCode {
    // NCCL (with --compare) must never create NVLink multicast objects on shared hosts.
    // SAFETY: nothing else runs yet: no thread reads the environment concurrently.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    let args = Args::parse();
    // Refused before any rank starts (by the launcher once, not by every rank).
    let result =
        config::check_args(&args)
            .map_err(Error::from)
            .and_then(|()| match Launch::from_env() {
                Ok(launch) => run_rank(&args, &launch),
                Err(LaunchError::NotLaunched) => launch_local(&args),
                Err(e) => Err(e.into()),
            });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train-dp: {e}");
            ExitCode::FAILURE
        }
    }
}

fn gpus(args: &Args) -> usize {
    if args.host {
        0
    } else {
        device_count().unwrap_or(0)
    }
}

/// Started alone: one process per local GPU (or `--nranks`; 2 without a GPU).
fn launch_local(args: &Args) -> Result<(), Error> {
    let ngpus = gpus(args);
    if ngpus == 0 && (args.compare.is_some() || args.graph) {
        return Err(
            "--compare and --graph need GPUs; this run would use the Host transport".into(),
        );
    }
    let nranks = args.nranks.unwrap_or(if ngpus > 0 { ngpus } else { 2 });
    // The sizes and their checks before any rank starts (each rank resolves them again).
    Config::new(args, nranks, nranks, ngpus > 0)?;
    Config::check_outputs(args)?;
    let mut launcher = LocalLauncher::current_exe(nranks)?
        .unprefixed_stdout(0)
        .env("NCCL_NVLS_ENABLE", "0")
        .timeout(Duration::from_secs(4 * 3600))
        // A rank that failed: the others have 10 s to report, then stop (a stopped or stuck
        // rank no longer holds the job to the timeout).
        .stop_after_failure(Duration::from_secs(10));
    if ngpus > 0 {
        for (k, v) in libs::child_env(args.compare.is_some())? {
            launcher = launcher.env(k, v);
        }
    }
    let report = launcher.run()?;
    if report.success() {
        Ok(())
    } else {
        Err(format!("a rank failed:\n{report}").into())
    }
}

/// One rank: bootstrap, collectives, training (GPU or Host), the JSON report.
fn run_rank(args: &Args, launch: &Launch) -> Result<(), Error> {
    let on_gpu = gpus(args) > 0;
    if on_gpu {
        // Before the bootstrap starts threads: may replace this process.
        libs::reexec_if_needed(args.compare.is_some())?;
    }
    let bootstrap = match args.simulate_hosts {
        None => launch.blocking_bootstrap()?,
        Some(h) => {
            if h == 0 || !launch.nranks.is_multiple_of(h) {
                return Err(format!(
                    "--simulate-hosts {h} does not divide the {} ranks (every simulated host \
                     needs the same number of ranks)",
                    launch.nranks
                )
                .into());
            }
            let host = format!("simhost{}", launch.rank * h / launch.nranks);
            let config = launch.config().with_host_id(host);
            BlockingBootstrap::init_with_config(launch.nranks, launch.rank, launch.root, config)?
        }
    };
    let backend = if on_gpu {
        Backend::auto(bootstrap.local_rank())?
    } else {
        Backend::Host
    };
    let on_gpu = matches!(backend, Backend::Gpu(_));
    let ranks = Ranks {
        rank: bootstrap.rank(),
        nranks: bootstrap.nranks(),
    };
    let cfg = Config::new(args, ranks.nranks, bootstrap.nranks_per_node(), on_gpu)?;
    if ranks.rank == 0 {
        // The process that writes them (under another launcher, nothing checked them).
        Config::check_outputs(args)?;
    }
    if !on_gpu && (cfg.graph || args.compare.is_some()) {
        return Err("--compare and --graph need GPUs".into());
    }
    if ranks.rank == 0 && args.tf32 && !on_gpu {
        println!("--tf32: no effect on the Host transport (its math is f32)");
    }
    if let (0, Some(why)) = (ranks.rank, &cfg.check_skipped) {
        println!("gradient check: skipped: {why}");
    }
    let comm = Communicator::from_bootstrap(bootstrap, backend.clone(), CommConfig::default())?;
    let mut coll_config = CollConfig::from_env()?;
    if !on_gpu && std::env::var_os("MSCCLPP_COLL_SCRATCH_BYTES").is_none() {
        // Shared memory per rank on the Host transport: small models need little.
        coll_config.scratch_bytes = 8 << 20;
    }
    if let Some(b) = cfg.allreduce_blocks {
        coll_config.max_blocks = b;
    }
    let coll_max_blocks = coll_config.max_blocks;
    let coll = Collectives::new(comm, coll_config)?;
    if let (0, Some(note)) = (ranks.rank, coll.layout_note()) {
        println!("note: {note}");
    }
    if ranks.rank == 0 && coll.hosts() > 1 {
        println!(
            "across {} hosts (simulated: --simulate-hosts): the all-reduce runs inside each \
             host, then across hosts over TCP ({} for a {:.0} KiB bucket)",
            coll.hosts(),
            match coll.choose_all_reduce(cfg.bucket_bytes) {
                mscclpp::host::collectives::AllReduceAlgo::TwoShot => "two-shot",
                _ => "one-shot",
            },
            cfg.bucket_bytes as f64 / 1024.0
        );
    }
    let baseline = if cfg.baseline {
        Some(baseline::run(
            &cfg,
            &coll,
            &ranks,
            |c, r, mode| match &backend {
                Backend::Host => host_train::run(c, &coll, r, mode),
                Backend::Gpu(g) => gpu::baseline(c, &coll, g, r, mode),
            },
        )?)
    } else {
        None
    };
    let mut mode = baseline::Mode::Together {
        baseline: baseline.as_ref().map(|b| b.samples_per_s),
    };
    let reports = match &backend {
        Backend::Host => vec![host_train::run(&cfg, &coll, &ranks, &mut mode)?],
        Backend::Gpu(g) => gpu::run(&cfg, args, &coll, g, &ranks, &mut mode)?,
    };
    if ranks.rank == 0 {
        if reports.len() == 2 {
            let (a, b) = (&reports[0].summary, &reports[1].summary);
            println!(
                "comparison: step time {} {:.3} ms vs {} {:.3} ms (ratio {:.3}: > 1, ours is faster); exposed comm {:.3} vs {:.3} ms",
                reports[0].library,
                a.step_ms,
                reports[1].library,
                b.step_ms,
                b.step_ms / a.step_ms,
                a.exposed_comm_ms,
                b.exposed_comm_ms
            );
        }
        if let Some(path) = &args.json {
            let mut json = serde_json::json!({
                // The binary by its file name and the output files by theirs: a report
                // names no folder of the machine that ran it.
                "command": mscclpp_perf::json::public_command_line(
                    &std::env::args().collect::<Vec<_>>()
                ),
                "nranks": ranks.nranks,
                "config": cfg,
                "coll_max_blocks": coll_max_blocks,
                "runs": reports,
            });
            if let Some(b) = baseline.as_ref().and_then(|b| b.report.as_ref()) {
                json["baseline"] = serde_json::to_value(b)?;
            }
            std::fs::write(path, serde_json::to_string_pretty(&json)?)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    Ok(())
}
