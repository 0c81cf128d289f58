//! Trigger FIFO round trips, each against a reference measured in the same run:
//!
//! - CPU: a producer thread pushes a trigger and syncs on it while a consumer thread polls
//!   and pops: push → pop → tail → sync, against a plain `AtomicU64` ping-pong between
//!   the same two threads (the floor for any handshake through shared memory).
//! - GPU (skipped, with the reason printed, without one): one GPU thread pushes and syncs
//!   while this thread pops, against the `ordering_probe` flag ping-pong between a GPU
//!   thread and the host through the same kind of mapped memory. Both include one kernel
//!   launch per sample (and the probe its setup), amortised over thousands of round trips.
//! - GPU, streaming (push → pop): one GPU thread pushes back to back without waiting, this
//!   thread pops; the time per trigger is the FIFO's push → pop throughput (MSCCL++'s
//!   `fifo_test` measures the same). Printed next to the round trip above.
//!
//! `cargo bench --bench fifo`; the ratios are printed at the end.

use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use mscclpp::host::cuda::{Gpu, KernelModule};
use mscclpp::host::proxy::fifo_check::{PushTest, run_push_test};
use mscclpp::host::proxy::{Fifo, FifoConfig, Trigger, TriggerOp};
use mscclpp::host::smoke::{self, Backend};

/// Total time and iterations of every timed run of one benchmark.
#[derive(Default)]
struct Tally(Mutex<(Duration, u64)>);

impl Tally {
    fn add(&self, d: Duration, iters: u64) -> Duration {
        let mut t = self.0.lock().unwrap();
        t.0 += d;
        t.1 += iters;
        d
    }
    fn mean_ns(&self) -> f64 {
        let t = self.0.lock().unwrap();
        t.0.as_nanos() as f64 / t.1.max(1) as f64
    }
}

fn report(what: &str, ours: &Tally, reference: &Tally, reference_name: &str) {
    let (a, b) = (ours.mean_ns(), reference.mean_ns());
    println!(
        "{what}: FIFO round trip {a:.0} ns, {reference_name} {b:.0} ns, ratio {:.2}",
        a / b
    );
}

fn cpu(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    let (fifo_tally, ping_tally) = (Tally::default(), Tally::default());

    let fifo = Fifo::new_host(FifoConfig::with_slots(512)).expect("host FIFO");
    let handle = fifo.device_handle();
    let mut consumer = fifo.consumer().expect("the FIFO's consumer");
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let consumer = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if consumer.poll().is_some() {
                    consumer.pop().expect("polled trigger pops");
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let t = Trigger::new(TriggerOp::DATA | TriggerOp::SYNC, 1, 4096, 0, 256).unwrap();
        group.bench_function("fifo_push_sync_round_trip", |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    // SAFETY: `fifo` outlives the scope; its consumer runs until `stop`.
                    unsafe { handle.sync(handle.push(black_box(t))) };
                }
                fifo_tally.add(start.elapsed(), iters)
            })
        });
        stop.store(true, Ordering::Relaxed);
        consumer.join().unwrap();
    });

    let (ping, pong) = (AtomicU64::new(0), AtomicU64::new(0));
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                let v = ping.load(Ordering::Acquire);
                if v != last {
                    last = v;
                    pong.store(v, Ordering::Release);
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0u64;
        group.bench_function("reference_atomic_ping_pong", |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    next += 1;
                    ping.store(next, Ordering::Release);
                    while pong.load(Ordering::Acquire) != next {
                        std::hint::spin_loop();
                    }
                }
                ping_tally.add(start.elapsed(), iters)
            })
        });
        stop.store(true, Ordering::Relaxed);
    });
    group.finish();
    report("cpu", &fifo_tally, &ping_tally, "AtomicU64 ping-pong");
}

fn gpu(c: &mut Criterion) {
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) => {
            println!("skipping the GPU FIFO benchmark: {e}");
            return;
        }
    };
    let module = KernelModule::load_builtin(&gpu).expect("load PTX");
    let fifo = Fifo::new_gpu(&gpu, FifoConfig::with_slots(512)).expect("GPU FIFO");
    let (fifo_tally, probe_tally, stream_tally) =
        (Tally::default(), Tally::default(), Tally::default());
    let mut group = c.benchmark_group("gpu");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10);
    // One GPU thread pushing: syncing on each push (the round trip), or not (streaming).
    for (name, sync_each, tally) in [
        ("fifo_gpu_push_host_pop_round_trip", true, &fifo_tally),
        ("fifo_gpu_push_host_pop_stream", false, &stream_tally),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let test = PushTest {
                    blocks: 1,
                    threads: 1,
                    pushes: iters as u32,
                    sync_each,
                    timeout: Duration::from_secs(120),
                };
                let r = run_push_test(Backend::Gpu(&gpu, &module), &fifo, &test)
                    .expect("GPU push test");
                tally.add(r.elapsed, iters)
            })
        });
    }
    group.bench_function("reference_ordering_probe_ping_pong", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            smoke::ordering_probe(
                Backend::Gpu(&gpu, &module),
                1,
                iters,
                7,
                Duration::from_secs(60),
            )
            .expect("ordering probe");
            probe_tally.add(start.elapsed(), iters)
        })
    });
    group.finish();
    report("gpu", &fifo_tally, &probe_tally, "GPU-host flag ping-pong");
    println!(
        "gpu: FIFO push -> pop streaming {:.0} ns per trigger (one GPU thread, no sync), \
         {:.2}x the round trip",
        stream_tally.mean_ns(),
        stream_tally.mean_ns() / fifo_tally.mean_ns()
    );
}

criterion_group!(benches, cpu, gpu);
criterion_main!(benches);
