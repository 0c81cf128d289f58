//! Sends and receives over the Host transport, ranks as threads of this process: in order,
//! alone and grouped, of no elements, mismatched, and the grids of their launches.

use super::super::tests::{ranks, small, value};
use super::Exec;
use super::*;

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
                unsafe { c.group(&ops, Exec::Host) }.unwrap();
                assert_eq!(got, data(prev, r, k, len), "rank {r} ring len {len}");
                // Rank 0 sends to every other rank alone, twice; they receive alone.
                if r == 0 {
                    for p in 1..n {
                        c.send(&data(0, p, k, len), p, Exec::Host).unwrap();
                        c.send(&data(0, p, k + 100, len + 1), p, Exec::Host)
                            .unwrap();
                    }
                } else {
                    let mut a = vec![0f32; len];
                    let mut b = vec![0f32; len + 1];
                    c.recv(&mut a, 0, Exec::Host).unwrap();
                    c.recv(&mut b, 0, Exec::Host).unwrap();
                    assert_eq!(a, data(0, r, k, len), "rank {r} first of two, len {len}");
                    assert_eq!(
                        b,
                        data(0, r, k + 100, len + 1),
                        "rank {r} second, len {len}"
                    );
                }
            }
            let e = c.send(&[1f32; 3], r, Exec::Host).unwrap_err().to_string();
            assert!(e.contains("the own rank"), "{e}");
            let e = c
                .recv(&mut [1f32; 3], n, Exec::Host)
                .unwrap_err()
                .to_string();
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
            let e = unsafe { c.group(&[op; 17], Exec::Host) }
                .unwrap_err()
                .to_string();
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
            let e = unsafe { c.group(&[recv(p, 8), recv(p + 4, 2)], Exec::Host) }
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
                unsafe { c.group(&ops, Exec::Host) }.unwrap();
                let from = (r + n - 1) % n;
                assert!(
                    (0..len).all(|i| buf[i] == mine(from, i)),
                    "rank {r}: in-place exchange of {len}"
                );
            }
        });
    }
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
                c.send(&[0f32; 0], peer, Exec::Host).unwrap();
            } else if k == 1 {
                c.recv(&mut [0f32; 0], peer, Exec::Host).unwrap();
            } else {
                // SAFETY: no bytes: nothing is read or written.
                unsafe { c.group(&both, Exec::Host) }.unwrap();
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
            c.send(&out, 1, Exec::Host).unwrap();
            c.recv(&mut got, 1, Exec::Host).unwrap();
        } else {
            c.recv(&mut got, 0, Exec::Host).unwrap();
            c.send(&out, 0, Exec::Host).unwrap();
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
        unsafe { c.group(&[op(first, 5), op(first + 8, 0)], Exec::Host) }
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
            c.send(&data(k, sent), 1, Exec::Host)
        } else {
            let mut got = vec![0f32; want];
            let res = c.recv(&mut got, 0, Exec::Host);
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
            unsafe { c.group(&ops, Exec::Host) }.unwrap();
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
            let m = mismatch_text(r, unsafe { c.group(&ops, Exec::Host) });
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
            let cap = super::super::set_up::share_cap(sharing, 132);
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
