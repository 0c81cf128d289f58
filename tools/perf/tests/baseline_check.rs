//! `scripts/check-baseline.py` and `scripts/plot-baseline.py` against small fixtures
//! (`tests/baseline/`), the stored baselines (`benches/records/*.jsonl`) and a real
//! `mscclpp-perf --json` report from the Host transport. The scripts need `python3` and
//! nothing beyond its standard library.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::alone;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/baseline")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// `python3 scripts/<script> <args>`, from the repository's root.
fn script(script: &str, args: &[&str]) -> Output {
    Command::new("python3")
        .arg(repo().join("scripts").join(script))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("python3 must run to test scripts/{script}: {e}"))
}

fn check(args: &[&str]) -> (i32, String, String) {
    let out = script("check-baseline.py", args);
    (
        out.status
            .code()
            .expect("check-baseline.py exited by itself"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("mscclpp-baseline-{}-{name}", std::process::id()))
}

/// The `key: value` pairs of one JSON line, as text (no JSON parser needed for these
/// flat rows: values hold no commas or braces in the fixtures).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("\"{key}\": "))? + key.len() + 4;
    let rest = &line[start..];
    let end = rest.find([',', '}'])?;
    Some(rest[..end].trim_matches('"'))
}

#[test]
fn a_clean_run_passes_and_rows_without_a_baseline_are_named() {
    let (code, out, err) = check(&[
        "--baseline",
        &fixture("baseline.jsonl"),
        &fixture("clean.json"),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("REGRESSION"), "{out}");
    assert!(
        out.contains("no baseline allreduce float 16384 B, 2 ranks, 1 host, graph"),
        "{out}"
    );
    assert!(
        out.contains("3 row(s): 2 within the band, 0 faster, 0 regressed, 1 without a baseline"),
        "{out}"
    );
}

#[test]
fn a_slowed_run_fails_and_names_the_slowed_row_only() {
    let (code, out, err) = check(&[
        "--baseline",
        &fixture("baseline.jsonl"),
        &fixture("slowed.json"),
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let named: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("REGRESSION"))
        .collect();
    assert_eq!(named.len(), 1, "{out}");
    // Matched with the graph row of one host (3.0 us), not the plain (5.0 us) or the
    // simulated-hosts one (90 us).
    assert!(
        named[0].contains(
            "allreduce float 4096 B, 2 ranks, 1 host, graph: 4.500 us against 3.000 us (1.500x"
        ),
        "{out}"
    );
    assert!(
        named[0].contains("NCCL in the same runs 6.350 against 6.300 us"),
        "{out}"
    );
}

#[test]
fn the_band_decides_what_is_a_regression() {
    let base = fixture("baseline.jsonl");
    let slowed = fixture("slowed.json");
    let (code, out, _) = check(&["--baseline", &base, "--band", "0.6", &slowed]);
    assert_eq!(code, 0, "a 1.5x row is within a 60% band: {out}");
    assert!(out.contains("band 60%"), "{out}");
    // The clean run's 4096 B row is 1.033x its baseline: out of a 2% band.
    let (code, out, _) = check(&[
        "--baseline",
        &base,
        "--band",
        "0.02",
        &fixture("clean.json"),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("REGRESSION  allreduce float 4096 B"), "{out}");
    let (code, _, err) = check(&["--baseline", &base, "--band", "-1", &slowed]);
    assert_eq!(code, 2);
    assert!(err.contains("--band -1.0"), "{err}");
}

#[test]
fn recording_appends_rows_with_commit_and_command_and_the_latest_row_counts() {
    let base = temp("record.jsonl");
    std::fs::copy(fixture("baseline.jsonl"), &base).unwrap();
    let base_s = base.to_str().unwrap();
    let before = std::fs::read_to_string(&base).unwrap().lines().count();
    let (code, out, err) = check(&[
        "--record",
        "--baseline",
        base_s,
        "--commit",
        "abc1234",
        &fixture("slowed.json"),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let text = std::fs::read_to_string(&base).unwrap();
    let added: Vec<&str> = text.lines().skip(before).collect();
    assert_eq!(added.len(), 3, "{text}");
    for line in &added {
        assert_eq!(field(line, "commit"), Some("abc1234"), "{line}");
        assert_eq!(
            field(line, "command"),
            Some("mscclpp-perf -b 1K -e 16K -f 4 -G 10 --compare nccl"),
            "the output file is left out: {line}"
        );
        assert_eq!(field(line, "graph"), Some("true"), "{line}");
        assert_eq!(field(line, "nccl_version"), Some("2.28.3"), "{line}");
    }
    assert_eq!(field(added[1], "size"), Some("4096"));
    assert_eq!(field(added[1], "time_us"), Some("4.5"));
    // The slowed run is now the latest baseline: the same run passes, the clean one is
    // faster at 4096 B.
    let (code, out, _) = check(&["--baseline", base_s, &fixture("slowed.json")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("3 within the band"), "{out}");
    let (code, out, _) = check(&["--baseline", base_s, &fixture("clean.json")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("faster      allreduce float 4096 B"), "{out}");
    let _ = std::fs::remove_file(&base);
}

#[test]
fn bad_input_exits_2_with_the_reason() {
    let base = fixture("baseline.jsonl");
    let (code, _, err) = check(&["--baseline", &base, &fixture("wrong.json")]);
    assert_eq!(code, 2);
    assert!(
        err.contains("4096 B in-place: 3 wrong elements"),
        "a run with wrong results is refused: {err}"
    );
    let broken = temp("broken.jsonl");
    std::fs::write(
        &broken,
        "{\"op\": \"allreduce\", \"dtype\": \"float\", \"size\": 8}\n",
    )
    .unwrap();
    let (code, _, err) = check(&["--baseline", &base, broken.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("broken.jsonl:1: missing ranks, hosts"),
        "{err}"
    );
    let (code, _, err) = check(&["--kind", "no-such-kind", &fixture("clean.json")]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no-such-kind.jsonl: no such baseline"),
        "{err}"
    );
    let (code, _, err) = check(&[&fixture("clean.json")]);
    assert_eq!(code, 2, "a kind or a baseline file is required: {err}");
    let _ = std::fs::remove_file(&broken);
}

#[test]
fn every_stored_baseline_reads_and_its_latest_rows_pass_against_it() {
    let dir = repo().join("benches/records");
    let mut kinds = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        let kind = path.file_stem().unwrap().to_str().unwrap().to_string();
        // A baseline is a history: a later row of the same key replaces an earlier one (the
        // checker takes the latest). So the run checked here is the latest row of each key.
        let text = std::fs::read_to_string(&path).unwrap();
        let mut latest: Vec<(String, serde_json::Value)> = Vec::new();
        for line in text.lines() {
            let row: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{kind}: a row that is no JSON ({e}): {line}"));
            let key = [
                "op",
                "dtype",
                "size",
                "ranks",
                "hosts",
                "hosts_simulated",
                "graph",
            ]
            .map(|k| row[k].to_string())
            .join(" ");
            latest.retain(|(k, _)| *k != key);
            latest.push((key, row));
        }
        let rows = latest.len();
        let run = temp(&format!("{kind}-latest.jsonl"));
        let body: Vec<String> = latest.iter().map(|(_, r)| r.to_string()).collect();
        std::fs::write(&run, body.join("\n") + "\n").unwrap();
        let (code, out, err) = check(&["--kind", &kind, run.to_str().unwrap()]);
        let _ = std::fs::remove_file(&run);
        assert_eq!(code, 0, "{kind}: {out}{err}");
        assert!(
            out.contains(&format!("{rows} row(s): {rows} within the band")),
            "{kind}: every latest row matches itself: {out}"
        );
        kinds += 1;
    }
    assert!(
        kinds >= 2,
        "benches/records holds the machine kinds' baselines"
    );
}

#[test]
fn the_committed_plots_are_those_of_the_stored_baseline() {
    let out_dir = temp("plots");
    let out = script(
        "plot-baseline.py",
        &["nvidia-h200-x2", "--out", out_dir.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut made: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    made.sort();
    for op in ["allreduce", "allgather", "reducescatter"] {
        assert!(
            made.contains(&format!("nvidia-h200-x2-{op}.svg")),
            "{made:?}"
        );
    }
    for name in &made {
        let plot = std::fs::read_to_string(out_dir.join(name)).unwrap();
        assert!(plot.starts_with("<svg ") && plot.trim_end().ends_with("</svg>"));
        // Time and bandwidth panels, ours and NCCL's line in each.
        assert_eq!(plot.matches("<path ").count(), 4, "{name}");
        let committed = std::fs::read_to_string(repo().join("docs/guide/img").join(name))
            .unwrap_or_else(|e| panic!("docs/guide/img/{name}: {e}"));
        assert!(
            plot == committed,
            "docs/guide/img/{name} is not the plot of benches/records/nvidia-h200-x2.jsonl: \
             run python3 scripts/plot-baseline.py nvidia-h200-x2"
        );
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn a_report_of_the_perf_tool_is_recorded_and_checked() {
    let report = temp("host.json");
    let base = temp("host.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mscclpp-perf"));
    cmd.args([
        "--nranks", "2", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "1",
    ])
    .arg("--json")
    .arg(&report);
    alone(&mut cmd, &[]);
    let out = cmd.output().expect("mscclpp-perf runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (report_s, base_s) = (report.to_str().unwrap(), base.to_str().unwrap());
    let (code, out, err) = check(&[
        "--record",
        "--baseline",
        base_s,
        "--commit",
        "0000000",
        report_s,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("new baseline file"), "{out}");
    let text = std::fs::read_to_string(&base).unwrap();
    let sizes: Vec<&str> = text.lines().filter_map(|l| field(l, "size")).collect();
    assert_eq!(sizes, ["1024", "4096"], "{text}");
    for line in text.lines() {
        assert_eq!(field(line, "op"), Some("allreduce"), "{line}");
        assert_eq!(field(line, "ranks"), Some("2"), "{line}");
        assert_eq!(field(line, "graph"), Some("false"), "{line}");
        assert_eq!(field(line, "nccl_time_us"), Some("null"), "{line}");
        assert_eq!(
            field(line, "command"),
            Some("mscclpp-perf --nranks 2 -b 1K -e 4K -f 4 -n 2 -w 1"),
            "{line}"
        );
    }
    let (code, out, err) = check(&["--baseline", base_s, report_s]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("2 row(s): 2 within the band"), "{out}");
    let _ = std::fs::remove_file(&report);
    let _ = std::fs::remove_file(&base);
}
