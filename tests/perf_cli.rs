//! `mscclpp-perf` end to end on the Host transport: the tool spawns its own ranks (local
//! launcher), runs a few small sizes with checking, and writes the JSON and the plot.
//! `CUDA_VISIBLE_DEVICES=` hides any GPU, so this runs the same with or without one.

use std::path::PathBuf;
use std::process::{Command, Output};

use mscclpp::perf::json::Report;

/// The tool, started alone (no launcher variables), GPUs hidden.
fn perf(args: &[&str]) -> Output {
    // Cargo's path to the binary; in a gpu-bundle (tests/ and bin/ side by side, built
    // elsewhere) the packed copy next to this test.
    let mut exe = PathBuf::from(env!("CARGO_BIN_EXE_mscclpp-perf"));
    if !exe.exists()
        && let Some(packed) = std::env::current_exe()
            .ok()
            .and_then(|t| Some(t.parent()?.parent()?.join("bin/mscclpp-perf")))
    {
        exe = packed;
    }
    let mut cmd = Command::new(exe);
    cmd.args(args).env("CUDA_VISIBLE_DEVICES", "");
    for var in [
        "MSCCLPP_RANK",
        "MSCCLPP_NRANKS",
        "MSCCLPP_LOCAL_RANK",
        "MSCCLPP_BOOTSTRAP",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
    ] {
        cmd.env_remove(var);
    }
    cmd.output().expect("mscclpp-perf runs")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("mscclpp-perf-{}-{name}", std::process::id()))
}

/// Table rows: lines that start with a size.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn all_reduce_on_the_host_transport_with_json_and_plot() {
    let (json, svg) = (temp("ar.json"), temp("ar.svg"));
    let out = perf(&[
        "--nranks",
        "2",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "4",
        "-n",
        "3",
        "-w",
        "1",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("no GPU: running on the Host transport (CPU threads, shared memory)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("#wrong") && stdout.contains("busbw"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("[rank"),
        "rank 0 prints unprefixed:\n{stdout}"
    );
    let rows = rows(&stdout);
    let sizes: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(sizes, ["1024", "4096", "16384", "65536"], "{stdout}");
    for r in &rows {
        assert_eq!(r.len(), 13, "{r:?}");
        assert_eq!(r[1], (r[0].parse::<u64>().unwrap() / 4).to_string());
        assert_eq!((r[2].as_str(), r[3].as_str()), ("float", "sum"));
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "#wrong: {r:?}");
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");

    let report = Report::from_json(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!((report.nranks, report.backend.as_str()), (2, "host"));
    assert_eq!(report.rows.len(), 4);
    assert!(report.rows.iter().all(|r| r.nccl.is_none()));
    assert_eq!(report.rows[3].mscclpp.in_place.wrong, Some(0));
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(plot.matches("<polyline").count(), 4, "{plot}");
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(svg);
}

#[test]
fn all_gather_half_on_the_host_transport() {
    let out = perf(&[
        "--op",
        "allgather",
        "-d",
        "half",
        "--nranks",
        "2",
        "-b",
        "256",
        "-e",
        "4K",
        "-f",
        "4",
        "-n",
        "2",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let rows = rows(&stdout);
    assert_eq!(rows.len(), 3, "{stdout}");
    for r in &rows {
        assert_eq!((r[2].as_str(), r[3].as_str()), ("half", "none"));
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "#wrong: {r:?}");
    }
}

#[test]
fn all_reduce_bfloat16_three_ranks_on_the_host_transport() {
    let out = perf(&[
        "-d", "bfloat16", "--nranks", "3", "-b", "8", "-e", "4K", "-f", "8", "-n", "2",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let rows = rows(&stdout);
    assert_eq!(rows.len(), 4, "{stdout}");
    assert!(rows.iter().all(|r| r[8] == "0" && r[12] == "0"), "{stdout}");
}

#[test]
fn bad_command_lines_exit_2_with_the_reason() {
    for (args, says) in [
        (&["-b", "64M", "-e", "1M"][..], "larger than"),
        (&["-d", "int8"][..], "not supported"),
        (&["-b", "12Q"][..], "unknown size suffix"),
        (&["-n", "0"][..], "iters"),
    ] {
        let out = perf(args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn nccl_comparison_is_refused_without_a_gpu() {
    let out = perf(&["--compare", "nccl", "-b", "1K", "-e", "1K"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stderr.contains("--compare nccl needs GPUs"), "{stderr}");
}

#[test]
fn reducescatter_broadcast_reduce_alltoall_sendrecv_on_the_host_transport() {
    for (op, factor) in [
        ("reducescatter", "(n-1)/n"),
        ("broadcast", "1"),
        ("reduce", "1"),
        ("alltoall", "(n-1)/n"),
        ("sendrecv", "1"),
    ] {
        let out = perf(&[
            "--op", op, "--nranks", "3", "--root", "2", "-b", "96", "-e", "96K", "-f", "32", "-n",
            "2", "-w", "1", "-d", "half",
        ]);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "{op}: stdout:\n{stdout}\nstderr:\n{stderr}"
        );
        let rows = rows(&stdout);
        assert_eq!(rows.len(), 3, "{op}: {stdout}");
        for r in &rows {
            assert_eq!(r.len(), 13, "{op}: {r:?}");
            let redop = if matches!(op, "reducescatter" | "reduce") {
                "sum"
            } else {
                "none"
            };
            assert_eq!(
                (r[2].as_str(), r[3].as_str()),
                ("half", redop),
                "{op}: {r:?}"
            );
            assert_eq!(
                (r[8].as_str(), r[12].as_str()),
                ("0", "0"),
                "{op} #wrong: {r:?}"
            );
            // busbw = algbw x the factor.
            let (alg, bus): (f64, f64) = (r[6].parse().unwrap(), r[7].parse().unwrap());
            let want = if factor == "1" { alg } else { alg * 2.0 / 3.0 };
            assert!((bus - want).abs() <= 0.01 + want * 0.01, "{op}: {r:?}");
        }
        assert!(
            stdout.contains("# Out of bounds values : 0 OK"),
            "{op}: {stdout}"
        );
    }
}
