//! Proxy channels on GPUs, each number next to a reference measured in the same run:
//!
//! - ping-pong: two ranks (threads of this process, GPU 0 and GPU 1, or both on GPU 0 when
//!   there is one) bounce 8 bytes with `put_with_signal` / `wait` through the proxy; the
//!   round trip is the kernel time over the number of round trips. Reference: the
//!   GPU→host→GPU flag round trip of `ordering_probe` (the floor of any proxy handshake).
//! - put bandwidth, 1 KB to 1 GB: rank 0 queues puts and one signal, timed on its stream
//!   with CUDA events, against `cuMemcpyAsync` of the same bytes between the same two
//!   buffers on a stream (the copy engine, which the proxy drives).
//!
//! `cargo bench --bench proxy_channel` (skips with the reason without a GPU). Not criterion:
//! one measurement per size is what a sweep to 1 GB affords; each is the mean of several
//! launches after a warm-up.

mod common;

use std::sync::Barrier;

use common::{events_ms, grid};
use mscclpp::host::bootstrap::UniqueId;
use mscclpp::host::communicator::{Communicator, DevConnArg};
use mscclpp::host::cuda::{DeviceBuffer, Gpu, KernelModule, PushKernelArg, memcpy_async};
use mscclpp::host::transport::TransportKind;

const MAX_BYTES: usize = 1 << 30;

struct Rank {
    comm: Communicator,
    gpu: Gpu,
    module: KernelModule,
    conn: DevConnArg,
    buf_ptr: u64,
    peer_buf_ptr: u64,
}

fn setup(rank: usize, id: UniqueId, ngpus: usize) -> Rank {
    let (mut comm, gpu) = common::communicator(rank, id, ngpus);
    let buf = comm.alloc_buffer(MAX_BYTES).unwrap();
    comm.connect(1 - rank, &buf, 0, TransportKind::P2p).unwrap();
    comm.connection_setup().unwrap();
    let conn = DevConnArg(comm.device_connections()[0]);
    let ptrs = comm
        .bootstrap_all_gather(&buf.device_ptr().unwrap().to_le_bytes())
        .unwrap();
    let peer_buf_ptr = u64::from_le_bytes(ptrs[1 - rank][..8].try_into().unwrap());
    comm.proxy_launch().unwrap();
    let module = KernelModule::load_builtin(&gpu).unwrap();
    // The connection keeps a clone of `buf`, so its memory outlives this function.
    let buf_ptr = buf.device_ptr().unwrap();
    Rank {
        comm,
        gpu,
        module,
        conn,
        buf_ptr,
        peer_buf_ptr,
    }
}

/// Ping-pong of 8 bytes for `rounds` rounds; returns rank 0's kernel time in ms.
fn ping_pong(r: &Rank, rank: usize, rounds: u64, sync: &Barrier) -> f64 {
    let f = r.module.function("proxy_ping_pong").unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let errors = DeviceBuffer::zeroed(&r.gpu, 8).unwrap();
    let (words, rank32, seed, perr) = (1usize, rank as u32, 1u64, errors.device_ptr());
    sync.wait();
    let ms = events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&r.conn)
            .arg(&r.buf_ptr)
            .arg(&words)
            .arg(&rounds)
            .arg(&rank32)
            .arg(&seed)
            .arg(&perr);
        // SAFETY: the connection and buffers live in `r`, past the event synchronize.
        unsafe { l.launch(grid(1, 1)) }.unwrap();
    });
    let mut bad = [0u64];
    errors.copy_to_host(0, &mut bad).unwrap();
    assert_eq!(bad[0], 0, "ping-pong data corrupted");
    ms
}

fn put_bench(r: &Rank, rank: usize, size: u64, iters: u64, sync: &Barrier) -> f64 {
    let f = r.module.function("proxy_put_bench").unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let rank32 = rank as u32;
    sync.wait();
    events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&r.conn).arg(&size).arg(&iters).arg(&rank32);
        // SAFETY: as above.
        unsafe { l.launch(grid(1, 1)) }.unwrap();
    })
}

fn copy_engine(r: &Rank, size: u64, iters: u64) -> f64 {
    let stream = r.gpu.new_stream().unwrap();
    events_ms(&stream, || {
        for _ in 0..iters {
            // SAFETY: both buffers are MAX_BYTES long and live in the communicators.
            unsafe { memcpy_async(r.peer_buf_ptr, r.buf_ptr, size as usize, &stream) }.unwrap();
        }
    })
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some(ngpus) = common::gpus_or_skip("proxy_channel") else {
        return;
    };
    let sizes: Vec<u64> = (10..=30).step_by(2).map(|p| 1u64 << p).collect();
    let results = common::two_ranks(|rank, id, sync: &Barrier| {
        let mut r = setup(rank, id, ngpus);
        let mut out = Vec::new();
        // Ping-pong: warm-up, then the mean of 5 launches of 2000 rounds.
        ping_pong(&r, rank, 200, sync);
        let rounds = 2000u64;
        let ms: f64 = (0..5)
            .map(|_| ping_pong(&r, rank, rounds, sync))
            .sum::<f64>()
            / 5.0;
        out.push((0u64, ms * 1e3 / (rounds as f64 / 2.0), 0.0));
        for &size in &sizes {
            let iters = ((4u64 << 30) / size).clamp(4, 2000);
            put_bench(&r, rank, size, iters.min(10), sync);
            let ms = (0..3)
                .map(|_| put_bench(&r, rank, size, iters, sync))
                .sum::<f64>()
                / 3.0;
            sync.wait();
            let ce = if rank == 0 {
                copy_engine(&r, size, iters);
                (0..3).map(|_| copy_engine(&r, size, iters)).sum::<f64>() / 3.0
            } else {
                0.0
            };
            sync.wait();
            let gbps = |ms: f64| size as f64 * iters as f64 / (ms * 1e-3) / 1e9;
            out.push((size, gbps(ms), if rank == 0 { gbps(ce) } else { 0.0 }));
        }
        r.comm.proxy_stop().unwrap();
        (out, r.gpu.info().name.clone(), r.gpu.info().ordinal)
    });
    let (rows, name, _) = &results[0];
    println!(
        "proxy channel bench: rank 0 on GPU {} ({name}), rank 1 on GPU {}",
        results[0].2, results[1].2
    );
    // Reference for the round trip: GPU <-> host flag ping-pong through mapped memory.
    let probe_us = common::host_flag_round_trip_us();
    let rtt = rows[0].1;
    println!(
        "ping-pong 8 B round trip: {rtt:.2} us; GPU<->host flag round trip (reference) {probe_us:.2} us; ratio {:.2}",
        rtt / probe_us
    );
    println!(
        "{:>12} {:>14} {:>16} {:>7}",
        "bytes", "put GB/s", "cuMemcpy GB/s", "ratio"
    );
    for (size, put, ce) in &rows[1..] {
        println!("{size:>12} {put:>14.1} {ce:>16.1} {:>7.3}", put / ce);
    }
}
