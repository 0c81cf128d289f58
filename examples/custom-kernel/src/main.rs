//! Runs the example's own `saxpy` kernel: on GPU 0 from the PTX its build.rs made, or, without
//! a GPU, on CPU threads. Checks every element.
//!
//! `cargo run -p custom-kernel-example`

use mscclpp::device::arch::{self, Dim3};
use mscclpp::host::cuda::{self, DeviceBuffer, Gpu, KernelModule, LaunchConfig, PushKernelArg};

mod ptx {
    include!(concat!(env!("OUT_DIR"), "/kernels_ptx.rs"));
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = 1_000_003usize;
    let a = 2.5f32;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.25).collect();
    let y0: Vec<f32> = (0..n).map(|i| (i % 77) as f32 - 30.0).collect();
    let mut y = y0.clone();
    match Gpu::open(0) {
        Ok(gpu) => {
            let module = KernelModule::load_images(&gpu, ptx::PTX, ptx::CUBIN)?;
            println!(
                "{}: running saxpy from {:?} sm_{}",
                gpu.info().name,
                module.image(),
                module.arch()
            );
            let dx = DeviceBuffer::alloc(&gpu, n * 4)?;
            let dy = DeviceBuffer::alloc(&gpu, n * 4)?;
            dx.copy_from_host(0, &x)?;
            dy.copy_from_host(0, &y)?;
            let f = module.function("saxpy")?;
            let stream = gpu.new_stream()?;
            let (px, py) = (dx.device_ptr(), dy.device_ptr());
            let mut launch = stream.launch_builder(&f);
            launch.arg(&a).arg(&px).arg(&py).arg(&n);
            // SAFETY: dx and dy hold n f32 each and live past the synchronize.
            unsafe { launch.launch(LaunchConfig::for_num_elems(n as u32)) }?;
            stream.synchronize()?;
            dy.copy_to_host(0, &mut y)?;
        }
        Err(e @ (cuda::CudaError::NoDriver | cuda::CudaError::NoGpu(_))) => {
            println!("no GPU ({e}): running saxpy on CPU threads");
            let (px, py) = (x.as_ptr() as usize, y.as_mut_ptr() as usize);
            arch::launch(Dim3::x(8), Dim3::x(64), || {
                // SAFETY: x and y hold n elements and outlive the launch.
                unsafe { custom_kernels::saxpy(a, px as *const f32, py as *mut f32, n) }
            })?;
        }
        Err(e) => return Err(e.into()),
    }
    for i in 0..n {
        let want = a * x[i] + y0[i];
        // The GPU may fuse the multiply-add (one rounding instead of two).
        if (y[i] - want).abs() > 1e-3 * want.abs().max(1.0) {
            return Err(format!("saxpy: y[{i}] = {}, expected {want}", y[i]).into());
        }
    }
    println!("saxpy: all {n} elements correct");
    Ok(())
}
