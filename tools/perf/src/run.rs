//! Launching and running: one process per rank, rank 0 prints.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::host::bootstrap::BlockingBootstrap;
use crate::host::collectives::{
    AllGatherAlgo, CollConfig, Collectives, DataType, Fp8E4M3, Fp8E5M2,
};
use crate::host::communicator::{Backend, CommConfig, Communicator};
use crate::host::cuda::{self, CudaError, Gpu};
use crate::host::launch::{Launch, LaunchError, LocalLauncher};

use super::PerfError;
use super::args::{AlgoArg, Args, BindArg, Collective, CompareWith, Config};
use super::header::print_header;
use super::host_memory::{self, Need};
use super::host_runner::host_runner_peak;
use super::json::{self, Report};
use super::nccl::{self, Nccl};
use super::plot;
use super::report::{self, Row};
use super::sweep::{largest_shape, redop_name, sum_over_ranks, sweep};

/// How long the local launcher lets its ranks run.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(2 * 3600);
/// After a rank failed, how long the others have to report before the launcher stops them
/// (they usually fail within a second or two of a peer's exit).
const STOP_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// The tool's entry point: parses the command line, then launches local ranks (started
/// alone) or runs as one rank (under a launcher). Exit status: 0 when every check passed,
/// 1 on a failure or wrong results, 2 on a bad command line.
pub fn main() -> ExitCode {
    // NCCL must never create NVLink multicast objects on the shared hosts this runs on; set
    // before any thread exists, so the ranks and NCCL (which reads it at init) see it.
    // SAFETY: nothing else runs yet: no thread reads the environment concurrently.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    let config = match Config::new(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mscclpp-perf: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match Launch::from_env() {
        Ok(launch) => run_rank(&config, &launch),
        Err(LaunchError::NotLaunched) => launch_local(&config),
        Err(e) => Err(PerfError::Launch(e)),
    };
    match result {
        Ok(code) => code,
        Err(PerfError::Reported) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mscclpp-perf: {e}");
            ExitCode::from(if matches!(e, PerfError::Args(_)) {
                2
            } else {
                1
            })
        }
    }
}

/// Started alone: one process per local GPU (or `--nranks`), rank 0's stdout unprefixed.
fn launch_local(config: &Config) -> Result<ExitCode, PerfError> {
    let gpus = cuda::device_count();
    let ngpus = *gpus.as_ref().unwrap_or(&0);
    if config.args.compare.is_some() && ngpus == 0 {
        return Err(no_gpu_for_nccl(&gpus.err()));
    }
    let nranks = config
        .args
        .nranks
        .unwrap_or(if ngpus > 0 { ngpus } else { 2 });
    // Refused here, once, rather than by every rank after all have started.
    config.check_outputs()?;
    check_root(config, nranks)?;
    largest_shape(config, nranks)?;
    if config.args.collective == Collective::SendRecv && nranks < 2 {
        return Err(PerfError::Args(
            "--op sendrecv needs at least 2 ranks (each sends to the next): --nranks 1 has \
             no peer"
                .into(),
        ));
    }
    // The ranks run on the Host transport (`Backend::auto`), all of them on this machine.
    if matches!(gpus, Ok(0) | Err(CudaError::NoDriver | CudaError::NoGpu(_))) {
        let scratch = CollConfig::from_env().unwrap_or_default().scratch_bytes;
        if let Some(need) = host_need(config, nranks, nranks, scratch) {
            host_memory::available()
                .map_or(Ok(()), |have| need.check(have))
                .map_err(PerfError::Args)?;
        }
        host_memory::shm_space()
            .map_or(Ok(()), |space| {
                host_memory::check_shm(scratch as u128, nranks, space)
            })
            .map_err(PerfError::Args)?;
    }
    let mut launcher = LocalLauncher::current_exe(nranks)?
        .unprefixed_stdout(0)
        .env("NCCL_NVLS_ENABLE", "0")
        .timeout(LAUNCH_TIMEOUT)
        .stop_after_failure(STOP_AFTER_FAILURE)
        .bind_cpus(config.args.bind == BindArg::Cpus);
    if config.args.compare == Some(CompareWith::Nccl) {
        for (k, v) in nccl::child_env()? {
            launcher = launcher.env(k, v);
        }
    }
    let report = launcher.run()?;
    if report.success() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprint!("mscclpp-perf: a rank failed:\n{report}");
        Ok(ExitCode::FAILURE)
    }
}

/// `--root` of a rooted collective must be one of the `nranks` ranks the tool launches
/// (under another launcher the collectives refuse it on every rank).
fn check_root(config: &Config, nranks: usize) -> Result<(), PerfError> {
    let (c, root) = (config.args.collective, config.args.root);
    if c.rooted() && root >= nranks {
        return Err(PerfError::Args(format!(
            "--root {root} is not a rank: {} runs on {nranks} ranks (0 to {}; --nranks, else \
             one per GPU, 2 without a GPU)",
            c.name(),
            nranks - 1
        )));
    }
    Ok(())
}

/// On the Host transport, whether the ranks of this machine fit in its memory for the
/// sweep, and their scratch in `/dev/shm`, agreed by every rank: a rank that does not fit says why and every rank fails
/// (status 1) before any allocates, as none passes the gather before all have read
/// `MemAvailable`. The ranks of this machine: those of its host id, or with simulated
/// hosts (which split this one machine) all of them.
fn host_memory_agreed(
    config: &Config,
    bootstrap: &BlockingBootstrap,
    backend: &Backend,
    scratch: usize,
) -> Result<(), PerfError> {
    let nranks = bootstrap.nranks();
    let mine = match backend {
        Backend::Host => {
            let local = match config.args.simulate_hosts {
                Some(_) => nranks,
                None => bootstrap.nranks_per_node(),
            };
            host_need(config, nranks, local, scratch)
                .zip(host_memory::available())
                .map_or(Ok(()), |(need, have)| need.check(have))
                .and_then(|()| {
                    host_memory::shm_space().map_or(Ok(()), |space| {
                        host_memory::check_shm(scratch as u128, local, space)
                    })
                })
        }
        Backend::Gpu(_) => Ok(()),
    };
    let short = sum_over_ranks(bootstrap, u64::from(mine.is_err()))?;
    if let Err(why) = mine {
        eprintln!("mscclpp-perf: {why}");
        return Err(PerfError::Reported);
    }
    if short > 0 {
        eprintln!(
            "mscclpp-perf: {short} other rank(s) lack the host memory or /dev/shm space for the sweep (their \
             messages say why)"
        );
        return Err(PerfError::Reported);
    }
    Ok(())
}

/// What the `local` ranks of this machine need in host memory for the sweep on the Host
/// transport, with `scratch` bytes of the collectives' scratch each; `None` when no size
/// of the sweep holds an element (the ranks say so).
fn host_need(config: &Config, nranks: usize, local: usize, scratch: usize) -> Option<Need> {
    let (size, largest) = largest_shape(config, nranks).ok()?;
    let elt = config.args.dtype.size() as u128;
    Some(Need {
        size,
        per_rank: host_runner_peak(&largest) * elt + scratch as u128,
        ranks: local,
    })
}

fn no_gpu_for_nccl(reason: &Option<CudaError>) -> PerfError {
    PerfError::Args(format!(
        "--compare nccl needs GPUs, and this machine has none{}: NCCL cannot run on the Host \
         transport; run without --compare",
        reason
            .as_ref()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default()
    ))
}

/// What every rank tells rank 0 for the header.
fn describe(backend: &Backend) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let device = match backend {
        Backend::Gpu(g) => {
            let i = g.info();
            format!("device {:2} [{}] {}", i.ordinal, i.pci_bus_id, i.name)
        }
        Backend::Host => "host (CPU threads)".to_string(),
    };
    format!("{host}\t{device}")
}

/// One rank: bootstrap, communicator, collectives, the sweep.
fn run_rank(config: &Config, launch: &Launch) -> Result<ExitCode, PerfError> {
    let compare = config.args.compare == Some(CompareWith::Nccl);
    let (bootstrap, backend) = join(config, launch, compare)?;
    let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
    let coll_config = coll_config(config, rank, nranks)?;
    host_memory_agreed(config, &bootstrap, &backend, coll_config.scratch_bytes)?;
    let all = bootstrap.all_gather(describe(&backend).as_bytes())?;
    let hosts_devices: Vec<(String, String)> = all
        .iter()
        .map(|b| {
            let s = String::from_utf8_lossy(b);
            let (h, d) = s.split_once('\t').unwrap_or(("?", &s));
            (h.to_string(), d.to_string())
        })
        .collect();
    let gpu = match &backend {
        Backend::Gpu(g) => Some(g.clone()),
        Backend::Host => None,
    };
    if compare && gpu.is_none() {
        // Every rank decides alike when none has a GPU; a lone GPU-less rank fails the run.
        return Err(no_gpu_for_nccl(&None));
    }
    let nccl_version = if compare {
        Some(nccl::version()?)
    } else {
        None
    };
    if rank == 0 {
        print_header(config, nranks, &hosts_devices, gpu.is_some(), &nccl_version);
        if let Some(h) = config.args.simulate_hosts {
            println!(
                "# simulated hosts: {h} (rank r on simhost{{r * {h} / {nranks}}}); the \
                 collectives run across hosts over TCP"
            );
        }
    }
    let comm = Communicator::from_bootstrap(bootstrap, backend, CommConfig::default())?;
    let coll = Collectives::new(comm, coll_config)?;
    if rank == 0 {
        print_layout(&coll);
    }
    let nccl = match &gpu {
        Some(g) if compare => Some(Nccl::init(coll.communicator().bootstrap(), g)?),
        _ => None,
    };
    let rows = match sweep_dtype(config, &coll, nccl.as_ref()) {
        Ok(rows) => rows,
        Err(e) => {
            // Said now, while NCCL, the collectives and the communicator still stand: their
            // teardown (the bootstrap's goodbyes, joining the proxy) may take a while after
            // a failure, and the user should not wait for it to learn what failed.
            return Err(report_now(e));
        }
    };
    drop(nccl);
    if rank == 0 {
        let ran = Ran {
            nranks,
            gpu: gpu.as_ref(),
            hosts_devices: &hosts_devices,
            nccl_version,
        };
        write_outputs(config, &ran, &rows)?;
    }
    Ok(exit_for(&rows))
}

/// Joins the job: re-executes for NCCL first when comparing with it (before the bootstrap
/// starts threads), checks the output paths on rank 0, picks the backend and starts the
/// bootstrap (on a simulated host with `--simulate-hosts`).
fn join(
    config: &Config,
    launch: &Launch,
    compare: bool,
) -> Result<(BlockingBootstrap, Backend), PerfError> {
    if compare {
        // Before the bootstrap starts threads: may replace this process.
        nccl::reexec_if_needed()?;
    }
    if launch.rank == 0 {
        // The process that writes them (under mpirun, srun or torchrun: no launcher of
        // ours checked them).
        config.check_outputs()?;
    }
    let backend = Backend::auto(launch.local_rank.unwrap_or(launch.rank))?;
    let bootstrap = match config.args.simulate_hosts {
        None => launch.blocking_bootstrap()?,
        Some(h) => {
            if !launch.nranks.is_multiple_of(h) {
                return Err(PerfError::Args(format!(
                    "--simulate-hosts {h} does not divide the {} ranks (every simulated host \
                     needs the same number of ranks)",
                    launch.nranks
                )));
            }
            let host = format!("simhost{}", launch.rank * h / launch.nranks);
            let bs_config = launch.config().with_host_id(host);
            BlockingBootstrap::init_with_config(launch.nranks, launch.rank, launch.root, bs_config)?
        }
    };
    Ok((bootstrap, backend))
}

/// The collectives' settings: the environment's, with the algorithm of `--algo` and, for
/// send/recv, the ring's neighbours as the only peers.
fn coll_config(config: &Config, rank: usize, nranks: usize) -> Result<CollConfig, PerfError> {
    let mut coll_config = CollConfig::from_env()?;
    if config.args.algo == AlgoArg::Proxy {
        coll_config.all_gather_algo = AllGatherAlgo::Proxy;
    }
    if config.args.algo != AlgoArg::Auto {
        // The host calls (and the calls across hosts) take the algorithm from the config.
        coll_config.all_reduce_algo = config.args.algo.all_reduce();
    }
    if config.args.collective == Collective::SendRecv && nranks > 1 {
        // The ring's neighbours are the only peers: across hosts only they get channels, so
        // jobs with more ranks on other hosts than CollConfig::p2p_remote_max run too
        // (MSCCLPP_P2P_PEERS still overrides).
        coll_config.p2p_peers = Some(vec![(rank + 1) % nranks, (rank + nranks - 1) % nranks]);
    }
    Ok(coll_config)
}

/// Rank 0's notes on how the collectives laid themselves out.
fn print_layout(coll: &Collectives) {
    if let Some(note) = coll.layout_note() {
        println!("# note: {note}");
    }
    if coll.hosts() > 1 {
        // Without a GPU there is no device memory: the buffer is the Host transport's.
        let kind = match coll.communicator().backend() {
            Backend::Host => "shared host memory (no GPU: the Host transport)",
            Backend::Gpu(_) if coll.cross_buffer_mapped() => {
                "host-mapped (MSCCLPP_CROSS_BUFFER=host)"
            }
            Backend::Gpu(_) => "device memory",
        };
        println!("# rank 0's cross buffer: {kind}");
    }
}

/// The sweep with buffers of `-d`'s type (fp8: the library's fp8 element types).
fn sweep_dtype(
    config: &Config,
    coll: &Collectives,
    theirs: Option<&Nccl>,
) -> Result<Vec<Row>, PerfError> {
    match config.args.dtype {
        DataType::F32 => sweep::<f32>(config, coll, theirs),
        DataType::F16 => sweep::<half::f16>(config, coll, theirs),
        DataType::Bf16 => sweep::<half::bf16>(config, coll, theirs),
        DataType::F64 => sweep::<f64>(config, coll, theirs),
        DataType::I8 => sweep::<i8>(config, coll, theirs),
        DataType::U8 => sweep::<u8>(config, coll, theirs),
        DataType::Fp8E4M3 => sweep::<Fp8E4M3>(config, coll, theirs),
        DataType::Fp8E5M2 => sweep::<Fp8E5M2>(config, coll, theirs),
        DataType::I32 => sweep::<i32>(config, coll, theirs),
        DataType::U32 => sweep::<u32>(config, coll, theirs),
        DataType::I64 => sweep::<i64>(config, coll, theirs),
        DataType::U64 => sweep::<u64>(config, coll, theirs),
    }
}

/// What a finished run ran on, for its outputs.
struct Ran<'a> {
    nranks: usize,
    /// This rank's GPU (none on the Host transport).
    gpu: Option<&'a Gpu>,
    /// Every rank's host and device, in rank order.
    hosts_devices: &'a [(String, String)],
    nccl_version: Option<String>,
}

/// Rank 0, after the sweep: the summary lines, and the JSON report and plot when asked for.
fn write_outputs(config: &Config, ran: &Ran<'_>, rows: &[Row]) -> Result<(), PerfError> {
    let (nranks, gpu, hosts_devices) = (ran.nranks, ran.gpu, ran.hosts_devices);
    for line in report::summary(rows) {
        println!("{line}");
    }
    let title = format!(
        "{} {} x{}{}",
        config.args.collective.name(),
        config.args.dtype,
        nranks,
        gpu.map(|g| format!(" {}", g.info().name))
            .unwrap_or_else(|| " host".into())
    );
    if let Some(path) = &config.args.json {
        let report = Report {
            tool: "mscclpp-perf".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            command_line: json::public_command_line(&std::env::args().collect::<Vec<_>>()),
            date: json::now_utc(),
            collective: config.args.collective.name().into(),
            dtype: config.args.dtype.name().into(),
            redop: redop_name(config).into(),
            algo: format!("{:?}", config.args.algo).to_lowercase(),
            nranks,
            backend: if gpu.is_some() { "gpu" } else { "host" }.into(),
            devices: hosts_devices.iter().map(|(_, d)| d.clone()).collect(),
            hosts: hosts_devices.iter().map(|(h, _)| h.clone()).collect(),
            nccl_version: ran.nccl_version.clone(),
            iters: config.args.iters,
            warmup_iters: config.args.warmup_iters,
            // What ran: the Host transport has no CUDA graphs (-G is ignored there).
            graph_launches: if gpu.is_some() {
                config.args.graph_launches
            } else {
                0
            },
            check: config.check(),
            rows: rows.to_vec(),
        };
        report.write(path)?;
        println!("# JSON written to {}", path.display());
    }
    if let Some(path) = &config.args.plot {
        std::fs::write(path, plot::svg(&title, rows)).map_err(|e| PerfError::Io {
            what: format!("cannot write {}", path.display()),
            source: e,
        })?;
        println!("# plot written to {}", path.display());
    }
    Ok(())
}

/// Prints `e` as [`main`] would and returns [`PerfError::Reported`] in its place (unless
/// it is a command-line error, whose exit status [`main`] sets).
fn report_now(e: PerfError) -> PerfError {
    if matches!(e, PerfError::Args(_)) {
        return e;
    }
    eprintln!("mscclpp-perf: {e}");
    PerfError::Reported
}

fn exit_for(rows: &[Row]) -> ExitCode {
    match report::total_wrong(rows) {
        Some(n) if n > 0 => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    }
}
