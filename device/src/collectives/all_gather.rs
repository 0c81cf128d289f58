//! All-gather over the scratch. See the [parent module](super) for the shared state.

use super::{CollContext, rotated_rank, round_share};
use crate::arch;
use crate::channel::memory::copy;

/// Pieces per block share of a full scratch round: the pipeline depth of [`all_gather`].
pub const PIECES_PER_SHARE: u64 = 8;

/// All-gather of `bytes` per rank: rank `q`'s `send` lands at `recv + q * bytes` on every
/// rank. The scratch holds one slot per source rank (`scratch_len / nranks`); rank `q`
/// writes into slot `q` of every peer's scratch. In rounds of one slot, each block owning one
/// fixed share of it, cut into pieces (a full round's share into [`PIECES_PER_SHARE`]) and
/// pipelined: the block's first half of threads puts piece `k + 1` of the own share into
/// every peer's scratch (and copies it to the own place of `recv`) while its second half
/// copies piece `k` of every peer's share from the own scratch into `recv`. NVLink carries
/// only writes (puts reach a higher bandwidth than gets when both directions are busy).
/// Between steps the block synchronises, and its threads `p < nranks` signal peer `p` that
/// the next piece is written / wait for peer `p`'s. A share of one piece is put and copied
/// out by the whole block. A barrier ends each round (after it no peer writes this scratch
/// until it has been copied out, so the next round or call may reuse it). In place
/// (`send == recv + rank * bytes`) is allowed.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; grid ≤ `MAX_BLOCKS` blocks
/// of at least `nranks` threads; the context valid; `send` valid for `bytes`, `recv` for
/// `nranks * bytes`; every rank calls it with the same `bytes` and grid.
#[inline(always)]
pub unsafe fn all_gather(ctx: &CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let (r, n) = (ctx.rank, ctx.nranks);
    super::all_reduce::check_grid(ctx, nb, nt);
    // SAFETY: b < MAX_BLOCKS (check_grid); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, bytes, tag) };
    // SAFETY: every thread of the block; block-uniform (see `CollContext::begin`).
    let go = unsafe { ctx.begin(&mut call, b, t) };
    let slot = ctx.scratch_len / n as u64 / 16 * 16;
    let rounds = if slot == 0 { 0 } else { bytes.div_ceil(slot) };
    let piece = (slot / (nb as u64 * PIECES_PER_SHARE) / 16 * 16).max(16);
    for j in 0..if go { rounds } else { 0 } {
        if call.failed {
            break;
        }
        let (s, e) = round_share(slot, bytes, j, 16, b as u64, nb as u64);
        let pieces = (e - s).div_ceil(piece);
        // One piece: the whole block puts it and copies it out. More: half and half.
        let half = if pieces > 1 { nt / 2 } else { 0 };
        let ps = |k: u64| s + k * piece;
        let len = |k: u64| piece.min(e - ps(k));
        let at = Place {
            slot,
            bytes,
            round_off: j * slot,
        };
        if pieces > 0 {
            // SAFETY: piece 0 of the block's share (see `push`); the last round barrier.
            unsafe { push(ctx, &at, send, recv, ps(0), len(0), t, nt) };
            arch::sync_threads();
            if t < n && t != r {
                // SAFETY: b < MAX_BLOCKS, t a peer; the block's piece is written (barrier).
                unsafe { ctx.signal(t, b) };
            }
        }
        for k in 0..pieces {
            if t < n && t != r {
                // SAFETY: as above.
                unsafe { ctx.wait(&mut call, t, b) };
            }
            arch::sync_threads();
            // Block-uniform from here (the slots were last read before the sync ending
            // the previous step).
            if !ctx.block_agree(&mut call, t) {
                break;
            }
            // SAFETY: pieces of the block's share; the peers' piece k was published by their
            // signals, waited for before the barrier above; the peers copy piece k + 1 out of
            // their scratch only after our next signal.
            unsafe {
                if half == 0 {
                    drain(ctx, &at, recv, ps(k), len(k), t, nt);
                } else if t < half {
                    if k + 1 < pieces {
                        push(ctx, &at, send, recv, ps(k + 1), len(k + 1), t, half);
                    }
                } else {
                    drain(ctx, &at, recv, ps(k), len(k), t - half, nt - half);
                }
            }
            arch::sync_threads();
            if k + 1 < pieces && t < n && t != r && !call.failed {
                // SAFETY: as above; piece k + 1 is written (barrier).
                unsafe { ctx.signal(t, b) };
            }
        }
        if call.failed {
            break;
        }
        // SAFETY: every thread of the block.
        unsafe { ctx.barrier(&mut call, b, t) };
    }
    // SAFETY: every thread of every block gets here.
    unsafe { ctx.finish(&call) };
}

/// Where a round's pieces go: the slot size, the bytes per rank and the round's offset in them.
struct Place {
    slot: u64,
    bytes: u64,
    round_off: u64,
}

/// Puts `len` bytes at `ps` of the own share of a round from `send` into slot `rank` of every
/// peer's scratch, and copies them to the own place of `recv`. Out of line (as is [`drain`]):
/// inlined in every branch of the pipeline the copies spilled registers.
///
/// # Safety
/// `ps..ps + len` lies in a slot and `round_off + ps..` plus `len` in `send` and in each
/// rank's part of `recv`; no peer copies that part of its slot out now.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
unsafe fn push(
    ctx: &CollContext,
    at: &Place,
    send: *const u8,
    recv: *mut u8,
    ps: u64,
    len: u64,
    thread: u32,
    threads: u32,
) {
    let (r, off) = (ctx.rank, at.round_off + ps);
    // SAFETY: caller contract.
    unsafe {
        let src = send.add(off as usize);
        for k in 0..ctx.nranks {
            let p = rotated_rank(r, ctx.nranks, arch::block_idx_x(), k);
            if p != r {
                let dst = ctx.peer_scratch[p as usize].add((r as u64 * at.slot + ps) as usize);
                copy(dst, src, len, thread, threads);
            }
        }
        let own = recv.add((r as u64 * at.bytes + off) as usize);
        if !core::ptr::eq(own as *const u8, src) {
            copy(own, src, len, thread, threads);
        }
    }
}

/// Copies `len` bytes at `ps` of every peer's slot of the own scratch into its place in
/// `recv` (see [`push`]).
///
/// # Safety
/// As for [`push`], and every peer has written and published this part of its slot.
#[inline(never)]
unsafe fn drain(
    ctx: &CollContext,
    at: &Place,
    recv: *mut u8,
    ps: u64,
    len: u64,
    thread: u32,
    threads: u32,
) {
    let off = at.round_off + ps;
    for p in 0..ctx.nranks {
        if p != ctx.rank {
            // SAFETY: caller contract.
            unsafe {
                let dst = recv.add((p as u64 * at.bytes + off) as usize);
                let src = ctx.scratch.add((p as u64 * at.slot + ps) as usize);
                copy(dst, src, len, thread, threads);
            }
        }
    }
}

/// All-gather of `bytes` per rank through LL packets, for small messages: every rank writes
/// its input as LL packets (8 data bytes and the call's flag in one 16-byte store) into each
/// peer's packet scratch, copies it to its own place of `recv`, and copies what arrives from
/// each peer to that peer's place. No signal and no barrier, like one-shot all-reduce (same
/// packet halves alternating by the call counter, same descriptor threads: the first threads
/// of block 0, in a warp that carries no data). Unit `i` (8 bytes) belongs to the same data
/// thread in both phases (`all_reduce::data_threads`), so in place
/// (`send == recv + rank * bytes`) is safe.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; at most `MAX_BLOCKS` blocks of
/// at least `nranks` threads; the context valid with `bytes.div_ceil(8) * 16 <=
/// packet_half(packets_len)`; `send` valid for `bytes`, `recv` for `nranks * bytes`.
#[inline(always)]
pub unsafe fn all_gather_packets(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    bytes: u64,
    tag: u64,
) {
    use super::all_reduce::{load_unit, recv_unit, send_unit, store_unit};
    // SAFETY: first thing of every thread (launched with PDL by the host).
    unsafe { ctx.dependent_launch_entry() };
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let units = bytes.div_ceil(8);
    super::all_reduce::check_grid(ctx, nb, nt);
    // SAFETY: b < MAX_BLOCKS; finish() below on every thread.
    let mut call = unsafe { ctx.call(b, bytes, tag) };
    let half = super::packet_half(ctx.packets_len) * (call.seq & 1);
    if units * 16 > super::packet_half(ctx.packets_len) {
        arch::trap();
    }
    let (r, n) = (ctx.rank, ctx.nranks);
    // Every rank's place in recv is aligned when recv and bytes are.
    let aligned = (send as usize | recv as usize | bytes as usize).is_multiple_of(8);
    let (first, stride) = super::all_reduce::data_threads(t, nt, b, nb);
    let desc_peer = super::all_reduce::desc_thread(ctx, t, b);
    let own = recv.wrapping_add((r as u64 * bytes) as usize);
    let mut i = first;
    while i < units {
        // SAFETY: i < units; send valid for bytes, own place of recv too (caller contract);
        // in place, the unit is read before it is written back unchanged.
        unsafe {
            let d = load_unit(send, i, bytes, aligned);
            send_unit(ctx, half, i, d, call.flag());
            if !core::ptr::eq(own as *const u8, send) {
                store_unit(own, i, bytes, d, aligned);
            }
        }
        i += stride;
    }
    if let Some(p) = desc_peer {
        // SAFETY: p is a peer.
        unsafe { ctx.send_desc(&call, p) };
    }
    let mut i = first;
    while i < units {
        for k in 0..n {
            let q = rotated_rank(r, n, i as u32, k);
            if q != r {
                // SAFETY: q a peer; rank q's place of recv holds bytes (caller contract).
                unsafe {
                    let v = recv_unit(ctx, &mut call, half, i, q);
                    store_unit(recv.add((q as u64 * bytes) as usize), i, bytes, v, aligned);
                }
            }
        }
        i += stride;
    }
    if let Some(p) = desc_peer {
        // SAFETY: p is a peer; waited for even after a failure (see `check_desc`).
        unsafe { ctx.check_desc(&mut call, p) };
    }
    // SAFETY: every thread of every block gets here.
    unsafe { ctx.finish(&call) };
}
