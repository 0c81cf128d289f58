use super::*;
use crate::shared_array;
use std::sync::atomic::AtomicUsize;

#[test]
fn launch_gives_every_thread_its_own_ids() {
    let grid = Dim3 { x: 3, y: 2, z: 1 };
    let block = Dim3 { x: 4, y: 1, z: 2 };
    let seen: Vec<AtomicU32> = (0..48).map(|_| AtomicU32::new(0)).collect();
    launch(grid, block, || {
        assert_eq!((block_dim_x(), block_dim_y(), block_dim_z()), (4, 1, 2));
        assert_eq!((grid_dim_x(), grid_dim_y(), grid_dim_z()), (3, 2, 1));
        let b = block_idx_x() + 3 * block_idx_y() + 6 * block_idx_z();
        let t = thread_idx_x() + 4 * thread_idx_y() + 4 * thread_idx_z();
        seen[(b * 8 + t) as usize].fetch_add(1, Ordering::Relaxed);
    })
    .unwrap();
    assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
}

#[test]
fn outside_launch_a_thread_is_a_grid_of_one() {
    assert_eq!((thread_idx_x(), block_idx_x()), (0, 0));
    assert_eq!((block_dim_x(), grid_dim_x()), (1, 1));
    assert_eq!(crate::arch::global_threads_x(), 1);
    sync_threads(); // must not block
}

#[test]
fn barrier_and_shared_memory_exchange_within_each_block() {
    const T: u32 = 32;
    let out: Vec<AtomicU32> = (0..4 * T).map(|_| AtomicU32::new(u32::MAX)).collect();
    launch(Dim3::x(4), Dim3::x(T), || {
        let s = shared_array!(EXCH: u32; 32);
        let t = thread_idx_x();
        // SAFETY: t < 32, each thread writes only its slot before the barrier.
        unsafe { *s.add(t as usize) = t * 10 + block_idx_x() };
        sync_threads();
        // SAFETY: after the barrier, reads of other slots see the writes.
        let v = unsafe { *s.add((T - 1 - t) as usize) };
        out[(block_idx_x() * T + t) as usize].store(v, Ordering::Relaxed);
    })
    .unwrap();
    for b in 0..4 {
        for t in 0..T {
            let got = out[(b * T + t) as usize].load(Ordering::Relaxed);
            assert_eq!(got, (T - 1 - t) * 10 + b, "block {b} thread {t}");
        }
    }
}

#[test]
fn release_store_publishes_data_to_acquire_load() {
    let data = AtomicU64::new(0);
    let flag = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 1..=20_000u64 {
                data.store(round * 7, Ordering::Relaxed);
                // SAFETY: `flag` is a live AtomicU64.
                unsafe { st_release_sys_u64(flag.as_ptr(), round) };
                // SAFETY: as above.
                while unsafe { ld_acquire_sys_u64(flag.as_ptr()) } != 0 {
                    std::hint::spin_loop();
                }
            }
        });
        for round in 1..=20_000u64 {
            // SAFETY: `flag` is a live AtomicU64.
            while unsafe { ld_acquire_sys_u64(flag.as_ptr()) } != round {
                std::hint::spin_loop();
            }
            assert_eq!(data.load(Ordering::Relaxed), round * 7);
            // SAFETY: as above.
            unsafe { st_release_sys_u64(flag.as_ptr(), 0) };
        }
    });
}

#[test]
fn atomic_adds_hand_out_distinct_old_values() {
    let counter = AtomicU64::new(0);
    let hits: Vec<AtomicUsize> = (0..256 * 3).map(|_| AtomicUsize::new(0)).collect();
    launch(Dim3::x(4), Dim3::x(64), || {
        for f in [
            atomic_add_relaxed_gpu_u64 as unsafe fn(*mut u64, u64) -> u64,
            atomic_add_relaxed_sys_u64,
            atomic_add_release_sys_u64,
        ] {
            // SAFETY: `counter` is a live AtomicU64.
            let old = unsafe { f(counter.as_ptr(), 1) };
            hits[old as usize].fetch_add(1, Ordering::Relaxed);
        }
    })
    .unwrap();
    assert_eq!(counter.load(Ordering::Relaxed), 768);
    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
}

#[test]
fn sixteen_byte_store_is_seen_whole_by_a_reader_of_the_high_word() {
    #[repr(C, align(16))]
    struct Slot([AtomicU64; 2]);
    let slot = Slot([AtomicU64::new(0), AtomicU64::new(0)]);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 1..=50_000u64 {
                // SAFETY: the slot is 16 live, aligned bytes of atomics.
                unsafe { st_volatile_v2_u64(slot.0[0].as_ptr(), i ^ 0xdead_beef, i) };
            }
        });
        let mut last = 0;
        while last < 50_000 {
            // SAFETY: as above.
            let hi = unsafe { ld_acquire_sys_u64(slot.0[1].as_ptr()) };
            if hi != last {
                let lo = slot.0[0].load(Ordering::Relaxed);
                // lo may already be newer, never older than hi's store.
                assert!(lo ^ 0xdead_beef >= hi, "lo {lo:#x} older than hi {hi}");
                last = hi;
            }
        }
    });
}

#[test]
fn a_trapping_thread_fails_the_launch_without_hanging_the_block() {
    let err = launch(Dim3::x(2), Dim3::x(8), || {
        if block_idx_x() == 1 && thread_idx_x() == 3 {
            trap();
        }
        sync_threads();
        sync_threads();
    })
    .unwrap_err();
    assert_eq!(err, LaunchError::Panicked("trap".into()));
}

#[test]
fn bad_dimensions_are_refused() {
    for (g, b) in [
        (Dim3::x(0), Dim3::x(1)),
        (Dim3::x(1), Dim3::x(0)),
        (Dim3::x(64), Dim3::x(1024)),
    ] {
        let e = launch(g, b, || {}).unwrap_err();
        assert!(matches!(e, LaunchError::BadDimensions { .. }), "{e}");
    }
}

#[test]
fn fences_and_timer_behave() {
    fence_acq_rel_sys();
    fence_sc_sys();
    let a = global_timer_ns();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let b = global_timer_ns();
    assert!(b >= a + 1_000_000, "{a} {b}");
}

#[test]
fn the_launching_thread_runs_one_emulated_thread_and_gets_its_context_back() {
    let me = std::thread::current().id();
    let ran_here = AtomicUsize::new(0);
    launch(Dim3::x(2), Dim3::x(3), || {
        if std::thread::current().id() == me {
            assert_eq!((thread_idx_x(), block_idx_x(), block_dim_x()), (0, 0, 3));
            ran_here.fetch_add(1, Ordering::Relaxed);
        }
    })
    .unwrap();
    assert_eq!(ran_here.load(Ordering::Relaxed), 1);
    assert_eq!((thread_idx_x(), block_dim_x(), grid_dim_x()), (0, 1, 1));
}

#[test]
fn later_launches_reuse_the_threads_of_earlier_ones() {
    let ids = || {
        let seen = Mutex::new(Vec::new());
        launch(Dim3::x(1), Dim3::x(4), || {
            seen.lock().unwrap().push(std::thread::current().id());
        })
        .unwrap();
        seen.into_inner().unwrap()
    };
    let first = ids();
    // Other tests launch at the same time and may take some of the idle threads, so
    // look for reuse over several launches rather than in the next one.
    let reused = (0..20).any(|_| ids().iter().any(|t| first.contains(t)));
    assert!(reused, "no thread of the first launch ran a later one");
}

#[test]
fn concurrent_launches_that_wait_on_each_other_all_finish() {
    // Two launches from two threads whose kernels each wait for the other's: both must
    // have their own threads at once, as with one OS thread per emulated thread.
    let flags = [AtomicU32::new(0), AtomicU32::new(0)];
    std::thread::scope(|s| {
        for me in 0..2usize {
            let flags = &flags;
            s.spawn(move || {
                launch(Dim3::x(2), Dim3::x(2), || {
                    flags[me].fetch_add(1, Ordering::AcqRel);
                    let t0 = std::time::Instant::now();
                    while flags[1 - me].load(Ordering::Acquire) < 4 {
                        assert!(t0.elapsed().as_secs() < 10, "the other launch never ran");
                        std::thread::yield_now();
                    }
                })
                .unwrap();
            });
        }
    });
}
