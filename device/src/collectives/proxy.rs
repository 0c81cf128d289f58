//! The collectives over proxy channels ([`DevConn`]): GPU threads stage data in the scratch
//! and queue puts; the proxy moves it with the copy engine (P2P), RDMA (IB) or memcpy (Host)
//! into the peers' scratch; the flag lands after the data. For peers whose memory this GPU
//! cannot map (no peer access, another machine), where memory channels do not work. Design:
//! docs/guide/06-design.md §8, "Proxy-channel collectives".
//!
//! # Grid and lanes
//!
//! A call runs on `lanes` lanes (at most the lanes the host built, `1..=`[`MAX_PROXY_LANES`])
//! of `workers` blocks each ([`proxy_workers`]: 1 to [`MAX_PROXY_WORKERS`]), `nb = lanes *
//! workers` blocks of at least `nranks` threads; both numbers are chosen by the host from
//! the size and recorded in the call's tag, so ranks that disagree fail with a mismatch.
//! Block `b` is worker `b % workers` of lane `b / workers`. Lane `l` owns the bytes
//! [`block_share`] gives it and drives its own proxy channel to every peer,
//! `conns[l * nranks + p]`: a channel's inbound counter counts every signal on it, so lanes
//! sharing one could not tell whose chunk had arrived. Every chunk of a lane is cut again
//! among its workers ([`block_share`] of the chunk): each stages and reduces its part, so a
//! lane moves large chunks (few triggers for the proxy) with the memory bandwidth of several
//! blocks. Thread `p < nranks` of worker 0 talks to rank `p`; the other workers meet it
//! through two words of the rank's state ([`PROXY_SYNC_WORDS`](super::PROXY_SYNC_WORDS)):
//! each worker publishes how many chunks it has staged (worker 0 puts a chunk once every
//! worker has staged its part), and worker 0 publishes how many chunks of every peer have
//! arrived (the workers reduce their part once it has). The words carry the call's sequence
//! number above the count, so no reset is needed between calls.
//!
//! # Scratch layout
//!
//! The shared region (`scratch_len` bytes) is cut into `nb` equal block areas; block `b`'s
//! area ([`ProxyLayout::area`] bytes from `b * area`) holds `K = depth` slots of
//! [`ProxyLayout::slot`] bytes for staging, then `K` receive slots for each other rank:
//!
//! ```text
//! | staging 0..K | from peer #0: 0..K | from peer #1: 0..K | ... (nranks - 1 peers)
//! ```
//!
//! where peer `#i` is the `i`-th other rank in rank order. `K` is 8 when the slots are still
//! at least 64 KiB, else 4 ([`proxy_layout`]). A call's data moves in *chunks* of at most
//! one slot (the host picks the chunk size, also in the tag: [`desc::piece`]); chunk `i` of a
//! block goes through staging slot `i % K` and receive slot `i % K`.
//!
//! # Pipeline and flow control
//!
//! With `L = K / 2 - 1`, iteration `i` of a block:
//!
//! 1. (`i < rounds`) the block copies chunk `i` of its input into staging slot `i % K`;
//!    barrier; thread `p` queues one put-with-signal of it into rank `p`'s receive slot
//!    `i % K` for this rank ([`DevConn::try_put_with_signal_queued`]: no wait for the
//!    proxy);
//! 2. (`i >= L`) thread `p` waits for rank `p`'s signal of chunk `j = i - L`; the block
//!    agrees; it reduces chunk `j` of every rank in rank order into `recv` (all-gather:
//!    copies each peer's chunk `j` to its place in `recv`).
//!
//! So the block stages and reduces while the proxy's engine moves up to `L + 1` chunks per
//! peer. No acknowledgement is sent: *a peer's signal of chunk `m` is the credit*. A rank
//! queues chunk `m` only after it has consumed chunk `m - 1 - L` of every peer (step 2 of
//! the iteration before); so when this rank queues chunk `i` it has consumed chunk `i - 1 -
//! L` of rank `p`, hence received rank `p`'s chunk `i - K + L + 1 <= i - 1 - L` (as `K >=
//! 2L + 2`), which rank `p` queued only after it had read this rank's chunk `i - K` out of
//! receive slot `i % K`. That slot is free, and since the chunk had landed there the engine
//! had read staging slot `i % K` too: the staging slot is free as well, without a flush.
//! A call starts after every peer's call descriptor has arrived ([`CollContext::begin`]),
//! so the peers have finished the previous call: every slot is free at a call's start.
//!
//! At the end of a call thread `p` flushes its lane ([`DevConn::try_flush`]) so that a put
//! the proxy refused is reported; a queue that stays full or a refused put fails the call
//! (recorded as [`fault::AT_PROXY_FLUSH`] / [`fault::AT_PROXY_QUEUE`]), never traps.

use super::all_reduce::reduce_sources;
use super::{
    Call, CollContext, MAX_BLOCKS, MAX_RANKS, PROXY_SYNC_BASE, Reduce, block_share, desc, fault,
};
use crate::arch;
use crate::channel::memory::copy;
use crate::channel::{ChannelError, DevConn};

/// Most lanes (proxy channels to each peer, one per block of a proxy kernel) a host may
/// build, and so most blocks of a proxy kernel; block `b` uses `conns[b * nranks + p]`. The
/// host builds 8 unless told otherwise (`MSCCLPP_PROXY_LANES`) and never launches more
/// blocks than it built lanes.
pub const MAX_PROXY_LANES: usize = 32;

/// Most blocks per lane ([`proxy_workers`]): the tag's depth field holds `workers - 1`.
pub const MAX_PROXY_WORKERS: u32 = 16;

/// The blocks per lane of a proxy call's tag: its [`desc::depth`] field plus one (the host
/// writes `workers - 1` there with [`desc::with_pipe`]).
#[inline(always)]
pub const fn proxy_workers(tag: u64) -> u32 {
    desc::depth(tag) + 1
}

/// Where a lane's slots are in the shared scratch region (see the [module](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyLayout {
    /// Staging slots per lane, and receive slots per lane and peer (`K`: 4 or 8).
    pub depth: u64,
    /// Bytes of each slot (a multiple of 16; 0 when the scratch is too small).
    pub slot: u64,
    /// Bytes of each lane's area: `nranks * depth * slot`.
    pub area: u64,
}

/// The layout of a scratch region of `scratch_len` bytes for `nranks` ranks and `lanes`
/// lanes: `depth` 8 while the slots are at least 64 KiB, else 4.
#[inline(always)]
pub fn proxy_layout(scratch_len: u64, nranks: u64, lanes: u64) -> ProxyLayout {
    let per_lane = scratch_len / lanes.max(1);
    let n = nranks.max(1);
    let depth = if per_lane / (n * 8) >= 64 << 10 { 8 } else { 4 };
    let slot = per_lane / (n * depth) / 16 * 16;
    ProxyLayout {
        depth,
        slot,
        area: n * depth * slot,
    }
}

/// Traps unless the grid is a whole number of lanes of `workers` blocks, at most
/// [`MAX_PROXY_LANES`] lanes and [`MAX_BLOCKS`] blocks, of at least `nranks` threads, the
/// proxy channels exist (or there are no peers) and every slot holds at least 16 bytes.
#[inline(always)]
fn check(ctx: &CollContext, layout: &ProxyLayout, workers: u32) {
    let nb = arch::grid_dim_x();
    if !nb.is_multiple_of(workers)
        || (nb / workers) as usize > MAX_PROXY_LANES
        || nb as usize > MAX_BLOCKS
        || arch::block_dim_x() < ctx.nranks
        || (ctx.nranks > 1 && (ctx.conns.is_null() || layout.slot == 0))
    {
        arch::trap();
    }
}

/// `count` tagged with the call: `seq + 1` in the high half (never 0, so the zeroed state
/// matches no call), so a word left by an earlier call never reads as this one's.
#[inline(always)]
fn sync_mark(call: &Call, count: u64) -> u64 {
    ((call.seq + 1) & 0xffff_ffff) << 32 | (count & 0xffff_ffff)
}

/// Whether the sync word `v` says at least `want` ([`sync_mark`]) for the same call.
#[inline(always)]
fn sync_reached(v: u64, want: u64) -> bool {
    v >> 32 == want >> 32 && (v & 0xffff_ffff) >= (want & 0xffff_ffff)
}

/// Polls the sync word `p` until it reaches `want` ([`sync_reached`]), looking at the abort
/// word, the call's stop word and the clock ([`CollContext::keep_waiting`]) every few
/// thousand polls. `false` when the call failed meanwhile.
///
/// # Safety
/// `p` a live word of the context's state; the context valid.
#[inline(always)]
unsafe fn sync_wait(ctx: &CollContext, call: Call, p: *const u64, want: u64) -> bool {
    let mut polls = 0u32;
    let mut start = None;
    loop {
        // SAFETY: caller contract (a live aligned word, accessed atomically).
        if sync_reached(unsafe { arch::ld_acquire_sys_u64(p) }, want) {
            return true;
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(4096) {
            let t0 = start.get_or_insert_with(arch::global_timer_ns);
            // SAFETY: the context valid (caller contract).
            *t0 = unsafe { ctx.keep_waiting(call, ctx.rank, fault::AT_PROXY, *t0) };
            if *t0 == 0 {
                return false;
            }
        }
        // Nothing on a GPU; CPU threads (Host backend) yield.
        arch::spin_backoff(polls);
    }
}

/// How long one `DevConn::wait_timeout` of a chunk wait lasts before the fault area is looked
/// at again.
const WAIT_SLICE_NS: u64 = 200_000;

/// One block's part of a call: its lane's bytes, chunks and slots, and its part of each chunk.
struct Plan {
    layout: ProxyLayout,
    /// This block's lane's area in the scratch (byte offset).
    base: u64,
    /// This block's share of the message: `[start, end)`.
    start: u64,
    end: u64,
    /// Bytes per chunk (a multiple of 16, at most a slot).
    chunk: u64,
    rounds: u64,
    /// `L`: how many iterations a chunk's consumption trails its put.
    lag: u64,
    lane: u32,
    /// This block's index in its lane, and the lane's blocks.
    worker: u32,
    workers: u32,
}

impl Plan {
    /// The plan of block `block` of a grid of `lanes * workers` blocks.
    #[inline(always)]
    fn new(
        layout: ProxyLayout,
        tag: u64,
        bytes: u64,
        block: u32,
        lanes: u32,
        workers: u32,
    ) -> Plan {
        let lane = block / workers;
        let (start, end) = block_share(bytes, 16, lane as u64, lanes as u64);
        let asked = desc::piece(tag);
        let chunk = if asked == 0 {
            layout.slot
        } else {
            asked.min(layout.slot)
        };
        let rounds = if chunk == 0 {
            0
        } else {
            (end - start).div_ceil(chunk)
        };
        Plan {
            layout,
            base: lane as u64 * layout.area,
            start,
            end,
            chunk,
            rounds,
            lag: layout.depth / 2 - 1,
            lane,
            worker: block % workers,
            workers,
        }
    }

    /// This block's part of a chunk of `len` bytes: `[from, to)` within the chunk.
    #[inline(always)]
    fn part(&self, len: u64) -> (u64, u64) {
        block_share(len, 16, self.worker as u64, self.workers as u64)
    }

    /// The "staged" sync word of block `worker` of this lane.
    #[inline(always)]
    fn staged_word(&self, ctx: &CollContext, worker: u32) -> *mut u64 {
        let block = (self.lane * self.workers + worker) as usize;
        ctx.state.wrapping_add(PROXY_SYNC_BASE + block)
    }

    /// The lane's "arrived" sync word.
    #[inline(always)]
    fn arrived_word(&self, ctx: &CollContext) -> *mut u64 {
        ctx.state
            .wrapping_add(PROXY_SYNC_BASE + MAX_BLOCKS + self.lane as usize)
    }

    /// Offset (in the message) and length of chunk `i`.
    #[inline(always)]
    fn span(&self, i: u64) -> (u64, u64) {
        let off = self.start + i * self.chunk;
        (off, self.chunk.min(self.end - off))
    }

    /// Scratch offset of staging slot `s`.
    #[inline(always)]
    fn staging(&self, s: u64) -> u64 {
        self.base + s * self.layout.slot
    }

    /// Scratch offset of receive slot `s` for the data of rank `from`, in the scratch of
    /// rank `at` (`from != at`).
    #[inline(always)]
    fn receive(&self, at: u32, from: u32, s: u64) -> u64 {
        let peer_index = (from - (from > at) as u32) as u64;
        self.base + ((1 + peer_index) * self.layout.depth + s) * self.layout.slot
    }

    /// This block's lane to rank `p`.
    ///
    /// # Safety
    /// `p < nranks`; the context's `conns` holds `grid_dim_x() * nranks` handles.
    #[inline(always)]
    unsafe fn conn<'c>(&self, ctx: &'c CollContext, p: u32) -> &'c DevConn<'static> {
        // SAFETY: caller contract.
        unsafe { &*ctx.conns.add((self.lane * ctx.nranks + p) as usize) }
    }

    /// Step 1's second half (every thread of the block, after staging its part of chunk `i`
    /// of `len` bytes): barrier; with several workers, the other workers publish that they
    /// staged chunk `i` and worker 0 waits until all have (the block agrees); then thread `p`
    /// of worker 0 queues the put with signal of the whole chunk to rank `p`. A queue that
    /// stays full fails the call on this thread (the next [`Plan::wait`] agrees on it).
    ///
    /// # Safety
    /// As for [`Plan::conn`], every thread of the block; the block's part of chunk `i`
    /// staged.
    #[inline(always)]
    unsafe fn put(&self, ctx: &CollContext, call: &mut Call, i: u64, len: u64, t: u32) {
        arch::sync_threads();
        if self.workers > 1 {
            if self.worker != 0 {
                if t == 0 && !call.failed {
                    // SAFETY: this block's own sync word in the state. Release (system scope:
                    // the copy engine reads the staged bytes once worker 0 has queued the
                    // put): the block's staging writes, ordered before by the barrier.
                    unsafe {
                        arch::st_release_sys_u64(
                            self.staged_word(ctx, self.worker),
                            sync_mark(call, i + 1),
                        )
                    };
                }
                return;
            }
            if t == 0 && !call.failed {
                let want = sync_mark(call, i + 1);
                for w in 1..self.workers {
                    // SAFETY: the lane's sync words in the state; the context valid.
                    if !unsafe { sync_wait(ctx, *call, self.staged_word(ctx, w), want) } {
                        call.failed = true;
                        break;
                    }
                }
            }
            if !ctx.block_agree(call, t) {
                return;
            }
        } else if self.worker != 0 {
            return;
        }
        if t < ctx.nranks && t != ctx.rank && !call.failed {
            let s = i % self.layout.depth;
            // SAFETY: t is a peer (caller contract).
            let c = unsafe { self.conn(ctx, t) };
            let dst = self.receive(t, ctx.rank, s);
            if c.try_put_with_signal_queued(dst, self.staging(s), len)
                .is_err()
            {
                // SAFETY: the context valid.
                unsafe { ctx.fail(*call, fault::TIMEOUT, t, [0; 2], fault::AT_PROXY_QUEUE) };
                call.failed = true;
            }
        }
    }

    /// Step 2's wait for chunk `j` (every thread of the block): thread `p` of worker 0 waits
    /// for rank `p`'s next signal on this lane, in slices between which the abort word, the
    /// call's stop word and the clock are looked at ([`CollContext::keep_waiting`]); the block
    /// agrees, and with several workers publishes that chunk `j` arrived, which thread 0 of
    /// every other worker waits for. `false` on every thread when a wait of the block gave up
    /// or the call failed.
    ///
    /// # Safety
    /// As for [`Plan::put`].
    #[inline(always)]
    unsafe fn wait(&self, ctx: &CollContext, call: &mut Call, j: u64, t: u32) -> bool {
        if self.worker != 0 {
            // The other workers learn it from worker 0.
            if t == 0 && !call.failed {
                // SAFETY: the lane's sync word in the state; the context valid.
                call.failed = !unsafe {
                    sync_wait(ctx, *call, self.arrived_word(ctx), sync_mark(call, j + 1))
                };
            }
            arch::sync_threads();
            return ctx.block_agree(call, t);
        }
        if t < ctx.nranks && t != ctx.rank && !call.failed {
            // SAFETY: t is a peer (caller contract); one waiter per lane (this thread).
            let c = unsafe { self.conn(ctx, t) };
            let mut start = None;
            while !c.wait_timeout(WAIT_SLICE_NS) {
                let t0 = start.get_or_insert_with(arch::global_timer_ns);
                // SAFETY: the context valid.
                *t0 = unsafe { ctx.keep_waiting(*call, t, fault::AT_PROXY, *t0) };
                if *t0 == 0 {
                    call.failed = true;
                    break;
                }
            }
        }
        arch::sync_threads();
        let ok = ctx.block_agree(call, t);
        if ok && self.workers > 1 && t == 0 {
            // SAFETY: the lane's sync word in the state. Release (system scope, as the waits'
            // acquire of the peers' flags): the peers' chunk `j` is in this rank's memory.
            unsafe { arch::st_release_sys_u64(self.arrived_word(ctx), sync_mark(call, j + 1)) };
        }
        ok
    }

    /// The end of a call on a block that moved data: thread `p` flushes its lane, so that a
    /// put the proxy refused (or a proxy that stopped serving) fails the call instead of
    /// leaving wrong data unreported.
    ///
    /// # Safety
    /// As for [`Plan::put`].
    #[inline(always)]
    unsafe fn flush(&self, ctx: &CollContext, call: &mut Call, t: u32) {
        if self.rounds == 0 || call.failed || self.worker != 0 || t >= ctx.nranks || t == ctx.rank {
            return;
        }
        // SAFETY: t is a peer (caller contract).
        let c = unsafe { self.conn(ctx, t) };
        let (kind, place) = match c.try_flush() {
            Ok(()) => return,
            Err(ChannelError::Timeout) => (fault::TIMEOUT, fault::AT_PROXY_QUEUE),
            Err(_) => (fault::ABORTED, fault::AT_PROXY_FLUSH),
        };
        // SAFETY: the context valid.
        unsafe { ctx.fail(*call, kind, t, [0; 2], place) };
        call.failed = true;
    }
}

/// All-reduce (`op`) of `count` elements of `T` over proxy channels; in place allowed.
///
/// # Safety
/// At most as many blocks as the context has lanes (`conns` holds at least `grid_dim_x() *
/// nranks` proxy channels), of at least `nranks` threads, every thread with the same
/// arguments; the context valid;
/// `send`/`recv` valid for `count` elements aligned to `T::SIZE`; every rank calls it with
/// the same `count`, tag and grid.
#[inline(always)]
pub unsafe fn all_reduce<T: Reduce, const OUT: bool>(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    count: u64,
    tag: u64,
    op: u32,
) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let (n, r) = (ctx.nranks, ctx.rank);
    let workers = proxy_workers(tag);
    let lanes = nb / workers;
    let layout = proxy_layout(ctx.scratch_len, n as u64, lanes as u64);
    check(ctx, &layout, workers);
    let plan = Plan::new(layout, tag, count * T::SIZE, b, lanes, workers);
    // SAFETY: at most MAX_BLOCKS blocks (check); finish() below on
    // every thread.
    let mut call = unsafe { ctx.call(b, count, tag) };
    // SAFETY: every thread of the block; block-uniform (see `CollContext::begin`).
    let go = unsafe { ctx.begin(&mut call, b, t) };
    let iterations = if go { plan.rounds + plan.lag } else { 0 };
    for i in 0..iterations {
        if i < plan.rounds {
            let (off, len) = plan.span(i);
            let (from, to) = plan.part(len);
            let s = i % layout.depth;
            // SAFETY: the staging slot holds slot >= len bytes, free (module: flow
            // control); send holds off + len; every thread of the block.
            unsafe {
                copy(
                    ctx.scratch.add((plan.staging(s) + from) as usize),
                    send.add((off + from) as usize),
                    to - from,
                    t,
                    nt,
                );
                plan.put(ctx, &mut call, i, len, t);
            }
        }
        if i < plan.lag {
            continue;
        }
        let j = i - plan.lag;
        // SAFETY: every thread of the block.
        if !unsafe { plan.wait(ctx, &mut call, j, t) } {
            break;
        }
        let (off, len) = plan.span(j);
        let (from, to) = plan.part(len);
        let (off, len) = (off + from, to - from);
        let s = j % layout.depth;
        let mut srcs = [core::ptr::null::<u8>(); MAX_RANKS];
        for (q, src) in srcs.iter_mut().enumerate().take(n as usize) {
            *src = if q as u32 == r {
                send.wrapping_add(off as usize)
            } else {
                ctx.scratch
                    .wrapping_add((plan.receive(r, q as u32, s) + from) as usize)
            };
        }
        // SAFETY: every source holds len bytes (receive slots published by the waits and
        // the barrier); recv holds off + len; no second output.
        unsafe {
            let (out, len) = (recv.add(off as usize), len / T::SIZE);
            if OUT {
                T::reduce_out(&srcs[..n as usize], out, core::ptr::null_mut(), len, t, op);
            } else {
                reduce_sources::<T>(&srcs[..n as usize], out, core::ptr::null_mut(), len, t, op);
            }
        }
    }
    // SAFETY: every thread of the block.
    unsafe {
        if go {
            plan.flush(ctx, &mut call, t);
        }
        ctx.finish(&call)
    };
}

/// All-gather of `bytes` per rank over proxy channels (rank `q`'s `send` lands at
/// `recv + q * bytes`); in place allowed.
///
/// # Safety
/// As for [`all_reduce`], with `recv` valid for `nranks * bytes`.
#[inline(always)]
pub unsafe fn all_gather(ctx: &CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let (n, r) = (ctx.nranks, ctx.rank);
    let workers = proxy_workers(tag);
    let lanes = nb / workers;
    let layout = proxy_layout(ctx.scratch_len, n as u64, lanes as u64);
    check(ctx, &layout, workers);
    let plan = Plan::new(layout, tag, bytes, b, lanes, workers);
    // SAFETY: at most MAX_BLOCKS blocks (check); finish() below on
    // every thread.
    let mut call = unsafe { ctx.call(b, bytes, tag) };
    // SAFETY: every thread of the block; block-uniform (see `CollContext::begin`).
    let go = unsafe { ctx.begin(&mut call, b, t) };
    let iterations = if go { plan.rounds + plan.lag } else { 0 };
    for i in 0..iterations {
        if i < plan.rounds {
            let (off, len) = plan.span(i);
            let (from, to) = plan.part(len);
            let s = i % layout.depth;
            // SAFETY: as in all_reduce; the own part of recv holds off + len.
            unsafe {
                let src = send.add((off + from) as usize);
                let stage = ctx.scratch.add((plan.staging(s) + from) as usize);
                copy(stage, src, to - from, t, nt);
                let own = recv.add((r as u64 * bytes + off + from) as usize);
                if !core::ptr::eq(own as *const u8, src) {
                    copy(own, src, to - from, t, nt);
                }
                plan.put(ctx, &mut call, i, len, t);
            }
        }
        if i < plan.lag {
            continue;
        }
        let j = i - plan.lag;
        // SAFETY: every thread of the block.
        if !unsafe { plan.wait(ctx, &mut call, j, t) } {
            break;
        }
        let (off, len) = plan.span(j);
        let (from, to) = plan.part(len);
        let s = j % layout.depth;
        for q in (0..n).filter(|&q| q != r) {
            // SAFETY: this block's part of receive slot s of rank q (published by the wait
            // and the barrier) into rank q's part of recv.
            unsafe {
                copy(
                    recv.add((q as u64 * bytes + off + from) as usize),
                    ctx.scratch.add((plan.receive(r, q, s) + from) as usize),
                    to - from,
                    t,
                    nt,
                );
            }
        }
    }
    // SAFETY: every thread of the block.
    unsafe {
        if go {
            plan.flush(ctx, &mut call, t);
        }
        ctx.finish(&call)
    };
}
