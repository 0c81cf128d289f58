//! The collective kernels: thin entry points over [`crate::collectives`], one per
//! algorithm and element type. The [`CollContext`] is read from memory (device memory
//! on a GPU, written once by the host): passed by value, its arrays indexed by rank made
//! every thread copy all 320 bytes to its local stack first.
//! Kernels (names `all_reduce_{one_shot,two_shot,two_shot_read,all_pairs,proxy}_{f32,f16,bf16}`:
//! sum only, the operation fixed at compile time so the sums cost what they always did;
//! `all_reduce_one_shot_op_{b8,b16,b32,b64}`: any reducing type of that many bits and any
//! operation, both read from the tag ([`desc::type_op`], see [`Dyn`]);
//! `all_reduce_{two_shot,proxy}_op`: any reducing type and operation, moved as bytes
//! ([`Bytes`]); `all_gather` and `all_gather_proxy`), all taking `(ctx, send, recv,
//! n, tag)`: `tag` is the call's descriptor tag ([`crate::collectives::desc`]), which every
//! rank sends with `n` to its peers so that calls that disagree fail on every rank instead
//! of corrupting data. The host (`mscclpp_host::collectives`) picks the grid and launches
//! them (read-reduce and all-pairs only for sums of the 16/32-bit floats: the other calls
//! take two-shot, which keeps the embedded PTX small).

use crate::collectives::{
    Bf16, Bytes, CollContext, Dyn, F16, F32, all_gather, all_reduce, desc, op, proxy,
};
use crate::kernel;

macro_rules! all_reduce_kernels {
    ($($one:ident, $two:ident, $read:ident, $pairs:ident, $proxy:ident, $t:ty);* $(;)?) => {$(
        kernel! {
            /// One-shot all-reduce (sum) of `count` elements: see
            /// [`all_reduce::one_shot`].
            pub unsafe fn $one(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { all_reduce::one_shot::<$t>(&*ctx, send, recv, count, tag, op::SUM) }
            }
        }
        kernel! {
            /// Two-shot all-reduce (sum) of `count` elements: see
            /// [`all_reduce::two_shot`].
            pub unsafe fn $two(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { all_reduce::two_shot::<$t, false, false>(&*ctx, send, recv, count, tag, op::SUM) }
            }
        }
        kernel! {
            /// Two-shot all-reduce (sum) of `count` elements, reading peers' staged parts:
            /// see [`all_reduce::two_shot`].
            pub unsafe fn $read(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { all_reduce::two_shot::<$t, true, false>(&*ctx, send, recv, count, tag, op::SUM) }
            }
        }
        crate::launch_bounds!($read, 512);
        kernel! {
            /// All-pairs all-reduce (sum) of `count` elements: see
            /// [`all_reduce::all_pairs`].
            pub unsafe fn $pairs(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { all_reduce::all_pairs::<$t>(&*ctx, send, recv, count, tag, op::SUM) }
            }
        }
        crate::launch_bounds!($pairs, 512);
        kernel! {
            /// All-reduce (sum) of `count` elements over proxy channels (pipelined, a block per lane): see
            /// [`proxy::all_reduce`].
            pub unsafe fn $proxy(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { proxy::all_reduce::<$t, false>(&*ctx, send, recv, count, tag, op::SUM) }
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
}

macro_rules! all_reduce_one_shot_op_kernels {
    ($($one:ident, $t:ty);* $(;)?) => {$(
        kernel! {
            /// One-shot all-reduce of `count` elements, any type of the size and operation (the
            /// tag's): see [`all_reduce::one_shot`].
            pub unsafe fn $one(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
                // SAFETY: forwarded to the launcher (the host validates the context).
                unsafe { all_reduce::one_shot::<$t>(&*ctx, send, recv, count, tag, desc::type_op(tag)) }
            }
        }
        crate::launch_bounds!($one, 1024);
    )*};
}

all_reduce_one_shot_op_kernels! {
    all_reduce_one_shot_op_b8, Dyn<1>;
    all_reduce_one_shot_op_b16, Dyn<2>;
    all_reduce_one_shot_op_b32, Dyn<4>;
    all_reduce_one_shot_op_b64, Dyn<8>;
}

kernel! {
    /// Two-shot all-reduce of `count` elements of any reducing type and operation (the
    /// tag's), moved as bytes ([`Bytes`]; the call descriptor holds the byte count): see
    /// [`all_reduce::two_shot`].
    pub unsafe fn all_reduce_two_shot_op(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
        let bytes = count * desc::type_size(tag);
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { all_reduce::two_shot::<Bytes, false, true>(&*ctx, send, recv, bytes, tag, desc::type_op(tag)) }
    }
}
crate::launch_bounds!(all_reduce_two_shot_op, 512);

kernel! {
    /// All-reduce of `count` elements of any reducing type and operation (the tag's) over
    /// proxy channels (pipelined, a block per lane), moved as bytes ([`Bytes`]; the call descriptor holds the
    /// byte count): see [`proxy::all_reduce`].
    pub unsafe fn all_reduce_proxy_op(ctx: *const CollContext, send: *const u8, recv: *mut u8, count: u64, tag: u64) {
        let bytes = count * desc::type_size(tag);
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { proxy::all_reduce::<Bytes, true>(&*ctx, send, recv, bytes, tag, desc::type_op(tag)) }
    }
}
crate::launch_bounds!(all_reduce_proxy_op, 512);

kernel! {
    /// All-gather of `bytes` per rank: see [`all_gather::all_gather`].
    pub unsafe fn all_gather(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { all_gather::all_gather(&*ctx, send, recv, bytes, tag) }
    }
}
crate::launch_bounds!(all_gather, 512);

kernel! {
    /// All-gather of `bytes` per rank over proxy channels (pipelined, a block per lane): see
    /// [`proxy::all_gather`].
    pub unsafe fn all_gather_proxy(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { proxy::all_gather(&*ctx, send, recv, bytes, tag) }
    }
}
crate::launch_bounds!(all_gather_proxy, 512);

kernel! {
    /// All-gather of `bytes` per rank through LL packets (small messages): see
    /// [`all_gather::all_gather_packets`].
    pub unsafe fn all_gather_packets(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { all_gather::all_gather_packets(&*ctx, send, recv, bytes, tag) }
    }
}
crate::launch_bounds!(all_gather_packets, 1024);

kernel! {
    /// The bare LL-packet exchange of one-shot all-reduce, a benchmark reference (`recv`: the
    /// XOR of every rank's `bytes`): see [`all_reduce::ll_exchange`].
    pub unsafe fn ll_exchange(ctx: *const CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
        // SAFETY: forwarded to the launcher (the host validates the context).
        unsafe { all_reduce::ll_exchange(&*ctx, send, recv, bytes, tag) }
    }
}
crate::launch_bounds!(ll_exchange, 1024);
