//! Support for tests (ours and users'): GPU skips, ranks as processes, signals to them.

use crate::cuda::{CudaError, Gpu};

/// Environment variable that turns "no GPU" from a skip into a failure (set it on GPU
/// machines so that a broken driver setup cannot pass as a skip).
pub const REQUIRE_GPU_ENV: &str = "MSCCLPP_REQUIRE_GPU";

/// Whether [`REQUIRE_GPU_ENV`] is `1`.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1")
}

/// Opens GPU `ordinal` for test `test`. Without one, prints why and returns `None` (the
/// test then returns early), or panics when `MSCCLPP_REQUIRE_GPU=1`.
pub fn gpu_or_skip(test: &str, ordinal: usize) -> Option<Gpu> {
    match Gpu::open(ordinal) {
        Ok(g) => Some(g),
        Err(e) => skip_or_fail(test, &e),
    }
}

fn skip_or_fail<T>(test: &str, e: &CudaError) -> Option<T> {
    if gpu_required() {
        panic!("{test}: a GPU is required ({REQUIRE_GPU_ENV}=1) but: {e}");
    }
    eprintln!("skipping {test}: {e} (set {REQUIRE_GPU_ENV}=1 to make this a failure)");
    None
}

/// Runs test `test` of the current test binary as `nranks` processes through the local
/// launcher (`--exact test --nocapture`), with `role_env=rank` set so the test body knows it
/// is a rank, and panics unless every rank exits 0 and prints a line ending in
/// `rank <r>: ok`. Returns the ranks' output lines (prefixed `[rank r] `).
pub fn run_test_ranks(
    test: &str,
    nranks: usize,
    role_env: &str,
    timeout: std::time::Duration,
) -> Vec<String> {
    run_test_ranks_env(test, nranks, role_env, timeout, &[])
}

/// [`run_test_ranks`] with `env` (name, value) set in every rank.
pub fn run_test_ranks_env(
    test: &str,
    nranks: usize,
    role_env: &str,
    timeout: std::time::Duration,
    env: &[(&str, &str)],
) -> Vec<String> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut launcher = crate::launch::LocalLauncher::command(nranks, exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(role_env, "rank")
        // A third of the test's time, at least 30 s: ranks meet at barriers after work
        // whose time grows with the load of the machine (four processes on two cores took
        // 78 s where they take 10 s alone); a rank that is stuck is ended by `timeout`.
        .bootstrap_timeout((timeout / 3).max(std::time::Duration::from_secs(30)))
        .timeout(timeout)
        .capture_output(true);
    for (k, v) in env {
        launcher = launcher.env(*k, *v);
    }
    let report = launcher
        .run()
        .unwrap_or_else(|e| panic!("{test}: cannot launch {nranks} ranks: {e}"));
    let output = report.output.join("\n");
    assert!(report.success(), "{test}: {report}{output}");
    for r in 0..nranks {
        let (prefix, done) = (format!("[rank {r}] "), format!("rank {r}: ok"));
        let finished = report
            .output
            .iter()
            .any(|l| l.starts_with(&prefix) && l.ends_with(&done));
        assert!(finished, "{test}: rank {r} did not finish:\n{output}");
    }
    report.output
}

/// Sends `sig` (`"-STOP"`, `"-CONT"`, ...) to process `pid` with kill(1); panics when that
/// fails (for tests that stop and resume ranks).
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// Whether `/proc` shows process `pid` stopped by a signal (state `T`); `false` where that
/// cannot be told.
pub fn process_stopped(pid: u32) -> bool {
    crate::procfs::process_stopped(pid)
}
