//! Kernels over proxy channels ([`DevConn`]): the seed's ping-pong and an all-gather, used
//! by the GPU tests and benches.

use crate::arch;
use crate::channel::{ChannelError, DevConn, MemoryChannel};
use crate::kernel;
use crate::kernels::smoke::probe_value;

kernel! {
    /// One block, two ranks. In round `r` (1-based) the sender (rank 0 in odd rounds, rank 1
    /// in even ones) fills its `words` u64 with `probe_value(seed ^ rank, r, i)` and
    /// `put_with_signal`s them; the other rank `wait`s and checks every word, adding
    /// mismatches to `*errors`. `words == 0` gives a pure signal ping-pong (8-byte-free).
    pub unsafe fn proxy_ping_pong(
        conn: DevConn<'_>,
        buf: *mut u64,
        words: usize,
        rounds: u64,
        rank: u32,
        seed: u64,
        errors: *mut u64,
    ) {
        let t = arch::thread_idx_x() as usize;
        let nt = arch::block_dim_x() as usize;
        let peer = 1 - rank;
        for r in 1..=rounds {
            let sender = (r % 2 == 1) == (rank == 0);
            if sender {
                let mut i = t;
                while i < words {
                    // SAFETY: buf holds `words` u64 (caller contract).
                    unsafe { *buf.add(i) = probe_value(seed ^ rank as u64, r, i as u64) };
                    i += nt;
                }
                arch::sync_threads();
                if t == 0 {
                    conn.put_with_signal(0, 0, (words * 8) as u64);
                }
                arch::sync_threads();
            } else {
                if t == 0 {
                    conn.wait();
                }
                arch::sync_threads();
                let mut bad = 0u64;
                let mut i = t;
                while i < words {
                    // SAFETY: as above; the peer's put completed before its signal.
                    let v = unsafe { *buf.add(i) };
                    if v != probe_value(seed ^ peer as u64, r, i as u64) {
                        bad += 1;
                    }
                    i += nt;
                }
                if bad != 0 {
                    // SAFETY: `errors` is a live counter (caller contract).
                    unsafe { arch::atomic_add_relaxed_gpu_u64(errors, bad) };
                }
                arch::sync_threads();
            }
        }
    }
}

/// Byte `i` of the message [`proxy_bytes_ping_pong`] sends in round `round` from `seed`:
/// the little-endian bytes of [`probe_value`] words.
#[inline(always)]
pub fn probe_byte(seed: u64, round: u64, i: u64) -> u8 {
    (probe_value(seed, round, i / 8) >> (8 * (i % 8))) as u8
}

kernel! {
    /// One block, two ranks, messages of any byte count. In round `r` (1-based) the sender
    /// (rank 0 in odd rounds, rank 1 in even ones) writes `bytes` bytes
    /// `probe_byte(seed ^ rank, r, i)` at the start of its buffer and `put_with_signal`s
    /// them (`bytes == 0`: a bare `signal`, no put at all); the other rank `wait`s, then
    /// checks every byte under the flag and the byte just past the message (`guard`, when
    /// `bytes < cap`, must still be 0: the buffer starts zeroed and nobody writes it),
    /// adding mismatches to `*errors`. A flag raised before its data shows as bytes of the
    /// previous round.
    #[allow(clippy::too_many_arguments)] // the host side is coded against this signature
    pub unsafe fn proxy_bytes_ping_pong(
        conn: DevConn<'_>,
        buf: *mut u8,
        bytes: u64,
        cap: u64,
        rounds: u64,
        rank: u32,
        seed: u64,
        errors: *mut u64,
    ) {
        let t = arch::thread_idx_x() as u64;
        let nt = arch::block_dim_x() as u64;
        let peer = 1 - rank;
        for r in 1..=rounds {
            let sender = (r % 2 == 1) == (rank == 0);
            if sender {
                let mut i = t;
                while i < bytes {
                    // SAFETY: buf holds `cap >= bytes` bytes (caller contract).
                    unsafe { *buf.add(i as usize) = probe_byte(seed ^ rank as u64, r, i) };
                    i += nt;
                }
                arch::sync_threads();
                if t == 0 {
                    if bytes == 0 {
                        conn.signal();
                    } else {
                        conn.put_with_signal(0, 0, bytes);
                    }
                }
                arch::sync_threads();
            } else {
                if t == 0 {
                    conn.wait();
                }
                arch::sync_threads();
                let mut bad = 0u64;
                let mut i = t;
                while i < bytes {
                    // SAFETY: as above; volatile, so each byte is read after the wait; the
                    // peer's put completed before its signal.
                    let v = unsafe { core::ptr::read_volatile(buf.add(i as usize)) };
                    if v != probe_byte(seed ^ peer as u64, r, i) {
                        bad += 1;
                    }
                    i += nt;
                }
                if t == 0 && bytes < cap {
                    // SAFETY: `bytes < cap`, inside the buffer.
                    if unsafe { core::ptr::read_volatile(buf.add(bytes as usize)) } != 0 {
                        bad += 1;
                    }
                }
                if bad != 0 {
                    // SAFETY: `errors` is a live counter (caller contract).
                    unsafe { arch::atomic_add_relaxed_gpu_u64(errors, bad) };
                }
                arch::sync_threads();
            }
        }
    }
}

kernel! {
    /// All-gather over proxy channels: thread `i < nconns` puts this rank's chunk
    /// (`rank * chunk_bytes`, same offset on the peer) over `conns[i]`, signals, then waits
    /// for that peer's chunk. One block of at least `nconns` threads.
    pub unsafe fn proxy_all_gather(conns: *const DevConn<'_>, nconns: u32, rank: u32, chunk_bytes: u64) {
        let t = arch::thread_idx_x();
        if t < nconns {
            // SAFETY: `conns` holds `nconns` handles (caller contract).
            let c = unsafe { *conns.add(t as usize) };
            c.put(rank as u64 * chunk_bytes, chunk_bytes);
            c.signal();
            c.wait();
        }
    }
}

kernel! {
    /// Bandwidth probe over one proxy channel: rank 0 queues `iters` puts of `size` bytes
    /// (offset 0 on both sides) and one signal; rank 1 waits for it. One thread.
    pub unsafe fn proxy_put_bench(conn: DevConn<'_>, size: u64, iters: u64, rank: u32) {
        if arch::global_thread_idx_x() != 0 {
            return;
        }
        if rank == 0 {
            for _ in 0..iters {
                conn.put(0, size);
            }
            conn.signal();
        } else {
            conn.wait();
        }
    }
}

kernel! {
    /// Latency probe for what a proxy issues: for `i` in `1..=rounds`, one thread waits
    /// (acquire loads, system scope) until `*flag >= i`, then stores `i` to `*ack` with a
    /// release store. `flag` may be device memory written by a copy engine or a stream
    /// write, or host-mapped memory written by a CPU; `ack` is host-mapped memory the host
    /// polls. Traps after `timeout_ns` without progress.
    pub unsafe fn flag_echo(flag: *const u64, ack: *mut u64, rounds: u64, timeout_ns: u64) {
        if arch::global_thread_idx_x() != 0 {
            return;
        }
        for i in 1..=rounds {
            let start = arch::global_timer_ns();
            // SAFETY: `flag` is a live aligned word (caller contract).
            while unsafe { arch::ld_acquire_sys_u64(flag) } < i {
                if arch::global_timer_ns().wrapping_sub(start) > timeout_ns {
                    arch::trap();
                }
            }
            // SAFETY: `ack` is a live aligned word (caller contract).
            unsafe { arch::st_release_sys_u64(ack, i) };
        }
    }
}

/// Writes a channel operation's outcome as two words at `out`: the kind
/// ([`STATUS_OK`], [`STATUS_TIMEOUT`], [`STATUS_ABORTED`], [`STATUS_REFUSED`],
/// [`STATUS_LEFT`]) and the detail (the abort word, the refused connection, or the rank
/// that left).
///
/// # Safety
/// `out` must be valid for two `u64` writes.
pub unsafe fn write_status(out: *mut u64, r: Result<(), ChannelError>) {
    let (kind, detail) = match r {
        Ok(()) => (STATUS_OK, 0),
        Err(ChannelError::Timeout) => (STATUS_TIMEOUT, 0),
        Err(ChannelError::Aborted { word }) => (STATUS_ABORTED, word),
        Err(ChannelError::ProxyRefused { connection }) => (STATUS_REFUSED, connection as u64),
        Err(ChannelError::PeerLeft { rank }) => (STATUS_LEFT, rank as u64),
    };
    // SAFETY: caller contract; volatile so the host reads what was written even if the
    // kernel is stopped later.
    unsafe {
        core::ptr::write_volatile(out, kind);
        core::ptr::write_volatile(out.add(1), detail);
    }
}

/// [`write_status`]: the operation succeeded.
pub const STATUS_OK: u64 = 1;
/// [`write_status`]: [`ChannelError::Timeout`].
pub const STATUS_TIMEOUT: u64 = 2;
/// [`write_status`]: [`ChannelError::Aborted`] (detail: the abort word).
pub const STATUS_ABORTED: u64 = 3;
/// [`write_status`]: [`ChannelError::ProxyRefused`] (detail: the connection).
pub const STATUS_REFUSED: u64 = 4;
/// [`write_status`]: [`ChannelError::PeerLeft`] (detail: the rank).
pub const STATUS_LEFT: u64 = 5;

kernel! {
    /// One thread waits up to `timeout_ns` on the memory channel `ch`, first for 64 bytes of
    /// LL packets with flag 1 at scratch offset 0 (into buffer offset 0), then for a signal,
    /// then on the proxy channel `conn` for a signal, none of which may ever come, and writes
    /// each outcome ([`write_status`]) to `out[0..2]`, `out[2..4]` and `out[4..6]`: a wait
    /// of an aborted communicator ends with [`STATUS_ABORTED`] instead of hanging until its
    /// timeout. `ch` needs 128 bytes of packet scratch.
    pub unsafe fn user_wait_status(
        ch: MemoryChannel<'_>,
        conn: DevConn<'_>,
        timeout_ns: u64,
        out: *mut u64,
    ) {
        if arch::global_thread_idx_x() != 0 {
            return;
        }
        // SAFETY: `out` holds six words (caller contract).
        unsafe {
            write_status(out, ch.try_unpack_packets(0, 0, 64, 0, 1, 1, timeout_ns));
            write_status(out.add(2), ch.try_wait(timeout_ns));
            write_status(out.add(4), conn.try_wait(timeout_ns));
        }
    }
}

kernel! {
    /// One thread queues a put of `size` bytes from offset 0 to `dst_offset` on `conn`,
    /// then signals, and writes the signal's outcome ([`write_status`]) to `out[0..2]`: a
    /// put the proxy refused (outside the buffers) makes it [`STATUS_REFUSED`].
    pub unsafe fn proxy_put_status(conn: DevConn<'_>, dst_offset: u64, size: u64, out: *mut u64) {
        if arch::global_thread_idx_x() != 0 {
            return;
        }
        conn.put_at(dst_offset, 0, size);
        // SAFETY: `out` holds two words (caller contract).
        unsafe { write_status(out, conn.try_signal()) };
    }
}

kernel! {
    /// One thread queues `pushes` puts of 8 bytes (offset 0 to 0) on `conn`, then a queued
    /// put with signal and then a signal, and writes their outcomes ([`write_status`]) to
    /// `out[0..2]` and `out[2..4]`. With no proxy popping and `pushes` the FIFO's slot count,
    /// the queued put waits for a slot that never frees: an abort ends that wait with
    /// [`STATUS_ABORTED`] (not a trap at the FIFO's timeout), and the signal after it says
    /// the same at once.
    pub unsafe fn proxy_push_status(conn: DevConn<'_>, pushes: u64, out: *mut u64) {
        if arch::global_thread_idx_x() != 0 {
            return;
        }
        for _ in 0..pushes {
            conn.put_at(0, 0, 8);
        }
        // SAFETY: `out` holds four words (caller contract).
        unsafe {
            write_status(out, conn.try_put_with_signal_queued(0, 0, 8));
            write_status(out.add(2), conn.try_signal());
        }
    }
}

#[cfg(test)]
mod tests;
