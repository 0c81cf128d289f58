//! Proxy channels over the TCP transport on the Host backend, across processes on
//! 127.0.0.1, each rank a simulated host of its own (its bootstrap host id), so the only
//! transport that may connect them is a network one: the test binary re-executes itself
//! through the local launcher, one process per rank.

use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::BlockingBootstrap;
use mscclpp::host::communicator::{Backend, Buffer, CommConfig, CommError, Communicator};
use mscclpp::host::launch::{Launch, LocalLauncher};
use mscclpp::host::testing::run_test_ranks_env;
use mscclpp::host::transport::TransportKind;

mod common;

const ROLE: &str = "MSCCLPP_TEST_ROLE";

fn child() -> bool {
    std::env::var(ROLE).is_ok()
}

/// Runs `test` in `nranks` processes with `env` set; returns their output (prefixed by rank).
fn launch(test: &str, nranks: usize, env: &[(&str, &str)]) -> Vec<String> {
    run_test_ranks_env(test, nranks, ROLE, Duration::from_secs(60), env)
}

/// This rank's communicator, on a simulated host of its own.
fn communicator() -> Communicator {
    let launch = Launch::from_env().unwrap();
    let config = launch
        .config()
        .with_host_id(format!("sim-host-{}", launch.rank));
    let bs = BlockingBootstrap::init_with_config(launch.nranks, launch.rank, launch.root, config)
        .unwrap();
    let config = CommConfig {
        fifo_slots: 16,
        device_timeout: Duration::from_secs(20),
        ..CommConfig::default()
    };
    Communicator::from_bootstrap(bs, Backend::Host, config).unwrap()
}

fn pattern(round: u64, from: usize, i: usize) -> u8 {
    (round as usize * 131 + from * 7 + i * 31 + (i >> 8)) as u8
}

fn read_bytes(buf: &Buffer, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    buf.read(offset, &mut v).unwrap();
    v
}

const SIZES: [usize; 12] = [
    1,
    3,
    8,
    13,
    255,
    4097,
    65_537,
    (512 << 10) + 1,
    1_000_003,
    (3 << 20) - 5,
    (8 << 20) - 9,
    8 << 20,
];
const SLACK: usize = 64;

/// Both ranks take turns: the sender fills an odd-offset source range, puts it in two puts
/// and a signal, flushes; the receiver checks every byte as soon as its wait returns (data
/// before signal, for every size) and that the bytes around the range are untouched, then
/// signals back.
fn puts_rank() {
    let mut comm = communicator();
    let me = comm.rank();
    let peer = 1 - me;
    let len = (8 << 20) + 2 * SLACK;
    let buf = comm.alloc_buffer(len).unwrap();
    comm.connect(peer, &buf, 5, TransportKind::Tcp).unwrap();
    comm.connection_setup().unwrap();
    assert_eq!(comm.connections()[0].transport(), TransportKind::Tcp);
    let conn = comm.device_connections()[0];
    comm.proxy_launch().unwrap();
    let sentinel = vec![0xeeu8; len];
    for (round, &size) in SIZES.iter().enumerate() {
        let round = round as u64 + 1;
        let src = (size * 7 + 3) % SLACK;
        let dst = (size * 5 + 1) % SLACK;
        let sending = (round % 2 == 1) == (me == 0);
        if !sending {
            buf.write(0, &sentinel).unwrap();
        }
        // The receiver has laid its sentinel before the sender starts.
        comm.bootstrap().barrier().unwrap();
        if sending {
            let data: Vec<u8> = (0..size).map(|i| pattern(round, me, i)).collect();
            buf.write(src, &data).unwrap();
            let first = size / 3;
            conn.put_at(dst as u64, src as u64, first as u64);
            conn.put_with_signal(
                (dst + first) as u64,
                (src + first) as u64,
                (size - first) as u64,
            );
            conn.flush();
            conn.wait();
        } else {
            conn.wait();
            let got = read_bytes(&buf, dst, size);
            let bad = (0..size).find(|&i| got[i] != pattern(round, peer, i));
            assert_eq!(bad, None, "size {size} offset {dst}: first wrong byte");
            let before = read_bytes(&buf, 0, dst);
            assert!(
                before.iter().all(|&b| b == 0xee),
                "size {size}: bytes before"
            );
            let after = read_bytes(&buf, dst + size, SLACK.min(len - dst - size));
            assert!(after.iter().all(|&b| b == 0xee), "size {size}: bytes after");
            conn.signal();
        }
    }
    comm.proxy_stop().unwrap();
    println!("rank {me}: ok");
}

/// Puts of 1 B to 8 MiB at odd offsets, both directions, checked byte for byte.
#[test]
fn tcp_puts_odd_sizes_and_offsets_2_hosts() {
    if child() {
        return puts_rank();
    }
    // Small chunks and three sockets: the large puts are striped over many chunks.
    launch(
        "tcp_puts_odd_sizes_and_offsets_2_hosts",
        2,
        &[("MSCCLPP_TCP_CHUNK", "65536"), ("MSCCLPP_TCP_CONNS", "3")],
    );
}

/// Every rank (each its own host) puts its chunk to every other and waits for theirs,
/// repeated so that the epochs advance; default settings.
fn all_gather_rank() {
    let mut comm = communicator();
    let (me, n) = (comm.rank(), comm.nranks());
    let chunk = 100_003usize;
    let buf = comm.alloc_buffer(chunk * n).unwrap();
    for peer in (0..n).filter(|p| *p != me) {
        comm.connect(peer, &buf, 11, TransportKind::Tcp).unwrap();
    }
    comm.connection_setup().unwrap();
    let conns = comm.device_connections();
    comm.proxy_launch().unwrap();
    for round in 1..=10u64 {
        let data: Vec<u8> = (0..chunk).map(|i| pattern(round, me, i)).collect();
        buf.write(me * chunk, &data).unwrap();
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
            let got = read_bytes(&buf, r * chunk, chunk);
            let bad = (0..chunk).find(|&i| got[i] != pattern(round, r, i));
            assert_eq!(bad, None, "round {round} chunk of rank {r}");
        }
        comm.bootstrap().barrier().unwrap();
    }
    comm.proxy_stop().unwrap();
    println!("rank {me}: ok");
}

#[test]
fn tcp_all_gather_3_hosts() {
    if child() {
        return all_gather_rank();
    }
    launch("tcp_all_gather_3_hosts", 3, &[]);
}

/// A put leaving the peer's buffer is refused by the proxy as on the other transports: the
/// kernel's next signal fails, the error names the rank and the sizes, and the peer still
/// gets the signal (without the data).
fn out_of_bounds_rank() {
    let mut comm = communicator();
    let me = comm.rank();
    let buf = comm.alloc_buffer(4096).unwrap();
    comm.connect(1 - me, &buf, 0, TransportKind::Tcp).unwrap();
    comm.connection_setup().unwrap();
    let conn = comm.device_connections()[0];
    comm.proxy_launch().unwrap();
    if me == 0 {
        conn.put_at(4092, 0, 8);
        assert!(
            conn.try_signal().is_err(),
            "the refused put was not reported"
        );
        let e = comm.proxy_error().expect("a proxy error");
        assert!(e.contains("rank 1") && e.contains("does not fit"), "{e}");
        match comm.proxy_stop() {
            Err(CommError::Proxy(errors)) => assert_eq!(errors.len(), 1, "{errors:?}"),
            other => panic!("{other:?}"),
        }
    } else {
        conn.wait();
        comm.proxy_stop().unwrap();
    }
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

#[test]
fn tcp_put_outside_the_buffer_is_refused() {
    if child() {
        return out_of_bounds_rank();
    }
    launch("tcp_put_outside_the_buffer_is_refused", 2, &[]);
}

/// Rank 1 SIGKILLs itself; rank 0 keeps putting and finds the error naming rank 1.
fn killed_peer_rank() {
    let mut comm = communicator();
    let me = comm.rank();
    let buf = comm.alloc_buffer(1 << 20).unwrap();
    comm.connect(1 - me, &buf, 0, TransportKind::Tcp).unwrap();
    comm.connection_setup().unwrap();
    let conn = comm.device_connections()[0];
    comm.proxy_launch().unwrap();
    comm.bootstrap().barrier().unwrap();
    if me == 1 {
        // Let rank 0 leave the barrier first: killed at once, rank 1 could die while rank 0
        // was still finishing it (seen once in CI: rank 0's barrier got PeerLost).
        std::thread::sleep(Duration::from_millis(300));
        common::kill_self();
    }
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    // Rank 1 dies about 100 ms into this loop, so the 2 s bound holds about 1.9 s for the
    // detection.
    let error = loop {
        conn.put(0, 1 << 20);
        let _ = conn.try_signal();
        if let Some(e) = comm.proxy_error() {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "no error 2 s after the peer was killed"
        );
    };
    println!("error after {:?}: {error}", start.elapsed());
    assert!(error.contains("rank 1"), "{error}");
    println!("rank 0: ok");
    // Leave at once: closing the bootstrap politely would wait for the dead rank.
    std::process::exit(0);
}

#[test]
fn tcp_killed_peer_is_named() {
    const TEST: &str = "tcp_killed_peer_is_named";
    if child() {
        return killed_peer_rank();
    }
    let exe = std::env::current_exe().unwrap();
    let report = LocalLauncher::command(2, exe)
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(ROLE, "rank")
        .bootstrap_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs(60))
        .capture_output(true)
        .run()
        .unwrap();
    let output = report.output.join("\n");
    assert!(report.ranks[0].status.success(), "rank 0: {report}{output}");
    assert!(
        report.output.iter().any(|l| l.ends_with("rank 0: ok")),
        "{output}"
    );
    for l in report.output.iter().filter(|l| l.contains("error after")) {
        println!("{l}");
    }
}
