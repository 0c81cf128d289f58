//! The element-wise passes around the staged reductions of `mscclpp_host` (fp8 reductions
//! and pre-multiplied sums): the host runs one pass before the collective and, for fp8, one
//! after it; the collective in between is an ordinary one.
//!
//! - [`mode::WIDEN`]: 8-bit floats to f32 (exact), optionally times the scalar (an fp8
//!   value, the product taken in f32, exact): the collective then reduces f32 and the
//!   result is rounded to fp8 once, by [`mode::NARROW`].
//! - [`mode::NARROW`]: f32 to 8-bit floats (nearest even, saturating: see [`fp8`]).
//! - [`mode::PRE_MUL`]: any other reducing type times the scalar, in the type (the product
//!   as the kernels' product: IEEE in the type, f16 and bf16 through an exact f32 product
//!   rounded once, integers wrapping), as NCCL's pre-multiplied sum does before summing.
//!
//! The scalar is an element of the call's type: its bits in the call (a host scalar) or read
//! from memory by the pass when it runs (a device scalar, which may change between CUDA graph
//! replays).

use super::fp8::{self, Fp8};
use super::types::{Dyn, Reduce, op};

/// The pass, in bits 8..16 of the `mode` argument (bits 0..8 hold the element type's
/// `types::dtype` code, bit 16 [`SCALED`](mode::SCALED)).
pub mod mode {
    /// fp8 to f32, scaled when [`SCALED`].
    pub const WIDEN: u64 = 1 << 8;
    /// f32 to fp8.
    pub const NARROW: u64 = 2 << 8;
    /// Any other reducing type times the scalar, in the type.
    pub const PRE_MUL: u64 = 3 << 8;
    /// The pass multiplies by the scalar.
    pub const SCALED: u64 = 1 << 16;
    /// Mask of the pass field.
    pub const PASS_MASK: u64 = 0xff << 8;
}

/// Reads the scalar: `bits` (low bytes of the type), or the element at `ptr` unless null.
///
/// # Safety
/// `ptr` null or valid for one element of `size` bytes.
#[inline(always)]
unsafe fn scalar(bits: u64, ptr: *const u8, size: u64) -> u64 {
    if ptr.is_null() {
        return bits;
    }
    // SAFETY: caller contract. Volatile: the value may change between launches (graph
    // replays) and must be read by every launch.
    unsafe {
        match size {
            1 => ptr.read_volatile() as u64,
            2 => (ptr as *const u16).read_volatile() as u64,
            4 => (ptr as *const u32).read_volatile() as u64,
            _ => (ptr as *const u64).read_volatile(),
        }
    }
}

/// Elements `first, first + stride, ...` below `count` of the pass `mode` from `src` to
/// `dst` (may be equal when the element sizes are; see the [module](self)); a mode it does
/// not know does nothing.
///
/// # Safety
/// `src` valid for `count` elements of the source type, `dst` for `count` of the
/// destination type (f32 for [`mode::WIDEN`], fp8 for [`mode::NARROW`], the type for
/// [`mode::PRE_MUL`]), both aligned to their element size; `scalar_ptr` as for the scalar;
/// no other thread writes these elements.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn pass(
    src: *const u8,
    dst: *mut u8,
    count: u64,
    mode: u64,
    scalar_bits: u64,
    scalar_ptr: *const u8,
    first: u64,
    stride: u64,
) {
    let dt = (mode & 0xff) as u32;
    let scaled = mode & mode::SCALED != 0;
    match (mode & mode::PASS_MASK, fp8::kind_of(dt)) {
        (mode::WIDEN, Some(k)) => {
            // SAFETY: caller contract.
            let s = unsafe { scalar(scalar_bits, scalar_ptr, 1) };
            let s = fp8::to_f32(k, s as u8);
            let mut i = first;
            while i < count {
                // SAFETY: element i < count of each (caller contract).
                unsafe {
                    let x = fp8::to_f32(k, src.add(i as usize).read());
                    let x = if scaled { x * s } else { x };
                    (dst as *mut f32).add(i as usize).write(x);
                }
                i += stride;
            }
        }
        (mode::NARROW, Some(k)) => {
            let mut i = first;
            while i < count {
                // SAFETY: element i < count of each (caller contract).
                unsafe {
                    let x = (src as *const f32).add(i as usize).read();
                    dst.add(i as usize).write(fp8::from_f32(k, x));
                }
                i += stride;
            }
        }
        (mode::PRE_MUL, None) => {
            let size = super::types::dtype_size(dt);
            // SAFETY: caller contract.
            let s = unsafe { scalar(scalar_bits, scalar_ptr, size) };
            match size {
                // SAFETY (each): forwarded.
                1 => unsafe { pre_mul::<1>(src, dst, count, dt, s, first, stride) },
                2 => unsafe { pre_mul::<2>(src, dst, count, dt, s, first, stride) },
                4 => unsafe { pre_mul::<4>(src, dst, count, dt, s, first, stride) },
                8 => unsafe { pre_mul::<8>(src, dst, count, dt, s, first, stride) },
                _ => {}
            }
        }
        _ => {}
    }
}

/// [`mode::PRE_MUL`] for a type of `S` bytes.
///
/// # Safety
/// As for [`pass`].
#[inline(always)]
unsafe fn pre_mul<const S: u64>(
    src: *const u8,
    dst: *mut u8,
    count: u64,
    dt: u32,
    s: u64,
    first: u64,
    stride: u64,
) {
    let code = op::PROD | dt << 8;
    let mut i = first;
    while i < count {
        let at = (i * S) as usize;
        // SAFETY: element i < count of each, aligned (caller contract).
        unsafe {
            match S {
                1 => dst
                    .add(at)
                    .write(Dyn::<S>::op1(code, src.add(at).read() as u64, s) as u8),
                2 => (dst.add(at) as *mut u16).write(Dyn::<S>::op1(
                    code,
                    (src.add(at) as *const u16).read() as u64,
                    s,
                ) as u16),
                4 => (dst.add(at) as *mut u32).write(Dyn::<S>::op1(
                    code,
                    (src.add(at) as *const u32).read() as u64,
                    s,
                ) as u32),
                _ => (dst.add(at) as *mut u64).write(Dyn::<S>::op1(
                    code,
                    (src.add(at) as *const u64).read(),
                    s,
                )),
            }
        }
        i += stride;
    }
}

/// Whether `dt` is an 8-bit float code (its reductions widen to f32).
#[inline(always)]
pub const fn is_fp8(dt: u32) -> bool {
    fp8::kind_of(dt).is_some()
}

/// The kind of fp8 of a `types::dtype` code, for the host.
#[inline(always)]
pub const fn fp8_kind(dt: u32) -> Option<Fp8> {
    fp8::kind_of(dt)
}
