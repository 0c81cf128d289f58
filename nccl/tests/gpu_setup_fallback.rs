//! A communicator whose mscclpp side cannot be set up on one rank runs on the real NCCL
//! instead of failing (`setup_fallback.rs`); with `MSCCLPP_NCCL_SETUP_FALLBACK=0` on one rank the
//! set-up fails on every rank, promptly, with the reason.
//!
//! Two processes (this test re-run as ranks), rank 1 asking for a 1 TiB scratch
//! (`MSCCLPP_COLL_SCRATCH_BYTES`), which no GPU can allocate. Needs a GPU and a real NCCL
//! (found as the library finds it); without either it passes with a note, unless
//! `MSCCLPP_REQUIRE_GPU=1` (no GPU) or `MSCCLPP_REQUIRE_NCCL=1` (no real NCCL). When both
//! ranks share one GPU, each gets its own `NCCL_HOSTID`, so that the real NCCL (which refuses
//! two ranks on one GPU of one host) sees two hosts and joins them over its socket
//! transport on loopback.
//!
//! Also: on two simulated hosts with `MSCCLPP_P2P_REMOTE_MAX=0` (our collectives cannot
//! send to the other host's rank), sends and receives go to the real NCCL while the
//! collectives stay ours; with no real NCCL they fail naming why.

use std::ffi::c_void;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cudarc::driver::result as cu;
use mscclpp_nccl::api::*;

mod common;
use common::{ID_ENV, RANK_ENV, gpu_count, id_from_env, new_id_hex, wait_all};

const MODE_ENV: &str = "MSCCLPP_NCCL_TEST_MODE";
const TEST: &str = "set_up_failure_of_ours_falls_back_to_the_real_nccl";
const N: usize = 2;

#[test]
fn set_up_failure_of_ours_falls_back_to_the_real_nccl() {
    if let Ok(rank) = std::env::var(RANK_ENV) {
        rank_main(
            rank.parse().unwrap(),
            &std::env::var(MODE_ENV).unwrap_or_default(),
        );
        return;
    }
    if !have("GPU", TEST) {
        return;
    }
    if !have("NCCL", TEST) {
        return;
    }
    // Falls back: both ranks run every call on the real NCCL and say why.
    let logs = run_ranks(TEST, "fallback");
    for (r, log) in logs.iter().enumerate() {
        assert!(
            log.contains("mscclpp could not set up this communicator (rank 1: "),
            "rank {r} does not say that rank 1's set-up failed:\n{log}"
        );
        assert!(
            log.contains("ncclAllReduce float sum -> fallback (real NCCL)"),
            "rank {r}'s all-reduce did not go to the real NCCL:\n{log}"
        );
        assert!(
            !log.contains("-> native (mscclpp)"),
            "rank {r} ran a call natively:\n{log}"
        );
    }
    // Strict on rank 0 only: agreed, so both ranks fail.
    run_ranks(TEST, "strict");
}

const P2P_TEST: &str = "sends_our_collectives_cannot_make_go_to_the_real_nccl";

#[test]
fn sends_our_collectives_cannot_make_go_to_the_real_nccl() {
    if let Ok(rank) = std::env::var(RANK_ENV) {
        p2p_rank_main(
            rank.parse().unwrap(),
            &std::env::var(MODE_ENV).unwrap_or_default(),
        );
        return;
    }
    if !have("GPU", P2P_TEST) {
        return;
    }
    // No real NCCL: the send fails, saying why it was not ours.
    run_ranks(P2P_TEST, "p2p-alone");
    if !have("NCCL", P2P_TEST) {
        return;
    }
    let logs = run_ranks(P2P_TEST, "p2p");
    for (r, log) in logs.iter().enumerate() {
        assert!(
            log.contains("sends and receives (and gather, scatter) go to the real NCCL: ")
                && log.contains("MSCCLPP_P2P_REMOTE_MAX"),
            "rank {r} does not say why its sends go to the real NCCL:\n{log}"
        );
        assert!(
            log.contains("ncclAllReduce float sum -> native (mscclpp)"),
            "rank {r}'s all-reduce was not ours:\n{log}"
        );
        for call in ["ncclSend", "ncclRecv"] {
            assert!(
                log.contains(&format!("{call} float - -> fallback (real NCCL)")),
                "rank {r}'s {call} did not go to the real NCCL:\n{log}"
            );
        }
    }
}

/// Whether the machine has what `test` needs (`what`: "GPU" or "NCCL", a real NCCL as the
/// library finds it); without it the test passes with a note, unless `MSCCLPP_REQUIRE_GPU`
/// or `MSCCLPP_REQUIRE_NCCL` says it must not.
fn have(what: &str, test: &str) -> bool {
    let missing = match what {
        "GPU" => (gpu_count() == 0).then(|| "no GPU".to_string()),
        _ => mscclpp_nccl::system_nccl::real()
            .err()
            .map(|e| format!("no real NCCL ({e})")),
    };
    let Some(why) = missing else {
        return true;
    };
    assert!(
        std::env::var_os(format!("MSCCLPP_REQUIRE_{what}")).is_none(),
        "MSCCLPP_REQUIRE_{what} is set and there is {why}"
    );
    eprintln!("skipping (part of) {test}: {why}");
    false
}

/// Runs the two ranks of `test` in `mode`; both must exit 0 (their checks are inside).
/// Returns each rank's stderr.
fn run_ranks(test: &str, mode: &str) -> Vec<String> {
    let hex = new_id_hex();
    let exe = std::env::current_exe().unwrap();
    let shared_gpu = gpu_count() < N;
    let mut children: Vec<_> = (0..N)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.args(["--exact", test, "--nocapture"])
                .env(RANK_ENV, r.to_string())
                .env(ID_ENV, &hex)
                .env(MODE_ENV, mode)
                .env("MSCCLPP_DEBUG", "INFO")
                .env("NCCL_NVLS_ENABLE", "0")
                .env_remove("MSCCLPP_NCCL_LIB")
                .env_remove("MSCCLPP_NCCL_FALLBACK")
                .stderr(Stdio::piped());
            if test == TEST && r == 1 {
                cmd.env("MSCCLPP_COLL_SCRATCH_BYTES", (1u64 << 40).to_string());
            }
            if test == P2P_TEST {
                cmd.env("MSCCLPP_SIMULATE_HOSTS", "2")
                    .env("MSCCLPP_P2P_REMOTE_MAX", "0");
            }
            if mode == "p2p-alone" {
                cmd.env("MSCCLPP_NCCL_LIB", "none");
            }
            if mode == "strict" && r == 0 {
                cmd.env("MSCCLPP_NCCL_SETUP_FALLBACK", "0");
            }
            if shared_gpu {
                cmd.env("NCCL_HOSTID", format!("mscclpp-fallback-test-{r}"))
                    .env("NCCL_SOCKET_IFNAME", "lo")
                    .env("NCCL_IB_DISABLE", "1");
            }
            cmd.spawn().unwrap()
        })
        .collect();
    // Read the pipes on threads, so that a chatty rank cannot block on a full pipe.
    let readers: Vec<_> = children
        .iter_mut()
        .map(|c| {
            let mut err = c.stderr.take().unwrap();
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut err, &mut s);
                s
            })
        })
        .collect();
    let codes = wait_all(&mut children, Duration::from_secs(180), mode);
    let logs: Vec<String> = readers.into_iter().map(|h| h.join().unwrap()).collect();
    for (r, log) in logs.iter().enumerate() {
        eprintln!("---- {mode}: rank {r} ----\n{log}");
    }
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "{mode}: ranks failed: {codes:?}"
    );
    logs
}

fn ok(what: &str, r: i32) {
    if r != 0 {
        panic!("{what}: error {r}: {}", last_error());
    }
}

fn last_error() -> String {
    // SAFETY: null is allowed; a NUL-terminated text.
    unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// Sums `count` f32 over `comm` (rank r contributes `r + 1 + i % 5` at `i`) and checks.
fn check_all_reduce(what: &str, comm: *mut c_void, ranks: &[usize], me: usize, count: usize) {
    let ctx_stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).unwrap();
    let val = |r: usize, i: usize| (r + 1 + i % 5) as f32;
    // SAFETY: plain allocations of `count` f32 in the current context.
    let (x, y) = unsafe { (cu::malloc_sync(count * 4), cu::malloc_sync(count * 4)) };
    let (x, y) = (x.unwrap(), y.unwrap());
    let mine: Vec<f32> = (0..count).map(|i| val(me, i)).collect();
    // SAFETY: `x` holds `count` f32.
    unsafe { cu::memcpy_htod_sync(x, &mine) }.unwrap();
    cu::ctx::synchronize().unwrap();
    // SAFETY: device buffers of `count` f32, our communicator, a live stream.
    ok(what, unsafe {
        ncclAllReduce(
            x as *mut c_void,
            y as *mut c_void,
            count,
            7,
            0,
            comm,
            ctx_stream as *mut c_void,
        )
    });
    cu::ctx::synchronize().unwrap();
    let mut got = vec![0f32; count];
    // SAFETY: `y` holds `count` f32.
    unsafe { cu::memcpy_dtoh_sync(&mut got, y) }.unwrap();
    for (i, g) in got.iter().enumerate() {
        let want: f32 = ranks.iter().map(|&r| val(r, i)).sum();
        assert_eq!(*g, want, "{what}: element {i}");
    }
}

fn rank_main(rank: usize, mode: &str) {
    let id = id_from_env();
    let ctx = cudarc::driver::CudaContext::new(rank % gpu_count()).unwrap();
    ctx.bind_to_thread().unwrap();
    let mut comm: *mut c_void = std::ptr::null_mut();
    let start = Instant::now();
    // SAFETY: a live out-parameter; the id from the parent.
    let r = unsafe { ncclCommInitRank(&mut comm, N as i32, id, rank as i32) };
    if mode == "strict" {
        let msg = last_error();
        assert_ne!(r, 0, "rank {rank}: strict set-up succeeded");
        assert!(
            msg.contains("not falling back to the real NCCL"),
            "rank {rank}: {msg}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "rank {rank}: the failure took {:?}",
            start.elapsed()
        );
        eprintln!("rank {rank}: strict set-up failed as it should: {msg}");
        return;
    }
    ok(&format!("rank {rank}: ncclCommInitRank"), r);
    let mut n = 0;
    // SAFETY: our communicator; a live out-parameter.
    ok("ncclCommCount", unsafe { ncclCommCount(comm, &mut n) });
    assert_eq!(n, N as i32);
    for count in [1usize, 1000, 300_000] {
        check_all_reduce(
            &format!("rank {rank}: all-reduce of {count}"),
            comm,
            &[0, 1],
            rank,
            count,
        );
    }
    // A split of a communicator on the real NCCL is one too (both ranks in one color, in
    // reverse order).
    let mut child: *mut c_void = std::ptr::null_mut();
    // SAFETY: our communicator; a live out-parameter; no config.
    ok("ncclCommSplit", unsafe {
        ncclCommSplit(comm, 0, -(rank as i32), &mut child, std::ptr::null_mut())
    });
    let mut me = -1;
    // SAFETY: the child; a live out-parameter.
    ok("ncclCommUserRank", unsafe {
        ncclCommUserRank(child, &mut me)
    });
    assert_eq!(me as usize, N - 1 - rank, "rank {rank}: place in the split");
    check_all_reduce(
        &format!("rank {rank}: split all-reduce"),
        child,
        &[1, 0],
        me as usize,
        4096,
    );
    // SAFETY: our communicators, not used after this.
    unsafe {
        ok("ncclCommDestroy(child)", ncclCommDestroy(child));
        ok("ncclCommDestroy", ncclCommDestroy(comm));
    }
}

/// Rank `rank` of the send/receive test: an all-reduce (ours), then each rank sends
/// `count` f32 to the other and receives as many in one group, checked (`p2p`), or the
/// send fails saying why it was not ours (`p2p-alone`).
fn p2p_rank_main(rank: usize, mode: &str) {
    let id = id_from_env();
    let ctx = cudarc::driver::CudaContext::new(rank % gpu_count()).unwrap();
    ctx.bind_to_thread().unwrap();
    let mut comm: *mut c_void = std::ptr::null_mut();
    // Nonblocking asked for (p2p mode): the real communicator beside ours is made blocking
    // all the same, so that its splits (which take the parent's mode) are done when
    // ncclCommSplit returns (`split_children`). Ours block; the call returns when done.
    let mut cfg = mscclpp_nccl::types::NcclConfig::initializer();
    cfg.blocking = if mode == "p2p" { 0 } else { 1 };
    // SAFETY: a live out-parameter and config; the id from the parent.
    ok(&format!("rank {rank}: ncclCommInitRankConfig"), unsafe {
        ncclCommInitRankConfig(&mut comm, N as i32, id, rank as i32, &mut cfg)
    });
    check_all_reduce(
        &format!("rank {rank}: all-reduce"),
        comm,
        &[0, 1],
        rank,
        1000,
    );
    let peer = 1 - rank;
    let count = 100_000usize;
    let val = |r: usize, i: usize| (r * 1_000_000 + i) as f32;
    let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).unwrap();
    // SAFETY: plain allocations of `count` f32 in the current context.
    let (x, y) = unsafe { (cu::malloc_sync(count * 4), cu::malloc_sync(count * 4)) };
    let (x, y) = (x.unwrap(), y.unwrap());
    let mine: Vec<f32> = (0..count).map(|i| val(rank, i)).collect();
    // SAFETY: `x` holds `count` f32.
    unsafe { cu::memcpy_htod_sync(x, &mine) }.unwrap();
    cu::ctx::synchronize().unwrap();
    if mode == "p2p-alone" {
        // SAFETY: a device buffer of `count` f32, our communicator, a live stream.
        let r = unsafe {
            ncclSend(
                x as *const c_void,
                count,
                7,
                peer as i32,
                comm,
                stream as *mut c_void,
            )
        };
        let msg = last_error();
        assert_ne!(r, 0, "rank {rank}: a send with no way to make it succeeded");
        assert!(
            msg.contains("send/recv across hosts is off for this communicator")
                && msg.contains("MSCCLPP_P2P_REMOTE_MAX"),
            "rank {rank}: {msg}"
        );
        eprintln!("rank {rank}: the send failed as it should: {msg}");
    } else {
        exchange(&format!("rank {rank}"), comm, rank, (x, y), count, stream);
        // Ours still runs the collectives after the real NCCL's sends.
        check_all_reduce(
            &format!("rank {rank}: all-reduce after"),
            comm,
            &[0, 1],
            rank,
            4096,
        );
        split_children(rank, comm, (x, y), count, stream);
    }
    // SAFETY: our communicator, not used after this.
    unsafe { ok("ncclCommDestroy", ncclCommDestroy(comm)) };
}

/// Each rank sends `count` f32 from `x` to the other and receives as many into `y` in one
/// group on `comm` (the real NCCL's sends here), and checks them.
fn exchange(
    what: &str,
    comm: *mut c_void,
    rank: usize,
    (x, y): (u64, u64),
    count: usize,
    stream: cudarc::driver::sys::CUstream,
) {
    let peer = 1 - rank;
    // SAFETY: device buffers of `count` f32, our communicator, a live stream; the group
    // pairs the two directions.
    unsafe {
        ok("ncclGroupStart", ncclGroupStart());
        let s = stream as *mut c_void;
        ok(
            &format!("{what}: ncclSend"),
            ncclSend(x as *const c_void, count, 7, peer as i32, comm, s),
        );
        ok(
            &format!("{what}: ncclRecv"),
            ncclRecv(y as *mut c_void, count, 7, peer as i32, comm, s),
        );
        ok(&format!("{what}: ncclGroupEnd"), ncclGroupEnd());
    }
    cu::ctx::synchronize().unwrap();
    let mut got = vec![0f32; count];
    // SAFETY: `y` holds `count` f32.
    unsafe { cu::memcpy_dtoh_sync(&mut got, y) }.unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(
            *g,
            (peer * 1_000_000 + i) as f32,
            "{what}: element {i} from rank {peer}"
        );
    }
}

/// Children whose real communicator the real NCCL makes later than the call: a split inside
/// a group (the real NCCL defers it to its `ncclGroupEnd`) and a split asking for a
/// nonblocking communicator. Each child's sends go to its real communicator, which must
/// exist when the split has returned (they were missing before, and the real NCCL wrote the
/// handle into a slot on a stack frame gone by then). A rank splitting with
/// `NCCL_SPLIT_NOCOLOR` gets NULL, which ncclCommDestroy takes (as NCCL).
fn split_children(
    rank: usize,
    comm: *mut c_void,
    (x, y): (u64, u64),
    count: usize,
    stream: cudarc::driver::sys::CUstream,
) {
    let mut grouped: *mut c_void = std::ptr::null_mut();
    // SAFETY: our communicator; a live out-parameter; no config.
    unsafe {
        ok("ncclGroupStart (split)", ncclGroupStart());
        ok(
            "ncclCommSplit in a group",
            ncclCommSplit(comm, 0, rank as i32, &mut grouped, std::ptr::null_mut()),
        );
        ok("ncclGroupEnd (split)", ncclGroupEnd());
    }
    assert!(
        !grouped.is_null(),
        "rank {rank}: no child from the grouped split"
    );
    exchange(
        &format!("rank {rank}, split in a group"),
        grouped,
        rank,
        (x, y),
        count,
        stream,
    );
    check_all_reduce(
        &format!("rank {rank}: all-reduce on the grouped split"),
        grouped,
        &[0, 1],
        rank,
        4096,
    );
    let mut cfg = mscclpp_nccl::types::NcclConfig::initializer();
    cfg.blocking = 0;
    let mut nonblocking: *mut c_void = std::ptr::null_mut();
    // SAFETY: our communicator; a live out-parameter and config.
    let r = unsafe { ncclCommSplit(comm, 0, rank as i32, &mut nonblocking, &mut cfg) };
    assert!(
        r == 0 || r == 7,
        "rank {rank}: nonblocking split: {r}: {}",
        last_error()
    );
    let t0 = Instant::now();
    loop {
        let mut state = -1;
        // SAFETY: the child; a live out-parameter.
        ok("ncclCommGetAsyncError", unsafe {
            ncclCommGetAsyncError(nonblocking, &mut state)
        });
        if state == 0 {
            break;
        }
        assert!(
            state == 7 && t0.elapsed() < Duration::from_secs(60),
            "rank {rank}: nonblocking child: state {state} after {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    exchange(
        &format!("rank {rank}, nonblocking split"),
        nonblocking,
        rank,
        (x, y),
        count,
        stream,
    );
    let color = if rank == 0 { 0 } else { -1 };
    let mut alone: *mut c_void = std::ptr::null_mut();
    // SAFETY: our communicator; a live out-parameter; no config.
    ok("ncclCommSplit (NOCOLOR on rank 1)", unsafe {
        ncclCommSplit(comm, color, 0, &mut alone, std::ptr::null_mut())
    });
    assert_eq!(alone.is_null(), rank == 1, "rank {rank}: NOCOLOR child");
    // SAFETY: our communicators (or NULL), not used after this.
    unsafe {
        ok("ncclCommDestroy(alone)", ncclCommDestroy(alone));
        ok("ncclCommDestroy(nonblocking)", ncclCommDestroy(nonblocking));
        ok("ncclCommDestroy(grouped)", ncclCommDestroy(grouped));
    }
    eprintln!("rank {rank}: split children (in a group, nonblocking, NOCOLOR) passed");
}
