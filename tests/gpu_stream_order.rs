//! Call order across streams on GPUs: a communicator's calls run in the order they were
//! made, whatever stream each was made on (as NCCL; PyTorch's FSDP2 issues its all-gathers
//! and reduce-scatters from two streams of one communicator). Two processes
//! (`MSCCLPP_TEST_GPUS=N` for N), each with two streams; the calls alternate between the
//! streams and between collectives of different kinds and sizes, and each rank holds up a
//! different stream with a spinning kernel before each call on it, so that without the order
//! the ranks would run the calls in different orders. Every result is checked. Then the
//! same, captured into one CUDA graph across both streams and replayed. Skips with a reason
//! without a GPU; fails instead under MSCCLPP_REQUIRE_GPU=1.

use mscclpp::host::collectives::RawBuffer;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use mscclpp::host::collectives::ReduceOp;
use mscclpp::host::collectives::{Collectives, DataType, P2pOp};
use mscclpp::host::testing::{gpu_or_skip, run_test_ranks};

mod common;

use common::{ROLE, dptr, setup, test_ranks};

/// A kernel of one thread that spins for `ns` nanoseconds of the GPU's global timer.
const SPIN_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin_ns(.param .u64 spin_ns_param_0)
{
    .reg .pred %p;
    .reg .b64 %n, %t0, %t1, %d;
    ld.param.u64 %n, [spin_ns_param_0];
    mov.u64 %t0, %globaltimer;
SPIN:
    mov.u64 %t1, %globaltimer;
    sub.u64 %d, %t1, %t0;
    setp.lt.u64 %p, %d, %n;
    @%p bra SPIN;
    ret;
}
"#;

/// How long a rank holds up its delayed stream before each call on it.
const DELAY_NS: u64 = 1_000_000;

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

/// The kinds of call the test alternates.
#[derive(Debug, Clone, Copy)]
enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    AllToAll,
    SendRecv,
}

/// One call of the sequence: its kind, elements per rank (or per block), and buffers.
struct Call {
    kind: Kind,
    count: usize,
    _send: CudaSlice<f32>,
    recv: CudaSlice<f32>,
    /// Their device addresses (taken before any call, so that cudarc adds no event waits).
    ptrs: (u64, u64),
}

/// Rank `rank`'s input element `j` of call `i`: small integers, so that every sum is exact.
fn input(i: usize, rank: usize, j: usize) -> f32 {
    ((i * 31 + rank * 7 + j) % 13) as f32
}

/// The calls of the sequence: kinds and sizes alternate (LL-packet sizes and larger ones).
fn plan(calls: usize) -> Vec<(Kind, usize)> {
    const KINDS: [(Kind, usize); 8] = [
        (Kind::AllReduce, 2),
        (Kind::AllGather, 1000),
        (Kind::ReduceScatter, 65_536),
        (Kind::AllReduce, 1 << 20),
        (Kind::Broadcast, 3000),
        (Kind::AllToAll, 100),
        (Kind::SendRecv, 5000),
        (Kind::ReduceScatter, 3),
    ];
    (0..calls).map(|i| KINDS[i % KINDS.len()]).collect()
}

/// Lengths of a call's send and receive buffers on `n` ranks.
fn lens(kind: Kind, count: usize, n: usize) -> (usize, usize) {
    match kind {
        Kind::AllReduce | Kind::Broadcast | Kind::SendRecv => (count, count),
        Kind::AllGather => (count, n * count),
        Kind::ReduceScatter => (n * count, count),
        Kind::AllToAll => (n * count, n * count),
    }
}

/// What rank `r` of `n` must hold in the receive buffer of call `i`.
fn expected(kind: Kind, i: usize, count: usize, n: usize, r: usize) -> Vec<f32> {
    let root = i % n;
    let prev = (r + n - 1) % n;
    let (_, len) = lens(kind, count, n);
    (0..len)
        .map(|j| match kind {
            Kind::AllReduce => (0..n).map(|q| input(i, q, j)).sum(),
            Kind::AllGather => input(i, j / count, j % count),
            Kind::ReduceScatter => (0..n).map(|q| input(i, q, r * count + j)).sum(),
            Kind::Broadcast => input(i, root, j),
            Kind::AllToAll => input(i, j / count, r * count + j % count),
            Kind::SendRecv => input(i, prev, j),
        })
        .collect()
}

/// Allocates the buffers of every call on `stream` (inputs filled) and takes their
/// addresses; synchronises.
fn buffers(c: &Collectives, stream: &Arc<CudaStream>, calls: usize) -> Vec<Call> {
    let (n, r) = (c.nranks(), c.rank());
    let out = plan(calls)
        .into_iter()
        .enumerate()
        .map(|(i, (kind, count))| {
            let (slen, rlen) = lens(kind, count, n);
            let host: Vec<f32> = (0..slen).map(|j| input(i, r, j)).collect();
            let send = stream.clone_htod(&host).unwrap();
            let recv = stream.alloc_zeros::<f32>(rlen).unwrap();
            let ptrs = (dptr(&send, stream), dptr(&recv, stream));
            Call {
                kind,
                count,
                _send: send,
                recv,
                ptrs,
            }
        })
        .collect();
    stream.synchronize().unwrap();
    out
}

/// Queues call `i` on `stream`.
fn queue(c: &Collectives, i: usize, call: &Call, stream: &CudaStream) {
    let (n, r) = (c.nranks(), c.rank());
    let (s, d) = call.ptrs;
    let k = call.count;
    // SAFETY: the buffers live in `call` until the caller has synchronised both streams, and
    // each call has buffers of its own.
    let res = unsafe {
        match call.kind {
            Kind::AllReduce => c.all_reduce(
                &RawBuffer::device(s, k, DataType::F32),
                &mut RawBuffer::device(d, k, DataType::F32),
                ReduceOp::Sum,
                stream,
            ),
            Kind::AllGather => c.all_gather(
                &RawBuffer::device(s, k, DataType::F32),
                &mut RawBuffer::device(d, k.saturating_mul(c.nranks()), DataType::F32),
                stream,
            ),
            Kind::ReduceScatter => c.reduce_scatter(
                &RawBuffer::device(s, k.saturating_mul(c.nranks()), DataType::F32),
                &mut RawBuffer::device(d, k, DataType::F32),
                ReduceOp::Sum,
                stream,
            ),
            Kind::Broadcast => c.broadcast(
                &RawBuffer::device(s, k, DataType::F32),
                &mut RawBuffer::device(d, k, DataType::F32),
                i % n,
                stream,
            ),
            Kind::AllToAll => c.all_to_all(
                &RawBuffer::device(s, k.saturating_mul(c.nranks()), DataType::F32),
                &mut RawBuffer::device(d, k.saturating_mul(c.nranks()), DataType::F32),
                stream,
            ),
            Kind::SendRecv => {
                let ops = [
                    P2pOp::Send {
                        buf: s,
                        count: k,
                        dtype: DataType::F32,
                        peer: (r + 1) % n,
                    },
                    P2pOp::Recv {
                        buf: d,
                        count: k,
                        dtype: DataType::F32,
                        peer: (r + n - 1) % n,
                    },
                ];
                c.group(&ops, stream)
            }
        }
    };
    res.unwrap_or_else(|e| panic!("rank {r}: call {i} ({:?}) refused: {e}", call.kind));
}

/// Queues the spinning kernel on `stream` for `ns` nanoseconds.
fn spin(f: &CudaFunction, stream: &CudaStream, ns: u64) {
    let mut l = stream.launch_builder(f);
    l.arg(&ns);
    // SAFETY: the kernel takes one u64 and touches no memory.
    unsafe { l.launch(LaunchConfig::for_num_elems(1)) }.unwrap();
}

/// Queues every call, alternating between the two streams; before each call on the stream
/// this rank delays (stream `rank % 2`), a spin.
fn queue_all(c: &Collectives, calls: &[Call], streams: [&CudaStream; 2], f: &CudaFunction) {
    let delayed = c.rank() % 2;
    for (i, call) in calls.iter().enumerate() {
        let s = i % 2;
        if s == delayed {
            spin(f, streams[s], DELAY_NS);
        }
        queue(c, i, call, streams[s]);
    }
}

/// Checks every call's result, zeroing the receive buffers for the next round.
fn check_all(c: &Collectives, calls: &mut [Call], stream: &Arc<CudaStream>, what: &str) {
    let (n, r) = (c.nranks(), c.rank());
    for (i, call) in calls.iter_mut().enumerate() {
        let got = stream.clone_dtoh(&call.recv).unwrap();
        let want = expected(call.kind, i, call.count, n, r);
        let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
        assert!(
            bad == 0,
            "rank {r}, {what}: call {i} ({:?} of {}): {bad} of {} elements wrong (first: got \
             {:?}, want {:?})",
            call.kind,
            call.count,
            want.len(),
            &got[..got.len().min(4)],
            &want[..want.len().min(4)]
        );
        stream.memset_zeros(&mut call.recv).unwrap();
    }
    stream.synchronize().unwrap();
}

fn spin_kernel(stream: &Arc<CudaStream>) -> CudaFunction {
    let m = stream
        .context()
        .load_module(cudarc::nvrtc::Ptx::from_src(SPIN_PTX))
        .unwrap();
    m.load_function("spin_ns").unwrap()
}

/// Plain launches: 48 calls over two streams, three rounds.
fn streams_rank() {
    let (c, s0) = setup();
    let r = c.rank();
    let s1 = s0.context().new_stream().unwrap();
    let f = spin_kernel(&s0);
    let mut calls = buffers(&c, &s0, 48);
    for round in 0..3 {
        queue_all(&c, &calls, [&s0, &s1], &f);
        c.synchronize(&s0)
            .unwrap_or_else(|e| panic!("rank {r}: round {round}, stream 0: {e}"));
        c.synchronize(&s1)
            .unwrap_or_else(|e| panic!("rank {r}: round {round}, stream 1: {e}"));
        check_all(&c, &mut calls, &s0, &format!("round {round}"));
        println!("rank {r}: round {round}: 48 calls over two streams matched");
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

/// One CUDA graph captured across both streams (the second joined to the capture by an
/// event), replayed three times.
fn graph_rank() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (c, s0) = setup();
    let r = c.rank();
    let s1 = s0.context().new_stream().unwrap();
    let f = spin_kernel(&s0);
    let mut calls = buffers(&c, &s0, 24);
    s0.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    s1.join(&s0).unwrap();
    queue_all(&c, &calls, [&s0, &s1], &f);
    s0.join(&s1).unwrap();
    let graph = s0
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap()
        .expect("a graph was captured");
    for replay in 0..3 {
        graph.launch().unwrap();
        c.synchronize(&s0)
            .unwrap_or_else(|e| panic!("rank {r}: replay {replay}: {e}"));
        check_all(&c, &mut calls, &s0, &format!("replay {replay}"));
        println!("rank {r}: replay {replay}: 24 captured calls over two streams matched");
    }
    c.communicator().bootstrap().barrier().unwrap();
    println!("rank {r}: ok");
}

macro_rules! ranks_test {
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

ranks_test!(
    calls_on_two_streams_run_in_call_order_on_every_rank,
    streams_rank
);
ranks_test!(
    calls_captured_across_two_streams_replay_in_call_order,
    graph_rank
);

/// The expected values are neither zero nor the rank's own input (a receive buffer left
/// untouched, or holding its own input, would fail), for every kind on 2 and 3 ranks (but
/// a broadcast's root).
#[test]
fn expected_values_differ_from_the_inputs_and_from_zero() {
    for n in [2, 3] {
        for (i, (kind, count)) in plan(8).into_iter().enumerate() {
            for r in 0..n {
                if matches!(kind, Kind::Broadcast) && r == i % n {
                    continue; // the root receives its own input
                }
                let want = expected(kind, i, count, n, r);
                let own: Vec<f32> = (0..want.len()).map(|j| input(i, r, j)).collect();
                assert!(want != own, "{kind:?} n {n} rank {r}: equals own input");
                assert!(
                    want.iter().any(|&v| v != 0.0),
                    "{kind:?} n {n} rank {r}: all zero"
                );
            }
        }
    }
}
