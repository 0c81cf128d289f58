//! The latency variants on CPU threads (which cannot reorder what the variants differ in):
//! every variant that claims release semantics carries its payload every round, counters
//! stay consistent across variants, the LL ping-pongs check every word, and the checks can
//! fail. Variants that publish nothing (or only by the hardware's fences) are not run here:
//! their payload accesses race by design, which on CPU threads is undefined behaviour.

use super::*;
use crate::arch::LaunchError;
use crate::channel::memory::tests::{LONG_NS, Pair, run_ranks};
use core::sync::atomic::AtomicU64;
use std::vec::Vec;

type SemKernel = unsafe fn(MemoryChannel<'_>, u64, u32, u64, *mut u64);

/// The host twins of the kernels, in [`VARIANTS`] order.
const KERNELS: [SemKernel; 17] = [
    lat_sem_red_release,
    lat_sem_red_relaxed,
    lat_sem_fence_red_relaxed,
    lat_sem_fence_st_relaxed,
    lat_sem_st_release,
    lat_sem_st_relaxed,
    lat_sem_atom_release,
    lat_sem_relaxed_poll_fence,
    lat_sem_clock_every_poll,
    lat_sem_no_clock,
    lat_sem_st_release_no_clock,
    lat_sem_bare,
    lat_sem_block_red_release,
    lat_sem_block_red_relaxed,
    lat_sem_block_fence_red_relaxed,
    lat_sem_block_st_release,
    lat_sem_block_each_fence,
];

const SEED: u64 = 3 << 48;
const BLOCK: u32 = 8;

/// Runs variant `i` on `pair` (seeds per rank); the launch results and the mismatch count.
fn run(pair: &Pair, i: usize, rounds: u64, seeds: [u64; 2]) -> ([Result<(), LaunchError>; 2], u64) {
    let errors = AtomicU64::new(0);
    let threads = if VARIANTS[i].block { BLOCK } else { 3 };
    let res = run_ranks(threads, |rank| {
        // SAFETY: the pair's buffers hold BLOCK words; `errors` is a live counter.
        unsafe {
            KERNELS[i](
                pair.channel(rank, LONG_NS),
                rounds,
                rank as u32,
                seeds[rank],
                errors.as_ptr(),
            )
        }
    });
    (res, errors.into_inner())
}

fn releasing() -> impl Iterator<Item = usize> {
    (0..VARIANTS.len()).filter(|&i| VARIANTS[i].publishes() == Publishes::Release)
}

#[test]
fn releasing_variants_carry_the_payload_every_round() {
    for i in releasing() {
        let pair = Pair::new(8 * BLOCK as u64, 0);
        let (res, bad) = run(&pair, i, 300, [SEED; 2]);
        assert_eq!(res, [Ok(()), Ok(())], "{}", VARIANTS[i].kernel);
        assert_eq!(bad, 0, "{}", VARIANTS[i].kernel);
        assert_eq!(
            (pair.inbound(0), pair.inbound(1)),
            (300, 300),
            "{}",
            VARIANTS[i].kernel
        );
    }
}

#[test]
fn payload_check_counts_every_wrong_word() {
    // Ranks that disagree on the seed: every word each side reads is wrong.
    for i in releasing() {
        let pair = Pair::new(8 * BLOCK as u64, 0);
        let (res, bad) = run(&pair, i, 20, [SEED, 5 << 48]);
        let n = if VARIANTS[i].block { BLOCK as u64 } else { 1 };
        assert_eq!(res, [Ok(()), Ok(())], "{}", VARIANTS[i].kernel);
        assert_eq!(bad, 2 * 20 * n, "{}", VARIANTS[i].kernel);
    }
}

#[test]
fn store_and_add_signals_share_one_channel() {
    // A count-storing signal starts from the peer's counter, so it follows adds (and the
    // library's waits consume either) on the same semaphore, in any order.
    let pair = Pair::new(8 * BLOCK as u64, 0);
    let order = [0usize, 4, 2, 3, 10, 15, 12, 4];
    for (k, &i) in order.iter().enumerate() {
        let (res, bad) = run(&pair, i, 50, [SEED + ((k as u64) << 50); 2]);
        assert_eq!((res, bad), ([Ok(()), Ok(())], 0), "{}", VARIANTS[i].kernel);
    }
    let total = 50 * order.len() as u64;
    assert_eq!((pair.inbound(0), pair.inbound(1)), (total, total));
}

#[test]
fn variant_table_is_consistent() {
    for (i, v) in VARIANTS.iter().enumerate() {
        assert!(
            VARIANTS[..i].iter().all(|w| w.kernel != v.kernel),
            "{} twice",
            v.kernel
        );
        let floor = VARIANTS
            .iter()
            .find(|w| w.kernel == v.floor_kernel())
            .unwrap();
        assert_eq!(
            (floor.signal, floor.wait, floor.block),
            (Signal::RedRelaxed, Wait::Library, v.block)
        );
        assert_eq!(floor.publishes(), Publishes::Nothing);
    }
    // Today's pair is the first row and publishes.
    assert_eq!(
        (VARIANTS[0].signal, VARIANTS[0].wait),
        (Signal::RedRelease, Wait::Library)
    );
    assert_eq!(VARIANTS[0].publishes(), Publishes::Release);
    assert_eq!(VARIANTS[16].publishes(), Publishes::Hardware);
}

type LlKernel = unsafe fn(MemoryChannel<'_>, u64, u64, u32, u64, *mut u64);

fn ll_run(
    kernel: LlKernel,
    packet: u64,
    data: u64,
    bytes: u64,
    threads: u32,
    seeds: [u64; 2],
) -> ([Result<(), LaunchError>; 2], u64, Pair) {
    let pair = Pair::new(bytes.max(16), bytes.div_ceil(data) * packet + 16);
    let errors = AtomicU64::new(0);
    let res = run_ranks(threads, |rank| {
        // SAFETY: buffers of `bytes`, scratches of its packets; `errors` is live.
        unsafe {
            kernel(
                pair.channel(rank, LONG_NS),
                bytes,
                30,
                rank as u32,
                seeds[rank],
                errors.as_ptr(),
            )
        }
    });
    (res, errors.into_inner(), pair)
}

#[test]
fn ll_block_ping_pongs_check_every_chunk() {
    for (kernel, packet, data) in [
        (memory_ll8_block_ping_pong as LlKernel, 8, 4),
        (memory_ll16_block_ping_pong as LlKernel, 16, 8),
    ] {
        for (bytes, threads) in [(4, 1), (4096, 16), (1020, 7), (64, 32)] {
            let (res, bad, pair) = ll_run(kernel, packet, data, bytes, threads, [9, 9]);
            assert_eq!(
                (res, bad),
                ([Ok(()), Ok(())], 0),
                "packet {packet} bytes {bytes}"
            );
            // The last round (30, even) went from rank 1 to rank 0: rank 0 holds its message.
            let want: Vec<u8> = (0..bytes / 4)
                .flat_map(|k| ll_word(9 ^ 1, 30, k).to_le_bytes())
                .collect();
            assert_eq!(
                &pair.buf(0)[..bytes as usize],
                &want[..],
                "packet {packet} bytes {bytes}"
            );
        }
        // Disagreeing seeds: every chunk each side checks is wrong (15 rounds each way).
        let (res, bad, _) = ll_run(kernel, packet, data, 64, 4, [1, 2]);
        assert_eq!(res, [Ok(()), Ok(())]);
        assert_eq!(bad, 30 * 64 / data, "packet {packet}");
    }
}

#[test]
fn ll_block_ping_pong_traps_on_a_size_not_multiple_of_4() {
    let (res, _, _) = ll_run(memory_ll8_block_ping_pong, 8, 4, 6, 2, [1, 1]);
    let trap = Err(LaunchError::Panicked("trap".into()));
    assert_eq!(res, [trap.clone(), trap]);
}

#[test]
fn ll_chunk_holds_consecutive_words() {
    let c = ll_chunk(7, 3, 8, 12);
    assert_eq!(
        c[0],
        ll_word(7, 3, 2) as u64 | (ll_word(7, 3, 3) as u64) << 32
    );
    assert_eq!(c[1], ll_word(7, 3, 4) as u64);
    // Different rounds give different words.
    assert_ne!(ll_word(7, 3, 2), ll_word(7, 4, 2));
}
