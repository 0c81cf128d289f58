//! nvptx implementation: sreg reads through `core::arch::nvptx`, every memory-model access
//! as inline PTX. Pointers are generic addresses; `_sys` accesses use the generic state
//! space so they work for device, peer and host-mapped memory alike.

use core::arch::asm;
use core::arch::nvptx;

/// Thread index within the block, x.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() as u32 }
}
/// Thread index within the block, y.
#[inline(always)]
pub fn thread_idx_y() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_y() as u32 }
}
/// Thread index within the block, z.
#[inline(always)]
pub fn thread_idx_z() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_z() as u32 }
}
/// Block index within the grid, x.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_x() as u32 }
}
/// Block index within the grid, y.
#[inline(always)]
pub fn block_idx_y() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_y() as u32 }
}
/// Block index within the grid, z.
#[inline(always)]
pub fn block_idx_z() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_z() as u32 }
}
/// Threads per block, x.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_x() as u32 }
}
/// Threads per block, y.
#[inline(always)]
pub fn block_dim_y() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_y() as u32 }
}
/// Threads per block, z.
#[inline(always)]
pub fn block_dim_z() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_z() as u32 }
}
/// Blocks in the grid, x.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_x() as u32 }
}
/// Blocks in the grid, y.
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_y() as u32 }
}
/// Blocks in the grid, z.
#[inline(always)]
pub fn grid_dim_z() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_z() as u32 }
}

/// Block-wide barrier (`bar.sync 0`); also orders the block's memory accesses
/// (morally strong at CTA scope), so writes before it are visible to the block after it.
/// Every thread of the block must reach it.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: bar.sync has no memory preconditions; divergence is the caller's contract.
    unsafe { nvptx::_syncthreads() }
}

/// Programmatic dependent launch, the waiting side (`griddepcontrol.wait`, sm_90): blocks
/// until every grid this one depends on programmatically (the previous kernel on the stream,
/// when this one was launched with programmatic stream serialization) has completed and its
/// memory is visible. Without such a dependency it returns at once. On PTX for older arches
/// it is nothing (and the host must not launch with the attribute: `mscclpp_host` only does
/// for PTX of sm_90 or newer). A kernel launched with the attribute calls it before it
/// touches any memory an earlier kernel may write.
#[inline(always)]
pub fn grid_dependency_wait() {
    #[cfg(target_feature = "sm_90")]
    // SAFETY: griddepcontrol.wait has no operands and no memory preconditions; it may
    // only delay this thread. It orders memory (no `nomem`), so no access moves above it.
    unsafe {
        core::arch::asm!("griddepcontrol.wait;", options(nostack))
    }
}

/// `st.shared.u64`: stores `v` at `p`, a generic address of this block's shared memory
/// (from [`shared_array!`](crate::shared_array)). An explicit shared-memory store, so that a
/// kernel launched as a dependent may fill shared memory before
/// [`grid_dependency_wait`] (the `golden_ptx` test tells it from a global store).
///
/// # Safety
/// `p` points into this block's shared memory, 8-aligned, not accessed concurrently.
#[inline(always)]
pub unsafe fn st_shared_u64(p: *mut u64, v: u64) {
    // SAFETY: caller contract: `p` is a shared-window address of this block.
    unsafe {
        asm!(
            "{{ .reg .u64 a; cvta.to.shared.u64 a, {p}; st.shared.u64 [a], {v}; }}",
            p = in(reg64) p,
            v = in(reg64) v,
            options(nostack),
        )
    }
}

/// `prefetch.global.L1`: a hint to bring the line of `p` into this SM's L1; no effect on
/// memory, never faults. Only for memory no one writes while this kernel may read it
/// through L1 (L1 is not coherent).
#[inline(always)]
pub fn prefetch_l1(p: *const u8) {
    // SAFETY: a prefetch has no architectural effect and does not fault.
    unsafe { asm!("prefetch.global.L1 [{p}];", p = in(reg64) p, options(nostack, readonly)) }
}

/// `prefetch.global.L2`: a hint to bring the line of `p` into L2 (coherent for every
/// access of this GPU); no effect on memory, never faults.
#[inline(always)]
pub fn prefetch_l2(p: *const u8) {
    // SAFETY: a prefetch has no architectural effect and does not fault.
    unsafe { asm!("prefetch.global.L2 [{p}];", p = in(reg64) p, options(nostack, readonly)) }
}

/// Programmatic dependent launch, the triggering side (`griddepcontrol.launch_dependents`,
/// sm_90): once every block of this grid has executed it (or exited), the next kernel on
/// the stream, if launched with programmatic stream serialization, may start; it still
/// waits in [`grid_dependency_wait`] for this grid's completion before it touches memory.
/// Nothing on older arches.
#[inline(always)]
pub fn launch_dependents() {
    #[cfg(target_feature = "sm_90")]
    // SAFETY: no operands, no memory effects on this grid.
    unsafe {
        core::arch::asm!("griddepcontrol.launch_dependents;", options(nostack))
    }
}

/// Aborts the kernel (`trap`); the launch fails with an error the host sees.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: trap ends the kernel; nothing after it runs.
    unsafe { nvptx::trap() }
}

/// `ld.acquire.sys.u64`: later accesses of this thread cannot move before it, and it
/// synchronises with a release (store, add or fence) at system scope that wrote the value.
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn ld_acquire_sys_u64(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!("ld.acquire.sys.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) p, options(nostack))
    };
    v
}

/// `ld.acquire.sys.u32`; see [`ld_acquire_sys_u64`].
///
/// # Safety
/// `p` must be valid and 4-byte aligned.
#[inline(always)]
pub unsafe fn ld_acquire_sys_u32(p: *const u32) -> u32 {
    let v: u32;
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!("ld.acquire.sys.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p, options(nostack))
    };
    v
}

/// `ld.relaxed.sys.u64`: a strong load that is not hoisted out of a polling loop or torn, but
/// orders nothing; pair it with a fence or an acquire before using data it guards.
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn ld_relaxed_sys_u64(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!("ld.relaxed.sys.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) p, options(nostack))
    };
    v
}

/// `st.release.sys.u64`: earlier accesses of this thread (and, cumulatively, what it has
/// observed) become visible to whoever acquires this value, on any GPU or the CPU.
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn st_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!("st.release.sys.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
}

/// `st.relaxed.sys.u64`: a single-copy atomic store with no ordering of earlier accesses
/// (for words whose writer's earlier loads have completed, such as a count of packets
/// consumed).
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn st_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!("st.relaxed.sys.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
}

/// `st.release.sys.u32`; see [`st_release_sys_u64`].
///
/// # Safety
/// `p` must be valid and 4-byte aligned.
#[inline(always)]
pub unsafe fn st_release_sys_u32(p: *mut u32, v: u32) {
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!("st.release.sys.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack))
    };
}

/// `atom.add.release.sys.u64`, returning the old value: a remote semaphore increment that
/// publishes this thread's earlier writes to whoever acquires the new value.
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn atomic_add_release_sys_u64(p: *mut u64, v: u64) -> u64 {
    let old: u64;
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!(
            "atom.add.release.sys.u64 {old}, [{p}], {v};",
            old = out(reg64) old, p = in(reg64) p, v = in(reg64) v, options(nostack)
        )
    };
    old
}

/// `atom.add.relaxed.sys.u64`, returning the old value: atomic but ordering nothing; for
/// counters whose readers do not rely on other data (or that follow an explicit fence).
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn atomic_add_relaxed_sys_u64(p: *mut u64, v: u64) -> u64 {
    let old: u64;
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!(
            "atom.add.relaxed.sys.u64 {old}, [{p}], {v};",
            old = out(reg64) old, p = in(reg64) p, v = in(reg64) v, options(nostack)
        )
    };
    old
}

/// `atom.add.relaxed.gpu.u64`, returning the old value: a counter shared by the threads of
/// one GPU only (the FIFO head lives in device memory and only GPU threads add to it).
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn atomic_add_relaxed_gpu_u64(p: *mut u64, v: u64) -> u64 {
    let old: u64;
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!(
            "atom.add.relaxed.gpu.u64 {old}, [{p}], {v};",
            old = out(reg64) old, p = in(reg64) p, v = in(reg64) v, options(nostack)
        )
    };
    old
}

/// `atom.cas.relaxed.gpu.b64`: stores `new` at `p` if it holds `cmp`; returns the old value.
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
pub unsafe fn atomic_cas_relaxed_gpu_u64(p: *mut u64, cmp: u64, new: u64) -> u64 {
    let old: u64;
    // SAFETY: caller guarantees `p` is valid and aligned.
    unsafe {
        asm!(
            "atom.cas.relaxed.gpu.b64 {old}, [{p}], {cmp}, {new};",
            old = out(reg64) old, p = in(reg64) p, cmp = in(reg64) cmp, new = in(reg64) new,
            options(nostack)
        )
    };
    old
}

/// `red.release.sys.global.add.u64`: adds `v` with release semantics and does not wait for
/// the old value. Against memory on another GPU an `atom` is a round trip over NVLink (the old
/// value must come back) while `red` is posted, so remote semaphore signals use this.
///
/// # Safety
/// `p` must be valid, 8-byte aligned global memory (local, peer-mapped or host-mapped).
#[inline(always)]
pub unsafe fn red_add_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees `p` is valid, aligned and in the global window.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; red.release.sys.global.add.u64 [g], {v}; }}",
            p = in(reg64) p, v = in(reg64) v, options(nostack)
        )
    };
}

/// `red.relaxed.sys.global.add.u64`: a posted add that orders nothing (see
/// [`red_add_release_sys_u64`]).
///
/// # Safety
/// `p` must be valid, 8-byte aligned global memory.
#[inline(always)]
pub unsafe fn red_add_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees `p` is valid, aligned and in the global window.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; red.relaxed.sys.global.add.u64 [g], {v}; }}",
            p = in(reg64) p, v = in(reg64) v, options(nostack)
        )
    };
}

/// `red.relaxed.sys.global.max.u64`: a posted maximum that orders nothing (a word that
/// only grows, written by several threads: none can lower what another wrote).
///
/// # Safety
/// `p` must be valid, 8-byte aligned global memory.
#[inline(always)]
pub unsafe fn red_max_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees `p` is valid, aligned and in the global window.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; red.relaxed.sys.global.max.u64 [g], {v}; }}",
            p = in(reg64) p, v = in(reg64) v, options(nostack)
        )
    };
}

/// `fence.acq_rel.sys`: a release fence for earlier and an acquire fence for later accesses
/// of this thread, at system scope (pairs with relaxed flag accesses on either side).
#[inline(always)]
pub fn fence_acq_rel_sys() {
    // SAFETY: a fence has no memory preconditions.
    unsafe { asm!("fence.acq_rel.sys;", options(nostack)) };
}

/// `fence.acq_rel.gpu`: [`fence_acq_rel_sys`] for accesses shared only by threads of this
/// GPU; cheaper, as it need not wait for this thread's writes to peers or the host.
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    // SAFETY: a fence has no memory preconditions.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}

/// `fence.sc.sys`: sequentially consistent fence at system scope (store→load ordering,
/// which acq_rel does not give).
#[inline(always)]
pub fn fence_sc_sys() {
    // SAFETY: a fence has no memory preconditions.
    unsafe { asm!("fence.sc.sys;", options(nostack)) };
}

/// One 16-byte `st.volatile.global.v2.u64` of `[lo, hi]`: a single store, never split by the
/// compiler, not cached in L1, so the CPU or a peer sees both words from one transaction.
/// A trigger is published with it.
///
/// # Safety
/// `p` must point to 16 valid, 16-byte aligned bytes of global memory (device, peer or
/// host-mapped).
#[inline(always)]
pub unsafe fn st_volatile_v2_u64(p: *mut u64, lo: u64, hi: u64) {
    // SAFETY: caller guarantees `p` is valid, aligned and in the global window.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; st.volatile.global.v2.u64 [g], {{{lo}, {hi}}}; }}",
            p = in(reg64) p, lo = in(reg64) lo, hi = in(reg64) hi, options(nostack)
        )
    };
}

/// One 8-byte `st.volatile.global.u64`: a single-copy atomic store (volatile has the
/// memory-model semantics of `relaxed.sys`), not cached in L1. An LL8 packet (4 data bytes
/// and the flag in one word) is published with it.
///
/// # Safety
/// `p` must point to 8 valid, 8-byte aligned bytes of global memory (device, peer or
/// host-mapped).
#[inline(always)]
pub unsafe fn st_volatile_u64(p: *mut u64, v: u64) {
    // SAFETY: caller guarantees `p` is valid, aligned and in the global window.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; st.volatile.global.u64 [g], {v}; }}",
            p = in(reg64) p, v = in(reg64) v, options(nostack)
        )
    };
}

/// One 8-byte `ld.volatile.global.u64`: read whole (single-copy atomic), never hoisted out
/// of a polling loop, ordering nothing. LL8 packets are read with it.
///
/// # Safety
/// `p` must point to 8 valid, 8-byte aligned bytes of global memory (device, peer or
/// host-mapped).
#[inline(always)]
pub unsafe fn ld_volatile_u64(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: caller guarantees `p` is valid, aligned and in the global window.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; ld.volatile.global.u64 {v}, [g]; }}",
            p = in(reg64) p, v = out(reg64) v, options(nostack)
        )
    };
    v
}

/// One 16-byte `ld.volatile.global.v2.u64`: one load of both words, not cached in L1 and
/// never merged, split or hoisted out of a polling loop by the compiler. Volatile has the
/// memory-model semantics of `relaxed.sys`, applied to each `u64` element: each word is read
/// whole (single-copy atomic at 8 bytes) but the two words are not ordered with each other
/// nor with other accesses. LL packets read their (data, flag) words with it. (ptxas also
/// accepts `ld.relaxed.sys.global.v2.u64`, with the same meaning; volatile is used to match
/// [`st_volatile_v2_u64`], as MSCCL++ does.)
///
/// # Safety
/// `p` must point to 16 valid, 16-byte aligned bytes of global memory (device, peer or
/// host-mapped).
#[inline(always)]
pub unsafe fn ld_volatile_v2_u64(p: *const u64) -> [u64; 2] {
    let (lo, hi): (u64, u64);
    // SAFETY: caller guarantees `p` is valid, aligned and in the global window.
    unsafe {
        asm!(
            "{{ .reg .u64 g; cvta.to.global.u64 g, {p}; ld.volatile.global.v2.u64 {{{lo}, {hi}}}, [g]; }}",
            p = in(reg64) p, lo = out(reg64) lo, hi = out(reg64) hi, options(nostack)
        )
    };
    [lo, hi]
}

/// One 16-byte weak load `ld.v2.u64` (generic address): plain data, cached as the hardware
/// likes. It orders nothing; data written by another thread or GPU is read with it only after
/// an acquire (a semaphore wait, then a block barrier) has made that data visible. The bulk
/// copies of memory channels use it.
///
/// # Safety
/// `p` must point to 16 valid, 16-byte aligned bytes, not written concurrently (a race is a
/// data race: undefined values on the GPU, undefined behaviour on the host).
#[inline(always)]
pub unsafe fn ld_weak_v2_u64(p: *const u64) -> [u64; 2] {
    let (lo, hi): (u64, u64);
    // SAFETY: caller guarantees `p` is valid, aligned and not written concurrently; the asm
    // only reads memory.
    unsafe {
        asm!(
            "ld.v2.u64 {{{lo}, {hi}}}, [{p}];",
            p = in(reg64) p, lo = out(reg64) lo, hi = out(reg64) hi, options(nostack, readonly)
        )
    };
    [lo, hi]
}

/// One 16-byte weak store `st.v2.u64` (generic address) of `[lo, hi]`: plain data, made
/// visible to another thread or GPU only by a later release (a block barrier, then a
/// semaphore signal). The bulk copies of memory channels use it.
///
/// # Safety
/// `p` must point to 16 valid, 16-byte aligned bytes, not accessed concurrently (a race is a
/// data race: undefined values on the GPU, undefined behaviour on the host).
#[inline(always)]
pub unsafe fn st_weak_v2_u64(p: *mut u64, lo: u64, hi: u64) {
    // SAFETY: caller guarantees `p` is valid, aligned and not accessed concurrently.
    unsafe {
        asm!(
            "st.v2.u64 [{p}], {{{lo}, {hi}}};",
            p = in(reg64) p, lo = in(reg64) lo, hi = in(reg64) hi, options(nostack)
        )
    };
}

/// `%globaltimer`: nanoseconds of a global clock (resolution about 1 µs on most GPUs), for
/// timeouts in spin loops.
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    // SAFETY: reading a special register has no preconditions.
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack)) };
    t
}

/// Whether kernels may run on blocks of fewer threads than ranks: not on a GPU, whose
/// launches always give a block at least `nranks` threads (see the host's twin).
pub const NARROW_BLOCKS: bool = false;

/// Called once per round of a polling loop (the host version yields the CPU). Nothing on
/// the GPU: the FIFO's loops already wait on a PCIe read of host memory each round, and
/// threads of a warp that diverge keep making progress (independent thread scheduling,
/// sm_70 and later).
#[inline(always)]
pub fn spin_backoff(round: u32) {
    let _ = round;
}

/// Adds two pairs of IEEE half floats lane by lane (`add.rn.f16x2`: round to nearest even,
/// subnormals kept). Each `u32` holds two f16 bit patterns, lane 0 in the low half.
#[inline(always)]
pub fn add_f16x2(a: u32, b: u32) -> u32 {
    let d: u32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("add.rn.f16x2 {d}, {a}, {b};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack))
    };
    d
}

/// Adds two pairs of bfloat16 lane by lane, rounding to nearest even. Written as
/// `fma.rn.bf16x2 d, a, 1.0, b` (one rounding, so equal to a correctly rounded add), which
/// sm_80 has; the plain `add.bf16x2` needs sm_90.
#[inline(always)]
pub fn add_bf16x2(a: u32, b: u32) -> u32 {
    let d: u32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("fma.rn.bf16x2 {d}, {a}, {one}, {b};", d = out(reg32) d, a = in(reg32) a,
             one = in(reg32) 0x3f80_3f80u32, b = in(reg32) b, options(pure, nomem, nostack))
    };
    d
}

/// Multiplies two pairs of IEEE half floats lane by lane (`mul.rn.f16x2`: round to nearest
/// even). Each `u32` holds two f16 bit patterns, lane 0 in the low half.
#[inline(always)]
pub fn mul_f16x2(a: u32, b: u32) -> u32 {
    let d: u32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("mul.rn.f16x2 {d}, {a}, {b};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack))
    };
    d
}

/// An IEEE half float's bits to f32 (`cvt.f32.f16`, exact).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let f: f32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.f32.f16 {f}, {h};", f = out(reg32) f, h = in(reg16) h,
             options(pure, nomem, nostack))
    };
    f
}

/// f32 to IEEE half float bits, rounded to nearest even (`cvt.rn.f16.f32`).
#[inline(always)]
pub fn f32_to_f16(f: f32) -> u16 {
    let h: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16.f32 {h}, {f};", h = out(reg16) h, f = in(reg32) f,
             options(pure, nomem, nostack))
    };
    h
}
