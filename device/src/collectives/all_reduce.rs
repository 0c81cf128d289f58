//! All-reduce (sum): the one-shot packet algorithm for small messages and the two-shot
//! algorithm for large ones. See the [parent module](super) for the shared state.

use super::{
    COUNTER_WORDS, Call, CollContext, MAX_RANKS, Reduce, fault, packet_half, rotated_rank,
    round_share, two_shot_slot,
};
use crate::arch;
use crate::channel::memory::copy;
use crate::packet::LlPacket;

/// Loads unit `i` (8 bytes) of a `bytes`-long buffer; the last unit may be partial (missing
/// bytes read as zero). `aligned`: the buffer is 8-byte aligned.
///
/// # Safety
/// `p` valid for `bytes` bytes; `i < bytes.div_ceil(8)`.
#[inline(always)]
pub(crate) unsafe fn load_unit(p: *const u8, i: u64, bytes: u64, aligned: bool) -> u64 {
    let at = i * 8;
    if aligned && at + 8 <= bytes {
        // SAFETY: 8 valid aligned bytes (caller contract).
        return unsafe { (p.add(at as usize) as *const u64).read() };
    }
    // SAFETY: forwarded.
    unsafe { load_bytes(p, at, bytes) }
}

/// [`load_unit`] byte by byte (unaligned buffers, the last partial unit): out of line, so
/// the kernels' common path stays short.
///
/// # Safety
/// `p` valid for `bytes` bytes; `at < bytes`.
#[cold]
#[inline(never)]
unsafe fn load_bytes(p: *const u8, at: u64, bytes: u64) -> u64 {
    let mut v = 0u64;
    let end = (at + 8).min(bytes);
    for k in at..end {
        // SAFETY: k < bytes.
        v |= (unsafe { p.add(k as usize).read() } as u64) << ((k - at) * 8);
    }
    v
}

/// Stores unit `i` of a `bytes`-long buffer (only the bytes inside it).
///
/// # Safety
/// As for [`load_unit`], with `p` writable and not accessed concurrently at these bytes.
#[inline(always)]
pub(crate) unsafe fn store_unit(p: *mut u8, i: u64, bytes: u64, v: u64, aligned: bool) {
    let at = i * 8;
    if aligned && at + 8 <= bytes {
        // SAFETY: 8 valid aligned bytes (caller contract).
        unsafe { (p.add(at as usize) as *mut u64).write(v) };
        return;
    }
    // SAFETY: forwarded.
    unsafe { store_bytes(p, at, bytes, v) }
}

/// [`store_unit`] byte by byte, out of line like [`load_bytes`].
///
/// # Safety
/// As for [`load_bytes`], with `p` writable and not accessed concurrently at these bytes.
#[cold]
#[inline(never)]
unsafe fn store_bytes(p: *mut u8, at: u64, bytes: u64, v: u64) {
    let end = (at + 8).min(bytes);
    for k in at..end {
        // SAFETY: k < bytes.
        unsafe { p.add(k as usize).write((v >> ((k - at) * 8)) as u8) };
    }
}

/// Reads a call counter (see [`advance_counter`]) as block `block` sees it.
///
/// # Safety
/// `counter` holds `COUNTER_WORDS` live local words; `block < MAX_BLOCKS`; written only by
/// earlier calls, which finished before this kernel started (stream order).
#[inline(always)]
pub(crate) unsafe fn read_counter(counter: *mut u64, block: u32) -> u64 {
    // SAFETY: caller contract.
    let (single, copy) = unsafe {
        (
            arch::ld_relaxed_sys_u64(counter),
            arch::ld_relaxed_sys_u64(counter.add(1 + block as usize)),
        )
    };
    single.max(copy)
}

/// Advances a counter of calls (or rounds) to `value`, with no synchronisation between
/// blocks: called by every thread of every block of a call, after the block's threads have
/// read it with [`read_counter`]. It is kept in `COUNTER_WORDS` words: word 0 for calls of
/// one block, then one copy per block index for calls of more. A call of one block writes
/// word 0 only (one store rather than `MAX_BLOCKS`). In a call of more, block `b` writes
/// every copy `j` with `j % blocks == b`, so no block writes what another block of the call
/// reads. Whichever kind of call came last wrote the newest value, and counters only grow,
/// so the larger of word 0 and copy `b` is the counter, for every block of the next call
/// whatever its grid. (A last-block
/// protocol, a GPU-scope fence and a count of finished blocks, measured about 1.1 us more
/// per call under a CUDA graph: the fence waits for the writes just sent over NVLink.)
///
/// # Safety
/// `counter` holds `COUNTER_WORDS` live local words; `block < blocks <= MAX_BLOCKS`; every
/// block of the grid calls it once, after reading the counter; `value` not below it.
#[inline(always)]
pub(crate) unsafe fn advance_counter(
    counter: *mut u64,
    value: u64,
    thread: u32,
    threads: u32,
    block: u32,
    blocks: u32,
) {
    arch::sync_threads();
    if blocks == 1 {
        if thread == 0 {
            // SAFETY: word 0 (caller contract); no other block in this call, and this
            // block's threads read it before the barrier above.
            unsafe { core::ptr::write_volatile(counter, value) };
        }
        return;
    }
    let mut j = block as usize + blocks as usize * thread as usize;
    while j < super::MAX_BLOCKS {
        // SAFETY: copy j < MAX_BLOCKS (caller contract) is this block's alone in this call
        // (j % blocks == block); the block's threads read their copy before the barrier.
        unsafe { core::ptr::write_volatile(counter.add(1 + j), value) };
        j += blocks as usize * threads as usize;
    }
}

/// The data threads of the LL-packet calls (one-shot, all-gather packets, [`super::ll`]):
/// `(first unit, stride)` of thread `t` of block `b` in a grid of `nb` blocks of `nt`
/// threads. Block 0's first warp holds the descriptor threads ([`desc_thread`]) and carries
/// no data when the grid has more than one warp, so sending and checking the descriptor
/// never waits behind data: with data, the check's load came after the thread's last data
/// poll, one more memory latency at the end of every call (one-shot at 4 KB under a graph,
/// two ranks on one H200: 2.33 us with the descriptor warp idle against 2.90 with data on
/// it). The data threads are the grid's threads after that warp, in grid order (a thread
/// with no data gets `u64::MAX`, past every unit), so the host sizes the grid for
/// `units + 32` threads.
#[inline(always)]
pub(crate) fn data_threads(t: u32, nt: u32, b: u32, nb: u32) -> (u64, u64) {
    let (g, all) = (b * nt + t, nb * nt);
    let skip = if all > 32 { nt.min(32) } else { 0 };
    (
        if g >= skip {
            (g - skip) as u64
        } else {
            u64::MAX
        },
        (all - skip) as u64,
    )
}

/// The rank whose call descriptor thread `t` of block `b` sends and checks, if any: thread
/// `p` of block 0 for every peer `p` (the first warp, which [`data_threads`] keeps free of
/// data).
#[inline(always)]
pub(crate) fn desc_thread(ctx: &CollContext, t: u32, b: u32) -> Option<u32> {
    (b == 0 && t < ctx.nranks && t != ctx.rank).then_some(t)
}

/// One-shot all-reduce of `count` elements of `T` from `send` to `recv` (may be equal):
/// every rank sends its whole input to every peer as LL packets, and reduces what it
/// receives in rank order. Grid: at most `MAX_BLOCKS` blocks (traps otherwise) of any size
/// (GPUs launch at least `nranks` threads a block, the Host backend one thread); unit `i`
/// (8 bytes) belongs to the same data thread in both phases (`data_threads`), so in-place
/// is safe.
///
/// The packets' flag is the call's sequence number ([`Call`]) and the scratch half its
/// parity. The call descriptor (`count`, `tag`) travels as two more packets, sent by block
/// 0's first threads (thread `p` for rank `p`: `desc_thread`, in a warp that carries no
/// data when the grid has more than one warp); the same threads check the peers'
/// descriptors at the end, off the data's critical path. A data packet that is late makes
/// its poller look at the sender's descriptor too (with the abort word and the clock, every
/// `SLOW_POLLS` polls), so a rank waiting for data a peer of another size never sends stops
/// as soon as that descriptor is there. On a mismatch every rank records it (see
/// [`fault`]) and `recv` is undefined.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; the context valid, with
/// `count * T::SIZE <= one_shot_max_bytes(packets_len)`; `send`/`recv` valid for `count`
/// elements and aligned to `T::SIZE`.
#[inline(always)]
pub unsafe fn one_shot<T: Reduce>(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    count: u64,
    tag: u64,
    op: u32,
) {
    // SAFETY: first thing of every thread (launched with PDL by the host).
    unsafe { ctx.dependent_launch_entry() };
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let bytes = count * T::SIZE;
    let units = bytes.div_ceil(8);
    check_blocks(ctx, nb, nt);
    // SAFETY: b < MAX_BLOCKS; finish() below on every thread.
    let mut call = unsafe { ctx.call(b, count, tag) };
    let flag = call.flag();
    let half = packet_half(ctx.packets_len) * (call.seq & 1);
    let aligned = (send as usize | recv as usize).is_multiple_of(8);
    if units * 16 > packet_half(ctx.packets_len) {
        // More than a half of the packet scratch holds: never write past it.
        arch::trap();
    }
    let (first, stride) = data_threads(t, nt, b, nb);

    let mut i = first;
    while i < units {
        // SAFETY: i < units (send valid for bytes; the size contract for the packets).
        unsafe { send_unit(ctx, half, i, load_unit(send, i, bytes, aligned), flag) };
        i += stride;
    }
    if b == 0 {
        // The descriptors: thread p of block 0 for rank p (a block of fewer threads:
        // `for_ranks_of`).
        // SAFETY: the context valid (caller contract).
        unsafe { ctx.send_descs(&call, t) };
    }
    let mut i = first;
    while i < units {
        // SAFETY: as above; this thread has not written unit i of recv yet, and unit i
        // of recv is this thread's alone.
        unsafe {
            let own = load_unit(send, i, bytes, aligned);
            let acc = reduce_unit::<T>(ctx, &mut call, half, i, own, op);
            store_unit(recv, i, bytes, acc, aligned);
        }
        i += stride;
    }
    if b == 0 {
        // SAFETY: the context valid (caller contract). Waited for even after a failure of
        // this call (see `check_desc`).
        unsafe { ctx.check_descs(&mut call, t) };
    }
    // SAFETY: every thread of every block gets here.
    unsafe { ctx.finish(&call) };
}

/// The bare LL-packet exchange that one-shot all-reduce is made of, as a benchmark reference
/// (issue 18: the small all-reduce against the exchange alone, in one run): the same grid,
/// call counter, packet halves, flags and polls (with their clock and abort checks) as
/// [`one_shot`], without the call descriptors and the reduction in rank order. `recv` gets
/// the XOR of every rank's input, so that what arrives is used. Not a collective: it checks
/// nothing the ranks disagree on.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; the context valid with
/// `bytes.div_ceil(8) * 16 <= packet_half(packets_len)`; at most `MAX_BLOCKS` blocks of at
/// least `nranks` threads; `send`/`recv` valid for `bytes` (any alignment; may be equal).
#[inline(always)]
pub unsafe fn ll_exchange(ctx: &CollContext, send: *const u8, recv: *mut u8, bytes: u64, tag: u64) {
    // SAFETY: first thing of every thread (launched with PDL by the host).
    unsafe { ctx.dependent_launch_entry() };
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let units = bytes.div_ceil(8);
    check_grid(ctx, nb, nt);
    if units * 16 > packet_half(ctx.packets_len) {
        arch::trap();
    }
    // SAFETY: b < MAX_BLOCKS (checked); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, bytes, tag) };
    let flag = call.flag();
    let half = packet_half(ctx.packets_len) * (call.seq & 1);
    let aligned = (send as usize | recv as usize).is_multiple_of(8);
    let (first, stride) = (b as u64 * nt as u64 + t as u64, nb as u64 * nt as u64);
    let mut i = first;
    while i < units {
        // SAFETY: i < units (send valid for bytes; the size contract for the packets).
        unsafe { send_unit(ctx, half, i, load_unit(send, i, bytes, aligned), flag) };
        i += stride;
    }
    let mut i = first;
    while i < units {
        // SAFETY: as above; unit i of recv is this thread's alone, written after its read
        // of unit i of send (in place too).
        unsafe {
            let mut acc = load_unit(send, i, bytes, aligned);
            for q in 0..ctx.nranks {
                if q != ctx.rank {
                    acc ^= recv_unit(ctx, &mut call, half, i, q);
                }
            }
            store_unit(recv, i, bytes, acc, aligned);
        }
        i += stride;
    }
    // SAFETY: every thread of every block gets here.
    unsafe { ctx.finish(&call) };
}

/// Sends unit `i` of this rank's input (`d`) to every peer as an LL packet with `flag`, in
/// the packet half at byte `half`.
///
/// # Safety
/// The context valid; `half + 16 * i + 16 <= packets_len - DESC_BYTES`.
#[inline(always)]
pub(crate) unsafe fn send_unit(ctx: &CollContext, half: u64, i: u64, d: u64, flag: u32) {
    for k in 0..ctx.nranks {
        let p = rotated_rank(ctx.rank, ctx.nranks, i as u32, k);
        if p != ctx.rank {
            // SAFETY: within the peer's scratch for this rank, mapped here, accessed by
            // packets only (caller contract).
            unsafe {
                // Masked: no bounds check (and its panic path) in the kernel; p < nranks
                // <= MAX_RANKS anyway.
                let slot =
                    ctx.packets_out[p as usize & (MAX_RANKS - 1)].add((half + 16 * i) as usize);
                LlPacket::write(slot as *mut LlPacket, d, flag);
            }
        }
    }
}

/// The sum of unit `i` over the ranks, in rank order: `own` for this rank, the peers'
/// packets (polled inline; every `SLOW_POLLS` failed polls [`CollContext::keep_waiting`]
/// looks at the clock, the fault words and the peer's descriptor) for the others. After a
/// failed wait of the call, the peers' values are not waited for (the result is undefined
/// then).
///
/// # Safety
/// As for [`send_unit`].
#[inline(always)]
unsafe fn reduce_unit<T: Reduce>(
    ctx: &CollContext,
    call: &mut Call,
    half: u64,
    i: u64,
    own: u64,
    op: u32,
) -> u64 {
    let mut acc = 0u64;
    for q in 0..ctx.nranks {
        let v = if q == ctx.rank {
            own
        } else {
            // SAFETY: forwarded (caller contract), q a peer.
            unsafe { recv_unit(ctx, call, half, i, q) }
        };
        acc = if q == 0 { v } else { T::op8(op, acc, v) };
    }
    T::finish8(op, acc, ctx.nranks)
}

/// Unit `i` of rank `q`'s input, from the LL packet rank `q` wrote into this rank's packet
/// scratch (half at byte `half`) with the call's flag: polled inline; every `SLOW_POLLS`
/// failed polls [`CollContext::keep_waiting`] looks at the clock, the fault words and the
/// peer's descriptor. 0 once the call failed (the result is undefined then).
///
/// # Safety
/// As for [`send_unit`]; `q < nranks`, `q != rank`.
#[inline(always)]
pub(crate) unsafe fn recv_unit(
    ctx: &CollContext,
    call: &mut Call,
    half: u64,
    i: u64,
    q: u32,
) -> u64 {
    // SAFETY: this rank's scratch for rank q, same bounds as in `send_unit`, written by q.
    unsafe {
        let slot = ctx.packets_in[q as usize & (MAX_RANKS - 1)].add((half + 16 * i) as usize)
            as *const LlPacket;
        ctx.poll_packet(call, slot, call.flag(), q, fault::AT_PACKET)
    }
}

/// [`check_grid`] for the kernels that take blocks of any size on the host (all-reduce's;
/// see `for_ranks_of`): there only the number of blocks is checked.
#[inline(always)]
pub(crate) fn check_blocks(ctx: &CollContext, blocks: u32, threads: u32) {
    if blocks as usize > super::MAX_BLOCKS || (!arch::NARROW_BLOCKS && threads < ctx.nranks) {
        arch::trap();
    }
}

/// Traps unless the grid fits the semaphores and the call counter's copies (at most
/// `MAX_BLOCKS` blocks) and has a descriptor thread per rank (at least `nranks` threads per
/// block).
#[inline(always)]
pub(crate) fn check_grid(ctx: &CollContext, blocks: u32, threads: u32) {
    if blocks as usize > super::MAX_BLOCKS || threads < ctx.nranks {
        arch::trap();
    }
}

/// Elements `[start, start + len)` of rank chunk `q` clipped to `count`: `(first element,
/// elements)`.
#[inline(always)]
fn chunk_part(q: u64, chunk: u64, off: u64, len: u64, count: u64) -> (u64, u64) {
    let start = q * chunk + off;
    if start >= count {
        (start, 0)
    } else {
        (start, len.min(count - start))
    }
}

/// Loads element `i` (low `SIZE` bytes).
///
/// # Safety
/// `p` valid for element `i`, aligned to `T::SIZE`.
#[inline(always)]
unsafe fn load1<T: Reduce>(p: *const u8, i: u64) -> u64 {
    let i = i as usize;
    // SAFETY: caller contract.
    unsafe {
        match T::SIZE {
            8 => (p as *const u64).add(i).read(),
            4 => (p as *const u32).add(i).read() as u64,
            2 => (p as *const u16).add(i).read() as u64,
            _ => p.add(i).read() as u64,
        }
    }
}

/// Stores element `i`.
///
/// # Safety
/// As for [`load1`], writable.
#[inline(always)]
unsafe fn store1<T: Reduce>(p: *mut u8, i: u64, v: u64) {
    let i = i as usize;
    // SAFETY: caller contract.
    unsafe {
        match T::SIZE {
            8 => (p as *mut u64).add(i).write(v),
            4 => (p as *mut u32).add(i).write(v as u32),
            2 => (p as *mut u16).add(i).write(v as u16),
            _ => p.add(i).write(v as u8),
        }
    }
}

/// Reduces `len` elements of `srcs` (one source per rank, combined by `op` in rank order) into
/// `out` and, unless null, `reduced`. Threads of the block share the work; 16-byte vectors
/// (two per thread in flight) when every address is 16-byte aligned, elements otherwise
/// and for the tail.
///
/// # Safety
/// Every source valid for `len` elements and published to this block; `out` (and
/// `reduced` unless null) valid for `len` elements, written by this block only; all aligned
/// to `T::SIZE`.
#[inline(always)]
pub(crate) unsafe fn reduce_sources<T: Reduce>(
    srcs: &[*const u8],
    out: *mut u8,
    reduced: *mut u8,
    len: u64,
    thread: u32,
    op: u32,
) {
    let (t, nt) = (thread as u64, arch::block_dim_x() as u64);
    let n = srcs.len() as u32;
    let add = |a: [u64; 2], x: [u64; 2]| [T::op8(op, a[0], x[0]), T::op8(op, a[1], x[1])];
    let fin = |a: [u64; 2]| [T::finish8(op, a[0], n), T::finish8(op, a[1], n)];
    let per_vec = 16 / T::SIZE;
    let aligned = srcs
        .iter()
        .fold(out as usize | reduced as usize, |a, s| a | *s as usize)
        .is_multiple_of(16);
    let vectors = if aligned { len / per_vec } else { 0 };
    let store = |p: *mut u8, at: usize, v: [u64; 2]| {
        // SAFETY: 16 valid aligned bytes of an output (callers' bounds), this thread's own.
        unsafe { arch::st_weak_v2_u64(p.add(at) as *mut u64, v[0], v[1]) }
    };
    let mut v = t;
    while v < vectors {
        let second = v + nt < vectors;
        let (a1, a2) = ((v * 16) as usize, ((v + nt) * 16) as usize);
        let (mut acc1, mut acc2) = ([0u64; 2], [0u64; 2]);
        for (q, &p) in srcs.iter().enumerate() {
            // SAFETY: 16 valid aligned bytes at each offset (v, v + nt < vectors), published.
            let x1 = unsafe { arch::ld_weak_v2_u64(p.add(a1) as *const u64) };
            let x2 = if second {
                // SAFETY: as above.
                unsafe { arch::ld_weak_v2_u64(p.add(a2) as *const u64) }
            } else {
                [0; 2]
            };
            (acc1, acc2) = if q == 0 {
                (x1, x2)
            } else {
                (add(acc1, x1), add(acc2, x2))
            };
        }
        let (acc1, acc2) = (fin(acc1), fin(acc2));
        store(out, a1, acc1);
        if !reduced.is_null() {
            store(reduced, a1, acc1);
        }
        if second {
            store(out, a2, acc2);
            if !reduced.is_null() {
                store(reduced, a2, acc2);
            }
        }
        v += 2 * nt;
    }
    let mut i = vectors * per_vec + t;
    while i < len {
        let mut acc = 0u64;
        for (q, &p) in srcs.iter().enumerate() {
            // SAFETY: element i < len of a valid, element-aligned range.
            let x = unsafe { load1::<T>(p, i) };
            acc = if q == 0 { x } else { T::op1(op, acc, x) };
        }
        let acc = T::finish1(op, acc, n);
        // SAFETY: as above, this thread's own element.
        unsafe {
            store1::<T>(out, i, acc);
            if !reduced.is_null() {
                store1::<T>(reduced, i, acc);
            }
        }
        i += nt;
    }
}

/// [`reduce_sources`] out of line: the any-operation kernels call this one copy per type
/// (their reductions branch on the operation, which would otherwise be inlined into every
/// kernel and multiply the embedded PTX); the sum-only kernels inline theirs.
///
/// # Safety
/// As for [`reduce_sources`].
#[inline(never)]
pub(crate) unsafe fn reduce_sources_out<T: Reduce>(
    srcs: &[*const u8],
    out: *mut u8,
    reduced: *mut u8,
    len: u64,
    thread: u32,
    op: u32,
) {
    // On the CPU, a sum gets its own copy of the loop with the operation known, which the
    // compiler turns into vector adds (a 2 MB f32 sum of two sources: 350-420 us branching
    // on the operation per element, 185-225 us so, as fast as a plain loop). The GPU keeps
    // one copy: its loads, not the branch, are the cost there, and the PTX stays small.
    #[cfg(not(target_arch = "nvptx64"))]
    if op == super::op::SUM {
        // SAFETY: forwarded.
        return unsafe { reduce_sources::<T>(srcs, out, reduced, len, thread, super::op::SUM) };
    }
    // SAFETY: forwarded.
    unsafe { reduce_sources::<T>(srcs, out, reduced, len, thread, op) }
}

/// The two-shot (and all-pairs) reduction: rank `q`'s values are `own` for `q == rank`,
/// else rank `q`'s staged part at byte `slot_off` of a slot (`READ`: slot `rank` of rank
/// `q`'s scratch, read over NVLink; else slot `q` of this rank's scratch, put there by rank
/// `q`); the sum goes to `out` and to `reduced` (unless null).
///
/// # Safety
/// As for [`reduce_sources`]; scratch slots published to this block by a barrier.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn reduce_slots<T: Reduce, const READ: bool, const OUT: bool>(
    ctx: &CollContext,
    slot_bytes: u64,
    slot_off: u64,
    own: *const u8,
    out: *mut u8,
    reduced: *mut u8,
    len: u64,
    thread: u32,
    op: u32,
) {
    let (n, r) = (ctx.nranks, ctx.rank);
    let mut srcs = [core::ptr::null::<u8>(); super::MAX_RANKS];
    for (q, s) in srcs.iter_mut().enumerate().take(n as usize) {
        let q = q as u32;
        *s = if q == r {
            own
        } else if READ {
            ctx.peer_scratch[q as usize].wrapping_add((r as u64 * slot_bytes + slot_off) as usize)
        } else {
            ctx.scratch
                .wrapping_add((q as u64 * slot_bytes + slot_off) as usize)
        };
    }
    // SAFETY: forwarded.
    unsafe {
        if OUT {
            T::reduce_out(&srcs[..n as usize], out, reduced, len, thread, op)
        } else {
            reduce_sources::<T>(&srcs[..n as usize], out, reduced, len, thread, op)
        }
    }
}

/// Two-shot all-reduce of `count` elements of `T` from `send` to `recv` (may be equal).
///
/// The elements are cut into one chunk per rank (a multiple of 16 bytes each, the last ones
/// shorter or empty); rank `r` reduces chunk `r`. Two variants: `READ = false` puts each
/// peer's part of the input into that peer's scratch (NVLink writes) and reduces from the
/// own scratch; `READ = true` stages each peer's part in the own scratch (a local copy) and
/// reduces while reading the peers' staged parts over NVLink, so the reduction overlaps the
/// transfer. Chunks pass through the scratch in rounds
/// of one slot (`two_shot_slot`), each block owning one fixed share of every slot. Per round and
/// block: put the peers' shares of their chunks into their receive slots for this rank;
/// barrier; reduce the own share in rank order into `recv` and into the own reduced slot;
/// barrier; get the peers' reduced shares into `recv`. A last barrier ends the call with no
/// peer reading this rank's scratch. A rank overwrites its reduced slot only after the
/// peers' next barrier signal, which they send after reading it, and a peer's receive slot
/// only after the peer's second barrier signal of the round that read it.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; grid ≤ `MAX_BLOCKS` blocks
/// of any size; the context valid; `send`/`recv` valid for `count`
/// elements, aligned to `T::SIZE`; every rank calls it with the same `count` and grid.
#[inline(always)]
pub unsafe fn two_shot<T: Reduce, const READ: bool, const OUT: bool>(
    ctx: &CollContext,
    send: *const u8,
    recv: *mut u8,
    count: u64,
    tag: u64,
    op: u32,
) {
    let t = arch::thread_idx_x();
    let (b, nb) = (arch::block_idx_x(), arch::grid_dim_x());
    let (n, r) = (ctx.nranks as u64, ctx.rank);
    let es = T::SIZE;
    let per_vec = 16 / es;
    let chunk = count.div_ceil(n).next_multiple_of(per_vec);
    let slot_bytes = two_shot_slot(ctx.scratch_len, n);
    let slot = slot_bytes / es;
    let rounds = if slot == 0 { 0 } else { chunk.div_ceil(slot) };
    let reduced_base = n * slot_bytes;
    let nt = arch::block_dim_x();
    check_blocks(ctx, nb, nt);
    // SAFETY: b < MAX_BLOCKS (check_blocks); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, count, tag) };
    // SAFETY: every thread of every block. The first barrier checks the peers'
    // descriptors; on a mismatch (or failure) it returns false on every thread of the block
    // and nothing after it touches shared state.
    unsafe { ctx.begin_deferred(&mut call, b, t) };
    for j in 0..rounds {
        let (s, e) = round_share(slot, chunk, j, per_vec, b as u64, nb as u64);
        let off = j * slot + s;
        let scratch_off = s * es;
        for k in 0..ctx.nranks {
            let p = rotated_rank(r, ctx.nranks, b, k);
            if p != r {
                let (start, len) = chunk_part(p as u64, chunk, off, e - s, count);
                // SAFETY: the slot (READ: this rank's staging slot for rank p; else rank p's
                // receive slot for this rank) holds slot_bytes >= (e - s) * es from
                // scratch_off; send holds the chunk part (clipped to count).
                unsafe {
                    let dst = if READ {
                        ctx.scratch
                            .add((p as u64 * slot_bytes + scratch_off) as usize)
                    } else {
                        ctx.peer_scratch[p as usize]
                            .add((r as u64 * slot_bytes + scratch_off) as usize)
                    };
                    copy(dst, send.add((start * es) as usize), len * es, t, nt);
                }
            }
        }
        // SAFETY: every thread of the block; b < MAX_BLOCKS.
        if !unsafe { ctx.barrier(&mut call, b, t) } {
            break;
        }
        let (start, len) = chunk_part(r as u64, chunk, off, e - s, count);
        // SAFETY: ranges as above; the peers' puts were published by the barrier.
        unsafe {
            reduce_slots::<T, READ, OUT>(
                ctx,
                slot_bytes,
                scratch_off,
                send.add((start * es) as usize),
                recv.add((start * es) as usize),
                ctx.scratch.add((reduced_base + scratch_off) as usize),
                len,
                t,
                op,
            );
        }
        // SAFETY: every thread of the block.
        if !unsafe { ctx.barrier(&mut call, b, t) } {
            break;
        }
        for k in 0..ctx.nranks {
            let p = rotated_rank(r, ctx.nranks, b, k);
            if p != r {
                let (start, len) = chunk_part(p as u64, chunk, off, e - s, count);
                // SAFETY: the peer's reduced slot, published by the barrier; recv holds
                // the chunk part.
                unsafe {
                    let src =
                        ctx.peer_scratch[p as usize].add((reduced_base + scratch_off) as usize);
                    copy(recv.add((start * es) as usize), src, len * es, t, nt);
                }
            }
        }
    }
    if !call.failed {
        // SAFETY: every thread of the block (block-uniform condition).
        unsafe { ctx.barrier(&mut call, b, t) };
    }
    // SAFETY: every thread of every block gets here.
    unsafe { ctx.finish(&call) };
}

/// All-pairs all-reduce of `count` elements of `T` from `send` to `recv` (may be equal): every
/// rank puts its whole input into slot `rank` of every peer's scratch (NVLink writes, no packet
/// flags, so half the traffic of [`one_shot`]), then reduces all of it locally in rank order.
/// For mid sizes, where barriers cost more than the transfer.
///
/// It has its own scratch region, `[scratch_len, 2 * scratch_len)`, cut into two halves of one
/// slot (`scratch_len / 2 / nranks`) per rank. Rounds alternate between the halves by a round
/// counter that runs on across calls (the state's second counter, kept like [`one_shot`]'s call
/// counter, with no synchronisation between blocks). Each block owns one fixed share of every
/// slot. Per round and block: put the own share into every peer; barrier; reduce the share from
/// the own input and the peers' slots into `recv`. One barrier per round, and none at the end:
/// a peer writes a half again two rounds later, after the barrier of the round between, which
/// this block enters only once it has read that half. Between calls the grid may change, but a
/// call's kernel starts only after the previous one has passed its last barrier on this rank,
/// so every peer block has finished reading all but the last round's half, and the first round
/// of the new call uses the other one. The other algorithms use the first region and end with a
/// barrier, so nothing they do meets a peer still reading this one.
///
/// # Safety
/// Every thread of the grid calls it with the same arguments; grid ≤ `MAX_BLOCKS` blocks of any
/// size; the context valid (scratches of `2 * scratch_len` bytes);
/// `send`/`recv` valid for `count` elements, aligned to `T::SIZE`; every rank calls it with the
/// same `count` and grid, in the same sequence of calls.
#[inline(always)]
pub unsafe fn all_pairs<T: Reduce>(
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
    let es = T::SIZE;
    check_blocks(ctx, nb, nt);
    let slot_bytes = ctx.scratch_len / 2 / n as u64 / 16 * 16;
    let half_bytes = slot_bytes * n as u64;
    let slot = slot_bytes / es;
    let rounds = if slot == 0 { 0 } else { count.div_ceil(slot) };
    // SAFETY: the all-pairs round counter is the second of the state's two; b < MAX_BLOCKS
    // (check_blocks).
    let rounds_counter = unsafe { ctx.state.add(COUNTER_WORDS) };
    // SAFETY: as above.
    let base = unsafe { read_counter(rounds_counter, b) };
    // SAFETY: b < MAX_BLOCKS (check_blocks); finish() below on every thread.
    let mut call = unsafe { ctx.call(b, count, tag) };
    // SAFETY: every thread of every block; as in two_shot.
    unsafe { ctx.begin_deferred(&mut call, b, t) };
    for j in 0..rounds {
        let (s, e) = round_share(slot, count, j, 16 / es, b as u64, nb as u64);
        let off = j * slot + s;
        // Byte offset of this round's half in every scratch.
        let half = ctx.scratch_len + ((base + j) & 1) * half_bytes;
        // SAFETY: slot `r` of this round's half of each peer's region holds slot_bytes >=
        // (e - s) * es from s * es; send holds elements off..off + (e - s); no peer reads
        // this half's share now (see above).
        unsafe {
            let src = send.add((off * es) as usize);
            for k in 0..n {
                let p = rotated_rank(r, n, b, k);
                if p != r {
                    let at = half + r as u64 * slot_bytes + s * es;
                    copy(
                        ctx.peer_scratch[p as usize].add(at as usize),
                        src,
                        (e - s) * es,
                        t,
                        nt,
                    );
                }
            }
        }
        // SAFETY: every thread of the block.
        if !unsafe { ctx.barrier(&mut call, b, t) } {
            break;
        }
        // SAFETY: the peers' shares (slot q of this round's half of this rank's region)
        // were published by the barrier; recv holds the elements; in place, each element
        // is read before this thread writes it.
        unsafe {
            reduce_slots::<T, false, false>(
                ctx,
                slot_bytes,
                half + s * es,
                send.add((off * es) as usize),
                recv.add((off * es) as usize),
                core::ptr::null_mut(),
                e - s,
                t,
                op,
            );
        }
    }
    // Rounds done: all of them, or none on a mismatch (every rank's first barrier fails
    // alike, so the round counters stay equal; a call failed otherwise leaves the
    // collectives unusable anyway). `call.failed` is uniform over the grid then.
    let done = if call.failed { 0 } else { rounds };
    // SAFETY: every thread of the block; the counter as above.
    unsafe {
        advance_counter(rounds_counter, base + done, t, nt, b, nb);
        ctx.finish(&call);
    }
}
