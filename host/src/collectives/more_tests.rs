//! Reduce-scatter, reduce, broadcast and all-to-all over the Host transport, ranks as
//! threads of this process, across the LL limit and over several scratch rounds.

use half::{bf16, f16};

use super::super::tests::{ranks, small};
use super::*;

/// Small integers (exact sums in every type) from rank, index and call.
fn value(rank: usize, i: usize, call: u64) -> f32 {
    let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ call << 20 ^ (rank as u64) << 44;
    ((h >> 31) % 15) as f32 - 7.0
}

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
        c.reduce_scatter_host_in_place(&mut b, ReduceOp::Sum)
            .unwrap();
        b[r * count..(r + 1) * count].to_vec()
    } else {
        let mut out = vec![T::from(0.0); count];
        c.reduce_scatter_host(&send, &mut out, ReduceOp::Sum)
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
            c.reduce_host_in_place(&mut out, ReduceOp::Sum, root)
                .unwrap();
        } else {
            c.reduce_host(&send, &mut out, ReduceOp::Sum, root).unwrap();
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
            c.broadcast_host_in_place(&mut out, root).unwrap();
        } else {
            c.broadcast_host(&send, &mut out, root).unwrap();
        }
        let want: Vec<T> = (0..count).map(|i| v(root, i)).collect();
        assert_eq!(out, want, "broadcast root {root} {what}");
    }
    // All-to-all (out of place; the raw GPU call takes send == recv).
    let send: Vec<T> = (0..n * count).map(|i| v(r, i)).collect();
    let mut out = vec![T::from(0.0); n * count];
    c.all_to_all_host(&send, &mut out).unwrap();
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
            assert!(c.more_ll(2048));
            assert!(!c.more_ll(2049));
        });
    }
}

#[test]
fn bad_arguments_are_refused_with_the_reason() {
    ranks(2, small(), |c| {
        let err = |e: CommError| e.to_string();
        let mut out = vec![0f32; 4];
        let e = err(c
            .reduce_host(&[1f32; 4], &mut out, ReduceOp::Sum, 2)
            .unwrap_err());
        assert!(
            e.contains("root 2 is not a rank (there are 2 ranks)"),
            "{e}"
        );
        let e = err(c.broadcast_host_in_place(&mut out, 7).unwrap_err());
        assert!(e.contains("root 7 is not a rank"), "{e}");
        let e = err(c
            .reduce_scatter_host(&[1f32; 7], &mut out, ReduceOp::Sum)
            .unwrap_err());
        assert!(
            e.contains("send has 7 elements; 2 ranks x recv's 4 expected"),
            "{e}"
        );
        let e = err(c
            .reduce_scatter_host_in_place(&mut [1f32; 5], ReduceOp::Sum)
            .unwrap_err());
        assert!(e.contains("5 elements are not 2 equal blocks"), "{e}");
        let e = err(c.all_to_all_host(&[1f32; 4], &mut [0f32; 6]).unwrap_err());
        assert!(e.contains("send has 4 elements, recv 6"), "{e}");
        let e = err(c.all_to_all_host(&[1f32; 3], &mut [0f32; 3]).unwrap_err());
        assert!(e.contains("3 elements are not 2 equal blocks"), "{e}");
        let e = err(c.broadcast_host(&[1f32; 3], &mut out, 0).unwrap_err());
        assert!(e.contains("send has 3 elements, recv 4"), "{e}");
        // Nothing was launched by the refused calls: a good one still works.
        c.broadcast_host_in_place(&mut out, 1).unwrap();
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
                c.reduce_host(&send, &mut out, op, root).unwrap();
                if r == root {
                    for (i, &o) in out.iter().enumerate() {
                        let vals: Vec<i64> = (0..n).map(|q| v(q, i) + 11).collect();
                        let w = int_ref(op, &vals, |x| x as u8 as i64) as u8;
                        assert_eq!(o, w, "rank {r}: reduce u8 {op:?} root {root} [{i}]");
                    }
                }
                let mut buf: Vec<i32> = (0..1001).map(|i| v(r, i) as i32).collect();
                c.reduce_host_in_place(&mut buf, op, root).unwrap();
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
                c.reduce_host(&send, &mut out, op, root).unwrap();
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
            let m = err(c.broadcast_host_in_place(&mut buf, 0));
            assert!(
                m.contains("broadcast from root 0 of 3000 u8 (pipelined)")
                    && m.contains("broadcast from root 0 of 3000 u8 (put)"),
                "{m}"
            );
            let mut buf = vec![1.0f32; 1000];
            let m = err(c.reduce_host_in_place(&mut buf, ReduceOp::Max, 1));
            assert!(
                m.contains("reduce (max) to root 1 with 1000 f32 (pipelined)")
                    && m.contains("(put)"),
                "{m}"
            );
            // Below the LL size both take LL packets and agree.
            let mut buf = vec![r as u8 + 1; 100];
            c.broadcast_host_in_place(&mut buf, 1).unwrap();
            assert!(buf.iter().all(|&x| x == 2));
        },
    );
    // Both pipelined, different sizes.
    ranks(2, pipelined(16, 2), |c| {
        let r = c.rank();
        let mut buf = vec![1.0f32; [1000, 1200][r]];
        match c.reduce_host_in_place(&mut buf, ReduceOp::Sum, 0) {
            Err(CommError::CallMismatch(m)) => assert!(
                m.contains("1000 f32 (pipelined)") && m.contains("1200 f32 (pipelined)"),
                "{m}"
            ),
            other => panic!("rank {r}: {other:?}"),
        }
        // Usable afterwards.
        let mut buf = vec![r as u8 + 1; 5000];
        c.broadcast_host_in_place(&mut buf, 1).unwrap();
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

#[test]
fn sends_and_receives_match_in_order_alone_and_grouped() {
    for n in [2, 3] {
        ranks(n, small(), |c| {
            let (n, r) = (c.nranks(), c.rank());
            let data = |from: usize, to: usize, k: usize, len: usize| -> Vec<f32> {
                (0..len)
                    .map(|i| value(from, i + 7 * to, k as u64))
                    .collect()
            };
            // Sizes below and far above the p2p slot (1 KiB: 16-byte chunks).
            for (k, len) in [1usize, 5, 256, 1000, 4099].into_iter().enumerate() {
                // A ring in one group.
                let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                let out = data(r, next, k, len);
                let mut got = vec![0f32; len];
                let ops = [
                    P2pOp::Recv {
                        buf: got.as_mut_ptr() as u64,
                        count: len,
                        dtype: DataType::F32,
                        peer: prev,
                    },
                    P2pOp::Send {
                        buf: out.as_ptr() as u64,
                        count: len,
                        dtype: DataType::F32,
                        peer: next,
                    },
                ];
                // SAFETY: both vectors live across the call.
                unsafe { c.group_host(&ops) }.unwrap();
                assert_eq!(got, data(prev, r, k, len), "rank {r} ring len {len}");
                // Rank 0 sends to every other rank alone, twice; they receive alone.
                if r == 0 {
                    for p in 1..n {
                        c.send_host(&data(0, p, k, len), p).unwrap();
                        c.send_host(&data(0, p, k + 100, len + 1), p).unwrap();
                    }
                } else {
                    let mut a = vec![0f32; len];
                    let mut b = vec![0f32; len + 1];
                    c.recv_host(&mut a, 0).unwrap();
                    c.recv_host(&mut b, 0).unwrap();
                    assert_eq!(a, data(0, r, k, len), "rank {r} first of two, len {len}");
                    assert_eq!(
                        b,
                        data(0, r, k + 100, len + 1),
                        "rank {r} second, len {len}"
                    );
                }
            }
            let e = c.send_host(&[1f32; 3], r).unwrap_err().to_string();
            assert!(e.contains("the own rank"), "{e}");
            let e = c.recv_host(&mut [1f32; 3], n).unwrap_err().to_string();
            assert!(
                e.contains(&format!("receive from rank {n}, which is not a rank")),
                "{e}"
            );
            let op = P2pOp::Send {
                buf: 0,
                count: 0,
                dtype: DataType::F16,
                peer: (r + 1) % n,
            };
            // SAFETY: refused before any access.
            let e = unsafe { c.group_host(&[op; 17]) }.unwrap_err().to_string();
            assert!(e.contains("17 operations; at most 16"), "{e}");
            // Two receives over one range are refused.
            let mut buf = vec![0f32; 8];
            let p = buf.as_mut_ptr() as u64;
            let recv = |buf, count| P2pOp::Recv {
                buf,
                count,
                dtype: DataType::F32,
                peer: (r + n - 1) % n,
            };
            // SAFETY: refused before any access.
            let e = unsafe { c.group_host(&[recv(p, 8), recv(p + 4, 2)]) }
                .unwrap_err()
                .to_string();
            assert!(e.contains("overlaps the receive from rank"), "{e}");
            // In place (a receive over the data being sent, as nccl-tests' sendrecv in
            // place): the send is staged, so the receive gets the peer's data and the peer
            // gets this rank's data as it was before the call; below and above the LL limit.
            for len in [8usize, 3000] {
                let mine = |q: usize, i: usize| (q * 1000 + i) as f32;
                let mut buf: Vec<f32> = (0..len).map(|i| mine(r, i)).collect();
                let p = buf.as_mut_ptr() as u64;
                let ops = [
                    P2pOp::Send {
                        buf: p,
                        count: len,
                        dtype: DataType::F32,
                        peer: (r + 1) % n,
                    },
                    recv(p, len),
                ];
                // SAFETY: buf holds len elements for the call.
                unsafe { c.group_host(&ops) }.unwrap();
                let from = (r + n - 1) % n;
                assert!(
                    (0..len).all(|i| buf[i] == mine(from, i)),
                    "rank {r}: in-place exchange of {len}"
                );
            }
        });
    }
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
                c.all_reduce_host(&send, &mut out, op).unwrap();
                assert!(
                    (0..n * count).all(|i| out[i] == want(i)),
                    "rank {r}: all_reduce i32 {op:?} count {count}"
                );
                let mut part = vec![0i32; count];
                c.reduce_scatter_host(&send, &mut part, op).unwrap();
                assert!(
                    (0..count).all(|i| part[i] == want(r * count + i)),
                    "rank {r}: reduce_scatter i32 {op:?} count {count}"
                );
                // u8 reduce to the last rank (wrapping products and sums).
                let send: Vec<u8> = (0..count).map(|i| (v(r, i) + 11) as u8).collect();
                let mut out = vec![0u8; count];
                c.reduce_host(&send, &mut out, op, n - 1).unwrap();
                if r == n - 1 {
                    for (i, &o) in out.iter().enumerate() {
                        let vals: Vec<i64> = (0..n).map(|q| v(q, i) + 11).collect();
                        let w = int_ref(op, &vals, |x| x as u8 as i64) as u8;
                        assert_eq!(o, w, "rank {r}: reduce u8 {op:?} [{i}]");
                    }
                }
                // f64 in place: small integers, exact; average divides once.
                let mut buf: Vec<f64> = (0..count).map(|i| v(r, i) as f64).collect();
                c.all_reduce_host_in_place(&mut buf, op).unwrap();
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
            let m = err(c.reduce_scatter_host(&send, &mut recv, ReduceOp::Sum));
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
        let m = err(c.reduce_scatter_host(&send, &mut recv, op));
        assert!(m.contains("(sum)") && m.contains("(max)"), "{m}");
        // Broadcast roots, LL and put.
        for len in [100usize, 3000] {
            let mut buf = vec![r as u8; len];
            let m = err(c.broadcast_host_in_place(&mut buf, r));
            assert!(
                m.contains(&format!("broadcast from root 0 of {len} u8"))
                    && m.contains(&format!("broadcast from root 1 of {len} u8")),
                "{m}"
            );
        }
        // Reduce roots.
        let mut buf = vec![1.0f32; 50];
        let m = err(c.reduce_host_in_place(&mut buf, ReduceOp::Sum, r));
        assert!(
            m.contains("reduce (sum) to root 0") && m.contains("to root 1"),
            "{m}"
        );
        // Usable afterwards.
        let mut buf = vec![r as u8 + 1; 3000];
        c.broadcast_host_in_place(&mut buf, 1).unwrap();
        assert!(buf.iter().all(|&x| x == 2));
        let send = vec![1.0f32; 2 * 700];
        let mut recv = vec![0.0f32; 700];
        c.reduce_scatter_host(&send, &mut recv, ReduceOp::Sum)
            .unwrap();
        assert!(recv.iter().all(|&x| x == 2.0));
    });
}

/// A send and a receive of no elements are a transfer (as NCCL's since 2.12.10, which
/// programs use to synchronise): the receive returns only once the peer's send was posted,
/// alone and in a group, and the pair's later transfers still match. Before, both returned
/// at once.
#[test]
fn transfers_of_no_elements_wait_for_the_peer() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Rank 0's sends of none so far, raised just before each.
    let sends = AtomicUsize::new(0);
    ranks(2, small(), |c| {
        let r = c.rank();
        let peer = 1 - r;
        // A send and a receive of none with the peer, in one group.
        let both = [
            P2pOp::Send {
                buf: 0,
                count: 0,
                dtype: DataType::F32,
                peer,
            },
            P2pOp::Recv {
                buf: 0,
                count: 0,
                dtype: DataType::F32,
                peer,
            },
        ];
        for k in 1..=2 {
            if r == 0 {
                // Long enough that a receive that does not wait finds the count short.
                std::thread::sleep(std::time::Duration::from_millis(300));
                sends.store(k, Ordering::SeqCst);
            }
            if k == 1 && r == 0 {
                c.send_host(&[0f32; 0], peer).unwrap();
            } else if k == 1 {
                c.recv_host(&mut [0f32; 0], peer).unwrap();
            } else {
                // SAFETY: no bytes: nothing is read or written.
                unsafe { c.group_host(&both) }.unwrap();
            }
            if r == 1 {
                assert_eq!(
                    sends.load(Ordering::SeqCst),
                    k,
                    "rank 1: receive of none #{k} returned before rank 0 sent it"
                );
            }
        }
        // The pair's next transfers match: one of data each way.
        let out: Vec<f32> = (0..5).map(|i| value(r, i, 3)).collect();
        let mut got = vec![0f32; 5];
        if r == 0 {
            c.send_host(&out, 1).unwrap();
            c.recv_host(&mut got, 1).unwrap();
        } else {
            c.recv_host(&mut got, 0).unwrap();
            c.send_host(&out, 0).unwrap();
        }
        let want: Vec<f32> = (0..5).map(|i| value(1 - r, i, 3)).collect();
        assert_eq!(got, want, "rank {r}: the transfer after those of none");
        // A receive of none whose address lies inside another receive's range overlaps
        // nothing (all-to-all-v code passes such addresses for zero counts).
        let mut got = vec![0f32; 5];
        let p = got.as_mut_ptr() as u64;
        let op = |buf, count| {
            if r == 0 {
                P2pOp::Send {
                    buf,
                    count,
                    dtype: DataType::F32,
                    peer,
                }
            } else {
                P2pOp::Recv {
                    buf,
                    count,
                    dtype: DataType::F32,
                    peer,
                }
            }
        };
        let out: Vec<f32> = (0..5).map(|i| value(0, i, 4)).collect();
        let first = if r == 0 { out.as_ptr() as u64 } else { p };
        // SAFETY: both vectors live across the call; the second operation has no bytes.
        unsafe { c.group_host(&[op(first, 5), op(first + 8, 0)]) }
            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
        if r == 1 {
            assert_eq!(got, out, "rank 1: beside a receive of none inside it");
        }
    });
}

/// Send/recv mismatches over two host ranks (`small()`: LL up to 1024 bytes, above in 16-byte
/// pieces): rank 0 sends `sent` f32 to rank 1, which receives `want`.
mod p2p_mismatch {
    use super::*;

    fn data(k: usize, len: usize) -> Vec<f32> {
        (0..len).map(|i| value(0, i, k as u64)).collect()
    }

    fn mismatch_text(r: usize, res: Result<(), CommError>) -> String {
        match res {
            Err(CommError::CallMismatch(m)) => m,
            other => panic!("rank {r}: expected a CallMismatch, got {other:?}"),
        }
    }

    /// One transfer from rank 0 to rank 1 of `sent` / `want` f32 (rank 1 checks the data
    /// when they are equal); the call's result.
    fn one_way(c: &Collectives, sent: usize, want: usize, k: usize) -> Result<(), CommError> {
        if c.rank() == 0 {
            c.send_host(&data(k, sent), 1)
        } else {
            let mut got = vec![0f32; want];
            let res = c.recv_host(&mut got, 0);
            if res.is_ok() {
                assert_eq!(got, data(k, want), "rank 1: transfer {k} of {want} f32");
            }
            res
        }
    }

    /// Matching transfers after a mismatch: LL and pipelined, both directions, in one group
    /// and alone; all must arrive intact. `earlier`: the text rank 0's first send must report
    /// (an LL send's mismatch, learnt at its next send).
    fn still_usable(c: &Collectives, earlier: Option<&str>) {
        let r = c.rank();
        c.communicator().bootstrap().barrier().unwrap();
        let res = one_way(c, 50, 50, 900);
        match (r, earlier) {
            (0, Some(text)) => {
                let m = mismatch_text(r, res);
                assert!(
                    m.contains(text) && m.contains("learnt it from a note"),
                    "{m}"
                );
            }
            _ => res.unwrap(),
        }
        for (k, len) in [(901, 700usize), (902, 3), (903, 256), (904, 2000)] {
            one_way(c, len, len, k).unwrap();
            let out: Vec<f32> = (0..len).map(|i| value(r, i, k as u64)).collect();
            let mut got = vec![0f32; len];
            let peer = 1 - r;
            let ops = [
                P2pOp::Recv {
                    buf: got.as_mut_ptr() as u64,
                    count: len,
                    dtype: DataType::F32,
                    peer,
                },
                P2pOp::Send {
                    buf: out.as_ptr() as u64,
                    count: len,
                    dtype: DataType::F32,
                    peer,
                },
            ];
            // SAFETY: both vectors live across the call.
            unsafe { c.group_host(&ops) }.unwrap();
            let want: Vec<f32> = (0..len).map(|i| value(peer, i, k as u64)).collect();
            assert_eq!(got, want, "rank {r}: exchange {k} of {len}");
        }
    }

    /// Rank 0 sends `sent` f32, rank 1 expects `want`: the receiver reports it at once, the
    /// sender at once when it waited for the receiver (pipelined) and at its next send when
    /// it did not (LL); then the pair works.
    fn case(sent: usize, want: usize) {
        ranks(2, small(), |c| {
            let r = c.rank();
            let text = format!(
                "rank 0 sent {} bytes to rank 1, which expected {}",
                4 * sent,
                4 * want
            );
            let ll_sender = 4 * sent <= small().p2p_packet_max_bytes;
            let res = one_way(&c, sent, want, 1);
            // An LL sender reports it once: at the end of this send if the receiver's note
            // is already there, else at its next send.
            let mut later = None;
            if r == 1 || !ll_sender || res.is_err() {
                let m = mismatch_text(r, res);
                assert!(m.contains(&text), "rank {r}: {m}");
                assert!(m.contains("stay usable"), "rank {r}: {m}");
            } else {
                later = Some(text.as_str());
            }
            still_usable(&c, later);
        });
    }

    #[test]
    fn ll_send_to_a_smaller_receive_is_reported_on_both_sides() {
        case(100, 60);
    }

    #[test]
    fn ll_send_to_a_larger_receive_is_reported_without_a_timeout() {
        case(60, 100);
    }

    #[test]
    fn pipelined_sends_and_receives_of_different_sizes_fail_on_both_sides() {
        case(1000, 1500);
        case(1500, 1000);
    }

    #[test]
    fn a_send_and_a_receive_on_different_paths_are_reported() {
        // LL send (800 bytes), pipelined receive (2000), and the other way round.
        case(200, 500);
        case(500, 200);
    }

    /// A transfer of no elements against one of some (NCCL's zero-byte sends and receives
    /// are transfers since 2.12.10): reported like any other size, the pair in step after.
    /// Before, the send or receive of none was skipped, so the other side's transfer paired
    /// with the next one (or waited out the device timeout).
    #[test]
    fn a_transfer_of_no_elements_against_one_of_some_is_reported() {
        case(0, 60);
        case(60, 0);
        // Against the pipelined path (1000 f32 = 4000 bytes > 1024).
        case(0, 1000);
        case(1000, 0);
    }

    #[test]
    fn a_mismatch_inside_a_group_fails_that_transfer_only() {
        ranks(2, small(), |c| {
            let r = c.rank();
            // Rank 0 -> 1 matches (300 f32, LL); rank 1 -> 0 does not (2000 f32 sent, 1000
            // expected, pipelined).
            let (sent, want) = ([300usize, 2000][r], [1000usize, 300][r]);
            let out: Vec<f32> = (0..sent).map(|i| value(r, i, 7)).collect();
            let mut got = vec![0f32; want];
            let peer = 1 - r;
            let ops = [
                P2pOp::Send {
                    buf: out.as_ptr() as u64,
                    count: sent,
                    dtype: DataType::F32,
                    peer,
                },
                P2pOp::Recv {
                    buf: got.as_mut_ptr() as u64,
                    count: want,
                    dtype: DataType::F32,
                    peer,
                },
            ];
            // SAFETY: both vectors live across the call.
            let m = mismatch_text(r, unsafe { c.group_host(&ops) });
            assert!(
                m.contains("rank 1 sent 8000 bytes to rank 0, which expected 4000"),
                "rank {r}: {m}"
            );
            if r == 1 {
                let from0: Vec<f32> = (0..300).map(|i| value(0, i, 7)).collect();
                assert_eq!(got, from0, "rank 1: the matching transfer of the group");
            }
            still_usable(&c, None);
        });
    }
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

#[test]
fn ll_only_groups_launch_smaller_blocks_and_other_groups_the_configured_size() {
    use mscclpp_device::collectives::send_recv::{P2pOp as Op, P2pOps};
    let ops = |sizes: &[u64]| {
        let mut o = P2pOps {
            count: sizes.len() as u32,
            ll_max: 512 << 10,
            ll_blocks: 16,
            ll_row: 512,
            ..P2pOps::default()
        };
        for (i, &bytes) in sizes.iter().enumerate() {
            o.ops[i] = Op {
                bytes,
                peer: 1,
                send: (i % 2) as u32,
                ..Op::default()
            };
        }
        o
    };
    // 8 B and 32 KB (256 units per block): 128 threads, as measured; 128 KB (1024 units per
    // block): the configured 512; the largest transfer of the group decides.
    assert_eq!(super::p2p_threads(&ops(&[8, 8]), 512), (128, true));
    assert_eq!(super::p2p_threads(&ops(&[32 << 10, 8]), 512), (128, true));
    assert_eq!(super::p2p_threads(&ops(&[8, 64 << 10]), 512), (256, true));
    assert_eq!(super::p2p_threads(&ops(&[128 << 10]), 512), (512, true));
    assert_eq!(super::p2p_threads(&ops(&[512 << 10]), 512), (512, true));
    // A transfer above the LL size: the configured size, not LL-only (a plain launch);
    // never more than configured.
    assert_eq!(
        super::p2p_threads(&ops(&[8, (512 << 10) + 1]), 512),
        (512, false)
    );
    assert_eq!(super::p2p_threads(&ops(&[8]), 64), (64, true));
}

/// A send/receive group's grid (every lane of every peer with its blocks) fits under the cap
/// that ranks sharing a GPU each get, so all their kernels are resident at once (four ranks
/// on one H200 hung in nccl-tests' alltoallv with 126 blocks each against a cap of 33); on
/// a GPU of its own a rank keeps its 128 blocks shared among the lanes.
#[test]
fn send_recv_groups_fit_under_the_shared_gpu_cap() {
    for nranks in [2usize, 3, 4, 8, 16, 64] {
        let lanes = 2 * (nranks as u32 - 1);
        for sharing in [1u32, 2, 4, 8] {
            let cap = super::super::share_cap(sharing, 132);
            let per = p2p_transfer_blocks(nranks, cap, u32::MAX);
            assert!((1..=P2P_MAX_BLOCKS).contains(&per), "{nranks} ranks: {per}");
            if lanes <= cap.min(128) {
                assert!(
                    lanes * per <= cap.min(128),
                    "{nranks} ranks, {sharing} per GPU: {lanes} lanes x {per} blocks over the cap {cap}"
                );
            }
        }
        // Alone on a GPU: 128 blocks among the lanes, at most P2P_MAX_BLOCKS each.
        assert_eq!(
            p2p_transfer_blocks(nranks, u32::MAX, u32::MAX),
            (128 / lanes).clamp(1, P2P_MAX_BLOCKS)
        );
        // The config's limit still applies.
        assert_eq!(p2p_transfer_blocks(nranks, u32::MAX, 1), 1);
    }
    assert_eq!(p2p_transfer_blocks(4, 33, u32::MAX), 5);
}
