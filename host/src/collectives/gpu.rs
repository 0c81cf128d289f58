//! The GPU side of the collectives: loaded kernels, pointer checks, launches.

use cudarc::driver::sys;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use mscclpp_device::channel::DevConn;
use mscclpp_device::collectives::CollContext;

use super::{AllReduceAlgo, DataType, ReduceOp};
use crate::communicator::CommError;
use crate::cuda::{CudaError, CudaFunction, CudaStream, DeviceBuffer, Gpu, KernelModule};

/// The collective kernels of the embedded PTX, loaded once per communicator.
#[derive(Debug)]
pub(super) struct Kernels {
    /// The sum-only kernels of f32, f16 and bf16 (in `kernel_table::REDUCE_TYPES` order), per
    /// algorithm in `AllReduceAlgo` order: one-shot, two-shot, read-reduce, all-pairs, proxy.
    sum: Vec<[CudaFunction; 5]>,
    /// The any-type, any-operation kernels per element size (`kernel_table::size_class`): one-shot,
    /// two-shot, proxy.
    any_op: Vec<[CudaFunction; 3]>,
    pub(super) all_gather_proxy: CudaFunction,
    /// The proxy channels' handles in device memory (the context points at them).
    _conns: Option<DeviceBuffer>,
    pub(super) all_gather: CudaFunction,
    pub(super) all_gather_packets: CudaFunction,
    /// The bare LL exchange (a benchmark reference, [`super::Collectives::ll_exchange_raw`]).
    pub(super) ll_exchange: CudaFunction,
    /// The context in device memory (kernels take its address).
    ctx: DeviceBuffer,
    /// Programmatic dependent launch for the kernels that wait for it (see [`Self::launch`]).
    pub(super) pdl: Pdl,
    _module: KernelModule,
}

impl Kernels {
    /// Loads the kernels; `pdl`: programmatic dependent launch allowed ([`pdl_plan`]; used
    /// only with PTX for sm_90 or newer).
    pub(super) fn load(
        gpu: &Gpu,
        ctx: &CollContext,
        conns: &[DevConn<'_>],
        pdl: bool,
    ) -> Result<Kernels, CudaError> {
        let m = KernelModule::load_builtin(gpu)?;
        let mut ctx = *ctx;
        let conns = match conns {
            [] => None,
            c => {
                let mem = DeviceBuffer::zeroed(gpu, std::mem::size_of_val(c))?;
                mem.copy_from_host(0, c)?;
                ctx.conns = mem.device_ptr() as *const DevConn<'static>;
                Some(mem)
            }
        };
        let mem = DeviceBuffer::zeroed(gpu, std::mem::size_of::<CollContext>())?;
        mem.copy_from_host(0, std::slice::from_ref(&ctx))?;
        let f = |name: &str| m.function(name);
        let sum = super::kernel_table::REDUCE_TYPES[..3]
            .iter()
            .map(|t| -> Result<[CudaFunction; 5], CudaError> {
                Ok([
                    f(&format!("all_reduce_one_shot_{t}"))?,
                    f(&format!("all_reduce_two_shot_{t}"))?,
                    f(&format!("all_reduce_two_shot_read_{t}"))?,
                    f(&format!("all_reduce_all_pairs_{t}"))?,
                    f(&format!("all_reduce_proxy_{t}"))?,
                ])
            })
            .collect::<Result<_, _>>()?;
        let any_op = super::kernel_table::SIZE_CLASSES
            .iter()
            .map(|t| -> Result<[CudaFunction; 3], CudaError> {
                Ok([
                    f(&format!("all_reduce_one_shot_op_{t}"))?,
                    f("all_reduce_two_shot_op")?,
                    f("all_reduce_proxy_op")?,
                ])
            })
            .collect::<Result<_, _>>()?;
        Ok(Kernels {
            sum,
            any_op,
            all_gather: f("all_gather")?,
            all_gather_packets: f("all_gather_packets")?,
            ll_exchange: f("ll_exchange")?,
            all_gather_proxy: f("all_gather_proxy")?,
            _conns: conns,
            ctx: mem,
            pdl: Pdl::new(pdl && m.arch() >= 90),
            _module: m,
        })
    }

    pub(super) fn all_reduce(
        &self,
        algo: AllReduceAlgo,
        dtype: DataType,
        op: ReduceOp,
    ) -> &CudaFunction {
        let i = super::kernel_table::reduce_index(dtype)
            .expect("a reducing type (checked by the caller)");
        match super::kernel_table::kernel_slot(algo, dtype, op) {
            (true, a) => &self.sum[i][a],
            (false, a) => &self.any_op[super::kernel_table::size_class(dtype)][a],
        }
    }
}

/// Checks that `stream` belongs to `gpu`'s context and makes that context current on this
/// thread (the pointer checks ask the driver in the current context).
pub(super) fn check_stream(call: &str, gpu: &Gpu, stream: &CudaStream) -> Result<(), CommError> {
    if stream.context().cu_ctx() != gpu.context().cu_ctx() {
        return Err(CommError::InvalidArgument(format!(
            "{call}: the stream belongs to another CUDA context than this communicator's GPU {}",
            gpu.info().ordinal
        )));
    }
    gpu.context()
        .bind_to_thread()
        .map_err(|e| CudaError::driver("cuCtxSetCurrent", e).into())
}

/// Refuses a typed call on a capturing stream while cudarc would add (uncapturable) event
/// waits for the slices.
/// Whether `stream` is being captured into a CUDA graph (false if the query fails).
pub(super) fn is_capturing(stream: &CudaStream) -> bool {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream and an out-pointer to a local.
    let r = unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) };
    r == sys::CUresult::CUDA_SUCCESS
        && status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

pub(super) fn check_capture(call: &str, stream: &CudaStream) -> Result<(), CommError> {
    if !stream.context().is_managing_stream_synchronization() {
        return Ok(());
    }
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream of this context and an out-pointer to a local.
    let r = unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) };
    if r == sys::CUresult::CUDA_SUCCESS
        && status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    {
        return Err(CommError::InvalidArgument(format!(
            "{call}: the stream is being captured into a CUDA graph and cudarc's event \
             tracking would add event waits that cannot be captured; call \
             CudaContext::disable_event_tracking before allocating the slices, or use the \
             _raw call"
        )));
    }
    Ok(())
}

/// Checks that `[ptr, ptr + bytes)` is device memory of this context and that `ptr` is
/// aligned to `align` (a host-side lookup; no stream work). The range may cross
/// allocations of the CUDA virtual memory API mapped back to back: it maps several
/// physical allocations into one reserved range (PyTorch's `expandable_segments`, whose
/// segments DDP's 25 MiB buckets cross), and `cuMemGetAddressRange` answers with the one
/// holding the address only. Our kernels reach the buffer at its address in this context
/// alone, so such a range serves. Allocations of `cuMemAlloc` that happen to lie side by
/// side are still separate: a range running from one into the next is refused.
pub(super) fn check_range(
    what: &str,
    ptr: u64,
    bytes: usize,
    align: usize,
) -> Result<(), CommError> {
    if !ptr.is_multiple_of(align as u64) {
        return Err(CommError::InvalidArgument(format!(
            "{what}: address {ptr:#x} is not aligned to the element size ({align} bytes)"
        )));
    }
    // The current context's device (the caller bound the communicator's).
    let mut dev = 0;
    // SAFETY: an out-pointer to a local.
    let have_dev = unsafe { sys::cuCtxGetDevice(&mut dev) } == sys::CUresult::CUDA_SUCCESS;
    // Whether the allocation at `at` is a mapping of the virtual memory API (a handle can be
    // retained for it; not so for `cuMemAlloc`'s) that this device may read and write (a
    // mapping whose access leaves it out would fault the kernel and lose the context).
    let mapped = |at: u64| {
        let mut handle = 0;
        // SAFETY: an out-pointer to a local; the driver only looks the address up.
        let r =
            unsafe { sys::cuMemRetainAllocationHandle(&mut handle, at as *mut std::ffi::c_void) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return false;
        }
        // SAFETY: the reference just retained.
        unsafe { sys::cuMemRelease(handle) };
        let location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        };
        let mut flags = 0;
        // SAFETY: out-pointer and location are locals; the driver only looks the address up.
        let r = unsafe { sys::cuMemGetAccess(&mut flags, &location, at) };
        have_dev
            && r == sys::CUresult::CUDA_SUCCESS
            && flags == sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u64
    };
    let lookup = |at: u64| {
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: out-pointers to locals; the driver only reads its own tables.
        let status = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, at) };
        if is_sticky(status) {
            return Err(Some(context_lost(what, "cuMemGetAddressRange", status)));
        }
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(None);
        }
        Ok((base, size as u64))
    };
    match mapped_through(ptr, bytes as u64, lookup, mapped) {
        Ok(()) => Ok(()),
        Err(Gap::Lost(e)) => Err(e),
        Err(Gap::NotMapped) => Err(CommError::InvalidArgument(format!(
            "{what}: address {ptr:#x} is not device memory of this context"
        ))),
        Err(Gap::Beyond { at, first }) => {
            let (base, size) = first;
            let past = if at == base.saturating_add(size) {
                format!("its allocation ({size} bytes at {base:#x})")
            } else {
                format!(
                    "the allocations mapped back to back from its own ({size} bytes at \
                     {base:#x}), which end at {at:#x}"
                )
            };
            Err(CommError::InvalidArgument(format!(
                "{what}: {bytes} bytes from {ptr:#x} go beyond {past}"
            )))
        }
    }
}

/// Why [`mapped_through`] found a range not mapped.
#[derive(Debug, PartialEq)]
enum Gap<E> {
    /// The first address is not mapped.
    NotMapped,
    /// The range goes past the allocations mapped back to back from the first one: where
    /// they end, and the first allocation `(base, size)`.
    Beyond { at: u64, first: (u64, u64) },
    /// The lookup's own error (a lost context).
    Lost(E),
}

/// Whether `[ptr, ptr + bytes)` is covered by allocations that `lookup` (an address to its
/// allocation `(base, size)`; `Err(None)`: not mapped) finds back to back from `ptr`'s, each
/// step between two allocations that `mapped` says are virtual memory mappings.
fn mapped_through<E>(
    ptr: u64,
    bytes: u64,
    mut lookup: impl FnMut(u64) -> Result<(u64, u64), Option<E>>,
    mut mapped: impl FnMut(u64) -> bool,
) -> Result<(), Gap<E>> {
    let first = match lookup(ptr) {
        Ok(r) => r,
        Err(Some(e)) => return Err(Gap::Lost(e)),
        Err(None) => return Err(Gap::NotMapped),
    };
    let mut at = first.0.saturating_add(first.1);
    let Some(end) = ptr.checked_add(bytes) else {
        return Err(Gap::Beyond { at, first });
    };
    let mut last = first.0;
    let mut last_mapped: Option<bool> = None;
    while at < end {
        match lookup(at) {
            // The next allocation starts right where the last one ends, both mappings (the
            // last one's answer kept from its own step: one question per allocation).
            Ok((base, size)) if base == at && size > 0 => {
                let last_ok = *last_mapped.get_or_insert_with(|| mapped(last));
                if !(last_ok && mapped(base)) {
                    return Err(Gap::Beyond { at, first });
                }
                (last, at, last_mapped) = (base, base.saturating_add(size), Some(true));
            }
            Err(Some(e)) => return Err(Gap::Lost(e)),
            _ => return Err(Gap::Beyond { at, first }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod range_tests {
    use super::*;

    /// A fake address space of allocations `(base, size)`.
    fn space(allocs: &[(u64, u64)]) -> impl FnMut(u64) -> Result<(u64, u64), Option<()>> + '_ {
        |at| {
            allocs
                .iter()
                .find(|(b, s)| at >= *b && at < b + s)
                .copied()
                .ok_or(None)
        }
    }

    #[test]
    fn a_range_may_cross_allocations_mapped_back_to_back() {
        // Three 20 MiB segments back to back (expandable segments), a hole, one more.
        let m = 20 << 20;
        let base = 0x1000_0000u64;
        let lone = 0x2000_0000u64;
        let allocs = [(base, m), (base + m, m), (base + 2 * m, m), (lone, m)];
        let vmm = |_| true;
        // Inside the first, across two (a 25 MiB bucket), across all three.
        assert_eq!(mapped_through(base + 8, 1024, space(&allocs), vmm), Ok(()));
        assert_eq!(
            mapped_through(base + m - 8, 25 << 20, space(&allocs), vmm),
            Ok(())
        );
        assert_eq!(mapped_through(base, 3 * m, space(&allocs), vmm), Ok(()));
        // One byte past the third: the hole.
        assert_eq!(
            mapped_through(base + m, 2 * m + 1, space(&allocs), vmm),
            Err(Gap::Beyond {
                at: base + 3 * m,
                first: (base + m, m)
            })
        );
        // Past a lone allocation; an unmapped start; an end that overflows.
        assert_eq!(
            mapped_through(lone + 16, m, space(&allocs), vmm),
            Err(Gap::Beyond {
                at: lone + m,
                first: (lone, m)
            })
        );
        assert_eq!(
            mapped_through(0x10, 8, space(&allocs), vmm),
            Err(Gap::NotMapped)
        );
        assert!(matches!(
            mapped_through(base, u64::MAX, space(&allocs), vmm),
            Err(Gap::Beyond { .. })
        ));
        // Allocations side by side that are not virtual memory mappings (cuMemAlloc's), or
        // a mapping next to one that is not: separate, as before.
        assert_eq!(
            mapped_through(base + m - 8, 16, space(&allocs), |_| false),
            Err(Gap::Beyond {
                at: base + m,
                first: (base, m)
            })
        );
        assert_eq!(
            mapped_through(base + m - 8, 16, space(&allocs), |a| a != base + m),
            Err(Gap::Beyond {
                at: base + m,
                first: (base, m)
            })
        );
        // One question per allocation crossed: three for all three segments.
        let mut asked = Vec::new();
        let whole = mapped_through(base, 3 * m, space(&allocs), |a| {
            asked.push(a);
            true
        });
        assert_eq!(whole, Ok(()));
        assert_eq!(asked, [base, base + m, base + 2 * m]);
        // The lookup's own error stops the walk.
        let mut calls = 0;
        let lost = mapped_through(
            base,
            2 * m,
            |at| {
                calls += 1;
                if calls == 1 {
                    Ok((base, m))
                } else {
                    Err(Some(at))
                }
            },
            vmm,
        );
        assert_eq!(lost, Err(Gap::Lost(base + m)));
    }
}

impl Kernels {
    /// The context's device address (every collective kernel takes it first).
    pub(super) fn ctx_ptr(&self) -> u64 {
        self.ctx.device_ptr()
    }

    /// Kernel `name` of the loaded module.
    pub(super) fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
        self._module.function(name)
    }

    /// Launches `f(ctx, send, recv, n, tag)` with `blocks` x `threads` on `stream`. With
    /// `dependent` (only for kernels that call `arch::grid_dependency_wait` before touching
    /// memory, such as one-shot all-reduce) and programmatic dependent launch on (PTX of sm_90
    /// or newer, `MSCCLPP_PDL` not `0`), the launch carries programmatic stream
    /// serialization: the kernel may start while the previous kernel on the stream ends, and
    /// waits for it on the GPU.
    ///
    /// # Safety
    /// `send`/`recv` valid for what the kernel accesses with `n`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn launch(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        send: u64,
        recv: u64,
        n: u64,
        tag: u64,
        blocks: u32,
        threads: u32,
        dependent: bool,
    ) -> Result<(), CommError> {
        let args = [self.ctx.device_ptr(), send, recv, n, tag];
        // SAFETY: forwarded (caller contract); the context in device memory holds this
        // communicator's registered memory.
        unsafe { launch_coll(stream, &self.pdl, f, args, (blocks, threads), dependent) }
    }
}

/// Launches a collective kernel `f(ctx, send, recv, n, tag)` (`args` in that order) on
/// `stream` with `grid` (blocks, threads): as a dependent ([`launch_dependent`]) when
/// `dependent`, the grid is small enough ([`dependent_grid`]) and `pdl` is on, else plainly.
///
/// # Safety
/// `f` takes `(*const CollContext, *const u8, *mut u8, u64, u64)`; `args[0]` is a context
/// in device memory holding the communicator's registered memory; the other pointers valid
/// for what the kernel accesses; with `dependent`, `f` calls `dependent_launch_entry`
/// first on every thread and the stream's context is bound on this thread.
pub(super) unsafe fn launch_coll(
    stream: &CudaStream,
    pdl: &Pdl,
    f: &CudaFunction,
    args: [u64; 5],
    (blocks, threads): (u32, u32),
    dependent: bool,
) -> Result<(), CommError> {
    if dependent
        && dependent_grid(blocks, threads)
        && let Some(r) = pdl.launch(|| {
            // SAFETY: forwarded (caller contract; the arguments match the signature).
            unsafe { launch_dependent(stream, f, args, (blocks, threads)) }
        })
    {
        return r;
    }
    let [ctx, send, recv, n, tag] = args;
    let mut l = stream.launch_builder(f);
    l.arg(&ctx).arg(&send).arg(&recv).arg(&n).arg(&tag);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: caller contract for the context and the user ranges; the argument list
    // matches the kernels' signature (*const CollContext, *const u8, *mut u8, u64, u64).
    unsafe { l.launch(cfg) }
        .map(|_| ())
        .map_err(|e| classify("launch", "cuLaunchKernel", e))
}

/// Most threads of a grid launched as a dependent (programmatic dependent launch): the latency
/// cases (one-shot all-reduce to 128 KiB, 33 blocks of 512 with its descriptor warp, and the
/// like) stay below it. Larger grids are launched plainly, where saving a launch latency
/// matters little. This is also a caution:
/// with every kernel launched dependent, a large grid (all-pairs all-reduce at 4 MB) hung
/// with two ranks on one GPU under MPS, likely for the reason [`pdl_plan`] gives (see
/// `mod.rs`, "Launches").
pub(super) const PDL_MAX_THREADS: u64 = 33 * 512;

/// Whether a grid of `blocks` x `threads` may be launched as a dependent ([`PDL_MAX_THREADS`]).
pub(super) fn dependent_grid(blocks: u32, threads: u32) -> bool {
    blocks as u64 * threads as u64 <= PDL_MAX_THREADS
}

/// Programmatic dependent launch and the block cap, from this rank's `MSCCLPP_PDL` (`env`,
/// [`Settings::pdl`](crate::settings::Settings::pdl)),
/// the shared-GPU block cap (`block_cap`, `u32::MAX` when no other rank of the communicator
/// is on this GPU) and whether any rank set `MSCCLPP_PDL=1` (`one_anywhere`): whether this
/// rank may use dependent launch (the PTX must also be for sm_90 or newer, see
/// [`Kernels::load`]) and the cap to apply.
///
/// - One rank per GPU: on unless `MSCCLPP_PDL=0`; no cap.
/// - Ranks sharing a GPU (processes under MPS: tests, simulated hosts): off, unless
///   `MSCCLPP_PDL=1`, which turns it on. The cap is halved on every rank once any rank set
///   `1` (grids must be equal on every rank).
///
/// The baselines ran with these defaults: `benches/records/nvidia-h200-x2.jsonl` with
/// dependent launch (a GPU per rank), `benches/records/nvidia-h100-x1.jsonl` without (two
/// ranks under MPS).
///
/// The ranks on one GPU must fit their kernels on it together, which the cap arranges for
/// one grid per rank (`shared_gpu_block_cap`). A dependent launch lets the stream's next
/// kernel become resident as soon as the current one starts, and wait there for it: a
/// rank with calls queued holds two grids. Four ranks on one H200 as two simulated hosts of
/// two hung in nccl-tests' broadcast at 256 KiB that way (6 of 6 runs with 20 calls
/// queued): the two ranks without a step across hosts ran ahead, their current and next LL
/// grids (33 blocks each) filled the 132 multiprocessors, and the grids they waited for
/// (their host leaders', after the step across hosts) found no room until the device
/// timeout. Half the cap fits two grids per rank.
pub(super) fn pdl_plan(
    env: crate::settings::PdlMode,
    block_cap: u32,
    one_anywhere: bool,
) -> (bool, u32) {
    if block_cap == u32::MAX {
        return (env != crate::settings::PdlMode::Off, u32::MAX);
    }
    let cap = if one_anywhere {
        (block_cap / 2).max(1)
    } else {
        block_cap
    };
    (env == crate::settings::PdlMode::On, cap)
}

/// Whether the latency kernels go out with programmatic dependent launch: on for sm_90 PTX
/// as [`pdl_plan`] decides, and off for good the first time the driver refuses such a launch
/// (an old driver, a setup without it); they are then launched plainly, which the kernels'
/// wait makes a no-op.
#[derive(Debug)]
pub(super) struct Pdl(std::sync::atomic::AtomicBool);

impl Pdl {
    pub(super) fn new(on: bool) -> Pdl {
        Pdl(std::sync::atomic::AtomicBool::new(on))
    }

    pub(super) fn is_on(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `launch` (a dependent launch) if on. `None` if off, or if the driver refused it
    /// (then off from now on, and nothing was launched): the caller launches plainly. A lost
    /// context is returned as is.
    pub(super) fn launch(
        &self,
        launch: impl FnOnce() -> Result<(), CommError>,
    ) -> Option<Result<(), CommError>> {
        if !self.is_on() {
            return None;
        }
        match launch() {
            Err(CommError::ContextLost(m)) => Some(Err(CommError::ContextLost(m))),
            Err(_) => {
                self.0.store(false, std::sync::atomic::Ordering::Relaxed);
                None
            }
            Ok(()) => Some(Ok(())),
        }
    }
}

/// Launches a collective kernel `f(ctx, send, recv, n, tag)` (`args` in that order) with
/// programmatic stream serialization (programmatic dependent launch): it may start while the
/// previous kernel on `stream` ends; the kernel waits for that kernel on the GPU
/// (`CollContext::dependent_launch_entry`) before touching memory.
///
/// # Safety
/// `f` calls `dependent_launch_entry` first on every thread, takes `(*const CollContext,
/// *const u8, *mut u8, u64, u64)`, and belongs to a module of the stream's context (bound on
/// this thread); the pointers in `args` valid for what the kernel accesses.
pub(super) unsafe fn launch_dependent(
    stream: &CudaStream,
    f: &CudaFunction,
    args: [u64; 5],
    grid: (u32, u32),
) -> Result<(), CommError> {
    let mut ptrs = args
        .each_ref()
        .map(|a| a as *const u64 as *mut std::ffi::c_void);
    // SAFETY: forwarded; `ptrs` points at the five u64s of `args`, which outlive the call.
    unsafe { launch_dependent_params(stream, f, &mut ptrs, grid) }
}

/// [`launch_dependent`] with the kernel's parameters given as `cuLaunchKernelEx` takes them:
/// one pointer per parameter, to a value of the parameter's type.
///
/// # Safety
/// As for [`launch_dependent`], with `params` matching the kernel's parameter list and
/// pointing at values that outlive the call.
pub(super) unsafe fn launch_dependent_params(
    stream: &CudaStream,
    f: &CudaFunction,
    params: &mut [*mut std::ffi::c_void],
    (blocks, threads): (u32, u32),
) -> Result<(), CommError> {
    // SAFETY: an all-zero attribute is a valid plain-old-data value; the id and the union
    // member it selects are set next.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `params` match the kernel's parameters and point at values that outlive the
    // call (caller contract); `cfg` and `attr` outlive the call.
    let r = unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    r.result()
        .map_err(|e| classify("launch", "cuLaunchKernelEx", e))
}

/// Whether `status` is one of the errors that leave the CUDA context unusable (every later
/// call of the context returns it).
pub(super) fn is_sticky(status: sys::CUresult) -> bool {
    use sys::CUresult as R;
    matches!(
        status,
        R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_ECC_UNCORRECTABLE
            | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

/// The error for a sticky status seen by `driver_call` during `what`.
pub(super) fn context_lost(what: &str, driver_call: &str, status: sys::CUresult) -> CommError {
    CommError::ContextLost(format!(
        "{what}: the CUDA context of this GPU is lost ({driver_call} returned {status:?}): an \
         earlier kernel on it trapped or faulted (a bad pointer, or a broken contract), and \
         every later CUDA call in this process fails the same way; the arguments of this \
         call are not the cause. Recreate the context (restart the process)"
    ))
}

/// A driver error of `driver_call` during `what`: [`context_lost`] for sticky statuses.
pub(super) fn classify(
    what: &str,
    driver_call: &'static str,
    e: cudarc::driver::DriverError,
) -> CommError {
    if is_sticky(e.0) {
        context_lost(what, driver_call, e.0)
    } else {
        CudaError::driver(driver_call, e).into()
    }
}
