//! Reduce-scatter, reduce, broadcast and all-to-all over the Host transport, ranks as
//! threads of this process, across the LL limit and over several scratch rounds.

use super::Exec;
use half::{bf16, f16};

use super::super::kernel_table::SIZE_CLASSES;
use super::super::tests::{ranks, small, value};
use super::super::{CollConfig, Element};
use super::*;

trait Num: Element + PartialEq + std::fmt::Debug {
    fn from(v: f32) -> Self;
}
impl Num for f32 {
    fn from(v: f32) -> Self {
        v
    }
}
impl Num for f16 {
    fn from(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl Num for bf16 {
    fn from(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

fn cases<T: Num>(c: &Collectives, count: usize, call: u64, in_place: bool) {
    let (n, r) = (c.nranks(), c.rank());
    let v = |q: usize, i: usize| T::from(value(q, i, call));
    let sum = |i: usize| T::from((0..n).map(|q| value(q, i, call)).sum());
    let what = format!(
        "rank {r} of {n}: {:?} count {count} in_place {in_place}",
        T::DTYPE
    );
    // Reduce-scatter.
    let send: Vec<T> = (0..n * count).map(|i| v(r, i)).collect();
    let want: Vec<T> = (0..count).map(|i| sum(r * count + i)).collect();
    let got = if in_place {
        let mut b = send.clone();
        c.reduce_scatter_in_place(&mut b, ReduceOp::Sum, Exec::Host)
            .unwrap();
        b[r * count..(r + 1) * count].to_vec()
    } else {
        let mut out = vec![T::from(0.0); count];
        c.reduce_scatter(&send, &mut out, ReduceOp::Sum, Exec::Host)
            .unwrap();
        out
    };
    assert_eq!(got, want, "reduce_scatter {what}");
    // Reduce and broadcast, from every root.
    for root in 0..n {
        let send: Vec<T> = (0..count).map(|i| v(r, i)).collect();
        let mut out = if in_place {
            send.clone()
        } else {
            vec![T::from(99.0); count]
        };
        if in_place {
            c.reduce_in_place(&mut out, ReduceOp::Sum, root, Exec::Host)
                .unwrap();
        } else {
            c.reduce(&send, &mut out, ReduceOp::Sum, root, Exec::Host)
                .unwrap();
        }
        let want: Vec<T> = if r == root {
            (0..count).map(sum).collect()
        } else if in_place {
            send.clone()
        } else {
            vec![T::from(99.0); count]
        };
        assert_eq!(out, want, "reduce root {root} {what}");
        let mut out = if in_place {
            send.clone()
        } else {
            vec![T::from(0.0); count]
        };
        if in_place {
            c.broadcast_in_place(&mut out, root, Exec::Host).unwrap();
        } else {
            c.broadcast(&send, &mut out, root, Exec::Host).unwrap();
        }
        let want: Vec<T> = (0..count).map(|i| v(root, i)).collect();
        assert_eq!(out, want, "broadcast root {root} {what}");
    }
    // All-to-all (out of place; the raw GPU call takes send == recv).
    let send: Vec<T> = (0..n * count).map(|i| v(r, i)).collect();
    let mut out = vec![T::from(0.0); n * count];
    c.all_to_all(&send, &mut out, Exec::Host).unwrap();
    let want: Vec<T> = (0..n * count)
        .map(|i| v(i / count, r * count + i % count))
        .collect();
    assert_eq!(out, want, "all_to_all {what}");
}

#[test]
fn every_collective_matches_the_reference_across_the_ll_limit_and_scratch_rounds() {
    for n in [2, 3] {
        ranks(n, small(), |c| {
            let mut call = 0;
            // The LL limit is 2048 bytes per peer; the scratch slots hold
            // 1024 (two ranks) or 672 bytes (three) per round.
            for count in [1usize, 3, 255, 509, 510, 511, 512, 513, 1000, 1500] {
                for in_place in [false, true] {
                    call += 1;
                    cases::<f32>(&c, count, call, in_place);
                    cases::<f16>(&c, count, call, in_place);
                    cases::<bf16>(&c, count, call, in_place);
                }
            }
            // One limit for every collective (the rooted ones need no token packet: the
            // descriptor check orders their calls).
            assert!(c.takes_ll_path(2048));
            assert!(!c.takes_ll_path(2049));
        });
    }
}

#[test]
fn bad_arguments_are_refused_with_the_reason() {
    ranks(2, small(), |c| {
        let err = |e: CommError| e.to_string();
        let mut out = vec![0f32; 4];
        let e = err(c
            .reduce(&[1f32; 4], &mut out, ReduceOp::Sum, 2, Exec::Host)
            .unwrap_err());
        assert!(
            e.contains("root 2 is not a rank (there are 2 ranks)"),
            "{e}"
        );
        let e = err(c.broadcast_in_place(&mut out, 7, Exec::Host).unwrap_err());
        assert!(e.contains("root 7 is not a rank"), "{e}");
        let e = err(c
            .reduce_scatter(&[1f32; 7], &mut out, ReduceOp::Sum, Exec::Host)
            .unwrap_err());
        assert!(
            e.contains("send has 7 elements; 2 ranks x recv's 4 expected"),
            "{e}"
        );
        let e = err(c
            .reduce_scatter_in_place(&mut [1f32; 5], ReduceOp::Sum, Exec::Host)
            .unwrap_err());
        assert!(e.contains("5 elements are not 2 equal blocks"), "{e}");
        let e = err(c
            .all_to_all(&[1f32; 4], &mut [0f32; 6], Exec::Host)
            .unwrap_err());
        assert!(e.contains("send has 4 elements, recv 6"), "{e}");
        let e = err(c
            .all_to_all(&[1f32; 3], &mut [0f32; 3], Exec::Host)
            .unwrap_err());
        assert!(e.contains("3 elements are not 2 equal blocks"), "{e}");
        let e = err(c
            .broadcast(&[1f32; 3], &mut out, 0, Exec::Host)
            .unwrap_err());
        assert!(e.contains("send has 3 elements, recv 4"), "{e}");
        // Nothing was launched by the refused calls: a good one still works.
        c.broadcast_in_place(&mut out, 1, Exec::Host).unwrap();
        // Partial overlaps of the raw calls' ranges.
        let e = err(check_overlap("x", 0, 16, 8, 16, 0).unwrap_err());
        assert!(e.contains("overlap other than in place"), "{e}");
        assert!(check_overlap("x", 0, 32, 16, 16, 16).is_ok());
        assert!(check_overlap("x", 0, 16, 16, 16, 0).is_ok());
    });
}

#[test]
fn the_kernel_table_matches_its_index() {
    assert_eq!(TABLE.len(), 16);
    for (i, &d) in DataType::ALL.iter().enumerate() {
        assert_eq!(reduce_index(d), (i < 10).then_some(i), "{d}");
    }
    let names = ["reduce_scatter", "reduce"];
    for (k, kind) in [Kind::ReduceScatter, Kind::Reduce].into_iter().enumerate() {
        for &d in &DataType::ALL[..10] {
            let want = format!("{}_ll_{}", names[k], SIZE_CLASSES[size_class(d)]);
            assert_eq!(TABLE[kernel_index(kind, Path::Ll, d)].0, want);
            assert_eq!(
                TABLE[kernel_index(kind, Path::Put, d)].0,
                format!("{}_put", names[k])
            );
        }
    }
    for (kind, name) in [
        (Kind::Broadcast, "broadcast"),
        (Kind::AllToAll, "all_to_all"),
    ] {
        assert_eq!(
            TABLE[kernel_index(kind, Path::Ll, DataType::F16)].0,
            format!("{name}_ll")
        );
        assert_eq!(
            TABLE[kernel_index(kind, Path::Put, DataType::F32)].0,
            format!("{name}_put")
        );
    }
    assert_eq!(
        TABLE[kernel_index(Kind::Broadcast, Path::Pipe, DataType::U8)].0,
        "broadcast_pipe"
    );
    for &d in &DataType::ALL[..10] {
        assert_eq!(
            TABLE[kernel_index(Kind::Reduce, Path::Pipe, d)].0,
            "reduce_pipe"
        );
    }
}

/// [`small`] with pipelined broadcast and reduce: pieces of at least `piece` bytes, `depth`
/// in flight.
fn pipelined(piece: usize, depth: u32) -> CollConfig {
    CollConfig {
        broadcast_algo: super::super::RootedAlgo::Pipelined,
        reduce_algo: super::super::RootedAlgo::Pipelined,
        rooted_piece_bytes: piece,
        rooted_depth: depth,
        ..small()
    }
}

#[test]
fn pipelined_broadcast_and_reduce_match_the_reference_across_pieces_and_sub_slots() {
    use super::super::RootedAlgo;
    // Slots of 2048 bytes (broadcast) and 1024, 672 or 512 (reduce, 2-4 ranks): a call of a
    // few KB is cut into 8 or more pieces and reuses every sub-slot several times.
    for (n, piece, depth) in [(2, 16, 2), (3, 64, 3), (4, 16, 1), (2, 256, 4)] {
        ranks(n, pipelined(piece, depth), |c| {
            assert_eq!(c.rooted_algo(false, 1 << 20), RootedAlgo::Pipelined);
            assert_eq!(c.rooted_algo(true, 1 << 20), RootedAlgo::Pipelined);
            let mut call = 0;
            // Below and above the LL limit (2048 bytes); odd counts.
            for count in [3usize, 511, 513, 1001, 1500, 3333] {
                for in_place in [false, true] {
                    call += 1;
                    cases::<f32>(&c, count, call, in_place);
                    cases::<f16>(&c, count, call, in_place);
                    cases::<bf16>(&c, count, call, in_place);
                }
            }
        });
    }
}

#[test]
fn pipelined_reduce_applies_every_operation_in_rank_order() {
    ranks(3, pipelined(32, 2), |c| {
        let (n, r) = (c.nranks(), c.rank());
        for (k, op) in ReduceOp::ALL.into_iter().enumerate() {
            let v = |q: usize, i: usize| ((i * 37 + q * 11 + k * 5) % 23) as i64 - 11;
            for root in 0..n {
                // u8 (3001 bytes) and i32 (4004 bytes), above the LL limit.
                let send: Vec<u8> = (0..3001).map(|i| (v(r, i) + 11) as u8).collect();
                let mut out = vec![0u8; send.len()];
                c.reduce(&send, &mut out, op, root, Exec::Host).unwrap();
                if r == root {
                    for (i, &o) in out.iter().enumerate() {
                        let vals: Vec<i64> = (0..n).map(|q| v(q, i) + 11).collect();
                        let w = int_ref(op, &vals, |x| x as u8 as i64) as u8;
                        assert_eq!(o, w, "rank {r}: reduce u8 {op:?} root {root} [{i}]");
                    }
                }
                let mut buf: Vec<i32> = (0..1001).map(|i| v(r, i) as i32).collect();
                c.reduce_in_place(&mut buf, op, root, Exec::Host).unwrap();
                if r == root {
                    for (i, &o) in buf.iter().enumerate() {
                        let vals: Vec<i64> = (0..n).map(|q| v(q, i)).collect();
                        let w = int_ref(op, &vals, |x| x as i32 as i64) as i32;
                        assert_eq!(o, w, "rank {r}: reduce i32 {op:?} root {root} [{i}]");
                    }
                }
                // f64: non-integer values, so the rank order of the sum shows.
                let x = |q: usize, i: usize| (v(q, i) as f64 + 0.1) * 1.37e-3_f64.powi(q as i32);
                let send: Vec<f64> = (0..700).map(|i| x(r, i)).collect();
                let mut out = vec![0f64; 700];
                c.reduce(&send, &mut out, op, root, Exec::Host).unwrap();
                if r == root {
                    for (i, &o) in out.iter().enumerate() {
                        let acc = (1..n).fold(x(0, i), |a, q| match op {
                            ReduceOp::Prod => a * x(q, i),
                            ReduceOp::Min => a.min(x(q, i)),
                            ReduceOp::Max => a.max(x(q, i)),
                            _ => a + x(q, i),
                        });
                        let w = if op == ReduceOp::Avg {
                            acc / n as f64
                        } else {
                            acc
                        };
                        assert_eq!(
                            o.to_bits(),
                            w.to_bits(),
                            "rank {r}: reduce f64 {op:?} [{i}]"
                        );
                    }
                }
            }
        }
    });
}

#[test]
fn pipelined_and_rounds_calls_that_differ_fail_on_every_rank_naming_them() {
    use super::super::RootedAlgo;
    // Rank 0 pipelines, rank 1 goes in rounds: the descriptors name both.
    super::super::tests::ranks_with(
        2,
        |r| CollConfig {
            broadcast_algo: [RootedAlgo::Pipelined, RootedAlgo::Rounds][r],
            reduce_algo: [RootedAlgo::Pipelined, RootedAlgo::Auto][r],
            ..small()
        },
        |c| {
            let r = c.rank();
            let err = |res: Result<(), CommError>| match res {
                Err(CommError::CallMismatch(m)) => m,
                other => panic!("rank {r}: {other:?}"),
            };
            let mut buf = vec![r as u8; 3000];
            let m = err(c.broadcast_in_place(&mut buf, 0, Exec::Host));
            assert!(
                m.contains("broadcast from root 0 of 3000 u8 (pipelined)")
                    && m.contains("broadcast from root 0 of 3000 u8 (put)"),
                "{m}"
            );
            let mut buf = vec![1.0f32; 1000];
            let m = err(c.reduce_in_place(&mut buf, ReduceOp::Max, 1, Exec::Host));
            assert!(
                m.contains("reduce (max) to root 1 with 1000 f32 (pipelined)")
                    && m.contains("(put)"),
                "{m}"
            );
            // Below the LL size both take LL packets and agree.
            let mut buf = vec![r as u8 + 1; 100];
            c.broadcast_in_place(&mut buf, 1, Exec::Host).unwrap();
            assert!(buf.iter().all(|&x| x == 2));
        },
    );
    // Both pipelined, different sizes.
    ranks(2, pipelined(16, 2), |c| {
        let r = c.rank();
        let mut buf = vec![1.0f32; [1000, 1200][r]];
        match c.reduce_in_place(&mut buf, ReduceOp::Sum, 0, Exec::Host) {
            Err(CommError::CallMismatch(m)) => assert!(
                m.contains("1000 f32 (pipelined)") && m.contains("1200 f32 (pipelined)"),
                "{m}"
            ),
            other => panic!("rank {r}: {other:?}"),
        }
        // Usable afterwards.
        let mut buf = vec![r as u8 + 1; 5000];
        c.broadcast_in_place(&mut buf, 1, Exec::Host).unwrap();
        assert!(buf.iter().all(|&x| x == 2));
    });
}

#[test]
fn rooted_algorithm_names_parse() {
    use super::super::RootedAlgo;
    use crate::settings::Settings;
    let p = |v: &str| Settings::from_vars([("MSCCLPP_REDUCE_ALGO", v)]).map(|s| s.reduce_algo);
    assert_eq!(p("pipelined").unwrap(), RootedAlgo::Pipelined);
    assert_eq!(p(" Rounds ").unwrap(), RootedAlgo::Rounds);
    assert_eq!(p("auto").unwrap(), RootedAlgo::Auto);
    assert_eq!(p("").unwrap(), RootedAlgo::Auto);
    let e = p("chain").unwrap_err().to_string();
    assert!(
        e.contains("MSCCLPP_REDUCE_ALGO=\"chain\": expected auto, rounds or pipelined"),
        "{e}"
    );
    let bad = CollConfig {
        rooted_depth: 9,
        ..CollConfig::default()
    };
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("rooted_depth 9")
    );
}

/// `op` over the ranks' values, as the library defines it (integers wrap; average divides
/// the wrapped sum once).
fn int_ref(op: ReduceOp, vals: &[i64], wrap: impl Fn(i64) -> i64) -> i64 {
    let acc = vals[1..].iter().fold(vals[0], |a, &b| {
        wrap(match op {
            ReduceOp::Prod => a.wrapping_mul(b),
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
            _ => a.wrapping_add(b),
        })
    });
    if op == ReduceOp::Avg {
        acc / vals.len() as i64
    } else {
        acc
    }
}

#[test]
fn every_operation_reaches_the_kernels_for_new_types() {
    ranks(3, small(), |c| {
        let (n, r) = (c.nranks(), c.rank());
        for (k, op) in ReduceOp::ALL.into_iter().enumerate() {
            // Across the LL limit (2048 bytes) and over scratch rounds.
            for count in [5usize, 700] {
                let v = |q: usize, i: usize| ((i * 37 + q * 11 + k * 5) % 23) as i64 - 11;
                // i32 all-reduce and reduce-scatter.
                let send: Vec<i32> = (0..n * count).map(|i| v(r, i) as i32).collect();
                let want = |i: usize| {
                    let vals: Vec<i64> = (0..n).map(|q| v(q, i)).collect();
                    int_ref(op, &vals, |x| x as i32 as i64) as i32
                };
                let mut out = vec![0i32; n * count];
                c.all_reduce(&send, &mut out, op, Exec::Host).unwrap();
                assert!(
                    (0..n * count).all(|i| out[i] == want(i)),
                    "rank {r}: all_reduce i32 {op:?} count {count}"
                );
                let mut part = vec![0i32; count];
                c.reduce_scatter(&send, &mut part, op, Exec::Host).unwrap();
                assert!(
                    (0..count).all(|i| part[i] == want(r * count + i)),
                    "rank {r}: reduce_scatter i32 {op:?} count {count}"
                );
                // u8 reduce to the last rank (wrapping products and sums).
                let send: Vec<u8> = (0..count).map(|i| (v(r, i) + 11) as u8).collect();
                let mut out = vec![0u8; count];
                c.reduce(&send, &mut out, op, n - 1, Exec::Host).unwrap();
                if r == n - 1 {
                    for (i, &o) in out.iter().enumerate() {
                        let vals: Vec<i64> = (0..n).map(|q| v(q, i) + 11).collect();
                        let w = int_ref(op, &vals, |x| x as u8 as i64) as u8;
                        assert_eq!(o, w, "rank {r}: reduce u8 {op:?} [{i}]");
                    }
                }
                // f64 in place: small integers, exact; average divides once.
                let mut buf: Vec<f64> = (0..count).map(|i| v(r, i) as f64).collect();
                c.all_reduce_in_place(&mut buf, op, Exec::Host).unwrap();
                for (i, &b) in buf.iter().enumerate() {
                    let vals: Vec<f64> = (0..n).map(|q| v(q, i) as f64).collect();
                    let acc = vals[1..].iter().fold(vals[0], |a, &x| match op {
                        ReduceOp::Prod => a * x,
                        ReduceOp::Min => a.min(x),
                        ReduceOp::Max => a.max(x),
                        _ => a + x,
                    });
                    let w = if op == ReduceOp::Avg {
                        acc / n as f64
                    } else {
                        acc
                    };
                    assert_eq!(b, w, "rank {r}: all_reduce f64 {op:?} [{i}]");
                }
            }
        }
        // fp8 is reduced too (staged in f32): `staged_tests.rs`.
    });
}

#[test]
fn mismatched_reduce_scatter_broadcast_and_reduce_fail_on_every_rank_naming_them() {
    ranks(2, small(), |c| {
        let r = c.rank();
        let err = |res: Result<(), CommError>| match res {
            Err(CommError::CallMismatch(m)) => m,
            other => panic!("rank {r}: {other:?}"),
        };
        // Reduce-scatter sizes, on the LL path (20, 30 f32) and the put path.
        for (a, b) in [(20usize, 30usize), (700, 900)] {
            let count = [a, b][r];
            let send = vec![1.0f32; 2 * count];
            let mut recv = vec![0.0f32; count];
            let m = err(c.reduce_scatter(&send, &mut recv, ReduceOp::Sum, Exec::Host));
            assert!(
                m.contains(&format!("reduce_scatter (sum) of {a} f32 per rank")),
                "{m}"
            );
            assert!(
                m.contains(&format!("reduce_scatter (sum) of {b} f32 per rank")),
                "{m}"
            );
        }
        // Reduce-scatter operations.
        let (send, mut recv) = (vec![1.0f32; 64], vec![0.0f32; 32]);
        let op = [ReduceOp::Sum, ReduceOp::Max][r];
        let m = err(c.reduce_scatter(&send, &mut recv, op, Exec::Host));
        assert!(m.contains("(sum)") && m.contains("(max)"), "{m}");
        // Broadcast roots, LL and put.
        for len in [100usize, 3000] {
            let mut buf = vec![r as u8; len];
            let m = err(c.broadcast_in_place(&mut buf, r, Exec::Host));
            assert!(
                m.contains(&format!("broadcast from root 0 of {len} u8"))
                    && m.contains(&format!("broadcast from root 1 of {len} u8")),
                "{m}"
            );
        }
        // Reduce roots.
        let mut buf = vec![1.0f32; 50];
        let m = err(c.reduce_in_place(&mut buf, ReduceOp::Sum, r, Exec::Host));
        assert!(
            m.contains("reduce (sum) to root 0") && m.contains("to root 1"),
            "{m}"
        );
        // Usable afterwards.
        let mut buf = vec![r as u8 + 1; 3000];
        c.broadcast_in_place(&mut buf, 1, Exec::Host).unwrap();
        assert!(buf.iter().all(|&x| x == 2));
        let send = vec![1.0f32; 2 * 700];
        let mut recv = vec![0.0f32; 700];
        c.reduce_scatter(&send, &mut recv, ReduceOp::Sum, Exec::Host)
            .unwrap();
        assert!(recv.iter().all(|&x| x == 2.0));
    });
}

/// The host launches the LL path's kernels with programmatic dependent launch, which is
/// correct only for kernels that wait for the previous kernel first
/// (`dependent_launch_entry`, added to the `*_ll` entries only): every kernel the LL path
/// picks must be one of those, and no other path may pick one.
#[test]
fn only_ll_kernels_are_launched_as_dependent() {
    for kind in [
        Kind::ReduceScatter,
        Kind::Reduce,
        Kind::Broadcast,
        Kind::AllToAll,
    ] {
        for path in [Path::Ll, Path::Put, Path::Pipe] {
            if path == Path::Pipe && !matches!(kind, Kind::Broadcast | Kind::Reduce) {
                continue;
            }
            for dtype in DataType::ALL {
                if path == Path::Ll
                    && matches!(kind, Kind::ReduceScatter | Kind::Reduce)
                    && reduce_index(dtype).is_none()
                {
                    continue;
                }
                let name = TABLE[kernel_index(kind, path, dtype)].0;
                assert_eq!(
                    name.contains("_ll"),
                    path == Path::Ll,
                    "{kind:?} {path:?} {dtype:?} picks {name}"
                );
            }
        }
    }
}

#[test]
fn auto_pipelines_broadcast_and_reduce_only_above_8_mib() {
    use super::super::{ROOTED_PIPELINED_ABOVE, RootedAlgo};
    ranks(2, small(), |c| {
        for reduce in [false, true] {
            assert_eq!(c.rooted_algo(reduce, 4096), RootedAlgo::Rounds);
            assert_eq!(
                c.rooted_algo(reduce, ROOTED_PIPELINED_ABOVE),
                RootedAlgo::Rounds
            );
            assert_eq!(
                c.rooted_algo(reduce, ROOTED_PIPELINED_ABOVE + 1),
                RootedAlgo::Pipelined
            );
        }
    });
    // A configured algorithm wins at every size.
    let config = CollConfig {
        broadcast_algo: RootedAlgo::Rounds,
        reduce_algo: RootedAlgo::Pipelined,
        ..small()
    };
    ranks(2, config, |c| {
        assert_eq!(c.rooted_algo(false, 1 << 30), RootedAlgo::Rounds);
        assert_eq!(c.rooted_algo(true, 16), RootedAlgo::Pipelined);
    });
}
