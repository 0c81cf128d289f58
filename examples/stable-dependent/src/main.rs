//! A dependent of mscclpp built with stable Rust: three ranks (processes this program starts
//! itself) all-reduce over the Host transport and check the sums. CI builds it with no
//! nightly (`MSCCLPP_DEVICE_BUILD=shipped`) and no ptxas (`PTXAS=none`).
//!
//! ```text
//! cargo run            # from examples/stable-dependent/
//! ```

use mscclpp::host::collectives::Exec;
use std::process::ExitCode;
use std::time::Duration;

use mscclpp::host::collectives::{CollConfig, Collectives, ReduceOp};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::launch::{Launch, LaunchError, LocalLauncher};

const RANKS: usize = 3;

/// Element `i` of rank `rank`'s input: small integers, so that f32 sums are exact.
fn value(rank: usize, i: usize) -> f32 {
    ((i * 7 + rank * 5) % 11) as f32 - 5.0
}

fn main() -> ExitCode {
    match Launch::from_env() {
        Ok(launch) => match run_rank(launch) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Err(LaunchError::NotLaunched) => launch_ranks(),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Started by hand: runs this program once per rank and reports how they ended.
fn launch_ranks() -> ExitCode {
    let embedded: Vec<String> = mscclpp::host::ptx::PTX
        .iter()
        .map(|(cc, _)| format!("sm_{cc}"))
        .collect();
    println!(
        "kernels embedded as PTX for {embedded:?}, {} cubin(s)",
        mscclpp::host::ptx::CUBIN.len()
    );
    let report =
        LocalLauncher::current_exe(RANKS).map(|l| l.timeout(Duration::from_secs(120)).run());
    match report {
        Ok(Ok(r)) if r.success() => {
            println!("all-reduce over {RANKS} ranks on the Host transport: sums correct");
            ExitCode::SUCCESS
        }
        Ok(Ok(r)) => {
            eprintln!("ranks failed:\n{r}");
            ExitCode::FAILURE
        }
        Ok(Err(e)) | Err(e) => {
            eprintln!("error: cannot launch the ranks: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_rank(launch: Launch) -> Result<(), Box<dyn std::error::Error>> {
    let bootstrap = launch.blocking_bootstrap()?;
    let comm = Communicator::from_bootstrap(bootstrap, Backend::Host, CommConfig::default())?;
    let coll = Collectives::new(comm, CollConfig::default())?;
    let (rank, n) = (coll.rank(), coll.nranks());
    // One element, a size that is not a multiple of the ranks or of a packet, and one of
    // several scratch rounds.
    for count in [1usize, 1001, 300_000] {
        let send: Vec<f32> = (0..count).map(|i| value(rank, i)).collect();
        let mut sum = vec![0f32; count];
        coll.all_reduce(&send, &mut sum, ReduceOp::Sum, Exec::Host)?;
        let mut max = send.clone();
        coll.all_reduce_in_place(&mut max, ReduceOp::Max, Exec::Host)?;
        for i in 0..count {
            let want_sum: f32 = (0..n).map(|q| value(q, i)).sum();
            let want_max = (0..n).map(|q| value(q, i)).fold(f32::MIN, f32::max);
            if sum[i] != want_sum || max[i] != want_max {
                return Err(format!(
                    "rank {rank}, {count} elements, [{i}]: sum {} (want {want_sum}), max {} \
                     (want {want_max})",
                    sum[i], max[i]
                )
                .into());
            }
        }
    }
    Ok(())
}
