//! The collective kernels: thin entry points over [`crate::collectives`], one per
//! algorithm and element type. The [`CollContext`] is read from memory (device memory
//! on a GPU, written once by the host): passed by value, its arrays indexed by rank made
//! every thread copy all 320 bytes to its local stack first.
//! Kernels (names `all_reduce_{one_shot,two_shot,two_shot_read,all_pairs,proxy}_{T}` for T in
//! f32, f16, bf16, f64, i8, u8, i32, u32, i64, u64; the operation code rides in the top byte
//! of `count`, see [`crate::collectives::types::pack_op`]),
//! `all_gather` and `all_gather_proxy`). The host (`mscclpp_host::collectives`) picks the grid and launches them.

use crate::collectives::types::unpack_op;
use crate::collectives::{
    Bf16, CollContext, F16, F32, F64, I8, I32, I64, U8, U32, U64, all_gather, all_reduce, proxy,
};
use crate::kernel;

macro_rules! all_reduce_kernels {
    ($($one:ident, $two:ident, $read:ident, $pairs:ident, $proxy:ident, $t:ty);* $(;)?) => {$(
        kernel! {
            /// One-shot all-reduce of `count` elements (the operation code in the top byte of `count`): see
            /// [`all_reduce::one_shot`].
            pub unsafe fn $one(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64) {
                let (count, op) = unpack_op(count);
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { all_reduce::one_shot::<$t>(&*ctx, send, recv, count, op) }
            }
        }
        kernel! {
            /// Two-shot all-reduce of `count` elements (the operation code in the top byte of `count`): see
            /// [`all_reduce::two_shot`].
            pub unsafe fn $two(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64) {
                let (count, op) = unpack_op(count);
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { all_reduce::two_shot::<$t, false>(&*ctx, send, recv, count, op) }
            }
        }
        kernel! {
            /// Two-shot all-reduce of `count` elements (the operation code in the top byte of `count`), reading peers' staged parts:
            /// see [`all_reduce::two_shot`].
            pub unsafe fn $read(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64) {
                let (count, op) = unpack_op(count);
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { all_reduce::two_shot::<$t, true>(&*ctx, send, recv, count, op) }
            }
        }
        crate::launch_bounds!($read, 512);
        kernel! {
            /// All-pairs all-reduce of `count` elements (the operation code in the top byte of `count`): see
            /// [`all_reduce::all_pairs`].
            pub unsafe fn $pairs(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64) {
                let (count, op) = unpack_op(count);
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { all_reduce::all_pairs::<$t>(&*ctx, send, recv, count, op) }
            }
        }
        crate::launch_bounds!($pairs, 512);
        kernel! {
            /// All-reduce of `count` elements (the operation code in the top byte of `count`) over proxy channels (one block): see
            /// [`proxy::all_reduce`].
            pub unsafe fn $proxy(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64) {
                let (count, op) = unpack_op(count);
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { proxy::all_reduce::<$t>(&*ctx, send, recv, count, op) }
            }
        }
        crate::launch_bounds!($proxy, 512);
        crate::launch_bounds!($one, 1024);
        crate::launch_bounds!($two, 512);
    )*};
}

all_reduce_kernels! {
    all_reduce_one_shot_f32, all_reduce_two_shot_f32, all_reduce_two_shot_read_f32,
        all_reduce_all_pairs_f32, all_reduce_proxy_f32, F32;
    all_reduce_one_shot_f16, all_reduce_two_shot_f16, all_reduce_two_shot_read_f16,
        all_reduce_all_pairs_f16, all_reduce_proxy_f16, F16;
    all_reduce_one_shot_bf16, all_reduce_two_shot_bf16, all_reduce_two_shot_read_bf16,
        all_reduce_all_pairs_bf16, all_reduce_proxy_bf16, Bf16;
    all_reduce_one_shot_f64, all_reduce_two_shot_f64, all_reduce_two_shot_read_f64,
        all_reduce_all_pairs_f64, all_reduce_proxy_f64, F64;
    all_reduce_one_shot_i8, all_reduce_two_shot_i8, all_reduce_two_shot_read_i8,
        all_reduce_all_pairs_i8, all_reduce_proxy_i8, I8;
    all_reduce_one_shot_u8, all_reduce_two_shot_u8, all_reduce_two_shot_read_u8,
        all_reduce_all_pairs_u8, all_reduce_proxy_u8, U8;
    all_reduce_one_shot_i32, all_reduce_two_shot_i32, all_reduce_two_shot_read_i32,
        all_reduce_all_pairs_i32, all_reduce_proxy_i32, I32;
    all_reduce_one_shot_u32, all_reduce_two_shot_u32, all_reduce_two_shot_read_u32,
        all_reduce_all_pairs_u32, all_reduce_proxy_u32, U32;
    all_reduce_one_shot_i64, all_reduce_two_shot_i64, all_reduce_two_shot_read_i64,
        all_reduce_all_pairs_i64, all_reduce_proxy_i64, I64;
    all_reduce_one_shot_u64, all_reduce_two_shot_u64, all_reduce_two_shot_read_u64,
        all_reduce_all_pairs_u64, all_reduce_proxy_u64, U64;
}

kernel! {
    /// All-gather of `bytes` per rank: see [`all_gather::all_gather`].
    pub unsafe fn all_gather(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { all_gather::all_gather(&*ctx, send, recv, bytes) }
    }
}
crate::launch_bounds!(all_gather, 512);

kernel! {
    /// All-gather of `bytes` per rank over proxy channels (one block): see
    /// [`proxy::all_gather`].
    pub unsafe fn all_gather_proxy(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { proxy::all_gather(&*ctx, send, recv, bytes) }
    }
}
crate::launch_bounds!(all_gather_proxy, 512);
