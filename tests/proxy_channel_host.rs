//! Proxy channels over the Host transport across processes (what CI runs end to end): the
//! test binary re-executes itself through the local launcher, one process per rank, and
//! each rank drives `DevConn`s from CPU threads.

use std::time::Duration;

use mscclpp::device::channel::DevConn;
use mscclpp::device::kernels::smoke::probe_value;
use mscclpp::host::communicator::{Backend, Buffer, CommConfig, Communicator};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::run_test_ranks;
use mscclpp::host::transport::TransportKind;

mod common;

const ROLE: &str = "MSCCLPP_TEST_ROLE";

fn child() -> bool {
    std::env::var(ROLE).is_ok()
}

fn launch(test: &str, nranks: usize) {
    run_test_ranks(test, nranks, ROLE, Duration::from_secs(120));
}

fn communicator(slots: usize) -> Communicator {
    let launch = Launch::from_env().unwrap();
    let bs = launch.blocking_bootstrap().unwrap();
    let config = CommConfig {
        fifo_slots: slots,
        device_timeout: Duration::from_secs(60),
        ..CommConfig::default()
    };
    Communicator::from_bootstrap(bs, Backend::Host, config).unwrap()
}

fn fill(buf: &Buffer, offset: usize, words: usize, seed: u64, round: u64) {
    let v: Vec<u64> = (0..words as u64)
        .map(|i| probe_value(seed, round, i))
        .collect();
    buf.write(offset, &v).unwrap();
}

fn check(buf: &Buffer, offset: usize, words: usize, seed: u64, round: u64, what: &str) {
    let mut v = vec![0u64; words];
    buf.read(offset, &mut v).unwrap();
    for (i, w) in v.iter().enumerate() {
        assert_eq!(*w, probe_value(seed, round, i as u64), "{what}: word {i}");
    }
}

/// Two processes bounce random data of several sizes for many rounds through an 8-slot FIFO
/// (many laps of wrap-around).
fn ping_pong_rank() {
    let mut comm = communicator(8);
    let me = comm.rank();
    let peer = 1 - me;
    let buf = comm.alloc_buffer(1 << 16).unwrap();
    comm.connect(peer, &buf, 0, TransportKind::Host).unwrap();
    comm.connection_setup().unwrap();
    let conn: DevConn = comm.device_connections()[0];
    comm.proxy_launch().unwrap();
    let sizes = [8usize, 1000, 1 << 16];
    for round in 1..=600u64 {
        let words = sizes[(round as usize / 2) % sizes.len()] / 8;
        if (round % 2 == 1) == (me == 0) {
            fill(&buf, 0, words, me as u64, round);
            // Several puts of one message, then one signal: data complete after wait.
            let half = (words / 2) as u64 * 8;
            conn.put(0, half);
            conn.put_with_signal(half, half, words as u64 * 8 - half);
        } else {
            conn.wait();
            check(
                &buf,
                0,
                words,
                peer as u64,
                round,
                &format!("round {round}"),
            );
        }
    }
    comm.proxy_stop().unwrap();
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

/// Every rank puts its chunk to every other rank from one CPU thread per connection, then
/// waits for all of them; repeated so the epochs advance.
fn all_gather_rank() {
    let mut comm = communicator(64);
    let (me, n) = (comm.rank(), comm.nranks());
    let chunk = 4096usize;
    let buf = comm.alloc_buffer(chunk * n).unwrap();
    for peer in (0..n).filter(|p| *p != me) {
        comm.connect(peer, &buf, 11, TransportKind::Host).unwrap();
    }
    comm.connection_setup().unwrap();
    let conns = comm.device_connections();
    comm.proxy_launch().unwrap();
    for round in 1..=20u64 {
        fill(&buf, me * chunk, chunk / 8, me as u64, round);
        std::thread::scope(|s| {
            for c in &conns {
                s.spawn(move || {
                    c.put((me * chunk) as u64, chunk as u64);
                    c.signal();
                    c.wait();
                });
            }
        });
        for r in 0..n {
            check(
                &buf,
                r * chunk,
                chunk / 8,
                r as u64,
                round,
                &format!("round {round} chunk {r}"),
            );
        }
        // Nobody may overwrite a chunk before everyone has checked it.
        comm.bootstrap().barrier().unwrap();
    }
    comm.proxy_stop().unwrap();
    println!("rank {me}: ok");
}

#[test]
fn host_ping_pong_2_processes() {
    if child() {
        return ping_pong_rank();
    }
    launch("host_ping_pong_2_processes", 2);
}

#[test]
fn host_all_gather_2_processes() {
    if child() {
        return all_gather_rank();
    }
    launch("host_all_gather_2_processes", 2);
}

#[test]
fn host_all_gather_4_processes() {
    if child() {
        return all_gather_rank();
    }
    launch("host_all_gather_4_processes", 4);
}

#[test]
fn host_all_gather_8_processes() {
    if child() {
        return all_gather_rank();
    }
    launch("host_all_gather_8_processes", 8);
}

/// Rank body of [`concurrent_waits_take_one_signal_each`]: rank 1 signals once while rank
/// 0 waits with `wait_timeout(2 s)` from 8 CPU threads of one launch, all on copies of one
/// `DevConn`; then rank 1 signals once more and rank 0 waits once. Rank 0 checks that
/// exactly one of the 8 waits took the first signal and that the second is there for the
/// single wait (no signal lost to the waits that timed out).
fn concurrent_waits_rank() {
    use mscclpp::device::arch::{Dim3, launch};
    use std::sync::atomic::{AtomicU32, Ordering};
    const WAITERS: u32 = 8;
    let mut comm = communicator(8);
    let me = comm.rank();
    let buf = comm.alloc_buffer(4096).unwrap();
    comm.connect(1 - me, &buf, 0, TransportKind::Host).unwrap();
    comm.connection_setup().unwrap();
    let conn: DevConn = comm.device_connections()[0];
    comm.proxy_launch().unwrap();
    comm.bootstrap().barrier().unwrap();
    if me == 1 {
        // After rank 0's waits have started.
        std::thread::sleep(Duration::from_millis(300));
        conn.signal();
    } else {
        let took = AtomicU32::new(0);
        launch(Dim3::x(1), Dim3::x(WAITERS), || {
            if conn.wait_timeout(2_000_000_000) {
                took.fetch_add(1, Ordering::Relaxed);
            }
        })
        .unwrap();
        let took = took.into_inner();
        assert_eq!(
            took, 1,
            "{took} of {WAITERS} concurrent waits took one signal"
        );
    }
    comm.bootstrap().barrier().unwrap();
    if me == 1 {
        conn.signal();
    } else {
        assert!(
            conn.wait_timeout(10_000_000_000),
            "the next signal is the next wait's"
        );
        assert!(!conn.poll(), "two signals, two waits");
    }
    comm.bootstrap().barrier().unwrap();
    comm.proxy_stop().unwrap();
    println!("rank {me}: ok");
}

/// Safe code cannot make one signal satisfy several waits: concurrent waits on copies of
/// one `DevConn` each take a signal of their own.
#[test]
fn concurrent_waits_take_one_signal_each() {
    if child() {
        return concurrent_waits_rank();
    }
    launch("concurrent_waits_take_one_signal_each", 2);
}

/// Rank body of [`user_waits_end_when_the_peer_is_killed`]: rank 0 runs a kernel of three
/// CPU threads that wait at once, for LL packets and a signal on a memory channel and for a
/// signal on a proxy channel, none of which its peer sends; rank 1 SIGKILLs itself 300 ms
/// in. Rank 0 prints when and how each wait ended.
fn killed_peer_rank() {
    use mscclpp::device::arch::{Dim3, launch, thread_idx_x};
    let mut comm = communicator(8);
    let me = comm.rank();
    let buf = comm.alloc_buffer(4096).unwrap();
    comm.connect(1 - me, &buf, 0, TransportKind::Host).unwrap();
    comm.connect_memory(1 - me, &buf, 1, TransportKind::Host, 256)
        .unwrap();
    comm.connection_setup().unwrap();
    comm.proxy_launch().unwrap();
    comm.bootstrap().barrier().unwrap();
    if me == 1 {
        std::thread::sleep(Duration::from_millis(300));
        println!("killed at {}", common::epoch_ns());
        common::kill_self();
    }
    let ch = comm.memory_channels()[0];
    let conn = comm.device_connections()[0];
    // Three threads wait at once: for packets and a signal on the memory channel, and for
    // a signal on the proxy channel.
    launch(Dim3::x(1), Dim3::x(3), || match thread_idx_x() {
        0 => {
            let r = ch.try_unpack_packets(0, 0, 64, 0, 1, 1, 60_000_000_000);
            println!("packet wait ended at {}: {r:?}", common::epoch_ns());
        }
        1 => {
            let r = ch.try_wait(60_000_000_000);
            println!("memory wait ended at {}: {r:?}", common::epoch_ns());
        }
        _ => {
            let r = conn.try_wait(60_000_000_000);
            println!("proxy wait ended at {}: {r:?}", common::epoch_ns());
        }
    })
    .unwrap();
    println!("reason: {:?}", comm.abort_reason());
    // Leave at once: closing the bootstrap politely would wait for the dead rank.
    std::process::exit(0);
}

/// A user kernel's waits on a memory channel (packets and signal) and a proxy channel end
/// with `ChannelError::Aborted` naming the lost rank (`word: 2` = rank 1) within a second of the
/// peer's `kill -9`, instead of at their 60 s timeout.
#[test]
fn user_waits_end_when_the_peer_is_killed() {
    const TEST: &str = "user_waits_end_when_the_peer_is_killed";
    if child() {
        return killed_peer_rank();
    }
    let exe = std::env::current_exe().unwrap();
    let report = mscclpp::host::launch::LocalLauncher::command(2, exe)
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(ROLE, "rank")
        .bootstrap_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs(120))
        .capture_output(true)
        .run()
        .unwrap();
    let output = report.output.join("\n");
    assert!(
        !report.ranks[1].status.success(),
        "rank 1 was not killed:\n{output}"
    );
    assert!(report.ranks[0].status.success(), "rank 0: {report}{output}");
    let line_of = |marker: &str| -> &String {
        report
            .output
            .iter()
            .find(|l| l.contains(marker))
            .unwrap_or_else(|| panic!("no `{marker}` line:\n{output}"))
    };
    let stamp = |marker: &str| -> u128 {
        let line = line_of(marker);
        let rest = &line[line.find(marker).unwrap() + marker.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let killed = stamp("killed at ");
    for what in [
        "packet wait ended at ",
        "memory wait ended at ",
        "proxy wait ended at ",
    ] {
        let line = line_of(what);
        assert!(line.contains("Aborted { word: 2 }"), "{line}\n{output}");
        let ms = stamp(what).saturating_sub(killed) as f64 / 1e6;
        println!("{what}{ms:.1} ms after the kill");
        assert!(ms < 1000.0, "{line}: {ms} ms after the kill\n{output}");
    }
    assert!(line_of("reason: ").contains("Lost { rank: 1"), "{output}");
}
