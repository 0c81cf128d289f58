use clap::Parser;
use half::{bf16, f16};

use super::args::{AlgoArg, Args, Collective, CompareWith, Config, parse_size, size_sweep};
use super::check::{self, Elem};
use super::json::{self, Report};
use super::plot;
use super::report::{self, Measurement, Pair, Row};
use crate::host::collectives::{DataType, ReduceOp};

fn parse(args: &[&str]) -> Result<Config, String> {
    let args = Args::try_parse_from(std::iter::once("mscclpp-perf").chain(args.iter().copied()))
        .map_err(|e| e.to_string())?;
    Config::new(args).map_err(|e| e.to_string())
}

#[test]
fn sizes_with_suffixes() {
    assert_eq!(parse_size("8"), Ok(8));
    assert_eq!(parse_size("1K"), Ok(1024));
    assert_eq!(parse_size("32M"), Ok(32 << 20));
    assert_eq!(parse_size("2G"), Ok(2 << 30));
    assert_eq!(parse_size("64k"), Ok(64 << 10));
    assert_eq!(parse_size("4KiB"), Ok(4096));
    assert_eq!(parse_size("16MB"), Ok(16 << 20));
    assert_eq!(parse_size("1.5K"), Ok(1536));
    assert_eq!(parse_size(" 7b "), Ok(7));
    for bad in [
        "",
        "K",
        "-1",
        "0",
        "1.5",
        "12Q",
        "1..5K",
        "99999999999999999999",
        "0.1",
    ] {
        assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
    }
    assert!(parse_size("20000000T").is_err(), "overflow is refused");
}

#[test]
fn nccl_tests_defaults() {
    let c = parse(&[]).unwrap();
    let a = &c.args;
    assert_eq!((a.min_bytes, a.max_bytes), (32 << 20, 32 << 20));
    assert_eq!((a.step_factor, a.step_bytes), (1, 1 << 20));
    assert_eq!(
        (a.iters, a.warmup_iters, a.check, a.graph_launches),
        (20, 1, 1, 0)
    );
    assert_eq!(a.dtype, DataType::F32);
    assert_eq!(a.redop, ReduceOp::Sum);
    assert_eq!(a.collective, Collective::AllReduce);
    assert_eq!(a.algo, AlgoArg::Auto);
    assert_eq!(
        (a.nranks, a.compare, &a.json, &a.plot),
        (None, None, &None, &None)
    );
    assert_eq!(c.sizes, vec![32 << 20]);
    assert!(c.check());
}

#[test]
fn all_flags() {
    let c = parse(&[
        "-b",
        "8",
        "-e",
        "1M",
        "-f",
        "2",
        "-n",
        "5",
        "-w",
        "3",
        "-c",
        "0",
        "-d",
        "bf16",
        "-o",
        "sum",
        "-G",
        "10",
        "--op",
        "allgather",
        "--algo",
        "twoshot",
        "--nranks",
        "4",
        "--compare",
        "nccl",
        "--json",
        "out.json",
        "--plot",
        "out.svg",
    ])
    .unwrap();
    let a = &c.args;
    assert_eq!((a.min_bytes, a.max_bytes, a.step_factor), (8, 1 << 20, 2));
    assert_eq!((a.iters, a.warmup_iters, a.graph_launches), (5, 3, 10));
    assert!(!c.check());
    assert_eq!(a.dtype, DataType::Bf16);
    assert_eq!(a.collective, Collective::AllGather);
    assert_eq!(a.algo, AlgoArg::Twoshot);
    assert_eq!(a.nranks, Some(4));
    assert_eq!(a.compare, Some(CompareWith::Nccl));
    assert_eq!(a.json.as_deref(), Some(std::path::Path::new("out.json")));
    assert_eq!(a.plot.as_deref(), Some(std::path::Path::new("out.svg")));
    assert_eq!(c.sizes.len(), 18); // 8 B .. 1 MiB, doubling
    let long = parse(&["--minbytes", "1K", "--maxbytes", "4K", "--stepbytes", "1K"]).unwrap();
    assert_eq!(long.sizes, vec![1024, 2048, 3072, 4096]);
}

#[test]
fn datatype_names_and_aliases() {
    for (names, want) in [
        (
            &["float", "float32", "f32", "fp32", "FLOAT"][..],
            DataType::F32,
        ),
        (&["half", "float16", "f16", "fp16"][..], DataType::F16),
        (&["bfloat16", "bf16"][..], DataType::Bf16),
    ] {
        for n in names {
            assert_eq!(parse(&["-d", n]).unwrap().args.dtype, want, "{n}");
        }
    }
    let e = parse(&["-d", "int8"]).unwrap_err();
    assert!(e.contains("not supported"), "{e}");
    let e = parse(&["-d", "quux"]).unwrap_err();
    assert!(e.contains("unknown datatype"), "{e}");
    let e = parse(&["-o", "max"]).unwrap_err();
    assert!(e.contains("not supported"), "{e}");
}

#[test]
fn bad_command_lines_are_errors() {
    let e = parse(&["-b", "64M", "-e", "1M"]).unwrap_err();
    assert!(e.contains("larger than"), "{e}");
    assert!(parse(&["-b", "1G"]).is_err(), "-b above the default -e");
    assert!(parse(&["-n", "0"]).unwrap_err().contains("iters"));
    assert!(parse(&["--nranks", "0"]).is_err());
    assert!(parse(&["-f", "0"]).is_err());
    assert!(
        parse(&["-b", "1", "-e", "1G", "-i", "1"])
            .unwrap_err()
            .contains("sizes")
    );
    assert!(parse(&["--op", "scan"]).is_err());
    assert!(parse(&["--op", "broadcast", "--root", "1"]).is_ok());
    assert!(parse(&["--algo", "ring"]).is_err());
    assert!(parse(&["--compare", "rccl"]).is_err());
    assert!(parse(&["-b", "x"]).is_err());
}

#[test]
fn size_sweeps() {
    assert_eq!(size_sweep(8, 128, 2, 0).unwrap(), vec![8, 16, 32, 64, 128]);
    assert_eq!(size_sweep(8, 100, 4, 0).unwrap(), vec![8, 32]);
    assert_eq!(size_sweep(10, 40, 1, 10).unwrap(), vec![10, 20, 30, 40]);
    assert_eq!(size_sweep(10, 45, 1, 10).unwrap(), vec![10, 20, 30, 40]);
    assert_eq!(size_sweep(5, 5, 2, 0).unwrap(), vec![5]);
    assert!(size_sweep(0, 5, 2, 0).is_err());
    assert!(size_sweep(6, 5, 2, 0).is_err());
    assert!(size_sweep(1, 5, 1, 0).is_err());
    // Near the top of u64 the next step overflows and the sweep ends.
    assert_eq!(
        size_sweep(u64::MAX / 2 + 1, u64::MAX, 2, 0).unwrap().len(),
        1
    );
}

#[test]
fn shapes_round_like_nccl_tests() {
    let s = report::shape(Collective::AllReduce, 1000, DataType::F32, 2).unwrap();
    assert_eq!((s.bytes, s.count, s.send_count), (1000, 250, 250));
    let s = report::shape(Collective::AllReduce, 1001, DataType::F16, 8).unwrap();
    assert_eq!((s.bytes, s.count, s.send_count), (1000, 500, 500));
    assert!(report::shape(Collective::AllReduce, 3, DataType::F32, 2).is_none());
    // All-gather: per-rank count a multiple of 16 bytes; size = total output.
    let s = report::shape(Collective::AllGather, 1 << 20, DataType::F32, 2).unwrap();
    assert_eq!(
        (s.bytes, s.count, s.send_count),
        (1 << 20, 1 << 18, 1 << 17)
    );
    let s = report::shape(Collective::AllGather, 1000, DataType::F16, 3).unwrap();
    assert_eq!((s.bytes, s.count, s.send_count), (960, 480, 160));
    assert!(report::shape(Collective::AllGather, 32, DataType::F16, 3).is_none());
}

#[test]
fn bus_bandwidth_factors() {
    let f = report::bus_factor;
    assert_eq!(f(Collective::AllReduce, 2), 1.0);
    assert_eq!(f(Collective::AllReduce, 8), 1.75);
    assert_eq!(f(Collective::AllGather, 2), 0.5);
    assert_eq!(f(Collective::AllGather, 8), 0.875);
    assert_eq!(f(Collective::AllReduce, 1), 0.0);
    let m = Measurement::new(1_000_000, 10.0, 1.75, Some(0));
    assert!((m.algbw_gbps - 100.0).abs() < 1e-9, "{m:?}");
    assert!((m.busbw_gbps - 175.0).abs() < 1e-9, "{m:?}");
}

fn m(time_us: f64, bytes: u64, factor: f64, wrong: Option<u64>) -> Measurement {
    Measurement::new(bytes, time_us, factor, wrong)
}

fn row(nccl: bool) -> Row {
    let b = 33_554_432;
    Row {
        bytes: b,
        count: b / 4,
        dtype: "float".into(),
        redop: "sum".into(),
        algo: "twoshot".into(),
        mscclpp: Pair {
            out_of_place: m(123.456, b, 1.0, Some(0)),
            in_place: m(12345.6, b, 1.0, None),
        },
        nccl: nccl.then(|| Pair {
            out_of_place: m(246.912, b, 1.0, Some(3)),
            in_place: m(6172.8, b, 1.0, Some(0)),
        }),
    }
}

#[test]
fn table_row_and_header() {
    let line = report::format_row(&row(false));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "33554432", "8388608", "float", "sum", "twoshot", "123.5", "271.79", "271.79", "0",
            "12346", "2.72", "2.72", "N/A"
        ]
    );
    let header = report::header(false);
    assert_eq!(header.len(), 3);
    assert!(header.iter().all(|h| h.starts_with('#')));
    assert!(header[0].contains("out-of-place") && header[0].contains("in-place"));
    // Every column title ends where the row's cell ends.
    let titles = &header[1];
    for title in ["size", "count", "type", "redop", "algo", "busbw", "#wrong"] {
        assert!(titles.contains(title), "{title} in {titles}");
    }
    assert_eq!(
        titles.find("count").unwrap() + 5,
        line.find("8388608").unwrap() + 7
    );
    assert_eq!(titles.len(), line.len(), "{titles}\n{line}");

    let line = report::format_row(&row(true));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells.len(), 5 + 2 * (4 + 4));
    // NCCL out-of-place: time, busbw, #wrong, ratio = NCCL time / ours.
    assert_eq!(&cells[9..13], ["246.9", "135.90", "3", "2.00"]);
    assert_eq!(&cells[17..21], ["6172.8", "5.44", "0", "0.50"]);
    let header = report::header(true);
    assert!(header[0].contains("NCCL out-of-place") && header[0].contains("NCCL in-place"));
    assert!(header[1].contains("ratio"));
    assert_eq!(header[1].len(), line.len(), "{}\n{line}", header[1]);
}

#[test]
fn time_format_like_nccl_tests() {
    assert_eq!(report::format_time(5.678), "5.68");
    assert_eq!(report::format_time(123.45), "123.5");
    assert_eq!(report::format_time(12345.6), "12346");
}

#[test]
fn summary_lines() {
    let s = report::summary(&[row(true)]);
    assert!(s[0].starts_with("# Avg bus bandwidth    : "), "{s:?}");
    assert!(
        s[1].contains("NCCL") && s[1].contains("mscclpp/NCCL"),
        "{s:?}"
    );
    assert_eq!(s[2], "# Out of bounds values : 3 FAILED");
    assert_eq!(report::total_wrong(&[row(false)]), Some(0));
    let mut unchecked = row(false);
    unchecked.mscclpp.out_of_place.wrong = None;
    assert_eq!(report::total_wrong(&[unchecked]), None);
}

fn roundtrip_exact<T: Elem>() {
    for c in [Collective::AllReduce, Collective::AllGather] {
        for nranks in [1, 2, 3, 8, 16] {
            let count = 1000u64;
            let send_count = match c {
                Collective::AllReduce => count,
                Collective::AllGather => count / nranks as u64,

                _ => unreachable!("the loop runs all-reduce and all-gather"),
            };
            // Every input and expected value survives the element type unchanged.
            for r in 0..nranks {
                for i in 0..send_count {
                    let v = check::input_value(c, T::DTYPE, nranks, r, i);
                    assert_eq!(T::from_f32(v).to_f32(), v, "{c:?} {} r{r} i{i}", T::DTYPE);
                }
            }
            let out_len = match c {
                Collective::AllReduce => count,
                Collective::AllGather => send_count * nranks as u64,

                _ => unreachable!("the loop runs all-reduce and all-gather"),
            };
            let mut got: Vec<T> = (0..out_len)
                .map(|j| T::from_f32(check::expected(c, T::DTYPE, nranks, send_count, j)))
                .collect();
            for (j, g) in got.iter().enumerate() {
                let want = check::expected(c, T::DTYPE, nranks, send_count, j as u64);
                assert_eq!(g.to_f32(), want, "expected value not exact in {}", T::DTYPE);
            }
            assert_eq!(check::count_wrong(c, nranks, send_count, &got), 0);
            // Corrupt three elements (one NaN): exactly three are counted.
            let n = got.len();
            let bump = |x: T| T::from_f32(-x.to_f32() - 1.0);
            got[0] = bump(got[0]);
            got[n / 2] = bump(got[n / 2]);
            got[n - 1] = T::from_f32(f32::NAN);
            assert_eq!(
                check::count_wrong(c, nranks, send_count, &got),
                3,
                "{c:?} n{nranks}"
            );
        }
    }
}

#[test]
fn expected_values_and_wrong_counts_float() {
    roundtrip_exact::<f32>();
}

#[test]
fn expected_values_and_wrong_counts_half() {
    roundtrip_exact::<f16>();
}

#[test]
fn expected_values_and_wrong_counts_bfloat16() {
    roundtrip_exact::<bf16>();
}

#[test]
fn all_reduce_expected_is_the_sum_and_all_gather_the_slots() {
    let c = Collective::AllReduce;
    for i in 0..50 {
        let sum: f32 = (0..4)
            .map(|r| check::input_value(c, DataType::F32, 4, r, i))
            .sum();
        assert_eq!(check::expected(c, DataType::F32, 4, 50, i), sum);
    }
    let g = Collective::AllGather;
    let v = |r, i| check::input_value(g, DataType::F16, 4, r, i);
    assert_eq!(check::expected(g, DataType::F16, 4, 10, 0), v(0, 0));
    assert_eq!(check::expected(g, DataType::F16, 4, 10, 25), v(2, 5));
    // Ranks' inputs differ, so a block landing in the wrong slot is counted.
    assert!((0..10).any(|i| v(0, i) != v(1, i)));
    // Inputs take several values, both signs.
    let vals: std::collections::BTreeSet<i32> = (0..100).map(|i| v(0, i) as i32).collect();
    assert!(vals.len() > 10 && vals.iter().any(|&x| x < 0) && vals.iter().any(|&x| x > 0));
}

#[test]
fn tolerance_per_dtype() {
    assert!(check::matches(DataType::F32, 100.0, 100.0));
    assert!(!check::matches(DataType::F32, 100.01, 100.0));
    assert!(check::matches(DataType::Bf16, 100.1, 100.0));
    assert!(!check::matches(DataType::Bf16, 101.0, 100.0));
    assert!(check::matches(DataType::F16, 1000.1, 1000.0));
    assert!(!check::matches(DataType::F16, 1001.0, 1000.0));
    // Below one unit at the largest result the inputs make (16 per rank, 1024 ranks for
    // float): an off-by-one always counts.
    for d in [DataType::F32, DataType::F16, DataType::Bf16] {
        let top = check::exact_limit(d).min(16 * 1024) as f32;
        assert!(!check::matches(d, top - 1.0, top), "{d}");
    }
    assert!(!check::matches(DataType::F16, f32::NAN, 1.0));
    assert!(!check::matches(DataType::F16, f32::INFINITY, 1.0));
}

fn sample_report() -> Report {
    Report {
        tool: "mscclpp-perf".into(),
        version: "0.1.0".into(),
        command_line: vec!["mscclpp-perf".into(), "-b".into(), "8".into()],
        date: json::iso8601_utc(0),
        collective: "allreduce".into(),
        dtype: "float".into(),
        redop: "sum".into(),
        algo: "auto".into(),
        nranks: 2,
        backend: "gpu".into(),
        devices: vec!["device 0 [0000:18:00] NVIDIA H200".into(); 2],
        hosts: vec!["node1".into(); 2],
        nccl_version: Some("2.27.3".into()),
        iters: 20,
        warmup_iters: 1,
        graph_launches: 0,
        check: true,
        rows: vec![row(true), row(false)],
    }
}

#[test]
fn json_round_trip() {
    let r = sample_report();
    let text = r.to_json();
    assert_eq!(Report::from_json(&text).unwrap(), r);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let row0 = &v["rows"][0];
    for key in [
        "bytes", "count", "dtype", "redop", "algo", "mscclpp", "nccl",
    ] {
        assert!(row0.get(key).is_some(), "{key} in {row0}");
    }
    let oop = &row0["nccl"]["out_of_place"];
    for key in ["time_us", "algbw_gbps", "busbw_gbps", "wrong"] {
        assert!(oop.get(key).is_some(), "{key} in {oop}");
    }
    assert!(v["rows"][1]["nccl"].is_null());
    assert!(Report::from_json("{\"tool\": 1}").is_err());
}

#[test]
fn dates() {
    assert_eq!(json::iso8601_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(json::iso8601_utc(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(json::iso8601_utc(1_798_761_599), "2026-12-31T23:59:59Z");
    assert!(json::now_utc().starts_with("20"));
}

#[test]
fn svg_has_axes_series_and_legend() {
    let rows: Vec<Row> = (3..=10)
        .map(|k| {
            let mut r = row(true);
            r.bytes = 1 << (2 * k);
            r
        })
        .collect();
    let svg = plot::svg("allreduce <float> x2", &rows);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 8, "4 series x 2 panels");
    for name in [
        "mscclpp out-of-place",
        "mscclpp in-place",
        "NCCL out-of-place",
        "NCCL in-place",
    ] {
        assert_eq!(svg.matches(&format!(">{name}</text>")).count(), 2, "{name}");
    }
    assert!(svg.contains("busbw (GB/s)") && svg.contains("time (us)"));
    assert!(svg.contains("size (bytes)"));
    assert!(svg.contains("allreduce &lt;float&gt; x2"), "title escaped");
    assert_eq!(svg.matches("class=\"axis\"").count(), 4);
    // x ticks: powers of two from 64 B to 1 MiB, labelled.
    assert!(svg.contains(">64</text>") && svg.contains(">1M</text>"));
    // Latency decades on a log axis.
    assert!(svg.contains(">100</text>") && svg.contains(">10000</text>"));
    let mut ours_only = rows.clone();
    for r in &mut ours_only {
        r.nccl = None;
    }
    let svg = plot::svg("t", &ours_only);
    assert_eq!(svg.matches("<polyline").count(), 4);
    assert!(!svg.contains("NCCL"));
    // No rows still gives a document.
    assert!(plot::svg("t", &[]).contains("</svg>"));
}

#[test]
fn size_labels() {
    assert_eq!(plot::size_label(8.0), "8");
    assert_eq!(plot::size_label(1024.0), "1K");
    assert_eq!(plot::size_label((32u64 << 20) as f64), "32M");
    assert_eq!(plot::size_label((1u64 << 30) as f64), "1G");
    assert_eq!(plot::size_label(1536.0), "1536");
}

#[test]
fn new_collectives_have_nccl_tests_shapes_factors_and_references() {
    use Collective::*;
    let f = report::bus_factor;
    assert_eq!(f(ReduceScatter, 4), 0.75);
    assert_eq!(f(AllToAll, 8), 0.875);
    assert_eq!(f(Broadcast, 8), 1.0);
    assert_eq!(f(Reduce, 8), 1.0);
    assert_eq!(f(SendRecv, 2), 1.0);
    // Reduce-scatter and all-to-all: size = a rank's whole input, in `nranks` blocks.
    let s = report::shape(ReduceScatter, 1000, DataType::F32, 3).unwrap();
    assert_eq!((s.bytes, s.count, s.send_count), (996, 249, 249));
    assert_eq!(report::out_count(ReduceScatter, &s, 3), 83);
    assert!(report::shape(AllToAll, 8, DataType::F32, 3).is_none());
    let s = report::shape(Broadcast, 1001, DataType::F16, 3).unwrap();
    assert_eq!((s.bytes, s.count), (1000, 500));
    let (n, sc) = (3usize, 12u64);
    let v = |r: usize, i: u64| check::input_value(ReduceScatter, DataType::F32, n, r, i);
    // Rank 2's reduce-scatter output: block 2 summed.
    let want: f32 = (0..n).map(|r| v(r, 8 + 1)).sum();
    assert_eq!(
        check::expected_at(ReduceScatter, DataType::F32, n, 2, 0, sc, 1),
        Some(want)
    );
    // All-to-all: element 5 of rank 1's output is block 1 of rank 1 (5 / 4), element 1.
    let a = |r: usize, i: u64| check::input_value(AllToAll, DataType::F32, n, r, i);
    assert_eq!(
        check::expected_at(AllToAll, DataType::F32, n, 1, 0, sc, 5),
        Some(a(1, 4 + 1))
    );
    assert_eq!(
        check::expected_at(Broadcast, DataType::F32, n, 0, 2, sc, 3),
        Some(a(2, 3))
    );
    assert_eq!(
        check::expected_at(Reduce, DataType::F32, n, 1, 2, sc, 3),
        None
    );
    assert_eq!(
        check::expected_at(SendRecv, DataType::F32, n, 0, 0, sc, 3),
        Some(a(2, 3))
    );
    // Wrong elements are counted where something is expected.
    let got = vec![0f32; 4];
    assert_eq!(check::count_wrong_at(Reduce, n, 1, 2, 4, &got), 0);
    assert_eq!(
        check::count_wrong_at(Broadcast, n, 1, 2, 4, &got),
        4 - got.iter().zip(0..).filter(|(g, i)| **g == a(2, *i)).count() as u64
    );
}
