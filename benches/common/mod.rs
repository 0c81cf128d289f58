//! Shared by the GPU channel benches: two ranks as threads of this process (GPU 0 and 1, or
//! both on GPU 0), CUDA-event timing.

#![allow(dead_code)] // each bench uses part of this module

use std::sync::Barrier;
use std::time::Duration;

use mscclpp::host::bootstrap::{BlockingBootstrap, UniqueId, create_unique_id};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::cuda::{self, Gpu, LaunchConfig};

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
