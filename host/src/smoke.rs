//! Smoke kernels that prove the pipeline end to end, on a GPU or on CPU threads: each
//! function generates random inputs, runs the kernel, and checks every element against a
//! CPU reference, returning an error that names the first wrong element.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_device::arch::{self, Dim3};
use mscclpp_device::kernels::arch_check::{self, slot};
use mscclpp_device::kernels::smoke::{self, PROBE_DONE, ProbeControl, probe_value};

use crate::cuda::{
    CudaError, DeviceBuffer, Gpu, KernelModule, LaunchConfig, MappedHostBuffer, PushKernelArg,
};

/// Where the smoke kernels run.
#[derive(Debug, Clone, Copy)]
pub enum Backend<'a> {
    /// On this GPU, with our embedded PTX loaded into `module`.
    Gpu(&'a Gpu, &'a KernelModule),
    /// On CPU threads through [`arch::launch`].
    Host,
}

/// Why a smoke kernel failed.
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The CPU-thread launch failed.
    #[error(transparent)]
    HostLaunch(#[from] arch::LaunchError),
    /// An element differs from the CPU reference.
    #[error("{kernel}: element {index} is {found:#x}, expected {expected:#x}{context}")]
    Mismatch {
        /// The kernel.
        kernel: &'static str,
        /// The first wrong index.
        index: usize,
        /// The reference value (bits).
        expected: u64,
        /// What the kernel produced (bits).
        found: u64,
        /// E.g. the round of the probe.
        context: String,
    },
    /// The kernel did not publish in time.
    #[error("{0}")]
    Timeout(String),
}

/// Deterministic pseudo-random f32 in [-100, 100) from `seed` and `i`.
pub fn random_f32(seed: u64, i: u64) -> f32 {
    let v = probe_value(seed, 0x5eed, i);
    ((v >> 40) as f32 / (1u64 << 24) as f32) * 200.0 - 100.0
}

fn grid_for(n: usize, threads: u32) -> u32 {
    (n.div_ceil(threads as usize)).clamp(1, 1024) as u32
}

/// `out = a + b` on `n` random f32; checks every element bit for bit (one IEEE addition
/// rounds the same on both sides).
pub fn vector_add(backend: Backend<'_>, n: usize, seed: u64) -> Result<(), SmokeError> {
    let a: Vec<f32> = (0..n as u64).map(|i| random_f32(seed, i)).collect();
    let b: Vec<f32> = (0..n as u64).map(|i| random_f32(seed ^ 1, i)).collect();
    let mut out = vec![f32::NAN; n];
    match backend {
        Backend::Gpu(gpu, module) => {
            let bytes = (n * 4).max(4);
            let (da, db, dout) = (
                DeviceBuffer::alloc(gpu, bytes)?,
                DeviceBuffer::alloc(gpu, bytes)?,
                DeviceBuffer::alloc(gpu, bytes)?,
            );
            da.copy_from_host(0, &a)?;
            db.copy_from_host(0, &b)?;
            let f = module.function("vector_add_f32")?;
            let stream = gpu.new_stream()?;
            let cfg = LaunchConfig {
                grid_dim: (grid_for(n, 256), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let (pa, pb, po) = (da.device_ptr(), db.device_ptr(), dout.device_ptr());
            let mut l = stream.launch_builder(&f);
            l.arg(&pa).arg(&pb).arg(&po).arg(&n);
            // SAFETY: the three buffers hold at least n f32 and outlive the synchronize below.
            unsafe { l.launch(cfg) }.map_err(|e| CudaError::driver("cuLaunchKernel", e))?;
            stream
                .synchronize()
                .map_err(|e| CudaError::driver("cuStreamSynchronize", e))?;
            dout.copy_to_host(0, &mut out)?;
        }
        Backend::Host => {
            let (pa, pb, po) = (
                a.as_ptr() as usize,
                b.as_ptr() as usize,
                out.as_mut_ptr() as usize,
            );
            arch::launch(Dim3::x(grid_for(n, 64).min(4)), Dim3::x(64), || {
                // SAFETY: the buffers hold n elements and outlive the launch.
                unsafe {
                    smoke::vector_add_f32(pa as *const f32, pb as *const f32, po as *mut f32, n)
                }
            })?;
        }
    }
    for i in 0..n {
        let want = a[i] + b[i];
        if out[i].to_bits() != want.to_bits() {
            return Err(SmokeError::Mismatch {
                kernel: "vector_add_f32",
                index: i,
                expected: want.to_bits() as u64,
                found: out[i].to_bits() as u64,
                context: format!(" (n = {n})"),
            });
        }
    }
    Ok(())
}

/// What [`ordering_probe`] observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeReport {
    /// Rounds published by the kernel and checked in full by the host.
    pub rounds: u64,
    /// Elements checked per round.
    pub elements: usize,
}

/// The memory-ordering probe: the kernel writes `n` words of host-mapped memory then
/// publishes a round number with a release store; the host acquires the flag, checks every
/// word, acknowledges, for `rounds` rounds. `timeout` bounds each wait on both sides.
pub fn ordering_probe(
    backend: Backend<'_>,
    n: usize,
    rounds: u64,
    seed: u64,
    timeout: Duration,
) -> Result<ProbeReport, SmokeError> {
    let timeout_ns = timeout.as_nanos().min(u64::MAX as u128) as u64;
    match backend {
        Backend::Gpu(gpu, module) => {
            let data = MappedHostBuffer::alloc(gpu, (n * 8).max(8))?;
            let ctl = MappedHostBuffer::alloc(gpu, std::mem::size_of::<ProbeControl>())?;
            let f = module.function("ordering_probe")?;
            let stream = gpu.new_stream()?;
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let (pd, pc) = (data.device_ptr(), ctl.device_ptr());
            let mut l = stream.launch_builder(&f);
            l.arg(&pd)
                .arg(&n)
                .arg(&pc)
                .arg(&rounds)
                .arg(&seed)
                .arg(&timeout_ns);
            // SAFETY: data holds n words and ctl one ProbeControl; both outlive the
            // synchronize below.
            unsafe { l.launch(cfg) }.map_err(|e| CudaError::driver("cuLaunchKernel", e))?;
            let checked = check_probe_rounds(
                data.host_ptr() as *const u64,
                ctl.host_ptr() as *mut ProbeControl,
                n,
                rounds,
                seed,
                timeout,
            );
            stream
                .synchronize()
                .map_err(|e| CudaError::driver("cuStreamSynchronize", e))?;
            let report = checked?;
            // SAFETY: the kernel has finished; ctl is live.
            let status = unsafe { (*(ctl.host_ptr() as *const ProbeControl)).status };
            probe_status(status)?;
            Ok(report)
        }
        Backend::Host => {
            let mut data = vec![0u64; n.max(1)];
            let mut ctl = ProbeControl::default();
            let (pd, pc) = (data.as_mut_ptr() as usize, &raw mut ctl as usize);
            let (launched, checked) = std::thread::scope(|s| {
                let k = s.spawn(|| {
                    arch::launch(Dim3::x(1), Dim3::x(8), || {
                        // SAFETY: data and ctl outlive the launch.
                        unsafe {
                            smoke::ordering_probe(
                                pd as *mut u64,
                                n,
                                pc as *mut ProbeControl,
                                rounds,
                                seed,
                                timeout_ns,
                            )
                        }
                    })
                });
                let checked = check_probe_rounds(
                    pd as *const u64,
                    pc as *mut ProbeControl,
                    n,
                    rounds,
                    seed,
                    timeout,
                );
                (k.join(), checked)
            });
            match launched {
                Ok(r) => r?,
                Err(_) => return Err(SmokeError::Timeout("host probe thread panicked".into())),
            }
            let report = checked?;
            probe_status(ctl.status)?;
            Ok(report)
        }
    }
}

fn probe_status(status: u64) -> Result<(), SmokeError> {
    if status == PROBE_DONE {
        Ok(())
    } else {
        Err(SmokeError::Timeout(format!(
            "ordering_probe: kernel ended with status {status} (expected {PROBE_DONE}: done)"
        )))
    }
}

/// The host side of the probe. On any failure it acknowledges every round so the kernel
/// exits at once.
fn check_probe_rounds(
    data: *const u64,
    ctl: *mut ProbeControl,
    n: usize,
    rounds: u64,
    seed: u64,
    timeout: Duration,
) -> Result<ProbeReport, SmokeError> {
    // SAFETY: ctl points to a live, 8-aligned ProbeControl shared with the kernel, whose
    // words both sides access only atomically.
    let (flag, ack) = unsafe {
        (
            AtomicU64::from_ptr(&raw mut (*ctl).flag),
            AtomicU64::from_ptr(&raw mut (*ctl).ack),
        )
    };
    let release_kernel = || ack.store(u64::MAX, Ordering::Release);
    for r in 1..=rounds {
        let start = Instant::now();
        while flag.load(Ordering::Acquire) < r {
            if start.elapsed() > timeout {
                release_kernel();
                return Err(SmokeError::Timeout(format!(
                    "ordering_probe: round {r} not published within {timeout:?}"
                )));
            }
            std::hint::spin_loop();
        }
        for i in 0..n {
            // SAFETY: i < n; the kernel does not write again before our acknowledgement.
            let got = unsafe { data.add(i).read_volatile() };
            let want = probe_value(seed, r, i as u64);
            if got != want {
                release_kernel();
                return Err(SmokeError::Mismatch {
                    kernel: "ordering_probe",
                    index: i,
                    expected: want,
                    found: got,
                    context: format!(" in round {r} after acquiring the flag"),
                });
            }
        }
        ack.store(r, Ordering::Release);
    }
    Ok(ProbeReport {
        rounds,
        elements: n,
    })
}

/// Runs [`arch_check::arch_check`] with one block of `threads` and verifies every word.
pub fn arch_check(backend: Backend<'_>, threads: u32, input: u64) -> Result<(), SmokeError> {
    #[repr(C, align(16))]
    struct Words([u64; slot::COUNT]);
    let mut w = Words([0; slot::COUNT]);
    match backend {
        Backend::Gpu(gpu, module) => {
            let buf = DeviceBuffer::zeroed(gpu, slot::COUNT * 8)?;
            let f = module.function("arch_check")?;
            let stream = gpu.new_stream()?;
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            let p = buf.device_ptr();
            let mut l = stream.launch_builder(&f);
            l.arg(&p).arg(&input);
            // SAFETY: buf holds COUNT zeroed words (cuMemAlloc is 256-byte aligned) and
            // outlives the synchronize below.
            unsafe { l.launch(cfg) }.map_err(|e| CudaError::driver("cuLaunchKernel", e))?;
            stream
                .synchronize()
                .map_err(|e| CudaError::driver("cuStreamSynchronize", e))?;
            buf.copy_to_host(0, &mut w.0)?;
        }
        Backend::Host => {
            let p = w.0.as_mut_ptr() as usize;
            arch::launch(Dim3::x(1), Dim3::x(threads), || {
                // SAFETY: w is COUNT aligned zeroed words that outlive the launch.
                unsafe { arch_check::arch_check(p as *mut u64, input) }
            })?;
        }
    }
    arch_check::verify(&w.0, threads as u64, input).map_err(|(index, expected, found)| {
        SmokeError::Mismatch {
            kernel: "arch_check",
            index,
            expected,
            found,
            context: format!(" ({threads} threads)"),
        }
    })
}

#[cfg(test)]
mod tests;
