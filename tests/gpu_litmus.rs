//! GPU litmus tests (`mscclpp_device::kernels::litmus`): the orderings the device protocols
//! rely on, run across two GPUs (two processes; both on GPU 0 when the machine has one) for
//! millions of checked words each, with every violation counted. The library's variant and
//! the latency candidates of `kernels::latency` must show none; each deliberately weakened
//! (or hardware-only) variant runs beside them and its count is printed (whether the
//! hardware ever shows the reordering is what that line reports; it is not asserted, since a
//! machine that never reorders is not a failure of the library). Skips with a reason without
//! a GPU; fails instead under MSCCLPP_REQUIRE_GPU=1.
//!
//! Sizes: `MSCCLPP_LITMUS_ITERS` iterations (default 20 000) of 16 blocks x 128 threads,
//! so 2048 checked 16-byte units per iteration.
//!
//! Two more run in one process, between the GPU and the proxy's side on the CPU: the FIFO
//! publish (`fifo_publish_*`: each of 2048 threads stores data, then pushes a trigger,
//! `MSCCLPP_LITMUS_ITERS / 20` times; this thread pops every trigger and checks it is whole
//! and its data there) and the proxy's flag after a copy (`flag_after_copy_*`:
//! `MSCCLPP_LITMUS_ITERS` copies of 64 KiB, each followed by the flag in one of the two ways
//! the P2P proxy raises it, or a weakened way; a kernel checks every word under the flag).

use std::time::Duration;

use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::cuda::{DeviceBuffer, KernelModule, LaunchConfig, PushKernelArg};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::{gpu_or_skip, run_test_ranks};
use mscclpp::host::transport::TransportKind;
use mscclpp_device::kernels::litmus::region_words;

const ROLE: &str = "MSCCLPP_TEST_ROLE";
const BLOCKS: u32 = 16;
const THREADS: u32 = 128;
/// Data words per block: two per thread (one 16-byte unit or one LL packet).
const WORDS: u64 = 2 * THREADS as u64;

/// `MSCCLPP_LITMUS_ITERS`, else 20 000; a value that is not a whole number from 1 to
/// 1 000 000 000 stops the test instead of being taken as unset (`gpu_collectives`' size limit
/// was, and misled several sessions).
fn iters() -> u64 {
    match std::env::var("MSCCLPP_LITMUS_ITERS") {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if (1..=1_000_000_000).contains(&n) => n,
            _ => panic!("MSCCLPP_LITMUS_ITERS={v:?}: expected a whole number from 1 to 10^9"),
        },
        Err(_) => 20_000,
    }
}

/// One variant of a litmus kernel: its number, its name, and whether it claims the ordering
/// (the library's and the latency candidates: must show no violation) or is a weakened or
/// hardware-only variant whose count is only printed.
type Case<'a> = (u32, &'a str, Claim);

#[derive(Clone, Copy, PartialEq)]
enum Claim {
    /// Ordered by the PTX memory model: a violation fails the test.
    Ordered,
    /// Weakened, or ordered only by the hardware's implementation: printed.
    Shown,
}

/// Runs `kernel` with each of `variants` (the first is the library's) on both ranks;
/// returns `(violations, timeouts)` per variant as the reader (rank 1) counted them.
fn run_variants(kernel: &str, variants: &[Case<'_>]) -> (u32, Vec<(u64, u64)>) {
    let launch = Launch::from_env().unwrap();
    let bs = launch.blocking_bootstrap().unwrap();
    let backend = Backend::auto(bs.local_rank()).unwrap();
    let Backend::Gpu(gpu) = backend.clone() else {
        panic!("rank {} found no GPU", bs.rank())
    };
    let config = CommConfig {
        device_timeout: Duration::from_secs(60),
        ..CommConfig::default()
    };
    let mut comm = Communicator::from_bootstrap(bs, backend, config).unwrap();
    let (rank, peer) = (comm.rank() as u32, 1 - comm.rank());
    let bytes = (region_words(WORDS) * BLOCKS as u64 * 8) as usize;
    // A fresh zeroed buffer per variant: the flag and acknowledgement counters start at 0.
    let bufs: Vec<_> = variants
        .iter()
        .map(|_| comm.alloc_buffer(bytes).unwrap())
        .collect();
    for (tag, b) in bufs.iter().enumerate() {
        comm.connect_memory(peer, b, tag as u32, TransportKind::P2p, 0)
            .unwrap();
    }
    comm.connection_setup().unwrap();
    let remotes: Vec<u64> = comm
        .memory_channels()
        .iter()
        .map(|c| c.remote_ptr() as u64)
        .collect();
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let f = module.function(kernel).unwrap();
    let stream = gpu.new_stream().unwrap();
    let n = iters();
    let mut results = Vec::new();
    for (i, &(variant, name, _)) in variants.iter().enumerate() {
        let out = DeviceBuffer::zeroed(&gpu, 16).unwrap();
        let (local, remote, pout) = (bufs[i].device_ptr().unwrap(), remotes[i], out.device_ptr());
        comm.bootstrap().barrier().unwrap();
        let start = std::time::Instant::now();
        let mut l = stream.launch_builder(&f);
        l.arg(&local)
            .arg(&remote)
            .arg(&WORDS)
            .arg(&n)
            .arg(&rank)
            .arg(&variant)
            .arg(&pout);
        let cfg = LaunchConfig {
            grid_dim: (BLOCKS, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: both buffers hold BLOCKS regions of region_words(WORDS) words, the remote
        // one mapped here; `out` holds two words; all live until the synchronize below.
        unsafe { l.launch(cfg) }.unwrap();
        stream.synchronize().unwrap();
        let mut got = [0u64; 2];
        out.copy_to_host(0, &mut got).unwrap();
        // The reader's counts, sent to the writer too so both ranks print and assert alike.
        let all = comm
            .bootstrap_all_gather(&[got[0].to_le_bytes(), got[1].to_le_bytes()].concat())
            .unwrap();
        let w = |k: usize| u64::from_le_bytes(all[1][k * 8..k * 8 + 8].try_into().unwrap());
        let (bad, timeouts) = (w(0), w(1));
        if rank == 1 {
            println!(
                "{kernel} {name}: {bad} violations, {timeouts} timeouts in {n} iterations x {} units ({:.2?})",
                BLOCKS * THREADS,
                start.elapsed()
            );
        }
        results.push((bad, timeouts));
    }
    comm.bootstrap().barrier().unwrap();
    (rank, results)
}

fn check(kernel: &str, variants: &[Case<'_>]) {
    let (rank, r) = run_variants(kernel, variants);
    for (&(bad, timeouts), &(_, name, claim)) in r.iter().zip(variants) {
        // Every variant must finish; a weakened one may reorder (violations), an ordered
        // one (the library's, or a latency candidate) must not.
        assert_eq!(timeouts, 0, "{kernel} {name}: timed out");
        if claim == Claim::Ordered {
            assert_eq!(
                bad, 0,
                "{kernel} {name}: an ordered variant showed violations"
            );
        }
    }
    println!("rank {rank}: ok");
}

fn run_two(test: &str) {
    if gpu_or_skip(test, 0).is_none() {
        return;
    }
    // The reader's counts, shown also when the test passes.
    for line in run_test_ranks(test, 2, ROLE, Duration::from_secs(300)) {
        if line.contains("violations") {
            println!("{line}");
        }
    }
}

#[test]
fn semaphore_message_passing_never_shows_old_data() {
    if std::env::var(ROLE).is_ok() {
        return check(
            "litmus_message_passing",
            &[
                (0, "release add + acquire poll (library)", Claim::Ordered),
                (1, "relaxed add (weakened)", Claim::Shown),
                (2, "relaxed poll (weakened)", Claim::Shown),
                // The latency candidates (kernels::latency, docs/guide/06-design.md §7), each
                // with its weakened twin above or below.
                (
                    3,
                    "fence.acq_rel.sys + relaxed add (candidate; twin: 1)",
                    Claim::Ordered,
                ),
                (
                    4,
                    "st.release.sys of the count (candidate; twin: 8)",
                    Claim::Ordered,
                ),
                (
                    5,
                    "fence.acq_rel.sys + st.relaxed.sys (candidate; twin: 8)",
                    Claim::Ordered,
                ),
                (
                    6,
                    "relaxed poll + fence.acq_rel.sys (candidate; twin: 2)",
                    Claim::Ordered,
                ),
                (
                    7,
                    "every thread fences, thread 0 relaxed add (hardware only; twin: 1)",
                    Claim::Shown,
                ),
                (8, "st.relaxed.sys of the count (weakened)", Claim::Shown),
            ],
        );
    }
    run_two("semaphore_message_passing_never_shows_old_data");
}

#[test]
fn ll_packets_are_never_seen_torn() {
    if std::env::var(ROLE).is_ok() {
        return check(
            "litmus_ll_packets",
            &[
                (0, "one 16-byte store (library)", Claim::Ordered),
                (
                    1,
                    "four 4-byte stores, flags first (weakened)",
                    Claim::Shown,
                ),
                (2, "two LL8 packets, one 8-byte store each", Claim::Ordered),
            ],
        );
    }
    run_two("ll_packets_are_never_seen_torn");
}

#[test]
fn fifo_publish_shows_every_trigger_whole_and_after_its_data() {
    use mscclpp::host::proxy::fifo_litmus::{PublishShape, PublishVariant, run_publish_litmus};
    use mscclpp::host::proxy::{Fifo, FifoConfig};
    use mscclpp::host::smoke::Backend as SmokeBackend;

    let test = "fifo_publish_shows_every_trigger_whole_and_after_its_data";
    let Some(gpu) = gpu_or_skip(test, 0) else {
        return;
    };
    let module = KernelModule::load_builtin(&gpu).unwrap();
    // 2048 threads; MSCCLPP_LITMUS_ITERS / 20 pushes each (1000 by default: 2 M triggers
    // per variant through a ring of 512 slots, the proxy's default size being larger).
    let shape = PublishShape {
        blocks: 16,
        threads: 128,
        pushes: (iters() / 20).max(1) as u32,
        timeout: Duration::from_secs(240),
    };
    let variants = [
        (
            PublishVariant::Library,
            "fence + one 16-byte store (library)",
            Claim::Ordered,
        ),
        (
            PublishVariant::NoFence,
            "one 16-byte store, no fence (weakened)",
            Claim::Shown,
        ),
        (
            PublishVariant::HighWordFirst,
            "fence + high word, then low word (weakened)",
            Claim::Shown,
        ),
    ];
    for (variant, name, claim) in variants {
        let fifo = Fifo::new_gpu(&gpu, FifoConfig::with_slots(512)).unwrap();
        let c = run_publish_litmus(SmokeBackend::Gpu(&gpu, &module), &fifo, &shape, variant)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        println!(
            "litmus_fifo_publish {name}: {} torn, {} before their data, of {} triggers ({:.2?})",
            c.torn, c.stale, c.popped, c.elapsed
        );
        assert_eq!(c.popped, shape.triggers(), "{name}");
        if claim == Claim::Ordered {
            assert_eq!(
                (c.torn, c.stale),
                (0, 0),
                "{name}: the library's push showed violations"
            );
        }
    }
}

/// How `flag_after_copy_never_shows_old_data` raises the flag after each copy.
#[derive(Clone, Copy, PartialEq, Debug)]
enum FlagWay {
    /// `cuStreamWriteValue64` on the copy's stream (the P2P proxy's `stream` flag mode).
    StreamWrite,
    /// A CPU store into host memory the GPU polls, once an event recorded after the copy is
    /// reached (the `cpu` flag mode).
    CpuAfterEvent,
    /// Weakened: the CPU store right after queueing the copy.
    CpuAtOnce,
    /// Weakened: `cuStreamWriteValue64` on another stream.
    OtherStream,
}

#[test]
fn flag_after_copy_never_shows_old_data() {
    use mscclpp::host::cuda::{
        Gpu, MappedHostBuffer, device_count, event_reached, memcpy_async, new_event, record_event,
        write_u64_async,
    };
    use mscclpp_device::kernels::litmus::copy_pattern;
    use std::sync::atomic::{AtomicU64, Ordering};

    let test = "flag_after_copy_never_shows_old_data";
    let Some(sender) = gpu_or_skip(test, 0) else {
        return;
    };
    // The copy goes from GPU 0 to GPU 1 where there are two, as a proxy's put to a peer
    // does; on a machine with one GPU, within GPU 0.
    let receiver = if device_count().unwrap_or(1) >= 2 {
        let r = Gpu::open(1).unwrap();
        sender.enable_peer_access(&r).unwrap();
        r
    } else {
        Gpu::open(0).unwrap()
    };
    const COPY_BLOCKS: u32 = 8;
    const COPY_THREADS: u32 = 256;
    const COPY_WORDS: u64 = 8192; // 64 KiB per copy
    let n = iters();
    let module = KernelModule::load_builtin(&receiver).unwrap();
    let f = module.function("litmus_flag_after_copy").unwrap();
    let src: Vec<DeviceBuffer> = (0..2u64)
        .map(|p| {
            let b = DeviceBuffer::alloc(&sender, COPY_WORDS as usize * 8).unwrap();
            let v: Vec<u64> = (0..COPY_WORDS).map(|j| copy_pattern(p, j)).collect();
            b.copy_from_host(0, &v).unwrap();
            b
        })
        .collect();
    let ways = [
        (
            FlagWay::StreamWrite,
            "stream write after the copy (library, `stream` mode)",
            Claim::Ordered,
        ),
        (
            FlagWay::CpuAfterEvent,
            "CPU store once the copy's event is reached (library, `cpu` mode)",
            Claim::Ordered,
        ),
        (
            FlagWay::CpuAtOnce,
            "CPU store right after queueing the copy (weakened)",
            Claim::Shown,
        ),
        (
            FlagWay::OtherStream,
            "stream write on another stream (weakened)",
            Claim::Shown,
        ),
    ];
    for (way, name, claim) in ways {
        let dst = DeviceBuffer::zeroed(&receiver, COPY_WORDS as usize * 8).unwrap();
        let flag_dev = DeviceBuffer::zeroed(&receiver, 8).unwrap();
        let flag_host = MappedHostBuffer::alloc(&receiver, 8).unwrap();
        let ack = MappedHostBuffer::alloc(&receiver, 8).unwrap();
        let out = DeviceBuffer::zeroed(&receiver, 16).unwrap();
        // SAFETY: both mapped buffers hold 8 zeroed, aligned bytes, live for this iteration
        // of the loop and accessed only atomically (here and by the kernel).
        let (host_flag, host_ack) = unsafe {
            (
                AtomicU64::from_ptr(flag_host.host_ptr() as *mut u64),
                AtomicU64::from_ptr(ack.host_ptr() as *mut u64),
            )
        };
        let flag_ptr = match way {
            FlagWay::StreamWrite | FlagWay::OtherStream => flag_dev.device_ptr(),
            FlagWay::CpuAfterEvent | FlagWay::CpuAtOnce => flag_host.device_ptr(),
        };
        let kernel_stream = receiver.new_stream().unwrap();
        let (copy_stream, other_stream) =
            (sender.new_stream().unwrap(), sender.new_stream().unwrap());
        let event = new_event(sender.context()).unwrap();
        let (pdst, pack, pout) = (dst.device_ptr(), ack.device_ptr(), out.device_ptr());
        let mut l = kernel_stream.launch_builder(&f);
        l.arg(&pdst)
            .arg(&COPY_WORDS)
            .arg(&flag_ptr)
            .arg(&pack)
            .arg(&n)
            .arg(&pout);
        let cfg = LaunchConfig {
            grid_dim: (COPY_BLOCKS, 1, 1),
            block_dim: (COPY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every buffer the kernel gets outlives the synchronize below.
        unsafe { l.launch(cfg) }.unwrap();
        let start = std::time::Instant::now();
        let mut stuck = None;
        for i in 1..=n {
            // One limit for this iteration's waits here: the copy's event, then the ack.
            let t0 = std::time::Instant::now();
            let late = || t0.elapsed() > Duration::from_secs(20);
            sender.bind().unwrap();
            // SAFETY: `dst` and the source hold COPY_WORDS words, live until the streams are
            // synchronised below; the kernel reads `dst` only between a flag and its ack,
            // and the next copy is queued only after the ack.
            unsafe {
                memcpy_async(
                    pdst,
                    src[(i % 2) as usize].device_ptr(),
                    COPY_WORDS as usize * 8,
                    &copy_stream,
                )
                .unwrap();
                match way {
                    FlagWay::StreamWrite => write_u64_async(flag_ptr, i, &copy_stream).unwrap(),
                    FlagWay::OtherStream => write_u64_async(flag_ptr, i, &other_stream).unwrap(),
                    FlagWay::CpuAfterEvent => {
                        record_event(&event, &copy_stream).unwrap();
                        while !event_reached(&event).unwrap() && !late() {
                            std::hint::spin_loop();
                        }
                        host_flag.store(i, Ordering::Release);
                    }
                    FlagWay::CpuAtOnce => host_flag.store(i, Ordering::Release),
                }
            }
            while host_ack.load(Ordering::Acquire) < i * COPY_BLOCKS as u64 {
                if late() {
                    stuck = Some(i);
                    break;
                }
                std::hint::spin_loop();
            }
            if stuck.is_some() {
                break;
            }
        }
        let elapsed = start.elapsed();
        kernel_stream.synchronize().unwrap();
        copy_stream.synchronize().unwrap();
        other_stream.synchronize().unwrap();
        let mut got = [0u64; 2];
        out.copy_to_host(0, &mut got).unwrap();
        println!(
            "litmus_flag_after_copy {name}: {} violations, {} timeouts in {n} iterations x {COPY_WORDS} words ({elapsed:.2?})",
            got[0], got[1]
        );
        assert_eq!(
            (stuck, got[1]),
            (None, 0),
            "{name}: the kernel or the host timed out"
        );
        if claim == Claim::Ordered {
            assert_eq!(got[0], 0, "{name}: an ordered way showed old data");
        }
    }
}
