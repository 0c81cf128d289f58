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
//!   separate signal); reference: the signal/wait round trip above. Today's kernel (each
//!   thread its own ping-pong, 256 threads) at 8 B, 1 KB and 16 KB, and MSCCL++'s shape
//!   (`MemoryChannelOneToOneTest.LL8/LL16PacketPingPong`: 4 KB = 1024 x 4-byte values each
//!   way, one block of 1024 threads, a block barrier every round) with LL8 and LL16 packets,
//!   beside today's kernel at 4 KB and 1024 threads. MSCCL++ reports one-way iterations; the
//!   table gives both.
//! - the semaphore latency variants of `mscclpp_device::kernels::latency` (design notes:
//!   docs/guide/06-design.md §7): every variant's round trip with a payload word per thread
//!   written before the signal and checked after the wait, with its ratio to the relaxed
//!   floor (`red.relaxed.sys` + the library's wait) measured in the same run, interleaved,
//!   and its payload mismatches. A mismatch of a variant that claims release semantics fails
//!   the bench after the table is printed.
//!
//! With one GPU both ranks run on GPU 0: the numbers are intra-GPU, not NVLink (the output
//! says so).
//!
//! `cargo bench --bench memory_channel` (skips with the reason without a GPU).

mod common;

use std::sync::Barrier;

use common::{events_ms, grid};
use mscclpp::host::bootstrap::UniqueId;
use mscclpp::host::communicator::{Communicator, MemoryChannelArg};
use mscclpp::host::cuda::{DeviceBuffer, Gpu, KernelModule, PushKernelArg, memcpy_async};
use mscclpp::host::transport::TransportKind;
use mscclpp_device::kernels::latency::{Publishes, VARIANTS, Variant};

const BYTES: usize = 256 << 20;
/// Round trips per launch of a semaphore variant.
const VARIANT_ROUNDS: u64 = 20_000;
/// Threads of the block variants (each writes and checks one payload word).
const BLOCK_THREADS: u32 = 1024;
/// Launches per variant: the first warms up, the rest are averaged.
const VARIANT_LAUNCHES: usize = 4;

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

/// One LL ping-pong row: its kernel (arguments `ch, bytes, rounds, rank, seed, errors`),
/// packets, bytes each way and threads of the one block.
struct PacketRow {
    kernel: &'static str,
    packets: &'static str,
    bytes: u64,
    threads: u32,
    what: &'static str,
}

const PACKET_ROWS: &[PacketRow] = &[
    PacketRow {
        kernel: "memory_packet_ping_pong",
        packets: "LL16",
        bytes: 8,
        threads: 256,
        what: "today's",
    },
    PacketRow {
        kernel: "memory_packet_ping_pong",
        packets: "LL16",
        bytes: 1024,
        threads: 256,
        what: "today's",
    },
    PacketRow {
        kernel: "memory_packet_ping_pong",
        packets: "LL16",
        bytes: 16 << 10,
        threads: 256,
        what: "today's",
    },
    PacketRow {
        kernel: "memory_packet_ping_pong",
        packets: "LL16",
        bytes: 4096,
        threads: 1024,
        what: "today's kernel, MSCCL++'s size",
    },
    PacketRow {
        kernel: "memory_ll8_block_ping_pong",
        packets: "LL8",
        bytes: 4096,
        threads: 1024,
        what: "MSCCL++'s shape",
    },
    PacketRow {
        kernel: "memory_ll16_block_ping_pong",
        packets: "LL16",
        bytes: 4096,
        threads: 1024,
        what: "MSCCL++'s shape",
    },
];

/// One launch of an LL ping-pong row: microseconds per round trip (two one-way rounds); wrong
/// chunks are added to `r.errors`.
fn packet_rtt_us(r: &Rank, rank: usize, row: &PacketRow, sync: &Barrier) -> f64 {
    let f = r.module.function(row.kernel).unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let ch = r.ch();
    let (rounds, rank32, seed, perr) = (4000u64, rank as u32, 9u64, r.errors.device_ptr());
    sync.wait();
    let ms = events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&ch)
            .arg(&row.bytes)
            .arg(&rounds)
            .arg(&rank32)
            .arg(&seed)
            .arg(&perr);
        // SAFETY: as above; the packets fit the 1 MiB scratch.
        unsafe { l.launch(grid(1, row.threads)) }.unwrap();
    });
    ms * 1e3 / (rounds as f64 / 2.0)
}

/// One launch of semaphore variant `v` with payload seed `seed`: microseconds per round trip
/// and the payload mismatches this rank counted.
fn variant_rtt_us(r: &Rank, rank: usize, v: &Variant, seed: u64, sync: &Barrier) -> (f64, u64) {
    let f = r.module.function(v.kernel).unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let ch = r.ch();
    let errors = DeviceBuffer::zeroed(&r.gpu, 8).unwrap();
    let (rounds, rank32, perr) = (VARIANT_ROUNDS, rank as u32, errors.device_ptr());
    let threads = if v.block { BLOCK_THREADS } else { 1 };
    sync.wait();
    let ms = events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&ch).arg(&rounds).arg(&rank32).arg(&seed).arg(&perr);
        // SAFETY: the channel's memory lives in `r.comm` past the event synchronize; the
        // payload words (8 per thread) fit its 256 MB buffers; `errors` holds one word.
        unsafe { l.launch(grid(1, threads)) }.unwrap();
    });
    let mut bad = [0u64];
    errors.copy_to_host(0, &mut bad).unwrap();
    (ms * 1e3 / rounds as f64, bad[0])
}

/// Every variant's mean round trip (launches 2.. of [`VARIANT_LAUNCHES`], interleaved so that
/// drift hits all alike) and its mismatches over all launches, in [`VARIANTS`] order.
fn variants_us(r: &Rank, rank: usize, sync: &Barrier) -> Vec<(f64, u64)> {
    let mut out = vec![(0.0, 0u64); VARIANTS.len()];
    for launch in 0..VARIANT_LAUNCHES {
        for (i, v) in VARIANTS.iter().enumerate() {
            // Seeds differ in bits 48 and up from launch to launch (`payload`'s contract).
            let seed = ((launch * VARIANTS.len() + i + 1) as u64) << 48;
            let (us, bad) = variant_rtt_us(r, rank, v, seed, sync);
            if launch > 0 {
                out[i].0 += us / (VARIANT_LAUNCHES - 1) as f64;
            }
            out[i].1 += bad;
        }
    }
    out
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
    let results = common::two_ranks(|rank, id, sync: &Barrier| {
        let r = setup(rank, id, ngpus);
        signal_rtt_us(&r, rank, sync);
        let rtt = (0..3).map(|_| signal_rtt_us(&r, rank, sync)).sum::<f64>() / 3.0;
        let relaxed = (0..3)
            .map(|_| kernel_rtt_us(&r, "memory_relaxed_signal_ping_pong", rank, sync))
            .sum::<f64>()
            / 3.0;
        let packets: Vec<f64> = PACKET_ROWS
            .iter()
            .map(|row| {
                packet_rtt_us(&r, rank, row, sync);
                packet_rtt_us(&r, rank, row, sync)
            })
            .collect();
        let variants = variants_us(&r, rank, sync);
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
        (
            rtt,
            relaxed,
            packets,
            bw,
            ce,
            r.gpu.info().ordinal,
            variants,
        )
    });
    let (rtt, relaxed, packets, bw, ce, g0, variants) = &results[0];
    let g1 = results[1].5;
    let link = if *g0 == g1 {
        "both ranks on one GPU: intra-GPU numbers, not NVLink"
    } else {
        "two GPUs: over their link (NVLink on the H200 machines)"
    };
    println!("memory channel bench: rank 0 on GPU {g0}, rank 1 on GPU {g1} ({link})");
    let probe_us = common::host_flag_round_trip_us();
    println!(
        "signal/wait round trip: {rtt:.3} us; GPU<->host flag round trip (reference) {probe_us:.2} us; ratio {:.2}",
        rtt / probe_us
    );
    println!(
        "relaxed_signal/wait round trip (no release: the NVLink floor): {relaxed:.3} us; signal/wait costs {:.2}x it",
        rtt / relaxed
    );
    println!(
        "LL-packet ping-pong, one block (MSCCL++ reports one-way iterations: half the round trip)"
    );
    println!(
        "{:<28} {:>7} {:>7} {:>7} {:>10} {:>8} {:>8}  what",
        "kernel", "packets", "bytes", "threads", "rt us", "1-way us", "x s/w"
    );
    for (row, us) in PACKET_ROWS.iter().zip(packets) {
        println!(
            "{:<28} {:>7} {:>7} {:>7} {us:>10.3} {:>8.3} {:>8.2}  {}",
            row.kernel,
            row.packets,
            row.bytes,
            row.threads,
            us / 2.0,
            us / rtt,
            row.what
        );
    }
    print_variants(variants, &results[1].6);
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

/// The semaphore variants' table (`v0`, `v1`: each rank's means and mismatches); panics after
/// printing it if a variant that claims release semantics saw a stale payload.
fn print_variants(v0: &[(f64, u64)], v1: &[(f64, u64)]) {
    println!(
        "semaphore round trips with a payload word per thread ({VARIANT_ROUNDS} per launch, mean of \
         {} launches after a warm-up, interleaved; one thread, or a block of {BLOCK_THREADS}); \
         x floor: against red.relaxed.sys + the library's wait, same threads, this run",
        VARIANT_LAUNCHES - 1
    );
    println!(
        "{:<32} {:>8} {:>8} {:>10} {:>9}  what",
        "kernel", "rt us", "x floor", "mismatches", "publishes"
    );
    let us = |k: &str| {
        let i = VARIANTS.iter().position(|v| v.kernel == k).unwrap();
        v0[i].0
    };
    let mut broken = Vec::new();
    for (i, v) in VARIANTS.iter().enumerate() {
        let bad = v0[i].1 + v1[i].1;
        let publishes = match v.publishes() {
            Publishes::Release => "release",
            Publishes::Hardware => "hardware",
            Publishes::Nothing => "nothing",
        };
        if v.publishes() == Publishes::Release && bad != 0 {
            broken.push(v.kernel);
        }
        println!(
            "{:<32} {:>8.3} {:>8.2} {bad:>10} {publishes:>9}  {}",
            v.kernel,
            v0[i].0,
            v0[i].0 / us(v.floor_kernel()),
            v.what
        );
    }
    assert!(
        broken.is_empty(),
        "variants that claim release semantics saw stale payloads: {broken:?}"
    );
}
