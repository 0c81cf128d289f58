//! All-gather over the scratch. See the [parent module](super) for the shared state.

use super::{CollContext, block_share};
use crate::arch;
use crate::channel::memory::copy;

/// All-gather of `bytes` per rank: rank `q`'s `send` lands at `recv + q * bytes` on every
/// rank. In rounds of one scratch, each block owning one fixed share of it: copy the own share
/// into the own scratch and the own place of `recv`; barrier; get every peer's share from
/// its scratch into `recv`; barrier (after which no peer reads this scratch any more, so
/// the next round or call may overwrite it). In place (`send == recv + rank * bytes`) is
/// allowed.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; grid ≤ `MAX_BLOCKS` blocks
/// of at least `nranks` threads; the context valid; `send` valid for `bytes`, `recv` for
/// `nranks * bytes`; every rank calls it with the same `bytes` and grid.
#[inline(always)]
pub unsafe fn all_gather(ctx: &CollContext, send: *const u8, recv: *mut u8, bytes: u64) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let r = ctx.rank;
    super::all_reduce::check_grid(ctx, nb, nt);
    let slot = ctx.scratch_len / 16 * 16;
    let rounds = if slot == 0 { 0 } else { bytes.div_ceil(slot) };
    for j in 0..rounds {
        // Each block owns the same share of the scratch in every round of the call (so no
        // block overwrites a region another block's peer may still read), cut from the
        // first (longest) round; the last round may leave a block less or nothing.
        let round_len = slot.min(bytes - j * slot);
        let (s, e) = block_share(slot.min(bytes), 16, b as u64, nb as u64);
        let e = e.min(round_len);
        let s = s.min(e);
        let off = j * slot + s;
        // SAFETY: s..e lies in the scratch and off..off+(e-s) in send and in each rank's
        // part of recv (caller contract); no peer reads this scratch now (last barrier).
        unsafe {
            let src = send.add(off as usize);
            copy(ctx.scratch.add(s as usize), src, e - s, t, nt);
            let own = recv.add((r as u64 * bytes + off) as usize);
            if !core::ptr::eq(own as *const u8, src) {
                copy(own, src, e - s, t, nt);
            }
            ctx.barrier(b, t);
        }
        for p in 0..ctx.nranks {
            if p != r {
                // SAFETY: the peer's scratch share, published by the barrier.
                unsafe {
                    let dst = recv.add((p as u64 * bytes + off) as usize);
                    copy(
                        dst,
                        ctx.peer_scratch[p as usize].add(s as usize),
                        e - s,
                        t,
                        nt,
                    );
                }
            }
        }
        // SAFETY: every thread of the block.
        unsafe { ctx.barrier(b, t) };
    }
}
