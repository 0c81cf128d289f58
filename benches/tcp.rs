//! Proxy channels over the TCP transport with GPU memory, each number next to a reference
//! measured in the same run:
//!
//! - put bandwidth, 64 KB to 1 GB: two ranks (threads of this process, each a simulated
//!   host of its own, so only a network transport connects them; GPU 0 and GPU 1, or both
//!   on GPU 0), rank 0 queues puts of its device buffer into rank 1's and one signal; timed
//!   with CUDA events on rank 1's stream around its kernel, which ends when the signal
//!   (after every byte) arrives, both kernels launched together (a thread barrier); the
//!   reference is a plain copy of the same bytes between two threads over one loopback TCP
//!   socket, from host memory to host memory (what the transport would reach with no
//!   staging and one socket).
//! - 8 B ping-pong round trip through the proxies and sockets, against a plain 8-byte
//!   ping-pong between two threads over loopback TCP.
//!
//! `cargo bench --bench tcp` (skips with the reason without a GPU). `MSCCLPP_TCP_CONNS` and
//! `MSCCLPP_TCP_CHUNK` apply as to the transport. Not criterion: one measurement per size,
//! the mean of several launches after a warm-up.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Barrier;
use std::time::Instant;

use common::{events_ms, grid};
use mscclpp::host::bootstrap::{BlockingBootstrap, BootstrapConfig, UniqueId};
use mscclpp::host::communicator::{Backend, Buffer, CommConfig, Communicator, DevConnArg};
use mscclpp::host::cuda::{DeviceBuffer, Gpu, KernelModule, PushKernelArg};
use mscclpp::host::transport::TransportKind;

const MAX_BYTES: usize = 1 << 30;

fn setup(rank: usize, id: UniqueId, ngpus: usize) -> (Communicator, Gpu, Buffer) {
    let config = BootstrapConfig::default().with_host_id(format!("bench-host-{rank}"));
    let bs = BlockingBootstrap::init_with_config(2, rank, id, config).unwrap();
    let gpu = Gpu::open(rank % ngpus).unwrap();
    let config = CommConfig {
        device_timeout: std::time::Duration::from_secs(120),
        ..CommConfig::default()
    };
    let mut comm = Communicator::from_bootstrap(bs, Backend::Gpu(gpu.clone()), config).unwrap();
    let buf = comm.alloc_buffer(MAX_BYTES).unwrap();
    comm.connect(1 - rank, &buf, 0, TransportKind::Tcp).unwrap();
    comm.connection_setup().unwrap();
    comm.proxy_launch().unwrap();
    (comm, gpu, buf)
}

fn put_ms(
    comm: &Communicator,
    module: &KernelModule,
    gpu: &Gpu,
    rank: usize,
    size: u64,
    iters: u64,
    sync: &Barrier,
) -> f64 {
    let f = module.function("proxy_put_bench").unwrap();
    let stream = gpu.new_stream().unwrap();
    let conn = DevConnArg(comm.device_connections()[0]);
    let rank32 = rank as u32;
    sync.wait();
    events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&conn).arg(&size).arg(&iters).arg(&rank32);
        // SAFETY: the connection and its buffers live in `comm`, past the event synchronize.
        unsafe { l.launch(grid(1, 1)) }.unwrap();
    })
}

fn ping_pong_ms(
    comm: &Communicator,
    module: &KernelModule,
    gpu: &Gpu,
    buf: u64,
    rank: usize,
    rounds: u64,
    sync: &Barrier,
) -> f64 {
    let f = module.function("proxy_ping_pong").unwrap();
    let stream = gpu.new_stream().unwrap();
    let conn = DevConnArg(comm.device_connections()[0]);
    let errors = DeviceBuffer::zeroed(gpu, 8).unwrap();
    let (words, rank32, seed, perr) = (1usize, rank as u32, 3u64, errors.device_ptr());
    sync.wait();
    let ms = events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&conn)
            .arg(&buf)
            .arg(&words)
            .arg(&rounds)
            .arg(&rank32)
            .arg(&seed)
            .arg(&perr);
        // SAFETY: the connection and buffers live in `comm`, past the event synchronize.
        unsafe { l.launch(grid(1, 1)) }.unwrap();
    });
    let mut bad = [0u64];
    errors.copy_to_host(0, &mut bad).unwrap();
    assert_eq!(bad[0], 0, "ping-pong data corrupted");
    ms
}

/// GB/s of a plain copy of `bytes` from one thread to another over one loopback socket.
fn socket_copy_gbps(bytes: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let block = 4 << 20;
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; block];
        let mut got = 0;
        while got < bytes {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "socket closed early");
            got += n;
        }
        s.write_all(&[1]).unwrap();
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let data = vec![7u8; block];
    let t = Instant::now();
    let mut sent = 0;
    while sent < bytes {
        let n = block.min(bytes - sent);
        s.write_all(&data[..n]).unwrap();
        sent += n;
    }
    let mut ack = [0u8];
    s.read_exact(&mut ack).unwrap();
    let secs = t.elapsed().as_secs_f64();
    reader.join().unwrap();
    bytes as f64 / secs / 1e9
}

/// Mean round trip (us) of an 8-byte ping-pong between two threads over loopback TCP.
fn socket_ping_pong_us(rounds: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [0u8; 8];
        for _ in 0..rounds {
            s.read_exact(&mut b).unwrap();
            s.write_all(&b).unwrap();
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut b = [0u8; 8];
    let t = Instant::now();
    for i in 0..rounds {
        s.write_all(&(i as u64).to_le_bytes()).unwrap();
        s.read_exact(&mut b).unwrap();
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / rounds as f64;
    echo.join().unwrap();
    us
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some(ngpus) = common::gpus_or_skip("tcp") else {
        return;
    };
    let sizes: Vec<u64> = (16..=30).step_by(2).map(|p| 1u64 << p).collect();
    let results = common::two_ranks(|rank, id, sync: &Barrier| {
        let (comm, gpu, buffer) = setup(rank, id, ngpus);
        let buf = buffer.device_ptr().unwrap();
        let module = KernelModule::load_builtin(&gpu).unwrap();
        let rounds = 1000u64;
        ping_pong_ms(&comm, &module, &gpu, buf, rank, 100, sync);
        let ms = (0..3)
            .map(|_| ping_pong_ms(&comm, &module, &gpu, buf, rank, rounds, sync))
            .sum::<f64>()
            / 3.0;
        let rtt = ms * 1e3 / (rounds as f64 / 2.0);
        let mut out = vec![(0u64, rtt)];
        for &size in &sizes {
            let iters = ((2u64 << 30) / size).clamp(2, 200);
            put_ms(&comm, &module, &gpu, rank, size, iters.min(4), sync);
            let ms = (0..2)
                .map(|_| put_ms(&comm, &module, &gpu, rank, size, iters, sync))
                .sum::<f64>()
                / 2.0;
            out.push((size, size as f64 * iters as f64 / (ms * 1e-3) / 1e9));
        }
        sync.wait();
        comm.proxy_stop().unwrap();
        drop(buffer);
        (out, gpu.info().name.clone(), gpu.info().ordinal)
    });
    let (rows, name, _) = &results[0];
    // Bandwidth from rank 1, whose kernel ends when the data and the signal are in.
    let received = &results[1].0;
    println!(
        "tcp bench: rank 0 on GPU {} ({name}), rank 1 on GPU {}, simulated hosts over 127.0.0.1; \
         MSCCLPP_TCP_CONNS={} MSCCLPP_TCP_CHUNK={}",
        results[0].2,
        results[1].2,
        std::env::var("MSCCLPP_TCP_CONNS").unwrap_or_else(|_| "default".into()),
        std::env::var("MSCCLPP_TCP_CHUNK").unwrap_or_else(|_| "default".into()),
    );
    let sock_rtt = socket_ping_pong_us(20_000);
    println!(
        "ping-pong 8 B round trip, GPU kernel to GPU kernel: {:.1} us; plain loopback socket \
         (reference): {sock_rtt:.1} us; ratio {:.2}",
        rows[0].1,
        rows[0].1 / sock_rtt
    );
    println!(
        "{:>12} {:>14} {:>18} {:>7}",
        "bytes", "put GB/s", "socket copy GB/s", "ratio"
    );
    for (size, put) in &received[1..] {
        let reference = socket_copy_gbps((*size as usize).max(256 << 20));
        println!(
            "{size:>12} {put:>14.2} {reference:>18.2} {:>7.3}",
            put / reference
        );
    }
}
