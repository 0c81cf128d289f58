//! Point-to-point send and receive, alone or grouped into one launch (NCCL's grouped
//! `ncclSend`/`ncclRecv`), over a p2p context: a [`CollContext`] whose scratch, semaphores
//! and expected words are a separate registered buffer (built by the host), so transfers
//! never meet a collective's use of the shared scratch and semaphores, while using the same
//! [`CollContext::signal`] / [`CollContext::wait`].
//!
//! Rank `r`'s p2p scratch holds one slot per source rank (`scratch_len` bytes each), each cut
//! into [`P2P_MAX_BLOCKS`] fixed chunks, one per block index. A transfer of `bytes` uses
//! `blocks` blocks ([`p2p_blocks`], the same on both sides), block `k` moving chunks `k`,
//! `k + blocks`, … through chunk `k` of the slot. Per chunk, the sender copies it into the
//! receiver's slot, its thread 0 signals semaphore `k` of the receiver and waits for the
//! receiver's acknowledgement on semaphore `P2P_MAX_BLOCKS + k`; the receiver waits, copies
//! the chunk out and acknowledges. A send therefore ends only once its data has been copied
//! out (rendezvous, as NCCL for large messages): a send and the matching receive must be
//! able to run at the same time (a rank sending to and receiving from the same peer puts
//! both into one group). Consecutive transfers between a pair in one direction match in call
//! order; the slot is free again when a send ends, so nothing is kept between calls.
//!
//! In a group, operations with the same peer and direction form a *lane* and run in order on
//! the lane's blocks; lanes run side by side on different blocks.

use super::{Call, CollContext, MAX_BLOCKS, desc};
use crate::arch;
use crate::channel::memory::copy;

/// Most operations of one group.
pub const MAX_P2P_OPS: usize = 16;
/// Most blocks one transfer uses (chunks per slot); semaphores `0..P2P_MAX_BLOCKS` carry
/// data signals, `P2P_MAX_BLOCKS..2 * P2P_MAX_BLOCKS` acknowledgements.
pub const P2P_MAX_BLOCKS: u32 = 64;

/// One send or receive of a group (`#[repr(C)]`, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pOp {
    /// The data's address (read by a send, written by a receive).
    pub buf: u64,
    /// Bytes to move.
    pub bytes: u64,
    /// The other rank.
    pub peer: u32,
    /// 1: send, 0: receive.
    pub send: u32,
    /// The first block of the operation's lane.
    pub first_block: u32,
    /// Blocks the operation uses ([`p2p_blocks`] of `bytes`), from `first_block`.
    pub blocks: u32,
}

/// The operations of one launch, passed by value (`#[repr(C)]`, 520 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pOps {
    /// Operations in use.
    pub count: u32,
    /// Unused (alignment).
    pub _pad: u32,
    /// The operations, in call order.
    pub ops: [P2pOp; MAX_P2P_OPS],
}

/// Bytes of the chunk of one block index in a slot of `slot` bytes (a multiple of 16).
#[inline(always)]
pub fn p2p_chunk(slot: u64) -> u64 {
    slot / P2P_MAX_BLOCKS as u64 / 16 * 16
}

/// Blocks a transfer of `bytes` uses with chunks of `chunk` bytes and at most `max` blocks
/// (1..=[`P2P_MAX_BLOCKS`]): one per chunk, at most `max`.
#[inline(always)]
pub fn p2p_blocks(bytes: u64, chunk: u64, max: u32) -> u32 {
    let max = max.clamp(1, P2P_MAX_BLOCKS) as u64;
    bytes.div_ceil(chunk.max(1)).clamp(1, max) as u32
}

impl P2pOps {
    /// Fills in every operation's `blocks` (from its bytes, chunks of `chunk` bytes, at most
    /// `max_blocks` each) and `first_block` (lanes of one peer and direction side by side, in
    /// order of first appearance, each as wide as its widest operation); returns the grid's
    /// blocks. The same operations give the same plan on every rank.
    pub fn plan(&mut self, chunk: u64, max_blocks: u32) -> u32 {
        let n = (self.count as usize).min(MAX_P2P_OPS);
        let mut lanes = [(0u32, 0u32, 0u32); MAX_P2P_OPS]; // (peer, send, width)
        let mut nlanes = 0;
        let mut lane_of = [0usize; MAX_P2P_OPS];
        for (i, op) in self.ops[..n].iter_mut().enumerate() {
            op.blocks = p2p_blocks(op.bytes, chunk, max_blocks);
            let l = match lanes[..nlanes]
                .iter()
                .position(|l| l.0 == op.peer && l.1 == op.send)
            {
                Some(l) => l,
                None => {
                    lanes[nlanes] = (op.peer, op.send, 0);
                    nlanes += 1;
                    nlanes - 1
                }
            };
            lanes[l].2 = lanes[l].2.max(op.blocks);
            lane_of[i] = l;
        }
        let mut first = [0u32; MAX_P2P_OPS];
        let mut total = 0;
        for (l, f) in first.iter_mut().enumerate().take(nlanes) {
            *f = total;
            total += lanes[l].2;
        }
        for (i, op) in self.ops[..n].iter_mut().enumerate() {
            op.first_block = first[lane_of[i]];
        }
        total
    }
}

/// Runs the operations of `ops` that block `blockIdx.x` takes part in, in order. Traps on an
/// empty chunk, a peer out of range or the own rank, or a grid of more than `MAX_BLOCKS`
/// blocks.
///
/// A launch is one call of the p2p context ([`Call`], on the p2p context's own call counter
/// and local fault words, so sends and receives never shift the collectives' sequence) with
/// the descriptor `(ops.count, SEND_RECV tag)`; it exchanges no descriptor (a pair's
/// operations are not a call of every rank). Its waits follow the fault protocol: they give
/// up on abort or timeout, recording why in the fault area the p2p context shares with the
/// collectives, and the block skips the rest of its operations (keeping every
/// `sync_threads`). A send and a receive of different sizes are therefore not reported as a
/// mismatch: the side left waiting times out.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; `ctx` a p2p context (its
/// scratch a slot of `scratch_len` bytes per source rank, its semaphores, expected and state
/// words its own); every operation's buffer valid for its bytes; the peers post matching
/// operations (same bytes, same order per pair and direction) and run them concurrently
/// with these.
#[inline(always)]
pub unsafe fn run(ctx: &CollContext, ops: &P2pOps) {
    let b = arch::block_idx_x();
    let chunk = p2p_chunk(ctx.scratch_len);
    if chunk == 0 || arch::grid_dim_x() as usize > MAX_BLOCKS {
        arch::trap();
    }
    let tag = desc::tag(desc::SEND_RECV, 0, 0, 0);
    // SAFETY: b < MAX_BLOCKS (above); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, ops.count as u64, tag) };
    for op in &ops.ops[..(ops.count as usize).min(MAX_P2P_OPS)] {
        if op.peer >= ctx.nranks || op.peer == ctx.rank || op.blocks > P2P_MAX_BLOCKS {
            arch::trap();
        }
        if b >= op.first_block && b - op.first_block < op.blocks {
            // SAFETY: forwarded; the block index is below op.blocks <= P2P_MAX_BLOCKS.
            unsafe { transfer(ctx, &mut call, op, b - op.first_block, chunk) };
        }
    }
    // SAFETY: every thread of every block gets here.
    unsafe { ctx.finish(&call) };
}

/// Block `k` of operation `op`: its chunks `k`, `k + op.blocks`, … through chunk `k` of the
/// slot (see the [module](self)). Once a wait of the block failed (`call.failed`, agreed by
/// the block), nothing more is copied or signalled.
///
/// # Safety
/// As for [`run`]; `k < op.blocks`.
#[inline(always)]
unsafe fn transfer(ctx: &CollContext, call: &mut Call, op: &P2pOp, k: u32, chunk: u64) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (peer, buf) = (op.peer, op.buf as *mut u8);
    let chunks = op.bytes.div_ceil(chunk);
    // Separates this operation's uses of the agreement slot from the previous one's.
    arch::sync_threads();
    let mut c = k as u64;
    while c < chunks && !call.failed {
        let off = c * chunk;
        let len = chunk.min(op.bytes - off);
        if op.send != 0 {
            // SAFETY: chunk k of slot `rank` of the peer's p2p scratch (k < P2P_MAX_BLOCKS
            // chunks of `chunk` bytes fit in scratch_len); free, since the receiver
            // acknowledged the previous chunk through it (or none was sent since the last
            // send ended); buf holds bytes.
            unsafe {
                let dst = ctx.peer_scratch[peer as usize]
                    .add((ctx.rank as u64 * ctx.scratch_len + k as u64 * chunk) as usize);
                copy(dst, buf.add(off as usize), len, t, nt);
            }
            arch::sync_threads();
            if t == 0 {
                // SAFETY: peer a valid other rank; k + P2P_MAX_BLOCKS < MAX_BLOCKS; one
                // waiter per (peer, index): this block.
                unsafe {
                    ctx.signal(peer, k);
                    ctx.wait(call, peer, P2P_MAX_BLOCKS + k);
                }
            }
            // Syncs the block, which agrees on a failed wait.
            agree(call, t);
        } else {
            if t == 0 {
                // SAFETY: as above.
                unsafe { ctx.wait(call, peer, k) };
            }
            // Syncs the block (the data was published by the signal thread 0 waited for).
            if !agree(call, t) {
                break;
            }
            // SAFETY: chunk k of this rank's slot for the peer, published by its signal
            // (waited for before the barrier above); buf holds bytes.
            unsafe {
                let src = ctx
                    .scratch
                    .add((peer as u64 * ctx.scratch_len + k as u64 * chunk) as usize);
                copy(buf.add(off as usize), src, len, t, nt);
            }
            arch::sync_threads();
            if t == 0 {
                // SAFETY: as above.
                unsafe { ctx.signal(peer, P2P_MAX_BLOCKS + k) };
            }
        }
        c += op.blocks as u64;
    }
}

/// Syncs the block and makes thread 0's `call.failed` (the only waiter's) every thread's;
/// `!call.failed`. Every thread of the block; a `sync_threads` between two uses.
#[inline(always)]
fn agree(call: &mut Call, t: u32) -> bool {
    let slot = crate::shared_array!(P2P_FAILED: u32; 1);
    if t == 0 {
        // SAFETY: the block's one slot, written by thread 0 only, read after the sync.
        unsafe { slot.write_volatile(call.failed as u32) };
    }
    arch::sync_threads();
    // SAFETY: as above.
    call.failed = unsafe { slot.read_volatile() } != 0;
    !call.failed
}
