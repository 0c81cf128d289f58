//! Proxy channels between two processes, one GPU each (both on GPU 0 when the machine has
//! one: CUDA IPC works within a device too), over P2P and over TCP (each rank then a
//! simulated host of its own, so the bytes go device -> pinned host slot -> socket ->
//! pinned host slot -> device). Random data checked by the receiving kernel word by word;
//! all-gather checked on the host. Skips with a reason without a GPU; fails instead under
//! MSCCLPP_REQUIRE_GPU=1.

use std::time::Duration;

use mscclpp::device::kernels::proxy_test::{STATUS_ABORTED, STATUS_LEFT, STATUS_REFUSED};
use mscclpp::device::kernels::smoke::probe_value;
use mscclpp::host::bootstrap::BlockingBootstrap;
use mscclpp::host::communicator::{
    Backend, CommConfig, Communicator, DevConnArg, MemoryChannelArg,
};
use mscclpp::host::cuda::{DeviceBuffer, KernelModule, LaunchConfig, PushKernelArg};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::{gpu_or_skip, run_test_ranks_env};
use mscclpp::host::transport::TransportKind;

mod common;

const ROLE: &str = "MSCCLPP_TEST_ROLE";

fn run_two(test: &str) {
    run_two_env(test, &[]);
}

fn run_two_env(test: &str, env: &[(&str, &str)]) {
    if gpu_or_skip(test, 0).is_none() {
        return;
    }
    let output = run_test_ranks_env(test, 2, ROLE, Duration::from_secs(240), env);
    println!("{}", output.join("\n"));
}

fn gpu_communicator() -> Communicator {
    gpu_communicator_on(TransportKind::P2p)
}

/// This rank's GPU communicator; for TCP on a simulated host of its own.
fn gpu_communicator_on(transport: TransportKind) -> Communicator {
    let launch = Launch::from_env().unwrap();
    let bs = if transport == TransportKind::Tcp {
        let config = launch
            .config()
            .with_host_id(format!("sim-gpu-host-{}", launch.rank));
        BlockingBootstrap::init_with_config(launch.nranks, launch.rank, launch.root, config)
            .unwrap()
    } else {
        launch.blocking_bootstrap().unwrap()
    };
    let backend = Backend::auto(bs.local_rank()).unwrap();
    assert!(
        matches!(backend, Backend::Gpu(_)),
        "rank {} found no GPU",
        bs.rank()
    );
    let config = CommConfig {
        device_timeout: Duration::from_secs(60),
        ..CommConfig::default()
    };
    Communicator::from_bootstrap(bs, backend, config).unwrap()
}

/// Ping-pong of `(words, rounds)` per launch over `transport`, checked word by word by the
/// receiving kernel; the time per round is printed (with two processes on one GPU it is the
/// driver's time slice, not the channel's).
fn ping_pong_rank(transport: TransportKind, sizes: &[(usize, u64)]) {
    ping_pong_rank_on(transport, sizes, false)
}

/// `mapped`: the buffer is host-mapped memory (`alloc_mapped_buffer`, TCP only), which the
/// kernel writes and reads over PCIe and the sockets directly.
fn ping_pong_rank_on(transport: TransportKind, sizes: &[(usize, u64)], mapped: bool) {
    let mut comm = gpu_communicator_on(transport);
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let max = sizes.iter().map(|s| s.0).max().unwrap();
    let buf = if mapped {
        let b = comm.alloc_mapped_buffer(max * 8).unwrap();
        assert!(b.is_mapped());
        // Host-mapped memory serves TCP proxy channels only.
        let e = comm
            .connect_memory(peer, &b, 7, TransportKind::P2p, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("host-mapped buffer"), "{e}");
        b
    } else {
        comm.alloc_buffer(max * 8).unwrap()
    };
    comm.connect(peer, &buf, 0, transport).unwrap();
    comm.connection_setup().unwrap();
    let conn = DevConnArg(comm.device_connections()[0]);
    comm.proxy_launch().unwrap();
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let f = module.function("proxy_ping_pong").unwrap();
    let errors = DeviceBuffer::zeroed(&gpu, 8).unwrap();
    let stream = gpu.new_stream().unwrap();
    let (pbuf, perr) = (buf.device_ptr().unwrap(), errors.device_ptr());
    for (k, &(words, rounds)) in sizes.iter().enumerate() {
        let (rank, seed) = (me as u32, 0x5eed + k as u64);
        let mut l = stream.launch_builder(&f);
        l.arg(&conn)
            .arg(&pbuf)
            .arg(&words)
            .arg(&rounds)
            .arg(&rank)
            .arg(&seed)
            .arg(&perr);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let t = std::time::Instant::now();
        // SAFETY: the connection, buffer and counter belong to `comm`/this scope and outlive
        // the synchronize below.
        unsafe { l.launch(cfg) }.unwrap();
        stream.synchronize().unwrap();
        let us = t.elapsed().as_secs_f64() * 1e6 / rounds as f64;
        let mut bad = [0u64];
        errors.copy_to_host(0, &mut bad).unwrap();
        assert_eq!(
            bad[0],
            0,
            "rank {me}: {} wrong words received with {} bytes per put over {transport:?}",
            bad[0],
            words * 8
        );
        println!(
            "rank {me}: {transport:?}, {} B per put, {rounds} rounds, {us:.1} us per round",
            words * 8
        );
    }
    comm.proxy_stop().unwrap();
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

fn all_gather_rank(transport: TransportKind, chunk: usize) {
    let mut comm = gpu_communicator_on(transport);
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let (me, n) = (comm.rank(), comm.nranks());
    let buf = comm.alloc_buffer(chunk * n).unwrap();
    let mine: Vec<u64> = (0..chunk as u64 / 8)
        .map(|i| probe_value(me as u64, 3, i))
        .collect();
    buf.write(me * chunk, &mine).unwrap();
    for peer in (0..n).filter(|p| *p != me) {
        comm.connect(peer, &buf, 1, transport).unwrap();
    }
    comm.connection_setup().unwrap();
    let conns = comm.device_connections();
    let table = DeviceBuffer::alloc(&gpu, std::mem::size_of_val(conns.as_slice())).unwrap();
    table.copy_from_host(0, &conns).unwrap();
    comm.proxy_launch().unwrap();
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let f = module.function("proxy_all_gather").unwrap();
    let stream = gpu.new_stream().unwrap();
    let (ptable, nconns, rank, chunk_bytes) = (
        table.device_ptr(),
        conns.len() as u32,
        me as u32,
        chunk as u64,
    );
    let mut l = stream.launch_builder(&f);
    l.arg(&ptable).arg(&nconns).arg(&rank).arg(&chunk_bytes);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the handle table and buffers live until after the synchronize.
    unsafe { l.launch(cfg) }.unwrap();
    stream.synchronize().unwrap();
    for r in 0..n {
        let mut got = vec![0u64; chunk / 8];
        buf.read(r * chunk, &mut got).unwrap();
        for (i, w) in got.iter().enumerate() {
            assert_eq!(
                *w,
                probe_value(r as u64, 3, i as u64),
                "rank {me}: chunk {r} word {i}"
            );
        }
    }
    comm.proxy_stop().unwrap();
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

/// 8 B, 8 KiB + 8, 1 MiB + 8 and 6 MiB + 8 per put (TCP: one piece, several, odd tails).
const TCP_SIZES: [(usize, u64); 4] = [(1, 200), (1025, 100), ((1 << 17) + 1, 20), (786_433, 6)];

#[test]
fn p2p_ping_pong_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return ping_pong_rank(TransportKind::P2p, &[(1 << 14, 1000)]);
    }
    run_two("p2p_ping_pong_two_processes");
}

#[test]
fn p2p_all_gather_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return all_gather_rank(TransportKind::P2p, 1 << 20);
    }
    run_two("p2p_all_gather_two_processes");
}

#[test]
fn tcp_ping_pong_two_simulated_hosts() {
    if std::env::var(ROLE).is_ok() {
        return ping_pong_rank(TransportKind::Tcp, &TCP_SIZES);
    }
    run_two("tcp_ping_pong_two_simulated_hosts");
}

#[test]
fn tcp_ping_pong_small_chunks_three_sockets() {
    if std::env::var(ROLE).is_ok() {
        return ping_pong_rank(TransportKind::Tcp, &TCP_SIZES);
    }
    run_two_env(
        "tcp_ping_pong_small_chunks_three_sockets",
        &[("MSCCLPP_TCP_CHUNK", "65536"), ("MSCCLPP_TCP_CONNS", "3")],
    );
}

/// The same over host-mapped buffers on both sides (no staging copies, the flag a CPU
/// store), with small chunks over three sockets so that large puts stripe.
#[test]
fn tcp_ping_pong_host_mapped_buffers() {
    if std::env::var(ROLE).is_ok() {
        return ping_pong_rank_on(TransportKind::Tcp, &TCP_SIZES, true);
    }
    run_two_env(
        "tcp_ping_pong_host_mapped_buffers",
        &[("MSCCLPP_TCP_CHUNK", "65536"), ("MSCCLPP_TCP_CONNS", "3")],
    );
}

#[test]
fn tcp_all_gather_two_simulated_hosts() {
    if std::env::var(ROLE).is_ok() {
        return all_gather_rank(TransportKind::Tcp, (3 << 20) + 8);
    }
    run_two_env(
        "tcp_all_gather_two_simulated_hosts",
        &[("MSCCLPP_TCP_CHUNK", "262144")],
    );
}

fn one_thread() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// How rank 1 ends the abort tests' waits ([`user_waits_abort_rank`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// Rank 0 calls `abort()`.
    Abort,
    /// Rank 1 kills itself (`kill -9`).
    Kill,
    /// Rank 1 drops its communicator (a goodbye after its work ended).
    Leave,
}

/// Rank body of the abort tests: both ranks set up a proxy channel (over `proxy`) and a
/// memory channel (P2P) and launch the proxy; rank 0 runs `user_wait_status` (waits of 60 s for LL packets
/// and signals that never come). With [`End::Kill`], rank 1 SIGKILLs itself 300 ms later;
/// with [`End::Leave`] it drops its communicator then; with [`End::Abort`], rank 0 calls
/// `abort()` 300 ms after the launch. Rank 0 checks that all three waits ended with the
/// abort (or the departure), within a second of `abort()`.
fn user_waits_abort_rank(end: End, proxy: TransportKind) {
    let mut comm = gpu_communicator();
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let buf = comm.alloc_buffer(1 << 16).unwrap();
    comm.connect(peer, &buf, 0, proxy).unwrap();
    comm.connect_memory(peer, &buf, 1, TransportKind::P2p, 128)
        .unwrap();
    comm.connection_setup().unwrap();
    comm.proxy_launch().unwrap();
    comm.bootstrap().barrier().unwrap();
    if me == 1 {
        match end {
            End::Kill => {
                std::thread::sleep(Duration::from_millis(300));
                println!("killed at {}", common::epoch_ns());
                common::kill_self();
            }
            End::Leave => {
                std::thread::sleep(Duration::from_millis(300));
                println!("left at {}", common::epoch_ns());
                drop(comm);
                println!("rank {me}: ok");
                return;
            }
            End::Abort => {
                // Stay until rank 0 is done (it never signals us, nor we it).
                comm.bootstrap().barrier().unwrap();
                comm.proxy_stop().unwrap();
                println!("rank {me}: ok");
                return;
            }
        }
    }
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let f = module.function("user_wait_status").unwrap();
    let out = DeviceBuffer::zeroed(&gpu, 6 * 8).unwrap();
    let stream = gpu.new_stream().unwrap();
    let ch = MemoryChannelArg(comm.memory_channels()[0]);
    let conn = DevConnArg(comm.device_connections()[0]);
    let (timeout_ns, pout) = (60_000_000_000u64, out.device_ptr());
    let mut l = stream.launch_builder(&f);
    l.arg(&ch).arg(&conn).arg(&timeout_ns).arg(&pout);
    // SAFETY: the channels and `out` belong to `comm`/this scope and outlive the
    // synchronize below.
    unsafe { l.launch(one_thread()) }.unwrap();
    let at = if end == End::Abort {
        std::thread::sleep(Duration::from_millis(300));
        let t = std::time::Instant::now();
        comm.abort();
        Some(t)
    } else {
        None
    };
    stream.synchronize().unwrap();
    println!("waits ended at {}", common::epoch_ns());
    if let Some(t) = at {
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "the waits ended {took:?} after abort()"
        );
    }
    let mut got = [0u64; 6];
    out.copy_to_host(0, &mut got).unwrap();
    let (status, detail) = match end {
        End::Abort => (STATUS_ABORTED, u64::MAX),
        End::Kill => (STATUS_ABORTED, 1 + peer as u64),
        End::Leave => (STATUS_LEFT, peer as u64),
    };
    assert_eq!(
        got,
        [status, detail, status, detail, status, detail],
        "memory-channel packet and signal and proxy-channel signal wait outcomes"
    );
    println!("rank {me}: ok");
    if end == End::Kill {
        // Leave at once: closing the bootstrap politely would wait for the dead rank.
        std::process::exit(0);
    }
    if end == End::Abort {
        comm.bootstrap().barrier().unwrap();
    }
    let _ = comm.proxy_stop();
}

/// A user kernel's waits on a memory channel (LL packets, a signal) and a proxy channel end
/// within a second of `Communicator::abort()` with the abort (not at their 60 s timeout, not with a trap).
#[test]
fn p2p_user_waits_end_at_abort_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return user_waits_abort_rank(End::Abort, TransportKind::P2p);
    }
    run_two("p2p_user_waits_end_at_abort_two_processes");
}

/// A kernel that fills the FIFO (no proxy runs to pop it) and pushes once more ends that
/// push within a second of `Communicator::abort()` with the abort, and its next signal says
/// the same at once (before, the push waited out the FIFO's 60 s timeout and trapped).
#[test]
fn a_push_into_a_full_fifo_ends_at_abort_two_processes() {
    if std::env::var(ROLE).is_err() {
        return run_two("a_push_into_a_full_fifo_ends_at_abort_two_processes");
    }
    let mut comm = gpu_communicator();
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let buf = comm.alloc_buffer(1 << 16).unwrap();
    comm.connect(peer, &buf, 0, TransportKind::P2p).unwrap();
    comm.connection_setup().unwrap();
    // No proxy: nothing pops the triggers.
    comm.bootstrap().barrier().unwrap();
    if me == 0 {
        let module = KernelModule::load_builtin(&gpu).unwrap();
        let f = module.function("proxy_push_status").unwrap();
        let out = DeviceBuffer::zeroed(&gpu, 4 * 8).unwrap();
        let stream = gpu.new_stream().unwrap();
        let conn = DevConnArg(comm.device_connections()[0]);
        let (pushes, pout) = (CommConfig::default().fifo_slots as u64, out.device_ptr());
        let mut l = stream.launch_builder(&f);
        l.arg(&conn).arg(&pushes).arg(&pout);
        // SAFETY: the connection and `out` belong to `comm`/this scope and outlive the
        // synchronize below.
        unsafe { l.launch(one_thread()) }.unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let t = std::time::Instant::now();
        comm.abort();
        stream.synchronize().unwrap();
        let took = t.elapsed();
        println!("the push ended {took:?} after abort()");
        assert!(
            took < Duration::from_secs(1),
            "the push ended {took:?} after abort()"
        );
        let mut got = [0u64; 4];
        out.copy_to_host(0, &mut got).unwrap();
        assert_eq!(
            got,
            [STATUS_ABORTED, u64::MAX, STATUS_ABORTED, u64::MAX],
            "queued put with signal and signal outcomes"
        );
    }
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

/// Runs `test` (rank 1 ends the waits by itself: [`End::Kill`] or [`End::Leave`]) and
/// checks that rank 0's waits ended within a second of rank 1's line `marker`.
fn user_waits_end_after(test: &str, marker: &str, killed: bool) {
    if gpu_or_skip(test, 0).is_none() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let report = mscclpp::host::launch::LocalLauncher::command(2, exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, "rank")
        .bootstrap_timeout(Duration::from_secs(60))
        .timeout(Duration::from_secs(180))
        .capture_output(true)
        .run()
        .unwrap();
    let output = report.output.join("\n");
    println!("{output}");
    assert_eq!(
        report.ranks[1].status.success(),
        !killed,
        "rank 1's exit:\n{output}"
    );
    assert!(report.ranks[0].status.success(), "rank 0: {report}{output}");
    let stamp = |marker: &str| -> u128 {
        let line = report
            .output
            .iter()
            .find(|l| l.contains(marker))
            .unwrap_or_else(|| panic!("no `{marker}` line:\n{output}"));
        let rest = &line[line.find(marker).unwrap() + marker.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let ms = stamp("waits ended at ").saturating_sub(stamp(marker)) as f64 / 1e6;
    println!("the waits ended {ms:.1} ms after `{marker}`");
    assert!(ms < 1000.0, "{ms} ms after `{marker}`:\n{output}");
}

/// The same waits end within a second of the peer's `kill -9`, naming it (abort word 2 =
/// rank 1).
#[test]
fn p2p_user_waits_end_when_the_peer_is_killed() {
    const TEST: &str = "p2p_user_waits_end_when_the_peer_is_killed";
    if std::env::var(ROLE).is_ok() {
        return user_waits_abort_rank(End::Kill, TransportKind::P2p);
    }
    user_waits_end_after(TEST, "killed at ", true);
}

/// The same waits end within a second of the peer dropping its communicator (a goodbye
/// once its GPU work ended) with `PeerLeft { rank: 1 }` (`STATUS_LEFT`), not at their 60 s
/// timeout.
#[test]
fn p2p_user_waits_end_when_the_peer_leaves() {
    const TEST: &str = "p2p_user_waits_end_when_the_peer_leaves";
    if std::env::var(ROLE).is_ok() {
        return user_waits_abort_rank(End::Leave, TransportKind::P2p);
    }
    user_waits_end_after(TEST, "left at ", false);
}

/// The same with the proxy channel over TCP (staged through host memory): its wait, and the
/// memory channel's beside it, end with `PeerLeft` once the peer's goodbye is in and its TCP
/// streams to this rank have drained, within a second of its leaving.
#[test]
fn tcp_user_waits_end_when_the_peer_leaves() {
    const TEST: &str = "tcp_user_waits_end_when_the_peer_leaves";
    if std::env::var(ROLE).is_ok() {
        return user_waits_abort_rank(End::Leave, TransportKind::Tcp);
    }
    user_waits_end_after(TEST, "left at ", false);
}

/// Rank 0 puts 100 bytes at offset 1000 of a 1024-byte buffer and signals: the signal
/// reports the refused put (`STATUS_REFUSED`, connection 0), and the host has the error
/// before the proxy stops.
fn bad_put_rank() {
    let mut comm = gpu_communicator();
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let buf = comm.alloc_buffer(1024).unwrap();
    comm.connect(peer, &buf, 0, TransportKind::P2p).unwrap();
    comm.connection_setup().unwrap();
    comm.proxy_launch().unwrap();
    if me == 0 {
        let module = KernelModule::load_builtin(&gpu).unwrap();
        let f = module.function("proxy_put_status").unwrap();
        let out = DeviceBuffer::zeroed(&gpu, 2 * 8).unwrap();
        let stream = gpu.new_stream().unwrap();
        let conn = DevConnArg(comm.device_connections()[0]);
        let (dst, size, pout) = (1000u64, 100u64, out.device_ptr());
        let mut l = stream.launch_builder(&f);
        l.arg(&conn).arg(&dst).arg(&size).arg(&pout);
        // SAFETY: the connection and `out` outlive the synchronize below.
        unsafe { l.launch(one_thread()) }.unwrap();
        stream.synchronize().unwrap();
        let mut got = [0u64; 2];
        out.copy_to_host(0, &mut got).unwrap();
        assert_eq!(got, [STATUS_REFUSED, 0], "the signal after the bad put");
        let e = comm.proxy_error().expect("the proxy reported the put");
        for part in [
            "connection 0",
            "rank 1",
            "offset 1000",
            "100 bytes",
            "1024 bytes",
        ] {
            assert!(e.contains(part), "{part:?} missing from {e:?}");
        }
    }
    comm.bootstrap().barrier().unwrap();
    let r = comm.proxy_stop();
    assert_eq!(r.is_err(), me == 0, "{r:?}");
    println!("rank {me}: ok");
}

#[test]
fn p2p_put_outside_the_buffer_fails_the_signal_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return bad_put_rank();
    }
    run_two("p2p_put_outside_the_buffer_fails_the_signal_two_processes");
}
