//! Kernels of reduce-scatter, reduce, broadcast and all-to-all (entry points over
//! [`crate::collectives`]), one per path (LL packets or puts through the scratch) and, for
//! the reducing ones, element type. All take `(ctx, send, recv, count, root)`: `count` is in
//! elements for the reducing kernels (per rank of the output for reduce-scatter; the
//! operation code in its top byte, see [`crate::collectives::types::pack_op`]) and in bytes
//! for the others (per block for all-to-all); `root` is ignored by the unrooted ones.
//! Names: `reduce_scatter_{ll,put}_{T}` and `reduce_{ll,put}_{T}` for T in f32, f16, bf16,
//! f64, i8, u8, i32, u32, i64, u64,
//! `broadcast_{ll,put}`, `all_to_all_{ll,put}`; and `p2p(ctx, ops)`, grouped sends and
//! receives.

use crate::collectives::send_recv::{self, P2pOps};
use crate::collectives::types::unpack_op;
use crate::collectives::{
    Bf16, CollContext, F16, F32, F64, I8, I32, I64, U8, U32, U64, all_to_all, broadcast, reduce,
    reduce_scatter,
};
use crate::kernel;

/// The host twins' common signature: `(ctx, send, recv, count, root)`.
pub type MoreKernel = unsafe fn(*const CollContext, *const u8, *mut u8, u64, u64);

macro_rules! reducing_kernels {
    ($($rs_ll:ident, $rs_put:ident, $red_ll:ident, $red_put:ident, $t:ty);* $(;)?) => {$(
        kernel! {
            /// LL reduce-scatter: see [`reduce_scatter::ll`].
            pub unsafe fn $rs_ll(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, _root: u64) {
                let (count, op) = unpack_op(count);
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { reduce_scatter::ll::<$t>(&*ctx, send, recv, count, op) }
            }
        }
        crate::launch_bounds!($rs_ll, 1024);
        kernel! {
            /// Reduce-scatter through the scratch: see [`reduce_scatter::put`].
            pub unsafe fn $rs_put(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, _root: u64) {
                let (count, op) = unpack_op(count);
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { reduce_scatter::put::<$t>(&*ctx, send, recv, count, op) }
            }
        }
        crate::launch_bounds!($rs_put, 512);
        kernel! {
            /// LL reduce to `root`: see [`reduce::ll`].
            pub unsafe fn $red_ll(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, root: u64) {
                let (count, op) = unpack_op(count);
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { reduce::ll::<$t>(&*ctx, send, recv, count, root as u32, op) }
            }
        }
        crate::launch_bounds!($red_ll, 1024);
        kernel! {
            /// Reduce to `root` through its scratch: see [`reduce::put`].
            pub unsafe fn $red_put(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, root: u64) {
                let (count, op) = unpack_op(count);
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { reduce::put::<$t>(&*ctx, send, recv, count, root as u32, op) }
            }
        }
        crate::launch_bounds!($red_put, 512);
    )*};
}

reducing_kernels! {
    reduce_scatter_ll_f32, reduce_scatter_put_f32, reduce_ll_f32, reduce_put_f32, F32;
    reduce_scatter_ll_f16, reduce_scatter_put_f16, reduce_ll_f16, reduce_put_f16, F16;
    reduce_scatter_ll_bf16, reduce_scatter_put_bf16, reduce_ll_bf16, reduce_put_bf16, Bf16;
    reduce_scatter_ll_f64, reduce_scatter_put_f64, reduce_ll_f64, reduce_put_f64, F64;
    reduce_scatter_ll_i8, reduce_scatter_put_i8, reduce_ll_i8, reduce_put_i8, I8;
    reduce_scatter_ll_u8, reduce_scatter_put_u8, reduce_ll_u8, reduce_put_u8, U8;
    reduce_scatter_ll_i32, reduce_scatter_put_i32, reduce_ll_i32, reduce_put_i32, I32;
    reduce_scatter_ll_u32, reduce_scatter_put_u32, reduce_ll_u32, reduce_put_u32, U32;
    reduce_scatter_ll_i64, reduce_scatter_put_i64, reduce_ll_i64, reduce_put_i64, I64;
    reduce_scatter_ll_u64, reduce_scatter_put_u64, reduce_ll_u64, reduce_put_u64, U64;
}

kernel! {
    /// LL broadcast of `bytes` from `root`: see [`broadcast::ll`].
    pub unsafe fn broadcast_ll(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, root: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { broadcast::ll(&*ctx, send, recv, bytes, root as u32) }
    }
}
crate::launch_bounds!(broadcast_ll, 1024);

kernel! {
    /// Broadcast of `bytes` from `root` through the scratch: see [`broadcast::put`].
    pub unsafe fn broadcast_put(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, root: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { broadcast::put(&*ctx, send, recv, bytes, root as u32) }
    }
}
crate::launch_bounds!(broadcast_put, 512);

kernel! {
    /// LL all-to-all of `bytes` per block: see [`all_to_all::ll`].
    pub unsafe fn all_to_all_ll(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, _root: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { all_to_all::ll(&*ctx, send, recv, bytes) }
    }
}
crate::launch_bounds!(all_to_all_ll, 1024);

kernel! {
    /// All-to-all of `bytes` per block through the scratch: see [`all_to_all::put`].
    pub unsafe fn all_to_all_put(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, _root: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { all_to_all::put(&*ctx, send, recv, bytes) }
    }
}
crate::launch_bounds!(all_to_all_put, 512);

kernel! {
    /// A group of point-to-point sends and receives over the p2p context `ctx`: see
    /// [`send_recv::run`].
    pub unsafe fn p2p(ctx: *const CollContext, ops: P2pOps) {
        // SAFETY: forwarded to the launcher (the host validates the context and the ops).
        unsafe { send_recv::run(&*ctx, &ops) }
    }
}
crate::launch_bounds!(p2p, 512);
