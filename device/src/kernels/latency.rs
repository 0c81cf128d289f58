//! Latency variants of the device semaphore and of LL packets (issue 18; design notes in
//! docs/guide/06-design.md §7), for `benches/memory_channel.rs`: one kernel per variant, so
//! each is compiled with only its own instructions, all run in one bench.
//!
//! # Semaphore ping-pongs
//!
//! [`VARIANTS`] lists them. Each is the round trip of `memory_signal_ping_pong` (rank 0
//! signals then waits, rank 1 waits then signals, `rounds` times, one block) on the
//! channel's own counters, with a *payload*: before signalling, the signalling side writes
//! one word per taking-part thread into the peer's buffer (words `0..n`, weak stores); after
//! its wait the other side reads its own words (weak loads) and counts those that are not
//! [`payload`] of that round into `errors[0]`. A variant whose signal and wait form a release
//! / acquire pair must count nothing ([`Variant::publishes`]); the others show what the
//! hardware reorders. Variants differ in:
//!
//! - how the signal publishes ([`Signal`]): the library's `red.release.sys`, a fence plus a
//!   relaxed add or store, `st.release.sys`, `atom.add.release.sys`, every thread fencing;
//! - how the wait polls ([`Wait`]): the library's wait, acquire polls with the clock read
//!   on every failed poll or never, relaxed polls with one fence after success;
//! - who takes part ([`Variant::block`]): thread 0 alone (launch one thread), or the whole
//!   block (each thread writes and checks its own word; a barrier before the signal and
//!   after the wait, as collectives do).
//!
//! Signals that store a count instead of adding 1 need one signaller per counter (true here:
//! thread 0 of one rank is the only writer of the peer's inbound counter); they start from
//! the peer's counter as read at kernel start, which only this side writes, so the library's
//! signals and these can follow each other on one channel.
//!
//! Waits that read no clock ([`Wait::NoClock`], [`Wait::RelaxedNoClock`]) give up after
//! [`MAX_POLLS`] failed polls instead (a trap, as the library's wait does at its timeout).
//!
//! # LL ping-pongs in MSCCL++'s shape
//!
//! [`memory_ll8_block_ping_pong`] and [`memory_ll16_block_ping_pong`]: one block, in round `r`
//! the sender's threads write the words of their own packets into `local[..bytes]` and send
//! them as LL8 or LL16 packets, the receiver's threads unpack and check them, and the block
//! barriers at the end of every round, as MSCCL++'s `MemoryChannelOneToOneTest`
//! `LL8PacketPingPong` / `LL16PacketPingPong` kernels do (4 KB each way, 1024 threads).

use crate::arch;
use crate::channel::MemoryChannel;
use crate::kernel;
use crate::kernels::memory_test::{report, sends};
use crate::packet::{self, Ll8Packet, LlPacket, Packet, flag_for_round};

/// Failed polls after which a wait that never reads the clock gives up and traps (over a
/// minute at 50 ns per poll; no legitimate round trip comes near it).
pub const MAX_POLLS: u64 = 1 << 30;

/// Most threads of a block variant (the payload words are `t < 1024`).
pub const MAX_BLOCK_THREADS: u32 = 1024;

/// How a semaphore variant publishes its payload and raises the peer's counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// `red.release.sys.global.add.u64` of 1: the library's `signal`.
    RedRelease,
    /// `red.relaxed.sys.global.add.u64` of 1: the library's `relaxed_signal` (publishes
    /// nothing).
    RedRelaxed,
    /// `fence.acq_rel.sys`, then `red.relaxed.sys.global.add.u64` of 1 (a release pattern).
    FenceRedRelaxed,
    /// `fence.acq_rel.sys`, then `st.relaxed.sys.u64` of the signaller's count (a release
    /// pattern).
    FenceStRelaxed,
    /// `st.release.sys.u64` of the signaller's count (MSCCL++'s `signal`).
    StRelease,
    /// `st.relaxed.sys.u64` of the count: the twin of the two store variants without their
    /// release (publishes nothing).
    StRelaxed,
    /// `atom.add.release.sys.u64` of 1: a release add that also waits for the old value.
    AtomRelease,
    /// Every taking-part thread runs `fence.acq_rel.sys` after its own payload store, the
    /// block barriers, thread 0 adds 1 with `red.relaxed.sys`. The hardware's fence waits for
    /// the thread's stores before the barrier lets thread 0 go, but under the PTX memory
    /// model a fence is a release pattern only with a strong write *of the same thread*
    /// after it, so this is ordered by the implementation, not by the model.
    EachThreadFence,
}

impl Signal {
    /// Whether it stores the signaller's count (one signaller per counter) instead of
    /// adding 1.
    pub const fn stores_count(self) -> bool {
        matches!(
            self,
            Signal::FenceStRelaxed | Signal::StRelease | Signal::StRelaxed
        )
    }
}

/// How a semaphore variant waits: which load polls and how often the clock is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The library's `wait`: `ld.acquire.sys` polls, the clock (and the abort word) after
    /// every 64 failed polls.
    Library,
    /// `ld.acquire.sys` polls, the clock read after every failed poll.
    ClockEveryPoll,
    /// `ld.acquire.sys` polls, never the clock: a trap after [`MAX_POLLS`] failed polls
    /// (MSCCL++'s wait counts spins the same way).
    NoClock,
    /// `ld.relaxed.sys` polls (the clock every 64), then one `fence.acq_rel.sys` once the
    /// count is there (an acquire pattern).
    RelaxedPollFence,
    /// `ld.relaxed.sys` polls, no fence, no clock (acquires nothing: the bare floor).
    RelaxedNoClock,
}

/// What a variant promises about the payload written before its signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publishes {
    /// A release pattern and an acquire pattern of the PTX memory model: the payload is
    /// seen every round; a mismatch is a bug.
    Release,
    /// Ordered by the hardware's implementation of fences and barriers, not by the model
    /// ([`Signal::EachThreadFence`]): mismatches are what the run shows.
    Hardware,
    /// Nothing: mismatches are the reordering the hardware shows.
    Nothing,
}

/// One semaphore variant: its kernel (`extern "ptx-kernel"` symbol with the arguments
/// `(ch, rounds, rank, seed, errors)`) and what it does.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// The kernel's name.
    pub kernel: &'static str,
    /// How it signals.
    pub signal: Signal,
    /// How it waits.
    pub wait: Wait,
    /// Whether the whole block takes part (launch up to [`MAX_BLOCK_THREADS`]) or thread 0
    /// only (launch one thread).
    pub block: bool,
    /// One line for the bench's table.
    pub what: &'static str,
}

impl Variant {
    /// What the payload may rely on with this signal and wait.
    pub const fn publishes(&self) -> Publishes {
        match (self.signal, self.wait) {
            (_, Wait::RelaxedNoClock) => Publishes::Nothing,
            (Signal::RedRelaxed | Signal::StRelaxed, _) => Publishes::Nothing,
            (Signal::EachThreadFence, _) => Publishes::Hardware,
            _ => Publishes::Release,
        }
    }

    /// The kernel of the relaxed floor this variant is compared with in the same run: the
    /// library's wait with `red.relaxed.sys` (today's `relaxed_signal`), one thread or the
    /// whole block like this variant.
    pub const fn floor_kernel(&self) -> &'static str {
        if self.block {
            "lat_sem_block_red_relaxed"
        } else {
            "lat_sem_red_relaxed"
        }
    }
}

const fn variant(
    kernel: &'static str,
    signal: Signal,
    wait: Wait,
    block: bool,
    what: &'static str,
) -> Variant {
    Variant {
        kernel,
        signal,
        wait,
        block,
        what,
    }
}

/// Every semaphore variant, in the bench's order: thread 0 alone first, then the block.
pub const VARIANTS: &[Variant] = &[
    variant(
        "lat_sem_red_release",
        Signal::RedRelease,
        Wait::Library,
        false,
        "red.release.sys + library wait (today's signal/wait)",
    ),
    variant(
        "lat_sem_red_relaxed",
        Signal::RedRelaxed,
        Wait::Library,
        false,
        "red.relaxed.sys + library wait (today's relaxed_signal: the floor)",
    ),
    variant(
        "lat_sem_fence_red_relaxed",
        Signal::FenceRedRelaxed,
        Wait::Library,
        false,
        "fence.acq_rel.sys + red.relaxed.sys",
    ),
    variant(
        "lat_sem_fence_st_relaxed",
        Signal::FenceStRelaxed,
        Wait::Library,
        false,
        "fence.acq_rel.sys + st.relaxed.sys of the count",
    ),
    variant(
        "lat_sem_st_release",
        Signal::StRelease,
        Wait::Library,
        false,
        "st.release.sys of the count",
    ),
    variant(
        "lat_sem_st_relaxed",
        Signal::StRelaxed,
        Wait::Library,
        false,
        "st.relaxed.sys of the count (no release)",
    ),
    variant(
        "lat_sem_atom_release",
        Signal::AtomRelease,
        Wait::Library,
        false,
        "atom.add.release.sys (waits for the old value)",
    ),
    variant(
        "lat_sem_relaxed_poll_fence",
        Signal::RedRelease,
        Wait::RelaxedPollFence,
        false,
        "red.release.sys; ld.relaxed.sys polls + fence.acq_rel.sys",
    ),
    variant(
        "lat_sem_clock_every_poll",
        Signal::RedRelease,
        Wait::ClockEveryPoll,
        false,
        "red.release.sys; acquire polls, clock every poll",
    ),
    variant(
        "lat_sem_no_clock",
        Signal::RedRelease,
        Wait::NoClock,
        false,
        "red.release.sys; acquire polls, no clock",
    ),
    variant(
        "lat_sem_st_release_no_clock",
        Signal::StRelease,
        Wait::NoClock,
        false,
        "st.release.sys; acquire polls, no clock (MSCCL++'s pair)",
    ),
    variant(
        "lat_sem_bare",
        Signal::RedRelaxed,
        Wait::RelaxedNoClock,
        false,
        "red.relaxed.sys; relaxed polls, no clock (no ordering at all)",
    ),
    variant(
        "lat_sem_block_red_release",
        Signal::RedRelease,
        Wait::Library,
        true,
        "block: barrier, thread 0 red.release.sys (today)",
    ),
    variant(
        "lat_sem_block_red_relaxed",
        Signal::RedRelaxed,
        Wait::Library,
        true,
        "block: barrier, thread 0 red.relaxed.sys (the block floor)",
    ),
    variant(
        "lat_sem_block_fence_red_relaxed",
        Signal::FenceRedRelaxed,
        Wait::Library,
        true,
        "block: barrier, thread 0 fence.acq_rel.sys + red.relaxed.sys",
    ),
    variant(
        "lat_sem_block_st_release",
        Signal::StRelease,
        Wait::Library,
        true,
        "block: barrier, thread 0 st.release.sys",
    ),
    variant(
        "lat_sem_block_each_fence",
        Signal::EachThreadFence,
        Wait::Library,
        true,
        "block: every thread fence.acq_rel.sys, barrier, thread 0 red.relaxed.sys",
    ),
];

/// The payload word thread `t` (< 1024) of `rank` sends in round `round` of a run with
/// `seed`: distinct for every round, thread and rank of one run, and, when runs use seeds
/// that differ in bits 48 and up (the bench's do), from every word an earlier run left.
#[inline(always)]
pub const fn payload(seed: u64, rank: u32, round: u64, t: u32) -> u64 {
    seed.wrapping_add((round << 11) | ((rank as u64 & 1) << 10) | (t as u64 & 0x3ff))
}

/// Raises the peer's counter at `remote` as `signal` does; `sent` is this side's count so
/// far (used and advanced by the store variants).
///
/// # Safety
/// `remote` is the peer's live inbound counter, written by this thread only when
/// `signal.stores_count()`.
#[inline(always)]
unsafe fn raise(signal: Signal, remote: *mut u64, sent: &mut u64) {
    // SAFETY (whole body): caller contract; every access is one atomic PTX instruction.
    unsafe {
        match signal {
            Signal::RedRelease => arch::red_add_release_sys_u64(remote, 1),
            // EachThreadFence: every thread fenced before the barrier.
            Signal::RedRelaxed | Signal::EachThreadFence => {
                arch::red_add_relaxed_sys_u64(remote, 1)
            }
            Signal::FenceRedRelaxed => {
                // Release pattern: a fence, then a strong write of this thread.
                arch::fence_acq_rel_sys();
                arch::red_add_relaxed_sys_u64(remote, 1);
            }
            Signal::FenceStRelaxed => {
                *sent += 1;
                arch::fence_acq_rel_sys();
                arch::st_relaxed_sys_u64(remote, *sent);
            }
            Signal::StRelease => {
                *sent += 1;
                arch::st_release_sys_u64(remote, *sent);
            }
            Signal::StRelaxed => {
                *sent += 1;
                arch::st_relaxed_sys_u64(remote, *sent);
            }
            Signal::AtomRelease => {
                arch::atomic_add_release_sys_u64(remote, 1);
            }
        }
    }
}

/// Waits as `wait` does for the next signal on the channel's semaphore (`inbound`,
/// `expected`: its counters) and consumes it; traps at the channel's timeout or after
/// [`MAX_POLLS`]. Every variant takes its ticket as the library's wait does (a GPU-scope
/// add to `expected`, before the first poll), so that variants differ from the library
/// only in how they poll.
///
/// # Safety
/// `inbound` and `expected` are the channel's semaphore counters, `expected` accessed only
/// atomically while shared.
#[inline(always)]
unsafe fn lower(wait: Wait, ch: &MemoryChannel<'_>, inbound: *const u64, expected: *mut u64) {
    if wait == Wait::Library {
        ch.wait();
        return;
    }
    let timeout_ns = ch.timeout_ns();
    // SAFETY: caller contract. Relaxed, GPU scope: the ticket orders nothing (as in the
    // library's wait; the polls below acquire or fence).
    let want = unsafe { arch::atomic_add_relaxed_gpu_u64(expected, 1) } + 1;
    let mut polls = 0u64;
    let mut start = None;
    loop {
        // SAFETY: caller contract.
        let got = unsafe {
            match wait {
                Wait::ClockEveryPoll | Wait::NoClock => arch::ld_acquire_sys_u64(inbound),
                _ => arch::ld_relaxed_sys_u64(inbound),
            }
        };
        if got >= want {
            break;
        }
        polls += 1;
        let clock = match wait {
            Wait::ClockEveryPoll => true,
            Wait::RelaxedPollFence => polls.is_multiple_of(64),
            _ => false,
        };
        if clock {
            let now = arch::global_timer_ns();
            let t0 = *start.get_or_insert(now);
            if now.wrapping_sub(t0) > timeout_ns {
                arch::trap();
            }
        } else if polls >= MAX_POLLS {
            arch::trap();
        }
        arch::spin_backoff(polls as u32);
    }
    if wait == Wait::RelaxedPollFence {
        // Acquire pattern: a strong read (the poll that saw the count), then a fence.
        arch::fence_acq_rel_sys();
    }
}

/// The body of every semaphore variant (see the [module](self)); `v` is a constant in each
/// kernel, so each compiles to its own instructions only.
#[inline(always)]
fn semaphore_ping_pong(
    ch: &MemoryChannel<'_>,
    rounds: u64,
    rank: u32,
    seed: u64,
    errors: *mut u64,
    v: Variant,
) {
    let t = arch::thread_idx_x();
    if arch::block_idx_x() != 0 || (!v.block && t != 0) {
        return;
    }
    let n = if v.block { arch::block_dim_x() } else { 1 };
    if n > MAX_BLOCK_THREADS || ch.remote_len() < 8 * n as u64 {
        arch::trap();
    }
    let mine = ch.local_range(0, 8 * n as u64) as *const u64;
    let theirs = ch.remote_ptr() as *mut u64;
    let (inbound, remote, expected) = ch.semaphore().counters();
    let mut sent = 0u64;
    if t == 0 && v.signal.stores_count() {
        // Only this side writes the peer's inbound counter: it holds every signal sent so far.
        // SAFETY: the channel's live counter.
        sent = unsafe { arch::ld_relaxed_sys_u64(remote) };
    }
    let mut bad = 0u64;
    for r in 1..=rounds {
        let send = |sent: &mut u64| {
            // SAFETY: word t < n of the peer's buffer (checked above); the peer reads it only
            // after this round's signal and writes its own buffer's words only.
            unsafe { theirs.add(t as usize).write(payload(seed, rank, r, t)) };
            if v.signal == Signal::EachThreadFence {
                arch::fence_acq_rel_sys();
            }
            if v.block {
                arch::sync_threads();
            }
            if t == 0 {
                // SAFETY: the channel's counter; thread 0 is its only writer on this side.
                unsafe { raise(v.signal, remote, sent) };
            }
        };
        let receive = |bad: &mut u64| {
            if t == 0 {
                // SAFETY: the channel's counters; thread 0 is the only waiter.
                unsafe { lower(v.wait, ch, inbound, expected) };
            }
            if v.block {
                arch::sync_threads();
            }
            // SAFETY: word t < n of this side's buffer (checked above); the peer wrote it
            // before the signal just consumed and writes it next after our next signal.
            let got = unsafe { mine.add(t as usize).read() };
            *bad += (got != payload(seed, rank ^ 1, r, t)) as u64;
        };
        if rank == 0 {
            send(&mut sent);
            receive(&mut bad);
        } else {
            receive(&mut bad);
            send(&mut sent);
        }
    }
    report(errors, bad);
}

/// Declares the kernel of `VARIANTS[$i]`, checking at compile time that the name matches.
macro_rules! semaphore_variant {
    ($name:ident, $i:expr) => {
        const _: () = assert!(str_eq(VARIANTS[$i].kernel, stringify!($name)));
        kernel! {
            /// A semaphore latency variant: see the [module](self) and its entry in
            /// [`VARIANTS`]. Arguments: the channel, round trips, this rank (0 or 1), the
            /// run's payload seed, and the mismatch counter (`errors[0]`).
            pub unsafe fn $name(ch: MemoryChannel<'_>, rounds: u64, rank: u32, seed: u64, errors: *mut u64) {
                semaphore_ping_pong(&ch, rounds, rank, seed, errors, VARIANTS[$i]);
            }
        }
    };
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

semaphore_variant!(lat_sem_red_release, 0);
semaphore_variant!(lat_sem_red_relaxed, 1);
semaphore_variant!(lat_sem_fence_red_relaxed, 2);
semaphore_variant!(lat_sem_fence_st_relaxed, 3);
semaphore_variant!(lat_sem_st_release, 4);
semaphore_variant!(lat_sem_st_relaxed, 5);
semaphore_variant!(lat_sem_atom_release, 6);
semaphore_variant!(lat_sem_relaxed_poll_fence, 7);
semaphore_variant!(lat_sem_clock_every_poll, 8);
semaphore_variant!(lat_sem_no_clock, 9);
semaphore_variant!(lat_sem_st_release_no_clock, 10);
semaphore_variant!(lat_sem_bare, 11);
semaphore_variant!(lat_sem_block_red_release, 12);
semaphore_variant!(lat_sem_block_red_relaxed, 13);
semaphore_variant!(lat_sem_block_fence_red_relaxed, 14);
semaphore_variant!(lat_sem_block_st_release, 15);
semaphore_variant!(lat_sem_block_each_fence, 16);

const _: () = assert!(VARIANTS.len() == 17);

crate::launch_bounds!(lat_sem_block_red_release, 1024);
crate::launch_bounds!(lat_sem_block_red_relaxed, 1024);
crate::launch_bounds!(lat_sem_block_fence_red_relaxed, 1024);
crate::launch_bounds!(lat_sem_block_st_release, 1024);
crate::launch_bounds!(lat_sem_block_each_fence, 1024);

/// Word `k` (bytes `4k..4k + 4`) of the LL ping-pongs' message of `(seed, round)`: the
/// round through an odd multiplier (so rounds differ modulo 2³²), the seed and the index.
#[inline(always)]
pub const fn ll_word(seed: u64, round: u64, k: u64) -> u32 {
    (seed as u32) ^ (round as u32).wrapping_mul(0x9e37_79b9) ^ (k as u32)
}

/// The message bytes `off..off + len` (`off`, `len` multiples of 4, `len <= 16`) as the two
/// little-endian words a packet chunk holds.
#[inline(always)]
fn ll_chunk(seed: u64, round: u64, off: u64, len: u64) -> [u64; 2] {
    let mut w = [0u64; 2];
    let mut q = 0;
    while q < len / 4 {
        w[(q / 2) as usize] |= (ll_word(seed, round, off / 4 + q) as u64) << (32 * (q % 2));
        q += 1;
    }
    w
}

/// The body of the LL ping-pongs in MSCCL++'s shape (see the [module](self)) with packets of
/// type `P`; `bytes` must be a multiple of 4 (traps otherwise).
#[inline(always)]
fn ll_block_ping_pong<P: Packet>(
    ch: &MemoryChannel<'_>,
    bytes: u64,
    rounds: u64,
    rank: u32,
    seed: u64,
    errors: *mut u64,
) {
    let (t, nt) = (arch::thread_idx_x(), arch::block_dim_x());
    if !bytes.is_multiple_of(4) {
        arch::trap();
    }
    let buf = ch.local_range(0, bytes);
    let mut bad = 0u64;
    for r in 1..=rounds {
        let flag = flag_for_round(r);
        // Thread t's chunks are exactly the data of its packets t, t + nt, ...: no barrier
        // is needed between writing them and sending them (nor receiving and checking).
        let mut i = t as u64;
        if sends(rank, r) {
            while i * P::DATA_BYTES < bytes {
                let off = i * P::DATA_BYTES;
                let len = (bytes - off).min(P::DATA_BYTES);
                // SAFETY: off + len <= bytes, checked against the buffer; this thread's chunk.
                unsafe {
                    packet::store_chunk(
                        buf.wrapping_add(off as usize),
                        len,
                        ll_chunk(seed ^ rank as u64, r, off, len),
                    )
                };
                i += nt as u64;
            }
            ch.put_packets_of::<P>(0, 0, bytes, t, nt, flag);
        } else {
            if ch
                .try_unpack_packets_of::<P>(0, 0, bytes, t, nt, flag, ch.timeout_ns())
                .is_err()
            {
                arch::trap();
            }
            while i * P::DATA_BYTES < bytes {
                let off = i * P::DATA_BYTES;
                let len = (bytes - off).min(P::DATA_BYTES);
                // SAFETY: as above; written by this thread's unpack.
                let got = unsafe { packet::load_chunk(buf.wrapping_add(off as usize), len) };
                bad += (got != ll_chunk(seed ^ (rank ^ 1) as u64, r, off, len)) as u64;
                i += nt as u64;
            }
        }
        arch::sync_threads();
    }
    report(errors, bad);
}

kernel! {
    /// LL8 ping-pong in MSCCL++'s shape (`kernelMemLL8PacketPingPong`): one block, `rounds`
    /// one-way rounds of `bytes` (a multiple of 4) as [`Ll8Packet`]s at offset 0 of the
    /// peer's scratch, one packet per thread per 4 bytes, a block barrier every round;
    /// wrong 4-byte chunks are added to `errors[0]`.
    pub unsafe fn memory_ll8_block_ping_pong(ch: MemoryChannel<'_>, bytes: u64, rounds: u64, rank: u32, seed: u64, errors: *mut u64) {
        ll_block_ping_pong::<Ll8Packet>(&ch, bytes, rounds, rank, seed, errors);
    }
}

kernel! {
    /// [`memory_ll8_block_ping_pong`] with [`LlPacket`]s (LL16: 8 data bytes per packet, so
    /// half the threads of a 1024-thread block send 4 KB), as
    /// `kernelMemLL16PacketPingPong`.
    pub unsafe fn memory_ll16_block_ping_pong(ch: MemoryChannel<'_>, bytes: u64, rounds: u64, rank: u32, seed: u64, errors: *mut u64) {
        ll_block_ping_pong::<LlPacket>(&ch, bytes, rounds, rank, seed, errors);
    }
}

crate::launch_bounds!(memory_ll8_block_ping_pong, 1024);
crate::launch_bounds!(memory_ll16_block_ping_pong, 1024);

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;
