//! Setup time and per-rank memory of [`Collectives`] across simulated hosts: for each rank
//! count, the example re-executes itself as that many processes on this machine (Host
//! backend), splits them into simulated hosts of up to 4 ranks (`with_host_id`: ranks of one
//! host talk over shared memory, hosts over TCP on 127.0.0.1), builds the collectives, checks
//! one all-reduce, and prints a table.
//!
//! ```text
//! cargo run --release --example cross_host_scale            # 2 4 8 16 32 64 ranks
//! cargo run --release --example cross_host_scale -- 8 16    # chosen rank counts
//! ```
//!
//! Columns: the largest `Collectives::new` time over the ranks (every rank starts it after a
//! bootstrap barrier), the connections of one rank (memory and proxy channels to its host's
//! ranks, one TCP channel per other host, and two per rank on another host for send/recv
//! while there are at most `CollConfig::p2p_remote_max` of those), and the resident memory
//! of one rank (largest over
//! the ranks) before and after `Collectives::new` (shared-memory segments count once they
//! are touched). The collectives use a 1 MiB scratch and 64 KiB packet scratch
//! (`CollConfig`), so the numbers show how state grows with the job, not the defaults'
//! size. Times on a busy machine with fewer cores than ranks mostly measure scheduling.

use mscclpp::host::collectives::Exec;
use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::BlockingBootstrap;
use mscclpp::host::collectives::{CollConfig, Collectives, ReduceOp};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::launch::{Launch, LocalLauncher};

const ROLE: &str = "MSCCLPP_SCALE_ROLE";
const PER_HOST: &str = "MSCCLPP_SCALE_PER_HOST";

/// Resident set of this process in KiB (`VmRSS` of /proc/self/status).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn rank_main() -> Result<(), Box<dyn std::error::Error>> {
    let launch = Launch::from_env()?;
    let per: usize = std::env::var(PER_HOST)?.parse()?;
    let config = launch
        .config()
        .with_host_id(format!("sim-host-{}", launch.rank / per));
    let bs = BlockingBootstrap::init_with_config(launch.nranks, launch.rank, launch.root, config)?;
    let comm = Communicator::from_bootstrap(
        bs,
        Backend::Host,
        CommConfig {
            device_timeout: Duration::from_secs(120),
            ..CommConfig::default()
        },
    )?;
    comm.bootstrap().barrier()?;
    let before = rss_kib();
    let t = Instant::now();
    let c = Collectives::new(
        comm,
        CollConfig {
            scratch_bytes: 1 << 20,
            packet_max_bytes: 64 << 10,
            ..CollConfig::default()
        },
    )?;
    let setup = t.elapsed();
    let n = c.nranks();
    let mut v: Vec<f32> = (0..1001).map(|i| (i % 7) as f32).collect();
    c.all_reduce_in_place(&mut v, ReduceOp::Sum, Exec::Host)?;
    for (i, x) in v.iter().enumerate() {
        if *x != ((i % 7) * n) as f32 {
            return Err(format!("rank {}: element {i} is {x}", c.rank()).into());
        }
    }
    let after = rss_kib();
    println!(
        "SCALE {} {} {} {} {}",
        c.rank(),
        setup.as_micros(),
        c.communicator().connections().len(),
        before,
        after
    );
    c.communicator().bootstrap().barrier()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var(ROLE).is_ok() {
        return rank_main();
    }
    let args: Result<Vec<usize>, _> = std::env::args().skip(1).map(|a| a.parse()).collect();
    let counts = match args {
        Ok(v) if !v.is_empty() => v,
        _ => vec![2, 4, 8, 16, 32, 64],
    };
    println!(
        "| ranks | hosts x ranks | setup (max over ranks) | connections per rank | RSS per rank before / after setup |"
    );
    println!("|---|---|---|---|---|");
    for n in counts {
        // At least two hosts, at most 4 ranks each.
        let per = (n / 2).clamp(1, 4);
        let report = LocalLauncher::command(n, std::env::current_exe()?)
            .env(ROLE, "rank")
            .env(PER_HOST, per.to_string())
            .bootstrap_timeout(Duration::from_secs(120))
            .timeout(Duration::from_secs(300))
            .capture_output(true)
            .run()?;
        if !report.success() {
            return Err(format!("{n} ranks: {report}\n{}", report.output.join("\n")).into());
        }
        let rows: Vec<Vec<u64>> = report
            .output
            .iter()
            .filter_map(|l| l.split_once("SCALE ").map(|(_, r)| r))
            .map(|r| {
                r.split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect()
            })
            .collect();
        let max = |i: usize| rows.iter().map(|r| r[i]).max().unwrap_or(0);
        println!(
            "| {n} | {} x {per} | {:.1} ms | {} | {:.1} / {:.1} MiB |",
            n.div_ceil(per),
            max(1) as f64 / 1000.0,
            max(2),
            max(3) as f64 / 1024.0,
            max(4) as f64 / 1024.0
        );
    }
    Ok(())
}
