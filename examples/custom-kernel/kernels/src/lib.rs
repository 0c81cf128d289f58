//! A user's kernel crate: `no_std`, depends on `mscclpp-device` for the thread ids and the
//! `kernel!` macro, and needs one nightly feature on nvptx only (the kernel ABI).

#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![deny(unsafe_op_in_unsafe_fn)]

use mscclpp_device::{arch, kernel};

kernel! {
    /// `y[i] = a * x[i] + y[i]` for `i < n`, grid-stride.
    pub unsafe fn saxpy(a: f32, x: *const f32, y: *mut f32, n: usize) {
        let mut i = arch::global_thread_idx_x() as usize;
        while i < n {
            // SAFETY: x and y hold n elements (caller contract) and i < n.
            unsafe { *y.add(i) = a * *x.add(i) + *y.add(i) };
            i += arch::global_threads_x() as usize;
        }
    }
}
