//! Reduce-scatter, reduce, broadcast and all-to-all over the Host transport across three
//! processes, and sends/receives (the test binary re-executes itself, one process per rank), from CPU threads,
//! checked against a CPU reference; sizes on both sides of the LL limit and over many
//! scratch rounds; then again across four processes with the pipelined broadcast and reduce
//! (`RootedAlgo::Pipelined`).

use mscclpp::host::collectives::Exec;
use std::time::Duration;

use half::bf16;
use mscclpp::host::collectives::{CollConfig, Collectives, DataType, P2pOp, ReduceOp, RootedAlgo};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::run_test_ranks;

const ROLE: &str = "MSCCLPP_TEST_ROLE";

/// Small integers: sums exact in f32 and bf16 for three ranks.
fn value(rank: usize, i: usize, call: usize) -> f32 {
    ((i * 31 + rank * 17 + call * 7) % 13) as f32 - 6.0
}

/// `pipelined`: broadcast and reduce above the LL size take the pipelined kernels (pieces of
/// at least 512 bytes, three in flight).
fn rank_main(pipelined: bool) {
    let launch = Launch::from_env().unwrap();
    let bs = launch.blocking_bootstrap().unwrap();
    let config = CommConfig {
        device_timeout: Duration::from_secs(60),
        ..CommConfig::default()
    };
    let comm = Communicator::from_bootstrap(bs, Backend::Host, config).unwrap();
    // A small scratch: large messages go through many rounds.
    let c = Collectives::new(
        comm,
        CollConfig {
            scratch_bytes: 64 << 10,
            packet_max_bytes: 16 << 10,
            broadcast_algo: if pipelined {
                RootedAlgo::Pipelined
            } else {
                RootedAlgo::Auto
            },
            reduce_algo: if pipelined {
                RootedAlgo::Pipelined
            } else {
                RootedAlgo::Auto
            },
            rooted_piece_bytes: 512,
            rooted_depth: 3,
            ..CollConfig::default()
        },
    )
    .unwrap();
    let (n, r) = (c.nranks(), c.rank());
    let mut call = 0;
    for count in [1usize, 3, 1000, 4095, 4096, 4097, 50_001] {
        call += 1;
        let send: Vec<f32> = (0..n * count).map(|i| value(r, i, call)).collect();
        let mut out = vec![0f32; count];
        c.reduce_scatter(&send, &mut out, ReduceOp::Sum, Exec::Host)
            .unwrap();
        for (i, v) in out.iter().enumerate() {
            let want: f32 = (0..n).map(|q| value(q, r * count + i, call)).sum();
            assert_eq!(*v, want, "rank {r}: reduce_scatter count {count} [{i}]");
        }
        let root = call % n;
        let mut buf: Vec<bf16> = (0..count)
            .map(|i| bf16::from_f32(value(r, i, call)))
            .collect();
        c.reduce_in_place(&mut buf, ReduceOp::Sum, root, Exec::Host)
            .unwrap();
        for (i, v) in buf.iter().enumerate() {
            let want: f32 = if r == root {
                (0..n).map(|q| value(q, i, call)).sum()
            } else {
                value(r, i, call)
            };
            assert_eq!(
                v.to_f32(),
                want,
                "rank {r}: reduce root {root} count {count} [{i}]"
            );
        }
        let word = |q: usize, i: usize| bf16::from_bits((i * 7 + q * 1001) as u16);
        let mut words: Vec<bf16> = (0..count * 3 + 1).map(|i| word(r, i)).collect();
        c.broadcast_in_place(&mut words, root, Exec::Host).unwrap();
        assert!(
            words
                .iter()
                .enumerate()
                .all(|(i, &w)| w.to_bits() == word(root, i).to_bits()),
            "rank {r}: broadcast root {root} count {count}"
        );
        let mut all = vec![0f32; n * count];
        c.all_to_all(&send, &mut all, Exec::Host).unwrap();
        for q in 0..n {
            for i in 0..count {
                assert_eq!(
                    all[q * count + i],
                    value(q, r * count + i, call),
                    "rank {r}: all_to_all from {q} [{i}]"
                );
            }
        }
    }
    // Sends and receives: a ring in one group, then rank 0 to every other rank alone. On
    // one host every rank can be reached.
    assert_eq!(c.send_recv_across_hosts_off(), None, "rank {r}");
    for len in [1usize, 1000, 300_001] {
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let msg = |from: usize, to: usize| -> Vec<f32> {
            (0..len).map(|i| value(from, i + to, len)).collect()
        };
        let out = msg(r, next);
        let mut got = vec![0f32; len];
        let ops = [
            P2pOp::Send {
                buf: out.as_ptr() as u64,
                count: len,
                dtype: DataType::F32,
                peer: next,
            },
            P2pOp::Recv {
                buf: got.as_mut_ptr() as u64,
                count: len,
                dtype: DataType::F32,
                peer: prev,
            },
        ];
        // SAFETY: both vectors live across the call.
        unsafe { c.group(&ops, Exec::Host) }.unwrap();
        assert!(got == msg(prev, r), "rank {r}: ring of {len}");
        if r == 0 {
            for p in 1..n {
                c.send(&msg(0, p), p, Exec::Host).unwrap();
            }
        } else {
            c.recv(&mut got, 0, Exec::Host).unwrap();
            assert!(got == msg(0, r), "rank {r}: from rank 0, {len}");
        }
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

#[test]
fn three_processes_reduce_scatter_reduce_broadcast_all_to_all_send_recv() {
    if std::env::var(ROLE).is_ok() {
        rank_main(false);
    } else {
        run_test_ranks(
            "three_processes_reduce_scatter_reduce_broadcast_all_to_all_send_recv",
            3,
            ROLE,
            Duration::from_secs(300),
        );
    }
}

#[test]
fn four_processes_with_pipelined_broadcast_and_reduce() {
    if std::env::var(ROLE).is_ok() {
        rank_main(true);
    } else {
        run_test_ranks(
            "four_processes_with_pipelined_broadcast_and_reduce",
            4,
            ROLE,
            Duration::from_secs(300),
        );
    }
}
