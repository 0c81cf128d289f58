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
//! communicator), and block `k` always moves rows `k`, `k + ll_blocks`, … of
//! [`P2pOps::ll_row`] units, so the sender's block `k` and the receiver's block `k` share a
//! set of packet slots across transfers, whatever the block size of either launch (a group
//! of LL transfers only is launched with blocks as small as its largest transfer allows). The packets of transfer `x` (see below) carry the
//! flag `x + 1` and use half `x & 1` of the packet scratch. Before writing into a half,
//! sender block `k` waits until receiver block `k` has reported (a *done* word at the end of
//! the sender's packet scratch for that peer, written by the receiver with a maximum) that
//! it finished the last LL transfer through that half: usually long ago, so the check costs
//! one local load.
//!
//! ## Mismatched sizes
//!
//! Every transfer has a number `x` between its pair in its direction (0 for the first),
//! counted on both sides in the p2p state words after [`STATE_WORDS`] (one counter per peer
//! and direction, kept like the call counter), so both sides agree on it whatever the sizes.
//! Each side *posts* its size at the start of a transfer: one LL packet (flag `x + 1`) in a
//! ring of [`P2P_POST_RING`] at the end of the peer's packet scratch ([`P2P_TAIL_BYTES`]).
//! An LL send also writes its size in a header packet per block, next to its data.
//!
//! - A pipelined send copies its first piece, then signals it only once the receiver's post
//!   shows the same size (usually there long before the copy ends); otherwise it signals
//!   nothing and records the mismatch at once.
//! - A receive compares the sender's size: an LL receive reads its block's header after
//!   its data (a smaller receive reads every unit it wants), and a wait that is not
//!   answered looks at the header and the sender's post every
//!   [`SLOW_POLLS`](super::SLOW_POLLS) polls (a larger receive, or one on the other path). A
//!   pipelined receive takes the first signal of a transfer only once the sender's post
//!   shows the same size.
//! - Nothing is signalled or acknowledged for a mismatched transfer, both sides count it,
//!   LL flags and halves follow `x`, and a receive that will not read an LL send's packets
//!   marks it skipped (a word per LL block and half beside the done words; not the done word,
//!   which a slower block of the receiver may still owe for the transfer before it through
//!   that half): the pair stays in step, and only that transfer fails
//!   (recorded with [`CollContext::record`], which does not stop the call's other waits).
//! - An LL send is eager: it ends before the receiver looks. The receiver leaves a note in
//!   the sender's packet scratch, which the sender's send reports once it has written its
//!   data if the note is there, else its next send to that peer (as a mismatch found by a
//!   note, [`fault::AT_P2P_EARLIER`]); two notes before the sender looks keep the newer.

use super::all_reduce::{advance_counter, read_counter};
use super::{COUNTER_WORDS, Call, CollContext, MAX_BLOCKS, MAX_RANKS, STATE_WORDS, desc, fault};
use crate::arch;
use crate::packet::{LlPacket, LlWidePacket};

pub(super) mod ll;
mod pipelined;

use ll::ll_transfer;
use pipelined::transfer;

/// Most operations of one group.
pub const MAX_P2P_OPS: usize = 16;
/// Most blocks one transfer uses (chunks per slot); semaphores `0..P2P_MAX_BLOCKS` carry
/// data signals, `P2P_MAX_BLOCKS..2 * P2P_MAX_BLOCKS` acknowledgements.
pub const P2P_MAX_BLOCKS: u32 = 64;
/// Most sub-slots per block chunk ([`P2pOps::depth`]).
pub const P2P_MAX_DEPTH: u32 = 4;
/// Most blocks of an LL transfer ([`P2pOps::ll_blocks`]); sets the state and done words.
pub const P2P_LL_BLOCKS: u32 = 16;
/// Transfers whose posts (sizes) a packet scratch keeps: a ring indexed by transfer number
/// (see the [module](self), "Mismatched sizes").
pub const P2P_POST_RING: u64 = 32;
/// Bytes at the end of every packet scratch of a p2p context, all written by the scratch's
/// writer `w` (in rank `r`'s scratch for `w`): the done words of the LL transfers `r` sends
/// `w` (one per LL block, 128 bytes), the skip words (per half and LL block: the last LL
/// send of `r` that `w` received as a pipelined transfer, so never read), a note of the last LL send of `r` that `w` received
/// with another size (32), the posts of `w`'s receives from `r` and of `w`'s sends to `r`
/// ([`P2P_POST_RING`] packets each), the LL headers of `w`'s sends (two halves of one packet
/// per LL block).
pub const P2P_TAIL_BYTES: u64 = TAIL_HEADER + 2 * P2P_LL_BLOCKS as u64 * 16;
const TAIL_SKIP: u64 = P2P_LL_BLOCKS as u64 * 8;
const TAIL_NOTE: u64 = TAIL_SKIP + 2 * P2P_LL_BLOCKS as u64 * 8;
const TAIL_RPOST: u64 = TAIL_NOTE + 32;
const TAIL_SPOST: u64 = TAIL_RPOST + P2P_POST_RING * 16;
const TAIL_HEADER: u64 = TAIL_SPOST + P2P_POST_RING * 16;
const _: () = assert!(P2P_TAIL_BYTES.is_multiple_of(32));
/// State words of a p2p context after [`STATE_WORDS`]: the transfer counters per direction
/// (send, receive) and peer (each [`COUNTER_WORDS`] long), then per peer, LL block and half
/// the number (plus one) of the last LL send through it, then per peer the flag of the last
/// note reported.
pub const P2P_STATE_WORDS: usize = REPORTED_AT + MAX_RANKS;
const LAST_LL_AT: usize = 2 * MAX_RANKS * COUNTER_WORDS;
const REPORTED_AT: usize = LAST_LL_AT + MAX_RANKS * P2P_LL_BLOCKS as usize * 2;
/// Bit of a p2p mismatch record's tag where the transfer number (its low 24 bits) starts
/// (see [`p2p_desc`]).
pub const P2P_XFER_SHIFT: u32 = 40;

/// One side of a transfer as a mismatch record holds it (`[bytes, tag]`): the tag is
/// [`desc::SEND_RECV`] with algorithm 1 for the sending side, 2 for the receiving side, the
/// other rank in the root field, and the transfer's number between the pair in that
/// direction (0 for the first) from [`P2P_XFER_SHIFT`].
#[inline(always)]
pub const fn p2p_desc(bytes: u64, send: bool, other: u32, xfer: u64) -> [u64; 2] {
    let algo = if send { 1 } else { 2 };
    [
        bytes,
        desc::rooted_tag(desc::SEND_RECV, 0, 0, algo, other as u64)
            | (xfer & 0xff_ffff) << P2P_XFER_SHIFT,
    ]
}

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
/// `ll_max`, `ll_blocks` and `ll_row` must be the same on every rank of the communicator (both sides
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
    /// Units (8 bytes) per row of an LL transfer: block `k` of `ll_blocks` owns rows `k`,
    /// `k + ll_blocks`, … of this many units each, whatever the launch's block size, so the
    /// two sides of a transfer agree on what each block moves even when their launches have
    /// different block sizes (0: the launch's block size). Equal on every rank.
    pub ll_row: u32,
    /// The operations, in call order.
    pub ops: [P2pOp; MAX_P2P_OPS],
}

const _: () = assert!(core::mem::size_of::<P2pOps>() == 536);

/// Bytes of each of the two packet halves of a p2p packet scratch of `packets_len` bytes.
#[inline(always)]
pub fn p2p_ll_half(packets_len: u64) -> u64 {
    packets_len.saturating_sub(P2P_TAIL_BYTES) / 2 / 16 * 16
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

/// The flag of transfer `xfer`'s packets (its LL data, header and posts; never 0).
#[inline(always)]
fn flag_of(xfer: u64) -> u32 {
    (xfer % u32::MAX as u64) as u32 + 1
}

/// The tail ([`P2P_TAIL_BYTES`]) of packet scratch `base` plus `at` bytes.
#[inline(always)]
fn tail(ctx: &CollContext, base: *mut u8, at: u64) -> *mut u8 {
    base.wrapping_add((ctx.packets_len - P2P_TAIL_BYTES + at) as usize)
}

/// Offset in the tail of the skip word of LL block `k` and half `parity`.
#[inline(always)]
fn skip_off(k: u32, parity: u64) -> u64 {
    TAIL_SKIP + (parity * P2P_LL_BLOCKS as u64 + k as u64) * 8
}

/// This rank's transfer counter for `peer` in one direction (see [`P2P_STATE_WORDS`]).
#[inline(always)]
fn xfer_counter(ctx: &CollContext, send: bool, peer: u32) -> *mut u64 {
    let dir = (!send) as usize;
    ctx.state.wrapping_add(
        STATE_WORDS + (dir * MAX_RANKS + (peer as usize & (MAX_RANKS - 1))) * COUNTER_WORDS,
    )
}

/// The size rank `peer` posted for its send `xfer` to this rank, if its post has arrived, or
/// (`k` given: an LL receive's block) the header of its LL block `k`.
///
/// # Safety
/// `peer` a peer; the context a p2p context.
#[inline(always)]
unsafe fn sent_bytes(ctx: &CollContext, peer: u32, xfer: u64, k: Option<u32>) -> Option<u64> {
    let inp = ctx.packets_in[peer as usize & (MAX_RANKS - 1)];
    let flag = flag_of(xfer);
    if let Some(k) = k {
        let at = TAIL_HEADER + ((xfer & 1) * P2P_LL_BLOCKS as u64 + k as u64) * 16;
        // SAFETY: a header slot of this rank's packet scratch written by the peer, accessed
        // by packets only.
        if let Some(n) = unsafe { LlPacket::read(tail(ctx, inp, at) as *const LlPacket, flag) } {
            return Some(n);
        }
    }
    let at = TAIL_SPOST + (xfer % P2P_POST_RING) * 16;
    // SAFETY: as above, a post slot.
    unsafe { LlPacket::read(tail(ctx, inp, at) as *const LlPacket, flag) }
}

/// Runs the operations of `ops` that block `blockIdx.x` takes part in, in order. Traps on an
/// empty piece, a peer out of range or the own rank, an LL transfer larger than the packet
/// scratch holds, or a grid of more than `MAX_BLOCKS` blocks.
///
/// A launch is one call of the p2p context ([`Call`], on the p2p context's own call counter
/// and local fault words, so sends and receives never shift the collectives' sequence) with
/// the descriptor `(ops.count, SEND_RECV tag)`; it exchanges no call descriptor (a pair's
/// operations are not a call of every rank), but every transfer carries its size (see the
/// [module](self), "Mismatched sizes"): a send and a receive of different sizes are
/// recorded as a [`fault::MISMATCH`] of that transfer alone (the call's other operations go
/// on) and leave the pair in step. Waits follow the fault protocol: they give up on abort or
/// timeout, recording why in the fault area the p2p context shares with the collectives, and
/// the block skips the rest of its operations (keeping every `sync_threads`).
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; `ctx` a p2p context (its
/// scratch a slot of `scratch_len` bytes per source rank, its semaphores, expected and state
/// words its own, its packet scratch ending with [`P2P_TAIL_BYTES`]); every operation's
/// buffer valid for its bytes; the peers post the same number of operations per pair and
/// direction, in the same order, and run them concurrently with these.
#[inline(always)]
pub unsafe fn run(ctx: &CollContext, ops: &P2pOps) {
    // The operations are indexed at run time below. Indexing the kernel parameter itself
    // made every thread copy all 536 bytes of it into local memory first (about 7 us per
    // launch of 32 blocks on an H200); thread 0 copies it into shared memory instead, with
    // constant offsets, before the dependency wait: a kernel parameter is not memory an
    // earlier kernel writes, and the copy (0.8 us of a 5.7 us send/recv of 8 bytes under a
    // CUDA graph on one H200, timed in the kernel) then overlaps the end of the previous
    // kernel.
    let shared = crate::shared_array!(P2P_OPS: P2pOps; 1);
    if arch::thread_idx_x() == 0 {
        // SAFETY: the block's own shared array of one P2pOps, read after the barrier.
        unsafe { copy_ops_to_shared(ops, shared) };
    }
    // SAFETY: the host launches it with PDL (`gpu.rs`); nothing above touches memory an
    // earlier kernel writes.
    unsafe { ctx.dependent_launch_entry() };
    let b = arch::block_idx_x();
    arch::sync_threads();
    // SAFETY: written above before the barrier, never written again in this launch.
    let ops = unsafe { &*shared };
    let depth = p2p_depth(ctx.scratch_len, ops.depth);
    let piece = p2p_piece(ctx.scratch_len, ops.depth);
    if piece == 0
        || arch::grid_dim_x() as usize > MAX_BLOCKS
        || ops.ll_max > p2p_ll_capacity(ctx.packets_len)
        || ctx.packets_len < P2P_TAIL_BYTES
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
        if op.peer >= ctx.nranks || op.peer == ctx.rank || op.blocks > P2P_MAX_BLOCKS {
            arch::trap();
        }
        // The transfer's number between the pair in its direction: the same on both sides
        // whatever the sizes (both post the same operations per pair and direction).
        let earlier = ops.ops[..i]
            .iter()
            .filter(|o| o.peer == op.peer && o.send == op.send)
            .count() as u64;
        // SAFETY: the counter's COUNTER_WORDS words are this context's state (caller
        // contract), advanced only at the end of launches.
        let xfer = unsafe { read_counter(xfer_counter(ctx, op.send != 0, op.peer), b) } + earlier;
        i += 1;
        if b >= op.first_block && b - op.first_block < op.blocks {
            let k = b - op.first_block;
            if k == 0 && arch::thread_idx_x() == 0 {
                // SAFETY: forwarded; the peer checked above.
                unsafe { post(ctx, op, xfer) };
            }
            if is_ll(op.bytes, ops.ll_max) {
                if op.blocks != ops.ll_blocks {
                    arch::trap();
                }
                // SAFETY: forwarded; k < ll_blocks <= P2P_LL_BLOCKS, the packets fit (checked
                // above).
                unsafe { ll_transfer(ctx, &mut call, op, k, xfer, ops) };
            } else {
                // SAFETY: forwarded; k < op.blocks <= P2P_MAX_BLOCKS.
                unsafe { transfer(ctx, &mut call, op, k, piece, depth, xfer, ops) };
            }
            if k == 0 && op.send != 0 && arch::thread_idx_x() == 0 {
                // After the data, off its path.
                // SAFETY: forwarded.
                unsafe { report_note(ctx, &call, op) };
            }
        }
    }
    // Advance the transfer counter of every (peer, direction) of the launch, once each.
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let nb = arch::grid_dim_x();
    for (i, op) in ops.ops[..n].iter().enumerate() {
        let same = |o: &P2pOp| o.peer == op.peer && o.send == op.send;
        if ops.ops[..i].iter().any(same) {
            continue;
        }
        let count = ops.ops[..n].iter().filter(|o| same(o)).count() as u64;
        let counter = xfer_counter(ctx, op.send != 0, op.peer);
        // SAFETY: every thread of every block, after reading the counter above (each block
        // runs this same loop); the counter's words are the context's own.
        unsafe {
            let base = read_counter(counter, b);
            advance_counter(counter, base + count, t, nt, b, nb);
        }
    }
    // SAFETY: every thread of every block gets here.
    unsafe { ctx.finish(&call) };
}

/// Copies the launch's operations from the kernel parameter into the block's shared array
/// with explicit shared-memory stores: parameter loads and shared stores only, so that it
/// may run before the dependency wait (`golden_ptx` checks the PTX).
///
/// # Safety
/// `dst` the block's shared array of one `P2pOps`, not accessed concurrently.
#[inline(always)]
unsafe fn copy_ops_to_shared(ops: &P2pOps, dst: *mut P2pOps) {
    // Unrolled by hand: a loop (or an array of the words) is kept in local memory.
    macro_rules! copy {
        ($($i:literal)*) => {
            const _: () = assert!(core::mem::size_of::<P2pOps>() == 8 * [$($i),*].len());
            let (src, dst) = (ops as *const P2pOps as *const u64, dst as *mut u64);
            // SAFETY: P2pOps is 8-aligned plain data of these words; word i of the
            // caller's shared array.
            $(unsafe { arch::st_shared_u64(dst.add($i), src.add($i).read()) };)*
        };
    }
    copy!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
        62 63 64 65 66);
}

/// Thread 0 of an operation's block 0, at its start: posts the operation's size for the
/// peer (a send: into the peer's scratch, where its receive's waits look; a receive: where
/// the peer's send checks it before its first signal).
///
/// # Safety
/// `op.peer` a peer; the context a p2p context.
#[inline(always)]
unsafe fn post(ctx: &CollContext, op: &P2pOp, xfer: u64) {
    let peer = op.peer as usize & (MAX_RANKS - 1);
    let send = op.send != 0;
    let at = if send { TAIL_SPOST } else { TAIL_RPOST } + (xfer % P2P_POST_RING) * 16;
    // SAFETY: a post slot of the peer's packet scratch for this rank, accessed by packets
    // only; the ring is long enough that the peer has read the post it replaces.
    unsafe {
        LlPacket::write(
            tail(ctx, ctx.packets_out[peer], at) as *mut LlPacket,
            op.bytes,
            flag_of(xfer),
        )
    };
}

/// Thread 0 of a send's block 0, after its data: reports a note the peer left about an
/// earlier LL send of another size, once.
///
/// # Safety
/// `op.peer` a peer; the context a p2p context.
#[inline(always)]
unsafe fn report_note(ctx: &CollContext, call: &Call, op: &P2pOp) {
    let peer = op.peer as usize & (MAX_RANKS - 1);
    let note = tail(ctx, ctx.packets_in[peer], TAIL_NOTE) as *const u64;
    // SAFETY: the note in this rank's packet scratch written by the peer (two packets,
    // each read whole; the flags tell a torn note).
    let (lo, hi) = unsafe {
        (
            LlPacket::from_words(arch::ld_volatile_v2_u64(note)),
            LlPacket::from_words(arch::ld_volatile_v2_u64(note.add(2))),
        )
    };
    let f = lo.flag0;
    // SAFETY: this rank's own state word, used by this lane's block 0 only.
    let reported = unsafe { ctx.state.add(STATE_WORDS + REPORTED_AT + peer) };
    // SAFETY: as above.
    if f != 0 && lo.has_flag(f) && hi.has_flag(f) && unsafe { *reported } != f as u64 {
        // SAFETY: as above.
        unsafe { *reported = f as u64 };
        let earlier = f as u64 - 1;
        // SAFETY: the context valid.
        unsafe {
            ctx.record(
                call.seq,
                fault::MISMATCH,
                op.peer,
                p2p_desc(lo.data(), true, op.peer, earlier),
                p2p_desc(hi.data(), false, ctx.rank, earlier),
                fault::AT_P2P_EARLIER,
            )
        };
    }
}

/// Records on this rank that transfer `xfer` of `op` (`op.bytes`) met `theirs` bytes on the
/// peer, and (a receive from an LL send) leaves the sender a note of it. Thread 0 of the
/// operation's block 0.
///
/// # Safety
/// `op.peer` a peer; the context a p2p context.
#[inline(always)]
unsafe fn mismatch(
    ctx: &CollContext,
    call: &Call,
    op: &P2pOp,
    xfer: u64,
    theirs: u64,
    ll_max: u64,
) {
    let send = op.send != 0;
    // SAFETY: the context valid.
    unsafe {
        ctx.record(
            call.seq,
            fault::MISMATCH,
            op.peer,
            p2p_desc(op.bytes, send, op.peer, xfer),
            p2p_desc(theirs, !send, ctx.rank, xfer),
            fault::AT_P2P,
        )
    };
    if !send && is_ll(theirs, ll_max) {
        // The sender (eager) may have ended without knowing: tell it (see the module docs).
        let note = tail(
            ctx,
            ctx.packets_out[op.peer as usize & (MAX_RANKS - 1)],
            TAIL_NOTE,
        );
        // SAFETY: the note in the peer's packet scratch for this rank, accessed by packets.
        unsafe {
            LlWidePacket::write(note as *mut LlWidePacket, [theirs, op.bytes], flag_of(xfer))
        };
    }
}

/// Syncs the block and makes thread 0's outcome (the only waiter's: `call.failed`, or a
/// mismatch found, `theirs`) every thread's; `!call.failed && theirs.is_none()`. Every
/// thread of the block; a `sync_threads` between two uses.
#[inline(always)]
fn agree(call: &mut Call, theirs: &mut Option<u64>, t: u32) -> bool {
    let slot = crate::shared_array!(P2P_OUTCOME: u64; 2);
    if t == 0 {
        // SAFETY: the block's two slots, written by thread 0 only, read after the sync.
        unsafe {
            slot.write_volatile(call.failed as u64 | (theirs.is_some() as u64) << 1);
            slot.add(1).write_volatile(theirs.unwrap_or(0));
        }
    }
    arch::sync_threads();
    // SAFETY: as above.
    let (state, n) = unsafe { (slot.read_volatile(), slot.add(1).read_volatile()) };
    call.failed = state & 1 != 0;
    *theirs = (state & 2 != 0).then_some(n);
    !call.failed && theirs.is_none()
}
