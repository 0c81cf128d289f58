use super::*;
use crate::arch::{self, Dim3, LaunchError, launch};
use proptest::prelude::*;
use std::boxed::Box;
use std::string::ToString;

/// FIFO memory in ordinary host memory, laid out as the host's `Fifo` does.
struct TestFifo {
    ring: Box<[Trigger]>,
    /// head, tail, tail cache, spare: each word only ever accessed through `arch`.
    words: Box<[u64; 4]>,
}

impl TestFifo {
    fn new(slots: usize) -> TestFifo {
        TestFifo {
            ring: std::vec![Trigger::ZERO; slots].into_boxed_slice(),
            words: Box::new([0; 4]),
        }
    }
    fn handle(&mut self, timeout_ns: u64) -> FifoDeviceHandle {
        let w = self.words.as_mut_ptr();
        FifoDeviceHandle::new(
            self.ring.as_mut_ptr(),
            w,
            w.wrapping_add(1),
            w.wrapping_add(2),
            self.ring.len() as u64,
            timeout_ns,
        )
        .unwrap()
    }
    fn consumer(&mut self) -> FifoConsumer {
        // SAFETY: the memory outlives every consumer the tests make, and each test makes one.
        unsafe {
            FifoConsumer::new(
                self.ring.as_ptr(),
                self.words.as_mut_ptr().wrapping_add(1),
                self.ring.len() as u64,
            )
        }
        .unwrap()
    }
    fn raw_slot(&self, i: usize) -> [u64; 2] {
        let p = &raw const self.ring[i] as *const u64;
        // SAFETY: the slot is live; loads are atomic.
        unsafe {
            [
                arch::ld_relaxed_sys_u64(p),
                arch::ld_acquire_sys_u64(p.add(1)),
            ]
        }
    }
}

const SECOND: u64 = 1_000_000_000;

fn t(op: TriggerOp, conn: u32, dst: u64, src: u64, size: u64) -> Trigger {
    Trigger::new(op, conn, dst, src, size).unwrap()
}

#[test]
fn trigger_fields_sit_where_the_layout_table_says() {
    let x = t(
        TriggerOp::DATA | TriggerOp::SYNC,
        0x2a5,
        0x1234_5678,
        0x9abc_def0,
        0xfeed_beef,
    );
    let [lo, hi] = x.to_words();
    assert_eq!(lo, 0x1234_5678_9abc_def0);
    assert_eq!(hi & 0xffff_ffff, 0xfeed_beef);
    assert_eq!((hi >> 32) & 0x3ff, 0x2a5);
    assert_eq!((hi >> 42) & 0x7, 0b101);
    assert_eq!(hi >> 45, 0, "reserved and commit bits stay clear");
    assert_eq!(Trigger::ZERO.to_words(), [0, 0]);
    assert_eq!(t(TriggerOp::NONE, 0, 0, 0, 0), Trigger::ZERO);
    assert_eq!(RESERVED_MASK, 0x7fff_e000_0000_0000);
}

#[test]
fn each_field_accepts_its_maximum_and_names_itself_beyond_it() {
    let max = t(
        TriggerOp::ALL,
        MAX_CONNECTION_ID,
        MAX_OFFSET,
        MAX_OFFSET,
        MAX_SIZE,
    );
    assert_eq!(max.connection_id(), 1023);
    assert_eq!(
        (max.dst_offset(), max.src_offset(), max.size()),
        (MAX_OFFSET, MAX_OFFSET, MAX_SIZE)
    );
    assert_eq!(max.op(), TriggerOp::ALL);
    let cases = [
        (
            Trigger::new(TriggerOp::NONE, 1024, 0, 0, 0),
            TriggerField::ConnectionId,
            1024,
            "connection id",
        ),
        (
            Trigger::new(TriggerOp::NONE, 0, 1 << 32, 0, 0),
            TriggerField::DstOffset,
            1 << 32,
            "destination offset",
        ),
        (
            Trigger::new(TriggerOp::NONE, 0, 0, u64::MAX, 0),
            TriggerField::SrcOffset,
            u64::MAX,
            "source offset",
        ),
        (
            Trigger::new(TriggerOp::NONE, 0, 0, 0, 5 << 30),
            TriggerField::Size,
            5 << 30,
            "size",
        ),
    ];
    for (r, field, value, name) in cases {
        let e = r.unwrap_err();
        assert_eq!(e, TriggerError::FieldTooLarge { field, value });
        let msg = e.to_string();
        assert!(
            msg.contains(name) && msg.contains(&value.to_string()),
            "{msg}"
        );
    }
    assert!(TriggerOp::from_bits(8).is_none());
    assert_eq!(
        std::format!("{:?}", TriggerOp::DATA | TriggerOp::FLAG),
        "DATA | FLAG"
    );
    assert_eq!(std::format!("{:?}", TriggerOp::NONE), "NONE");
}

#[test]
fn raw_words_with_reserved_or_commit_bits_are_refused() {
    for bit in 45..64 {
        let e = Trigger::from_words([0, 1 << bit]).unwrap_err();
        assert_eq!(e, TriggerError::ReservedBits { hi: 1 << bit });
        assert!(e.to_string().contains("reserved"), "{e}");
    }
}

proptest! {
    #[test]
    fn trigger_encode_decode_round_trips(
        op in 0u8..8,
        conn in 0..=MAX_CONNECTION_ID,
        dst in 0..=MAX_OFFSET,
        src in 0..=MAX_OFFSET,
        size in 0..=MAX_SIZE,
    ) {
        let op = TriggerOp::from_bits(op).unwrap();
        let x = Trigger::new(op, conn, dst, src, size).unwrap();
        prop_assert_eq!(x.op(), op);
        prop_assert_eq!(x.connection_id(), conn);
        prop_assert_eq!(x.dst_offset(), dst);
        prop_assert_eq!(x.src_offset(), src);
        prop_assert_eq!(x.size(), size);
        prop_assert_eq!(Trigger::from_words(x.to_words()), Ok(x));
        // What a slot holds, with either commit bit, decodes to the same trigger.
        for commit in [0, 1] {
            let [lo, _] = x.to_words();
            prop_assert_eq!(Trigger::from_slot_words(lo, x.hi_with_commit(commit)), x);
        }
    }

    #[test]
    fn out_of_range_fields_are_named(
        which in 0usize..4,
        excess in 1u64..=u32::MAX as u64,
    ) {
        let (r, field) = match which {
            0 => (Trigger::new(TriggerOp::NONE, MAX_CONNECTION_ID + 1 + (excess % 4096) as u32, 0, 0, 0), TriggerField::ConnectionId),
            1 => (Trigger::new(TriggerOp::NONE, 0, MAX_OFFSET + excess, 0, 0), TriggerField::DstOffset),
            2 => (Trigger::new(TriggerOp::NONE, 0, 0, MAX_OFFSET + excess, 0), TriggerField::SrcOffset),
            _ => (Trigger::new(TriggerOp::NONE, 0, 0, 0, MAX_SIZE + excess), TriggerField::Size),
        };
        match r {
            Err(TriggerError::FieldTooLarge { field: f, .. }) => prop_assert_eq!(f, field),
            other => prop_assert!(false, "expected {:?} to be refused, got {:?}", field, other),
        }
    }

    #[test]
    fn raw_words_decode_iff_reserved_and_commit_bits_are_clear(lo: u64, hi: u64) {
        let r = Trigger::from_words([lo, hi]);
        prop_assert_eq!(r.is_ok(), hi >> 45 == 0);
        if let Ok(x) = r {
            prop_assert_eq!(x.to_words(), [lo, hi]);
        }
    }
}

#[test]
fn handles_and_consumers_refuse_bad_memory_and_parameters() {
    let mut f = TestFifo::new(8);
    let ring = f.ring.as_mut_ptr();
    let w = f.words.as_mut_ptr();
    let (h, tl, c) = (w, w.wrapping_add(1), w.wrapping_add(2));
    let new = |ring, slots, timeout| FifoDeviceHandle::new(ring, h, tl, c, slots, timeout);
    assert_eq!(
        new(ring, 6, SECOND).unwrap_err(),
        FifoConfigError::SlotsNotPowerOfTwo { slots: 6 }
    );
    assert_eq!(
        new(ring, 0, SECOND).unwrap_err(),
        FifoConfigError::SlotsNotPowerOfTwo { slots: 0 }
    );
    assert_eq!(
        new(ring, 1, SECOND).unwrap_err(),
        FifoConfigError::SlotsOutOfRange { slots: 1 }
    );
    assert_eq!(
        new(ring, 1 << 17, SECOND).unwrap_err(),
        FifoConfigError::SlotsOutOfRange { slots: 1 << 17 }
    );
    assert_eq!(
        new(ring, 8, 0).unwrap_err(),
        FifoConfigError::TimeoutOutOfRange { timeout_ns: 0 }
    );
    assert!(new(ring, 8, MAX_TIMEOUT_NS + 1).is_err());
    assert_eq!(
        new(std::ptr::null_mut(), 8, SECOND).unwrap_err(),
        FifoConfigError::NullPointer {
            what: "trigger ring"
        }
    );
    let skewed = (ring as usize + 8) as *mut Trigger;
    let e = new(skewed, 8, SECOND).unwrap_err();
    assert!(
        matches!(
            e,
            FifoConfigError::Misaligned {
                what: "trigger ring",
                align: 16,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("not 16-byte aligned"), "{e}");
    let e =
        FifoDeviceHandle::new(ring, (w as usize + 4) as *mut u64, tl, c, 8, SECOND).unwrap_err();
    assert!(
        matches!(e, FifoConfigError::Misaligned { what: "head", .. }),
        "{e}"
    );
    assert!(new(ring, 8, SECOND).is_ok());
    assert!(new(ring, 2, SECOND).is_ok() && new(ring, 1 << 16, SECOND).is_ok());
    assert!(
        FifoConfigError::SlotsOutOfRange { slots: 1 }
            .to_string()
            .contains("2..=65536")
    );
    // SAFETY: only validation runs; nothing is read for a refused configuration.
    let e = unsafe { FifoConsumer::new(ring, tl, 12) }.unwrap_err();
    assert_eq!(e, FifoConfigError::SlotsNotPowerOfTwo { slots: 12 });
    // SAFETY: as above.
    let e = unsafe { FifoConsumer::new(ring, std::ptr::null_mut(), 8) }.unwrap_err();
    assert_eq!(e, FifoConfigError::NullPointer { what: "tail" });
}

#[test]
fn one_thread_pushes_and_pops_through_many_laps_with_alternating_commit_bits() {
    for slots in [2usize, 8] {
        let mut f = TestFifo::new(slots);
        let h = f.handle(SECOND);
        let mut c = f.consumer();
        assert_eq!(c.poll(), None, "a zeroed ring holds nothing");
        assert_eq!(c.pop(), None);
        for seq in 0..(slots as u64 * 50) {
            let x = t(TriggerOp::DATA, (seq % 1024) as u32, seq, seq * 3, seq % 7);
            // SAFETY: `f` outlives the handle's use.
            assert_eq!(unsafe { h.try_push(x) }, Ok(seq));
            let [_, hi] = f.raw_slot(seq as usize % slots);
            let lap = seq / slots as u64;
            assert_eq!(
                hi >> 63,
                1 - lap % 2,
                "seq {seq}: commit bit is the lap's parity"
            );
            assert_eq!(c.poll(), Some(x));
            assert_eq!(c.poll(), Some(x), "poll does not consume");
            assert_eq!(c.pop(), Some(seq));
            assert_eq!(c.tail(), seq + 1);
            assert_eq!(c.poll(), None);
            // SAFETY: as above.
            assert_eq!(
                unsafe { h.try_sync(seq) },
                Ok(()),
                "the tail has passed {seq}"
            );
        }
        // SAFETY: as above.
        assert_eq!(unsafe { h.try_flush() }, Ok(()));
    }
}

#[test]
fn an_all_zero_trigger_is_delivered_in_every_lap() {
    let mut f = TestFifo::new(2);
    let h = f.handle(SECOND);
    let mut c = f.consumer();
    for seq in 0..10 {
        // SAFETY: `f` outlives the handle's use.
        assert_eq!(unsafe { h.try_push(Trigger::ZERO) }, Ok(seq));
        assert_eq!(c.poll(), Some(Trigger::ZERO), "seq {seq}");
        assert_eq!(c.pop(), Some(seq));
    }
}

#[test]
fn a_full_ring_times_out_naming_the_sequence_and_the_tail() {
    let mut f = TestFifo::new(4);
    let h = f.handle(2_000_000); // 2 ms
    let mut c = f.consumer();
    for seq in 0..4 {
        // SAFETY: `f` outlives the handle's use.
        assert_eq!(unsafe { h.try_push(Trigger::ZERO) }, Ok(seq));
    }
    // SAFETY: as above.
    let e = unsafe { h.try_push(Trigger::ZERO) }.unwrap_err();
    assert_eq!(
        e,
        FifoTimeout {
            wait: FifoWait::Push,
            seq: 4,
            tail: 0,
            timeout_ns: 2_000_000
        }
    );
    assert!(e.to_string().contains("ring full"), "{e}");
    // Nothing was overwritten: the four pushed triggers are still there, in order.
    for seq in 0..4 {
        assert_eq!(c.poll(), Some(Trigger::ZERO));
        assert_eq!(c.pop(), Some(seq));
    }
    // The timed-out push claimed sequence 4 and never published it: the consumer waits.
    assert_eq!(c.poll(), None);
    // SAFETY: as above.
    let e = unsafe { h.try_sync(4) }.unwrap_err();
    assert_eq!(e.wait, FifoWait::Sync);
    assert_eq!((e.seq, e.tail), (4, 4));
    // SAFETY: as above.
    assert!(
        unsafe { h.try_flush() }.is_err(),
        "the claimed slot 4 is never popped"
    );
}

#[test]
fn push_and_sync_trap_after_the_timeout_inside_a_kernel() {
    let mut f = TestFifo::new(2);
    let h = f.handle(1_000_000);
    let r = launch(Dim3::x(1), Dim3::x(1), || {
        for _ in 0..3 {
            // SAFETY: `f` outlives the launch.
            unsafe { h.push(Trigger::ZERO) };
        }
    });
    assert_eq!(r, Err(LaunchError::Panicked("trap".into())));
    let r = launch(Dim3::x(1), Dim3::x(1), || {
        // SAFETY: as above.
        unsafe { h.sync(0) }
    });
    assert_eq!(r, Err(LaunchError::Panicked("trap".into())));
}

#[test]
fn cpu_threads_of_a_launch_push_into_one_ring_and_each_trigger_arrives_once() {
    use crate::kernels::fifo_test::{decode_test_trigger, fifo_push_test, status};
    for slots in [8usize, 512] {
        let mut f = TestFifo::new(slots);
        let h = f.handle(20 * SECOND);
        let mut c = f.consumer();
        let (blocks, threads, pushes) = (3u32, 8u32, 120u32);
        let total = (blocks * threads * pushes) as usize;
        let mut st = [0u64; status::COUNT];
        let sp = st.as_mut_ptr() as usize;
        let mut seen = std::vec![0u8; total];
        std::thread::scope(|s| {
            let k = s.spawn(|| {
                launch(Dim3::x(blocks), Dim3::x(threads), || {
                    // SAFETY: `f` and `st` outlive the launch.
                    unsafe { fifo_push_test(h, pushes, 0, sp as *mut u64) }
                })
            });
            let mut got = 0;
            let mut round = 0;
            while got < total {
                match c.poll() {
                    Some(x) => {
                        let (b, t, k) = decode_test_trigger(&x)
                            .unwrap_or_else(|| panic!("corrupted trigger {x:?}"));
                        seen[((b * threads + t) * pushes + k) as usize] += 1;
                        assert_eq!(c.pop(), Some(got as u64));
                        got += 1;
                        round = 0;
                    }
                    None => {
                        assert!(
                            !k.is_finished() || c.poll().is_some(),
                            "producers ended early"
                        );
                        arch::spin_backoff(round);
                        round += 1;
                    }
                }
            }
            k.join().unwrap().unwrap();
        });
        assert!(
            seen.iter().all(|n| *n == 1),
            "{slots} slots: some trigger lost or doubled"
        );
        assert_eq!(st[status::STATE], 0);
        assert_eq!(st[status::FINISHED_THREADS], (blocks * threads) as u64);
        assert_eq!(c.poll(), None);
    }
}

#[test]
fn a_fault_flag_in_the_tail_is_reported_by_sync_and_ignored_by_counts() {
    let mut f = TestFifo::new(2);
    let h = f.handle(SECOND);
    let mut c = f.consumer();
    let op = TriggerOp::SYNC;
    // SAFETY: the FIFO memory is live for the whole test; one consumer.
    unsafe {
        let s0 = h.try_push(t(op, 0, 0, 0, 0)).unwrap();
        assert_eq!(c.pop(), Some(s0));
        assert_eq!(h.try_sync_status(s0), Ok(SyncStatus::Clean));
        c.mark_fault();
        let s1 = h.try_push(t(op, 0, 0, 0, 0)).unwrap();
        assert_eq!(c.pop(), Some(s1));
        assert_eq!(h.try_sync_status(s1), Ok(SyncStatus::ProxyFaulted));
        assert_eq!(h.try_sync(s1), Ok(()));
        // The flag does not make an unpopped trigger look popped, nor the ring look full
        // (two slots: these pushes need the masked tail to find room).
        let s2 = h.try_push(t(op, 0, 0, 0, 0)).unwrap();
        let s3 = h.try_push(t(op, 0, 0, 0, 0)).unwrap();
        let short = FifoDeviceHandle::new(
            f.ring.as_mut_ptr(),
            f.words.as_mut_ptr(),
            f.words.as_mut_ptr().wrapping_add(1),
            f.words.as_mut_ptr().wrapping_add(2),
            2,
            1_000_000,
        )
        .unwrap();
        assert!(short.try_sync_status(s2).is_err(), "not popped yet");
        assert_eq!(c.pop(), Some(s2));
        assert_eq!(c.pop(), Some(s3));
        assert_eq!(c.tail(), 4);
        assert_eq!(h.try_sync_status(s3), Ok(SyncStatus::ProxyFaulted));
    }
    // A new consumer (this one is done) starts clean and clears the flag at once.
    let c = f.consumer();
    assert_eq!(c.tail(), 4);
    // SAFETY: as above.
    unsafe { assert_eq!(h.try_sync_status(3), Ok(SyncStatus::Clean)) };
}
