//! Kernels that prove the pipeline: arithmetic on device memory, and the memory-ordering
//! probe between a GPU and the CPU through host-mapped memory.

use crate::arch;
use crate::kernel;

kernel! {
    /// `out[i] = a[i] + b[i]` for `i < n`, grid-stride.
    pub unsafe fn vector_add_f32(a: *const f32, b: *const f32, out: *mut f32, n: usize) {
        let mut i = arch::global_thread_idx_x() as usize;
        let stride = arch::global_threads_x() as usize;
        while i < n {
            // SAFETY: the caller passes buffers of at least `n` elements; i < n.
            unsafe { *out.add(i) = *a.add(i) + *b.add(i) };
            i += stride;
        }
    }
}

/// Control words of [`ordering_probe`], shared between GPU and host (host-mapped memory).
#[repr(C, align(16))]
#[derive(Debug, Default)]
pub struct ProbeControl {
    /// Round the GPU has published (written with release after the data).
    pub flag: u64,
    /// Round the host has checked (written by the host; acquired by the GPU).
    pub ack: u64,
    /// 0 while running; [`PROBE_DONE`] at the end; [`PROBE_TIMEOUT`] if the host stopped
    /// acknowledging.
    pub status: u64,
    /// Keeps the struct 32 bytes.
    pub reserved: u64,
}

/// [`ProbeControl::status`]: every round was acknowledged.
pub const PROBE_DONE: u64 = 1;
/// [`ProbeControl::status`]: the GPU gave up waiting for an acknowledgement.
pub const PROBE_TIMEOUT: u64 = 2;

/// The value the probe writes at index `i` in round `round` (SplitMix64 of the three).
#[inline(always)]
pub fn probe_value(seed: u64, round: u64, i: u64) -> u64 {
    let mut z =
        seed ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i.wrapping_mul(0xd1b5_4a32_d192_ed03);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

kernel! {
    /// One block. For each round `r` in `1..=rounds`: every thread writes its share of
    /// `data[..n]` with [`probe_value`], the block synchronises, thread 0 publishes `r` in
    /// `ctl.flag` with a system-scope release store and then waits (acquire loads, with a
    /// `%globaltimer` timeout of `timeout_ns`) until the host has written `ctl.ack >= r`.
    /// The host polls `flag`, checks every element, then acknowledges. A host that sees a
    /// stale element has found a memory-ordering bug.
    pub unsafe fn ordering_probe(
        data: *mut u64,
        n: usize,
        ctl: *mut ProbeControl,
        rounds: u64,
        seed: u64,
        timeout_ns: u64,
    ) {
        let stop = crate::shared_array!(PROBE_STOP: u32; 1);
        let t = arch::thread_idx_x() as usize;
        let threads = arch::block_dim_x() as usize;
        // SAFETY: `ctl` points to a live ProbeControl (caller contract).
        let (flag, ack, status) = unsafe {
            (&raw mut (*ctl).flag, &raw mut (*ctl).ack, &raw mut (*ctl).status)
        };
        for r in 1..=rounds {
            let mut i = t;
            while i < n {
                // SAFETY: i < n and `data` holds n elements.
                unsafe { data.add(i).write_volatile(probe_value(seed, r, i as u64)) };
                i += threads;
            }
            arch::sync_threads();
            if t == 0 {
                // SAFETY: flag/ack/status are valid aligned words of `ctl`.
                unsafe {
                    arch::st_release_sys_u64(flag, r);
                    let deadline = arch::global_timer_ns().saturating_add(timeout_ns);
                    let mut ok = true;
                    while arch::ld_acquire_sys_u64(ack) < r {
                        if arch::global_timer_ns() > deadline {
                            ok = false;
                            break;
                        }
                    }
                    if !ok {
                        arch::st_release_sys_u64(status, PROBE_TIMEOUT);
                    }
                    *stop = if ok { 0 } else { 1 };
                }
            }
            arch::sync_threads();
            // SAFETY: written by thread 0 before the barrier.
            if unsafe { *stop } != 0 {
                return;
            }
        }
        if t == 0 {
            // SAFETY: `status` is a valid aligned word of `ctl`.
            unsafe { arch::st_release_sys_u64(status, PROBE_DONE) };
        }
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;
