use super::*;
use crate::proxy::fifo_check::{FifoCheckError, PushTest, run_push_test};
use crate::smoke::Backend;
use mscclpp_device::arch;
use mscclpp_device::fifo::{FifoTimeout, FifoWait, TriggerOp};
use std::sync::atomic::{AtomicBool, Ordering};

fn trigger(i: u64) -> Trigger {
    Trigger::new(TriggerOp::DATA, (i % 1024) as u32, i, i + 1, i % 4096).unwrap()
}

#[test]
fn bad_configurations_are_refused_with_the_reason() {
    let cases = [
        (
            FifoConfig::with_slots(0),
            "slot count 0 is not a power of two",
        ),
        (
            FifoConfig::with_slots(12),
            "slot count 12 is not a power of two",
        ),
        (
            FifoConfig::with_slots(1),
            "slot count 1 is out of range (2..=65536)",
        ),
        (
            FifoConfig::with_slots(1 << 17),
            "slot count 131072 is out of range",
        ),
        (
            FifoConfig {
                slots: 8,
                timeout: Duration::ZERO,
            },
            "timeout of 0 ns is out of range",
        ),
        (
            FifoConfig {
                slots: 8,
                timeout: Duration::from_secs(7200),
            },
            "timeout of 7200000000000 ns is out of range",
        ),
    ];
    for (config, msg) in cases {
        let e = Fifo::new_host(config).unwrap_err();
        assert!(matches!(e, FifoError::Config(_)), "{e:?}");
        assert!(e.to_string().contains(msg), "{config:?}: {e}");
    }
    for slots in [2, 8, 512, 1 << 16] {
        let f = Fifo::new_host(FifoConfig::with_slots(slots)).unwrap();
        assert_eq!(f.slots(), slots);
        assert_eq!(f.device_handle().slots(), slots as u64);
        assert!(!f.is_on_gpu());
    }
    assert_eq!(FifoConfig::default().slots, DEFAULT_SLOTS);
}

#[test]
fn pop_with_nothing_published_is_an_error_and_changes_nothing() {
    let f = Fifo::new_host(FifoConfig::with_slots(8)).unwrap();
    let mut c = f.consumer().unwrap();
    let e = c.pop().unwrap_err();
    assert!(matches!(e, FifoError::NothingToPop { tail: 0 }), "{e:?}");
    assert!(
        e.to_string().contains("nothing to pop at FIFO tail 0"),
        "{e}"
    );
    assert_eq!(c.tail(), 0);
    // SAFETY: `f` outlives the push.
    unsafe { f.device_handle().try_push(Trigger::ZERO) }.unwrap();
    assert_eq!(
        c.poll(),
        Some(Trigger::ZERO),
        "the all-zero trigger is delivered"
    );
    assert_eq!(c.pop().unwrap(), 0);
    assert!(c.pop().is_err());
    assert_eq!(f.tail(), 1);
}

#[test]
fn the_ring_sits_where_the_layout_says() {
    let f = Fifo::new_host(FifoConfig::with_slots(8)).unwrap();
    let h = f.device_handle();
    let dbg = format!("{h:?}");
    assert!(dbg.contains("slots: 8"), "{dbg}");
    assert_eq!(tail_offset(8), 128);
    assert_eq!(tail_offset(512), 512 * 16);
    assert_eq!(tail_offset(2), 128);
}

#[test]
fn a_full_ring_holds_the_next_push_until_the_proxy_pops() {
    let f = Fifo::new_host(FifoConfig::with_slots(8)).unwrap();
    let h = f.device_handle();
    let mut c = f.consumer().unwrap();
    for i in 0..8 {
        // SAFETY: `f` outlives every push of this test.
        assert_eq!(unsafe { h.try_push(trigger(i)) }, Ok(i));
    }
    // Set just before the first pop; a ninth push that returns must see it, since it
    // acquired the tail that this pop releases afterwards.
    let about_to_pop = AtomicBool::new(false);
    let saw_the_pop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: as above.
            let seq = unsafe { h.try_push(trigger(8)) }.unwrap();
            assert_eq!(seq, 8);
            saw_the_pop.store(about_to_pop.load(Ordering::Relaxed), Ordering::Relaxed);
        });
        // The ninth push must wait for a free slot. Giving it time to misbehave makes a
        // broken backpressure likely to show up (slot 0 overwritten, or the push returning
        // before the pop); the checks hold for any timing when it works.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(c.poll(), Some(trigger(0)), "slot 0 kept until popped");
        about_to_pop.store(true, Ordering::Relaxed);
        assert_eq!(c.pop().unwrap(), 0);
        for i in 1..9 {
            let mut round = 0;
            let t = loop {
                if let Some(t) = c.poll() {
                    break t;
                }
                arch::spin_backoff(round);
                round += 1;
            };
            assert_eq!(t, trigger(i), "seq {i}");
            assert_eq!(c.pop().unwrap(), i);
        }
    });
    assert!(
        saw_the_pop.into_inner(),
        "the ninth push returned before the pop"
    );
    assert_eq!(c.poll(), None);
}

#[test]
fn a_push_into_a_full_ring_without_a_proxy_times_out() {
    let f = Fifo::new_host(FifoConfig {
        slots: 2,
        timeout: Duration::from_millis(5),
    })
    .unwrap();
    let h = f.device_handle();
    for i in 0..2 {
        // SAFETY: `f` outlives the pushes.
        unsafe { h.try_push(trigger(i)) }.unwrap();
    }
    // SAFETY: as above.
    let e = unsafe { h.try_push(trigger(2)) }.unwrap_err();
    assert_eq!(
        e,
        FifoTimeout {
            wait: FifoWait::Push,
            seq: 2,
            tail: 0,
            timeout_ns: 5_000_000
        }
    );
}

fn host_run(slots: usize, test: PushTest) {
    let f = Fifo::new_host(FifoConfig::with_slots(slots)).unwrap();
    // Two runs on one FIFO: the second starts at the first's tail, mid-lap.
    for run in 1..=2 {
        let r = run_push_test(Backend::Host, &f, &test).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.triggers, test.triggers());
        assert_eq!(f.tail(), run * test.triggers());
    }
    assert_eq!(f.consumer().unwrap().poll(), None);
}

#[test]
fn cpu_threads_push_into_eight_slots_through_many_laps() {
    host_run(
        8,
        PushTest {
            blocks: 4,
            threads: 8,
            pushes: 100,
            sync_each: false,
            timeout: Duration::from_secs(60),
        },
    );
}

#[test]
fn cpu_threads_push_into_512_slots_through_many_laps() {
    host_run(
        512,
        PushTest {
            blocks: 4,
            threads: 16,
            pushes: 200,
            sync_each: false,
            timeout: Duration::from_secs(60),
        },
    );
}

#[test]
fn cpu_threads_sync_after_every_push() {
    host_run(
        8,
        PushTest {
            blocks: 2,
            threads: 4,
            pushes: 50,
            sync_each: true,
            timeout: Duration::from_secs(60),
        },
    );
}

#[test]
fn the_checker_refuses_mismatched_backends_and_empty_runs() {
    let f = Fifo::new_host(FifoConfig::with_slots(8)).unwrap();
    let empty = PushTest {
        blocks: 1,
        threads: 1,
        pushes: 0,
        sync_each: false,
        timeout: Duration::from_secs(1),
    };
    let e = run_push_test(Backend::Host, &f, &empty).unwrap_err();
    assert!(matches!(e, FifoCheckError::InvalidArgument(_)), "{e}");
    let one = PushTest { pushes: 1, ..empty };
    let held = f.consumer().unwrap();
    let e = run_push_test(Backend::Host, &f, &one).unwrap_err();
    assert!(
        matches!(e, FifoCheckError::Fifo(FifoError::ConsumerTaken)),
        "{e}"
    );
    drop(held);
    run_push_test(Backend::Host, &f, &one).unwrap();
}

#[test]
fn the_checker_reports_a_corrupted_trigger() {
    // A producer that pushes something the kernel never would: the checker must say so,
    // and still drain the ring.
    let f = Fifo::new_host(FifoConfig::with_slots(2)).unwrap();
    let h = f.device_handle();
    let bad = Trigger::new(TriggerOp::DATA, 1, 0, 0, 0).unwrap(); // wrong checksum
    // SAFETY: `f` outlives the push.
    unsafe { h.try_push(bad) }.unwrap();
    let test = PushTest {
        blocks: 1,
        threads: 1,
        pushes: 3,
        sync_each: false,
        timeout: Duration::from_secs(30),
    };
    let e = run_push_test(Backend::Host, &f, &test).unwrap_err();
    assert!(
        matches!(e, FifoCheckError::Corrupt { seq: 0, trigger } if trigger == bad),
        "{e}"
    );
    assert_eq!(f.tail(), 3, "drained what the producers pushed");
}

#[test]
fn one_consumer_at_a_time_and_the_next_carries_on_from_the_tail() {
    let f = Fifo::new_host(FifoConfig::with_slots(4)).unwrap();
    let h = f.device_handle();
    let mut c = f.consumer().unwrap();
    assert!(matches!(
        f.consumer().unwrap_err(),
        FifoError::ConsumerTaken
    ));
    for i in 0..3 {
        // SAFETY: `f` outlives the pushes.
        unsafe { h.try_push(trigger(i)) }.unwrap();
    }
    assert_eq!(c.pop().unwrap(), 0);
    drop(c);
    let mut c = f.consumer().unwrap();
    assert_eq!(c.tail(), 1);
    assert_eq!(c.poll(), Some(trigger(1)));
    assert_eq!(c.pop().unwrap(), 1);
    // The consumer keeps the memory alive after the FIFO is gone.
    drop(f);
    assert_eq!(c.poll(), Some(trigger(2)));
    assert_eq!(c.pop().unwrap(), 2);
    assert_eq!(c.slots(), 4);
}
