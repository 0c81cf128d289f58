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
    pub(super) fn new(n: usize, scratch_len: u64, packets_len: u64) -> World {
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
                    state: alloc(STATE_WORDS as u64 * 8) as *mut u64,
                    // Proxy channels need the host's proxy: tested in mscclpp-host.
                    conns: core::ptr::null(),
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
                    launch(Dim3::x(blocks), Dim3::x(4), || {
                        // SAFETY: the world's context; buffers valid as the kernel needs.
                        unsafe { k::all_gather(&ctx, sp as *const u8, rp as *mut u8, bytes as u64) }
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
    assert_eq!(one_shot_max_bytes(4096), 1024);
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
