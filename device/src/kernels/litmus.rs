//! Litmus kernels: the orderings the protocols rely on, run across two GPUs many times with
//! every violation counted, each next to a deliberately weakened variant that shows the test
//! can see a violation (where the hardware ever shows one). The CPU emulation cannot see weak
//! ordering, so these only mean something on GPUs (`tests/gpu_litmus.rs`).
//!
//! Two of them are between GPUs and the others between a GPU and the proxy's CPU thread:
//! [`litmus_fifo_publish`] (a trigger is seen whole and after the data written before its
//! push) and [`litmus_flag_after_copy`] (the proxy's flag is seen after the copy it follows).
//!
//! The two GPU-to-GPU kernels run one writer (rank 0) and one reader (rank 1), each with a grid of blocks;
//! block `b` uses region `b` of both ranks' buffers ([`region_words`] words each): `words`
//! data words, then a flag word and an acknowledgement word on lines of their own. The writer
//! writes into the reader's buffer (`remote`, mapped over NVLink), the reader acknowledges
//! into the writer's (`remote` on its side), so iteration `i + 1` starts only after the reader
//! has checked iteration `i`. `out[0]` counts violations, `out[1]` waits that timed out
//! (the kernel then stops).

use crate::arch;
use crate::fifo::{FifoDeviceHandle, Publish};
use crate::kernel;
use crate::kernels::fifo_test;
use crate::packet::{Ll8Packet, LlPacket, poll_words};

/// Words of one block's region for `words` data words: the data, then the flag and the
/// acknowledgement 16 words (128 bytes) apart.
#[inline(always)]
pub const fn region_words(words: u64) -> u64 {
    words.next_multiple_of(16) + 32
}

/// Spins until `*p >= want` (acquire when `acquire`, else relaxed), or counts a timeout in
/// `out[1]` and returns false after `timeout_ns`.
///
/// # Safety
/// `p` valid, aligned, written only by atomics; `out` two valid words.
#[inline(always)]
unsafe fn wait_at_least(p: *const u64, want: u64, acquire: bool, out: *mut u64) -> bool {
    let start = arch::global_timer_ns();
    let mut round = 0u32;
    loop {
        // SAFETY: caller contract.
        let v = unsafe {
            if acquire {
                arch::ld_acquire_sys_u64(p)
            } else {
                arch::ld_relaxed_sys_u64(p)
            }
        };
        if v >= want {
            return true;
        }
        if arch::global_timer_ns().wrapping_sub(start) > 10_000_000_000 {
            // SAFETY: caller contract.
            unsafe { arch::atomic_add_relaxed_gpu_u64(out.add(1), 1) };
            return false;
        }
        arch::spin_backoff(round);
        round = round.wrapping_add(1);
    }
}

kernel! {
    /// Message passing through a device semaphore, the pattern every semaphore algorithm
    /// uses: the writer's threads store 16 bytes each of iteration `i` into the reader's
    /// buffer with weak stores, the block syncs, thread 0 adds 1 to the reader's flag; the
    /// reader's thread 0 waits for the flag to reach `i`, the block syncs, every thread
    /// loads its 16 bytes with weak loads and counts a violation when they are older than
    /// `i`. `variant` 0: the library's `red.release.sys` add and `ld.acquire.sys` poll;
    /// 1: a relaxed add (no release); 2: a relaxed poll (no acquire). The latency candidates
    /// of `kernels::latency`, each with the library's other half: 3: `fence.acq_rel.sys` +
    /// relaxed add (its weakened twin: 1); 4: `st.release.sys` of the count `i`; 5:
    /// `fence.acq_rel.sys` + `st.relaxed.sys` of `i` (the twin of 4 and 5: 8, a relaxed
    /// store of `i`); 6: relaxed polls + one `fence.acq_rel.sys` after (twin: 2); 7: every
    /// thread `fence.acq_rel.sys` before the barrier, then thread 0's relaxed add (ordered by
    /// the hardware's fences, not a release pattern of the model; twin: 1). Blocks of
    /// `words / 2` threads (`words` even).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn litmus_message_passing(
        local: *mut u64,
        remote: *mut u64,
        words: u64,
        iters: u64,
        rank: u32,
        variant: u32,
        out: *mut u64,
    ) {
        let (t, b) = (arch::thread_idx_x() as u64, arch::block_idx_x() as u64);
        let stride = region_words(words);
        let data = t * 2;
        let flag = words.next_multiple_of(16);
        let ack = flag + 16;
        // SAFETY (whole body): both buffers hold grid_dim_x regions (launch contract); each
        // thread touches its own two data words and thread 0 the flag and ack words.
        let (mine, theirs) = unsafe { (local.add((b * stride) as usize), remote.add((b * stride) as usize)) };
        // SAFETY: the spare word between the flag and the ack, this block's own.
        let stop = unsafe { mine.add((flag + 8) as usize) };
        for i in 1..=iters {
            if rank == 0 {
                // SAFETY: see above.
                if t == 0 && unsafe { !wait_at_least(mine.add(ack as usize), i - 1, true, out) } {
                    // SAFETY: see above.
                    unsafe { set_stop(stop) };
                }
                arch::sync_threads();
                // SAFETY: see above; the reader has checked iteration i - 1.
                unsafe { arch::st_weak_v2_u64(theirs.add(data as usize), i, i) };
                if variant == 7 {
                    arch::fence_acq_rel_sys();
                }
                arch::sync_threads();
                if t == 0 {
                    // SAFETY: see above; thread 0 is the flag's only writer (stores of `i`).
                    unsafe {
                        let f = theirs.add(flag as usize);
                        match variant {
                            1 | 7 => arch::red_add_relaxed_sys_u64(f, 1),
                            3 => {
                                arch::fence_acq_rel_sys();
                                arch::red_add_relaxed_sys_u64(f, 1);
                            }
                            4 => arch::st_release_sys_u64(f, i),
                            5 => {
                                arch::fence_acq_rel_sys();
                                arch::st_relaxed_sys_u64(f, i);
                            }
                            8 => arch::st_relaxed_sys_u64(f, i),
                            _ => arch::red_add_release_sys_u64(f, 1),
                        }
                    }
                }
            } else {
                // SAFETY: see above.
                if t == 0 {
                    // SAFETY: see above.
                    if unsafe { !wait_at_least(mine.add(flag as usize), i, variant != 2 && variant != 6, out) } {
                        // SAFETY: see above.
                        unsafe { set_stop(stop) };
                    }
                    if variant == 6 {
                        // Acquire pattern: the relaxed poll that saw `i`, then a fence.
                        arch::fence_acq_rel_sys();
                    }
                }
                arch::sync_threads();
                // SAFETY: see above; published by the flag (variant 0).
                let v = unsafe { arch::ld_weak_v2_u64(mine.add(data as usize)) };
                if v[0] < i || v[1] < i {
                    // SAFETY: out holds two words.
                    unsafe { arch::atomic_add_relaxed_gpu_u64(out, 1) };
                }
                arch::sync_threads();
                if t == 0 {
                    // SAFETY: see above.
                    unsafe { arch::red_add_release_sys_u64(theirs.add(ack as usize), 1) };
                }
            }
            // Every thread of a block stops together.
            // SAFETY: see above.
            if unsafe { stop_now(stop) } {
                return;
            }
        }
    }
}

kernel! {
    /// LL packets never seen torn: the writer's threads write one LL packet each per
    /// iteration into the reader's buffer (data a function of iteration and slot, flag the
    /// iteration, no signal); the reader's threads poll their packet until both flag copies
    /// equal the iteration's and count a violation when its data is not that iteration's.
    /// After the block syncs, the reader's thread 0 acknowledges. `variant` 0: the library's one 16-byte store;
    /// 1: four 4-byte stores, flags first (a writer that can be seen torn); 2: the same 8
    /// data bytes as two [`Ll8Packet`]s (one 8-byte store each, read and validated one by
    /// one: the LL8 layout of `kernels::latency`). Blocks of
    /// `words / 2` threads (`words` even).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn litmus_ll_packets(
        local: *mut u64,
        remote: *mut u64,
        words: u64,
        iters: u64,
        rank: u32,
        variant: u32,
        out: *mut u64,
    ) {
        let (t, b) = (arch::thread_idx_x() as u64, arch::block_idx_x() as u64);
        let stride = region_words(words);
        let ack = words.next_multiple_of(16) + 16;
        // SAFETY (whole body): as in litmus_message_passing; slot t is the thread's own.
        let (mine, theirs) = unsafe { (local.add((b * stride) as usize), remote.add((b * stride) as usize)) };
        // SAFETY: the spare word before the ack, this block's own.
        let stop = unsafe { mine.add((ack - 8) as usize) };
        for i in 1..=iters {
            let want = pattern(i, b, t);
            let flag = (i % u32::MAX as u64) as u32 + 1;
            if rank == 0 {
                // SAFETY: see above.
                if t == 0 && unsafe { !wait_at_least(mine.add(ack as usize), i - 1, true, out) } {
                    // SAFETY: see above.
                    unsafe { set_stop(stop) };
                }
                arch::sync_threads();
                // SAFETY: see above.
                unsafe {
                    let slot = theirs.add((t * 2) as usize) as *mut LlPacket;
                    if variant == 2 {
                        let p = slot as *mut Ll8Packet;
                        Ll8Packet::write(p, want as u32, flag);
                        Ll8Packet::write(p.add(1), (want >> 32) as u32, flag);
                    } else if variant == 1 {
                        let w = slot as *mut u32;
                        core::ptr::write_volatile(w.add(1), flag);
                        core::ptr::write_volatile(w.add(3), flag);
                        core::ptr::write_volatile(w, want as u32);
                        core::ptr::write_volatile(w.add(2), (want >> 32) as u32);
                    } else {
                        LlPacket::write(slot, want, flag);
                    }
                }
            } else {
                {
                    // SAFETY: see above.
                    let got = unsafe {
                        let slot = mine.add((t * 2) as usize);
                        if variant == 2 {
                            let p = slot as *const Ll8Packet;
                            match (poll_words(p, flag, 10_000_000_000), poll_words(p.add(1), flag, 10_000_000_000)) {
                                (Some(lo), Some(hi)) => Some(lo[0] | hi[0] << 32),
                                _ => None,
                            }
                        } else {
                            LlPacket::poll(slot as *const LlPacket, flag, 10_000_000_000)
                        }
                    };
                    match got {
                        Some(v) if v != want => {
                            // SAFETY: out holds two words.
                            unsafe { arch::atomic_add_relaxed_gpu_u64(out, 1) };
                        }
                        Some(_) => {}
                        None => {
                            // SAFETY: as above.
                            unsafe {
                                arch::atomic_add_relaxed_gpu_u64(out.add(1), 1);
                                set_stop(stop);
                            }
                        }
                    }
                }
                arch::sync_threads();
                if t == 0 {
                    // SAFETY: see above.
                    unsafe { arch::red_add_release_sys_u64(theirs.add(ack as usize), 1) };
                }
            }
            // SAFETY: see above.
            if unsafe { stop_now(stop) } {
                return;
            }
        }
    }
}

/// The word layout of the data buffer of [`litmus_fifo_publish`]: two words (one 16-byte
/// unit) per thread of the grid, thread `t` of block `b` at unit `b * threads + t`.
pub const FIFO_DATA_WORDS_PER_THREAD: u64 = 2;

kernel! {
    /// FIFO publish: the data a trigger names is seen with it, and a trigger is never seen
    /// torn. Every thread of the grid, for `k` in `0..pushes`, stores `k + 1` into both
    /// words of its unit of `data` (host-mapped memory the consumer reads; relaxed stores,
    /// which the push's fence orders as it does the kernels' weak ones), then pushes
    /// [`fifo_test::test_trigger`]`(block, thread, k)`. The consumer (the proxy's side, on
    /// the CPU) checks every trigger it pops: that it decodes (not torn), and that the
    /// thread's unit holds at least `k + 1` (not stale). `variant` 0: the library's push
    /// (`fence.acq_rel.sys`, one 16-byte store); 1: without the fence; 2: the fence, then
    /// the high word (commit bit) and the low word as two 8-byte stores. A wait that times
    /// out is reported in `status_words` as by [`fifo_test::fifo_push_test`].
    pub unsafe fn litmus_fifo_publish(
        fifo: FifoDeviceHandle,
        data: *mut u64,
        pushes: u32,
        variant: u32,
        status_words: *mut u64,
    ) {
        let (block, thread) = (arch::block_idx_x(), arch::thread_idx_x());
        let unit = (block as u64 * arch::block_dim_x() as u64 + thread as u64)
            * FIFO_DATA_WORDS_PER_THREAD;
        let publish = match variant {
            1 => Publish::NoFence,
            2 => Publish::HighWordFirst,
            _ => Publish::Library,
        };
        for k in 0..pushes {
            // SAFETY: `data` holds FIFO_DATA_WORDS_PER_THREAD words per thread of the grid
            // (launch contract), this unit is this thread's alone to write, and the
            // consumer reads it only with atomic loads.
            unsafe {
                arch::st_volatile_v2_u64(data.wrapping_add(unit as usize), k as u64 + 1, k as u64 + 1)
            };
            // SAFETY: the host keeps the FIFO alive until the kernel has finished.
            let r = unsafe { fifo.try_push_as(fifo_test::test_trigger(block, thread, k), publish) };
            if let Err(e) = r {
                // SAFETY: `status_words` holds status::COUNT live, aligned words (launch
                // contract).
                unsafe { fifo_test::report_timeout(status_words, e.seq) };
                break;
            }
        }
        // SAFETY: as above.
        unsafe { fifo_test::count_finished(status_words) };
    }
}

/// Word `j` of the source buffer of parity `p` of [`litmus_flag_after_copy`] (never 0, and
/// different for the two parities).
#[inline(always)]
pub const fn copy_pattern(p: u64, j: u64) -> u64 {
    ((j << 1) | (p & 1)) ^ 0x3c3c_0000_0000_0001
}

kernel! {
    /// The proxy's flag after a copy: in iteration `i` (from 1) the host copies the source
    /// buffer of parity `i % 2` ([`copy_pattern`]) over `dst` with the copy engine and
    /// then raises `flag` to `i`, in the way under test (a stream-ordered write, or a CPU
    /// store once it knows the copy complete). Thread 0 of every block polls `flag` with
    /// acquire loads until it reaches `i`, the block syncs, every thread checks its words of
    /// `dst` (word `j` for `j % (blocks * threads)` its global index) and counts each one
    /// that is not the iteration's in `out[0]`; the block syncs and thread 0 adds 1 to
    /// `ack` (release), so the host starts iteration `i + 1` once every block has counted
    /// `i` (`ack == i * blocks`). A flag wait longer than 10 s counts in `out[1]` and ends
    /// the kernel.
    pub unsafe fn litmus_flag_after_copy(
        dst: *const u64,
        words: u64,
        flag: *const u64,
        ack: *mut u64,
        iters: u64,
        out: *mut u64,
    ) {
        let (t, nt) = (arch::thread_idx_x() as u64, arch::block_dim_x() as u64);
        let (b, nb) = (arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
        let stride = nt * nb;
        // The block's stop word lives in shared memory: no buffer of the host's is needed.
        let stop = crate::shared_array!(stop: u64; 1);
        if t == 0 {
            // SAFETY: the block's own shared word.
            unsafe { stop.write(0) };
        }
        arch::sync_threads();
        for i in 1..=iters {
            // SAFETY: `flag` and `out` valid (launch contract).
            if t == 0 && unsafe { !wait_at_least(flag, i, true, out) } {
                // SAFETY: as above.
                unsafe { stop.write(1) };
            }
            arch::sync_threads();
            // SAFETY: every thread reads it after the barrier that follows its only write.
            if unsafe { stop.read() } != 0 {
                return;
            }
            let mut bad = 0u64;
            let mut j = b * nt + t;
            while j < words {
                // SAFETY: j < words, `dst` valid for `words` words (launch contract); the
                // copy of this iteration has completed (the flag).
                if unsafe { arch::ld_volatile_u64(dst.add(j as usize)) } != copy_pattern(i, j) {
                    bad += 1;
                }
                j += stride;
            }
            if bad != 0 {
                // SAFETY: `out` holds two words.
                unsafe { arch::atomic_add_relaxed_gpu_u64(out, bad) };
            }
            arch::sync_threads();
            if t == 0 {
                // SAFETY: `ack` valid (launch contract); written only by these adds.
                unsafe { arch::red_add_release_sys_u64(ack, 1) };
            }
        }
    }
}

/// The data of slot `t` of block `b` in iteration `i`: differs from every other iteration's.
#[inline(always)]
fn pattern(i: u64, b: u64, t: u64) -> u64 {
    (i << 24) ^ (b << 12) ^ t ^ 0x5a5a_0000_0000_0000
}

/// Whether a thread of the block has set the block's stop word (`word`), seen alike by every
/// thread: the block syncs before reading it (after every write of this iteration) and
/// after (before any write of the next).
///
/// # Safety
/// `word` valid, aligned, written only by this block's threads with [`set_stop`].
#[inline(always)]
unsafe fn stop_now(word: *const u64) -> bool {
    arch::sync_threads();
    // SAFETY: caller contract.
    let s = unsafe { arch::ld_relaxed_sys_u64(word) } != 0;
    arch::sync_threads();
    s
}

/// Sets the block's stop word (see [`stop_now`]).
///
/// # Safety
/// As for [`stop_now`].
#[inline(always)]
unsafe fn set_stop(word: *mut u64) {
    // SAFETY: caller contract.
    unsafe { core::ptr::write_volatile(word, 1) };
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    //! The litmus protocols on CPU threads (which cannot reorder what they test): both roles
    //! finish, and the library's variants count nothing.

    use super::*;
    use crate::arch::{Dim3, launch};
    use std::vec;

    fn run(
        kernel: unsafe fn(*mut u64, *mut u64, u64, u64, u32, u32, *mut u64),
        variant: u32,
    ) -> [u64; 2] {
        let (blocks, threads, iters) = (2u32, 4u32, 300u64);
        let words = 2 * threads as u64;
        let len = (region_words(words) * blocks as u64) as usize;
        let mut a = vec![0u64; len];
        let mut b = vec![0u64; len];
        let mut out = [[0u64; 2]; 2];
        let (pa, pb) = (a.as_mut_ptr() as usize, b.as_mut_ptr() as usize);
        let outs = [out[0].as_mut_ptr() as usize, out[1].as_mut_ptr() as usize];
        std::thread::scope(|s| {
            for rank in 0..2u32 {
                s.spawn(move || {
                    let (local, remote) = if rank == 0 { (pa, pb) } else { (pb, pa) };
                    launch(Dim3::x(blocks), Dim3::x(threads), || {
                        // SAFETY: both buffers hold `blocks` regions and outlive the scope.
                        unsafe {
                            kernel(
                                local as *mut u64,
                                remote as *mut u64,
                                words,
                                iters,
                                rank,
                                variant,
                                outs[rank as usize] as *mut u64,
                            )
                        }
                    })
                    .unwrap();
                });
            }
        });
        out[1]
    }

    /// `litmus_flag_after_copy` on CPU threads, with this thread as the copy engine and the
    /// proxy: per iteration it copies the source of the iteration's parity over `dst` with
    /// atomic stores and raises the flag; `flag_first`: it raises the flag first and copies
    /// 20 ms later (a proxy that does not wait for its copy). Returns `out`.
    fn run_flag_after_copy(flag_first: bool) -> [u64; 2] {
        let (blocks, threads, iters, words) = (2u32, 4u32, 6u64, 37u64);
        let dst: std::vec::Vec<u64> = vec![0; words as usize];
        let mut words3 = [0u64; 4]; // flag, ack, out[0], out[1]
        let (pd, pw) = (dst.as_ptr() as usize, words3.as_mut_ptr() as usize);
        std::thread::scope(|s| {
            let kernel = s.spawn(move || {
                launch(Dim3::x(blocks), Dim3::x(threads), || {
                    let w = pw as *mut u64;
                    // SAFETY: `dst` holds `words` words and `words3` four; both outlive
                    // the scope and are accessed atomically by both sides.
                    unsafe {
                        litmus_flag_after_copy(
                            pd as *const u64,
                            words,
                            w,
                            w.add(1),
                            iters,
                            w.add(2),
                        )
                    }
                })
                .unwrap();
            });
            let w = pw as *mut u64;
            let copy = |i: u64| {
                for j in 0..words {
                    // SAFETY: as above.
                    unsafe {
                        arch::st_volatile_u64((pd as *mut u64).add(j as usize), copy_pattern(i, j))
                    };
                }
            };
            for i in 1..=iters {
                if flag_first {
                    // SAFETY: as above.
                    unsafe { arch::st_release_sys_u64(w, i) };
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    copy(i);
                } else {
                    copy(i);
                    // SAFETY: as above.
                    unsafe { arch::st_release_sys_u64(w, i) };
                }
                // The kernel's own flag wait gives up after 10 s; this one after 30 s, or as
                // soon as the kernel has ended without acknowledging.
                let t0 = std::time::Instant::now();
                // SAFETY: as above.
                while unsafe { arch::ld_acquire_sys_u64(w.add(1)) } < i * blocks as u64 {
                    assert!(
                        !kernel.is_finished() && t0.elapsed() < std::time::Duration::from_secs(30),
                        "iteration {i} was not acknowledged (the kernel ended or 30 s passed)"
                    );
                    std::thread::yield_now();
                }
            }
            kernel.join().unwrap();
        });
        [words3[2], words3[3]]
    }

    #[test]
    fn flag_after_copy_counts_nothing_when_the_flag_follows_the_copy() {
        assert_eq!(run_flag_after_copy(false), [0, 0]);
    }

    #[test]
    fn flag_after_copy_counts_every_word_of_a_copy_that_lands_after_its_flag() {
        // An iteration's check normally runs within the 20 ms before its copy, and then finds
        // every word the previous parity's (or zero, the first time); a check delayed past
        // the copy would count less, so only "some, and at most every word" is asserted.
        let [bad, timeouts] = run_flag_after_copy(true);
        assert!((1..=6 * 37).contains(&bad), "{bad} violations counted");
        assert_eq!(timeouts, 0);
    }

    #[test]
    fn message_passing_finishes_clean_on_cpu_threads() {
        // 0-2 as before, and the latency candidates that claim release/acquire (3-6).
        for variant in 0..7 {
            assert_eq!(
                run(litmus_message_passing, variant),
                [0, 0],
                "variant {variant}"
            );
        }
    }

    #[test]
    fn ll_packets_finish_clean_on_cpu_threads() {
        assert_eq!(run(litmus_ll_packets, 0), [0, 0]);
        assert_eq!(run(litmus_ll_packets, 2), [0, 0], "LL8");
    }
}
