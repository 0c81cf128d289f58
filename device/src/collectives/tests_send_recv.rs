//! Sends and receives on CPU threads: groups of transfers between `n` ranks as threads, on
//! both paths (LL packets and pipelined pieces), every received byte checked against the
//! sender's, and mismatched sizes recorded on both sides.

use super::tests::{Mem, World};
use super::tests_scatter_rooted::{TIMEOUT_NS, byte, splitmix};
use super::*;
use crate::arch::{Dim3, launch};
use crate::kernels::send_recv as k;
use std::vec;
use std::vec::Vec;

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
                    // Matching transfers record nothing: a wait that gave up is named here,
                    // before the bytes it left unwritten.
                    // SAFETY: the fault area, FAULT_WORDS words; no kernel runs.
                    let f = unsafe { core::slice::from_raw_parts(ctx.fault, FAULT_WORDS) };
                    assert_eq!(f[fault::RECORD], 0, "rank {r} group {g}: record {f:?}");
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
                    send_recv::ll::block_units(k as u32, blocks, row, units, t, nt, |i| {
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
