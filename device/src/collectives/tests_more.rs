//! Reduce-scatter, reduce, broadcast and all-to-all on CPU threads: `n` ranks as threads,
//! each running a whole sequence of calls without joining in between (so a rank may run
//! ahead of its peers by several calls, as on GPUs), every result checked bit for bit
//! against a CPU reference that sums in rank order with the type's rounding.

use super::tests::{Mem, World};
use super::*;
use crate::arch::{Dim3, launch};
use crate::kernels::collectives as k1;
use crate::kernels::collectives_more as k;
use half::{bf16, f16};
use std::vec;
use std::vec::Vec;

/// A trap fails a test in this long rather than the world's minute.
const TIMEOUT_NS: u64 = 10_000_000_000;

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
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of rank `rank`'s input of call `seed`, as raw bits: random values in
/// [-4, 4) with many mantissa bits, held exactly by the type (so the sum's order shows).
fn value(ty: Ty, seed: u64, rank: usize, i: usize) -> u32 {
    let h = splitmix(seed ^ (rank as u64) << 56 ^ i as u64);
    let v = (h >> 40) as f32 / (1u64 << 21) as f32 - 4.0;
    match ty {
        Ty::F32 => v.to_bits(),
        Ty::F16 => f16::from_f32(v).to_bits() as u32,
        Ty::Bf16 => bf16::from_f32(v).to_bits() as u32,
    }
}

/// `a + b` rounded to the type (the f32 sum of two f16/bf16 values rounds correctly).
fn add(ty: Ty, a: u32, b: u32) -> u32 {
    match ty {
        Ty::F32 => (f32::from_bits(a) + f32::from_bits(b)).to_bits(),
        Ty::F16 => {
            f16::from_f32(f16::from_bits(a as u16).to_f32() + f16::from_bits(b as u16).to_f32())
                .to_bits() as u32
        }
        Ty::Bf16 => {
            bf16::from_f32(bf16::from_bits(a as u16).to_f32() + bf16::from_bits(b as u16).to_f32())
                .to_bits() as u32
        }
    }
}

/// The rank-order sum over `n` ranks of element `i`.
fn sum(ty: Ty, seed: u64, n: usize, i: usize) -> u32 {
    (1..n).fold(value(ty, seed, 0, i), |acc, q| {
        add(ty, acc, value(ty, seed, q, i))
    })
}

fn bytes_of(ty: Ty, words: impl Iterator<Item = u32>) -> Vec<u8> {
    let mut out = Vec::new();
    for w in words {
        out.extend_from_slice(&w.to_le_bytes()[..ty.size()]);
    }
    out
}

fn byte(seed: u64, rank: usize, i: usize) -> u8 {
    splitmix(seed ^ (rank as u64) << 52 ^ i as u64) as u8
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coll {
    ReduceScatter(Ty),
    Reduce(Ty),
    Broadcast,
    AllToAll,
    /// The existing one-shot all-reduce (f32), to mix the shared call counter.
    AllReduceOneShot,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    coll: Coll,
    /// LL packets (else puts through the scratch).
    ll: bool,
    /// Elements (reducing) or bytes (per block for all-to-all).
    count: usize,
    root: usize,
    /// Offset of the user buffers from 16-byte alignment.
    pad: usize,
    in_place: bool,
    seed: u64,
    blocks: u32,
    threads: u32,
    /// The receiving ranks of a rooted call (broadcast: all but the root; reduce: the root)
    /// sleep this long before it, so the writers may run ahead.
    lag_us: u64,
    /// Broadcast and reduce: the pipelined kernel with this piece size and depth (instead
    /// of `ll`'s path).
    pipe: Option<(u64, u32)>,
}

/// Fill of output bytes a call must not touch.
const UNTOUCHED: u8 = 0xEE;

impl Case {
    /// `(input, expected output, recv offset in the send buffer when in place)` of rank `r`
    /// of `n`.
    fn data(&self, n: usize, r: usize) -> (Vec<u8>, Vec<u8>, usize) {
        let (c, s) = (self.count, self.seed);
        match self.coll {
            Coll::ReduceScatter(ty) => (
                bytes_of(ty, (0..n * c).map(|i| value(ty, s, r, i))),
                bytes_of(ty, (0..c).map(|i| sum(ty, s, n, r * c + i))),
                r * c * ty.size(),
            ),
            Coll::Reduce(ty) => {
                let input = bytes_of(ty, (0..c).map(|i| value(ty, s, r, i)));
                let want = if r == self.root {
                    bytes_of(ty, (0..c).map(|i| sum(ty, s, n, i)))
                } else if self.in_place {
                    input.clone()
                } else {
                    vec![UNTOUCHED; c * ty.size()]
                };
                (input, want, 0)
            }
            Coll::AllReduceOneShot => (
                bytes_of(Ty::F32, (0..c).map(|i| value(Ty::F32, s, r, i))),
                bytes_of(Ty::F32, (0..c).map(|i| sum(Ty::F32, s, n, i))),
                0,
            ),
            Coll::Broadcast => (
                (0..c).map(|i| byte(s, r, i)).collect(),
                (0..c).map(|i| byte(s, self.root, i)).collect(),
                0,
            ),
            Coll::AllToAll => (
                (0..n * c).map(|i| byte(s, r, i)).collect(),
                // Block q of the output: block r of rank q's input.
                (0..n * c).map(|i| byte(s, i / c, r * c + i % c)).collect(),
                0,
            ),
        }
    }

    /// The kernel, its `count` argument and its tag.
    fn kernel(&self) -> (k::MoreKernel, u64, u64) {
        use Coll::*;
        let c = self.count as u64;
        let (algo, root) = (if self.ll { 1 } else { 2 }, self.root as u64);
        let dt = |ty: Ty| match ty {
            Ty::F32 => 1,
            Ty::F16 => 2,
            Ty::Bf16 => 3,
        };
        let (f, tag): (k::MoreKernel, u64) = match (self.coll, self.ll) {
            (ReduceScatter(Ty::F32), true) => (k::reduce_scatter_ll_b32, 0),
            (ReduceScatter(_), true) => (k::reduce_scatter_ll_b16, 0),
            (ReduceScatter(_), false) => (k::reduce_scatter_put, 0),
            (Reduce(Ty::F32), true) => (k::reduce_ll_b32, 0),
            (Reduce(_), true) => (k::reduce_ll_b16, 0),
            (Reduce(_), false) => (k::reduce_put, 0),
            (Broadcast, true) => (k::broadcast_ll, desc::BROADCAST),
            (Broadcast, false) => (k::broadcast_put, desc::BROADCAST),
            (AllToAll, true) => (k::all_to_all_ll, desc::ALL_TO_ALL),
            (AllToAll, false) => (k::all_to_all_put, desc::ALL_TO_ALL),
            (AllReduceOneShot, _) => (
                k1::all_reduce_one_shot_f32,
                desc::tag(desc::ALL_REDUCE, 1, 1, 1),
            ),
        };
        if let (Some((piece, depth)), Broadcast | Reduce(_)) = (self.pipe, self.coll) {
            let (f, tag): (k::MoreKernel, u64) = match self.coll {
                Reduce(ty) => (
                    k::reduce_pipe,
                    desc::rooted_tag(desc::REDUCE, dt(ty), 1, desc::PIPELINED, root),
                ),
                _ => (
                    k::broadcast_pipe,
                    desc::rooted_tag(desc::BROADCAST, 0, 0, desc::PIPELINED, root),
                ),
            };
            return (f, c, desc::with_pipe(tag, piece, depth));
        }
        let tag = match self.coll {
            ReduceScatter(ty) => desc::tag(desc::REDUCE_SCATTER, dt(ty), 1, algo),
            Reduce(ty) => desc::rooted_tag(desc::REDUCE, dt(ty), 1, algo, root),
            Broadcast => desc::rooted_tag(tag, 0, 0, algo, root),
            AllToAll => desc::tag(tag, 0, 0, algo),
            AllReduceOneShot => tag,
        };
        (f, c, tag)
    }

    /// Runs the case on rank `r` and checks it.
    fn run(&self, ctx: &CollContext, n: usize, r: usize) {
        let receives = match self.coll {
            Coll::Broadcast => r != self.root,
            Coll::Reduce(_) => r == self.root,
            _ => false,
        };
        if receives && self.lag_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(self.lag_us));
        }
        let (input, want, off) = self.data(n, r);
        let pad = self.pad;
        let send = Mem::new(pad + input.len().max(off + want.len()));
        // SAFETY: fresh memory of at least pad + input.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(input.as_ptr(), send.p.add(pad), input.len()) };
        let recv = Mem::new(pad + want.len());
        // SAFETY: fresh memory of pad + want.len() bytes.
        unsafe { std::ptr::write_bytes(recv.p.add(pad), UNTOUCHED, want.len()) };
        // SAFETY: both buffers hold the offsets.
        let (sp, rp) = unsafe {
            let sp = send.p.add(pad);
            (
                sp,
                if self.in_place {
                    sp.add(off)
                } else {
                    recv.p.add(pad)
                },
            )
        };
        let (f, count, tag) = self.kernel();
        let (sp, rp) = (sp as u64, rp as u64);
        launch(Dim3::x(self.blocks), Dim3::x(self.threads), || {
            // SAFETY: the world's context; buffers valid for what the kernel accesses.
            unsafe { f(ctx, sp as *const u8, rp as *mut u8, count, tag) }
        })
        .unwrap_or_else(|e| panic!("rank {r} of {n}: {self:?}: {e}"));
        // SAFETY: rp is valid for want.len() bytes; the kernel is done.
        let got = unsafe { std::slice::from_raw_parts(rp as *const u8, want.len()) };
        if got != want.as_slice() {
            let first = got.iter().zip(&want).position(|(g, w)| g != w).unwrap();
            panic!("rank {r} of {n}: {self:?}: first wrong byte at {first}");
        }
    }
}

/// Runs `cases` in sequence on `n` ranks (one thread each, no join between calls).
fn run_sequence(w: &World, n: usize, cases: &[Case]) {
    std::thread::scope(|s| {
        for r in 0..n {
            let mut ctx = w.ctxs[r];
            ctx.timeout_ns = TIMEOUT_NS;
            s.spawn(move || {
                for c in cases {
                    c.run(&ctx, n, r);
                }
            });
        }
    });
}

/// Grids by seed: (blocks, threads), at least `n` threads.
fn grid(seed: u64, n: usize) -> (u32, u32) {
    let (b, t) = [(2, 4), (3, 5), (1, 8), (4, 4)][(seed % 4) as usize];
    (b, t.max(n as u32))
}

/// Every path of every collective, type, size, alignment and place for `n` ranks.
fn all_cases(n: usize, counts: &[usize]) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut seed = n as u64 * 1000;
    let colls = [
        Coll::ReduceScatter(Ty::F32),
        Coll::ReduceScatter(Ty::F16),
        Coll::ReduceScatter(Ty::Bf16),
        Coll::Reduce(Ty::F32),
        Coll::Reduce(Ty::F16),
        Coll::Reduce(Ty::Bf16),
        Coll::Broadcast,
        Coll::AllToAll,
        Coll::AllReduceOneShot,
    ];
    for &count in counts {
        for coll in colls {
            let size = match coll {
                Coll::ReduceScatter(t) | Coll::Reduce(t) => t.size(),
                Coll::AllReduceOneShot => 4,
                _ => 1,
            };
            for ll in [true, false] {
                if coll == Coll::AllReduceOneShot && !ll {
                    continue;
                }
                let rooted = matches!(coll, Coll::Reduce(_) | Coll::Broadcast);
                let roots: Vec<usize> = if rooted { (0..n).collect() } else { vec![0] };
                for root in roots {
                    for (pad, in_place) in [(0, false), (0, true), (size, false), (size, true)] {
                        seed += 1;
                        let (blocks, threads) = grid(seed, n);
                        cases.push(Case {
                            coll,
                            ll,
                            count,
                            root,
                            pad,
                            in_place,
                            seed,
                            blocks,
                            threads,
                            lag_us: 0,
                            pipe: None,
                        });
                    }
                }
            }
        }
    }
    cases
}

#[test]
fn every_collective_path_type_size_root_and_place_matches_the_rank_order_reference() {
    for n in [1usize, 2, 3, 4] {
        // A small scratch forces several rounds through the slots (640 bytes: 208 per
        // rank for three ranks); the packet halves hold 4096 bytes (255 data packets for the
        // rooted paths).
        let w = World::new(n, 16 * 40, 8192);
        let counts: &[usize] = if n <= 2 {
            &[1, 3, 8, 33, 100, 257]
        } else {
            &[1, 7, 100, 257]
        };
        let cases = all_cases(n, counts);
        run_sequence(&w, n, &cases);
        // Every call (LL or put) advanced the one shared call counter.
        let ll_calls = cases.len() as u64;
        for r in 0..n {
            // SAFETY: rank r's state words; no kernel running.
            let words = unsafe { std::slice::from_raw_parts(w.ctxs[r].state, STATE_WORDS) };
            for b in 0..MAX_BLOCKS {
                assert_eq!(words[0].max(words[1 + b]), ll_calls, "rank {r} block {b}");
            }
        }
    }
}

/// The LL paths (one-shot all-reduce, reduce-scatter, reduce, broadcast, all-to-all) on
/// grids of more than a warp, where block 0's first warp sends and checks the descriptors and
/// carries no data (`all_reduce::data_threads`): one block with 8 data threads, two with
/// 40, three with 67 (block 0 keeps one); counts above and below the data threads.
#[test]
fn ll_paths_on_grids_with_a_data_free_descriptor_warp_match_the_reference() {
    for n in [2usize, 3] {
        let w = World::new(n, 16 * 40, 8192);
        let counts: &[usize] = if n == 2 { &[17, 100] } else { &[40] };
        let mut cases = all_cases(n, counts);
        cases.retain(|c| c.ll);
        for (i, c) in cases.iter_mut().enumerate() {
            (c.blocks, c.threads) = [(1, 40), (2, 36), (3, 33)][i % 3];
        }
        run_sequence(&w, n, &cases);
    }
}

/// Every unit of a call belongs to exactly one data thread, and block 0's first warp (the
/// descriptor threads) has none once the grid has more than a warp.
#[test]
fn data_threads_own_every_unit_once_and_leave_the_descriptor_warp_free() {
    use super::all_reduce::data_threads;
    for (nb, nt) in [
        (1, 1),
        (1, 8),
        (4, 8),
        (1, 32),
        (1, 33),
        (1, 64),
        (2, 40),
        (3, 512),
    ] {
        for units in [0u64, 1, 31, 32, 33, 100, 3 * 512, 5000] {
            let mut owners = vec![0u32; units as usize];
            for b in 0..nb {
                for t in 0..nt {
                    let (first, stride) = data_threads(t, nt, b, nb);
                    let mut i = first;
                    while i < units {
                        owners[i as usize] += 1;
                        assert!(
                            nb * nt <= 32 || b > 0 || t >= nt.min(32),
                            "grid {nb}x{nt}: thread {t} of block 0 got unit {i}"
                        );
                        i += stride;
                    }
                }
            }
            assert!(
                owners.iter().all(|&o| o == 1),
                "grid {nb}x{nt}, {units} units: owners {owners:?}"
            );
        }
    }
}

#[test]
fn rooted_ll_calls_in_a_row_do_not_let_the_root_overrun_its_peers() {
    // The root of a broadcast (or a non-root of a reduce) only writes data: without the
    // descriptor check at the end of every call it would run two calls ahead and overwrite
    // packets a peer has not read yet (the peer would then wait for a flag that never comes).
    let n = 3;
    let w = World::new(n, 1024, 2048);
    let mut cases = Vec::new();
    for seed in 0..40u64 {
        // Runs of ten calls of one kind and root, the receivers sleeping before each.
        let coll = if seed / 10 % 2 == 0 {
            Coll::Broadcast
        } else {
            Coll::Reduce(Ty::F32)
        };
        cases.push(Case {
            coll,
            ll: true,
            count: 1 + (seed as usize * 37) % 120,
            root: (seed / 20) as usize,
            pad: 0,
            in_place: seed % 3 == 0,
            seed,
            blocks: 1 + (seed % 3) as u32,
            threads: 4,
            lag_us: 2000,
            pipe: None,
        });
    }
    run_sequence(&w, n, &cases);
}

#[test]
fn rank_slots_are_multiples_of_16() {
    assert_eq!(reduce_scatter::rank_slot(640, 3), 208);
}

/// One group: `(send, peer, bytes)` per operation.
type Group = Vec<(bool, usize, usize)>;

/// How a p2p launch cuts transfers: sub-slots per chunk, LL transfers up to `ll_max`
/// bytes over `ll_blocks` blocks.
#[derive(Clone, Copy, Debug)]
struct P2pShape {
    depth: u32,
    ll_max: u64,
    ll_blocks: u32,
    /// `P2pOps::ll_row`; when set, rank `r` launches blocks of `2 + r` threads (the two
    /// sides of a transfer then run different block sizes), else every rank 3.
    ll_row: u32,
}

const PLAIN: P2pShape = P2pShape {
    depth: 1,
    ll_max: 0,
    ll_blocks: 0,
    ll_row: 0,
};

/// Runs `groups[r]` (rank r's groups, in order) on every rank over p2p contexts of `slot`
/// bytes per source rank: each group's sends carry `byte(seed, rank, i)`, each receive is
/// checked against the sender's bytes.
fn run_p2p(n: usize, slot: u64, max_blocks: u32, groups: &[Vec<Group>]) {
    run_p2p_shaped(n, slot, max_blocks, PLAIN, groups)
}

/// [`run_p2p`] with a shape.
fn run_p2p_shaped(n: usize, slot: u64, max_blocks: u32, shape: P2pShape, groups: &[Vec<Group>]) {
    use send_recv::{P2pOp, P2pOps};
    // World::new gives 2 * scratch_len bytes of scratch: n slots; packet scratch for LL
    // transfers of ll_max bytes (two halves of 16-byte packets, the done words).
    let packets = (4 * shape.ll_max.div_ceil(8) * 8 + send_recv::P2P_TAIL_BYTES).max(32);
    let w = World::new(n, (n as u64 * slot).div_ceil(2), packets);
    std::thread::scope(|s| {
        for (r, rank_groups) in groups.iter().enumerate().take(n) {
            let mut ctx = w.ctxs[r];
            ctx.timeout_ns = TIMEOUT_NS;
            ctx.scratch_len = slot;
            s.spawn(move || {
                // Messages so far per (peer, direction): sends and receives match in this
                // order per pair.
                let mut seq = vec![[0u64; 2]; n];
                for (g, group) in rank_groups.iter().enumerate() {
                    let mut ops = P2pOps {
                        count: group.len() as u32,
                        depth: shape.depth,
                        ll_max: shape.ll_max,
                        ll_blocks: shape.ll_blocks,
                        ll_row: shape.ll_row,
                        ..P2pOps::default()
                    };
                    // (send, peer, bytes): a message's data depends on (sender, receiver, its
                    // number among the messages between them).
                    let mut mems = Vec::new();
                    for (i, &(send, peer, bytes)) in group.iter().enumerate() {
                        let k = seq[peer][send as usize];
                        seq[peer][send as usize] += 1;
                        let (from, to) = if send { (r, peer) } else { (peer, r) };
                        let seed = (from as u64) << 32 | (to as u64) << 24 | k;
                        // Offset by one byte: unaligned buffers.
                        let m = Mem::new(bytes + 1);
                        // SAFETY: m holds bytes + 1 bytes.
                        let p = unsafe { m.p.add(1) };
                        if send {
                            for j in 0..bytes {
                                // SAFETY: j < bytes.
                                unsafe { p.add(j).write(byte(seed, 0, j)) };
                            }
                        }
                        ops.ops[i] = P2pOp {
                            buf: p as u64,
                            bytes: bytes as u64,
                            peer: peer as u32,
                            send: send as u32,
                            ..P2pOp::default()
                        };
                        mems.push((m, seed, send, bytes));
                    }
                    let piece = send_recv::p2p_piece(slot, shape.depth);
                    let blocks = ops.plan(piece, max_blocks);
                    let threads = if shape.ll_row > 0 { 2 + r as u32 } else { 3 };
                    launch(Dim3::x(blocks), Dim3::x(threads), || {
                        // SAFETY: the p2p context; every op's buffer holds its bytes.
                        unsafe { k::p2p(&ctx, ops) }
                    })
                    .unwrap_or_else(|e| panic!("rank {r} group {g} {group:?} {shape:?}: {e}"));
                    for (i, (m, seed, send, bytes)) in mems.iter().enumerate() {
                        if !send {
                            // SAFETY: the kernel is done; m holds bytes + 1.
                            let got = unsafe { std::slice::from_raw_parts(m.p.add(1), *bytes) };
                            let bad = (0..*bytes).find(|&j| got[j] != byte(*seed, 0, j));
                            assert_eq!(bad, None, "rank {r} group {g} op {i} {group:?} {shape:?}");
                        }
                    }
                }
            });
        }
    });
}

/// Groups of every kind over `n` ranks: a ring both ways, every pair exchanging two messages
/// of different sizes, one-way transfers, for sizes `1..=33_333`.
fn p2p_groups(n: usize) -> Vec<Vec<Group>> {
    let mut groups = vec![Vec::new(); n];
    for (g, bytes) in [1usize, 17, 100, 4096, 5000, 33_333]
        .into_iter()
        .enumerate()
    {
        // A ring, both directions in one group.
        for (r, gr) in groups.iter_mut().enumerate() {
            gr.push(vec![
                (true, (r + 1) % n, bytes + g),
                (false, (r + n - 1) % n, bytes + g),
            ]);
        }
        // Every pair exchanges, two sends to each peer (ordered in one lane) of different
        // sizes, receives posted before the sends.
        for (r, gr) in groups.iter_mut().enumerate() {
            let mut ops = Vec::new();
            for p in (0..n).filter(|&p| p != r) {
                ops.push((false, p, bytes));
                ops.push((false, p, bytes / 2 + 3));
            }
            for p in (0..n).filter(|&p| p != r) {
                ops.push((true, p, bytes));
                ops.push((true, p, bytes / 2 + 3));
            }
            gr.push(ops);
        }
        // One-way transfers alone: rank 0 sends to every other rank in turn.
        for p in 1..n {
            groups[0].push(vec![(true, p, bytes * 2 + 1)]);
            groups[p].push(vec![(false, 0, bytes * 2 + 1)]);
        }
    }
    groups
}

#[test]
fn grouped_sends_and_receives_match_in_order_per_peer() {
    for n in [2usize, 3, 4] {
        // Slots of 2048 bytes: chunks of 32 bytes, so large transfers reuse each chunk many
        // times; at most 4 blocks per transfer.
        run_p2p(n, 2048, 4, &p2p_groups(n));
    }
}

#[test]
fn pipelined_and_ll_transfers_match_in_order_per_peer() {
    // Slots of 8192 bytes: chunks of 128 bytes cut into 2 or 4 pieces, reused many times;
    // LL transfers up to 100 or 5000 bytes (the smaller sizes of p2p_groups, and most
    // transfers repeat one half of the packet scratch, which the done words guard).
    for n in [2usize, 3] {
        for shape in [
            P2pShape {
                depth: 2,
                ll_max: 0,
                ll_blocks: 0,
                ll_row: 0,
            },
            P2pShape {
                depth: 4,
                ll_max: 100,
                ll_blocks: 1,
                ll_row: 0,
            },
            P2pShape {
                depth: 2,
                ll_max: 5000,
                ll_blocks: 3,
                ll_row: 0,
            },
        ] {
            run_p2p_shaped(n, 8192, 4, shape, &p2p_groups(n));
        }
    }
}

#[test]
fn many_small_sends_in_a_row_wait_for_the_receiver() {
    // Rank 0 sends 40 LL messages to rank 1 in 40 launches; a send completes without the
    // receiver, so rank 0 runs ahead of rank 1, and without the done words a send could
    // overwrite packets of the send two before it that rank 1 has not read yet.
    let shape = P2pShape {
        depth: 1,
        ll_max: 256,
        ll_blocks: 2,
        ll_row: 0,
    };
    let mut groups = vec![Vec::new(); 2];
    for i in 0..40usize {
        groups[0].push(vec![(true, 1, 1 + i * 6)]);
        groups[1].push(vec![(false, 0, 1 + i * 6)]);
    }
    run_p2p_shaped(2, 2048, 4, shape, &groups);
}

#[test]
fn ll_blocks_own_the_same_units_whatever_the_block_size() {
    // What block k of an LL transfer moves must not depend on the launch's block size: the
    // host launches groups of LL transfers with smaller blocks than other groups, so the
    // sender's and the receiver's launches may differ. Every unit once, and per block the
    // same set for every block size.
    for (units, blocks, row) in [
        (1u64, 1u32, 4u32),
        (37, 3, 4),
        (1000, 16, 512),
        (4096, 2, 7),
    ] {
        let owned = |nt: u32| {
            let mut by_block = vec![Vec::new(); blocks as usize];
            for (k, set) in by_block.iter_mut().enumerate() {
                for t in 0..nt {
                    send_recv::block_units(k as u32, blocks, row, units, t, nt, |i| {
                        set.push(i);
                        true
                    });
                }
                set.sort_unstable();
            }
            by_block
        };
        let want = owned(row);
        let mut all: Vec<u64> = want.concat();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..units).collect::<Vec<_>>(),
            "{units} units over {blocks} blocks"
        );
        for nt in [1, 2, 3, 5, 32, 128] {
            assert_eq!(
                owned(nt),
                want,
                "{units} units, {blocks} blocks, rows of {row}, {nt} threads"
            );
        }
    }
}

#[test]
fn ll_transfers_match_when_the_two_sides_launch_different_block_sizes() {
    // Rank r launches blocks of 2 + r threads, rows of 4 units: 30 LL sends in a row through
    // both halves of the packet scratch (so the done words guard each reuse), both ways.
    let shape = P2pShape {
        depth: 1,
        ll_max: 256,
        ll_blocks: 2,
        ll_row: 4,
    };
    let mut groups = vec![Vec::new(); 2];
    for i in 0..30usize {
        groups[0].push(vec![(true, 1, 1 + i * 8), (false, 1, 250 - i * 8)]);
        groups[1].push(vec![(false, 0, 1 + i * 8), (true, 0, 250 - i * 8)]);
    }
    run_p2p_shaped(2, 2048, 4, shape, &groups);
}

#[test]
fn p2p_plan_puts_lanes_side_by_side() {
    use send_recv::{P2pOp, P2pOps};
    let mut ops = P2pOps {
        count: 4,
        ..P2pOps::default()
    };
    let op = |peer, send, bytes| P2pOp {
        buf: 0,
        bytes,
        peer,
        send,
        first_block: 0,
        blocks: 0,
    };
    ops.ops[0] = op(1, 1, 100); // 4 blocks of 32
    ops.ops[1] = op(1, 0, 10); // 1 block
    ops.ops[2] = op(1, 1, 1000); // same lane as 0: 8 blocks
    ops.ops[3] = op(2, 1, 64); // 2 blocks
    assert_eq!(ops.plan(32, 8), 8 + 1 + 2);
    let firsts: Vec<u32> = ops.ops[..4].iter().map(|o| o.first_block).collect();
    let blocks: Vec<u32> = ops.ops[..4].iter().map(|o| o.blocks).collect();
    assert_eq!(firsts, [0, 8, 0, 9]);
    assert_eq!(blocks, [4, 1, 8, 2]);
}

/// The kernels' common signature.
type Kernel5 = unsafe fn(*const CollContext, *const u8, *mut u8, u64, u64);

/// The kernel and tag of path `path` for type `ti` (in [`OpTy::ALL`] order, which is the
/// descriptor's type code less one) and operation `opc`: all-reduce one-shot, two-shot,
/// read-reduce, all-pairs (0..4; read-reduce and all-pairs are two-shot but for sums of the
/// 16/32-bit floats, as the host routes them), reduce-scatter LL and put, reduce LL and put
/// (4..8) to `root`; the test adds the pipelined reduce (8).
fn reducing_kernel(ti: usize, path: usize, opc: u32, root: usize) -> (Kernel5, u64) {
    const SUM: [[Kernel5; 4]; 3] = [
        [
            k1::all_reduce_one_shot_f32,
            k1::all_reduce_two_shot_f32,
            k1::all_reduce_two_shot_read_f32,
            k1::all_reduce_all_pairs_f32,
        ],
        [
            k1::all_reduce_one_shot_f16,
            k1::all_reduce_two_shot_f16,
            k1::all_reduce_two_shot_read_f16,
            k1::all_reduce_all_pairs_f16,
        ],
        [
            k1::all_reduce_one_shot_bf16,
            k1::all_reduce_two_shot_bf16,
            k1::all_reduce_two_shot_read_bf16,
            k1::all_reduce_all_pairs_bf16,
        ],
    ];
    const ONE_SHOT: [Kernel5; 4] = [
        k1::all_reduce_one_shot_op_b8,
        k1::all_reduce_one_shot_op_b16,
        k1::all_reduce_one_shot_op_b32,
        k1::all_reduce_one_shot_op_b64,
    ];
    const RS_LL: [Kernel5; 4] = [
        k::reduce_scatter_ll_b8,
        k::reduce_scatter_ll_b16,
        k::reduce_scatter_ll_b32,
        k::reduce_scatter_ll_b64,
    ];
    const RED_LL: [Kernel5; 4] = [
        k::reduce_ll_b8,
        k::reduce_ll_b16,
        k::reduce_ll_b32,
        k::reduce_ll_b64,
    ];
    let class = OpTy::ALL[ti].size().trailing_zeros() as usize;
    let (dt, o) = (ti as u64 + 1, opc as u64 + 1);
    let sum = opc == op::SUM && ti < 3;
    match path {
        0..4 => {
            let f = if sum {
                SUM[ti][path]
            } else if path == 0 {
                ONE_SHOT[class]
            } else {
                k1::all_reduce_two_shot_op
            };
            let algo = if sum || path == 0 { path + 1 } else { 2 };
            (f, desc::tag(desc::ALL_REDUCE, dt, o, algo as u64))
        }
        4 => (RS_LL[class], desc::tag(desc::REDUCE_SCATTER, dt, o, 1)),
        5 => (
            k::reduce_scatter_put,
            desc::tag(desc::REDUCE_SCATTER, dt, o, 2),
        ),
        6 => (
            RED_LL[class],
            desc::rooted_tag(desc::REDUCE, dt, o, 1, root as u64),
        ),
        _ => (
            k::reduce_put,
            desc::rooted_tag(desc::REDUCE, dt, o, 2, root as u64),
        ),
    }
}

/// Every reducing type, with a reference of every operation written independently of the
/// kernels' (std and `half` arithmetic, `total_cmp` for float min/max).
#[derive(Clone, Copy, Debug, PartialEq)]
enum OpTy {
    F32,
    F16,
    Bf16,
    F64,
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
}

impl OpTy {
    const ALL: [OpTy; 10] = [
        OpTy::F32,
        OpTy::F16,
        OpTy::Bf16,
        OpTy::F64,
        OpTy::I8,
        OpTy::U8,
        OpTy::I32,
        OpTy::U32,
        OpTy::I64,
        OpTy::U64,
    ];

    fn size(self) -> usize {
        match self {
            OpTy::I8 | OpTy::U8 => 1,
            OpTy::F16 | OpTy::Bf16 => 2,
            OpTy::F32 | OpTy::I32 | OpTy::U32 => 4,
            OpTy::F64 | OpTy::I64 | OpTy::U64 => 8,
        }
    }

    /// Random bits: floats in [-4, 4) held exactly, integers over their whole range.
    fn value(self, seed: u64, rank: usize, i: usize) -> u64 {
        let h = splitmix(seed ^ (rank as u64) << 56 ^ i as u64);
        let v = (h >> 40) as f32 / (1u64 << 21) as f32 - 4.0;
        match self {
            OpTy::F32 => v.to_bits() as u64,
            OpTy::F16 => f16::from_f32(v).to_bits() as u64,
            OpTy::Bf16 => bf16::from_f32(v).to_bits() as u64,
            OpTy::F64 => ((h >> 11) as f64 / (1u64 << 50) as f64 - 4.0).to_bits(),
            _ => h & mask(self.size()),
        }
    }

    /// `op` (not average's division) of two elements' bits.
    fn apply(self, op: u32, a: u64, b: u64) -> u64 {
        use core::cmp::Ordering::{Greater, Less};
        macro_rules! float {
            ($x:expr, $y:expr, $to:expr) => {{
                let (x, y) = ($x, $y);
                let pick_b = match op {
                    op::MIN => y.total_cmp(&x) == Less,
                    op::MAX => y.total_cmp(&x) == Greater,
                    _ => false,
                };
                match op {
                    op::PROD => $to(x * y),
                    op::MIN | op::MAX => {
                        if pick_b {
                            b
                        } else {
                            a
                        }
                    }
                    _ => $to(x + y),
                }
            }};
        }
        macro_rules! int {
            ($t:ty) => {{
                let (x, y) = (a as $t, b as $t);
                (match op {
                    op::PROD => x.wrapping_mul(y),
                    op::MIN => x.min(y),
                    op::MAX => x.max(y),
                    _ => x.wrapping_add(y),
                }) as u64
                    & mask(self.size())
            }};
        }
        match self {
            OpTy::F32 => float!(
                f32::from_bits(a as u32),
                f32::from_bits(b as u32),
                |v: f32| v.to_bits() as u64
            ),
            OpTy::F64 => float!(f64::from_bits(a), f64::from_bits(b), |v: f64| v.to_bits()),
            OpTy::F16 => {
                let (x, y) = (f16::from_bits(a as u16), f16::from_bits(b as u16));
                match op {
                    op::MIN | op::MAX => float!(x, y, |v: f16| v.to_bits() as u64),
                    op::PROD => f16::from_f32(x.to_f32() * y.to_f32()).to_bits() as u64,
                    _ => f16::from_f32(x.to_f32() + y.to_f32()).to_bits() as u64,
                }
            }
            OpTy::Bf16 => {
                let (x, y) = (bf16::from_bits(a as u16), bf16::from_bits(b as u16));
                match op {
                    op::MIN | op::MAX => float!(x, y, |v: bf16| v.to_bits() as u64),
                    op::PROD => bf16::from_f32(x.to_f32() * y.to_f32()).to_bits() as u64,
                    _ => bf16::from_f32(x.to_f32() + y.to_f32()).to_bits() as u64,
                }
            }
            OpTy::I8 => int!(i8),
            OpTy::U8 => int!(u8),
            OpTy::I32 => int!(i32),
            OpTy::U32 => int!(u32),
            OpTy::I64 => int!(i64),
            OpTy::U64 => int!(u64),
        }
    }

    /// Average's division of a sum by `n`.
    fn divide(self, a: u64, n: usize) -> u64 {
        let m = mask(self.size());
        match self {
            OpTy::F32 => (f32::from_bits(a as u32) / n as f32).to_bits() as u64,
            OpTy::F64 => (f64::from_bits(a) / n as f64).to_bits(),
            OpTy::F16 => {
                f16::from_f32(f16::from_bits(a as u16).to_f32() / n as f32).to_bits() as u64
            }
            OpTy::Bf16 => {
                bf16::from_f32(bf16::from_bits(a as u16).to_f32() / n as f32).to_bits() as u64
            }
            OpTy::I8 => (a as i8 / n as i8) as u64 & m,
            OpTy::I32 => (a as i32 / n as i32) as u64 & m,
            OpTy::I64 => (a as i64 / n as i64) as u64,
            _ => a / n as u64,
        }
    }

    /// The reference: `op` over ranks `0..n` of element `i`, in rank order.
    fn reduce(self, op: u32, seed: u64, n: usize, i: usize) -> u64 {
        let acc = (1..n).fold(self.value(seed, 0, i), |acc, q| {
            self.apply(op, acc, self.value(seed, q, i))
        });
        if op == op::AVG {
            self.divide(acc, n)
        } else {
            acc
        }
    }

    fn bytes(self, words: impl Iterator<Item = u64>) -> Vec<u8> {
        let mut out = Vec::new();
        for w in words {
            out.extend_from_slice(&w.to_le_bytes()[..self.size()]);
        }
        out
    }
}

fn mask(size: usize) -> u64 {
    if size == 8 {
        u64::MAX
    } else {
        (1 << (size * 8)) - 1
    }
}

#[test]
fn every_operation_of_every_type_on_every_reducing_path_matches_the_reference() {
    for n in [2usize, 3, 4] {
        // Several rounds through the scratch for the put paths.
        let w = World::new(n, 16 * 40, 8192);
        std::thread::scope(|s| {
            for r in 0..n {
                let mut ctx = w.ctxs[r];
                ctx.timeout_ns = TIMEOUT_NS;
                s.spawn(move || {
                    let mut seed = 0u64;
                    for (ti, ty) in OpTy::ALL.into_iter().enumerate() {
                        for opc in 0..op::COUNT {
                            for path in 0..9usize {
                                seed += 1;
                                let count = [37usize, 5, 64, 131][(seed % 4) as usize];
                                let (pad, in_place) = [(0, false), (ty.size(), true), (0, true), (ty.size(), false)][(seed / 4 % 4) as usize];
                                let root = (seed as usize) % n;
                                let es = ty.size();
                                // (input elements, expected output, recv offset when in place)
                                let (input, want, off): (Vec<u8>, Vec<u8>, usize) = match path {
                                    0..4 => (
                                        ty.bytes((0..count).map(|i| ty.value(seed, r, i))),
                                        ty.bytes((0..count).map(|i| ty.reduce(opc, seed, n, i))),
                                        0,
                                    ),
                                    4 | 5 => (
                                        ty.bytes((0..n * count).map(|i| ty.value(seed, r, i))),
                                        ty.bytes((0..count).map(|i| ty.reduce(opc, seed, n, r * count + i))),
                                        r * count * es,
                                    ),
                                    _ => {
                                        let input = ty.bytes((0..count).map(|i| ty.value(seed, r, i)));
                                        let want = if r == root {
                                            ty.bytes((0..count).map(|i| ty.reduce(opc, seed, n, i)))
                                        } else if in_place {
                                            input.clone()
                                        } else {
                                            vec![UNTOUCHED; count * es]
                                        };
                                        (input, want, 0)
                                    }
                                };
                                let send = Mem::new(pad + input.len().max(off + want.len()));
                                let recv = Mem::new(pad + want.len());
                                // SAFETY: fresh memory of these sizes.
                                let (sp, rp) = unsafe {
                                    std::ptr::copy_nonoverlapping(input.as_ptr(), send.p.add(pad), input.len());
                                    std::ptr::write_bytes(recv.p.add(pad), UNTOUCHED, want.len());
                                    let sp = send.p.add(pad);
                                    (sp as u64, if in_place { sp.add(off) } else { recv.p.add(pad) } as u64)
                                };
                                let (blocks, threads) = grid(seed, n);
                                let (f, tag) = if path == 8 {
                                    // The pipelined reduce: pieces of 16 or 32 bytes.
                                    let slot = reduce_scatter::rank_slot(16 * 40, n as u64);
                                    let (piece, depth) = pipe_shape((count * es) as u64, slot, blocks, 2, 16 * (1 + seed % 2));
                                    let tag = desc::rooted_tag(desc::REDUCE, ti as u64 + 1, opc as u64 + 1, desc::PIPELINED, root as u64);
                                    (k::reduce_pipe as Kernel5, desc::with_pipe(tag, piece, depth))
                                } else {
                                    reducing_kernel(ti, path, opc, root)
                                };
                                launch(Dim3::x(blocks), Dim3::x(threads), || {
                                    // SAFETY: the world's context; buffers as the kernels need.
                                    unsafe {
                                        let (sp, rp) = (sp as *const u8, rp as *mut u8);
                                        f(&ctx, sp, rp, count as u64, tag)
                                    }
                                })
                                .unwrap_or_else(|e| panic!("rank {r} of {n}: {ty:?} op {opc} path {path}: {e}"));
                                // SAFETY: rp holds want.len() bytes; the kernel is done.
                                let got = unsafe { std::slice::from_raw_parts(rp as *const u8, want.len()) };
                                if got != want.as_slice() {
                                    let first = got.iter().zip(&want).position(|(g, w)| g != w).unwrap();
                                    panic!(
                                        "rank {r} of {n}: {ty:?} op {opc} path {path} count {count} pad {pad} \
                                         in_place {in_place}: first wrong byte at {first}"
                                    );
                                }
                            }
                        }
                    }
                });
            }
        });
    }
}

/// The piece and depth of a pipelined call of `bytes` over `blocks` blocks and slots of
/// `slot` bytes: [`pipe::pipe_piece`] with `min_piece`, the depth lowered until a sub-slot
/// holds 16 bytes.
fn pipe_shape(bytes: u64, slot: u64, blocks: u32, depth: u32, min_piece: u64) -> (u64, u32) {
    let mut d = depth;
    loop {
        let p = pipe::pipe_piece(bytes, slot, blocks, d, min_piece);
        if p > 0 || d == 1 {
            assert!(
                pipe::pipe_fits(slot, blocks, d, p),
                "{bytes} {slot} {blocks} {d}"
            );
            return (p, d);
        }
        d -= 1;
    }
}

#[test]
fn pipe_pieces_fit_their_chunks() {
    // 128 MiB slots, 128 blocks: 1 MiB chunks; 32 MB over 128 blocks: 8 pieces of 32 KiB.
    assert_eq!(
        pipe::pipe_piece(32 << 20, 128 << 20, 128, 2, 16 << 10),
        32 << 10
    );
    // Capped by the sub-slot (1 MiB / 2).
    assert_eq!(
        pipe::pipe_piece(1 << 30, 128 << 20, 128, 2, 16 << 10),
        512 << 10
    );
    // At least the minimum, in multiples of 16.
    assert_eq!(pipe::pipe_piece(100, 128 << 20, 4, 2, 0), 16);
    assert_eq!(pipe::pipe_piece(100, 128 << 20, 4, 2, 1000), 1008);
    // No room for 16 bytes per sub-slot.
    assert_eq!(pipe::pipe_piece(1 << 20, 100, 4, 2, 16), 0);
    assert!(!pipe::pipe_fits(640, 4, 2, 96));
    assert!(pipe::pipe_fits(640, 4, 2, 80));
    let tag = desc::with_pipe(desc::rooted_tag(desc::REDUCE, 3, 5, 3, 7), 80, 3);
    assert_eq!(
        (desc::piece(tag), desc::depth(tag), desc::root(tag)),
        (80, 3, 7)
    );
    assert_eq!(desc::type_op(tag), op::AVG | 3 << 8);
}

#[test]
fn pipelined_broadcast_and_reduce_match_the_reference_between_other_calls() {
    for n in [1usize, 2, 3, 4] {
        // A small scratch: 640 bytes, so every block's chunk holds a few pieces of 16 to 80
        // bytes and the larger calls reuse each sub-slot many times.
        let scratch = 16 * 40;
        let w = World::new(n, scratch, 8192);
        let mut cases = Vec::new();
        let mut seed = 50_000 + n as u64 * 1000;
        for count in [1usize, 5, 64, 100, 257, 1000] {
            for coll in [
                Coll::Broadcast,
                Coll::Reduce(Ty::F32),
                Coll::Reduce(Ty::F16),
                Coll::Reduce(Ty::Bf16),
            ] {
                let (size, slot) = match coll {
                    Coll::Reduce(t) => (t.size(), reduce_scatter::rank_slot(scratch, n as u64)),
                    _ => (1, scratch / 16 * 16),
                };
                for root in 0..n {
                    for (pad, in_place) in [(0, false), (0, true), (size, false), (size, true)] {
                        seed += 1;
                        let (blocks, threads) = grid(seed, n);
                        let bytes = (count * size) as u64;
                        let depth = 1 + (seed % 4) as u32;
                        let min_piece = [16, 32, 48, 4096][(seed / 4 % 4) as usize];
                        let case = Case {
                            coll,
                            ll: false,
                            count,
                            root,
                            pad,
                            in_place,
                            seed,
                            blocks,
                            threads,
                            // Now and then the receivers start late: the senders run ahead
                            // until their sub-slots are full.
                            lag_us: if seed.is_multiple_of(7) { 500 } else { 0 },
                            pipe: Some(pipe_shape(bytes, slot, blocks, depth, min_piece)),
                        };
                        cases.push(case);
                        // Between them, other kernels on the same semaphores and scratch.
                        let other = match seed % 6 {
                            0 => Some((Coll::AllToAll, false)),
                            2 => Some((Coll::Broadcast, false)),
                            3 => Some((Coll::Reduce(Ty::F32), true)),
                            5 => Some((Coll::ReduceScatter(Ty::F16), false)),
                            _ => None,
                        };
                        if let Some((coll, ll)) = other {
                            cases.push(Case {
                                coll,
                                ll,
                                count: 37,
                                seed: seed << 8,
                                pipe: None,
                                lag_us: 0,
                                ..case
                            });
                        }
                    }
                }
            }
        }
        run_sequence(&w, n, &cases);
    }
}

#[test]
fn mismatched_sizes_are_recorded_and_every_matching_transfer_around_them_arrives() {
    // Three ranks, 30 launches; in each, every rank sends two messages to and receives two
    // from every peer (two lanes per peer, several transfers per lane). Sizes span both
    // paths (LL up to 256 bytes; pieces of 8192 / 64 / 2 = 64 bytes, at most 4 blocks); about
    // one transfer in four is received with another size, on either or across the paths.
    // Every launch must end without a timeout, every matching transfer must arrive intact,
    // and a rank that receives a wrong size (or sends a pipelined one) records a mismatch.
    use send_recv::{P2pOp, P2pOps};
    const SIZES: [usize; 7] = [1, 17, 100, 256, 257, 1000, 5000];
    let (n, slot, launches) = (3usize, 8192u64, 30usize);
    let shape = P2pShape {
        depth: 2,
        ll_max: 256,
        ll_blocks: 2,
        ll_row: 0,
    };
    let h = |from: usize, to: usize, x: u64| splitmix((from as u64) << 40 ^ (to as u64) << 32 ^ x);
    let sent = |from, to, x| SIZES[(h(from, to, x) % 7) as usize];
    let wanted = |from, to, x| {
        let v = h(from, to, x);
        if (v >> 20) % 4 == 0 {
            SIZES[((v % 7) + 1 + (v >> 30) % 6) as usize % 7]
        } else {
            SIZES[(v % 7) as usize]
        }
    };
    let packets = 4 * shape.ll_max + send_recv::P2P_TAIL_BYTES;
    let w = World::new(n, (n as u64 * slot).div_ceil(2), packets);
    std::thread::scope(|s| {
        for r in 0..n {
            let mut ctx = w.ctxs[r];
            ctx.timeout_ns = TIMEOUT_NS;
            ctx.scratch_len = slot;
            s.spawn(move || {
                let mut count = vec![[0u64; 2]; n]; // [sent to p, received from p]
                let mut mismatched = 0;
                for g in 0..launches {
                    let mut ops = P2pOps {
                        depth: shape.depth,
                        ll_max: shape.ll_max,
                        ll_blocks: shape.ll_blocks,
                        ..P2pOps::default()
                    };
                    let mut mems = Vec::new();
                    let mut expect_record = false;
                    for p in (0..n).filter(|&p| p != r) {
                        for send in [false, true] {
                            for _ in 0..2 {
                                let x = count[p][(!send) as usize];
                                count[p][(!send) as usize] += 1;
                                let (from, to) = if send { (r, p) } else { (p, r) };
                                let (mine, theirs) = if send {
                                    (sent(from, to, x), wanted(from, to, x))
                                } else {
                                    (wanted(from, to, x), sent(from, to, x))
                                };
                                let pipelined_send = send && mine as u64 > shape.ll_max;
                                if mine != theirs && (!send || pipelined_send) {
                                    expect_record = true;
                                }
                                mismatched += (mine != theirs) as usize;
                                let seed = (from as u64) << 32 | (to as u64) << 24 | x;
                                let m = Mem::new(mine);
                                if send {
                                    for j in 0..mine {
                                        // SAFETY: j < mine.
                                        unsafe { m.p.add(j).write(byte(seed, 0, j)) };
                                    }
                                }
                                ops.ops[ops.count as usize] = P2pOp {
                                    buf: m.p as u64,
                                    bytes: mine as u64,
                                    peer: p as u32,
                                    send: send as u32,
                                    ..P2pOp::default()
                                };
                                ops.count += 1;
                                mems.push((m, seed, send, mine, mine == theirs));
                            }
                        }
                    }
                    let piece = send_recv::p2p_piece(slot, shape.depth);
                    let blocks = ops.plan(piece, 4);
                    launch(Dim3::x(blocks), Dim3::x(3), || {
                        // SAFETY: the p2p context; every op's buffer holds its bytes.
                        unsafe { k::p2p(&ctx, ops) }
                    })
                    .unwrap();
                    // SAFETY: the fault area, FAULT_WORDS words; no kernel runs.
                    let f = unsafe { core::slice::from_raw_parts_mut(ctx.fault, FAULT_WORDS) };
                    let kind = f[fault::RECORD];
                    assert!(
                        kind == 0 || kind == fault::MISMATCH,
                        "rank {r} launch {g}: record {f:?}"
                    );
                    if expect_record {
                        assert_eq!(kind, fault::MISMATCH, "rank {r} launch {g}");
                    }
                    f[fault::RECORD] = 0;
                    f[fault::CLAIM] = 0;
                    for (i, (m, seed, send, bytes, matched)) in mems.iter().enumerate() {
                        if !send && *matched {
                            // SAFETY: the kernel is done; m holds bytes.
                            let got = unsafe { std::slice::from_raw_parts(m.p, *bytes) };
                            let bad = (0..*bytes).find(|&j| got[j] != byte(*seed, 0, j));
                            assert_eq!(bad, None, "rank {r} launch {g} op {i} of {bytes}");
                        }
                    }
                }
                assert!(
                    mismatched > 20,
                    "rank {r}: only {mismatched} mismatched transfers"
                );
            });
        }
    });
}
