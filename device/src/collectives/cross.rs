//! The cross-host step of the hierarchical collectives (issue #17): one *round* of an
//! exchange between a rank and its *partners*, the ranks of its local index on the other
//! hosts, over proxy channels ([`DevConn`](crate::channel::DevConn), TCP or IB), followed
//! by a reduction of the hosts' payloads in host order or a gather of them.
//!
//! The same function, [`step`], runs as block 0 of the [`cross_step`] GPU kernel on the GPU
//! backend and in the calling CPU thread on the Host backend (a block of one thread:
//! `sync_threads` is then a no-op), so the logic CI tests over TCP loopback is the logic the
//! GPU runs. A [`cross_step`] grid of more blocks reduces in blocks `1..`
//! ([`reduce_pieces`]), which block 0 hands each piece as it lands ([`PROGRESS`]): for
//! payloads in host memory that one block would read too slowly over PCIe.
//!
//! # The cross context
//!
//! A [`CollContext`] of its own (not the local group's) describes the step; its fields
//! mean:
//!
//! - `rank`: this rank's host index; `nranks`: the number of hosts (any number);
//! - `scratch`: the *cross buffer*, registered for the proxy channels, of `3 * nranks`
//!   slots of `scratch_len` bytes (a multiple of 16): `nranks` send slots (slot `h` for
//!   what goes to host `h`; slot `rank` for a payload every partner gets), then two halves
//!   (alternate rounds) of `nranks` receive slots (slot `h` for host `h`'s payload);
//!   every slot is a [`HDR`]-byte header (round, call descriptor `n` and tag, payload
//!   bytes) then the payload;
//! - `conns`: `nranks` handles, `conns[h]` the proxy channel to the partner on host `h`
//!   (over the cross buffer on both sides; the own entry is unused);
//! - `state`: this step's own [`STATE_WORDS`](super::STATE_WORDS) words (zeroed at first):
//!   [`ROUND`] (rounds done) and the local fault words ([`super::local_fault`]) its
//!   waits use;
//! - `fault`, `timeout_ns`: the communicator's fault area and device timeout, as for the
//!   collective kernels; the rest is unused.
//!
//! # A round
//!
//! 1. The block copies `src` (unless null) into the own send slot's payload; thread 0
//!    writes the own send slot's header; barrier. A payload from `src` that every partner
//!    gets, longer than [`PIPE_PIECE`], is copied in pieces of that size instead, each but
//!    the last put with a signal (the first with the header, which says so: [`PIECEWISE`])
//!    as soon as it is copied (after a barrier), so the proxy sends one piece while the
//!    block copies the next, and the partners may reduce it while the next travels; step
//!    2 then puts the last piece with its signal.
//! 2. For every partner host `h` (threads take hosts `t, t + nt, …`): with per-destination
//!    slots ([`PER_DEST`]), the thread writes slot `h`'s header; it puts the header and
//!    payload (`len` bytes, or none for a host that gets none: [`to_host`], or with
//!    [`HEADER_ONLY`]) into the
//!    partner's receive slot of this host in the round's half, with the signal
//!    (`try_put_with_signal` returns once the proxy has taken the source, so the send slots
//!    may be rewritten by the next round).
//! 3. The same thread waits for every such partner's signal (every signal of a
//!    [`PIECEWISE`] payload: see 4), through
//!    [`CollContext::keep_waiting`] every slice (abort word, stop word, device timeout; no
//!    trap), and checks the partner's header: a different round or descriptor is recorded
//!    in the fault area ([`fault::MISMATCH`] at [`fault::AT_CROSS`] with both descriptors,
//!    or at [`fault::AT_CROSS_ROUND`] with both rounds in the descriptor words) and the
//!    step is *broken*: [`fault::CROSS_BROKEN`] is raised in the fault area. A partner
//!    whose connection is gone (the proxy refused the put to it, or found its stream
//!    ended: `DevConn::refused`) does not stop the waits: its round may have landed before
//!    it left, and is waited for until 1 s after the wait's first slice (so a partner
//!    that found a mismatch and left is still reported as the mismatch, one that died as
//!    lost by the bootstrap's abort, and one that left before the call is named within a
//!    second, not after the device timeout); after a
//!    barrier, the gone partner is recorded ([`fault::ABORTED`] at
//!    [`fault::AT_CROSS_GONE`]) unless something else was. Barrier.
//! 4. Unless broken: [`REDUCE`]: the payloads of every host, in host order (the own from
//!    its send slot), reduced by the tag's operation into `out` (`len` bytes), average as a
//!    sum divided by the job's rank count ([`flags`]); a [`to_host`] step reduces on that
//!    host only. The reduction goes piece by piece ([`pieces`]): 3 waits for every
//!    partner's signals up to piece `i` (a partner that sent its payload whole: its one
//!    signal), then the block reduces piece `i` (or hands it to the grid's reducing
//!    blocks), and so on; the last piece takes every signal still due. [`GATHER`]: host
//!    `h`'s payload copied to `out + h * stride`. [`PICK`]: host `stride`'s payload copied
//!    to `out`. [`NONE`]: nothing (the
//!    Host backend's caller may read the slots itself).
//! 5. Thread 0 advances [`ROUND`] (after a barrier; in a grid, once every reducing block
//!    counted itself done: [`REDUCED`]).
//!
//! A rank writes a partner's receive slot of round `k + 2` (the half of round `k`) only
//! after it has received that partner's round `k + 1`, which the partner sends only after
//! its round `k` ended: no acknowledgement is needed. Once broken (a failed wait, a
//! mismatch, a refused put), every later step only advances the round: the rounds of the
//! partners may no longer pair, and the host reports the recorded failure from then on.

use super::{Bytes, Call, CollContext, Dyn, Reduce, desc, fault, op};
use crate::arch;
use crate::channel::ChannelError;
use crate::channel::memory::copy;

/// Bytes of the header in front of every payload: round, descriptor (`n`, tag), payload
/// bytes (four `u64`).
pub const HDR: u64 = 32;
/// Index in the cross context's `state` of the number of rounds done.
pub const ROUND: usize = 0;

/// Mode ([`flags`]): the caller reads the receive slots itself.
pub const NONE: u64 = 0;
/// Mode: reduce the hosts' payloads in host order into `out`.
pub const REDUCE: u64 = 1;
/// Mode: copy host `h`'s payload to `out + h * stride`.
pub const GATHER: u64 = 2;
/// Mode: copy the payload of host `stride` (the own send slot for this host) to `out`.
pub const PICK: u64 = 3;
/// Flag: the payload for host `h` is in send slot `h` (else every partner gets the own send
/// slot `rank`).
pub const PER_DEST: u64 = 1 << 4;
/// Flag: this rank sends every partner the header alone (a round in which other hosts
/// send, e.g. a broadcast's); `len` still sizes what the mode copies.
pub const HEADER_ONLY: u64 = 1 << 5;
/// Bits of [`flags`] holding the host that alone gets the payload ([`to_host`]).
const TO_SHIFT: u32 = 8;
/// "Every partner" in the [`TO_SHIFT`] field.
const TO_ALL: u64 = 0xff_ffff;
/// Bits of [`flags`] holding the average's divisor.
const AVG_SHIFT: u32 = 32;
/// Pieces of a round's payload copied in and put one after the other (see [`step`]): the
/// proxy sends one piece while the block copies the next.
pub const PIPE_PIECE: u64 = 1 << 20;
/// Flag in a header's payload-bytes word: the sender put its payload in [`PIPE_PIECE`]s,
/// each with a signal, so the partner may reduce a piece as soon as it has landed.
pub const PIECEWISE: u64 = 1 << 63;
/// Index in the cross context's `state` of what block 0 of a [`cross_step`] grid has
/// handed its reducing blocks ([`reduce_pieces`]): the round in the high 32 bits, the
/// pieces landed from every partner (or [`BROKEN`]) in the low 32.
pub const PROGRESS: usize = 1;
/// Index in the cross context's `state` of the reducing blocks done with the round (block 0
/// waits for all of them, then clears it): each adds 1, plus [`GAVE_UP`] when it stopped
/// waiting for a piece without the round having failed (its share may be partial).
pub const REDUCED: usize = 2;
/// What a reducing block adds to [`REDUCED`] beside its 1 when it gave up: the round fails.
pub const GAVE_UP: u64 = 1 << 32;
/// Index in the cross context's `state` of the round whose [`BASES`] are written, plus one.
pub const BASES_ROUND: usize = 3;
/// Index in the cross context's `state` of the first of [`MAX_BASES`] words: partner `h`'s
/// signal tickets ([`DevConn::tickets`](crate::channel::DevConn::tickets)) at the start of
/// the round, written by block 0 before it copies anything, so that the reducing blocks see
/// the partners' pieces land ([`DevConn::arrived`](crate::channel::DevConn::arrived))
/// while block 0 still copies and puts its own.
pub const BASES: usize = 4;
/// Most hosts whose [`BASES`] are kept (more: the reducing blocks follow [`PROGRESS`]
/// alone).
pub const MAX_BASES: usize = 64;
/// Index in the cross context's `state` of the pieces of `src` block 0 of a [`cross_step`]
/// grid has copied into its send slot (the round in the high 32 bits, as [`PROGRESS`]): in
/// place, a reducing block writes a piece of `out` only once it was copied.
pub const COPIED: usize = BASES + MAX_BASES;
/// Index in the cross context's `state` of the pieces the first reducing block has seen
/// land ([`BASES`]; in place, also copied: [`COPIED`]), as [`PROGRESS`] without the failure:
/// the others follow it rather than poll the partners' counters and headers (host memory)
/// themselves.
pub const LANDED: usize = COPIED + 1;
/// [`PROGRESS`]'s count when the round failed: the reducing blocks stop.
pub const BROKEN: u64 = 0xffff_ffff;
/// How long one `wait_timeout` waits before the fault words are looked at.
const WAIT_SLICE_NS: u64 = 200_000;
/// How long a partner whose connection is gone (`DevConn::refused`) is still waited for:
/// what it sent before it left has landed by then, and a partner that died (rather than
/// left) has been reported lost by the bootstrap (the abort word, within about 250 ms),
/// which names it as lost.
pub(crate) const GONE_GRACE_NS: u64 = 1_000_000_000;

/// The `flags` argument of [`step`]: a mode ([`NONE`], [`REDUCE`], [`GATHER`]) or'ed with
/// [`PER_DEST`] and [`to_host`], and `avg_n`, the job's rank count (the divisor of an
/// average; ignored for other operations).
#[inline(always)]
pub const fn flags(mode: u64, avg_n: u32) -> u64 {
    mode | TO_ALL << TO_SHIFT | (avg_n as u64) << AVG_SHIFT
}

/// `flags` with only host `h` getting the payload (the others get the header alone, with
/// the signal) and only host `h` reducing ([`REDUCE`]).
#[inline(always)]
pub const fn to_host(flags: u64, h: u32) -> u64 {
    flags & !(TO_ALL << TO_SHIFT) | ((h as u64 & TO_ALL) << TO_SHIFT)
}

/// Byte offset of send slot `h` in the cross buffer.
#[inline(always)]
pub const fn send_slot(slot: u64, h: u64) -> u64 {
    h * slot
}

/// Byte offset of receive slot `h` of `round`'s half for `hosts` hosts.
#[inline(always)]
pub const fn recv_slot(slot: u64, hosts: u64, round: u64, h: u64) -> u64 {
    (hosts + (round & 1) * hosts + h) * slot
}

/// Address of host `h`'s payload of `round` in the cross buffer of `ctx`: the own send
/// slot's for this host, else the receive slot of `h` in the round's half.
#[inline(always)]
fn round_payload(ctx: &CollContext, round: u64, h: u32) -> *const u8 {
    let (slot, nh) = (ctx.scratch_len, ctx.nranks as u64);
    let off = if h == ctx.rank {
        send_slot(slot, h as u64)
    } else {
        recv_slot(slot, nh, round, h as u64)
    };
    ctx.scratch.wrapping_add((off + HDR) as usize) as *const u8
}

/// Bytes of a cross buffer with slots of `slot` bytes for `hosts` hosts.
#[inline(always)]
pub const fn buffer_bytes(slot: u64, hosts: u64) -> u64 {
    3 * hosts * slot
}

/// One round (see the [module](self)): `n` and `tag` are the call's descriptor (checked
/// against every partner's), `len` the payload bytes (at most `scratch_len - HDR`), `src`
/// (null: the payload is already in the send slots) the own payload, `out` and `stride` the
/// destination of [`REDUCE`] / [`GATHER`] / [`PICK`] (null: none on this rank; for
/// [`PICK`], `stride` is the host whose payload is copied).
///
/// # Safety
/// Every thread of one block, with the same arguments; `ctx` a valid cross context (see the
/// [module](self)); `src` valid for `len` bytes; `out` valid for `len` bytes ([`REDUCE`],
/// aligned to the tag's element size; [`PICK`]) or `(nranks - 1) * stride + len` bytes
/// ([`GATHER`]), disjoint from the cross buffer; the payloads `len` bytes of whole
/// elements.
//
// One function on purpose: the round's phases (stage, put, wait and check, agree, reduce or
// copy) share the context's fields, read once at the top, and the block's failure word.
// Split into `#[inline(always)]` phase functions over a struct of those values, the
// `cross_step` kernel needed 128 registers instead of 124 (ptxas, sm_90): at its bound of
// 512 threads that is the whole register file.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn step(
    ctx: &CollContext,
    src: *const u8,
    out: *mut u8,
    n: u64,
    tag: u64,
    len: u64,
    flags: u64,
    stride: u64,
) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (me, nh) = (ctx.rank, ctx.nranks);
    let slot = ctx.scratch_len;
    let mode = flags & 0xf;
    let per_dest = flags & PER_DEST != 0;
    let to = (flags >> TO_SHIFT) & TO_ALL;
    let gets = |h: u32| to == TO_ALL || to == h as u64;
    let sends = flags & HEADER_ONLY == 0;
    let own_len = if sends { len } else { 0 };
    let avg_n = (flags >> AVG_SHIFT) as u32;
    // Blocks beside this one reduce (see `reduce_pieces`).
    let grid = arch::grid_dim_x() > 1;
    let base = ctx.scratch;
    // The block's agreement on a failure: thread 0 seeds it from the sticky broken word.
    let failed_flag = crate::shared_array!(CROSS_FAILED: u32; 1);
    // SAFETY: the state words are live and this step's own (context contract); the last
    // writer was the previous step on this stream (a kernel boundary) or this thread.
    let round = unsafe { core::ptr::read_volatile(ctx.state.add(ROUND)) };
    if t == 0 {
        // SAFETY: the fault area is live (context contract); the shared word is the block's.
        unsafe {
            let broken = arch::ld_relaxed_sys_u64(ctx.fault.add(fault::CROSS_BROKEN));
            failed_flag.write_volatile(u32::from(broken != 0));
        }
    }
    arch::sync_threads();
    let mut call = Call {
        seq: round,
        desc: [n, tag],
        // SAFETY: written by thread 0 before the barrier.
        failed: unsafe { failed_flag.read_volatile() } != 0,
        desc_pending: false,
    };
    if grid && t == 0 && !call.failed && nh as usize <= MAX_BASES {
        for h in 0..nh {
            if h != me {
                // SAFETY: conns holds nranks handles; BASES + MAX_BASES state words are live
                // (context contract); no wait of this round has taken a ticket yet.
                unsafe {
                    let c = &*ctx.conns.add(h as usize);
                    core::ptr::write_volatile(ctx.state.add(BASES + h as usize), c.tickets());
                }
            }
        }
        // SAFETY: the state words are live (context contract).
        unsafe { arch::st_release_sys_u64(ctx.state.add(BASES_ROUND), round + 1) };
    }
    let header = |at: *mut u8, l: u64| {
        let h = [round, n, tag, l];
        for (i, w) in h.iter().enumerate() {
            // SAFETY: a send slot's header (HDR bytes at a 16-byte aligned slot start).
            unsafe { core::ptr::write_volatile((at as *mut u64).add(i), *w) };
        }
    };
    let dst = recv_slot(slot, nh as u64, round, me as u64);
    // The first partner of this thread's whose connection is gone (the proxy refused or
    // failed the put to it, or its round did not come within the grace after the proxy
    // found it gone): typically a partner that failed this round, or an earlier call, and
    // left. Recorded after the waits unless something else was (a mismatch says more).
    let mut gone = None;
    // The part of the payload the put with the signal (below) sends: all of it, or the
    // last piece of a pipelined one (uniform over the block).
    let mut tail = 0;
    if !call.failed {
        let own = base.wrapping_add(send_slot(slot, me as u64) as usize);
        let piecewise = !src.is_null() && !per_dest && sends && to == TO_ALL && len > PIPE_PIECE;
        if !per_dest && t == 0 {
            header(own, own_len | if piecewise { PIECEWISE } else { 0 });
        }
        if piecewise {
            tail = (len - 1) / PIPE_PIECE * PIPE_PIECE;
            // SAFETY: tail < len: inside the own send slot's payload and src (as below);
            // every thread of the block, with the same arguments.
            call.failed = unsafe { put_pieces(ctx, src, tail, round, call) };
        }
        if !src.is_null() {
            // SAFETY: the own send slot's payload holds slot - HDR >= len bytes; src holds
            // len bytes (caller contract).
            unsafe {
                copy(
                    own.add((HDR + tail) as usize),
                    src.add(tail as usize),
                    len - tail,
                    t,
                    nt,
                )
            };
        }
    }
    arch::sync_threads();
    if grid && t == 0 && !call.failed {
        // Every piece of `src` copied (see `COPIED`).
        // SAFETY: the state words are live (context contract).
        unsafe { arch::st_release_sys_u64(ctx.state.add(COPIED), stamp(round, pieces(len))) };
    }
    let mut h = t;
    while h < nh && !call.failed {
        if h != me {
            let l = if gets(h) { own_len } else { 0 };
            let from = send_slot(slot, if per_dest { h } else { me } as u64);
            if per_dest {
                header(base.wrapping_add(from as usize), l);
            }
            // The block's payload and headers before the trigger, for the proxy's copy.
            arch::fence_acq_rel_sys();
            // SAFETY: conns holds nranks handles (context contract).
            let c = unsafe { &*ctx.conns.add(h as usize) };
            // Pipelined, the last piece (the header and the others are on their way).
            let at = if tail == 0 { 0 } else { HDR + tail };
            match c.try_put_with_signal(dst + at, from + at, HDR + l - at) {
                Ok(()) => {}
                Err(ChannelError::ProxyRefused { .. }) => gone = gone.or(Some(h)),
                Err(e) => {
                    // SAFETY: the context valid.
                    unsafe { ctx.fail(call, put_fault(e), h, [0; 2], fault::AT_CROSS) };
                    call.failed = true;
                }
            }
        }
        h += nt;
    }
    // The reduction follows the partners' pieces (see `PIECEWISE`): in this block, or in the
    // grid's other blocks (`reduce_pieces`), to which thread 0 hands each piece as it lands.
    let progressive = mode == REDUCE && gets(me) && (grid || !out.is_null());
    let steps = if progressive { pieces(len) } else { 1 };
    let mut piece = 0;
    let broken = loop {
        let last = piece + 1 == steps;
        let mut h = t;
        while h < nh && !call.failed {
            if h != me {
                // SAFETY: conns holds nranks handles (context contract).
                let c = unsafe { &*ctx.conns.add(h as usize) };
                let at = base.wrapping_add(recv_slot(slot, nh as u64, round, h as u64) as usize);
                // The partner's signal count (its header, which came with its first).
                let total = || {
                    // SAFETY: the receive slot's header, published by the first wait (the
                    // proxy writes the data before it raises the counter).
                    let l = unsafe { core::ptr::read_volatile((at as *const u64).add(3)) };
                    if l & PIECEWISE != 0 {
                        pieces(l & !PIECEWISE)
                    } else {
                        1
                    }
                };
                // Its signals waited for by the end of this piece: up to this piece's, at the
                // last every one.
                let upto = |n: u64| if last { n } else { n.min(piece + 1) };
                let (mut waited, mut want) = if piece == 0 {
                    (0, 1)
                } else {
                    let n = total();
                    (piece.min(n), upto(n))
                };
                while waited < want && !call.failed {
                    let mut start = None;
                    let mut arrived = true;
                    while !c.wait_timeout(WAIT_SLICE_NS) {
                        let t0 = start.get_or_insert_with(arch::global_timer_ns);
                        // A partner this rank cannot reach any more: what it sent before it
                        // left is there within the grace; after it, give up without a
                        // record.
                        if c.refused() && arch::global_timer_ns().wrapping_sub(*t0) > GONE_GRACE_NS
                        {
                            gone = gone.or(Some(h));
                            arrived = false;
                            break;
                        }
                        // SAFETY: the context valid.
                        *t0 = unsafe { ctx.keep_waiting(call, h, fault::AT_CROSS, *t0) };
                        if *t0 == 0 {
                            call.failed = true;
                            break;
                        }
                    }
                    if !arrived || call.failed {
                        break;
                    }
                    if waited == 0 {
                        // SAFETY: the context valid; the header published by the wait.
                        call.failed = unsafe { check_header(ctx, call, at, round, h) };
                        if call.failed {
                            break;
                        }
                        want = upto(total());
                    }
                    waited += 1;
                }
            }
            h += nt;
        }
        if call.failed {
            // SAFETY: the fault area is live (context contract); the shared word the block's.
            unsafe {
                arch::st_release_sys_u64(ctx.fault.add(fault::CROSS_BROKEN), 1);
                failed_flag.write_volatile(1);
            }
        }
        arch::sync_threads();
        // A partner gone fails the round, named as such only when no wait failed or found a
        // mismatch (those were recorded before the barrier and say more).
        // SAFETY: the shared word was written before the barrier; after it, only raised to 1
        // (below), so a thread that reads it while another raises it sees 0 or 1, and either
        // leaves one record in the fault area (first writer wins).
        if let Some(h) = gone
            && unsafe { failed_flag.read_volatile() } == 0
        {
            // SAFETY: the context valid; the fault area live (context contract); the shared
            // word the block's.
            unsafe {
                ctx.fail(call, fault::ABORTED, h, [0; 2], fault::AT_CROSS_GONE);
                arch::st_release_sys_u64(ctx.fault.add(fault::CROSS_BROKEN), 1);
                failed_flag.write_volatile(1);
            }
        }
        arch::sync_threads();
        // Every thread reads the same word after the barrier: the block agrees.
        // SAFETY: written before the barrier.
        if unsafe { failed_flag.read_volatile() } != 0 {
            break true;
        }
        if progressive {
            let (lo, hi) = (piece * PIPE_PIECE, ((piece + 1) * PIPE_PIECE).min(len));
            if grid {
                if t == 0 {
                    // SAFETY: the state words are live (context contract).
                    unsafe { publish(ctx, round, piece + 1) };
                }
            } else {
                let payload = |h: u32| round_payload(ctx, round, h).wrapping_add(lo as usize);
                // SAFETY: every payload holds len bytes, [lo, hi) of them published by the
                // waits and the barrier (the own written above or by the caller); out holds
                // len bytes (caller contract); a piece is whole elements.
                unsafe { reduce_hosts(payload, nh, out.add(lo as usize), hi - lo, tag, avg_n) };
            }
        }
        piece += 1;
        if piece == steps {
            break false;
        }
    };
    if grid && t == 0 {
        // SAFETY: the state words are live (context contract).
        unsafe {
            if broken {
                publish(ctx, round, BROKEN);
            }
            if !wait_reducers(ctx, arch::grid_dim_x() as u64 - 1) && !broken {
                ctx.fail(call, fault::TIMEOUT, me, [0; 2], fault::AT_CROSS_REDUCE);
                arch::st_release_sys_u64(ctx.fault.add(fault::CROSS_BROKEN), 1);
            }
        }
    }
    if !broken && !out.is_null() {
        let payload = |h: u32| round_payload(ctx, round, h);
        if mode == PICK {
            let from = (stride as u32).min(nh - 1);
            // SAFETY: every payload holds len bytes (the own written above or by the
            // caller, the others published by the waits and the barrier); out holds len
            // bytes.
            unsafe { copy(out, payload(from), len, t, nt) };
        } else if mode == GATHER {
            for h in 0..nh {
                // SAFETY: as above; out holds (nh - 1) * stride + len bytes.
                unsafe {
                    copy(
                        out.add((h as u64 * stride) as usize),
                        payload(h),
                        len,
                        t,
                        nt,
                    )
                };
            }
        }
    }
    arch::sync_threads();
    if t == 0 {
        // SAFETY: the state words are live; read by the next step after a kernel boundary
        // (or in this thread).
        unsafe { core::ptr::write_volatile(ctx.state.add(ROUND), round + 1) };
    }
}

/// The pipelined part of [`step`]'s first phase: copies `src[..tail]` (a multiple of
/// [`PIPE_PIECE`]) into the own send slot's payload piece by piece and puts each piece
/// (the first with the header) to every partner with a signal ([`PIECEWISE`]), after a
/// barrier, without waiting for the proxy (the put with the signal after these does).
/// Returns whether a put of this thread's failed (recorded in the fault area). Not
/// inlined: inside the step, its loop made the `cross_step` kernel spill registers.
///
/// # Safety
/// Every thread of one block, with the same arguments; `ctx` a valid cross context; `src`
/// valid for `tail` bytes, `tail` within a slot's payload.
#[inline(never)]
unsafe fn put_pieces(ctx: &CollContext, src: *const u8, tail: u64, round: u64, call: Call) -> bool {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (me, nh, slot) = (ctx.rank, ctx.nranks, ctx.scratch_len);
    let from = send_slot(slot, me as u64);
    let own = ctx.scratch.wrapping_add(from as usize);
    let dst = recv_slot(slot, nh as u64, round, me as u64);
    let mut failed = false;
    let mut off = 0;
    while off < tail {
        // Every thread copies its share, also one whose put failed: the others' partners
        // still get whole data with their signal.
        // SAFETY: off + PIPE_PIECE <= tail: inside the own send slot's payload and src
        // (caller contract).
        unsafe {
            copy(
                own.add((HDR + off) as usize),
                src.add(off as usize),
                PIPE_PIECE,
                t,
                nt,
            )
        };
        arch::sync_threads();
        if t == 0 && arch::grid_dim_x() > 1 {
            // SAFETY: the state words are live (context contract).
            unsafe {
                arch::st_release_sys_u64(ctx.state.add(COPIED), stamp(round, off / PIPE_PIECE + 1))
            };
        }
        // The first piece carries the header.
        let (at, size) = if off == 0 {
            (0, HDR + PIPE_PIECE)
        } else {
            (HDR + off, PIPE_PIECE)
        };
        let mut h = t;
        while h < nh && !failed {
            if h != me {
                // The block's piece before the trigger, for the proxy's copy.
                arch::fence_acq_rel_sys();
                // SAFETY: conns holds nranks handles (context contract).
                let c = unsafe { &*ctx.conns.add(h as usize) };
                // A refused put is reported by the put with the signal after these.
                if let Err(e) = c.try_put_with_signal_queued(dst + at, from + at, size) {
                    // SAFETY: the context valid.
                    unsafe { ctx.fail(call, put_fault(e), h, [0; 2], fault::AT_CROSS) };
                    failed = true;
                }
            }
            h += nt;
        }
        off += PIPE_PIECE;
    }
    failed
}

/// Pieces of a payload of `len` bytes: [`PIPE_PIECE`]s, the last one shorter (one for an
/// empty payload).
#[inline(always)]
pub const fn pieces(len: u64) -> u64 {
    if len == 0 {
        1
    } else {
        (len - 1) / PIPE_PIECE + 1
    }
}

/// Checks the header of partner `h`'s payload of `round` at `at` against this rank's round
/// and descriptor: a difference is recorded in the fault area ([`fault::MISMATCH`] at
/// [`fault::AT_CROSS`] with both descriptors, or at [`fault::AT_CROSS_ROUND`] with both
/// rounds in the descriptor words). Returns whether it differed.
///
/// # Safety
/// `ctx` a valid cross context; `at` a receive slot's header, published to this thread.
#[inline(always)]
unsafe fn check_header(ctx: &CollContext, call: Call, at: *const u8, round: u64, h: u32) -> bool {
    let mut hdr = [0u64; 4];
    for (i, w) in hdr.iter_mut().enumerate() {
        // SAFETY: the header's four words (caller contract).
        *w = unsafe { core::ptr::read_volatile((at as *const u64).add(i)) };
    }
    if hdr[0] != round {
        // Both rounds in the record's descriptor words.
        let rounds = Call {
            desc: [round, call.desc[1]],
            ..call
        };
        // SAFETY: the context valid (caller contract).
        unsafe {
            ctx.fail(
                rounds,
                fault::MISMATCH,
                h,
                [hdr[0], hdr[2]],
                fault::AT_CROSS_ROUND,
            )
        };
        true
    } else if [hdr[1], hdr[2]] != call.desc {
        // SAFETY: as above.
        unsafe { ctx.fail(call, fault::MISMATCH, h, [hdr[1], hdr[2]], fault::AT_CROSS) };
        true
    } else {
        false
    }
}

/// A count of pieces (or [`BROKEN`]) of `round` as the grid's state words hold it: the
/// round's low 32 bits above the count, so a word left by an earlier round is told apart.
#[inline(always)]
const fn stamp(round: u64, count: u64) -> u64 {
    round << 32 | count
}

/// The count of a word [`stamp`]ed for `round`; `None` when it is another round's.
#[inline(always)]
const fn count_in(word: u64, round: u64) -> Option<u64> {
    if word >> 32 == round & BROKEN {
        Some(word & BROKEN)
    } else {
        None
    }
}

/// Hands the reducing blocks of a [`cross_step`] grid the first `done` pieces of `round`
/// (or [`BROKEN`]): a release, after what this block's waits acquired.
///
/// # Safety
/// Thread 0 of block 0, after a barrier; `ctx` a valid cross context.
#[inline(always)]
unsafe fn publish(ctx: &CollContext, round: u64, done: u64) {
    arch::fence_acq_rel_sys();
    // SAFETY: the state words are live (caller contract).
    unsafe { arch::st_release_sys_u64(ctx.state.add(PROGRESS), stamp(round, done)) };
}

/// The pieces of `src` block 0 has copied into its send slot in `round` ([`COPIED`]; 0 for
/// an older round's count).
///
/// # Safety
/// `ctx` a valid cross context.
#[inline(always)]
unsafe fn copied(ctx: &CollContext, round: u64) -> u64 {
    // SAFETY: the state words are live (caller contract).
    count_in(
        unsafe { arch::ld_acquire_sys_u64(ctx.state.add(COPIED)) },
        round,
    )
    .unwrap_or(0)
}

/// Whether piece `piece` of `round` has landed from every partner, as the partners'
/// counters say against the round's [`BASES`] (`false` while block 0 has not written them,
/// or when it keeps none): a partner's first signal brings its header, which says whether
/// it signals every piece ([`PIECEWISE`]) or sent its payload whole.
///
/// # Safety
/// `ctx` a valid cross context of a [`cross_step`] grid.
#[inline(always)]
unsafe fn landed(ctx: &CollContext, round: u64, piece: u64) -> bool {
    let (me, nh) = (ctx.rank, ctx.nranks);
    // SAFETY: the state words are live (caller contract).
    if unsafe { arch::ld_acquire_sys_u64(ctx.state.add(BASES_ROUND)) } != round + 1 {
        return false;
    }
    let slot = ctx.scratch_len;
    for h in 0..nh {
        if h == me {
            continue;
        }
        // SAFETY: conns holds nranks handles; the bases were written before BASES_ROUND
        // (released, acquired above), for nh <= MAX_BASES hosts.
        let (c, base) = unsafe {
            (
                &*ctx.conns.add(h as usize),
                core::ptr::read_volatile(ctx.state.add(BASES + h as usize)),
            )
        };
        let arrived = c.arrived();
        if arrived <= base {
            return false;
        }
        let at = recv_slot(slot, nh as u64, round, h as u64) + 3 * 8;
        // SAFETY: the payload-bytes word of the partner's header in its receive slot,
        // published by its first signal (acquired above).
        let l = unsafe {
            core::ptr::read_volatile(ctx.scratch.wrapping_add(at as usize) as *const u64)
        };
        let need = if l & PIECEWISE != 0 {
            pieces(l & !PIECEWISE).min(piece + 1)
        } else {
            1
        };
        if arrived < base + need {
            return false;
        }
    }
    true
}

/// Block 0's end of a [`cross_step`] grid of `reducers` reducing blocks: waits (at most the
/// device timeout) until every one is done with the round, then clears their count for the
/// next one. Returns `false` if they were not done in time or one gave up ([`GAVE_UP`]):
/// the reduction may be partial.
///
/// # Safety
/// Thread 0 of block 0 after its last [`publish`]; `ctx` a valid cross context.
#[inline(always)]
pub(crate) unsafe fn wait_reducers(ctx: &CollContext, reducers: u64) -> bool {
    let t0 = arch::global_timer_ns();
    loop {
        // SAFETY: the state words are live (caller contract).
        let v = unsafe { arch::ld_acquire_sys_u64(ctx.state.add(REDUCED)) };
        if v & (GAVE_UP - 1) >= reducers {
            // SAFETY: as above.
            unsafe { core::ptr::write_volatile(ctx.state.add(REDUCED), 0) };
            return v < GAVE_UP;
        }
        if arch::global_timer_ns().wrapping_sub(t0) > ctx.timeout_ns {
            return false;
        }
    }
}

/// What a reducing block does next with a piece.
#[derive(Clone, Copy, PartialEq)]
#[repr(u32)]
enum Go {
    /// The round failed: stop.
    Stop,
    /// The piece is there: reduce it.
    Reduce,
    /// Waited the device timeout without the round failing: stop, saying so.
    GiveUp,
}

/// A reducing block of a [`cross_step`] grid (blocks `1..`): for every piece of the round's
/// payloads ([`pieces`] of `len`), once block 0 has handed it over ([`PROGRESS`]) or it has
/// landed from every partner (the first reducing block polls the partners' counters against
/// the round's [`BASES`], the others follow it: [`LANDED`]; in place, once block 0 has also
/// copied it out of `src`: [`COPIED`]), reduces
/// this block's share of it (cut at multiples of 16 bytes) over the hosts in host order into
/// `out`, as [`step`]'s reduction in one block would (the same sources in the same order:
/// the same bits), then counts itself done ([`REDUCED`]). The own payload is `src` when it
/// is not null (in place, `out`, unless this host's payload falls past the first reduction
/// pass), else the own send slot's. Nothing but the count when the step does not reduce
/// here ([`to_host`], no `out`) or the round failed.
///
/// # Safety
/// Every thread of every block but block 0 of the grid whose block 0 runs [`step`] with the
/// same arguments; `src` null or valid for `len` bytes; `out` valid for `len` bytes,
/// aligned to the tag's element size, disjoint from the cross buffer.
#[inline(never)]
pub unsafe fn reduce_pieces(
    ctx: &CollContext,
    src: *const u8,
    out: *mut u8,
    tag: u64,
    len: u64,
    flags: u64,
) {
    let t = arch::thread_idx_x();
    let (me, nh) = (ctx.rank, ctx.nranks);
    let to = (flags >> TO_SHIFT) & TO_ALL;
    let reduces = flags & 0xf == REDUCE && (to == TO_ALL || to == me as u64) && !out.is_null();
    // SAFETY: the state words are live; block 0 advances the round only after this block
    // counted itself done.
    let round = unsafe { core::ptr::read_volatile(ctx.state.add(ROUND)) };
    let (b, nb) = (
        arch::block_idx_x() as u64 - 1,
        arch::grid_dim_x() as u64 - 1,
    );
    let in_place = core::ptr::eq(src, out);
    let from_src = !src.is_null() && (!in_place || (me as usize) < PASS);
    let ready = crate::shared_array!(CROSS_PIECE_READY: u32; 1);
    let mut gave_up = false;
    let mut piece = 0;
    while reduces && piece < pieces(len) {
        if t == 0 {
            let t0 = arch::global_timer_ns();
            let go = loop {
                // SAFETY: the state words are live (context contract).
                let v = unsafe { arch::ld_acquire_sys_u64(ctx.state.add(PROGRESS)) };
                match count_in(v, round) {
                    Some(BROKEN) => break Go::Stop,
                    Some(done) if done > piece => break Go::Reduce,
                    _ => {}
                }
                // Block 0 fails the round when its waits give up; a reducing block that gives
                // up first says so (`GAVE_UP`), so a partial share never passes as a result.
                if arch::global_timer_ns().wrapping_sub(t0) > ctx.timeout_ns {
                    break Go::GiveUp;
                }
                if b > 0 {
                    // What the first reducing block saw land (see `LANDED`).
                    // SAFETY: the state words are live (context contract).
                    let v = unsafe { arch::ld_acquire_sys_u64(ctx.state.add(LANDED)) };
                    if count_in(v, round).is_some_and(|n| n > piece) {
                        break Go::Reduce;
                    }
                    continue;
                }
                // In place, `out` is `src`: this piece of it copied before it is written.
                // SAFETY: the state words are live; the context valid (caller contract).
                if (!in_place || unsafe { copied(ctx, round) } > piece)
                    && unsafe { landed(ctx, round, piece) }
                {
                    // SAFETY: as above.
                    unsafe {
                        arch::st_release_sys_u64(ctx.state.add(LANDED), stamp(round, piece + 1))
                    };
                    break Go::Reduce;
                }
            };
            // SAFETY: the block's shared word.
            unsafe { ready.write_volatile(go as u32) };
        }
        arch::sync_threads();
        // SAFETY: written by thread 0 before the barrier.
        let go = unsafe { ready.read_volatile() };
        if go != Go::Reduce as u32 {
            gave_up = go == Go::GiveUp as u32;
            break;
        }
        let (lo, hi) = (piece * PIPE_PIECE, ((piece + 1) * PIPE_PIECE).min(len));
        let share = (hi - lo).div_ceil(nb).next_multiple_of(16);
        let at = lo + b * share;
        if at < hi {
            let payload = |h: u32| {
                let p = if h == me && from_src {
                    src
                } else {
                    round_payload(ctx, round, h)
                };
                p.wrapping_add(at as usize)
            };
            // SAFETY: every payload holds len bytes (the own: src or the send slot; the
            // others: [lo, hi) published by block 0's waits and its release), out len bytes
            // (caller contract); this block's share is whole elements (16-byte cuts).
            unsafe {
                reduce_hosts(
                    payload,
                    nh,
                    out.add(at as usize),
                    share.min(hi - at),
                    tag,
                    (flags >> AVG_SHIFT) as u32,
                )
            };
        }
        // Thread 0 writes `ready` again only after every thread read it.
        arch::sync_threads();
        piece += 1;
    }
    arch::sync_threads();
    if t == 0 {
        arch::fence_acq_rel_sys();
        // SAFETY: the state words are live (context contract).
        let count = if gave_up { 1 + GAVE_UP } else { 1 };
        unsafe { arch::atomic_add_release_sys_u64(ctx.state.add(REDUCED), count) };
    }
}

/// The fault kind of a put the FIFO did not take: it stayed full for its timeout (the proxy
/// stopped serving), or the communicator was aborted while the thread waited for a slot (a
/// rank elsewhere was lost: the host names it, not the partner).
#[inline(always)]
fn put_fault(e: ChannelError) -> u64 {
    match e {
        ChannelError::Timeout => fault::TIMEOUT,
        _ => fault::ABORTED,
    }
}

/// Most sources one reduction pass takes (more hosts fold in passes whose first source is
/// the result so far: still host order, so the same bits).
const PASS: usize = 16;

/// Reduces `len` bytes of the payloads of hosts `0..nh` (`payload(h)`) in host order into
/// `out` with the tag's operation; an average sums, then divides by `avg_n`.
///
/// # Safety
/// Every thread of the block; the payloads and `out` valid for `len` bytes of whole
/// elements of the tag's type, published to the block.
#[inline(always)]
unsafe fn reduce_hosts(
    payload: impl Fn(u32) -> *const u8,
    nh: u32,
    out: *mut u8,
    len: u64,
    tag: u64,
    avg_n: u32,
) {
    let t = arch::thread_idx_x();
    let type_op = desc::type_op(tag);
    let avg = type_op & 0xff == op::AVG;
    let step_op = if avg {
        type_op & !0xff | op::SUM
    } else {
        type_op
    };
    let mut srcs = [core::ptr::null::<u8>(); PASS];
    let mut h = 0;
    while h < nh {
        let mut k = 0;
        if h > 0 {
            arch::sync_threads();
            srcs[0] = out;
            k = 1;
        }
        while k < PASS && h < nh {
            srcs[k] = payload(h);
            k += 1;
            h += 1;
        }
        // SAFETY: caller contract; out is either disjoint from the sources or the first
        // one (each element read before this thread writes it; passes separated by
        // barriers).
        unsafe { Bytes::reduce_out(&srcs[..k], out, core::ptr::null_mut(), len, t, step_op) };
    }
    if avg {
        arch::sync_threads();
        // SAFETY: out holds len bytes of the type (caller contract).
        unsafe { finish_avg(out, len, type_op, avg_n) };
    }
}

/// Divides every element of `out` (`len` bytes of the type of `type_op`) by `n`, as the
/// kernels' average does ([`Reduce::finish1`]); the block's threads share the elements.
///
/// # Safety
/// `out` valid for `len` bytes of whole elements; every thread of the block.
#[inline(always)]
pub unsafe fn finish_avg(out: *mut u8, len: u64, type_op: u32, n: u32) {
    let (t, nt) = (arch::thread_idx_x() as u64, arch::block_dim_x() as u64);
    let code = op::AVG | type_op & !0xff;
    let s = super::types::dtype_size(type_op >> 8);
    if s == 0 {
        return;
    }
    let mut i = t;
    while i < len / s {
        // SAFETY: element i of out (caller contract), this thread's own.
        unsafe {
            let p = out.add((i * s) as usize);
            match s {
                1 => p.write(<Dyn<1> as Reduce>::finish1(code, p.read() as u64, n) as u8),
                2 => {
                    let p = p as *mut u16;
                    p.write_unaligned(<Dyn<2> as Reduce>::finish1(
                        code,
                        p.read_unaligned() as u64,
                        n,
                    ) as u16)
                }
                4 => {
                    let p = p as *mut u32;
                    p.write_unaligned(<Dyn<4> as Reduce>::finish1(
                        code,
                        p.read_unaligned() as u64,
                        n,
                    ) as u32)
                }
                _ => {
                    let p = p as *mut u64;
                    p.write_unaligned(<Dyn<8> as Reduce>::finish1(code, p.read_unaligned(), n))
                }
            }
        }
        i += nt;
    }
}

crate::kernel! {
    /// One cross-host round ([`step`]) in block 0; the grid's other blocks, if any, reduce
    /// with it ([`reduce_pieces`]): `ctx` the cross context in device memory.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn cross_step(
        ctx: *const CollContext,
        src: *const u8,
        out: *mut u8,
        n: u64,
        tag: u64,
        len: u64,
        flags: u64,
        stride: u64,
    ) {
        // SAFETY: forwarded to the launcher (the host builds the context); every block
        // with the same arguments.
        unsafe {
            if arch::block_idx_x() == 0 {
                step(&*ctx, src, out, n, tag, len, flags, stride)
            } else {
                reduce_pieces(&*ctx, src, out, tag, len, flags)
            }
        }
    }
}
crate::launch_bounds!(cross_step, 512);
