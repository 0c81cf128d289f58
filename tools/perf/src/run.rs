//! Launching and running: one process per rank, rank 0 prints.

use mscclpp::host::collectives::{Exec, RawBuffer};
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use cudarc::driver::DriverError;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use crate::host::bootstrap::BlockingBootstrap;
use crate::host::collectives::{
    AllGatherAlgo, AllReduceAlgo, CollConfig, Collectives, DataType, Fp8E4M3, Fp8E5M2, P2pOp,
};
use crate::host::communicator::{Backend, CommConfig, Communicator};
use crate::host::cuda::{self, CUevent_flags, CudaError, CudaStream, DeviceBuffer, Gpu};
use crate::host::launch::{Launch, LaunchError, LocalLauncher};

use super::PerfError;
use super::args::{AlgoArg, Args, Collective, CompareWith, Config, Redop};
use super::check::{self, Elem, Reference, Strictness};
use super::host_memory::{self, Need};
use super::json::{self, Report};
use super::nccl::{self, Nccl};
use super::plot;
use super::report::{self, Measurement, Pair, Row, Shape};

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
        .stop_after_failure(STOP_AFTER_FAILURE);
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
    let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
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
    if let (0, Some(note)) = (rank, coll.layout_note()) {
        println!("# note: {note}");
    }
    if rank == 0 && coll.hosts() > 1 {
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
    let nccl = match &gpu {
        Some(g) if compare => Some(Nccl::init(coll.communicator().bootstrap(), g)?),
        _ => None,
    };
    let theirs = nccl.as_ref();
    // The buffers' element type: `-d`'s type (fp8: the library's fp8 element types).
    let swept = match config.args.dtype {
        DataType::F32 => sweep::<f32>(config, &coll, theirs),
        DataType::F16 => sweep::<half::f16>(config, &coll, theirs),
        DataType::Bf16 => sweep::<half::bf16>(config, &coll, theirs),
        DataType::F64 => sweep::<f64>(config, &coll, theirs),
        DataType::I8 => sweep::<i8>(config, &coll, theirs),
        DataType::U8 => sweep::<u8>(config, &coll, theirs),
        DataType::Fp8E4M3 => sweep::<Fp8E4M3>(config, &coll, theirs),
        DataType::Fp8E5M2 => sweep::<Fp8E5M2>(config, &coll, theirs),
        DataType::I32 => sweep::<i32>(config, &coll, theirs),
        DataType::U32 => sweep::<u32>(config, &coll, theirs),
        DataType::I64 => sweep::<i64>(config, &coll, theirs),
        DataType::U64 => sweep::<u64>(config, &coll, theirs),
    };
    let rows = match swept {
        Ok(rows) => rows,
        Err(e) => {
            // Said now, while NCCL, the collectives and the communicator still stand: their
            // teardown (the bootstrap's goodbyes, joining the proxy) may take a while after
            // a failure, and the user should not wait for it to learn what failed.
            return Err(report_now(e));
        }
    };
    drop(nccl);
    if rank != 0 {
        return Ok(exit_for(&rows));
    }
    for line in report::summary(&rows) {
        println!("{line}");
    }
    let title = format!(
        "{} {} x{}{}",
        config.args.collective.name(),
        config.args.dtype,
        nranks,
        gpu.as_ref()
            .map(|g| format!(" {}", g.info().name))
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
            nccl_version: nccl_version.clone(),
            iters: config.args.iters,
            warmup_iters: config.args.warmup_iters,
            // What ran: the Host transport has no CUDA graphs (-G is ignored there).
            graph_launches: if gpu.is_some() {
                config.args.graph_launches
            } else {
                0
            },
            check: config.check(),
            rows: rows.clone(),
        };
        report.write(path)?;
        println!("# JSON written to {}", path.display());
    }
    if let Some(path) = &config.args.plot {
        std::fs::write(path, plot::svg(&title, &rows)).map_err(|e| PerfError::Io {
            what: format!("cannot write {}", path.display()),
            source: e,
        })?;
        println!("# plot written to {}", path.display());
    }
    Ok(exit_for(&rows))
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

fn redop_name(config: &Config) -> &'static str {
    if config.args.collective.reduces() {
        config.args.redop.name()
    } else {
        "none"
    }
}

/// The placement actually run: send/recv always runs out of place (an in-place exchange
/// could overwrite data before it is sent), so its in-place columns are a second
/// out-of-place run.
fn effective(c: Collective, placement: Placement) -> Placement {
    if c == Collective::SendRecv {
        Placement::OutOfPlace
    } else {
        placement
    }
}

/// The elements of the receive buffer that hold `rank`'s output.
fn out_range(
    c: Collective,
    placement: Placement,
    shape: &Shape,
    rank: usize,
    nranks: usize,
) -> std::ops::Range<usize> {
    let len = report::out_count(c, shape, nranks) as usize;
    let at = match (c, placement) {
        (Collective::ReduceScatter, Placement::InPlace) => rank * len,
        _ => 0,
    };
    at..at + len
}

fn print_header(
    config: &Config,
    nranks: usize,
    hosts_devices: &[(String, String)],
    on_gpu: bool,
    nccl_version: &Option<String>,
) {
    let a = &config.args;
    let algo = format!("{:?}", a.algo).to_lowercase();
    if !on_gpu {
        println!("no GPU: running on the Host transport (CPU threads, shared memory)");
    }
    println!(
        "# mscclpp-perf {}: {} {}, redop {}, algo {}, {} ranks",
        env!("CARGO_PKG_VERSION"),
        a.collective.name(),
        a.dtype,
        redop_name(config),
        algo,
        nranks
    );
    if a.collective == Collective::AllGather && !matches!(a.algo, AlgoArg::Auto | AlgoArg::Proxy) {
        println!(
            "# --algo {algo} is an all-reduce algorithm: all-gather takes auto or proxy, and runs \
             as the library chooses (the rows name it)"
        );
    }
    println!(
        "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} \
         validation: {} graph: {}",
        a.min_bytes,
        a.max_bytes,
        if a.step_factor > 1 {
            format!("{}(factor)", a.step_factor)
        } else {
            format!("{}(bytes)", a.step_bytes)
        },
        a.warmup_iters,
        a.iters,
        u32::from(config.check()),
        a.graph_launches
    );
    if on_gpu {
        println!("# timing: CUDA events on each rank's stream; time = max over ranks");
    } else {
        println!("# timing: wall clock on each rank; time = max over ranks");
        if a.graph_launches > 0 {
            println!(
                "# -G {} ignored: no CUDA graphs on the Host transport",
                a.graph_launches
            );
        }
        if matches!(a.collective, Collective::AllGather | Collective::AllToAll) {
            println!(
                "# in-place {} on the Host transport sends from a copy of the rank's input \
                 (host slices cannot alias)",
                a.collective.name()
            );
        }
    }
    if a.collective.rooted() {
        println!("# root {}", a.root);
    }
    if !a.collective.reduces() && a.redop != Redop::Sum {
        println!(
            "# -o {} ignored: {} does not reduce",
            a.redop.name(),
            a.collective.name()
        );
    }
    if a.collective.reduces() && check::is_fp8(a.dtype) {
        println!(
            "# {} {}: widened to f32, reduced in f32 and rounded once to {} (the library \
             moves 4 bytes per element)",
            a.dtype,
            a.redop.name(),
            a.dtype
        );
    }
    if a.collective.reduces() && a.redop == Redop::MulSum {
        println!(
            "# mulsum: each rank's input times its own scalar (nccl-tests': 1 on even ranks, 2 \
             on odd ranks), then summed"
        );
    }
    if a.collective == Collective::SendRecv {
        println!(
            "# sendrecv: rank r sends to r+1 and receives from r-1 in one group; in place is \
             not supported (the in-place columns are a second out-of-place run)"
        );
    }
    if let Some(v) = nccl_version {
        println!(
            "# NCCL {v}{} on the same buffers; ratio = NCCL time / mscclpp time (= mscclpp \
             busbw / NCCL busbw); NCCL_NVLS_ENABLE=0",
            nccl::found_path()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        );
    }
    println!("#");
    println!("# Using devices");
    for (rank, (host, device)) in hosts_devices.iter().enumerate() {
        println!("#  Rank {rank:2} on {host} {device}");
    }
    println!("#");
    for line in report::header(a.compare.is_some()) {
        println!("{line}");
    }
    let _ = std::io::stdout().flush();
}

/// Out of place or in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    OutOfPlace,
    InPlace,
}

/// Which library runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lib {
    Mscclpp,
    Nccl,
}

fn drv(call: &'static str) -> impl Fn(DriverError) -> PerfError {
    move |e| PerfError::Cuda(CudaError::driver(call, e))
}

/// Every rank's 8-byte value, in rank order.
fn gather_words(bs: &BlockingBootstrap, bytes: [u8; 8]) -> Result<Vec<[u8; 8]>, PerfError> {
    let all = bs.all_gather(&bytes)?;
    Ok(all
        .iter()
        .filter_map(|b| b.get(..8).and_then(|b| b.try_into().ok()))
        .collect())
}

/// Largest value over ranks.
fn max_over_ranks(bs: &BlockingBootstrap, v: f64) -> Result<f64, PerfError> {
    Ok(gather_words(bs, v.to_le_bytes())?
        .into_iter()
        .map(f64::from_le_bytes)
        .fold(f64::NEG_INFINITY, f64::max))
}

/// One timed operation as a rank (or, after [`Runner::measure`], every rank) saw it.
struct Timed {
    /// Microseconds per operation on the GPU (or the wall clock on the Host transport).
    us: f64,
    /// CPU microseconds to queue one operation (plain launches on a GPU only).
    host_us: Option<f64>,
    /// Mismatching elements, when checked.
    wrong: Option<u64>,
}

/// Sum over ranks.
fn sum_over_ranks(bs: &BlockingBootstrap, v: u64) -> Result<u64, PerfError> {
    Ok(gather_words(bs, v.to_le_bytes())?
        .into_iter()
        .map(u64::from_le_bytes)
        .sum())
}

fn algo_name(config: &Config, coll: &Collectives, shape: &Shape) -> String {
    if coll.hosts() > 1 {
        // Hierarchical across hosts: all-reduce, reduce (which follows it) and broadcast
        // choose between one-shot and two-shot across hosts; the others have one form.
        let bytes = shape.bytes as usize;
        let two_shot = match config.args.collective {
            Collective::AllReduce | Collective::Reduce => {
                Some(coll.choose_all_reduce(bytes) == AllReduceAlgo::TwoShot)
            }
            Collective::Broadcast => Some(coll.broadcast_two_shot_across_hosts(bytes)),
            _ => None,
        };
        return match two_shot {
            Some(true) => "cross-host-twoshot",
            Some(false) => "cross-host-oneshot",
            None => "cross-host",
        }
        .into();
    }
    match config.args.collective {
        Collective::AllGather => {
            let per_rank = shape.bytes as usize / coll.nranks().max(1);
            match coll.choose_all_gather(per_rank) {
                AllGatherAlgo::Proxy => "proxy",
                AllGatherAlgo::Packets => "packets",
                _ => "memory",
            }
            .into()
        }
        Collective::AllReduce => {
            let algo = match config.args.algo {
                AlgoArg::Auto => coll.choose_all_reduce(shape.bytes as usize),
                other => other.all_reduce(),
            };
            match algo {
                AllReduceAlgo::Auto => "auto",
                AllReduceAlgo::OneShot => "oneshot",
                AllReduceAlgo::TwoShot => "twoshot",
                AllReduceAlgo::ReadReduce => "readreduce",
                AllReduceAlgo::AllPairs => "allpairs",
                AllReduceAlgo::Proxy => "proxy",
            }
            .into()
        }
        // LL packets or puts, chosen by the library by size.
        _ => "auto".into(),
    }
}

/// Every size of the sweep with its shape (`None`: no element in it).
fn shapes(config: &Config, nranks: usize) -> Vec<(u64, Option<Shape>)> {
    let (c, dtype) = (config.args.collective, config.args.dtype);
    config
        .sizes
        .iter()
        .map(|&s| (s, report::shape(c, s, dtype, nranks)))
        .collect()
}

/// The sweep's size of the most elements, with its shape: what the buffers must hold.
fn largest_shape(config: &Config, nranks: usize) -> Result<(u64, Shape), PerfError> {
    let c = config.args.collective;
    shapes(config, nranks)
        .into_iter()
        .filter_map(|(size, s)| Some((size, s?)))
        .max_by_key(|(_, s)| s.count)
        .ok_or_else(|| {
            PerfError::Args(format!(
                "no size of the sweep is large enough for {} of {} on {nranks} ranks: {}",
                c.name(),
                config.args.dtype,
                report::too_small(c)
            ))
        })
}

/// Runs the whole sweep on this rank; rank 0 prints each row as it completes.
fn sweep<T: Elem>(
    config: &Config,
    coll: &Collectives,
    nccl: Option<&Nccl>,
) -> Result<Vec<Row>, PerfError> {
    let nranks = coll.nranks();
    let c = config.args.collective;
    let shapes = shapes(config, nranks);
    let (_, largest) = largest_shape(config, nranks)?;
    let mut runner = match coll.gpu() {
        Some(gpu) => Runner::Gpu(GpuRunner::<T>::new(gpu, coll, nccl, &largest)?),
        None => Runner::Host(HostRunner::<T>::new(coll, &largest)?),
    };
    let factor = report::bus_factor(c, nranks);
    let mut rows = Vec::new();
    for (size, shape) in shapes {
        let Some(shape) = shape else {
            if coll.rank() == 0 {
                println!("# skipped {size} B: {}", report::too_small(c));
            }
            continue;
        };
        let mut pair = |lib: Lib| -> Result<Pair, PerfError> {
            let mut m = [None, None];
            for (i, p) in [Placement::OutOfPlace, Placement::InPlace]
                .into_iter()
                .enumerate()
            {
                let t = runner.measure(config, coll, lib, p, &shape)?;
                let mut one = Measurement::new(shape.bytes, t.us, factor, t.wrong);
                one.host_us = t.host_us;
                m[i] = Some(one);
            }
            match m {
                [Some(o), Some(i)] => Ok(Pair {
                    out_of_place: o,
                    in_place: i,
                }),
                _ => unreachable!("both placements are measured"),
            }
        };
        let ours = pair(Lib::Mscclpp)?;
        let theirs = if nccl.is_some() {
            Some(pair(Lib::Nccl)?)
        } else {
            None
        };
        let row = Row {
            bytes: shape.bytes,
            count: shape.count,
            dtype: config.args.dtype.name().into(),
            redop: redop_name(config).into(),
            algo: algo_name(config, coll, &shape),
            mscclpp: ours,
            nccl: theirs,
        };
        if coll.rank() == 0 {
            println!("{}", report::format_row(&row));
            let _ = std::io::stdout().flush();
        }
        rows.push(row);
    }
    Ok(rows)
}

enum Runner<'a, T: Elem> {
    Gpu(GpuRunner<'a, T>),
    Host(HostRunner<T>),
}

impl<T: Elem> Runner<'_, T> {
    /// Times one (library, placement, size) and checks it: (µs, #wrong summed over ranks).
    fn measure(
        &mut self,
        config: &Config,
        coll: &Collectives,
        lib: Lib,
        placement: Placement,
        shape: &Shape,
    ) -> Result<Timed, PerfError> {
        let bs = coll.communicator().bootstrap();
        let t = match self {
            Runner::Gpu(g) => g.measure(config, lib, placement, shape)?,
            Runner::Host(h) => h.measure(config, coll, placement, shape)?,
        };
        // Every rank times the same way (plain or graph), so all or none have a host time.
        let host_us = match t.host_us {
            Some(h) => Some(max_over_ranks(bs, h)?),
            None => None,
        };
        let wrong = match t.wrong {
            Some(w) => Some(sum_over_ranks(bs, w)?),
            None => None,
        };
        Ok(Timed {
            us: max_over_ranks(bs, t.us)?,
            host_us,
            wrong,
        })
    }
}

/// The check's reference of this run.
fn reference(config: &Config, nranks: usize) -> Reference {
    Reference {
        collective: config.args.collective,
        dtype: config.args.dtype,
        op: config.args.redop,
        nranks,
        root: config.args.root,
    }
}

/// A host vector of `len` copies of `v` (for `what`), or a clear error when that much memory
/// cannot be had (a size from the command line too large for this machine).
fn host_vec<T: Clone>(len: u64, v: T, what: &str) -> Result<Vec<T>, PerfError> {
    let too_large = || {
        PerfError::Args(format!(
            "{what}: {len} elements of {} bytes do not fit in this machine's memory; choose \
             a smaller size (-b/-e)",
            std::mem::size_of::<T>()
        ))
    };
    let n = usize::try_from(len).map_err(|_| too_large())?;
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| too_large())?;
    out.resize(n, v);
    Ok(out)
}

/// Bytes of a device buffer of `count` elements of `elt` bytes (the `what` buffer), or a
/// clear error when that does not fit in an address.
fn buffer_bytes(count: u64, elt: usize, what: &str) -> Result<usize, PerfError> {
    usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(elt))
        .ok_or_else(|| {
            PerfError::Args(format!(
                "the {what} buffer: {count} elements of {elt} bytes is too large; choose a \
                 smaller size (-b/-e)"
            ))
        })
}

/// The inputs of a check run: (send buffer contents, receive buffer contents). Receive
/// elements not written by the input hold [`check::unwritten`], so a collective that writes
/// nothing fails.
fn check_inputs<T: Elem>(
    config: &Config,
    nranks: usize,
    rank: usize,
    placement: Placement,
    shape: &Shape,
) -> Result<(Vec<T>, Vec<T>), PerfError> {
    let c = config.args.collective;
    let mut input = host_vec(shape.send_count, T::default(), "the check's input")?;
    reference(config, nranks).fill(rank, &mut input);
    let unwritten = T::from_bits(check::unwritten(config.args.dtype));
    let mut recv = host_vec(shape.count, unwritten, "the check's output")?;
    if effective(c, placement) == Placement::InPlace {
        let at = match c {
            Collective::AllGather => rank * shape.send_count as usize,
            _ => 0,
        };
        recv[at..at + input.len()].copy_from_slice(&input);
    }
    Ok((input, recv))
}

struct GpuRunner<'a, T: Elem> {
    coll: &'a Collectives,
    gpu: Gpu,
    nccl: Option<&'a Nccl>,
    stream: std::sync::Arc<CudaStream>,
    send: DeviceBuffer,
    recv: DeviceBuffer,
    _elem: std::marker::PhantomData<T>,
}

impl<'a, T: Elem> GpuRunner<'a, T> {
    fn new(
        gpu: &Gpu,
        coll: &'a Collectives,
        nccl: Option<&'a Nccl>,
        largest: &Shape,
    ) -> Result<Self, PerfError> {
        let elt = T::DTYPE.size();
        Ok(GpuRunner {
            coll,
            gpu: gpu.clone(),
            nccl,
            stream: gpu.new_stream()?,
            send: DeviceBuffer::zeroed(gpu, buffer_bytes(largest.send_count, elt, "send")?)?,
            recv: DeviceBuffer::zeroed(gpu, buffer_bytes(largest.count, elt, "receive")?)?,
            _elem: std::marker::PhantomData,
        })
    }

    /// (send, recv) device addresses of `placement`.
    fn pointers(&self, placement: Placement, shape: &Shape, c: Collective) -> (u64, u64) {
        let recv = self.recv.device_ptr();
        match placement {
            Placement::OutOfPlace => (self.send.device_ptr(), recv),
            Placement::InPlace => match c {
                Collective::AllGather => {
                    let slot = self.coll.rank() as u64 * shape.send_count * T::DTYPE.size() as u64;
                    (recv + slot, recv)
                }
                Collective::ReduceScatter => {
                    let per = shape.count / self.coll.nranks() as u64;
                    let slot = self.coll.rank() as u64 * per * T::DTYPE.size() as u64;
                    (recv, recv + slot)
                }
                Collective::SendRecv => (self.send.device_ptr(), recv),
                _ => (recv, recv),
            },
        }
    }

    /// Queues one operation on the stream.
    fn enqueue(
        &self,
        config: &Config,
        lib: Lib,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(), PerfError> {
        let c = config.args.collective;
        let (send, recv) = self.pointers(placement, shape, c);
        let dtype = config.args.dtype;
        let (n, rank, root) = (self.coll.nranks(), self.coll.rank(), config.args.root);
        let (count, per) = (shape.count as usize, shape.count as usize / n);
        let op = config.args.redop.reduce_op(dtype, rank);
        let nccl = || {
            self.nccl
                .ok_or_else(|| PerfError::Nccl("NCCL is not initialised".into()))
        };
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        match (lib, c) {
            // SAFETY (all of these): as below.
            (Lib::Mscclpp, Collective::ReduceScatter) => unsafe {
                self.coll.reduce_scatter(
                    &RawBuffer::device(send, per.saturating_mul(self.coll.nranks()), dtype),
                    &mut RawBuffer::device(recv, per, dtype),
                    op,
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            (Lib::Mscclpp, Collective::Broadcast) => unsafe {
                self.coll.broadcast(
                    &RawBuffer::device(send, count, dtype),
                    &mut RawBuffer::device(recv, count, dtype),
                    root,
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            (Lib::Mscclpp, Collective::Reduce) => unsafe {
                self.coll.reduce(
                    &RawBuffer::device(send, count, dtype),
                    &mut RawBuffer::device(recv, count, dtype),
                    op,
                    root,
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            (Lib::Mscclpp, Collective::AllToAll) => unsafe {
                self.coll.all_to_all(
                    &RawBuffer::device(send, per.saturating_mul(self.coll.nranks()), dtype),
                    &mut RawBuffer::device(recv, per.saturating_mul(self.coll.nranks()), dtype),
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            (Lib::Mscclpp, Collective::SendRecv) => {
                let ops = [
                    P2pOp::Send {
                        buf: send,
                        count,
                        dtype,
                        peer: next,
                    },
                    P2pOp::Recv {
                        buf: recv,
                        count,
                        dtype,
                        peer: prev,
                    },
                ];
                // SAFETY: as below.
                unsafe { self.coll.group(&ops, &self.stream) }.map_err(PerfError::from)
            }
            (Lib::Nccl, Collective::ReduceScatter) => unsafe {
                nccl()?.reduce_scatter(send, recv, per, dtype, op, &self.stream)
            },
            (Lib::Nccl, Collective::Broadcast) => unsafe {
                nccl()?.broadcast(send, recv, count, dtype, root, &self.stream)
            },
            (Lib::Nccl, Collective::Reduce) => unsafe {
                nccl()?.reduce(send, recv, count, dtype, op, root, &self.stream)
            },
            (Lib::Nccl, Collective::AllToAll) => unsafe {
                nccl()?.all_to_all(send, recv, per, dtype, n, &self.stream)
            },
            (Lib::Nccl, Collective::SendRecv) => unsafe {
                nccl()?.send_recv(send, recv, count, dtype, next, prev, &self.stream)
            },
            // SAFETY (all four): the buffers hold the largest shape of the sweep and live in
            // `self` until the stream is synchronised in `measure`.
            (Lib::Mscclpp, Collective::AllReduce) => unsafe {
                self.coll.all_reduce_using(
                    config.args.algo.all_reduce(),
                    &RawBuffer::device(send, shape.count as usize, dtype),
                    &mut RawBuffer::device(recv, shape.count as usize, dtype),
                    op,
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            (Lib::Mscclpp, Collective::AllGather) => unsafe {
                self.coll.all_gather(
                    &RawBuffer::device(send, shape.send_count as usize, dtype),
                    &mut RawBuffer::device(
                        recv,
                        (shape.send_count as usize).saturating_mul(self.coll.nranks()),
                        dtype,
                    ),
                    &self.stream,
                )
            }
            .map_err(PerfError::from),
            (Lib::Nccl, Collective::AllReduce) => match self.nccl {
                Some(n) => unsafe {
                    n.all_reduce(send, recv, shape.count as usize, dtype, op, &self.stream)
                },
                None => Err(PerfError::Nccl("NCCL is not initialised".into())),
            },
            (Lib::Nccl, Collective::AllGather) => match self.nccl {
                Some(n) => unsafe {
                    n.all_gather(send, recv, shape.send_count as usize, dtype, &self.stream)
                },
                None => Err(PerfError::Nccl("NCCL is not initialised".into())),
            },
        }
    }

    /// Synchronises the stream and the GPU, then returns what the collectives' kernels
    /// recorded (`Collectives::synchronize`): calls are asynchronous, so a mismatch between
    /// the ranks, a timeout or an abort (a lost rank) of a timed loop surfaces here, as an
    /// error that ends the run with a non-zero exit status, rather than as bad timings.
    fn sync(&self) -> Result<(), PerfError> {
        self.coll.synchronize(&self.stream)?;
        self.gpu.synchronize()?;
        Ok(self.coll.async_error()?)
    }

    /// Writes the check inputs (every rank; peers are idle: barriers on both sides).
    fn load_inputs(
        &self,
        config: &Config,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(), PerfError> {
        let bs = self.coll.communicator().bootstrap();
        self.sync()?;
        bs.barrier()?;
        let (input, recv) = check_inputs::<T>(
            config,
            self.coll.nranks(),
            self.coll.rank(),
            placement,
            shape,
        )?;
        self.recv.copy_from_host(0, &recv)?;
        if effective(config.args.collective, placement) == Placement::OutOfPlace {
            self.send.copy_from_host(0, &input)?;
        }
        self.sync()?;
        bs.barrier()?;
        Ok(())
    }

    fn time(
        &self,
        config: &Config,
        lib: Lib,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(f64, Option<f64>), PerfError> {
        let bs = self.coll.communicator().bootstrap();
        let a = &config.args;
        for _ in 0..a.warmup_iters {
            self.enqueue(config, lib, placement, shape)?;
        }
        self.sync()?;
        let ctx = self.stream.context();
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(timing).map_err(drv("cuEventCreate"))?;
        let stop = ctx.new_event(timing).map_err(drv("cuEventCreate"))?;
        let mut host_us = None;
        let ops = if a.graph_launches == 0 {
            bs.barrier()?;
            // Ranks leave the host barrier microseconds apart. One untimed call first waits
            // on the GPU for the last of them, so the timed calls start together (nccl-tests'
            // timed loop likewise follows its warm-up on the stream, with no host barrier).
            self.enqueue(config, lib, placement, shape)?;
            start.record(&self.stream).map_err(drv("cuEventRecord"))?;
            let queued_at = std::time::Instant::now();
            for _ in 0..a.iters {
                self.enqueue(config, lib, placement, shape)?;
            }
            host_us = Some(queued_at.elapsed().as_secs_f64() * 1e6 / a.iters.max(1) as f64);
            stop.record(&self.stream).map_err(drv("cuEventRecord"))?;
            a.iters as f64
        } else {
            if a.warmup_iters == 0 {
                // fp8 reductions and pre-multiplied sums allocate the communicator's staging
                // buffer at their first call, which cannot be under capture.
                self.enqueue(config, lib, placement, shape)?;
                self.sync()?;
            }
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(drv("cuStreamBeginCapture"))?;
            let queued = (0..a.iters).try_for_each(|_| self.enqueue(config, lib, placement, shape));
            // End the capture even when a call failed, so the stream is usable again.
            let graph = self
                .stream
                .end_capture(CUgraphInstantiate_flags(0))
                .map_err(drv("cuStreamEndCapture"));
            queued?;
            let graph = graph?.ok_or_else(|| {
                PerfError::Cuda(CudaError::InvalidArgument(
                    "the captured CUDA graph is empty".into(),
                ))
            })?;
            graph.upload().map_err(drv("cuGraphUpload"))?;
            graph.launch().map_err(drv("cuGraphLaunch"))?;
            self.sync()?;
            bs.barrier()?;
            // As above: one untimed call aligns the ranks.
            self.enqueue(config, lib, placement, shape)?;
            start.record(&self.stream).map_err(drv("cuEventRecord"))?;
            for _ in 0..a.graph_launches {
                graph.launch().map_err(drv("cuGraphLaunch"))?;
            }
            stop.record(&self.stream).map_err(drv("cuEventRecord"))?;
            a.iters as f64 * a.graph_launches as f64
        };
        stop.synchronize().map_err(drv("cuEventSynchronize"))?;
        let ms = start.elapsed_ms(&stop).map_err(drv("cuEventElapsedTime"))? as f64;
        self.sync()?;
        Ok((ms * 1e3 / ops, host_us))
    }

    fn measure(
        &mut self,
        config: &Config,
        lib: Lib,
        placement: Placement,
        shape: &Shape,
    ) -> Result<Timed, PerfError> {
        if config.check() {
            self.load_inputs(config, placement, shape)?;
        }
        let (us, host_us) = self.time(config, lib, placement, shape)?;
        // NCCL's all-to-all does not support in place (it is grouped sends and receives
        // of the same buffer): timed as nccl-tests does, not checked.
        let unsupported = lib == Lib::Nccl
            && placement == Placement::InPlace
            && config.args.collective == Collective::AllToAll;
        let wrong = if config.check() && !unsupported {
            // Fresh inputs: in-place iterations have overwritten them.
            self.load_inputs(config, placement, shape)?;
            self.enqueue(config, lib, placement, shape)?;
            self.sync()?;
            let mut got = host_vec(shape.count, T::default(), "the check's copy of the output")?;
            self.recv.copy_to_host(0, &mut got)?;
            let (c, n, rank) = (config.args.collective, self.coll.nranks(), self.coll.rank());
            let strictness = match lib {
                Lib::Mscclpp => Strictness::Exact,
                Lib::Nccl => Strictness::Nccl,
            };
            Some(reference(config, n).count_wrong(
                strictness,
                rank,
                shape.send_count,
                &got[out_range(c, placement, shape, rank, n)],
            ))
        } else {
            None
        };
        Ok(Timed { us, host_us, wrong })
    }
}

/// Elements a [`HostRunner`] holds at most for a sweep whose largest shape is `largest`:
/// its send and receive buffers and the in-place send copy (`slot`), and while
/// [`HostRunner::load_inputs`] runs, the check's fresh input and receive image beside them.
/// Keep in step with the runner: the host-memory check before the ranks allocate counts it.
fn host_runner_peak(largest: &Shape) -> u128 {
    3 * u128::from(largest.send_count) + 2 * u128::from(largest.count)
}

struct HostRunner<T: Elem> {
    send: Vec<T>,
    recv: Vec<T>,
    /// In-place all-gather: the rank's own slot, sent from here.
    slot: Vec<T>,
}

impl<T: Elem> HostRunner<T> {
    fn new(coll: &Collectives, largest: &Shape) -> Result<Self, PerfError> {
        let _ = coll;
        Ok(HostRunner {
            send: host_vec(largest.send_count, T::default(), "the send buffer")?,
            recv: host_vec(largest.count, T::default(), "the receive buffer")?,
            slot: Vec::new(),
        })
    }

    fn run_once(
        &mut self,
        config: &Config,
        coll: &Collectives,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(), PerfError> {
        let (sc, n) = (shape.send_count as usize, shape.count as usize);
        let op = config.args.redop.reduce_op(config.args.dtype, coll.rank());
        let root = config.args.root;
        match (config.args.collective, placement) {
            (Collective::AllReduce, Placement::OutOfPlace) => {
                coll.all_reduce(&self.send[..sc], &mut self.recv[..n], op, Exec::Host)?
            }
            (Collective::AllReduce, Placement::InPlace) => {
                coll.all_reduce_in_place(&mut self.recv[..n], op, Exec::Host)?
            }
            (Collective::AllGather, Placement::OutOfPlace) => {
                coll.all_gather(&self.send[..sc], &mut self.recv[..n], Exec::Host)?
            }
            (Collective::AllGather, Placement::InPlace) => {
                coll.all_gather(&self.slot[..sc], &mut self.recv[..n], Exec::Host)?
            }
            (Collective::ReduceScatter, Placement::OutOfPlace) => {
                let per = n / coll.nranks();
                coll.reduce_scatter(&self.send[..sc], &mut self.recv[..per], op, Exec::Host)?
            }
            (Collective::ReduceScatter, Placement::InPlace) => {
                coll.reduce_scatter_in_place(&mut self.recv[..n], op, Exec::Host)?
            }
            (Collective::Broadcast, Placement::OutOfPlace) => {
                coll.broadcast(&self.send[..sc], &mut self.recv[..n], root, Exec::Host)?
            }
            (Collective::Broadcast, Placement::InPlace) => {
                coll.broadcast_in_place(&mut self.recv[..n], root, Exec::Host)?
            }
            (Collective::Reduce, Placement::OutOfPlace) => {
                coll.reduce(&self.send[..sc], &mut self.recv[..n], op, root, Exec::Host)?
            }
            (Collective::Reduce, Placement::InPlace) => {
                coll.reduce_in_place(&mut self.recv[..n], op, root, Exec::Host)?
            }
            (Collective::AllToAll, Placement::OutOfPlace) => {
                coll.all_to_all(&self.send[..sc], &mut self.recv[..n], Exec::Host)?
            }
            (Collective::AllToAll, Placement::InPlace) => {
                coll.all_to_all(&self.slot[..sc], &mut self.recv[..n], Exec::Host)?
            }
            (Collective::SendRecv, _) => {
                let (r, nr) = (coll.rank(), coll.nranks());
                let ops = [
                    P2pOp::Send {
                        buf: self.send.as_ptr() as u64,
                        count: n,
                        dtype: config.args.dtype,
                        peer: (r + 1) % nr,
                    },
                    P2pOp::Recv {
                        buf: self.recv.as_mut_ptr() as u64,
                        count: n,
                        dtype: config.args.dtype,
                        peer: (r + nr - 1) % nr,
                    },
                ];
                // SAFETY: both vectors hold at least `n` elements (the largest shape) and
                // are borrowed for the call.
                unsafe { coll.group(&ops, Exec::Host)? }
            }
        }
        Ok(())
    }

    fn load_inputs(
        &mut self,
        config: &Config,
        coll: &Collectives,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(), PerfError> {
        let bs = coll.communicator().bootstrap();
        // Peers may still be in the previous operation.
        bs.barrier()?;
        let (input, recv) =
            check_inputs::<T>(config, coll.nranks(), coll.rank(), placement, shape)?;
        self.recv[..recv.len()].copy_from_slice(&recv);
        self.send[..input.len()].copy_from_slice(&input);
        self.slot = input;
        Ok(bs.barrier()?)
    }

    fn measure(
        &mut self,
        config: &Config,
        coll: &Collectives,
        placement: Placement,
        shape: &Shape,
    ) -> Result<Timed, PerfError> {
        let a = &config.args;
        let bs = coll.communicator().bootstrap();
        // Inputs always: the in-place all-gather sends from `slot`.
        self.load_inputs(config, coll, placement, shape)?;
        for _ in 0..a.warmup_iters {
            self.run_once(config, coll, placement, shape)?;
        }
        bs.barrier()?;
        let t = Instant::now();
        for _ in 0..a.iters {
            self.run_once(config, coll, placement, shape)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / a.iters as f64;
        let wrong = if config.check() {
            self.load_inputs(config, coll, placement, shape)?;
            self.run_once(config, coll, placement, shape)?;
            let (c, n, rank) = (a.collective, coll.nranks(), coll.rank());
            Some(reference(config, n).count_wrong(
                Strictness::Exact,
                rank,
                shape.send_count,
                &self.recv[out_range(c, placement, shape, rank, n)],
            ))
        } else {
            None
        };
        Ok(Timed {
            us,
            host_us: None,
            wrong,
        })
    }
}
