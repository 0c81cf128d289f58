//! Loom model of the trigger FIFO. It runs the real `FifoDeviceHandle::try_push` /
//! `try_sync` and `FifoConsumer::poll` / `pop`: under `--cfg mscclpp_loom` the `arch` calls
//! they make use loom atomics registered for the FIFO's words (`arch::shadow`), so loom
//! explores their interleavings and memory orderings. Payload cells (loom `UnsafeCell`s)
//! stand for the data a trigger names: loom reports a data race if a push does not release
//! the producer's writes to the consumer, or a pop / sync does not hand the consumer's
//! reads back to the producer.
//!
//! Run (about 15 s of model checking, after the build, on 2 cores):
//!
//! ```text
//! RUSTFLAGS="--cfg mscclpp_loom" cargo test -p mscclpp-device --release --test loom_fifo
//! ```
//!
//! Without the cfg this file compiles to nothing. Each model uses a preemption bound of 3
//! unless `LOOM_MAX_PREEMPTIONS` sets one. Spin loops (`arch::spin_backoff`) stop loom's
//! branching after a few failed rounds of one wait; see `arch::LOOM_EXPLORED_ROUNDS` for
//! why that loses no state.
//!
//! What it cannot check: loom does not produce load-buffering outcomes, nor the GPU's own
//! memory model, where the push's `fence.acq_rel.sys` (not a release store) is what
//! publishes the trigger; those orderings are argued in `fifo`'s documentation and checked
//! on the GPU by `tests/gpu_fifo.rs`. It was seen to fail when the consumer's acquire, the
//! pop's release, the sync's acquire, the lap parity or the full-ring test is broken.
#![cfg(mscclpp_loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use mscclpp_device::arch::{self, shadow::ShadowMemory};
use mscclpp_device::fifo::{FifoConsumer, FifoDeviceHandle, Trigger, TriggerOp};

/// A FIFO's memory in ordinary host memory: the ring and head / tail / tail cache.
struct Memory {
    ring: Box<[Trigger]>,
    words: Box<[u64; 3]>,
}

impl Memory {
    /// Zeroed memory for `slots` slots, every word registered with `shadow`.
    fn new(shadow: &ShadowMemory, slots: usize) -> Memory {
        let mut m = Memory {
            ring: vec![Trigger::ZERO; slots].into_boxed_slice(),
            words: Box::new([0; 3]),
        };
        // SAFETY: both allocations are live for the model execution and read only here.
        unsafe {
            shadow.add_u64_words(m.ring.as_mut_ptr() as *mut u64, 2 * slots);
            shadow.add_u64_words(m.words.as_mut_ptr(), 3);
        }
        m
    }

    fn handle(&mut self) -> FifoDeviceHandle {
        let w = self.words.as_mut_ptr();
        FifoDeviceHandle::new(
            self.ring.as_mut_ptr(),
            w,
            w.wrapping_add(1),
            w.wrapping_add(2),
            self.ring.len() as u64,
            1, // time does not pass under loom: waits never time out
        )
        .unwrap()
    }

    fn consumer(&mut self) -> FifoConsumer {
        // SAFETY: the memory outlives the consumer (dropped at the end of the execution,
        // after every thread is joined); it is the only consumer.
        unsafe {
            FifoConsumer::new(
                self.ring.as_ptr(),
                self.words.as_mut_ptr().wrapping_add(1),
                self.ring.len() as u64,
            )
        }
        .unwrap()
    }
}

/// Trigger `k` of producer `p`, naming payload cell `cell` (in its destination offset).
fn trigger(p: u32, k: u64, cell: usize) -> Trigger {
    Trigger::new(TriggerOp::DATA, p, cell as u64, k, 100 * p as u64 + k).unwrap()
}

fn payload_value(p: u32, k: u64) -> u64 {
    1000 + 10 * p as u64 + k
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b
}

/// Producer `p` pushes `pushes[p]` triggers into a ring of `slots`, writing each
/// trigger's payload cell before its push. The consumer (the model's main thread) pops
/// them all, reading each payload between poll and pop, and checks that every trigger
/// arrived once, intact, with its payload.
fn producers_and_one_consumer(pushes: &'static [u64], slots: usize) {
    builder().check(move || {
        let shadow = ShadowMemory::new();
        let mut mem = Memory::new(&shadow, slots);
        let handle = mem.handle();
        let mut consumer = mem.consumer();
        let first_cell: Vec<usize> = pushes
            .iter()
            .scan(0, |n, k| {
                let first = *n;
                *n += *k as usize;
                Some(first)
            })
            .collect();
        let cells = pushes.iter().sum::<u64>() as usize;
        let payload: Arc<Vec<UnsafeCell<u64>>> =
            Arc::new((0..cells).map(|_| UnsafeCell::new(0)).collect());
        let threads: Vec<_> = (0..pushes.len())
            .map(|p| {
                let payload = payload.clone();
                let first = first_cell[p];
                thread::spawn(move || {
                    for k in 0..pushes[p] {
                        let cell = first + k as usize;
                        // SAFETY: each cell is written by its one producer, before the push
                        // that publishes it.
                        payload[cell].with_mut(|v| unsafe { *v = payload_value(p as u32, k) });
                        // SAFETY: `mem` outlives this thread (joined below).
                        unsafe { handle.try_push(trigger(p as u32, k, cell)) }.unwrap();
                    }
                })
            })
            .collect();
        let mut seen = vec![false; cells];
        let mut popped = 0;
        let mut round = 0;
        while popped < cells {
            let Some(t) = consumer.poll() else {
                arch::spin_backoff(round);
                round += 1;
                continue;
            };
            round = 0;
            let (p, k, cell) = (t.connection_id(), t.src_offset(), t.dst_offset() as usize);
            assert_eq!(t, trigger(p, k, cell), "trigger delivered intact");
            assert!(!seen[cell], "trigger {p}/{k} delivered twice");
            seen[cell] = true;
            // SAFETY: the push that published `t` released the producer's write; the
            // producer does not write the cell again.
            let v = payload[cell].with(|v| unsafe { *v });
            assert_eq!(v, payload_value(p, k), "payload of {p}/{k} visible");
            assert_eq!(consumer.pop(), Some(popped as u64));
            popped += 1;
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(consumer.poll(), None);
        drop(shadow);
    });
}

#[test]
fn two_producers_one_push_each_into_two_slots() {
    producers_and_one_consumer(&[1, 1], 2);
}

#[test]
fn two_producers_two_pushes_each_wrap_a_two_slot_ring() {
    // Four triggers through two slots: the second lap (commit bit 0), a full ring, the
    // cached tail going stale and being refreshed.
    producers_and_one_consumer(&[2, 2], 2);
}

#[test]
fn producers_of_two_and_one_push_wrap_a_two_slot_ring() {
    producers_and_one_consumer(&[2, 1], 2);
}

/// One producer pushes three triggers through two slots, syncs on the last and then
/// reuses (writes again) every payload cell, as a kernel reuses a source buffer after
/// `sync`. The consumer reads each payload between poll and pop; loom reports a race if
/// the pop's release or the sync's acquire is missing.
#[test]
fn sync_hands_the_consumers_work_back_to_the_producer() {
    builder().check(|| {
        let shadow = ShadowMemory::new();
        let mut mem = Memory::new(&shadow, 2);
        let handle = mem.handle();
        let mut consumer = mem.consumer();
        let payload: Arc<Vec<UnsafeCell<u64>>> =
            Arc::new((0..3).map(|_| UnsafeCell::new(0)).collect());
        let producer = {
            let payload = payload.clone();
            thread::spawn(move || {
                let mut last = 0;
                for k in 0..3u64 {
                    // SAFETY: written before the push that publishes it; the consumer
                    // reads it only after acquiring that push.
                    payload[k as usize].with_mut(|v| unsafe { *v = payload_value(0, k) });
                    // SAFETY: `mem` outlives this thread (joined below).
                    last = unsafe { handle.try_push(trigger(0, k, k as usize)) }.unwrap();
                }
                // SAFETY: as above.
                unsafe { handle.try_sync(last) }.unwrap();
                for cell in payload.iter() {
                    // SAFETY: the sync acquired the pop of the last trigger, after which
                    // the consumer reads no payload.
                    cell.with_mut(|v| unsafe { *v = 0 });
                }
            })
        };
        for k in 0..3u64 {
            let mut round = 0;
            let t = loop {
                match consumer.poll() {
                    Some(t) => break t,
                    None => arch::spin_backoff(round),
                }
                round += 1;
            };
            assert_eq!(t, trigger(0, k, k as usize));
            // SAFETY: published by the push; not rewritten before our pop.
            let v = payload[k as usize].with(|v| unsafe { *v });
            assert_eq!(v, payload_value(0, k));
            assert_eq!(consumer.pop(), Some(k));
        }
        producer.join().unwrap();
        drop(shadow);
    });
}
