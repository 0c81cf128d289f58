//! Collectives over the Host transport, ranks as threads of this process.

use super::Exec;
use std::time::{Duration, Instant};

use half::{bf16, f16};

use super::launch::one_shot_grid;
use super::set_up::{block_cap_of, share_cap};
use super::*;
use crate::bootstrap::{BlockingBootstrap, BootstrapConfig, UniqueId, create_unique_id};
use crate::communicator::CommConfig;
use crate::transport::TransportKind;
use mscclpp_device::collectives::fault;

fn comm_config() -> CommConfig {
    CommConfig {
        fifo_slots: 8,
        device_timeout: Duration::from_secs(30),
        bootstrap: BootstrapConfig::default().with_timeout(Duration::from_secs(30)),
        ..CommConfig::default()
    }
}

/// Small scratch (several two-shot rounds for a few KB) and packet limit.
pub(super) fn small() -> CollConfig {
    CollConfig {
        scratch_bytes: 4096,
        packet_max_bytes: 2048,
        // Sends and receives of up to 1 KiB as LL packets, larger ones in pieces.
        p2p_packet_max_bytes: 1024,
        ..CollConfig::default()
    }
}

/// Runs `f(collectives)` on `n` host-backed ranks (threads); results in rank order.
pub(super) fn ranks<T: Send>(
    n: usize,
    config: CollConfig,
    f: impl Fn(Collectives) -> T + Sync,
) -> Vec<T> {
    ranks_with(n, |_| config.clone(), f)
}

/// [`ranks`] with rank `r`'s config `config(r)`.
pub(super) fn ranks_with<T: Send>(
    n: usize,
    config: impl Fn(usize) -> CollConfig,
    f: impl Fn(Collectives) -> T + Sync,
) -> Vec<T> {
    let id = create_unique_id().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (f, config) = (&f, config(r));
                s.spawn(move || {
                    let c = comm_config();
                    let bs =
                        BlockingBootstrap::init_with_config(n, r, id, c.bootstrap.clone()).unwrap();
                    let comm = Communicator::from_bootstrap(bs, Backend::Host, c).unwrap();
                    f(Collectives::new(comm, config).unwrap())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `r` of `n` host-backed ranks of job `id` with the [`small`] collectives and a device
/// timeout of `timeout` (the tests that need each rank's collectives in their own hands:
/// dropped early, or not called).
fn host_rank(n: usize, r: usize, id: crate::bootstrap::UniqueId, timeout: Duration) -> Collectives {
    let mut cc = comm_config();
    cc.device_timeout = timeout;
    let bs = BlockingBootstrap::init_with_config(n, r, id, cc.bootstrap.clone()).unwrap();
    let comm = Communicator::from_bootstrap(bs, Backend::Host, cc).unwrap();
    Collectives::new(comm, small()).unwrap()
}

/// Small integers (exact sums in every type) from rank, index and call.
pub(super) fn value(rank: usize, i: usize, call: u64) -> f32 {
    let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ call << 20 ^ (rank as u64) << 44;
    ((h >> 31) % 15) as f32 - 7.0
}

fn sum(n: usize, i: usize, call: u64) -> f32 {
    (0..n).map(|r| value(r, i, call)).sum()
}

trait FromF32: Element + PartialEq + std::fmt::Debug {
    fn from(v: f32) -> Self;
}
impl FromF32 for f32 {
    fn from(v: f32) -> Self {
        v
    }
}
impl FromF32 for f16 {
    fn from(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl FromF32 for bf16 {
    fn from(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

fn all_reduce_case<T: FromF32>(c: &Collectives, count: usize, call: u64, in_place: bool) {
    let (n, r) = (c.nranks(), c.rank());
    let send: Vec<T> = (0..count).map(|i| T::from(value(r, i, call))).collect();
    let want: Vec<T> = (0..count).map(|i| T::from(sum(n, i, call))).collect();
    let got = if in_place {
        let mut b = send;
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, Exec::Host)
            .unwrap();
        b
    } else {
        let mut out = vec![T::from(0.0); count];
        c.all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)
            .unwrap();
        out
    };
    assert_eq!(
        got,
        want,
        "rank {r} of {n}: {:?} count {count} in_place {in_place}",
        T::DTYPE
    );
}

#[test]
fn all_reduce_sums_every_type_and_size_in_and_out_of_place() {
    for n in [2, 3] {
        ranks(n, small(), |c| {
            let mut call = 0;
            // Sizes across the one-shot limit (the Host backend's 128 B for two ranks, the
            // config's 2048 bytes for more) and over several scratch rounds.
            for count in [
                1usize, 2, 3, 7, 31, 32, 33, 64, 255, 256, 257, 511, 512, 513, 1000, 3001,
            ] {
                for in_place in [false, true] {
                    call += 1;
                    all_reduce_case::<f32>(&c, count, call, in_place);
                    all_reduce_case::<f16>(&c, count, call, in_place);
                    all_reduce_case::<bf16>(&c, count, call, in_place);
                }
            }
            // Both algorithms chose as expected around the limit.
            let (limit, above) = if n == 2 {
                (128, AllReduceAlgo::AllPairs)
            } else {
                (2048, AllReduceAlgo::TwoShot)
            };
            assert_eq!(c.choose_all_reduce(limit), AllReduceAlgo::OneShot);
            assert_eq!(c.choose_all_reduce(limit + 1), above);
        });
    }
}

#[test]
fn two_ranks_send_one_shot_only_up_to_256_kib_and_more_ranks_up_to_the_packet_limit() {
    use super::select::auto_all_reduce;
    let limit = 1 << 20;
    for n in [2, 3] {
        let gpu = |bytes| auto_all_reduce(true, n, bytes, limit);
        assert_eq!(gpu(super::TWO_RANK_ONE_SHOT_MAX), AllReduceAlgo::OneShot);
        let (mid, above) = if n == 2 {
            (AllReduceAlgo::AllPairs, AllReduceAlgo::AllPairs)
        } else {
            (AllReduceAlgo::OneShot, AllReduceAlgo::TwoShot)
        };
        assert_eq!(gpu(super::TWO_RANK_ONE_SHOT_MAX + 1), mid, "{n} ranks");
        assert_eq!(gpu(limit), mid, "{n} ranks");
        assert_eq!(gpu(limit + 1), above, "{n} ranks");
    }
}

#[test]
fn the_host_backend_sends_one_shot_up_to_128_b_for_two_ranks_2_kib_for_more() {
    let config = CollConfig {
        scratch_bytes: 4096,
        packet_max_bytes: 1 << 20,
        ..CollConfig::default()
    };
    for n in [2, 3] {
        ranks(n, config.clone(), |c| {
            assert!(c.one_shot_max_bytes() >= 1 << 20);
            let (one_shot_max, above) = if n == 2 {
                (128, AllReduceAlgo::AllPairs)
            } else {
                (2048, AllReduceAlgo::TwoShot)
            };
            assert_eq!(c.choose_all_reduce(8), AllReduceAlgo::OneShot, "{n} ranks");
            assert_eq!(c.choose_all_reduce(one_shot_max), AllReduceAlgo::OneShot);
            assert_eq!(c.choose_all_reduce(one_shot_max + 1), above, "{n} ranks");
            assert_eq!(c.choose_all_reduce(16 << 10), above, "{n} ranks");
            // Two-shot moves half of what all-pairs does: ahead on a CPU from 32 KB.
            let big = c.choose_all_reduce((16 << 10) + 1);
            assert_eq!(big, AllReduceAlgo::TwoShot, "{n} ranks");
            assert_eq!(
                c.choose_all_reduce(1 << 20),
                AllReduceAlgo::TwoShot,
                "{n} ranks"
            );
        });
    }
}

#[test]
fn many_calls_without_reinit_and_all_gathers_between_them() {
    ranks(2, small(), |c| {
        let r = c.rank();
        for call in 0..60u64 {
            if call % 4 == 3 {
                let send: Vec<f32> = (0..333).map(|i| value(r, i, call)).collect();
                let mut out = vec![0f32; 666];
                c.all_gather(&send, &mut out, Exec::Host).unwrap();
                for q in 0..2 {
                    for i in 0..333 {
                        assert_eq!(
                            out[q * 333 + i],
                            value(q, i, call),
                            "call {call} rank {q} [{i}]"
                        );
                    }
                }
            } else {
                all_reduce_case::<f32>(&c, 17 + call as usize * 37, call, call % 2 == 0);
            }
        }
    });
}

#[test]
fn all_gather_of_every_type_and_odd_sizes() {
    ranks(3, small(), |c| {
        let (n, r) = (c.nranks(), c.rank());
        for count in [1usize, 5, 800, 2501] {
            let send: Vec<bf16> = (0..count).map(|i| bf16::from_f32(value(r, i, 9))).collect();
            let mut out = vec![bf16::ZERO; n * count];
            c.all_gather(&send, &mut out, Exec::Host).unwrap();
            for q in 0..n {
                for i in 0..count {
                    assert_eq!(out[q * count + i], bf16::from_f32(value(q, i, 9)));
                }
            }
        }
    });
}

#[test]
fn bad_arguments_are_refused_with_the_reason() {
    ranks(2, small(), |c| {
        let mut out = vec![0f32; 3];
        let e = c
            .all_reduce(&[1f32, 2.0], &mut out, ReduceOp::Sum, Exec::Host)
            .unwrap_err();
        assert!(e.to_string().contains("send has 2 elements, recv 3"), "{e}");
        let e = c
            .all_gather(&[1f32, 2.0], &mut out, Exec::Host)
            .unwrap_err();
        assert!(e.to_string().contains("2 ranks x 2 expected"), "{e}");
        let e = c
            .resolve(AllReduceAlgo::OneShot, c.one_shot_max_bytes() + 1)
            .unwrap_err();
        assert!(e.to_string().contains("one-shot carries at most"), "{e}");
        let e = c.gpu_kernels("all_reduce").unwrap_err();
        assert!(e.to_string().contains("host backend"), "{e}");
        // Nothing was left half-done: a good call still works on both ranks.
        all_reduce_case::<f32>(&c, 10, 1, false);
    });
}

#[test]
fn bad_configs_are_refused() {
    for (config, msg) in [
        (
            CollConfig {
                scratch_bytes: 100,
                ..CollConfig::default()
            },
            "at least 4096",
        ),
        (
            CollConfig {
                max_blocks: 0,
                ..CollConfig::default()
            },
            "max_blocks 0",
        ),
        (
            CollConfig {
                threads: 100,
                ..CollConfig::default()
            },
            "threads 100",
        ),
        (
            CollConfig {
                host_cross_round_bytes: 4095,
                ..CollConfig::default()
            },
            "host_cross_round_bytes 4095 is below 4 KiB",
        ),
    ] {
        let e = config.validate().unwrap_err();
        assert!(e.to_string().contains(msg), "{e} should mention {msg}");
    }
}

#[test]
fn a_rank_that_does_not_take_part_fails_the_others_with_a_timeout() {
    let id = create_unique_id().unwrap();
    let out: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    let c = host_rank(2, r, id, Duration::from_millis(300));
                    if r == 0 {
                        let mut out = vec![0f32; 4];
                        c.all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum, Exec::Host)
                            .map_err(|e| e.to_string())
                    } else {
                        // Rank 1 keeps its scratch alive but never calls.
                        std::thread::sleep(Duration::from_millis(1500));
                        Ok(())
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let e = out[0].as_ref().unwrap_err();
    assert!(e.contains("did not take part"), "{e}");
}

/// A peer that never calls (alive, stalled) holds the caller for one device timeout, not
/// two: after the one-shot kernel's packet wait gave up, its descriptor check (which looks
/// for a mismatch as the cause) waited a timeout of its own (helper audit: a stopped
/// train-dp rank held the other 60 s with the 30 s default).
#[test]
fn a_stalled_peer_costs_one_device_timeout() {
    let id = create_unique_id().unwrap();
    let timeout = Duration::from_secs(3);
    let took = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    let c = host_rank(2, r, id, timeout);
                    if r == 0 {
                        let mut out = vec![0f32; 4];
                        let t0 = std::time::Instant::now();
                        let e = c.all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum, Exec::Host);
                        let took = t0.elapsed();
                        let e = e.expect_err("rank 1 never called").to_string();
                        assert!(e.contains("did not take part"), "{e}");
                        Some(took)
                    } else {
                        // Alive but never calling, past both of rank 0's possible timeouts.
                        std::thread::sleep(3 * timeout);
                        None
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()[0]
    })
    .unwrap();
    // One timeout plus scheduling; two would be 6 s.
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// A rank that left (dropped its collectives) before the others' call without naming its
/// calls (as when its GPU work did not end within a second): the timeout says it had left.
#[test]
fn a_timeout_names_a_rank_that_had_left() {
    let id = create_unique_id().unwrap();
    let out: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    let c = host_rank(2, r, id, Duration::from_millis(300));
                    if r == 0 {
                        // Rank 1's goodbye is on its way by the end of the wait.
                        let mut out = vec![0f32; 4];
                        c.all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum, Exec::Host)
                            .map_err(|e| e.to_string())
                    } else {
                        c.drop_without_naming_calls();
                        Ok(())
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let e = out[0].as_ref().unwrap_err();
    assert!(
        e.contains("did not take part") && e.contains("rank 1 had left"),
        "{e}"
    );
}

/// A rank that made fewer calls and left (dropped its collectives; its goodbye names its
/// calls): the others' next call fails at once, not at the device timeout (20 s here),
/// naming it and its count, whether the goodbye came before the call or during its wait;
/// so does every later call. The calls it made completed on every rank, and a rank that
/// leaves after the same calls as the others (a normal end) leaves no error behind.
#[test]
fn a_call_that_a_rank_which_left_never_made_fails_at_once_naming_it() {
    for delay_ms in [0u64, 300] {
        let id = create_unique_id().unwrap();
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    s.spawn(move || {
                        let c = host_rank(3, r, id, Duration::from_secs(20));
                        for call in 0..2 {
                            let send = vec![(r + call) as f32; 40];
                            let mut out = vec![0f32; 40];
                            c.all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)
                                .unwrap();
                            assert_eq!(out, vec![(3 + 3 * call) as f32; 40], "rank {r}");
                        }
                        if r == 1 {
                            std::thread::sleep(Duration::from_millis(delay_ms));
                            drop(c);
                            return;
                        }
                        let t0 = Instant::now();
                        let mut out = vec![0f32; 40];
                        let e = c
                            .all_reduce(&[1f32; 40], &mut out, ReduceOp::Sum, Exec::Host)
                            .unwrap_err()
                            .to_string();
                        let took = t0.elapsed();
                        println!("rank {r}, goodbye after {delay_ms} ms: {took:?}: {e}");
                        assert!(took < Duration::from_secs(5), "rank {r}: {took:?}: {e}");
                        assert!(
                            e.contains("collective #3")
                                && e.contains("rank 1 left")
                                && e.contains("after 2 collective calls"),
                            "rank {r}: {e}"
                        );
                        let again = c
                            .all_reduce(&[1f32; 40], &mut out, ReduceOp::Sum, Exec::Host)
                            .unwrap_err()
                            .to_string();
                        assert!(again.contains("rank 1 left"), "rank {r}: {again}");
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
    }
    // Everyone makes the same calls and leaves: no error on the ranks that stay longest.
    let id = create_unique_id().unwrap();
    std::thread::scope(|s| {
        for r in 0..2 {
            s.spawn(move || {
                let c = host_rank(2, r, id, comm_config().device_timeout);
                let mut out = vec![0f32; 40];
                c.all_reduce(&[1f32; 40], &mut out, ReduceOp::Sum, Exec::Host)
                    .unwrap();
                if r == 0 {
                    std::thread::sleep(Duration::from_millis(300));
                    assert!(c.communicator().bootstrap().as_async().has_left(1));
                    assert_eq!(
                        c.communicator().bootstrap().as_async().left_after(1),
                        Some(1)
                    );
                    c.async_error().unwrap();
                }
            });
        }
    });
}

/// What rank 0 does after rank 1 left in [`a_send_or_receive_with_a_rank_that_left_fails_at_once`].
#[derive(Clone, Copy, Debug)]
enum AfterLeave {
    /// A small receive (LL packets).
    Recv,
    /// A large send (pipelined: it waits for the receiver's acknowledgements).
    SendLarge,
}

/// Send/recv with a rank that left (dropped its collectives with its work done; its goodbye
/// names its calls): what it sent before it left arrives, even when the receive starts after
/// the goodbye; a receive from it, or a send that needs it, fails at once (not at the 20 s
/// device timeout) naming it, whether the goodbye came before the call or during its wait;
/// so does every later call, a collective too.
#[test]
fn a_send_or_receive_with_a_rank_that_left_fails_at_once() {
    let small_data = |k: usize| (0..5).map(|i| (i + 10 * k) as f32).collect::<Vec<f32>>();
    let large = (0..4099).map(|i| i as f32).collect::<Vec<f32>>();
    for (after, delay_ms) in [
        (AfterLeave::Recv, 0u64),
        (AfterLeave::Recv, 300),
        (AfterLeave::SendLarge, 0),
        (AfterLeave::SendLarge, 300),
    ] {
        let id = create_unique_id().unwrap();
        let (small_data, large) = (&small_data, &large);
        std::thread::scope(|s| {
            for r in 0..2 {
                s.spawn(move || {
                    let c = host_rank(2, r, id, Duration::from_secs(20));
                    if r == 1 {
                        // Two sends (LL, then pipelined), a receive; then, without waiting
                        // for rank 0 to take the last LL send, leave.
                        c.send(&small_data(0), 0, Exec::Host).unwrap();
                        c.send(large, 0, Exec::Host).unwrap();
                        let mut got = vec![0f32; 5];
                        c.recv(&mut got, 0, Exec::Host).unwrap();
                        assert_eq!(got, small_data(1));
                        c.send(&small_data(2), 0, Exec::Host).unwrap();
                        std::thread::sleep(Duration::from_millis(delay_ms));
                        drop(c);
                        return;
                    }
                    let mut got = vec![0f32; 5];
                    c.recv(&mut got, 1, Exec::Host).unwrap();
                    assert_eq!(got, small_data(0));
                    let mut got_large = vec![0f32; large.len()];
                    c.recv(&mut got_large, 1, Exec::Host).unwrap();
                    assert_eq!(&got_large, large);
                    c.send(&small_data(1), 1, Exec::Host).unwrap();
                    if delay_ms == 0 {
                        // The goodbye is here before the receive starts.
                        let deadline = Instant::now() + Duration::from_secs(10);
                        while !c.communicator().bootstrap().as_async().has_left(1) {
                            assert!(
                                Instant::now() < deadline,
                                "rank 1's goodbye did not arrive within 10 s"
                            );
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                    let mut got = vec![0f32; 5];
                    c.recv(&mut got, 1, Exec::Host).unwrap();
                    assert_eq!(got, small_data(2), "{after:?}: sent before it left");
                    let t0 = Instant::now();
                    let e = match after {
                        AfterLeave::Recv => c.recv(&mut got, 1, Exec::Host),
                        AfterLeave::SendLarge => c.send(large, 1, Exec::Host),
                    }
                    .unwrap_err()
                    .to_string();
                    let took = t0.elapsed();
                    println!("{after:?}, goodbye after {delay_ms} ms: {took:?}: {e}");
                    assert!(took < Duration::from_secs(5), "{after:?}: {took:?}: {e}");
                    assert!(
                        e.contains("rank 1 left") && e.contains("without the matching send"),
                        "{after:?}: {e}"
                    );
                    let again = c
                        .send(&small_data(3), 1, Exec::Host)
                        .unwrap_err()
                        .to_string();
                    assert!(again.contains("rank 1 left"), "{after:?}: {again}");
                    let mut out = vec![0f32; 4];
                    let coll = c
                        .all_reduce(&[1f32; 4], &mut out, ReduceOp::Sum, Exec::Host)
                        .unwrap_err()
                        .to_string();
                    assert!(coll.contains("rank 1 left"), "{after:?}: {coll}");
                });
            }
        });
    }
}

#[test]
fn the_any_type_proxy_kernel_reduces_other_types_and_operations() {
    let config = CollConfig {
        all_reduce_algo: AllReduceAlgo::Proxy,
        ..small()
    };
    for n in [2, 3] {
        ranks(n, config.clone(), |c| {
            let r = c.rank() as i64;
            for count in [1usize, 5, 333, 2501] {
                let send: Vec<i32> = (0..count).map(|i| (r * 1000 - i as i64) as i32).collect();
                let mut out = vec![0i32; count];
                c.all_reduce(&send, &mut out, ReduceOp::Max, Exec::Host)
                    .unwrap();
                let top = (n as i64 - 1) * 1000;
                assert!(
                    out.iter()
                        .enumerate()
                        .all(|(i, &x)| x as i64 == top - i as i64)
                );
                let send: Vec<f64> = (0..count).map(|i| (r + 1) as f64 * i as f64).collect();
                let mut out = vec![0f64; count];
                c.all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)
                    .unwrap();
                let k = (n * (n + 1) / 2) as f64;
                assert!(out.iter().enumerate().all(|(i, &x)| x == k * i as f64));
                let send: Vec<u8> = (0..count).map(|i| (i % 7) as u8 + r as u8).collect();
                let mut out = vec![0u8; count];
                c.all_reduce(&send, &mut out, ReduceOp::Min, Exec::Host)
                    .unwrap();
                assert!(out.iter().enumerate().all(|(i, &x)| x == (i % 7) as u8));
            }
        });
    }
}

#[test]
fn proxy_channel_variants_reduce_and_gather_over_the_proxy() {
    let config = CollConfig {
        all_reduce_algo: AllReduceAlgo::Proxy,
        all_gather_algo: AllGatherAlgo::Proxy,
        ..small()
    };
    for n in [2, 3] {
        ranks(n, config.clone(), |c| {
            let r = c.rank();
            assert_eq!(c.choose_all_reduce(8), AllReduceAlgo::Proxy);
            assert_eq!(c.choose_all_gather(8), AllGatherAlgo::Proxy);
            let mut call = 100;
            // 4096-byte scratch: 1024 (n=3) or 1360 (n=2) bytes per slot, many rounds.
            for count in [1usize, 5, 64, 333, 1000, 2501] {
                for in_place in [false, true] {
                    call += 1;
                    all_reduce_case::<f32>(&c, count, call, in_place);
                    all_reduce_case::<bf16>(&c, count, call, in_place);
                }
                let send: Vec<f16> = (0..count)
                    .map(|i| f16::from_f32(value(r, i, call)))
                    .collect();
                let mut out = vec![f16::ZERO; n * count];
                c.all_gather(&send, &mut out, Exec::Host).unwrap();
                for q in 0..n {
                    for i in 0..count {
                        assert_eq!(
                            out[q * count + i],
                            f16::from_f32(value(q, i, call)),
                            "rank {r} n {n} count {count}"
                        );
                    }
                }
            }
        });
    }
}

#[test]
fn a_single_rank_copies_its_input() {
    ranks(1, small(), |c| {
        all_reduce_case::<f32>(&c, 1000, 7, false);
        all_reduce_case::<f16>(&c, 3, 8, true);
        let mut out = vec![0f32; 5];
        c.all_gather(&[1f32, 2.0, 3.0, 4.0, 5.0], &mut out, Exec::Host)
            .unwrap();
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0, 5.0]);
    });
}

/// Host-backend `all_reduce` of `count` f32 (or f16) on this rank; the error's text.
fn reduce_err(c: &Collectives, count: usize, half: bool) -> String {
    let r = if half {
        let mut b = vec![f16::ONE; count];
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, Exec::Host)
    } else {
        let mut b = vec![1f32; count];
        c.all_reduce_in_place(&mut b, ReduceOp::Sum, Exec::Host)
    };
    match r {
        Err(e @ CommError::CallMismatch(_)) => e.to_string(),
        other => panic!("rank {}: expected a mismatch, got {other:?}", c.rank()),
    }
}

#[test]
fn mismatched_calls_fail_on_every_rank_naming_the_difference_then_work() {
    let algos = [
        (AllReduceAlgo::OneShot, "one-shot"),
        (AllReduceAlgo::TwoShot, "two-shot"),
        (AllReduceAlgo::ReadReduce, "readreduce"),
        (AllReduceAlgo::AllPairs, "all-pairs"),
        (AllReduceAlgo::Proxy, "proxy"),
    ];
    for (algo, name) in algos {
        let config = CollConfig {
            all_reduce_algo: algo,
            ..small()
        };
        ranks(2, config, |c| {
            let r = c.rank();
            // Counts (one-shot: both fit its 2048 bytes).
            let e = reduce_err(&c, [300, 400][r], false);
            let want = format!(
                "rank {r} called all_reduce (sum) with {} f32 ({name}), rank {} all_reduce (sum) \
                 with {} f32 ({name})",
                [300, 400][r],
                1 - r,
                [300, 400][1 - r]
            );
            assert!(e.contains(&want), "rank {r}: {e}\nwants: {want}");
            // The other way round, so that each rank once waits for data never sent.
            reduce_err(&c, [400, 300][r], false);
            // Data type.
            let e = reduce_err(&c, 100, r == 1);
            assert!(e.contains("100 f16") && e.contains("100 f32"), "{e}");
            // Usable afterwards, repeatedly.
            for call in 0..3 {
                all_reduce_case::<f32>(&c, 257 + call, call as u64, call % 2 == 0);
            }
            c.async_error().unwrap();
        });
    }
    // Algorithm: the ranks' configs differ.
    ranks_with(
        2,
        |r| CollConfig {
            all_reduce_algo: [AllReduceAlgo::TwoShot, AllReduceAlgo::AllPairs][r],
            ..small()
        },
        |c| {
            let e = reduce_err(&c, 100, false);
            assert!(e.contains("(two-shot)") && e.contains("(all-pairs)"), "{e}");
        },
    );
    // All-gather sizes, both algorithms; then all-reduce against all-gather.
    for algo in [
        AllGatherAlgo::Memory,
        AllGatherAlgo::Proxy,
        AllGatherAlgo::Packets,
    ] {
        let config = CollConfig {
            all_gather_algo: algo,
            ..small()
        };
        ranks(2, config, |c| {
            let r = c.rank();
            let count = [100, 300][r];
            let mut out = vec![0f32; 2 * count];
            let e = c
                .all_gather(&vec![1f32; count], &mut out, Exec::Host)
                .unwrap_err();
            assert!(matches!(e, CommError::CallMismatch(_)), "{e}");
            let e = e.to_string();
            assert!(
                e.contains("all_gather of 100 f32 per rank")
                    && e.contains("all_gather of 300 f32 per rank"),
                "{e}"
            );
            let e = if r == 0 {
                let mut out = vec![0f32; 200];
                c.all_gather(&[1f32; 100], &mut out, Exec::Host)
                    .unwrap_err()
            } else {
                let mut b = vec![1f32; 100];
                c.all_reduce_in_place(&mut b, ReduceOp::Sum, Exec::Host)
                    .unwrap_err()
            };
            assert!(
                e.to_string().contains("all_gather of 100 f32 per rank"),
                "{e}"
            );
            let send: Vec<f32> = (0..333).map(|i| value(r, i, 5)).collect();
            let mut out = vec![0f32; 666];
            c.all_gather(&send, &mut out, Exec::Host).unwrap();
            for q in 0..2 {
                for i in 0..333 {
                    assert_eq!(out[q * 333 + i], value(q, i, 5));
                }
            }
        });
    }
}

#[test]
fn abort_stops_a_waiting_collective_at_once_and_sticks() {
    let aborted = std::sync::atomic::AtomicBool::new(false);
    let out = ranks(2, small(), |c| {
        let r = c.rank();
        std::thread::scope(|s| {
            // Rank 0 aborts itself 200 ms into a call rank 1 makes late; rank 1 aborts once
            // rank 0 has (as an application would after seeing the error).
            s.spawn(|| {
                if r == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                } else {
                    while !aborted.load(std::sync::atomic::Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                c.abort();
            });
            if r == 1 {
                std::thread::sleep(Duration::from_millis(400));
            }
            let t0 = std::time::Instant::now();
            let mut b = vec![1f32; 3000];
            let e = c
                .all_reduce_in_place(&mut b, ReduceOp::Sum, Exec::Host)
                .unwrap_err();
            if r == 0 {
                aborted.store(true, std::sync::atomic::Ordering::Release);
            }
            let took = t0.elapsed();
            assert!(matches!(e, CommError::Aborted(_)), "rank {r}: {e}");
            assert!(e.to_string().contains("abort()"), "{e}");
            // Sticky.
            let e2 = c.async_error().unwrap_err();
            assert!(matches!(e2, CommError::Aborted(_)), "{e2}");
            let e3 = c
                .all_reduce_in_place(&mut b, ReduceOp::Sum, Exec::Host)
                .unwrap_err();
            assert!(matches!(e3, CommError::Aborted(_)), "{e3}");
            took
        })
    });
    assert!(
        out[0] < Duration::from_millis(1500),
        "rank 0 took {:?}",
        out[0]
    );
}

/// Rank `r` of `n` host-backed ranks (threads) with small collectives, on the simulated
/// host `host`.
fn rank_on_host(n: usize, r: usize, id: UniqueId, host: &str) -> Collectives {
    let c = comm_config();
    let bs = BlockingBootstrap::init_with_config(n, r, id, c.bootstrap.clone().with_host_id(host))
        .unwrap();
    let comm = Communicator::from_bootstrap(bs, Backend::Host, c).unwrap();
    Collectives::new(comm, small()).unwrap()
}

/// Ranks on two (simulated) hosts of different sizes (2 + 1): no rank refuses; every rank
/// is its own host (three hosts), the layout note names both hosts and their sizes, and an
/// all-reduce gives the sum on every rank.
#[test]
fn hosts_of_different_sizes_make_every_rank_its_own_host() {
    let id = create_unique_id().unwrap();
    let out: Vec<(usize, String, Vec<f32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                s.spawn(move || {
                    let host = if r == 2 { "host-b" } else { "host-a" };
                    let coll = rank_on_host(3, r, id, host);
                    let mut v = vec![(r + 1) as f32; 1001];
                    coll.all_reduce_in_place(&mut v, ReduceOp::Sum, Exec::Host)
                        .unwrap();
                    let note = coll.layout_note().unwrap_or("").to_string();
                    // Proxy channels (cross step, and two for send/recv) to every other rank:
                    // over the network to the other machine, over shared memory inside one.
                    let count = |t| {
                        coll.communicator()
                            .connections()
                            .iter()
                            .filter(|k| k.transport() == t)
                            .count()
                    };
                    let (same, other) = if r == 2 { (0, 2) } else { (1, 1) };
                    assert_eq!(count(TransportKind::Tcp), 3 * other, "rank {r}: TCP");
                    assert_eq!(count(TransportKind::Host), 3 * same, "rank {r}: Host");
                    // Host-mapped cross buffers are a GPU backend's (here: shared memory).
                    assert!(!coll.cross_buffer_mapped(), "rank {r}");
                    coll.communicator().bootstrap().barrier().unwrap();
                    (coll.hosts(), note, v)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (hosts, note, v)) in out.iter().enumerate() {
        assert_eq!(*hosts, 3, "rank {r}");
        assert!(
            note.contains("host \"host-a\" has 2 ranks and host \"host-b\" 1")
                && note.contains("every rank is its own host"),
            "rank {r}: {note}"
        );
        assert!(v.iter().all(|&x| x == 6.0), "rank {r}");
    }
}

/// Programmatic dependent launch falls back to plain launches for good once the driver
/// refuses one (nothing was launched then), but a lost context is an error of the call.
#[test]
fn dependent_launch_falls_back_once_refused_but_not_on_a_lost_context() {
    use super::gpu::Pdl;
    let off = Pdl::new(false);
    assert!(off.launch(|| panic!("must not launch when off")).is_none());

    let pdl = Pdl::new(true);
    assert!(matches!(pdl.launch(|| Ok(())), Some(Ok(()))));
    let lost = pdl.launch(|| Err(CommError::ContextLost("trap".into())));
    assert!(
        matches!(lost, Some(Err(CommError::ContextLost(_)))),
        "{lost:?}"
    );
    assert!(pdl.is_on(), "a lost context says nothing about PDL");
    let refused = pdl.launch(|| Err(CommError::InvalidArgument("not supported".into())));
    assert!(refused.is_none(), "{refused:?}");
    assert!(!pdl.is_on());
    assert!(pdl.launch(|| panic!("off for good")).is_none());
}

/// Only small grids go out as dependents: the latency cases fit, large grids do not.
#[test]
fn only_small_grids_are_launched_as_dependents() {
    use super::gpu::{PDL_MAX_THREADS, dependent_grid};
    assert!(dependent_grid(1, 64));
    assert!(
        dependent_grid(16, 1024),
        "one-shot at 128 KiB: 16 blocks of 1024"
    );
    let (b, t) = one_shot_grid(128 << 10, 512, u32::MAX);
    assert!(
        dependent_grid(b, t),
        "one-shot at 128 KiB: {b} blocks of {t}"
    );
    assert!(dependent_grid((PDL_MAX_THREADS / 512) as u32, 512));
    assert!(!dependent_grid((PDL_MAX_THREADS / 512) as u32 + 1, 512));
    assert!(!dependent_grid(128, 512), "all-pairs at 4 MB");
    assert!(!dependent_grid(u32::MAX, u32::MAX), "no overflow");
}

/// One-shot's grid (all LL-packet launches): whole warps, at least two (block 0's first warp
/// carries the descriptors and no data), within the configured threads and the block cap,
/// and a data thread per unit unless the cap stops it, with no block more than that needs.
#[test]
fn one_shot_grids_hold_every_unit_beside_a_data_free_descriptor_warp() {
    let most = mscclpp_device::collectives::MAX_BLOCKS as u32;
    for threads in [32u32, 64, 256, 512] {
        for cap in [1u32, 3, u32::MAX] {
            for bytes in (0..=2048)
                .step_by(8)
                .chain([4 << 10, 64 << 10, 256 << 10, 1 << 20])
            {
                let (b, t) = one_shot_grid(bytes, threads, cap);
                let units = bytes.div_ceil(8).max(1) as u64;
                let what = format!("{bytes} B, {threads} threads, cap {cap}: {b} x {t}");
                assert!(
                    t.is_multiple_of(32) && (64..=threads.max(64)).contains(&t),
                    "{what}"
                );
                assert!((1..=cap.min(most)).contains(&b), "{what}");
                let data = b as u64 * t as u64 - 32;
                assert!(data >= units || b == cap.min(most), "{what}");
                assert!(b == 1 || (b as u64 - 1) * (t as u64) < units + 32, "{what}");
            }
        }
    }
}

/// Collectives and send/recv across hosts over IB: 6 thread ranks as 3 interleaved
/// simulated hosts of 2 (host `r % 3`), every rank with its own device on the fake fabric,
/// `cross_transport` IB: the channels between hosts are IB queue pairs, and all-reduce
/// (cross-host step forced to `algo`), all-gather, reduce-scatter, reduce, broadcast,
/// all-to-all and a send/recv ring across hosts give the CPU reference's results.
fn across_hosts_over_ib_on_the_fake_fabric(algo: AllReduceAlgo) {
    use crate::transport::ib::fake::{FakeFabric, FakeVerbs};
    use std::sync::Arc;
    const N: usize = 6;
    let fabric = FakeFabric::new();
    let id = create_unique_id().unwrap();
    let value = |r: usize, i: usize| ((r * 7 + i * 3) % 11) as f32 - 5.0;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..N)
            .map(|r| {
                let fabric = &fabric;
                s.spawn(move || {
                    let c = comm_config();
                    let host = format!("ib-host-{}", r % 3);
                    let bs = BlockingBootstrap::init_with_config(
                        N,
                        r,
                        id,
                        c.bootstrap.clone().with_host_id(host),
                    )
                    .unwrap();
                    let mut comm = Communicator::from_bootstrap(bs, Backend::Host, c).unwrap();
                    comm.use_ib_verbs(Arc::new(FakeVerbs::new(fabric)));
                    let config = CollConfig {
                        scratch_bytes: 64 << 10,
                        cross_transport: CrossTransport::Ib,
                        all_reduce_algo: algo,
                        ..small()
                    };
                    let coll = Collectives::new(comm, config).unwrap();
                    assert_eq!(coll.hosts(), 3);
                    let ib = coll
                        .communicator()
                        .connections()
                        .iter()
                        .filter(|k| k.transport() == TransportKind::Ib)
                        .count();
                    // Two partners (cross step) and two channels per rank on another host.
                    assert_eq!(ib, 2 + 2 * 4, "rank {r}: IB channels");
                    for count in [1usize, 5, 3001] {
                        let send: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
                        let want: Vec<f32> = (0..count)
                            .map(|i| (0..N).map(|q| value(q, i)).sum())
                            .collect();
                        let mut out = vec![0f32; count];
                        coll.all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)
                            .unwrap();
                        assert_eq!(out, want, "rank {r}: {algo:?} all-reduce of {count}");
                        // Reduce to rank 4 (written there only), then reduce-scatter and
                        // all-to-all of N blocks of `count`.
                        let mut red = vec![7f32; count];
                        coll.reduce(&send, &mut red, ReduceOp::Sum, 4, Exec::Host)
                            .unwrap();
                        if r == 4 {
                            assert_eq!(red, want, "rank {r}: reduce of {count}");
                        } else {
                            assert!(red.iter().all(|&x| x == 7.0), "rank {r}: reduce wrote");
                        }
                        let blocks: Vec<f32> = (0..N * count).map(|i| value(r, i)).collect();
                        let mut rs = vec![0f32; count];
                        coll.reduce_scatter(&blocks, &mut rs, ReduceOp::Max, Exec::Host)
                            .unwrap();
                        assert!(
                            (0..count).all(|i| {
                                let at = r * count + i;
                                let max = (0..N).map(|q| value(q, at)).fold(f32::MIN, f32::max);
                                rs[i] == max
                            }),
                            "rank {r}: reduce-scatter (max) of {count}"
                        );
                        let mut a2a = vec![0f32; N * count];
                        coll.all_to_all(&blocks, &mut a2a, Exec::Host).unwrap();
                        assert!(
                            (0..N).all(|q| (0..count)
                                .all(|i| a2a[q * count + i] == value(q, r * count + i))),
                            "rank {r}: all-to-all of {count}"
                        );
                        let mut all = vec![0f32; N * count];
                        coll.all_gather(&send, &mut all, Exec::Host).unwrap();
                        for q in 0..N {
                            assert!(
                                (0..count).all(|i| all[q * count + i] == value(q, i)),
                                "rank {r}: all-gather block {q}"
                            );
                        }
                        let mut b = vec![0f32; count];
                        coll.broadcast(&send, &mut b, 4, Exec::Host).unwrap();
                        assert!(
                            (0..count).all(|i| b[i] == value(4, i)),
                            "rank {r}: broadcast"
                        );
                        // A ring across hosts: r + 1 is always on another host.
                        let (next, prev) = ((r + 1) % N, (r + N - 1) % N);
                        let mut got = vec![0f32; count];
                        let ops = [
                            P2pOp::Send {
                                buf: send.as_ptr() as u64,
                                count,
                                dtype: DataType::F32,
                                peer: next,
                            },
                            P2pOp::Recv {
                                buf: got.as_mut_ptr() as u64,
                                count,
                                dtype: DataType::F32,
                                peer: prev,
                            },
                        ];
                        // SAFETY: the buffers outlive the blocking call.
                        unsafe { coll.group(&ops, Exec::Host) }.unwrap();
                        assert!(
                            (0..count).all(|i| got[i] == value(prev, i)),
                            "rank {r}: send/recv of {count} from {prev}"
                        );
                    }
                    coll.communicator().bootstrap().barrier().unwrap();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}

/// A rank that sends across hosts over IB (eagerly: the send returns before the receive is
/// posted) and drops its collectives at once leaves its writes complete (the signals flush,
/// and a stopping proxy's `finish` completes anything posted after), so the message arrives
/// whole when the receiver asks for it only after the sender left. Two thread ranks as two
/// simulated hosts on the fake fabric, which runs a write only when its sender polls.
#[test]
fn a_send_across_hosts_over_ib_lands_though_its_sender_left_at_once() {
    use crate::transport::ib::fake::{FakeFabric, FakeVerbs};
    use std::sync::Arc;
    const COUNT: usize = 3001;
    let fabric = FakeFabric::new();
    let id = create_unique_id().unwrap();
    let value = |i: usize| (i % 97) as f32 - 40.0;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let fabric = &fabric;
                s.spawn(move || {
                    let c = comm_config();
                    let bs = BlockingBootstrap::init_with_config(
                        2,
                        r,
                        id,
                        c.bootstrap.clone().with_host_id(format!("ib-leave-{r}")),
                    )
                    .unwrap();
                    let mut comm = Communicator::from_bootstrap(bs, Backend::Host, c).unwrap();
                    comm.use_ib_verbs(Arc::new(FakeVerbs::new(fabric)));
                    let config = CollConfig {
                        scratch_bytes: 64 << 10,
                        cross_transport: CrossTransport::Ib,
                        ..small()
                    };
                    let coll = Collectives::new(comm, config).unwrap();
                    assert_eq!(coll.hosts(), 2);
                    if r == 0 {
                        let send: Vec<f32> = (0..COUNT).map(value).collect();
                        coll.send(&send, 1, Exec::Host).unwrap();
                        drop(coll);
                    } else {
                        std::thread::sleep(Duration::from_millis(300));
                        let mut got = vec![0f32; COUNT];
                        coll.recv(&mut got, 0, Exec::Host).unwrap();
                        for (i, g) in got.iter().enumerate() {
                            assert_eq!(*g, value(i), "element {i}");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}

#[test]
fn across_hosts_over_ib_on_the_fake_fabric_two_shot() {
    across_hosts_over_ib_on_the_fake_fabric(AllReduceAlgo::TwoShot);
}

#[test]
fn across_hosts_over_ib_on_the_fake_fabric_one_shot() {
    across_hosts_over_ib_on_the_fake_fabric(AllReduceAlgo::OneShot);
}

#[test]
fn a_timeout_across_hosts_names_too_few_work_queues() {
    use super::cross::work_queue_hint;
    assert_eq!(work_queue_hint(None), None);
    assert_eq!(work_queue_hint(Some("8")), None);
    assert_eq!(work_queue_hint(Some("4")), None);
    for low in ["1", "3", "0", "lots"] {
        let hint = work_queue_hint(Some(low)).expect(low);
        assert!(
            hint.contains(&format!("CUDA_DEVICE_MAX_CONNECTIONS={low}"))
                && hint.contains("set it to 8"),
            "{hint}"
        );
    }
}

#[test]
fn a_proxy_channel_timeout_on_a_gpu_names_too_few_work_queues() {
    use super::failure::proxy_wait_hint;
    let one = || Some("1".to_string());
    for place in [fault::AT_PROXY, fault::AT_PROXY_QUEUE] {
        let hint = proxy_wait_hint(place, true, one).expect("a hint");
        assert!(hint.contains("CUDA_DEVICE_MAX_CONNECTIONS=1"), "{hint}");
        assert_eq!(proxy_wait_hint(place, true, || None), None);
        assert_eq!(proxy_wait_hint(place, true, || Some("8".into())), None);
        // The Host backend has no work queues.
        assert_eq!(proxy_wait_hint(place, false, one), None);
    }
    // Waits that are not for the proxy's copies.
    for place in [fault::AT_SEMAPHORE, fault::AT_PACKET, fault::AT_PROXY_FLUSH] {
        assert_eq!(proxy_wait_hint(place, true, one), None);
    }
}

/// A reduction across hosts that this rank's own reducing blocks did not finish (every
/// partner's payload had come) is named as this rank's, blaming no partner, where a wait for
/// a partner's round names that partner.
#[test]
fn a_stalled_own_reduction_across_hosts_blames_no_partner() {
    use crate::communicator::FaultRecord;
    use mscclpp_device::collectives::desc;
    use mscclpp_device::collectives::types::{dtype, op};
    assert!(super::cross::is_cross(fault::AT_CROSS_REDUCE));
    let id = create_unique_id().unwrap();
    std::thread::scope(|s| {
        for r in 0..2usize {
            s.spawn(move || {
                let coll = rank_on_host(2, r, id, &format!("reduce-host-{r}"));
                let mut v = vec![1f32; 1001];
                coll.all_reduce_in_place(&mut v, ReduceOp::Sum, Exec::Host)
                    .unwrap();
                let me = coll.cross().unwrap().topo.host;
                let tag = desc::tag(desc::ALL_REDUCE, dtype::F32 as u64, op::SUM as u64 + 1, 0);
                let record = |peer: usize, place: u64| FaultRecord {
                    kind: fault::TIMEOUT,
                    seq: 1,
                    peer,
                    own: [1001, tag],
                    theirs: [0; 2],
                    place,
                };
                let other = 1 - r;
                let own = coll
                    .cross_error("all_reduce", &record(me, fault::AT_CROSS_REDUCE))
                    .to_string();
                assert!(
                    own.contains(&format!("rank {r}: every partner's part"))
                        && own.contains("own reducing blocks")
                        && !own.contains(&format!("rank {other}"))
                        && !own.contains("did not take part"),
                    "rank {r}: {own}"
                );
                let partner = coll
                    .cross_error("all_reduce", &record(1 - me, fault::AT_CROSS))
                    .to_string();
                assert!(
                    partner.contains(&format!("for rank {other}"))
                        && partner.contains("did not take part"),
                    "rank {r}: {partner}"
                );
                coll.communicator().bootstrap().barrier().unwrap();
            });
        }
    });
}

#[test]
fn the_cross_buffer_setting_is_host_or_device() {
    let host = |v: &str| {
        crate::settings::Settings::from_vars([("MSCCLPP_CROSS_BUFFER", v)])
            .map(|s| CollConfig::from_settings(&s).cross_buffer_host)
    };
    assert!(CollConfig::default().cross_buffer_host);
    assert!(host("host").unwrap());
    assert!(host(" host\n").unwrap());
    assert!(host("").unwrap(), "blank: the default");
    assert!(!host("device").unwrap());
    for bad in ["gpu", "1"] {
        let e = host(bad).unwrap_err().to_string();
        assert!(
            e.contains("MSCCLPP_CROSS_BUFFER") && e.contains("`host` or `device`"),
            "{bad:?}: {e}"
        );
    }
}

#[test]
fn ranks_sharing_a_gpu_split_its_multiprocessors() {
    // One rank per device: no cap (the config's max_blocks stands).
    assert_eq!(share_cap(1, 132), u32::MAX);
    // Four ranks on an H200 (132 multiprocessors, one 512-thread block each): 33 blocks
    // each, so the four kernels fit at once (4 * 33 <= 132).
    assert_eq!(share_cap(4, 132), 33);
    assert!(4 * share_cap(4, 132) <= 132);
    assert_eq!(share_cap(2, 132), 66);
    // More ranks than multiprocessors: still one block each.
    assert_eq!(share_cap(200, 132), 1);
}

#[test]
fn synchronize_returns_on_an_abort_while_the_stream_never_finishes() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    // A stream that finishes on the fifth query: done, whatever the abort flag says later.
    let queries = AtomicUsize::new(0);
    let w = wait_idle(
        || Ok::<_, ()>(queries.fetch_add(1, Ordering::Relaxed) >= 4),
        || false,
    );
    assert_eq!(w, Waited::Done);
    assert_eq!(queries.load(Ordering::Relaxed), 5);
    // A failed query ends the wait too (the caller synchronises to learn the error).
    assert_eq!(wait_idle(|| Err::<bool, _>("lost"), || false), Waited::Done);
    // Work that never runs (kernels that cannot start on a shared GPU): before, a plain
    // cuStreamSynchronize waited forever; the abort raised 30 ms in ends the wait.
    // The wait runs on a thread of its own, so that a wait that never ends fails the test
    // (after 10 s) instead of hanging it.
    let abort = std::sync::Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = abort.clone();
    std::thread::spawn(move || {
        let _ = tx.send(wait_idle(
            || Ok::<_, ()>(false),
            || waiting.load(Ordering::Acquire),
        ));
    });
    std::thread::sleep(Duration::from_millis(30));
    abort.store(true, Ordering::Release);
    let w = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the wait did not end on the abort");
    assert_eq!(w, Waited::Aborted);
}

#[test]
fn the_block_cap_is_read_from_every_rank_and_counts_ranks_per_device() {
    let dev = |sms: u32, bus: &str, machine: &str| format!("{sms} {bus} {machine}").into_bytes();
    let a = dev(132, "0000:19:00", "m0/boot");
    let b = dev(132, "0000:3b:00", "m0/boot");
    // One rank per device: no cap.
    assert_eq!(block_cap_of(&[a.clone(), b.clone()]), u32::MAX);
    // The same bus id on two machines is two devices.
    assert_eq!(
        block_cap_of(&[a.clone(), dev(132, "0000:19:00", "m1/boot")]),
        u32::MAX
    );
    // Four ranks on one device (e.g. two simulated hosts of two on one GPU: the machine,
    // not the host id, is in the key): 33 blocks each, 4 * 33 <= 132.
    assert_eq!(block_cap_of(&vec![a.clone(); 4]), 33);
    // Two ranks share device a, one is alone on b: every rank gets the shared device's cap.
    assert_eq!(block_cap_of(&[a.clone(), a.clone(), b.clone()]), 66);
    // The smallest device of the job sets it (every rank the same grids).
    let small = dev(78, "0000:5d:00", "m0/boot");
    assert_eq!(block_cap_of(&[a.clone(), a, small]), 39);
    // Without a GPU (empty entries): no cap.
    assert_eq!(block_cap_of(&[Vec::new(), Vec::new()]), u32::MAX);
}

/// Programmatic dependent launch: on for one rank per GPU unless `MSCCLPP_PDL=0`; off when
/// ranks share the GPU unless `MSCCLPP_PDL=1`, and their block cap is halved on every rank
/// once any rank set `1` (two grids per rank must fit; grids equal everywhere).
#[test]
fn dependent_launch_plan_follows_the_variable_and_the_shared_gpu_cap() {
    use super::gpu::pdl_plan;
    use crate::settings::{PdlMode, Settings};
    let read = |v: &str| Settings::from_vars([("MSCCLPP_PDL", v)]).map(|s| s.pdl);
    for (ok, pdl) in [
        ("", PdlMode::Auto),
        (" 0", PdlMode::Off),
        ("1 ", PdlMode::On),
        ("AUTO", PdlMode::Auto),
    ] {
        assert_eq!(read(ok), Ok(pdl), "{ok:?}");
    }
    for bad in ["abc", "-1", "2", "yes"] {
        let e = read(bad).unwrap_err().to_string();
        assert!(e.contains(&format!("MSCCLPP_PDL={bad:?}")), "{e}");
    }
    let alone = u32::MAX;
    assert_eq!(pdl_plan(PdlMode::Auto, alone, false), (true, alone));
    assert_eq!(pdl_plan(PdlMode::On, alone, false), (true, alone));
    assert_eq!(pdl_plan(PdlMode::Off, alone, false), (false, alone));
    assert_eq!(
        pdl_plan(PdlMode::Auto, 33, false),
        (false, 33),
        "four ranks on 132 SMs"
    );
    assert_eq!(pdl_plan(PdlMode::Off, 33, false), (false, 33));
    assert_eq!(pdl_plan(PdlMode::On, 33, true), (true, 16));
    assert_eq!(pdl_plan(PdlMode::On, 66, true), (true, 33));
    assert_eq!(
        pdl_plan(PdlMode::Auto, 66, true),
        (false, 33),
        "another rank set 1"
    );
    assert_eq!(
        pdl_plan(PdlMode::Off, 66, true),
        (false, 33),
        "another rank set 1"
    );
    assert_eq!(
        pdl_plan(PdlMode::On, 1, true),
        (true, 1),
        "never below one block"
    );
}

#[test]
fn p2p_peers_variable_parses_absolute_and_relative_ranks() {
    use super::send_recv_proxy::peers_of;
    use crate::settings::Settings;
    let parse_peers = |v: &str, rank: usize, nranks: usize| {
        Settings::from_vars([("MSCCLPP_P2P_PEERS", v)])
            .map_err(|e| e.to_string())
            .and_then(|s| peers_of(&s.p2p_peers, rank, nranks).map_err(|e| e.to_string()))
    };
    // Rank 8 of 24 (three stages of 8).
    assert_eq!(parse_peers("+8,-8", 8, 24).unwrap(), Some(vec![16, 0]));
    // Relative ranks outside the job are skipped, so the last stage names only one.
    assert_eq!(parse_peers("+8, -8", 16, 24).unwrap(), Some(vec![8]));
    assert_eq!(parse_peers("3 17", 0, 24).unwrap(), Some(vec![3, 17]));
    assert_eq!(parse_peers(" none ", 0, 24).unwrap(), Some(vec![]));
    assert_eq!(parse_peers("ALL", 0, 24).unwrap(), None);
    assert_eq!(parse_peers("", 0, 24).unwrap(), None);
    for (v, why) in [
        ("24", "rank 24 is not a rank (there are 24 ranks)"),
        ("x", "\"x\" is not a rank"),
        ("+", "\"+\" is not a rank"),
        ("1,-", "\"-\" is not a rank"),
    ] {
        let e = parse_peers(v, 0, 24).unwrap_err();
        assert!(
            e.contains("MSCCLPP_P2P_PEERS") && e.contains(why),
            "{v:?}: {e}"
        );
    }
}

#[test]
fn machines_not_alike_are_cut_into_groups_of_one_size() {
    use super::topology::group_hosts;
    let ids: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    // Alike machines of at most 8 ranks: used as they are.
    let (g, note) = group_hosts(vec![vec![0, 1], vec![2, 3]], &ids);
    assert_eq!((g, note), (vec![vec![0, 1], vec![2, 3]], None));
    // 4 + 2: groups of 2, ordered by their lowest rank.
    let (g, note) = group_hosts(vec![vec![0, 2, 4, 6], vec![1, 3]], &ids);
    assert_eq!(g, vec![vec![0, 2], vec![1, 3], vec![4, 6]]);
    let note = note.unwrap();
    assert!(
        note.contains("host \"a\" has 4 ranks and host \"b\" 2")
            && note.contains("groups of 2 ranks")
            && note.contains("3 groups in all"),
        "{note}"
    );
    // One machine of 10: two groups of 5 (the largest divisor of at most 8).
    let (g, note) = group_hosts(vec![(0..10).collect()], &ids);
    assert_eq!(g, vec![(0..5).collect::<Vec<_>>(), (5..10).collect()]);
    assert!(note.unwrap().contains("more than the 8"));
    // 16 and 8: groups of 8.
    let (g, _) = group_hosts(vec![(0..16).collect(), (16..24).collect()], &ids);
    assert_eq!(g.len(), 3);
    assert!(g.iter().all(|r| r.len() == 8));
    // 2 + 1: every rank its own host, as before.
    let (g, note) = group_hosts(vec![vec![0, 1], vec![2]], &ids);
    assert_eq!(g, vec![vec![0], vec![1], vec![2]]);
    assert!(note.unwrap().contains("every rank is its own host"));
    // 6 + 9 (gcd 3), 7 + 14 (gcd 7), 12 + 18 (gcd 6).
    for (a, b, size) in [(6, 9, 3), (7, 14, 7), (12, 18, 6)] {
        let (g, _) = group_hosts(vec![(0..a).collect(), (a..a + b).collect()], &ids);
        assert!(g.iter().all(|r| r.len() == size), "{a} + {b}: {g:?}");
        assert_eq!(g.len(), (a + b) / size, "{a} + {b}");
    }
}
