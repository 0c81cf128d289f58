//! Who talks to whom in which order, how work is cut between blocks and rounds, and how
//! the scratches are cut.

use super::DESC_BYTES;

/// The `k`-th peer (`k < nranks - 1`) that lane `lane` (a block or unit index) of rank `rank`
/// talks to: every peer once over `k`, and for each `k` a different peer per lane and per rank,
/// so that at any moment the ranks' writes spread over every destination instead of all
/// ranks writing to rank 0 first (on NVSwitch machines that incast halved the bandwidth of
/// more than two ranks).
#[inline(always)]
pub fn peer_at(rank: u32, nranks: u32, lane: u32, k: u32) -> u32 {
    let others = nranks - 1;
    (rank + 1 + (lane % others + k) % others) % nranks
}

/// For `k` in `0..nranks`: [`peer_at`] for `k < nranks - 1`, then `rank` itself, so loops
/// written over all ranks (skipping the own) visit the peers in rotated order.
#[inline(always)]
pub fn rotated_rank(rank: u32, nranks: u32, lane: u32, k: u32) -> u32 {
    if k + 1 < nranks {
        peer_at(rank, nranks, lane, k)
    } else {
        rank
    }
}

/// Block `b` of `nb`'s share of `len` units, in multiples of `align`: `(start, end)`, empty
/// for blocks past the end.
#[inline(always)]
pub fn block_share(len: u64, align: u64, b: u64, nb: u64) -> (u64, u64) {
    let share = len.div_ceil(nb).next_multiple_of(align);
    let start = b.saturating_mul(share).min(len);
    (start, start.saturating_add(share).min(len))
}

/// Block `b` of `nb`'s share `[start, end)` of round `j` of `total` units moved through
/// slots of `slot` units (`slot > 0`): cut from the first (longest) round, so a block owns
/// the same part of the slot in every round of a call (no block overwrites a region another
/// block's peer may still use); the last round may leave a block less or nothing. Shares
/// start at multiples of `align`.
#[inline(always)]
pub fn round_share(slot: u64, total: u64, j: u64, align: u64, b: u64, nb: u64) -> (u64, u64) {
    let round_len = slot.min(total - j * slot);
    let (s, e) = block_share(slot.min(total), align, b, nb);
    let e = e.min(round_len);
    (s.min(e), e)
}

/// Bytes of each rank's slot in the two-shot layout of a scratch of `scratch_len` bytes
/// for `nranks` ranks: `nranks` receive slots then one slot of reduced data, each a
/// multiple of 16 bytes.
#[inline(always)]
pub fn two_shot_slot(scratch_len: u64, nranks: u64) -> u64 {
    (scratch_len / (nranks + 1)) / 16 * 16
}

/// Bytes of each half of a packet scratch of `packets_len` bytes (the halves alternate
/// between calls), past the [`DESC_BYTES`] of descriptors at its end.
#[inline(always)]
pub fn packet_half(packets_len: u64) -> u64 {
    packets_len.saturating_sub(DESC_BYTES) / 2 / 16 * 16
}

/// The largest message (bytes per rank) the one-shot packet path carries in a packet
/// scratch of `packets_len` bytes: 8 data bytes per 16-byte packet, in one half.
#[inline(always)]
pub fn one_shot_max_bytes(packets_len: u64) -> u64 {
    packet_half(packets_len) / 2
}
