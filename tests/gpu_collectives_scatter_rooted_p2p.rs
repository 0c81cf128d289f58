//! Reduce-scatter, reduce, broadcast and all-to-all on GPUs: two processes
//! (`MSCCLPP_TEST_GPUS=N` for N, 2..=8), one GPU each (all on GPU 0 when the machine has
//! one). Random data of every power-of-two size from 4 B to 64 MiB and odd counts next to
//! them, f32/f16/bf16, in place and out of place, every root, checked bit for bit against a
//! CPU reference that adds in rank order; every reducing type (f32, f16, bf16, f64, i8, u8,
//! i32, u32, i64, u64) and operation (sum, prod, min, max, avg) on every reducing path,
//! all-reduce's algorithms included, and the fp8 types on the byte movers; sends and receives (a ring in one group, one-way
//! sends alone) of the same sizes; one call of each captured into a CUDA graph and replayed
//! over fresh inputs; the typed API's argument checks; and the pipelined broadcast and
//! reduce (`RootedAlgo::Pipelined`) over the same sizes, types and operations and under a
//! graph (`pipelined_broadcast_and_reduce_match_the_cpu_reference_to_64_mib`); the staged
//! reductions (`staged_*`): fp8 e4m3 and e5m2 all-reduce, reduce-scatter and reduce with
//! sum, max and avg (f32 in rank order, rounded once; sizes beyond the staging buffer, so in
//! pieces) and pre-multiplied f32 sums by a host scalar and by a device scalar, the latter
//! replayed under a CUDA graph with the scalar changed between replays. Skips with a reason
//! without a GPU; fails instead under MSCCLPP_REQUIRE_GPU=1.

use mscclpp::host::collectives::RawBuffer;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{DevicePtr, sys};
use half::{bf16, f16};
use mscclpp::host::collectives::{
    AllReduceAlgo, CollConfig, Collectives, DataType, Fp8E4M3, Fp8E5M2, P2pOp, ReduceOp,
    RootedAlgo, STAGING_BYTES,
};
use mscclpp::host::communicator::CommError;
use mscclpp::host::cuda::{CudaSlice, CudaStream};
use mscclpp::host::testing::{gpu_or_skip, run_test_ranks};

mod common;

use common::{ROLE, dptr, mismatches, setup, setup_with, splitmix, test_ranks, to_bytes};

/// Element `i` of rank `rank`'s input of call `seed` as raw bits: floats random in
/// [-4, 4) held exactly by the type, integers over their whole range, fp8 any finite value
/// (a NaN's or an infinity's byte with its exponent's top bit cleared; the largest values
/// are there, so sums saturate).
fn input(dtype: DataType, seed: u64, rank: usize, i: usize) -> u64 {
    let h = splitmix(seed ^ (rank as u64) << 56 ^ i as u64);
    let v = (h >> 40) as f32 / (1u64 << 21) as f32 - 4.0;
    match dtype {
        DataType::F32 => v.to_bits() as u64,
        DataType::F16 => f16::from_f32(v).to_bits() as u64,
        DataType::Bf16 => bf16::from_f32(v).to_bits() as u64,
        DataType::F64 => ((h >> 11) as f64 / (1u64 << 50) as f64 - 4.0).to_bits(),
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => {
            let b = h as u8;
            u64::from(if fp8_value(dtype, b).is_finite() {
                b
            } else {
                b & !0x40
            })
        }
        _ => h & mask(dtype.size()),
    }
}

/// The value of fp8 bits of `dtype`, exactly (the library's conversion).
fn fp8_value(dtype: DataType, bits: u8) -> f32 {
    match dtype {
        DataType::Fp8E4M3 => Fp8E4M3(bits).to_f32(),
        DataType::Fp8E5M2 => Fp8E5M2(bits).to_f32(),
        _ => unreachable!("fp8_value of an fp8 type"),
    }
}

/// `x` rounded once to fp8 of `dtype` (the library's conversion: nearest even, saturating
/// to the largest finite value).
fn fp8_round(dtype: DataType, x: f32) -> u8 {
    match dtype {
        DataType::Fp8E4M3 => Fp8E4M3::from_f32(x).0,
        DataType::Fp8E5M2 => Fp8E5M2::from_f32(x).0,
        _ => unreachable!("fp8_round to an fp8 type"),
    }
}

/// The library's fp8 reduction of the ranks' elements `bits` (in rank order): each widened
/// to f32, `op` applied in f32 in rank order (average: the sum divided once), the result
/// rounded once to fp8.
fn fp8_reduce(dtype: DataType, op: ReduceOp, bits: &[u8]) -> u8 {
    let wide = |b: u8| fp8_value(dtype, b).to_bits() as u64;
    let Some((&first, rest)) = bits.split_first() else {
        unreachable!("a reduction of at least one rank")
    };
    let acc = rest.iter().fold(wide(first), |acc, &b| {
        apply(DataType::F32, op, acc, wide(b))
    });
    let acc = if op == ReduceOp::Avg {
        divide(DataType::F32, acc, bits.len())
    } else {
        acc
    };
    fp8_round(dtype, f32::from_bits(acc as u32))
}

/// The library's pre-multiplied f32 sum of the ranks' elements `values` (in rank order),
/// rank q's times `scalar(q)`: each product rounded to f32, then summed in rank order.
fn pre_mul_sum(values: &[f32], scalar: impl Fn(usize) -> f32) -> f32 {
    values
        .iter()
        .enumerate()
        .map(|(q, &v)| v * scalar(q))
        .reduce(|acc, x| acc + x)
        .expect("a sum of at least one rank")
}

fn mask(size: usize) -> u64 {
    if size == 8 {
        u64::MAX
    } else {
        (1 << (size * 8)) - 1
    }
}

/// `op` of two elements' bits (average: the sum), as the library defines it: IEEE
/// arithmetic rounded to the type, wrapping integers, float min/max by `total_cmp`, ties
/// keeping `a`.
fn apply(dtype: DataType, op: ReduceOp, a: u64, b: u64) -> u64 {
    use std::cmp::Ordering::{Greater, Less};
    macro_rules! float {
        ($x:expr, $y:expr, $to:expr, $mul:expr, $add:expr) => {{
            let (x, y) = ($x, $y);
            match op {
                ReduceOp::Prod => $to($mul(x, y)),
                ReduceOp::Min => {
                    if y.total_cmp(&x) == Less {
                        b
                    } else {
                        a
                    }
                }
                ReduceOp::Max => {
                    if y.total_cmp(&x) == Greater {
                        b
                    } else {
                        a
                    }
                }
                _ => $to($add(x, y)),
            }
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let (x, y) = (a as $t, b as $t);
            (match op {
                ReduceOp::Prod => x.wrapping_mul(y),
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
                _ => x.wrapping_add(y),
            }) as u64
                & mask(dtype.size())
        }};
    }
    match dtype {
        DataType::F32 => float!(
            f32::from_bits(a as u32),
            f32::from_bits(b as u32),
            |v: f32| v.to_bits() as u64,
            |x: f32, y: f32| x * y,
            |x: f32, y: f32| x + y
        ),
        DataType::F64 => float!(
            f64::from_bits(a),
            f64::from_bits(b),
            |v: f64| v.to_bits(),
            |x: f64, y: f64| x * y,
            |x: f64, y: f64| x + y
        ),
        DataType::F16 => float!(
            f16::from_bits(a as u16),
            f16::from_bits(b as u16),
            |v: f16| v.to_bits() as u64,
            |x: f16, y: f16| f16::from_f32(x.to_f32() * y.to_f32()),
            |x: f16, y: f16| f16::from_f32(x.to_f32() + y.to_f32())
        ),
        DataType::Bf16 => float!(
            bf16::from_bits(a as u16),
            bf16::from_bits(b as u16),
            |v: bf16| v.to_bits() as u64,
            |x: bf16, y: bf16| bf16::from_f32(x.to_f32() * y.to_f32()),
            |x: bf16, y: bf16| bf16::from_f32(x.to_f32() + y.to_f32())
        ),
        DataType::I8 => int!(i8),
        DataType::U8 => int!(u8),
        DataType::I32 => int!(i32),
        DataType::U32 => int!(u32),
        DataType::I64 => int!(i64),
        DataType::U64 => int!(u64),
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => unreachable!("fp8 is not reduced"),
    }
}

/// Average's division of a sum by `n`.
fn divide(dtype: DataType, a: u64, n: usize) -> u64 {
    let m = mask(dtype.size());
    match dtype {
        DataType::F32 => (f32::from_bits(a as u32) / n as f32).to_bits() as u64,
        DataType::F64 => (f64::from_bits(a) / n as f64).to_bits(),
        DataType::F16 => {
            f16::from_f32(f16::from_bits(a as u16).to_f32() / n as f32).to_bits() as u64
        }
        DataType::Bf16 => {
            bf16::from_f32(bf16::from_bits(a as u16).to_f32() / n as f32).to_bits() as u64
        }
        DataType::I8 => (a as i8 / n as i8) as u64 & m,
        DataType::I32 => (a as i32 / n as i32) as u64 & m,
        DataType::I64 => (a as i64 / n as i64) as u64,
        _ => a / n as u64,
    }
}

/// The reference: `op` over ranks `0..n` of element `i` of call `seed`, in rank order (fp8:
/// [`fp8_reduce`]).
fn reduce(dtype: DataType, op: ReduceOp, seed: u64, n: usize, i: usize) -> u64 {
    if matches!(dtype, DataType::Fp8E4M3 | DataType::Fp8E5M2) {
        let mut bits = [0u8; 8];
        for (q, b) in bits.iter_mut().enumerate().take(n) {
            *b = input(dtype, seed, q, i) as u8;
        }
        return u64::from(fp8_reduce(dtype, op, &bits[..n]));
    }
    let acc = (1..n).fold(input(dtype, seed, 0, i), |acc, q| {
        apply(dtype, op, acc, input(dtype, seed, q, i))
    });
    if op == ReduceOp::Avg {
        divide(dtype, acc, n)
    } else {
        acc
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    AllReduce(AllReduceAlgo),
    ReduceScatter,
    Reduce,
    Broadcast,
    AllToAll,
}

/// One call's buffers and expected output on rank `r` of `n`: `(send contents, recv
/// length, recv byte offset in send when in place, expected recv)`.
#[allow(clippy::too_many_arguments)]
fn data(
    op: Op,
    dtype: DataType,
    red: ReduceOp,
    seed: u64,
    n: usize,
    r: usize,
    count: usize,
    root: usize,
    in_place: bool,
) -> (Vec<u8>, usize, usize, Vec<u8>) {
    let reduced = |i: usize| reduce(dtype, red, seed, n, i);
    data_against(op, dtype, seed, n, r, count, root, in_place, &reduced)
}

/// [`data`] with the reduced element `i` of the ranks' inputs given by `reduced`.
#[allow(clippy::too_many_arguments)]
fn data_against(
    op: Op,
    dtype: DataType,
    seed: u64,
    n: usize,
    r: usize,
    count: usize,
    root: usize,
    in_place: bool,
    reduced: &dyn Fn(usize) -> u64,
) -> (Vec<u8>, usize, usize, Vec<u8>) {
    let es = dtype.size();
    let words = |q: usize, len: usize| (0..len).map(move |i| input(dtype, seed, q, i));
    match op {
        Op::AllReduce(_) => (
            to_bytes(dtype, words(r, count)),
            count * es,
            0,
            to_bytes(dtype, (0..count).map(reduced)),
        ),
        Op::ReduceScatter => (
            to_bytes(dtype, words(r, n * count)),
            count * es,
            r * count * es,
            to_bytes(dtype, (0..count).map(|i| reduced(r * count + i))),
        ),
        Op::Reduce => {
            let send = to_bytes(dtype, words(r, count));
            let want = if r == root {
                to_bytes(dtype, (0..count).map(reduced))
            } else if in_place {
                send.clone()
            } else {
                vec![0; count * es]
            };
            (send, count * es, 0, want)
        }
        Op::Broadcast => (
            to_bytes(dtype, words(r, count)),
            count * es,
            0,
            to_bytes(dtype, words(root, count)),
        ),
        Op::AllToAll => (
            to_bytes(dtype, words(r, n * count)),
            n * count * es,
            0,
            to_bytes(
                dtype,
                (0..n * count).map(|i| input(dtype, seed, i / count, r * count + i % count)),
            ),
        ),
    }
}

/// Issues one raw call on `stream`.
///
/// # Safety
/// The buffers live until the stream is synchronised.
#[allow(clippy::too_many_arguments)]
unsafe fn issue(
    c: &Collectives,
    op: Op,
    dtype: DataType,
    red: ReduceOp,
    sp: u64,
    rp: u64,
    count: usize,
    root: usize,
    stream: &CudaStream,
) {
    // SAFETY: caller contract.
    unsafe {
        match op {
            Op::AllReduce(algo) => c.all_reduce_using(
                algo,
                &RawBuffer::device(sp, count, dtype),
                &mut RawBuffer::device(rp, count, dtype),
                red,
                stream,
            ),
            Op::ReduceScatter => c.reduce_scatter(
                &RawBuffer::device(sp, count.saturating_mul(c.nranks()), dtype),
                &mut RawBuffer::device(rp, count, dtype),
                red,
                stream,
            ),
            Op::Reduce => c.reduce(
                &RawBuffer::device(sp, count, dtype),
                &mut RawBuffer::device(rp, count, dtype),
                red,
                root,
                stream,
            ),
            Op::Broadcast => c.broadcast(
                &RawBuffer::device(sp, count, dtype),
                &mut RawBuffer::device(rp, count, dtype),
                root,
                stream,
            ),
            Op::AllToAll => c.all_to_all(
                &RawBuffer::device(sp, count.saturating_mul(c.nranks()), dtype),
                &mut RawBuffer::device(rp, count.saturating_mul(c.nranks()), dtype),
                stream,
            ),
        }
    }
    .unwrap_or_else(|e| panic!("{op:?} {dtype} {red:?} count {count}: {e}"));
}

/// Element counts for `dtype` and `op` whose message (the input of one rank for
/// reduce-scatter and all-to-all, else the buffer) is every power of two of bytes from 4 B
/// to 64 MiB, and an odd count next to each.
fn counts(op: Op, dtype: DataType, n: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut bytes = 4usize;
    while bytes <= 64 << 20 {
        let per = match op {
            Op::ReduceScatter | Op::AllToAll => n,
            _ => 1,
        };
        let c = (bytes / dtype.size() / per).max(1);
        v.push(c);
        v.push(c + if c > 8 { 5 } else { 1 });
        bytes *= 2;
    }
    v
}

/// Runs one call on fresh buffers and checks it bit for bit.
#[allow(clippy::too_many_arguments)]
fn check_call(
    c: &Collectives,
    stream: &Arc<CudaStream>,
    op: Op,
    dtype: DataType,
    red: ReduceOp,
    seed: u64,
    count: usize,
    root: usize,
    in_place: bool,
) {
    let n = c.nranks();
    let reduced = |i: usize| reduce(dtype, red, seed, n, i);
    check_call_against(
        c, stream, op, dtype, red, seed, count, root, in_place, &reduced,
    );
}

/// [`check_call`] with the reduced element `i` of the ranks' inputs given by `reduced`.
#[allow(clippy::too_many_arguments)]
fn check_call_against(
    c: &Collectives,
    stream: &Arc<CudaStream>,
    op: Op,
    dtype: DataType,
    red: ReduceOp,
    seed: u64,
    count: usize,
    root: usize,
    in_place: bool,
    reduced: &dyn Fn(usize) -> u64,
) {
    let (n, r) = (c.nranks(), c.rank());
    let (send, recv_len, off, want) =
        data_against(op, dtype, seed, n, r, count, root, in_place, reduced);
    let sbuf: CudaSlice<u8> = stream.clone_htod(&send).unwrap();
    let rbuf: CudaSlice<u8> = stream.alloc_zeros(recv_len).unwrap();
    let sp = dptr(&sbuf, stream);
    let rp = if in_place {
        sp + off as u64
    } else {
        dptr(&rbuf, stream)
    };
    // SAFETY: both buffers live until the synchronize below.
    unsafe { issue(c, op, dtype, red, sp, rp, count, root, stream) };
    stream.synchronize().unwrap();
    let got = if in_place {
        stream.clone_dtoh(&sbuf).unwrap()[off..off + recv_len].to_vec()
    } else {
        stream.clone_dtoh(&rbuf).unwrap()
    };
    let (bad, first) = mismatches(&got, &want, dtype.size());
    assert_eq!(
        bad, 0,
        "rank {r}: {op:?} {dtype} {red:?} count {count} root {root} in_place {in_place}: \
         {bad} wrong elements, first at {first:?}"
    );
}

fn sweep_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let mut seed = 0u64;
    for op in [Op::ReduceScatter, Op::Reduce, Op::Broadcast, Op::AllToAll] {
        for dtype in [DataType::F32, DataType::F16, DataType::Bf16] {
            if matches!(op, Op::Broadcast | Op::AllToAll) && dtype == DataType::F32 {
                continue; // byte movers: 2-byte elements give the odd sizes
            }
            for (k, count) in counts(op, dtype, n).into_iter().enumerate() {
                seed += 1;
                let red = ReduceOp::Sum;
                check_call(&c, &stream, op, dtype, red, seed, count, k % n, k % 2 == 1);
            }
            println!("rank {r}: {op:?} {dtype} up to 64 MiB matched");
        }
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// Every reducing type and operation on every reducing path (all-reduce's algorithms,
/// reduce-scatter, reduce), at an LL size and at a size that takes many scratch rounds; the
/// byte movers on the 1-byte types.
fn types_and_ops_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let mut seed = 1 << 20;
    let algos = [
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::ReadReduce,
        AllReduceAlgo::AllPairs,
        AllReduceAlgo::Proxy,
    ];
    for dtype in DataType::ALL {
        if matches!(dtype, DataType::Fp8E4M3 | DataType::Fp8E5M2) {
            for op in [Op::Broadcast, Op::AllToAll] {
                for count in [1usize, 4099, (3 << 20) + 1] {
                    seed += 1;
                    let red = ReduceOp::Sum;
                    check_call(&c, &stream, op, dtype, red, seed, count, n - 1, false);
                }
            }
            continue;
        }
        for red in ReduceOp::ALL {
            for count in [37usize, 1001, ((1 << 20) + 40) / dtype.size()] {
                let mut ops: Vec<Op> = vec![Op::ReduceScatter, Op::Reduce];
                for a in algos {
                    // One-shot carries at most a packet half.
                    if a != AllReduceAlgo::OneShot || count * dtype.size() <= c.one_shot_max_bytes()
                    {
                        ops.push(Op::AllReduce(a));
                    }
                }
                for (k, op) in ops.into_iter().enumerate() {
                    seed += 1;
                    let in_place = (seed + k as u64).is_multiple_of(2);
                    check_call(&c, &stream, op, dtype, red, seed, count, k % n, in_place);
                }
            }
        }
        println!("rank {r}: {dtype}: every operation on every reducing path matched");
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// One call of each collective, small (LL) and large (puts), captured into a CUDA graph and
/// replayed three times, with a fresh input uploaded before each replay: every replay must
/// give the new result (fresh packet flags and semaphores each time).
fn graph_rank() {
    let (c, stream) = setup();
    let r = c.rank();
    graph_replays(
        &c,
        &stream,
        &[Op::ReduceScatter, Op::Reduce, Op::Broadcast, Op::AllToAll],
    );
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// [`graph_rank`]'s replays of `ops`.
fn graph_replays(c: &Collectives, stream: &Arc<CudaStream>, ops: &[Op]) {
    let (n, r) = (c.nranks(), c.rank());
    let dtype = DataType::Bf16;
    for &op in ops {
        for count in [n * 3, n * (3 << 20)] {
            let root = n - 1;
            let red = ReduceOp::Sum;
            let (send, recv_len, _, _) = data(op, dtype, red, 0, n, r, count, root, false);
            let sbuf: CudaSlice<u8> = stream.alloc_zeros(send.len()).unwrap();
            let rbuf: CudaSlice<u8> = stream.alloc_zeros(recv_len).unwrap();
            let (sp, rp) = (dptr(&sbuf, stream), dptr(&rbuf, stream));
            stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .unwrap();
            // SAFETY: the buffers live until the synchronize after the replays.
            unsafe { issue(c, op, dtype, red, sp, rp, count, root, stream) };
            let graph = stream
                .end_capture(
                    sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
                )
                .unwrap()
                .expect("a graph was captured");
            for replay in 1..=3u64 {
                let (send, _, _, want) = data(op, dtype, red, replay, n, r, count, root, false);
                let tmp: CudaSlice<u8> = stream.clone_htod(&send).unwrap();
                // SAFETY: device-to-device copy between live buffers of send.len() bytes.
                unsafe {
                    mscclpp::host::cuda::memcpy_async(sp, dptr(&tmp, stream), send.len(), stream)
                }
                .unwrap();
                stream.synchronize().unwrap();
                // Every rank's input is in place before any rank replays.
                c.communicator().bootstrap().barrier().unwrap();
                graph.launch().unwrap();
                stream.synchronize().unwrap();
                let got = stream.clone_dtoh(&rbuf).unwrap();
                if op == Op::Reduce && r != root {
                    continue;
                }
                let (bad, first) = mismatches(&got, &want, dtype.size());
                assert_eq!(
                    bad, 0,
                    "rank {r}: {op:?} count {count} replay {replay}: {bad} wrong, first at {first:?}"
                );
            }
            println!("rank {r}: graph replays of {op:?} count {count} matched");
        }
    }
}

/// The typed calls refuse bad arguments with the reason, and work.
fn typed_api_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let send: CudaSlice<f32> = stream.clone_htod(&vec![r as f32 + 1.0; n * 10]).unwrap();
    let mut small: CudaSlice<f32> = stream.alloc_zeros(9).unwrap();
    let e = c
        .reduce_scatter(&send, &mut small, ReduceOp::Sum, &stream)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("send has {} elements", n * 10)), "{e}");
    let mut recv: CudaSlice<f32> = stream.alloc_zeros(10).unwrap();
    let e = c
        .reduce(&send, &mut recv, ReduceOp::Sum, 0, &stream)
        .unwrap_err()
        .to_string();
    assert!(e.contains("recv 10"), "{e}");
    let mut buf: CudaSlice<f32> = stream.alloc_zeros(10).unwrap();
    let e = c
        .broadcast_in_place(&mut buf, n, &stream)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("root {n} is not a rank")), "{e}");
    let p = {
        let (p, _g) = send.device_ptr(&stream);
        p
    };
    // SAFETY: refused before any access.
    let e = unsafe {
        c.all_to_all(
            &RawBuffer::device(p, 4usize.saturating_mul(c.nranks()), DataType::F32),
            &mut RawBuffer::device(p + 4, 4usize.saturating_mul(c.nranks()), DataType::F32),
            &stream,
        )
    }
    .unwrap_err()
    .to_string();
    assert!(e.contains("overlap"), "{e}");
    c.reduce_scatter(&send, &mut recv, ReduceOp::Sum, &stream)
        .unwrap();
    let want = (1..=n).sum::<usize>() as f32;
    assert!(stream.clone_dtoh(&recv).unwrap().iter().all(|&v| v == want));
    c.broadcast_in_place(&mut recv, 0, &stream).unwrap();
    assert!(stream.clone_dtoh(&recv).unwrap().iter().all(|&v| v == want));
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// Bytes rank `from` sends rank `to` as its `k`-th message.
fn message(from: usize, to: usize, k: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| splitmix(k << 40 ^ (from as u64) << 36 ^ (to as u64) << 32 ^ i as u64) as u8)
        .collect()
}

fn send_recv_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let mut bytes = 2usize;
    let mut k = 0u64;
    while bytes <= 64 << 20 {
        for len in [bytes, bytes + 6] {
            k += 1;
            let count = len / 2;
            let out: CudaSlice<u8> = stream.clone_htod(&message(r, next, k, len)).unwrap();
            let got: CudaSlice<u8> = stream.alloc_zeros(len).unwrap();
            let ops = [
                P2pOp::Send {
                    buf: dptr(&out, &stream),
                    count,
                    dtype: DataType::F16,
                    peer: next,
                },
                P2pOp::Recv {
                    buf: dptr(&got, &stream),
                    count,
                    dtype: DataType::Bf16,
                    peer: prev,
                },
            ];
            // SAFETY: both buffers live until the synchronize below.
            unsafe { c.group(&ops, &stream) }.unwrap();
            // Rank 0 then sends to every other rank alone.
            let one: CudaSlice<u8> = if r == 0 {
                stream.clone_htod(&message(0, 1, k, len)).unwrap()
            } else {
                stream.alloc_zeros(len).unwrap()
            };
            for p in 1..n {
                // SAFETY: `one` lives until the synchronize below.
                unsafe {
                    if r == 0 {
                        c.send(
                            &RawBuffer::device(dptr(&one, &stream), count, DataType::F16),
                            p,
                            &stream,
                        )
                    } else if r == p {
                        c.recv(
                            &mut RawBuffer::device(dptr(&one, &stream), count, DataType::F16),
                            0,
                            &stream,
                        )
                    } else {
                        Ok(())
                    }
                }
                .unwrap();
            }
            stream.synchronize().unwrap();
            let want = message(prev, r, k, len);
            let (bad, first) = mismatches(&stream.clone_dtoh(&got).unwrap(), &want, 1);
            assert_eq!(
                bad, 0,
                "rank {r}: ring {len} bytes: {bad} wrong, first at {first:?}"
            );
            if r != 0 {
                let want = message(0, 1, k, len);
                let (bad, first) = mismatches(&stream.clone_dtoh(&one).unwrap(), &want, 1);
                assert_eq!(
                    bad, 0,
                    "rank {r}: from 0, {len} bytes: {bad} wrong, first {first:?}"
                );
            }
        }
        bytes *= 2;
    }
    println!("rank {r}: send/recv up to 64 MiB matched");
    // In place, as nccl-tests' sendrecv: one buffer sent to `next` and received from `prev`
    // in one group (staged), as LL packets, just above the packet limit, and pipelined.
    for (k, len) in [(500u64, 1000usize), (501, (512 << 10) + 2), (502, 5 << 20)] {
        let buf: CudaSlice<u8> = stream.clone_htod(&message(r, next, k, len)).unwrap();
        let ops = [
            P2pOp::Send {
                buf: dptr(&buf, &stream),
                count: len / 2,
                dtype: DataType::Bf16,
                peer: next,
            },
            P2pOp::Recv {
                buf: dptr(&buf, &stream),
                count: len / 2,
                dtype: DataType::Bf16,
                peer: prev,
            },
        ];
        // SAFETY: `buf` lives until the synchronize below; the group stages the send.
        unsafe { c.group(&ops, &stream) }.unwrap();
        stream.synchronize().unwrap();
        let want = message(prev, r, k, len);
        let (bad, first) = mismatches(&stream.clone_dtoh(&buf).unwrap(), &want, 1);
        assert_eq!(
            bad, 0,
            "rank {r}: in place {len} bytes: {bad} wrong, first at {first:?}"
        );
    }
    println!("rank {r}: in-place send/recv matched");
    // A ring group captured into a graph, replayed over fresh data.
    let len = 3 << 20;
    let out: CudaSlice<u8> = stream.alloc_zeros(len).unwrap();
    let got: CudaSlice<u8> = stream.alloc_zeros(len).unwrap();
    let (op, gp) = (dptr(&out, &stream), dptr(&got, &stream));
    let ops = [
        P2pOp::Recv {
            buf: gp,
            count: len / 2,
            dtype: DataType::Bf16,
            peer: prev,
        },
        P2pOp::Send {
            buf: op,
            count: len / 2,
            dtype: DataType::Bf16,
            peer: next,
        },
    ];
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    // SAFETY: the buffers live until the last synchronize.
    unsafe { c.group(&ops, &stream) }.unwrap();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap()
        .expect("a graph was captured");
    for replay in 1..=3u64 {
        let tmp: CudaSlice<u8> = stream
            .clone_htod(&message(r, next, 1000 + replay, len))
            .unwrap();
        // SAFETY: device-to-device copy between live buffers of len bytes.
        unsafe { mscclpp::host::cuda::memcpy_async(op, dptr(&tmp, &stream), len, &stream) }
            .unwrap();
        stream.synchronize().unwrap();
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        let want = message(prev, r, 1000 + replay, len);
        let (bad, first) = mismatches(&stream.clone_dtoh(&got).unwrap(), &want, 1);
        assert_eq!(
            bad, 0,
            "rank {r}: graph replay {replay}: {bad} wrong, first at {first:?}"
        );
    }
    // SAFETY: refused before any access.
    let e = unsafe { c.send(&RawBuffer::device(op, 2, DataType::F16), r, &stream) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("the own rank"), "{e}");
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// The pipelined broadcast and reduce ([`RootedAlgo::Pipelined`], selected by the config
/// as `MSCCLPP_BROADCAST_ALGO=pipelined` / `MSCCLPP_REDUCE_ALGO=pipelined` would): every
/// size to 64 MiB and odd counts next to them, every root, in place and out of place; every
/// reducing type and operation of reduce; fp8 broadcasts; one graph replay of each.
fn pipelined_rank() {
    let (c, stream) = setup_with(CollConfig {
        broadcast_algo: RootedAlgo::Pipelined,
        reduce_algo: RootedAlgo::Pipelined,
        ..CollConfig::default()
    });
    let (n, r) = (c.nranks(), c.rank());
    assert_eq!(c.rooted_algo(false, 1 << 20), RootedAlgo::Pipelined);
    assert_eq!(c.rooted_algo(true, 1 << 20), RootedAlgo::Pipelined);
    let mut seed = 2 << 20;
    for op in [Op::Reduce, Op::Broadcast] {
        for dtype in [DataType::F32, DataType::F16, DataType::Bf16] {
            if op == Op::Broadcast && dtype == DataType::F32 {
                continue;
            }
            for (k, count) in counts(op, dtype, n).into_iter().enumerate() {
                seed += 1;
                let red = ReduceOp::Sum;
                check_call(&c, &stream, op, dtype, red, seed, count, k % n, k % 2 == 1);
            }
            println!("rank {r}: pipelined {op:?} {dtype} up to 64 MiB matched");
        }
    }
    for dtype in DataType::ALL {
        if matches!(dtype, DataType::Fp8E4M3 | DataType::Fp8E5M2) {
            for count in [4099usize, (3 << 20) + 1] {
                seed += 1;
                let red = ReduceOp::Sum;
                check_call(
                    &c,
                    &stream,
                    Op::Broadcast,
                    dtype,
                    red,
                    seed,
                    count,
                    0,
                    false,
                );
            }
            continue;
        }
        for red in ReduceOp::ALL {
            for count in [
                1001usize,
                ((1 << 20) + 40) / dtype.size(),
                ((9 << 20) + 8) / dtype.size(),
            ] {
                seed += 1;
                let in_place = seed.is_multiple_of(2);
                let root = (seed as usize) % n;
                check_call(
                    &c,
                    &stream,
                    Op::Reduce,
                    dtype,
                    red,
                    seed,
                    count,
                    root,
                    in_place,
                );
            }
        }
        println!("rank {r}: pipelined reduce {dtype}: every operation matched");
    }
    graph_replays(&c, &stream, &[Op::Reduce, Op::Broadcast]);
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// Elements of the largest fp8 calls: 20M elements widen to 80 MB of f32, five times the
/// staging buffer, so the calls run in pieces.
const FP8_BEYOND_STAGING: usize = 20_000_000;

/// fp8 e4m3 and e5m2 all-reduce, reduce-scatter and reduce with sum, max and avg, in place
/// and out of place, against [`fp8_reduce`] bit for bit: from one element to
/// [`FP8_BEYOND_STAGING`] (a reduce-scatter's: one rank's whole input).
fn staged_fp8_rank() {
    const { assert!(FP8_BEYOND_STAGING * 4 > 4 * STAGING_BYTES) };
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let mut seed = 3 << 20;
    let ops = [
        Op::AllReduce(AllReduceAlgo::Auto),
        Op::ReduceScatter,
        Op::Reduce,
    ];
    for dtype in [DataType::Fp8E4M3, DataType::Fp8E5M2] {
        for red in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
            let totals = [1usize, 37, 4099, (1 << 20) + 3, FP8_BEYOND_STAGING];
            for (k, total) in totals.into_iter().enumerate() {
                for (j, op) in ops.into_iter().enumerate() {
                    let count = if op == Op::ReduceScatter {
                        (total / n).max(1)
                    } else {
                        total
                    };
                    seed += 1;
                    let in_place = (k + j) % 2 == 1;
                    check_call(
                        &c,
                        &stream,
                        op,
                        dtype,
                        red,
                        seed,
                        count,
                        (k + j) % n,
                        in_place,
                    );
                }
            }
            println!(
                "rank {r}: {dtype} {red:?}: all-reduce, reduce-scatter and reduce matched up to \
                 {FP8_BEYOND_STAGING} elements"
            );
        }
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// Rank `q`'s host scalar of the pre-multiplied sums: not a power of two, so products round.
fn host_scalar(q: usize) -> f32 {
    0.3 + 0.45 * q as f32
}

/// Rank `q`'s device scalar for replay (or eager round) `round`, 1 or 2: the second differs
/// from the first on every rank (and in sign).
fn device_scalar(round: u32, q: usize) -> f32 {
    if round == 1 {
        1.5 + q as f32
    } else {
        -0.7 - 0.2 * q as f32
    }
}

/// Element `i` of the ranks' f32 inputs of call `seed`, pre-multiplied by `scalar` and
/// summed ([`pre_mul_sum`]), as bits.
fn pre_mul_reference(seed: u64, n: usize, i: usize, scalar: &dyn Fn(usize) -> f32) -> u64 {
    let mut values = [0f32; 8];
    for (q, v) in values.iter_mut().enumerate().take(n) {
        *v = f32::from_bits(input(DataType::F32, seed, q, i) as u32);
    }
    pre_mul_sum(&values[..n], scalar).to_bits() as u64
}

/// Pre-multiplied f32 sums: a first one under graph capture is refused (it would allocate
/// the staging buffer); by a host scalar, all-reduce, reduce-scatter and reduce up to beyond
/// the staging buffer; by a device scalar, eagerly with the scalar changed between calls,
/// then captured into a CUDA graph replayed twice with the scalar changed between replays:
/// each result follows the scalar the GPU read.
fn staged_pre_mul_sum_rank() {
    let (c, stream) = setup();
    let (n, r) = (c.nranks(), c.rank());
    let dtype = DataType::F32;
    let capture = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let instantiate =
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
    // No staged call yet: a reduce-scatter under capture cannot allocate the staging.
    {
        let count = 4099;
        let send: CudaSlice<f32> = stream.alloc_zeros(n * count).unwrap();
        let recv: CudaSlice<f32> = stream.alloc_zeros(count).unwrap();
        let (sp, rp) = (dptr(&send, &stream), dptr(&recv, &stream));
        let op = ReduceOp::pre_mul_sum(host_scalar(r));
        stream.begin_capture(capture).unwrap();
        // SAFETY: refused before any access (and the buffers outlive the call anyway).
        let res = unsafe {
            c.reduce_scatter(
                &RawBuffer::device(sp, count.saturating_mul(c.nranks()), dtype),
                &mut RawBuffer::device(rp, count, dtype),
                op,
                &stream,
            )
        };
        let _ = stream.end_capture(instantiate);
        let e = res
            .expect_err("a first staged call under capture is refused")
            .to_string();
        assert!(e.contains("make one before capturing"), "rank {r}: {e}");
        stream.synchronize().unwrap();
        c.communicator().bootstrap().barrier().unwrap();
    }
    let ops = [
        Op::AllReduce(AllReduceAlgo::Auto),
        Op::ReduceScatter,
        Op::Reduce,
    ];
    let mut seed = 4 << 20;
    // Host scalars, eager (the first staged call allocates the staging buffer).
    let beyond_staging = STAGING_BYTES / 4 + 1001;
    for (k, total) in [1usize, 4099, (1 << 20) + 3, beyond_staging]
        .into_iter()
        .enumerate()
    {
        for (j, op) in ops.into_iter().enumerate() {
            let count = if op == Op::ReduceScatter {
                (total / n).max(1)
            } else {
                total
            };
            seed += 1;
            let red = ReduceOp::pre_mul_sum(host_scalar(r));
            let reduced = |i: usize| pre_mul_reference(seed, n, i, &host_scalar);
            let (root, in_place) = ((k + j) % n, (k + j) % 2 == 1);
            check_call_against(
                &c, &stream, op, dtype, red, seed, count, root, in_place, &reduced,
            );
        }
    }
    println!("rank {r}: pre-multiplied sums by host scalars matched");
    // A device scalar, eager: each call reads the value it finds.
    let mut scalar: CudaSlice<f32> = stream.clone_htod(&[device_scalar(1, r)]).unwrap();
    let red = ReduceOp::pre_mul_sum_at(dtype, dptr(&scalar, &stream));
    for round in 1..=2u32 {
        stream
            .memcpy_htod(&[device_scalar(round, r)], &mut scalar)
            .unwrap();
        for (j, op) in ops.into_iter().enumerate() {
            seed += 1;
            let reduced =
                |i: usize| pre_mul_reference(seed, n, i, &|q: usize| device_scalar(round, q));
            check_call_against(
                &c,
                &stream,
                op,
                dtype,
                red,
                seed,
                4099,
                j % n,
                false,
                &reduced,
            );
        }
    }
    println!("rank {r}: pre-multiplied sums by a device scalar matched, eagerly");
    // Under a CUDA graph: the replays read the scalar as it is when they run.
    for count in [4099usize, (1 << 20) + 3] {
        seed += 1;
        let root = n - 1;
        let first = |op: Op| {
            let reduced = |i: usize| pre_mul_reference(seed, n, i, &|q: usize| device_scalar(1, q));
            data_against(op, dtype, seed, n, r, count, root, false, &reduced)
        };
        let mut bufs: Vec<(Op, CudaSlice<u8>, CudaSlice<u8>)> = ops
            .into_iter()
            .map(|op| {
                let (send, recv_len, _, _) = first(op);
                let sbuf: CudaSlice<u8> = stream.clone_htod(&send).unwrap();
                let rbuf: CudaSlice<u8> = stream.alloc_zeros(recv_len).unwrap();
                (op, sbuf, rbuf)
            })
            .collect();
        let ptrs: Vec<(Op, u64, u64)> = bufs
            .iter()
            .map(|(op, s, rb)| (*op, dptr(s, &stream), dptr(rb, &stream)))
            .collect();
        stream.synchronize().unwrap();
        stream.begin_capture(capture).unwrap();
        for &(op, sp, rp) in &ptrs {
            // SAFETY: the buffers live until the synchronize after the last replay.
            unsafe { issue(&c, op, dtype, red, sp, rp, count, root, &stream) };
        }
        let graph = stream
            .end_capture(instantiate)
            .unwrap()
            .expect("a graph was captured");
        for replay in 1..=2u32 {
            stream
                .memcpy_htod(&[device_scalar(replay, r)], &mut scalar)
                .unwrap();
            // A replay that wrote nothing fails.
            for (_, _, rbuf) in bufs.iter_mut() {
                stream.memset_zeros(rbuf).unwrap();
            }
            stream.synchronize().unwrap();
            c.communicator().bootstrap().barrier().unwrap();
            graph.launch().unwrap();
            stream.synchronize().unwrap();
            for (op, _, rbuf) in &bufs {
                if *op == Op::Reduce && r != root {
                    continue;
                }
                let reduced =
                    |i: usize| pre_mul_reference(seed, n, i, &|q: usize| device_scalar(replay, q));
                let (_, _, _, want) =
                    data_against(*op, dtype, seed, n, r, count, root, false, &reduced);
                let got = stream.clone_dtoh(rbuf).unwrap();
                let (bad, first) = mismatches(&got, &want, dtype.size());
                assert_eq!(
                    bad,
                    0,
                    "rank {r}: {op:?} count {count} under a graph, replay {replay} (scalar \
                     {}): {bad} wrong, first at {first:?}",
                    device_scalar(replay, r)
                );
            }
        }
        println!("rank {r}: graph replays of count {count} followed the device scalar");
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// The text of a `CallMismatch`, or a panic naming what came instead.
fn mismatch_text(r: usize, what: &str, res: Result<(), CommError>) -> String {
    match res {
        Err(CommError::CallMismatch(m)) => m,
        other => panic!("rank {r}: {what}: expected a CallMismatch, got {other:?}"),
    }
}

/// Sends and receives of different sizes between ranks 0 and 1 (the others idle): an LL
/// send to a smaller and to a larger receive, pipelined ones both ways, the two paths
/// against each other, one inside a group; each reported by `synchronize` on the receiver
/// and on a pipelined sender at once, on an LL sender at its next send; after each, the
/// pair moves matching messages intact (LL and pipelined, both directions).
fn p2p_mismatch_rank() {
    let (c, stream) = setup();
    let r = c.rank();
    let ll_max = c.config().p2p_packet_max_bytes;
    let barrier = || c.communicator().bootstrap().barrier().unwrap();
    let mut k = 1000u64;
    // Matching transfers 0 -> 1 and a ring between 0 and 1; `earlier`: the text rank 0's
    // first send must report.
    let usable = |k: &mut u64, earlier: Option<&str>| {
        for (i, len) in [100usize, (512 << 10) + 2, 3 << 20].into_iter().enumerate() {
            *k += 1;
            let buf: CudaSlice<u8> = if r == 0 {
                stream.clone_htod(&message(0, 1, *k, len)).unwrap()
            } else {
                stream.alloc_zeros(len).unwrap()
            };
            // SAFETY: `buf` lives until the synchronize below.
            unsafe {
                match r {
                    0 => c.send(
                        &RawBuffer::device(dptr(&buf, &stream), len, DataType::U8),
                        1,
                        &stream,
                    ),
                    1 => c.recv(
                        &mut RawBuffer::device(dptr(&buf, &stream), len, DataType::U8),
                        0,
                        &stream,
                    ),
                    _ => Ok(()),
                }
            }
            .unwrap();
            let res = c.synchronize(&stream);
            match (r, earlier, i) {
                (0, Some(text), 0) => {
                    let m = mismatch_text(r, "the send after an LL mismatch", res);
                    assert!(
                        m.contains(text) && m.contains("learnt it from a note"),
                        "{m}"
                    );
                }
                _ => res.unwrap(),
            }
            if r == 1 {
                let (bad, first) = mismatches(
                    &stream.clone_dtoh(&buf).unwrap(),
                    &message(0, 1, *k, len),
                    1,
                );
                assert_eq!(
                    bad, 0,
                    "rank 1: {len} bytes after a mismatch: first {first:?}"
                );
            }
        }
        barrier();
    };
    let cases = [
        (4000usize, 2400usize),
        (2400, 4000),
        (4 << 20, 6 << 20),
        (6 << 20, 4 << 20),
        (400 << 10, 600 << 10),
        (600 << 10, 400 << 10),
    ];
    for (sent, want) in cases {
        k += 1;
        let len = [sent, want][r.min(1)];
        let buf: CudaSlice<u8> = if r == 0 {
            stream.clone_htod(&message(0, 1, k, len)).unwrap()
        } else {
            stream.alloc_zeros(len).unwrap()
        };
        // SAFETY: `buf` lives until the synchronize below.
        unsafe {
            match r {
                0 => c.send(
                    &RawBuffer::device(dptr(&buf, &stream), len, DataType::U8),
                    1,
                    &stream,
                ),
                1 => c.recv(
                    &mut RawBuffer::device(dptr(&buf, &stream), len, DataType::U8),
                    0,
                    &stream,
                ),
                _ => Ok(()),
            }
        }
        .unwrap();
        let res = c.synchronize(&stream);
        let text = format!("rank 0 sent {sent} bytes to rank 1, which expected {want}");
        let ll_sender = sent <= ll_max;
        // An LL sender reports it once: at the end of this send if the receiver's note is
        // already there, else at its next send.
        let mut later = None;
        if r == 1 || (r == 0 && (!ll_sender || res.is_err())) {
            let m = mismatch_text(r, &text, res);
            assert!(m.contains(&text), "rank {r}: {m}");
        } else if r == 0 {
            res.unwrap();
            later = Some(text.as_str());
        } else {
            res.unwrap();
        }
        barrier();
        usable(&mut k, later);
        println!("rank {r}: {sent} bytes sent, {want} expected: reported, pair usable");
    }
    // In a group: 0 -> 1 matches, 1 -> 0 does not (pipelined).
    if r < 2 {
        let (sent, want) = ([300usize, 2 << 20][r], [1 << 20, 300][r]);
        let out: CudaSlice<u8> = stream.clone_htod(&message(r, 1 - r, 7, sent)).unwrap();
        let got: CudaSlice<u8> = stream.alloc_zeros(want).unwrap();
        let ops = [
            P2pOp::Send {
                buf: dptr(&out, &stream),
                count: sent,
                dtype: DataType::U8,
                peer: 1 - r,
            },
            P2pOp::Recv {
                buf: dptr(&got, &stream),
                count: want,
                dtype: DataType::U8,
                peer: 1 - r,
            },
        ];
        // SAFETY: both buffers live until the synchronize below.
        unsafe { c.group(&ops, &stream) }.unwrap();
        let m = mismatch_text(r, "group", c.synchronize(&stream));
        let text = format!(
            "rank 1 sent {} bytes to rank 0, which expected {}",
            2 << 20,
            1 << 20
        );
        assert!(m.contains(&text), "rank {r}: {m}");
        if r == 1 {
            let (bad, first) =
                mismatches(&stream.clone_dtoh(&got).unwrap(), &message(0, 1, 7, 300), 1);
            assert_eq!(
                bad, 0,
                "rank 1: the matching transfer of the group: first {first:?}"
            );
        }
    }
    barrier();
    usable(&mut k, None);
    println!("rank {r}: send/recv mismatches reported on both sides, pair usable");
    barrier();
    println!("rank {r}: ok");
}

/// Rank 0 receives from rank 1 while every other rank all-reduces: rank 0 fails at once
/// naming rank 1's collective, and every other rank (rank 1, and from three ranks on one that
/// waits for rank 0's part of the collective) at once naming rank 0's send/recv, well within
/// the device timeout.
fn out_of_order_rank() {
    let (c, stream) = setup();
    let r = c.rank();
    let mut buf: CudaSlice<f32> = stream.alloc_zeros(1000).unwrap();
    let start = std::time::Instant::now();
    let res = if r == 0 {
        c.recv(&mut buf, 1, &stream)
    } else {
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)
    }
    .and_then(|()| c.synchronize(&stream));
    let took = start.elapsed();
    let e = match res {
        Ok(()) => panic!("rank {r}: the call succeeded"),
        Err(e) => e.to_string(),
    };
    println!("rank {r}: failed after {took:?}: {e}");
    let want = if r == 0 {
        "rank 1 called a collective (all_reduce"
    } else {
        "rank 0 waits in a send/recv group"
    };
    assert!(e.contains(want), "rank {r} did not say {want:?}: {e}");
    assert!(
        took < common::device_timeout() / 2,
        "rank {r} took {took:?}"
    );
    println!("rank {r}: ok");
}

macro_rules! gpu_test {
    ($name:ident, $rank:ident) => {
        #[test]
        fn $name() {
            if std::env::var(ROLE).is_ok() {
                $rank();
            } else if gpu_or_skip(stringify!($name), 0).is_some() {
                run_test_ranks(
                    stringify!($name),
                    test_ranks(),
                    ROLE,
                    Duration::from_secs(common::test_timeout_s()),
                );
            }
        }
    };
}

gpu_test!(
    reduce_scatter_reduce_broadcast_all_to_all_match_the_cpu_reference_to_64_mib,
    sweep_rank
);
gpu_test!(one_call_of_each_replays_under_a_cuda_graph, graph_rank);
gpu_test!(
    every_type_and_operation_on_every_reducing_path_matches_the_reference,
    types_and_ops_rank
);
gpu_test!(typed_api_checks_arguments, typed_api_rank);
gpu_test!(
    pipelined_broadcast_and_reduce_match_the_cpu_reference_to_64_mib,
    pipelined_rank
);
gpu_test!(
    sends_and_receives_match_alone_grouped_and_under_a_graph,
    send_recv_rank
);
gpu_test!(
    sends_and_receives_of_different_sizes_fail_on_both_sides_and_the_pair_stays_usable,
    p2p_mismatch_rank
);
gpu_test!(
    a_receive_facing_a_collective_fails_at_once_on_every_rank,
    out_of_order_rank
);
gpu_test!(
    staged_fp8_reductions_round_once_like_the_reference_beyond_the_staging,
    staged_fp8_rank
);
gpu_test!(
    staged_pre_multiplied_sums_follow_host_and_device_scalars_under_a_graph,
    staged_pre_mul_sum_rank
);

/// The staged references: fp8 widened to f32 and rounded once (saturating), fp8 inputs
/// finite with the extremes among them, and pre-multiplied sums scaled per rank.
#[test]
fn staged_references_round_once_saturate_and_scale_per_rank() {
    let (e4, e5) = (DataType::Fp8E4M3, DataType::Fp8E5M2);
    let one = fp8_round(e4, 1.0);
    let sixteenth = fp8_round(e4, 0.0625);
    assert_eq!(
        (fp8_value(e4, one), fp8_value(e4, sixteenth)),
        (1.0, 0.0625)
    );
    // 1 + 1/16 + 1/16 = 1.125, an e4m3 value; rounding each step (1.0625 -> 1, even) would
    // give 1.
    let once = fp8_reduce(e4, ReduceOp::Sum, &[one, sixteenth, sixteenth]);
    assert_eq!(fp8_value(e4, once), 1.125);
    // Saturating: 448 + 448 is e4m3's largest, 448; e5m2's 57344 likewise.
    let largest = fp8_round(e4, f32::MAX);
    assert_eq!(fp8_value(e4, largest), 448.0);
    assert_eq!(fp8_reduce(e4, ReduceOp::Sum, &[largest, largest]), largest);
    let largest5 = fp8_round(e5, f32::MAX);
    assert_eq!(fp8_value(e5, largest5), 57344.0);
    assert_eq!(
        fp8_reduce(e5, ReduceOp::Sum, &[largest5, largest5]),
        largest5
    );
    // Average: the f32 sum divided once, then rounded: 5/3 -> 1.625 in e4m3.
    let two = fp8_round(e4, 2.0);
    assert_eq!(
        fp8_value(e4, fp8_reduce(e4, ReduceOp::Avg, &[one, two, two])),
        1.625
    );
    // Max by totalOrder: +0 above -0, whichever rank holds it; negatives below.
    let (pz, nz) = (fp8_round(e5, 0.0), fp8_round(e5, -0.0));
    assert_ne!(pz, nz);
    assert_eq!(fp8_reduce(e5, ReduceOp::Max, &[nz, pz]), pz);
    assert_eq!(fp8_reduce(e5, ReduceOp::Max, &[pz, nz]), pz);
    let m3 = fp8_round(e5, -3.0);
    assert_eq!(fp8_reduce(e5, ReduceOp::Max, &[m3, nz]), nz);
    // The inputs: finite, with both largest magnitudes among them; reduce() is fp8_reduce of
    // them.
    for d in [e4, e5] {
        let bits: std::collections::BTreeSet<u8> =
            (0..20_000).map(|i| input(d, 7, i % 3, i) as u8).collect();
        assert!(bits.iter().all(|&b| fp8_value(d, b).is_finite()), "{d}");
        let big = fp8_round(d, f32::MAX);
        assert!(bits.contains(&big) && bits.contains(&(big | 0x80)), "{d}");
        for i in 0..1000 {
            let ins: Vec<u8> = (0..3).map(|q| input(d, 9, q, i) as u8).collect();
            assert_eq!(
                reduce(d, ReduceOp::Sum, 9, 3, i),
                u64::from(fp8_reduce(d, ReduceOp::Sum, &ins))
            );
        }
    }
    // Pre-multiplied sums: each rank's own scalar, products rounded to f32, then summed in
    // rank order.
    let third = 1.0f32 / 3.0;
    assert_eq!(pre_mul_sum(&[1.0, 2.0], |q| 0.5 + q as f32), 0.5 + 3.0);
    assert_eq!(
        pre_mul_sum(&[third, third, 1.0], |q| [3.0, 0.1, 7.0][q]),
        (third * 3.0 + third * 0.1) + 7.0
    );
    assert_ne!(device_scalar(1, 0), device_scalar(2, 0));
    let got = pre_mul_reference(11, 2, 5, &host_scalar);
    let x = |q| f32::from_bits(input(DataType::F32, 11, q, 5) as u32);
    assert_eq!(
        f32::from_bits(got as u32),
        x(0) * host_scalar(0) + x(1) * host_scalar(1)
    );
}
