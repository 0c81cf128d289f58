//! Kernels of the data-parallel training example: the element-wise and reduction parts of a
//! training step (the GEMMs are cuBLAS). `no_std`; built for nvptx64 by the example's
//! `build.rs` and for the host, where the pure helpers ([`unit_uniform`], [`input_value`],
//! [`f32_to_bf16_bits`]) are what the CPU reference uses, so both sides see bit-identical
//! inputs.
//!
//! Launch contract of the reductions ([`loss_grad`], [`sum_squares`], [`finalize`]): blocks
//! of exactly [`REDUCE_THREADS`] threads; the partial sums are one per block, formed in a
//! fixed order, so every run (and every rank) reduces identically.

#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch))]
#![feature(core_float_math)]
#![deny(unsafe_op_in_unsafe_fn)]
// Kernel entry points take their arguments flat (the launch ABI).
#![allow(clippy::too_many_arguments)]

use mscclpp_device::arch;
use mscclpp_device::{kernel, shared_array};

/// Threads per block of the reduction kernels.
pub const REDUCE_THREADS: u32 = 256;
/// Blocks of the reduction kernels (so at most this many partial sums).
pub const REDUCE_BLOCKS: u32 = 256;

/// Slots of the `scalars` array the step kernels share (f32 each).
pub mod slot {
    /// This rank's loss of the last step (mean over its samples and outputs).
    pub const LOSS: usize = 0;
    /// Global L2 norm of the averaged gradient of the last step (before clipping).
    pub const GRAD_NORM: usize = 1;
    /// Factor the optimizer applies to the summed gradient: `clip / nranks`.
    pub const GRAD_SCALE: usize = 2;
    /// `beta1^t` after the last step.
    pub const BETA1_POW: usize = 3;
    /// `beta2^t` after the last step.
    pub const BETA2_POW: usize = 4;
    /// Number of slots.
    pub const COUNT: usize = 8;
}

/// SplitMix64's finaliser: a bijective 64-bit mix.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in `[0, 1)` (24 bits, exact in f32) determined by `(seed, a, b)`:
/// counter-based, so any element of any stream is computed independently, on the GPU or
/// the host, with the same bits.
#[inline(always)]
pub fn unit_uniform(seed: u64, a: u64, b: u64) -> f32 {
    let h = mix64(seed ^ mix64(a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ mix64(b ^ 0x632b_e59b)));
    (h >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// Input feature `j` of sample `sample`: uniform with mean 0 and variance 1
/// (`sqrt(3) * (2u - 1)`).
#[inline(always)]
pub fn input_value(seed: u64, sample: u64, j: u64) -> f32 {
    1.732_050_8 * (2.0 * unit_uniform(seed, sample, j) - 1.0)
}

/// f32 to bfloat16 bits, rounding to nearest even (NaN stays a quiet NaN).
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Sums `v` over the calling block (all [`REDUCE_THREADS`] threads must call it); thread 0
/// gets the block's total, in a fixed tree order.
///
/// # Safety
/// Every thread of a block of exactly [`REDUCE_THREADS`] threads must call it, at the same
/// place.
#[inline(always)]
unsafe fn block_sum(v: f32) -> f32 {
    let sh = shared_array!(RED: f32; REDUCE_THREADS as usize);
    let t = arch::thread_idx_x() as usize;
    // SAFETY: t < REDUCE_THREADS (launch contract); the array has that many slots.
    unsafe { *sh.add(t) = v };
    arch::sync_threads();
    let mut s = REDUCE_THREADS as usize / 2;
    while s > 0 {
        if t < s {
            // SAFETY: t + s < REDUCE_THREADS; written before the last barrier.
            unsafe { *sh.add(t) += *sh.add(t + s) };
        }
        arch::sync_threads();
        s /= 2;
    }
    // SAFETY: slot 0 holds the total after the last barrier.
    let total = unsafe { *sh };
    arch::sync_threads();
    total
}

kernel! {
    /// Fills `x` (`rows x cols`, row-major) with the inputs of samples
    /// `*step * global_batch + row_offset + i`: the step counter lives in device memory, so
    /// a captured CUDA graph draws fresh samples each replay.
    pub unsafe fn gen_inputs(
        x: *mut f32,
        rows: u64,
        cols: u64,
        seed: u64,
        step: *const u64,
        global_batch: u64,
        row_offset: u64,
    ) {
        // SAFETY: step is a valid device word (caller contract).
        let first = unsafe { *step } * global_batch + row_offset;
        let n = rows * cols;
        let mut i = arch::global_thread_idx_x() as u64;
        while i < n {
            let (r, c) = (i / cols, i % cols);
            // SAFETY: i < rows * cols, the size of x.
            unsafe { *x.add(i as usize) = input_value(seed, first + r, c) };
            i += arch::global_threads_x() as u64;
        }
    }
}

kernel! {
    /// `y[r][c] = act(y[r][c] + bias[c])` for a `rows x cols` row-major `y`; `relu != 0`
    /// applies ReLU, else the identity.
    pub unsafe fn bias_act(y: *mut f32, bias: *const f32, rows: u64, cols: u64, relu: u32) {
        let n = rows * cols;
        let mut i = arch::global_thread_idx_x() as u64;
        while i < n {
            // SAFETY: i < rows * cols and i % cols < cols: inside y and bias.
            unsafe {
                let v = *y.add(i as usize) + *bias.add((i % cols) as usize);
                *y.add(i as usize) = if relu != 0 && v < 0.0 { 0.0 } else { v };
            }
            i += arch::global_threads_x() as u64;
        }
    }
}

kernel! {
    /// MSE: `dy = scale * (y - t)` and, per block, `sum (y - t)^2` into `partial[block]`.
    /// Blocks of [`REDUCE_THREADS`] threads, at most [`REDUCE_BLOCKS`] blocks.
    pub unsafe fn loss_grad(
        y: *const f32,
        t: *const f32,
        dy: *mut f32,
        n: u64,
        scale: f32,
        partial: *mut f32,
    ) {
        let mut acc = 0.0f32;
        let mut i = arch::global_thread_idx_x() as u64;
        while i < n {
            // SAFETY: i < n, the size of y, t and dy.
            unsafe {
                let d = *y.add(i as usize) - *t.add(i as usize);
                acc += d * d;
                *dy.add(i as usize) = scale * d;
            }
            i += arch::global_threads_x() as u64;
        }
        // SAFETY: launch contract (block size).
        let s = unsafe { block_sum(acc) };
        if arch::thread_idx_x() == 0 {
            // SAFETY: partial has one slot per block.
            unsafe { *partial.add(arch::block_idx_x() as usize) = s };
        }
    }
}

kernel! {
    /// ReLU backward: `g[i] = 0` where the layer's output `h[i]` is not positive.
    pub unsafe fn relu_backward(g: *mut f32, h: *const f32, n: u64) {
        let mut i = arch::global_thread_idx_x() as u64;
        while i < n {
            // SAFETY: i < n, the size of g and h.
            unsafe {
                if *h.add(i as usize) <= 0.0 {
                    *g.add(i as usize) = 0.0;
                }
            }
            i += arch::global_threads_x() as u64;
        }
    }
}

kernel! {
    /// `partial[block] = sum x[i]^2` over the block's grid-stride share of `x[..n]`.
    /// Blocks of [`REDUCE_THREADS`] threads, at most [`REDUCE_BLOCKS`] blocks.
    pub unsafe fn sum_squares(x: *const f32, n: u64, partial: *mut f32) {
        let mut acc = 0.0f32;
        let mut i = arch::global_thread_idx_x() as u64;
        while i < n {
            // SAFETY: i < n, the size of x.
            let v = unsafe { *x.add(i as usize) };
            acc += v * v;
            i += arch::global_threads_x() as u64;
        }
        // SAFETY: launch contract (block size).
        let s = unsafe { block_sum(acc) };
        if arch::thread_idx_x() == 0 {
            // SAFETY: partial has one slot per block.
            unsafe { *partial.add(arch::block_idx_x() as usize) = s };
        }
    }
}

kernel! {
    /// End of a step, one block of [`REDUCE_THREADS`] threads: sums the loss partials
    /// (times `loss_scale`) and the squared-gradient partials of the summed gradient, then
    /// sets the loss, the averaged gradient's norm, the optimizer's gradient factor
    /// `min(1, max_norm / norm) / nranks` (`max_norm <= 0`: no clipping), the Adam beta
    /// powers, and advances the step counter.
    pub unsafe fn finalize(
        loss_partial: *const f32,
        n_loss: u32,
        loss_scale: f32,
        grad_partial: *const f32,
        n_grad: u32,
        inv_nranks: f32,
        max_norm: f32,
        beta1: f32,
        beta2: f32,
        scalars: *mut f32,
        step: *mut u64,
    ) {
        let t = arch::thread_idx_x();
        let (mut l, mut g) = (0.0f32, 0.0f32);
        let mut i = t;
        while i < n_loss.max(n_grad) {
            // SAFETY: i below each array's length.
            unsafe {
                if i < n_loss {
                    l += *loss_partial.add(i as usize);
                }
                if i < n_grad {
                    g += *grad_partial.add(i as usize);
                }
            }
            i += arch::block_dim_x();
        }
        // SAFETY: launch contract (one block of REDUCE_THREADS).
        let (l, g) = unsafe { (block_sum(l), block_sum(g)) };
        if t == 0 {
            let norm = core::f32::math::sqrt(g) * inv_nranks;
            let clip = if max_norm > 0.0 && norm > max_norm { max_norm / norm } else { 1.0 };
            // SAFETY: scalars has slot::COUNT slots and step is one word (caller contract);
            // only this thread touches them.
            unsafe {
                *scalars.add(slot::LOSS) = l * loss_scale;
                *scalars.add(slot::GRAD_NORM) = norm;
                *scalars.add(slot::GRAD_SCALE) = clip * inv_nranks;
                *scalars.add(slot::BETA1_POW) *= beta1;
                *scalars.add(slot::BETA2_POW) *= beta2;
                *step += 1;
            }
        }
    }
}

kernel! {
    /// AdamW on `n` parameters: `g = grad * scalars[GRAD_SCALE]` (average and clip),
    /// moments updated, bias-corrected with `scalars[BETA*_POW]`, decoupled weight decay.
    pub unsafe fn adamw(
        p: *mut f32,
        grad: *const f32,
        m: *mut f32,
        v: *mut f32,
        n: u64,
        scalars: *const f32,
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
    ) {
        // SAFETY: scalars holds slot::COUNT values (caller contract).
        let (gs, bc1, bc2) = unsafe {
            (
                *scalars.add(slot::GRAD_SCALE),
                1.0 - *scalars.add(slot::BETA1_POW),
                1.0 - *scalars.add(slot::BETA2_POW),
            )
        };
        let mut i = arch::global_thread_idx_x() as u64;
        while i < n {
            let k = i as usize;
            // SAFETY: i < n, the size of p, grad, m and v.
            unsafe {
                let g = *grad.add(k) * gs;
                let mk = beta1 * *m.add(k) + (1.0 - beta1) * g;
                let vk = beta2 * *v.add(k) + (1.0 - beta2) * g * g;
                *m.add(k) = mk;
                *v.add(k) = vk;
                let upd = (mk / bc1) / (core::f32::math::sqrt(vk / bc2) + eps);
                let pk = *p.add(k);
                *p.add(k) = pk - lr * (upd + weight_decay * pk);
            }
            i += arch::global_threads_x() as u64;
        }
    }
}

kernel! {
    /// `dst[i] = bf16(src[i])`, rounding to nearest even.
    pub unsafe fn to_bf16(dst: *mut u16, src: *const f32, n: u64) {
        let mut i = arch::global_thread_idx_x() as u64;
        while i < n {
            // SAFETY: i < n, the size of both.
            unsafe { *dst.add(i as usize) = f32_to_bf16_bits(*src.add(i as usize)) };
            i += arch::global_threads_x() as u64;
        }
    }
}

kernel! {
    /// `dst[i] = f32(src[i])` (bfloat16 bits, exact).
    pub unsafe fn from_bf16(dst: *mut f32, src: *const u16, n: u64) {
        let mut i = arch::global_thread_idx_x() as u64;
        while i < n {
            // SAFETY: i < n, the size of both.
            unsafe { *dst.add(i as usize) = f32::from_bits((*src.add(i as usize) as u32) << 16) };
            i += arch::global_threads_x() as u64;
        }
    }
}
