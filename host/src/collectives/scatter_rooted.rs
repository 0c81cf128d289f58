//! What reduce-scatter, reduce, broadcast and all-to-all share: their kernel table, the plan
//! of a checked call and its launch (their calls are in `reduce_scatter.rs`, `reduce.rs`,
//! `broadcast.rs` and `all_to_all.rs`).
//!
//! Each has two paths, chosen by the bytes one rank sends to one peer: up to
//! [`CollConfig::packet_max_bytes`](super::CollConfig::packet_max_bytes) (and what a packet
//! half holds), LL packets with no barrier, sharing one-shot all-reduce's call counter and
//! packet halves; above, puts into the peers' scratch in rounds with per-block semaphore
//! barriers. Sums are formed in rank order on every rank, as all-reduce's.

use super::cross::Exec;

use super::kernel_table::{reduce_index, size_class};
use super::{Collectives, DataType, ReduceOp, gpu};
use crate::communicator::CommError;
use crate::cuda::{CudaError, CudaFunction, CudaStream};
use mscclpp_device::collectives::pipe::pipe_piece;
use mscclpp_device::collectives::{CollContext, MAX_BLOCKS, desc};
use mscclpp_device::kernels::scatter_rooted as k;
use mscclpp_device::kernels::scatter_rooted::ScatterRootedKernel;

/// The collectives whose paths this file runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
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

/// Every kernel of these collectives: name and host twin (see [`kernel_index`]). The reducing ones
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

/// The kernels of these collectives (and the p2p kernel) in the communicator's loaded module.
#[derive(Debug)]
pub(super) struct Kernels {
    /// In [`TABLE`]'s order.
    functions: Vec<CudaFunction>,
    pub(super) p2p: CudaFunction,
    ctx: u64,
    /// Programmatic dependent launch for the LL and p2p kernels (see `gpu::Kernels::launch`).
    pub(super) pdl: gpu::Pdl,
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

pub(super) fn invalid(m: String) -> CommError {
    CommError::InvalidArgument(m)
}

/// Refuses ranges that overlap other than as `allowed` (recv at that byte offset of send).
pub(super) fn check_overlap(
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
pub(super) struct Plan {
    pub(super) kind: Kind,
    pub(super) dtype: DataType,
    /// The kernel's `count` argument (elements, or bytes for the byte movers).
    pub(super) count: u64,
    /// The reduction (reduce-scatter, reduce).
    pub(super) op: Option<ReduceOp>,
    /// Bytes one rank sends one peer (chooses the path).
    pub(super) pair_bytes: usize,
    /// Bytes the call moves on this rank (sizes the grid of the put path).
    pub(super) total_bytes: usize,
    pub(super) root: usize,
}

impl Collectives {
    /// The path of a plan: LL up to the LL size, else pipelined for a broadcast or reduce
    /// whose algorithm says so ([`rooted_algo`](Self::rooted_algo)), else rounds.
    fn plan_path(&self, p: &Plan) -> Path {
        if self.takes_ll_path(p.pair_bytes) {
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

    /// The descriptor tag of a plan on `path` over `blocks` blocks: the collective, type,
    /// operation, path (algorithm 1 LL, 2 put, 3 pipelined, with its piece size and depth)
    /// and root.
    fn plan_desc_tag(&self, p: &Plan, path: Path, blocks: u32) -> u64 {
        let algo = match path {
            Path::Ll => 1,
            Path::Put => 2,
            Path::Pipe => desc::PIPELINED,
        };
        let tag = desc::rooted_tag(
            p.kind.desc(),
            super::descriptor::dtype_code(p.dtype),
            p.op.map_or(0, super::descriptor::op_desc),
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

    pub(super) fn check_root(&self, call: &str, root: usize) -> Result<(), CommError> {
        if root >= self.nranks() {
            return Err(invalid(format!(
                "{call}: root {root} is not a rank (there are {} ranks)",
                self.nranks()
            )));
        }
        Ok(())
    }

    /// The kernel (index in [`TABLE`]), grid and tag of a plan on the GPU.
    fn plan_gpu_launch(&self, p: &Plan) -> (usize, (u32, u32), u64) {
        let path = self.plan_path(p);
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
            self.plan_desc_tag(p, path, grid.0),
        )
    }

    /// Launches a checked plan on `stream`.
    ///
    /// # Safety
    /// The ranges valid for the plan (checked by the caller) until it completes.
    unsafe fn launch_plan(
        &self,
        p: Plan,
        send: u64,
        recv: u64,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let kernels = &self.on_gpu().scatter_rooted;
        let (index, grid, tag) = self.plan_gpu_launch(&p);
        // The LL kernels start with dependent_launch_entry and go out as dependents (small
        // grids, checked on GPUs; see `mod.rs`, "Launches"); the others do not.
        let dependent = self.plan_path(&p) == Path::Ll;
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
    pub(super) unsafe fn run_plan_host(
        &self,
        call: &str,
        p: Plan,
        send: u64,
        recv: u64,
    ) -> Result<(), CommError> {
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
            return unsafe { self.run_plan_across_hosts(Exec::Host, p, send, recv) };
        }
        // SAFETY: caller contract.
        unsafe { self.run_plan_local_host(call, p, send, recv) }
    }

    /// Runs a plan across hosts (`cross.rs`) on `ex` (never of no bytes: the callers send
    /// such calls to `empty_call`).
    ///
    /// # Safety
    /// The ranges valid memory of `ex`'s kind for the plan (until the stream ran it).
    unsafe fn run_plan_across_hosts(
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
    pub(super) unsafe fn run_plan_gpu(
        &self,
        p: Plan,
        send: u64,
        recv: u64,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        // SAFETY: caller contract.
        unsafe {
            if self.cross().is_some() {
                self.run_plan_across_hosts(Exec::Gpu(stream), p, send, recv)
            } else {
                self.launch_plan(p, send, recv, stream)
            }
        }
    }

    /// Runs a local-group plan on `ex` (CPU threads, or the kernel on the stream).
    ///
    /// # Safety
    /// The ranges valid memory of `ex`'s kind for the plan.
    unsafe fn run_plan_local(
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
                Exec::Host => self.run_plan_local_host(call, p, send, recv),
                Exec::Gpu(_) if p.pair_bytes == 0 => Ok(()),
                Exec::Gpu(stream) => self.launch_plan(p, send, recv, stream),
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
        unsafe { self.run_plan_local(ex, call, plan, buf, buf) }
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
        unsafe { self.run_plan_local(ex, call, plan, send, recv) }
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
        unsafe { self.run_plan_local(ex, call, plan, send, recv) }
    }

    /// Runs a plan on CPU threads over the local group's context.
    ///
    /// # Safety
    /// The ranges valid host memory for the plan.
    unsafe fn run_plan_local_host(
        &self,
        call: &str,
        p: Plan,
        send: u64,
        recv: u64,
    ) -> Result<(), CommError> {
        if p.pair_bytes == 0 {
            return Ok(());
        }
        let path = self.plan_path(&p);
        let f = TABLE[kernel_index(p.kind, path, p.dtype)].1;
        let ctx = &*self.ctx as *const CollContext as u64;
        // One block (`run_host`).
        let (count, tag) = (p.count, self.plan_desc_tag(&p, path, 1));
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
    pub(super) fn plan_gpu_call(
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

    /// `len / nranks`, or an error unless `len` is a multiple of `nranks`.
    pub(super) fn blocks_of(&self, call: &str, len: usize) -> Result<usize, CommError> {
        let n = self.nranks();
        if !len.is_multiple_of(n) {
            return Err(invalid(format!(
                "{call}: {len} elements are not {n} equal blocks (one per rank)"
            )));
        }
        Ok(len / n)
    }

    /// A reduce-scatter plan of `count` elements per rank of the output.
    pub(super) fn plan_rs(&self, count: usize, dtype: DataType, op: ReduceOp) -> Plan {
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
    pub(super) fn plan_rooted(
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
}

#[cfg(test)]
#[path = "scatter_rooted_tests.rs"]
mod tests;
