//! The trigger FIFO on a real GPU: threads of many blocks push, this thread pops and checks
//! that every trigger arrives exactly once and intact, for 8 and 512 slots through many
//! laps. Skips with a reason without a GPU; fails instead under MSCCLPP_REQUIRE_GPU=1.
//! The first test needs no GPU: it checks the kernel's PTX.

use std::time::Duration;

use mscclpp::host::cuda::KernelModule;
use mscclpp::host::proxy::fifo_check::{PushTest, run_push_test};
use mscclpp::host::proxy::{Fifo, FifoConfig};
use mscclpp::host::ptx::PTX;
use mscclpp::host::smoke::Backend;
use mscclpp::host::testing::gpu_or_skip;

#[test]
fn fifo_kernel_ptx_uses_the_protocol_instructions() {
    for (cc, ptx) in PTX {
        let start = ptx
            .find(".visible .entry fifo_push_test(")
            .unwrap_or_else(|| panic!("sm_{cc}: no fifo_push_test entry"));
        let rest = &ptx[start + 1..];
        let body = &rest[..rest.find(".visible .entry").unwrap_or(rest.len())];
        for instr in [
            "atom.add.relaxed.gpu.u64",  // the head
            "ld.relaxed.sys.u64",        // the cached tail
            "fence.acq_rel.sys;",        // publishes the kernel's writes with the trigger
            "st.volatile.global.v2.u64", // the one 16-byte trigger store
            "ld.acquire.sys.u64",        // the proxy's tail (sync)
            "%globaltimer",              // every wait times out
        ] {
            assert!(
                body.contains(instr),
                "sm_{cc}: fifo_push_test lacks `{instr}`"
            );
        }
        // The handle is passed by value: one 48-byte parameter.
        assert!(
            body.contains(".param .align 8 .b8 fifo_push_test_param_0[48]"),
            "sm_{cc}: FifoDeviceHandle is not a 48-byte by-value parameter"
        );
        assert!(!body.contains("atom.global"), "sm_{cc}: a plain atomic");
        // The slow path (re-reading the tail when the ring looks full) is its own function.
        assert!(ptx.contains("wait_for_room"), "sm_{cc}: no wait_for_room");
    }
}

fn gpu_run(test_name: &str, slots: usize, test: PushTest, launches: u32) {
    let Some(gpu) = gpu_or_skip(test_name, 0) else {
        return;
    };
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let fifo = Fifo::new_gpu(&gpu, FifoConfig::with_slots(slots)).unwrap();
    // Several launches on one FIFO: the head and tail carry over between kernels (the
    // second run starts mid-lap when the trigger count is not a multiple of the slots).
    for launch in 0..launches as u64 {
        let r = run_push_test(Backend::Gpu(&gpu, &module), &fifo, &test)
            .unwrap_or_else(|e| panic!("{test_name}, launch {launch}: {e}"));
        assert_eq!(r.triggers, test.triggers());
        assert_eq!(fifo.tail(), (launch + 1) * test.triggers());
        eprintln!(
            "{test_name}: {} triggers through {slots} slots in {:?}",
            r.triggers, r.elapsed
        );
    }
    assert_eq!(fifo.consumer().unwrap().poll(), None);
}

#[test]
fn gpu_threads_push_into_eight_slots_through_many_laps() {
    gpu_run(
        "gpu_threads_push_into_eight_slots_through_many_laps",
        8,
        PushTest {
            blocks: 16,
            threads: 128,
            pushes: 15,
            sync_each: false,
            timeout: Duration::from_secs(60),
        },
        2,
    );
}

#[test]
fn gpu_threads_push_into_512_slots_through_many_laps() {
    gpu_run(
        "gpu_threads_push_into_512_slots_through_many_laps",
        512,
        PushTest {
            blocks: 132,
            threads: 256,
            pushes: 8,
            sync_each: false,
            timeout: Duration::from_secs(60),
        },
        2,
    );
}

#[test]
fn gpu_threads_sync_on_each_push() {
    gpu_run(
        "gpu_threads_sync_on_each_push",
        8,
        PushTest {
            blocks: 8,
            threads: 32,
            pushes: 8,
            sync_each: true,
            timeout: Duration::from_secs(60),
        },
        1,
    );
}
