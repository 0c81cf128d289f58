//! Proxy channels over the TCP transport on the GPU backend: two processes, each a simulated
//! host of its own (bootstrap host id), one GPU each (both on GPU 0 when the machine has
//! one), so the bytes go device -> pinned host slot -> socket -> pinned host slot -> device.
//! Random data checked word by word by the receiving kernel (ping-pong) and on the host
//! (all-gather), with the default chunk and with small chunks (many pieces, both slots).
//! Skips with a reason without a GPU; fails instead under MSCCLPP_REQUIRE_GPU=1.

use std::time::{Duration, Instant};

use mscclpp::device::kernels::smoke::probe_value;
use mscclpp::host::bootstrap::BlockingBootstrap;
use mscclpp::host::communicator::{Backend, CommConfig, Communicator, DevConnArg};
use mscclpp::host::cuda::{DeviceBuffer, KernelModule, LaunchConfig, PushKernelArg};
use mscclpp::host::launch::{Launch, LocalLauncher};
use mscclpp::host::testing::gpu_or_skip;
use mscclpp::host::transport::TransportKind;

const ROLE: &str = "MSCCLPP_TEST_ROLE";

/// Runs `test` in two processes with `env`; checks that both finished.
fn run_two(test: &str, env: &[(&str, &str)]) {
    if gpu_or_skip(test, 0).is_none() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut l = LocalLauncher::command(2, exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, "rank")
        .bootstrap_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs(240))
        .capture_output(true);
    for (k, v) in env {
        l = l.env(*k, *v);
    }
    let report = l.run().unwrap();
    let output = report.output.join("\n");
    assert!(report.success(), "{test}: {report}{output}");
    for r in 0..2 {
        let done = format!("rank {r}: ok");
        assert!(
            report.output.iter().any(|l| l.ends_with(&done)),
            "{test}: rank {r} did not finish:\n{output}"
        );
    }
    println!("{output}");
}

/// This rank's GPU communicator, on a simulated host of its own.
fn communicator() -> Communicator {
    let launch = Launch::from_env().unwrap();
    let config = launch
        .config()
        .with_host_id(format!("sim-gpu-host-{}", launch.rank));
    let local = launch.local_rank.unwrap_or(launch.rank);
    let bs = BlockingBootstrap::init_with_config(launch.nranks, launch.rank, launch.root, config)
        .unwrap();
    let backend = Backend::auto(local).unwrap();
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

fn ping_pong_rank() {
    let mut comm = communicator();
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    // 8 B, 8 KiB + 8, 1 MiB + 8 and 6 MiB + 8 per put: one piece, several, and odd tails.
    let sizes: [(usize, u64); 4] = [(1, 200), (1025, 100), ((1 << 17) + 1, 20), (786_433, 6)];
    let max = sizes.iter().map(|s| s.0).max().unwrap();
    let buf = comm.alloc_buffer(max * 8).unwrap();
    comm.connect(peer, &buf, 0, TransportKind::Tcp).unwrap();
    comm.connection_setup().unwrap();
    let conn = DevConnArg(comm.device_connections()[0]);
    comm.proxy_launch().unwrap();
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let f = module.function("proxy_ping_pong").unwrap();
    let errors = DeviceBuffer::zeroed(&gpu, 8).unwrap();
    let stream = gpu.new_stream().unwrap();
    let (pbuf, perr) = (buf.device_ptr().unwrap(), errors.device_ptr());
    for (k, &(words, rounds)) in sizes.iter().enumerate() {
        let (rank, seed) = (me as u32, 0x7c9 + k as u64);
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
        let t = Instant::now();
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
            "rank {me}: {} wrong words received with {} bytes per put",
            bad[0],
            words * 8
        );
        println!(
            "rank {me}: {} B per put, {rounds} rounds, {us:.1} us per round",
            words * 8
        );
    }
    comm.proxy_stop().unwrap();
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

fn all_gather_rank() {
    let mut comm = communicator();
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let (me, n) = (comm.rank(), comm.nranks());
    let chunk = (3usize << 20) + 8;
    let buf = comm.alloc_buffer(chunk * n).unwrap();
    let mine: Vec<u64> = (0..chunk as u64 / 8)
        .map(|i| probe_value(me as u64, 5, i))
        .collect();
    buf.write(me * chunk, &mine).unwrap();
    for peer in (0..n).filter(|p| *p != me) {
        comm.connect(peer, &buf, 1, TransportKind::Tcp).unwrap();
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
        let bad = got
            .iter()
            .enumerate()
            .filter(|(i, w)| **w != probe_value(r as u64, 5, *i as u64))
            .count();
        assert_eq!(bad, 0, "rank {me}: {bad} wrong words in rank {r}'s chunk");
    }
    comm.proxy_stop().unwrap();
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

#[test]
fn gpu_tcp_ping_pong_two_simulated_hosts() {
    if std::env::var(ROLE).is_ok() {
        ping_pong_rank();
    } else {
        run_two("gpu_tcp_ping_pong_two_simulated_hosts", &[]);
    }
}

#[test]
fn gpu_tcp_ping_pong_small_chunks_three_sockets() {
    if std::env::var(ROLE).is_ok() {
        ping_pong_rank();
    } else {
        run_two(
            "gpu_tcp_ping_pong_small_chunks_three_sockets",
            &[("MSCCLPP_TCP_CHUNK", "65536"), ("MSCCLPP_TCP_CONNS", "3")],
        );
    }
}

#[test]
fn gpu_tcp_all_gather_two_simulated_hosts() {
    if std::env::var(ROLE).is_ok() {
        all_gather_rank();
    } else {
        run_two(
            "gpu_tcp_all_gather_two_simulated_hosts",
            &[("MSCCLPP_TCP_CHUNK", "262144")],
        );
    }
}
