//! The collectives over proxy channels ([`DevConn`](crate::channel::DevConn)): GPU threads stage data in the scratch
//! and queue puts; the proxy moves it with the copy engine (P2P), RDMA (IB) or memcpy
//! (Host) into the peers' scratch; the flag lands after the data. For peers whose memory
//! this GPU cannot map (no peer access, another machine), where memory channels do not work.
//!
//! One block drives a call (the grid must be one block of at least `nranks` threads): the
//! copy engine moves the bytes, the block only stages and reduces. The scratch holds a
//! staging slot then one receive slot per rank (`proxy_slot` bytes each); per round:
//!
//! 1. the block copies its part of the input into the staging slot; barrier;
//! 2. thread `p` puts the staging slot into rank `p`'s receive slot for this rank, signals
//!    (returns once the proxy has copied it, so the staging slot is free again) and waits
//!    for rank `p`'s data in its own receive slot `p`; barrier;
//! 3. all-reduce: the block sums in rank order into `recv`; all-gather: it copies each
//!    receive slot to its place in `recv`; barrier;
//! 4. thread `p` signals rank `p` that its receive slot is read and waits for the same
//!    (so the next round may overwrite them); barrier.

use super::all_reduce::reduce_sources;
use super::{Call, CollContext, MAX_RANKS, Reduce, fault};
use crate::arch;
use crate::channel::memory::copy;

/// Bytes of the staging slot and of each receive slot in a scratch of `scratch_len` bytes
/// for `nranks` ranks (a multiple of 16).
#[inline(always)]
pub fn proxy_slot(scratch_len: u64, nranks: u64) -> u64 {
    (scratch_len / (nranks + 1)) / 16 * 16
}

/// Traps unless the grid is one block of at least `nranks` threads and the proxy channels
/// exist (or there are no peers).
#[inline(always)]
fn check(ctx: &CollContext) {
    if arch::grid_dim_x() != 1
        || arch::block_dim_x() < ctx.nranks
        || (ctx.nranks > 1 && ctx.conns.is_null())
    {
        arch::trap();
    }
}

/// How long one `DevConn::wait_timeout` of [`exchange`] waits before the fault area is
/// looked at again.
const WAIT_SLICE_NS: u64 = 200_000;

/// Steps 2 and 4 of a round for thread `t`: with `len > 0`, put the staging slot into the
/// peer's receive slot for this rank and signal; without, signal only; then wait for the
/// peer's signal, in slices between which the abort word, the call's stop word and the
/// clock are looked at ([`CollContext::keep_waiting`]). Block barriers around it; `false`
/// on every thread when a wait of the block gave up (nothing more is signalled then).
///
/// # Safety
/// Every thread of the block; the context valid with proxy channels; `len <= slot`.
#[inline(always)]
unsafe fn exchange(ctx: &CollContext, call: &mut Call, slot: u64, len: u64, t: u32) -> bool {
    arch::sync_threads();
    if t < ctx.nranks && t != ctx.rank && !call.failed {
        // SAFETY: conns holds nranks handles (context contract).
        let c = unsafe { &*ctx.conns.add(t as usize) };
        if len > 0 {
            c.put_with_signal((1 + ctx.rank as u64) * slot, 0, len);
        } else {
            c.signal();
        }
        let mut start = None;
        while !c.wait_timeout(WAIT_SLICE_NS) {
            let t0 = *start.get_or_insert_with(arch::global_timer_ns);
            // SAFETY: the context valid.
            if !unsafe { ctx.keep_waiting(*call, t, fault::AT_PROXY, t0) } {
                call.failed = true;
                break;
            }
        }
    }
    ctx.block_agree(call, t)
}

/// All-reduce (`op`) of `count` elements of `T` over proxy channels; in place allowed.
///
/// # Safety
/// One block of at least `nranks` threads, every thread with the same arguments; the
/// context valid with proxy channels; `send`/`recv` valid for `count` elements aligned to
/// `T::SIZE`; every rank calls it with the same `count`.
#[inline(always)]
pub unsafe fn all_reduce<T: Reduce, const OUT: bool>(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    count: u64,
    tag: u64,
    op: u32,
) {
    check(ctx);
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (n, r) = (ctx.nranks, ctx.rank);
    let slot = proxy_slot(ctx.scratch_len, n as u64);
    let bytes = count * T::SIZE;
    let rounds = if slot == 0 { 0 } else { bytes.div_ceil(slot) };
    // SAFETY: one block (check); finish() below on every thread.
    let mut call = unsafe { ctx.call(0, count, tag) };
    // SAFETY: every thread of the block; block-uniform (see `CollContext::begin`).
    let go = unsafe { ctx.begin(&mut call, 0, t) };
    for j in 0..if go { rounds } else { 0 } {
        let off = j * slot;
        let len = slot.min(bytes - off);
        // SAFETY: the staging slot holds slot >= len bytes; send holds off + len.
        if !unsafe {
            copy(ctx.scratch, send.add(off as usize), len, t, nt);
            exchange(ctx, &mut call, slot, len, t)
        } {
            break;
        }
        let mut srcs = [core::ptr::null::<u8>(); MAX_RANKS];
        for (q, s) in srcs.iter_mut().enumerate().take(n as usize) {
            *s = if q as u32 == r {
                send.wrapping_add(off as usize)
            } else {
                ctx.scratch.wrapping_add(((1 + q as u64) * slot) as usize)
            };
        }
        // SAFETY: every source holds len bytes (receive slots published by the waits and
        // the barrier); recv holds off + len; no second output.
        unsafe {
            let (out, len) = (recv.add(off as usize), len / T::SIZE);
            if OUT {
                T::reduce_out(&srcs[..n as usize], out, core::ptr::null_mut(), len, t, op);
            } else {
                reduce_sources::<T>(&srcs[..n as usize], out, core::ptr::null_mut(), len, t, op);
            }
            if !exchange(ctx, &mut call, slot, 0, t) {
                break;
            }
        }
    }
    // SAFETY: every thread of the block.
    unsafe { ctx.finish(&call) };
}

/// All-gather of `bytes` per rank over proxy channels (rank `q`'s `send` lands at
/// `recv + q * bytes`); in place allowed.
///
/// # Safety
/// As for [`all_reduce`], with `recv` valid for `nranks * bytes`.
#[inline(always)]
pub unsafe fn all_gather(ctx: &CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
    check(ctx);
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (n, r) = (ctx.nranks, ctx.rank);
    let slot = proxy_slot(ctx.scratch_len, n as u64);
    let rounds = if slot == 0 { 0 } else { bytes.div_ceil(slot) };
    // SAFETY: one block (check); finish() below on every thread.
    let mut call = unsafe { ctx.call(0, bytes, tag) };
    // SAFETY: every thread of the block; block-uniform (see `CollContext::begin`).
    let go = unsafe { ctx.begin(&mut call, 0, t) };
    for j in 0..if go { rounds } else { 0 } {
        let off = j * slot;
        let len = slot.min(bytes - off);
        // SAFETY: as in all_reduce; the own part of recv holds off + len.
        unsafe {
            let src = send.add(off as usize);
            copy(ctx.scratch, src, len, t, nt);
            let own = recv.add((r as u64 * bytes + off) as usize);
            if !core::ptr::eq(own as *const u8, src) {
                copy(own, src, len, t, nt);
            }
        }
        // SAFETY: every thread of the block.
        if !unsafe { exchange(ctx, &mut call, slot, len, t) } {
            break;
        }
        for q in 0..n {
            if q != r {
                // SAFETY: receive slot q (published by the wait and the barrier) into
                // rank q's part of recv.
                unsafe {
                    let from = ctx.scratch.add(((1 + q as u64) * slot) as usize);
                    copy(
                        recv.add((q as u64 * bytes + off) as usize),
                        from,
                        len,
                        t,
                        nt,
                    );
                }
            }
        }
        // SAFETY: every thread of the block.
        if !unsafe { exchange(ctx, &mut call, slot, 0, t) } {
            break;
        }
    }
    // SAFETY: every thread of the block.
    unsafe { ctx.finish(&call) };
}
