//! Point-to-point calls (`ncclSend`, `ncclRecv`), the sends and receives that spell out a
//! gather or scatter, and groups (`ncclGroupStart`, `ncclGroupEnd`).

use std::ffi::{c_int, c_void};

use mscclpp_host::collectives::{DataType, P2pOp};

use crate::comm::{Comm, Inner};
use crate::dispatch;
use crate::error::{Failure, guard};
use crate::group;
use crate::log::{self, Path};
use crate::system_nccl::{Ptr, Real, need};
use crate::types::{NativeCall, NcclDataType, NcclResult, result};

use super::{Target, check_dtype, check_out, check_ptr, check_rank, forward_because, pass, target};

/// Native sends and receives (one for `ncclSend`/`ncclRecv`, several for a gather or
/// scatter): at once as one group outside a group, else kept for the outermost
/// `ncclGroupEnd` (see [`group`]).
pub(super) fn p2p(
    call: &'static str,
    c: &'static Comm,
    comm: Ptr,
    inner: &Inner,
    dt: &'static str,
    ops: &[P2pOp],
    stream: Ptr,
) -> Result<NcclResult, Failure> {
    log::call_path(call, c.rank, c.nranks, dt, "-", Path::Native);
    if group::depth() > 0 {
        for op in ops {
            group::add_p2p(comm, *op, stream);
        }
        return Ok(result::SUCCESS);
    }
    let ops: Vec<(P2pOp, Ptr)> = ops.iter().map(|op| (*op, stream)).collect();
    group::run_p2p(call, c, inner, &ops)?;
    Ok(result::SUCCESS)
}

/// Which rooted operation [`rooted_ops`] spells out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RootedKind {
    /// Every rank's `count` elements to slot `rank` of the root's `recv`.
    Gather,
    /// Slot `q` of the root's `send` to rank `q`'s `recv`.
    Scatter,
}

/// The sends and receives of rank `rank`'s part of a gather or scatter of `count` elements
/// per rank with `root`, in rank order. The root's own piece is a send to and a receive
/// from itself (a stream copy), left out when it is in place (the same address). A count
/// whose root buffer (`nranks` pieces) would not fit the address space is refused.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rooted_ops(
    call: &str,
    kind: RootedKind,
    rank: usize,
    nranks: usize,
    root: usize,
    send: u64,
    recv: u64,
    count: usize,
    dtype: DataType,
) -> Result<Vec<P2pOp>, Failure> {
    let Some(piece) = count
        .checked_mul(dtype.size())
        .filter(|p| p.checked_mul(nranks).is_some())
    else {
        return Err(Failure::arg(format!(
            "{call}: count {count} x {} bytes x {nranks} ranks overflows",
            dtype.size()
        )));
    };
    if count == 0 {
        return Ok(Vec::new());
    }
    let piece = piece as u64;
    let send_op = |buf, peer| P2pOp::Send {
        buf,
        count,
        dtype,
        peer,
    };
    let recv_op = |buf, peer| P2pOp::Recv {
        buf,
        count,
        dtype,
        peer,
    };
    // The root's slots: its output's (gather) or its input's (scatter); in place when the
    // root's own piece already sits in its slot.
    let (slots, own) = match kind {
        RootedKind::Gather => (recv, send),
        RootedKind::Scatter => (send, recv),
    };
    let in_place = rank == root && own == slots + root as u64 * piece;
    let at_root = (0..nranks)
        .filter(|&q| rank == root && !(in_place && q == root))
        .map(|q| (slots + q as u64 * piece, q));
    let mine = (!in_place).then_some((own, root));
    Ok(match kind {
        RootedKind::Gather => (mine.into_iter().map(|(b, p)| send_op(b, p)))
            .chain(at_root.map(|(b, q)| recv_op(b, q)))
            .collect(),
        RootedKind::Scatter => (at_root.map(|(b, q)| send_op(b, q)))
            .chain(mine.into_iter().map(|(b, p)| recv_op(b, p)))
            .collect(),
    })
}

export! {
    /// `ncclSend`: native for every data type (unless `MSCCLPP_NCCL_FALLBACK` names
    /// `send`/`recv`); inside a group it runs, paired with the group's receives, at the
    /// outermost `ncclGroupEnd`.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: Ptr,
        stream: Ptr,
    ) -> NcclResult {
        guard("ncclSend", || {
            let call = "ncclSend";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.send)?(sendbuff.cast_mut(), count, datatype, peer, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "peer", peer, c.nranks)?;
            check_ptr(call, "sendbuff", sendbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::SendRecv, datatype) {
                Ok(dtype) => {
                    let op = P2pOp::Send { buf: sendbuff as u64, count, dtype, peer: peer as usize };
                    p2p(call, c, comm, inner, dt, &[op], stream)
                }
                Err(why) => forward_because(call, c, inner, "this send", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclRecv`: native as `ncclSend`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: Ptr,
        stream: Ptr,
    ) -> NcclResult {
        guard("ncclRecv", || {
            let call = "ncclRecv";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.recv)?(recvbuff, count, datatype, peer, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "peer", peer, c.nranks)?;
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::SendRecv, datatype) {
                Ok(dtype) => {
                    let op = P2pOp::Recv { buf: recvbuff as u64, count, dtype, peer: peer as usize };
                    p2p(call, c, comm, inner, dt, &[op], stream)
                }
                Err(why) => forward_because(call, c, inner, "this receive", why, dt, "-", run),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------
// Groups

export! {
    /// `ncclGroupStart` (see the `group` module: mirrored on the real NCCL).
    fn ncclGroupStart / pncclGroupStart() -> NcclResult {
        guard("ncclGroupStart", group::start)
    }
}

export! {
    /// `ncclGroupEnd`: runs deferred set-ups, then (outermost) the group's native sends and
    /// receives, then ends the real NCCL's group.
    fn ncclGroupEnd / pncclGroupEnd() -> NcclResult {
        guard("ncclGroupEnd", || group::end("ncclGroupEnd", None))
    }
}

export! {
    /// `ncclGroupSimulateEnd`: ends the group like `ncclGroupEnd` without launching its
    /// native collectives, sends and receives, the real NCCL simulating its part (`sim_info`
    /// is left as is without one).
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(sim_info: Ptr) -> NcclResult {
        guard("ncclGroupSimulateEnd", || {
            check_out("ncclGroupSimulateEnd", "simInfo", sim_info)?;
            group::end("ncclGroupSimulateEnd", Some(sim_info))
        })
    }
}
