//! Calls that cannot pair because the ranks made sends, receives and collectives in
//! different orders (Host transport, one process per rank): each rank's calls run in order,
//! so a send or receive waiting for a rank that is inside a collective, which waits for it
//! in turn, can never go on. Every rank fails at once, naming the other side's call, rather
//! than waiting out the device timeout ("did not take part, or is stuck").

use mscclpp::host::collectives::Exec;
use std::time::{Duration, Instant};

use mscclpp::host::collectives::{CollConfig, Collectives, ReduceOp};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::run_test_ranks;

const ROLE: &str = "MSCCLPP_TEST_ROLE";

/// A device timeout far beyond what the errors may take, so that a wait that runs it out
/// fails the test's time check, not a limit of the launcher.
const DEVICE_TIMEOUT: Duration = Duration::from_secs(20);

/// How soon each rank must fail: the waits look at their peers every few thousand polls.
const AT_ONCE: Duration = Duration::from_secs(5);

fn collectives() -> Collectives {
    let launch = Launch::from_env().unwrap();
    let bs = launch.blocking_bootstrap().unwrap();
    let config = CommConfig {
        device_timeout: DEVICE_TIMEOUT,
        ..CommConfig::default()
    };
    let comm = Communicator::from_bootstrap(bs, Backend::Host, config).unwrap();
    let coll = CollConfig {
        scratch_bytes: 1 << 20,
        ..CollConfig::default()
    };
    Collectives::new(comm, coll).unwrap()
}

/// Checks that `r` failed within [`AT_ONCE`] of `start` with every one of `said` in its
/// error, and prints the rank's `ok` line.
fn failed_at_once(
    rank: usize,
    r: Result<(), impl std::fmt::Display>,
    start: Instant,
    said: &[&str],
) {
    let took = start.elapsed();
    let e = match r {
        Ok(()) => panic!("rank {rank}: the call succeeded"),
        Err(e) => e.to_string(),
    };
    println!("rank {rank}: failed after {took:?}: {e}");
    assert!(took < AT_ONCE, "rank {rank} took {took:?}: {e}");
    for s in said {
        assert!(e.contains(s), "rank {rank} did not say {s:?}: {e}");
    }
    assert!(!e.contains("did not take part"), "rank {rank}: {e}");
    println!("rank {rank}: ok");
}

fn receive_against_collective_main() {
    let c = collectives();
    let r = c.rank();
    let mut buf = vec![1f32; 1000];
    let start = Instant::now();
    if r == 0 {
        let e = c.recv(&mut buf, 1, Exec::Host);
        failed_at_once(
            r,
            e,
            start,
            &[
                "send/recv launch #1",
                "rank 1 called a collective (all_reduce",
            ],
        );
    } else {
        let e = c.all_reduce_in_place(&mut buf, ReduceOp::Sum, Exec::Host);
        failed_at_once(
            r,
            e,
            start,
            &[
                "collective #1 (all_reduce",
                "rank 0 waits in a send/recv group",
            ],
        );
    }
}

/// Rank 0 receives from rank 1 while rank 1 all-reduces: both fail at once.
#[test]
fn a_receive_facing_a_collective_fails_at_once_on_both_ranks() {
    const TEST: &str = "a_receive_facing_a_collective_fails_at_once_on_both_ranks";
    if std::env::var(ROLE).is_ok() {
        return receive_against_collective_main();
    }
    run_test_ranks(TEST, 2, ROLE, Duration::from_secs(120));
}

fn send_against_collective_main() {
    let c = collectives();
    let r = c.rank();
    // 4 MiB: a pipelined send, which waits for the receiver (not an eager LL send).
    let mut buf = vec![1f32; 1 << 20];
    let start = Instant::now();
    if r == 1 {
        let e = c.send(&buf, 0, Exec::Host);
        failed_at_once(r, e, start, &["rank 0 called a collective (all_reduce"]);
    } else {
        let e = c.all_reduce_in_place(&mut buf, ReduceOp::Sum, Exec::Host);
        failed_at_once(
            r,
            e,
            start,
            &[
                "collective #1 (all_reduce",
                "rank 1 waits in a send/recv group",
            ],
        );
    }
}

/// Rank 1 sends 4 MiB to rank 0 while ranks 0 and 2 all-reduce: every rank fails at once,
/// rank 2 too (it waited for rank 1's part of the collective, not for a send).
#[test]
fn a_send_facing_a_collective_fails_at_once_on_every_rank() {
    const TEST: &str = "a_send_facing_a_collective_fails_at_once_on_every_rank";
    if std::env::var(ROLE).is_ok() {
        return send_against_collective_main();
    }
    run_test_ranks(TEST, 3, ROLE, Duration::from_secs(120));
}

fn legal_orders_main() {
    let c = collectives();
    let r = c.rank();
    let mut buf = vec![1f32; 1000];
    // An eager (small) send made before a collective that its receiver makes first: legal,
    // the send ends without waiting for the receive.
    for round in 0..3 {
        if r == 1 {
            c.send(&buf, 0, Exec::Host).unwrap();
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum, Exec::Host)
                .unwrap();
        } else {
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum, Exec::Host)
                .unwrap();
            let mut got = vec![0f32; 1000];
            c.recv(&mut got, 1, Exec::Host).unwrap();
            assert!(
                got.iter().all(|&v| v == 2f32.powi(round)),
                "round {round}: {:?}",
                &got[..4]
            );
        }
    }
    println!("rank {r}: ok");
}

/// The check does not fail a legal program: a small send before a collective that the
/// receiving rank makes before its receive.
#[test]
fn an_eager_send_before_a_collective_is_not_taken_for_a_clash() {
    const TEST: &str = "an_eager_send_before_a_collective_is_not_taken_for_a_clash";
    if std::env::var(ROLE).is_ok() {
        return legal_orders_main();
    }
    run_test_ranks(TEST, 2, ROLE, Duration::from_secs(120));
}
