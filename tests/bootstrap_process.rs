//! Bootstrap across processes: the test binary re-executes itself through the local
//! launcher, one process per rank, with `MSCCLPP_TEST_ROLE` selecting what the child does
//! and `--exact <test name>` selecting the test that does it. 127.0.0.1 only.

use std::process::Command;
use std::time::Duration;

use mscclpp::host::bootstrap::BootstrapError;
use mscclpp::host::launch::{Launch, LaunchReport, LocalLauncher};

const ROLE: &str = "MSCCLPP_TEST_ROLE";

fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// Runs `test` (this binary, this test's name) as `nranks` processes in `role`.
fn launch(test: &str, nranks: usize, role: &str) -> LaunchReport {
    let exe = std::env::current_exe().unwrap();
    LocalLauncher::command(nranks, exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .bootstrap_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(60))
        .capture_output(true)
        .run()
        .unwrap()
}

/// Whether rank `r`'s output has a line ending in `text` (libtest may print its own
/// `test name ... ` before the child's first line).
fn printed(report: &LaunchReport, r: usize, text: &str) -> bool {
    let prefix = format!("[rank {r}] ");
    report
        .output
        .iter()
        .any(|l| l.starts_with(&prefix) && l.ends_with(text))
}

fn payload(r: usize) -> Vec<u8> {
    (0..(r * 101 + 3)).map(|i| (i * 31 + r) as u8).collect()
}

/// A rank: every operation, checked against what the others contribute.
fn exercise_rank() {
    let launch = Launch::from_env().unwrap();
    let bs = launch.blocking_bootstrap().unwrap();
    let (r, n) = (bs.rank(), bs.nranks());
    assert_eq!((r, n), (launch.rank, launch.nranks));
    assert_eq!(bs.local_rank(), launch.local_rank.unwrap());
    assert_eq!(bs.nranks_per_node(), n);
    let all = bs.all_gather(&payload(r)).unwrap();
    let expected: Vec<_> = (0..n).map(payload).collect();
    assert_eq!(all, expected);
    bs.barrier().unwrap();
    let root = n - 1;
    let data = if r == root { payload(999) } else { Vec::new() };
    assert_eq!(bs.broadcast(root, &data).unwrap(), payload(999));
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    bs.send(next, 5, &payload(r + 7)).unwrap();
    assert_eq!(bs.recv(prev, 5).unwrap(), payload(prev + 7));
    bs.barrier().unwrap();
    println!("rank {r} of {n}: ok");
}

fn processes(test: &str, nranks: usize) {
    if role().is_some() {
        return exercise_rank();
    }
    let report = launch(test, nranks, "exercise");
    let output = report.output.join("\n");
    assert!(report.success(), "{report}{output}");
    for r in 0..nranks {
        let line = format!("rank {r} of {nranks}: ok");
        assert!(
            printed(&report, r, &line),
            "rank {r} did not print {line:?}:\n{output}"
        );
    }
}

#[test]
fn processes_1_rank() {
    processes("processes_1_rank", 1);
}

#[test]
fn processes_2_ranks() {
    processes("processes_2_ranks", 2);
}

#[test]
fn processes_3_ranks() {
    processes("processes_3_ranks", 3);
}

#[test]
fn processes_8_ranks() {
    processes("processes_8_ranks", 8);
}

/// The victim kills itself with SIGKILL while the others wait in `op`; each survivor must
/// fail with an error naming the victim (and exits 0 only then).
fn killed_rank(test: &str, nranks: usize, victim: usize, op: &str) {
    if let Some(op) = role() {
        let launch = Launch::from_env().unwrap();
        let bs = launch.blocking_bootstrap().unwrap();
        if bs.rank() == victim {
            std::thread::sleep(Duration::from_millis(300));
            let pid = std::process::id().to_string();
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            std::process::abort();
        }
        let result = match op.as_str() {
            "barrier" => bs.barrier(),
            _ => bs.all_gather(b"data").map(drop),
        };
        match result {
            Err(BootstrapError::PeerLost { peer, .. }) if peer == victim => {
                println!("rank {}: lost rank {peer} as expected", bs.rank());
                return;
            }
            other => panic!(
                "rank {}: expected PeerLost naming {victim}, got {other:?}",
                bs.rank()
            ),
        }
    }
    let report = launch(test, nranks, op);
    let output = report.output.join("\n");
    for exit in &report.ranks {
        if exit.rank == victim {
            assert!(!exit.status.success(), "the victim survived:\n{report}");
        } else {
            assert!(exit.status.success(), "{report}{output}");
            let line = format!("rank {}: lost rank {victim} as expected", exit.rank);
            assert!(
                printed(&report, exit.rank, &line),
                "missing {line:?} in:\n{output}"
            );
        }
    }
}

#[test]
fn process_killed_during_all_gather_is_named() {
    killed_rank(
        "process_killed_during_all_gather_is_named",
        3,
        1,
        "all_gather",
    );
}

#[test]
fn process_killed_during_barrier_is_named() {
    killed_rank("process_killed_during_barrier_is_named", 8, 5, "barrier");
}

#[test]
fn launcher_prefixes_output_and_reports_exit_codes() {
    if role().is_some() {
        let launch = Launch::from_env().unwrap();
        println!("hello from {}", launch.rank);
        eprintln!("complaint from {}", launch.rank);
        std::process::exit(launch.rank as i32);
    }
    let report = launch("launcher_prefixes_output_and_reports_exit_codes", 3, "exit");
    assert!(!report.success());
    for (r, exit) in report.ranks.iter().enumerate() {
        assert_eq!((exit.rank, exit.status.code()), (r, Some(r as i32)));
        assert!(!exit.killed_at_timeout);
        for line in [format!("hello from {r}"), format!("complaint from {r}")] {
            assert!(
                printed(&report, r, &line),
                "missing {line:?} in {:?}",
                report.output
            );
        }
    }
}

#[test]
fn launcher_timeout_kills_the_ranks() {
    if role().is_some() {
        std::thread::sleep(Duration::from_secs(30));
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let report = LocalLauncher::command(2, exe)
        .args(["--exact", "launcher_timeout_kills_the_ranks", "--nocapture"])
        .env(ROLE, "sleep")
        .timeout(Duration::from_millis(500))
        .capture_output(true)
        .run()
        .unwrap();
    assert!(!report.success());
    for exit in &report.ranks {
        assert!(exit.killed_at_timeout, "{report}");
        assert!(!exit.status.success());
    }
}

/// A rank killed at the launch timeout is reported with its threads as they stood just
/// before the kill (name, state, kernel wait channel), so a hang says where it hung.
#[test]
#[cfg(target_os = "linux")]
fn a_rank_killed_at_the_timeout_is_reported_with_its_threads() {
    if role().is_some() {
        let (_tx, rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::Builder::new()
            .name("hung-worker".into())
            .spawn(move || rx.recv())
            .unwrap();
        println!("hanging");
        let _ = worker.join();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let test = "a_rank_killed_at_the_timeout_is_reported_with_its_threads";
    let report = LocalLauncher::command(1, exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, "hang")
        .timeout(Duration::from_secs(3))
        .capture_output(true)
        .run()
        .unwrap();
    print!("{report}");
    let r = &report.ranks[0];
    assert!(r.killed_at_timeout, "{report}");
    assert!(printed(&report, 0, "hanging"), "{:?}", report.output);
    // The worker blocks in a futex: asleep (S), in some kernel wait function.
    let worker = r.threads.iter().find(|l| l.starts_with("hung-worker "));
    let fields: Vec<&str> = worker
        .unwrap_or_else(|| panic!("no hung-worker thread in {:?}", r.threads))
        .split(' ')
        .collect();
    assert_eq!(fields.len(), 3, "{fields:?}");
    assert_eq!(fields[1], "S", "{fields:?}");
    assert!(
        report.to_string().contains("its threads before the kill: "),
        "{report}"
    );
}
