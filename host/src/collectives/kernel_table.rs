//! Which kernel runs a call of a given type: the per-type and per-size kernel tables (names
//! in the loaded module, host twins on the Host backend) and the all-reduce kernels' slots.

use super::select::sum_kernels;
use super::{AllReduceAlgo, DataType, ReduceOp};
use mscclpp_device::collectives::CollContext;
use mscclpp_device::kernels::collectives as k1;

pub(super) type HostKernel = unsafe fn(*const CollContext, *const u8, *mut u8, u64, u64);

/// Which kernel table runs a routed all-reduce: `(true, i)`: the sum-only kernels,
/// algorithm `i` of one-shot, two-shot, read-reduce, all-pairs, proxy; `(false, i)`: the
/// any-operation kernels, `i` of one-shot, two-shot, proxy.
pub(super) fn kernel_slot(algo: AllReduceAlgo, dtype: DataType, op: ReduceOp) -> (bool, usize) {
    if sum_kernels(dtype, op) {
        let i = match algo {
            AllReduceAlgo::OneShot => 0,
            AllReduceAlgo::ReadReduce => 2,
            AllReduceAlgo::AllPairs => 3,
            AllReduceAlgo::Proxy => 4,
            _ => 1,
        };
        (true, i)
    } else {
        let i = match algo {
            AllReduceAlgo::OneShot => 0,
            AllReduceAlgo::Proxy => 2,
            _ => 1,
        };
        (false, i)
    }
}

/// The reducing types' kernel name suffixes, in the order of every per-type table.
pub(super) const REDUCE_TYPES: [&str; 10] = [
    "f32", "f16", "bf16", "f64", "i8", "u8", "i32", "u32", "i64", "u64",
];

/// The index of `dtype` in [`REDUCE_TYPES`]; `None` for the types that are only moved (fp8).
pub(super) fn reduce_index(dtype: DataType) -> Option<usize> {
    Some(match dtype {
        DataType::F32 => 0,
        DataType::F16 => 1,
        DataType::Bf16 => 2,
        DataType::F64 => 3,
        DataType::I8 => 4,
        DataType::U8 => 5,
        DataType::I32 => 6,
        DataType::U32 => 7,
        DataType::I64 => 8,
        DataType::U64 => 9,
        DataType::Fp8E4M3 | DataType::Fp8E5M2 => return None,
    })
}

/// The host twins of the sum-only all-reduce kernels (f32, f16, bf16): one-shot, two-shot,
/// read-reduce, all-pairs, proxy.
const ALL_REDUCE_SUM_HOST: [[super::kernel_table::HostKernel; 5]; 3] = [
    [
        k1::all_reduce_one_shot_f32,
        k1::all_reduce_two_shot_f32,
        k1::all_reduce_two_shot_read_f32,
        k1::all_reduce_all_pairs_f32,
        k1::all_reduce_proxy_f32,
    ],
    [
        k1::all_reduce_one_shot_f16,
        k1::all_reduce_two_shot_f16,
        k1::all_reduce_two_shot_read_f16,
        k1::all_reduce_all_pairs_f16,
        k1::all_reduce_proxy_f16,
    ],
    [
        k1::all_reduce_one_shot_bf16,
        k1::all_reduce_two_shot_bf16,
        k1::all_reduce_two_shot_read_bf16,
        k1::all_reduce_all_pairs_bf16,
        k1::all_reduce_proxy_bf16,
    ],
];

/// The host twins of the any-operation all-reduce kernels, per element size ([`size_class`]):
/// one-shot, two-shot, proxy.
const ALL_REDUCE_OP_HOST: [[super::kernel_table::HostKernel; 3]; 4] = [
    [
        k1::all_reduce_one_shot_op_b8,
        k1::all_reduce_two_shot_op,
        k1::all_reduce_proxy_op,
    ],
    [
        k1::all_reduce_one_shot_op_b16,
        k1::all_reduce_two_shot_op,
        k1::all_reduce_proxy_op,
    ],
    [
        k1::all_reduce_one_shot_op_b32,
        k1::all_reduce_two_shot_op,
        k1::all_reduce_proxy_op,
    ],
    [
        k1::all_reduce_one_shot_op_b64,
        k1::all_reduce_two_shot_op,
        k1::all_reduce_proxy_op,
    ],
];

/// The index of the any-type kernels of `dtype`'s element size: 0 for 1 byte, 1 for 2, 2
/// for 4, 3 for 8.
pub(super) fn size_class(dtype: DataType) -> usize {
    dtype.size().trailing_zeros() as usize
}

/// The kernel name suffixes of the element sizes, in [`size_class`] order.
pub(super) const SIZE_CLASSES: [&str; 4] = ["b8", "b16", "b32", "b64"];

/// The host twin of the all-reduce kernel of routed `algo`, `dtype` (a reducing type) and
/// `op` (see `super::kernel_table::kernel_slot`).
pub(super) fn all_reduce_host_kernel(
    algo: AllReduceAlgo,
    dtype: DataType,
    op: ReduceOp,
) -> super::kernel_table::HostKernel {
    let i = reduce_index(dtype).expect("a reducing type (checked)");
    match super::kernel_table::kernel_slot(algo, dtype, op) {
        (true, a) => ALL_REDUCE_SUM_HOST[i][a],
        (false, a) => ALL_REDUCE_OP_HOST[size_class(dtype)][a],
    }
}
