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

fn iters() -> u64 {
    std::env::var("MSCCLPP_LITMUS_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
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
                // The latency candidates (kernels::latency, docs/latency-variants.md), each
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
