//! Reduce-scatter, broadcast, all-to-all and reduce, and point-to-point send/receive
//! (issue #14): the calls on [`Collectives`], in the three forms of all-reduce's (`_raw` on
//! device addresses with a [`DataType`] and a stream; typed on cudarc slices; `_host` on the
//! host backend).
//!
//! Each has two paths, chosen by the bytes one rank sends to one peer: up to
//! [`CollConfig::packet_max_bytes`](super::CollConfig::packet_max_bytes) (and what a packet
//! half holds), LL packets with no barrier, sharing one-shot all-reduce's call counter and
//! packet halves; above, puts into the peers' scratch in rounds with per-block semaphore
//! barriers. Sums are formed in rank order on every rank, as all-reduce's.
//!
//! Sends and receives ([`Collectives::send_raw`], [`Collectives::recv_raw`],
//! [`Collectives::group`]) go through a separate registered p2p buffer (per source rank: a
//! slot of `scratch_bytes / 16` clamped to 1 KiB..32 MiB, a packet scratch of `4 *`
//! [`CollConfig::p2p_packet_max_bytes`](super::CollConfig::p2p_packet_max_bytes); its own
//! semaphores), so they never meet a collective's scratch: see
//! `mscclpp_device::collectives::send_recv`. A transfer of up to `p2p_packet_max_bytes` goes
//! as LL packets: the send ends once its packets are written (eager, as NCCL's small
//! messages), unless the receiver has yet to read the send two before it between the pair.
//! A larger send ends once the receiver has copied its data out (rendezvous, pipelined
//! through `p2p_depth` pieces per block). Either way a rank that sends to and receives from
//! the same peer must post both in one [`group`](Collectives::group). Sends and receives
//! between a pair match in call order and must have equal sizes. Sending to the own rank is
//! refused (copy locally instead).

use crate::transport::tags::TAG_P2P;
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use mscclpp_device::arch::{Dim3, launch};
use mscclpp_device::collectives::op;
use mscclpp_device::collectives::pipe::pipe_piece;
use mscclpp_device::collectives::send_recv::{
    MAX_P2P_OPS, P2P_MAX_BLOCKS, P2P_STATE_WORDS, P2P_TAIL_BYTES, P2pOp as DevP2pOp, P2pOps,
    p2p_piece,
};
use mscclpp_device::collectives::send_recv_proxy::XOps;
use mscclpp_device::collectives::{
    CollContext, EXPECTED_WORDS, MAX_BLOCKS, MAX_RANKS, SEMAPHORE_WORDS, STATE_WORDS, desc, guard,
    one_shot_max_bytes,
};
use mscclpp_device::kernels::collectives as k1;
use mscclpp_device::kernels::scatter_rooted::{self as k, ScatterRootedKernel};

use super::cross::Exec;
use super::{
    AllReduceAlgo, CollConfig, Collectives, DataType, Element, ReduceOp, checked_bytes, gpu,
};
use crate::communicator::{Backend, Buffer, CommError, Communicator};
use std::sync::Mutex;

use crate::cuda::{CudaError, CudaEvent, CudaFunction, CudaSlice, CudaStream, DeviceBuffer};

/// The collectives of this file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ReduceScatter,
    Reduce,
    Broadcast,
    AllToAll,
}

impl Kind {
    /// The collective's descriptor code (`mscclpp_device::collectives::desc`).
    fn desc(self) -> u64 {
        match self {
            Kind::ReduceScatter => desc::REDUCE_SCATTER,
            Kind::Reduce => desc::REDUCE,
            Kind::Broadcast => desc::BROADCAST,
            Kind::AllToAll => desc::ALL_TO_ALL,
        }
    }
}

/// Every kernel of this file: name and host twin (see [`kernel_index`]). The reducing ones
/// exist per element size (b8, b16, b32, b64) on the LL path and once on the put path (bytes),
/// and take the type and operation from the tag.
const TABLE: &[(&str, ScatterRootedKernel)] = &[
    ("reduce_scatter_ll_b8", k::reduce_scatter_ll_b8),
    ("reduce_scatter_ll_b16", k::reduce_scatter_ll_b16),
    ("reduce_scatter_ll_b32", k::reduce_scatter_ll_b32),
    ("reduce_scatter_ll_b64", k::reduce_scatter_ll_b64),
    ("reduce_scatter_put", k::reduce_scatter_put),
    ("reduce_ll_b8", k::reduce_ll_b8),
    ("reduce_ll_b16", k::reduce_ll_b16),
    ("reduce_ll_b32", k::reduce_ll_b32),
    ("reduce_ll_b64", k::reduce_ll_b64),
    ("reduce_put", k::reduce_put),
    ("broadcast_ll", k::broadcast_ll),
    ("broadcast_put", k::broadcast_put),
    ("all_to_all_ll", k::all_to_all_ll),
    ("all_to_all_put", k::all_to_all_put),
    ("broadcast_pipe", k::broadcast_pipe),
    ("reduce_pipe", k::reduce_pipe),
];

/// How a call moves its data: LL packets, rounds through the scratch with a barrier per
/// round, or pieces pipelined through the scratch (broadcast and reduce,
/// [`RootedAlgo::Pipelined`](super::RootedAlgo::Pipelined)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Ll,
    Put,
    Pipe,
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

/// The host twins of the sum-only all-reduce kernels (f32, f16, bf16): one-shot, two-shot,
/// read-reduce, all-pairs, proxy.
const ALL_REDUCE_SUM_HOST: [[super::HostKernel; 5]; 3] = [
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
const ALL_REDUCE_OP_HOST: [[super::HostKernel; 3]; 4] = [
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
/// `op` (see `super::kernel_slot`).
pub(super) fn all_reduce_host_kernel(
    algo: AllReduceAlgo,
    dtype: DataType,
    op: ReduceOp,
) -> super::HostKernel {
    let i = reduce_index(dtype).expect("a reducing type (checked)");
    match super::kernel_slot(algo, dtype, op) {
        (true, a) => ALL_REDUCE_SUM_HOST[i][a],
        (false, a) => ALL_REDUCE_OP_HOST[size_class(dtype)][a],
    }
}

/// The index in [`TABLE`] of the kernel of `kind` on `path` for `dtype` (ignored by the
/// byte movers; a reducing type for the others). Only broadcast and reduce have a
/// pipelined path.
fn kernel_index(kind: Kind, path: Path, dtype: DataType) -> usize {
    match (kind, path) {
        (Kind::Broadcast, Path::Pipe) => return 14,
        (Kind::Reduce, Path::Pipe) => return 15,
        _ => {}
    }
    let ll = path == Path::Ll;
    let path = usize::from(!ll);
    let ty = || {
        reduce_index(dtype).expect("a reducing type (checked)");
        size_class(dtype)
    };
    let reducing = |base: usize| if ll { base + ty() } else { base + 4 };
    match kind {
        Kind::ReduceScatter => reducing(0),
        Kind::Reduce => reducing(5),
        Kind::Broadcast => 10 + path,
        Kind::AllToAll => 12 + path,
    }
}

/// The kernels of this file in the communicator's loaded module.
#[derive(Debug)]
pub(super) struct Kernels {
    /// In [`TABLE`]'s order.
    functions: Vec<CudaFunction>,
    p2p: CudaFunction,
    ctx: u64,
    /// Programmatic dependent launch for the LL and p2p kernels (see `gpu::Kernels::launch`).
    pdl: gpu::Pdl,
}

impl Kernels {
    pub(super) fn load(base: &gpu::Kernels) -> Result<Kernels, CudaError> {
        let functions = TABLE
            .iter()
            .map(|(name, _)| base.function(name))
            .collect::<Result<_, _>>()?;
        Ok(Kernels {
            functions,
            p2p: base.function("p2p")?,
            ctx: base.ctx_ptr(),
            pdl: gpu::Pdl::new(base.pdl.is_on()),
        })
    }

    /// Launches kernel `TABLE[index]` with `(ctx, send, recv, count, tag)` on `stream`.
    ///
    /// # Safety
    /// `send`/`recv` valid for what the kernel accesses with `count` and `root`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(
        &self,
        stream: &CudaStream,
        index: usize,
        send: u64,
        recv: u64,
        count: u64,
        tag: u64,
        (blocks, threads): (u32, u32),
        dependent: bool,
    ) -> Result<(), CommError> {
        let args = [self.ctx, send, recv, count, tag];
        // SAFETY: forwarded (caller contract); the LL kernels, the only ones launched as
        // dependents, call dependent_launch_entry first, and the stream's context was bound
        // by the call's check_stream.
        unsafe {
            gpu::launch_coll(
                stream,
                &self.pdl,
                &self.functions[index],
                args,
                (blocks, threads),
                dependent,
            )
        }
    }
}

fn invalid(m: String) -> CommError {
    CommError::InvalidArgument(m)
}

/// Refuses ranges that overlap other than as `allowed` (recv at that byte offset of send).
fn check_overlap(
    call: &str,
    send: u64,
    send_bytes: usize,
    recv: u64,
    recv_bytes: usize,
    allowed: u64,
) -> Result<(), CommError> {
    let disjoint = send + send_bytes as u64 <= recv || recv + recv_bytes as u64 <= send;
    if disjoint || recv == send + allowed {
        Ok(())
    } else {
        Err(invalid(format!(
            "{call}: send ({send:#x}, {send_bytes} bytes) and recv ({recv:#x}, {recv_bytes} \
             bytes) overlap other than in place (recv at send + {allowed} bytes)"
        )))
    }
}

/// What one call launches, once checked.
struct Plan {
    kind: Kind,
    dtype: DataType,
    /// The kernel's `count` argument (elements, or bytes for the byte movers).
    count: u64,
    /// The reduction (reduce-scatter, reduce).
    op: Option<ReduceOp>,
    /// Bytes one rank sends one peer (chooses the path).
    pair_bytes: usize,
    /// Bytes the call moves on this rank (sizes the grid of the put path).
    total_bytes: usize,
    root: usize,
}

impl Collectives {
    /// Whether a call of `kind` sending `pair_bytes` to each peer takes the LL path.
    fn more_ll(&self, pair_bytes: usize) -> bool {
        let fits = one_shot_max_bytes(self.ctx.packets_len);
        pair_bytes <= self.config.packet_max_bytes.min(fits as usize)
    }

    /// The path of a plan: LL up to the LL size, else pipelined for a broadcast or reduce
    /// whose algorithm says so ([`rooted_algo`](Self::rooted_algo)), else rounds.
    fn more_path(&self, p: &Plan) -> Path {
        if self.more_ll(p.pair_bytes) {
            return Path::Ll;
        }
        let pipelined = match p.kind {
            Kind::Broadcast => {
                self.rooted_algo(false, p.pair_bytes) == super::RootedAlgo::Pipelined
            }
            Kind::Reduce => self.rooted_algo(true, p.pair_bytes) == super::RootedAlgo::Pipelined,
            _ => false,
        };
        if pipelined { Path::Pipe } else { Path::Put }
    }

    /// The algorithm of a broadcast (`reduce` false) or reduce above the LL size:
    /// `MSCCLPP_BROADCAST_ALGO` / `MSCCLPP_REDUCE_ALGO`, then
    /// [`CollConfig::broadcast_algo`](super::CollConfig::broadcast_algo) /
    /// [`reduce_algo`](super::CollConfig::reduce_algo); [`Auto`](super::RootedAlgo::Auto)
    /// resolves by the message's `bytes`: [`Pipelined`](super::RootedAlgo::Pipelined) above
    /// [`ROOTED_PIPELINED_ABOVE`](super::ROOTED_PIPELINED_ABOVE), else
    /// [`Rounds`](super::RootedAlgo::Rounds) (never `Auto` here).
    pub fn rooted_algo(&self, reduce: bool, bytes: usize) -> super::RootedAlgo {
        let algo = if reduce {
            self.env_reduce.unwrap_or(self.config.reduce_algo)
        } else {
            self.env_broadcast.unwrap_or(self.config.broadcast_algo)
        };
        match algo {
            super::RootedAlgo::Auto if bytes > super::ROOTED_PIPELINED_ABOVE => {
                super::RootedAlgo::Pipelined
            }
            super::RootedAlgo::Auto => super::RootedAlgo::Rounds,
            a => a,
        }
    }

    /// The descriptor tag of a plan on `path` over `blocks` blocks: the collective, type,
    /// operation, path (algorithm 1 LL, 2 put, 3 pipelined, with its piece size and depth)
    /// and root.
    fn more_tag(&self, p: &Plan, path: Path, blocks: u32) -> u64 {
        let algo = match path {
            Path::Ll => 1,
            Path::Put => 2,
            Path::Pipe => desc::PIPELINED,
        };
        let tag = desc::rooted_tag(
            p.kind.desc(),
            super::dtype_code(p.dtype),
            p.op.map_or(0, super::op_desc),
            algo,
            p.root as u64,
        );
        if path != Path::Pipe {
            return tag;
        }
        let (piece, depth) = self.pipe_shape(p, blocks);
        desc::with_pipe(tag, piece, depth)
    }

    /// The slot a pipelined plan streams through: the whole region for a broadcast, one slot
    /// per source rank for a reduce.
    fn pipe_slot(&self, p: &Plan) -> u64 {
        let region = self.ctx.scratch_len / 16 * 16;
        match p.kind {
            Kind::Reduce => mscclpp_device::collectives::reduce_scatter::rank_slot(
                region,
                self.ctx.nranks as u64,
            ),
            _ => region,
        }
    }

    /// Most blocks a pipelined plan may use: each block's chunk must hold `depth` pieces of
    /// 16 bytes.
    fn pipe_max_blocks(&self, p: &Plan) -> u32 {
        let per = 16 * self.config.rooted_depth.max(1) as u64;
        (self.pipe_slot(p) / per).clamp(1, MAX_BLOCKS as u64) as u32
    }

    /// Piece size and depth of a pipelined plan over `blocks` blocks (the depth lowered until
    /// a sub-slot holds 16 bytes; [`pipe_max_blocks`](Self::pipe_max_blocks) keeps that
    /// possible).
    fn pipe_shape(&self, p: &Plan, blocks: u32) -> (u64, u32) {
        let slot = self.pipe_slot(p);
        let bytes = p.pair_bytes as u64;
        let min = self.config.rooted_piece_bytes as u64;
        let mut depth = self.config.rooted_depth.max(1);
        loop {
            let piece = pipe_piece(bytes, slot, blocks, depth, min);
            if piece > 0 || depth == 1 {
                return (piece, depth);
            }
            depth -= 1;
        }
    }

    fn check_root(&self, call: &str, root: usize) -> Result<(), CommError> {
        if root >= self.nranks() {
            return Err(invalid(format!(
                "{call}: root {root} is not a rank (there are {} ranks)",
                self.nranks()
            )));
        }
        Ok(())
    }

    /// The kernel (index in [`TABLE`]), grid and tag of a plan on the GPU.
    fn more_gpu_launch(&self, p: &Plan) -> (usize, (u32, u32), u64) {
        let path = self.more_path(p);
        let grid = match path {
            Path::Ll => self.grid(Some(super::AllReduceAlgo::OneShot), p.pair_bytes),
            Path::Put => self.grid(None, p.total_bytes),
            Path::Pipe => {
                let (blocks, threads) = self.grid(None, p.total_bytes);
                (blocks.min(self.pipe_max_blocks(p)), threads)
            }
        };
        (
            kernel_index(p.kind, path, p.dtype),
            grid,
            self.more_tag(p, path, grid.0),
        )
    }

    /// Launches a checked plan on `stream`.
    ///
    /// # Safety
    /// The ranges valid for the plan (checked by the caller) until it completes.
    unsafe fn more_launch(
        &self,
        p: Plan,
        send: u64,
        recv: u64,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let kernels = self.more.as_ref().expect("GPU backend");
        let (index, grid, tag) = self.more_gpu_launch(&p);
        // The LL kernels start with dependent_launch_entry and go out as dependents (small
        // grids, checked on GPUs; see `mod.rs`, "Launches"); the others do not.
        let dependent = self.more_path(&p) == Path::Ll;
        // SAFETY: caller contract.
        self.noted(unsafe {
            kernels.launch(stream, index, send, recv, p.count, tag, grid, dependent)
        })
    }

    /// Runs a plan on the host backend: on CPU threads, or across hosts through
    /// `cross.rs`.
    ///
    /// # Safety
    /// The ranges valid host memory for the plan.
    unsafe fn more_host(&self, call: &str, p: Plan, send: u64, recv: u64) -> Result<(), CommError> {
        if let Some(op) = p.op
            && super::staged::is_staged(p.dtype, op)
        {
            let what = match p.kind {
                Kind::Reduce => super::staged::Staged::Reduce(p.root),
                _ => super::staged::Staged::ReduceScatter,
            };
            let count = p.pair_bytes / p.dtype.size();
            // SAFETY: forwarded (caller contract).
            return unsafe { self.staged(Exec::Host, what, send, recv, count, p.dtype, op) };
        }
        self.host_only(call)?;
        if p.pair_bytes == 0 {
            let root = matches!(p.kind, Kind::Reduce | Kind::Broadcast).then_some(p.root);
            return self.empty_call(Exec::Host, call, p.kind.desc(), p.dtype, p.op, root);
        }
        if self.cross().is_some() {
            // SAFETY: caller contract.
            return unsafe { self.cross_more(Exec::Host, p, send, recv) };
        }
        // SAFETY: caller contract.
        unsafe { self.local_more_host(call, p, send, recv) }
    }

    /// Runs a plan across hosts (`cross.rs`) on `ex` (never of no bytes: the callers send
    /// such calls to `empty_call`).
    ///
    /// # Safety
    /// The ranges valid memory of `ex`'s kind for the plan (until the stream ran it).
    unsafe fn cross_more(
        &self,
        ex: Exec<'_>,
        p: Plan,
        send: u64,
        recv: u64,
    ) -> Result<(), CommError> {
        // SAFETY: caller contract.
        unsafe {
            match p.kind {
                Kind::ReduceScatter => self.cross_reduce_scatter(
                    ex,
                    send,
                    recv,
                    p.count as usize,
                    p.dtype,
                    p.op.expect("a reduction"),
                ),
                Kind::Broadcast => {
                    self.cross_broadcast(ex, send, recv, p.pair_bytes, p.dtype, p.root)
                }
                Kind::Reduce => self.cross_all_reduce(
                    ex,
                    send,
                    recv,
                    p.count as usize,
                    p.dtype,
                    p.op.expect("a reduction"),
                    Some(p.root),
                    // As the all-reduce decides (a reduce's bytes per rank: pair_bytes).
                    self.cross_all_reduce_algo(
                        self.cross().expect("across hosts"),
                        super::AllReduceAlgo::Auto,
                        p.pair_bytes,
                    ),
                ),
                Kind::AllToAll => self.cross_all_to_all(ex, send, recv, p.pair_bytes, p.dtype),
            }
        }
    }

    /// A checked plan on the GPU: across hosts through `cross.rs`, else the kernel.
    ///
    /// # Safety
    /// The ranges valid for the plan (checked by the caller) until it completes.
    unsafe fn more_gpu(
        &self,
        p: Plan,
        send: u64,
        recv: u64,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        // SAFETY: caller contract.
        unsafe {
            if self.cross().is_some() {
                self.cross_more(Exec::Gpu(stream), p, send, recv)
            } else {
                self.more_launch(p, send, recv, stream)
            }
        }
    }

    /// Runs a local-group plan on `ex` (CPU threads, or the kernel on the stream).
    ///
    /// # Safety
    /// The ranges valid memory of `ex`'s kind for the plan.
    unsafe fn local_more(
        &self,
        ex: Exec<'_>,
        call: &str,
        p: Plan,
        send: u64,
        recv: u64,
    ) -> Result<(), CommError> {
        // SAFETY: caller contract.
        unsafe {
            match ex {
                Exec::Host => self.local_more_host(call, p, send, recv),
                Exec::Gpu(_) if p.pair_bytes == 0 => Ok(()),
                Exec::Gpu(stream) => self.more_launch(p, send, recv, stream),
            }
        }
    }

    /// The local group's broadcast of `bytes` in place at `buf` from local index `root`.
    ///
    /// # Safety
    /// `buf` valid memory of `ex`'s kind for `bytes`.
    pub(super) unsafe fn local_broadcast(
        &self,
        ex: Exec<'_>,
        call: &str,
        buf: u64,
        bytes: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<(), CommError> {
        let plan = self.plan_rooted(bytes / dtype.size(), dtype, None, root);
        // SAFETY: caller contract.
        unsafe { self.local_more(ex, call, plan, buf, buf) }
    }

    /// The local group's reduce-scatter of `count` elements per local rank (`send` holds
    /// `nlocal * count`).
    ///
    /// # Safety
    /// `send` valid memory of `ex`'s kind for `nlocal * count` elements, `recv` for
    /// `count`, disjoint.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn local_reduce_scatter(
        &self,
        ex: Exec<'_>,
        call: &str,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let plan = self.plan_rs(count, dtype, op);
        // SAFETY: caller contract.
        unsafe { self.local_more(ex, call, plan, send, recv) }
    }

    /// The local group's all-to-all of `pair_bytes` per pair (`send` and `recv` hold
    /// `nlocal * pair_bytes`, block `l` for / from local index `l`).
    ///
    /// # Safety
    /// `send`, `recv` valid memory of `ex`'s kind for `nlocal * pair_bytes`, disjoint.
    pub(super) unsafe fn local_all_to_all(
        &self,
        ex: Exec<'_>,
        call: &str,
        send: u64,
        recv: u64,
        pair_bytes: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let plan = Plan {
            kind: Kind::AllToAll,
            dtype,
            op: None,
            count: pair_bytes as u64,
            pair_bytes,
            total_bytes: pair_bytes * self.ctx.nranks as usize,
            root: 0,
        };
        // SAFETY: caller contract.
        unsafe { self.local_more(ex, call, plan, send, recv) }
    }

    /// Runs a plan on CPU threads over the local group's context.
    ///
    /// # Safety
    /// The ranges valid host memory for the plan.
    unsafe fn local_more_host(
        &self,
        call: &str,
        p: Plan,
        send: u64,
        recv: u64,
    ) -> Result<(), CommError> {
        if p.pair_bytes == 0 {
            return Ok(());
        }
        let path = self.more_path(&p);
        let f = TABLE[kernel_index(p.kind, path, p.dtype)].1;
        let ctx = &*self.ctx as *const CollContext as u64;
        // One block (`run_host`).
        let (count, tag) = (p.count, self.more_tag(&p, path, 1));
        self.run_host(call, || {
            // SAFETY: the context (boxed, alive as long as self) holds this communicator's
            // shared memory; the ranges are valid (caller contract); the grid is one block
            // of >= nranks threads.
            unsafe {
                f(
                    ctx as *const CollContext,
                    send as *const u8,
                    recv as *mut u8,
                    count,
                    tag,
                )
            }
        })
    }

    /// Checks the GPU backend and the stream of a `_raw` call, and orders the call after the
    /// communicator's previous ones (its work must be queued while the guard lives).
    fn more_gpu_call(
        &self,
        call: &str,
        stream: &CudaStream,
    ) -> Result<super::order::Ordered<'_>, CommError> {
        self.gpu_kernels(call)?;
        self.check_fault(call, false)?;
        self.noted(gpu::check_stream(
            call,
            self.gpu().expect("GPU backend"),
            stream,
        ))?;
        self.ordered(call, stream)
    }

    /// Reduce-scatter: `send` holds `nranks * recv_count` elements (block `p` for rank `p`);
    /// rank `r`'s `recv` gets the sum over the ranks of their block `r` (in rank order, so
    /// bit-identical to a CPU sum in that order). In place when `recv == send + rank *
    /// recv_count` elements. Stream-ordered on `stream`; GPU backend; checks as
    /// [`all_reduce_raw`](Self::all_reduce_raw) (device memory, bounds, alignment) and
    /// refuses other overlaps. Allocates nothing: capturable into CUDA graphs.
    ///
    /// # Safety
    /// `send` and `recv` must stay valid until the operation completes on `stream`, and not
    /// be written by others meanwhile.
    pub unsafe fn reduce_scatter_raw(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        if super::staged::is_staged(dtype, op) {
            let (ex, what) = (Exec::Gpu(stream), super::staged::Staged::ReduceScatter);
            // SAFETY: forwarded (caller contract).
            return unsafe { self.staged(ex, what, send, recv, recv_count, dtype, op) };
        }
        let call = "reduce_scatter";
        let _order = self.more_gpu_call(call, stream)?;
        let word = recv_count as u64;
        let (n, es) = (self.nranks(), dtype.size());
        let bytes = checked_bytes(call, recv_count, es)?;
        let total = checked_bytes(call, bytes, n)?;
        if recv_count == 0 {
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, call, desc::REDUCE_SCATTER, dtype, Some(op), None);
        }
        gpu::check_range("reduce_scatter: send", send, total, es)?;
        gpu::check_range("reduce_scatter: recv", recv, bytes, es)?;
        check_overlap(call, send, total, recv, bytes, (self.rank() * bytes) as u64)?;
        let p = Plan {
            kind: Kind::ReduceScatter,
            dtype,
            op: Some(op),
            count: word,
            pair_bytes: bytes,
            total_bytes: total,
            root: 0,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.more_gpu(p, send, recv, stream) }
    }

    /// Reduce (sum) to `root`: the root's `recv` gets the rank-order sum of every rank's
    /// `send` (`count` elements each); `recv` is neither checked nor touched on the other
    /// ranks (pass 0). In place when `send == recv` on the root. As
    /// [`reduce_scatter_raw`](Self::reduce_scatter_raw) otherwise; `root >= nranks` is an
    /// error.
    ///
    /// # Safety
    /// As for [`reduce_scatter_raw`](Self::reduce_scatter_raw).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        if super::staged::is_staged(dtype, op) {
            let (ex, what) = (Exec::Gpu(stream), super::staged::Staged::Reduce(root));
            // SAFETY: forwarded (caller contract).
            return unsafe { self.staged(ex, what, send, recv, count, dtype, op) };
        }
        let call = "reduce";
        let _order = self.more_gpu_call(call, stream)?;
        self.check_root(call, root)?;
        let word = count as u64;
        let es = dtype.size();
        let bytes = checked_bytes(call, count, es)?;
        if count == 0 {
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, call, desc::REDUCE, dtype, Some(op), Some(root));
        }
        gpu::check_range("reduce: send", send, bytes, es)?;
        if self.rank() == root {
            gpu::check_range("reduce: recv", recv, bytes, es)?;
            check_overlap(call, send, bytes, recv, bytes, 0)?;
        }
        let p = Plan {
            kind: Kind::Reduce,
            dtype,
            op: Some(op),
            count: word,
            pair_bytes: bytes,
            total_bytes: bytes,
            root,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.more_gpu(p, send, recv, stream) }
    }

    /// Broadcast from `root`: every rank's `recv` gets the root's `send` (`count` elements of
    /// `dtype`; any byte count). `send` is read on the root only (other ranks may pass 0); in
    /// place when `send == recv` on the root. As
    /// [`reduce_scatter_raw`](Self::reduce_scatter_raw) otherwise; `root >= nranks` is an
    /// error.
    ///
    /// # Safety
    /// As for [`reduce_scatter_raw`](Self::reduce_scatter_raw).
    pub unsafe fn broadcast_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let call = "broadcast";
        let _order = self.more_gpu_call(call, stream)?;
        self.check_root(call, root)?;
        let es = dtype.size();
        let bytes = checked_bytes(call, count, es)?;
        if count == 0 {
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, call, desc::BROADCAST, dtype, None, Some(root));
        }
        gpu::check_range("broadcast: recv", recv, bytes, es)?;
        if self.rank() == root {
            gpu::check_range("broadcast: send", send, bytes, es)?;
            check_overlap(call, send, bytes, recv, bytes, 0)?;
        }
        let p = Plan {
            kind: Kind::Broadcast,
            dtype,
            op: None,
            count: bytes as u64,
            pair_bytes: bytes,
            total_bytes: bytes,
            root,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.more_gpu(p, send, recv, stream) }
    }

    /// All-to-all: `send` and `recv` hold `nranks` blocks of `count` elements; block `p` of
    /// this rank's `send` lands in block `rank` of rank `p`'s `recv`. In place when `send ==
    /// recv`. As [`reduce_scatter_raw`](Self::reduce_scatter_raw) otherwise.
    ///
    /// # Safety
    /// As for [`reduce_scatter_raw`](Self::reduce_scatter_raw).
    pub unsafe fn all_to_all_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let call = "all_to_all";
        let _order = self.more_gpu_call(call, stream)?;
        let es = dtype.size();
        let bytes = checked_bytes(call, count, es)?;
        let total = checked_bytes(call, bytes, self.nranks())?;
        if count == 0 {
            let ex = Exec::Gpu(stream);
            return self.empty_call(ex, call, desc::ALL_TO_ALL, dtype, None, None);
        }
        gpu::check_range("all_to_all: send", send, total, es)?;
        gpu::check_range("all_to_all: recv", recv, total, es)?;
        check_overlap(call, send, total, recv, total, 0)?;
        let p = Plan {
            kind: Kind::AllToAll,
            dtype,
            op: None,
            count: bytes as u64,
            pair_bytes: bytes,
            total_bytes: total,
            root: 0,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.more_gpu(p, send, recv, stream) }
    }

    /// Reduce-scatter of cudarc slices (`send.len() == nranks * recv.len()`), on `stream`
    /// (graph capture as in [`all_reduce`](Self::all_reduce)).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let n = self.nranks();
        if send.len() != n * recv.len() {
            return Err(invalid(format!(
                "reduce_scatter: send has {} elements; {n} ranks x recv's {} expected",
                send.len(),
                recv.len()
            )));
        }
        let count = recv.len();
        gpu::check_capture("reduce_scatter", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: the slices are borrowed across the launch and cudarc's guards order later
        // uses of them after this stream's work.
        unsafe { self.reduce_scatter_raw(s, r, count, T::DTYPE, op, stream) }
    }

    /// In-place reduce-scatter: `buf` holds `nranks` blocks; this rank's block (at element
    /// `rank * buf.len() / nranks`) gets the sum. The length must be a multiple of `nranks`.
    pub fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::DevicePtrMut;
        let count = self.blocks_of("reduce_scatter_in_place", buf.len())?;
        gpu::check_capture("reduce_scatter_in_place", stream)?;
        let off = (self.rank() * count * std::mem::size_of::<T>()) as u64;
        let (p, _g) = buf.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.reduce_scatter_raw(p, p + off, count, T::DTYPE, op, stream) }
    }

    /// Reduce of cudarc slices to `root` (equal lengths; `recv` is written on the root only).
    pub fn reduce<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        same_len("reduce", send.len(), recv.len())?;
        gpu::check_capture("reduce", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.reduce_raw(s, r, send.len(), T::DTYPE, op, root, stream) }
    }

    /// In-place reduce to `root` (the root's `buf` gets the sum; others' is not written).
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::DevicePtrMut;
        gpu::check_capture("reduce_in_place", stream)?;
        let count = buf.len();
        let (p, _g) = buf.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.reduce_raw(p, p, count, T::DTYPE, op, root, stream) }
    }

    /// Broadcast of cudarc slices from `root` (equal lengths; `send` is read on the root
    /// only).
    pub fn broadcast<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        same_len("broadcast", send.len(), recv.len())?;
        gpu::check_capture("broadcast", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.broadcast_raw(s, r, send.len(), T::DTYPE, root, stream) }
    }

    /// In-place broadcast from `root`: every rank's `buf` gets the root's.
    pub fn broadcast_in_place<T: Element>(
        &self,
        buf: &mut CudaSlice<T>,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::DevicePtrMut;
        gpu::check_capture("broadcast_in_place", stream)?;
        let count = buf.len();
        let (p, _g) = buf.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.broadcast_raw(p, p, count, T::DTYPE, root, stream) }
    }

    /// All-to-all of cudarc slices (equal lengths, a multiple of `nranks`).
    pub fn all_to_all<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        same_len("all_to_all", send.len(), recv.len())?;
        let count = self.blocks_of("all_to_all", send.len())?;
        gpu::check_capture("all_to_all", stream)?;
        let (s, _gs) = send.device_ptr(stream);
        let (r, _gr) = recv.device_ptr_mut(stream);
        // SAFETY: as in reduce_scatter.
        unsafe { self.all_to_all_raw(s, r, count, T::DTYPE, stream) }
    }

    /// `len / nranks`, or an error unless `len` is a multiple of `nranks`.
    fn blocks_of(&self, call: &str, len: usize) -> Result<usize, CommError> {
        let n = self.nranks();
        if !len.is_multiple_of(n) {
            return Err(invalid(format!(
                "{call}: {len} elements are not {n} equal blocks (one per rank)"
            )));
        }
        Ok(len / n)
    }

    /// Host backend: reduce-scatter of host slices (`send.len() == nranks * recv.len()`;
    /// blocking, CPU threads run the kernel).
    pub fn reduce_scatter_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = "reduce_scatter_host";
        let n = self.nranks();
        if send.len() != n * recv.len() {
            return Err(invalid(format!(
                "{call}: send has {} elements; {n} ranks x recv's {} expected",
                send.len(),
                recv.len()
            )));
        }
        let plan = self.plan_rs(recv.len(), T::DTYPE, op);
        // SAFETY: both slices are valid for their length and borrowed for the call.
        unsafe { self.more_host(call, plan, send.as_ptr() as u64, recv.as_mut_ptr() as u64) }
    }

    /// Host backend: in-place reduce-scatter (see
    /// [`reduce_scatter_in_place`](Self::reduce_scatter_in_place)).
    pub fn reduce_scatter_host_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = "reduce_scatter_host_in_place";
        let count = self.blocks_of(call, buf.len())?;
        let plan = self.plan_rs(count, T::DTYPE, op);
        let p = buf.as_mut_ptr();
        // SAFETY: the slice is valid for its length and borrowed for the call; this rank's
        // block lies in it.
        unsafe {
            let r = p.add(self.rank() * count);
            self.more_host(call, plan, p as u64, r as u64)
        }
    }

    /// Host backend: reduce-scatter of raw host ranges (`send`: `nranks * count` elements).
    ///
    /// # Safety
    /// Both ranges valid host memory for those elements.
    pub(super) unsafe fn host_reduce_scatter_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = "reduce_scatter_host";
        let plan = self.plan_rs(count, dtype, op);
        // SAFETY: caller contract.
        unsafe { self.more_host(call, plan, send, recv) }
    }

    /// Host backend: reduce to `root` of raw host ranges (`count` elements each).
    ///
    /// # Safety
    /// Both ranges valid host memory for those elements (`recv` on the root).
    pub(super) unsafe fn host_reduce_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError> {
        let call = "reduce_host";
        self.check_root(call, root)?;
        let plan = self.plan_rooted(count, dtype, Some(op), root);
        // SAFETY: caller contract.
        unsafe { self.more_host(call, plan, send, recv) }
    }

    fn plan_rs(&self, count: usize, dtype: DataType, op: ReduceOp) -> Plan {
        let bytes = count * dtype.size();
        Plan {
            kind: Kind::ReduceScatter,
            dtype,
            op: Some(op),
            count: count as u64,
            pair_bytes: bytes,
            total_bytes: bytes * self.nranks(),
            root: 0,
        }
    }

    /// A reduce (with `op`) or broadcast (`op` None) plan.
    fn plan_rooted(
        &self,
        count: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
        root: usize,
    ) -> Plan {
        let bytes = count * dtype.size();
        Plan {
            kind: if op.is_some() {
                Kind::Reduce
            } else {
                Kind::Broadcast
            },
            dtype,
            count: match op {
                Some(_) => count as u64,
                None => bytes as u64,
            },
            op,
            pair_bytes: bytes,
            total_bytes: bytes,
            root,
        }
    }

    /// Host backend: reduce to `root` (equal lengths; `recv` is written on the root only).
    pub fn reduce_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError> {
        let call = "reduce_host";
        same_len(call, send.len(), recv.len())?;
        self.check_root(call, root)?;
        let plan = self.plan_rooted(send.len(), T::DTYPE, Some(op), root);
        // SAFETY: both slices are valid for their length and borrowed for the call.
        unsafe { self.more_host(call, plan, send.as_ptr() as u64, recv.as_mut_ptr() as u64) }
    }

    /// Host backend: in-place reduce to `root`.
    pub fn reduce_host_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError> {
        let call = "reduce_host_in_place";
        self.check_root(call, root)?;
        let plan = self.plan_rooted(buf.len(), T::DTYPE, Some(op), root);
        let p = buf.as_mut_ptr() as u64;
        // SAFETY: the slice is valid for its length and borrowed for the call.
        unsafe { self.more_host(call, plan, p, p) }
    }

    /// Host backend: broadcast from `root` (equal lengths; `send` is read on the root only).
    pub fn broadcast_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        root: usize,
    ) -> Result<(), CommError> {
        let call = "broadcast_host";
        same_len(call, send.len(), recv.len())?;
        self.check_root(call, root)?;
        let plan = self.plan_rooted(send.len(), T::DTYPE, None, root);
        // SAFETY: both slices are valid for their length and borrowed for the call.
        unsafe { self.more_host(call, plan, send.as_ptr() as u64, recv.as_mut_ptr() as u64) }
    }

    /// Host backend: in-place broadcast from `root`.
    pub fn broadcast_host_in_place<T: Element>(
        &self,
        buf: &mut [T],
        root: usize,
    ) -> Result<(), CommError> {
        let call = "broadcast_host_in_place";
        self.check_root(call, root)?;
        let plan = self.plan_rooted(buf.len(), T::DTYPE, None, root);
        let p = buf.as_mut_ptr() as u64;
        // SAFETY: the slice is valid for its length and borrowed for the call.
        unsafe { self.more_host(call, plan, p, p) }
    }

    /// Host backend: all-to-all (equal lengths, a multiple of `nranks`).
    pub fn all_to_all_host<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        let call = "all_to_all_host";
        same_len(call, send.len(), recv.len())?;
        let count = self.blocks_of(call, send.len())?;
        let bytes = count * T::DTYPE.size();
        let plan = Plan {
            kind: Kind::AllToAll,
            dtype: T::DTYPE,
            op: None,
            count: bytes as u64,
            pair_bytes: bytes,
            total_bytes: bytes * self.nranks(),
            root: 0,
        };
        // SAFETY: both slices are valid for their length and borrowed for the call.
        unsafe { self.more_host(call, plan, send.as_ptr() as u64, recv.as_mut_ptr() as u64) }
    }
}

fn same_len(call: &str, send: usize, recv: usize) -> Result<(), CommError> {
    if send != recv {
        return Err(invalid(format!(
            "{call}: send has {send} elements, recv {recv}"
        )));
    }
    Ok(())
}

/// Bytes of each source rank's slot of the p2p buffer for a config.
fn p2p_slot(config: &CollConfig) -> usize {
    (config.scratch_bytes / 16).clamp(1 << 10, 32 << 20) / 1024 * 1024
}

/// Bytes of each source rank's packet scratch of the p2p buffer for a config: two halves
/// for LL transfers of `p2p_packet_max_bytes` (16-byte packets of 8 data bytes), then the
/// done words (see `send_recv`).
fn p2p_packets(config: &CollConfig) -> usize {
    4 * config.p2p_packet_max_bytes.div_ceil(8) * 8 + P2P_TAIL_BYTES as usize
}

/// The p2p context (a [`CollContext`] over the p2p buffer) and its memory.
#[derive(Debug)]
pub(super) struct P2p {
    /// On the host (host backend kernels read it here).
    ctx: Box<CollContext>,
    /// In device memory (GPU backend).
    dev: Option<DeviceBuffer>,
    /// GPU backend: where the sends of a group that a receive of the same group overlaps
    /// (an in-place exchange) are copied first; grown on demand (not under capture).
    stage: Mutex<Option<Stage>>,
    _buf: Buffer,
    _local: Buffer,
}

/// A staging buffer for sends and the event recorded after the last launch that read it.
#[derive(Debug)]
struct Stage {
    buf: DeviceBuffer,
    bytes: usize,
    done: CudaEvent,
}

/// Bytes a staged send takes in the staging buffer (16-byte aligned pieces).
fn staged_len(bytes: u64) -> u64 {
    bytes.div_ceil(16) * 16
}

/// The ops of a launch as a kernel parameter (by value).
#[repr(transparent)]
struct OpsArg(P2pOps);

// SAFETY: plain `#[repr(C)]` integers, the kernel's parameter type.
unsafe impl DeviceRepr for OpsArg {}

impl P2p {
    /// Registers the p2p buffer (one slot per source rank, then the semaphores) and connects
    /// it to every peer (collective; after the communicator's first connection setup and
    /// before its proxy starts). `base`: the collectives' context, whose fields the p2p
    /// context shares except the scratch, semaphores and expected words.
    ///
    /// Across hosts the context spans this rank's host: `group` holds its ranks (ascending,
    /// `group[local]` this rank), and the kernel's peers are local indexes.
    pub(super) fn new(
        comm: &mut Communicator,
        config: &CollConfig,
        base: &CollContext,
        group: &[usize],
        local: usize,
    ) -> Result<P2p, CommError> {
        let (n, rank) = (group.len(), local);
        let slot = p2p_slot(config);
        let packets = p2p_packets(config);
        // n slots, n packet scratches, the semaphores.
        let packets_at = n * slot;
        let sems_at = packets_at + n * packets;
        let buf = comm.alloc_buffer(sems_at + SEMAPHORE_WORDS * 8)?;
        // Expected words, then the p2p context's own state (call counter, local fault words,
        // the LL sequence numbers).
        let local = comm.alloc_buffer((EXPECTED_WORDS + STATE_WORDS + P2P_STATE_WORDS) * 8)?;
        let transport = comm.backend().transport();
        let mut channels = Vec::new();
        for p in (0..n).filter(|&p| p != rank) {
            channels.push((
                p,
                comm.connect_memory(group[p], &buf, TAG_P2P, transport, 0)?,
            ));
        }
        comm.connection_setup()?;
        let all = comm.memory_channels();
        let addr = |b: &Buffer| {
            b.device_ptr()
                .unwrap_or_else(|| b.host_ptr().unwrap() as u64)
        };
        let mine = addr(&buf);
        let mut ctx = CollContext {
            scratch_len: slot as u64,
            packets_len: packets as u64,
            packets_in: [std::ptr::null_mut(); MAX_RANKS],
            packets_out: [std::ptr::null_mut(); MAX_RANKS],
            scratch: mine as *mut u8,
            peer_scratch: [std::ptr::null_mut(); MAX_RANKS],
            sems: (mine + sems_at as u64) as *mut u64,
            peer_sems: [std::ptr::null_mut(); MAX_RANKS],
            expected: addr(&local) as *mut u64,
            state: (addr(&local) + EXPECTED_WORDS as u64 * 8) as *mut u64,
            // Sends and receives count their own operations, not the collectives' calls;
            // their waits give up on a peer that left (see `guard::PEERS`).
            guards: (base.guards & !guard::LEFT) | guard::PEERS,
            ..*base
        };
        ctx.peer_scratch[rank] = ctx.scratch;
        ctx.peer_sems[rank] = ctx.sems;
        for q in 0..n {
            // This rank's packet scratch that rank q writes into.
            ctx.packets_in[q] = (mine + (packets_at + q * packets) as u64) as *mut u8;
        }
        for (p, c) in channels {
            let remote = all[c].remote_ptr();
            // SAFETY: the peer's buffer is mapped whole: its packet scratch for this rank
            // follows its slots.
            ctx.packets_out[p] = unsafe { remote.add(packets_at + rank * packets) };
            ctx.peer_scratch[p] = remote;
            // SAFETY: the peer's buffer is mapped whole: its semaphores follow its slots.
            ctx.peer_sems[p] = unsafe { remote.add(sems_at) } as *mut u64;
        }
        let dev = match comm.backend() {
            Backend::Gpu(g) => {
                let mem = DeviceBuffer::zeroed(g, std::mem::size_of::<CollContext>())?;
                mem.copy_from_host(0, std::slice::from_ref(&ctx))?;
                Some(mem)
            }
            Backend::Host => None,
        };
        Ok(P2p {
            ctx: Box::new(ctx),
            dev,
            stage: Mutex::new(None),
            _buf: buf,
            _local: local,
        })
    }
}

impl P2p {
    /// Points the send/receive context at the collectives' context `coll` (the address the
    /// kernels read: in device memory on a GPU), see `CollContext::coll`.
    pub(super) fn link_collectives(&mut self, coll: *const CollContext) -> Result<(), CommError> {
        self.ctx.coll = coll;
        if let Some(dev) = &self.dev {
            dev.copy_from_host(0, std::slice::from_ref(&*self.ctx))?;
        }
        Ok(())
    }
}

/// One operation of a [`Collectives::group`]: `count` elements of `dtype` at device (or, for
/// [`Collectives::group_host`], host) address `buf`, sent to or received from `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pOp {
    /// Send `buf` to `peer` (matched by its next receive from this rank).
    Send {
        /// The data.
        buf: u64,
        /// Elements.
        count: usize,
        /// Element type (sets the size and the alignment checked).
        dtype: DataType,
        /// The receiving rank.
        peer: usize,
    },
    /// Receive into `buf` from `peer` (matched by its next send to this rank).
    Recv {
        /// Where the data lands.
        buf: u64,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// The sending rank.
        peer: usize,
    },
}

impl Collectives {
    /// Checks `ops` and builds the kernel's operations (empty ones left out); `gpu`: check
    /// the device ranges too. Also returns the mask of the (kernel) operations that are sends
    /// whose range a receive of the group overlaps: they must be staged (copied elsewhere
    /// first), or the receive could overwrite data not yet sent.
    fn p2p_ops(
        &self,
        call: &str,
        ops: &[P2pOp],
        gpu_ranges: bool,
    ) -> Result<(P2pOps, u32), CommError> {
        if ops.len() > MAX_P2P_OPS {
            return Err(invalid(format!(
                "{call}: {} operations; at most {MAX_P2P_OPS} in one group",
                ops.len()
            )));
        }
        let mut out = P2pOps::default();
        for op in ops {
            let (send, buf, count, dtype, peer) = match *op {
                P2pOp::Send {
                    buf,
                    count,
                    dtype,
                    peer,
                } => (true, buf, count, dtype, peer),
                P2pOp::Recv {
                    buf,
                    count,
                    dtype,
                    peer,
                } => (false, buf, count, dtype, peer),
            };
            let what = if send { "send to" } else { "receive from" };
            if peer >= self.nranks() {
                return Err(invalid(format!(
                    "{call}: {what} rank {peer}, which is not a rank (there are {} ranks)",
                    self.nranks()
                )));
            }
            if peer == self.rank() {
                return Err(invalid(format!(
                    "{call}: {what} the own rank {peer} is not supported; copy locally instead"
                )));
            }
            if !self.send_recv_reaches(peer) {
                let off = self.p2p_off.as_deref().unwrap_or("no channel to it");
                return Err(invalid(format!(
                    "{call}: {what} rank {peer}, on another host: {off}"
                )));
            }
            let bytes = checked_bytes(call, count, dtype.size())?;
            // A transfer of no bytes is still one (matched in order with the peer's, as
            // NCCL's since 2.12.10): it carries its size, so a receive of some bytes fails
            // against it, and a receive of none returns once the send was posted.
            if gpu_ranges && bytes > 0 {
                let name = format!("{call}: {what} rank {peer}");
                gpu::check_range(&name, buf, bytes, dtype.size())?;
            }
            out.ops[out.count as usize] = DevP2pOp {
                buf,
                bytes: bytes as u64,
                peer: peer as u32,
                send: send as u32,
                first_block: 0,
                blocks: 0,
            };
            out.count += 1;
        }
        // A receive may not overlap another receive's range; a send whose range a receive
        // overlaps (an in-place exchange, as nccl-tests' sendrecv in place) is staged.
        let live = &out.ops[..out.count as usize];
        let mut stage = 0u32;
        for (i, a) in live.iter().enumerate() {
            for (j, b) in live.iter().enumerate() {
                // A transfer of no bytes touches no memory: it overlaps nothing, wherever it
                // points (a zero count's address inside another peer's range, as
                // all-to-all-v code passes it, is neither refused nor a cause to stage).
                let overlap = a.bytes > 0
                    && b.bytes > 0
                    && a.buf < b.buf + b.bytes
                    && b.buf < a.buf + a.bytes;
                if i != j && a.send == 0 && overlap {
                    if b.send != 0 {
                        stage |= 1 << j;
                    } else {
                        return Err(invalid(format!(
                            "{call}: the receive from rank {} overlaps the receive from rank {}",
                            a.peer, b.peer
                        )));
                    }
                }
            }
        }
        Ok((out, stage))
    }

    /// The p2p state of this rank's host (every Collectives has it).
    fn p2p_one_host(&self) -> &P2p {
        self.p2p.as_ref().expect("built by Collectives::new")
    }

    /// Splits checked operations (peers as job ranks) into those with ranks of this host
    /// (peers as local indexes, for the p2p kernel) and those with ranks on other hosts
    /// (for [`xp2p`](super::xp2p)); each keeps the call order.
    fn p2p_split(&self, ops: &P2pOps) -> (P2pOps, XOps) {
        let mut local = P2pOps { count: 0, ..*ops };
        let mut remote = XOps::default();
        for op in &ops.ops[..ops.count as usize] {
            let g = op.peer as usize;
            let xop = self
                .xp2p
                .as_ref()
                .and_then(|x| x.op(op.buf, op.bytes, g, op.send != 0));
            if let Some(x) = xop {
                remote.ops[remote.count as usize] = x;
                remote.count += 1;
            } else {
                let peer = self.cross().map_or(g, |c| {
                    c.topo
                        .group()
                        .iter()
                        .position(|&r| r == g)
                        .expect("checked")
                });
                local.ops[local.count as usize] = DevP2pOp {
                    peer: peer as u32,
                    ..*op
                };
                local.count += 1;
            }
        }
        (local, remote)
    }

    /// Most blocks of one transfer on a GPU ([`p2p_transfer_blocks`] of this communicator).
    fn p2p_max_blocks(&self) -> u32 {
        p2p_transfer_blocks(
            self.ctx.nranks as usize,
            self.block_cap,
            self.config.max_blocks,
        )
    }

    /// Sets how `ops` are cut (the config's, equal on every rank) and plans the launch with
    /// at most `max_blocks` blocks per transfer; returns the grid's blocks.
    fn p2p_plan(&self, ops: &mut P2pOps, max_blocks: u32) -> u32 {
        let c = &self.config;
        ops.depth = c.p2p_depth;
        ops.ll_max = c.p2p_packet_max_bytes as u64;
        ops.ll_blocks = c.p2p_packet_blocks.min(max_blocks);
        // The rows of an LL transfer: fixed by the config (equal on every rank), so a launch
        // may run its LL transfers with smaller blocks (see `p2p_threads`).
        ops.ll_row = c.threads;
        ops.plan(
            p2p_piece(self.p2p_one_host().ctx.scratch_len, c.p2p_depth),
            max_blocks,
        )
    }

    /// Posts the sends and receives of `ops` as one launch on `stream` (NCCL's grouped
    /// `ncclSend`/`ncclRecv`): all of them progress together, so a rank may send to and
    /// receive from the same peer in one group. Operations with the same peer and direction
    /// run in order; at most 16 per group. Each send must be matched by the peer's receive of
    /// the same size (in call order per pair and direction), posted concurrently: a send
    /// completes only once the peer has copied its data out. A send or receive of no
    /// elements is a transfer too (as NCCL's): it pairs with the peer's, and a receive of
    /// none completes once the peer's send of none was posted. GPU backend; checks every range
    /// as [`all_reduce_raw`](Self::all_reduce_raw); refuses the own rank and ranks out of
    /// range, and a receive whose range overlaps another operation's (no in-place
    /// exchange: a chunk received could overwrite data not yet sent). Allocates nothing:
    /// capturable into CUDA graphs.
    ///
    /// A send and a receive of different sizes (the same number of operations per pair and
    /// direction, in the same order, but other byte counts) fail that transfer alone, without
    /// a timeout: [`async_error`](Self::async_error) / [`synchronize`](Self::synchronize)
    /// return [`CommError::CallMismatch`] ("rank 1 sent 4000 bytes to rank 0, which expected
    /// 6000") on the receiver and on a pipelined sender; an LL sender (at most
    /// `p2p_packet_max_bytes`: eager, done before the receiver looks) learns of it from a note
    /// the receiver leaves, at the end of that send if it is there, else at its next send to
    /// that peer, whose call then reports it (once). The receive buffer is undefined; the
    /// group's other operations and the pair's later transfers work.
    ///
    /// # Safety
    /// Every buffer must stay valid until the operation completes on `stream`, receive
    /// buffers not be accessed by others meanwhile, and send buffers not written.
    pub unsafe fn group(&self, ops: &[P2pOp], stream: &CudaStream) -> Result<(), CommError> {
        let call = "group";
        let _order = self.more_gpu_call(call, stream)?;
        let (ops, stage) = self.p2p_ops(call, ops, true)?;
        if ops.count == 0 {
            return Ok(());
        }
        if stage != 0 {
            return self.noted(self.group_staged(call, ops, stage, stream));
        }
        self.p2p_launch(call, ops, stream)
    }

    /// [`group`](Self::group) with the sends of `mask` copied into the staging buffer first
    /// (stream-ordered, after the last launch that read it), their addresses replaced.
    fn group_staged(
        &self,
        call: &str,
        mut ops: P2pOps,
        mask: u32,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let total: u64 = (0..ops.count as usize)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| staged_len(ops.ops[i].bytes))
            .sum();
        let capturing = gpu::is_capturing(stream);
        let mut stage = self
            .p2p_one_host()
            .stage
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if stage.as_ref().is_none_or(|s| (s.bytes as u64) < total) {
            if capturing {
                return Err(invalid(format!(
                    "{call}: an in-place exchange of {total} bytes under CUDA graph capture \
                     needs a staging buffer that is not there yet; run the same group once \
                     outside capture first"
                )));
            }
            let gpu = self.gpu().expect("GPU backend");
            if let Some(old) = stage.take() {
                // The last launch that read it must be done before it is freed.
                old.done
                    .synchronize()
                    .map_err(|e| gpu::classify(call, "cuEventSynchronize", e))?;
            }
            let bytes = (total as usize).next_power_of_two();
            let done = gpu
                .context()
                .new_event(None)
                .map_err(|e| gpu::classify(call, "cuEventCreate", e))?;
            *stage = Some(Stage {
                buf: DeviceBuffer::alloc(gpu, bytes)?,
                bytes,
                done,
            });
        }
        let s = stage.as_ref().expect("set above");
        if !capturing {
            // A launch on another stream may still read it. (Under capture the graph's
            // replays are ordered on the stream they are launched on.)
            stream
                .wait(&s.done)
                .map_err(|e| gpu::classify(call, "cuStreamWaitEvent", e))?;
        }
        let mut at = s.buf.device_ptr();
        for i in (0..ops.count as usize).filter(|i| mask & (1 << i) != 0) {
            let op = &mut ops.ops[i];
            // SAFETY: the send's range was checked (caller contract keeps it valid); the
            // staging piece holds its bytes and no launch reads it now (the wait above).
            unsafe { crate::cuda::memcpy_async(at, op.buf, op.bytes as usize, stream) }?;
            op.buf = at;
            at += staged_len(op.bytes);
        }
        self.p2p_launch(call, ops, stream)?;
        if !capturing {
            s.done
                .record(stream)
                .map_err(|e| gpu::classify(call, "cuEventRecord", e))?;
        }
        Ok(())
    }

    /// Queues `ops` on `stream`: the p2p kernel for the transfers inside this host, then
    /// the `xp2p` kernel for those with other hosts.
    fn p2p_launch(&self, call: &str, ops: P2pOps, stream: &CudaStream) -> Result<(), CommError> {
        let (local, remote) = self.p2p_split(&ops);
        if local.count > 0 {
            self.p2p_launch_local(call, local, stream)?;
        }
        if remote.count > 0 {
            let x = self
                .xp2p
                .as_ref()
                .expect("remote operations need it (p2p_ops)");
            // SAFETY: the ranges were checked (p2p_ops) and the caller keeps them valid.
            self.noted(unsafe { x.launch(call, remote, self.config.threads, stream) })?;
        }
        Ok(())
    }

    /// Launches the p2p kernel for `ops` (peers as local indexes) on `stream`.
    fn p2p_launch_local(
        &self,
        call: &str,
        mut ops: P2pOps,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let blocks = self.p2p_plan(&mut ops, self.p2p_max_blocks());
        let (threads, ll_only) = p2p_threads(&ops, self.config.threads);
        let kernels = self.more.as_ref().expect("GPU backend");
        let ctx = self
            .p2p_one_host()
            .dev
            .as_ref()
            .expect("GPU backend")
            .device_ptr();
        let arg = OpsArg(ops);
        let mut params = [
            &ctx as *const u64 as *mut std::ffi::c_void,
            &arg as *const OpsArg as *mut std::ffi::c_void,
        ];
        // Dependent only when every transfer goes as LL packets (the latency case, checked
        // on GPUs; see `mod.rs`, "Launches").
        if ll_only
            && gpu::dependent_grid(blocks, threads)
            && let Some(r) = kernels.pdl.launch(|| {
                // SAFETY: the p2p kernel calls dependent_launch_entry first; the parameters
                // (*const CollContext, P2pOps by value) point at live locals; the rest as below.
                unsafe {
                    gpu::launch_dependent_params(
                        stream,
                        &kernels.p2p,
                        &mut params,
                        (blocks, threads),
                    )
                }
            })
        {
            return self.noted(r);
        }
        let mut l = stream.launch_builder(&kernels.p2p);
        l.arg(&ctx).arg(&arg);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the p2p context in device memory holds this communicator's registered
        // memory; the ranges were checked and the caller keeps them valid; the arguments
        // match the kernel's (*const CollContext, P2pOps).
        self.noted(
            unsafe { l.launch(cfg) }
                .map(|_| ())
                .map_err(|e| gpu::classify(call, "cuLaunchKernel", e)),
        )
    }

    /// Sends `count` elements at device address `buf` to `peer`: a group of one (see
    /// [`group`](Self::group)).
    ///
    /// # Safety
    /// As for [`group`](Self::group).
    pub unsafe fn send_raw(
        &self,
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let op = P2pOp::Send {
            buf,
            count,
            dtype,
            peer,
        };
        // SAFETY: forwarded.
        unsafe { self.group(&[op], stream) }
    }

    /// Receives `count` elements from `peer` into device address `buf`: a group of one (see
    /// [`group`](Self::group)).
    ///
    /// # Safety
    /// As for [`group`](Self::group).
    pub unsafe fn recv_raw(
        &self,
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let op = P2pOp::Recv {
            buf,
            count,
            dtype,
            peer,
        };
        // SAFETY: forwarded.
        unsafe { self.group(&[op], stream) }
    }

    /// Sends a cudarc slice to `peer` (graph capture as in [`all_reduce`](Self::all_reduce)).
    pub fn send<T: Element>(
        &self,
        buf: &CudaSlice<T>,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::DevicePtr;
        gpu::check_capture("send", stream)?;
        let (p, _g) = buf.device_ptr(stream);
        // SAFETY: the slice is borrowed across the launch and cudarc's guard orders later
        // uses of it after this stream's work.
        unsafe { self.send_raw(p, buf.len(), T::DTYPE, peer, stream) }
    }

    /// Receives into a cudarc slice from `peer`.
    pub fn recv<T: Element>(
        &self,
        buf: &mut CudaSlice<T>,
        peer: usize,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        use cudarc::driver::DevicePtrMut;
        gpu::check_capture("recv", stream)?;
        let count = buf.len();
        let (p, _g) = buf.device_ptr_mut(stream);
        // SAFETY: as in send.
        unsafe { self.recv_raw(p, count, T::DTYPE, peer, stream) }
    }

    /// Host backend: runs a group of sends and receives on host addresses (blocking; see
    /// [`group`](Self::group)).
    ///
    /// # Safety
    /// Every buffer valid host memory for its operation during the call.
    pub unsafe fn group_host(&self, ops: &[P2pOp]) -> Result<(), CommError> {
        let call = "group_host";
        self.host_only(call)?;
        let (mut ops, stage) = self.p2p_ops(call, ops, false)?;
        if ops.count == 0 {
            return Ok(());
        }
        self.check_fault(call, true)?;
        // Sends a receive of the group overlaps: copied first (kept alive for the call).
        let mut staged: Vec<Vec<u8>> = Vec::new();
        for op in ops.ops[..ops.count as usize]
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| stage & (1 << i) != 0)
            .map(|(_, op)| op)
        {
            // SAFETY: the caller keeps the send's range valid host memory for the call.
            let data =
                unsafe { std::slice::from_raw_parts(op.buf as *const u8, op.bytes as usize) };
            staged.push(data.to_vec());
            op.buf = staged.last().expect("pushed").as_ptr() as u64;
        }
        let (mut local, remote) = self.p2p_split(&ops);
        let mut run_local = || -> Result<(), CommError> {
            if local.count == 0 {
                return Ok(());
            }
            // Two blocks per transfer at most: CPU threads.
            let blocks = self.p2p_plan(&mut local, 2);
            let ctx = &*self.p2p_one_host().ctx as *const CollContext as u64;
            launch(Dim3::x(blocks), Dim3::x(2), || {
                // SAFETY: the p2p context (boxed, alive as long as self) holds this
                // communicator's shared memory; the buffers are valid (caller contract).
                unsafe { mscclpp_device::kernels::send_recv::p2p(ctx as *const CollContext, local) }
            })
            .map_err(|e| {
                CommError::State(format!(
                    "{call}: the transfer kernel failed on this rank ({e}): a bug or a broken \
                     contract, not a peer's doing"
                ))
            })
        };
        if remote.count == 0 {
            run_local()?;
        } else {
            let x = self
                .xp2p
                .as_ref()
                .expect("remote operations need it (p2p_ops)");
            // The group's transfers with other hosts progress beside those inside the host,
            // as a group's transfers do (one after the other, a peer whose local transfer
            // waits for this rank's remote one would wait until the device timeout).
            std::thread::scope(|scope| {
                let remote_part = scope.spawn(|| {
                    // SAFETY: the buffers are valid host memory for the call (caller
                    // contract; staged sends kept alive above).
                    unsafe { x.run_host(&remote) }
                });
                let r = run_local();
                if remote_part.join().is_err() {
                    return Err(CommError::State(format!(
                        "{call}: the transfers with other hosts panicked on this rank: a bug, \
                         not a peer's doing"
                    )));
                }
                r
            })?;
        }
        // A transfer of another size than the peer's, or a wait that gave up (a peer did not
        // post the matching operation within the device timeout, or an abort), recorded why.
        self.check_fault(call, true)
    }

    /// Host backend: sends a host slice to `peer` (blocks until the peer has received it).
    pub fn send_host<T: Element>(&self, buf: &[T], peer: usize) -> Result<(), CommError> {
        let op = P2pOp::Send {
            buf: buf.as_ptr() as u64,
            count: buf.len(),
            dtype: T::DTYPE,
            peer,
        };
        // SAFETY: the slice is valid for its length and borrowed for the call.
        unsafe { self.group_host(&[op]) }
    }

    /// Host backend: receives into a host slice from `peer`.
    pub fn recv_host<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<(), CommError> {
        let op = P2pOp::Recv {
            buf: buf.as_mut_ptr() as u64,
            count: buf.len(),
            dtype: T::DTYPE,
            peer,
        };
        // SAFETY: as in send_host.
        unsafe { self.group_host(&[op]) }
    }
}

const _: () = assert!(2 * P2P_MAX_BLOCKS as usize <= MAX_BLOCKS);

/// Threads per block of a p2p launch of `ops` (planned) with blocks of `most` threads, and
/// whether every transfer of it goes as LL packets: such a group takes half a thread per
/// unit of its largest block share, in warps, at least 128 (on 2x H200, an 8 B send/recv
/// under a CUDA graph took 7.1 us with 512 threads per block and 5.7 us with 128, and 32 KB
/// 7.5 and 6.6 us: the blocks of the p2p kernel take a whole SM's registers at 512); any
/// other launch `most`. Only this rank's launch depends on it ([`P2pOps::ll_row`] fixes
/// what each block moves).
fn p2p_threads(ops: &P2pOps, most: u32) -> (u32, bool) {
    let n = (ops.count as usize).min(ops.ops.len());
    let mut units_per_block = 0u64;
    for op in &ops.ops[..n] {
        if op.bytes > ops.ll_max {
            return (most, false);
        }
        let per = op.bytes.div_ceil(8).div_ceil(ops.ll_blocks.max(1) as u64);
        units_per_block = units_per_block.max(per);
    }
    let want = units_per_block.div_ceil(2).next_multiple_of(32).max(128);
    (want.min(most as u64) as u32, true)
}

/// Most blocks of one transfer of a send/receive group on a GPU, for `nranks` ranks: a group
/// has up to `2 * (nranks - 1)` lanes side by side, and every block of it must be resident at
/// once (a send's blocks wait for the peer's receive, which may wait for other lanes), so
/// the lanes share 128 blocks (the kernel takes 128 registers per thread, one block of 512
/// threads per SM, and an H100/H200 has 132), or `block_cap` when ranks share the GPU (every
/// rank's kernel must fit beside the others'; see `shared_gpu_block_cap`); then at most
/// [`P2P_MAX_BLOCKS`] and `max_blocks`, and at least one. Equal on every rank (it depends
/// only on the rank count, the cap every rank computes alike and the config), as both sides
/// of a transfer must cut it alike.
pub(super) fn p2p_transfer_blocks(nranks: usize, block_cap: u32, max_blocks: u32) -> u32 {
    let lanes = 2 * (nranks.max(2) as u32 - 1);
    (block_cap.min(128) / lanes).clamp(1, P2P_MAX_BLOCKS.min(max_blocks).max(1))
}

#[cfg(test)]
#[path = "more_tests.rs"]
mod tests;
