use super::*;

#[test]
fn select_ptx_takes_the_newest_arch_the_device_runs() {
    let ptx = [(80, "a"), (90, "b")];
    assert_eq!(select_ptx(&ptx, 90), Some((90, "b")));
    assert_eq!(select_ptx(&ptx, 100), Some((90, "b")));
    assert_eq!(select_ptx(&ptx, 89), Some((80, "a")));
    assert_eq!(select_ptx(&ptx, 75), None);
    assert_eq!(select_ptx(&[], 90), None);
}

#[test]
fn select_cubin_takes_machine_code_of_the_device_major_version_only() {
    let cubin: [(u32, &[u8]); 3] = [(80, b"a"), (86, b"b"), (90, b"c")];
    assert_eq!(select_cubin(&cubin, 90), Some((90, &b"c"[..])));
    // sm_90 machine code does not run on sm_100, nor sm_86 code on sm_80.
    assert_eq!(select_cubin(&cubin, 100), None);
    assert_eq!(select_cubin(&cubin, 89), Some((86, &b"b"[..])));
    assert_eq!(select_cubin(&cubin, 80), Some((80, &b"a"[..])));
    assert_eq!(select_cubin(&cubin, 75), None);
    assert_eq!(select_cubin(&[], 90), None);
}

#[test]
fn only_image_errors_send_a_refused_cubin_to_the_ptx() {
    use cudarc::driver::sys::CUresult as R;
    for code in [R::CUDA_ERROR_NO_BINARY_FOR_GPU, R::CUDA_ERROR_INVALID_IMAGE] {
        assert!(is_image_error(code), "{code:?}");
    }
    // Compiling the PTX would not help these: they are returned as they are.
    for code in [
        R::CUDA_ERROR_OUT_OF_MEMORY,
        R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
        R::CUDA_ERROR_LAUNCH_FAILED,
    ] {
        assert!(!is_image_error(code), "{code:?}");
    }
}

#[test]
fn kernel_image_env_values_are_read_or_refused_by_name() {
    let read = |v: &str| {
        crate::settings::Settings::from_vars([(KERNEL_IMAGE_ENV, v)]).map(|s| s.kernel_image)
    };
    assert_eq!(read(" ").unwrap(), ImagePolicy::Auto);
    assert_eq!(read("auto").unwrap(), ImagePolicy::Auto);
    assert_eq!(read("ptx").unwrap(), ImagePolicy::Ptx);
    assert_eq!(read(" cubin").unwrap(), ImagePolicy::Cubin);
    for bad in ["sass", "1"] {
        let e = read(bad).unwrap_err().to_string();
        assert!(
            e.contains(KERNEL_IMAGE_ENV) && e.contains(&format!("{bad:?}")),
            "{e}"
        );
    }
}

#[test]
fn builtin_ptx_is_embedded_for_sm90() {
    assert!(
        crate::ptx::PTX
            .iter()
            .any(|(cc, text)| *cc == 90 && text.contains(".target sm_90")),
        "embedded arches: {:?}",
        crate::ptx::PTX.iter().map(|(c, _)| c).collect::<Vec<_>>()
    );
}

#[test]
fn no_driver_or_no_gpu_is_a_typed_error_not_a_panic() {
    match device_count() {
        Ok(n) => {
            assert!(driver_present());
            if n == 0 {
                assert!(matches!(Gpu::open(0), Err(CudaError::NoGpu(_))));
            } else {
                let e = Gpu::open(n).unwrap_err();
                assert!(
                    matches!(e, CudaError::NoSuchGpu { ordinal, count } if ordinal == n && count == n),
                    "{e}"
                );
            }
        }
        Err(e) => {
            assert!(!driver_present(), "driver present but count failed: {e}");
            assert!(matches!(e, CudaError::NoDriver));
            assert!(e.to_string().contains("no CUDA driver"), "{e}");
            assert!(matches!(Gpu::open(0), Err(CudaError::NoDriver)));
            assert!(matches!(list_gpus(), Err(CudaError::NoDriver)));
        }
    }
}

#[test]
fn driver_errors_carry_the_call_and_the_status_name() {
    use cudarc::driver::sys::CUresult;
    let e = check("cuMemAlloc", CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap_err();
    let s = e.to_string();
    assert!(s.starts_with("cuMemAlloc failed:"), "{s}");
    assert!(matches!(
        e,
        CudaError::Driver {
            code: CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            ..
        }
    ));
    assert!(check("cuMemAlloc", CUresult::CUDA_SUCCESS).is_ok());
}

#[test]
fn missing_ptx_arch_error_says_how_to_rebuild() {
    let e = CudaError::NoPtxForArch {
        major: 7,
        minor: 5,
        built: vec![90],
    };
    assert!(
        e.to_string().contains("MSCCLPP_PTX_ARCHES including sm_75"),
        "{e}"
    );
}

#[test]
fn shared_streams_are_one_per_role_and_context_while_held() {
    use std::sync::Arc;
    let Some(gpu) = crate::testing::gpu_or_skip("shared_streams_are_one_per_role", 0) else {
        return;
    };
    let a = gpu.shared_stream(StreamRole::StageIn).unwrap();
    // Another handle of the same device (another primary-context retain) gets the same one.
    let again = Gpu::open(0).unwrap();
    let b = again.shared_stream(StreamRole::StageIn).unwrap();
    assert!(
        Arc::ptr_eq(&a, &b),
        "the same role on one context shares its stream"
    );
    let out = gpu.shared_stream(StreamRole::StageOut).unwrap();
    assert!(!Arc::ptr_eq(&a, &out), "each role has a stream of its own");
    drop((a, b));
    // Nobody holds it any more: the next caller gets a new stream (not a dangling one).
    let c = gpu.shared_stream(StreamRole::StageIn).unwrap();
    c.synchronize().unwrap();
    assert_eq!(
        Arc::strong_count(&c),
        1,
        "the registry holds only a weak reference"
    );
}
