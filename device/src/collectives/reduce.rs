//! Reduce to a root: the root's `recv` gets the reduction (`op`) over the ranks of their `send`
//! (`count` elements); other ranks' `recv` is not touched. See the [parent module](super).

use super::all_reduce::{check_grid, load_unit, store_unit};
use super::reduce_scatter::rank_slot;
use super::{CollContext, MAX_RANKS, Reduce, ll, round_share};
use crate::arch;
use crate::channel::memory::copy;

/// LL reduce of `count` elements to `root`: the other ranks write their input as packets
/// into the root's packet scratch; the root sums unit `i` in rank order. No barrier (see
/// [`super::ll`]). In place (`send == recv` on the root) allowed.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; grid ≤ `MAX_BLOCKS` blocks of
/// at least `nranks` threads; the context valid with `count * T::SIZE <=
/// one_shot_max_bytes(packets_len)`; `root < nranks`; `send` valid for `count` elements,
/// `recv` too on the root, aligned to `T::SIZE`; every rank calls it with the same `count`,
/// root and grid.
#[inline(always)]
pub unsafe fn ll<T: Reduce>(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    count: u64,
    tag: u64,
    root: u32,
    op: u32,
) {
    let (n, r) = (ctx.nranks, ctx.rank);
    let bytes = count * T::SIZE;
    let units = bytes.div_ceil(8);
    // SAFETY: every thread, first.
    let mut call = unsafe { ll::begin(ctx, units, count, tag) };
    let aligned = (send as usize | recv as usize).is_multiple_of(8);
    let (first, stride) = ll::lanes();
    if r != root {
        let mut i = first;
        while i < units {
            // SAFETY: send holds `bytes`, i < units; root a peer.
            unsafe { ll::put(ctx, &call, root, i, load_unit(send, i, bytes, aligned)) };
            i += stride;
        }
    }
    // SAFETY: after this thread's puts.
    unsafe { ll::sent(ctx, &call) };
    let mut i = if r == root { first } else { units };
    while i < units {
        // SAFETY: send holds `bytes`, i < units; every q != r a peer.
        unsafe {
            let own = load_unit(send, i, bytes, aligned);
            let mut acc = 0u64;
            for q in 0..n {
                let v = if q == r {
                    own
                } else {
                    ll::get(ctx, &mut call, q, i)
                };
                acc = if q == 0 { v } else { T::op8(op, acc, v) };
            }
            let acc = T::finish8(op, acc, n);
            store_unit(recv, i, bytes, acc, aligned);
        }
        i += stride;
    }
    // SAFETY: every thread, last.
    unsafe { ll::end(ctx, &mut call) };
}

/// Reduce of `count` elements to `root` through the root's scratch (one slot per source
/// rank, [`rank_slot`]): in rounds, each block's share is put by every other rank into slot
/// `rank` of the root's scratch; barrier; the root sums the share in rank order into `recv`;
/// barrier. In place allowed.
///
/// # Safety
/// As for [`ll()`], with grid blocks of at least `nranks` threads and any `count`.
#[inline(always)]
pub unsafe fn put<T: Reduce>(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    count: u64,
    tag: u64,
    root: u32,
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
        if r != root {
            // SAFETY: slot r of the root's scratch holds the share; send the elements; the
            // root read the previous round's share before its last barrier.
            unsafe {
                let dst = ctx.peer_scratch[root as usize & (MAX_RANKS - 1)]
                    .add((r as u64 * slot_bytes + s * es) as usize);
                copy(dst, send.add((off * es) as usize), (e - s) * es, t, nt);
            }
        }
        // SAFETY: every thread of the block; b < MAX_BLOCKS.
        if !unsafe { ctx.barrier(&mut call, b, t) } {
            break;
        }
        if r == root {
            let mut srcs = [core::ptr::null::<u8>(); MAX_RANKS];
            for (q, src) in srcs.iter_mut().enumerate().take(n as usize) {
                *src = if q as u32 == r {
                    send.wrapping_add((off * es) as usize)
                } else {
                    ctx.scratch
                        .wrapping_add((q as u64 * slot_bytes + s * es) as usize)
                        as *const u8
                };
            }
            // SAFETY: the peers' shares were published by the barrier; recv holds the
            // elements; in place, each element is read before this thread writes it.
            unsafe {
                T::reduce_out(
                    &srcs[..n as usize],
                    recv.add((off * es) as usize),
                    core::ptr::null_mut(),
                    e - s,
                    t,
                    op,
                )
            };
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

/// Pipelined reduce of `count` elements to `root` through the root's scratch (one slot per
/// source rank, [`rank_slot`]), with no barrier per round (see [`super::pipe`]): every other
/// rank writes its pieces into its slot of the root's scratch and the root, as soon as piece
/// `k` has arrived from every rank, reduces it in rank order into `recv` (the same
/// reduction as [`put`], so bit-identical results) while the ranks write piece `k + 1`. The
/// root's link carries `nranks - 1` inputs (the bandwidth-optimal shape for two ranks; for
/// more, a chain in rank order would carry each link once). In place allowed. The piece size
/// and depth come from the tag ([`desc::piece`](super::desc::piece),
/// [`desc::depth`](super::desc::depth)); traps unless they fit the grid's chunks.
///
/// # Safety
/// As for [`put`].
#[inline(always)]
pub unsafe fn pipelined<T: Reduce>(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    count: u64,
    tag: u64,
    root: u32,
    op: u32,
) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let (n, r) = (ctx.nranks, ctx.rank);
    check_grid(ctx, nb, nt);
    let es = T::SIZE;
    let slot_bytes = rank_slot(ctx.scratch_len, n as u64);
    let (piece, depth) = (super::desc::piece(tag), super::desc::depth(tag));
    // Pieces are multiples of 16 bytes: whole elements.
    if !super::pipe::pipe_fits(slot_bytes, nb, depth, piece) || !piece.is_multiple_of(es) {
        arch::trap();
    }
    // SAFETY: b < MAX_BLOCKS (check_grid); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, count, tag) };
    // SAFETY: every thread of every block; the stage checks the descriptors before it
    // signals or waits.
    unsafe { ctx.begin_deferred(&mut call, b, t) };
    let others = ((1u32 << n) - 1) & !(1 << r);
    let (ups, downs) = if r == root {
        (others, 0)
    } else {
        (0, 1 << root)
    };
    let root_scratch = ctx.peer_scratch[root as usize & (MAX_RANKS - 1)];
    // SAFETY: every thread; the stages agree (same tag, count and grid everywhere); the work
    // touches piece `off..off + len` of send/recv and sub-slot `sub` of slots.
    unsafe {
        super::pipe::run(
            ctx,
            &mut call,
            slot_bytes,
            count * es,
            piece,
            depth,
            ups,
            downs,
            |off, len, sub| {
                if r != root {
                    // Slot `r` of the root's scratch; the sub-slot is free.
                    let dst = root_scratch.add((r as u64 * slot_bytes + sub) as usize);
                    copy(dst, send.add(off as usize), len, t, nt);
                } else {
                    let mut srcs = [core::ptr::null::<u8>(); MAX_RANKS];
                    for (q, src) in srcs.iter_mut().enumerate().take(n as usize) {
                        *src = if q as u32 == r {
                            send.wrapping_add(off as usize)
                        } else {
                            ctx.scratch
                                .wrapping_add((q as u64 * slot_bytes + sub) as usize)
                                as *const u8
                        };
                    }
                    // Every rank's piece has landed (waited for); in place, each element is
                    // read before this thread writes it.
                    T::reduce_out(
                        &srcs[..n as usize],
                        recv.add(off as usize),
                        core::ptr::null_mut(),
                        len / es,
                        t,
                        op,
                    );
                }
            },
        )
    };
    if n > 2 {
        // SAFETY: every thread of the block; no rank writes the root's scratch in its next
        // call before the root has reduced every rank's pieces.
        unsafe { ctx.barrier(&mut call, b, t) };
    }
    // SAFETY: every thread of every block (a block with no piece still checks).
    unsafe {
        ctx.check_pending(&mut call, t);
        ctx.finish(&call);
    }
}
