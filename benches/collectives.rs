//! Every collective (all-reduce, all-gather, reduce-scatter, broadcast, reduce, all-to-all,
//! send/recv) on GPUs (criterion), with a reference measured in the same run:
//!
//! - two ranks as threads of this process (GPU 0 and 1, or both on GPU 0 when there is
//!   one), each with its own communicator and stream; rank 0's thread drives criterion and
//!   tells rank 1's thread how many operations to run, so both run the same ones;
//! - each sample queues `iters` operations between two CUDA events on each rank's stream;
//!   the sample's time is the larger of the two ranks' (as nccl-tests reports the slowest);
//! - reference: `cuMemcpyAsync` of the same bytes from rank 0's buffer into rank 1's (the
//!   copy engine over NVLink), against which the bus bandwidth is put at the end.
//!
//! Without a GPU the same collectives run on the Host transport (two ranks as threads, CPU
//! kernels, small sizes, short samples), against a `memcpy` of the same bytes: a smoke run
//! of the calls more than a measurement.
//!
//! `cargo bench --bench collectives`. For sweeps, other sizes and NCCL side by side, use the
//! `mscclpp-perf` tool.

mod common;

use mscclpp::host::collectives::{Exec, RawBuffer};
use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use common::events_ms;
use criterion::{BenchmarkId, Criterion, Throughput};
use mscclpp::host::bootstrap::{UniqueId, create_unique_id};
use mscclpp::host::collectives::{CollConfig, Collectives, DataType, P2pOp, ReduceOp};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::cuda::{CudaStream, DeviceBuffer, Gpu, memcpy_async};

/// Bytes per rank (all-reduce) or total output bytes (all-gather), as nccl-tests counts.
const SIZES: [usize; 4] = [1 << 10, 64 << 10, 1 << 20, 64 << 20];
const MAX_BYTES: usize = 64 << 20;
const NRANKS: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
}

impl Op {
    const ALL: [Op; 7] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::Reduce,
        Op::AllToAll,
        Op::SendRecv,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllToAll => "all_to_all",
            Op::SendRecv => "send_recv",
        }
    }

    /// nccl-tests' bus bandwidth factor.
    fn bus_factor(self) -> f64 {
        let n = NRANKS as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter | Op::AllToAll => (n - 1.0) / n,
            Op::Broadcast | Op::Reduce | Op::SendRecv => 1.0,
        }
    }
}

struct Rank {
    coll: Collectives,
    gpu: Gpu,
    stream: Arc<CudaStream>,
    send: DeviceBuffer,
    recv: DeviceBuffer,
}

fn setup(rank: usize, id: UniqueId, ngpus: usize) -> Rank {
    let (comm, gpu) = common::communicator(rank, id, ngpus);
    let coll = Collectives::new(comm, CollConfig::default())
        .unwrap_or_else(|e| panic!("rank {rank}: Collectives::new: {e}"));
    Rank {
        stream: gpu.new_stream().unwrap(),
        send: DeviceBuffer::zeroed(&gpu, MAX_BYTES).unwrap(),
        recv: DeviceBuffer::zeroed(&gpu, MAX_BYTES).unwrap(),
        coll,
        gpu,
    }
}

/// Queues `iters` operations of `bytes` between two events; returns the elapsed time.
fn run(r: &Rank, op: Op, bytes: usize, iters: u64, sync: &Barrier) -> Duration {
    let dtype = DataType::F32;
    let count = bytes / dtype.size();
    let (send, recv) = (r.send.device_ptr(), r.recv.device_ptr());
    let (rank, sum) = (r.coll.rank(), ReduceOp::Sum);
    let peer = (rank + 1) % NRANKS;
    r.stream.synchronize().unwrap();
    sync.wait();
    let ms = events_ms(&r.stream, || {
        for _ in 0..iters {
            // SAFETY: both buffers hold MAX_BYTES >= bytes and outlive the event sync.
            let res = unsafe {
                match op {
                    Op::ReduceScatter => r.coll.reduce_scatter(
                        &RawBuffer::device(
                            send,
                            (count / NRANKS).saturating_mul(r.coll.nranks()),
                            dtype,
                        ),
                        &mut RawBuffer::device(recv, count / NRANKS, dtype),
                        sum,
                        &r.stream,
                    ),
                    Op::Broadcast => r.coll.broadcast(
                        &RawBuffer::device(send, count, dtype),
                        &mut RawBuffer::device(recv, count, dtype),
                        0,
                        &r.stream,
                    ),
                    Op::Reduce => r.coll.reduce(
                        &RawBuffer::device(send, count, dtype),
                        &mut RawBuffer::device(recv, count, dtype),
                        sum,
                        0,
                        &r.stream,
                    ),
                    Op::AllToAll => r.coll.all_to_all(
                        &RawBuffer::device(
                            send,
                            (count / NRANKS).saturating_mul(r.coll.nranks()),
                            dtype,
                        ),
                        &mut RawBuffer::device(
                            recv,
                            (count / NRANKS).saturating_mul(r.coll.nranks()),
                            dtype,
                        ),
                        &r.stream,
                    ),
                    Op::SendRecv => r.coll.group(&send_recv(send, recv, count, peer), &r.stream),
                    Op::AllReduce => r.coll.all_reduce(
                        &RawBuffer::device(r.send.device_ptr(), count, dtype),
                        &mut RawBuffer::device(r.recv.device_ptr(), count, dtype),
                        ReduceOp::Sum,
                        &r.stream,
                    ),
                    Op::AllGather => r.coll.all_gather(
                        &RawBuffer::device(r.send.device_ptr(), count / NRANKS, dtype),
                        &mut RawBuffer::device(
                            r.recv.device_ptr(),
                            (count / NRANKS).saturating_mul(r.coll.nranks()),
                            dtype,
                        ),
                        &r.stream,
                    ),
                }
            };
            if let Err(e) = res {
                panic!("{} of {bytes} B: {e}", op.name());
            }
        }
    });
    Duration::from_secs_f64(ms * 1e-3)
}

/// Send to the next rank and receive from the previous one, in one group (nccl-tests'
/// sendrecv).
fn send_recv(send: u64, recv: u64, count: usize, peer: usize) -> [P2pOp; 2] {
    let dtype = DataType::F32;
    [
        P2pOp::Send {
            buf: send,
            count,
            dtype,
            peer,
        },
        P2pOp::Recv {
            buf: recv,
            count,
            dtype,
            peer: (peer + NRANKS - 2) % NRANKS,
        },
    ]
}

enum Cmd {
    Run(Op, usize, u64),
    Stop,
}

/// Rank 1: runs what rank 0 asks for, returns its time.
fn follower(r: Rank, cmds: Receiver<Cmd>, times: Sender<Duration>, sync: Arc<Barrier>) {
    while let Ok(Cmd::Run(op, bytes, iters)) = cmds.recv() {
        let _ = times.send(run(&r, op, bytes, iters, &sync));
    }
    r.coll.communicator().bootstrap().barrier().unwrap();
}

/// Total time and operations per (op, bytes), for the summary.
type Tally = Mutex<BTreeMap<(Op, usize), (Duration, u64)>>;

fn main() {
    let Some(ngpus) = common::gpus_or_skip("collectives") else {
        host_transport();
        return;
    };
    let id = create_unique_id().unwrap();
    let sync = Arc::new(Barrier::new(NRANKS));
    let (cmd_tx, cmd_rx) = channel();
    let (time_tx, time_rx) = channel();
    let (ptr_tx, ptr_rx) = channel();
    let follower = {
        let sync = sync.clone();
        std::thread::spawn(move || {
            let r = setup(1, id, ngpus);
            let _ = ptr_tx.send((r.recv.device_ptr(), r.gpu.clone()));
            follower(r, cmd_rx, time_tx, sync);
        })
    };
    let r0 = setup(0, id, ngpus);
    let (peer_recv, peer_gpu) = ptr_rx.recv().expect("rank 1 set up");
    println!(
        "collectives bench: rank 0 on GPU {}, rank 1 on GPU {}, float, sum",
        r0.gpu.info().ordinal,
        peer_gpu.info().ordinal
    );
    let tally = Tally::default();
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    for op in Op::ALL {
        let mut group = c.benchmark_group(op.name());
        for bytes in SIZES {
            group.throughput(Throughput::Bytes(bytes as u64));
            group.bench_function(BenchmarkId::new("mscclpp", bytes), |b| {
                b.iter_custom(|iters| {
                    cmd_tx.send(Cmd::Run(op, bytes, iters)).unwrap();
                    let mine = run(&r0, op, bytes, iters, &sync);
                    let theirs = time_rx.recv().expect("rank 1 alive");
                    let t = mine.max(theirs);
                    let mut m = tally.lock().unwrap();
                    let e = m.entry((op, bytes)).or_default();
                    e.0 += t;
                    e.1 += iters;
                    t
                })
            });
        }
        group.finish();
    }
    // Reference, while rank 1 idles (its buffers alive): the copy engine moving the largest
    // size from rank 0's send buffer into rank 1's receive buffer.
    r0.gpu.enable_peer_access(&peer_gpu).unwrap();
    let copy = || {
        events_ms(&r0.stream, || {
            for _ in 0..10 {
                // SAFETY: both buffers hold MAX_BYTES; rank 1's lives until it gets `Stop`,
                // after `events_ms` has synchronised this copy.
                unsafe { memcpy_async(peer_recv, r0.send.device_ptr(), MAX_BYTES, &r0.stream) }
                    .unwrap();
            }
        })
    };
    copy();
    let ce_gbps = MAX_BYTES as f64 * 10.0 / (copy() * 1e-3) / 1e9;
    let _ = cmd_tx.send(Cmd::Stop);
    r0.coll.communicator().bootstrap().barrier().unwrap();
    follower.join().unwrap();

    println!("summary (mean over all samples; busbw as nccl-tests):");
    for ((op, bytes), (total, n)) in tally.lock().unwrap().iter() {
        let us = total.as_secs_f64() * 1e6 / (*n).max(1) as f64;
        let busbw = *bytes as f64 / (us * 1e3) * op.bus_factor();
        println!(
            "  {} {:>9} B: {us:9.2} us, busbw {busbw:7.2} GB/s",
            op.name(),
            bytes
        );
    }
    let ar = tally
        .lock()
        .unwrap()
        .get(&(Op::AllReduce, MAX_BYTES))
        .map(|(t, n)| MAX_BYTES as f64 / (t.as_secs_f64() * 1e9 / (*n).max(1) as f64));
    println!(
        "reference: cuMemcpyAsync {MAX_BYTES} B GPU {} -> GPU {}: {ce_gbps:.1} GB/s",
        r0.gpu.info().ordinal,
        peer_gpu.info().ordinal
    );
    if let Some(algbw) = ar {
        let busbw = algbw * Op::AllReduce.bus_factor();
        println!(
            "all-reduce {MAX_BYTES} B busbw / copy engine: {:.2}",
            busbw / ce_gbps
        );
    }
}

/// Bytes of the Host-transport runs (CPU kernels: small, to keep `cargo bench` short).
const HOST_SIZES: [usize; 2] = [1 << 10, 64 << 10];

/// One Host-transport rank: its collectives and host buffers of the largest size.
struct HostRank {
    coll: Collectives,
    send: Vec<f32>,
    recv: Vec<f32>,
}

impl HostRank {
    fn new(rank: usize, id: UniqueId) -> HostRank {
        let bs = mscclpp::host::bootstrap::BlockingBootstrap::init(NRANKS, rank, id).unwrap();
        let config = CommConfig {
            device_timeout: Duration::from_secs(60),
            ..CommConfig::default()
        };
        let comm = Communicator::from_bootstrap(bs, Backend::Host, config).unwrap();
        let coll = Collectives::new(comm, CollConfig::default()).unwrap();
        let len = HOST_SIZES[HOST_SIZES.len() - 1] / 4;
        HostRank {
            coll,
            send: vec![1.0; len],
            recv: vec![0.0; len],
        }
    }

    /// `iters` operations of `bytes`; the time they took.
    fn run(&mut self, op: Op, bytes: usize, iters: u64) -> Duration {
        let n = bytes / 4;
        let (c, sum) = (&self.coll, ReduceOp::Sum);
        let peer = (c.rank() + 1) % NRANKS;
        c.communicator().bootstrap().barrier().unwrap();
        let t = std::time::Instant::now();
        for _ in 0..iters {
            let (send, recv) = (&self.send[..n], &mut self.recv[..n]);
            let res = match op {
                Op::AllReduce => c.all_reduce(send, recv, sum, Exec::Host),
                Op::AllGather => c.all_gather(&send[..n / NRANKS], recv, Exec::Host),
                Op::ReduceScatter => {
                    c.reduce_scatter(send, &mut recv[..n / NRANKS], sum, Exec::Host)
                }
                Op::Broadcast => c.broadcast(send, recv, 0, Exec::Host),
                Op::Reduce => c.reduce(send, recv, sum, 0, Exec::Host),
                Op::AllToAll => c.all_to_all(send, recv, Exec::Host),
                Op::SendRecv => {
                    let ops = send_recv(send.as_ptr() as u64, recv.as_mut_ptr() as u64, n, peer);
                    // SAFETY: both slices hold `n` elements and are borrowed for the call.
                    unsafe { c.group(&ops, Exec::Host) }
                }
            };
            if let Err(e) = res {
                panic!("host {} of {bytes} B: {e}", op.name());
            }
        }
        t.elapsed()
    }
}

/// No GPU: every collective on the Host transport, rank 1 on a thread following rank 0.
fn host_transport() {
    println!("collectives bench: no GPU, Host transport (CPU threads), float, sum");
    let id = create_unique_id().unwrap();
    let (cmd_tx, cmd_rx) = channel::<Cmd>();
    let (time_tx, time_rx) = channel();
    let follower = std::thread::spawn(move || {
        let mut r = HostRank::new(1, id);
        while let Ok(Cmd::Run(op, bytes, iters)) = cmd_rx.recv() {
            let _ = time_tx.send(r.run(op, bytes, iters));
        }
        r.coll.communicator().bootstrap().barrier().unwrap();
    });
    let mut r0 = HostRank::new(0, id);
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(400))
        .sample_size(10);
    for op in Op::ALL {
        let mut group = c.benchmark_group(format!("host_{}", op.name()));
        for bytes in HOST_SIZES {
            group.throughput(Throughput::Bytes(bytes as u64));
            group.bench_function(BenchmarkId::new("mscclpp", bytes), |b| {
                b.iter_custom(|iters| {
                    cmd_tx.send(Cmd::Run(op, bytes, iters)).unwrap();
                    let mine = r0.run(op, bytes, iters);
                    mine.max(time_rx.recv().expect("rank 1 alive"))
                })
            });
        }
        group.finish();
    }
    // Reference: a plain copy of the largest size on this CPU.
    let bytes = HOST_SIZES[HOST_SIZES.len() - 1];
    let (src, mut dst) = (vec![1u8; bytes], vec![0u8; bytes]);
    let t = std::time::Instant::now();
    for _ in 0..1000 {
        // black_box on both sides, so the copies are neither merged nor dropped.
        std::hint::black_box(dst.as_mut_slice()).copy_from_slice(std::hint::black_box(&src));
    }
    let copy_gbps = bytes as f64 * 1000.0 / t.elapsed().as_secs_f64() / 1e9;
    println!("reference: memcpy {bytes} B on this CPU: {copy_gbps:.1} GB/s");
    let _ = cmd_tx.send(Cmd::Stop);
    r0.coll.communicator().bootstrap().barrier().unwrap();
    follower.join().unwrap();
}
