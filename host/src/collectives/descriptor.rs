//! Call descriptors: the codes of types, operations and algorithms in the 16-byte descriptor
//! every kernel sends its peers (`mscclpp_device::collectives::desc`), and their reading back
//! into words for a mismatch's error.

use super::proxy;
use super::select::sum_kernels;
use super::staged;
use super::{AllGatherAlgo, AllReduceAlgo, DataType, ReduceOp};
use mscclpp_device::collectives::{desc, op};

/// The descriptor code of a data type: its index in [`DataType::ALL`] plus one.
pub(super) fn dtype_code(d: DataType) -> u64 {
    let d = staged::described_dtype(d);
    DataType::ALL
        .iter()
        .position(|&x| x == d)
        .map_or(0, |i| i as u64 + 1)
}

/// The descriptor code of a reduction: `mscclpp_device::collectives::op` code plus one.
pub(super) fn op_desc(op: ReduceOp) -> u64 {
    op_code(staged::described_op(op)) as u64 + 1
}

/// The kernels' code of `op`.
pub(super) fn op_code(op: ReduceOp) -> u32 {
    match op {
        ReduceOp::Sum => op::SUM,
        ReduceOp::Prod => op::PROD,
        ReduceOp::Min => op::MIN,
        ReduceOp::Max => op::MAX,
        ReduceOp::Avg => op::AVG,
        ReduceOp::PreMulSum(_) => op::PRE_MUL_SUM,
    }
}

const AR_ALGOS: [(AllReduceAlgo, &str); 5] = [
    (AllReduceAlgo::OneShot, "one-shot"),
    (AllReduceAlgo::TwoShot, "two-shot"),
    (AllReduceAlgo::ReadReduce, "readreduce"),
    (AllReduceAlgo::AllPairs, "all-pairs"),
    (AllReduceAlgo::Proxy, "proxy"),
];

const AG_ALGOS: [(AllGatherAlgo, &str); 3] = [
    (AllGatherAlgo::Memory, "memory"),
    (AllGatherAlgo::Proxy, "proxy"),
    (AllGatherAlgo::Packets, "packets"),
];

const OPS: [&str; 6] = ["sum", "prod", "min", "max", "avg", "premulsum"];

/// The descriptor tag of an all-reduce (`algo` resolved and routed).
pub(super) fn all_reduce_tag(algo: AllReduceAlgo, dtype: DataType, op: ReduceOp) -> u64 {
    let a = AR_ALGOS
        .iter()
        .position(|x| x.0 == algo)
        .map_or(0, |i| i + 1);
    desc::tag(desc::ALL_REDUCE, dtype_code(dtype), op_desc(op), a as u64)
}

/// The descriptor tag of an all-gather (`algo` resolved).
pub(super) fn all_gather_tag(algo: AllGatherAlgo, dtype: DataType) -> u64 {
    let a = AG_ALGOS
        .iter()
        .position(|x| x.0 == algo)
        .map_or(0, |i| i + 1);
    desc::tag(desc::ALL_GATHER, dtype_code(dtype), 0, a as u64)
}

/// [`describe`] of both sides of a mismatch; where those read the same (calls cut
/// differently: proxy plans from `set_proxy_pipeline` / `MSCCLPP_PROXY_*`, pipelined
/// pieces), with each side's plan added.
pub(super) fn describe_pair(own: [u64; 2], theirs: [u64; 2]) -> (String, String) {
    let (a, b) = (describe(own), describe(theirs));
    if a != b {
        return (a, b);
    }
    let plan = |tag: u64| {
        let algo = desc::field(tag, desc::ALGO_SHIFT) as usize;
        let proxy = match desc::field(tag, desc::KIND_SHIFT) {
            desc::ALL_REDUCE => {
                AR_ALGOS.get(algo.wrapping_sub(1)).map(|a| a.0) == Some(AllReduceAlgo::Proxy)
            }
            desc::ALL_GATHER => {
                AG_ALGOS.get(algo.wrapping_sub(1)).map(|a| a.0) == Some(AllGatherAlgo::Proxy)
            }
            _ => false,
        };
        if proxy {
            format!(" {}", proxy::proxy_tag_plan(tag))
        } else if algo as u64 == desc::PIPELINED {
            format!(
                " [pieces of {} bytes, depth {}]",
                desc::piece(tag),
                desc::depth(tag)
            )
        } else {
            format!(" [tag {tag:#x}]")
        }
    };
    (a + &plan(own[1]), b + &plan(theirs[1]))
}

/// A call descriptor in words: "all_reduce (sum) with 400000 f32 (two-shot)".
pub(super) fn describe(d: [u64; 2]) -> String {
    let [n, tag] = d;
    let field = |shift| desc::field(tag, shift) as usize;
    let dtype = DataType::ALL.get(field(desc::DTYPE_SHIFT).wrapping_sub(1));
    const SHORT: [&str; 12] = [
        "f32", "f16", "bf16", "f64", "i8", "u8", "i32", "u32", "i64", "u64", "fp8e4m3", "fp8e5m2",
    ];
    let dname = SHORT
        .get(field(desc::DTYPE_SHIFT).wrapping_sub(1))
        .unwrap_or(&"?");
    let op = OPS
        .get(field(desc::OP_SHIFT).wrapping_sub(1))
        .unwrap_or(&"?");
    // A reduction of fp8 carries its data widened to f32 (`staged.rs`).
    let widened = *op != "?" && matches!(dtype, Some(DataType::Fp8E4M3 | DataType::Fp8E5M2));
    let dtype = if widened { Some(&DataType::F32) } else { dtype };
    let dname = if widened {
        format!("{dname} (in f32)")
    } else {
        dname.to_string()
    };
    let size = dtype.map_or(1, |x| x.size() as u64);
    let root = desc::root(tag);
    let ll = field(desc::ALGO_SHIFT) == 1;
    // A call of no elements carries no algorithm (`Collectives::empty_call`).
    const EMPTY: &str = "no elements";
    let path = match field(desc::ALGO_SHIFT) as u64 {
        _ if n == 0 => EMPTY,
        1 => "LL",
        desc::PIPELINED => "pipelined",
        _ => "put",
    };
    // The kernels that move any type as bytes hold the byte count (see
    // `mscclpp_device::collectives::types::Bytes`): the put paths of reduce-scatter and
    // reduce, and two-shot and proxy all-reduce but for the sums of `sum_kernels`.
    let elems = |bytes_n: bool| if bytes_n { n / size } else { n };
    match field(desc::KIND_SHIFT) as u64 {
        desc::ALL_REDUCE => {
            let algo = AR_ALGOS.get(field(desc::ALGO_SHIFT).wrapping_sub(1));
            let sum = dtype.is_some_and(|d| {
                matches!(*op, "sum" | "premulsum") && sum_kernels(*d, ReduceOp::Sum)
            });
            let bytes_n = !sum
                && algo
                    .is_some_and(|a| matches!(a.0, AllReduceAlgo::TwoShot | AllReduceAlgo::Proxy));
            let algo = if n == 0 {
                EMPTY
            } else {
                algo.map_or("?", |x| x.1)
            };
            format!("all_reduce ({op}) with {} {dname} ({algo})", elems(bytes_n))
        }
        desc::ALL_GATHER => {
            let algo = AG_ALGOS
                .get(field(desc::ALGO_SHIFT).wrapping_sub(1))
                .map_or(if n == 0 { EMPTY } else { "?" }, |x| x.1);
            format!("all_gather of {} {dname} per rank ({algo})", n / size)
        }
        desc::REDUCE_SCATTER => format!(
            "reduce_scatter ({op}) of {} {dname} per rank ({path})",
            elems(!ll)
        ),
        desc::REDUCE => format!(
            "reduce ({op}) to root {root} with {} {dname} ({path})",
            elems(!ll)
        ),
        desc::BROADCAST => format!(
            "broadcast from root {root} of {} {dname} ({path})",
            n / size
        ),
        desc::ALL_TO_ALL => format!("all_to_all of {} {dname} per rank ({path})", n / size),
        desc::SEND_RECV => format!(
            "a send/recv group of {n} operation{}",
            if n == 1 { "" } else { "s" }
        ),
        _ => format!("an unknown collective ({n}, {tag:#x})"),
    }
}
