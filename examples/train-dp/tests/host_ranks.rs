//! The training example on the Host transport (no GPU needed): 1, 2 and 3 rank processes
//! started by the binary itself, checked through its JSON report and parameter dumps.
//!
//! Tolerances of the run-to-run comparisons (2 or 3 ranks against 1 over the same global
//! batch): the first step's averaged gradient is checked by the program against the
//! derived bound `2 gamma_k * A`, and the parameters after that step against the same step
//! on the reference gradient within `cpu::first_step_bounds` (see `src/cpu.rs`); past that,
//! Adam divides by the gradient's magnitude, so there is no a-priori bound on the parameters
//! and the tests use margins far above the differences measured (losses 2e-9..1e-8 relative, parameters
//! 3e-8..1.2e-7 absolute over 30 steps at lr 1e-3) and far below what averaging over other
//! gradients produces (each rank's own gradient moves parameters by up to lr = 1e-3 per
//! step): losses within 1e-5 relative, parameters within 1% of `lr * steps` = 3e-4. A
//! wrong *scale* of the right average (a sum without the 1/N) is not among what these
//! comparisons see: Adam divides by the gradient's magnitude, so a gradient twice too large
//! moves the parameters almost as the right one does (measured: 7.7e-6 apart without
//! clipping). The gradient check of the first step catches it (`wrong_averaging_is_caught`);
//! the program says when that check is skipped (a model too large for the CPU reference).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_train-dp");

/// A run's report and parameter dump, in a directory of its own that is removed when this
/// drops, so that test runs leave nothing in the temporary directory.
struct Files {
    dir: PathBuf,
    json: PathBuf,
    params: PathBuf,
}

impl Files {
    fn new(tag: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("train-dp-test-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Files {
            json: dir.join("report.json"),
            params: dir.join("params.bin"),
            dir,
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the binary on the Host transport with `nranks` local ranks.
fn run(nranks: usize, extra: &[&str], env: &[(&str, &str)], tag: &str) -> (Output, Files) {
    let files = Files::new(tag);
    let mut cmd = Command::new(BIN);
    cmd.args(["--host", "--nranks", &nranks.to_string(), "--steps", "30"])
        // A global batch of 48 unless the test sets its own (clap refuses a flag given twice).
        .args(if extra.contains(&"--batch") {
            &[][..]
        } else {
            &["--batch", "48"][..]
        })
        .args(["--log-every", "5"])
        .arg("--json")
        .arg(&files.json)
        .arg("--dump-params")
        .arg(&files.params)
        .args(extra)
        // Small buckets (4 KiB: three or four per step) unless the test sets its own.
        .args(if extra.contains(&"--bucket-mb") {
            &[][..]
        } else {
            &["--bucket-mb", "0.004"][..]
        })
        .env("MSCCLPP_BOOTSTRAP_TIMEOUT", "60");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run train-dp");
    (out, files)
}

fn ok_run(nranks: usize, extra: &[&str], tag: &str) -> (Value, Vec<f32>) {
    let (out, files) = run(nranks, extra, &[], tag);
    assert!(
        out.status.success(),
        "train-dp {nranks} ranks {extra:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    (report, read_params(&files.params))
}

fn read_params(p: &Path) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn run0(report: &Value) -> &Value {
    &report["runs"][0]
}

fn losses(report: &Value) -> Vec<f64> {
    run0(report)["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["loss"].as_f64().unwrap())
        .collect()
}

/// Loss decreases, parameters bit-identical, the gradient check ran and passed; the report
/// names no folder (the command line and the parameter dump by their file names).
fn check_healthy(report: &Value, nranks: usize) {
    assert_eq!(report["nranks"].as_u64(), Some(nranks as u64));
    assert_eq!(
        report["config"]["dump_params"], "params.bin",
        "{}",
        report["config"]
    );
    let command = report["command"].to_string();
    assert!(
        !command.contains('/') && command.contains("params.bin"),
        "{command}"
    );
    let r = run0(report);
    assert_eq!(r["backend"], "host");
    assert_eq!(r["identical"], true, "parameters differ across ranks");
    let s = &r["summary"];
    let (first, last) = (
        s["first_loss"].as_f64().unwrap(),
        s["last_loss"].as_f64().unwrap(),
    );
    assert!(
        last < 0.8 * first,
        "loss did not decrease enough: {first} -> {last}"
    );
    let l = losses(report);
    assert!(
        l.windows(2).filter(|w| w[1] < w[0]).count() >= l.len() / 2,
        "losses {l:?}"
    );
    let gc = &r["grad_check"];
    assert_eq!(gc["violations"].as_u64(), Some(0), "{gc}");
    assert!(gc["elements"].as_u64().unwrap() > 3000);
    // The first step's parameters against the same step on the reference gradient, within
    // the derived bound (`cpu::first_step_bounds`).
    let pc = &gc["params"];
    assert_eq!(pc["violations"].as_u64(), Some(0), "{pc}");
    assert_eq!(pc["elements"], gc["elements"], "{pc}");
    assert!(pc["max_ratio"].as_f64().unwrap() < 1.0, "{pc}");
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn close_losses(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * y.abs(), "losses {a:?} vs {b:?}");
    }
}

const PARAM_TOL: f32 = 0.01 * 1e-3 * 30.0;

#[test]
fn one_two_three_ranks_train_and_agree() {
    let (r1, p1) = ok_run(1, &[], "r1");
    check_healthy(&r1, 1);
    for n in [2, 3] {
        let (rn, pn) = ok_run(n, &[], &format!("r{n}"));
        check_healthy(&rn, n);
        // Several buckets, so the ordering logic ran.
        assert!(run0(&rn)["summary"]["timed_steps"].as_u64().unwrap() > 20);
        close_losses(&losses(&rn), &losses(&r1));
        let d = max_diff(&pn, &p1);
        assert!(d <= PARAM_TOL, "{n} ranks vs 1: parameters differ by {d}");
    }
}

#[test]
fn four_ranks_on_two_simulated_hosts_train_and_agree_with_one() {
    let (r1, p1) = ok_run(1, &[], "sim1");
    let (r4, p4) = ok_run(4, &["--simulate-hosts", "2"], "sim4");
    check_healthy(&r4, 4);
    close_losses(&losses(&r4), &losses(&r1));
    let d = max_diff(&p4, &p1);
    assert!(
        d <= PARAM_TOL,
        "4 ranks on 2 hosts vs 1: parameters differ by {d}"
    );
    // A host count that does not divide the ranks is refused.
    let (out, _) = run(4, &["--simulate-hosts", "3"], &[], "sim-bad");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--simulate-hosts 3 does not divide the 4 ranks"),
        "{err}"
    );
}

#[test]
fn overlap_does_not_change_results_and_bf16_trains() {
    let (a, pa) = ok_run(2, &[], "ov");
    let (b, pb) = ok_run(2, &["--no-overlap"], "noov");
    // Same all-reduces in the same order: bit-identical.
    assert_eq!(run0(&a)["checksum"], run0(&b)["checksum"]);
    assert_eq!(pa, pb);
    // One bucket for everything: same sums, same results.
    let (c, _) = ok_run(2, &["--bucket-mb", "100"], "onebucket");
    assert_eq!(run0(&a)["checksum"], run0(&c)["checksum"]);
    let (h, ph) = ok_run(3, &["--grad-dtype", "bf16"], "bf16");
    check_healthy(&h, 3);
    // bf16 gradients: near the f32 run, but not equal.
    let d = max_diff(&ph, &pa);
    assert!(d > 0.0 && d < 0.05, "bf16 vs f32 parameters differ by {d}");
}

#[test]
fn wrong_averaging_is_caught() {
    // Summing without dividing by the rank count: the gradient check fails the run.
    let (out, _) = run(2, &[], &[("TRAIN_DP_FAULT", "sum-not-mean")], "fault-scale");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gradient check failed"), "{err}");
    // No all-reduce at all: the check fails, and without the check the checksums differ.
    let (out, _) = run(2, &[], &[("TRAIN_DP_FAULT", "no-allreduce")], "fault-none");
    assert!(!out.status.success());
    let (out, _) = run(
        2,
        &["--no-check"],
        &[("TRAIN_DP_FAULT", "no-allreduce")],
        "fault-none-nocheck",
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("parameters differ across ranks"), "{err}");
}

#[test]
fn a_learning_rate_off_by_a_thousandth_is_caught() {
    // The gradients are right; only the optimizer's step is off: the first step's parameter
    // check fails the run (the GPU path applies the same fault and the same check).
    let (out, _) = run(2, &[], &[("TRAIN_DP_FAULT", "lr-off")], "fault-lr");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("parameter check failed"), "{err}");
}

#[test]
fn bad_batch_is_refused() {
    let (out, _) = run(2, &["--batch", "47"], &[], "badbatch");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--batch 47 is the global batch"), "{err}");
}

/// Values that cannot train are refused by the program before any rank starts, naming the
/// flag (helper audit: `--nranks 0` and `--steps 0` exited 0, `--lr nan` trained to NaN and
/// reported success, a negative `--lr` failed a correct run's check, a width past memory
/// aborted in the allocator, and `--warmup` past the steps timed every step).
#[test]
fn values_that_cannot_train_are_refused_before_the_ranks_start() {
    let cases: [(&[&str], &str); 9] = [
        (&["--nranks", "0"], "--nranks must be at least 1"),
        (&["--steps", "0"], "--steps must be at least 1"),
        (
            &["--lr", "nan"],
            "--lr NaN must be a positive finite number",
        ),
        (
            &["--lr", "-0.01"],
            "--lr -0.01 must be a positive finite number",
        ),
        (
            &["--weight-decay", "inf"],
            "--weight-decay inf must be a finite number",
        ),
        (&["--clip", "-5"], "--clip -5 must be a finite number"),
        (
            &["--warmup", "40", "--steps", "40"],
            "--warmup 40 leaves no step of the 40",
        ),
        (&["--width", "4294967296"], "more than 2^32 parameters"),
        // About 900 GiB of activations per rank: past any machine's memory.
        (
            &["--width", "60000", "--layers", "1", "--batch", "2000000"],
            "GiB available",
        ),
    ];
    for (args, text) in cases {
        let out = Command::new(BIN)
            .args(["--host"])
            .args(args)
            .output()
            .expect("run train-dp");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} passed");
        assert!(err.contains(text), "{args:?}: {err}");
        // Refused once, by the program: no rank started.
        let all = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
        assert!(!all.contains("[rank "), "{args:?}: a rank ran:\n{all}");
    }
}

#[test]
fn bad_allreduce_blocks_is_refused() {
    for b in ["0", "129"] {
        let (out, _) = run(2, &["--allreduce-blocks", b], &[], &format!("blocks{b}"));
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("--allreduce-blocks {b} is not in 1..=")),
            "{err}"
        );
    }
}

fn f64_at(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} missing or not a number: {v}"))
}

/// `a == b` up to floating-point rounding of one division and one product.
fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-12 * b.abs(),
        "{what}: {a} vs {b} (relative {})",
        (a - b).abs() / b.abs()
    );
}

#[test]
fn baseline_reports_scaling_from_the_same_run() {
    let (out, files) = run(
        2,
        &["--baseline", "--allreduce-blocks", "4"],
        &[],
        "baseline",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rb: Value = serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    check_healthy(&rb, 2);
    // The knob reached the collectives' configuration.
    assert_eq!(rb["config"]["allreduce_blocks"].as_u64(), Some(4));
    assert_eq!(rb["coll_max_blocks"].as_u64(), Some(4));

    // The baseline: rank 0 alone at the per-rank batch (24 of 48) for the same steps.
    let base = &rb["baseline"];
    assert_eq!(base["library"], "baseline");
    assert_eq!(base["backend"], "host");
    let bs = &base["summary"];
    let single = f64_at(&bs["samples_per_s"], "baseline samples/s");
    assert!(single.is_finite() && single > 0.0);
    close(
        single,
        24.0 / (f64_at(&bs["step_ms"], "baseline step_ms") / 1e3),
        "baseline samples/s from its step time at 24 samples per step",
    );
    let multi = &run0(&rb)["summary"];
    assert_eq!(bs["timed_steps"], multi["timed_steps"]);
    assert_eq!(
        base["log"].as_array().unwrap().len(),
        run0(&rb)["log"].as_array().unwrap().len()
    );
    // It is exactly a 1-rank run of the per-rank batch: the same final parameters.
    let (r1, _) = ok_run(1, &["--batch", "24"], "baseline-ref1");
    assert_eq!(base["checksum"], run0(&r1)["checksum"]);

    // Scaling = multi / (n * single), in the summary and on every line.
    close(
        f64_at(
            &multi["baseline_samples_per_s"],
            "summary.baseline_samples_per_s",
        ),
        single,
        "baseline samples/s as every rank received it",
    );
    let sps = f64_at(&multi["samples_per_s"], "summary.samples_per_s");
    close(
        f64_at(&multi["scaling_efficiency"], "summary.scaling_efficiency"),
        sps / (2.0 * single),
        "summary scaling efficiency",
    );
    for row in run0(&rb)["log"].as_array().unwrap() {
        close(
            f64_at(&row["scaling"], "log scaling"),
            f64_at(&row["samples_per_s"], "log samples/s") / (2.0 * single),
            "line scaling",
        );
    }
    assert!(stdout.contains("[baseline] summary:"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("[mscclpp] summary:") && l.contains("scaling efficiency")),
        "{stdout}"
    );

    // The baseline changes nothing in the real run, and without the flag there are no
    // baseline fields anywhere.
    let (out0, files0) = run(2, &[], &[], "nobaseline");
    assert!(out0.status.success());
    let r0: Value = serde_json::from_str(&std::fs::read_to_string(&files0.json).unwrap()).unwrap();
    assert_eq!(run0(&r0)["checksum"], run0(&rb)["checksum"]);
    assert_eq!(read_params(&files0.params), read_params(&files.params));
    assert!(r0.get("baseline").is_none());
    assert!(r0["config"].get("allreduce_blocks").is_none());
    let s0 = &run0(&r0)["summary"];
    assert!(s0.get("scaling_efficiency").is_none() && s0.get("baseline_samples_per_s").is_none());
    assert!(
        run0(&r0)["log"]
            .as_array()
            .unwrap()
            .iter()
            .all(|row| row.get("scaling").is_none())
    );
    assert!(!String::from_utf8_lossy(&out0.stdout).contains("scaling"));
}

#[test]
fn baseline_wait_is_bounded_and_kept_alive() {
    let timeout = [("MSCCLPP_BOOTSTRAP_TIMEOUT", "2")];
    // A baseline longer than the bootstrap timeout (30 steps x 200 ms): heartbeats keep
    // the waiting ranks going.
    let t0 = std::time::Instant::now();
    let (out, _) = run(
        3,
        &["--baseline"],
        &[timeout[0], ("TRAIN_DP_FAULT", "baseline-slow")],
        "baseline-slow",
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        t0.elapsed().as_secs_f64() > 4.0,
        "the baseline was not slow"
    );
    // Rank 0 silent for twice the timeout: the others give up, naming the wait.
    let (out, _) = run(
        3,
        &["--baseline"],
        &[timeout[0], ("TRAIN_DP_FAULT", "baseline-stall")],
        "baseline-stall",
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("waiting for rank 0's --baseline run") && err.contains("timed out"),
        "{err}"
    );
    // Rank 0's baseline fails: the others are told.
    let (out, _) = run(
        3,
        &["--baseline"],
        &[timeout[0], ("TRAIN_DP_FAULT", "baseline-fail")],
        "baseline-fail",
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 0's --baseline run failed"), "{err}");
}
