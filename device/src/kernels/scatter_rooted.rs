//! Kernels of reduce-scatter, reduce, broadcast and all-to-all (entry points over
//! [`crate::collectives`]), one per path (LL packets or puts through the scratch) and, for
//! the reducing ones, element size (any reducing type of that size, see [`Dyn`]). All take `(ctx, send, recv, count, tag)`, as the
//! all-reduce kernels: `count` is in elements for the reducing kernels (per rank of the
//! output for reduce-scatter) and in bytes for the others (per block for all-to-all); `tag`
//! is the call's descriptor tag ([`desc`]), from which the reducing kernels take their
//! type and operation ([`desc::type_op`]: one kernel per path and element size) and the
//! rooted ones their root ([`desc::root`]).
//! Names: `reduce_scatter_ll_{B}` and `reduce_ll_{B}` for B in b8, b16, b32, b64 (one per
//! element size, [`Dyn`]), `reduce_scatter_put` and `reduce_put` (every type, as bytes:
//! [`Bytes`]; their call descriptors hold the byte count),
//! `broadcast_{ll,put}`, `all_to_all_{ll,put}`, the pipelined `broadcast_pipe` and
//! `reduce_pipe` (every type, as bytes). The send/recv kernel is in [`super::send_recv`].

use crate::collectives::{
    Bytes, CollContext, Dyn, all_to_all, broadcast, desc, reduce, reduce_scatter,
};
use crate::kernel;

/// The host twins' common signature: `(ctx, send, recv, count, tag)`.
pub type ScatterRootedKernel = unsafe fn(*const CollContext, *const u8, *mut u8, u64, u64);

macro_rules! reducing_ll_kernels {
    ($($rs_ll:ident, $red_ll:ident, $t:ty);* $(;)?) => {$(
        kernel! {
            /// LL reduce-scatter: see [`reduce_scatter::ll`].
            pub unsafe fn $rs_ll(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
                // SAFETY: first of every thread; the host may launch it with PDL (`gpu.rs`).
                unsafe { (*ctx).dependent_launch_entry() };
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { reduce_scatter::ll::<$t>(&*ctx, send, recv, count, tag, desc::type_op(tag)) }
            }
        }
        crate::launch_bounds!($rs_ll, 1024);
        kernel! {
            /// LL reduce to the tag's root: see [`reduce::ll`].
            pub unsafe fn $red_ll(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
                // SAFETY: first of every thread; the host may launch it with PDL (`gpu.rs`).
                unsafe { (*ctx).dependent_launch_entry() };
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { reduce::ll::<$t>(&*ctx, send, recv, count, tag, desc::root(tag), desc::type_op(tag)) }
            }
        }
        crate::launch_bounds!($red_ll, 1024);
    )*};
}

reducing_ll_kernels! {
    reduce_scatter_ll_b8, reduce_ll_b8, Dyn<1>;
    reduce_scatter_ll_b16, reduce_ll_b16, Dyn<2>;
    reduce_scatter_ll_b32, reduce_ll_b32, Dyn<4>;
    reduce_scatter_ll_b64, reduce_ll_b64, Dyn<8>;
}

kernel! {
    /// Reduce-scatter through the scratch, any reducing type, moved as bytes ([`Bytes`]; the
    /// call descriptor holds the byte count): see [`reduce_scatter::put`].
    pub unsafe fn reduce_scatter_put(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
        let bytes = count * desc::type_size(tag);
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { reduce_scatter::put::<Bytes>(&*ctx, send, recv, bytes, tag, desc::type_op(tag)) }
    }
}
crate::launch_bounds!(reduce_scatter_put, 512);

kernel! {
    /// Reduce to the tag's root through its scratch, any reducing type, moved as bytes
    /// ([`Bytes`]; the call descriptor holds the byte count): see [`reduce::put`].
    pub unsafe fn reduce_put(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
        let bytes = count * desc::type_size(tag);
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { reduce::put::<Bytes>(&*ctx, send, recv, bytes, tag, desc::root(tag), desc::type_op(tag)) }
    }
}
crate::launch_bounds!(reduce_put, 512);

kernel! {
    /// LL broadcast of `bytes` from `root`: see [`broadcast::ll`].
    pub unsafe fn broadcast_ll(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
        // SAFETY: first of every thread; the host may launch it with PDL (`gpu.rs`).
        unsafe { (*ctx).dependent_launch_entry() };
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { broadcast::ll(&*ctx, send, recv, bytes, tag, desc::root(tag)) }
    }
}
crate::launch_bounds!(broadcast_ll, 1024);

kernel! {
    /// Broadcast of `bytes` from `root` through the scratch: see [`broadcast::put`].
    pub unsafe fn broadcast_put(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { broadcast::put(&*ctx, send, recv, bytes, tag, desc::root(tag)) }
    }
}
crate::launch_bounds!(broadcast_put, 512);

kernel! {
    /// Pipelined broadcast of `bytes` from the tag's root (a chain through the scratch, no
    /// barrier per round): see [`broadcast::pipelined`].
    pub unsafe fn broadcast_pipe(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { broadcast::pipelined(&*ctx, send, recv, bytes, tag, desc::root(tag)) }
    }
}
crate::launch_bounds!(broadcast_pipe, 512);

kernel! {
    /// Pipelined reduce to the tag's root through its scratch (no barrier per round), any
    /// reducing type, moved as bytes ([`Bytes`]; the call descriptor holds the byte count):
    /// see [`reduce::pipelined`].
    pub unsafe fn reduce_pipe(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
        let bytes = count * desc::type_size(tag);
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { reduce::pipelined::<Bytes>(&*ctx, send, recv, bytes, tag, desc::root(tag), desc::type_op(tag)) }
    }
}
crate::launch_bounds!(reduce_pipe, 512);

kernel! {
    /// LL all-to-all of `bytes` per block: see [`all_to_all::ll`].
    pub unsafe fn all_to_all_ll(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
        // SAFETY: first of every thread; the host may launch it with PDL (`gpu.rs`).
        unsafe { (*ctx).dependent_launch_entry() };
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { all_to_all::ll(&*ctx, send, recv, bytes, tag) }
    }
}
crate::launch_bounds!(all_to_all_ll, 1024);

kernel! {
    /// All-to-all of `bytes` per block through the scratch: see [`all_to_all::put`].
    pub unsafe fn all_to_all_put(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { all_to_all::put(&*ctx, send, recv, bytes, tag) }
    }
}
crate::launch_bounds!(all_to_all_put, 512);
