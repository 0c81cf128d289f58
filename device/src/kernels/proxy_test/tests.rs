//! The proxy-probe kernel on a CPU thread.

use super::*;
use crate::arch::{Dim3, launch};
use core::sync::atomic::{AtomicU64, Ordering};

/// Raises the flag one step at a time, each only after the previous one was acknowledged,
/// and returns the acknowledgements seen in order.
fn feed(flag: &AtomicU64, ack: &AtomicU64, rounds: u64) -> std::vec::Vec<u64> {
    let mut seen = std::vec::Vec::new();
    for i in 1..=rounds {
        flag.store(i, Ordering::Release);
        let start = std::time::Instant::now();
        loop {
            let a = ack.load(Ordering::Acquire);
            if a == i {
                seen.push(a);
                break;
            }
            assert!(a < i, "acknowledged {a} before the flag reached it");
            assert!(
                start.elapsed().as_secs() < 30,
                "round {i} never acknowledged"
            );
            std::hint::spin_loop();
        }
    }
    seen
}

#[test]
fn flag_echo_acknowledges_each_round_in_order() {
    let (flag, ack) = (AtomicU64::new(0), AtomicU64::new(0));
    let rounds = 200;
    let (fp, ap) = (flag.as_ptr() as usize, ack.as_ptr() as usize);
    std::thread::scope(|s| {
        let kernel = s.spawn(|| {
            launch(Dim3::x(1), Dim3::x(2), || {
                // SAFETY: both words outlive the scope and are accessed atomically.
                unsafe { flag_echo(fp as *const u64, ap as *mut u64, rounds, 30_000_000_000) }
            })
        });
        let seen = feed(&flag, &ack, rounds);
        assert_eq!(seen, (1..=rounds).collect::<std::vec::Vec<_>>());
        assert_eq!(kernel.join().unwrap(), Ok(()));
    });
}

#[test]
fn flag_echo_traps_when_the_flag_never_comes() {
    let (flag, ack) = (AtomicU64::new(0), AtomicU64::new(0));
    let r = launch(Dim3::x(1), Dim3::x(1), || {
        // SAFETY: both words outlive the launch and are accessed atomically.
        unsafe { flag_echo(flag.as_ptr(), ack.as_ptr(), 3, 20_000_000) }
    });
    assert!(r.is_err(), "the echo should have given up: {r:?}");
    assert_eq!(ack.load(Ordering::Relaxed), 0);
}
