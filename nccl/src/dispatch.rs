//! Which calls run on our collectives and which go to the real NCCL, and the native calls
//! in our terms ([`Launch`], [`P2pPlan`]).
//!
//! # Every rank decides alike
//!
//! A collective, or a send and its receive, must run on one transport on every rank taking
//! part: if one rank launched our kernel and its peer called the real NCCL, each would wait
//! for the other forever. So every decision here depends only on what all ranks of a call
//! agree on by NCCL's contract: the call, data type, reduction operation, root, and
//! `MSCCLPP_NCCL_FALLBACK` (whose mask is OR-ed over the ranks at set-up, so a process
//! started with another value cannot split a call). Never on buffer addresses or alignment,
//! streams, counts, what else a group holds, or what this process has loaded: those may
//! differ between ranks. (The all-gather used to pick its word size from the buffers'
//! alignment and forward 1-byte rows at odd addresses: a rank-local choice, gone.)
//!
//! Sends and receives: the `sendrecv` switch covers both directions, and every data type is
//! moved natively, so within a process either every send/receive is native or none is; a
//! group never mixes native and forwarded sends/receives, and pairing never crosses from our
//! transport to NCCL's. Sends and receives to the own rank are paired inside the group and
//! copied on the stream.

use mscclpp_host::collectives::RawBuffer;
use mscclpp_host::collectives::{
    Collectives, DataType, MAX_P2P_OPS, P2pOp, PreMulScalar, ReduceOp,
};
use mscclpp_host::communicator::CommError;
use mscclpp_host::cuda::CudaStream;

use crate::types::{Fallback, NativeCall, NcclDataType, NcclRedOp, native_dtype, native_op};

/// Why a call is forwarded (for the log and for errors without a real NCCL).
pub type Why = &'static str;

const BY_ENV: Why = "named by MSCCLPP_NCCL_FALLBACK";
const PREMUL: Why = "not an operation of this communicator";
const BAD_TYPE: Why = "not a data type of the 2.28 ABI";
const P2P_OFF: Why = "send/recv across hosts is off for this communicator (more ranks on \
                      other hosts than MSCCLPP_P2P_REMOTE_MAX)";

/// The native type and operation of a reducing call (all-reduce, reduce-scatter, reduce),
/// or why it is forwarded. Every type (fp8 included: `mscclpp_host`'s staged reductions)
/// and built-in operation is native unless `MSCCLPP_NCCL_FALLBACK` names the call; a
/// pre-multiplied sum (`premul`: its scalar, which the communicator holds for operation
/// `op`) is always native, since this library made it and the real NCCL does not know it.
pub fn reducing(
    fb: &Fallback,
    call: NativeCall,
    dt: NcclDataType,
    op: NcclRedOp,
    premul: Option<PreMulScalar>,
) -> Result<(DataType, ReduceOp), Why> {
    let dtype = native_dtype(dt).ok_or(BAD_TYPE)?;
    if let Some(s) = premul {
        return Ok((dtype, ReduceOp::PreMulSum(s)));
    }
    if !fb.native(call) {
        return Err(BY_ENV);
    }
    Ok((dtype, native_op(op).ok_or(PREMUL)?))
}

/// The native type of a call that moves data (all-gather, broadcast, all-to-all,
/// send/receive), or why it is forwarded.
pub fn moving(fb: &Fallback, call: NativeCall, dt: NcclDataType) -> Result<DataType, Why> {
    if fb.named(call) {
        return Err(BY_ENV);
    }
    if !fb.native(call) {
        return Err(P2P_OFF);
    }
    native_dtype(dt).ok_or(BAD_TYPE)
}

/// A native collective with NCCL's arguments in our terms (device addresses, counts in
/// elements of `dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// `ncclAllReduce`.
    AllReduce {
        /// Input.
        send: u64,
        /// Output (equal: in place).
        recv: u64,
        /// Elements.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Operation.
        op: ReduceOp,
    },
    /// `ncclAllGather` (`count`: elements per rank).
    AllGather {
        /// Input.
        send: u64,
        /// Output (`nranks * count`).
        recv: u64,
        /// Elements per rank.
        count: usize,
        /// Type.
        dtype: DataType,
    },
    /// `ncclReduceScatter` (`count`: elements per rank of the output).
    ReduceScatter {
        /// Input (`nranks * count`).
        send: u64,
        /// Output.
        recv: u64,
        /// Elements of the output.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Operation.
        op: ReduceOp,
    },
    /// `ncclReduce`.
    Reduce {
        /// Input.
        send: u64,
        /// Output (root only).
        recv: u64,
        /// Elements.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Operation.
        op: ReduceOp,
        /// Root.
        root: usize,
    },
    /// `ncclBroadcast` (`ncclBcast`: `send == recv`).
    Broadcast {
        /// Input (root only).
        send: u64,
        /// Output.
        recv: u64,
        /// Elements.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Root.
        root: usize,
    },
    /// `ncclAlltoAll` (`count`: elements per peer block).
    AllToAll {
        /// Input (`nranks * count`).
        send: u64,
        /// Output (`nranks * count`).
        recv: u64,
        /// Elements per block.
        count: usize,
        /// Type.
        dtype: DataType,
    },
}

impl Launch {
    /// Launches on `stream` (GPU backend).
    ///
    /// # Safety
    /// As for a [`RawBuffer`] given to [`Collectives`]: the buffers stay valid until the call
    /// completes on `stream`.
    pub unsafe fn run(&self, coll: &Collectives, stream: &CudaStream) -> Result<(), CommError> {
        // SAFETY (every arm): the caller's buffers, checked by the collectives.
        unsafe {
            match *self {
                Launch::AllReduce {
                    send,
                    recv,
                    count,
                    dtype,
                    op,
                } => coll.all_reduce(
                    &RawBuffer::device(send, count, dtype),
                    &mut RawBuffer::device(recv, count, dtype),
                    op,
                    stream,
                ),
                Launch::AllGather {
                    send,
                    recv,
                    count,
                    dtype,
                } => coll.all_gather(
                    &RawBuffer::device(send, count, dtype),
                    &mut RawBuffer::device(recv, count.saturating_mul(coll.nranks()), dtype),
                    stream,
                ),
                Launch::ReduceScatter {
                    send,
                    recv,
                    count,
                    dtype,
                    op,
                } => coll.reduce_scatter(
                    &RawBuffer::device(send, count.saturating_mul(coll.nranks()), dtype),
                    &mut RawBuffer::device(recv, count, dtype),
                    op,
                    stream,
                ),
                Launch::Reduce {
                    send,
                    recv,
                    count,
                    dtype,
                    op,
                    root,
                } => coll.reduce(
                    &RawBuffer::device(send, count, dtype),
                    &mut RawBuffer::device(recv, count, dtype),
                    op,
                    root,
                    stream,
                ),
                Launch::Broadcast {
                    send,
                    recv,
                    count,
                    dtype,
                    root,
                } => coll.broadcast(
                    &RawBuffer::device(send, count, dtype),
                    &mut RawBuffer::device(recv, count, dtype),
                    root,
                    stream,
                ),
                Launch::AllToAll {
                    send,
                    recv,
                    count,
                    dtype,
                } => coll.all_to_all(
                    &RawBuffer::device(send, count.saturating_mul(coll.nranks()), dtype),
                    &mut RawBuffer::device(recv, count.saturating_mul(coll.nranks()), dtype),
                    stream,
                ),
            }
        }
    }
}

/// One send or receive of a group, as NCCL gave it (peer may be the own rank).
pub type P2pCall = P2pOp;

/// How a rank's native sends and receives of one group run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2pPlan {
    /// Copies `(src, dst, bytes)` for the sends to the own rank, paired in order with the
    /// receives from it.
    pub self_copies: Vec<(u64, u64, usize)>,
    /// Launches of [`Collectives::group`], in order.
    pub launches: Vec<Vec<P2pOp>>,
}

/// A send or receive as `(is_send, buffer, bytes, peer)`.
pub(crate) fn parts(op: &P2pOp) -> (bool, u64, usize, usize) {
    match *op {
        P2pOp::Send {
            buf,
            count,
            dtype,
            peer,
        } => (true, buf, count * dtype.size(), peer),
        P2pOp::Recv {
            buf,
            count,
            dtype,
            peer,
        } => (false, buf, count * dtype.size(), peer),
    }
}

/// Plans a rank's sends and receives of one group.
///
/// - To and from the own rank: the i-th send pairs with the i-th receive (equal bytes), a
///   copy on the stream.
/// - Up to [`MAX_P2P_OPS`] other operations (empty ones too, as NCCL's): one launch, all
///   progressing together (as NCCL's group).
/// - More: one launch per peer and round, peers in the global order of the pair
///   (`(min, max)` of the two ranks), a round holding the next up-to-8 sends to and 8
///   receives from that peer. The peer cuts its side alike (its receives from us match our
///   sends in order), and every rank walks the pairs in one global order, so the lowest
///   unfinished pair always has both sides posted: no deadlock, whatever the other ranks'
///   group sizes. (Only the counts *between two ranks* enter, which both agree on.)
pub fn plan_p2p(rank: usize, ops: &[P2pOp]) -> Result<P2pPlan, String> {
    let mut self_sends = Vec::new();
    let mut self_recvs = Vec::new();
    let mut others = Vec::new();
    for op in ops {
        let (send, buf, bytes, peer) = parts(op);
        if peer == rank {
            if send {
                self_sends.push((buf, bytes));
            } else {
                self_recvs.push((buf, bytes));
            }
        } else {
            // Of no bytes too: NCCL runs those (since 2.12.10), and programs use them to
            // synchronise, so they pair with the peer's like any other.
            others.push(*op);
        }
    }
    if self_sends.len() != self_recvs.len() {
        return Err(format!(
            "{} send(s) to the own rank {rank} and {} receive(s) from it in the group: they \
             must pair up",
            self_sends.len(),
            self_recvs.len()
        ));
    }
    let mut self_copies = Vec::new();
    for (i, (s, r)) in self_sends.iter().zip(&self_recvs).enumerate() {
        if s.1 != r.1 {
            return Err(format!(
                "send #{i} to the own rank {rank} has {} bytes, its receive {}",
                s.1, r.1
            ));
        }
        if s.1 > 0 {
            self_copies.push((s.0, r.0, s.1));
        }
    }
    let launches = if others.is_empty() {
        Vec::new()
    } else if others.len() <= MAX_P2P_OPS {
        vec![others]
    } else {
        let mut peers: Vec<usize> = others.iter().map(|o| parts(o).3).collect();
        peers.sort_by_key(|&p| (rank.min(p), rank.max(p)));
        peers.dedup();
        let half = MAX_P2P_OPS / 2;
        let mut launches = Vec::new();
        for p in peers {
            let of = |send: bool| -> Vec<P2pOp> {
                others
                    .iter()
                    .filter(|o| {
                        let (s, _, _, q) = parts(o);
                        s == send && q == p
                    })
                    .copied()
                    .collect()
            };
            let (sends, recvs) = (of(true), of(false));
            let rounds = sends.len().max(recvs.len()).div_ceil(half);
            for j in 0..rounds {
                let pick = |v: &[P2pOp]| -> Vec<P2pOp> {
                    v.iter().skip(j * half).take(half).copied().collect()
                };
                let mut l = pick(&sends);
                l.extend(pick(&recvs));
                launches.push(l);
            }
        }
        launches
    };
    Ok(P2pPlan {
        self_copies,
        launches,
    })
}

#[cfg(test)]
mod tests;
