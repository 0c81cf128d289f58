//! The collective protocols on CPU threads: `n` ranks are `n` threads of this process, each
//! running a grid with `arch::launch` over plain host memory standing for the GPUs', and
//! results are checked against a CPU reference.

use super::*;
use crate::arch::{Dim3, launch};
use crate::kernels::collectives as k;
use half::{bf16, f16};
use std::boxed::Box;
use std::vec;
use std::vec::Vec;

const LONG_NS: u64 = 60_000_000_000;

/// Zeroed, 16-byte aligned memory reached only through its raw pointer.
pub(super) struct Mem {
    _b: Box<[u128]>,
    pub(super) p: *mut u8,
}

impl Mem {
    pub(super) fn new(bytes: usize) -> Mem {
        let mut b = vec![0u128; bytes.div_ceil(16).max(1)].into_boxed_slice();
        let p = b.as_mut_ptr() as *mut u8;
        Mem { _b: b, p }
    }
}

/// The memory of `n` ranks and their contexts.
pub(super) struct World {
    pub(super) ctxs: Vec<CollContext>,
    _mem: Vec<Mem>,
}

// SAFETY: the contexts point into `_mem`, which the world owns; ranks use it only through
// the collective protocols during launches.
unsafe impl Sync for World {}

impl World {
    /// `packets_len`: bytes of packet data per packet scratch (the descriptor area is added).
    pub(super) fn new(n: usize, scratch_len: u64, packets_len: u64) -> World {
        let packets_len = packets_len + DESC_BYTES;
        let mut mem = Vec::new();
        let mut alloc = |bytes: u64| {
            let m = Mem::new(bytes as usize);
            let p = m.p;
            mem.push(m);
            p
        };
        let scratch: Vec<*mut u8> = (0..n).map(|_| alloc(2 * scratch_len)).collect();
        let sems: Vec<*mut u64> = (0..n)
            .map(|_| alloc(SEMAPHORE_WORDS as u64 * 8) as *mut u64)
            .collect();
        // packets[to][from]: rank `to`'s scratch written by rank `from`.
        let packets: Vec<Vec<*mut u8>> = (0..n)
            .map(|_| (0..n).map(|_| alloc(packets_len)).collect())
            .collect();
        let ctxs = (0..n)
            .map(|r| {
                let mut c = CollContext {
                    rank: r as u32,
                    nranks: n as u32,
                    timeout_ns: LONG_NS,
                    scratch_len,
                    packets_len,
                    scratch: scratch[r],
                    peer_scratch: [core::ptr::null_mut(); MAX_RANKS],
                    packets_in: [core::ptr::null_mut(); MAX_RANKS],
                    packets_out: [core::ptr::null_mut(); MAX_RANKS],
                    sems: sems[r],
                    peer_sems: [core::ptr::null_mut(); MAX_RANKS],
                    expected: alloc(EXPECTED_WORDS as u64 * 8) as *mut u64,
                    // The p2p context's LL sequence numbers follow (unused by collectives).
                    state: alloc((STATE_WORDS + super::send_recv::P2P_STATE_WORDS) as u64 * 8)
                        as *mut u64,
                    // Proxy channels need the host's proxy: tested in mscclpp-host.
                    conns: core::ptr::null(),
                    fault: alloc(FAULT_WORDS as u64 * 8) as *mut u64,
                    guards: 0,
                    coll: core::ptr::null(),
                };
                for p in 0..n {
                    c.peer_scratch[p] = scratch[p];
                    c.peer_sems[p] = sems[p];
                    c.packets_in[p] = packets[r][p];
                    c.packets_out[p] = packets[p][r];
                }
                c
            })
            .collect();
        World { ctxs, _mem: mem }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ty {
    F32,
    F16,
    Bf16,
}

impl Ty {
    fn size(self) -> usize {
        if self == Ty::F32 { 4 } else { 2 }
    }
    fn encode(self, v: f32) -> u32 {
        match self {
            Ty::F32 => v.to_bits(),
            Ty::F16 => f16::from_f32(v).to_bits() as u32,
            Ty::Bf16 => bf16::from_f32(v).to_bits() as u32,
        }
    }
    fn decode(self, b: u32) -> f32 {
        match self {
            Ty::F32 => f32::from_bits(b),
            Ty::F16 => f16::from_bits(b as u16).to_f32(),
            Ty::Bf16 => bf16::from_bits(b as u16).to_f32(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Algo {
    OneShot,
    TwoShot,
    ReadReduce,
    AllPairs,
}

/// The descriptor tag of an all-reduce (the host's encoding is the host's business; any
/// injective one does here).
fn tag(algo: Algo, ty: Ty) -> u64 {
    desc::tag(desc::ALL_REDUCE, ty as u64 + 1, 1, algo as u64 + 1)
}

/// The descriptor tag of the all-gathers here.
const AG_TAG: u64 = desc::tag(desc::ALL_GATHER, 0, 0, 1);

/// Bytes of `count` elements encoded from `vals`, at byte `pad` of a fresh buffer.
fn encode(ty: Ty, vals: &[f32], pad: usize) -> Vec<u8> {
    let mut out = vec![0u8; pad];
    for &v in vals {
        let b = ty.encode(v);
        out.extend_from_slice(&b.to_le_bytes()[..ty.size()]);
    }
    out
}

fn decode(ty: Ty, bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(ty.size())
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            ty.decode(u32::from_le_bytes(b))
        })
        .collect()
}

/// Runs one all-reduce on every rank (one thread each, grid `blocks` x `threads`) over
/// inputs `inputs[r]`; returns each rank's output. `pad` offsets the user buffers from
/// 16-byte alignment by that many bytes; `in_place` uses one buffer.
#[allow(clippy::too_many_arguments)]
fn all_reduce(
    w: &World,
    ty: Ty,
    algo: Algo,
    inputs: &[Vec<f32>],
    pad: usize,
    in_place: bool,
    blocks: u32,
    threads: u32,
) -> Vec<Vec<f32>> {
    let count = inputs[0].len();
    let bytes = count * ty.size();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..inputs.len())
            .map(|r| {
                let input = encode(ty, &inputs[r], pad);
                s.spawn(move || {
                    let send = Mem::new(input.len());
                    // SAFETY: fresh memory of input.len() bytes.
                    unsafe { std::ptr::copy_nonoverlapping(input.as_ptr(), send.p, input.len()) };
                    let recv = if in_place {
                        None
                    } else {
                        Some(Mem::new(pad + bytes))
                    };
                    let (sp, rp) = (send.p as u64, recv.as_ref().map_or(send.p, |m| m.p) as u64);
                    let ctx = w.ctxs[r];
                    let f = match (algo, ty) {
                        (Algo::OneShot, Ty::F32) => k::all_reduce_one_shot_f32,
                        (Algo::OneShot, Ty::F16) => k::all_reduce_one_shot_f16,
                        (Algo::OneShot, Ty::Bf16) => k::all_reduce_one_shot_bf16,
                        (Algo::TwoShot, Ty::F32) => k::all_reduce_two_shot_f32,
                        (Algo::TwoShot, Ty::F16) => k::all_reduce_two_shot_f16,
                        (Algo::TwoShot, Ty::Bf16) => k::all_reduce_two_shot_bf16,
                        (Algo::ReadReduce, Ty::F32) => k::all_reduce_two_shot_read_f32,
                        (Algo::ReadReduce, Ty::F16) => k::all_reduce_two_shot_read_f16,
                        (Algo::ReadReduce, Ty::Bf16) => k::all_reduce_two_shot_read_bf16,
                        (Algo::AllPairs, Ty::F32) => k::all_reduce_all_pairs_f32,
                        (Algo::AllPairs, Ty::F16) => k::all_reduce_all_pairs_f16,
                        (Algo::AllPairs, Ty::Bf16) => k::all_reduce_all_pairs_bf16,
                    };
                    launch(Dim3::x(blocks), Dim3::x(threads), || {
                        // SAFETY: the world's context; buffers valid for pad + bytes.
                        unsafe {
                            f(
                                &ctx,
                                (sp as *const u8).add(pad),
                                (rp as *mut u8).add(pad),
                                count as u64,
                                tag(algo, ty),
                            )
                        }
                    })
                    .expect("kernel ran to completion");
                    let out = recv.as_ref().unwrap_or(&send);
                    // SAFETY: the buffer holds pad + bytes bytes; the kernel is done.
                    let got = unsafe { std::slice::from_raw_parts(out.p.add(pad), bytes) };
                    decode(ty, got)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Small integers: every sum of up to 8 ranks is exact in f32, f16 and bf16.
fn int_inputs(n: usize, count: usize, seed: u64) -> Vec<Vec<f32>> {
    (0..n)
        .map(|r| {
            (0..count)
                .map(|i| {
                    let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                        ^ seed
                        ^ (r as u64) << 40;
                    ((h >> 29) % 17) as f32 - 8.0
                })
                .collect()
        })
        .collect()
}

fn expected(inputs: &[Vec<f32>]) -> Vec<f32> {
    (0..inputs[0].len())
        .map(|i| inputs.iter().map(|v| v[i]).sum())
        .collect()
}

#[test]
fn all_reduce_exact_sums_for_every_algorithm_type_rank_count_and_alignment() {
    for n in [1usize, 2, 3, 4] {
        // A small scratch forces several rounds of the two-shot pipeline.
        let w = World::new(n, 16 * 40, 8192);
        let mut call = 0u64;
        for ty in [Ty::F32, Ty::F16, Ty::Bf16] {
            for count in [1usize, 3, 8, 33, 100, 257] {
                for algo in [
                    Algo::OneShot,
                    Algo::TwoShot,
                    Algo::ReadReduce,
                    Algo::AllPairs,
                ] {
                    for (pad, in_place) in [(0, false), (0, true), (ty.size(), false)] {
                        call += 1;
                        let inputs = int_inputs(n, count, call);
                        let want = expected(&inputs);
                        let got = all_reduce(&w, ty, algo, &inputs, pad, in_place, 2, 4);
                        for (r, g) in got.iter().enumerate() {
                            assert_eq!(
                                g, &want,
                                "n={n} rank {r} {ty:?} {algo:?} count {count} pad {pad} in_place {in_place}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn all_reduce_on_blocks_of_fewer_threads_than_ranks_sums_exactly() {
    // The Host backend runs the all-reduce kernels on one thread a rank: each thread then
    // stands for several ranks in the descriptors, barriers and the block's agreement.
    for n in [2usize, 3, 4] {
        let w = World::new(n, 16 * 40, 8192);
        let mut call = 0u64;
        for (blocks, threads) in [(1, 1), (2, 1), (1, 2), (3, 1), (1, 4)] {
            for algo in [
                Algo::OneShot,
                Algo::TwoShot,
                Algo::ReadReduce,
                Algo::AllPairs,
            ] {
                for count in [1usize, 33, 257] {
                    call += 1;
                    let inputs = int_inputs(n, count, call);
                    let want = expected(&inputs);
                    let got = all_reduce(&w, Ty::F32, algo, &inputs, 0, false, blocks, threads);
                    for (r, g) in got.iter().enumerate() {
                        assert_eq!(
                            g, &want,
                            "n={n} rank {r} {algo:?} count {count} grid {blocks}x{threads}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn all_reduce_of_random_floats_is_identical_on_every_rank_and_close_to_the_sum() {
    let n = 3;
    let w = World::new(n, 16 * 64, 8192);
    for (i, ty) in [Ty::F32, Ty::F16, Ty::Bf16].into_iter().enumerate() {
        for algo in [
            Algo::OneShot,
            Algo::TwoShot,
            Algo::ReadReduce,
            Algo::AllPairs,
        ] {
            let count = 301;
            let inputs: Vec<Vec<f32>> = (0..n)
                .map(|r| {
                    (0..count)
                        .map(|j| {
                            let h =
                                ((j * 31 + r * 7 + i) as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
                            // Values the type holds exactly, so only the sum rounds.
                            ty.decode(ty.encode((h >> 40) as f32 / (1u64 << 20) as f32 - 8.0))
                        })
                        .collect()
                })
                .collect();
            let want = expected(&inputs);
            let got = all_reduce(&w, ty, algo, &inputs, 0, false, 3, 5);
            let tol = match ty {
                Ty::F32 => 1e-5,
                Ty::F16 => 2e-2,
                Ty::Bf16 => 2e-1,
            };
            for r in 1..n {
                assert_eq!(
                    got[r], got[0],
                    "{ty:?} {algo:?}: rank {r} differs from rank 0"
                );
            }
            for (j, (g, e)) in got[0].iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= tol * (1.0 + e.abs()),
                    "{ty:?} {algo:?} [{j}]: {g} vs {e}"
                );
            }
        }
    }
}

/// State counter `which` (0: one-shot calls, 1: all-pairs rounds) of rank `r` as each block
/// index reads it: the larger of the single-block word and the block's copy.
fn counter_per_block(w: &World, r: usize, which: usize) -> Vec<u64> {
    // SAFETY: rank r's STATE_WORDS state words; no kernel running.
    let words = unsafe { std::slice::from_raw_parts(w.ctxs[r].state, STATE_WORDS) };
    let c = &words[which * COUNTER_WORDS..][..COUNTER_WORDS];
    (0..MAX_BLOCKS).map(|b| c[0].max(c[1 + b])).collect()
}

#[test]
fn one_shot_flags_alternate_halves_over_many_calls() {
    // Many calls of one size and then of another, on grids of 1 to 4 blocks: stale packets
    // of earlier calls (same half, older flag) must never be taken for new ones, whichever
    // block handled a slot before.
    let n = 2;
    let w = World::new(n, 1024, 2048);
    let calls = 40u64;
    for call in 0..calls {
        let count = if call < 20 { 64 } else { 7 };
        let blocks = [1, 3, 2, 4][(call % 4) as usize];
        let inputs = int_inputs(n, count, call);
        let got = all_reduce(&w, Ty::F32, Algo::OneShot, &inputs, 0, false, blocks, 8);
        assert_eq!(got[0], expected(&inputs), "call {call}");
        assert_eq!(got[1], expected(&inputs), "call {call}");
    }
    for r in 0..n {
        assert_eq!(
            counter_per_block(&w, r, 0),
            vec![calls; MAX_BLOCKS],
            "rank {r}: the one-shot call counter as each block index reads it"
        );
    }
}

/// Runs one all-gather of `inputs[r]` (bytes) on every rank; returns each rank's output.
fn all_gather(w: &World, inputs: &[Vec<u8>], in_place: bool, blocks: u32) -> Vec<Vec<u8>> {
    all_gather_with(w, inputs, in_place, (blocks, 4), k::all_gather, AG_TAG)
}

/// [`all_gather`] with kernel `f` (and its descriptor tag).
fn all_gather_with(
    w: &World,
    inputs: &[Vec<u8>],
    in_place: bool,
    (blocks, threads): (u32, u32),
    f: Kernel,
    tag: u64,
) -> Vec<Vec<u8>> {
    let n = inputs.len();
    let bytes = inputs[0].len();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let input = inputs[r].clone();
                s.spawn(move || {
                    let recv = Mem::new(n * bytes);
                    let send = Mem::new(bytes);
                    let sp = if in_place {
                        // SAFETY: rank r's part of recv.
                        unsafe { recv.p.add(r * bytes) }
                    } else {
                        send.p
                    };
                    // SAFETY: sp is valid for `bytes`.
                    unsafe { std::ptr::copy_nonoverlapping(input.as_ptr(), sp, bytes) };
                    let (sp, rp, ctx) = (sp as u64, recv.p as u64, w.ctxs[r]);
                    launch(Dim3::x(blocks), Dim3::x(threads), || {
                        // SAFETY: the world's context; buffers valid as the kernel needs.
                        unsafe { f(&ctx, sp as *const u8, rp as *mut u8, bytes as u64, tag) }
                    })
                    .expect("kernel ran to completion");
                    // SAFETY: recv holds n * bytes; the kernel is done.
                    unsafe { std::slice::from_raw_parts(recv.p, n * bytes) }.to_vec()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn all_gather_places_every_rank_in_order_in_and_out_of_place() {
    for n in [1usize, 2, 4] {
        let w = World::new(n, 96, 32);
        for bytes in [1usize, 15, 16, 100, 333] {
            for in_place in [false, true] {
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|r| (0..bytes).map(|i| (i * 13 + r * 101 + 7) as u8).collect())
                    .collect();
                let want: Vec<u8> = inputs.concat();
                for (r, got) in all_gather(&w, &inputs, in_place, 3).iter().enumerate() {
                    assert_eq!(
                        got, &want,
                        "n={n} bytes {bytes} in_place {in_place} rank {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn all_gather_through_packets_places_every_rank_over_many_calls() {
    // Calls alternate the packet halves and mix with the memory all-gather and one-shot
    // all-reduce (one call counter): stale packets of an earlier call must never be taken.
    let tag = desc::tag(desc::ALL_GATHER, 0, 0, 3);
    for n in [1usize, 2, 3, 4] {
        let w = World::new(n, 4096, 16 * 1024);
        for (call, bytes) in [1usize, 15, 16, 100, 333, 4000, 8, 4000, 7]
            .into_iter()
            .enumerate()
        {
            for in_place in [false, true] {
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|r| {
                        (0..bytes)
                            .map(|i| (i * 13 + r * 101 + call * 7) as u8)
                            .collect()
                    })
                    .collect();
                let want: Vec<u8> = inputs.concat();
                // Grids of more than a warp too: block 0's first warp carries no data there
                // (`data_threads`), one block then has 16 data threads, (2, 40) has 48.
                let grid = [(1, 4), (2, 4), (3, 4), (1, 48), (2, 40)][call % 5];
                let got = all_gather_with(&w, &inputs, in_place, grid, k::all_gather_packets, tag);
                for (r, got) in got.iter().enumerate() {
                    assert_eq!(
                        got, &want,
                        "n={n} bytes {bytes} in_place {in_place} grid {grid:?} rank {r}"
                    );
                }
            }
            if call % 4 == 3 {
                let inputs: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8 ^ 0x5a; 64]).collect();
                assert_eq!(all_gather(&w, &inputs, false, 2)[0], inputs.concat());
            }
        }
    }
}

#[test]
fn all_gather_pipelines_many_pieces_over_several_rounds() {
    // 1024 B of scratch and 2 blocks: pieces of 64 B, 8 per block share, and 5000 B per rank
    // take 5 rounds, the last one partial (odd sizes leave short and empty pieces).
    for n in [2usize, 3] {
        let w = World::new(n, 1024, 32);
        for bytes in [5000usize, 1024 + 17, 129] {
            let inputs: Vec<Vec<u8>> = (0..n)
                .map(|r| {
                    (0..bytes)
                        .map(|i| (i * 7 + r * 31 + i / 251) as u8)
                        .collect()
                })
                .collect();
            let want: Vec<u8> = inputs.concat();
            for in_place in [false, true] {
                for (r, got) in all_gather(&w, &inputs, in_place, 2).iter().enumerate() {
                    assert!(
                        got == &want,
                        "n={n} bytes {bytes} in_place {in_place} rank {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn collectives_of_different_kinds_share_the_scratch_in_sequence() {
    let n = 3;
    let w = World::new(n, 16 * 30, 4096);
    for call in 0..12u64 {
        match call % 3 {
            0 => {
                let inputs: Vec<Vec<u8>> =
                    (0..n).map(|r| vec![(call as u8) ^ r as u8; 200]).collect();
                assert_eq!(all_gather(&w, &inputs, false, 2)[1], inputs.concat());
            }
            c => {
                let algo = [
                    Algo::TwoShot,
                    Algo::OneShot,
                    Algo::ReadReduce,
                    Algo::AllPairs,
                ][((call / 3 + c) % 4) as usize];
                let inputs = int_inputs(n, 150, call);
                let got = all_reduce(&w, Ty::F16, algo, &inputs, 0, call % 2 == 0, 2, 4);
                assert_eq!(got[2], expected(&inputs), "call {call} {algo:?}");
            }
        }
    }
}

#[test]
fn all_pairs_alternates_halves_over_rounds_calls_and_grids() {
    // A region of 2 x 2 slots of 64 bytes: 16 f32 per slot, so a call of 100 elements takes
    // 7 rounds. Grids change between calls and some calls are in place; with no barrier
    // at the end of a call, a peer running ahead must only ever write the other half.
    let n = 2;
    let w = World::new(n, 256, 2048);
    let mut total_rounds = 0u64;
    for call in 0..60u64 {
        let count = [100usize, 16, 33, 1, 64][(call % 5) as usize];
        let blocks = [1, 3, 2, 4][(call % 4) as usize];
        let inputs = int_inputs(n, count, call);
        let got = all_reduce(
            &w,
            Ty::F32,
            Algo::AllPairs,
            &inputs,
            0,
            call % 3 == 0,
            blocks,
            8,
        );
        assert_eq!(got[0], expected(&inputs), "call {call}");
        assert_eq!(got[1], expected(&inputs), "call {call}");
        total_rounds += count.div_ceil(16) as u64;
    }
    for r in 0..n {
        assert_eq!(
            counter_per_block(&w, r, 1),
            vec![total_rounds; MAX_BLOCKS],
            "rank {r}: the all-pairs round counter as each block index reads it"
        );
    }
}

#[test]
fn layout_helpers_partition_exactly() {
    for len in [0u64, 1, 15, 16, 17, 1000] {
        for nb in 1..6 {
            let mut covered = 0;
            for b in 0..nb {
                let (s, e) = block_share(len, 4, b, nb);
                assert!(s <= e && e <= len);
                assert_eq!(s, covered.min(len), "shares are contiguous");
                covered = e;
                if e < len {
                    assert_eq!(s % 4, 0);
                }
            }
            assert_eq!(covered, len);
        }
    }
    assert_eq!(two_shot_slot(1000, 3), 240);
    assert_eq!(one_shot_max_bytes(4096 + DESC_BYTES), 1024);
}

/// The rotated peer order visits every peer once per rank and lane, and for a given step and
/// lane no two ranks write to the same destination (no incast).
#[test]
fn peer_order_visits_every_peer_once_and_spreads_destinations() {
    for n in 1..=MAX_RANKS as u32 {
        for lane in 0..3 * n {
            for r in 0..n {
                let mut seen = vec![false; n as usize];
                for k in 0..n {
                    let p = super::rotated_rank(r, n, lane, k);
                    assert!(
                        p < n && !seen[p as usize],
                        "n {n} lane {lane} rank {r} k {k}"
                    );
                    seen[p as usize] = true;
                }
                assert_eq!(super::rotated_rank(r, n, lane, n - 1), r);
            }
            for k in 0..n.saturating_sub(1) {
                let mut dest = vec![false; n as usize];
                for r in 0..n {
                    let p = super::peer_at(r, n, lane, k);
                    assert_ne!(p, r);
                    assert!(!dest[p as usize], "two ranks write to {p} at step {k}");
                    dest[p as usize] = true;
                }
            }
        }
    }
}

/// What one rank calls in the mismatch tests.
#[derive(Clone, Debug)]
enum Op {
    AllReduce(Ty, Algo, Vec<f32>),
    AllGather(Vec<u8>),
    /// Any kernel: `(kernel, n, tag, input bytes, output bytes)`.
    Raw(Kernel, u64, u64, Vec<u8>, usize),
}

/// Runs `ops[r]` on rank `r` (grid `blocks` x `threads`); returns each rank's output bytes.
/// Kernels never trap: a failure is in the fault area ([`record`]).
fn run_ops(w: &World, ops: &[Op], blocks: u32, threads: u32) -> Vec<Vec<u8>> {
    let n = ops.len();
    std::thread::scope(|s| {
        let handles: Vec<_> = ops
            .iter()
            .enumerate()
            .map(|(r, op)| {
                let ctx = w.ctxs[r];
                s.spawn(move || {
                    let (input, out_len, n_arg, tag, f): (Vec<u8>, usize, u64, u64, Kernel) =
                        match op {
                            Op::AllReduce(ty, algo, vals) => {
                                let f: Kernel = match (algo, ty) {
                                    (Algo::OneShot, Ty::F32) => k::all_reduce_one_shot_f32,
                                    (Algo::OneShot, _) => k::all_reduce_one_shot_f16,
                                    (Algo::TwoShot, Ty::F32) => k::all_reduce_two_shot_f32,
                                    (Algo::TwoShot, _) => k::all_reduce_two_shot_f16,
                                    (Algo::ReadReduce, Ty::F32) => k::all_reduce_two_shot_read_f32,
                                    (Algo::ReadReduce, _) => k::all_reduce_two_shot_read_f16,
                                    (Algo::AllPairs, Ty::F32) => k::all_reduce_all_pairs_f32,
                                    (Algo::AllPairs, _) => k::all_reduce_all_pairs_f16,
                                };
                                let bytes = encode(*ty, vals, 0);
                                let len = bytes.len();
                                (bytes, len, vals.len() as u64, tag(*algo, *ty), f)
                            }
                            Op::AllGather(bytes) => (
                                bytes.clone(),
                                n * bytes.len(),
                                bytes.len() as u64,
                                AG_TAG,
                                k::all_gather,
                            ),
                            Op::Raw(f, n_arg, tag, input, out_len) => {
                                (input.clone(), *out_len, *n_arg, *tag, *f)
                            }
                        };
                    let send = Mem::new(input.len());
                    let recv = Mem::new(out_len);
                    // SAFETY: fresh memory of input.len() bytes.
                    unsafe { std::ptr::copy_nonoverlapping(input.as_ptr(), send.p, input.len()) };
                    let (sp, rp) = (send.p as u64, recv.p as u64);
                    launch(Dim3::x(blocks), Dim3::x(threads), || {
                        // SAFETY: the world's context; buffers valid as the kernel needs.
                        unsafe { f(&ctx, sp as *const u8, rp as *mut u8, n_arg, tag) }
                    })
                    .expect("the kernel ends without a trap");
                    // SAFETY: recv holds out_len bytes; the kernel is done.
                    unsafe { std::slice::from_raw_parts(recv.p, out_len) }.to_vec()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

type Kernel = unsafe fn(*const CollContext, *const u8, *mut u8, u64, u64);

/// Rank `r`'s fault record `(kind, peer, own, theirs)`, cleared as the host clears a
/// reported mismatch.
fn record(w: &World, r: usize) -> (u64, u64, [u64; 2], [u64; 2]) {
    // SAFETY: rank r's fault area; no kernel running.
    unsafe {
        let f = w.ctxs[r].fault;
        let got = (
            f.add(fault::RECORD).read(),
            f.add(fault::PEER).read(),
            [f.add(fault::OWN).read(), f.add(fault::OWN + 1).read()],
            [f.add(fault::THEIRS).read(), f.add(fault::THEIRS + 1).read()],
        );
        f.add(fault::RECORD).write(0);
        f.add(fault::CLAIM).write(0);
        got
    }
}

/// World with a short wait timeout: a mismatch must be found long before it.
fn short_world(n: usize, scratch_len: u64, packets_len: u64) -> World {
    let mut w = World::new(n, scratch_len, packets_len);
    for c in &mut w.ctxs {
        c.timeout_ns = 20_000_000_000;
    }
    w
}

/// Runs `ops` (which disagree), checks every rank recorded a mismatch naming a rank whose
/// descriptor differs from its own and did so fast, then runs a matching all-reduce of
/// `algo` and checks its exact result.
fn mismatch_then_match(w: &World, ops: &[Op], algo: Algo, what: &str) {
    let n = ops.len();
    let t0 = std::time::Instant::now();
    run_ops(w, ops, 2, 8);
    let took = t0.elapsed();
    assert!(
        took < std::time::Duration::from_secs(5),
        "{what}: took {took:?}"
    );
    for r in 0..n {
        let (kind, peer, own, theirs) = record(w, r);
        assert_eq!(kind, fault::MISMATCH, "{what}: rank {r} recorded {kind}");
        assert!(
            (peer as usize) < n && peer as usize != r,
            "{what}: rank {r} peer {peer}"
        );
        assert_ne!(own, theirs, "{what}: rank {r}");
    }
    for call in 0..2 {
        let inputs = int_inputs(n, 77 + call, 99 + call as u64);
        let ops: Vec<Op> = inputs
            .iter()
            .map(|v| Op::AllReduce(Ty::F32, algo, v.clone()))
            .collect();
        let want = encode(Ty::F32, &expected(&inputs), 0);
        for (r, got) in run_ops(w, &ops, 2, 8).iter().enumerate() {
            assert_eq!(
                got, &want,
                "{what}: rank {r}, matching call {call} after it"
            );
            assert_eq!(record(w, r).0, 0, "{what}: rank {r} recorded a failure");
        }
    }
}

/// A rank whose round across hosts failed earlier (`CROSS_BROKEN` in its fault area) takes
/// part in no later call inside its host: with `guard::CROSS` on, its descriptor is
/// `desc::BROKEN`, so every other rank records a mismatch naming it (an error, never its
/// buffers' contents taken as a result), for the LL one-shot, the scratch two-shot and the
/// all-gather. Without the guard (one-host contexts) the word is not read at all.
#[test]
fn a_rank_broken_across_hosts_fails_the_calls_inside_its_host() {
    let n = 3;
    let mut w = short_world(n, 16 * 40, 8192);
    for c in &mut w.ctxs {
        c.guards = guard::CROSS;
    }
    let set_broken = |w: &World, v: u64| {
        // SAFETY: rank 1's fault area; no kernel running.
        unsafe { w.ctxs[1].fault.add(fault::CROSS_BROKEN).write(v) }
    };
    set_broken(&w, 1);
    let inputs = int_inputs(n, 150, 5);
    let cases: Vec<(&str, Vec<Op>)> = vec![
        (
            "one-shot",
            inputs
                .iter()
                .map(|v| Op::AllReduce(Ty::F32, Algo::OneShot, v.clone()))
                .collect(),
        ),
        (
            "two-shot",
            inputs
                .iter()
                .map(|v| Op::AllReduce(Ty::F32, Algo::TwoShot, v.clone()))
                .collect(),
        ),
        (
            "all-gather",
            (0..n).map(|r| Op::AllGather(vec![r as u8; 96])).collect(),
        ),
    ];
    for (what, ops) in &cases {
        run_ops(&w, ops, 2, 8);
        for r in 0..n {
            let (kind, peer, own, theirs) = record(&w, r);
            assert_eq!(kind, fault::MISMATCH, "{what}: rank {r} recorded {kind}");
            if r == 1 {
                assert_eq!(own[1], desc::BROKEN, "{what}: the broken rank sends BROKEN");
            } else {
                assert_eq!(peer, 1, "{what}: rank {r} names the broken rank");
                assert_eq!(theirs[1], desc::BROKEN, "{what}: rank {r}");
                assert_ne!(own[1], desc::BROKEN, "{what}: rank {r}");
            }
        }
    }
    // The word is what decides: cleared, the same calls agree and are exact.
    set_broken(&w, 0);
    let want = encode(Ty::F32, &expected(&inputs), 0);
    for (r, got) in run_ops(&w, &cases[0].1, 2, 8).iter().enumerate() {
        assert_eq!(got, &want, "rank {r} once nothing is broken");
        assert_eq!(record(&w, r).0, 0, "rank {r} recorded a failure");
    }
    // Unguarded contexts never read it: a broken word changes nothing there.
    for c in &mut w.ctxs {
        c.guards = 0;
    }
    set_broken(&w, 1);
    for (r, got) in run_ops(&w, &cases[1].1, 2, 8).iter().enumerate() {
        assert_eq!(got, &want, "rank {r} unguarded");
        assert_eq!(record(&w, r).0, 0, "rank {r} recorded a failure unguarded");
    }
}

#[test]
fn every_rank_reports_count_dtype_and_algorithm_mismatches_then_works() {
    for n in [2usize, 3] {
        let w = short_world(n, 16 * 40, 8192);
        for algo in [
            Algo::OneShot,
            Algo::TwoShot,
            Algo::ReadReduce,
            Algo::AllPairs,
        ] {
            // Counts: the last rank asks for more (one-shot: it waits for packets the
            // others never send), then for fewer.
            for extra in [300usize, 0] {
                let ops: Vec<Op> = (0..n)
                    .map(|r| {
                        let count = if r == n - 1 { 50 + extra } else { 150 };
                        Op::AllReduce(Ty::F32, algo, int_inputs(1, count, 5)[0].clone())
                    })
                    .collect();
                mismatch_then_match(
                    &w,
                    &ops,
                    algo,
                    &std::format!("n={n} {algo:?} count +{extra}"),
                );
            }
            // Data type (same bytes on every rank: f32 x 100 against f16 x 200 would be
            // another count; here the count agrees).
            let ops: Vec<Op> = (0..n)
                .map(|r| {
                    let ty = if r == 1 { Ty::F16 } else { Ty::F32 };
                    Op::AllReduce(ty, algo, int_inputs(1, 64, 6)[0].clone())
                })
                .collect();
            mismatch_then_match(&w, &ops, algo, &std::format!("n={n} {algo:?} dtype"));
            // Algorithm.
            let other = if algo == Algo::TwoShot {
                Algo::OneShot
            } else {
                Algo::TwoShot
            };
            let ops: Vec<Op> = (0..n)
                .map(|r| {
                    let a = if r == 0 { other } else { algo };
                    Op::AllReduce(Ty::F32, a, int_inputs(1, 64, 7)[0].clone())
                })
                .collect();
            mismatch_then_match(&w, &ops, algo, &std::format!("n={n} {algo:?} vs {other:?}"));
        }
        // Collective kind and all-gather sizes.
        let ops: Vec<Op> = (0..n)
            .map(|r| {
                if r == 0 {
                    Op::AllGather(vec![1u8; 64])
                } else {
                    Op::AllReduce(Ty::F32, Algo::OneShot, vec![1.0; 16])
                }
            })
            .collect();
        mismatch_then_match(&w, &ops, Algo::OneShot, &std::format!("n={n} kind"));
        let ops: Vec<Op> = (0..n)
            .map(|r| Op::AllGather(vec![r as u8; if r == 1 { 300 } else { 100 }]))
            .collect();
        mismatch_then_match(
            &w,
            &ops,
            Algo::TwoShot,
            &std::format!("n={n} all-gather bytes"),
        );
    }
}

/// A reduce-scatter (f32, `op`) of `count` elements per rank on path `ll` (LL or put).
fn reduce_scatter_op(n: usize, count: usize, op: u32, ll: bool) -> Op {
    use crate::kernels::scatter_rooted as m;
    let f: Kernel = if ll {
        m::reduce_scatter_ll_b32
    } else {
        m::reduce_scatter_put
    };
    let tag = desc::tag(desc::REDUCE_SCATTER, 1, op as u64 + 1, 2 - ll as u64);
    let input = encode(Ty::F32, &int_inputs(1, n * count, 8)[0], 0);
    Op::Raw(f, count as u64, tag, input, 4 * count)
}

/// A broadcast of `bytes` from `root` on path `ll` (LL or put).
fn broadcast_op(bytes: usize, root: usize, ll: bool) -> Op {
    use crate::kernels::scatter_rooted as m;
    let f: Kernel = if ll {
        m::broadcast_ll
    } else {
        m::broadcast_put
    };
    let tag = desc::rooted_tag(desc::BROADCAST, 6, 0, 2 - ll as u64, root as u64);
    Op::Raw(f, bytes as u64, tag, vec![7u8; bytes], bytes)
}

/// A reduce (f32 sum) of `count` elements to `root` on path `ll` (LL or put).
fn reduce_op(count: usize, root: usize, ll: bool) -> Op {
    use crate::kernels::scatter_rooted as m;
    let f: Kernel = if ll { m::reduce_ll_b32 } else { m::reduce_put };
    let tag = desc::rooted_tag(desc::REDUCE, 1, 1, 2 - ll as u64, root as u64);
    let input = encode(Ty::F32, &int_inputs(1, count, 9)[0], 0);
    Op::Raw(f, count as u64, tag, input, 4 * count)
}

#[test]
fn every_rank_reports_reduce_scatter_broadcast_and_reduce_mismatches_then_works() {
    for n in [2usize, 3] {
        // Put paths: several rounds through a scratch of 640 bytes per region.
        let w = short_world(n, 16 * 40, 8192);
        for ll in [true, false] {
            let path = if ll { "LL" } else { "put" };
            // Reduce-scatter: the last rank asks for more, then for fewer elements.
            for other in [300usize, 20] {
                let ops: Vec<Op> = (0..n)
                    .map(|r| {
                        let count = if r == n - 1 { other } else { 100 };
                        reduce_scatter_op(n, count, op::SUM, ll)
                    })
                    .collect();
                let what = std::format!("n={n} reduce_scatter {path} count {other}");
                mismatch_then_match(&w, &ops, Algo::TwoShot, &what);
            }
            // Reduce-scatter: the operation.
            let ops: Vec<Op> = (0..n)
                .map(|r| {
                    let o = if r == 0 { op::MAX } else { op::SUM };
                    reduce_scatter_op(n, 64, o, ll)
                })
                .collect();
            let what = std::format!("n={n} reduce_scatter {path} op");
            mismatch_then_match(&w, &ops, Algo::OneShot, &what);
            // Broadcast: the root (rank 0 thinks it is the root, the others rank 1).
            let ops: Vec<Op> = (0..n)
                .map(|r| broadcast_op(200, usize::from(r != 0), ll))
                .collect();
            let what = std::format!("n={n} broadcast {path} root");
            mismatch_then_match(&w, &ops, Algo::TwoShot, &what);
            // Broadcast: the size.
            let ops: Vec<Op> = (0..n)
                .map(|r| broadcast_op(if r == 1 { 900 } else { 200 }, 0, ll))
                .collect();
            let what = std::format!("n={n} broadcast {path} bytes");
            mismatch_then_match(&w, &ops, Algo::OneShot, &what);
            // Reduce: the root.
            let ops: Vec<Op> = (0..n)
                .map(|r| reduce_op(100, usize::from(r != 0), ll))
                .collect();
            let what = std::format!("n={n} reduce {path} root");
            mismatch_then_match(&w, &ops, Algo::AllPairs, &what);
        }
    }
}

#[test]
fn a_wait_gives_up_on_abort_and_names_it_without_trapping() {
    // Rank 1 never calls: rank 0's waits (descriptor, then semaphore/packet) give up once
    // the abort word is raised, well before the timeout.
    let w = World::new(2, 16 * 40, 8192);
    for algo in [Algo::OneShot, Algo::TwoShot, Algo::AllPairs] {
        let fault_word = w.ctxs[0].fault as u64;
        let t0 = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(100));
                // SAFETY: rank 0's fault area, written atomically as the host does.
                unsafe {
                    crate::arch::st_release_sys_u64(
                        (fault_word as *mut u64).add(fault::ABORT),
                        fault::ABORT_REQUESTED,
                    )
                };
            });
            all_reduce_on(&w, algo, &[0], &[0]);
        });
        let took = t0.elapsed();
        assert!(
            took < std::time::Duration::from_secs(5),
            "{algo:?}: {took:?}"
        );
        // One claim on the host word (an atomic across PCIe on a GPU) for the failed call,
        // not one per thread that gave up. (Read first: `record` clears it.)
        // SAFETY: rank 0's fault area; no kernel runs.
        let claims = unsafe { w.ctxs[0].fault.add(fault::CLAIM).read() };
        let (kind, peer, _, _) = record(&w, 0);
        assert_eq!((kind, peer), (fault::ABORTED, 1), "{algo:?}");
        assert_eq!(claims, 1, "{algo:?}: claims on the host word");
        // SAFETY: as above; no kernel runs.
        unsafe { w.ctxs[0].fault.add(fault::ABORT).write(0) };
    }
}

/// A call queued behind one that gave up for good (its timeout or abort record stays, the
/// communicator cannot be used any more) gives up at the first look at the fault area,
/// without a record of its own (the first one is what the host reports), instead of waiting
/// a timeout of its own: a rank with many calls queued behind a stalled peer reports it
/// after one timeout. A mismatch record (cleared once reported; the communicator stays
/// usable) does not cut a later call's wait short.
#[test]
fn calls_queued_behind_one_that_gave_up_for_good_give_up_at_once() {
    for algo in [Algo::OneShot, Algo::TwoShot, Algo::AllPairs] {
        for kind in [fault::TIMEOUT, fault::ABORTED] {
            let mut w = World::new(2, 16 * 40, 8192);
            w.ctxs[0].timeout_ns = 60_000_000_000;
            let f = w.ctxs[0].fault;
            // An earlier call (sequence 7) of rank 0 gave up, as a kernel records it.
            // SAFETY: rank 0's fault area; no kernel runs yet.
            unsafe {
                f.add(fault::CLAIM).write(1);
                f.add(fault::SEQ).write(7);
                f.add(fault::PEER).write(1);
                f.add(fault::RECORD).write(kind);
            }
            // Rank 1 never calls.
            let (_, took) = all_reduce_on(&w, algo, &[0], &[0]);
            assert!(
                took < std::time::Duration::from_secs(5),
                "{algo:?}, record {kind}: waited {took:?} (the timeout is 60 s)"
            );
            // SAFETY: rank 0's fault area; no kernel runs.
            let (seq, claims) = unsafe { (f.add(fault::SEQ).read(), f.add(fault::CLAIM).read()) };
            assert_eq!(
                (record(&w, 0).0, seq),
                (kind, 7),
                "{algo:?}: the record changed"
            );
            // Every thread of the call gave up (rank 1 never calls), but only its first one
            // touched the claim word in host memory (an atomic across PCIe on a GPU).
            assert_eq!(
                claims, 2,
                "{algo:?}, record {kind}: claims on the host word"
            );
        }
        // A mismatch record does not stop the next call: its wait ends at the timeout.
        let mut w = World::new(2, 16 * 40, 8192);
        w.ctxs[0].timeout_ns = 300_000_000;
        // SAFETY: as above.
        unsafe {
            w.ctxs[0].fault.add(fault::CLAIM).write(1);
            w.ctxs[0].fault.add(fault::RECORD).write(fault::MISMATCH);
        }
        let (_, took) = all_reduce_on(&w, algo, &[0], &[0]);
        assert!(
            took >= std::time::Duration::from_millis(300),
            "{algo:?}: {took:?}"
        );
    }
}

/// Runs an all-reduce of `algo` (100 f32, the value `r + 1` on rank `r`) on each rank of
/// `ranks`, rank `ranks[i]` starting after `delays_ms[i]`; returns each one's output and the
/// time the slowest took.
fn all_reduce_on(
    w: &World,
    algo: Algo,
    ranks: &[usize],
    delays_ms: &[u64],
) -> (Vec<Vec<f32>>, std::time::Duration) {
    let t0 = std::time::Instant::now();
    let outs = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .zip(delays_ms)
            .map(|(&r, &delay)| {
                let ctx = w.ctxs[r];
                s.spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(delay));
                    let f: Kernel = match algo {
                        Algo::OneShot => k::all_reduce_one_shot_f32,
                        Algo::AllPairs => k::all_reduce_all_pairs_f32,
                        _ => k::all_reduce_two_shot_f32,
                    };
                    let input = encode(Ty::F32, &[(r + 1) as f32; 100], 0);
                    let (send, recv) = (Mem::new(400), Mem::new(400));
                    // SAFETY: fresh memory of 400 bytes.
                    unsafe { std::ptr::copy_nonoverlapping(input.as_ptr(), send.p, 400) };
                    let (sp, rp) = (send.p as u64, recv.p as u64);
                    launch(Dim3::x(2), Dim3::x(8), || {
                        // SAFETY: rank r's context; buffers of 100 f32.
                        unsafe {
                            f(
                                &ctx,
                                sp as *const u8,
                                rp as *mut u8,
                                100,
                                tag(algo, Ty::F32),
                            )
                        }
                    })
                    .expect("no trap");
                    // SAFETY: recv holds 400 bytes; the kernel is done.
                    decode(Ty::F32, unsafe { std::slice::from_raw_parts(recv.p, 400) })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (outs, t0.elapsed())
}

/// Sets rank `r`'s host word [`fault::LEFT`] as the host does when a rank of the group left
/// after `calls` calls.
fn set_left(w: &World, r: usize, calls: u64) {
    // SAFETY: rank r's fault area, written atomically as the host does.
    unsafe { crate::arch::st_release_sys_u64(w.ctxs[r].fault.add(fault::LEFT), calls + 1) };
}

/// A rank that left after `C` calls (its goodbye names `C`; the host writes `C + 1` into
/// [`fault::LEFT`]): the survivors' waits in a call it never made (sequence number `C` or
/// more) give up within the next looks at the fault area, not at the timeout, recorded as
/// an abort at [`fault::AT_LEFT`]; a call it made (a smaller sequence number) is not
/// touched, even when its waits go through the slow path that reads the word; and a context
/// without [`guard::LEFT`] (send/receive, cross-host steps: counters of their own) never
/// reads it.
#[test]
fn a_call_that_a_rank_which_left_never_made_gives_up_at_once() {
    for algo in [Algo::OneShot, Algo::TwoShot, Algo::AllPairs] {
        let mut w = World::new(3, 16 * 40, 8192);
        for c in &mut w.ctxs {
            c.guards = guard::LEFT;
        }
        // Rank 1 "left after 1 call" as far as rank 0 knows, before that call ended on rank
        // 0: call 0 (rank 2 late, so rank 0 waits in the slow path) completes on all three.
        set_left(&w, 0, 1);
        let (outs, _) = all_reduce_on(&w, algo, &[0, 1, 2], &[0, 0, 50]);
        for (r, out) in outs.iter().enumerate() {
            assert_eq!(out, &vec![6.0f32; 100], "{algo:?}: rank {r}, call 0");
            assert_eq!(record(&w, r).0, 0, "{algo:?}: rank {r} recorded a failure");
        }
        // Call 1, which rank 1 never makes: ranks 0 and 2 give up (rank 2 learns of the
        // departure 100 ms into its wait), well before the 60 s timeout.
        set_left(&w, 2, 1);
        // SAFETY: rank 2's fault area; no kernel runs yet.
        unsafe { w.ctxs[2].fault.add(fault::LEFT).write(0) };
        let fault2 = w.ctxs[2].fault as u64;
        let (_, took) = std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                // SAFETY: rank 2's fault area, written atomically as the host does.
                unsafe {
                    crate::arch::st_release_sys_u64((fault2 as *mut u64).add(fault::LEFT), 2)
                };
            });
            all_reduce_on(&w, algo, &[0, 2], &[0, 0])
        });
        assert!(
            took < std::time::Duration::from_secs(5),
            "{algo:?}: took {took:?}"
        );
        for r in [0, 2] {
            // SAFETY: rank r's fault area; no kernel runs.
            let place = unsafe { w.ctxs[r].fault.add(fault::PLACE).read() };
            let (kind, _, _, _) = record(&w, r);
            assert_eq!(
                (kind, place),
                (fault::ABORTED, fault::AT_LEFT),
                "{algo:?}: rank {r}"
            );
        }
    }
    // Without the guard the word is not read: the wait ends at the (short) timeout.
    let mut w = World::new(2, 16 * 40, 8192);
    w.ctxs[0].timeout_ns = 300_000_000;
    set_left(&w, 0, 0);
    let (_, took) = all_reduce_on(&w, Algo::OneShot, &[0], &[0]);
    // SAFETY: rank 0's fault area; no kernel runs.
    let place = unsafe { w.ctxs[0].fault.add(fault::PLACE).read() };
    assert_eq!(record(&w, 0).0, fault::TIMEOUT, "place {place}");
    assert!(took >= std::time::Duration::from_millis(300), "{took:?}");
}

/// f32 bits compared whole and shown short (the first element that differs is what a
/// failure needs, not a million values).
#[derive(PartialEq)]
struct Bits(Vec<u32>);

impl core::fmt::Debug for Bits {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let sum = self
            .0
            .iter()
            .fold(0u64, |a, &x| a.wrapping_mul(31).wrapping_add(x as u64));
        write!(
            f,
            "{} values, first {:x?}, hash {sum:x}",
            self.0.len(),
            &self.0[..self.0.len().min(4)]
        )
    }
}

/// The reducing blocks of a cross-host round (`cross::reduce_pieces`, blocks `1..` of a
/// `cross_step` grid over a host-mapped cross buffer): each piece once block 0 has handed it
/// over (`PROGRESS`) or the partners' counters say it landed (against the round's `BASES`),
/// every block's share reduced in host order exactly as one block would (f32 values whose
/// sum depends on the order), the own payload from the send slot, from `src` or in place;
/// nothing past the pieces landed, nothing once the round broke or on a host that does not
/// get the payload; every block counted done (`REDUCED`), marked as having given up when it
/// stopped waiting without the round having failed, which block 0 reads as a failure.
#[test]
fn reducing_blocks_follow_the_pieces_in_host_order() {
    use super::cross::{
        self as xk, BASES, BASES_ROUND, BROKEN, COPIED, GAVE_UP, HDR, LANDED, PIECEWISE,
        PIPE_PIECE, PROGRESS, REDUCED, ROUND,
    };
    use crate::channel::DevConn;
    use crate::fifo::{FifoDeviceHandle, Trigger};
    let (nh, me) = (3u32, 1u32);
    // Two pieces, the second short.
    let count = (PIPE_PIECE as usize / 4) + 7;
    let len = (count * 4) as u64;
    assert_eq!(xk::pieces(len), 2);
    let slot = (len + HDR).next_multiple_of(16);
    let bytes = xk::buffer_bytes(slot, nh as u64);
    let w = World::new(1, bytes.div_ceil(2), 0);
    let mut ctx = w.ctxs[0];
    (ctx.rank, ctx.nranks, ctx.scratch_len) = (me, nh, slot);
    // How long the blocks wait for a piece not handed over: short where every block's end
    // is known at its start, long where the others follow what the first reducing block saw
    // land (`LANDED`), so that a block started late on a loaded machine still sees it.
    let (short, long) = (50_000_000u64, 3_000_000_000u64);
    // Block 0's wait for the reducing blocks (checked last) gives up as soon.
    ctx.timeout_ns = short;
    // The partners' handles: only their counters are read (a FIFO nobody pushes to).
    let mut ring = vec![Trigger::ZERO; 4];
    let mut words = vec![0u64; 3 + 2 * nh as usize];
    let w8 = words.as_mut_ptr();
    // SAFETY: words 0..3 and the 2 * nh counters below lie in `words`.
    let (inbound, tickets) = unsafe { (w8.add(3), w8.add(3 + nh as usize)) };
    // SAFETY: as above.
    let fifo =
        unsafe { FifoDeviceHandle::new(ring.as_mut_ptr(), w8, w8.add(1), w8.add(2), 4, 1 << 30) }
            .unwrap();
    let conns: Vec<DevConn<'_>> = (0..nh as usize)
        // SAFETY: live aligned words for the test's length; no fault area.
        .map(|h| unsafe {
            DevConn::from_raw_parts(
                fifo,
                h as u32,
                inbound.add(h),
                tickets.add(h),
                1 << 30,
                core::ptr::null_mut(),
            )
        })
        .collect();
    ctx.conns = conns.as_ptr();
    // Values whose f32 sum changes with the order: large and small magnitudes mixed.
    let value = |h: u32, i: usize| -> f32 {
        let x = (h as u64 * 1_000_003 + i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let x = x ^ x >> 29;
        let mag = [1.0e7f32, 1.0, 3.0e-3][(x % 3) as usize];
        (x >> 8) as u32 as f32 / u32::MAX as f32 * mag - mag / 2.0
    };
    let round = 5u64; // the round block 0 runs (its half: round & 1)
    // SAFETY: every slot lies inside the world's scratch (bytes of it); state words live.
    unsafe {
        for h in 0..nh {
            let at = if h == me {
                xk::send_slot(slot, h as u64)
            } else {
                xk::recv_slot(slot, nh as u64, round, h as u64)
            };
            let p = ctx.scratch.add((at + HDR) as usize) as *mut f32;
            for i in 0..count {
                p.add(i).write(value(h, i));
            }
        }
        ctx.state.add(ROUND).write(round);
    }
    let want: Vec<u32> = (0..count)
        .map(|i| ((value(0, i) + value(1, i)) + value(2, i)).to_bits())
        .collect();
    let tag = desc::tag(
        desc::ALL_REDUCE,
        types::dtype::F32 as u64,
        op::SUM as u64 + 1,
        0,
    );
    let own: Vec<f32> = (0..count).map(|i| value(me, i)).collect();
    let sentinel = 0xeeee_eeee_u32;
    let blocks = 4u32;
    // Runs the reducing blocks with `progress` handed over, waiting up to `patience` for a
    // piece; `in_place`: src is out, holding the own payload. Returns out and the blocks
    // counted done.
    let run = |src: *const u8, in_place: bool, flags: u64, progress: u64, patience: u64| {
        let mut ctx = ctx;
        ctx.timeout_ns = patience;
        let out = Mem::new(len as usize);
        // SAFETY: the out memory is distinct, len bytes; the state words live.
        unsafe {
            let o = out.p as *mut u32;
            for (i, v) in own.iter().enumerate() {
                o.add(i)
                    .write(if in_place { v.to_bits() } else { sentinel });
            }
            ctx.state.add(PROGRESS).write(progress);
            ctx.state.add(REDUCED).write(0);
            ctx.state.add(LANDED).write(0);
        }
        let (c, o) = (&ctx, out.p as usize);
        let s = if in_place { o } else { src as usize };
        // SAFETY: every thread of blocks 1.. with the same arguments (block 0, the step's,
        // does nothing here: `progress` stands for it); the kernel reads the world's slots
        // and `src` (count f32 or null) and writes `len` bytes of out.
        launch(Dim3::x(1 + blocks), Dim3::x(64), || unsafe {
            if crate::arch::block_idx_x() > 0 {
                xk::reduce_pieces(c, s as *const u8, o as *mut u8, tag, len, flags)
            }
        })
        .unwrap();
        // SAFETY: out holds count f32 (written or sentinel); the state word live.
        unsafe {
            (
                Bits(std::slice::from_raw_parts(out.p as *const u32, count).to_vec()),
                ctx.state.add(REDUCED).read(),
            )
        }
    };
    let all = xk::flags(xk::REDUCE, 3);
    let both = round << 32 | 2;
    let done = blocks as u64;
    let null = core::ptr::null();
    let from_src = own.as_ptr() as *const u8;
    assert_eq!(
        run(null, false, all, both, long),
        (Bits(want.clone()), done),
        "send slot"
    );
    assert_eq!(
        run(from_src, false, all, both, long),
        (Bits(want.clone()), done),
        "src"
    );
    assert_eq!(
        run(null, true, all, both, long),
        (Bits(want.clone()), done),
        "in place"
    );
    let untouched = vec![sentinel; count];
    assert_eq!(
        run(null, false, xk::to_host(all, 0), both, short),
        (Bits(untouched.clone()), done),
        "another host's"
    );
    assert_eq!(
        run(null, false, all, round << 32 | BROKEN, short),
        (Bits(untouched.clone()), done),
        "a broken round"
    );
    // The first piece only: the blocks give up on the second after the device timeout, and
    // say so (block 0 then fails the round).
    let gave_up = done + done * GAVE_UP;
    let first = PIPE_PIECE as usize / 4;
    let mut part = want.clone();
    part[first..].fill(sentinel);
    assert_eq!(
        run(null, false, all, round << 32 | 1, short),
        (Bits(part), gave_up),
        "one piece"
    );
    // The previous round's progress is not this round's.
    assert_eq!(
        run(null, false, all, (round - 1) << 32 | 2, short),
        (Bits(untouched.clone()), gave_up),
        "an old round"
    );
    // Nothing handed over, but the partners' counters past the round's bases: host 0
    // signals each piece (its header says so), host 2 sent its payload whole (one signal).
    let nothing = round << 32;
    // SAFETY: the state words, counters and the partners' headers are live; no kernel runs.
    let set = |base_round: u64, arrived: [u64; 3], l: [u64; 3]| unsafe {
        ctx.state.add(BASES_ROUND).write(base_round);
        for h in [0u32, 2] {
            ctx.state.add(BASES + h as usize).write(10 + h as u64);
            tickets.add(h as usize).write(10 + h as u64);
            inbound
                .add(h as usize)
                .write(10 + h as u64 + arrived[h as usize]);
            let at = xk::recv_slot(slot, nh as u64, round, h as u64) + 24;
            (ctx.scratch.add(at as usize) as *mut u64).write(l[h as usize]);
        }
    };
    let (split, whole) = (len | PIECEWISE, len);
    set(round + 1, [2, 0, 1], [split, 0, whole]);
    assert_eq!(
        run(null, false, all, nothing, long),
        (Bits(want.clone()), done),
        "landed"
    );
    let mut part = want.clone();
    part[first..].fill(sentinel);
    set(round + 1, [1, 0, 1], [split, 0, whole]);
    assert_eq!(
        run(null, false, all, nothing, long),
        (Bits(part), gave_up),
        "one piece landed"
    );
    set(round + 1, [2, 0, 0], [split, 0, whole]);
    assert_eq!(
        run(null, false, all, nothing, short),
        (Bits(untouched.clone()), gave_up),
        "one host's"
    );
    set(round, [2, 0, 1], [split, 0, whole]);
    assert_eq!(
        run(null, false, all, nothing, short),
        (Bits(untouched), gave_up),
        "old bases"
    );
    // In place, a piece is written only once block 0 copied it out of `src` (`COPIED`).
    set(round + 1, [2, 0, 1], [split, 0, whole]);
    let own_bits: Vec<u32> = own.iter().map(|v| v.to_bits()).collect();
    let mut first_only = want.clone();
    first_only[first..].copy_from_slice(&own_bits[first..]);
    for (copied, out, counted, patience, what) in [
        (0, own_bits, gave_up, short, "nothing copied"),
        (1, first_only, gave_up, long, "one piece copied"),
        (2, want, done, long, "all copied"),
    ] {
        // SAFETY: the state word is live; no kernel runs.
        unsafe { ctx.state.add(COPIED).write(round << 32 | copied) };
        assert_eq!(
            run(null, true, all, nothing, patience),
            (Bits(out), counted),
            "in place, {what}"
        );
    }
    // Block 0's end: every block counted and none gave up, else the round fails; the count
    // is cleared for the next round only once every block is in.
    for (count, ok, left) in [
        (done, true, 0),
        (gave_up, false, 0),
        (done - 1, false, done - 1),
    ] {
        // SAFETY: the state word is live; no kernel runs.
        let got = unsafe {
            ctx.state.add(REDUCED).write(count);
            (xk::wait_reducers(&ctx, done), ctx.state.add(REDUCED).read())
        };
        assert_eq!(got, (ok, left), "block 0 after {count:#x}");
    }
    drop(conns);
}

/// The bare LL exchange (a benchmark reference): every rank's output is the XOR of every
/// rank's input, over many calls (alternating packet halves, mixed with one-shot all-reduce
/// on the same call counter), in and out of place, at unaligned sizes, on several grids.
#[test]
fn ll_exchange_delivers_every_ranks_bytes_over_many_calls() {
    for n in [2usize, 3, 4] {
        let w = World::new(n, 4096, 16 * 1024);
        for (call, bytes) in [8usize, 1, 15, 333, 4000, 8, 4000, 7]
            .into_iter()
            .enumerate()
        {
            let inputs: Vec<Vec<u8>> = (0..n)
                .map(|r| {
                    (0..bytes)
                        .map(|i| (i * 29 + r * 71 + call * 5 + 1) as u8)
                        .collect()
                })
                .collect();
            let want: Vec<u8> = (0..bytes)
                .map(|i| inputs.iter().fold(0u8, |a, v| a ^ v[i]))
                .collect();
            let in_place = call % 2 == 1;
            let blocks = 1 + (call % 3) as u32;
            let got: Vec<Vec<u8>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..n)
                    .map(|r| {
                        let input = inputs[r].clone();
                        let w = &w;
                        s.spawn(move || {
                            let recv = Mem::new(bytes);
                            let send = Mem::new(bytes);
                            let sp = if in_place { recv.p } else { send.p };
                            // SAFETY: sp holds `bytes`.
                            unsafe { std::ptr::copy_nonoverlapping(input.as_ptr(), sp, bytes) };
                            let (sp, rp, ctx) = (sp as u64, recv.p as u64, w.ctxs[r]);
                            launch(Dim3::x(blocks), Dim3::x(4), || {
                                // SAFETY: the world's context; buffers hold `bytes`.
                                unsafe {
                                    k::ll_exchange(
                                        &ctx,
                                        sp as *const u8,
                                        rp as *mut u8,
                                        bytes as u64,
                                        0,
                                    )
                                }
                            })
                            .expect("kernel ran to completion");
                            // SAFETY: recv holds `bytes`; the kernel is done.
                            unsafe { std::slice::from_raw_parts(recv.p, bytes) }.to_vec()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (r, g) in got.iter().enumerate() {
                assert_eq!(g, &want, "n={n} call {call} bytes {bytes} rank {r}");
            }
            if call % 3 == 2 {
                // A one-shot all-reduce in between: same counter, same packet halves.
                let inputs = int_inputs(n, 100, call as u64);
                let want = expected(&inputs);
                for (r, got) in all_reduce(&w, Ty::F32, Algo::OneShot, &inputs, 0, false, 2, 64)
                    .iter()
                    .enumerate()
                {
                    assert_eq!(got, &want, "n={n} all-reduce after call {call}, rank {r}");
                }
            }
        }
    }
}
