//! Pieces streamed between ranks through the shared scratch with no barrier per round: the
//! pipelined broadcast ([`broadcast::pipelined`](super::broadcast::pipelined)) and reduce
//! ([`reduce::pipelined`](super::reduce::pipelined)), the collectives' counterpart of the
//! pipelined send/receive ([`send_recv`](super::send_recv)).
//!
//! A call moves `bytes` cut into pieces of `piece` bytes; block `b` of `nb` moves pieces `b`,
//! `b + nb`, …, its `j`-th one through sub-slot `j % depth` of chunk `b` of a slot (the chunk:
//! [`pipe_chunk`], `depth` sub-slots of `piece` bytes). Every rank runs one *stage* per block
//! (`run`): it receives from its *upstream* ranks (data written into its own scratch) and
//! sends to its *downstream* ranks (writing into theirs). Per piece, a thread `p < nranks`
//! of the block waits for upstream rank `p`'s signal that the piece has landed, or, before
//! reusing a sub-slot, for downstream rank `p`'s acknowledgement that the sub-slot's previous
//! piece was consumed; the block then does the piece's work (copies, a reduction) and
//! thread `p` signals downstream rank `p` (data) or acknowledges upstream rank `p`. A rank
//! that sends ends only once each downstream rank has acknowledged every piece.
//!
//! Signals and acknowledgements use the semaphore of the sender and the block index, as the
//! barriers do: a pair `(from, to)` carries data signals or acknowledgements, never both
//! (no rank is both upstream and downstream of another), and every signal of a call is
//! consumed within it, so calls and the barriers of other kernels keep counting alike.
//!
//! The call descriptor is sent at the start ([`CollContext::begin_deferred`]); a rank that
//! receives checks the peers' descriptors before its first wait, a rank that only sends after
//! its first piece's copy and before its first signal, so on a mismatch nobody signals.
//! With more than two ranks the kernels end with a barrier (a rank may not write into a
//! peer's scratch in its next call while another rank still reads its own); with two, the
//! last acknowledgement already orders the only reader after the only writer.

use super::{Call, CollContext, MAX_RANKS};
use crate::arch;

/// Pieces per block a pipelined call aims at ([`pipe_piece`]).
pub const PIPE_PIECES_PER_BLOCK: u64 = 8;
/// Most sub-slots per chunk (the tag holds 4 bits).
pub const PIPE_MAX_DEPTH: u32 = 8;
/// Largest piece the tag holds.
pub const PIPE_MAX_PIECE: u64 = 16 * 0xf_ffff;

/// Bytes of block `b`'s chunk of a slot of `slot` bytes shared by `blocks` blocks (a
/// multiple of 16).
#[inline(always)]
pub fn pipe_chunk(slot: u64, blocks: u32) -> u64 {
    slot / (blocks.max(1) as u64) / 16 * 16
}

/// The piece size of a pipelined call of `bytes` over `blocks` blocks and slots of `slot`
/// bytes with `depth` sub-slots per chunk: about [`PIPE_PIECES_PER_BLOCK`] pieces per block,
/// at least `min_piece`, at most what a sub-slot holds (and [`PIPE_MAX_PIECE`]), a multiple
/// of 16; 0 when a sub-slot cannot hold 16 bytes.
#[inline(always)]
pub fn pipe_piece(bytes: u64, slot: u64, blocks: u32, depth: u32, min_piece: u64) -> u64 {
    let most = (pipe_chunk(slot, blocks) / depth.max(1) as u64 / 16 * 16).min(PIPE_MAX_PIECE);
    let want = bytes
        .div_ceil(blocks.max(1) as u64 * PIPE_PIECES_PER_BLOCK)
        .max(min_piece)
        .next_multiple_of(16);
    want.min(most)
}

/// Whether `piece` and `depth` fit slots of `slot` bytes shared by `blocks` blocks.
#[inline(always)]
pub fn pipe_fits(slot: u64, blocks: u32, depth: u32, piece: u64) -> bool {
    piece > 0
        && piece.is_multiple_of(16)
        && (1..=PIPE_MAX_DEPTH).contains(&depth)
        && piece * depth as u64 <= pipe_chunk(slot, blocks)
}

/// One stage of block `blockIdx.x`: the pieces of `bytes` (see the [module](self)), received
/// from the ranks of bit mask `ups` and sent to those of `downs`. `work(off, len, sub)` is
/// called by every thread of the block for each piece (bytes `off..off + len` of the data,
/// sub-slot at byte `sub` of a slot) once the upstream ranks' piece has landed in this
/// rank's scratch and the downstream ranks' sub-slot is free; it does the piece's copies or
/// reduction. Returns `false` on every thread once the call failed (a wait gave up or the
/// descriptors differ); nothing is signalled after that.
///
/// # Safety
/// Every thread of the block, `blockDim.x >= nranks`, `gridDim.x <= MAX_BLOCKS`; `ups` and
/// `downs` disjoint masks of peers (not the own rank); every rank's stages agree on the
/// pieces (same `bytes`, `piece`, `depth`, slots and grid) and form a graph in which each
/// downstream rank of this one lists it upstream and vice versa; `piece * depth` fits a
/// chunk ([`pipe_fits`]); `work` accesses only its piece's data and sub-slots.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run(
    ctx: &CollContext,
    call: &mut Call,
    slot: u64,
    bytes: u64,
    piece: u64,
    depth: u32,
    ups: u32,
    downs: u32,
    mut work: impl FnMut(u64, u64, u64),
) -> bool {
    let (t, b, nb) = (
        arch::thread_idx_x(),
        arch::block_idx_x(),
        arch::grid_dim_x(),
    );
    let n = ctx.nranks.min(MAX_RANKS as u32);
    if ups & downs != 0 || (ups | downs) >> ctx.rank & 1 != 0 {
        arch::trap();
    }
    let depth = depth.max(1) as u64;
    let chunk_at = b as u64 * pipe_chunk(slot, nb);
    let pieces = bytes.div_ceil(piece.max(1));
    // This thread's peer: one it waits for and signals (t < n, in a mask).
    let up = t < n && ups >> t & 1 != 0;
    let down = t < n && downs >> t & 1 != 0;
    let mut j = 0u64;
    let mut c = b as u64;
    while c < pieces {
        if ups != 0 && call.desc_pending {
            // A receiver checks the descriptors before its first wait: on a mismatch the
            // senders never signal.
            // SAFETY: every thread of the block; first use of the agreement slots here.
            if !unsafe { ctx.check_pending(call, t) } {
                break;
            }
        }
        if up || (down && j >= depth) {
            // Upstream: the piece has landed. Downstream: the sub-slot's piece `j - depth` was
            // consumed (acknowledgements come in piece order).
            // SAFETY: t a peer (masks exclude the own rank); b < MAX_BLOCKS; this thread is
            // the only waiter for (t, b).
            unsafe { ctx.wait(call, t, b) };
        }
        arch::sync_threads();
        if !ctx.block_agree(call, t) {
            break;
        }
        let off = c * piece;
        work(off, piece.min(bytes - off), chunk_at + (j % depth) * piece);
        arch::sync_threads();
        if call.desc_pending {
            // A rank that only sends: its first piece is written (into slots no peer reads
            // before a signal), the descriptors are checked before it signals.
            // SAFETY: every thread of the block, synced since the last agreement.
            if !unsafe { ctx.check_pending(call, t) } {
                break;
            }
        }
        if up || down {
            // SAFETY: as above; release publishes the block's work (synced above).
            unsafe { ctx.signal(t, b) };
        }
        j += 1;
        c += nb as u64;
    }
    if down && !call.failed {
        // The acknowledgements still due: every piece has been consumed downstream.
        for _ in 0..j.min(depth) {
            // SAFETY: as above.
            if !unsafe { ctx.wait(call, t, b) } {
                break;
            }
        }
    }
    arch::sync_threads();
    ctx.block_agree(call, t)
}
