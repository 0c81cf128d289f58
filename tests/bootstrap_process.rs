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

/// With `stop_after_failure`, a rank that fails makes the launcher stop the others after the
/// grace, instead of waiting for them to the timeout (helper audit: a stopped rank held a
/// train-dp job for its four-hour timeout after the other rank had failed).
#[test]
fn launcher_stops_the_other_ranks_after_a_failure() {
    if let Some(role) = role() {
        let launch = Launch::from_env().unwrap();
        if launch.rank == 0 {
            std::process::exit(3);
        }
        assert_eq!(role, "fail-or-sleep");
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let t0 = std::time::Instant::now();
    let report = LocalLauncher::command(3, exe)
        .args([
            "--exact",
            "launcher_stops_the_other_ranks_after_a_failure",
            "--nocapture",
        ])
        .env(ROLE, "fail-or-sleep")
        .timeout(Duration::from_secs(120))
        .stop_after_failure(Duration::from_millis(500))
        .capture_output(true)
        .run()
        .unwrap();
    let took = t0.elapsed();
    print!("{report}");
    assert!(!report.success());
    assert_eq!(report.ranks[0].status.code(), Some(3), "{report}");
    assert_eq!(report.ranks[0].stopped_after, None, "{report}");
    for r in &report.ranks[1..] {
        assert_eq!(r.stopped_after, Some(0), "{report}");
        assert!(!r.killed_at_timeout, "{report}");
    }
    assert!(report.to_string().contains("rank 0 had failed"), "{report}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// The grace after a failure ends early once every rank still running is stopped by a signal
/// (rank 1 sends itself SIGSTOP, as a user's `kill -STOP` would): such a rank can report
/// nothing, so waiting out the grace (60 s here; the perf tool's 10 s) only delays the job's
/// end (seen in session 28: a stopped rank held `mscclpp-perf` 10 s after every other rank
/// had failed).
#[test]
fn the_grace_after_a_failure_ends_when_the_ranks_left_are_stopped() {
    if role().is_some() {
        let launch = Launch::from_env().unwrap();
        if launch.rank == 1 {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-STOP", &pid])
                .status();
            // Only if the signal did not stop us (or someone continued us).
            std::thread::sleep(Duration::from_secs(120));
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
        std::process::exit(3);
    }
    let exe = std::env::current_exe().unwrap();
    let t0 = std::time::Instant::now();
    let report = LocalLauncher::command(2, exe)
        .args([
            "--exact",
            "the_grace_after_a_failure_ends_when_the_ranks_left_are_stopped",
            "--nocapture",
        ])
        .env(ROLE, "fail-or-stop")
        .timeout(Duration::from_secs(150))
        .stop_after_failure(Duration::from_secs(60))
        .capture_output(true)
        .run()
        .unwrap();
    let took = t0.elapsed();
    print!("{report}");
    assert_eq!(report.ranks[0].status.code(), Some(3), "{report}");
    assert_eq!(report.ranks[1].stopped_after, Some(0), "{report}");
    assert!(!report.ranks[1].killed_at_timeout, "{report}");
    assert!(
        took < Duration::from_secs(30),
        "the launcher waited {took:?} for a stopped rank"
    );
}

/// A rank that ends before the rendezvous completes (here it exits with status 3 before
/// it bootstraps) is named at once by the others: the launcher tells its root, which
/// refuses every join with the reason, where they waited for the bootstrap timeout
/// (helper audit: 30 s, and under `mscclpp-perf` killed silently after its 10 s grace).
#[test]
fn a_rank_that_ends_before_the_rendezvous_is_named_at_once() {
    if role().is_some() {
        let launch = Launch::from_env().unwrap();
        if launch.rank == 1 {
            std::process::exit(3);
        }
        if launch.rank == 2 {
            // Joins only after rank 1 is gone: a late join is refused too.
            std::thread::sleep(Duration::from_millis(1500));
        }
        let t0 = std::time::Instant::now();
        match launch.blocking_bootstrap() {
            Err(e) => println!("after {:?}: {e}", t0.elapsed()),
            Ok(_) => println!("bootstrapped without rank 1"),
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let t0 = std::time::Instant::now();
    let report = LocalLauncher::command(3, exe)
        .args([
            "--exact",
            "a_rank_that_ends_before_the_rendezvous_is_named_at_once",
            "--nocapture",
        ])
        .env(ROLE, "early-exit")
        .bootstrap_timeout(Duration::from_secs(60))
        .timeout(Duration::from_secs(120))
        .capture_output(true)
        .run()
        .unwrap();
    let took = t0.elapsed();
    print!("{report}");
    assert_eq!(report.ranks[1].status.code(), Some(3), "{report}");
    for r in [0, 2] {
        let line = report
            .output
            .iter()
            .find(|l| l.starts_with(&format!("[rank {r}] after ")))
            .unwrap_or_else(|| panic!("rank {r} printed no error: {:#?}", report.output));
        assert!(
            line.contains("rank 1 ended before the rendezvous completed (exit status: 3)"),
            "{line}"
        );
    }
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

/// Ranks end with their launcher: a launcher killed with SIGKILL (here a child process of
/// the test running `LocalLauncher`) takes its sleeping ranks with it at once, where they
/// ran on as orphans until their next write to its closed pipe (helper audit).
#[test]
#[cfg(target_os = "linux")]
fn ranks_end_with_their_launcher() {
    const PIDS: &str = "MSCCLPP_TEST_PIDS";
    let test = "ranks_end_with_their_launcher";
    match role().as_deref() {
        Some("rank") => {
            let path = std::env::var(PIDS).unwrap();
            let rank = Launch::from_env().unwrap().rank;
            std::fs::write(format!("{path}.{rank}"), std::process::id().to_string()).unwrap();
            std::thread::sleep(Duration::from_secs(120));
            return;
        }
        Some(_) => {
            // The launcher: two sleeping ranks.
            let exe = std::env::current_exe().unwrap();
            let _ = LocalLauncher::command(2, exe)
                .args(["--exact", test, "--nocapture"])
                .env(ROLE, "rank")
                .timeout(Duration::from_secs(120))
                .run();
            return;
        }
        None => {}
    }
    let path = std::env::temp_dir().join(format!("mscclpp-pids-{}", std::process::id()));
    let path = path.to_str().unwrap().to_string();
    let mut launcher = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(ROLE, "launcher")
        .env(PIDS, &path)
        .spawn()
        .unwrap();
    let read = |r: usize| std::fs::read_to_string(format!("{path}.{r}")).ok();
    let t0 = std::time::Instant::now();
    while (read(0).is_none() || read(1).is_none()) && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pids: Vec<String> = (0..2).map(|r| read(r).expect("rank started")).collect();
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let alive = |pid: &str| {
        // A process that ended and was reaped has no /proc entry; one not yet reaped is a
        // zombie (state Z).
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, t)| t.trim_start().to_string()))
            .is_some_and(|t| !t.starts_with('Z'))
    };
    let t0 = std::time::Instant::now();
    while pids.iter().any(|p| alive(p)) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (r, pid) in pids.iter().enumerate() {
        let _ = std::fs::remove_file(format!("{path}.{r}"));
        if alive(pid) {
            // The orphan must not outlive the test.
            let _ = Command::new("kill").args(["-9", pid]).status();
            panic!("rank {r} (pid {pid}) outlived its killed launcher");
        }
    }
}

/// A rank killed at the launch timeout is reported with its threads as they stood just
/// before the kill (name, state, kernel wait channel), so a hang says where it hung.
#[test]
#[cfg(target_os = "linux")]
fn a_rank_killed_at_the_timeout_is_reported_with_its_threads() {
    if role().is_some() {
        return hang();
    }
    let test = "a_rank_killed_at_the_timeout_is_reported_with_its_threads";
    let report = launch_hang(test, false);
    assert!(report.ranks[0].stacks.is_empty(), "{report}");
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

/// A rank that blocks for good in a thread named `hung-worker` (in [`hang_here`]).
#[cfg(target_os = "linux")]
fn hang() {
    let (_tx, rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::Builder::new()
        .name("hung-worker".into())
        .spawn(move || hang_here(rx))
        .unwrap();
    println!("hanging");
    let _ = worker.join();
}

/// Where the hung worker waits (not inlined: its name must show in the stack).
#[inline(never)]
#[cfg(target_os = "linux")]
fn hang_here(rx: std::sync::mpsc::Receiver<()>) {
    let _ = rx.recv();
}

/// Runs `test` as one rank with the role `hang`, killed after 3 s, stacks on or off.
#[cfg(target_os = "linux")]
fn launch_hang(test: &str, stacks: bool) -> LaunchReport {
    let exe = std::env::current_exe().unwrap();
    LocalLauncher::command(1, exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, "hang")
        .timeout(Duration::from_secs(3))
        .capture_output(true)
        .stacks(stacks)
        .run()
        .unwrap()
}

/// With stacks on, a rank killed at the launch timeout is reported with every thread's
/// stack, read with gdb: the hung worker's thread, and the function of ours it waits in,
/// with its file and line. Skips (saying so) where gdb is not installed.
#[test]
#[cfg(target_os = "linux")]
fn a_rank_killed_at_the_timeout_is_reported_with_its_stacks() {
    if role().is_some() {
        return hang();
    }
    let gdb = std::process::Command::new("gdb")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !gdb {
        println!("skipped: gdb is not installed (the launcher then reports no stacks)");
        return;
    }
    let test = "a_rank_killed_at_the_timeout_is_reported_with_its_stacks";
    let report = launch_hang(test, true);
    print!("{report}");
    let r = &report.ranks[0];
    assert!(r.killed_at_timeout, "{report}");
    let worker = r
        .stacks
        .iter()
        .position(|l| l.starts_with("thread \"hung-worker\""))
        .unwrap_or_else(|| panic!("no hung-worker thread in {:#?}", r.stacks));
    // Its frames, up to the next thread: one of them is hang_here, in this file.
    let frames: Vec<&String> = r.stacks[worker + 1..]
        .iter()
        .take_while(|l| l.starts_with("  #"))
        .collect();
    assert!(
        frames
            .iter()
            .any(|l| l.contains("hang_here") && l.contains("tests/bootstrap_process.rs:")),
        "{frames:#?}"
    );
    assert!(
        report
            .to_string()
            .contains("its stacks before the kill (gdb):"),
        "{report}"
    );
}
