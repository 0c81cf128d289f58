//! The collectives (all-reduce, all-gather, reduce-scatter, broadcast, reduce,
//! all-to-all, gather, scatter) and the reduction operations they take.

use std::ffi::{c_int, c_void};

use mscclpp_host::collectives::PreMulScalar;

use crate::comm::{Comm, Inner};
use crate::dispatch::{self, Launch};
use crate::error::{Failure, guard};
use crate::group;
use crate::log::{self, Path};
use crate::system_nccl::{Ptr, Real, need};
use crate::types::{self, NativeCall, NcclDataType, NcclRedOp, NcclResult, op_name, result};

use super::p2p::{RootedKind, p2p, rooted_ops};
use super::{
    Target, check_dtype, check_out, check_ptr, check_rank, forward_because, pass, resolve_op,
    target,
};

/// Runs a native collective on the caller's stream (with this device's context current), or,
/// inside a group, keeps it for the outermost `ncclGroupEnd` (see [`group`]).
#[allow(clippy::too_many_arguments)]
fn native(
    call: &'static str,
    c: &Comm,
    inner: &Inner,
    dt: &'static str,
    op: &'static str,
    launch: Launch,
    stream: Ptr,
) -> Result<NcclResult, Failure> {
    log::call_path(call, c.rank, c.nranks, dt, op, Path::Native);
    if group::depth() > 0 {
        group::add_coll(c as *const Comm as Ptr, call, launch, stream);
        return Ok(result::SUCCESS);
    }
    c.launch_native(call, inner, launch, stream)
}

export! {
    /// `ncclAllReduce`: native for every operation on every type (unless
    /// `MSCCLPP_NCCL_FALLBACK` names it; pre-multiplied sums, made here, are always native).
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        op: NcclRedOp, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclAllReduce", || {
            let call = "ncclAllReduce";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.all_reduce)?(sendbuff.cast_mut(), recvbuff, count, datatype, op, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_ptr(call, "sendbuff", sendbuff, count)?;
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            let premul = resolve_op(call, inner, op, datatype)?;
            match dispatch::reducing(&inner.fallback, NativeCall::AllReduce, datatype, op, premul) {
                Ok((dtype, o)) => {
                    let l = Launch::AllReduce { send: sendbuff as u64, recv: recvbuff as u64, count, dtype, op: o };
                    native(call, c, inner, dt, op_name(op), l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this all-reduce", why, dt, op_name(op), run),
            }
        })
    }
}

export! {
    /// `ncclAllGather`: native for every data type (it moves bytes), unless
    /// `MSCCLPP_NCCL_FALLBACK` names it.
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: NcclDataType,
        comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclAllGather", || {
            let call = "ncclAllGather";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.all_gather)?(sendbuff.cast_mut(), recvbuff, sendcount, datatype, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_ptr(call, "sendbuff", sendbuff, sendcount)?;
            check_ptr(call, "recvbuff", recvbuff, sendcount)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::AllGather, datatype) {
                Ok(dtype) => {
                    let l = Launch::AllGather { send: sendbuff as u64, recv: recvbuff as u64, count: sendcount, dtype };
                    native(call, c, inner, dt, "-", l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this all-gather", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclReduceScatter`: native as `ncclAllReduce`.
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: NcclDataType,
        op: NcclRedOp, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclReduceScatter", || {
            let call = "ncclReduceScatter";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.reduce_scatter)?(sendbuff.cast_mut(), recvbuff, recvcount, datatype, op, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_ptr(call, "sendbuff", sendbuff, recvcount)?;
            check_ptr(call, "recvbuff", recvbuff, recvcount)?;
            let inner = c.usable(call)?;
            let premul = resolve_op(call, inner, op, datatype)?;
            match dispatch::reducing(&inner.fallback, NativeCall::ReduceScatter, datatype, op, premul) {
                Ok((dtype, o)) => {
                    let l = Launch::ReduceScatter { send: sendbuff as u64, recv: recvbuff as u64, count: recvcount, dtype, op: o };
                    native(call, c, inner, dt, op_name(op), l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this reduce-scatter", why, dt, op_name(op), run),
            }
        })
    }
}

export! {
    /// `ncclBroadcast`: native for every data type (unless `MSCCLPP_NCCL_FALLBACK` names
    /// `broadcast`).
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclBroadcast", || {
            let call = "ncclBroadcast";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.broadcast)?(sendbuff.cast_mut(), recvbuff, count, datatype, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            if c.rank == root as usize {
                check_ptr(call, "sendbuff", sendbuff, count)?;
            }
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::Broadcast, datatype) {
                Ok(dtype) => {
                    let l = Launch::Broadcast { send: sendbuff as u64, recv: recvbuff as u64, count, dtype, root: root as usize };
                    native(call, c, inner, dt, "-", l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this broadcast", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclBcast` (in place): native as `ncclBroadcast`.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclBcast", || {
            let call = "ncclBcast";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.bcast)?(buff, count, datatype, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            check_ptr(call, "buff", buff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::Broadcast, datatype) {
                Ok(dtype) => {
                    let l = Launch::Broadcast { send: buff as u64, recv: buff as u64, count, dtype, root: root as usize };
                    native(call, c, inner, dt, "-", l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this broadcast", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclReduce`: native as `ncclAllReduce`.
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        op: NcclRedOp, root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclReduce", || {
            let call = "ncclReduce";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.reduce)?(sendbuff.cast_mut(), recvbuff, count, datatype, op, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            check_ptr(call, "sendbuff", sendbuff, count)?;
            if c.rank == root as usize {
                check_ptr(call, "recvbuff", recvbuff, count)?;
            }
            let inner = c.usable(call)?;
            let premul = resolve_op(call, inner, op, datatype)?;
            match dispatch::reducing(&inner.fallback, NativeCall::Reduce, datatype, op, premul) {
                Ok((dtype, o)) => {
                    let l = Launch::Reduce {
                        send: sendbuff as u64, recv: recvbuff as u64, count, dtype, op: o, root: root as usize,
                    };
                    native(call, c, inner, dt, op_name(op), l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this reduce", why, dt, op_name(op), run),
            }
        })
    }
}

export! {
    /// `ncclAlltoAll`: native for every data type (unless `MSCCLPP_NCCL_FALLBACK` names
    /// `alltoall`).
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclAlltoAll", || {
            let call = "ncclAlltoAll";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.all_to_all)?(sendbuff.cast_mut(), recvbuff, count, datatype, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_ptr(call, "sendbuff", sendbuff, count)?;
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::AllToAll, datatype) {
                Ok(dtype) => {
                    let l = Launch::AllToAll { send: sendbuff as u64, recv: recvbuff as u64, count, dtype };
                    native(call, c, inner, dt, "-", l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this all-to-all", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclGather`: native for every data type as the sends and receives it stands for
    /// (every rank's piece to the root; the root's own by a stream copy, none in place),
    /// unless `MSCCLPP_NCCL_FALLBACK` names `sendrecv`; inside a group they run with the
    /// group's other sends and receives at the outermost `ncclGroupEnd`.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclGather", || {
            let call = "ncclGather";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.gather)?(sendbuff.cast_mut(), recvbuff, count, datatype, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            check_ptr(call, "sendbuff", sendbuff, count)?;
            if c.rank == root as usize {
                check_ptr(call, "recvbuff", recvbuff, count)?;
            }
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::SendRecv, datatype) {
                Ok(dtype) => {
                    let ops = rooted_ops(call, RootedKind::Gather, c.rank, c.nranks, root as usize,
                        sendbuff as u64, recvbuff as u64, count, dtype)?;
                    p2p(call, c, comm, inner, dt, &ops, stream)
                }
                Err(why) => forward_because(call, c, inner, "this gather", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclScatter`: native as [`ncclGather`], the other way (the root's piece `q` to rank
    /// `q`).
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclScatter", || {
            let call = "ncclScatter";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.scatter)?(sendbuff.cast_mut(), recvbuff, count, datatype, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            if c.rank == root as usize {
                check_ptr(call, "sendbuff", sendbuff, count)?;
            }
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::SendRecv, datatype) {
                Ok(dtype) => {
                    let ops = rooted_ops(call, RootedKind::Scatter, c.rank, c.nranks, root as usize,
                        sendbuff as u64, recvbuff as u64, count, dtype)?;
                    p2p(call, c, comm, inner, dt, &ops, stream)
                }
                Err(why) => forward_because(call, c, inner, "this scatter", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclRedOpCreatePreMulSum`: made here (native calls): a host scalar
    /// (`ncclScalarHostImmediate`) is read now, a device one (`ncclScalarDevice`) by every
    /// call that uses the operation, when it runs.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut NcclRedOp, scalar: Ptr, datatype: NcclDataType, residence: c_int, comm: Ptr,
    ) -> NcclResult {
        guard("ncclRedOpCreatePreMulSum", || {
            let call = "ncclRedOpCreatePreMulSum";
            check_out(call, "op", op)?;
            check_out(call, "scalar", scalar)?;
            check_dtype(call, datatype)?;
            let dtype = types::native_dtype(datatype)
                .ok_or_else(|| Failure::arg(format!("{call}: invalid data type {datatype}")))?;
            let s = match residence {
                types::SCALAR_DEVICE => PreMulScalar::Device { dtype, ptr: scalar as u64 },
                types::SCALAR_HOST_IMMEDIATE => {
                    let mut bits = 0u64;
                    // SAFETY: NCCL's contract: `scalar` points at one element of `datatype`
                    // in host memory (checked non-null); at most 8 bytes into `bits`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            scalar as *const u8,
                            &mut bits as *mut u64 as *mut u8,
                            dtype.size(),
                        )
                    };
                    PreMulScalar::Host { dtype, bits }
                }
                r => {
                    return Err(Failure::arg(format!(
                        "{call}: invalid residence {r} (0: ncclScalarDevice, 1: ncclScalarHostImmediate)"
                    )));
                }
            };
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.red_op_create_pre_mul_sum)?(op, scalar, datatype, residence, p) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            let inner = c.ready(call)?;
            let made = inner.premul_ops.create(s).map_err(|e| Failure::arg(format!("{call}: {e}")))?;
            // SAFETY: checked non-null; the caller's output.
            unsafe { *op = made };
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclRedOpDestroy`: forgets an operation made by `ncclRedOpCreatePreMulSum` on this
    /// communicator (a built-in one, an unknown one or one destroyed already is an invalid
    /// argument).
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: NcclRedOp, comm: Ptr) -> NcclResult {
        guard("ncclRedOpDestroy", || {
            let call = "ncclRedOpDestroy";
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.red_op_destroy)?(op, p) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            let inner = c.ready(call)?;
            inner.premul_ops.destroy(op).map_err(|e| Failure::arg(format!("{call}: {e}")))?;
            Ok(result::SUCCESS)
        })
    }
}
