//! The P2P proxy's two flag modes (`CommConfig::proxy_flag`, `MSCCLPP_PROXY_FLAG`):
//! `stream` (`cuStreamWriteValue64` after the copy) and `cpu` (the proxy stores the flag
//! into host memory the peer GPU polls, once the copy is known complete).
//!
//! For each mode, two processes (one GPU each; both on GPU 0 when the machine has one)
//! bounce messages of every size from 1 B to 64 MiB (powers of 4 and odd sizes) through
//! `proxy_bytes_ping_pong`, whose receiving kernel checks every byte under the flag (and
//! the byte after the message); then they time an 8-byte ping-pong and a signal-only one
//! and print the times (not asserted). Skips with a reason without a GPU; fails instead
//! under MSCCLPP_REQUIRE_GPU=1.
//!
//! The kernel's checking itself runs everywhere: over the Host transport on CPU threads,
//! with a test that it catches data that is not what the sender sent.

use std::time::Duration;

use mscclpp::device::arch::{Dim3, launch};
use mscclpp::device::kernels::proxy_test::proxy_bytes_ping_pong;
use mscclpp::host::communicator::{Backend, CommConfig, Communicator, DevConnArg};
use mscclpp::host::cuda::{CUevent_flags, DeviceBuffer, KernelModule, LaunchConfig, PushKernelArg};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::{gpu_or_skip, run_test_ranks};
use mscclpp::host::transport::TransportKind;
use mscclpp::host::transport::p2p::{PROXY_FLAG_ENV, ProxyFlagMode};

const ROLE: &str = "MSCCLPP_TEST_ROLE";

/// The largest message: 64 MiB.
const MAX: u64 = 64 << 20;

/// Every size checked: 4^0 .. 4^13 (1 B .. 64 MiB) and odd sizes between them, ascending
/// (each message's guard byte lies beyond every earlier message).
fn sizes() -> Vec<u64> {
    let mut v: Vec<u64> = (0..=13).map(|k| 1u64 << (2 * k)).collect();
    v.extend([
        3,
        7,
        13,
        255,
        1001,
        4097,
        65_537,
        1_048_573,
        16_777_259,
        MAX - 1,
    ]);
    v.sort_unstable();
    v.dedup();
    v
}

/// Rounds for a message of `bytes` (even, so both ranks send as often).
fn rounds_for(bytes: u64) -> u64 {
    if bytes <= 1 << 20 { 20 } else { 4 }
}

fn run_two(test: &str) -> Vec<String> {
    if gpu_or_skip(test, 0).is_none() {
        return Vec::new();
    }
    let output = run_test_ranks(test, 2, ROLE, Duration::from_secs(300));
    println!("{}", output.join("\n"));
    output
}

/// The mode a run really uses: the environment's when set (it overrides the config).
fn effective(mode: ProxyFlagMode) -> ProxyFlagMode {
    ProxyFlagMode::from_env()
        .expect("a valid MSCCLPP_PROXY_FLAG")
        .unwrap_or(mode)
}

fn gpu_communicator(mode: ProxyFlagMode) -> Communicator {
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
        proxy_flag: mode,
        ..CommConfig::default()
    };
    Communicator::from_bootstrap(bs, backend, config).unwrap()
}

fn block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Every size, then the two timings, in `mode`.
fn data_and_timing_rank(mode: ProxyFlagMode) {
    let mut comm = gpu_communicator(mode);
    let Backend::Gpu(gpu) = comm.backend().clone() else {
        unreachable!()
    };
    let mode = comm.proxy_flag_mode();
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    // Room for the largest message and its guard byte.
    let cap = MAX + 64;
    let buf = comm.alloc_buffer(cap as usize).unwrap();
    buf.write(0, &vec![0u8; cap as usize]).unwrap();
    comm.connect(peer, &buf, 0, TransportKind::P2p).unwrap();
    comm.connection_setup().unwrap();
    let conn = DevConnArg(comm.device_connections()[0]);
    comm.proxy_launch().unwrap();
    // Both buffers are zeroed before either rank's first put lands.
    comm.bootstrap().barrier().unwrap();
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let f = module.function("proxy_bytes_ping_pong").unwrap();
    let errors = DeviceBuffer::zeroed(&gpu, 8).unwrap();
    let stream = gpu.new_stream().unwrap();
    let (pbuf, perr, rank) = (buf.device_ptr().unwrap(), errors.device_ptr(), me as u32);
    // `guard_cap`: the kernel's `cap`; the byte at `bytes` is checked when it is below it.
    let run = |bytes: u64, rounds: u64, seed: u64, guard_cap: u64| {
        let mut l = stream.launch_builder(&f);
        l.arg(&conn)
            .arg(&pbuf)
            .arg(&bytes)
            .arg(&guard_cap)
            .arg(&rounds)
            .arg(&rank)
            .arg(&seed)
            .arg(&perr);
        // SAFETY: the connection, buffer and counter belong to `comm`/this scope and
        // outlive every synchronize below.
        unsafe { l.launch(block(1024)) }.unwrap();
    };
    for bytes in sizes() {
        // A seed per size: a stale byte of an earlier size never matches by accident.
        run(
            bytes,
            rounds_for(bytes),
            0x5eed ^ bytes.wrapping_mul(0x9e37_79b9),
            cap,
        );
        stream.synchronize().unwrap();
        let mut bad = [0u64];
        errors.copy_to_host(0, &mut bad).unwrap();
        assert_eq!(
            bad[0], 0,
            "rank {me}, flag mode {mode}: {} wrong bytes under the flag at {bytes} B",
            bad[0]
        );
    }
    println!("rank {me}: flag mode {mode}: data under the flag right at every size");
    // Timing (printed, not asserted): each rank's kernel time per round trip (two rounds).
    // The buffers hold earlier messages now: no guard byte (`cap == bytes`).
    let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
    for (what, bytes) in [("8 B ping-pong", 8u64), ("signal-only ping-pong", 0)] {
        run(bytes, 200, 7, bytes);
        stream.synchronize().unwrap();
        comm.bootstrap().barrier().unwrap();
        let rounds = 4000u64;
        let a = stream.record_event(timing).unwrap();
        run(bytes, rounds, 7, bytes);
        let b = stream.record_event(timing).unwrap();
        b.synchronize().unwrap();
        let ms = a.elapsed_ms(&b).unwrap() as f64;
        println!(
            "rank {me}: flag mode {mode}: {what}: {:.2} us per round trip ({} round trips; \
             not asserted)",
            ms * 1000.0 / (rounds / 2) as f64,
            rounds / 2
        );
    }
    let mut bad = [0u64];
    errors.copy_to_host(0, &mut bad).unwrap();
    assert_eq!(bad[0], 0, "rank {me}: wrong bytes in the timing runs");
    comm.proxy_stop().unwrap();
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

fn data_and_timing(test: &str, mode: ProxyFlagMode) {
    let used = effective(mode);
    if used != mode {
        println!("{PROXY_FLAG_ENV} is set: this run uses the {used} mode, not {mode}");
    }
    let out = run_two(test);
    if !out.is_empty() {
        let needle = format!("flag mode {used}: data under the flag right");
        assert!(
            out.iter().any(|l| l.contains(&needle)),
            "no rank reported `{needle}`"
        );
    }
}

#[test]
fn p2p_proxy_flag_stream_data_under_flag_and_timing() {
    if std::env::var(ROLE).is_ok() {
        return data_and_timing_rank(ProxyFlagMode::Stream);
    }
    data_and_timing(
        "p2p_proxy_flag_stream_data_under_flag_and_timing",
        ProxyFlagMode::Stream,
    );
}

#[test]
fn p2p_proxy_flag_cpu_data_under_flag_and_timing() {
    if std::env::var(ROLE).is_ok() {
        return data_and_timing_rank(ProxyFlagMode::Cpu);
    }
    data_and_timing(
        "p2p_proxy_flag_cpu_data_under_flag_and_timing",
        ProxyFlagMode::Cpu,
    );
}

/// Rank 0 in the `stream` mode, rank 1 in `cpu`: setup fails on both, naming the variable.
fn mismatch_rank() {
    let launch = Launch::from_env().unwrap();
    let mode = if launch.rank == 0 {
        ProxyFlagMode::Stream
    } else {
        ProxyFlagMode::Cpu
    };
    let mut comm = gpu_communicator(mode);
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let buf = comm.alloc_buffer(4096).unwrap();
    comm.connect(peer, &buf, 0, TransportKind::P2p).unwrap();
    let e = comm
        .connection_setup()
        .expect_err("setup with different flag modes")
        .to_string();
    assert!(
        e.contains(PROXY_FLAG_ENV) && e.contains("stream") && e.contains("cpu"),
        "rank {me}: {e}"
    );
    println!("rank {me}: refused as expected: {e}");
    println!("rank {me}: ok");
}

#[test]
fn p2p_proxy_flag_modes_must_match() {
    if std::env::var(ROLE).is_ok() {
        return mismatch_rank();
    }
    if std::env::var(PROXY_FLAG_ENV).is_ok() {
        println!("skipped: {PROXY_FLAG_ENV} is set, so both ranks would use one mode");
        return;
    }
    run_two("p2p_proxy_flag_modes_must_match");
}

/// The kernel over the Host transport on CPU threads: right data passes at odd and even
/// sizes and at a bare signal; a receiver expecting another sender's bytes counts errors
/// (so the GPU runs above can fail).
fn host_kernel_rank() {
    let launch_env = Launch::from_env().unwrap();
    let bs = launch_env.blocking_bootstrap().unwrap();
    // The flag mode only concerns P2P: on the Host backend `cpu` is accepted and changes
    // nothing (the Host transport's flags are CPU stores already).
    let config = CommConfig {
        device_timeout: Duration::from_secs(60),
        proxy_flag: ProxyFlagMode::Cpu,
        ..CommConfig::default()
    };
    let mut comm = Communicator::from_bootstrap(bs, Backend::Host, config).unwrap();
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let cap = 1u64 << 16;
    let buf = comm.alloc_buffer(cap as usize).unwrap();
    comm.connect(peer, &buf, 0, TransportKind::Host).unwrap();
    comm.connection_setup().unwrap();
    let conn = comm.device_connections()[0];
    comm.proxy_launch().unwrap();
    let pbuf = buf.host_ptr().unwrap() as usize;
    let errors = std::sync::atomic::AtomicU64::new(0);
    let perr = errors.as_ptr() as usize;
    let run = |bytes: u64, rounds: u64, seed: u64| {
        launch(Dim3::x(1), Dim3::x(4), || {
            // SAFETY: the buffer holds `cap` bytes and the counter lives past the launch;
            // the connection belongs to `comm`, which outlives it.
            unsafe {
                proxy_bytes_ping_pong(
                    conn,
                    pbuf as *mut u8,
                    bytes,
                    cap,
                    rounds,
                    me as u32,
                    seed,
                    perr as *mut u64,
                )
            }
        })
        .unwrap();
    };
    for bytes in [0u64, 1, 3, 8, 13, 1001, 4096, 4097] {
        run(bytes, 6, bytes + 1);
        assert_eq!(
            errors.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "{bytes} B"
        );
    }
    // Rank 1 expects another seed than rank 0 sends: its checks in odd rounds fail (and
    // rank 0's in even rounds).
    run(1000, 2, 99 + me as u64);
    let bad = errors.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        bad > 900,
        "rank {me}: only {bad} of 1000 wrong bytes counted"
    );
    println!("rank {me}: a wrong sender's 1000 bytes counted as {bad} errors");
    comm.proxy_stop().unwrap();
    comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

#[test]
fn bytes_ping_pong_kernel_checks_every_byte_over_the_host_transport() {
    if std::env::var(ROLE).is_ok() {
        return host_kernel_rank();
    }
    let out = run_test_ranks(
        "bytes_ping_pong_kernel_checks_every_byte_over_the_host_transport",
        2,
        ROLE,
        Duration::from_secs(120),
    );
    println!("{}", out.join("\n"));
}
