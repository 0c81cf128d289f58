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
    let bs = launch
        .blocking_bootstrap()
        .unwrap_or_else(|e| panic!("{e}"));
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
/// with its file and line where the build has debug information. Skips (saying so) where
/// gdb is not installed.
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
    // With debug information (the dev profile's), with its file and line; without (the
    // release profile), by name.
    let at = if cfg!(debug_assertions) {
        "tests/bootstrap_process.rs:"
    } else {
        ""
    };
    assert!(
        frames
            .iter()
            .any(|l| l.contains("hang_here") && l.contains(at)),
        "{frames:#?}"
    );
    assert!(
        report
            .to_string()
            .contains("its stacks before the kill (gdb):"),
        "{report}"
    );
}

/// Variables a rank reads its job identity from (`BootstrapConfig::job_id`).
const JOB_VARS: &[&str] = &[
    "MSCCLPP_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_orte_hnp_uri",
];

/// Starts this binary as `rank` of `nranks` of the `"ip:port"` form at `addr`, in the job
/// `job` (`None`: no job id at all, as ranks started by hand).
fn start_rank(
    test: &str,
    addr: &str,
    nranks: usize,
    rank: usize,
    job: Option<&str>,
) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, "exercise")
        .env("MSCCLPP_RANK", rank.to_string())
        .env("MSCCLPP_NRANKS", nranks.to_string())
        .env("MSCCLPP_LOCAL_RANK", rank.to_string())
        .env("MSCCLPP_BOOTSTRAP", addr)
        .env("MSCCLPP_BOOTSTRAP_TIMEOUT", "5")
        .env_remove("MSCCLPP_BOOTSTRAP_SECRET")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for var in JOB_VARS {
        cmd.env_remove(var);
    }
    if let Some(job) = job {
        cmd.env("MSCCLPP_JOB_ID", job);
    }
    cmd.spawn().unwrap()
}

/// Waits at most `limit` for `child` (killing it then); returns whether it succeeded and
/// its stdout and stderr.
fn finish(mut child: std::process::Child, limit: Duration) -> (bool, String) {
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Job A (2 ranks, `job_a`) and job B (`nranks_b` ranks, `job_b`) are given one
/// `"ip:port"`: A's rank 0 hosts the root, B's rank 0 cannot, B's rank 1 reaches A's root
/// before A's rank 1. B's rank 1 must fail with `refusal` in its error, A's root must say
/// so, and A must complete with its own rank 1.
fn two_jobs_at_one_address(
    test: &str,
    job_a: Option<&str>,
    job_b: Option<&str>,
    nranks_b: usize,
    refusal: &str,
) {
    if role().is_some() {
        return exercise_rank();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let a0 = start_rank(test, &addr, 2, 0, job_a);
    // Wait (at most 10 s) for A's root to listen; a connection closed at once is nothing to
    // the root.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "A's root never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, out) = finish(
        start_rank(test, &addr, nranks_b, 0, job_b),
        Duration::from_secs(10),
    );
    assert!(
        !ok && out.contains("cannot listen on"),
        "B's rank 0:\n{out}"
    );
    let (ok, out) = finish(
        start_rank(test, &addr, nranks_b, 1, job_b),
        Duration::from_secs(10),
    );
    assert!(!ok, "B's rank 1 succeeded; it must be refused:\n{out}");
    assert!(
        out.contains(&format!(
            "the bootstrap root at {addr} refused the connection"
        )) && out.contains(refusal),
        "B's rank 1 does not name the clash ({refusal:?}):\n{out}"
    );
    let a1 = start_rank(test, &addr, 2, 1, job_a);
    let (ok1, out1) = finish(a1, Duration::from_secs(20));
    let (ok0, out0) = finish(a0, Duration::from_secs(20));
    assert!(
        ok0 && out0.contains("rank 0 of 2: ok"),
        "A's rank 0:\n{out0}"
    );
    assert!(
        ok1 && out1.contains("rank 1 of 2: ok"),
        "A's rank 1:\n{out1}"
    );
    assert!(
        out0.contains(&format!("refused a join as rank 1 of {nranks_b}")) && out0.contains(refusal),
        "A's root does not report the refusal:\n{out0}"
    );
}

#[test]
fn a_rank_of_another_job_at_one_address_is_refused() {
    two_jobs_at_one_address(
        "a_rank_of_another_job_at_one_address_is_refused",
        Some("A"),
        Some("B"),
        2,
        "another job (job MSCCLPP_JOB_ID=A, 2 ranks) is using this root address; this rank \
         belongs to job MSCCLPP_JOB_ID=B (2 ranks)",
    );
}

#[test]
fn ranks_started_by_hand_of_another_size_are_refused_as_another_job() {
    two_jobs_at_one_address(
        "ranks_started_by_hand_of_another_size_are_refused_as_another_job",
        None,
        None,
        3,
        "rank 1 was started with nranks = 3, but the job at this root has nranks = 2 (a rank \
         started with the wrong size, or a rank of another job",
    );
}

#[test]
fn each_launch_gives_its_ranks_a_fresh_job_id() {
    if role().is_some() {
        println!(
            "job={}",
            std::env::var("MSCCLPP_JOB_ID").unwrap_or_default()
        );
        return;
    }
    let test = "each_launch_gives_its_ranks_a_fresh_job_id";
    let jobs = |report: &LaunchReport| -> Vec<String> {
        (0..2)
            .map(|r| {
                let prefix = format!("[rank {r}] ");
                report
                    .output
                    .iter()
                    .filter(|l| l.starts_with(&prefix))
                    .find_map(|l| l.split_once("job=").map(|(_, j)| j.to_owned()))
                    .unwrap_or_else(|| panic!("rank {r} printed no job: {report}"))
            })
            .collect()
    };
    let first = jobs(&launch(test, 2, "job"));
    let second = jobs(&launch(test, 2, "job"));
    assert!(!first[0].is_empty() && first[0] == first[1], "{first:?}");
    assert!(
        second[0] == second[1] && second[0] != first[0],
        "{first:?} {second:?}"
    );
}
