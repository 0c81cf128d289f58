//! `mscclpp-perf` end to end on the Host transport: the tool spawns its own ranks (local
//! launcher), runs a few small sizes with checking, and writes the JSON and the plot.
//! `CUDA_VISIBLE_DEVICES=` hides any GPU, so this runs the same with or without one.

use std::path::PathBuf;
use std::process::{Command, Output};

use mscclpp_perf::json::Report;

mod common;
use common::alone;

/// The tool, started alone (no launcher variables), GPUs hidden.
fn perf(args: &[&str]) -> Output {
    perf_with(args, &[])
}

/// [`perf`] with more environment variables (the ranks inherit them).
fn perf_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(perf_exe());
    cmd.args(args);
    alone(&mut cmd, env);
    cmd.output().expect("mscclpp-perf runs")
}

/// Cargo's path to the binary; in a gpu-bundle (tests/ and bin/ side by side, built
/// elsewhere) the packed copy next to this test.
fn perf_exe() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_mscclpp-perf"));
    if !exe.exists()
        && let Some(packed) = std::env::current_exe()
            .ok()
            .and_then(|t| Some(t.parent()?.parent()?.join("bin/mscclpp-perf")))
    {
        return packed;
    }
    exe
}

/// The tool run through `sh` with its address space (and its ranks') limited to
/// `max_bytes`: a safety net for the host-memory tests, whose sizes must never be
/// allocated in full; a tool that tried would fail at once instead of filling the machine.
fn perf_limited(max_bytes: u64, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -v {} && exec \"$0\" \"$@\"",
            max_bytes >> 10
        ))
        .arg(perf_exe())
        .args(args);
    alone(&mut cmd, env);
    cmd
}

/// A port nobody listens on (bound, then released) for a root of ranks started by hand.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// The tool's own launcher variables for rank `rank` of `nranks` started by hand, the root
/// on `port` of 127.0.0.1.
fn by_hand(rank: usize, nranks: usize, port: u16) -> [(&'static str, String); 3] {
    [
        ("MSCCLPP_RANK", rank.to_string()),
        ("MSCCLPP_NRANKS", nranks.to_string()),
        ("MSCCLPP_BOOTSTRAP", format!("127.0.0.1:{port}")),
    ]
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
    // The binary by name, the output files without their folder.
    let name = |p: &PathBuf| p.file_name().unwrap().to_str().unwrap().to_string();
    assert_eq!(
        report.command_line[0], "mscclpp-perf",
        "{:?}",
        report.command_line
    );
    assert!(
        report
            .command_line
            .windows(2)
            .any(|w| w[0] == "--json" && w[1] == name(&json))
            && report
                .command_line
                .windows(2)
                .any(|w| w[0] == "--plot" && w[1] == name(&svg)),
        "{:?}",
        report.command_line
    );
    assert!(
        report.command_line.iter().all(|a| !a.contains('/')),
        "{:?}",
        report.command_line
    );
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
        (&["-d", "int64x"][..], "unknown datatype"),
        (&["-o", "xor"][..], "unknown reduction"),
        (&["-o", "all"][..], "one reduction per invocation"),
        (&["-b", "12Q"][..], "unknown size suffix"),
        (&["-n", "0"][..], "iters"),
    ] {
        let out = perf(args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// A size too large for the machine's memory (the largest the parser takes: a send buffer
/// of 2^62 f32) is refused with the reason (by the host-memory check, before any rank
/// starts), not a panic or an allocation abort.
#[test]
fn a_size_beyond_memory_is_refused_with_the_reason() {
    let max = u64::MAX.to_string();
    let out = perf(&[
        "--nranks", "2", "-b", &max, "-e", &max, "-n", "1", "-w", "1",
    ]);
    let (stdout, stderr) = text(&out);
    let all = format!("{stdout}{stderr}");
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("do not fit in this machine's memory"), "{all}");
    assert!(
        !all.contains("panicked") && !all.contains("memory allocation of"),
        "{all}"
    );
}

/// Four local ranks of all-reduce whose buffers (send, receive and the check's copies: five
/// times the size per rank) fit one rank but not the four together: refused before any rank
/// starts, naming the size, the need per rank, the ranks and `MemAvailable`. (Each rank
/// allocating its share would take minutes, or the whole machine: overcommit lets every
/// buffer through on its own.)
#[test]
fn host_memory_of_the_local_ranks_together_is_checked_before_launching() {
    let Some(avail) = mscclpp::host::launch::mem_available() else {
        println!("skipped: no MemAvailable here (not Linux): the tool checks nothing");
        return;
    };
    // Per rank 5/12 of MemAvailable (and the collectives' scratch): 4 ranks need 5/3 of it.
    let size = avail / 12 / 4 * 4;
    let s = size.to_string();
    let started = std::time::Instant::now();
    let out = perf_limited(
        size + (2 << 30),
        &[
            "--nranks",
            "4",
            "--simulate-hosts",
            "2",
            "-b",
            &s,
            "-e",
            &s,
            "-n",
            "1",
        ],
        &[],
    )
    .output()
    .expect("mscclpp-perf runs");
    let (stdout, stderr) = text(&out);
    let all = format!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(
        !all.contains("[rank") && !stdout.contains("# mscclpp-perf"),
        "no rank starts:\n{all}"
    );
    for says in [s.as_str(), "per rank", "4 ranks", "MemAvailable"] {
        assert!(stderr.contains(says), "{says:?}: {stderr}");
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// Ranks started by another launcher (the tool's own variables, one machine) count the
/// ranks of their machine together: every rank ends with status 1 and the reason, before
/// allocating.
#[test]
fn ranks_under_a_launcher_check_the_host_memory_of_their_machine_together() {
    let Some(avail) = mscclpp::host::launch::mem_available() else {
        println!("skipped: no MemAvailable here (not Linux): the tool checks nothing");
        return;
    };
    // Per rank 5/7 of MemAvailable: fits one rank, not two.
    let size = (avail / 7 / 4 * 4).to_string();
    let port = free_port();
    let started = std::time::Instant::now();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let vars = by_hand(rank, 2, port);
            perf_limited(
                avail / 7 + (2 << 30),
                &["-b", &size, "-e", &size, "-n", "1"],
                &vars.each_ref().map(|(k, v)| (*k, v.as_str())),
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("mscclpp-perf starts")
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "rank {rank}: {stdout}{stderr}");
        assert!(
            !stdout.contains("# mscclpp-perf"),
            "rank {rank}: {stdout}{stderr}"
        );
        for says in [size.as_str(), "per rank", "2 ranks", "MemAvailable"] {
            assert!(stderr.contains(says), "rank {rank}: {says:?}: {stderr}");
        }
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

/// `--root` of broadcast and reduce beyond the ranks the tool launches: a command-line
/// error before any rank starts.
#[test]
fn a_root_beyond_the_ranks_is_refused_before_launching() {
    for op in ["broadcast", "reduce"] {
        let out = perf(&[
            "--op", op, "--root", "4", "--nranks", "4", "-b", "1K", "-e", "1K", "-n", "1",
        ]);
        let (stdout, stderr) = text(&out);
        let all = format!("{stdout}{stderr}");
        assert_eq!(out.status.code(), Some(2), "{op}: {all}");
        assert!(!all.contains("[rank"), "{op}: no rank starts:\n{all}");
        assert!(
            stderr.contains("--root 4") && stderr.contains("4 ranks"),
            "{op}: {stderr}"
        );
    }
}

/// A sweep with no size that holds a rank's part, and send/recv on one rank: command-line
/// errors before any rank starts (they failed in every rank after all had started, exit 1).
#[test]
fn sweeps_no_rank_can_run_are_refused_before_launching() {
    let cases: [(&[&str], &str); 3] = [
        (&["-b", "1", "-e", "3", "-n", "1"], "less than one element"),
        (
            &[
                "--op", "alltoall", "--nranks", "3", "-b", "8", "-e", "32", "-f", "2",
            ],
            "less than 16 bytes per rank",
        ),
        (
            &["--op", "sendrecv", "--nranks", "1", "-b", "8", "-e", "8"],
            "needs at least 2 ranks",
        ),
    ];
    for (args, why) in cases {
        let out = perf(args);
        let (stdout, stderr) = text(&out);
        let all = format!("{stdout}{stderr}");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {all}");
        assert!(!all.contains("[rank"), "{args:?}: no rank starts:\n{all}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
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

/// Packets up to 4 KiB per peer, puts through the scratch above: small sizes reach both
/// paths of every collective (and two-shot all-reduce), quickly in a debug build.
const SMALL_PACKETS: [(&str, &str); 1] = [("MSCCLPP_COLL_PACKET_MAX_BYTES", "4096")];

/// Runs the tool once per argument list, a few at a time (each spawns its own ranks), with
/// [`SMALL_PACKETS`], and checks every run: exit 0, rows of `dtype` and `redop`, and 0 wrong
/// in both placements.
/// Returns the algorithms the rows name.
fn all_pass(runs: &[(Vec<String>, &str, &str)]) -> std::collections::BTreeSet<String> {
    let algos = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let algos_ref = &algos;
    std::thread::scope(|s| {
        for chunk in runs.chunks(runs.len().div_ceil(4)) {
            s.spawn(move || {
                for (args, dtype, redop) in chunk {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let out = perf_with(&args, &SMALL_PACKETS);
                    let (stdout, stderr) = text(&out);
                    assert!(
                        out.status.success(),
                        "{args:?}: stdout:\n{stdout}\nstderr:\n{stderr}"
                    );
                    let rows = rows(&stdout);
                    assert!(!rows.is_empty(), "{args:?}: {stdout}");
                    for r in &rows {
                        algos_ref.lock().unwrap().insert(r[4].clone());
                        assert_eq!((r[2].as_str(), r[3].as_str()), (*dtype, *redop), "{args:?}");
                        assert_eq!(
                            (r[8].as_str(), r[12].as_str()),
                            ("0", "0"),
                            "{args:?} #wrong: {r:?}"
                        );
                    }
                    assert!(
                        stdout.contains("# Out of bounds values : 0 OK"),
                        "{args:?}: {stdout}"
                    );
                }
            });
        }
    });
    algos.into_inner().unwrap()
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

const REDUCING: [&str; 10] = [
    "float", "half", "bfloat16", "double", "int8", "uint8", "int32", "uint32", "int64", "uint64",
];
const OPS: [&str; 6] = ["sum", "prod", "min", "max", "avg", "mulsum"];
const FP8: [&str; 2] = ["f8e4m3", "f8e5m2"];

#[test]
fn all_reduce_every_type_and_operation_checks_exactly() {
    // 64 B, 2 KiB, 64 KiB: one-shot packets and, above 4 KiB, two-shot through the scratch.
    let mut runs = Vec::new();
    for d in REDUCING {
        for o in OPS {
            let args = strings(&[
                "-d", d, "-o", o, "--nranks", "2", "-b", "64", "-e", "64K", "-f", "32", "-n", "1",
                "-w", "0",
            ]);
            runs.push((args, d, o));
        }
    }
    let algos = all_pass(&runs);
    // Packets below 4 KiB, a scratch algorithm (all-pairs, two-shot) above.
    assert!(algos.contains("oneshot") && algos.len() >= 2, "{algos:?}");
}

#[test]
fn reduce_scatter_and_reduce_every_operation_on_three_ranks() {
    // Three ranks: the average divides by 3 (inexact in floats, so the single division is
    // checked bit for bit) and the reduction order matters for nothing else.
    let mut runs = Vec::new();
    for op in ["reducescatter", "reduce"] {
        for d in ["float", "bfloat16", "double", "int8", "uint32", "int64"] {
            for o in OPS {
                let args = strings(&[
                    "--op", op, "-d", d, "-o", o, "--nranks", "3", "--root", "1", "-b", "96", "-e",
                    "96K", "-f", "32", "-n", "1", "-w", "0",
                ]);
                runs.push((args, d, o));
            }
        }
    }
    let _ = all_pass(&runs);
}

/// fp8 reductions, every operation (mulsum too) on every reducing collective: widened to f32,
/// reduced, rounded once; the tool's reference is the same, bit for bit. Three ranks for
/// reduce-scatter and reduce (the average divides by 3).
#[test]
fn fp8_reductions_every_collective_and_operation_check_exactly() {
    let mut runs = Vec::new();
    for d in FP8 {
        for o in OPS {
            let args = strings(&[
                "-d", d, "-o", o, "--nranks", "2", "-b", "64", "-e", "64K", "-f", "32", "-n", "1",
                "-w", "0",
            ]);
            runs.push((args, d, o));
            for op in ["reducescatter", "reduce"] {
                let args = strings(&[
                    "--op", op, "-d", d, "-o", o, "--nranks", "3", "--root", "2", "-b", "96", "-e",
                    "96K", "-f", "32", "-n", "1", "-w", "0",
                ]);
                runs.push((args, d, o));
            }
        }
    }
    let _ = all_pass(&runs);
}

/// fp8 calls larger than the staging (16 MiB, four bytes per element): an all-reduce and a
/// reduce-scatter of 5 MiB of fp8, 20 MiB of f32, run in two pieces each; every element is
/// checked.
#[test]
fn fp8_calls_larger_than_the_staging_run_in_pieces() {
    let runs = [
        (
            strings(&[
                "-d", "f8e4m3", "-o", "sum", "--nranks", "2", "-b", "5M", "-e", "5M", "-n", "1",
                "-w", "0",
            ]),
            "f8e4m3",
            "sum",
        ),
        (
            strings(&[
                "--op",
                "reducescatter",
                "-d",
                "f8e5m2",
                "-o",
                "mulsum",
                "--nranks",
                "2",
                "-b",
                "5M",
                "-e",
                "5M",
                "-n",
                "1",
                "-w",
                "0",
            ]),
            "f8e5m2",
            "mulsum",
        ),
    ];
    let _ = all_pass(&runs);
}

/// fp8 and mulsum across simulated hosts: the library sums per host first, then across
/// hosts, and the tool's inputs make the result the same as in rank order.
#[test]
fn fp8_and_mulsum_across_simulated_hosts() {
    let mut runs = Vec::new();
    for (d, o) in [
        ("f8e5m2", "sum"),
        ("f8e4m3", "max"),
        // Across hosts an average sums on each host and divides once at the end.
        ("f8e4m3", "avg"),
        ("float", "mulsum"),
        ("f8e4m3", "mulsum"),
    ] {
        let args = strings(&[
            "-d",
            d,
            "-o",
            o,
            "--nranks",
            "4",
            "--simulate-hosts",
            "2",
            "-b",
            "64",
            "-e",
            "64K",
            "-f",
            "32",
            "-n",
            "1",
            "-w",
            "0",
        ]);
        runs.push((args, d, o));
    }
    let algos = all_pass(&runs);
    assert!(
        algos.iter().all(|a| a.starts_with("cross-host")),
        "{algos:?}"
    );
}

#[test]
fn moved_types_on_the_collectives_that_move_them() {
    let mut runs = Vec::new();
    for op in ["allgather", "broadcast", "alltoall", "sendrecv"] {
        for d in ["f8e4m3", "f8e5m2", "int8", "uint64", "double"] {
            let args = strings(&[
                "--op", op, "-d", d, "--nranks", "2", "--root", "1", "-b", "64", "-e", "64K", "-f",
                "32", "-n", "1", "-w", "0",
            ]);
            runs.push((args, d, "none"));
        }
    }
    let _ = all_pass(&runs);
}

#[test]
fn fp8_and_mulsum_headers_and_ignored_redop_are_said() {
    let out = perf(&[
        "--op",
        "allgather",
        "-d",
        "fp8_e4m3",
        "--nranks",
        "2",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "1",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        !stdout.contains("rounded once"),
        "moved, not reduced: {stdout}"
    );
    for (args, says) in [
        (
            &["-d", "fp8_e4m3", "-o", "max"][..],
            "# f8e4m3 max: widened to f32, reduced in f32 and rounded once to f8e4m3",
        ),
        (
            &["--op", "reduce", "-o", "mulsum"][..],
            "# mulsum: each rank's input times its own scalar (nccl-tests': 1 on even ranks, 2 \
             on odd ranks), then summed",
        ),
    ] {
        let out = perf(&[args, &["--nranks", "2", "-b", "64", "-e", "64", "-n", "1"]].concat());
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{args:?}: {stdout}{stderr}");
        assert!(stdout.contains(says), "{args:?}: {stdout}");
    }
    let out = perf(&[
        "--op",
        "broadcast",
        "-o",
        "max",
        "--nranks",
        "2",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "1",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("# -o max ignored: broadcast does not reduce"),
        "{stdout}"
    );
}

#[test]
fn simulated_hosts_run_across_hosts_and_say_so() {
    let json = temp("xhost.json");
    let sweep = [
        "--nranks",
        "4",
        "--simulate-hosts",
        "2",
        "-b",
        "64",
        "-e",
        "64K",
        "-f",
        "32",
        "-n",
        "2",
        "-w",
        "1",
        "--json",
        json.to_str().unwrap(),
    ];
    let out = perf(&sweep);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("# simulated hosts: 2"), "{stdout}");
    // No GPU here: the cross buffer is the Host transport's shared memory, not device memory.
    assert!(
        stdout.contains("# rank 0's cross buffer: shared host memory (no GPU"),
        "{stdout}"
    );
    let ar = rows(&stdout);
    assert_eq!(ar.len(), 3, "{stdout}");
    for r in &ar {
        // Two hosts: the all-reduce across hosts is one-shot at every size.
        assert_eq!(r[4], "cross-host-oneshot", "{r:?}");
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "#wrong: {r:?}");
    }
    let report = Report::from_json(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(
        report.rows.iter().all(|r| r.algo == "cross-host-oneshot"),
        "{:?}",
        report.rows
    );
    let _ = std::fs::remove_file(&json);

    // Send/recv across the simulated hosts (rank r to r + 1: every other pair crosses): the
    // same sweep with --op sendrecv in place of the JSON output. With no send/recv across
    // hosts by default (MSCCLPP_P2P_REMOTE_MAX=0): the tool names the ring's neighbours as
    // the peers, so it runs all the same.
    let out = perf_with(
        &[&sweep[..sweep.len() - 2], &["--op", "sendrecv"]].concat(),
        &[("MSCCLPP_P2P_REMOTE_MAX", "0")],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let p2p = rows(&stdout);
    assert_eq!(p2p.len(), 3, "{stdout}");
    for r in &p2p {
        assert_eq!(r[4], "cross-host", "{r:?}");
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "#wrong: {r:?}");
    }

    // Three hosts: a broadcast of 512 KB goes two-shot (the root scatters, the hosts
    // all-gather), one of 64 B one-shot; both checked.
    let out = perf(&[
        "--nranks",
        "3",
        "--simulate-hosts",
        "3",
        "--op",
        "broadcast",
        "-b",
        "64",
        "-e",
        "512K",
        "-f",
        "8192",
        "-n",
        "2",
        "-w",
        "1",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let bc = rows(&stdout);
    let algos: Vec<&str> = bc.iter().map(|r| r[4].as_str()).collect();
    assert_eq!(
        algos,
        ["cross-host-oneshot", "cross-host-twoshot"],
        "{stdout}"
    );
    for r in &bc {
        assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "#wrong: {r:?}");
    }

    let out = perf(&[
        "--nranks",
        "4",
        "--simulate-hosts",
        "3",
        "-b",
        "8",
        "-e",
        "8",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "stdout:\n{stdout}");
    assert!(
        stderr.contains("--simulate-hosts 3 does not divide"),
        "{stderr}"
    );
}

/// Ranks started by hand (the tool's own launcher variables) with different `--algo`: the
/// first all-reduce is a mismatch that every rank reports, once, naming both algorithms,
/// and every rank exits with status 1 (no panic, no second copy of the message).
#[test]
fn a_failed_call_is_reported_once_by_every_rank() {
    let port = free_port();
    let ranks: Vec<_> = ["oneshot", "twoshot"]
        .iter()
        .enumerate()
        .map(|(rank, algo)| {
            let vars = by_hand(rank, 2, port);
            let mut cmd = Command::new(perf_exe());
            cmd.args(["--algo", algo, "-b", "1K", "-e", "1K", "-n", "2"]);
            alone(&mut cmd, &vars.each_ref().map(|(k, v)| (*k, v.as_str())));
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("mscclpp-perf starts")
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "rank {rank}: {stdout}{stderr}");
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("mscclpp-perf: "))
            .collect();
        assert_eq!(lines.len(), 1, "rank {rank}: {stderr}");
        assert!(
            lines[0].contains("called collective #1 differently")
                && lines[0].contains("(one-shot)")
                && lines[0].contains("(two-shot)"),
            "rank {rank}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "rank {rank}: {stderr}");
    }
}

/// A 64 MiB `/dev/shm` (a container's default) in a private mount namespace: the tool's
/// default sweep, whose scratch does not fit there, is refused before any rank starts, and
/// ranks started by hand each end with status 1; both name `/dev/shm`, its size and how to
/// raise it (they were killed by `SIGBUS` at the first touch of a page beyond the space
/// left). A smaller scratch, as the message suggests, runs. Needs `unshare -m` (root);
/// elsewhere it says why and checks nothing.
#[test]
fn a_small_dev_shm_is_refused_with_its_size_and_how_to_raise_it() {
    let probe = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=1M tmpfs /dev/shm"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        println!("skipped: no private /dev/shm can be mounted here (unshare -m: {probe:?})");
        return;
    }
    let dir = temp("small-shm");
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    // Each run is limited (`timeout`), so that a hung rank fails the test instead of CI.
    let script = format!(
        "mount -t tmpfs -o size=64M tmpfs /dev/shm || exit 90
         timeout 60 \"$0\" -n 1 -w 1 >\"$D/alone\" 2>&1; echo $? >\"$D/alone.rc\"
         for r in 0 1; do
           (MSCCLPP_RANK=$r MSCCLPP_NRANKS=2 MSCCLPP_BOOTSTRAP=127.0.0.1:{port} \
            timeout 60 \"$0\" -n 1 -w 1 >\"$D/rank$r\" 2>&1; echo $? >\"$D/rank$r.rc\") &
         done
         wait
         MSCCLPP_COLL_SCRATCH_BYTES=8388608 timeout 60 \"$0\" -b 1M -e 1M -n 1 -w 1 \
           >\"$D/small\" 2>&1; echo $? >\"$D/small.rc\""
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "sh", "-c", &script]).arg(perf_exe());
    alone(&mut cmd, &[("D", dir.to_str().unwrap())]);
    let out = cmd.output().expect("unshare runs");
    assert!(out.status.success(), "{out:?}");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let says = [
        "/dev/shm",
        "64.0 MiB",
        "--shm-size",
        "MSCCLPP_COLL_SCRATCH_BYTES",
    ];
    for (run, status) in [("alone", "2"), ("rank0", "1"), ("rank1", "1")] {
        let (text, rc) = (read(run), read(&format!("{run}.rc")));
        assert_eq!(rc.trim(), status, "{run}: {text}");
        for s in says {
            assert!(text.contains(s), "{run}: {s:?}: {text}");
        }
        assert!(
            !text.contains("[rank") && !text.contains("# mscclpp-perf"),
            "{run}: no rank starts its sweep:\n{text}"
        );
    }
    let small = read("small");
    assert_eq!(read("small.rc").trim(), "0", "{small}");
    let _ = std::fs::remove_dir_all(&dir);
}
