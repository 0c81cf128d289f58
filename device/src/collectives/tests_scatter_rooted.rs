//! Reduce-scatter, reduce, broadcast and all-to-all on CPU threads: `n` ranks as threads,
//! each running a whole sequence of calls without joining in between (so a rank may run
//! ahead of its peers by several calls, as on GPUs), every result checked bit for bit
//! against a CPU reference that sums in rank order with the type's rounding.

use super::tests::{Mem, World};
use super::*;
use crate::arch::{Dim3, launch};
use crate::kernels::collectives as k1;
use crate::kernels::scatter_rooted as k;
use half::{bf16, f16};
use std::vec;
use std::vec::Vec;

/// A wait that never ends fails a test in this long rather than the world's minute (long
/// enough for a 2-core machine running several suites at once).
pub(super) const TIMEOUT_NS: u64 = 30_000_000_000;

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

pub(super) fn splitmix(mut z: u64) -> u64 {
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

pub(super) fn byte(seed: u64, rank: usize, i: usize) -> u8 {
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
    fn kernel(&self) -> (k::ScatterRootedKernel, u64, u64) {
        use Coll::*;
        let c = self.count as u64;
        let (algo, root) = (if self.ll { 1 } else { 2 }, self.root as u64);
        let dt = |ty: Ty| match ty {
            Ty::F32 => 1,
            Ty::F16 => 2,
            Ty::Bf16 => 3,
        };
        let (f, tag): (k::ScatterRootedKernel, u64) = match (self.coll, self.ll) {
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
            let (f, tag): (k::ScatterRootedKernel, u64) = match self.coll {
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
