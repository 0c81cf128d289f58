//! The LL-packet call protocol of the small-message paths of reduce-scatter, broadcast,
//! all-to-all and reduce, written with one-shot all-reduce's primitives: the one call counter
//! of [`CollContext::state`] (read with `read_counter`, advanced with `advance_counter`), its
//! packet flag `calls + 1` and the alternating packet halves ([`packet_half`]). Every LL call
//! of every collective advances that one counter, so consecutive calls of different
//! collectives alternate halves and never share a flag.
//!
//! A writer reuses a half two calls later. That is safe when, in the call in between, it
//! received something from the reader that the reader sent after finishing the older call:
//! true when every pair of ranks exchanges data (all-reduce, reduce-scatter, all-to-all). The
//! rooted collectives (broadcast, reduce) move data one way only, so their calls also pass a
//! *token*: block 0's thread `p` writes one packet into rank `p`'s packet scratch at the
//! start of the call (in the last packet of the half, [`token_slot`]) and polls the token of
//! rank `p` before the call ends. Their data therefore takes one packet less of a half
//! ([`rooted_ll_max_bytes`]).

use super::all_reduce::{advance_counter, read_counter};
use super::{CollContext, MAX_BLOCKS, MAX_RANKS, packet_half};
use crate::arch;
use crate::packet::LlPacket;

/// One LL call as a thread sees it: the flag and the byte offset of the half.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LlCall {
    calls: u64,
    /// The packet flag of this call (`calls + 1`, never 0).
    pub(crate) flag: u32,
    /// Byte offset of this call's half in every packet scratch.
    pub(crate) half: u64,
}

/// Index of the token packet in a half (its last packet).
#[inline(always)]
pub fn token_slot(packets_len: u64) -> u64 {
    (packet_half(packets_len) / 16).saturating_sub(1)
}

/// The largest message (bytes per peer pair) the rooted LL paths carry: one-shot's limit
/// less the token's packet.
#[inline(always)]
pub fn rooted_ll_max_bytes(packets_len: u64) -> u64 {
    token_slot(packets_len) * 8
}

/// Starts an LL call carrying `units` packets per peer pair: traps if the grid has more
/// than `MAX_BLOCKS` blocks (the counter's copies) or the packets (with the token for
/// `rooted` calls) overflow a half; reads the call counter; `rooted`: block 0's threads
/// `p < nranks` send their token to rank `p`.
///
/// # Safety
/// Every thread of the grid calls it once, first; the context valid; every rank makes the
/// same sequence of LL calls.
#[inline(always)]
pub(crate) unsafe fn begin(ctx: &CollContext, units: u64, rooted: bool) -> LlCall {
    let (t, b, nb) = (
        arch::thread_idx_x(),
        arch::block_idx_x(),
        arch::grid_dim_x(),
    );
    if nb as usize > MAX_BLOCKS {
        arch::trap();
    }
    let cap = if rooted {
        token_slot(ctx.packets_len)
    } else {
        packet_half(ctx.packets_len) / 16
    };
    if units > cap {
        arch::trap();
    }
    // SAFETY: b < MAX_BLOCKS; the one-shot call counter is the first of the state's two.
    let calls = unsafe { read_counter(ctx.state, b) };
    let call = LlCall {
        calls,
        flag: (calls % u32::MAX as u64) as u32 + 1,
        half: packet_half(ctx.packets_len) * (calls & 1),
    };
    if rooted && b == 0 && t < ctx.nranks && t != ctx.rank {
        // SAFETY: the token slot lies in the half (token_slot < half / 16).
        unsafe { put(ctx, &call, t, token_slot(ctx.packets_len), 0) };
    }
    call
}

/// Ends an LL call: `rooted`: block 0's threads `p < nranks` poll rank `p`'s token (trap
/// after the timeout); then every thread advances the call counter.
///
/// # Safety
/// Every thread of the grid calls it once, last, with the [`begin`] result and `rooted`.
#[inline(always)]
pub(crate) unsafe fn end(ctx: &CollContext, call: &LlCall, rooted: bool) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    if rooted && b == 0 && t < ctx.nranks && t != ctx.rank {
        // SAFETY: as in begin.
        unsafe { get(ctx, call, t, token_slot(ctx.packets_len)) };
    }
    // SAFETY: every thread of every block gets here, after reading the counter in begin.
    unsafe { advance_counter(ctx.state, call.calls + 1, t, nt, b, nb) };
}

/// Writes packet `i` (8 data bytes `d`) of this call into rank `peer`'s packet scratch for
/// this rank.
///
/// # Safety
/// `peer < nranks`, `peer != rank`; `i` below the half's packets (checked in [`begin`]).
#[inline(always)]
pub(crate) unsafe fn put(ctx: &CollContext, call: &LlCall, peer: u32, i: u64, d: u64) {
    // SAFETY: within the peer's packet scratch for this rank, mapped here, accessed by
    // packets only (caller contract); masked: no bounds check in the kernel.
    unsafe {
        let slot =
            ctx.packets_out[peer as usize & (MAX_RANKS - 1)].add((call.half + 16 * i) as usize);
        LlPacket::write(slot as *mut LlPacket, d, call.flag);
    }
}

/// Polls packet `i` of this call from rank `peer` (traps after the timeout).
///
/// # Safety
/// As for [`put`].
#[inline(always)]
pub(crate) unsafe fn get(ctx: &CollContext, call: &LlCall, peer: u32, i: u64) -> u64 {
    // SAFETY: this rank's packet scratch for rank `peer`, same bounds as in `put`.
    let got = unsafe {
        let slot =
            ctx.packets_in[peer as usize & (MAX_RANKS - 1)].add((call.half + 16 * i) as usize);
        LlPacket::poll(slot as *const LlPacket, call.flag, ctx.timeout_ns)
    };
    match got {
        Some(v) => v,
        None => arch::trap(),
    }
}

/// This thread's first unit and the grid's stride.
#[inline(always)]
pub(crate) fn lanes() -> (u64, u64) {
    let (t, nt) = (arch::thread_idx_x() as u64, arch::block_dim_x() as u64);
    let (b, nb) = (arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
    (b * nt + t, nb * nt)
}
