//! Where a call runs: the grid of a GPU launch, the CPU threads of the Host backend, and the
//! all-gather over the local group (also a step of the across-hosts all-reduce).

use super::descriptor::all_gather_tag;
use super::kernel_table::HostKernel;
use super::{AllGatherAlgo, AllReduceAlgo, Collectives, DataType};
use crate::communicator::CommError;
use crate::cuda::CudaStream;
use mscclpp_device::arch::{Dim3, launch};
use mscclpp_device::collectives::CollContext;
use mscclpp_device::kernels::collectives as k;

/// Grid `(blocks, threads)` of an LL-packet launch (one-shot all-reduce, all-gather packets,
/// the small paths of the other collectives) of `bytes` per rank pair, with blocks of at most
/// `threads` threads and at most `block_cap` blocks (and `MAX_BLOCKS`): a thread per 8-byte
/// unit plus one warp. Block 0's first warp sends and checks the call descriptors and carries
/// no data (the device's `data_threads`), so it does not hold up the data threads' polls,
/// nor they its check.
pub(super) fn one_shot_grid(bytes: usize, threads: u32, block_cap: u32) -> (u32, u32) {
    let units = bytes.div_ceil(8).max(1);
    let threads = ((units.next_multiple_of(32) + 32) as u32).clamp(64, threads.max(64));
    let most = block_cap.clamp(1, mscclpp_device::collectives::MAX_BLOCKS as u32) as usize;
    let blocks = (units + 32).div_ceil(threads as usize).clamp(1, most) as u32;
    (blocks, threads)
}

impl Collectives {
    /// Grid of a GPU launch: `(blocks, threads)`.
    pub(super) fn grid(&self, algo: Option<AllReduceAlgo>, bytes: usize) -> (u32, u32) {
        let threads = self.config.threads;
        match algo {
            // A few blocks stage and reduce, each over its own lane of proxy channels; the
            // copy engine moves the data.
            Some(AllReduceAlgo::Proxy) => (self.proxy_plan(bytes).0, threads),
            Some(AllReduceAlgo::OneShot) => one_shot_grid(bytes, threads, self.block_cap),
            _ => {
                // NVLink needs many blocks in flight (one block moves only a few GB/s):
                // one per 16 KiB, at most max_blocks.
                let blocks = bytes
                    .div_ceil(16 << 10)
                    .clamp(1, self.config.max_blocks as usize);
                (blocks as u32, threads)
            }
        }
    }

    /// Runs a kernel body on CPU threads (host backend): one block of `max(nranks, 2)`
    /// threads (the kernels take any grid, and more threads only add contention on a CPU).
    /// Returns the pending error before, and the kernel's record after (the kernels do not
    /// trap: a failed wait records why and returns).
    pub(super) fn run_host(&self, call: &str, body: impl Fn() + Sync) -> Result<(), CommError> {
        self.run_host_blocks(call, 1, body)
    }

    /// [`run_host`](Self::run_host) on `blocks` blocks (the proxy kernels' lanes).
    pub(super) fn run_host_blocks(
        &self,
        call: &str,
        blocks: u32,
        body: impl Fn() + Sync,
    ) -> Result<(), CommError> {
        self.run_host_grid(call, blocks, self.ctx.nranks.max(2), body)
    }

    /// [`run_host`](Self::run_host) on one thread, the calling one: for the kernels that
    /// take blocks of any size (all-reduce's one-shot, two-shot, read-reduce, all-pairs). Two ranks on two cores then poll
    /// each other's packets with nothing else to schedule: on the 2-core CI machine, 8 B
    /// took 85-95 us with blocks of two threads (their barriers wait on a thread that has
    /// no core) and MPI_Allreduce 0.5-0.8 us.
    pub(super) fn run_host_alone(
        &self,
        call: &str,
        body: impl Fn() + Sync,
    ) -> Result<(), CommError> {
        self.run_host_grid(call, 1, 1, body)
    }

    fn run_host_grid(
        &self,
        call: &str,
        blocks: u32,
        threads: u32,
        body: impl Fn() + Sync,
    ) -> Result<(), CommError> {
        self.check_fault(call, true)?;
        launch(Dim3::x(blocks), Dim3::x(threads), body).map_err(|e| {
            CommError::State(format!(
                "{call}: the collective kernel failed on this rank ({e}): a bug or a broken \
                 contract, not a peer's doing"
            ))
        })?;
        self.check_fault(call, true)
    }

    /// Launches the all-gather kernel of resolved `algo` over the local group on `stream`
    /// (`bytes` per local rank).
    ///
    /// # Safety
    /// `send` valid device memory for `bytes`, `recv` for `nlocal * bytes`, until the stream
    /// ran the kernel.
    pub(super) unsafe fn launch_all_gather(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
        algo: AllGatherAlgo,
        stream: &CudaStream,
    ) -> Result<(), CommError> {
        let kernels = self.gpu_kernels("all_gather")?;
        let (blocks, threads) = match algo {
            AllGatherAlgo::Proxy => self.grid(Some(AllReduceAlgo::Proxy), bytes),
            // The same unit-per-thread grid as one-shot all-reduce.
            AllGatherAlgo::Packets => self.grid(Some(AllReduceAlgo::OneShot), bytes),
            _ => self.grid(None, bytes),
        };
        let f = match algo {
            AllGatherAlgo::Proxy => &kernels.all_gather_proxy,
            AllGatherAlgo::Packets => &kernels.all_gather_packets,
            _ => &kernels.all_gather,
        };
        let tag = all_gather_tag(algo, dtype);
        let tag = match algo {
            AllGatherAlgo::Proxy => self.proxy_tag(tag, bytes),
            _ => tag,
        };
        // SAFETY: as in all_reduce_raw.
        self.noted(unsafe {
            kernels.launch(
                stream,
                f,
                send,
                recv,
                bytes as u64,
                tag,
                blocks,
                threads,
                algo == AllGatherAlgo::Packets,
            )
        })
    }

    /// Runs the all-gather kernel of resolved `algo` on CPU threads over the local group's
    /// context (`bytes` per rank; rank `l`'s lands at `recv + l * bytes`).
    ///
    /// # Safety
    /// `send` valid host memory for `bytes`, `recv` for `nlocal * bytes`.
    pub(super) unsafe fn run_all_gather_kernel(
        &self,
        call: &str,
        s: u64,
        r: u64,
        bytes: u64,
        dtype: DataType,
        algo: AllGatherAlgo,
    ) -> Result<(), CommError> {
        let ctx = &*self.ctx as *const CollContext as u64;
        let f: HostKernel = match algo {
            AllGatherAlgo::Proxy => k::all_gather_proxy,
            AllGatherAlgo::Packets => k::all_gather_packets,
            _ => k::all_gather,
        };
        let (tag, blocks) = match algo {
            AllGatherAlgo::Proxy => (
                self.proxy_tag(all_gather_tag(algo, dtype), bytes as usize),
                self.proxy_plan(bytes as usize).0,
            ),
            _ => (all_gather_tag(algo, dtype), 1),
        };
        self.run_host_blocks(call, blocks, || {
            // SAFETY: as in host_all_reduce; recv holds nranks * bytes.
            unsafe {
                f(
                    ctx as *const CollContext,
                    s as *const u8,
                    r as *mut u8,
                    bytes,
                    tag,
                )
            }
        })
    }
}
