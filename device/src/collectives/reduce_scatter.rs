//! Reduce-scatter: rank `r` gets the reduction (`op`) over the ranks of block `r` of their inputs
//! (`send` holds `nranks` blocks of `count` elements, `recv` one). See the
//! [parent module](super) for the shared state.

use super::all_reduce::{check_grid, load_unit, store_unit};
use super::{CollContext, MAX_RANKS, Reduce, ll, rotated_rank, round_share};
use crate::arch;
use crate::channel::memory::copy;

/// Bytes of each source rank's slot when the scratch region of `scratch_len` bytes is cut
/// into one slot per rank (reduce-scatter, all-to-all and reduce; a multiple of 16).
#[inline(always)]
pub fn rank_slot(scratch_len: u64, nranks: u64) -> u64 {
    scratch_len / nranks / 16 * 16
}

/// LL reduce-scatter of `count` elements per rank: unit `i` (8 bytes) of block `p` of the
/// input goes to rank `p` as a packet, and rank `r` sums unit `i` of block `r` over the ranks
/// in rank order. No barrier (see [`super::ll`]). Unit `i` of every block belongs to one thread, so
/// in place (`recv == send + rank * count` elements) is safe.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; grid ≤ `MAX_BLOCKS` blocks;
/// the context valid with `count * T::SIZE <= one_shot_max_bytes(packets_len)`; `send`
/// valid for `nranks * count` elements, `recv` for `count`, aligned to `T::SIZE`; every rank
/// calls it with the same `count` and grid.
#[inline(always)]
pub unsafe fn ll<T: Reduce>(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    count: u64,
    tag: u64,
    op: u32,
) {
    let (n, r) = (ctx.nranks, ctx.rank);
    let bytes = count * T::SIZE;
    let units = bytes.div_ceil(8);
    // SAFETY: every thread, first.
    let mut call = unsafe { ll::begin(ctx, units, count, tag) };
    let aligned = (send as usize | recv as usize).is_multiple_of(8) && bytes.is_multiple_of(8);
    let (first, stride) = ll::lanes();
    let block = |q: u32| send.wrapping_add((q as u64 * bytes) as usize);
    let mut i = first;
    while i < units {
        for k in 0..n {
            let p = rotated_rank(r, n, i as u32, k);
            if p != r {
                // SAFETY: block p of send holds `bytes`; i < units; p a peer.
                unsafe { ll::put(ctx, &call, p, i, load_unit(block(p), i, bytes, aligned)) };
            }
        }
        i += stride;
    }
    // SAFETY: after this thread's puts.
    unsafe { ll::sent(ctx, &call) };
    let mut i = first;
    while i < units {
        let mut acc = 0u64;
        for q in 0..n {
            let v = if q == r {
                // SAFETY: as above; in place, recv unit i (= this unit) is written below.
                unsafe { load_unit(block(r), i, bytes, aligned) }
            } else {
                // SAFETY: q a peer, i < units.
                unsafe { ll::get(ctx, &mut call, q, i) }
            };
            acc = if q == 0 { v } else { T::op8(op, acc, v) };
        }
        let acc = T::finish8(op, acc, n);
        // SAFETY: recv holds `bytes`; unit i is this thread's alone.
        unsafe { store_unit(recv, i, bytes, acc, aligned) };
        i += stride;
    }
    // SAFETY: every thread, last.
    unsafe { ll::end(ctx, &mut call) };
}

/// Reduce-scatter of `count` elements per rank through the scratch: each rank's region is
/// cut into one slot per source rank ([`rank_slot`]); in rounds of one slot, each block
/// owning one fixed share of it, a rank puts the block's share of its input block `p` into
/// slot `rank` of rank `p`'s scratch; barrier; sums the share of its own block (own input
/// and the peers' slots, in rank order) into `recv`; barrier (the slots may be written
/// again). The last barrier leaves no peer touching this rank's scratch. In place allowed.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; grid ≤ `MAX_BLOCKS` blocks of
/// at least `nranks` threads; the context valid; `send` valid for `nranks * count`
/// elements, `recv` for `count`, aligned to `T::SIZE`; every rank calls it with the same
/// `count` and grid.
#[inline(always)]
pub unsafe fn put<T: Reduce>(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    count: u64,
    tag: u64,
    op: u32,
) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let (n, r) = (ctx.nranks, ctx.rank);
    check_grid(ctx, nb, nt);
    let es = T::SIZE;
    let slot_bytes = rank_slot(ctx.scratch_len, n as u64);
    let slot = slot_bytes / es;
    let rounds = if slot == 0 { 0 } else { count.div_ceil(slot) };
    // SAFETY: b < MAX_BLOCKS (check_grid); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, count, tag) };
    // SAFETY: every thread of every block. The first barrier checks the peers'
    // descriptors; on a mismatch (or failure) nothing after it touches shared state.
    unsafe { ctx.begin_deferred(&mut call, b, t) };
    for j in 0..rounds {
        let (s, e) = round_share(slot, count, j, 16 / es, b as u64, nb as u64);
        let off = j * slot + s;
        for k in 0..n {
            let p = rotated_rank(r, n, b, k);
            if p != r {
                // SAFETY: slot r of rank p's scratch holds slot_bytes >= (e - s) * es from
                // s * es; block p of send holds elements off..off + (e - s); no peer reads
                // it now (the previous round's last barrier).
                unsafe {
                    let dst =
                        ctx.peer_scratch[p as usize].add((r as u64 * slot_bytes + s * es) as usize);
                    let src = send.add(((p as u64 * count + off) * es) as usize);
                    copy(dst, src, (e - s) * es, t, nt);
                }
            }
        }
        // SAFETY: every thread of the block; b < MAX_BLOCKS.
        if !unsafe { ctx.barrier(&mut call, b, t) } {
            break;
        }
        let mut srcs = [core::ptr::null::<u8>(); MAX_RANKS];
        for (q, src) in srcs.iter_mut().enumerate().take(n as usize) {
            *src = if q as u32 == r {
                send.wrapping_add(((r as u64 * count + off) * es) as usize)
            } else {
                ctx.scratch
                    .wrapping_add((q as u64 * slot_bytes + s * es) as usize)
                    as *const u8
            };
        }
        // SAFETY: the peers' shares were published by the barrier; recv holds the elements;
        // in place, each element is read before this thread writes it.
        unsafe {
            T::reduce_out(
                &srcs[..n as usize],
                recv.add((off * es) as usize),
                core::ptr::null_mut(),
                e - s,
                t,
                op,
            );
        }
        // SAFETY: every thread of the block.
        if !unsafe { ctx.barrier(&mut call, b, t) } {
            break;
        }
    }
    // SAFETY: every thread of every block (no round: the descriptors are still to be
    // checked).
    unsafe {
        ctx.check_pending(&mut call, t);
        ctx.finish(&call);
    }
}
