use super::*;
use crate::arch::{Dim3, LaunchError, launch};
use crate::kernels::smoke::probe_value;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use proptest::prelude::*;
use std::boxed::Box;
use std::vec::Vec;

const SHORT_NS: u64 = 2_000_000;
const LONG_NS: u64 = 60_000_000_000;

fn traps<T>(f: impl FnOnce() -> T) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(_) => false,
        Err(p) => p.downcast_ref::<&str>() == Some(&"trap"),
    }
}

/// Zeroed, 16-byte aligned packet memory.
fn slots(bytes: usize) -> Box<[u128]> {
    std::vec![0u128; bytes.div_ceil(16)].into_boxed_slice()
}

#[test]
fn ll_packet_bytes_sit_where_the_layout_table_says() {
    let pk = LlPacket::new(0x8877_6655_4433_2211, 0xddcc_bbaa);
    // SAFETY: LlPacket is 16 bytes of plain integers.
    let bytes: [u8; 16] = unsafe { core::mem::transmute(pk) };
    assert_eq!(
        bytes,
        [
            0x11, 0x22, 0x33, 0x44, 0xaa, 0xbb, 0xcc, 0xdd, 0x55, 0x66, 0x77, 0x88, 0xaa, 0xbb,
            0xcc, 0xdd
        ]
    );
    let words = pk.to_words();
    assert_eq!(words, [0xddcc_bbaa_4433_2211, 0xddcc_bbaa_8877_6655]);
    assert_eq!(LlPacket::from_words(words), pk);
    assert_eq!(pk.data(), 0x8877_6655_4433_2211);
    assert!(pk.has_flag(0xddcc_bbaa) && !pk.has_flag(1));
    let wide = LlWidePacket::new([1, 2], 9);
    // SAFETY: LlWidePacket is 32 bytes of plain integers.
    let w: [u64; 4] = unsafe { core::mem::transmute(wide) };
    assert_eq!(w, [9 << 32 | 1, 9 << 32, 9 << 32 | 2, 9 << 32]);
    assert_eq!(wide.data(), [1, 2]);
    assert_eq!(core::mem::align_of::<LlPacket>(), 16);
    assert_eq!(core::mem::align_of::<LlWidePacket>(), 16);
}

#[test]
fn flags_skip_zero_at_the_wrap() {
    assert_eq!(next_flag(1), 2);
    assert_eq!(next_flag(u32::MAX - 1), u32::MAX);
    assert_eq!(next_flag(u32::MAX), 1);
    assert_eq!(next_flag(INVALID_FLAG), 1);
    assert_eq!(flag_for_round(1), 1);
    assert_eq!(flag_for_round(2), 2);
    assert_eq!(flag_for_round(u32::MAX as u64), u32::MAX);
    assert_eq!(flag_for_round(u32::MAX as u64 + 1), 1);
    assert_eq!(flag_for_round(0), u32::MAX);
    assert_eq!(scratch_bytes::<LlPacket>(0), Some(0));
    assert_eq!(scratch_bytes::<LlPacket>(9), Some(32));
    assert_eq!(scratch_bytes::<LlWidePacket>(17), Some(64));
    assert_eq!(scratch_bytes::<LlPacket>(u64::MAX), None);
}

proptest! {
    #[test]
    fn flag_for_round_follows_next_flag(round in any::<u64>()) {
        let f = flag_for_round(round);
        prop_assert_ne!(f, INVALID_FLAG);
        if round < u64::MAX - u32::MAX as u64 {
            prop_assert_eq!(flag_for_round(round + 1), next_flag(f));
        }
    }
}

#[test]
fn written_packets_read_back_only_with_their_flag() {
    let mut m = slots(48);
    let p = m.as_mut_ptr() as *mut LlPacket;
    let q = p.wrapping_add(1) as *mut LlWidePacket;
    // SAFETY: 48 zeroed aligned bytes, accessed only here.
    unsafe {
        assert_eq!(LlPacket::read(p, 1), None, "zeroed scratch is no packet");
        LlPacket::write(p, 0x0123_4567_89ab_cdef, 5);
        assert_eq!(LlPacket::read(p, 5), Some(0x0123_4567_89ab_cdef));
        assert_eq!(LlPacket::read(p, 4), None);
        assert_eq!(LlPacket::poll(p, 5, SHORT_NS), Some(0x0123_4567_89ab_cdef));
        assert_eq!(LlPacket::poll(p, 6, SHORT_NS), None);
        LlWidePacket::write(q, [u64::MAX, 3], u32::MAX);
        assert_eq!(LlWidePacket::read(q, u32::MAX), Some([u64::MAX, 3]));
        assert_eq!(LlWidePacket::poll(q, 1, SHORT_NS), None);
        assert_eq!(
            LlPacket::read(p, 5),
            Some(0x0123_4567_89ab_cdef),
            "neighbour untouched"
        );
    }
    let flag_zero: [&dyn Fn(); 4] = [
        // SAFETY: the slots above; the flag check traps before any access.
        &|| unsafe { LlPacket::write(p, 1, 0) },
        &|| {
            // SAFETY: as above.
            let _ = unsafe { LlPacket::read(p, 0) };
        },
        // SAFETY: as above.
        &|| unsafe { LlWidePacket::write(q, [1, 1], 0) },
        &|| {
            // SAFETY: as above.
            let _ = unsafe { LlWidePacket::read(q, 0) };
        },
    ];
    for (i, f) in flag_zero.iter().enumerate() {
        assert!(traps(f), "case {i}: flag 0 accepted");
    }
}

#[test]
fn a_packet_with_any_stale_word_is_refused() {
    // Torn states a reader may observe: one word of the new round, one of the old.
    let mut m = slots(32);
    let w = m.as_mut_ptr() as *mut u64;
    let new = LlPacket::new(0xaaaa_aaaa_bbbb_bbbb, 8).to_words();
    let old = LlPacket::new(0x1111_1111_2222_2222, 7).to_words();
    for (lo, hi) in [(new[0], old[1]), (old[0], new[1])] {
        // SAFETY: 32 aligned bytes, accessed only by this thread.
        unsafe {
            crate::arch::st_volatile_v2_u64(w, lo, hi);
            assert_eq!(LlPacket::read(w as *const LlPacket, 8), None);
            assert_eq!(LlPacket::read(w as *const LlPacket, 7), None);
        }
    }
    for k in 0..4 {
        let mut words = [new[0], new[1], new[0], new[1]];
        words[k] = old[k % 2];
        // SAFETY: as above.
        unsafe {
            crate::arch::st_volatile_v2_u64(w, words[0], words[1]);
            crate::arch::st_volatile_v2_u64(w.add(2), words[2], words[3]);
            assert_eq!(
                LlWidePacket::read(w as *const LlWidePacket, 8),
                None,
                "stale word {k}"
            );
        }
    }
}

#[test]
fn packets_written_concurrently_are_never_accepted_torn() {
    // One thread rewrites a slot with flag f carrying data derived from f; another reads it
    // all the while and, whenever every flag in it agrees, checks the data.
    const WRITES: u32 = 200_000;
    let mut m = slots(32);
    let p = m.as_mut_ptr() as usize;
    let done = AtomicBool::new(false);
    let value = |f: u32| probe_value(f as u64, 1, 2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let p = p as *mut LlWidePacket;
            for f in 1..=WRITES {
                // SAFETY: 32 live aligned bytes, accessed only through packet functions.
                unsafe { LlWidePacket::write(p, [value(f), !value(f)], f) };
            }
            done.store(true, Ordering::Release);
        });
        let p = p as *const u64;
        loop {
            let finished = done.load(Ordering::Acquire);
            // SAFETY: as above.
            let (a, b) = unsafe {
                (
                    LlPacket::from_words(crate::arch::ld_volatile_v2_u64(p)),
                    LlPacket::from_words(crate::arch::ld_volatile_v2_u64(p.add(2))),
                )
            };
            let pk = LlWidePacket { lo: a, hi: b };
            let f = pk.lo.flag0;
            if f != 0 && pk.has_flag(f) {
                assert_eq!(pk.data(), [value(f), !value(f)], "flag {f}");
            }
            if finished {
                // The last write is complete: it must be accepted.
                assert_eq!(f, WRITES);
                assert!(pk.has_flag(WRITES));
                break;
            }
        }
    });
}

/// Packs `size` bytes from `src_off` of a random buffer into packets of type `P` by a
/// partition of `threads` (one after the other), unpacks them into `dst_off` of another
/// buffer, and checks every byte of it.
fn round_trip<P: Packet>(size: u64, src_off: u64, dst_off: u64, threads: u32, flag: u32) {
    let n = (size + 64) as usize;
    let src: Vec<u8> = (0..n)
        .map(|i| probe_value(size, 0, i as u64) as u8)
        .collect();
    let mut dst: Vec<u8> = (0..n)
        .map(|i| probe_value(size, 1, i as u64) as u8)
        .collect();
    let mut want = dst.clone();
    let (s, d, z) = (src_off as usize, dst_off as usize, size as usize);
    want[d..d + z].copy_from_slice(&src[s..s + z]);
    let mut scratch = slots(scratch_bytes::<P>(size).unwrap() as usize);
    let sp = scratch.as_mut_ptr() as *mut P;
    for t in 0..threads {
        // SAFETY: the ranges fit the vectors; the scratch holds every packet.
        unsafe { pack::<P>(sp, src.as_ptr().add(s), size, t, threads, flag) };
    }
    for t in 0..threads {
        // SAFETY: as above.
        let ok =
            unsafe { unpack::<P>(dst.as_mut_ptr().add(d), sp, size, t, threads, flag, LONG_NS) };
        assert!(ok);
    }
    assert_eq!(
        dst, want,
        "size {size} src {src_off} dst {dst_off} threads {threads}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pack_then_unpack_restores_any_range(
        size in 0u64..300,
        src_off in 0u64..40,
        dst_off in 0u64..40,
        threads in 1u32..40,
        flag in 1u32..,
        kind in 0u8..3,
    ) {
        match kind {
            0 => round_trip::<LlPacket>(size, src_off, dst_off, threads, flag),
            1 => round_trip::<LlWidePacket>(size, src_off, dst_off, threads, flag),
            _ => round_trip::<Ll8Packet>(size, src_off, dst_off, threads, flag),
        }
    }
}

#[test]
fn ll8_packets_hold_data_and_flag_in_one_word() {
    let pk = Ll8Packet::new(0x4433_2211, 0xddcc_bbaa);
    // SAFETY: Ll8Packet is 8 bytes of plain integers.
    let bytes: [u8; 8] = unsafe { core::mem::transmute(pk) };
    assert_eq!(bytes, [0x11, 0x22, 0x33, 0x44, 0xaa, 0xbb, 0xcc, 0xdd]);
    assert_eq!(pk.to_word(), 0xddcc_bbaa_4433_2211);
    assert_eq!(Ll8Packet::from_word(pk.to_word()), pk);
    assert_eq!(core::mem::align_of::<Ll8Packet>(), 8);
    assert_eq!(scratch_bytes::<Ll8Packet>(4096), Some(8192));
    assert_eq!(scratch_bytes::<Ll8Packet>(5), Some(16));
    let mut m = slots(16);
    let p = m.as_mut_ptr() as *mut Ll8Packet;
    let q = p.wrapping_add(1);
    // SAFETY: 16 zeroed aligned bytes (two slots), accessed only here.
    unsafe {
        assert_eq!(Ll8Packet::read(p, 1), None, "zeroed scratch is no packet");
        Ll8Packet::write(q, 0x0123_4567, 5);
        assert_eq!(Ll8Packet::read(q, 5), Some(0x0123_4567));
        assert_eq!(Ll8Packet::read(q, 4), None);
        assert_eq!(Ll8Packet::read(p, 5), None, "neighbour untouched");
        assert_eq!(
            Packet::read_words(q as *const Ll8Packet, 5),
            Some([0x0123_4567, 0])
        );
    }
    // SAFETY: the slots above; the flag check traps before any access.
    assert!(traps(|| unsafe { Ll8Packet::write(p, 1, 0) }));
    // SAFETY: as above.
    assert!(traps(|| unsafe { Ll8Packet::read(p, 0) }));
}

#[test]
fn pack_and_unpack_refuse_bad_partitions_and_flags() {
    let mut scratch = slots(32);
    let sp = scratch.as_mut_ptr() as *mut LlPacket;
    let data = [7u8; 16];
    let mut out = [0u8; 16];
    let op = out.as_mut_ptr();
    let bad: [&dyn Fn(); 5] = [
        // SAFETY: 16 data bytes, two packet slots; the checks trap before any access.
        &|| unsafe { pack(sp, data.as_ptr(), 16, 0, 0, 1) },
        // SAFETY: as above.
        &|| unsafe { pack(sp, data.as_ptr(), 16, 2, 2, 1) },
        // SAFETY: as above.
        &|| unsafe { pack(sp, data.as_ptr(), 16, 0, 1, 0) },
        &|| {
            // SAFETY: as above.
            let _ = unsafe { unpack(op, sp, 16, 0, 1, 0, 1) };
        },
        &|| {
            // SAFETY: as above.
            let _ = unsafe { unpack(op, sp, 16, 1, 1, 1, 1) };
        },
    ];
    for (i, f) in bad.iter().enumerate() {
        assert!(traps(f), "case {i} accepted");
    }
    assert!(scratch.iter().all(|&w| w == 0));
    // SAFETY: as above.
    assert!(!unsafe { unpack(out.as_mut_ptr(), sp, 16, 0, 1, 1, SHORT_NS) });
    assert_eq!(out, [0; 16]);
}

#[test]
fn a_block_unpacks_what_another_block_packs_while_it_waits() {
    // Real concurrency: the receivers start first and wait; the sender is another launch.
    const SIZE: u64 = 3001;
    let src: Vec<u8> = (0..SIZE).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = std::vec![0u8; SIZE as usize];
    let mut scratch = slots(scratch_bytes::<LlPacket>(SIZE).unwrap() as usize);
    let (sp, dp, src_p) = (
        scratch.as_mut_ptr() as usize,
        dst.as_mut_ptr() as usize,
        src.as_ptr() as usize,
    );
    let results: [Result<(), LaunchError>; 2] = std::thread::scope(|s| {
        let rx = s.spawn(move || {
            launch(Dim3::x(1), Dim3::x(8), || {
                let (t, nt) = (crate::arch::thread_idx_x(), crate::arch::block_dim_x());
                // SAFETY: dst and scratch sized for SIZE bytes; each thread writes its own.
                let ok = unsafe {
                    unpack::<LlPacket>(
                        dp as *mut u8,
                        sp as *const LlPacket,
                        SIZE,
                        t,
                        nt,
                        3,
                        LONG_NS,
                    )
                };
                assert!(ok);
            })
        });
        let tx = launch(Dim3::x(1), Dim3::x(5), || {
            let (t, nt) = (crate::arch::thread_idx_x(), crate::arch::block_dim_x());
            // SAFETY: as above.
            unsafe { pack::<LlPacket>(sp as *mut LlPacket, src_p as *const u8, SIZE, t, nt, 3) };
        });
        [tx, rx.join().unwrap()]
    });
    assert_eq!(results, [Ok(()), Ok(())]);
    assert_eq!(dst, src);
}

/// Once a wait is late, a non-zero abort word still lets it take the packets that are there
/// (a peer that left after sending them: the host writes its "left" word only after they
/// had landed), and ends it at once with the word's error when they are not.
#[test]
fn a_late_wait_takes_the_packets_that_came_before_a_left_word() {
    use crate::channel::ChannelError;
    use crate::collectives::fault::left_word;
    let src: Vec<u8> = (0..64u64).map(|i| probe_value(7, 0, i) as u8).collect();
    let mut scratch = slots(scratch_bytes::<LlPacket>(64).unwrap() as usize);
    let sp = scratch.as_mut_ptr() as *mut LlPacket;
    // SAFETY: 64 readable bytes; the scratch holds every packet.
    unsafe { pack::<LlPacket>(sp, src.as_ptr(), 64, 0, 1, 5) };
    let left = AtomicU64::new(left_word(2));
    let mut dst = std::vec![0u8; 64];
    let started = std::time::Instant::now();
    // SAFETY: 64 writable bytes; the packets and the word are live.
    let r = unsafe {
        unpack_late::<LlPacket>(dst.as_mut_ptr(), sp, 64, 0, 1, 5, LONG_NS, left.as_ptr())
    };
    assert_eq!(r, Ok(()));
    assert_eq!(dst, src);
    // Flag 6 was never sent: the word ends the wait at once, naming the rank.
    // SAFETY: as above.
    let r = unsafe {
        unpack_late::<LlPacket>(dst.as_mut_ptr(), sp, 64, 0, 1, 6, LONG_NS, left.as_ptr())
    };
    assert_eq!(r, Err(ChannelError::PeerLeft { rank: 2 }));
    left.store(u64::MAX, Ordering::Relaxed);
    // SAFETY: as above.
    let r = unsafe {
        unpack_late::<LlPacket>(dst.as_mut_ptr(), sp, 64, 0, 1, 6, LONG_NS, left.as_ptr())
    };
    assert_eq!(r, Err(ChannelError::Aborted { word: u64::MAX }));
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(1), "{took:?}");
}
