//! The element-wise pass of the staged reductions (fp8 and pre-multiplied sums):
//! `stage_elements(src, dst, count, mode, scalar_bits, scalar_ptr)`, see
//! [`staging::pass`]. Any grid; each thread takes the elements of a grid stride.

use crate::arch;
use crate::collectives::staging;
use crate::kernel;

kernel! {
    /// [`staging::pass`] over the grid's threads.
    pub unsafe fn stage_elements(
        src: *const u8,
        dst: *mut u8,
        count: u64,
        mode: u64,
        scalar_bits: u64,
        scalar_ptr: *const u8,
    ) {
        let (t, nt) = (arch::thread_idx_x() as u64, arch::block_dim_x() as u64);
        let (b, nb) = (arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
        // SAFETY: forwarded to the launcher (the host passes ranges of `count` elements).
        unsafe { staging::pass(src, dst, count, mode, scalar_bits, scalar_ptr, b * nt + t, nb * nt) }
    }
}
crate::launch_bounds!(stage_elements, 512);
