//! Kernels over memory channels ([`MemoryChannel`]), for the GPU tests and benches and, on
//! CPU threads, the channel's own tests: ping-pongs that check every byte (put, get, LL
//! packets), a signal-only ping-pong for the round-trip latency, and a multi-block put for
//! bandwidth.
//!
//! Two ranks, 0 and 1, each launch the same kernel with its own channel (the two channels
//! pair up: each one's remote buffer, outbound scratch and remote counter are the other's
//! local buffer, inbound scratch and inbound counter). Messages are
//! [`pattern`](fill_pattern) bytes derived from [`probe_value`], so a receiver can check
//! every byte of every round.

use crate::arch;
use crate::channel::MemoryChannel;
use crate::kernel;
use crate::kernels::smoke::probe_value;
use crate::packet::{self, LlPacket, Packet, flag_for_round};

/// Bytes per pattern chunk: chunk `j` is the little-endian bytes of
/// `probe_value(seed, round, j)`. Equal to [`LlPacket`]'s data bytes, so a thread that
/// fills chunks `t, t + threads, …` is the thread that sends them as packets.
pub const PATTERN_CHUNK: u64 = 8;

const _: () = assert!(PATTERN_CHUNK == LlPacket::DATA_BYTES);

/// Byte `i` of the pattern of `(seed, round)`.
#[inline]
pub fn pattern_byte(seed: u64, round: u64, i: u64) -> u8 {
    (probe_value(seed, round, i / PATTERN_CHUNK) >> (8 * (i % PATTERN_CHUNK))) as u8
}

/// Writes the pattern of `(seed, round)` to `p[..bytes]` (any alignment): thread `thread` of
/// `threads` writes chunks `thread, thread + threads, …` of [`PATTERN_CHUNK`] bytes.
///
/// # Safety
/// `p..p + bytes` must be valid for writes and not accessed concurrently by others.
#[inline]
pub unsafe fn fill_pattern(
    p: *mut u8,
    bytes: u64,
    seed: u64,
    round: u64,
    thread: u32,
    threads: u32,
) {
    packet::check_partition(thread, threads);
    let mut j = thread as u64;
    while j * PATTERN_CHUNK < bytes {
        let off = j * PATTERN_CHUNK;
        let len = (bytes - off).min(PATTERN_CHUNK);
        // SAFETY: off + len <= bytes (caller contract).
        unsafe {
            packet::store_chunk(
                p.wrapping_add(off as usize),
                len,
                [probe_value(seed, round, j), 0],
            )
        };
        j += threads as u64;
    }
}

/// Counts the bytes of `p[..bytes]` that differ from the pattern of `(seed, round)`, over the
/// chunks of thread `thread` of `threads` (as [`fill_pattern`] writes them).
///
/// # Safety
/// `p..p + bytes` must be valid for reads and not written concurrently.
#[inline]
pub unsafe fn count_mismatches(
    p: *const u8,
    bytes: u64,
    seed: u64,
    round: u64,
    thread: u32,
    threads: u32,
) -> u64 {
    packet::check_partition(thread, threads);
    let mut bad = 0u64;
    let mut j = thread as u64;
    while j * PATTERN_CHUNK < bytes {
        let off = j * PATTERN_CHUNK;
        let len = (bytes - off).min(PATTERN_CHUNK);
        // SAFETY: off + len <= bytes (caller contract).
        let got = unsafe { packet::load_chunk(p.wrapping_add(off as usize), len) }[0];
        let diff = got ^ probe_value(seed, round, j);
        for k in 0..len {
            bad += ((diff >> (8 * k)) & 0xff != 0) as u64;
        }
        j += threads as u64;
    }
    bad
}

/// Adds `bad` to the error counter, if non-zero.
#[inline(always)]
pub(crate) fn report(errors: *mut u64, bad: u64) {
    if bad != 0 {
        // Relaxed: a count read by the host after the kernel ends.
        // SAFETY: `errors` is a live counter (kernel contract).
        unsafe { arch::atomic_add_relaxed_gpu_u64(errors, bad) };
    }
}

/// Whether `rank` sends in round `round`: rank 0 in odd rounds, rank 1 in even ones.
#[inline(always)]
pub(crate) fn sends(rank: u32, round: u64) -> bool {
    (round % 2 == 1) == (rank == 0)
}

kernel! {
    /// One block, two ranks, `put`. In round `r` (1-based) the sender (rank 0 in odd rounds,
    /// rank 1 in even ones) fills `local[src_offset..][..bytes]` with the pattern of
    /// `(seed ^ rank, r)`, `put`s it to the peer's `dst_offset`, barriers, and thread 0
    /// signals; the receiver's thread 0 waits, the block barriers, and every thread checks
    /// its share of `local[dst_offset..][..bytes]`, adding wrong bytes to `*errors`. Any
    /// offsets and sizes (unaligned ones exercise the slow paths); out-of-range ones trap.
    #[allow(clippy::too_many_arguments)] // the argument list the host tests launch with
    pub unsafe fn memory_ping_pong(
        ch: MemoryChannel<'_>,
        bytes: u64,
        rounds: u64,
        rank: u32,
        seed: u64,
        src_offset: u64,
        dst_offset: u64,
        errors: *mut u64,
    ) {
        let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
        let src = ch.local_range(src_offset, bytes);
        let dst = ch.local_range(dst_offset, bytes);
        for r in 1..=rounds {
            if sends(rank, r) {
                // SAFETY: `src` was bounds-checked; the peer only writes `dst` ranges, and
                // not before this round's signal when they overlap.
                unsafe { fill_pattern(src, bytes, seed ^ rank as u64, r, t, nt) };
                arch::sync_threads();
                ch.put(dst_offset, src_offset, bytes, t, nt);
                arch::sync_threads();
                if t == 0 {
                    ch.signal();
                }
            } else {
                if t == 0 {
                    ch.wait();
                }
                arch::sync_threads();
                // SAFETY: bounds-checked; the peer's put is complete and visible (its
                // barrier + release signal, our acquire wait + barrier).
                let bad = unsafe { count_mismatches(dst, bytes, seed ^ (rank ^ 1) as u64, r, t, nt) };
                report(errors, bad);
                // The next round refills `src`, which may overlap `dst`.
                arch::sync_threads();
            }
        }
    }
}

kernel! {
    /// [`memory_ping_pong`] with `get`: in round `r` the owner (rank 0 in odd rounds) fills
    /// `local[src_offset..][..bytes]`, barriers, and thread 0 signals; the other rank waits,
    /// barriers, `get`s the owner's `src_offset` range into its own `dst_offset`, barriers
    /// and checks it. Its next round's signal (sent after that barrier) also tells the owner
    /// that the get is over, so the owner refills its source only after it.
    #[allow(clippy::too_many_arguments)] // the argument list the host tests launch with
    pub unsafe fn memory_get_ping_pong(
        ch: MemoryChannel<'_>,
        bytes: u64,
        rounds: u64,
        rank: u32,
        seed: u64,
        src_offset: u64,
        dst_offset: u64,
        errors: *mut u64,
    ) {
        let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
        let src = ch.local_range(src_offset, bytes);
        let dst = ch.local_range(dst_offset, bytes);
        for r in 1..=rounds {
            if sends(rank, r) {
                // SAFETY: bounds-checked; the peer's last get of `src` ended before the
                // signal we waited for in the previous round.
                unsafe { fill_pattern(src, bytes, seed ^ rank as u64, r, t, nt) };
                arch::sync_threads();
                if t == 0 {
                    ch.signal();
                }
            } else {
                if t == 0 {
                    ch.wait();
                }
                arch::sync_threads();
                ch.get(dst_offset, src_offset, bytes, t, nt);
                arch::sync_threads();
                // SAFETY: bounds-checked; the block's get ended at the barrier.
                let bad = unsafe { count_mismatches(dst, bytes, seed ^ (rank ^ 1) as u64, r, t, nt) };
                report(errors, bad);
                arch::sync_threads();
            }
        }
    }
}

kernel! {
    /// One block, two ranks, LL packets. In round `r` the sender fills `local[..bytes]` with
    /// the pattern of `(seed ^ rank, r)` and `put_packets` it to offset 0 of the peer's
    /// scratch with flag [`flag_for_round`]`(r)`; the receiver `unpack_packets` into
    /// `local[..bytes]` and checks. No signal and no barrier: thread `t` fills, sends,
    /// receives and checks exactly the 8-byte chunks of its own packets (`t`, `t + threads`,
    /// …), so each thread runs its own ping-pong. The scratch (at least
    /// `scratch_bytes::<LlPacket>(bytes)`) is reused every round and never cleared.
    pub unsafe fn memory_packet_ping_pong(
        ch: MemoryChannel<'_>,
        bytes: u64,
        rounds: u64,
        rank: u32,
        seed: u64,
        errors: *mut u64,
    ) {
        let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
        let buf = ch.local_range(0, bytes);
        for r in 1..=rounds {
            let flag = flag_for_round(r);
            if sends(rank, r) {
                // SAFETY: bounds-checked; only this thread touches its chunks.
                unsafe { fill_pattern(buf, bytes, seed ^ rank as u64, r, t, nt) };
                ch.put_packets(0, 0, bytes, t, nt, flag);
            } else {
                ch.unpack_packets(0, 0, bytes, t, nt, flag);
                // SAFETY: as above.
                let bad = unsafe { count_mismatches(buf, bytes, seed ^ (rank ^ 1) as u64, r, t, nt) };
                report(errors, bad);
            }
        }
    }
}

kernel! {
    /// Signal/wait round trips: thread 0 of block 0 only; rank 0 signals then waits, rank 1
    /// waits then signals, `rounds` times. For the memory-channel round-trip benchmark.
    pub unsafe fn memory_signal_ping_pong(ch: MemoryChannel<'_>, rounds: u64, rank: u32) {
        signal_ping_pong(&ch, rounds, rank, false);
    }
}

kernel! {
    /// [`memory_signal_ping_pong`] with `relaxed_signal`: the same round trips without the
    /// system-scope release (a signal that publishes nothing), for the benchmark's floor.
    pub unsafe fn memory_relaxed_signal_ping_pong(ch: MemoryChannel<'_>, rounds: u64, rank: u32) {
        signal_ping_pong(&ch, rounds, rank, true);
    }
}

/// The body of the signal ping-pongs: thread 0 of block 0 only.
#[inline(always)]
fn signal_ping_pong(ch: &MemoryChannel<'_>, rounds: u64, rank: u32, relaxed: bool) {
    if arch::global_thread_idx_x() != 0 {
        return;
    }
    let signal = || {
        if relaxed {
            ch.relaxed_signal()
        } else {
            ch.signal()
        }
    };
    for _ in 0..rounds {
        if rank == 0 {
            signal();
            ch.wait();
        } else {
            ch.wait();
            signal();
        }
    }
}

/// Block `b` of `nb`'s share of `bytes` for the bandwidth kernels: one 16-byte aligned
/// slice per block, `(start, end)`, empty for blocks past the end.
#[inline(always)]
fn block_slice(bytes: u64, b: u64, nb: u64) -> (u64, u64) {
    let slice = bytes.div_ceil(nb).next_multiple_of(16);
    let start = b.saturating_mul(slice).min(bytes);
    (start, start.saturating_add(slice).min(bytes))
}

kernel! {
    /// Put bandwidth: rank 0's grid splits `local[..bytes]` into one 16-byte aligned slice
    /// per block and each block `put`s its slice to the same offsets of rank 1's buffer
    /// `iters` times, then barriers and its thread 0 signals once (a release add). Rank 1
    /// launches the same grid; its thread 0 of block 0 waits for `grid_dim_x` signals, the
    /// other threads return. No grid-wide barrier and no per-iteration synchronisation, so
    /// rank 0's kernel time is the data movement plus one signal per block; rank 1's kernel
    /// ends once all of it is visible there.
    pub unsafe fn memory_put_bench(ch: MemoryChannel<'_>, bytes: u64, iters: u64, rank: u32) {
        let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
        let (b, nb) = (arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
        if rank == 0 {
            let (start, end) = block_slice(bytes, b, nb);
            for _ in 0..iters {
                ch.put(start, start, end - start, t, nt);
            }
            arch::sync_threads();
            if t == 0 {
                ch.signal();
            }
        } else if b == 0 && t == 0 {
            for _ in 0..nb {
                ch.wait();
            }
        }
    }
}

kernel! {
    /// Get bandwidth: like [`memory_put_bench`] with the direction reversed. Rank 0's blocks
    /// `get` their slices of rank 1's buffer into their own, `iters` times (rank 1 does nothing:
    /// its buffer is only read, so no synchronisation is needed while both kernels run).
    pub unsafe fn memory_get_bench(ch: MemoryChannel<'_>, bytes: u64, iters: u64, rank: u32) {
        let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
        let (b, nb) = (arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
        if rank == 0 {
            let (start, end) = block_slice(bytes, b, nb);
            for _ in 0..iters {
                ch.get(start, start, end - start, t, nt);
            }
        }
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;

// Without a bound ptxas gives the copy kernels as many registers as it likes and blocks of
// more than 256 threads fail to launch. With the misaligned copy paths out of line these
// bounds cost no spills (ptxas -v): 63-64 registers for the ping-pongs at 1024 threads, 128
// for the put bench at 512 (at 1024 it spills 168 bytes per thread).
crate::launch_bounds!(memory_ping_pong, 1024);
crate::launch_bounds!(memory_get_ping_pong, 1024);
crate::launch_bounds!(memory_packet_ping_pong, 1024);
crate::launch_bounds!(memory_put_bench, 512);
crate::launch_bounds!(memory_get_bench, 512);
