//! The LL-packet call protocol of the small-message paths of reduce-scatter, broadcast,
//! all-to-all and reduce, written with one-shot all-reduce's primitives: the call ([`Call`])
//! with its sequence number from the one call counter of [`CollContext::state`], its packet
//! flag and the alternating packet halves ([`packet_half`]). Every call of every collective
//! advances that one counter, so consecutive calls of different collectives alternate halves
//! and never share a flag.
//!
//! As in one-shot, block 0's first threads (thread `p` for rank `p`, in a warp that carries
//! no data: `lanes`) send the call descriptor to every peer (`sent`) and check the peers'
//! at the end (`end`), off the data's critical path; a late data packet makes its poller
//! look at the sender's descriptor too ([`CollContext::keep_waiting`]), so a rank waiting
//! for data a peer of another call never sends stops as soon as that descriptor is there.
//!
//! A writer reuses a half two calls later. That is safe because every rank, before it ends a
//! call, has read every peer's descriptor of that call, which the peer sent after finishing
//! its previous call: also for the rooted collectives (broadcast, reduce), whose data moves
//! one way only.

use super::{Call, CollContext, MAX_RANKS, fault, packet_half};
use crate::arch;
use crate::packet::LlPacket;

/// One LL call as a thread sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LlCall {
    /// The call (sequence number, descriptor, failure).
    pub(crate) call: Call,
    /// Byte offset of this call's half in every packet scratch.
    pub(crate) half: u64,
    /// The rank this thread sends the descriptor to and checks, if any.
    desc_peer: Option<u32>,
}

/// Starts an LL call carrying `units` packets per peer pair, with descriptor `(n, tag)`:
/// traps if the grid has more than `MAX_BLOCKS` blocks (the counter's copies) or fewer than
/// `nranks` threads per block (a descriptor thread per rank), or if the packets overflow a
/// half; reads the call counter.
///
/// # Safety
/// Every thread of the grid calls it once, first, and [`end`] once, last; the context valid.
#[inline(always)]
pub(crate) unsafe fn begin(ctx: &CollContext, units: u64, n: u64, tag: u64) -> LlCall {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    super::all_reduce::check_grid(ctx, nb, nt);
    if units > packet_half(ctx.packets_len) / 16 {
        // More than a half of the packet scratch holds: never write past it.
        arch::trap();
    }
    // SAFETY: b < MAX_BLOCKS; end() calls finish() on every thread.
    let call = unsafe { ctx.call(b, n, tag) };
    LlCall {
        half: packet_half(ctx.packets_len) * (call.seq & 1),
        call,
        desc_peer: super::all_reduce::desc_thread(ctx, t, b),
    }
}

/// Sends the call's descriptor, if this thread is a descriptor thread: after its data
/// packets.
///
/// # Safety
/// As for [`begin`]; once per thread.
#[inline(always)]
pub(crate) unsafe fn sent(ctx: &CollContext, call: &LlCall) {
    if let Some(p) = call.desc_peer {
        // SAFETY: p is a peer.
        unsafe { ctx.send_desc(&call.call, p) };
    }
}

/// Ends an LL call: the descriptor threads check their peer's descriptor (waited for even
/// after a failure of the call, see [`CollContext::check_desc`]); then every thread
/// advances the call counter.
///
/// # Safety
/// Every thread of the grid calls it once, last, with its [`begin`] result, after [`sent`].
#[inline(always)]
pub(crate) unsafe fn end(ctx: &CollContext, call: &mut LlCall) {
    if let Some(p) = call.desc_peer {
        // SAFETY: p is a peer.
        unsafe { ctx.check_desc(&mut call.call, p) };
    }
    // SAFETY: every thread of every block gets here.
    unsafe { ctx.finish(&call.call) };
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
        LlPacket::write(slot as *mut LlPacket, d, call.call.flag());
    }
}

/// Polls packet `i` of this call from rank `peer`, inline; every `SLOW_POLLS` failed polls
/// [`CollContext::keep_waiting`] looks at the clock, the fault words and the peer's
/// descriptor. After a failed wait of the call, returns 0 at once (the result is undefined
/// then).
///
/// # Safety
/// As for [`put`].
#[inline(always)]
pub(crate) unsafe fn get(ctx: &CollContext, call: &mut LlCall, peer: u32, i: u64) -> u64 {
    // SAFETY: this rank's packet scratch for rank `peer`, same bounds as in `put`.
    unsafe {
        let slot = ctx.packets_in[peer as usize & (MAX_RANKS - 1)]
            .add((call.half + 16 * i) as usize) as *const LlPacket;
        let flag = call.call.flag();
        ctx.poll_packet(&mut call.call, slot, flag, peer, fault::AT_PACKET)
    }
}

/// This thread's first unit and the data threads' stride: block 0's first warp, which holds
/// the descriptor threads, carries no data ([`data_threads`](super::all_reduce::data_threads)).
#[inline(always)]
pub(crate) fn lanes() -> (u64, u64) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    super::all_reduce::data_threads(t, nt, b, nb)
}
