//! Embedding the all-reduce in a program: one process per GPU (this example starts them
//! itself when run alone, or runs under mpirun/torchrun/srun), a [`Collectives`] per rank,
//! then `all_reduce` on cudarc slices in a loop, timed with CUDA events. Without a GPU it
//! runs on the Host transport (CPU threads) and says so.
//!
//! ```text
//! cargo run --release --example all_reduce -- [--graph] [bytes ...]
//! ```

use mscclpp::host::collectives::{Exec, RawBuffer};
use std::time::{Duration, Instant};

use mscclpp::host::collectives::{CollConfig, Collectives, DataType, ReduceOp};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::cuda::{CudaSlice, device_count};
use mscclpp::host::launch::{Launch, LocalLauncher};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("MSCCLPP_RANK").is_none() && Launch::from_env().is_err() {
        // Started alone: one process per local GPU (two on the Host transport).
        let n = match device_count() {
            Ok(g) if g > 0 => g,
            _ => 2,
        };
        let report = LocalLauncher::current_exe(n)?
            .timeout(Duration::from_secs(600))
            .run()?;
        if !report.success() {
            return Err(format!("ranks failed: {report}").into());
        }
        return Ok(());
    }
    let launch = Launch::from_env()?;
    let bs = launch.blocking_bootstrap()?;
    let backend = Backend::auto(bs.local_rank())?;
    let comm = Communicator::from_bootstrap(bs, backend.clone(), CommConfig::default())?;
    let coll = Collectives::new(comm, CollConfig::from_env()?)?;
    let (rank, n) = (coll.rank(), coll.nranks());
    let graph = std::env::args().any(|a| a == "--graph");
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![8, 1 << 10, 512 << 10, 2 << 20, 64 << 20]
    } else {
        sizes
    };
    match backend {
        Backend::Gpu(gpu) => {
            let stream = gpu.new_stream()?;
            for bytes in sizes {
                let count = (bytes / 4).max(1);
                let mut buf: CudaSlice<f32> = stream.clone_htod(&vec![1.0f32; count])?;
                let iters = if bytes < 1 << 20 { 200 } else { 20 };
                for _ in 0..5 {
                    coll.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
                }
                let flags = mscclpp::host::cuda::CUevent_flags::CU_EVENT_DEFAULT;
                let (start, end) = (
                    stream.record_event(Some(flags))?,
                    stream.record_event(Some(flags))?,
                );
                if graph {
                    // The same calls captured once into a CUDA graph (raw API: cudarc's typed
                    // slices may add event waits that capture refuses), then replayed.
                    let p = {
                        use cudarc::driver::DevicePtr;
                        buf.device_ptr(&stream).0
                    };
                    stream.begin_capture(
                        cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                    )?;
                    for _ in 0..iters {
                        // SAFETY: buf outlives the graph's launches (synchronised below).
                        unsafe {
                            coll.all_reduce(
                                &RawBuffer::device(p, count, DataType::F32),
                                &mut RawBuffer::device(p, count, DataType::F32),
                                ReduceOp::Sum,
                                &stream,
                            )?
                        };
                    }
                    let g = stream
                        .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)?
                        .ok_or("nothing captured")?;
                    g.launch()?;
                    start.record(&stream)?;
                    g.launch()?;
                    end.record(&stream)?;
                } else {
                    start.record(&stream)?;
                    for _ in 0..iters {
                        coll.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
                    }
                    end.record(&stream)?;
                }
                stream.synchronize()?;
                let us = start.elapsed_ms(&end)? as f64 * 1000.0 / iters as f64;
                let busbw = (count * 4) as f64 * 2.0 * (n - 1) as f64 / n as f64 / us / 1e3;
                if rank == 0 {
                    println!(
                        "all_reduce f32 {:>11} B  {:>9.2} us  busbw {:>7.1} GB/s  ({:?}{})",
                        count * 4,
                        us,
                        busbw,
                        coll.choose_all_reduce(count * 4),
                        if graph { ", graph" } else { "" }
                    );
                }
            }
        }
        Backend::Host => {
            if rank == 0 {
                println!("no GPU: running on the Host transport (CPU threads, shared memory)");
            }
            for bytes in sizes {
                let count = (bytes / 4).max(1);
                let mut buf = vec![1.0f32; count];
                let t = Instant::now();
                coll.all_reduce_in_place(&mut buf, ReduceOp::Sum, Exec::Host)?;
                let want = n as f32;
                if buf.iter().any(|&v| v != want) {
                    return Err(format!("rank {rank}: wrong sum at {bytes} bytes").into());
                }
                if rank == 0 {
                    println!(
                        "all_reduce f32 {:>11} B  {:>9.1} us (host)",
                        count * 4,
                        t.elapsed().as_secs_f64() * 1e6
                    );
                }
            }
        }
    }
    Ok(())
}
