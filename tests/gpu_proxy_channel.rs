//! Proxy channels over P2P between two processes, one GPU each (both on GPU 0 when the
//! machine has one: CUDA IPC works within a device too). Random data checked by the
//! receiving kernel word by word; all-gather checked on the host.
//! Skips with a reason without a GPU; fails instead under MSCCLPP_REQUIRE_GPU=1.

use std::time::Duration;

use mscclpp::device::kernels::smoke::probe_value;
use mscclpp::host::communicator::{Backend, CommConfig, Communicator, DevConnArg};
use mscclpp::host::cuda::{DeviceBuffer, KernelModule, LaunchConfig, PushKernelArg};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::{gpu_or_skip, run_test_ranks};
use mscclpp::host::transport::TransportKind;

const ROLE: &str = "MSCCLPP_TEST_ROLE";

fn run_two(test: &str) {
    if gpu_or_skip(test, 0).is_none() {
        return;
    }
    let output = run_test_ranks(test, 2, ROLE, Duration::from_secs(180));
    println!("{}", output.join("\n"));
}

fn gpu_communicator() -> Communicator {
    let launch = Launch::from_env().unwrap();
    let bs = launch.blocking_bootstrap().unwrap();
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

fn ping_pong_rank() {
    let mut comm = gpu_communicator();
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let words = 1 << 14;
    let buf = comm.alloc_buffer(words * 8).unwrap();
    comm.connect(peer, &buf, 0, TransportKind::P2p).unwrap();
    comm.connection_setup().unwrap();
    let conn = DevConnArg(comm.device_connections()[0]);
    comm.proxy_launch().unwrap();
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let f = module.function("proxy_ping_pong").unwrap();
    let errors = DeviceBuffer::zeroed(&gpu, 8).unwrap();
    let stream = gpu.new_stream().unwrap();
    let (pbuf, perr) = (buf.device_ptr().unwrap(), errors.device_ptr());
    let (rounds, rank, seed) = (1000u64, me as u32, 0x5eedu64);
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
    // SAFETY: the connection, buffer and counter belong to `comm`/this scope and outlive the
    // synchronize below.
    unsafe { l.launch(cfg) }.unwrap();
    stream.synchronize().unwrap();
    let mut bad = [0u64];
    errors.copy_to_host(0, &mut bad).unwrap();
    assert_eq!(bad[0], 0, "rank {me}: {} wrong words received", bad[0]);
    comm.proxy_stop().unwrap();
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

fn all_gather_rank() {
    let mut comm = gpu_communicator();
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let (me, n) = (comm.rank(), comm.nranks());
    let chunk = 1usize << 20;
    let buf = comm.alloc_buffer(chunk * n).unwrap();
    let mine: Vec<u64> = (0..chunk as u64 / 8)
        .map(|i| probe_value(me as u64, 3, i))
        .collect();
    buf.write(me * chunk, &mine).unwrap();
    for peer in (0..n).filter(|p| *p != me) {
        comm.connect(peer, &buf, 1, TransportKind::P2p).unwrap();
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

#[test]
fn p2p_ping_pong_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return ping_pong_rank();
    }
    run_two("p2p_ping_pong_two_processes");
}

#[test]
fn p2p_all_gather_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return all_gather_rank();
    }
    run_two("p2p_all_gather_two_processes");
}
