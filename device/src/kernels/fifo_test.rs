//! A kernel that pushes triggers from many threads of many blocks, for the FIFO's tests and
//! benchmark: each trigger encodes who pushed it, so the consumer can check that every one
//! arrives exactly once and intact.

use crate::arch;
use crate::fifo::{FifoDeviceHandle, MAX_CONNECTION_ID, Trigger, TriggerOp};
use crate::kernel;

/// Word layout of the `status` buffer of [`fifo_push_test`] (u64 words, zeroed before
/// launch; host-mapped so the consumer can watch it).
pub mod status {
    /// 0 while running or after success; [`TIMED_OUT`](super::TIMED_OUT) if a thread gave
    /// up waiting on the FIFO.
    pub const STATE: usize = 0;
    /// The sequence number of the first wait that timed out.
    pub const TIMED_OUT_SEQ: usize = 1;
    /// Number of threads that have ended (after all their pushes, or a timeout).
    pub const FINISHED_THREADS: usize = 2;
    /// Number of words the buffer must hold.
    pub const COUNT: usize = 4;
}

/// [`status::STATE`]: a push or sync timed out.
pub const TIMED_OUT: u64 = 1;

fn check_id(block: u32, thread: u32, k: u32) -> u32 {
    block
        .wrapping_mul(37)
        .wrapping_add(thread.wrapping_mul(11))
        .wrapping_add(k.wrapping_mul(3))
        & MAX_CONNECTION_ID
}

/// The trigger that thread `thread` of block `block` pushes as its `k`-th: destination
/// offset = block, source offset = thread, size = k, operation = `k % 8`, connection id = a
/// checksum of the three. Thread 0 of block 0 pushes the all-zero trigger first.
#[inline]
pub fn test_trigger(block: u32, thread: u32, k: u32) -> Trigger {
    let op = match TriggerOp::from_bits((k & 7) as u8) {
        Some(op) => op,
        None => TriggerOp::NONE,
    };
    // u32 values always fit the 32-bit fields and the checksum is masked to 10 bits.
    match Trigger::new(
        op,
        check_id(block, thread, k),
        block as u64,
        thread as u64,
        k as u64,
    ) {
        Ok(t) => t,
        Err(_) => Trigger::ZERO,
    }
}

/// `(block, thread, k)` of a trigger made by [`test_trigger`], or `None` if it is not one
/// (a field was corrupted).
pub fn decode_test_trigger(t: &Trigger) -> Option<(u32, u32, u32)> {
    let (block, thread, k) = (
        t.dst_offset() as u32,
        t.src_offset() as u32,
        t.size() as u32,
    );
    (test_trigger(block, thread, k) == *t).then_some((block, thread, k))
}

/// Reports in `status_words` (see [`status`]) that a push or sync of sequence `seq` timed
/// out: the seq first, then the state that points to it (both release).
///
/// # Safety
/// `status_words` holds [`status::COUNT`] live, aligned words that the host reads only
/// atomically.
#[inline(always)]
pub unsafe fn report_timeout(status_words: *mut u64, seq: u64) {
    // SAFETY: caller contract. Release: the seq is written before the state that points
    // to it.
    unsafe {
        arch::st_release_sys_u64(status_words.wrapping_add(status::TIMED_OUT_SEQ), seq);
        arch::st_release_sys_u64(status_words.wrapping_add(status::STATE), TIMED_OUT);
    }
}

/// Counts this thread as finished in `status_words[status::FINISHED_THREADS]` (release: the
/// host, seeing every thread counted, also sees a [`report_timeout`] made before).
///
/// # Safety
/// As for [`report_timeout`].
#[inline(always)]
pub unsafe fn count_finished(status_words: *mut u64) {
    // SAFETY: caller contract.
    unsafe {
        arch::atomic_add_release_sys_u64(status_words.wrapping_add(status::FINISHED_THREADS), 1)
    };
}

kernel! {
    /// Every thread of every block pushes `pushes` triggers ([`test_trigger`]`(block,
    /// thread, k)` for `k` in `0..pushes`) into `fifo`; with `sync_each != 0` it also
    /// waits after each push until the proxy has popped it (a round trip). A wait that
    /// times out is reported in `status_words` (see [`status`]) and ends the thread's
    /// pushes; every thread adds one, as it ends, to
    /// `status_words[status::FINISHED_THREADS]`. Launch with a 1-D grid.
    pub unsafe fn fifo_push_test(
        fifo: FifoDeviceHandle,
        pushes: u32,
        sync_each: u32,
        status_words: *mut u64,
    ) {
        let (block, thread) = (arch::block_idx_x(), arch::thread_idx_x());
        for k in 0..pushes {
            // SAFETY: the host keeps the FIFO alive until the kernel has finished.
            let r = unsafe {
                match fifo.try_push(test_trigger(block, thread, k)) {
                    Ok(seq) if sync_each != 0 => fifo.try_sync(seq),
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = r {
                // SAFETY: `status_words` holds status::COUNT live, aligned words (caller
                // contract).
                unsafe { report_timeout(status_words, e.seq) };
                break;
            }
        }
        // SAFETY: as above.
        unsafe { count_finished(status_words) };
    }
}
