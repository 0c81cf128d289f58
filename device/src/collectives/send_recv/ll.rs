//! Small transfers as LL packets, with no rendezvous (see the [module](super), "Small
//! transfers: LL packets, no rendezvous").

use super::{
    LAST_LL_AT, P2P_LL_BLOCKS, P2pOp, P2pOps, TAIL_HEADER, agree, flag_of, mismatch, p2p_ll_half,
    sent_bytes, skip_off, tail,
};
use crate::arch;
use crate::collectives::all_reduce::{load_unit, store_unit};
use crate::collectives::{Call, CollContext, MAX_RANKS, SLOW_POLLS, STATE_WORDS, fault};
use crate::packet::LlPacket;

/// Block `k` of the LL transfer `op`, number `xfer` between the pair in its direction (see
/// the [module](super)): a send writes its header and units as packets into the peer's packet
/// scratch (half `xfer & 1`, flag from `xfer`), once the peer's block `k` has finished the
/// last LL transfer through the same half; a receive polls them into `op.buf`, checks the
/// header's size and reports done.
///
/// # Safety
/// As for [`run`](super::run); `k < ops.ll_blocks <= P2P_LL_BLOCKS`; `op.bytes <=
/// p2p_ll_capacity(packets_len)`; the p2p state holds
/// [`P2P_STATE_WORDS`](super::P2P_STATE_WORDS) more words.
//
// One function on purpose: its send and receive halves share the preamble and the block's
// agreement, and split into two `#[inline(always)]` halves over a struct of the shared
// values (by reference or by value), the p2p kernel gets longer (18 more instructions, the
// context's fields reloaded in the loop over the operations instead of kept).
#[inline(always)]
pub(super) unsafe fn ll_transfer(
    ctx: &CollContext,
    call: &mut Call,
    op: &P2pOp,
    k: u32,
    xfer: u64,
    ops: &P2pOps,
) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (peer, buf, bytes) = (
        op.peer as usize & (MAX_RANKS - 1),
        op.buf as *mut u8,
        op.bytes,
    );
    let units = bytes.div_ceil(8);
    let send = op.send != 0;
    let half_bytes = p2p_ll_half(ctx.packets_len);
    // Separates this operation's uses of the agreement slots from the previous one's.
    arch::sync_threads();
    let flag = flag_of(xfer);
    let parity = xfer & 1;
    let half = half_bytes * parity;
    let row = if ops.ll_row == 0 { nt } else { ops.ll_row };
    let done_off = 8 * k as u64;
    let header_off = TAIL_HEADER + (parity * P2P_LL_BLOCKS as u64 + k as u64) * 16;
    let mut theirs = None;
    if send {
        // SAFETY: the state words after STATE_WORDS (caller contract): the number (plus one)
        // of the last LL send to the peer through this block and half, this block's
        // thread 0's alone.
        let last_at = unsafe {
            ctx.state
                .add(STATE_WORDS + LAST_LL_AT + (peer * P2P_LL_BLOCKS as usize + k as usize) * 2)
        }
        .wrapping_add(parity as usize);
        if t == 0 {
            // SAFETY: as above.
            let last = unsafe { core::ptr::read_volatile(last_at) };
            if last != 0 {
                // SAFETY: the done word of block k at the end of this rank's packet scratch
                // written by the peer (for the transfers this rank sends it), local.
                let done = tail(ctx, ctx.packets_in[peer], done_off) as *const u64;
                let skip = tail(ctx, ctx.packets_in[peer], skip_off(k, parity)) as *const u64;
                // SAFETY: as above; the peer's block k raises it past a transfer after
                // reading it (relaxed: its loads were complete, their values stored). Or
                // the last LL send through this half was received as a pipelined transfer
                // (a mismatch): nobody reads it, and the sender wrote it only once the
                // transfer before it through the half had been read.
                unsafe {
                    ctx.wait_until(call, op.peer, fault::AT_SEMAPHORE, || {
                        arch::ld_relaxed_sys_u64(done) >= last
                            || arch::ld_relaxed_sys_u64(skip) >= last
                    })
                };
            }
        }
        if !agree(call, &mut theirs, t) {
            return;
        }
        let aligned = (buf as usize).is_multiple_of(8);
        let out = ctx.packets_out[peer];
        if t == 0 {
            // SAFETY: the header slot of block k in this half of the peer's packet scratch,
            // free as the data's half is.
            unsafe {
                LlPacket::write(tail(ctx, out, header_off) as *mut LlPacket, bytes, flag);
                core::ptr::write_volatile(last_at, xfer + 1);
            }
        }
        for_block_units(k, op.blocks, row, units, |i| {
            // SAFETY: i < units (buf holds bytes); the slot is in the first 2 * half_bytes
            // of the peer's packet scratch for this rank (units * 16 <= half_bytes), free
            // (the peer's block k finished the transfer that last used this half: above).
            unsafe {
                let d = load_unit(buf, i, bytes, aligned);
                LlPacket::write(out.add((half + 16 * i) as usize) as *mut LlPacket, d, flag);
            }
            true
        });
    } else {
        let aligned = (buf as usize).is_multiple_of(8);
        let inp = ctx.packets_in[peer];
        for_block_units(k, op.blocks, row, units, |i| {
            // SAFETY: as for the send, in this rank's packet scratch written by the peer.
            let slot = unsafe { inp.add((half + 16 * i) as usize) } as *const LlPacket;
            // SAFETY: a live packet slot written by the peer, accessed by packets only.
            match unsafe { poll_unit(ctx, call, slot, op.peer, xfer, k, bytes) } {
                // SAFETY: i < units, buf holds bytes; unit i is this thread's.
                Ok(d) => unsafe { store_unit(buf, i, bytes, d, aligned) },
                Err(n) => theirs = n,
            }
            !call.failed && theirs.is_none()
        });
        if t == 0 && !call.failed && theirs.is_none() {
            // The header: the size the sender sent (a smaller receive reads all its units).
            let slot = tail(ctx, inp, header_off) as *const LlPacket;
            // SAFETY: the header slot of block k in this half, written by the peer.
            match unsafe { poll_unit(ctx, call, slot, op.peer, xfer, k, bytes) } {
                Ok(n) if n != bytes => theirs = Some(n),
                Ok(_) => {}
                Err(n) => theirs = n,
            }
        }
        // Every thread of the block has read its packets (the values are stored).
        agree_any(call, &mut theirs, t);
        if call.failed {
            return;
        }
        if t == 0 {
            // SAFETY: the done word of block k at the end of the peer's packet scratch
            // written by this rank, mapped here; a maximum (a mismatched receive of a
            // rendezvous op may raise it from another block).
            unsafe {
                let done = tail(ctx, ctx.packets_out[peer], done_off) as *mut u64;
                arch::red_max_relaxed_sys_u64(done, xfer + 1);
            }
        }
        if let (Some(n), 0, 0) = (theirs, k, t) {
            // SAFETY: forwarded.
            unsafe { mismatch(ctx, call, op, xfer, n, ops.ll_max) };
        }
    }
}

/// Calls `f(i)` for the units `i < units` of an LL transfer that this thread moves as
/// block `k` of `blocks`: block `k` owns rows `k`, `k + blocks`, … of `row` units (see
/// [`P2pOps::ll_row`]), and the block's threads take a row's units in turn. Stops at the
/// first `false`.
#[inline(always)]
fn for_block_units(k: u32, blocks: u32, row: u32, units: u64, f: impl FnMut(u64) -> bool) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    block_units(k, blocks, row, units, t, nt, f);
}

/// [`for_block_units`] for thread `t` of `nt`.
#[inline(always)]
pub(crate) fn block_units(
    k: u32,
    blocks: u32,
    row: u32,
    units: u64,
    t: u32,
    nt: u32,
    mut f: impl FnMut(u64) -> bool,
) {
    let (t, nt) = (t as u64, nt.max(1) as u64);
    let (row, rows) = (row.max(1) as u64, blocks.max(1) as u64);
    let mut start = k as u64 * row;
    while start < units {
        let end = (start + row).min(units);
        let mut i = start + t;
        while i < end {
            if !f(i) {
                return;
            }
            i += nt;
        }
        start += rows * row;
    }
}

/// Polls the LL packet at `slot` of transfer `xfer` from rank `peer` (an LL receive of
/// `bytes` on block `k`): its data, or `Err(Some(n))` when the sender's header or post shows
/// it sent `n != bytes` (looked at every [`SLOW_POLLS`] failed polls, with the clock and the
/// fault words), `Err(None)` once the call failed.
///
/// # Safety
/// `slot` a live packet slot of this context, accessed by packets only; `peer` a peer.
#[inline(always)]
unsafe fn poll_unit(
    ctx: &CollContext,
    call: &mut Call,
    slot: *const LlPacket,
    peer: u32,
    xfer: u64,
    k: u32,
    bytes: u64,
) -> Result<u64, Option<u64>> {
    let flag = flag_of(xfer);
    let (mut polls, mut t0) = (0u32, 0u64);
    loop {
        // SAFETY: caller contract.
        if let Some(v) = unsafe { LlPacket::read(slot, flag) } {
            return Ok(v);
        }
        if call.failed {
            return Err(None);
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(SLOW_POLLS) {
            // SAFETY: caller contract.
            if let Some(n) = unsafe { sent_bytes(ctx, peer, xfer, Some(k)) }
                && n != bytes
            {
                return Err(Some(n));
            }
            // SAFETY: the context valid (caller contract).
            t0 = unsafe { ctx.keep_waiting(*call, peer, fault::AT_SEMAPHORE, t0) };
            if t0 == 0 {
                call.failed = true;
                return Err(None);
            }
        }
    }
}

/// Syncs the block and makes `call.failed`, and a mismatch (`theirs`), every thread's if any
/// thread has them; `!call.failed && theirs.is_none()`. Every thread of the block; a
/// `sync_threads` between two uses.
#[inline(always)]
fn agree_any(call: &mut Call, theirs: &mut Option<u64>, t: u32) -> bool {
    let slot = crate::shared_array!(P2P_ANY: u64; 3);
    if t == 0 {
        // SAFETY: the block's slots, reset by thread 0 before the barrier below.
        unsafe {
            slot.write_volatile(0);
            slot.add(1).write_volatile(0);
        }
    }
    arch::sync_threads();
    // SAFETY: as above; every writer of a slot stores the same value (the sender's size is
    // one number, whichever of its header or post a thread read it from).
    unsafe {
        if call.failed {
            slot.write_volatile(1);
        }
        if let Some(n) = *theirs {
            slot.add(2).write_volatile(n);
            slot.add(1).write_volatile(1);
        }
    }
    arch::sync_threads();
    // SAFETY: as above.
    let (failed, mis, n) = unsafe {
        (
            slot.read_volatile(),
            slot.add(1).read_volatile(),
            slot.add(2).read_volatile(),
        )
    };
    call.failed = failed != 0;
    *theirs = (mis != 0).then_some(n);
    !call.failed && theirs.is_none()
}
