//! Shared by the GPU channel benches: two ranks as threads of this process (GPU 0 and 1, or
//! both on GPU 0), CUDA-event timing.

#![allow(dead_code)] // each bench uses part of this module

use std::sync::Barrier;
use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::{BlockingBootstrap, UniqueId, create_unique_id};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator, DevConnArg};
use mscclpp::host::cuda::{self, DeviceBuffer, Gpu, KernelModule, LaunchConfig, PushKernelArg};
use mscclpp::host::smoke;

/// Milliseconds between two events recorded around `f` on `stream`.
pub fn events_ms(stream: &cuda::CudaStream, f: impl FnOnce()) -> f64 {
    let ctx = stream.context();
    let timing = Some(cuda::CUevent_flags::CU_EVENT_DEFAULT);
    let a = ctx.new_event(timing).unwrap();
    let b = ctx.new_event(timing).unwrap();
    a.record(stream).unwrap();
    f();
    b.record(stream).unwrap();
    b.synchronize().unwrap();
    a.elapsed_ms(&b).unwrap() as f64
}

/// A launch of `blocks` × `threads`.
pub fn grid(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The number of GPUs, or the reason to skip.
pub fn gpus_or_skip(bench: &str) -> Option<usize> {
    match cuda::device_count() {
        Ok(n) if n > 0 => Some(n),
        Ok(_) => {
            println!("{bench} bench skipped: no GPU");
            None
        }
        Err(e) => {
            println!("{bench} bench skipped: {e}");
            None
        }
    }
}

/// A GPU communicator for `rank` of 2 on GPU `rank % ngpus`.
pub fn communicator(rank: usize, id: UniqueId, ngpus: usize) -> (Communicator, Gpu) {
    let bs = BlockingBootstrap::init(2, rank, id).unwrap();
    let gpu = Gpu::open(rank % ngpus).unwrap();
    let config = CommConfig {
        device_timeout: Duration::from_secs(60),
        ..CommConfig::default()
    };
    let comm = Communicator::from_bootstrap(bs, Backend::Gpu(gpu.clone()), config).unwrap();
    (comm, gpu)
}

/// Runs `body(rank, id, barrier)` on two threads and returns their results in rank order.
pub fn two_ranks<T: Send>(body: impl Fn(usize, UniqueId, &Barrier) -> T + Sync) -> Vec<T> {
    let id = create_unique_id().unwrap();
    let sync = Barrier::new(2);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (body, sync) = (&body, &sync);
                s.spawn(move || body(rank, id, sync))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The reference for round trips: the GPU<->host flag ping-pong of `ordering_probe` on GPU 0
/// (one word per round, 5000 rounds), in microseconds per round trip.
pub fn host_flag_round_trip_us() -> f64 {
    let gpu = Gpu::open(0).unwrap();
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let rounds = 5000;
    let t = Instant::now();
    smoke::ordering_probe(
        smoke::Backend::Gpu(&gpu, &module),
        1,
        rounds,
        3,
        Duration::from_secs(10),
    )
    .unwrap();
    t.elapsed().as_secs_f64() * 1e6 / rounds as f64
}

/// One launch of `proxy_ping_pong` (one thread) over `conn`: `rounds` rounds of `words`
/// words, after a thread barrier with the peer; milliseconds on a new stream of `gpu`.
/// Panics if the receiving kernel saw wrong data.
#[allow(clippy::too_many_arguments)]
pub fn ping_pong_ms(
    module: &KernelModule,
    gpu: &Gpu,
    conn: &DevConnArg<'_>,
    buf: u64,
    rank: usize,
    words: usize,
    rounds: u64,
    sync: &Barrier,
) -> f64 {
    let f = module.function("proxy_ping_pong").unwrap();
    let stream = gpu.new_stream().unwrap();
    let errors = DeviceBuffer::zeroed(gpu, 8).unwrap();
    let (rank32, seed, perr) = (rank as u32, 1u64, errors.device_ptr());
    sync.wait();
    let ms = events_ms(&stream, || {
        let mut l = stream.launch_builder(&f);
        l.arg(conn)
            .arg(&buf)
            .arg(&words)
            .arg(&rounds)
            .arg(&rank32)
            .arg(&seed)
            .arg(&perr);
        // SAFETY: the connection and buffers belong to the caller's communicator, which
        // outlives the event synchronize.
        unsafe { l.launch(grid(1, 1)) }.unwrap();
    });
    let mut bad = [0u64];
    errors.copy_to_host(0, &mut bad).unwrap();
    assert_eq!(bad[0], 0, "ping-pong data corrupted");
    ms
}
