//! The one place for nvptx specifics, with a host implementation of the same signatures.
//!
//! On `nvptx64` every protocol access is explicit inline PTX: current LLVM drops the ordering
//! of read-modify-write atomics on nvptx (a `fetch_add(Release)` becomes a plain
//! `atom.global.add`), so nothing here relies on `core::sync::atomic` there. On the host the
//! same functions use `core::sync::atomic` with the matching orderings, and [`launch`] runs a
//! kernel body on CPU threads, one per GPU thread, with a real barrier per block.
//!
//! Scopes: `_sys` operations are ordered with respect to the CPU and other GPUs (memory
//! that crosses PCIe/NVLink: FIFOs in host memory, flags in a peer's memory); `_gpu`
//! operations only with other threads of the same GPU.
//!
//! Nothing here validates pointers: every function taking one is `unsafe` and states what it
//! needs.

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host;
#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

/// Index of the calling thread in the whole grid along x:
/// `block_idx_x() * block_dim_x() + thread_idx_x()`.
#[inline(always)]
pub fn global_thread_idx_x() -> u32 {
    block_idx_x() * block_dim_x() + thread_idx_x()
}

/// Number of threads in the whole grid along x: `grid_dim_x() * block_dim_x()`.
#[inline(always)]
pub fn global_threads_x() -> u32 {
    grid_dim_x() * block_dim_x()
}

/// FNV-1a of a string, evaluated at compile time; names one [`shared_array!`] site.
#[doc(hidden)]
pub const fn site_hash(s: &str) -> u64 {
    let b = s.as_bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < b.len() {
        h ^= b[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// Static shared memory: `shared_array!(NAME: T; N)` evaluates to a `*mut T` pointing at
/// `N` elements that all threads of the calling block share, like a CUDA `__shared__`
/// array. There is one array per macro site (not per inlined copy), aligned to 16 bytes,
/// uninitialised on the GPU and zeroed on the host; synchronise with
/// [`sync_threads`] before reading what other threads wrote.
///
/// On nvptx the array is a module-scope `.shared` variable declared with `global_asm!` and
/// addressed with `cvta.shared`; on the host it lives in the emulated block's state.
#[macro_export]
macro_rules! shared_array {
    ($name:ident : $t:ty ; $n:expr) => {{
        const __BYTES: usize = ($n) * ::core::mem::size_of::<$t>();
        const __SITE: u64 = $crate::arch::site_hash(concat!(
            module_path!(),
            "/",
            stringify!($name),
            "/",
            file!(),
            ":",
            line!(),
            ":",
            column!()
        ));
        #[cfg(target_arch = "nvptx64")]
        let __p: *mut $t = {
            ::core::arch::global_asm!(
                ".shared .align 16 .b8 __mscclpp_smem_{site}[{bytes}];",
                site = const __SITE,
                bytes = const __BYTES,
            );
            let p: u64;
            // SAFETY: only computes the generic address of the shared array declared above.
            unsafe {
                ::core::arch::asm!(
                    "cvta.shared.u64 {p}, __mscclpp_smem_{site};",
                    p = out(reg64) p,
                    site = const __SITE,
                    options(pure, nomem, nostack),
                );
            }
            p as *mut $t
        };
        #[cfg(not(target_arch = "nvptx64"))]
        let __p: *mut $t = $crate::arch::block_shared(__SITE, __BYTES) as *mut $t;
        __p
    }};
}
