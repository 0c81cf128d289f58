//! Transfers through the p2p scratch, piece by piece: the sender copies a piece into the
//! receiver's slot and signals it, the receiver copies it out and acknowledges it (see the
//! [module](super)).

use super::{
    P2P_MAX_BLOCKS, P2P_POST_RING, P2pOp, P2pOps, TAIL_RPOST, agree, flag_of, is_ll, mismatch,
    p2p_chunk, sent_bytes, skip_off, tail,
};
use crate::arch;
use crate::channel::memory::copy;
use crate::collectives::{Call, CollContext, MAX_BLOCKS, MAX_RANKS, SLOW_POLLS, fault};
use crate::packet::LlPacket;

/// Block `k` of operation `op`: its pieces `k`, `k + op.blocks`, … through the `depth`
/// sub-slots of chunk `k` of the slot, in turn (see the [module](super)). Once a wait of the
/// block failed (`call.failed`, agreed by the block), nothing more is copied or signalled.
/// A send signals its first piece only once the receiver's post shows the same size; a
/// receive whose first signal does not come looks for the sender's post.
///
/// # Safety
/// As for [`run`](super::run); `k < op.blocks`; `piece` is [`p2p_piece`](super::p2p_piece)
/// of the slot and `depth`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn transfer(
    ctx: &CollContext,
    call: &mut Call,
    op: &P2pOp,
    k: u32,
    piece: u64,
    depth: u32,
    xfer: u64,
    ops: &P2pOps,
) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (peer, buf) = (op.peer, op.buf as *mut u8);
    let pieces = op.bytes.div_ceil(piece);
    let depth = depth as u64;
    // Chunk k of the slot: `depth` sub-slots of `piece` bytes.
    let chunk_at = k as u64 * p2p_chunk(ctx.scratch_len);
    // Separates this operation's uses of the agreement slot from the previous one's.
    arch::sync_threads();
    let mut theirs = None;
    // Pieces this block has moved (sub-slot j % depth for the j-th).
    let mut j = 0u64;
    let mut c = k as u64;
    while c < pieces && !call.failed {
        let off = c * piece;
        let len = piece.min(op.bytes - off);
        let sub = chunk_at + (j % depth) * piece;
        if op.send != 0 {
            if j >= depth {
                // The sub-slot's previous piece must have been copied out.
                if t == 0 {
                    // SAFETY: peer a valid other rank; k + P2P_MAX_BLOCKS < MAX_BLOCKS; one
                    // waiter per (peer, index): this block.
                    unsafe { ctx.wait(call, peer, P2P_MAX_BLOCKS + k) };
                }
                // Syncs the block (after the last piece's sync), which agrees on a failure.
                if !agree(call, &mut theirs, t) {
                    break;
                }
            }
            // SAFETY: sub-slot `j % depth` of chunk k of slot `rank` of the peer's p2p
            // scratch (P2P_MAX_BLOCKS chunks of `depth` pieces fit in scratch_len); free:
            // the receiver acknowledged its previous piece (waited for above), or it was
            // never used since the last send ended; buf holds bytes.
            unsafe {
                let dst = ctx.peer_scratch[peer as usize]
                    .add((ctx.rank as u64 * ctx.scratch_len + sub) as usize);
                copy(dst, buf.add(off as usize), len, t, nt);
            }
            arch::sync_threads();
            if j == 0 {
                // Nothing is signalled before the receiver is known to expect these bytes
                // (its post is usually there long before the first piece is copied).
                if t == 0 {
                    // SAFETY: as above.
                    if let Some(m) = unsafe { receiver_bytes(ctx, call, peer, xfer) }
                        && m != op.bytes
                    {
                        theirs = Some(m);
                    }
                }
                if !agree(call, &mut theirs, t) {
                    if let (Some(m), 0, 0) = (theirs, k, t) {
                        // SAFETY: as above.
                        unsafe { mismatch(ctx, call, op, xfer, m, ops.ll_max) };
                    }
                    return;
                }
                // Separates this use of the agreement slot from the next (depth 1).
                arch::sync_threads();
            }
            if t == 0 {
                // SAFETY: as above.
                unsafe { ctx.signal(peer, k) };
            }
        } else {
            if t == 0 {
                // SAFETY: as above.
                theirs = unsafe { wait_piece(ctx, call, peer, k, xfer, op.bytes, j == 0) };
            }
            // Syncs the block (the data was published by the signal thread 0 waited for).
            if !agree(call, &mut theirs, t) {
                if let Some(m) = theirs {
                    // SAFETY: as above.
                    unsafe { receive_mismatch(ctx, call, op, k, xfer, m, ops) };
                }
                return;
            }
            // SAFETY: the sub-slot of this rank's slot for the peer that the sender's j-th
            // piece of chunk k went to, published by its signal (waited for before the
            // barrier above); buf holds bytes.
            unsafe {
                let src = ctx
                    .scratch
                    .add((peer as u64 * ctx.scratch_len + sub) as usize);
                copy(buf.add(off as usize), src, len, t, nt);
            }
            arch::sync_threads();
            if t == 0 {
                // SAFETY: as above.
                unsafe { ctx.signal(peer, P2P_MAX_BLOCKS + k) };
            }
        }
        j += 1;
        c += op.blocks as u64;
    }
    if op.send != 0 && !call.failed {
        // A send ends once every piece has been copied out: the acknowledgements still due.
        if t == 0 {
            for _ in 0..j.min(depth) {
                // SAFETY: as above.
                if !unsafe { ctx.wait(call, peer, P2P_MAX_BLOCKS + k) } {
                    break;
                }
            }
        }
        // Syncs the block (after the last piece's sync), which agrees on a failure.
        agree(call, &mut theirs, t);
    }
}

/// The size rank `peer` posted for its receive `xfer` from this rank (waiting for the post);
/// `None` when the wait gave up (`call.failed`).
///
/// # Safety
/// `peer` a peer; the context a p2p context.
#[inline(always)]
unsafe fn receiver_bytes(ctx: &CollContext, call: &mut Call, peer: u32, xfer: u64) -> Option<u64> {
    let at = TAIL_RPOST + (xfer % P2P_POST_RING) * 16;
    let slot = tail(ctx, ctx.packets_in[peer as usize & (MAX_RANKS - 1)], at) as *const LlPacket;
    let flag = flag_of(xfer);
    let mut m = 0;
    // SAFETY: a post slot of this rank's packet scratch written by the peer, accessed by
    // packets only.
    let ok = unsafe {
        ctx.wait_until(call, peer, fault::AT_P2P, || {
            match LlPacket::read(slot, flag) {
                Some(v) => {
                    m = v;
                    true
                }
                None => false,
            }
        })
    };
    ok.then_some(m)
}

/// Waits for rank `peer`'s next data signal on semaphore `k` (as [`CollContext::wait`]),
/// looking every [`SLOW_POLLS`] failed polls at the size the peer posted for its send
/// `xfer`: `Some(its bytes)` (nothing consumed) when they differ from `bytes`, for the
/// sender then signals nothing. The `first` signal of a transfer is taken only once that
/// post is there and shows `bytes`: after a mismatch the sender goes on to its next
/// transfer, whose signal may come before this block has looked at the post.
///
/// # Safety
/// As for [`CollContext::wait`]; the context a p2p context.
#[inline(always)]
unsafe fn wait_piece(
    ctx: &CollContext,
    call: &mut Call,
    peer: u32,
    k: u32,
    xfer: u64,
    bytes: u64,
    first: bool,
) -> Option<u64> {
    let idx = peer as usize * MAX_BLOCKS + k as usize;
    // SAFETY: our own counter and expected word (caller contract), one waiter.
    let (inbound, expected) = unsafe { (ctx.sems.add(idx), ctx.expected.add(idx)) };
    // SAFETY: as above.
    let want = unsafe { *expected } + 1;
    let (mut polls, mut theirs) = (0u32, None);
    // SAFETY: as above; acquire at system scope pairs with the peer's release add.
    let ok = unsafe {
        ctx.wait_until(call, peer, fault::AT_SEMAPHORE, || {
            if arch::ld_acquire_sys_u64(inbound) >= want {
                if !first {
                    return true;
                }
                match sent_bytes(ctx, peer, xfer, None) {
                    Some(n) if n == bytes => return true,
                    Some(n) => {
                        theirs = Some(n);
                        return true;
                    }
                    // The post of the transfer whose first piece this is, on its way.
                    None => {}
                }
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(SLOW_POLLS)
                && let Some(n) = sent_bytes(ctx, peer, xfer, None)
                && n != bytes
            {
                theirs = Some(n);
                return true;
            }
            false
        })
    };
    if ok && theirs.is_none() {
        // SAFETY: as above.
        unsafe { *expected = want };
    }
    theirs
}

/// A receive's block `k` that found the sender's size `theirs` differs from its own (every
/// thread of the block): block 0 records it and, when the sender sent LL packets that this
/// receive will never read, marks the transfer skipped for every LL block, so the sender
/// may reuse that half.
///
/// # Safety
/// `op.peer` a peer; the context a p2p context.
#[inline(always)]
unsafe fn receive_mismatch(
    ctx: &CollContext,
    call: &Call,
    op: &P2pOp,
    k: u32,
    xfer: u64,
    theirs: u64,
    ops: &P2pOps,
) {
    let t = arch::thread_idx_x();
    if k != 0 {
        return;
    }
    if t == 0 {
        // SAFETY: forwarded.
        unsafe { mismatch(ctx, call, op, xfer, theirs, ops.ll_max) };
    }
    if is_ll(theirs, ops.ll_max) && !is_ll(op.bytes, ops.ll_max) && t < ops.ll_blocks {
        // Not the done word: block t of this rank may still be reading an earlier transfer
        // through the same half.
        let out = ctx.packets_out[op.peer as usize & (MAX_RANKS - 1)];
        let skip = tail(ctx, out, skip_off(t, xfer & 1));
        // SAFETY: skip word (t, half) of the peer's scratch for this rank; a maximum.
        unsafe { arch::red_max_relaxed_sys_u64(skip as *mut u64, xfer + 1) };
    }
}
