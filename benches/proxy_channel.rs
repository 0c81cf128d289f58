//! Proxy channels on GPUs, each number next to a reference measured in the same run:
//!
//! - ping-pong: two ranks (threads of this process, GPU 0 and GPU 1, or both on GPU 0 when
//!   there is one) bounce 8 bytes with `put_with_signal` / `wait` through the proxy; the
//!   round trip is the kernel time over the number of round trips. Reference: the
//!   GPU→host→GPU flag round trip of `ordering_probe` (the floor of any proxy handshake).
//! - what one proxy step costs: the host issues a stream operation towards rank 1's GPU,
//!   where one thread (`flag_echo`) waits for the flag and acknowledges through host-mapped
//!   memory; the host times issue → acknowledgement (and the issuing calls alone), for a
//!   CPU store into host-mapped memory (the floor), `cuStreamWriteValue64`, an 8-byte
//!   `cuMemcpyAsync` followed by `cuStreamWriteValue64` (what the P2P plane does for
//!   `put_with_signal`), and the same copy followed by a copy of the epoch.
//! - put bandwidth, 1 KB to 1 GB: rank 0 queues puts and one signal; timed with CUDA events
//!   on rank 1's stream around its kernel, which ends when the signal (after the data)
//!   arrives, both launched together (a thread barrier); against `cuMemcpyAsync` of the
//!   same bytes between the same two buffers on a stream (the copy engine, which the proxy
//!   drives).
//!
//! `cargo bench --bench proxy_channel` (skips with the reason without a GPU). Not criterion:
//! one measurement per size is what a sweep to 1 GB affords; each is the mean of several
//! launches after a warm-up.

mod common;

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{events_ms, grid};
use mscclpp::host::bootstrap::UniqueId;
use mscclpp::host::communicator::{Communicator, DevConnArg};
use mscclpp::host::cuda::{
    DeviceBuffer, Gpu, KernelModule, MappedHostBuffer, PushKernelArg, memcpy_async, write_u64_async,
};
use mscclpp::host::transport::TransportKind;

const MAX_BYTES: usize = 1 << 30;

struct Rank {
    comm: Communicator,
    gpu: Gpu,
    module: KernelModule,
    buf_ptr: u64,
    peer_buf_ptr: u64,
}

impl Rank {
    /// The channel's handle (it borrows the communicator, so it is made when needed
    /// rather than kept next to it).
    fn conn(&self) -> DevConnArg<'_> {
        DevConnArg(self.comm.device_connections()[0])
    }
}

fn setup(rank: usize, id: UniqueId, ngpus: usize) -> Rank {
    let (mut comm, gpu) = common::communicator(rank, id, ngpus);
    let buf = comm.alloc_buffer(MAX_BYTES).unwrap();
    comm.connect(1 - rank, &buf, 0, TransportKind::P2p).unwrap();
    comm.connection_setup().unwrap();
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
        buf_ptr,
        peer_buf_ptr,
    }
}

/// Ping-pong of `words` u64 (0: signals alone) for `rounds` rounds; returns rank 0's kernel
/// time in ms.
fn ping_pong(r: &Rank, rank: usize, words: usize, rounds: u64, sync: &Barrier) -> f64 {
    let f = r.module.function("proxy_ping_pong").unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let conn = r.conn();
    let errors = DeviceBuffer::zeroed(&r.gpu, 8).unwrap();
    let (rank32, seed, perr) = (rank as u32, 1u64, errors.device_ptr());
    sync.wait();
    let ms = events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&conn)
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

/// What the host issues in one round of [`issue_latency`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Issue {
    /// A CPU release store into host-mapped memory the GPU polls.
    HostStore,
    /// `cuStreamWriteValue64` into the peer's device memory.
    StreamWrite,
    /// An 8-byte `cuMemcpyAsync` to the peer, then `cuStreamWriteValue64`.
    CopyThenWrite,
    /// An 8-byte `cuMemcpyAsync` to the peer, then a copy of the epoch from pinned memory.
    CopyThenCopy,
}

const ISSUES: [(Issue, &str); 4] = [
    (Issue::HostStore, "CPU store to host-mapped flag"),
    (Issue::StreamWrite, "cuStreamWriteValue64 to peer"),
    (Issue::CopyThenWrite, "8 B cuMemcpyAsync + WriteValue64"),
    (Issue::CopyThenCopy, "8 B cuMemcpyAsync + epoch copy"),
];

/// Reads the 8-byte words of a bootstrap all-gather contribution.
fn le_words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Rank 0 issues `rounds` operations of kind `issue` towards rank 1, where `flag_echo`
/// acknowledges each; returns, on rank 0, the mean microseconds from issue to
/// acknowledgement and of the issuing calls alone, over all rounds after the first 10%.
fn issue_latency(r: &Rank, rank: usize, issue: Issue, rounds: u64, sync: &Barrier) -> (f64, f64) {
    let flag_dev = DeviceBuffer::zeroed(&r.gpu, 8).unwrap();
    let flag_host = MappedHostBuffer::alloc(&r.gpu, 8).unwrap();
    let ack = MappedHostBuffer::alloc(&r.gpu, 8).unwrap();
    let mine = [
        flag_dev.device_ptr(),
        flag_host.host_ptr() as u64,
        ack.host_ptr() as u64,
    ];
    let all = r
        .comm
        .bootstrap_all_gather(
            &mine
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let stream = r.gpu.new_stream().unwrap();
    if rank == 1 {
        let f = r.module.function("flag_echo").unwrap();
        let flag = if issue == Issue::HostStore {
            flag_host.device_ptr()
        } else {
            flag_dev.device_ptr()
        };
        let (ackp, timeout) = (ack.device_ptr(), 20_000_000_000u64);
        let mut l = stream.launch_builder(&f);
        l.arg(&flag).arg(&ackp).arg(&rounds).arg(&timeout);
        // SAFETY: flag and ack live until the stream is synchronised below.
        unsafe { l.launch(grid(1, 1)) }.unwrap();
        sync.wait();
        sync.wait();
        stream.synchronize().unwrap();
        return (0.0, 0.0);
    }
    let peer = le_words(&all[1]);
    let (peer_flag, peer_flag_host, peer_ack) = (peer[0], peer[1] as *mut u64, peer[2] as *mut u64);
    // SAFETY: rank 1 keeps both words alive until after the second barrier; they are
    // 8-byte aligned pinned memory of this process, accessed only atomically here.
    let (flag_host, ack) = unsafe {
        (
            AtomicU64::from_ptr(peer_flag_host),
            AtomicU64::from_ptr(peer_ack),
        )
    };
    let epochs = MappedHostBuffer::alloc(&r.gpu, 8 * 64).unwrap();
    let epoch_words = epochs.host_ptr() as *mut u64;
    let skip = rounds / 10;
    let (mut total, mut api) = (Duration::ZERO, Duration::ZERO);
    sync.wait();
    for i in 1..=rounds {
        let t0 = Instant::now();
        // SAFETY (all arms): the peer's buffer and flag are live device memory mapped into
        // this context (peer access, enabled by the P2P connection); `epochs` is live
        // pinned memory and its slot is not rewritten before this round is acknowledged.
        match issue {
            Issue::HostStore => flag_host.store(i, Ordering::Release),
            Issue::StreamWrite => unsafe { write_u64_async(peer_flag, i, &stream) }.unwrap(),
            Issue::CopyThenWrite => unsafe {
                memcpy_async(r.peer_buf_ptr, r.buf_ptr, 8, &stream).unwrap();
                write_u64_async(peer_flag, i, &stream).unwrap();
            },
            Issue::CopyThenCopy => unsafe {
                let slot = epoch_words.add((i % 64) as usize);
                slot.write_volatile(i);
                memcpy_async(r.peer_buf_ptr, r.buf_ptr, 8, &stream).unwrap();
                memcpy_async(peer_flag, slot as u64, 8, &stream).unwrap();
            },
        }
        let t1 = Instant::now();
        while ack.load(Ordering::Acquire) < i {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{issue:?}: round {i} never acknowledged"
            );
            std::hint::spin_loop();
        }
        if i > skip {
            total += t0.elapsed();
            api += t1 - t0;
        }
    }
    sync.wait();
    stream.synchronize().unwrap();
    let n = (rounds - skip) as f64;
    (total.as_secs_f64() * 1e6 / n, api.as_secs_f64() * 1e6 / n)
}

fn put_bench(r: &Rank, rank: usize, size: u64, iters: u64, sync: &Barrier) -> f64 {
    let f = r.module.function("proxy_put_bench").unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let conn = r.conn();
    let rank32 = rank as u32;
    sync.wait();
    events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(&conn).arg(&size).arg(&iters).arg(&rank32);
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
        let r = setup(rank, id, ngpus);
        let mut out = Vec::new();
        let steps: Vec<(f64, f64)> = ISSUES
            .iter()
            .map(|&(issue, _)| issue_latency(&r, rank, issue, 2000, sync))
            .collect();
        // Ping-pong: warm-up, then the mean of 5 launches of 2000 rounds; 8 bytes, then
        // signals alone.
        let rounds = 2000u64;
        let mut rtts = [0.0; 2];
        for (rtt, words) in rtts.iter_mut().zip([1usize, 0]) {
            ping_pong(&r, rank, words, 200, sync);
            let ms: f64 = (0..5)
                .map(|_| ping_pong(&r, rank, words, rounds, sync))
                .sum::<f64>()
                / 5.0;
            *rtt = ms * 1e3 / (rounds as f64 / 2.0);
        }
        out.push((0u64, rtts[0], rtts[1]));
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
        (out, steps, r.gpu.info().name.clone(), r.gpu.info().ordinal)
    });
    let (rows, steps, name, _) = &results[0];
    println!(
        "proxy channel bench: rank 0 on GPU {} ({name}), rank 1 on GPU {}",
        results[0].3, results[1].3
    );
    println!("one proxy step, host issue -> peer GPU sees it -> host sees its ack (mean us):");
    for ((_, what), (total, api)) in ISSUES.iter().zip(steps) {
        println!("  {what:<36} {total:>7.2} us (issuing calls {api:.2} us)");
    }
    // Reference for the round trip: GPU <-> host flag ping-pong through mapped memory.
    let probe_us = common::host_flag_round_trip_us();
    let (rtt, signal_rtt) = (rows[0].1, rows[0].2);
    println!(
        "ping-pong 8 B round trip: {rtt:.2} us; GPU<->host flag round trip (reference) {probe_us:.2} us; ratio {:.2}",
        rtt / probe_us
    );
    println!("ping-pong of signals alone (no data): {signal_rtt:.2} us");
    println!(
        "{:>12} {:>14} {:>16} {:>7}",
        "bytes", "put GB/s", "cuMemcpy GB/s", "ratio"
    );
    // Put bandwidth as rank 1 sees it: its kernel ends when the signal, queued after every
    // put, arrives (rank 0's kernel may end before the proxy's last copies have).
    for ((size, _, ce), (_, put, _)) in rows[1..].iter().zip(&results[1].0[1..]) {
        println!("{size:>12} {put:>14.1} {ce:>16.1} {:>7.3}", put / ce);
    }
}
