//! Device side of mscclpp: everything a GPU kernel of ours (or a user's) needs, in
//! `#![no_std]` Rust that compiles both for `nvptx64-nvidia-cuda` and for the host.
//!
//! - [`arch`]: the one place for nvptx specifics (thread ids, barriers, memory-model
//!   loads/stores/atomics/fences as inline PTX, `%globaltimer`, shared memory), with a host
//!   implementation of the same signatures over `core::sync::atomic`, so every protocol
//!   function also runs on CPU threads ([`arch::launch`] emulates a grid).
//! - [`fifo`]: the trigger FIFO between GPU threads and the host proxy (the trigger
//!   layout, the producer handle kernels push with, the consumer the proxy pops with).
//! - [`semaphore`], [`packet`], [`channel`]: GPU-to-GPU semaphores, LL packets, and the
//!   channels kernels move data with (proxy channels over the FIFO, memory channels with
//!   loads and stores to mapped peer memory).
//! - [`kernels`]: our kernels, declared with [`kernel!`] so they are `extern "ptx-kernel"`
//!   entry points on the GPU and plain `unsafe fn`s on the host.
//!
//! Feature `test-kernels` adds the kernels of this project's GPU tests and benchmarks to
//! [`kernels`]; without it (the default, and the PTX `mscclpp-host` ships) there are none.
//!
//! A user's own kernel crate depends on this crate, declares its kernels with [`kernel!`],
//! adds `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]` at its root (the GPU
//! entry-point ABI is unstable) and is compiled by `mscclpp-device-builder`.

#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod arch;
pub mod channel;
pub mod collectives;
pub mod fault;
pub mod fifo;
pub mod kernels;
pub mod packet;
pub mod semaphore;

/// Declares a GPU kernel: on nvptx an exported `extern "ptx-kernel"` entry point (its
/// symbol is the function name), on the host a plain `pub unsafe fn` with the same body, to
/// be run on CPU threads by [`arch::launch`].
///
/// ```
/// mscclpp_device::kernel! {
///     /// Writes each thread's global index.
///     pub unsafe fn iota(out: *mut u32) {
///         let i = mscclpp_device::arch::global_thread_idx_x();
///         // SAFETY: the caller launches at most as many threads as `out` holds.
///         unsafe { *out.add(i as usize) = i };
///     }
/// }
/// ```
#[macro_export]
macro_rules! kernel {
    ($(#[$meta:meta])* pub unsafe fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        ///
        /// # Safety
        /// Pointer arguments must be valid for the accesses the kernel makes with the launch
        /// configuration used; on the host it must run inside `mscclpp_device::arch::launch`.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) $body

        $(#[$meta])*
        ///
        /// # Safety
        /// Pointer arguments must be valid for the accesses the kernel makes with the launch
        /// configuration used; it must run inside `mscclpp_device::arch::launch`.
        #[cfg(not(target_arch = "nvptx64"))]
        pub unsafe fn $name($($arg: $ty),*) $body
    };
}

/// Caps the block size of kernel `$kernel` at `$threads` (1..=1024): the PTX entry gets
/// `.maxntid $threads, 1, 1`, so ptxas budgets registers for that many threads (without it,
/// a kernel may use so many registers that large blocks fail to launch with
/// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`). Launching more threads than the bound fails.
/// Only meaningful on nvptx (mscclpp-device-builder applies it); nothing on the host.
///
/// ```
/// mscclpp_device::kernel! {
///     /// Does nothing, with up to 1024 threads per block.
///     pub unsafe fn idle() {}
/// }
/// mscclpp_device::launch_bounds!(idle, 1024);
/// ```
#[macro_export]
macro_rules! launch_bounds {
    ($kernel:ident, $threads:literal) => {
        #[cfg(target_arch = "nvptx64")]
        ::core::arch::global_asm!(concat!(
            "// mscclpp:maxntid ",
            stringify!($kernel),
            " ",
            stringify!($threads)
        ));
    };
}

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    arch::trap()
}
