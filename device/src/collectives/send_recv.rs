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
//! Each block's chunk is cut into [`P2pOps::depth`] sub-slots used in turn, so a sender
//! fills the next sub-slot while the receiver drains the previous one (it waits for an
//! acknowledgement only before reusing a sub-slot, and for the outstanding ones at the end).
//!
//! In a group, operations with the same peer and direction form a *lane* and run in order on
//! the lane's blocks; lanes run side by side on different blocks.
//!
//! ## Small transfers: LL packets, no rendezvous
//!
//! A transfer of at most [`P2pOps::ll_max`] bytes goes as LL packets instead
//! (`ll_transfer`): the sender writes 8 bytes of data per 16-byte packet, with a flag, into
//! the receiver's packet scratch for it (`packets_out[peer]`), and the receiver polls the
//! flags; neither waits for the other's acknowledgement, so a small send costs one one-way
//! latency. Every LL transfer uses exactly [`P2pOps::ll_blocks`] blocks (fixed for a
//! communicator), and block `k` always moves units `k * threads + t + m * ll_blocks *
//! threads`, so the sender's block `k` and the receiver's block `k` share a set of packet
//! slots across transfers. Each such pair keeps its own sequence number per (peer,
//! direction) in the p2p state words after [`STATE_WORDS`]; the flag is `seq + 1`, and the
//! packets alternate between two halves of the packet scratch by `seq` parity. Before
//! writing transfer `seq >= 2` into a half, sender block `k` waits until receiver block `k`
//! has reported (a *done* word at the end of the sender's packet scratch for that peer,
//! written by the receiver) that it finished transfer `seq - 2`: usually long ago, so the
//! check costs one local load.

use super::all_reduce::{load_unit, store_unit};
use super::{Call, CollContext, MAX_BLOCKS, MAX_RANKS, STATE_WORDS, desc, fault};
use crate::arch;
use crate::channel::memory::copy;
use crate::packet::LlPacket;

/// Most operations of one group.
pub const MAX_P2P_OPS: usize = 16;
/// Most blocks one transfer uses (chunks per slot); semaphores `0..P2P_MAX_BLOCKS` carry
/// data signals, `P2P_MAX_BLOCKS..2 * P2P_MAX_BLOCKS` acknowledgements.
pub const P2P_MAX_BLOCKS: u32 = 64;
/// Most sub-slots per block chunk ([`P2pOps::depth`]).
pub const P2P_MAX_DEPTH: u32 = 4;
/// Most blocks of an LL transfer ([`P2pOps::ll_blocks`]); sets the state and done words.
pub const P2P_LL_BLOCKS: u32 = 16;
/// Bytes at the end of every packet scratch of a p2p context holding the done words (one
/// per LL block) of the transfers this rank sends to the scratch's writer.
pub const P2P_DONE_BYTES: u64 = P2P_LL_BLOCKS as u64 * 8;
/// State words of a p2p context after [`STATE_WORDS`]: the LL sequence numbers, per
/// direction (send, receive), peer and LL block.
pub const P2P_STATE_WORDS: usize = 2 * MAX_RANKS * P2P_LL_BLOCKS as usize;

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

/// The operations of one launch, passed by value (`#[repr(C)]`, 536 bytes). `depth`,
/// `ll_max` and `ll_blocks` must be the same on every rank of the communicator (both sides
/// of a transfer cut it alike); the default (zeros) means one sub-slot and no LL transfers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pOps {
    /// Operations in use.
    pub count: u32,
    /// Sub-slots per block chunk (0 or 1: none; at most [`P2P_MAX_DEPTH`], and pieces of at
    /// least 16 bytes: see [`p2p_depth`]).
    pub depth: u32,
    /// Transfers of at most this many bytes go as LL packets (0: none); at most
    /// [`p2p_ll_capacity`] of the context's packet scratch.
    pub ll_max: u64,
    /// Blocks of every LL transfer (1..=[`P2P_LL_BLOCKS`] when `ll_max > 0`).
    pub ll_blocks: u32,
    /// Unused (alignment).
    pub _pad: u32,
    /// The operations, in call order.
    pub ops: [P2pOp; MAX_P2P_OPS],
}

const _: () = assert!(core::mem::size_of::<P2pOps>() == 536);

/// Bytes of each of the two packet halves of a p2p packet scratch of `packets_len` bytes.
#[inline(always)]
pub fn p2p_ll_half(packets_len: u64) -> u64 {
    packets_len.saturating_sub(P2P_DONE_BYTES) / 2 / 16 * 16
}

/// Most bytes of one LL transfer over a p2p packet scratch of `packets_len` bytes (8 data
/// bytes per 16-byte packet).
#[inline(always)]
pub fn p2p_ll_capacity(packets_len: u64) -> u64 {
    p2p_ll_half(packets_len) / 2
}

/// The depth a launch over slots of `slot` bytes uses: `depth` clamped to
/// 1..=[`P2P_MAX_DEPTH`], and to pieces of at least 16 bytes.
#[inline(always)]
pub fn p2p_depth(slot: u64, depth: u32) -> u32 {
    let most = (p2p_chunk(slot) / 16).clamp(1, P2P_MAX_DEPTH as u64) as u32;
    depth.clamp(1, most)
}

/// Bytes of one sub-slot: the block chunk of a slot of `slot` bytes cut into
/// [`p2p_depth`] sub-slots (a multiple of 16). Plans and kernels cut transfers into pieces
/// of this size.
#[inline(always)]
pub fn p2p_piece(slot: u64, depth: u32) -> u64 {
    p2p_chunk(slot) / p2p_depth(slot, depth) as u64 / 16 * 16
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
    /// Fills in every operation's `blocks` (an LL transfer: `ll_blocks`; else from its
    /// bytes, pieces of `piece` bytes ([`p2p_piece`]), at most `max_blocks` each) and
    /// `first_block` (lanes of one peer and direction side by side, in order of first
    /// appearance, each as wide as its widest operation); returns the grid's blocks. The
    /// same operations give the same plan on every rank.
    pub fn plan(&mut self, piece: u64, max_blocks: u32) -> u32 {
        let n = (self.count as usize).min(MAX_P2P_OPS);
        let (ll_max, ll_blocks) = (self.ll_max, self.ll_blocks);
        let mut lanes = [(0u32, 0u32, 0u32); MAX_P2P_OPS]; // (peer, send, width)
        let mut nlanes = 0;
        let mut lane_of = [0usize; MAX_P2P_OPS];
        for (i, op) in self.ops[..n].iter_mut().enumerate() {
            op.blocks = if is_ll(op.bytes, ll_max) {
                ll_blocks.clamp(1, P2P_LL_BLOCKS)
            } else {
                p2p_blocks(op.bytes, piece, max_blocks)
            };
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

/// Whether a transfer of `bytes` goes as LL packets under `ll_max`.
#[inline(always)]
fn is_ll(bytes: u64, ll_max: u64) -> bool {
    bytes <= ll_max
}

/// Runs the operations of `ops` that block `blockIdx.x` takes part in, in order. Traps on an
/// empty piece, a peer out of range or the own rank, an LL transfer larger than the packet
/// scratch holds, or a grid of more than `MAX_BLOCKS` blocks.
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
    // The operations are indexed at run time below. Indexing the kernel parameter itself
    // made every thread copy all 536 bytes of it into local memory first (about 7 us per
    // launch of 32 blocks on an H200); thread 0 copies it into shared memory instead, with
    // constant offsets.
    let shared = crate::shared_array!(P2P_OPS: P2pOps; 1);
    if arch::thread_idx_x() == 0 {
        // SAFETY: the block's own shared array of one P2pOps, read after the barrier.
        unsafe { shared.write(*ops) };
    }
    arch::sync_threads();
    // SAFETY: written above before the barrier, never written again in this launch.
    let ops = unsafe { &*shared };
    let depth = p2p_depth(ctx.scratch_len, ops.depth);
    let piece = p2p_piece(ctx.scratch_len, ops.depth);
    if piece == 0
        || arch::grid_dim_x() as usize > MAX_BLOCKS
        || ops.ll_max > p2p_ll_capacity(ctx.packets_len)
        || (ops.ll_max > 0 && !(1..=P2P_LL_BLOCKS).contains(&ops.ll_blocks))
    {
        arch::trap();
    }
    let tag = desc::tag(desc::SEND_RECV, 0, 0, 0);
    // SAFETY: b < MAX_BLOCKS (above); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, ops.count as u64, tag) };
    let n = (ops.count as usize).min(MAX_P2P_OPS);
    let mut i = 0;
    while i < n {
        let op = &ops.ops[i];
        i += 1;
        if op.peer >= ctx.nranks || op.peer == ctx.rank || op.blocks > P2P_MAX_BLOCKS {
            arch::trap();
        }
        if b >= op.first_block && b - op.first_block < op.blocks {
            let k = b - op.first_block;
            if is_ll(op.bytes, ops.ll_max) {
                if op.blocks != ops.ll_blocks {
                    arch::trap();
                }
                // SAFETY: forwarded; k < ll_blocks <= P2P_LL_BLOCKS, the packets fit (checked
                // above).
                unsafe { ll_transfer(ctx, &mut call, op, k) };
            } else {
                // SAFETY: forwarded; k < op.blocks <= P2P_MAX_BLOCKS.
                unsafe { transfer(ctx, &mut call, op, k, piece, depth) };
            }
        }
    }
    // SAFETY: every thread of every block gets here.
    unsafe { ctx.finish(&call) };
}

/// Block `k` of operation `op`: its pieces `k`, `k + op.blocks`, … through the `depth`
/// sub-slots of chunk `k` of the slot, in turn (see the [module](self)). Once a wait of the
/// block failed (`call.failed`, agreed by the block), nothing more is copied or signalled.
///
/// # Safety
/// As for [`run`]; `k < op.blocks`; `piece` is [`p2p_piece`] of the slot and `depth`.
#[inline(always)]
unsafe fn transfer(ctx: &CollContext, call: &mut Call, op: &P2pOp, k: u32, piece: u64, depth: u32) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (peer, buf) = (op.peer, op.buf as *mut u8);
    let pieces = op.bytes.div_ceil(piece);
    let depth = depth as u64;
    // Chunk k of the slot: `depth` sub-slots of `piece` bytes.
    let chunk_at = k as u64 * p2p_chunk(ctx.scratch_len);
    // Separates this operation's uses of the agreement slot from the previous one's.
    arch::sync_threads();
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
                if !agree(call, t) {
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
            if t == 0 {
                // SAFETY: as above.
                unsafe { ctx.signal(peer, k) };
            }
        } else {
            if t == 0 {
                // SAFETY: as above.
                unsafe { ctx.wait(call, peer, k) };
            }
            // Syncs the block (the data was published by the signal thread 0 waited for).
            if !agree(call, t) {
                break;
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
        agree(call, t);
    }
}

/// Block `k` of the LL transfer `op` (see the [module](self)): a send writes its units as
/// packets into the peer's packet scratch, once the peer's block `k` has finished the
/// transfer that last used the same half; a receive polls them into `op.buf` and reports
/// done. Both advance the block's sequence number for the peer and direction.
///
/// # Safety
/// As for [`run`]; `k < ops.ll_blocks <= P2P_LL_BLOCKS`; `op.bytes <=
/// p2p_ll_capacity(packets_len)`; the p2p state holds [`P2P_STATE_WORDS`] more words.
#[inline(always)]
unsafe fn ll_transfer(ctx: &CollContext, call: &mut Call, op: &P2pOp, k: u32) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (peer, buf, bytes) = (
        op.peer as usize & (MAX_RANKS - 1),
        op.buf as *mut u8,
        op.bytes,
    );
    let units = bytes.div_ceil(8);
    let send = op.send != 0;
    let half_bytes = p2p_ll_half(ctx.packets_len);
    // Separates this operation's uses of the agreement slot and of the sequence number
    // from the previous one's.
    arch::sync_threads();
    // SAFETY: the state words after STATE_WORDS (caller contract): this block's own
    // sequence number for (direction, peer), read after the barrier above (which follows
    // the previous update) and before the barrier that precedes the next update.
    let seq_at = unsafe {
        ctx.state.add(
            STATE_WORDS
                + ((!send) as usize * MAX_RANKS + peer) * P2P_LL_BLOCKS as usize
                + k as usize,
        )
    };
    // SAFETY: as above.
    let seq = unsafe { core::ptr::read_volatile(seq_at) };
    let flag = (seq as u32).wrapping_add(1).max(1);
    let half = half_bytes * (seq & 1);
    let (first, stride) = (
        k as u64 * nt as u64 + t as u64,
        op.blocks as u64 * nt as u64,
    );
    let done_off = (ctx.packets_len - P2P_DONE_BYTES + 8 * k as u64) as usize;
    if send {
        if seq >= 2 {
            if t == 0 {
                // SAFETY: the done word of block k at the end of this rank's packet scratch
                // written by the peer (for the transfers this rank sends it), local.
                let done = unsafe { ctx.packets_in[peer].add(done_off) } as *const u64;
                // SAFETY: as above; the peer's block k stores `seq + 1` there after reading
                // transfer `seq` (relaxed: its loads were complete, their values stored).
                unsafe {
                    ctx.wait_until(call, op.peer, fault::AT_SEMAPHORE, || {
                        arch::ld_relaxed_sys_u64(done) + 1 >= seq
                    })
                };
            }
            if !agree(call, t) {
                return;
            }
        }
        let aligned = (buf as usize).is_multiple_of(8);
        let out = ctx.packets_out[peer];
        let mut i = first;
        while i < units {
            // SAFETY: i < units (buf holds bytes); the slot is in the first 2 * half_bytes
            // of the peer's packet scratch for this rank (units * 16 <= half_bytes), free
            // (the peer's block k finished the transfer that last used this half: above).
            unsafe {
                let d = load_unit(buf, i, bytes, aligned);
                LlPacket::write(out.add((half + 16 * i) as usize) as *mut LlPacket, d, flag);
            }
            i += stride;
        }
    } else {
        let aligned = (buf as usize).is_multiple_of(8);
        let inp = ctx.packets_in[peer];
        let mut i = first;
        while i < units && !call.failed {
            // SAFETY: as for the send, in this rank's packet scratch written by the peer.
            let slot = unsafe { inp.add((half + 16 * i) as usize) } as *const LlPacket;
            // SAFETY: a live packet slot written by the peer, accessed by packets only.
            let d = unsafe { ctx.poll_packet(call, slot, flag, op.peer, fault::AT_SEMAPHORE) };
            if call.failed {
                break;
            }
            // SAFETY: i < units, buf holds bytes; unit i is this thread's.
            unsafe { store_unit(buf, i, bytes, d, aligned) };
            i += stride;
        }
        // Every thread of the block has read its packets (the values are stored).
        if !agree_any(call, t) {
            return;
        }
        if t == 0 {
            // SAFETY: the done word of block k at the end of the peer's packet scratch
            // written by this rank, mapped here.
            unsafe {
                let done = ctx.packets_out[peer].add(done_off) as *mut u64;
                arch::st_relaxed_sys_u64(done, seq + 1);
            }
        }
    }
    // Every thread has read `seq` before the update.
    arch::sync_threads();
    if t == 0 {
        // SAFETY: this block's own word (see above).
        unsafe { core::ptr::write_volatile(seq_at, seq + 1) };
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

/// Syncs the block and makes `call.failed` true on every thread if it is on any; returns
/// `!call.failed`. Every thread of the block; a `sync_threads` between two uses.
#[inline(always)]
fn agree_any(call: &mut Call, t: u32) -> bool {
    let slot = crate::shared_array!(P2P_FAILED: u32; 1);
    if t == 0 {
        // SAFETY: the block's one slot, reset by thread 0 before the barrier below.
        unsafe { slot.write_volatile(0) };
    }
    arch::sync_threads();
    if call.failed {
        // SAFETY: as above; every writer stores the same value.
        unsafe { slot.write_volatile(1) };
    }
    arch::sync_threads();
    // SAFETY: as above.
    call.failed = unsafe { slot.read_volatile() } != 0;
    !call.failed
}
