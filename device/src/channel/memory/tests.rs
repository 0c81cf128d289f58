//! Memory channels on CPU threads: two plain host buffers (and scratches, and counters)
//! stand for the two GPUs, and the same channel code runs over them.

use super::*;
use crate::arch::{Dim3, LaunchError, launch};
use crate::kernels::smoke::probe_value;
use crate::packet::{LlWidePacket, flag_for_round, next_flag, scratch_bytes};
use proptest::prelude::*;
use std::boxed::Box;

/// Timeout of every wait that must not time out: a hang becomes a trap, not a stuck test.
pub(crate) const LONG_NS: u64 = 60_000_000_000;
/// Timeout of the waits that must time out.
pub(crate) const SHORT_NS: u64 = 2_000_000;

/// One rank's memory: buffer, packet scratch, inbound counter and expected word. Reached only
/// through the raw pointers taken at creation, so channels and the test never alias a
/// reference.
pub(crate) struct Side {
    _buf: Box<[u128]>,
    _scratch: Box<[u128]>,
    _words: Box<[u64; 2]>,
    buf: *mut u8,
    scratch: *mut u8,
    words: *mut u64,
}

impl Side {
    fn new(len: u64, scratch_len: u64) -> Side {
        let mut b = std::vec![0u128; len.div_ceil(16) as usize].into_boxed_slice();
        let mut s = std::vec![0u128; scratch_len.div_ceil(16) as usize].into_boxed_slice();
        let mut w = Box::new([0u64; 2]);
        let (buf, scratch, words) = (
            b.as_mut_ptr() as *mut u8,
            s.as_mut_ptr() as *mut u8,
            w.as_mut_ptr(),
        );
        Side {
            _buf: b,
            _scratch: s,
            _words: w,
            buf,
            scratch,
            words,
        }
    }
}

/// Two ranks' memory and the pair of channels between them.
pub(crate) struct Pair {
    sides: [Side; 2],
    len: u64,
    scratch_len: u64,
    /// The abort word both channels' waits look at (0: not aborted).
    abort: Box<core::sync::atomic::AtomicU64>,
}

// SAFETY: the raw pointers refer to the boxes the pair owns; tests touch the memory only
// through channels during launches and through the accessors below between them.
unsafe impl Sync for Pair {}

impl Pair {
    /// Two zeroed buffers of `len` bytes and scratches of `scratch_len` bytes (16-aligned).
    pub(crate) fn new(len: u64, scratch_len: u64) -> Pair {
        Pair {
            sides: [Side::new(len, scratch_len), Side::new(len, scratch_len)],
            len,
            scratch_len,
            abort: Box::new(core::sync::atomic::AtomicU64::new(0)),
        }
    }

    /// Raises the abort word both channels' waits look at to `word`.
    pub(crate) fn abort(&self, word: u64) {
        self.abort
            .store(word, core::sync::atomic::Ordering::Relaxed);
    }

    /// Rank `rank`'s channel to the other rank.
    pub(crate) fn channel(&self, rank: usize, timeout_ns: u64) -> MemoryChannel<'_> {
        let (me, peer) = (&self.sides[rank], &self.sides[1 - rank]);
        // SAFETY: every pointer refers to memory the pair owns, of the lengths given; the
        // scratches are 16-byte aligned and zeroed; counters and expected words start at 0;
        // the abort word is live and written atomically.
        unsafe {
            let sem = DeviceSemaphore::from_raw_parts(
                me.words,
                peer.words,
                me.words.wrapping_add(1),
                timeout_ns,
                self.abort.as_ptr(),
            );
            MemoryChannel::from_raw_parts(
                me.buf,
                self.len,
                peer.buf,
                self.len,
                me.scratch,
                peer.scratch,
                self.scratch_len,
                sem,
            )
        }
    }

    /// Rank `rank`'s buffer (drop it before the next channel operation or fill).
    pub(crate) fn buf(&self, rank: usize) -> &[u8] {
        // SAFETY: `len` bytes owned by the pair; tests run no channel operation nor fill
        // while they hold the slice.
        unsafe { std::slice::from_raw_parts(self.sides[rank].buf, self.len as usize) }
    }

    /// Fills rank `rank`'s buffer with bytes that depend on `seed` and the position (call
    /// only while no launch uses it).
    pub(crate) fn fill(&self, rank: usize, seed: u64) {
        for i in 0..self.len {
            // SAFETY: inside the buffer; no channel operation runs concurrently.
            unsafe { *self.sides[rank].buf.add(i as usize) = probe_value(seed, 0, i) as u8 };
        }
    }

    /// Rank `rank`'s packet scratch (drop it before the next channel operation).
    pub(crate) fn scratch(&self, rank: usize) -> &[u8] {
        // SAFETY: as in `buf`.
        unsafe { std::slice::from_raw_parts(self.sides[rank].scratch, self.scratch_len as usize) }
    }

    /// Rank `rank`'s inbound counter (call only while no launch uses it).
    pub(crate) fn inbound(&self, rank: usize) -> u64 {
        // SAFETY: the word is live; no launch runs.
        unsafe { *self.sides[rank].words }
    }
}

/// Runs `body(rank)` as a launch of one block of `threads` threads per rank, both ranks at
/// once; the two launches' results.
pub(crate) fn run_ranks(threads: u32, body: impl Fn(usize) + Sync) -> [Result<(), LaunchError>; 2] {
    run_ranks_grid(1, threads, body)
}

/// [`run_ranks`] with `blocks` blocks per rank.
pub(crate) fn run_ranks_grid(
    blocks: u32,
    threads: u32,
    body: impl Fn(usize) + Sync,
) -> [Result<(), LaunchError>; 2] {
    std::thread::scope(|s| {
        let body = &body;
        let one = s.spawn(move || launch(Dim3::x(blocks), Dim3::x(threads), || body(1)));
        let zero = launch(Dim3::x(blocks), Dim3::x(threads), || body(0));
        [zero, one.join().unwrap()]
    })
}

/// Runs `f` and returns whether it trapped (panicked with "trap").
pub(crate) fn traps<T>(f: impl FnOnce() -> T) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(_) => false,
        Err(p) => p.downcast_ref::<&str>() == Some(&"trap"),
    }
}

const SIZES: [u64; 8] = [0, 1, 3, 15, 16, 17, 255, 4096 + 7];
const MAX_OFFSET: u64 = 17;
const LEN: u64 = 4096 + 7 + MAX_OFFSET + 16;

/// Which copy a case exercises.
#[derive(Clone, Copy, Debug)]
enum Dir {
    Put,
    Get,
}

/// One copy case: random source and destination, the copy split among `threads` partitions
/// (run one after the other on this thread), then every byte of the destination checked:
/// the range equals the source, everything outside it is untouched; the source is untouched.
fn check_copy(
    pair: &Pair,
    dir: Dir,
    dst_off: u64,
    src_off: u64,
    size: u64,
    threads: u32,
    seed: u64,
) {
    // Put copies rank 0's local buffer to rank 1's; get copies rank 1's to rank 0's.
    let (src_rank, dst_rank) = match dir {
        Dir::Put => (0, 1),
        Dir::Get => (1, 0),
    };
    pair.fill(src_rank, seed);
    pair.fill(dst_rank, !seed);
    let src_before = pair.buf(src_rank).to_vec();
    let dst_before = pair.buf(dst_rank).to_vec();
    let ch = pair.channel(0, LONG_NS);
    for t in 0..threads {
        match dir {
            Dir::Put => ch.put(dst_off, src_off, size, t, threads),
            Dir::Get => ch.get(dst_off, src_off, size, t, threads),
        }
    }
    let (s, d) = (src_off as usize, dst_off as usize);
    let n = size as usize;
    let mut want = dst_before.clone();
    want[d..d + n].copy_from_slice(&src_before[s..s + n]);
    let got = pair.buf(dst_rank);
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{dir:?} dst {dst_off} src {src_off} size {size} threads {threads}: byte {i} is \
             {:#x}, want {:#x} ({})",
            got[i],
            want[i],
            if (d..d + n).contains(&i) {
                "inside the range"
            } else {
                "outside the range"
            }
        );
    }
    assert_eq!(
        pair.buf(src_rank),
        &src_before[..],
        "{dir:?}: source changed"
    );
}

#[test]
fn put_and_get_copy_exactly_the_range_for_odd_sizes_and_offsets() {
    let pair = Pair::new(LEN, 0);
    let mut case = 0u64;
    for dir in [Dir::Put, Dir::Get] {
        for size in SIZES {
            for src_off in 0..=MAX_OFFSET {
                for dst_off in 0..=MAX_OFFSET {
                    let threads = [1, 3, 32, 7][(case % 4) as usize];
                    check_copy(&pair, dir, dst_off, src_off, size, threads, case);
                    case += 1;
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn put_and_get_match_a_byte_copy(
        put in any::<bool>(),
        size in 0u64..600,
        src_off in 0u64..80,
        dst_off in 0u64..80,
        threads in 1u32..70,
        seed in any::<u64>(),
    ) {
        let pair = Pair::new(700, 0);
        let dir = if put { Dir::Put } else { Dir::Get };
        check_copy(&pair, dir, dst_off, src_off, size, threads, seed);
    }
}

#[test]
fn a_block_of_cpu_threads_puts_concurrently() {
    let pair = Pair::new(LEN, 0);
    for (dst_off, src_off, size) in [(0, 0, 4096 + 7), (5, 5, 3000), (3, 12, 2049), (1, 0, 777)] {
        pair.fill(0, size);
        pair.fill(1, !size);
        let (src, dst) = (pair.buf(0).to_vec(), pair.buf(1).to_vec());
        let ch = pair.channel(0, LONG_NS);
        launch(Dim3::x(1), Dim3::x(16), || {
            ch.put(
                dst_off,
                src_off,
                size,
                arch::thread_idx_x(),
                arch::block_dim_x(),
            )
        })
        .unwrap();
        let mut want = dst;
        let (d, s, n) = (dst_off as usize, src_off as usize, size as usize);
        want[d..d + n].copy_from_slice(&src[s..s + n]);
        assert!(
            pair.buf(1) == &want[..],
            "dst {dst_off} src {src_off} size {size}"
        );
    }
}

#[test]
fn out_of_range_copies_trap_before_writing_anything() {
    let pair = Pair::new(256, 64);
    pair.fill(0, 1);
    pair.fill(1, 2);
    let before = [pair.buf(0).to_vec(), pair.buf(1).to_vec()];
    let ch = pair.channel(0, LONG_NS);
    let cases: [(&str, u64, u64, u64, u32, u32); 8] = [
        ("dst end past the buffer", 200, 0, 57, 0, 1),
        ("src end past the buffer", 0, 255, 2, 0, 1),
        ("offset past the buffer", 257, 0, 0, 0, 1),
        ("offset + size overflows", u64::MAX - 1, 0, 4, 0, 1),
        ("size overflows", 0, 0, u64::MAX, 0, 1),
        ("no threads", 0, 0, 16, 0, 0),
        ("thread outside the partition", 0, 0, 16, 4, 4),
        ("both ends past", 250, 250, 100, 0, 2),
    ];
    for (what, dst, src, size, t, nt) in cases {
        assert!(traps(|| ch.put(dst, src, size, t, nt)), "put, {what}");
        assert!(traps(|| ch.get(dst, src, size, t, nt)), "get, {what}");
    }
    // Exactly at the end is fine, and so is an empty copy at the very end.
    ch.put(256 - 7, 0, 7, 0, 1);
    ch.get(256, 256, 0, 0, 1);
    assert_eq!(pair.buf(0), &before[0][..]);
    assert_eq!(&pair.buf(1)[..249], &before[1][..249]);
    assert_eq!(&pair.buf(1)[249..], &before[0][..7]);
}

#[test]
fn read_and_write_reach_remote_elements_aligned_or_not() {
    let pair = Pair::new(64, 0);
    let ch = pair.channel(0, LONG_NS);
    for i in 0..8u64 {
        ch.write::<u64>(i, 0x0101_0101_0101_0101 * (i + 1));
    }
    for i in 0..8u64 {
        assert_eq!(ch.read::<u64>(i), 0x0101_0101_0101_0101 * (i + 1));
        assert_eq!(pair.buf(1)[i as usize * 8], i as u8 + 1);
    }
    ch.write::<[u8; 3]>(5, [7, 8, 9]);
    assert_eq!(&pair.buf(1)[15..18], &[7, 8, 9]);
    assert_eq!(ch.read::<[u8; 3]>(5), [7, 8, 9]);
    assert_eq!(ch.read::<u32>(15), 0x0808_0808);
    assert!(traps(|| ch.write::<u64>(8, 0)), "index past the end");
    assert!(traps(|| ch.read::<u32>(16)), "index past the end");
    assert!(traps(|| ch.read::<u64>(u64::MAX / 4)), "offset overflow");
    // A remote buffer starting at an odd address: every u64 element is misaligned.
    // SAFETY: the pair's buffer 1 has 64 bytes, so 63 from its second byte; the rest as in
    // `Pair::channel`.
    let odd = unsafe {
        let c = pair.channel(0, LONG_NS);
        MemoryChannel::from_raw_parts(
            c.local,
            c.local_len,
            c.remote.wrapping_add(1),
            63,
            c.packets_in,
            c.packets_out,
            0,
            c.semaphore,
        )
    };
    for i in 0..7u64 {
        odd.write::<u64>(i, u64::MAX - i);
    }
    for i in 0..7u64 {
        assert_eq!(odd.read::<u64>(i), u64::MAX - i);
    }
    assert_eq!(pair.buf(1)[0], 1, "byte before the odd buffer untouched");
    assert!(traps(|| odd.write::<u64>(7, 0)));
}

/// Sends `size` bytes from rank 0's `src_off` as packets of type `P` (partition of
/// `threads`, one after the other) to rank 1's scratch at `scratch_off`, unpacks them into
/// rank 1's `dst_off`, and checks the bytes, the untouched rest of the buffer, and the
/// scratch outside the packets.
fn check_packets<P: Packet>(
    pair: &Pair,
    dst_off: u64,
    src_off: u64,
    scratch_off: u64,
    size: u64,
    threads: u32,
    flag: u32,
) {
    pair.fill(0, flag as u64);
    pair.fill(1, !(flag as u64));
    let src = pair.buf(0).to_vec();
    let dst = pair.buf(1).to_vec();
    let scratch = pair.scratch(1).to_vec();
    let (c0, c1) = (pair.channel(0, LONG_NS), pair.channel(1, LONG_NS));
    for t in 0..threads {
        c0.put_packets_of::<P>(scratch_off, src_off, size, t, threads, flag);
    }
    for t in 0..threads {
        assert_eq!(
            c1.try_unpack_packets_of::<P>(dst_off, scratch_off, size, t, threads, flag, LONG_NS),
            Ok(())
        );
    }
    let mut want = dst;
    let (d, s, n) = (dst_off as usize, src_off as usize, size as usize);
    want[d..d + n].copy_from_slice(&src[s..s + n]);
    assert!(
        pair.buf(1) == &want[..],
        "dst {dst_off} src {src_off} size {size} threads {threads}"
    );
    let used = scratch_bytes::<P>(size).unwrap() as usize;
    let o = scratch_off as usize;
    assert_eq!(
        &pair.scratch(1)[..o],
        &scratch[..o],
        "scratch before the packets"
    );
    assert_eq!(
        &pair.scratch(1)[o + used..],
        &scratch[o + used..],
        "scratch after the packets"
    );
}

#[test]
fn packets_carry_odd_sizes_between_odd_offsets() {
    let pair = Pair::new(LEN, 2 * LEN + 64);
    let mut case = 0u32;
    for size in SIZES {
        for src_off in 0..=MAX_OFFSET {
            for dst_off in [0, 1, 7, 8, 13, 16, 17] {
                let threads = [1, 5, 32][(case % 3) as usize];
                let scratch_off = 16 * (case % 3) as u64;
                check_packets::<LlPacket>(
                    &pair,
                    dst_off,
                    src_off,
                    scratch_off,
                    size,
                    threads,
                    case + 1,
                );
                check_packets::<LlWidePacket>(
                    &pair,
                    dst_off,
                    src_off,
                    scratch_off,
                    size,
                    threads,
                    case + 1,
                );
                case += 1;
            }
        }
    }
}

#[test]
fn bad_packet_arguments_trap_before_writing() {
    let pair = Pair::new(64, 64);
    pair.fill(0, 3);
    let (c0, c1) = (pair.channel(0, LONG_NS), pair.channel(1, SHORT_NS));
    let cases: [(&str, u64, u64, u64, u32); 6] = [
        ("misaligned scratch offset", 8, 0, 8, 1),
        ("packets past the scratch", 48, 0, 9, 1),
        ("data past the buffer", 0, 60, 8, 1),
        ("flag 0", 0, 0, 8, 0),
        ("scratch offset overflow", u64::MAX - 15, 0, 8, 1),
        ("size overflow", 0, 0, u64::MAX, 1),
    ];
    for (what, scratch_off, off, size, flag) in cases {
        assert!(
            traps(|| c0.put_packets(scratch_off, off, size, 0, 1, flag)),
            "put, {what}"
        );
        assert!(
            traps(|| c1.unpack_packets(off, scratch_off, size, 0, 1, flag)),
            "unpack, {what}"
        );
    }
    assert!(
        traps(|| c0.put_packets(0, 0, 8, 1, 1, 1)),
        "thread outside the partition"
    );
    assert!(pair.scratch(1).iter().all(|&b| b == 0), "scratch written");
    assert!(pair.buf(1).iter().all(|&b| b == 0), "buffer written");
    // 32 bytes of data fill the 64-byte scratch exactly.
    c0.put_packets(0, 0, 32, 0, 1, 1);
    c1.unpack_packets(0, 0, 32, 0, 1, 1);
    assert_eq!(&pair.buf(1)[..32], &pair.buf(0)[..32]);
}

/// Rounds of packets between two ranks running at once, both directions, the scratch never
/// cleared, the flags starting at `first` and advancing with `next_flag`.
fn packet_rounds<P: Packet>(first: u32, rounds: u32, size: u64) {
    let pair = Pair::new(size + 64, scratch_bytes::<P>(size).unwrap());
    let errors = core::sync::atomic::AtomicU64::new(0);
    let res = run_ranks(8, |rank| {
        let ch = pair.channel(rank, LONG_NS);
        let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
        let mut flag = first;
        for r in 0..rounds {
            let sender = (r % 2 == 0) == (rank == 0);
            let seed = r as u64 * 2 + (!sender as u64 ^ rank as u64);
            if sender {
                let p = ch.local_range(3, size);
                for i in (t as u64..size).step_by(nt as usize) {
                    // SAFETY: in range; only this thread writes these bytes this round,
                    // and no thread reads them until after the barrier.
                    unsafe { *p.add(i as usize) = probe_value(seed, 0, i) as u8 };
                }
                arch::sync_threads();
                ch.put_packets_of::<P>(0, 3, size, t, nt, flag);
            } else {
                assert_eq!(
                    ch.try_unpack_packets_of::<P>(5, 0, size, t, nt, flag, LONG_NS),
                    Ok(())
                );
                arch::sync_threads();
                let p = ch.local_range(5, size);
                for i in (t as u64..size).step_by(nt as usize) {
                    // SAFETY: in range; written by this block's unpack before the barrier.
                    if unsafe { *p.add(i as usize) } != probe_value(seed, 0, i) as u8 {
                        errors.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
            // Fills of the next round must not overwrite bytes still being read.
            arch::sync_threads();
            flag = next_flag(flag);
        }
    });
    assert_eq!(res, [Ok(()), Ok(())]);
    assert_eq!(errors.into_inner(), 0);
}

#[test]
fn packet_rounds_reuse_the_scratch_across_the_flag_wrap() {
    // 40 rounds from u32::MAX - 20: through u32::MAX, then 1 (0 is skipped).
    packet_rounds::<LlPacket>(u32::MAX - 20, 40, 4096 + 7);
    packet_rounds::<LlWidePacket>(u32::MAX - 20, 40, 4096 + 7);
    packet_rounds::<LlPacket>(1, 30, 1);
    packet_rounds::<LlWidePacket>(1, 30, 17);
    assert_eq!(flag_for_round(u32::MAX as u64 + 1), 1);
}

#[test]
fn unpack_times_out_on_missing_or_stale_packets() {
    use crate::channel::ChannelError::Timeout;
    let pair = Pair::new(64, 128);
    pair.fill(0, 9);
    pair.fill(1, 10);
    let before = pair.buf(1).to_vec();
    let (c0, c1) = (pair.channel(0, LONG_NS), pair.channel(1, SHORT_NS));
    // Nothing sent: zeroed scratch never matches a valid flag.
    assert_eq!(
        c1.try_unpack_packets(0, 0, 64, 0, 1, 1, SHORT_NS),
        Err(Timeout)
    );
    // Sent with flag 7: waiting for flag 8 (the next round) times out; nothing is written.
    c0.put_packets(0, 0, 64, 0, 1, 7);
    assert_eq!(
        c1.try_unpack_packets(0, 0, 64, 0, 1, 8, SHORT_NS),
        Err(Timeout)
    );
    assert_eq!(pair.buf(1), &before[..]);
    // The trapping form fails the launch instead of hanging it.
    let r = launch(Dim3::x(1), Dim3::x(4), || {
        c1.unpack_packets(0, 0, 64, arch::thread_idx_x(), arch::block_dim_x(), 8)
    });
    assert_eq!(r, Err(LaunchError::Panicked("trap".into())));
    // Flag 7 is there.
    assert_eq!(c1.try_unpack_packets(0, 0, 64, 0, 1, 7, SHORT_NS), Ok(()));
    assert_eq!(pair.buf(1), pair.buf(0));
    // A thread whose later packet is missing stops there: one packet of two written.
    c0.put_packets(0, 0, 8, 0, 1, 9);
    pair.fill(1, 11);
    let before = pair.buf(1).to_vec();
    assert_eq!(
        c1.try_unpack_packets(0, 0, 16, 0, 1, 9, SHORT_NS),
        Err(Timeout)
    );
    assert_eq!(&pair.buf(1)[..8], &pair.buf(0)[..8]);
    assert_eq!(&pair.buf(1)[8..], &before[8..]);
}

/// A packet wait gives up within a second of an abort raised while it waits, long before its
/// timeout, and says so; a later wait gives up at once, yet packets that are there are still
/// taken; `unpack_packets` traps.
#[test]
fn unpack_ends_at_abort_and_still_takes_packets_that_are_there() {
    use crate::channel::ChannelError::Aborted;
    let pair = Pair::new(64, 128);
    pair.fill(0, 5);
    let (c0, c1) = (pair.channel(0, LONG_NS), pair.channel(1, LONG_NS));
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            pair.abort(3);
        });
        // Four threads, each waiting for its own packets (none was sent).
        let r = launch(Dim3::x(1), Dim3::x(4), || {
            let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
            assert_eq!(
                c1.try_unpack_packets(0, 0, 64, t, nt, 1, LONG_NS),
                Err(Aborted { word: 3 })
            );
        });
        assert_eq!(r, Ok(()));
    });
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(1), "{took:?}");
    assert_eq!(
        c1.try_unpack_packets(0, 0, 64, 0, 1, 2, LONG_NS),
        Err(Aborted { word: 3 })
    );
    let r = launch(Dim3::x(1), Dim3::x(1), || {
        c1.unpack_packets(0, 0, 64, 0, 1, 2)
    });
    assert_eq!(r, Err(LaunchError::Panicked("trap".into())));
    c0.put_packets(0, 0, 64, 0, 1, 2);
    assert_eq!(c1.try_unpack_packets(0, 0, 64, 0, 1, 2, LONG_NS), Ok(()));
    assert_eq!(pair.buf(1), pair.buf(0));
}

/// A packet wait that is long late (past the first `ABORT_LOOK_NS`, where it starts looking
/// at the abort word) still takes every byte: half the packets come at once, the other half
/// 100 ms later, to one thread waiting for all of them.
#[test]
fn a_late_packet_wait_still_takes_every_byte() {
    let pair = Pair::new(64, 128);
    pair.fill(0, 21);
    pair.fill(1, 22);
    let (c0, c1) = (pair.channel(0, LONG_NS), pair.channel(1, LONG_NS));
    std::thread::scope(|s| {
        s.spawn(|| {
            c0.put_packets(0, 0, 32, 0, 1, 4);
            std::thread::sleep(std::time::Duration::from_millis(100));
            // Bytes 32..64 are packets 4..8, at scratch byte 64.
            c0.put_packets(64, 32, 32, 0, 1, 4);
        });
        assert_eq!(c1.try_unpack_packets(0, 0, 64, 0, 1, 4, LONG_NS), Ok(()));
    });
    assert_eq!(pair.buf(1), pair.buf(0));
}

#[test]
fn put_then_signal_is_seen_after_wait_for_many_rounds() {
    // The bare protocol without the kernels: rank 0 puts round r's data, barriers and
    // signals; rank 1 waits, barriers, checks, and signals back that it is done reading.
    const ROUNDS: u64 = 300;
    const SIZE: u64 = 1000;
    let pair = Pair::new(SIZE, 0);
    let errors = core::sync::atomic::AtomicU64::new(0);
    let res = run_ranks(4, |rank| {
        let ch = pair.channel(rank, LONG_NS);
        let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
        let p = ch.local_range(0, SIZE);
        for r in 1..=ROUNDS {
            if rank == 0 {
                for i in (t as u64..SIZE).step_by(nt as usize) {
                    // SAFETY: in range; rank 1 read these bytes before its last signal.
                    unsafe { *p.add(i as usize) = (r * 31 + i) as u8 };
                }
                arch::sync_threads();
                ch.put(0, 0, SIZE, t, nt);
                arch::sync_threads();
                if t == 0 {
                    ch.signal();
                    ch.wait();
                }
                arch::sync_threads();
            } else {
                if t == 0 {
                    ch.wait();
                }
                arch::sync_threads();
                for i in (t as u64..SIZE).step_by(nt as usize) {
                    // SAFETY: in range; published by rank 0's barrier + signal.
                    if unsafe { *p.add(i as usize) } != (r * 31 + i) as u8 {
                        errors.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
                    }
                }
                arch::sync_threads();
                if t == 0 {
                    ch.signal();
                }
            }
        }
    });
    assert_eq!(res, [Ok(()), Ok(())]);
    assert_eq!(errors.into_inner(), 0);
    assert_eq!((pair.inbound(0), pair.inbound(1)), (ROUNDS, ROUNDS));
}

#[test]
fn channel_waits_time_out_and_trap() {
    let pair = Pair::new(16, 0);
    let ch = pair.channel(0, SHORT_NS);
    assert!(!ch.poll());
    assert!(!ch.wait_timeout(SHORT_NS));
    assert!(traps(|| ch.wait()));
    pair.channel(1, SHORT_NS).signal();
    assert!(ch.poll());
    assert!(!ch.poll(), "one signal is consumed once");
    pair.channel(1, SHORT_NS).relaxed_signal();
    ch.wait();
}

#[test]
fn handles_are_laid_out_for_the_host() {
    assert_eq!(core::mem::size_of::<MemoryChannel<'static>>(), 96);
    assert_eq!(core::mem::align_of::<MemoryChannel<'static>>(), 8);
    assert_eq!(core::mem::offset_of!(MemoryChannel<'static>, semaphore), 56);
    let pair = Pair::new(16, 16);
    let s = std::format!("{:?}", pair.channel(0, 5));
    assert!(
        s.contains("local_len: 16") && s.contains("timeout_ns: 5"),
        "{s}"
    );
}
