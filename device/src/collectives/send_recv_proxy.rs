//! Sends and receives between ranks on different hosts, over proxy channels (TCP
//! or IB): the part of a send/recv group whose peers a [`send_recv`](super::send_recv)
//! context cannot reach (no memory mapping across hosts).
//!
//! The same function, [`run`], runs as the one-block [`remote_p2p`] kernel on the GPU backend and
//! in the calling CPU thread on the Host backend (a block of one thread), so the logic CI
//! tests over TCP loopback is the logic the GPU runs.
//!
//! # The context ([`ProxyContext`])
//!
//! Every rank registers one *remote_p2p buffer* and connects two proxy channels to every rank on
//! another host (its *remote ranks*, numbered `0..R` in rank order): the *out* channel carries
//! this rank's data to the peer and the peer's credits back, the *in* channel the peer's data
//! and this rank's credits (each side's inbound counter of a channel then counts one kind of
//! signal only). Per remote rank `j` the buffer holds a *region*: [`ProxyContext::depth`] send
//! slots, then as many receive slots, of `slot` bytes each (a [`XHDR`]-byte header, then
//! the payload). Per remote rank, [`COUNTERS`] words count the pieces sent, the credits
//! received, the pieces received and the transfers each way, across calls.
//!
//! # A transfer
//!
//! A send of `bytes` goes in pieces of at most `slot - XHDR` bytes. Piece `k` (counted per
//! peer and direction, across calls) goes through send slot `k % depth` into the peer's
//! receive slot `k % depth` of this rank's region there, with the signal
//! (`try_put_with_signal`, which returns once the proxy has taken the source); it may go
//! once the receiver has credited piece `k - depth`. The header holds `k`, the transfer's
//! byte count, the piece's offset and length. The receiver polls its in channel, checks
//! the header, copies the payload out and credits the slot (a signal with no data).
//!
//! Operations with the same peer and direction run in call order; the others progress side
//! by side: thread 0 visits them in turn and takes the first step that can go without
//! waiting (a send whose window is open, a receive whose next piece is there), so a rank
//! may send to and receive from the same peer in one group.
//!
//! # Failures
//!
//! A send and a receive of different sizes: the receiver learns the sender's size from the
//! first header, consumes every piece of the send (copying what fits) and records the
//! mismatch ([`fault::MISMATCH`] at [`fault::AT_REMOTE_P2P`], the two sizes as
//! [`p2p_desc`]s, the peer's rank), so the pair stays in step;
//! the sender does not learn of it. No step for the device timeout, or an abort: the call
//! fails ([`CollContext::keep_waiting`], at [`fault::AT_REMOTE_P2P`], naming the peer of the
//! first unfinished operation). A header of another piece number (the pair out of step
//! after an earlier failure) fails the call as a mismatch. A peer whose connection is gone
//! (it left, or its streams broke): a put to it is refused by the proxy, and once the
//! proxy finds its streams ended (`DevConn::refused`), the first unfinished operation with
//! it still waits 1 s (`GONE_GRACE_NS`) for what was on its way; either fails the call at
//! [`fault::AT_REMOTE_P2P_GONE`], naming the peer, instead of at the device timeout.

use super::cross::GONE_GRACE_NS;
use super::send_recv::{MAX_P2P_OPS, p2p_desc};
use super::{Call, CollContext, SLOW_POLLS, desc, fault};
use crate::arch;
use crate::channel::memory::copy;
use crate::channel::{ChannelError, DevConn};

/// Bytes of the header in front of every piece: piece number, the transfer's bytes, the
/// piece's offset and length (four `u64`).
pub const XHDR: u64 = 32;
/// Counter (per remote rank): pieces sent.
pub const SENT: usize = 0;
/// Counter: credits received (pieces the peer has copied out).
pub const CREDITS: usize = 1;
/// Counter: pieces received.
pub const RECEIVED: usize = 2;
/// Counter: transfers sent (for messages).
pub const XFERS_OUT: usize = 3;
/// Counter: transfers received.
pub const XFERS_IN: usize = 4;
/// Counters per remote rank.
pub const COUNTERS: usize = 5;
/// Index in the context's state words of the number of calls.
pub const CALLS: usize = 0;

/// One send or receive with a rank on another host (`#[repr(C)]`, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteOp {
    /// The data's address (read by a send, written by a receive).
    pub buf: u64,
    /// Bytes to move (at least 1).
    pub bytes: u64,
    /// The other rank.
    pub peer: u32,
    /// 1: send, 0: receive.
    pub send: u32,
    /// The peer's number among this rank's remote ranks (its region and channels here).
    pub index: u32,
    /// This rank's number among the peer's remote ranks (its region there).
    pub at_peer: u32,
}

/// The operations of one launch, passed by value (`#[repr(C)]`, 520 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteOps {
    /// Operations in use.
    pub count: u32,
    /// Unused (alignment).
    pub reserved: u32,
    /// The operations, in call order.
    pub ops: [RemoteOp; MAX_P2P_OPS],
}

const _: () = assert!(core::mem::size_of::<RemoteOps>() == 520);

/// What [`run`] needs (`#[repr(C)]`): see the [module](self).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProxyContext {
    /// `rank`/`nranks`: the job's; `timeout_ns` and `fault` as for the collectives;
    /// `state`: this context's own [`STATE_WORDS`](super::STATE_WORDS) words (the call
    /// counter at [`CALLS`], the local fault words); `scratch`: the remote_p2p buffer;
    /// `scratch_len`: the slot size (a multiple of 16, above [`XHDR`]); `conns`: two
    /// handles per remote rank `j`, the out channel at `2 * j`, the in channel at
    /// `2 * j + 1`; the rest unused.
    pub coll: CollContext,
    /// [`COUNTERS`] words per remote rank (zeroed at first).
    pub counters: *mut u64,
    /// Send (and receive) slots per remote rank.
    pub depth: u64,
}

// SAFETY: addresses and numbers only; the memory behind them is accessed under the
// protocol of this module (counters and state words by thread 0 of the one running call).
unsafe impl Send for ProxyContext {}
// SAFETY: as above.
unsafe impl Sync for ProxyContext {}

/// Byte offset in the remote_p2p buffer of send slot `k % depth` of remote rank `j`'s region.
#[inline(always)]
pub const fn send_slot(slot: u64, depth: u64, j: u64, k: u64) -> u64 {
    (2 * j * depth + k % depth) * slot
}

/// Byte offset in the remote_p2p buffer of receive slot `k % depth` of remote rank `j`'s region.
#[inline(always)]
pub const fn recv_slot(slot: u64, depth: u64, j: u64, k: u64) -> u64 {
    ((2 * j + 1) * depth + k % depth) * slot
}

/// Bytes of an remote_p2p buffer for `remotes` remote ranks.
#[inline(always)]
pub const fn buffer_bytes(slot: u64, depth: u64, remotes: u64) -> u64 {
    2 * remotes * depth * slot
}

/// How long the first unfinished operation waits without a step before its channel's
/// refused bit is looked at, and then the least time between two looks
/// ([`gone_past_grace`]).
const GONE_LOOK_NS: u64 = 50_000;

/// The step thread 0 picked (in the block's shared words).
const IDLE: u64 = 0;
const SEND: u64 = 1;
const RECV: u64 = 2;
const DONE: u64 = 3;

/// Runs the operations of `ops` to the end (see the [module](self)).
///
/// # Safety
/// Every thread of one block, with the same arguments; `x` a valid context (see the
/// [module](self) and [`ProxyContext`]) of this communicator; every operation's `buf` valid
/// for its `bytes` (written by a receive, read by a send), receive ranges disjoint from
/// each other and from the sends; `index`/`at_peer` right for the peer; at most
/// [`MAX_P2P_OPS`] operations.
pub unsafe fn run(x: &ProxyContext, ops: &RemoteOps) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let ctx = &x.coll;
    let n = (ops.count as usize).min(MAX_P2P_OPS);
    // The block's shared words: the step, then its copy (dst, src, bytes).
    let sh = crate::shared_array!(REMOTE_P2P_STEP: u64; 4);
    // SAFETY: this context's own state words (context contract); the last writer was the
    // previous call on this stream (a kernel boundary) or this thread.
    let seq = unsafe { core::ptr::read_volatile(ctx.state.add(CALLS)) };
    let mut p = Progress {
        call: Call {
            seq,
            desc: [n as u64, desc::tag(desc::SEND_RECV, 0, 0, 0)],
            failed: false,
            desc_pending: false,
        },
        done: [0; MAX_P2P_OPS],
        total: [u64::MAX; MAX_P2P_OPS],
        finished: 0,
        last_progress: arch::global_timer_ns(),
        idle: 0,
        gone: None,
        gone_look: 0,
    };
    let all = (1u32 << n) - 1;
    loop {
        let mut pending = None;
        if t == 0 {
            let step = if p.finished == all || p.call.failed {
                [DONE, 0, 0, 0]
            } else {
                // SAFETY: caller contract.
                let (step, next) = unsafe { choose(x, ops, n, &mut p) };
                pending = next;
                if step[0] == IDLE {
                    arch::spin_backoff(p.idle);
                    p.idle = p.idle.saturating_add(1);
                    if p.idle.is_multiple_of(SLOW_POLLS) {
                        let first = (0..n).find(|&i| p.finished & (1 << i) == 0).unwrap_or(0);
                        let op = &ops.ops[first];
                        // SAFETY: the context valid.
                        match unsafe {
                            ctx.keep_waiting(p.call, op.peer, fault::AT_REMOTE_P2P, p.last_progress)
                        } {
                            0 => p.call.failed = true,
                            t0 => p.last_progress = t0,
                        }
                        // Only a wait that is already late reads the refused bit (host
                        // memory on a GPU).
                        let now = arch::global_timer_ns();
                        let waited = now.wrapping_sub(p.last_progress & !super::LEFT_SEEN);
                        // SAFETY: caller contract; thread 0.
                        if !p.call.failed
                            && waited > GONE_LOOK_NS
                            && now.wrapping_sub(p.gone_look) > GONE_LOOK_NS
                            && unsafe { gone_past_grace(x, op, first, now, &mut p) }
                        {
                            // SAFETY: the context valid.
                            unsafe {
                                ctx.fail(
                                    p.call,
                                    fault::ABORTED,
                                    op.peer,
                                    [0; 2],
                                    fault::AT_REMOTE_P2P_GONE,
                                )
                            };
                            p.call.failed = true;
                        }
                    }
                }
                step
            };
            // SAFETY: the block's shared words, written by thread 0 before the barrier.
            unsafe {
                for (w, v) in step.iter().enumerate() {
                    sh.add(w).write_volatile(*v);
                }
            }
        }
        arch::sync_threads();
        // SAFETY: written by thread 0 before the barrier.
        let step: [u64; 4] = core::array::from_fn(|w| unsafe { sh.add(w).read_volatile() });
        if step[0] == DONE {
            break;
        }
        if step[0] != IDLE {
            // SAFETY: a send: the user's range (caller contract) into a send slot's payload
            // (at most its size); a receive: a receive slot's payload into the user's range
            // (within the operation's bytes).
            unsafe { copy(step[1] as *mut u8, step[2] as *const u8, step[3], t, nt) };
        }
        arch::sync_threads();
        if let Some((i, k, len)) = pending {
            // SAFETY: thread 0, after the block's copy; caller contract.
            unsafe { finish(x, &ops.ops[i], i, k, len, &mut p) };
        }
    }
    arch::sync_threads();
    if t == 0 {
        // SAFETY: this context's state words; read by the next call after a kernel boundary
        // (or in this thread).
        unsafe { core::ptr::write_volatile(ctx.state.add(CALLS), seq + 1) };
    }
}

/// Thread 0's bookkeeping of a [`run`].
struct Progress {
    call: Call,
    /// Per operation: bytes done (a receive: of the sender's transfer).
    done: [u64; MAX_P2P_OPS],
    /// Per receive: the sender's byte count (`u64::MAX` until its first piece).
    total: [u64; MAX_P2P_OPS],
    /// Operations finished (bits).
    finished: u32,
    /// `%globaltimer` of the last step taken.
    last_progress: u64,
    /// Visits in a row that found no step.
    idle: u32,
    /// The first unfinished operation whose channel was found gone, and when.
    gone: Option<(usize, u64)>,
    /// `%globaltimer` of the last look at a refused bit ([`gone_past_grace`]).
    gone_look: u64,
}

/// Thread 0, while operation `i` (`op`) is the first unfinished one and nothing can step
/// (at most once per [`GONE_LOOK_NS`]; `now`: the clock): whether its channel is gone
/// (`DevConn::refused`: the proxy found the peer's streams ended) and has been for
/// [`GONE_GRACE_NS`], so what the peer sent before has landed and the operation cannot
/// complete.
///
/// # Safety
/// As for [`run`]; thread 0.
unsafe fn gone_past_grace(
    x: &ProxyContext,
    op: &RemoteOp,
    i: usize,
    now: u64,
    p: &mut Progress,
) -> bool {
    p.gone_look = now;
    // SAFETY: `index` is a remote rank (caller contract).
    if !unsafe { channel(x, op) }.refused() {
        p.gone = None;
        return false;
    }
    let since = match p.gone {
        Some((j, t)) if j == i => t,
        _ => {
            p.gone = Some((i, now));
            now
        }
    };
    now.wrapping_sub(since) > GONE_GRACE_NS
}

/// The counters of remote rank `j`.
///
/// # Safety
/// `j` a remote rank of the context.
#[inline(always)]
unsafe fn counters(x: &ProxyContext, j: u32) -> *mut u64 {
    // SAFETY: COUNTERS words per remote rank (context contract).
    unsafe { x.counters.add(j as usize * COUNTERS) }
}

/// Reads counter `c`.
///
/// # Safety
/// `cnt` from [`counters`]; thread 0.
#[inline(always)]
unsafe fn get(cnt: *mut u64, c: usize) -> u64 {
    // SAFETY: caller contract; written by thread 0 only.
    unsafe { core::ptr::read_volatile(cnt.add(c)) }
}

/// Writes counter `c`.
///
/// # Safety
/// As for [`get`].
#[inline(always)]
unsafe fn set(cnt: *mut u64, c: usize, v: u64) {
    // SAFETY: caller contract.
    unsafe { core::ptr::write_volatile(cnt.add(c), v) }
}

/// The channel of operation `op` (a send's out channel, a receive's in channel).
///
/// # Safety
/// `op.index` a remote rank of the context.
#[inline(always)]
unsafe fn channel<'a>(x: &'a ProxyContext, op: &RemoteOp) -> &'a DevConn<'static> {
    let i = 2 * op.index as usize + usize::from(op.send == 0);
    // SAFETY: two handles per remote rank (context contract).
    unsafe { &*x.coll.conns.add(i) }
}

/// Thread 0: the first step of `ops` that can go without waiting, as `[kind, dst, src,
/// bytes]` of the block's copy, and what [`finish`] then needs: `(operation, piece number,
/// piece bytes)`. A receive's header is checked here (a mismatch of sizes recorded, a piece
/// out of step failing the call).
///
/// # Safety
/// As for [`run`]; thread 0.
unsafe fn choose(
    x: &ProxyContext,
    ops: &RemoteOps,
    n: usize,
    p: &mut Progress,
) -> ([u64; 4], Option<(usize, u64, u64)>) {
    let ctx = &x.coll;
    let (slot, depth, base) = (ctx.scratch_len, x.depth, ctx.scratch);
    let payload = slot - XHDR;
    for i in 0..n {
        let op = &ops.ops[i];
        let earlier = |e: usize| {
            let o = &ops.ops[e];
            p.finished & (1 << e) == 0 && o.index == op.index && o.send == op.send
        };
        if p.finished & (1 << i) != 0 || (0..i).any(earlier) {
            continue;
        }
        // SAFETY: `index` is a remote rank (caller contract).
        let (cnt, conn) = unsafe { (counters(x, op.index), channel(x, op)) };
        if op.send != 0 {
            // SAFETY (every counter access below): thread 0, this remote rank's counters.
            let k = unsafe { get(cnt, SENT) };
            let mut credits = unsafe { get(cnt, CREDITS) };
            if k >= credits + depth && conn.poll() {
                credits += 1;
                unsafe { set(cnt, CREDITS, credits) };
            }
            if k < credits + depth {
                let len = payload.min(op.bytes - p.done[i]);
                let at = base.wrapping_add(send_slot(slot, depth, op.index as u64, k) as usize);
                for (w, v) in [k, op.bytes, p.done[i], len].iter().enumerate() {
                    // SAFETY: the send slot's header (the slot lies in the buffer, 16-byte
                    // aligned; no proxy reads it: its last put returned).
                    unsafe { core::ptr::write_volatile((at as *mut u64).add(w), *v) };
                }
                let step = [SEND, at as u64 + XHDR, op.buf + p.done[i], len];
                return (step, Some((i, k, len)));
            }
        } else if conn.poll() {
            // SAFETY: as above.
            let (k, xfer) = unsafe { (get(cnt, RECEIVED), get(cnt, XFERS_IN)) };
            let at = base.wrapping_add(recv_slot(slot, depth, op.index as u64, k) as usize);
            // SAFETY: the receive slot's header, published by the poll (the proxy writes the
            // data before it raises the counter).
            let h: [u64; 4] = core::array::from_fn(|w| unsafe {
                core::ptr::read_volatile((at as *const u64).add(w))
            });
            let [hk, bytes, off, len] = h;
            if hk != k || off != p.done[i] || len > payload || (len == 0 && bytes != 0) {
                let theirs = p2p_desc(bytes, true, op.peer, hk);
                // SAFETY: the context valid.
                unsafe {
                    ctx.fail(
                        p.call,
                        fault::MISMATCH,
                        op.peer,
                        theirs,
                        fault::AT_REMOTE_P2P,
                    )
                };
                p.call.failed = true;
                return ([DONE, 0, 0, 0], None);
            }
            if p.total[i] == u64::MAX {
                p.total[i] = bytes;
                if bytes != op.bytes {
                    // SAFETY: the context valid.
                    unsafe {
                        ctx.record(
                            p.call.seq,
                            fault::MISMATCH,
                            op.peer,
                            p2p_desc(op.bytes, false, op.peer, xfer),
                            p2p_desc(bytes, true, ctx.rank, xfer),
                            fault::AT_REMOTE_P2P,
                        )
                    };
                }
            }
            let fits = len.min(op.bytes.saturating_sub(off));
            return (
                [RECV, op.buf + off, at as u64 + XHDR, fits],
                Some((i, k, len)),
            );
        }
    }
    ([IDLE, 0, 0, 0], None)
}

/// Thread 0, after the block copied step `(i, k, len)` of operation `op`: a send puts the
/// piece with the signal, a receive credits its slot; the counters advance.
///
/// # Safety
/// As for [`run`]; thread 0, after the block's barrier that follows the copy.
unsafe fn finish(x: &ProxyContext, op: &RemoteOp, i: usize, k: u64, len: u64, p: &mut Progress) {
    let ctx = &x.coll;
    let (slot, depth) = (ctx.scratch_len, x.depth);
    // SAFETY: `index` is a remote rank (caller contract).
    let (cnt, conn) = unsafe { (counters(x, op.index), channel(x, op)) };
    let r = if op.send != 0 {
        // The block's payload and the header before the trigger, for the proxy's copy.
        arch::fence_acq_rel_sys();
        let dst = recv_slot(slot, depth, op.at_peer as u64, k);
        let src = send_slot(slot, depth, op.index as u64, k);
        conn.try_put_with_signal(dst, src, XHDR + len)
    } else {
        // The block's reads of the slot are done (the barrier): the sender may reuse it. A
        // credit refused because the sender's connection is gone is moot: the piece is here
        // (a sender that left sends nothing more; the next piece's wait says so).
        match conn.try_signal() {
            Err(ChannelError::ProxyRefused { .. }) => Ok(()),
            r => r,
        }
    };
    if let Err(e) = r {
        // The FIFO stayed full for its timeout (the proxy stopped serving), or the proxy
        // refused or failed the trigger (its errors say why: the peer's connection is gone,
        // as the puts of this module are always inside the buffers).
        let (kind, place) = match e {
            ChannelError::Timeout => (fault::TIMEOUT, fault::AT_REMOTE_P2P),
            ChannelError::ProxyRefused { .. } => (fault::ABORTED, fault::AT_REMOTE_P2P_GONE),
            _ => (fault::ABORTED, fault::AT_REMOTE_P2P),
        };
        // SAFETY: the context valid.
        unsafe { ctx.fail(p.call, kind, op.peer, [0; 2], place) };
        p.call.failed = true;
        return;
    }
    p.done[i] += len;
    p.last_progress = arch::global_timer_ns();
    p.idle = 0;
    // SAFETY (every counter access below): thread 0, this remote rank's counters.
    unsafe {
        if op.send != 0 {
            set(cnt, SENT, k + 1);
            if p.done[i] >= op.bytes {
                p.finished |= 1 << i;
                set(cnt, XFERS_OUT, get(cnt, XFERS_OUT) + 1);
            }
        } else {
            set(cnt, RECEIVED, k + 1);
            if p.done[i] >= p.total[i] {
                p.finished |= 1 << i;
                set(cnt, XFERS_IN, get(cnt, XFERS_IN) + 1);
            }
        }
    }
}

crate::kernel! {
    /// A group's sends and receives with ranks on other hosts ([`run`]) as a one-block
    /// kernel: `ctx` the remote_p2p context in device memory.
    pub unsafe fn remote_p2p(ctx: *const ProxyContext, ops: RemoteOps) {
        // SAFETY: forwarded to the launcher (the host builds the context and the ops).
        unsafe { run(&*ctx, &ops) }
    }
}
crate::launch_bounds!(remote_p2p, 512);
