//! Collectives across hosts on GPUs (issue #17): two processes, each a simulated host of its
//! own (bootstrap host ids `sim-gpu-host-<rank>`; `MSCCLPP_TEST_RANKS_PER_HOST=2`: four
//! processes as two hosts of two; `MSCCLPP_TEST_HOSTS=3`: three hosts, where large calls
//! take the two-shot forms), one GPU each (all on GPU 0 when the machine has one), so the
//! cross-host step runs as the `cross_step` kernel over TCP proxy channels: by default
//! through host-mapped cross buffers (kernel -> pinned host memory -> socket -> pinned host
//! memory -> kernel), and in one test with odd ranks on device cross buffers (device ->
//! pinned slot -> socket -> pinned slot -> device).
//! All-reduce (f32 sum and average, bf16 max, i32 product) at 4 B, odd counts, 1 MiB and
//! 64 MiB, in place and out of place, and all-gather, against a CPU reference (with one rank
//! per host the host order is the rank order); a CUDA-graph capture and replay of an
//! all-reduce; reduce-scatter, reduce and broadcast to and from each root, all-to-all; and
//! send/recv across hosts (the `remote_p2p` kernel), in place too, and a mismatch of sizes. Skips
//! with a reason without a GPU; fails instead under MSCCLPP_REQUIRE_GPU=1.

use mscclpp::host::collectives::RawBuffer;
use std::sync::Arc;
use std::time::Duration;

use half::bf16;
use mscclpp::host::bootstrap::BlockingBootstrap;
use mscclpp::host::collectives::{CollConfig, Collectives};
use mscclpp::host::collectives::{DataType, P2pOp, ReduceOp};
use mscclpp::host::communicator::CommError;
use mscclpp::host::cuda::{CudaSlice, CudaStream};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::{gpu_or_skip, run_test_ranks_env};

mod common;

use common::{ROLE, dptr, mismatches, splitmix};

/// Ranks per simulated host: `MSCCLPP_TEST_RANKS_PER_HOST` (1..=4, default 1; with 2, four
/// processes as two hosts of two also run the local reduce-scatter and all-gather kernels
/// over memory channels, all on GPU 0 of a one-GPU machine). Under
/// `MSCCLPP_TEST_HOST_SIZES`, the size of the groups the library cuts the hosts into.
fn ranks_per_host() -> usize {
    match host_sizes() {
        Some(sizes) => group_size(&sizes),
        None => common::env_number("MSCCLPP_TEST_RANKS_PER_HOST", 1..=4, 1) as usize,
    }
}

/// Simulated hosts: `MSCCLPP_TEST_HOSTS` (2..=8, default 2). From 3 hosts, large calls take
/// the two-shot forms across hosts (more processes than GPUs share them: run under MPS,
/// `scripts/with-mps.sh`). Under `MSCCLPP_TEST_HOST_SIZES`, the number of groups.
fn test_hosts() -> usize {
    match host_sizes() {
        Some(sizes) => sizes.iter().sum::<usize>() / group_size(&sizes),
        None => common::env_number("MSCCLPP_TEST_HOSTS", 2..=8, 2) as usize,
    }
}

/// Hosts of different sizes: `MSCCLPP_TEST_HOST_SIZES=4,2` (the first 4 ranks on one
/// simulated host, the next 2 on another). The library cuts them into groups of one size
/// taken in rank order (here three groups of 2), which the checks treat as the hosts.
fn host_sizes() -> Option<Vec<usize>> {
    let v = std::env::var("MSCCLPP_TEST_HOST_SIZES").ok()?;
    let sizes: Vec<usize> = v
        .split(',')
        .map(|s| s.trim().parse().expect("MSCCLPP_TEST_HOST_SIZES: numbers"))
        .collect();
    assert!(
        sizes.iter().all(|&s| (1..=8).contains(&s)) && sizes.len() >= 2,
        "MSCCLPP_TEST_HOST_SIZES={v:?}: two or more sizes of 1..=8"
    );
    Some(sizes)
}

/// The library's group size for hosts of `sizes`: the largest number of at most 8 that
/// divides them all.
fn group_size(sizes: &[usize]) -> usize {
    (1..=8)
        .rev()
        .find(|d| sizes.iter().all(|s| s % d == 0))
        .expect("1 divides them")
}

/// The simulated host of `rank`.
fn host_of(rank: usize) -> usize {
    match host_sizes() {
        Some(sizes) => {
            let mut end = 0;
            sizes
                .iter()
                .position(|s| {
                    end += s;
                    rank < end
                })
                .expect("a host for every rank")
        }
        None => rank / ranks_per_host(),
    }
}

fn run_two(test: &str) {
    run_two_env(test, &[]);
}

/// [`run_two`] with `env` set in every rank.
fn run_two_env(test: &str, env: &[(&str, &str)]) {
    if gpu_or_skip(test, 0).is_none() {
        return;
    }
    let n = test_hosts() * ranks_per_host();
    let limit = Duration::from_secs(common::test_timeout_s());
    run_test_ranks_env(test, n, ROLE, limit, env);
}

/// This rank's collectives, on a simulated host of its own, and a stream.
fn setup(coll: CollConfig) -> (Collectives, Arc<CudaStream>) {
    let launch = Launch::from_env().unwrap();
    let config = launch
        .config()
        .with_host_id(format!("sim-gpu-host-{}", host_of(launch.rank)));
    let bs = BlockingBootstrap::init_with_config(launch.nranks, launch.rank, launch.root, config)
        .unwrap();
    common::collectives_on(bs, coll)
}

/// A small scratch, so that the cross buffer's slots are about 340 KiB and 1 MiB and 64 MiB
/// take several rounds.
fn small_scratch() -> CollConfig {
    CollConfig {
        scratch_bytes: 4 << 20,
        ..CollConfig::default()
    }
}

/// Rank `rank`'s element `i` of case `seed` as raw bits of `dtype` (random values the type
/// holds exactly: floats in [-4, 4), integers in [-3, 3] for the product).
fn input(dtype: DataType, seed: u64, rank: usize, i: usize) -> u64 {
    let h = splitmix(seed ^ (rank as u64) << 56 ^ i as u64);
    let v = (h >> 40) as f32 / (1u64 << 21) as f32 - 4.0;
    match dtype {
        DataType::F32 => v.to_bits() as u64,
        DataType::Bf16 => bf16::from_f32(v).to_bits() as u64,
        DataType::I32 => ((h % 7) as i32 - 3) as u32 as u64,
        _ => unreachable!("not used here"),
    }
}

/// The reduction of two ranks' elements `a` (rank 0) then `b`, as the library defines it:
/// host order (here rank order); the average divides the sum once by the rank count.
fn reduce(dtype: DataType, op: ReduceOp, a: u64, b: u64) -> u64 {
    match dtype {
        DataType::F32 => {
            let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
            let r = match op {
                ReduceOp::Sum | ReduceOp::PreMulSum(_) => x + y,
                ReduceOp::Avg => (x + y) / 2.0,
                ReduceOp::Max => x.max(y),
                ReduceOp::Min => x.min(y),
                ReduceOp::Prod => x * y,
            };
            r.to_bits() as u64
        }
        DataType::Bf16 => {
            let (x, y) = (bf16::from_bits(a as u16), bf16::from_bits(b as u16));
            let r = match op {
                ReduceOp::Max => x.max(y),
                ReduceOp::Min => x.min(y),
                _ => unreachable!("not used here"),
            };
            r.to_bits() as u64
        }
        DataType::I32 => {
            let (x, y) = (a as u32 as i32, b as u32 as i32);
            let r = match op {
                ReduceOp::Prod => x.wrapping_mul(y),
                ReduceOp::Sum => x.wrapping_add(y),
                _ => unreachable!("not used here"),
            };
            r as u32 as u64
        }
        _ => unreachable!("not used here"),
    }
}

/// Element `i` of an all-reduce of case `seed` over `n` ranks in the library's order: each
/// host's ranks in rank order, then the hosts' partials in host order; the average divides
/// that sum once by `n`.
fn expected(dtype: DataType, op: ReduceOp, seed: u64, i: usize, n: usize) -> u64 {
    let l = ranks_per_host();
    let step = if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    };
    let mut acc = None;
    for h in 0..n / l {
        let mut part = input(dtype, seed, h * l, i);
        for q in 1..l {
            part = reduce(dtype, step, part, input(dtype, seed, h * l + q, i));
        }
        acc = Some(match acc {
            None => part,
            Some(a) => reduce(dtype, step, a, part),
        });
    }
    let v = acc.expect("at least one host");
    if op == ReduceOp::Avg {
        (f32::from_bits(v as u32) / n as f32).to_bits() as u64
    } else {
        v
    }
}

fn bytes_of(dtype: DataType, words: impl Iterator<Item = u64>) -> Vec<u8> {
    let s = dtype.size();
    words.flat_map(|w| w.to_le_bytes()[..s].to_vec()).collect()
}

/// All-reduce of every case against the CPU reference, then the calls that are not built on
/// GPUs across hosts.
fn all_reduce_rank() {
    // Odd ranks with the device cross buffer under MSCCLPP_TEST_MIXED_CROSS_BUFFER: each
    // rank chooses for itself, the wire is the same.
    let mixed = std::env::var("MSCCLPP_TEST_MIXED_CROSS_BUFFER").is_ok();
    let launch_rank = Launch::from_env().unwrap().rank;
    let host_buffer = !(mixed && launch_rank % 2 == 1);
    let (c, stream) = setup(CollConfig {
        cross_buffer_host: host_buffer,
        ..small_scratch()
    });
    let (n, r) = (c.nranks(), c.rank());
    assert_eq!(c.hosts(), test_hosts());
    // Where every partner (the rank of the same place in each other group) is on another
    // simulated host, over TCP, the setting decides; a partner on the same host (hosts cut
    // into groups) is reached by the copy engine, from device memory.
    let l = ranks_per_host();
    let all_tcp = (0..n)
        .filter(|&p| p % l == r % l && p / l != r / l)
        .all(|p| host_of(p) != host_of(r));
    assert_eq!(c.cross_buffer_mapped(), host_buffer && all_tcp, "rank {r}");
    let cases: [(DataType, ReduceOp, &[usize]); 4] = [
        (
            DataType::F32,
            ReduceOp::Sum,
            &[1, 7, 1001, 262_144, 16 << 20],
        ),
        (
            DataType::Bf16,
            ReduceOp::Max,
            &[2, 7, 1001, 524_288, 32 << 20],
        ),
        (DataType::F32, ReduceOp::Avg, &[1, 1001, 262_144 + 3]),
        (DataType::I32, ReduceOp::Prod, &[5, 100_003]),
    ];
    let mut seed = 0u64;
    for (dtype, op, counts) in cases {
        for &count in counts {
            for in_place in [false, true] {
                seed += 1;
                let s = dtype.size();
                let mine = bytes_of(dtype, (0..count).map(|i| input(dtype, seed, r, i)));
                let want = bytes_of(dtype, (0..count).map(|i| expected(dtype, op, seed, i, n)));
                let send: CudaSlice<u8> = stream.clone_htod(&mine).unwrap();
                let recv: CudaSlice<u8> = stream.alloc_zeros(count * s).unwrap();
                let sp = dptr(&send, &stream);
                let rp = if in_place { sp } else { dptr(&recv, &stream) };
                // SAFETY: both slices live until the synchronize below.
                unsafe {
                    c.all_reduce(
                        &RawBuffer::device(sp, count, dtype),
                        &mut RawBuffer::device(rp, count, dtype),
                        op,
                        &stream,
                    )
                }
                .unwrap();
                c.synchronize(&stream).unwrap();
                let got = stream
                    .clone_dtoh(if in_place { &send } else { &recv })
                    .unwrap();
                let (bad, first) = mismatches(&got, &want, s);
                assert_eq!(
                    bad, 0,
                    "rank {r}: all_reduce {dtype} {op:?} of {count} (in place: {in_place}): \
                     {bad} elements differ, first at {first:?}"
                );
            }
            println!("rank {r}: all_reduce {dtype} {op:?} of {count} matched");
        }
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// f32 elements `i` of rank `q`'s input of case `seed` (small integers: every sum exact).
fn ints(seed: u64, q: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (splitmix(seed << 48 ^ (q as u64) << 40 ^ i as u64) % 17) as f32 - 8.0)
        .collect()
}

/// Reduce-scatter, reduce to each root, broadcast from each root and all-to-all against
/// the CPU reference.
fn more_rank() {
    let (c, stream) = setup(small_scratch());
    let (n, r) = (c.nranks(), c.rank());
    for (k, count) in [1usize, 1001, 262_145].into_iter().enumerate() {
        let seed = 100 + k as u64;
        let send: CudaSlice<f32> = stream.clone_htod(&ints(seed, r, n * count)).unwrap();
        let recv: CudaSlice<f32> = stream.alloc_zeros(count).unwrap();
        let (sp, rp) = (dptr(&send, &stream), dptr(&recv, &stream));
        // SAFETY: the slices live until the synchronize.
        unsafe {
            c.reduce_scatter(
                &RawBuffer::device(sp, count.saturating_mul(c.nranks()), DataType::F32),
                &mut RawBuffer::device(rp, count, DataType::F32),
                ReduceOp::Sum,
                &stream,
            )
        }
        .unwrap();
        c.synchronize(&stream).unwrap();
        let got = stream.clone_dtoh(&recv).unwrap();
        let all: Vec<Vec<f32>> = (0..n).map(|q| ints(seed, q, n * count)).collect();
        let want: Vec<f32> = (0..count)
            .map(|i| all.iter().map(|x| x[r * count + i]).sum())
            .collect();
        assert!(got == want, "rank {r}: reduce_scatter of {count} per rank");
        println!("rank {r}: reduce_scatter of {count} per rank matched");
    }
    for root in 0..n {
        for count in [7usize, 300_001] {
            let seed = 200 + (root * 10 + count % 10) as u64;
            let send: CudaSlice<f32> = stream.clone_htod(&ints(seed, r, count)).unwrap();
            let recv: CudaSlice<f32> = stream.alloc_zeros(count).unwrap();
            let sp = dptr(&send, &stream);
            // The other ranks pass no receive buffer.
            let rp = if r == root { dptr(&recv, &stream) } else { 0 };
            // SAFETY: the slices live until the synchronize.
            unsafe {
                c.reduce(
                    &RawBuffer::device(sp, count, DataType::F32),
                    &mut RawBuffer::device(rp, count, DataType::F32),
                    ReduceOp::Sum,
                    root,
                    &stream,
                )
            }
            .unwrap();
            c.synchronize(&stream).unwrap();
            if r == root {
                let got = stream.clone_dtoh(&recv).unwrap();
                let all: Vec<Vec<f32>> = (0..n).map(|q| ints(seed, q, count)).collect();
                let want: Vec<f32> = (0..count).map(|i| all.iter().map(|x| x[i]).sum()).collect();
                assert!(got == want, "rank {r}: reduce of {count} to {root}");
            }
            let bytes = count * 4 + 3;
            let data: Vec<u8> = (0..bytes)
                .map(|i| splitmix(seed ^ i as u64) as u8)
                .collect();
            let mine: Vec<u8> = if r == root {
                data.clone()
            } else {
                vec![0; bytes]
            };
            let send: CudaSlice<u8> = stream.clone_htod(&mine).unwrap();
            let recv: CudaSlice<u8> = stream.alloc_zeros(bytes).unwrap();
            let sp = if r == root { dptr(&send, &stream) } else { 0 };
            let rp = dptr(&recv, &stream);
            // SAFETY: the slices live until the synchronize.
            unsafe {
                c.broadcast(
                    &RawBuffer::device(sp, bytes, DataType::U8),
                    &mut RawBuffer::device(rp, bytes, DataType::U8),
                    root,
                    &stream,
                )
            }
            .unwrap();
            c.synchronize(&stream).unwrap();
            let got = stream.clone_dtoh(&recv).unwrap();
            let (bad, first) = mismatches(&got, &data, 1);
            assert_eq!(
                bad, 0,
                "rank {r}: broadcast of {bytes} from {root}: first at {first:?}"
            );
        }
        println!("rank {r}: reduce and broadcast with root {root} matched");
    }
    for count in [1usize, 100_003] {
        let block = |q: usize, d: usize| -> Vec<u32> {
            (0..count)
                .map(|i| splitmix((q as u64) << 48 ^ (d as u64) << 40 ^ i as u64) as u32)
                .collect()
        };
        let mine: Vec<u32> = (0..n).flat_map(|d| block(r, d)).collect();
        let want: Vec<u32> = (0..n).flat_map(|q| block(q, r)).collect();
        let send: CudaSlice<u32> = stream.clone_htod(&mine).unwrap();
        let recv: CudaSlice<u32> = stream.alloc_zeros(n * count).unwrap();
        let (sp, rp) = (dptr(&send, &stream), dptr(&recv, &stream));
        // SAFETY: the slices live until the synchronize.
        unsafe {
            c.all_to_all(
                &RawBuffer::device(sp, count.saturating_mul(c.nranks()), DataType::U32),
                &mut RawBuffer::device(rp, count.saturating_mul(c.nranks()), DataType::U32),
                &stream,
            )
        }
        .unwrap();
        c.synchronize(&stream).unwrap();
        let got = stream.clone_dtoh(&recv).unwrap();
        assert!(got == want, "rank {r}: all_to_all of {count} per pair");
        println!("rank {r}: all_to_all of {count} per pair matched");
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// One group: `len` bytes at `send` to `next`, from `prev` into `recv`; synchronized.
///
/// # Safety
/// Both ranges device memory of `len` bytes until the call returns.
unsafe fn ring(
    c: &Collectives,
    stream: &Arc<CudaStream>,
    send: u64,
    recv: u64,
    len: usize,
    (next, prev): (usize, usize),
) {
    let ops = [
        P2pOp::Send {
            buf: send,
            count: len,
            dtype: DataType::U8,
            peer: next,
        },
        P2pOp::Recv {
            buf: recv,
            count: len,
            dtype: DataType::U8,
            peer: prev,
        },
    ];
    // SAFETY: caller contract.
    unsafe { c.group(&ops, stream) }.unwrap();
    c.synchronize(stream).unwrap();
}

/// Send/recv with ranks on the other host (the `remote_p2p` kernel over TCP) and, with two ranks
/// per host, inside the host in the same group: a ring exchange (send to the next rank,
/// receive from the previous) of 4 B to 8 MiB + 4 (many 256 KiB pieces), out of place and
/// in place (staged), then a mismatch of sizes named on the receiver, every byte checked.
fn send_recv_rank() {
    let (c, stream) = setup(CollConfig::default());
    let (n, r) = (c.nranks(), c.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let data = |q: usize, seed: u64, len: usize| -> Vec<u8> {
        (0..len)
            .map(|i| splitmix(seed << 40 ^ (q as u64) << 32 ^ i as u64) as u8)
            .collect()
    };
    for (k, len) in [4usize, 1001, 262_145, (8 << 20) + 4]
        .into_iter()
        .enumerate()
    {
        let seed = 500 + k as u64;
        let send: CudaSlice<u8> = stream.clone_htod(&data(r, seed, len)).unwrap();
        let recv: CudaSlice<u8> = stream.alloc_zeros(len).unwrap();
        let (sp, rp) = (dptr(&send, &stream), dptr(&recv, &stream));
        // SAFETY: the slices live until the synchronize.
        unsafe { ring(&c, &stream, sp, rp, len, (next, prev)) };
        let got = stream.clone_dtoh(&recv).unwrap();
        let (bad, first) = mismatches(&got, &data(prev, seed, len), 1);
        assert_eq!(
            bad, 0,
            "rank {r}: {len} B from rank {prev}: first bad bytes {first:?}"
        );
        // In place: the same buffer sent and received (the send is staged first).
        // SAFETY: as above.
        unsafe { ring(&c, &stream, sp, sp, len, (next, prev)) };
        let got = stream.clone_dtoh(&send).unwrap();
        let (bad, _) = mismatches(&got, &data(prev, seed, len), 1);
        assert_eq!(bad, 0, "rank {r}: in place, {len} B from rank {prev}");
        println!("rank {r}: send/recv of {len} B matched");
    }
    // Rank 0 sends 1000 B to rank 1 (the other host with one rank per host), which expects
    // 600: rank 1 is told, with both sizes, and the pair stays usable.
    if ranks_per_host() == 1 && r < 2 {
        let buf: CudaSlice<u8> = stream.alloc_zeros(1000).unwrap();
        let p = dptr(&buf, &stream);
        let other = 1 - r;
        // SAFETY: buf lives until the synchronize.
        let res = unsafe {
            if r == 0 {
                c.send(&RawBuffer::device(p, 1000, DataType::U8), other, &stream)
            } else {
                c.recv(&mut RawBuffer::device(p, 600, DataType::U8), other, &stream)
            }
        };
        res.unwrap();
        let res = c.synchronize(&stream);
        if r == 0 {
            res.unwrap();
        } else {
            match res {
                Err(CommError::CallMismatch(m)) => {
                    assert!(
                        m.contains("sent 1000 bytes to rank 1, which expected 600"),
                        "{m}"
                    )
                }
                other => panic!("rank 1: expected the mismatch, got {other:?}"),
            }
        }
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// All-gather of several sizes (odd ones included), out of place and in place.
fn all_gather_rank() {
    let (c, stream) = setup(small_scratch());
    let (n, r) = (c.nranks(), c.rank());
    for (k, bytes) in [4usize, 6, 1001, 1 << 20, (64 << 20) + 4]
        .into_iter()
        .enumerate()
    {
        let part = |q: usize| -> Vec<u8> {
            (0..bytes)
                .map(|i| splitmix((k as u64) << 40 ^ (q as u64) << 32 ^ i as u64) as u8)
                .collect()
        };
        let want: Vec<u8> = (0..n).flat_map(part).collect();
        for in_place in [false, true] {
            let recv: CudaSlice<u8> = stream.alloc_zeros(n * bytes).unwrap();
            let rp = dptr(&recv, &stream);
            let send: CudaSlice<u8> = stream.clone_htod(&part(r)).unwrap();
            let sp = if in_place {
                let own = rp + (r * bytes) as u64;
                // SAFETY: both live until the synchronize; the own part of recv.
                unsafe {
                    mscclpp::host::cuda::memcpy_async(own, dptr(&send, &stream), bytes, &stream)
                }
                .unwrap();
                own
            } else {
                dptr(&send, &stream)
            };
            let count = bytes / 2;
            let (count, dtype) = if bytes % 2 == 0 {
                (count, DataType::F16)
            } else {
                (bytes, DataType::U8)
            };
            // SAFETY: the slices live until the synchronize below.
            unsafe {
                c.all_gather(
                    &RawBuffer::device(sp, count, dtype),
                    &mut RawBuffer::device(rp, count.saturating_mul(c.nranks()), dtype),
                    &stream,
                )
            }
            .unwrap();
            c.synchronize(&stream).unwrap();
            let got = stream.clone_dtoh(&recv).unwrap();
            let (bad, first) = mismatches(&got, &want, 1);
            assert_eq!(
                bad, 0,
                "rank {r}: all_gather of {bytes} bytes (in place: {in_place}): {bad} bytes \
                 differ, first at {first:?}"
            );
        }
        println!("rank {r}: all_gather of {bytes} bytes per rank matched");
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// Ten in-place all-reduces captured into one CUDA graph (raw API) and replayed three times:
/// with small-integer inputs every call doubles the sum, so the result proves that every
/// replayed call exchanged a fresh round with the other host.
fn graph_rank() {
    let (c, stream) = setup(CollConfig::default());
    let (n, r) = (c.nranks(), c.rank());
    for count in [2usize, 3 << 20] {
        let base: Vec<f32> = (0..count).map(|i| ((i * 7 + r) % 5) as f32).collect();
        let buf: CudaSlice<f32> = stream.clone_htod(&base).unwrap();
        let p = dptr(&buf, &stream);
        // SAFETY: buf lives until the synchronize.
        unsafe { common::sum_in_place(&c, &stream, p, count) };
        c.synchronize(&stream).unwrap();
        let sum: Vec<f32> = stream.clone_dtoh(&buf).unwrap();
        // buf lives until the synchronize after the replays.
        common::replay_in_place_sums(&c, &stream, p, count);
        c.synchronize(&stream).unwrap();
        let got: Vec<f32> = stream.clone_dtoh(&buf).unwrap();
        for (i, (g, s)) in got.iter().zip(&sum).enumerate() {
            assert_eq!(
                *g,
                (0..30).fold(*s, |v, _| sum_of_equal(
                    v,
                    n / ranks_per_host(),
                    ranks_per_host()
                )),
                "rank {r}: count {count} element {i} after 30 replayed calls"
            );
        }
        println!("rank {r}: graph replay of count {count} matched");
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// The f32 sum of `v` held by every rank of `hosts` hosts of `local` ranks, in the library's
/// order: each host's ranks in local order, then the hosts' sums in host order. Exact for
/// powers of two only (three hosts triple a value, which f32 rounds), so the replays' result
/// is this applied once per call, not the first sum times `nranks^calls`.
fn sum_of_equal(v: f32, hosts: usize, local: usize) -> f32 {
    let host_sum = (1..local).fold(v, |a, _| a + v);
    (1..hosts).fold(host_sum, |a, _| a + host_sum)
}

macro_rules! two_rank_test {
    ($name:ident, $rank:ident) => {
        #[test]
        fn $name() {
            if std::env::var(ROLE).is_ok() {
                $rank();
            } else {
                run_two(stringify!($name));
            }
        }
    };
}

two_rank_test!(
    cross_host_all_reduce_matches_the_cpu_reference,
    all_reduce_rank
);
two_rank_test!(cross_host_all_gather_places_every_rank, all_gather_rank);

/// The all-reduce test with odd ranks on the device cross buffer (staged by the copy
/// engine) and even ranks on the host-mapped one.
#[test]
fn cross_host_all_reduce_mixes_host_and_device_cross_buffers() {
    if std::env::var(ROLE).is_ok() {
        all_reduce_rank();
        return;
    }
    run_two_env(
        "cross_host_all_reduce_mixes_host_and_device_cross_buffers",
        &[("MSCCLPP_TEST_MIXED_CROSS_BUFFER", "1")],
    );
}
two_rank_test!(
    cross_host_reduce_scatter_reduce_broadcast_all_to_all_match,
    more_rank
);
two_rank_test!(cross_host_all_reduce_replays_under_a_cuda_graph, graph_rank);
two_rank_test!(cross_host_send_recv_moves_every_byte, send_recv_rank);
