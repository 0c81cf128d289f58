use clap::Parser;
use half::{bf16, f16};

use super::args::{AlgoArg, Args, Collective, CompareWith, Config, Redop, parse_size, size_sweep};
use super::check::{self, Elem, Reference, Strictness};
use super::json::{self, Report};
use super::plot;
use super::report::{self, Measurement, Pair, Row};
use crate::host::collectives::{DataType, Fp8E4M3, Fp8E5M2, PreMulScalar, ReduceOp};

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
    assert_eq!(a.redop, Redop::Sum);
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
            &["float", "float32", "f32", "fp32", "FLOAT", "ncclFloat"][..],
            DataType::F32,
        ),
        (&["half", "float16", "f16", "fp16"][..], DataType::F16),
        (&["bfloat16", "bf16"][..], DataType::Bf16),
        (&["double", "float64", "f64", "fp64"][..], DataType::F64),
        (&["int8", "char", "i8", "ncclInt8"][..], DataType::I8),
        (&["uint8", "u8"][..], DataType::U8),
        (&["int32", "int", "i32"][..], DataType::I32),
        (&["uint32", "u32"][..], DataType::U32),
        (&["int64", "i64"][..], DataType::I64),
        (&["uint64", "u64"][..], DataType::U64),
        (
            &["f8e4m3", "float8e4m3", "fp8_e4m3", "e4m3"][..],
            DataType::Fp8E4M3,
        ),
        (
            &["f8e5m2", "float8e5m2", "fp8_e5m2", "e5m2"][..],
            DataType::Fp8E5M2,
        ),
    ] {
        for n in names {
            assert_eq!(parse(&["-d", n]).unwrap().args.dtype, want, "{n}");
        }
    }
    // Every type's printed name parses back to it.
    for d in DataType::ALL {
        assert_eq!(super::args::parse_dtype(d.name()), Ok(d));
    }
    let e = parse(&["-d", "quux"]).unwrap_err();
    assert!(
        e.contains("unknown datatype") && e.contains("f8e5m2"),
        "{e}"
    );
    assert!(parse(&["-d", "all"]).unwrap_err().contains("one data type"));
    for (names, want) in [
        (&["sum", "ncclSum"][..], Redop::Sum),
        (&["prod", "product"][..], Redop::Prod),
        (&["min"][..], Redop::Min),
        (&["max", "MAX"][..], Redop::Max),
        (&["avg", "average"][..], Redop::Avg),
        (&["mulsum", "premulsum", "ncclPreMulSum"][..], Redop::MulSum),
    ] {
        for n in names {
            assert_eq!(parse(&["-o", n]).unwrap().args.redop, want, "{n}");
        }
    }
    // Every operation's printed name parses back to it.
    for op in Redop::ALL {
        assert_eq!(super::args::parse_redop(op.name()), Ok(op));
    }
    assert!(
        parse(&["-o", "xor"])
            .unwrap_err()
            .contains("unknown reduction")
    );
}

#[test]
fn every_type_reduces_with_every_operation() {
    for c in ["allreduce", "reducescatter", "reduce"] {
        for d in DataType::ALL {
            for o in Redop::ALL {
                let a = parse(&["--op", c, "-d", d.name(), "-o", o.name()])
                    .unwrap_or_else(|e| panic!("{c} {d} {o:?}: {e}"))
                    .args;
                assert_eq!((a.dtype, a.redop), (d, o));
            }
        }
    }
    // -o is taken (and said to be ignored) by the collectives that do not reduce.
    assert!(parse(&["--op", "allgather", "-d", "f8e5m2", "-o", "prod"]).is_ok());
}

#[test]
fn mulsum_scalars_are_nccl_tests_ones_per_rank() {
    // 1 on even ranks, 2 on odd ones, in every type, as a host scalar of the call's type.
    for d in DataType::ALL {
        for rank in 0..4 {
            let want = if rank % 2 == 0 { 1.0 } else { 2.0 };
            let bits = check::premul_scalar(d, rank);
            let value = match d {
                DataType::F32 => f32::from_bits(bits as u32) as f64,
                DataType::F64 => f64::from_bits(bits),
                DataType::F16 => f16::from_bits(bits as u16).to_f64(),
                DataType::Bf16 => bf16::from_bits(bits as u16).to_f64(),
                DataType::Fp8E4M3 | DataType::Fp8E5M2 => check::fp8_to_f32(d, bits) as f64,
                _ => bits as f64,
            };
            assert_eq!(value, want, "{d} rank {rank}");
            assert_eq!(
                Redop::MulSum.reduce_op(d, rank),
                ReduceOp::PreMulSum(PreMulScalar::Host { dtype: d, bits })
            );
        }
        for op in Redop::ALL.into_iter().filter(|&o| o != Redop::MulSum) {
            assert_eq!(op.reduce_op(d, 1), op.combining());
        }
    }
    assert_eq!(Redop::MulSum.name(), "mulsum");
    assert_eq!(Redop::MulSum.combining(), ReduceOp::Sum);
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
    // The plot is SVG: another image type's name is refused.
    let e = parse(&["--plot", "p.png"]).unwrap_err();
    assert!(e.contains("name the file .svg"), "{e}");
    assert!(parse(&["--plot", "p.svg"]).is_ok() && parse(&["--plot", "p"]).is_ok());
    // A negative value is a bad value of its flag, not an unknown flag `-1`.
    for (flag, name) in [("-b", "minbytes"), ("-n", "iters"), ("-f", "stepfactor")] {
        let e = parse(&[flag, "-1"]).unwrap_err();
        assert!(
            e.contains(name) && !e.contains("unexpected argument"),
            "{e}"
        );
    }
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
    assert!(
        s[2].starts_with("# Ratio NCCL/mscclpp, geometric mean all sizes"),
        "{s:?}"
    );
    assert_eq!(s[3], "# Out of bounds values : 3 FAILED");
    assert_eq!(report::total_wrong(&[row(false)]), Some(0));
    let mut unchecked = row(false);
    unchecked.mscclpp.out_of_place.wrong = None;
    assert_eq!(report::total_wrong(&[unchecked]), None);
}

#[test]
fn host_time_line_spans_every_plain_measurement_of_each_library() {
    assert_eq!(
        report::host_line(&[row(true)]),
        None,
        "no host time: no line"
    );
    let mut a = row(true);
    a.mscclpp.out_of_place.host_us = Some(3.25);
    a.mscclpp.in_place.host_us = Some(0.5);
    let mut b = row(true);
    b.mscclpp.out_of_place.host_us = Some(4.0);
    b.mscclpp.in_place.host_us = Some(1.0);
    let line = report::host_line(&[a.clone(), b.clone()]).unwrap();
    assert!(line.ends_with("mscclpp 0.50-4.00 us"), "{line}");
    let n = b.nccl.as_mut().unwrap();
    n.out_of_place.host_us = Some(7.5);
    n.in_place.host_us = Some(6.0);
    let line = report::host_line(&[a, b.clone()]).unwrap();
    assert!(
        line.ends_with("mscclpp 0.50-4.00 us, NCCL 6.00-7.50 us"),
        "{line}"
    );
    let s = report::summary(&[b]);
    assert!(
        s.iter()
            .any(|l| l.starts_with("# Host time per queued call")),
        "{s:?}"
    );
    assert!(
        s.last().unwrap().starts_with("# Out of bounds values"),
        "{s:?}"
    );
}

/// The geometric mean of NCCL/ours over rows, the lowest ratio and its size, per placement,
/// and the summary lines split at 1 MB.
#[test]
fn ratio_geometric_means() {
    let at = |bytes: u64, ours: f64, theirs: f64| {
        let mut r = row(true);
        r.bytes = bytes;
        r.mscclpp.out_of_place.time_us = ours;
        r.mscclpp.in_place.time_us = ours;
        r.nccl.as_mut().unwrap().out_of_place.time_us = theirs;
        r.nccl.as_mut().unwrap().in_place.time_us = 2.0 * theirs;
        r
    };
    // Ratios 2 and 8 (geometric mean 4) up to 1 MB, then 0.5 at 4 MB.
    let rows = [
        at(8, 1.0, 2.0),
        at(1 << 20, 1.0, 8.0),
        at(4 << 20, 4.0, 2.0),
    ];
    let refs: Vec<&Row> = rows.iter().collect();
    let (geo, low, size) = report::ratio_stats(&refs[..2], false).unwrap();
    assert!((geo - 4.0).abs() < 1e-12, "{geo}");
    assert_eq!((low, size), (2.0, 8));
    // In place NCCL took twice as long: ratios 4 and 16.
    let (geo, _, _) = report::ratio_stats(&refs[..2], true).unwrap();
    assert!((geo - 8.0).abs() < 1e-12, "{geo}");
    // Over all three: (2 * 8 * 0.5)^(1/3) = 2.
    let (geo, low, size) = report::ratio_stats(&refs, false).unwrap();
    assert!((geo - 2.0).abs() < 1e-12, "{geo}");
    assert_eq!((low, size), (0.5, 4 << 20));
    let lines = report::summary(&rows);
    assert!(
        lines[2]
            .contains("up to 1 MB: 4.00 out of place, 8.00 in place (2 sizes; lowest 2.00 at 8 B)"),
        "{lines:?}"
    );
    assert!(
        lines[3].contains("all sizes: 2.00 out of place")
            && lines[3].contains("lowest 0.50 at 4194304 B"),
        "{lines:?}"
    );
    // Without NCCL there is no ratio line.
    assert!(
        report::summary(&[row(false)])
            .iter()
            .all(|l| !l.contains("Ratio"))
    );
}

/// The reference of `c` on `dtype` with `op`, `n` ranks, root 0.
fn reference(c: Collective, dtype: DataType, op: Redop, n: usize) -> Reference {
    Reference {
        collective: c,
        dtype,
        op,
        nranks: n,
        root: 0,
    }
}

/// Every reducing type: expected values round-trip the element type, and corrupting three
/// elements counts exactly three.
fn roundtrip_exact<T: Elem>() {
    for c in [Collective::AllReduce, Collective::AllGather] {
        for op in Redop::ALL {
            for nranks in [1, 2, 3, 8, 16] {
                let r = reference(c, T::DTYPE, op, nranks);
                let count = 1000u64;
                let (send_count, out_len) = match c {
                    Collective::AllReduce => (count, count),
                    _ => (count / nranks as u64, count / nranks as u64 * nranks as u64),
                };
                let mut got: Vec<T> = (0..out_len)
                    .map(|j| T::from_bits(r.expected(0, send_count, j).unwrap()))
                    .collect();
                assert_eq!(r.count_wrong(Strictness::Exact, 0, send_count, &got), 0);
                assert_eq!(r.count_wrong(Strictness::Nccl, 0, send_count, &got), 0);
                let n = got.len();
                let flip = |x: T| T::from_bits(x.to_bits() ^ 0x41);
                got[0] = flip(got[0]);
                got[n / 2] = flip(got[n / 2]);
                got[n - 1] = T::from_bits(check::unwritten(T::DTYPE));
                assert_eq!(
                    r.count_wrong(Strictness::Exact, 0, send_count, &got),
                    3,
                    "{c:?} {} {op:?} n{nranks}",
                    T::DTYPE
                );
            }
        }
    }
}

#[test]
fn expected_values_and_wrong_counts_every_type() {
    roundtrip_exact::<f32>();
    roundtrip_exact::<f16>();
    roundtrip_exact::<bf16>();
    roundtrip_exact::<f64>();
    roundtrip_exact::<i8>();
    roundtrip_exact::<u8>();
    roundtrip_exact::<i32>();
    roundtrip_exact::<u32>();
    roundtrip_exact::<i64>();
    roundtrip_exact::<u64>();
    roundtrip_exact::<Fp8E4M3>();
    roundtrip_exact::<Fp8E5M2>();
}

/// The f32 value of fp8 bits of `dtype`, through the library's own types.
fn fp8_value(dtype: DataType, bits: u64) -> f32 {
    match dtype {
        DataType::Fp8E4M3 => Fp8E4M3(bits as u8).to_f32(),
        _ => Fp8E5M2(bits as u8).to_f32(),
    }
}

/// `x` rounded once to fp8 of `dtype`, through the library's own types.
fn fp8_bits(dtype: DataType, x: f32) -> u64 {
    match dtype {
        DataType::Fp8E4M3 => Fp8E4M3::from_f32(x).0 as u64,
        _ => Fp8E5M2::from_f32(x).0 as u64,
    }
}

#[test]
fn fp8_reductions_accumulate_in_f32_and_round_once() {
    let c = Collective::AllReduce;
    for d in [DataType::Fp8E4M3, DataType::Fp8E5M2] {
        for n in [2, 3, 8] {
            let count = 2000u64;
            for op in Redop::ALL {
                let r = reference(c, d, op, n);
                // Written out here: f32 in rank order (inputs times 1 or 2 for mulsum),
                // one rounding at the end.
                let mut per_step_differs = 0;
                let mut per_step = Vec::new();
                let mut got = Vec::new();
                for i in 0..count {
                    let x: Vec<f32> = (0..n)
                        .map(|k| {
                            let v = fp8_value(d, r.input(k, i));
                            assert!(v.is_finite(), "{d} {op:?}: input {v}");
                            if op == Redop::MulSum && k % 2 == 1 {
                                2.0 * v
                            } else {
                                v
                            }
                        })
                        .collect();
                    let acc = match op {
                        Redop::Sum | Redop::MulSum => x.iter().sum::<f32>(),
                        Redop::Avg => x.iter().sum::<f32>() / n as f32,
                        Redop::Prod => x.iter().product(),
                        Redop::Min => x
                            .iter()
                            .copied()
                            .reduce(|a, b| if b.total_cmp(&a).is_lt() { b } else { a })
                            .unwrap(),
                        Redop::Max => x
                            .iter()
                            .copied()
                            .reduce(|a, b| if b.total_cmp(&a).is_gt() { b } else { a })
                            .unwrap(),
                    };
                    // The f32 partial results are exact: no order could change them.
                    if matches!(op, Redop::Sum | Redop::MulSum | Redop::Avg) {
                        let wide: f64 = x.iter().map(|&v| v as f64).sum();
                        assert_eq!(wide, x.iter().sum::<f32>() as f64, "{d} {op:?} n{n}");
                        assert!(
                            x.iter().all(|&v| v >= 0.0),
                            "{d} {op:?}: sums of non-negatives"
                        );
                    }
                    let want = fp8_bits(d, acc);
                    assert_eq!(r.expected(0, count, i), Some(want), "{d} {op:?} n{n} [{i}]");
                    got.push(want);
                    // Rounding every partial result to fp8 (as a reduction stored in fp8 between
                    // steps would) gives another value on some elements.
                    let stepped = x[1..].iter().fold(fp8_bits(d, x[0]), |a, &b| {
                        let a = fp8_value(d, a);
                        fp8_bits(
                            d,
                            match op {
                                Redop::Prod => a * b,
                                Redop::Min | Redop::Max => {
                                    if (b.total_cmp(&a).is_lt()) == (op == Redop::Min) {
                                        b
                                    } else {
                                        a
                                    }
                                }
                                _ => a + b,
                            },
                        )
                    });
                    let stepped = if op == Redop::Avg {
                        fp8_bits(d, fp8_value(d, stepped) / n as f32)
                    } else {
                        stepped
                    };
                    per_step_differs += u64::from(stepped != want);
                    per_step.push(stepped);
                }
                let as_fp8 = |v: &[u64]| -> Vec<u8> { v.iter().map(|&b| b as u8).collect() };
                let got8: Vec<u8> = as_fp8(&got);
                let stepped8: Vec<u8> = as_fp8(&per_step);
                let wrong = |v: &[u8]| match d {
                    DataType::Fp8E4M3 => {
                        let v: Vec<Fp8E4M3> = v.iter().map(|&b| Fp8E4M3(b)).collect();
                        r.count_wrong(Strictness::Exact, 0, count, &v)
                    }
                    _ => {
                        let v: Vec<Fp8E5M2> = v.iter().map(|&b| Fp8E5M2(b)).collect();
                        r.count_wrong(Strictness::Exact, 0, count, &v)
                    }
                };
                assert_eq!(wrong(&got8), 0, "{d} {op:?} n{n}");
                // A reduction that rounded each step would be counted wrong.
                assert_eq!(wrong(&stepped8), per_step_differs, "{d} {op:?} n{n}");
                // Two ranks: one step, rounded once either way; products of two e4m3
                // factors here are exact.
                let steps_round = match op {
                    Redop::Sum | Redop::MulSum => n > 2,
                    Redop::Prod => n > 3,
                    _ => false,
                };
                if steps_round {
                    assert!(
                        per_step_differs >= 10,
                        "{d} {op:?} n{n}: only {per_step_differs} of {count} elements tell \
                         rounding once from rounding each step"
                    );
                }
            }
        }
    }
}

#[test]
fn fp8_inputs_cover_the_type() {
    for d in [DataType::Fp8E4M3, DataType::Fp8E5M2] {
        // Min and max: both zeros, negative values, subnormals and the largest finite value
        // occur; no NaN or infinity.
        let r = reference(Collective::AllReduce, d, Redop::Max, 4);
        let seen: std::collections::BTreeSet<u64> = (0..4)
            .flat_map(|k| (0..4000).map(move |i| (k, i)))
            .map(|(k, i)| r.input(k, i))
            .collect();
        let largest = fp8_bits(d, f32::MAX);
        for b in [0x00, 0x80, 0x01, largest, largest | 0x80] {
            assert!(seen.contains(&b), "{d}: {b:#x} never an input");
        }
        assert!(seen.iter().all(|&b| fp8_value(d, b).is_finite()));
        // Sums: non-negative, and results that do not fit fp8 exactly (rounded at the end).
        let r = reference(Collective::AllReduce, d, Redop::Sum, 4);
        let inexact = (0..1000)
            .filter(|&i| {
                let s: f32 = (0..4).map(|k| fp8_value(d, r.input(k, i))).sum();
                fp8_value(d, fp8_bits(d, s)) != s
            })
            .count();
        assert!(
            inexact >= 300,
            "{d}: {inexact} of 1000 sums are inexact in fp8"
        );
    }
}

#[test]
fn mulsum_scales_each_rank_then_sums() {
    for d in [DataType::F32, DataType::Bf16, DataType::I32, DataType::U8] {
        for n in [2, 3, 5] {
            let r = reference(Collective::AllReduce, d, Redop::MulSum, n);
            let mut got = Vec::new();
            for i in 0..500 {
                let want = (0..n).fold(0u64, |acc, k| {
                    let scaled = check::combine(
                        d,
                        ReduceOp::Prod,
                        r.input(k, i),
                        check::premul_scalar(d, k),
                    );
                    if k == 0 {
                        scaled
                    } else {
                        check::combine(d, ReduceOp::Sum, acc, scaled)
                    }
                });
                assert_eq!(r.expected(0, 500, i), Some(want), "{d} n{n} [{i}]");
                // The plain sum of the same inputs.
                got.push(check::reduce(d, Redop::Sum, n, |k| r.input(k, i)));
            }
            // A collective that summed without the scalars is counted wrong on most elements.
            let wrong = match d {
                DataType::F32 => {
                    let v: Vec<f32> = got.iter().map(|&b| f32::from_bits(b as u32)).collect();
                    r.count_wrong(Strictness::Exact, 0, 500, &v)
                }
                DataType::Bf16 => {
                    let v: Vec<bf16> = got.iter().map(|&b| bf16::from_bits(b as u16)).collect();
                    r.count_wrong(Strictness::Nccl, 0, 500, &v)
                }
                DataType::I32 => {
                    let v: Vec<i32> = got.iter().map(|&b| b as u32 as i32).collect();
                    r.count_wrong(Strictness::Exact, 0, 500, &v)
                }
                _ => {
                    let v: Vec<u8> = got.iter().map(|&b| b as u8).collect();
                    r.count_wrong(Strictness::Exact, 0, 500, &v)
                }
            };
            assert!(wrong >= 400, "{d} n{n}: {wrong} of 500");
            // Floats: sums of the scaled inputs stay exact (halved bound).
            if d == DataType::Bf16 {
                for i in 0..500 {
                    let exact: f64 = (0..n)
                        .map(|k| {
                            bf16::from_bits(r.input(k, i) as u16).to_f64()
                                * if k % 2 == 1 { 2.0 } else { 1.0 }
                        })
                        .sum();
                    let got = bf16::from_bits(r.expected(0, 500, i).unwrap() as u16).to_f64();
                    assert_eq!(got, exact, "bf16 n{n} [{i}]");
                }
            }
        }
    }
}

#[test]
fn all_reduce_expected_applies_the_operation_in_rank_order() {
    let c = Collective::AllReduce;
    // Floats: small integers, sums exact; the reference is the plain sum.
    let r = reference(c, DataType::F32, Redop::Sum, 4);
    for i in 0..50 {
        let sum: f32 = (0..4).map(|k| f32::from_bits(r.input(k, i) as u32)).sum();
        assert_eq!(f32::from_bits(r.expected(0, 50, i).unwrap() as u32), sum);
    }
    // Integers wrap: int8 sums of full-range inputs overflow somewhere, and match the
    // wrapping sum.
    let r = reference(c, DataType::I8, Redop::Sum, 3);
    let mut wrapped = false;
    for i in 0..200 {
        let v: Vec<i8> = (0..3).map(|k| r.input(k, i) as u8 as i8).collect();
        let wide: i32 = v.iter().map(|&x| x as i32).sum();
        let want = v.iter().fold(0i8, |a, &x| a.wrapping_add(x));
        wrapped |= wide != want as i32;
        assert_eq!(r.expected(0, 200, i), Some(want as u8 as u64));
    }
    assert!(wrapped, "int8 inputs never overflow the sum");
    // Average: the wrapping sum, divided once, truncating toward zero.
    let r = reference(c, DataType::I32, Redop::Avg, 3);
    for i in 0..50 {
        let sum = (0..3).fold(0i32, |a, k| a.wrapping_add(r.input(k, i) as u32 as i32));
        assert_eq!(r.expected(0, 50, i), Some((sum / 3) as u32 as u64));
    }
    // Float average: one division of the exact sum (5/3 is not 1/3+1/3+... in f32).
    let r = reference(c, DataType::F32, Redop::Avg, 3);
    for i in 0..50 {
        let sum: f32 = (0..3).map(|k| f32::from_bits(r.input(k, i) as u32)).sum();
        assert_eq!(r.expected(0, 50, i), Some((sum / 3.0).to_bits() as u64));
    }
    // Half average: through an f32 quotient, rounded once.
    let r = reference(c, DataType::F16, Redop::Avg, 3);
    for i in 0..50 {
        let sum: f32 = (0..3)
            .map(|k| f16::from_bits(r.input(k, i) as u16).to_f32())
            .sum();
        let want = f16::from_f32(sum / 3.0).to_bits() as u64;
        assert_eq!(r.expected(0, 50, i), Some(want));
    }
    // Min by totalOrder: -0 below +0, whichever rank holds it.
    let r = reference(c, DataType::F32, Redop::Min, 2);
    assert_eq!(
        check::combine(DataType::F32, ReduceOp::Min, 0, (-0f32).to_bits() as u64),
        (-0f32).to_bits() as u64
    );
    assert_eq!(
        check::combine(DataType::F32, ReduceOp::Max, (-0f32).to_bits() as u64, 0),
        0
    );
    // Signed zeros do occur among min/max inputs.
    let zeros: std::collections::BTreeSet<u64> = (0..2000)
        .map(|i| r.input(0, i))
        .filter(|&b| f32::from_bits(b as u32) == 0.0)
        .collect();
    assert_eq!(zeros.len(), 2, "both zeros among the inputs: {zeros:?}");
    // Products stay exact: powers of two, below 2^8 in magnitude, on 16 ranks in bfloat16.
    let r = reference(c, DataType::Bf16, Redop::Prod, 16);
    for i in 0..100 {
        let p: f64 = (0..16)
            .map(|k| bf16::from_bits(r.input(k, i) as u16).to_f64())
            .product();
        let got = bf16::from_bits(r.expected(0, 100, i).unwrap() as u16).to_f64();
        assert_eq!(got, p);
        assert!(p.abs() <= 256.0 && p.abs() >= 1.0 / 256.0, "{p}");
    }
}

#[test]
fn each_operation_gives_a_different_result() {
    // A collective that ran another operation (or sum for every one) would be counted wrong:
    // on each operation's own inputs, the other operations' results differ on most elements.
    for dtype in [
        DataType::F32,
        DataType::Bf16,
        DataType::I8,
        DataType::U64,
        DataType::Fp8E4M3,
        DataType::Fp8E5M2,
    ] {
        for op in Redop::ALL {
            let r = reference(Collective::AllReduce, dtype, op, 3);
            for other in Redop::ALL.into_iter().filter(|&o| o != op) {
                let differ = (0..200u64)
                    .filter(|&i| {
                        let theirs = check::reduce(dtype, other, 3, |k| r.input(k, i));
                        Some(theirs) != r.expected(0, 200, i)
                    })
                    .count();
                assert!(differ >= 50, "{dtype} {op:?} vs {other:?}: {differ} of 200");
            }
        }
    }
}

#[test]
fn strictness() {
    let avg = reference(Collective::AllReduce, DataType::F32, Redop::Avg, 3);
    let want = (5f32 / 3.0).to_bits() as u64;
    let near = (5f32 / 3.0).to_bits() as u64 + 1; // one ulp off (NCCL's pre-multiplied sum)
    assert!(avg.matches(Strictness::Exact, want, want));
    assert!(!avg.matches(Strictness::Exact, near, want));
    assert!(avg.matches(Strictness::Nccl, near, want));
    let far = (1.7f32).to_bits() as u64;
    assert!(!avg.matches(Strictness::Nccl, far, want));
    let min = reference(Collective::AllReduce, DataType::F16, Redop::Min, 3);
    let (pz, nz) = (0u64, f16::NEG_ZERO.to_bits() as u64);
    assert!(!min.matches(Strictness::Exact, pz, nz));
    assert!(min.matches(Strictness::Nccl, pz, nz));
    let nan = check::unwritten(DataType::F16);
    assert!(!min.matches(Strictness::Nccl, nan, nan));
    // Integers and moved data: bits, whatever the strictness.
    let ints = reference(Collective::AllReduce, DataType::I32, Redop::Avg, 3);
    assert!(!ints.matches(Strictness::Nccl, 5, 6));
    let fp8 = reference(Collective::AllGather, DataType::Fp8E4M3, Redop::Sum, 3);
    assert!(!fp8.matches(Strictness::Nccl, 0x80, 0x00));
    // fp8 reductions: NCCL rounds each step to fp8, so one unit in the last place per rank
    // passes; ours is exact. 1.0 is 0x38 in e4m3, 1.125 0x39; 2.0 is 0x40.
    let fp8 = reference(Collective::AllReduce, DataType::Fp8E4M3, Redop::Sum, 3);
    assert!(fp8.matches(Strictness::Exact, 0x38, 0x38));
    assert!(!fp8.matches(Strictness::Exact, 0x39, 0x38));
    assert!(fp8.matches(Strictness::Nccl, 0x39, 0x38));
    assert!(!fp8.matches(Strictness::Nccl, 0x40 + 4, 0x38));
    let fp8 = reference(Collective::AllReduce, DataType::Fp8E5M2, Redop::Max, 3);
    assert!(
        fp8.matches(Strictness::Nccl, 0x80, 0x00),
        "either zero of a tie"
    );
    assert!(
        !fp8.matches(Strictness::Nccl, 0x7e, 0x7e),
        "NaN never matches"
    );
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
fn command_line_names_the_binary_and_no_folders() {
    let shown = json::public_command_line(&[
        "/home/someone/build/target/release/mscclpp-perf",
        "-b",
        "8",
        "--json",
        "/scratch/runs/2026/out.json",
        "--plot=/scratch/runs/2026/out.svg",
        "-d",
        "int8",
    ]);
    assert_eq!(
        shown,
        [
            "mscclpp-perf",
            "-b",
            "8",
            "--json",
            "out.json",
            "--plot=out.svg",
            "-d",
            "int8"
        ]
    );
    assert!(shown.iter().all(|a| !a.contains('/')), "{shown:?}");
    // Relative and bare names stay bare; a flag's value is only taken once.
    assert_eq!(
        json::public_command_line(&["./mscclpp-perf", "--json", "a.json", "-n", "2"]),
        ["mscclpp-perf", "--json", "a.json", "-n", "2"]
    );
    assert_eq!(
        json::public_command_line(&["mscclpp-perf"]),
        ["mscclpp-perf"]
    );
    // The training example's parameter dump, both forms (it was shown whole).
    assert_eq!(
        json::public_command_line(&[
            "train-dp",
            "--dump-params",
            "/scratch/p.bin",
            "--dump-params=/scratch/q.bin"
        ]),
        ["train-dp", "--dump-params", "p.bin", "--dump-params=q.bin"]
    );
}

/// Output files are checked before the run: a folder, a missing folder, or two flags naming
/// one file (which one output would overwrite) are refused naming the flag; a good path is
/// left as it was (not created, or not changed), and the folder holds nothing new.
#[test]
fn output_files_are_checked_before_the_run() {
    let dir = std::env::temp_dir().join(format!("mscclpp-perf-outputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.json"), dir.join("b.svg"));
    let a_str = a.to_str().unwrap();
    let parse =
        |args: &[&str]| parse(args).and_then(|c| c.check_outputs().map_err(|e| e.to_string()));
    let b_str = b.to_str().unwrap();
    let e = parse(&["--json", b_str, "--plot", b_str]).unwrap_err();
    assert!(e.contains("--json and --plot both name"), "{e}");
    let dotted = dir.join(".").join("a.json");
    let e =
        json::check_outputs(&[("--json", Some(&a)), ("--dump-params", Some(&dotted))]).unwrap_err();
    assert!(e.contains("--json and --dump-params"), "{e}");
    let e = parse(&["--json", dir.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("--json") && e.contains("is a folder"), "{e}");
    let missing = dir.join("no-such-folder").join("x.svg");
    let e = parse(&["--plot", missing.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("--plot") && e.contains("cannot write"), "{e}");
    assert!(parse(&["--json", a_str, "--plot", b_str]).is_ok());
    assert!(!a.exists() && !b.exists(), "the check left files behind");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "the probe left a file"
    );
    std::fs::write(&a, "kept").unwrap();
    assert!(parse(&["--json", a_str]).is_ok());
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "kept");
    std::fs::remove_dir_all(&dir).unwrap();
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
    // Reduce-scatter and all-to-all: size = a rank's whole input, in `nranks` blocks of a
    // multiple of 16 bytes each (as nccl-tests: 1000 B of f32 on 3 ranks is 3 x 80).
    let s = report::shape(ReduceScatter, 1000, DataType::F32, 3).unwrap();
    assert_eq!((s.bytes, s.count, s.send_count), (960, 240, 240));
    assert_eq!(report::out_count(ReduceScatter, &s, 3), 80);
    assert!(report::shape(AllToAll, 8, DataType::F32, 3).is_none());
    assert!(report::shape(AllToAll, 47, DataType::F32, 3).is_none());
    let s = report::shape(AllToAll, 48, DataType::I8, 3).unwrap();
    assert_eq!((s.bytes, s.count, s.send_count), (48, 48, 48));
    assert!(report::too_small(AllToAll).contains("16 bytes per rank"));
    let s = report::shape(Broadcast, 1001, DataType::F16, 3).unwrap();
    assert_eq!((s.bytes, s.count), (1000, 500));
    let (n, sc) = (3usize, 12u64);
    let f32_of = |b: u64| f32::from_bits(b as u32);
    let rs = reference(ReduceScatter, DataType::F32, Redop::Sum, n);
    // Rank 2's reduce-scatter output: block 2 summed.
    let want: f32 = (0..n).map(|r| f32_of(rs.input(r, 8 + 1))).sum();
    assert_eq!(rs.expected(2, sc, 1).map(f32_of), Some(want));
    // All-to-all: element 5 of rank 1's output is block 1 of rank 1 (5 / 4), element 1.
    let a2a = reference(AllToAll, DataType::F32, Redop::Sum, n);
    assert_eq!(a2a.expected(1, sc, 5), Some(a2a.input(1, 4 + 1)));
    let rooted = |c| Reference {
        root: 2,
        ..reference(c, DataType::F32, Redop::Sum, n)
    };
    assert_eq!(rooted(Broadcast).expected(0, sc, 3), Some(a2a.input(2, 3)));
    assert_eq!(rooted(Reduce).expected(1, sc, 3), None);
    let sr = reference(SendRecv, DataType::F32, Redop::Sum, n);
    assert_eq!(sr.expected(0, sc, 3), Some(sr.input(2, 3)));
    // Wrong elements are counted where something is expected.
    let got = vec![0f32; 4];
    assert_eq!(rooted(Reduce).count_wrong(Strictness::Exact, 1, 4, &got), 0);
    let b = rooted(Broadcast);
    assert_eq!(
        b.count_wrong(Strictness::Exact, 1, 4, &got),
        4 - (0..4).filter(|&i| b.input(2, i) == 0).count() as u64
    );
}

#[test]
fn host_memory_counts_the_machine_ranks_together() {
    use super::host_memory::{Need, amount};
    let need = Need {
        size: 16 << 30,
        per_rank: 80 << 30,
        ranks: 4,
    };
    // One rank's share fits; the four together do not.
    assert_eq!(Need { ranks: 1, ..need }.check(96 << 30), Ok(()));
    assert_eq!(need.check(320 << 30), Ok(()));
    let why = need.check(24 << 30).unwrap_err();
    for says in [
        "17179869184 bytes",
        "80.0 GiB of host memory per rank",
        "320.0 GiB for the 4 ranks",
        "MemAvailable 24.0 GiB",
    ] {
        assert!(why.contains(says), "{says:?}: {why}");
    }
    // No overflow on the largest sizes the parser takes.
    assert!(
        Need {
            per_rank: u128::MAX,
            ..need
        }
        .check(u64::MAX)
        .is_err()
    );
    assert_eq!(amount(1023), "1023 B");
    assert_eq!(amount(1536), "1.5 KiB");
    assert_eq!(amount(u128::from(u64::MAX)), "16.0 EiB");
}

#[test]
fn dev_shm_space_counts_the_machine_ranks_scratch_together() {
    use super::host_memory::check_shm;
    use crate::host::transport::shm::ShmSpace;
    let space = ShmSpace {
        size: 64 << 20,
        free: 60 << 20,
    };
    // One rank's scratch fits; two together do not.
    assert_eq!(check_shm(32 << 20, 1, space), Ok(()));
    let why = check_shm(32 << 20, 2, space).unwrap_err();
    for says in [
        "32.0 MiB per rank",
        "64.0 MiB for the 2 ranks",
        "/dev/shm holds 64.0 MiB with 60.0 MiB free",
        "--shm-size",
        "mount -o remount,size=",
        "MSCCLPP_COLL_SCRATCH_BYTES",
    ] {
        assert!(why.contains(says), "{says:?}: {why}");
    }
    assert!(check_shm(u128::MAX, usize::MAX, space).is_err());
}
