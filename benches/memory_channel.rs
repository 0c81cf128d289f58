//! Memory channels on GPUs, each number next to a reference measured in the same run:
//!
//! - signal/wait round trip: thread 0 of each rank (threads of this process, GPU 0 and 1, or
//!   both on GPU 0) alternates `signal` / `wait`; reference: the GPU<->host flag round trip
//!   of `ordering_probe`, and the same round trip with `relaxed_signal` (no system-scope
//!   release, so the bare NVLink latency).
//! - put bandwidth at 256 MB against blocks x threads per block: rank 0's grid `put`s slices
//!   of its buffer into the peer's with 16-byte stores over NVLink; reference:
//!   `cuMemcpyAsync` of the same bytes between the same buffers (the copy engine).
//! - LL-packet ping-pong round trip for small messages (data and flag in one store, no
//!   separate signal); reference: the signal/wait round trip above.
//!
//! `cargo bench --bench memory_channel` (skips with the reason without a GPU).

mod common;

use std::sync::Barrier;

use common::{events_ms, grid};
use mscclpp::host::bootstrap::UniqueId;
use mscclpp::host::communicator::{Communicator, MemoryChannelArg};
use mscclpp::host::cuda::{DeviceBuffer, Gpu, KernelModule, PushKernelArg, memcpy_async};
use mscclpp::host::transport::TransportKind;

const BYTES: usize = 256 << 20;

struct Rank {
    comm: Communicator,
    gpu: Gpu,
    module: KernelModule,
    buf_ptr: u64,
    peer_buf_ptr: u64,
    errors: DeviceBuffer,
}

impl Rank {
    /// The channel's handle (it borrows the communicator, so it is made when needed
    /// rather than kept next to it).
    fn ch(&self) -> MemoryChannelArg<'_> {
        MemoryChannelArg(self.comm.memory_channels()[0])
    }
}

fn setup(rank: usize, id: UniqueId, ngpus: usize) -> Rank {
    let (mut comm, gpu) = common::communicator(rank, id, ngpus);
    let buf = comm.alloc_buffer(BYTES).unwrap();
    comm.connect_memory(1 - rank, &buf, 0, TransportKind::P2p, 1 << 20)
        .unwrap();
    comm.connection_setup().unwrap();
    let ptrs = comm
        .bootstrap_all_gather(&buf.device_ptr().unwrap().to_le_bytes())
        .unwrap();
    let peer_buf_ptr = u64::from_le_bytes(ptrs[1 - rank][..8].try_into().unwrap());
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let errors = DeviceBuffer::zeroed(&gpu, 8).unwrap();
    // The connection keeps a clone of `buf`, so its memory outlives this function.
    let buf_ptr = buf.device_ptr().unwrap();
    Rank {
        comm,
        gpu,
        module,
        buf_ptr,
        peer_buf_ptr,
        errors,
    }
}

fn signal_rtt_us(r: &Rank, rank: usize, sync: &Barrier) -> f64 {
    kernel_rtt_us(r, "memory_signal_ping_pong", rank, sync)
}

fn kernel_rtt_us(r: &Rank, kernel: &str, rank: usize, sync: &Barrier) -> f64 {
    let f = r.module.function(kernel).unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let ch = r.ch();
    let (rounds, rank32) = (20_000u64, rank as u32);
    sync.wait();
    let ms = events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&ch).arg(&rounds).arg(&rank32);
        // SAFETY: the channel's memory lives in `r.comm` past the event synchronize.
        unsafe { l.launch(grid(1, 1)) }.unwrap();
    });
    ms * 1e3 / rounds as f64
}

fn packet_rtt_us(r: &Rank, rank: usize, bytes: u64, sync: &Barrier) -> f64 {
    let f = r.module.function("memory_packet_ping_pong").unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let ch = r.ch();
    let (rounds, rank32, seed, perr) = (4000u64, rank as u32, 9u64, r.errors.device_ptr());
    sync.wait();
    let ms = events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&ch)
            .arg(&bytes)
            .arg(&rounds)
            .arg(&rank32)
            .arg(&seed)
            .arg(&perr);
        // SAFETY: as above; the packets fit the 1 MiB scratch.
        unsafe { l.launch(grid(1, 256)) }.unwrap();
    });
    ms * 1e3 / (rounds as f64 / 2.0)
}

fn put_gbps(r: &Rank, rank: usize, blocks: u32, threads: u32, sync: &Barrier) -> f64 {
    copy_gbps(r, "memory_put_bench", rank, blocks, threads, sync)
}

fn get_gbps(r: &Rank, rank: usize, blocks: u32, threads: u32, sync: &Barrier) -> f64 {
    copy_gbps(r, "memory_get_bench", rank, blocks, threads, sync)
}

fn copy_gbps(
    r: &Rank,
    kernel: &str,
    rank: usize,
    blocks: u32,
    threads: u32,
    sync: &Barrier,
) -> f64 {
    let f = r.module.function(kernel).unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let ch = r.ch();
    let (bytes, iters, rank32) = (BYTES as u64, 5u64, rank as u32);
    sync.wait();
    let ms = events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&ch).arg(&bytes).arg(&iters).arg(&rank32);
        // SAFETY: as above.
        if let Err(e) = unsafe { l.launch(grid(blocks, threads)) } {
            panic!("rank {rank}: {kernel} with {blocks} x {threads}: {e:?}");
        }
    });
    bytes as f64 * iters as f64 / (ms * 1e-3) / 1e9
}

fn copy_engine_gbps(r: &Rank) -> f64 {
    let stream = r.gpu.new_stream().unwrap();
    let iters = 5;
    let ms = events_ms(&stream, || {
        for _ in 0..iters {
            // SAFETY: both buffers are BYTES long and live in the communicators.
            unsafe { memcpy_async(r.peer_buf_ptr, r.buf_ptr, BYTES, &stream) }.unwrap();
        }
    });
    BYTES as f64 * iters as f64 / (ms * 1e-3) / 1e9
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some(ngpus) = common::gpus_or_skip("memory_channel") else {
        return;
    };
    let configs: Vec<(u32, u32)> = vec![
        (8, 512),
        (16, 512),
        (32, 256),
        (32, 512),
        (64, 256),
        (64, 512),
        (132, 256),
        (132, 512),
    ];
    let packet_sizes = [8u64, 1024, 16 << 10];
    let results = common::two_ranks(|rank, id, sync: &Barrier| {
        let r = setup(rank, id, ngpus);
        signal_rtt_us(&r, rank, sync);
        let rtt = (0..3).map(|_| signal_rtt_us(&r, rank, sync)).sum::<f64>() / 3.0;
        let relaxed = (0..3)
            .map(|_| kernel_rtt_us(&r, "memory_relaxed_signal_ping_pong", rank, sync))
            .sum::<f64>()
            / 3.0;
        let packets: Vec<f64> = packet_sizes
            .iter()
            .map(|&b| {
                packet_rtt_us(&r, rank, b, sync);
                packet_rtt_us(&r, rank, b, sync)
            })
            .collect();
        let mut bw = Vec::new();
        for &(blocks, threads) in &configs {
            let mean = |f: &dyn Fn() -> f64| {
                f();
                (0..3).map(|_| f()).sum::<f64>() / 3.0
            };
            let put = mean(&|| put_gbps(&r, rank, blocks, threads, sync));
            let get = mean(&|| get_gbps(&r, rank, blocks, threads, sync));
            bw.push((put, get));
        }
        sync.wait();
        let ce = if rank == 0 {
            copy_engine_gbps(&r);
            (0..3).map(|_| copy_engine_gbps(&r)).sum::<f64>() / 3.0
        } else {
            0.0
        };
        sync.wait();
        let mut bad = [0u64];
        r.errors.copy_to_host(0, &mut bad).unwrap();
        assert_eq!(bad[0], 0, "packet data corrupted");
        r.comm.bootstrap().barrier().unwrap();
        (rtt, relaxed, packets, bw, ce, r.gpu.info().ordinal)
    });
    let (rtt, relaxed, packets, bw, ce, g0) = &results[0];
    println!(
        "memory channel bench: rank 0 on GPU {g0}, rank 1 on GPU {}",
        results[1].5
    );
    let probe_us = common::host_flag_round_trip_us();
    println!(
        "signal/wait round trip: {rtt:.3} us; GPU<->host flag round trip (reference) {probe_us:.2} us; ratio {:.2}",
        rtt / probe_us
    );
    println!(
        "relaxed_signal/wait round trip (no release: the NVLink floor): {relaxed:.3} us; signal/wait costs {:.2}x it",
        rtt / relaxed
    );
    for (b, us) in packet_sizes.iter().zip(packets) {
        println!(
            "LL-packet ping-pong {b} B round trip: {us:.3} us; ratio to signal/wait {:.2}",
            us / rtt
        );
    }
    println!(
        "put/get bandwidth at {} MB; cuMemcpyAsync (reference) {ce:.1} GB/s",
        BYTES >> 20
    );
    println!(
        "{:>7} {:>8} {:>10} {:>7} {:>10} {:>7}",
        "blocks", "threads", "put GB/s", "ratio", "get GB/s", "ratio"
    );
    for ((blocks, threads), (p, g)) in configs.iter().zip(bw) {
        println!(
            "{blocks:>7} {threads:>8} {p:>10.1} {:>7.3} {g:>10.1} {:>7.3}",
            p / ce,
            g / ce
        );
    }
}
