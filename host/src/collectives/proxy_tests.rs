//! The pipelined proxy-channel collectives on the Host backend (ranks as threads, the same
//! device kernels on CPU threads, the proxy's memcpy as the engine): many chunks per block
//! (far more than the slots), several blocks (lanes), odd sizes, every operation, against a
//! CPU reference that reduces in rank order.

use super::Exec;
use half::f16;

use super::tests::{ranks, ranks_with};
use super::*;

/// A small scratch (8 KiB per region), so that messages of a few KiB take many chunks.
fn config() -> CollConfig {
    CollConfig {
        scratch_bytes: 16 << 10,
        packet_max_bytes: 1024,
        all_reduce_algo: AllReduceAlgo::Proxy,
        all_gather_algo: AllGatherAlgo::Proxy,
        p2p_packet_max_bytes: 1024,
        ..CollConfig::default()
    }
}

/// Non-integer values that differ per rank, index and call, so that the order of a float
/// sum shows in its bits.
fn x(rank: usize, i: usize, call: u64) -> f32 {
    let h = (i as u64 + 7).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ call << 24 ^ (rank as u64) << 40;
    (((h >> 29) % 2001) as f32 - 1000.0) * 0.013 / (rank + 1) as f32
}

/// `(lanes, chunk bytes, blocks per lane)` plans to try for `n` ranks (fewer blocks for
/// more ranks: every block is `max(n, 2)` CPU threads per rank). Several blocks per lane cut
/// each chunk into parts of 16-byte units, some of them empty (48 bytes over 4 blocks).
type Plan = (Option<u32>, Option<usize>, Option<u32>);
fn plans(n: usize) -> Vec<Plan> {
    let mut p = vec![
        (Some(1), Some(16), None),
        (Some(3), Some(48), None),
        (None, None, None),
        (Some(1), Some(48), Some(4)),
        (Some(2), Some(80), Some(3)),
    ];
    if n == 2 {
        p.push((Some(8), Some(32), None));
        p.push((Some(4), Some(160), Some(2)));
    }
    p
}

/// Sets plan `p` on `c`.
fn set_plan(c: &mut Collectives, (lanes, chunk, workers): Plan) {
    c.set_proxy_pipeline(lanes, chunk).unwrap();
    c.set_proxy_workers(workers).unwrap();
}

#[test]
fn pipelined_all_reduce_matches_the_rank_order_reference_over_many_chunks() {
    for n in [2, 3, 4] {
        for plan in plans(n) {
            ranks(n, config(), |mut c| {
                set_plan(&mut c, plan);
                let r = c.rank();
                let mut call = 0u64;
                // 5003 f32 in 16-byte chunks: 1251 chunks in one block (slots: 4 or 8).
                for count in [1usize, 3, 257, 1001, 5003] {
                    for in_place in [false, true] {
                        call += 1;
                        let send: Vec<f32> = (0..count).map(|i| x(r, i, call)).collect();
                        let got = if in_place {
                            let mut b = send;
                            c.all_reduce_in_place(&mut b, ReduceOp::Sum, Exec::Host)
                                .unwrap();
                            b
                        } else {
                            let mut out = vec![0f32; count];
                            c.all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)
                                .unwrap();
                            out
                        };
                        for (i, g) in got.iter().enumerate() {
                            let want = (1..n).fold(x(0, i, call), |a, q| a + x(q, i, call));
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "rank {r} of {n}, plan {plan:?}, count {count}, \
                                 in place {in_place}: [{i}] {g} != {want}"
                            );
                        }
                    }
                }
                c.async_error().unwrap();
            });
        }
    }
}

#[test]
fn pipelined_all_reduce_every_operation_and_type() {
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
    ranks(3, config(), |mut c| {
        c.set_proxy_pipeline(Some(2), Some(32)).unwrap();
        let (n, r) = (c.nranks(), c.rank());
        for op in ops {
            let fold_f64 = |v: &dyn Fn(usize) -> f64| {
                let acc = (1..n).fold(v(0), |a, q| match op {
                    ReduceOp::Prod => a * v(q),
                    ReduceOp::Min => a.min(v(q)),
                    ReduceOp::Max => a.max(v(q)),
                    _ => a + v(q),
                });
                if op == ReduceOp::Avg {
                    acc / n as f64
                } else {
                    acc
                }
            };
            // f64, non-integer values (1001 elements: 251 chunks per block).
            let v = |q: usize, i: usize| (x(q, i, 9) as f64 + 0.1) * 1.37e-3_f64.powi(q as i32);
            let send: Vec<f64> = (0..1001).map(|i| v(r, i)).collect();
            let mut out = vec![0f64; 1001];
            c.all_reduce(&send, &mut out, op, Exec::Host).unwrap();
            for (i, o) in out.iter().enumerate() {
                let w = fold_f64(&|q| v(q, i));
                assert_eq!(o.to_bits(), w.to_bits(), "rank {r}: f64 {op:?} [{i}]");
            }
            // i64 (integer avg truncates, as the device does).
            let w = |q: usize, i: usize| ((i * 7 + q * 13) % 11) as i64 - 5;
            let mut buf: Vec<i64> = (0..777).map(|i| w(r, i)).collect();
            c.all_reduce_in_place(&mut buf, op, Exec::Host).unwrap();
            for (i, o) in buf.iter().enumerate() {
                let acc = (1..n).fold(w(0, i), |a, q| match op {
                    ReduceOp::Prod => a.wrapping_mul(w(q, i)),
                    ReduceOp::Min => a.min(w(q, i)),
                    ReduceOp::Max => a.max(w(q, i)),
                    _ => a.wrapping_add(w(q, i)),
                });
                let want = if op == ReduceOp::Avg {
                    acc / n as i64
                } else {
                    acc
                };
                assert_eq!(*o, want, "rank {r}: i64 {op:?} [{i}]");
            }
            // f16: small integers (exact), an odd count of 2-byte elements.
            if op != ReduceOp::Avg {
                let h = |q: usize, i: usize| ((i * 3 + q * 5) % 7) as f32 - 3.0;
                let send: Vec<f16> = (0..555).map(|i| f16::from_f32(h(r, i))).collect();
                let mut out = vec![f16::ZERO; 555];
                c.all_reduce(&send, &mut out, op, Exec::Host).unwrap();
                for (i, o) in out.iter().enumerate() {
                    let acc = (1..n).fold(h(0, i), |a, q| match op {
                        ReduceOp::Prod => a * h(q, i),
                        ReduceOp::Min => a.min(h(q, i)),
                        ReduceOp::Max => a.max(h(q, i)),
                        _ => a + h(q, i),
                    });
                    assert_eq!(*o, f16::from_f32(acc), "rank {r}: f16 {op:?} [{i}]");
                }
            }
        }
        c.async_error().unwrap();
    });
}

#[test]
fn pipelined_all_gather_of_odd_sizes_in_and_out_of_place() {
    for n in [2, 3, 4] {
        for plan in plans(n) {
            ranks(n, config(), |mut c| {
                set_plan(&mut c, plan);
                let r = c.rank();
                let v = |q: usize, i: usize, call: u64| {
                    ((i as u64 * 31 + q as u64 * 101 + call * 7) % 251) as u8
                };
                let mut call = 0u64;
                for count in [1usize, 15, 333, 4099] {
                    for in_place in [false, true] {
                        call += 1;
                        let mine: Vec<u8> = (0..count).map(|i| v(r, i, call)).collect();
                        let mut out = vec![0xAAu8; n * count];
                        if in_place {
                            out[r * count..(r + 1) * count].copy_from_slice(&mine);
                            let p = out.as_mut_ptr() as u64;
                            // SAFETY: out holds n * count bytes, this rank's part at
                            // r * count (the in-place layout), borrowed for the call.
                            unsafe {
                                c.run_all_gather_kernel(
                                    "all_gather_host",
                                    p + (r * count) as u64,
                                    p,
                                    count as u64,
                                    DataType::U8,
                                    AllGatherAlgo::Proxy,
                                )
                            }
                            .unwrap();
                        } else {
                            c.all_gather(&mine, &mut out, Exec::Host).unwrap();
                        }
                        for q in 0..n {
                            for i in 0..count {
                                assert_eq!(
                                    out[q * count + i],
                                    v(q, i, call),
                                    "rank {r} of {n}, plan {plan:?}, count \
                                     {count}, in place {in_place}: rank {q}'s [{i}]"
                                );
                            }
                        }
                    }
                }
                c.async_error().unwrap();
            });
        }
    }
}

#[test]
fn ranks_that_cut_proxy_calls_differently_fail_by_name_then_work() {
    ranks_with(
        2,
        |_| config(),
        |mut c| {
            let r = c.rank();
            c.set_proxy_pipeline(Some(2), Some([32, 64][r])).unwrap();
            let send = vec![1f32; 1000];
            let mut out = vec![0f32; 1000];
            let e = c
                .all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)
                .unwrap_err();
            assert!(matches!(e, CommError::CallMismatch(_)), "{e}");
            let e = e.to_string();
            assert!(
                e.contains("[2 proxy blocks, chunks of 32 bytes]")
                    && e.contains("[2 proxy blocks, chunks of 64 bytes]"),
                "rank {r}: {e}"
            );
            c.set_proxy_pipeline(Some([1, 3][r]), Some(48)).unwrap();
            let mut g = vec![0f32; 2000];
            let e = c.all_gather(&send, &mut g, Exec::Host).unwrap_err();
            assert!(
                e.to_string().contains("[1 proxy blocks")
                    && e.to_string().contains("[3 proxy blocks"),
                "rank {r}: {e}"
            );
            // The same lanes and chunks, cut among different numbers of blocks per lane.
            c.set_proxy_pipeline(Some(2), Some(64)).unwrap();
            c.set_proxy_workers(Some([1, 2][r])).unwrap();
            let e = c
                .all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)
                .unwrap_err();
            assert!(
                e.to_string()
                    .contains("[2 proxy blocks, chunks of 64 bytes]")
                    && e.to_string()
                        .contains("[2 proxy lanes of 2 blocks, chunks of 64 bytes]"),
                "rank {r}: {e}"
            );
            // Agreeing again: the collectives work.
            c.set_proxy_pipeline(Some(3), Some(48)).unwrap();
            c.set_proxy_workers(Some(2)).unwrap();
            c.all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)
                .unwrap();
            assert!(out.iter().all(|&v| v == 2.0), "rank {r}");
            c.async_error().unwrap();
        },
    );
}

#[test]
fn bad_proxy_pipelines_are_refused_with_the_reason() {
    ranks(2, config(), |mut c| {
        let e = c.set_proxy_pipeline(Some(0), None).unwrap_err().to_string();
        assert!(e.contains("0 proxy blocks") && e.contains("1..=8"), "{e}");
        let e = c.set_proxy_pipeline(Some(9), None).unwrap_err().to_string();
        assert!(e.contains("9 proxy blocks"), "{e}");
        let e = c
            .set_proxy_pipeline(None, Some(17))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("chunk of 17 bytes") && e.contains("multiple of 16"),
            "{e}"
        );
        let e = c.set_proxy_pipeline(None, Some(0)).unwrap_err().to_string();
        assert!(e.contains("chunk of 0 bytes"), "{e}");
        for w in [0, 17] {
            let e = c.set_proxy_workers(Some(w)).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{w} blocks per proxy lane")) && e.contains("1..=16"),
                "{e}"
            );
        }
        // 8 lanes (all built) of 16 blocks: the most a grid has.
        c.set_proxy_workers(Some(16)).unwrap();
        c.set_proxy_pipeline(Some(8), None).unwrap();
    });
    // More lanes built (MSCCLPP_PROXY_LANES=32): 32 lanes of 16 blocks would be 512.
    let e = proxy::ProxyPipe::checked(32, Some(32), None, "test")
        .unwrap()
        .with_workers(Some(16), "test")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("32 proxy lanes of 16 blocks is 512 blocks"),
        "{e}"
    );
}

#[test]
fn the_default_plan_spreads_large_messages_over_lanes_and_chunks() {
    let config = CollConfig {
        scratch_bytes: 64 << 20,
        ..CollConfig::default()
    };
    ranks(2, config, |mut c| {
        // 32 MiB per region: with one lane 2 ranks x 8 slots of 2 MiB, with two 1 MiB.
        // The plan a GPU backend would take:
        let gpu = |c: &Collectives, bytes| c.proxy_plan_for(bytes, true);
        // A small message: one lane of one block, one chunk (rounded up to 16 bytes).
        assert_eq!(gpu(&c, 1000), (1, 1008, 1));
        // 100 KiB: one block; a quarter would be below 64 KiB.
        assert_eq!(gpu(&c, 100 << 10), (1, 64 << 10, 1));
        // 1 MiB: one lane of a block per 512 KiB, chunks of a quarter.
        assert_eq!(gpu(&c, 1 << 20), (2, 256 << 10, 2));
        // 4 MiB: one lane of 8 blocks, chunks of 1 MiB.
        assert_eq!(gpu(&c, 4 << 20), (8, 1 << 20, 8));
        // 32 MiB: two lanes of 16 blocks; a quarter of a 16 MiB share is capped at a slot.
        assert_eq!(gpu(&c, 32 << 20), (32, 1 << 20, 16));
        // This Host backend: the same lanes and chunks, one block per lane.
        assert_eq!(c.proxy_plan(4 << 20), (1, 1 << 20, 1));
        assert_eq!(c.proxy_plan(32 << 20), (2, 1 << 20, 1));
        // Set: four blocks per lane (on either backend), the lanes and chunks as before.
        c.set_proxy_workers(Some(4)).unwrap();
        assert_eq!(c.proxy_plan(4 << 20), (4, 1 << 20, 4));
        assert_eq!(c.proxy_plan(32 << 20), (8, 1 << 20, 4));
        // 8 lanes of 16 blocks: 128, the most a grid has.
        c.set_proxy_workers(Some(16)).unwrap();
        c.set_proxy_pipeline(Some(8), None).unwrap();
        assert_eq!(c.proxy_plan(32 << 20), (128, 256 << 10, 16));
    });
    // CollConfig::max_blocks bounds the grid.
    let config = CollConfig {
        scratch_bytes: 64 << 20,
        max_blocks: 8,
        ..CollConfig::default()
    };
    ranks(2, config, |c| {
        assert_eq!(c.proxy_plan_for(32 << 20, true), (8, 1 << 20, 4));
    });
}

/// A rank that aborts in the middle of a long pipelined call: its own call ends with
/// [`CommError::Aborted`] at once, and its peer, left waiting for chunks that will not
/// come, gives up after the device timeout naming the proxy-channel signal (neither hangs
/// nor traps).
#[test]
fn an_abort_in_the_middle_of_the_pipeline_ends_both_ranks() {
    use std::time::{Duration, Instant};

    use crate::bootstrap::{BlockingBootstrap, BootstrapConfig, create_unique_id};
    use crate::communicator::CommConfig;

    let id = create_unique_id().unwrap();
    let out: Vec<(String, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    let cc = CommConfig {
                        device_timeout: Duration::from_millis(1000),
                        bootstrap: BootstrapConfig::default().with_timeout(Duration::from_secs(30)),
                        ..CommConfig::default()
                    };
                    let bs = BlockingBootstrap::init_with_config(2, r, id, cc.bootstrap.clone())
                        .unwrap();
                    let comm = Communicator::from_bootstrap(bs, Backend::Host, cc).unwrap();
                    let mut c = Collectives::new(comm, config()).unwrap();
                    // 16-byte chunks of 4 MB: a million chunks, far longer than the test.
                    c.set_proxy_pipeline(Some(2), Some(16)).unwrap();
                    let send = vec![1f32; 1 << 20];
                    let mut out = vec![0f32; 1 << 20];
                    std::thread::scope(|s2| {
                        if r == 1 {
                            s2.spawn(|| {
                                std::thread::sleep(Duration::from_millis(300));
                                c.abort();
                            });
                        }
                        let t0 = Instant::now();
                        let e = c
                            .all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)
                            .unwrap_err();
                        (e.to_string(), t0.elapsed())
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (e1, t1) = &out[1];
    assert!(e1.contains("abort()"), "rank 1: {e1}");
    assert!(*t1 < Duration::from_millis(3000), "rank 1 took {t1:?}");
    let (e0, t0) = &out[0];
    assert!(
        e0.contains("waited") && e0.contains("a proxy-channel signal"),
        "rank 0: {e0}"
    );
    assert!(*t0 < Duration::from_millis(6000), "rank 0 took {t0:?}");
}

#[test]
fn lane_counts_outside_1_to_32_are_refused() {
    use super::proxy::ProxyPipe;
    for lanes in [0, 33] {
        let e = ProxyPipe::checked(lanes, None, None, "MSCCLPP_PROXY_LANES")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("{lanes} proxy lanes")) && e.contains("1..=32"),
            "{e}"
        );
    }
    let e = ProxyPipe::checked(16, Some(17), None, "x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("17 proxy blocks; 1..=16"), "{e}");
    assert!(ProxyPipe::checked(32, Some(32), Some(1 << 20), "x").is_ok());
}
