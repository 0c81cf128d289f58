//! All-to-all: block `p` of rank `r`'s `send` (`bytes` bytes each, `nranks` blocks) lands
//! in block `r` of rank `p`'s `recv`. See the [parent module](super).

use super::all_reduce::{check_grid, load_unit, store_unit};
use super::reduce_scatter::rank_slot;
use super::{CollContext, ll, rotated_rank, round_share};
use crate::arch;
use crate::channel::memory::copy;

/// LL all-to-all of `bytes` per block: unit `i` of block `p` goes to rank `p` as a packet;
/// received units land in block `q` of `recv`. Unit `i` of every block belongs to one
/// thread, which sends all of them before writing any, so in place (`send == recv`) is
/// safe.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; grid ≤ `MAX_BLOCKS` blocks;
/// the context valid with `bytes <= one_shot_max_bytes(packets_len)`; `send` and `recv`
/// valid for `nranks * bytes` (equal or disjoint); every rank calls it with the same
/// `bytes` and grid.
#[inline(always)]
pub unsafe fn ll(ctx: &CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
    let (n, r) = (ctx.nranks, ctx.rank);
    let units = bytes.div_ceil(8);
    // SAFETY: every thread, first.
    let mut call = unsafe { ll::begin(ctx, units, bytes, tag) };
    let aligned = (send as usize | recv as usize).is_multiple_of(8) && bytes.is_multiple_of(8);
    let at = |q: u32| (q as u64 * bytes) as usize;
    let (first, stride) = ll::lanes();
    let mut i = first;
    while i < units {
        for k in 0..n {
            let p = rotated_rank(r, n, i as u32, k);
            if p != r {
                // SAFETY: block p of send holds `bytes`; i < units; p a peer.
                unsafe {
                    ll::put(
                        ctx,
                        &call,
                        p,
                        i,
                        load_unit(send.add(at(p)), i, bytes, aligned),
                    )
                };
            }
        }
        i += stride;
    }
    // SAFETY: after this thread's puts.
    unsafe { ll::sent(ctx, &call) };
    let mut i = first;
    while i < units {
        for q in 0..n {
            // SAFETY: block q of recv (and send) holds `bytes`; unit i of every block is this
            // thread's alone, and it sent its units of send above.
            unsafe {
                if q != r {
                    let d = ll::get(ctx, &mut call, q, i);
                    store_unit(recv.add(at(q)), i, bytes, d, aligned);
                } else if !core::ptr::eq(send, recv) {
                    let d = load_unit(send.add(at(r)), i, bytes, aligned);
                    store_unit(recv.add(at(r)), i, bytes, d, aligned);
                }
            }
        }
        i += stride;
    }
    // SAFETY: every thread, last.
    unsafe { ll::end(ctx, &mut call) };
}

/// All-to-all of `bytes` per block through the scratch (one slot per source rank,
/// [`rank_slot`]): in rounds, each block owning one fixed share of the slot, a rank puts the
/// share of its block `p` into slot `rank` of rank `p`'s scratch (and copies its own block
/// locally); barrier; copies every peer's slot share into its block of `recv`; barrier. In
/// place allowed (a round writes `recv` only after its puts read `send`).
///
/// # Safety
/// As for [`ll()`], with grid blocks of at least `nranks` threads and any `bytes`.
#[inline(always)]
pub unsafe fn put(ctx: &CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let (n, r) = (ctx.nranks, ctx.rank);
    check_grid(ctx, nb, nt);
    let slot = rank_slot(ctx.scratch_len, n as u64);
    let rounds = if slot == 0 { 0 } else { bytes.div_ceil(slot) };
    // SAFETY: b < MAX_BLOCKS (check_grid); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, bytes, tag) };
    // SAFETY: every thread of every block. The first barrier checks the peers'
    // descriptors; on a mismatch (or failure) nothing after it touches shared state.
    unsafe { ctx.begin_deferred(&mut call, b, t) };
    for j in 0..rounds {
        let (s, e) = round_share(slot, bytes, j, 16, b as u64, nb as u64);
        let off = j * slot + s;
        let at = |q: u32| (q as u64 * bytes + off) as usize;
        // SAFETY: slot r of each peer's scratch holds the share; send/recv hold the blocks;
        // the peers read the previous round's share before their last barrier.
        unsafe {
            for k in 0..n {
                let p = rotated_rank(r, n, b, k);
                if p != r {
                    let dst = ctx.peer_scratch[p as usize].add((r as u64 * slot + s) as usize);
                    copy(dst, send.add(at(p)), e - s, t, nt);
                }
            }
            if !core::ptr::eq(send, recv) {
                copy(recv.add(at(r)), send.add(at(r)), e - s, t, nt);
            }
        }
        // SAFETY: every thread of the block; b < MAX_BLOCKS.
        if !unsafe { ctx.barrier(&mut call, b, t) } {
            break;
        }
        for q in 0..n {
            if q != r {
                // SAFETY: the peer's share, published by the barrier; recv holds block q.
                unsafe {
                    let src = ctx.scratch.add((q as u64 * slot + s) as usize);
                    copy(recv.add(at(q)), src, e - s, t, nt);
                }
            }
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
