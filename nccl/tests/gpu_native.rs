//! The native calls through the C API on GPUs: two processes (this test re-run as ranks),
//! one GPU each (or both on GPU 0 when there is one: CUDA IPC works between processes on
//! one device), with no real NCCL (`MSCCLPP_NCCL_LIB=none`), so a call that forwarded would
//! fail. Checks every native collective's results, in and out of place, sends/receives alone
//! and in groups (to the own rank, past 16 operations, on two streams), gather and scatter
//! (native since they are spelled as sends and receives), and an all-gather of bytes at an
//! odd address (forwarded before). Passes with a note without a GPU.

use std::ffi::c_void;
use std::process::Command;
use std::time::Duration;

use cudarc::driver::result as cu;
use mscclpp_nccl::api::*;
use mscclpp_nccl::system_nccl::RawUniqueId;

mod common;
use common::{ID_ENV, RANK_ENV, gpu_count, id_from_env, new_id_hex, wait_all};

const N: usize = 2;

#[test]
fn native_calls_through_the_c_api_on_gpus() {
    if let Ok(rank) = std::env::var(RANK_ENV) {
        rank_main(rank.parse().unwrap());
        return;
    }
    if gpu_count() == 0 {
        assert!(
            std::env::var_os("MSCCLPP_REQUIRE_GPU").is_none(),
            "MSCCLPP_REQUIRE_GPU is set and there is no GPU"
        );
        eprintln!("skipping native_calls_through_the_c_api_on_gpus: no GPU");
        return;
    }
    let hex = new_id_hex();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..N)
        .map(|r| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "native_calls_through_the_c_api_on_gpus",
                    "--nocapture",
                ])
                .env(RANK_ENV, r.to_string())
                .env(ID_ENV, &hex)
                .env("MSCCLPP_NCCL_LIB", "none")
                .env("MSCCLPP_DEBUG", "INFO")
                .spawn()
                .unwrap()
        })
        .collect();
    let codes = wait_all(&mut children, Duration::from_secs(240), "native calls");
    assert!(
        codes.iter().all(|c| *c == Some(0)),
        "ranks failed: {codes:?}"
    );
}

/// The environment variable that makes the abort test's child run the cycles.
const ABORT_CHILD_ENV: &str = "MSCCLPP_NCCL_TEST_ABORT_CHILD";

/// `ncclCommAbort` frees what the communicator held: one process initialises two ranks (as
/// threads, on GPUs 0 and 1, or both on GPU 0), runs an all-reduce and aborts, four times;
/// the device's free memory after the last cycle is within half of one communicator's
/// footprint of that after the first (an abort that leaked, as before, lost a footprint
/// per cycle). Run in a child process, with no real NCCL.
#[test]
fn abort_frees_the_communicators_memory() {
    if std::env::var_os(ABORT_CHILD_ENV).is_some() {
        abort_cycles();
        return;
    }
    in_child("abort_frees_the_communicators_memory", ABORT_CHILD_ENV);
}

/// Runs `test` again in a child process with `env` set and no real NCCL, and expects it to
/// pass; skips (with a note) without a GPU.
fn in_child(test: &str, env: &str) {
    if gpu_count() == 0 {
        assert!(
            std::env::var_os("MSCCLPP_REQUIRE_GPU").is_none(),
            "MSCCLPP_REQUIRE_GPU is set and there is no GPU"
        );
        eprintln!("skipping {test}: no GPU");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut child = [Command::new(&exe)
        .args(["--exact", test, "--nocapture"])
        .env(env, "1")
        .env("MSCCLPP_NCCL_LIB", "none")
        .spawn()
        .unwrap()];
    let codes = wait_all(&mut child, Duration::from_secs(240), test);
    assert_eq!(codes, [Some(0)], "{test} failed in its child process");
}

fn abort_cycles() {
    let ctxs: Vec<_> = (0..N)
        .map(|r| cudarc::driver::CudaContext::new(r % gpu_count()).unwrap())
        .collect();
    ctxs[0].bind_to_thread().unwrap();
    let free = || cu::mem_get_info().unwrap().0 as i64;
    let before = free();
    let mut footprint = 0i64;
    let mut after = Vec::new();
    for cycle in 0..4 {
        let mut id = RawUniqueId { internal: [0; 128] };
        // SAFETY: a live out-parameter.
        ok("ncclGetUniqueId", unsafe { ncclGetUniqueId(&mut id) });
        let inside = std::sync::Arc::new(std::sync::Barrier::new(N));
        let threads: Vec<_> = (0..N)
            .map(|rank| {
                let ctx = ctxs[rank].clone();
                let inside = inside.clone();
                std::thread::spawn(move || -> i64 {
                    ctx.bind_to_thread().unwrap();
                    let s = ctx.new_stream().unwrap();
                    let st = s.cu_stream() as *mut c_void;
                    let mut comm: *mut c_void = std::ptr::null_mut();
                    // SAFETY: a live out-parameter; the cycle's id.
                    ok("ncclCommInitRank", unsafe {
                        ncclCommInitRank(&mut comm, N as i32, id, rank as i32)
                    });
                    let count = 1 << 20;
                    let (x, y) = (dev(count * 4), dev(count * 4));
                    put(x, &vec![1f32 + rank as f32; count]);
                    // The ranks share the GPU's context: `put`'s context-wide synchronise
                    // would wait for the other rank's all-reduce kernel, which waits for
                    // this rank's. Both finish their copies before either launches.
                    inside.wait();
                    // SAFETY: device buffers of `count` f32, our communicator and stream.
                    ok("ncclAllReduce", unsafe {
                        ncclAllReduce(p(x), p(y), count, 7, 0, comm, st)
                    });
                    s.synchronize().unwrap();
                    let got: Vec<f32> = get(y, count);
                    assert!(got.iter().all(|g| *g == 3.0), "rank {rank}: all-reduce");
                    // Both ranks set up and ran: what the device has free now.
                    inside.wait();
                    let now = cu::mem_get_info().unwrap().0 as i64;
                    inside.wait();
                    // SAFETY: our communicator, not used after this.
                    ok("ncclCommAbort", unsafe { ncclCommAbort(comm) });
                    // SAFETY: the buffers of this thread, no work pending on them.
                    unsafe {
                        cu::free_sync(x).unwrap();
                        cu::free_sync(y).unwrap();
                    }
                    now
                })
            })
            .collect();
        let inside_free: Vec<i64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        if cycle == 0 {
            footprint = before - inside_free[0];
        }
        after.push(free());
        println!(
            "cycle {cycle}: free {} MiB before, {} MiB with both communicators, {} MiB after the aborts",
            before >> 20,
            inside_free[0] >> 20,
            after[cycle] >> 20
        );
    }
    assert!(footprint > 0, "the communicators took no device memory?");
    let lost = after[0] - after[3];
    assert!(
        lost < footprint / 2,
        "three more abort cycles lost {} MiB of device memory (one cycle's communicators and \
         buffers take {} MiB)",
        lost >> 20,
        footprint >> 20
    );
}

/// The environment variable that makes the revoke test's child run.
const REVOKE_CHILD_ENV: &str = "MSCCLPP_NCCL_TEST_REVOKE_CHILD";

/// `ncclCommRevoke` as a fault-tolerant program uses it: two ranks (threads, as in the
/// abort test) run an all-reduce, revoke, wait for `ncclCommGetAsyncError` to go from
/// `ncclInProgress` to `ncclSuccess`, see collectives and `ncclCommFinalize` refused with
/// `ncclInvalidUsage`, then rank 0 shrinks the communicator to itself (rank 1 excluded,
/// as after its loss) and runs an all-reduce on the child; both destroy the revoked
/// parent without a barrier. No real NCCL.
#[test]
fn revoke_then_shrink_on_gpus() {
    if std::env::var_os(REVOKE_CHILD_ENV).is_some() {
        revoke_ranks();
        return;
    }
    in_child("revoke_then_shrink_on_gpus", REVOKE_CHILD_ENV);
}

fn revoke_ranks() {
    let ctxs: Vec<_> = (0..N)
        .map(|r| cudarc::driver::CudaContext::new(r % gpu_count()).unwrap())
        .collect();
    let mut id = RawUniqueId { internal: [0; 128] };
    // SAFETY: a live out-parameter.
    ok("ncclGetUniqueId", unsafe { ncclGetUniqueId(&mut id) });
    let inside = std::sync::Arc::new(std::sync::Barrier::new(N));
    let threads: Vec<_> = (0..N)
        .map(|rank| {
            let ctx = ctxs[rank].clone();
            let inside = inside.clone();
            std::thread::spawn(move || {
                ctx.bind_to_thread().unwrap();
                let s = ctx.new_stream().unwrap();
                let st = s.cu_stream() as *mut c_void;
                let mut comm: *mut c_void = std::ptr::null_mut();
                // SAFETY: a live out-parameter; the test's id.
                ok("ncclCommInitRank", unsafe {
                    ncclCommInitRank(&mut comm, N as i32, id, rank as i32)
                });
                let count = 4096;
                let (x, y) = (dev(count * 4), dev(count * 4));
                put(x, &vec![1f32 + rank as f32; count]);
                inside.wait();
                // SAFETY (every call below): device buffers of `count` f32, our
                // communicators and stream.
                ok("ncclAllReduce", unsafe {
                    ncclAllReduce(p(x), p(y), count, 7, 0, comm, st)
                });
                s.synchronize().unwrap();
                assert!(
                    get::<f32>(y, count).iter().all(|g| *g == 3.0),
                    "rank {rank}"
                );
                ok("ncclCommRevoke", unsafe { ncclCommRevoke(comm, 0) });
                // In progress until the GPU's work has ended, then success.
                let start = std::time::Instant::now();
                loop {
                    let mut state = -1;
                    ok("ncclCommGetAsyncError", unsafe {
                        ncclCommGetAsyncError(comm, &mut state)
                    });
                    match state {
                        0 => break,
                        7 => assert!(
                            start.elapsed() < Duration::from_secs(20),
                            "rank {rank}: still in progress 20 s after the revoke"
                        ),
                        other => panic!("rank {rank}: async state {other} after the revoke"),
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                let r = unsafe { ncclAllReduce(p(x), p(y), count, 7, 0, comm, st) };
                assert_eq!(r, 5, "rank {rank}: an all-reduce after the revoke");
                // SAFETY: null is allowed; a NUL-terminated text.
                let msg =
                    unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) };
                assert!(
                    msg.to_string_lossy().contains("revoked"),
                    "rank {rank}: {msg:?}"
                );
                assert_eq!(
                    unsafe { ncclCommFinalize(comm) },
                    5,
                    "rank {rank}: finalize"
                );
                if rank == 0 {
                    let mut excluded = [1i32];
                    let mut child: *mut c_void = std::ptr::null_mut();
                    ok("ncclCommShrink", unsafe {
                        ncclCommShrink(
                            comm,
                            excluded.as_mut_ptr(),
                            1,
                            &mut child,
                            std::ptr::null_mut(),
                            0,
                        )
                    });
                    let mut n = 0;
                    ok("ncclCommCount", unsafe { ncclCommCount(child, &mut n) });
                    assert_eq!(n, 1, "the shrunk communicator's size");
                    ok("ncclAllReduce on the child", unsafe {
                        ncclAllReduce(p(x), p(y), count, 7, 0, child, st)
                    });
                    s.synchronize().unwrap();
                    assert!(get::<f32>(y, count).iter().all(|g| *g == 1.0), "the child");
                    ok("ncclCommDestroy child", unsafe { ncclCommDestroy(child) });
                }
                ok("ncclCommDestroy", unsafe { ncclCommDestroy(comm) });
                // SAFETY: the buffers of this thread, no work pending on them.
                unsafe {
                    cu::free_sync(x).unwrap();
                    cu::free_sync(y).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    println!("revoke: both ranks passed");
}

/// A device buffer of `len` bytes (freed at the end of the process).
fn dev(len: usize) -> u64 {
    // SAFETY: a plain allocation in the current context.
    unsafe { cu::malloc_sync(len.max(1)) }.unwrap()
}

/// Copies `v` to `d` and waits for the copy to land: from pageable memory `cuMemcpyHtoD`
/// may return before its DMA is done, and the test's streams do not order after it.
fn put<T: Copy>(d: u64, v: &[T]) {
    // SAFETY: `d` holds at least `v`'s bytes (the test sizes them).
    unsafe { cu::memcpy_htod_sync(d, v) }.unwrap();
    cu::ctx::synchronize().unwrap();
}

fn get<T: Copy + Default>(d: u64, len: usize) -> Vec<T> {
    let mut v = vec![T::default(); len];
    // SAFETY: as in put.
    unsafe { cu::memcpy_dtoh_sync(&mut v, d) }.unwrap();
    v
}

fn ok(what: &str, r: i32) {
    if r != 0 {
        // SAFETY: null is allowed; a NUL-terminated text.
        let msg = unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) };
        panic!("{what}: error {r}: {}", msg.to_string_lossy());
    }
}

fn p(a: u64) -> *mut c_void {
    a as *mut c_void
}

fn rank_main(rank: usize) {
    let id = id_from_env();
    let device = rank % gpu_count();
    let ctx = cudarc::driver::CudaContext::new(device).unwrap();
    let s1 = ctx.new_stream().unwrap();
    let s2 = ctx.new_stream().unwrap();
    let (st, st2) = (s1.cu_stream() as *mut c_void, s2.cu_stream() as *mut c_void);
    let sync = || {
        s1.synchronize().unwrap();
        s2.synchronize().unwrap();
    };
    let mut comm: *mut c_void = std::ptr::null_mut();
    // SAFETY: a live out-parameter; the id from the parent.
    ok("ncclCommInitRank", unsafe {
        ncclCommInitRank(&mut comm, N as i32, id, rank as i32)
    });
    let peer = 1 - rank;
    let val = |q: usize, i: usize| ((q * 5 + i * 3) % 7) as f32 + 1.0;

    for count in [1000usize, 300_000] {
        let what = |c: &str| format!("rank {rank}: {c} count {count}");
        let b = count * 4;
        // All-reduce: f32 sum out of place, i32 max in place, f64 prod.
        let (x, y) = (dev(b), dev(b));
        put(x, &(0..count).map(|i| val(rank, i)).collect::<Vec<f32>>());
        // SAFETY (every call below): device buffers of the sizes NCCL's call implies, our
        // communicator and streams.
        ok(&what("allreduce"), unsafe {
            ncclAllReduce(p(x), p(y), count, 7, 0, comm, st)
        });
        sync();
        let got: Vec<f32> = get(y, count);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, g)| *g == val(0, i) + val(1, i)),
            "{}",
            what("allreduce sum")
        );
        put(
            x,
            &(0..count)
                .map(|i| (rank as i32 - 1) * i as i32)
                .collect::<Vec<i32>>(),
        );
        ok(&what("allreduce max"), unsafe {
            ncclAllReduce(p(x), p(x), count, 2, 2, comm, st)
        });
        sync();
        let got: Vec<i32> = get(x, count);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, g)| *g == 0.max(-(i as i32))),
            "{}",
            what("allreduce max")
        );
        let (xd, yd) = (dev(2 * b), dev(2 * b));
        put(
            xd,
            &(0..count)
                .map(|i| val(rank, i) as f64)
                .collect::<Vec<f64>>(),
        );
        ok(&what("allreduce prod"), unsafe {
            ncclAllReduce(p(xd), p(yd), count, 8, 1, comm, st)
        });
        sync();
        let got: Vec<f64> = get(yd, count);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, g)| *g == (val(0, i) * val(1, i)) as f64),
            "{}",
            what("allreduce prod")
        );

        // Reduce-scatter (f32 sum; recv count `count / 2`).
        let h = count / 2;
        put(x, &(0..count).map(|i| val(rank, i)).collect::<Vec<f32>>());
        ok(&what("reducescatter"), unsafe {
            ncclReduceScatter(p(x), p(y), h, 7, 0, comm, st)
        });
        sync();
        let got: Vec<f32> = get(y, h);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, g)| *g == val(0, rank * h + i) + val(1, rank * h + i)),
            "{}",
            what("reducescatter")
        );

        // Reduce to rank 1 (f32 min).
        put(x, &(0..count).map(|i| val(rank, i)).collect::<Vec<f32>>());
        put(y, &vec![-1f32; count]);
        ok(&what("reduce"), unsafe {
            ncclReduce(p(x), p(y), count, 7, 3, 1, comm, st)
        });
        sync();
        if rank == 1 {
            let got: Vec<f32> = get(y, count);
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, g)| *g == val(0, i).min(val(1, i))),
                "{}",
                what("reduce")
            );
        }

        // Broadcast from 0 (f32), Bcast in place from 1 (int8).
        put(x, &(0..count).map(|i| val(rank, i)).collect::<Vec<f32>>());
        ok(&what("broadcast"), unsafe {
            ncclBroadcast(p(x), p(y), count, 7, 0, comm, st)
        });
        sync();
        let got: Vec<f32> = get(y, count);
        assert!(
            got.iter().enumerate().all(|(i, g)| *g == val(0, i)),
            "{}",
            what("broadcast")
        );
        put(
            x,
            &(0..count)
                .map(|i| (i % 100) as i8 * if rank == 1 { 1 } else { -1 })
                .collect::<Vec<i8>>(),
        );
        ok(&what("bcast"), unsafe {
            ncclBcast(p(x), count, 0, 1, comm, st)
        });
        sync();
        let got: Vec<i8> = get(x, count);
        assert!(
            got.iter().enumerate().all(|(i, g)| *g == (i % 100) as i8),
            "{}",
            what("bcast")
        );

        // All-to-all (f32, blocks of `h`).
        put(x, &(0..count).map(|i| val(rank, i)).collect::<Vec<f32>>());
        ok(&what("alltoall"), unsafe {
            ncclAlltoAll(p(x), p(y), h, 7, comm, st)
        });
        sync();
        let got: Vec<f32> = get(y, count);
        let want: Vec<f32> = (0..N)
            .flat_map(|q| (0..h).map(move |i| val(q, rank * h + i)))
            .collect();
        assert_eq!(got, want, "{}", what("alltoall"));

        // Gather to rank 1 (out of place), then scatter from rank 0 (in place there: its
        // piece is slot 0 of its input): as the group of sends and receives they stand for.
        put(x, &(0..h).map(|i| val(rank, i)).collect::<Vec<f32>>());
        put(y, &vec![0f32; N * h]);
        ok(&what("gather"), unsafe {
            ncclGather(p(x), p(y), h, 7, 1, comm, st)
        });
        sync();
        let got: Vec<f32> = get(y, N * h);
        let want: Vec<f32> = if rank == 1 {
            (0..N)
                .flat_map(|q| (0..h).map(move |i| val(q, i)))
                .collect()
        } else {
            vec![0f32; N * h]
        };
        assert_eq!(got, want, "{}", what("gather"));
        put(x, &(0..N * h).map(|i| val(9, i)).collect::<Vec<f32>>());
        let dst = if rank == 0 { x } else { y };
        ok(&what("scatter"), unsafe {
            ncclScatter(p(x), p(dst), h, 7, 0, comm, st)
        });
        sync();
        let got: Vec<f32> = get(dst, h);
        let want: Vec<f32> = (0..h).map(|i| val(9, rank * h + i)).collect();
        assert_eq!(got, want, "{}", what("scatter"));

        // All-gather of bytes at an odd address, odd count.
        let n1 = count + 1;
        let (gx, gy) = (dev(n1 + 1), dev(N * n1 + 1));
        put(
            gx + 1,
            &(0..n1).map(|i| (i * 7 + rank) as u8).collect::<Vec<u8>>(),
        );
        ok(&what("allgather"), unsafe {
            ncclAllGather(p(gx + 1), p(gy + 1), n1, 1, comm, st)
        });
        sync();
        let got: Vec<u8> = get(gy + 1, N * n1);
        let want: Vec<u8> = (0..N)
            .flat_map(|q| (0..n1).map(move |i| (i * 7 + q) as u8))
            .collect();
        assert_eq!(got, want, "{}", what("allgather bytes"));

        // Send/recv outside a group: 0 -> 1.
        put(x, &(0..count).map(|i| val(rank, i)).collect::<Vec<f32>>());
        if rank == 0 {
            ok(&what("send"), unsafe {
                ncclSend(p(x), count, 7, 1, comm, st)
            });
        } else {
            ok(&what("recv"), unsafe {
                ncclRecv(p(y), count, 7, 0, comm, st)
            });
        }
        sync();
        if rank == 1 {
            let got: Vec<f32> = get(y, count);
            assert!(
                got.iter().enumerate().all(|(i, g)| *g == val(0, i)),
                "{}",
                what("send/recv")
            );
        }

        // A group: exchange with the peer on two streams, and a send to the own rank.
        let (z, w) = (dev(b), dev(b));
        put(x, &(0..count).map(|i| val(rank, i)).collect::<Vec<f32>>());
        put(
            z,
            &(0..count).map(|i| val(rank + 10, i)).collect::<Vec<f32>>(),
        );
        ok("groupstart", unsafe { ncclGroupStart() });
        ok(&what("group send"), unsafe {
            ncclSend(p(x), count, 7, peer as i32, comm, st)
        });
        ok(&what("group recv"), unsafe {
            ncclRecv(p(y), count, 7, peer as i32, comm, st2)
        });
        ok(&what("group self send"), unsafe {
            ncclSend(p(z), count, 7, rank as i32, comm, st)
        });
        ok(&what("group self recv"), unsafe {
            ncclRecv(p(w), count, 7, rank as i32, comm, st2)
        });
        ok("groupend", unsafe { ncclGroupEnd() });
        sync();
        let got: Vec<f32> = get(y, count);
        assert!(
            got.iter().enumerate().all(|(i, g)| *g == val(peer, i)),
            "{}",
            what("group exchange")
        );
        let got: Vec<f32> = get(w, count);
        assert!(
            got.iter().enumerate().all(|(i, g)| *g == val(rank + 10, i)),
            "{}",
            what("group self")
        );

        // Collectives in a group run at its end, as NCCL enqueues a group's work there: the
        // streams are idle before ncclGroupEnd (y keeps its marker), and a group ended by
        // ncclGroupSimulateEnd runs none of its collectives (y keeps it after the end too).
        put(x, &(0..count).map(|i| val(rank, i)).collect::<Vec<f32>>());
        let marker = vec![-1f32; count];
        for simulate in [true, false] {
            put(y, &marker);
            ok("groupstart", unsafe { ncclGroupStart() });
            ok(&what("group allreduce"), unsafe {
                ncclAllReduce(p(x), p(y), count, 7, 0, comm, st)
            });
            ok(&what("group allgather"), unsafe {
                ncclAllGather(p(x), p(w), count / 2, 7, comm, st2)
            });
            sync();
            let got: Vec<f32> = get(y, count);
            assert!(
                got == marker,
                "{}",
                what("group allreduce ran before the end")
            );
            if simulate {
                // ncclSimInfo_t as NCCL_SIM_INFO_INITIALIZER makes it.
                #[repr(C)]
                struct SimInfo {
                    size: usize,
                    magic: u32,
                    version: u32,
                    estimated_time: f32,
                }
                let mut sim = SimInfo {
                    size: std::mem::size_of::<SimInfo>(),
                    magic: 0x7468_5283,
                    version: 22800,
                    estimated_time: -1.0,
                };
                ok("groupsimulateend", unsafe {
                    ncclGroupSimulateEnd(&mut sim as *mut SimInfo as *mut c_void)
                });
                sync();
                let got: Vec<f32> = get(y, count);
                assert!(
                    got == marker,
                    "{}",
                    what("simulated group ran its allreduce")
                );
            } else {
                ok("groupend", unsafe { ncclGroupEnd() });
                sync();
                let got: Vec<f32> = get(y, count);
                assert!(
                    got.iter()
                        .enumerate()
                        .all(|(i, g)| *g == val(0, i) + val(1, i)),
                    "{}",
                    what("group allreduce")
                );
                let got: Vec<f32> = get(w, count);
                let half = count / 2;
                assert!(
                    got.iter()
                        .enumerate()
                        .all(|(i, g)| *g == val(i / half, i % half)),
                    "{}",
                    what("group allgather")
                );
            }
        }
    }

    // A group of 20 sends and 20 receives with the peer (past one launch's 16), nested.
    let m = 20;
    let k = 4097;
    let bufs: Vec<(u64, u64)> = (0..m).map(|_| (dev(k * 4), dev(k * 4))).collect();
    for (j, (sb, _)) in bufs.iter().enumerate() {
        put(
            *sb,
            &(0..k)
                .map(|i| (rank * 100_000 + j * 1000 + i) as f32)
                .collect::<Vec<f32>>(),
        );
    }
    ok("groupstart", unsafe { ncclGroupStart() });
    ok("groupstart inner", unsafe { ncclGroupStart() });
    for (sb, rb) in &bufs {
        if rank == 0 {
            ok("send", unsafe {
                ncclSend(p(*sb), k, 7, peer as i32, comm, st)
            });
            ok("recv", unsafe {
                ncclRecv(p(*rb), k, 7, peer as i32, comm, st)
            });
        } else {
            ok("recv", unsafe {
                ncclRecv(p(*rb), k, 7, peer as i32, comm, st)
            });
            ok("send", unsafe {
                ncclSend(p(*sb), k, 7, peer as i32, comm, st)
            });
        }
    }
    ok("groupend inner", unsafe { ncclGroupEnd() });
    ok("groupend", unsafe { ncclGroupEnd() });
    sync();
    for (j, (_, rb)) in bufs.iter().enumerate() {
        let got: Vec<f32> = get(*rb, k);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, g)| *g == (peer * 100_000 + j * 1000 + i) as f32),
            "rank {rank}: big group message {j}"
        );
    }
    let mut async_err = -1;
    ok("asyncerror", unsafe {
        ncclCommGetAsyncError(comm, &mut async_err)
    });
    assert_eq!(async_err, 0);
    // Finalize once; a second finalize is refused with ncclInvalidArgument, as NCCL does.
    ok("finalize", unsafe { ncclCommFinalize(comm) });
    assert_eq!(
        unsafe { ncclCommFinalize(comm) },
        4,
        "rank {rank}: second finalize"
    );
    ok("destroy", unsafe { ncclCommDestroy(comm) });
    println!("rank {rank}: every native call passed");
}
