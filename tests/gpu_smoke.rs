//! The smoke kernels on a real GPU: every element checked against a CPU reference.
//! Skips with a reason without a GPU; fails instead under MSCCLPP_REQUIRE_GPU=1.

use std::time::Duration;

use mscclpp::host::cuda::{DeviceBuffer, KernelModule, MappedHostBuffer};
use mscclpp::host::smoke::{self, Backend, ProbeReport};
use mscclpp::host::testing::gpu_or_skip;

#[test]
fn vector_add_on_random_data_of_many_sizes() {
    let Some(gpu) = gpu_or_skip("vector_add_on_random_data_of_many_sizes", 0) else {
        return;
    };
    let module = KernelModule::load_builtin(&gpu).unwrap();
    for (seed, n) in [1usize, 31, 256, 257, 65_537, (1 << 22) + 3]
        .into_iter()
        .enumerate()
    {
        smoke::vector_add(Backend::Gpu(&gpu, &module), n, seed as u64 + 100).unwrap();
    }
}

#[test]
fn ordering_probe_gpu_release_is_seen_by_host_acquire() {
    let Some(gpu) = gpu_or_skip("ordering_probe_gpu_release_is_seen_by_host_acquire", 0) else {
        return;
    };
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let r = smoke::ordering_probe(
        Backend::Gpu(&gpu, &module),
        1 << 16,
        2000,
        77,
        Duration::from_secs(20),
    )
    .unwrap();
    assert_eq!(
        r,
        ProbeReport {
            rounds: 2000,
            elements: 1 << 16
        }
    );
}

#[test]
fn arch_primitives_give_the_expected_words_on_gpu() {
    let Some(gpu) = gpu_or_skip("arch_primitives_give_the_expected_words_on_gpu", 0) else {
        return;
    };
    let module = KernelModule::load_builtin(&gpu).unwrap();
    assert_eq!(
        module.arch(),
        90.min(gpu.info().compute_capability.0 * 10 + gpu.info().compute_capability.1)
    );
    for threads in [1, 32, 1024] {
        smoke::arch_check(
            Backend::Gpu(&gpu, &module),
            threads,
            0xabcdef + threads as u64,
        )
        .unwrap();
    }
}

#[test]
fn buffers_validate_ranges_and_export_ipc_handles() {
    let Some(gpu) = gpu_or_skip("buffers_validate_ranges_and_export_ipc_handles", 0) else {
        return;
    };
    let buf = DeviceBuffer::zeroed(&gpu, 4096).unwrap();
    let mut back = [1u8; 4096];
    buf.copy_to_host(0, &mut back).unwrap();
    assert!(back.iter().all(|b| *b == 0));
    let data: Vec<u32> = (0..1024).map(|i| i * 3 + 1).collect();
    buf.copy_from_host(0, &data).unwrap();
    let mut got = vec![0u32; 1024];
    buf.copy_to_host(0, &mut got).unwrap();
    assert_eq!(got, data);
    let e = buf.copy_from_host(4000, &data).unwrap_err();
    assert!(
        e.to_string().contains("beyond the buffer of 4096 bytes"),
        "{e}"
    );
    assert!(DeviceBuffer::alloc(&gpu, 0).is_err());
    let h = buf.ipc_handle().unwrap();
    assert_eq!(h.len, 4096);
    assert!(h.bytes.iter().any(|b| *b != 0));
    let host = MappedHostBuffer::alloc(&gpu, 64).unwrap();
    assert_ne!(host.device_ptr(), 0);
    assert!(MappedHostBuffer::alloc(&gpu, 0).is_err());
    let e = module_function_error(&gpu);
    assert!(e.contains("no kernel named `no_such_kernel`"), "{e}");
}

fn module_function_error(gpu: &mscclpp::host::cuda::Gpu) -> String {
    let module = KernelModule::load_builtin(gpu).unwrap();
    module.function("no_such_kernel").unwrap_err().to_string()
}
