//! The memory-channel kernels on CPU threads: each rank a launch, both at once.

use super::*;
use crate::arch::LaunchError;
use crate::channel::memory::tests::{LONG_NS, Pair, run_ranks, run_ranks_grid};
use core::sync::atomic::AtomicU64;

const SEED: u64 = 0x5eed;

/// Runs a checking ping-pong kernel on both ranks; the launch results and the error count.
fn ping_pong(
    kernel: unsafe fn(MemoryChannel<'_>, u64, u64, u32, u64, u64, u64, *mut u64),
    bytes: u64,
    rounds: u64,
    src_offset: u64,
    dst_offset: u64,
    seeds: [u64; 2],
) -> ([Result<(), LaunchError>; 2], u64) {
    let len = bytes + src_offset.max(dst_offset) + 16;
    let pair = Pair::new(len, 0);
    let errors = AtomicU64::new(0);
    let res = run_ranks(8, |rank| {
        let ch = pair.channel(rank, LONG_NS);
        // SAFETY: the pair's buffers hold `len` bytes; `errors` is a live counter.
        unsafe {
            kernel(
                ch,
                bytes,
                rounds,
                rank as u32,
                seeds[rank],
                src_offset,
                dst_offset,
                errors.as_ptr(),
            )
        }
    });
    (res, errors.into_inner())
}

#[test]
fn put_ping_pong_checks_every_byte_of_every_round() {
    for (bytes, src, dst) in [
        (0, 0, 0),
        (1, 0, 0),
        (17, 3, 5),
        (4096 + 7, 0, 0),
        (1000, 16, 48),
        (999, 1, 1),
        (300, 0, 100),
    ] {
        let (res, errors) = ping_pong(memory_ping_pong, bytes, 21, src, dst, [SEED; 2]);
        assert_eq!(res, [Ok(()), Ok(())], "bytes {bytes} src {src} dst {dst}");
        assert_eq!(errors, 0, "bytes {bytes} src {src} dst {dst}");
    }
}

#[test]
fn get_ping_pong_checks_every_byte_of_every_round() {
    for (bytes, src, dst) in [
        (0, 0, 0),
        (5, 0, 0),
        (4096 + 7, 0, 0),
        (1000, 3, 16),
        (640, 0, 0),
    ] {
        let (res, errors) = ping_pong(memory_get_ping_pong, bytes, 21, src, dst, [SEED; 2]);
        assert_eq!(res, [Ok(()), Ok(())], "bytes {bytes} src {src} dst {dst}");
        assert_eq!(errors, 0, "bytes {bytes} src {src} dst {dst}");
    }
}

#[test]
fn ping_pongs_count_wrong_bytes() {
    // Ranks that disagree on the seed see every byte wrong: the check can fail.
    for kernel in [memory_ping_pong, memory_get_ping_pong] {
        let (res, errors) = ping_pong(kernel, 64, 4, 0, 0, [1, 2]);
        assert_eq!(res, [Ok(()), Ok(())]);
        assert!(errors > 4 * 64 * 9 / 10, "{errors} wrong bytes");
    }
}

#[test]
fn ping_pong_out_of_range_traps_on_both_ranks() {
    let pair = Pair::new(64, 0);
    let errors = AtomicU64::new(0);
    let res = run_ranks(4, |rank| {
        // SAFETY: the kernel bounds-checks the 65-byte range against the 64-byte buffers.
        unsafe {
            memory_ping_pong(
                pair.channel(rank, LONG_NS),
                65,
                2,
                rank as u32,
                0,
                0,
                0,
                errors.as_ptr(),
            )
        }
    });
    let trap = Err(LaunchError::Panicked("trap".into()));
    assert_eq!(res, [trap.clone(), trap]);
}

#[test]
fn packet_ping_pong_reuses_the_scratch_every_round() {
    for bytes in [1, 8, 9, 255, 4096 + 7] {
        let pair = Pair::new(bytes, scratch_bytes_ll(bytes));
        let errors = AtomicU64::new(0);
        let res = run_ranks(8, |rank| {
            // SAFETY: buffers of `bytes`, scratches of its packets; `errors` is live.
            unsafe {
                memory_packet_ping_pong(
                    pair.channel(rank, LONG_NS),
                    bytes,
                    40,
                    rank as u32,
                    SEED,
                    errors.as_ptr(),
                )
            }
        });
        assert_eq!(res, [Ok(()), Ok(())], "bytes {bytes}");
        assert_eq!(errors.into_inner(), 0, "bytes {bytes}");
        // The last round (40, even) went from rank 1 to rank 0 with flag 40.
        let last = &pair.scratch(0)[..16];
        assert_eq!(u32::from_le_bytes(last[4..8].try_into().unwrap()), 40);
    }
}

fn scratch_bytes_ll(bytes: u64) -> u64 {
    packet::scratch_bytes::<LlPacket>(bytes).unwrap()
}

#[test]
fn packet_ping_pong_detects_a_disagreeing_peer() {
    let pair = Pair::new(64, scratch_bytes_ll(64));
    let errors = AtomicU64::new(0);
    let res = run_ranks(4, |rank| {
        // SAFETY: as above.
        unsafe {
            memory_packet_ping_pong(
                pair.channel(rank, LONG_NS),
                64,
                4,
                rank as u32,
                rank as u64, // each rank's own seed: every check fails
                errors.as_ptr(),
            )
        }
    });
    assert_eq!(res, [Ok(()), Ok(())]);
    assert!(errors.into_inner() > 200);
}

#[test]
fn signal_ping_pong_counts_every_round_trip() {
    let pair = Pair::new(16, 0);
    let res = run_ranks(4, |rank| {
        // SAFETY: the kernel only signals and waits.
        unsafe { memory_signal_ping_pong(pair.channel(rank, LONG_NS), 2000, rank as u32) }
    });
    assert_eq!(res, [Ok(()), Ok(())]);
    assert_eq!((pair.inbound(0), pair.inbound(1)), (2000, 2000));
}

#[test]
fn put_bench_delivers_every_slice_before_the_last_signal() {
    for (blocks, bytes) in [(4, 10_000 + 3), (3, 16), (5, 0), (2, 4096)] {
        let pair = Pair::new(bytes + 16, 0);
        pair.fill(0, bytes);
        let want = pair.buf(0)[..bytes as usize].to_vec();
        let res = run_ranks_grid(blocks, 8, |rank| {
            // SAFETY: buffers of at least `bytes`.
            unsafe { memory_put_bench(pair.channel(rank, LONG_NS), bytes, 3, rank as u32) }
        });
        assert_eq!(res, [Ok(()), Ok(())], "blocks {blocks} bytes {bytes}");
        assert_eq!(
            &pair.buf(1)[..bytes as usize],
            &want[..],
            "blocks {blocks} bytes {bytes}"
        );
        assert!(
            pair.buf(1)[bytes as usize..].iter().all(|&b| b == 0),
            "wrote past `bytes`"
        );
        assert_eq!(pair.inbound(1), blocks as u64);
    }
}

#[test]
fn pattern_helpers_agree_with_pattern_byte() {
    let mut buf = [0u8; 40];
    for threads in [1, 3] {
        for t in 0..threads {
            // SAFETY: 39 bytes from the second one fit the array.
            unsafe { fill_pattern(buf.as_mut_ptr().add(1), 39, 9, 2, t, threads) };
        }
        for (i, &b) in buf[1..].iter().enumerate() {
            assert_eq!(b, pattern_byte(9, 2, i as u64));
        }
        let bad: u64 = (0..threads)
            // SAFETY: as above.
            .map(|t| unsafe { count_mismatches(buf.as_ptr().add(1), 39, 9, 2, t, threads) })
            .sum();
        assert_eq!(bad, 0);
        // SAFETY: as above.
        let all = unsafe { count_mismatches(buf.as_ptr().add(1), 39, 9, 3, 0, 1) };
        assert!(all > 30, "{all}");
    }
}
