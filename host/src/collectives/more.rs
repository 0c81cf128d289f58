//! Reduce-scatter, broadcast, all-to-all and reduce (issue #14): the calls on
//! [`Collectives`], in the three forms of all-reduce's (`_raw` on device addresses with a
//! [`DataType`] and a stream; typed on cudarc slices; `_host` on the host backend).
//!
//! Each has two paths, chosen by the bytes one rank sends to one peer: up to
//! [`CollConfig::packet_max_bytes`](super::CollConfig::packet_max_bytes) (and what a packet
//! half holds), LL packets with no barrier, sharing one-shot all-reduce's call counter and
//! packet halves; above, puts into the peers' scratch in rounds with per-block semaphore
//! barriers. Sums are formed in rank order on every rank, as all-reduce's.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use mscclpp_device::collectives::ll::rooted_ll_max_bytes;
use mscclpp_device::collectives::{CollContext, one_shot_max_bytes};
use mscclpp_device::kernels::collectives_more::{self as k, MoreKernel};

use super::{Collectives, DataType, Element, ReduceOp, checked_bytes, gpu};
use crate::communicator::CommError;
use crate::cuda::{CudaError, CudaFunction, CudaSlice, CudaStream};

/// The collectives of this file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ReduceScatter,
    Reduce,
    Broadcast,
    AllToAll,
}

impl Kind {
    /// Rooted calls move data one way and pass tokens (one packet less per half).
    fn rooted(self) -> bool {
        matches!(self, Kind::Reduce | Kind::Broadcast)
    }
}

/// Every kernel of this file: name and host twin.
const TABLE: &[(&str, MoreKernel)] = &[
    ("reduce_scatter_ll_f32", k::reduce_scatter_ll_f32),
    ("reduce_scatter_ll_f16", k::reduce_scatter_ll_f16),
    ("reduce_scatter_ll_bf16", k::reduce_scatter_ll_bf16),
    ("reduce_scatter_put_f32", k::reduce_scatter_put_f32),
    ("reduce_scatter_put_f16", k::reduce_scatter_put_f16),
    ("reduce_scatter_put_bf16", k::reduce_scatter_put_bf16),
    ("reduce_ll_f32", k::reduce_ll_f32),
    ("reduce_ll_f16", k::reduce_ll_f16),
    ("reduce_ll_bf16", k::reduce_ll_bf16),
    ("reduce_put_f32", k::reduce_put_f32),
    ("reduce_put_f16", k::reduce_put_f16),
    ("reduce_put_bf16", k::reduce_put_bf16),
    ("broadcast_ll", k::broadcast_ll),
    ("broadcast_put", k::broadcast_put),
    ("all_to_all_ll", k::all_to_all_ll),
    ("all_to_all_put", k::all_to_all_put),
];

/// The index in [`TABLE`] of the kernel of `kind` on path `ll` for `dtype` (ignored by the
/// byte movers).
fn kernel_index(kind: Kind, ll: bool, dtype: DataType) -> usize {
    let path = usize::from(!ll);
    let ty = match dtype {
        DataType::F32 => 0,
        DataType::F16 => 1,
        DataType::Bf16 => 2,
    };
    match kind {
        Kind::ReduceScatter => 3 * path + ty,
        Kind::Reduce => 6 + 3 * path + ty,
        Kind::Broadcast => 12 + path,
        Kind::AllToAll => 14 + path,
    }
}

/// The kernels of this file in the communicator's loaded module.
#[derive(Debug)]
pub(super) struct Kernels {
    /// In [`TABLE`]'s order.
    functions: Vec<CudaFunction>,
    ctx: u64,
}

impl Kernels {
    pub(super) fn load(base: &gpu::Kernels) -> Result<Kernels, CudaError> {
        let functions = TABLE
            .iter()
            .map(|(name, _)| base.function(name))
            .collect::<Result<_, _>>()?;
        Ok(Kernels {
            functions,
            ctx: base.ctx_ptr(),
        })
    }

    /// Launches kernel `TABLE[index]` with `(ctx, send, recv, count, root)` on `stream`.
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
        root: u64,
        (blocks, threads): (u32, u32),
    ) -> Result<(), CommError> {
        let f = &self.functions[index];
        let mut l = stream.launch_builder(f);
        l.arg(&self.ctx)
            .arg(&send)
            .arg(&recv)
            .arg(&count)
            .arg(&root);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: caller contract for the user ranges; the context in device memory holds
        // this communicator's registered memory; the argument list matches the kernels'
        // signature (*const CollContext, *const u8, *mut u8, u64, u64).
        unsafe { l.launch(cfg) }
            .map(|_| ())
            .map_err(|e| CudaError::driver("cuLaunchKernel", e).into())
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
    /// Bytes one rank sends one peer (chooses the path).
    pair_bytes: usize,
    /// Bytes the call moves on this rank (sizes the grid of the put path).
    total_bytes: usize,
    root: usize,
}

impl Collectives {
    /// Whether a call of `kind` sending `pair_bytes` to each peer takes the LL path.
    fn more_ll(&self, kind: Kind, pair_bytes: usize) -> bool {
        let fits = if kind.rooted() {
            rooted_ll_max_bytes(self.ctx.packets_len)
        } else {
            one_shot_max_bytes(self.ctx.packets_len)
        };
        pair_bytes <= self.config.packet_max_bytes.min(fits as usize)
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

    /// The kernel (index in [`TABLE`]) and grid of a plan on the GPU.
    fn more_gpu_launch(&self, p: &Plan) -> (usize, (u32, u32)) {
        let ll = self.more_ll(p.kind, p.pair_bytes);
        let grid = if ll {
            self.grid(Some(super::AllReduceAlgo::OneShot), p.pair_bytes)
        } else {
            self.grid(None, p.total_bytes)
        };
        (kernel_index(p.kind, ll, p.dtype), grid)
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
        let (index, grid) = self.more_gpu_launch(&p);
        // SAFETY: caller contract.
        unsafe { kernels.launch(stream, index, send, recv, p.count, p.root as u64, grid) }
    }

    /// Runs a plan on CPU threads (host backend).
    ///
    /// # Safety
    /// The ranges valid host memory for the plan.
    unsafe fn more_host(&self, call: &str, p: Plan, send: u64, recv: u64) -> Result<(), CommError> {
        self.host_only(call)?;
        if p.pair_bytes == 0 {
            return Ok(());
        }
        let ll = self.more_ll(p.kind, p.pair_bytes);
        let f = TABLE[kernel_index(p.kind, ll, p.dtype)].1;
        let ctx = &*self.ctx as *const CollContext as u64;
        let (count, root) = (p.count, p.root as u64);
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
                    root,
                )
            }
        })
    }

    /// Checks the GPU backend and the stream of a `_raw` call.
    fn more_gpu_call(&self, call: &str, stream: &CudaStream) -> Result<(), CommError> {
        self.gpu_kernels(call)?;
        gpu::check_stream(call, self.gpu().expect("GPU backend"), stream)
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
        let call = "reduce_scatter";
        let ReduceOp::Sum = op;
        self.more_gpu_call(call, stream)?;
        let (n, es) = (self.nranks(), dtype.size());
        let bytes = checked_bytes(call, recv_count, es)?;
        let total = checked_bytes(call, bytes, n)?;
        if recv_count == 0 {
            return Ok(());
        }
        gpu::check_range("reduce_scatter: send", send, total, es)?;
        gpu::check_range("reduce_scatter: recv", recv, bytes, es)?;
        check_overlap(call, send, total, recv, bytes, (self.rank() * bytes) as u64)?;
        let p = Plan {
            kind: Kind::ReduceScatter,
            dtype,
            count: recv_count as u64,
            pair_bytes: bytes,
            total_bytes: total,
            root: 0,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.more_launch(p, send, recv, stream) }
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
        let call = "reduce";
        let ReduceOp::Sum = op;
        self.more_gpu_call(call, stream)?;
        self.check_root(call, root)?;
        let es = dtype.size();
        let bytes = checked_bytes(call, count, es)?;
        if count == 0 {
            return Ok(());
        }
        gpu::check_range("reduce: send", send, bytes, es)?;
        if self.rank() == root {
            gpu::check_range("reduce: recv", recv, bytes, es)?;
            check_overlap(call, send, bytes, recv, bytes, 0)?;
        }
        let p = Plan {
            kind: Kind::Reduce,
            dtype,
            count: count as u64,
            pair_bytes: bytes,
            total_bytes: bytes,
            root,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.more_launch(p, send, recv, stream) }
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
        self.more_gpu_call(call, stream)?;
        self.check_root(call, root)?;
        let es = dtype.size();
        let bytes = checked_bytes(call, count, es)?;
        if count == 0 {
            return Ok(());
        }
        gpu::check_range("broadcast: recv", recv, bytes, es)?;
        if self.rank() == root {
            gpu::check_range("broadcast: send", send, bytes, es)?;
            check_overlap(call, send, bytes, recv, bytes, 0)?;
        }
        let p = Plan {
            kind: Kind::Broadcast,
            dtype,
            count: bytes as u64,
            pair_bytes: bytes,
            total_bytes: bytes,
            root,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.more_launch(p, send, recv, stream) }
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
        self.more_gpu_call(call, stream)?;
        let es = dtype.size();
        let bytes = checked_bytes(call, count, es)?;
        let total = checked_bytes(call, bytes, self.nranks())?;
        if count == 0 {
            return Ok(());
        }
        gpu::check_range("all_to_all: send", send, total, es)?;
        gpu::check_range("all_to_all: recv", recv, total, es)?;
        check_overlap(call, send, total, recv, total, 0)?;
        let p = Plan {
            kind: Kind::AllToAll,
            dtype,
            count: bytes as u64,
            pair_bytes: bytes,
            total_bytes: total,
            root: 0,
        };
        // SAFETY: ranges checked above, kept valid by the caller.
        unsafe { self.more_launch(p, send, recv, stream) }
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
        let ReduceOp::Sum = op;
        let n = self.nranks();
        if send.len() != n * recv.len() {
            return Err(invalid(format!(
                "{call}: send has {} elements; {n} ranks x recv's {} expected",
                send.len(),
                recv.len()
            )));
        }
        let plan = self.plan_rs(recv.len(), T::DTYPE);
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
        let ReduceOp::Sum = op;
        let count = self.blocks_of(call, buf.len())?;
        let plan = self.plan_rs(count, T::DTYPE);
        let p = buf.as_mut_ptr();
        // SAFETY: the slice is valid for its length and borrowed for the call; this rank's
        // block lies in it.
        unsafe {
            let r = p.add(self.rank() * count);
            self.more_host(call, plan, p as u64, r as u64)
        }
    }

    fn plan_rs(&self, count: usize, dtype: DataType) -> Plan {
        let bytes = count * dtype.size();
        Plan {
            kind: Kind::ReduceScatter,
            dtype,
            count: count as u64,
            pair_bytes: bytes,
            total_bytes: bytes * self.nranks(),
            root: 0,
        }
    }

    fn plan_rooted(&self, kind: Kind, count: usize, dtype: DataType, root: usize) -> Plan {
        let bytes = count * dtype.size();
        Plan {
            kind,
            dtype,
            count: if kind == Kind::Reduce { count } else { bytes } as u64,
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
        let ReduceOp::Sum = op;
        same_len(call, send.len(), recv.len())?;
        self.check_root(call, root)?;
        let plan = self.plan_rooted(Kind::Reduce, send.len(), T::DTYPE, root);
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
        let ReduceOp::Sum = op;
        self.check_root(call, root)?;
        let plan = self.plan_rooted(Kind::Reduce, buf.len(), T::DTYPE, root);
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
        let plan = self.plan_rooted(Kind::Broadcast, send.len(), T::DTYPE, root);
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
        let plan = self.plan_rooted(Kind::Broadcast, buf.len(), T::DTYPE, root);
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

#[cfg(test)]
#[path = "more_tests.rs"]
mod tests;
