//! Small all-reduce against the bare LL exchange it is made of, under CUDA graphs, in one run
//! (issue 18's goal: all-reduce ≤ 1.1× the bare exchange at every size to 64 KB).
//!
//! - two ranks as threads of this process (GPU 0 and 1, or both on GPU 0 when there is one),
//!   each with its own `Collectives` and stream;
//! - per size (8 B-64 KiB of f32): a graph of [`CALLS`] one-shot all-reduces and a graph of
//!   [`CALLS`] bare exchanges ([`Collectives::ll_exchange_raw`]: the same packets, grid,
//!   call counter and flags, without the call descriptors and the reduction), each replayed
//!   [`REPLAYS`] times between two events; the time per call is the larger of the two ranks',
//!   the median of [`ROUNDS`] rounds, each timing both (which goes first alternates);
//! - before timing, each size's results are checked (the all-reduce's sums, the exchange's
//!   XOR), and the run fails on a wrong element.
//!
//! Prints a table and, last, one line of JSON (`{"bench":"ll_exchange",...}`). Without a GPU
//! it says so and measures nothing (the exchange runs only on GPUs; its CPU form is tested in
//! the device crate).
//!
//! `cargo bench --bench ll_exchange`

mod common;

use mscclpp::host::collectives::RawBuffer;
use std::sync::{Arc, Barrier, Mutex};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use mscclpp::host::collectives::{AllReduceAlgo, CollConfig, Collectives, DataType, ReduceOp};
use mscclpp::host::cuda::{CudaStream, DeviceBuffer};

/// Bytes per rank.
const SIZES: [usize; 8] = [8, 64, 512, 1 << 10, 4 << 10, 8 << 10, 16 << 10, 64 << 10];
/// Calls per captured graph.
const CALLS: usize = 20;
/// Graph launches per timed round.
const REPLAYS: usize = 50;
/// Timed rounds per (size, kind); the median is reported.
const ROUNDS: usize = 7;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    AllReduce,
    Bare,
}

struct Rank {
    coll: Collectives,
    stream: Arc<CudaStream>,
    send: DeviceBuffer,
    recv: DeviceBuffer,
}

impl Rank {
    fn enqueue(&self, kind: Kind, bytes: usize) {
        let (send, recv) = (self.send.device_ptr(), self.recv.device_ptr());
        // SAFETY: both buffers hold the largest size and outlive every replay (synchronised
        // before they drop).
        let r = unsafe {
            match kind {
                Kind::AllReduce => self.coll.all_reduce_using(
                    AllReduceAlgo::OneShot,
                    &RawBuffer::device(send, bytes / 4, DataType::F32),
                    &mut RawBuffer::device(recv, bytes / 4, DataType::F32),
                    ReduceOp::Sum,
                    &self.stream,
                ),
                Kind::Bare => self.coll.ll_exchange_raw(send, recv, bytes, &self.stream),
            }
        };
        if let Err(e) = r {
            panic!("rank {}: {bytes} B: {e}", self.coll.rank());
        }
    }

    /// One call of `kind` on inputs of rank `r` (`r + 1 + i % 7` as f32), checked.
    fn check(&self, kind: Kind, bytes: usize, sync: &Barrier) {
        let count = bytes / 4;
        let val = |r: usize, i: usize| (r + 1 + i % 7) as f32;
        let mine: Vec<f32> = (0..count).map(|i| val(self.coll.rank(), i)).collect();
        self.send.copy_from_host(0, &mine).unwrap();
        self.stream.synchronize().unwrap();
        sync.wait();
        self.enqueue(kind, bytes);
        self.coll.synchronize(&self.stream).unwrap();
        let mut got = vec![0f32; count];
        self.recv.copy_to_host(0, &mut got).unwrap();
        for (i, g) in got.iter().enumerate() {
            let want = match kind {
                Kind::AllReduce => val(0, i) + val(1, i),
                Kind::Bare => f32::from_bits(val(0, i).to_bits() ^ val(1, i).to_bits()),
            };
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "rank {}: {} of {bytes} B, element {i}",
                self.coll.rank(),
                if kind == Kind::Bare {
                    "exchange"
                } else {
                    "all-reduce"
                }
            );
        }
        sync.wait();
    }

    /// Microseconds per call of `kind`: a graph of `CALLS` calls replayed `REPLAYS` times.
    fn time(&self, kind: Kind, bytes: usize, sync: &Barrier) -> f64 {
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .unwrap();
        for _ in 0..CALLS {
            self.enqueue(kind, bytes);
        }
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .unwrap()
            .expect("a captured graph");
        graph.upload().unwrap();
        graph.launch().unwrap();
        self.stream.synchronize().unwrap();
        sync.wait();
        // One untimed call waits on the GPU for the later rank, so the timed replays start
        // together.
        self.enqueue(kind, bytes);
        let ms = common::events_ms(&self.stream, || {
            for _ in 0..REPLAYS {
                graph.launch().unwrap();
            }
        });
        self.coll.synchronize(&self.stream).unwrap();
        ms * 1e3 / (CALLS * REPLAYS) as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let Some(ngpus) = common::gpus_or_skip("ll_exchange") else {
        println!(
            "(the bare exchange runs only on GPUs; its CPU form is tested in the device crate)"
        );
        return;
    };
    let largest = *SIZES.iter().max().unwrap();
    // rows[size index] = (all-reduce us, bare us) per round, max over ranks.
    let times: Mutex<Vec<[Vec<f64>; 2]>> =
        Mutex::new(SIZES.iter().map(|_| [Vec::new(), Vec::new()]).collect());
    common::two_ranks(|rank, id, sync| {
        let (comm, gpu) = common::communicator(rank, id, ngpus);
        let coll = Collectives::new(comm, CollConfig::default())
            .unwrap_or_else(|e| panic!("rank {rank}: Collectives::new: {e}"));
        let r = Rank {
            stream: gpu.new_stream().unwrap(),
            send: DeviceBuffer::zeroed(&gpu, largest).unwrap(),
            recv: DeviceBuffer::zeroed(&gpu, largest).unwrap(),
            coll,
        };
        for (s, &bytes) in SIZES.iter().enumerate() {
            r.check(Kind::AllReduce, bytes, sync);
            r.check(Kind::Bare, bytes, sync);
            for round in 0..ROUNDS {
                // Which goes first alternates, so that neither always follows the other.
                let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                for k in order {
                    let kind = [Kind::AllReduce, Kind::Bare][k];
                    let us = r.time(kind, bytes, sync);
                    if rank == 0 {
                        times.lock().unwrap()[s][k].push(us);
                    }
                    sync.wait();
                    if rank == 1 {
                        let mut t = times.lock().unwrap();
                        let last = t[s][k].last_mut().expect("rank 0 pushed its time");
                        *last = last.max(us);
                    }
                    sync.wait();
                }
            }
        }
        r.coll.communicator().bootstrap().barrier().unwrap();
    });
    let t = times.into_inner().unwrap();
    println!(
        "# all-reduce (one-shot, f32 sum) vs the bare LL exchange, {CALLS} calls per CUDA graph, \
         {REPLAYS} replays, median of {ROUNDS} rounds, max over 2 ranks on {ngpus} GPU(s)"
    );
    println!(
        "{:>8} {:>14} {:>12} {:>10}",
        "bytes", "all-reduce us", "bare LL us", "ratio"
    );
    let mut rows = Vec::new();
    for (s, &bytes) in SIZES.iter().enumerate() {
        let ar = median(t[s][0].clone());
        let bare = median(t[s][1].clone());
        println!("{bytes:>8} {ar:>14.2} {bare:>12.2} {:>10.3}", ar / bare);
        rows.push(format!(
            "{{\"bytes\":{bytes},\"all_reduce_us\":{ar:.3},\"bare_ll_us\":{bare:.3},\"ratio\":{:.4}}}",
            ar / bare
        ));
    }
    println!(
        "{{\"bench\":\"ll_exchange\",\"gpus\":{ngpus},\"calls_per_graph\":{CALLS},\"replays\":{REPLAYS},\"rounds\":{ROUNDS},\"rows\":[{}]}}",
        rows.join(",")
    );
}
