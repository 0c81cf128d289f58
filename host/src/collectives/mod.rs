//! Collectives: all-reduce and all-gather over memory channels (DESIGN §8).
//!
//! [`Collectives`] takes a set-up-less [`Communicator`], connects a memory channel to every
//! other rank over a scratch buffer registered once (plus LL-packet scratch and an array of
//! semaphores), and then runs the collective kernels of the device crate. Calls allocate
//! nothing and never synchronise with the host, so they may be captured into a CUDA graph.
//!
//! On the GPU backend the buffers are device pointers (raw, or cudarc [`CudaSlice`]s) and
//! calls are stream-ordered on the caller's [`CudaStream`]. On the host backend (no GPU)
//! the same kernels run on CPU threads over shared memory, and calls block until done.
//!
//! # Algorithms
//!
//! [`AllReduceAlgo::Auto`] picks by message size and rank count; the environment variables
//! `MSCCLPP_ALLREDUCE_ALGO` (`oneshot`, `twoshot`) and `MSCCLPP_ALLGATHER_ALGO` (`memory`)
//! override the choice, and an explicit algorithm argument overrides both.

use std::fmt;

use crate::communicator::{CommError, Communicator};
use crate::cuda::{CudaSlice, CudaStream, Gpu};

/// Element type of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    Bf16,
}

impl DataType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
        }
    }

    /// The name nccl-tests prints (`float`, `half`, `bfloat16`).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
}

impl ReduceOp {
    /// The name nccl-tests prints.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
        }
    }
}

/// All-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllReduceAlgo {
    /// Chosen by size and rank count (and `MSCCLPP_ALLREDUCE_ALGO`).
    Auto,
    /// Every rank sends its whole input as LL packets to every peer; each reduces locally.
    /// One kernel, no separate signal: lowest latency for small messages.
    OneShot,
    /// Reduce-scatter then all-gather through the scratch, with semaphores: for large ones.
    TwoShot,
}

/// All-gather algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllGatherAlgo {
    /// Chosen by size and rank count (and `MSCCLPP_ALLGATHER_ALGO`).
    Auto,
    /// GPU threads copy over memory channels.
    Memory,
}

/// Element types the typed calls accept.
pub trait Element: Copy + Send + Sync + 'static {
    /// The matching [`DataType`].
    const DTYPE: DataType;
}

impl Element for f32 {
    const DTYPE: DataType = DataType::F32;
}
impl Element for half::f16 {
    const DTYPE: DataType = DataType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DataType = DataType::Bf16;
}

/// Settings of [`Collectives`].
#[derive(Debug, Clone)]
pub struct CollConfig {
    /// Bytes of the scratch buffer each rank registers (the two-shot and all-gather paths
    /// pipeline larger messages through it).
    pub scratch_bytes: usize,
    /// Largest message (bytes) the one-shot packet path serves.
    pub packet_max_bytes: usize,
}

impl Default for CollConfig {
    fn default() -> Self {
        CollConfig {
            scratch_bytes: 64 << 20,
            packet_max_bytes: 1 << 20,
        }
    }
}

/// All-reduce and all-gather over one communicator. See the [module](self).
pub struct Collectives {
    comm: Communicator,
    config: CollConfig,
}

impl fmt::Debug for Collectives {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collectives")
            .field("rank", &self.comm.rank())
            .field("nranks", &self.comm.nranks())
            .field("config", &self.config)
            .finish()
    }
}

impl Collectives {
    /// Registers scratch and connects every pair of ranks (collective: every rank calls it).
    pub fn new(comm: Communicator, config: CollConfig) -> Result<Collectives, CommError> {
        let _ = (&comm, &config);
        Err(CommError::State("collectives: not implemented yet".into()))
    }

    /// The communicator underneath.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.comm.nranks()
    }

    /// The GPU of a GPU-backend communicator.
    pub fn gpu(&self) -> Option<&Gpu> {
        match self.comm.backend() {
            crate::communicator::Backend::Gpu(g) => Some(g),
            crate::communicator::Backend::Host => None,
        }
    }

    /// The algorithm [`AllReduceAlgo::Auto`] resolves to for `bytes` per rank.
    pub fn choose_all_reduce(&self, bytes: usize) -> AllReduceAlgo {
        let _ = bytes;
        AllReduceAlgo::TwoShot
    }

    /// All-reduce of `count` elements from device address `send` into `recv` (equal for in
    /// place), stream-ordered on `stream`. GPU backend only.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of this communicator's GPU valid for
    /// `count` elements until the operation completes on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_raw(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        algo: AllReduceAlgo,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let _ = (send, recv, count, dtype, op, algo, stream);
        Err(CommError::State("collectives: not implemented yet".into()))
    }

    /// All-gather: `send_count` elements from every rank land in `recv` (rank `r`'s at
    /// element `r * send_count`). GPU backend only.
    ///
    /// # Safety
    /// `send` valid for `send_count` elements and `recv` for `nranks * send_count`, device
    /// memory of this GPU, until the operation completes on `stream`.
    pub unsafe fn all_gather_raw(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        dtype: DataType,
        algo: AllGatherAlgo,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let _ = (send, recv, send_count, dtype, algo, stream);
        Err(CommError::State("collectives: not implemented yet".into()))
    }

    /// Out-of-place all-reduce of cudarc slices (lengths must match).
    pub fn all_reduce<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let _ = (send, recv, op, stream);
        Err(CommError::State("collectives: not implemented yet".into()))
    }

    /// In-place all-reduce of a cudarc slice.
    pub fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let _ = (buf, op, stream);
        Err(CommError::State("collectives: not implemented yet".into()))
    }

    /// All-gather of cudarc slices (`recv.len() == nranks * send.len()`).
    pub fn all_gather<T: Element>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let _ = (send, recv, stream);
        Err(CommError::State("collectives: not implemented yet".into()))
    }

    /// Host backend: all-reduce of host slices (blocking; CPU threads run the kernel).
    pub fn all_reduce_host<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let _ = (send, recv, op);
        Err(CommError::State("collectives: not implemented yet".into()))
    }

    /// Host backend: in-place all-reduce.
    pub fn all_reduce_host_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let _ = (buf, op);
        Err(CommError::State("collectives: not implemented yet".into()))
    }

    /// Host backend: all-gather of host slices (`recv.len() == nranks * send.len()`).
    pub fn all_gather_host<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        let _ = (send, recv);
        Err(CommError::State("collectives: not implemented yet".into()))
    }
}
