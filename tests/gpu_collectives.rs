//! All-reduce and all-gather on GPUs: two processes (`MSCCLPP_TEST_GPUS=N` for N, 2..=8),
//! one GPU each (all on GPU 0 when the machine has one). Random data of every power-of-two size from 4 B to 1 GiB and odd
//! counts next to them, f32/f16/bf16, both algorithms, in place and out of place, checked
//! against a CPU reference that adds in the same rank order (so results must match
//! exactly); CUDA-graph capture and replay; the typed cudarc API. Skips with a reason
//! without a GPU; fails instead under MSCCLPP_REQUIRE_GPU=1.

use mscclpp::host::collectives::RawBuffer;
use std::time::Duration;

use half::{bf16, f16};
use mscclpp::host::collectives::{AllGatherAlgo, AllReduceAlgo, CollConfig, DataType, ReduceOp};
use mscclpp::host::cuda::CudaSlice;
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::{gpu_or_skip, run_test_ranks};

mod common;

use common::{ROLE, dptr, mismatches, par_bytes, setup, splitmix, test_ranks};

fn run_ranks(test: &str) {
    if gpu_or_skip(test, 0).is_none() {
        return;
    }
    run_test_ranks(
        test,
        test_ranks(),
        ROLE,
        Duration::from_secs(common::test_timeout_s()),
    );
}

/// Rank `rank`'s input element `i` of call `seed`, as raw bits of `dtype`: random values
/// in [-4, 4) that the type holds exactly.
fn input(dtype: DataType, seed: u64, rank: usize, i: usize) -> u32 {
    let h = splitmix(seed ^ (rank as u64) << 56 ^ i as u64);
    let v = (h >> 40) as f32 / (1u64 << 21) as f32 - 4.0;
    match dtype {
        DataType::F32 => v.to_bits(),
        DataType::F16 => f16::from_f32(v).to_bits() as u32,
        DataType::Bf16 => bf16::from_f32(v).to_bits() as u32,
        _ => unreachable!("this test sweeps f32, f16 and bf16"),
    }
}

/// `a + b` in `dtype`, rounded to nearest even (the f32 sum of two f16/bf16 values rounds
/// correctly to them).
fn add(dtype: DataType, a: u32, b: u32) -> u32 {
    match dtype {
        DataType::F32 => (f32::from_bits(a) + f32::from_bits(b)).to_bits(),
        DataType::F16 => {
            let s = f16::from_bits(a as u16).to_f32() + f16::from_bits(b as u16).to_f32();
            f16::from_f32(s).to_bits() as u32
        }
        DataType::Bf16 => {
            let s = bf16::from_bits(a as u16).to_f32() + bf16::from_bits(b as u16).to_f32();
            bf16::from_f32(s).to_bits() as u32
        }
        _ => unreachable!("this test sweeps f32, f16 and bf16"),
    }
}

/// Element counts to test for `dtype`: every power of two of bytes from 4 B to `max`, and
/// an odd count next to each.
fn counts(dtype: DataType, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut bytes = 4;
    while bytes <= max {
        let c = bytes / dtype.size();
        v.push(c);
        v.push(c + if c > 8 { 5 } else { 1 });
        bytes *= 2;
    }
    v
}

/// Set (to anything), the all-reduce sweep prints each call before making it: run with a
/// `MSCCLPP_TEST_TIMEOUT_S` below the outer limit, the ranks are stopped and their lines
/// printed, the last one naming the call that did not return.
const TRACE: &str = "MSCCLPP_TEST_TRACE";

/// The largest all-reduce of the sweep: `MSCCLPP_TEST_MAX_BYTES` (a size as the perf tool
/// reads it: `65536`, `64K`, `16M`), else 1 GiB (f32; 64 MiB for the 16-bit types). Runs of
/// more ranks than GPUs share GPUs and want a smaller one. A value that is not a size stops
/// the test: until 2026-12-02 `16M` was silently read as "unset", and runs meant to stop at
/// 16 MiB swept to 1 GiB.
fn max_bytes() -> usize {
    match std::env::var("MSCCLPP_TEST_MAX_BYTES") {
        Ok(v) => match mscclpp::host::units::parse_size(&v) {
            Ok(b) if (4..=1 << 30).contains(&b) => b as usize,
            Ok(b) => panic!("MSCCLPP_TEST_MAX_BYTES={v:?}: {b} bytes is outside 4 B..=1 GiB"),
            Err(e) => panic!("MSCCLPP_TEST_MAX_BYTES: {e}"),
        },
        Err(_) => 1 << 30,
    }
}

fn sweep_all_reduce_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let mut seed = 0u64;
    let max = max_bytes();
    let trace = std::env::var_os(TRACE).is_some();
    let t0 = std::time::Instant::now();
    for (dtype, max) in [
        (DataType::F32, max),
        (DataType::F16, max.min(64 << 20)),
        (DataType::Bf16, max.min(64 << 20)),
    ] {
        for count in counts(dtype, max) {
            let bytes = count * dtype.size();
            let mut algos = vec![AllReduceAlgo::Auto, AllReduceAlgo::ReadReduce];
            if bytes <= 256 << 20 {
                // Auto picks all-pairs for two ranks; two-shot serves more.
                algos.push(AllReduceAlgo::TwoShot);
                algos.push(AllReduceAlgo::AllPairs);
            }
            if bytes <= 64 << 20 {
                algos.push(AllReduceAlgo::Proxy);
            }
            if bytes <= c.one_shot_max_bytes() {
                algos = vec![
                    AllReduceAlgo::OneShot,
                    AllReduceAlgo::TwoShot,
                    AllReduceAlgo::ReadReduce,
                    AllReduceAlgo::AllPairs,
                    AllReduceAlgo::Proxy,
                ];
            }
            for algo in algos {
                for in_place in [false, true] {
                    if bytes > 256 << 20 && in_place {
                        continue; // the largest sizes once, to keep the run short
                    }
                    seed += 1;
                    let t_prep = std::time::Instant::now();
                    let mine = par_bytes(dtype, count, |i| input(dtype, seed, r, i));
                    let want = par_bytes(dtype, count, |i| {
                        (1..n).fold(input(dtype, seed, 0, i), |acc, q| {
                            add(dtype, acc, input(dtype, seed, q, i))
                        })
                    });
                    let send: CudaSlice<u8> = stream.clone_htod(&mine).unwrap();
                    let recv: CudaSlice<u8> = if in_place {
                        send.clone()
                    } else {
                        stream.alloc_zeros(bytes).unwrap()
                    };
                    let (sp, rp) = (dptr(&send, &stream), dptr(&recv, &stream));
                    let rp = if in_place { sp } else { rp };
                    if trace {
                        // The last of these lines says which call a stopped run was in.
                        println!(
                            "rank {r}: {:.1} s: all_reduce {dtype} count {count} {algo:?} \
                             in_place {in_place}",
                            t0.elapsed().as_secs_f64()
                        );
                    }
                    let t_call = std::time::Instant::now();
                    // SAFETY: both buffers live until the synchronize below.
                    unsafe {
                        c.all_reduce_using(
                            algo,
                            &RawBuffer::device(sp, count, dtype),
                            &mut RawBuffer::device(rp, count, dtype),
                            ReduceOp::Sum,
                            &stream,
                        )
                    }
                    .unwrap();
                    stream.synchronize().unwrap();
                    let t_check = std::time::Instant::now();
                    let got = stream
                        .clone_dtoh(if in_place { &send } else { &recv })
                        .unwrap();
                    let (bad, first) = mismatches(&got, &want, dtype.size());
                    if trace && t_prep.elapsed() > Duration::from_millis(500) {
                        // Where a slow call's time went (the sweep is long on one GPU).
                        println!(
                            "rank {r}:   inputs and upload {:.2} s, call {:.3} s, check {:.2} s",
                            (t_call - t_prep).as_secs_f64(),
                            (t_check - t_call).as_secs_f64(),
                            t_check.elapsed().as_secs_f64()
                        );
                    }
                    assert_eq!(
                        bad, 0,
                        "rank {r}: all_reduce {dtype} count {count} {algo:?} in_place {in_place}: \
                         {bad} wrong elements, first at {first:?}"
                    );
                }
            }
        }
        println!("rank {r}: all_reduce {dtype} up to {max} bytes matched");
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

fn sweep_all_gather_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    // Bytes per rank: powers of two from 2 B to 512 MiB, and odd sizes next to them.
    let mut sizes = Vec::new();
    let mut b = 2usize;
    while b <= 512 << 20 {
        sizes.push(b);
        sizes.push(b + 6);
        b *= 2;
    }
    for (k, bytes) in sizes.into_iter().enumerate() {
        let count = bytes / 2;
        let part = |q: usize| -> Vec<u8> {
            (0..bytes)
                .map(|i| splitmix(k as u64 ^ (q as u64) << 48 ^ i as u64) as u8)
                .collect()
        };
        let want: Vec<u8> = (0..n).flat_map(part).collect();
        let recv: CudaSlice<u8> = stream.alloc_zeros(n * bytes).unwrap();
        let rp = dptr(&recv, &stream);
        let in_place = k % 2 == 1;
        let send: CudaSlice<u8> = stream.clone_htod(&part(r)).unwrap();
        let sp = if in_place {
            // The own part of recv holds the input.
            let mut own = vec![0u8; n * bytes];
            own[r * bytes..(r + 1) * bytes].copy_from_slice(&part(r));
            let tmp: CudaSlice<u8> = stream.clone_htod(&own).unwrap();
            // SAFETY: device-to-device copy of n * bytes between live buffers.
            unsafe {
                mscclpp::host::cuda::memcpy_async(rp, dptr(&tmp, &stream), n * bytes, &stream)
            }
            .unwrap();
            stream.synchronize().unwrap();
            rp + (r * bytes) as u64
        } else {
            dptr(&send, &stream)
        };
        // Memory channels, and the proxy channels up to 64 MiB per rank.
        let algo = if k % 4 < 2 || bytes > 64 << 20 {
            AllGatherAlgo::Auto
        } else {
            AllGatherAlgo::Proxy
        };
        // SAFETY: buffers live until the synchronize below.
        unsafe {
            c.all_gather_using(
                algo,
                &RawBuffer::device(sp, count, DataType::F16),
                &mut RawBuffer::device(rp, count.saturating_mul(c.nranks()), DataType::F16),
                &stream,
            )
        }
        .unwrap();
        stream.synchronize().unwrap();
        let got = stream.clone_dtoh(&recv).unwrap();
        let (bad, first) = mismatches(&got, &want, 1);
        assert_eq!(
            bad, 0,
            "rank {r}: all_gather {bytes} bytes per rank (in place {in_place}, {algo:?}): {bad} \
             wrong bytes, first at {first:?}"
        );
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// Ten in-place all-reduces (raw API: cudarc's typed slices add event waits under
/// multi-stream event tracking, which capture refuses) captured into one CUDA graph, replayed three times: with equal
/// small-integer inputs every call doubles the sum, so the result proves that every replayed
/// call ran with fresh packet flags and semaphores.
fn graph_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    for count in [2usize, 131072, 3 << 20] {
        let base: Vec<f32> = (0..count).map(|i| ((i * 7 + r) % 5) as f32).collect();
        let mut buf: CudaSlice<f32> = stream.clone_htod(&base).unwrap();
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        let sum: Vec<f32> = stream.clone_dtoh(&buf).unwrap();
        // The address is taken before capture: cudarc may wait on events for it.
        let p = dptr(&buf, &stream);
        // buf lives until the synchronize after the replays.
        common::replay_in_place_sums(&c, &stream, p, count);
        stream.synchronize().unwrap();
        let got: Vec<f32> = stream.clone_dtoh(&buf).unwrap();
        let scale = (n as f32).powi(30);
        for (i, (g, s)) in got.iter().zip(&sum).enumerate() {
            assert_eq!(
                *g,
                s * scale,
                "rank {r}: count {count} element {i} after 30 replayed calls"
            );
        }
        println!("rank {r}: graph replay of count {count} matched");
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// The typed API refuses bad arguments with the reason, and works out of place.
fn typed_api_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let send: CudaSlice<f32> = stream.clone_htod(&vec![r as f32 + 1.0; 1000]).unwrap();
    let mut recv: CudaSlice<f32> = stream.alloc_zeros(999).unwrap();
    let e = c
        .all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)
        .unwrap_err();
    assert!(
        e.to_string().contains("send has 1000 elements, recv 999"),
        "{e}"
    );
    let mut recv: CudaSlice<f32> = stream.alloc_zeros(1000).unwrap();
    c.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)
        .unwrap();
    let want = (1..=n).sum::<usize>() as f32;
    assert!(stream.clone_dtoh(&recv).unwrap().iter().all(|&v| v == want));
    // Misaligned, host and out-of-range pointers are refused before any launch.
    let p = dptr(&send, &stream);
    // SAFETY: the calls are refused before any access.
    unsafe {
        let e = c
            .all_reduce(
                &RawBuffer::device(p + 2, 4, DataType::F32),
                &mut RawBuffer::device(p, 4, DataType::F32),
                ReduceOp::Sum,
                &stream,
            )
            .unwrap_err();
        assert!(e.to_string().contains("not aligned"), "{e}");
        let host = [0f32; 16];
        let e = c
            .all_reduce(
                &RawBuffer::device(host.as_ptr() as u64, 4, DataType::F32),
                &mut RawBuffer::device(p, 4, DataType::F32),
                ReduceOp::Sum,
                &stream,
            )
            .unwrap_err();
        assert!(e.to_string().contains("not device memory"), "{e}");
        let e = c
            .all_reduce(
                &RawBuffer::device(p, 1 << 20, DataType::F32),
                &mut RawBuffer::device(p, 1 << 20, DataType::F32),
                ReduceOp::Sum,
                &stream,
            )
            .unwrap_err();
        assert!(e.to_string().contains("beyond its allocation"), "{e}");
    }
    // A buffer of two allocations mapped back to back (the CUDA virtual memory API, as
    // PyTorch's expandable segments): all-reduces across the seam (one-shot sizes, and every
    // algorithm at 2 MiB) are taken and correct; one past the second allocation is refused.
    // Before, `cuMemGetAddressRange` saw the first allocation only and every call across the
    // seam was refused ("go beyond its allocation").
    let seg = Segments::new();
    let large = [
        AllReduceAlgo::Auto,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::ReadReduce,
        AllReduceAlgo::AllPairs,
        AllReduceAlgo::Proxy,
    ];
    let cases = [AllReduceAlgo::Auto, AllReduceAlgo::OneShot]
        .map(|a| (2048usize, a))
        .into_iter()
        .chain(large.map(|a| (seg.each / 4, a)));
    for (k, (count, algo)) in cases.enumerate() {
        let at = seg.va + seg.each as u64 - 2048;
        // Values of this case alone, so that one left by an earlier case is caught.
        let val = |q: usize, i: usize| (q * 7 + (i + k) % 13) as f32;
        let mine: Vec<f32> = (0..count).map(|i| val(r, i)).collect();
        // SAFETY: `at` holds `count` f32 inside the two mapped allocations.
        unsafe { cudarc::driver::result::memcpy_htod_sync(at, &mine) }.unwrap();
        // From pageable memory `cuMemcpyHtoD` may return before its DMA lands, and the
        // test's stream (non-blocking) does not order after it: session 32's first run of
        // this test read a rank's own input as zeros deep in the second segment that way.
        stream.context().synchronize().unwrap();
        // SAFETY: as above; in place.
        unsafe {
            c.all_reduce_using(
                algo,
                &RawBuffer::device(at, count, DataType::F32),
                &mut RawBuffer::device(at, count, DataType::F32),
                ReduceOp::Sum,
                &stream,
            )
        }
        .unwrap();
        stream.synchronize().unwrap();
        let mut got = vec![0f32; count];
        // SAFETY: as above.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut got, at) }.unwrap();
        for (i, g) in got.iter().enumerate() {
            let want: f32 = (0..n).map(|q| val(q, i)).sum();
            assert_eq!(
                *g, want,
                "rank {r}: {count} f32 across the seam with {algo:?}, element {i}"
            );
        }
    }
    // SAFETY: refused before any access.
    let e = unsafe {
        c.all_reduce(
            &RawBuffer::device(seg.va + 8, seg.each / 2, DataType::F32),
            &mut RawBuffer::device(seg.va + 8, seg.each / 2, DataType::F32),
            ReduceOp::Sum,
            &stream,
        )
    }
    .unwrap_err();
    assert!(e.to_string().contains("mapped back to back"), "{e}");
    drop(seg);
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// Two physical allocations of `each` bytes (the allocation granularity) mapped back to
/// back at the start of a reserved range of three, the third left unmapped (so nothing
/// follows the second), readable and writable on the current context's device (plain
/// device memory, as `cuMemAlloc`'s, through the virtual memory API).
struct Segments {
    va: u64,
    each: usize,
    handles: [u64; 2],
}

impl Segments {
    fn new() -> Segments {
        use cudarc::driver::sys;
        let ok = |what: &str, r: sys::CUresult| {
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
        };
        // SAFETY: driver calls with live out-parameters, on the current context's device;
        // the range is reserved before anything is mapped into it.
        unsafe {
            let mut dev = 0;
            ok("cuCtxGetDevice", sys::cuCtxGetDevice(&mut dev));
            let mut prop: sys::CUmemAllocationProp = std::mem::zeroed();
            prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = dev;
            let mut each = 0usize;
            ok(
                "cuMemGetAllocationGranularity",
                sys::cuMemGetAllocationGranularity(
                    &mut each,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                ),
            );
            let mut va = 0;
            ok(
                "cuMemAddressReserve",
                sys::cuMemAddressReserve(&mut va, 3 * each, 0, 0, 0),
            );
            let mut handles = [0u64; 2];
            for (i, h) in handles.iter_mut().enumerate() {
                ok("cuMemCreate", sys::cuMemCreate(h, each, &prop, 0));
                ok(
                    "cuMemMap",
                    sys::cuMemMap(va + (i * each) as u64, each, 0, *h, 0),
                );
            }
            let access = sys::CUmemAccessDesc {
                location: prop.location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            ok(
                "cuMemSetAccess",
                sys::cuMemSetAccess(va, 2 * each, &access, 1),
            );
            Segments { va, each, handles }
        }
    }
}

impl Drop for Segments {
    fn drop(&mut self) {
        use cudarc::driver::sys;
        // SAFETY: the range and handles made in `new`, no longer used (streams synchronized).
        unsafe {
            sys::cuMemUnmap(self.va, 2 * self.each);
            for h in self.handles {
                sys::cuMemRelease(h);
            }
            sys::cuMemAddressFree(self.va, 3 * self.each);
        }
    }
}

/// Ranks disagree on the count (one-shot and two-shot sizes, and across the two), on the
/// data type and on the algorithm: every rank's `synchronize` names the mismatch, and the
/// next, matching call of each shape reduces correctly.
fn mismatch_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let max = 1usize << 20;
    let send: CudaSlice<f32> = stream.clone_htod(&vec![1.0f32; max]).unwrap();
    let recv: CudaSlice<f32> = stream.alloc_zeros(max).unwrap();
    let (sp, rp) = (dptr(&send, &stream), dptr(&recv, &stream));
    let cases: [(
        usize,
        usize,
        DataType,
        DataType,
        AllReduceAlgo,
        AllReduceAlgo,
    ); 6] = [
        // No elements on rank 0: checked like any call (then every rank with none).
        (
            0,
            1000,
            DataType::F32,
            DataType::F32,
            AllReduceAlgo::Auto,
            AllReduceAlgo::Auto,
        ),
        (
            1000,
            2000,
            DataType::F32,
            DataType::F32,
            AllReduceAlgo::Auto,
            AllReduceAlgo::Auto,
        ),
        (
            300_000,
            400_000,
            DataType::F32,
            DataType::F32,
            AllReduceAlgo::TwoShot,
            AllReduceAlgo::TwoShot,
        ),
        (
            1000,
            800_000,
            DataType::F32,
            DataType::F32,
            AllReduceAlgo::Auto,
            AllReduceAlgo::Auto,
        ),
        (
            4096,
            4096,
            DataType::F32,
            DataType::Bf16,
            AllReduceAlgo::Auto,
            AllReduceAlgo::Auto,
        ),
        (
            4096,
            4096,
            DataType::F32,
            DataType::F32,
            AllReduceAlgo::OneShot,
            AllReduceAlgo::TwoShot,
        ),
    ];
    for (k, &(c0, c1, d0, d1, a0, a1)) in cases.iter().enumerate() {
        let (count, dtype, algo) = if r == 0 { (c0, d0, a0) } else { (c1, d1, a1) };
        // SAFETY: both buffers hold `max` f32 (>= every count above) until the synchronize.
        unsafe {
            c.all_reduce_using(
                algo,
                &RawBuffer::device(sp, count, dtype),
                &mut RawBuffer::device(rp, count, dtype),
                ReduceOp::Sum,
                &stream,
            )
        }
        .unwrap();
        let e = c
            .synchronize(&stream)
            .expect_err("a mismatched call must fail");
        assert!(
            e.to_string().contains("called all_reduce"),
            "rank {r} case {k}: {e}"
        );
        // The same shape again, matching: exact sums.
        let (count, dtype, algo) = (c0, DataType::F32, a0);
        // SAFETY: as above.
        unsafe {
            c.all_reduce_using(
                algo,
                &RawBuffer::device(sp, count, dtype),
                &mut RawBuffer::device(rp, count, dtype),
                ReduceOp::Sum,
                &stream,
            )
        }
        .unwrap();
        c.synchronize(&stream).unwrap();
        let got: Vec<f32> = stream.clone_dtoh(&recv).unwrap();
        assert!(
            got[..count].iter().all(|&v| v == n as f32),
            "rank {r} case {k}: the matching call after a mismatch is wrong"
        );
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// A rank that made fewer calls and left (rank 1 drops its collectives after two calls; its
/// goodbye names them): the others' third call, of `algo` with `count` f32, fails within a
/// fraction of the device timeout (60 s here), naming rank 1 and its two calls, and every
/// later call is refused at launch with the same error. Before it, the two calls that every
/// rank made give exact sums.
fn departed(algo: AllReduceAlgo, count: usize) {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let send: CudaSlice<f32> = stream.clone_htod(&vec![1.0f32; count]).unwrap();
    let recv: CudaSlice<f32> = stream.alloc_zeros(count).unwrap();
    let (sp, rp) = (dptr(&send, &stream), dptr(&recv, &stream));
    for call in 0..2 {
        // SAFETY: both buffers hold `count` f32 until the synchronize.
        unsafe {
            c.all_reduce_using(
                algo,
                &RawBuffer::device(sp, count, DataType::F32),
                &mut RawBuffer::device(rp, count, DataType::F32),
                ReduceOp::Sum,
                &stream,
            )
        }
        .unwrap();
        c.synchronize(&stream).unwrap();
        let got: Vec<f32> = stream.clone_dtoh(&recv).unwrap();
        assert!(got.iter().all(|&v| v == n as f32), "rank {r} call {call}");
    }
    if r == 1 {
        drop(c);
        println!("rank {r}: left after 2 calls");
        println!("rank {r}: ok");
        return;
    }
    std::thread::sleep(Duration::from_millis(100));
    let t0 = std::time::Instant::now();
    // SAFETY: as above.
    unsafe {
        c.all_reduce_using(
            algo,
            &RawBuffer::device(sp, count, DataType::F32),
            &mut RawBuffer::device(rp, count, DataType::F32),
            ReduceOp::Sum,
            &stream,
        )
    }
    .unwrap();
    let e = c
        .synchronize(&stream)
        .expect_err("a call that rank 1 never makes must fail")
        .to_string();
    let took = t0.elapsed();
    println!("rank {r}: {algo:?} failed after {took:?}: {e}");
    assert!(took < Duration::from_secs(5), "rank {r}: {took:?}: {e}");
    assert!(
        e.contains("collective #3") && e.contains("rank 1 left") && e.contains("after 2"),
        "rank {r}: {e}"
    );
    // SAFETY: as above.
    let again = unsafe {
        c.all_reduce_using(
            algo,
            &RawBuffer::device(sp, count, DataType::F32),
            &mut RawBuffer::device(rp, count, DataType::F32),
            ReduceOp::Sum,
            &stream,
        )
    }
    .expect_err("refused at launch");
    assert!(
        again.to_string().contains("rank 1 left"),
        "rank {r}: {again}"
    );
    println!("rank {r}: ok");
}

/// Ranks that stall (alive, making no call) with many calls queued behind the first one
/// that waits for them: rank 0 queues 64 one-shot all-reduces with a 2 s device timeout; the
/// first gives up at the timeout and every call behind it at its first look at the fault
/// area, so the synchronize fails within a few seconds, naming a stalled rank and the first
/// call (before 0ba3efc each queued call waited a timeout of its own: 128 s). The other
/// ranks wait in a bootstrap barrier meanwhile, so nothing tells rank 0 they left or died.
fn stalled_rank() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let bs = Launch::from_env().unwrap().blocking_bootstrap().unwrap();
    let (c, stream) = common::collectives_timed(bs, CollConfig::default(), TIMEOUT);
    let r = c.rank();
    if r == 0 {
        let count = 1000;
        let send: CudaSlice<f32> = stream.clone_htod(&vec![1.0f32; count]).unwrap();
        let recv: CudaSlice<f32> = stream.alloc_zeros(count).unwrap();
        let (sp, rp) = (dptr(&send, &stream), dptr(&recv, &stream));
        let t0 = std::time::Instant::now();
        for _ in 0..64 {
            let algo = AllReduceAlgo::OneShot;
            // SAFETY: both buffers hold `count` f32 until the synchronize.
            unsafe {
                c.all_reduce_using(
                    algo,
                    &RawBuffer::device(sp, count, DataType::F32),
                    &mut RawBuffer::device(rp, count, DataType::F32),
                    ReduceOp::Sum,
                    &stream,
                )
            }
            .unwrap();
        }
        let e = c
            .synchronize(&stream)
            .expect_err("the other ranks never call")
            .to_string();
        let took = t0.elapsed();
        println!("rank {r}: 64 queued calls failed after {took:?}: {e}");
        assert!(
            took < 2 * TIMEOUT + Duration::from_secs(4),
            "rank {r}: the queued calls took {took:?} to fail (a timeout each?): {e}"
        );
        let names_one =
            (1..c.nranks()).any(|p| e.contains(&format!("waited {TIMEOUT:?} for rank {p} ")));
        assert!(names_one && e.contains("collective #1 "), "rank {r}: {e}");
    }
    // The other ranks wait here, alive, until rank 0 is done.
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

fn departed_ll_rank() {
    departed(AllReduceAlgo::OneShot, 1000);
}

fn departed_semaphores_rank() {
    departed(AllReduceAlgo::TwoShot, 1 << 18);
}

/// Send/recv with a rank that left (rank 1 drops its collectives with its work done): the
/// small send it made before it left arrives, though rank 0 receives it only after the
/// goodbye; rank 0's next operation with it (`large`: a pipelined send of 1 MiB, which needs
/// rank 1's acknowledgements; else a small LL receive) fails within a fraction of the device
/// timeout (a third of the test's timeout, 5-60 s) naming rank 1, and every later call is
/// refused at launch.
fn departed_p2p(large: bool) {
    let (c, stream) = setup();
    let r = c.rank();
    let small: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let mut buf: CudaSlice<f32> = stream.alloc_zeros(1 << 18).unwrap();
    if r == 1 {
        let s: CudaSlice<f32> = stream.clone_htod(&small).unwrap();
        c.send(&s, 0, &stream).unwrap();
        c.synchronize(&stream).unwrap();
        drop(c);
        println!("rank {r}: left after one send");
        println!("rank {r}: ok");
        return;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !c.communicator().bootstrap().as_async().has_left(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "rank 1's goodbye did not arrive within 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut got: CudaSlice<f32> = stream.alloc_zeros(100).unwrap();
    c.recv(&mut got, 1, &stream).unwrap();
    c.synchronize(&stream).unwrap();
    assert_eq!(
        stream.clone_dtoh(&got).unwrap(),
        small,
        "sent before it left"
    );
    let t0 = std::time::Instant::now();
    if large {
        c.send(&buf, 1, &stream).unwrap();
    } else {
        c.recv(&mut got, 1, &stream).unwrap();
    }
    let e = c
        .synchronize(&stream)
        .expect_err("an operation with a rank that left must fail")
        .to_string();
    let took = t0.elapsed();
    println!("rank {r}: large {large}: failed after {took:?}: {e}");
    assert!(took < Duration::from_secs(5), "rank {r}: {took:?}: {e}");
    assert!(
        e.contains("rank 1 left") && e.contains("without the matching send"),
        "rank {r}: {e}"
    );
    let again = c.recv(&mut buf, 1, &stream).expect_err("refused at launch");
    assert!(
        again.to_string().contains("rank 1 left"),
        "rank {r}: {again}"
    );
    println!("rank {r}: ok");
}

fn departed_p2p_recv_rank() {
    departed_p2p(false);
}

fn departed_p2p_send_rank() {
    departed_p2p(true);
}

macro_rules! two_rank_test {
    ($name:ident, $rank:ident) => {
        #[test]
        fn $name() {
            if std::env::var(ROLE).is_ok() {
                $rank();
            } else {
                run_ranks(stringify!($name));
            }
        }
    };
}

two_rank_test!(
    all_reduce_matches_the_cpu_reference_from_4_bytes_to_1_gib,
    sweep_all_reduce_rank
);
two_rank_test!(
    all_gather_places_every_rank_from_2_bytes_to_512_mib,
    sweep_all_gather_rank
);
two_rank_test!(all_reduce_replays_under_a_cuda_graph, graph_rank);
two_rank_test!(typed_api_checks_arguments_and_reduces, typed_api_rank);
two_rank_test!(mismatched_calls_fail_on_every_rank_then_work, mismatch_rank);
two_rank_test!(
    calls_queued_behind_a_stalled_rank_fail_after_one_timeout,
    stalled_rank
);
two_rank_test!(
    a_call_a_departed_rank_never_made_fails_at_once_over_packets,
    departed_ll_rank
);
two_rank_test!(
    a_call_a_departed_rank_never_made_fails_at_once_over_semaphores,
    departed_semaphores_rank
);
two_rank_test!(
    a_receive_from_a_departed_rank_fails_at_once,
    departed_p2p_recv_rank
);
two_rank_test!(
    a_large_send_to_a_departed_rank_fails_at_once,
    departed_p2p_send_rank
);

/// The threaded input builder gives the same bytes as the one-thread one, for counts that
/// split unevenly across threads and chunks, 2- and 4-byte types, and an empty buffer; and the
/// whole-buffer shortcut of `mismatches` still counts a difference.
#[test]
fn par_bytes_matches_to_bytes_and_mismatches_counts() {
    use common::to_bytes;
    for (dtype, count) in [
        (DataType::F32, 0),
        (DataType::F32, 1),
        (DataType::F16, (1 << 16) + 3),
        (DataType::Bf16, 9 * (1 << 16) + 7),
        (DataType::F32, 3 * (1 << 16) - 1),
    ] {
        let one = to_bytes(dtype, (0..count).map(|i| input(dtype, 5, 1, i)));
        let par = par_bytes(dtype, count, |i| input(dtype, 5, 1, i));
        assert_eq!(par.len(), count * dtype.size(), "{dtype} count {count}");
        assert!(
            par == one,
            "{dtype} count {count}: par_bytes differs from to_bytes"
        );
        assert_eq!(mismatches(&par, &one, dtype.size()), (0, vec![]));
        if count > 2 {
            let mut bad = par.clone();
            bad[dtype.size() * (count - 1)] ^= 1;
            bad[dtype.size() + 1] ^= 0x80;
            assert_eq!(
                mismatches(&bad, &one, dtype.size()),
                (2, vec![1, count - 1])
            );
        }
    }
}
