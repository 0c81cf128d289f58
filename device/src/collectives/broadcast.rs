//! Broadcast from a root: every rank's `recv` gets the root's `send` (`bytes` bytes; the
//! root's `send` may equal its `recv`, other ranks' `send` is not read). See the
//! [parent module](super).

use super::all_reduce::{check_grid, load_unit, store_unit};
use super::{CollContext, ll, rotated_rank, round_share};
use crate::arch;
use crate::channel::memory::copy;

/// LL broadcast of `bytes` from `root`: the root writes unit `i` as a packet into every
/// peer's packet scratch, the peers poll it into `recv`. No barrier (see
/// [`super::ll`]).
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; grid ≤ `MAX_BLOCKS` blocks of
/// at least `nranks` threads; the context valid with `bytes <=
/// one_shot_max_bytes(packets_len)`; `root < nranks`; `recv` valid for `bytes`, and `send`
/// on the root; every rank calls it with the same `bytes`, root and grid.
#[inline(always)]
pub unsafe fn ll(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    bytes: u64,
    tag: u64,
    root: u32,
) {
    let (n, r) = (ctx.nranks, ctx.rank);
    let units = bytes.div_ceil(8);
    // SAFETY: every thread, first.
    let mut call = unsafe { ll::begin(ctx, units, bytes, tag) };
    let (first, stride) = ll::lanes();
    if r == root {
        let aligned = (send as usize | recv as usize).is_multiple_of(8);
        let mut i = first;
        while i < units {
            // SAFETY: send and recv hold `bytes`, i < units; unit i is this thread's.
            unsafe {
                let d = load_unit(send, i, bytes, aligned);
                for k in 0..n {
                    let p = rotated_rank(r, n, i as u32, k);
                    if p != r {
                        ll::put(ctx, &call, p, i, d);
                    }
                }
                if !core::ptr::eq(send, recv) {
                    store_unit(recv, i, bytes, d, aligned);
                }
            }
            i += stride;
        }
    }
    // SAFETY: after this thread's puts.
    unsafe { ll::sent(ctx, &call) };
    if r != root {
        let aligned = (recv as usize).is_multiple_of(8);
        let mut i = first;
        while i < units {
            // SAFETY: recv holds `bytes`, i < units; unit i is this thread's; root a peer.
            unsafe {
                let d = ll::get(ctx, &mut call, root, i);
                store_unit(recv, i, bytes, d, aligned);
            }
            i += stride;
        }
    }
    // SAFETY: every thread, last.
    unsafe { ll::end(ctx, &mut call) };
}

/// Broadcast of `bytes` from `root` through the peers' scratch (the whole region as one
/// slot): in rounds, each block owning one fixed share of the slot, the root puts the share
/// into every peer's scratch (and copies it to its own `recv` unless in place); barrier;
/// the peers copy it into `recv`; barrier.
///
/// # Safety
/// As for [`ll()`], with any `bytes`.
#[inline(always)]
pub unsafe fn put(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    bytes: u64,
    tag: u64,
    root: u32,
) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let (n, r) = (ctx.nranks, ctx.rank);
    check_grid(ctx, nb, nt);
    let slot = ctx.scratch_len / 16 * 16;
    let rounds = if slot == 0 { 0 } else { bytes.div_ceil(slot) };
    // SAFETY: b < MAX_BLOCKS (check_grid); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, bytes, tag) };
    // SAFETY: every thread of every block. The first barrier checks the peers'
    // descriptors; on a mismatch (or failure) nothing after it touches shared state.
    unsafe { ctx.begin_deferred(&mut call, b, t) };
    for j in 0..rounds {
        let (s, e) = round_share(slot, bytes, j, 16, b as u64, nb as u64);
        let off = j * slot + s;
        if r == root {
            // SAFETY: the share lies in every peer's region and in send/recv; the peers
            // copied the previous round out before their last barrier.
            unsafe {
                let src = send.add(off as usize);
                for k in 0..n {
                    let p = rotated_rank(r, n, b, k);
                    if p != r {
                        copy(
                            ctx.peer_scratch[p as usize].add(s as usize),
                            src,
                            e - s,
                            t,
                            nt,
                        );
                    }
                }
                if !core::ptr::eq(send, recv) {
                    copy(recv.add(off as usize), src, e - s, t, nt);
                }
            }
        }
        // SAFETY: every thread of the block; b < MAX_BLOCKS.
        if !unsafe { ctx.barrier(&mut call, b, t) } {
            break;
        }
        if r != root {
            // SAFETY: the root's share, published by the barrier; recv holds it.
            unsafe {
                copy(
                    recv.add(off as usize),
                    ctx.scratch.add(s as usize),
                    e - s,
                    t,
                    nt,
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

/// Pipelined broadcast of `bytes` from `root` through the scratch (the whole region as one
/// slot), with no barrier per round (see [`super::pipe`]): the ranks form a chain in rank
/// order from the root (`root`, `root + 1`, … mod `nranks`); each piece goes from the root
/// into the next rank's scratch, and each rank copies it out into `recv` and on into the next
/// rank's scratch, while its upstream writes the following pieces. Every link carries the
/// data once (the root sends `bytes`, not `nranks - 1` times them); with two ranks it is
/// the root writing into the peer's scratch while the peer copies the previous piece out.
/// The piece size and depth come from the tag ([`desc::piece`](super::desc::piece),
/// [`desc::depth`](super::desc::depth)); traps unless they fit the grid's chunks.
///
/// # Safety
/// As for [`put`].
#[inline(always)]
pub unsafe fn pipelined(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    bytes: u64,
    tag: u64,
    root: u32,
) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let (n, r) = (ctx.nranks, ctx.rank);
    check_grid(ctx, nb, nt);
    let slot = ctx.scratch_len / 16 * 16;
    let (piece, depth) = (super::desc::piece(tag), super::desc::depth(tag));
    if !super::pipe::pipe_fits(slot, nb, depth, piece) {
        arch::trap();
    }
    // SAFETY: b < MAX_BLOCKS (check_grid); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, bytes, tag) };
    // SAFETY: every thread of every block; the stage checks the descriptors before it
    // signals or waits.
    unsafe { ctx.begin_deferred(&mut call, b, t) };
    let pos = (r + n - root) % n;
    let (prev, next) = ((r + n - 1) % n, (r + 1) % n);
    let ups = if pos > 0 { 1 << prev } else { 0 };
    let downs = if pos + 1 < n { 1 << next } else { 0 };
    let down_scratch = ctx.peer_scratch[next as usize & (super::MAX_RANKS - 1)];
    // SAFETY: every thread; the chain's stages agree (same tag, bytes and grid everywhere);
    // the work touches piece `off..off + len` of send/recv and sub-slot `sub`.
    unsafe {
        super::pipe::run(
            ctx,
            &mut call,
            slot,
            bytes,
            piece,
            depth,
            ups,
            downs,
            |off, len, sub| {
                // The piece: the root's input, else what the upstream rank wrote here.
                let src = if pos == 0 {
                    send.add(off as usize)
                } else {
                    ctx.scratch.add(sub as usize) as *const u8
                };
                if downs != 0 {
                    // The next rank's sub-slot is free (acknowledged, or never used).
                    copy(down_scratch.add(sub as usize), src, len, t, nt);
                }
                let out = recv.add(off as usize);
                if !core::ptr::eq(out as *const u8, src) {
                    copy(out, src, len, t, nt);
                }
            },
        )
    };
    if n > 2 {
        // SAFETY: every thread of the block; no peer writes this rank's scratch in its next
        // call before every rank has copied its pieces out.
        unsafe { ctx.barrier(&mut call, b, t) };
    }
    // SAFETY: every thread of every block (a block with no piece still checks).
    unsafe {
        ctx.check_pending(&mut call, t);
        ctx.finish(&call);
    }
}
