//! A kernel that exercises every [`arch`] primitive once, so that the golden
//! PTX test sees each instruction and a GPU test can check each result.

use crate::arch;
use crate::kernel;

/// Word layout of the `words` buffer of [`arch_check`] (all u64, 16-byte aligned start).
pub mod slot {
    /// Incremented by every thread with `atom.add.relaxed.gpu`.
    pub const ADD_RELAXED_GPU: usize = 0;
    /// Incremented by every thread with `atom.add.relaxed.sys`.
    pub const ADD_RELAXED_SYS: usize = 1;
    /// Incremented by every thread with `atom.add.release.sys`.
    pub const ADD_RELEASE_SYS: usize = 2;
    /// Sum over threads of the old values returned by the relaxed gpu add.
    pub const OLD_SUM: usize = 3;
    /// Two words written by thread 0 with one 16-byte volatile store.
    pub const V2_LO: usize = 4;
    /// See [`V2_LO`].
    pub const V2_HI: usize = 5;
    /// Thread 0 stores `input + 1` with `st.release.sys.u64` ...
    pub const RELEASE_U64: usize = 6;
    /// ... and reads it back with `ld.acquire.sys.u64` into this slot.
    pub const ACQUIRE_U64: usize = 7;
    /// Low half: `st.release.sys.u32` of `input as u32 + 2`; read back with
    /// `ld.acquire.sys.u32` into [`ACQUIRE_U32`].
    pub const RELEASE_U32: usize = 8;
    /// See [`RELEASE_U32`].
    pub const ACQUIRE_U32: usize = 9;
    /// `ld.relaxed.sys.u64` of [`RELEASE_U64`].
    pub const RELAXED_U64: usize = 10;
    /// 1 if `%globaltimer` did not go backwards across two fences, else 0.
    pub const TIMER_OK: usize = 11;
    /// Number of words the buffer must hold.
    pub const COUNT: usize = 12;
}

kernel! {
    /// Every thread adds 1 to the three counters (one per atomic flavour) and accumulates the
    /// returned old values; thread 0 then, after a block barrier, performs each load, store,
    /// fence and timer read, writing results to `words` (see [`slot`]). `words` must hold
    /// [`slot::COUNT`] u64 and be 16-byte aligned, zeroed before launch; launch one block.
    pub unsafe fn arch_check(words: *mut u64, input: u64) {
        let w = |i: usize| words.wrapping_add(i);
        // SAFETY: the caller passes COUNT valid, aligned, zeroed words; counters are only
        // touched atomically while the block runs.
        unsafe {
            let old = arch::atomic_add_relaxed_gpu_u64(w(slot::ADD_RELAXED_GPU), 1);
            arch::atomic_add_relaxed_sys_u64(w(slot::ADD_RELAXED_SYS), 1);
            arch::atomic_add_release_sys_u64(w(slot::ADD_RELEASE_SYS), 1);
            arch::atomic_add_relaxed_gpu_u64(w(slot::OLD_SUM), old);
        }
        arch::sync_threads();
        if arch::thread_idx_x() != 0 {
            return;
        }
        // SAFETY: as above; only thread 0 reaches here.
        unsafe {
            arch::st_volatile_v2_u64(w(slot::V2_LO), input ^ 0x5555, !input);
            arch::st_release_sys_u64(w(slot::RELEASE_U64), input + 1);
            let a = arch::ld_acquire_sys_u64(w(slot::RELEASE_U64));
            *w(slot::ACQUIRE_U64) = a;
            let p32 = w(slot::RELEASE_U32) as *mut u32;
            arch::st_release_sys_u32(p32, input as u32 + 2);
            *w(slot::ACQUIRE_U32) = arch::ld_acquire_sys_u32(p32) as u64;
            *w(slot::RELAXED_U64) = arch::ld_relaxed_sys_u64(w(slot::RELEASE_U64));
            let t0 = arch::global_timer_ns();
            arch::fence_acq_rel_sys();
            arch::fence_sc_sys();
            let t1 = arch::global_timer_ns();
            *w(slot::TIMER_OK) = (t1 >= t0) as u64;
        }
    }
}

/// Checks the words [`arch_check`] left after a launch of one block of `threads` threads
/// with `input`; on a wrong word returns (slot, expected, found).
pub fn verify(
    words: &[u64; slot::COUNT],
    threads: u64,
    input: u64,
) -> Result<(), (usize, u64, u64)> {
    let expected = [
        (slot::ADD_RELAXED_GPU, threads),
        (slot::ADD_RELAXED_SYS, threads),
        (slot::ADD_RELEASE_SYS, threads),
        (slot::OLD_SUM, threads * threads.saturating_sub(1) / 2),
        (slot::V2_LO, input ^ 0x5555),
        (slot::V2_HI, !input),
        (slot::ACQUIRE_U64, input + 1),
        (slot::RELAXED_U64, input + 1),
        (slot::ACQUIRE_U32, (input as u32 + 2) as u64),
        (slot::TIMER_OK, 1),
    ];
    for (i, want) in expected {
        if words[i] != want {
            return Err((i, want, words[i]));
        }
    }
    Ok(())
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use super::*;
    use crate::arch::{Dim3, launch};

    #[repr(C, align(16))]
    struct Words([u64; slot::COUNT]);

    #[test]
    fn arch_check_on_cpu_threads_gives_the_expected_words() {
        let mut w = Words([0; slot::COUNT]);
        let p = w.0.as_mut_ptr() as usize;
        let threads = 64u64;
        launch(Dim3::x(1), Dim3::x(threads as u32), || {
            // SAFETY: `w` is COUNT aligned zeroed words that outlive the launch.
            unsafe { arch_check(p as *mut u64, 1000) }
        })
        .unwrap();
        let w = w.0;
        assert_eq!(w[slot::ADD_RELAXED_GPU], threads);
        assert_eq!(w[slot::ADD_RELAXED_SYS], threads);
        assert_eq!(w[slot::ADD_RELEASE_SYS], threads);
        assert_eq!(w[slot::OLD_SUM], threads * (threads - 1) / 2);
        assert_eq!(w[slot::V2_LO], 1000 ^ 0x5555);
        assert_eq!(w[slot::V2_HI], !1000);
        assert_eq!(w[slot::ACQUIRE_U64], 1001);
        assert_eq!(w[slot::RELAXED_U64], 1001);
        assert_eq!(w[slot::ACQUIRE_U32], 1002);
        assert_eq!(w[slot::TIMER_OK], 1);
    }
}
