use super::*;
use crate::arch::{Dim3, launch};
use std::vec::Vec;

#[test]
fn vector_add_on_cpu_threads_covers_every_element() {
    for n in [0usize, 1, 7, 100, 1000] {
        let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
        let mut out = std::vec![f32::NAN; n];
        let (pa, pb, po) = (
            a.as_ptr() as usize,
            b.as_ptr() as usize,
            out.as_mut_ptr() as usize,
        );
        launch(Dim3::x(3), Dim3::x(16), || {
            // SAFETY: the three buffers hold n elements and outlive the launch.
            unsafe { vector_add_f32(pa as *const f32, pb as *const f32, po as *mut f32, n) }
        })
        .unwrap();
        for i in 0..n {
            assert_eq!(out[i], a[i] + b[i], "n={n} i={i}");
        }
    }
}

/// Runs the probe for `rounds` with the host acknowledging the first `ack_rounds`; the
/// kernel gives up on a round after `timeout_ns` without an acknowledgement. The host side
/// stops waiting once the kernel has given up (its status), so a kernel that timed out under
/// a loaded machine fails the test instead of hanging it.
fn run_probe(ack_rounds: u64, rounds: u64, timeout_ns: u64) -> (u64, u64) {
    let n = 300;
    let mut data = std::vec![0u64; n];
    let mut ctl = ProbeControl::default();
    let (pd, pc) = (data.as_mut_ptr() as usize, &raw mut ctl as usize);
    let mut checked = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            launch(Dim3::x(1), Dim3::x(8), || {
                // SAFETY: data and ctl outlive the launch.
                unsafe {
                    ordering_probe(
                        pd as *mut u64,
                        n,
                        pc as *mut ProbeControl,
                        rounds,
                        42,
                        timeout_ns,
                    )
                }
            })
            .unwrap();
        });
        let ctl = pc as *mut ProbeControl;
        'rounds: for r in 1..=ack_rounds {
            // SAFETY: ctl is live; its words are accessed atomically by both sides.
            while unsafe { crate::arch::ld_acquire_sys_u64(&raw const (*ctl).flag) } < r {
                // SAFETY: as above.
                if unsafe { crate::arch::ld_acquire_sys_u64(&raw const (*ctl).status) } != 0 {
                    // The kernel gave up (or ended): no flag is coming.
                    break 'rounds;
                }
                std::thread::yield_now();
            }
            for i in 0..n {
                // SAFETY: data is live; the GPU side does not write until acknowledged.
                let v = unsafe { (pd as *const u64).add(i).read_volatile() };
                assert_eq!(v, probe_value(42, r, i as u64), "round {r} index {i}");
            }
            checked += 1;
            // SAFETY: as above.
            unsafe { crate::arch::st_release_sys_u64(&raw mut (*ctl).ack, r) };
        }
    });
    (checked, ctl.status)
}

#[test]
fn ordering_probe_on_cpu_threads_completes_every_round() {
    // A generous per-round timeout: on a loaded 2-core machine the acknowledging thread
    // may be descheduled for long (a 50 ms timeout once ended the kernel while the host
    // waited for a flag forever).
    assert_eq!(run_probe(200, 200, 20_000_000_000), (200, PROBE_DONE));
}

#[test]
fn ordering_probe_times_out_when_the_host_stops_acknowledging() {
    // Long enough that an acknowledged round does not time out on a loaded machine.
    assert_eq!(run_probe(3, 10, 2_000_000_000), (3, PROBE_TIMEOUT));
}

#[test]
fn probe_values_differ_by_round_and_index() {
    let mut v: Vec<u64> = (1..=4)
        .flat_map(|r| (0..64).map(move |i| probe_value(7, r, i)))
        .collect();
    v.sort_unstable();
    v.dedup();
    assert_eq!(v.len(), 256);
}
