//! LL ("low latency") packets (docs/guide/06-design.md §7): data and a flag stored together, so
//! a reader that sees the flag has the data, with no separate signal and no fence.
//!
//! # Layouts
//!
//! [`LlPacket`], 16 bytes, 8 bytes of data (MSCCL++'s LL16 layout):
//!
//! | offset | 0..4    | 4..8  | 8..12   | 12..16 |
//! |--------|---------|-------|---------|--------|
//! | field  | `data0` | flag  | `data1` | flag   |
//!
//! `data0` holds data bytes 0..4, `data1` bytes 4..8 (the data as a little-endian `u64`
//! is `data0 | data1 << 32`). The writer stores the packet with one 16-byte
//! `st.volatile.global.v2.u64` of the two words `data0 | flag << 32` and
//! `data1 | flag << 32`; the reader loads it with one 16-byte `ld.volatile.global.v2.u64`
//! and accepts it only when *both* flags equal the flag it expects.
//!
//! [`Ll8Packet`], 8 bytes, 4 bytes of data (MSCCL++'s LL8 layout): `data` then the flag in
//! one word, stored with one `st.volatile.global.u64` and loaded with one
//! `ld.volatile.global.u64`; the flag and the data come from one single-copy atomic store.
//!
//! [`LlWidePacket`], 32 bytes, 16 bytes of data: two LL16 halves, `lo` carrying data bytes
//! 0..8 and `hi` bytes 8..16, each with its own copy of the flag, written with two 16-byte
//! stores and read with two 16-byte loads; valid when all four flags match. It takes the
//! same scratch per data byte (50 %) but moves twice the data per thread and instruction
//! pair.
//!
//! # Why a packet cannot be seen torn
//!
//! The PTX memory model treats a vector access as one access per element, in no particular
//! order: a 16-byte store is *not* promised to be seen whole. What it does promise is that
//! each naturally aligned 8-byte element of a volatile access (volatile has the semantics of
//! `relaxed.sys`) is single-copy atomic, and every 8-byte word of a packet holds 4 bytes of
//! data *and* a copy of the flag. A reader that sees the expected flag in a word therefore
//! sees that word's data from the same store; checking the flag of every word proves every
//! data byte belongs to the expected round, whatever order the words arrived in. No fence or
//! acquire is needed: nothing outside the packet is published by it.
//!
//! # Flags and reuse
//!
//! A flag is a `u32` that changes every time a packet slot is rewritten, so scratch buffers
//! are reused round after round without being cleared: a slot still holding an older round
//! carries an older flag and is not accepted. Flag `0` is never valid (fresh scratch is
//! zeroed, so a reader expecting 0 would accept it): writing or expecting it traps. Use
//! [`flag_for_round`] (rounds counted from 1) or [`next_flag`]; both run 1, 2, …,
//! `u32::MAX`, 1, … skipping 0.
//!
//! Wrap-around: after `u32::MAX` rounds a flag comes back. That is safe when every slot a
//! reader reads was rewritten at least once during the last `u32::MAX - 1` rounds (true when
//! every round uses the same slots, e.g. fixed-size messages). A slot left unwritten for
//! that long (e.g. the tail of a buffer only large messages reach) would hold a flag that
//! has come round again; the host must clear such scratch before the flags wrap.
//!
//! A writer may rewrite a slot (with the next flag) once its reader has consumed it, which it
//! learns through the peer's next packet or signal, as in NCCL's LL protocol. The accesses
//! involved are relaxed, so the PTX model alone does not forbid a load from being satisfied
//! by a store that causally depends on it (load buffering); like NCCL and MSCCL++ we rely on
//! the hardware not doing that. Even if it did, a reader could only see a *newer* flag, so
//! the failure mode is a timeout, never silent corruption.
//!
//! # Helpers
//!
//! [`pack`] and [`unpack`] move a byte range through packets with all threads of a block,
//! any size and alignment (the last packet is zero-padded); [`scratch_bytes`] says how
//! much scratch they need. Memory channels
//! ([`put_packets`](crate::channel::MemoryChannel::put_packets)) are built on them.

use crate::arch;
use crate::fault::ChannelError;
use crate::semaphore::ABORT_LOOK_NS;

/// The flag that is never valid (fresh scratch is zeroed).
pub const INVALID_FLAG: u32 = 0;

/// The flag after `flag`: `flag + 1`, with `u32::MAX` followed by 1 (0 is skipped).
#[inline(always)]
pub const fn next_flag(flag: u32) -> u32 {
    if flag == u32::MAX { 1 } else { flag + 1 }
}

/// The flag of round `round`, rounds counted from 1: 1, 2, …, `u32::MAX`, then 1 again
/// (never 0; round 0 gives `u32::MAX`, the flag before round 1's).
#[inline(always)]
pub const fn flag_for_round(round: u64) -> u32 {
    const CYCLE: u64 = u32::MAX as u64; // flags 1..=u32::MAX
    ((round.wrapping_add(CYCLE - 1)) % CYCLE) as u32 + 1
}

/// Traps on flag 0, which would match zeroed scratch.
#[inline(always)]
fn check_flag(flag: u32) {
    if flag == INVALID_FLAG {
        arch::trap();
    }
}

/// A word of a packet: 4 data bytes in the low half, the flag in the high half.
#[inline(always)]
const fn word(data: u32, flag: u32) -> u64 {
    data as u64 | (flag as u64) << 32
}

/// An LL16 packet: 8 data bytes and two copies of the flag, 16 bytes stored at once (see
/// the [module](self) for the layout and why it cannot be seen torn).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlPacket {
    /// Data bytes 0..4.
    pub data0: u32,
    /// The flag, first copy.
    pub flag0: u32,
    /// Data bytes 4..8.
    pub data1: u32,
    /// The flag, second copy.
    pub flag1: u32,
}

const _: () = assert!(core::mem::size_of::<LlPacket>() == 16);

impl LlPacket {
    /// The packet carrying `data` (bytes in little-endian order) with `flag`.
    #[inline(always)]
    pub const fn new(data: u64, flag: u32) -> LlPacket {
        LlPacket {
            data0: data as u32,
            flag0: flag,
            data1: (data >> 32) as u32,
            flag1: flag,
        }
    }

    /// The two 8-byte words as stored: `[data0 | flag0 << 32, data1 | flag1 << 32]`.
    #[inline(always)]
    pub const fn to_words(self) -> [u64; 2] {
        [word(self.data0, self.flag0), word(self.data1, self.flag1)]
    }

    /// The packet whose stored words are `w` (inverse of [`to_words`](Self::to_words)).
    #[inline(always)]
    pub const fn from_words(w: [u64; 2]) -> LlPacket {
        LlPacket {
            data0: w[0] as u32,
            flag0: (w[0] >> 32) as u32,
            data1: w[1] as u32,
            flag1: (w[1] >> 32) as u32,
        }
    }

    /// The 8 data bytes as a little-endian `u64`.
    #[inline(always)]
    pub const fn data(self) -> u64 {
        self.data0 as u64 | (self.data1 as u64) << 32
    }

    /// Whether both copies of the flag equal `flag`.
    #[inline(always)]
    pub const fn has_flag(self, flag: u32) -> bool {
        self.flag0 == flag && self.flag1 == flag
    }

    /// Stores `data` with `flag` at `p` with one 16-byte volatile store. Traps on flag 0.
    ///
    /// # Safety
    /// `p` must point to a live, 16-byte aligned packet slot in global memory that is only
    /// accessed through this module while shared.
    #[inline(always)]
    pub unsafe fn write(p: *mut LlPacket, data: u64, flag: u32) {
        check_flag(flag);
        let [lo, hi] = LlPacket::new(data, flag).to_words();
        // Volatile (relaxed.sys) 16-byte store: each word, data with its flag, is single-copy
        // atomic for the reader; nothing else needs ordering (module docs).
        // SAFETY: caller guarantees a live aligned global slot with atomic-only access.
        unsafe { arch::st_volatile_v2_u64(p as *mut u64, lo, hi) };
    }

    /// Loads the packet at `p` once: its data if both flags equal `flag`, else `None`.
    /// Traps on flag 0.
    ///
    /// # Safety
    /// As for [`write`](Self::write).
    #[inline(always)]
    pub unsafe fn read(p: *const LlPacket, flag: u32) -> Option<u64> {
        check_flag(flag);
        // Volatile (relaxed.sys) 16-byte load: each word whole; the flag check of both words
        // validates both data halves (module docs), so no acquire is needed.
        // SAFETY: caller guarantees a live aligned global slot with atomic-only access.
        let pk = LlPacket::from_words(unsafe { arch::ld_volatile_v2_u64(p as *const u64) });
        if pk.has_flag(flag) {
            Some(pk.data())
        } else {
            None
        }
    }

    /// Polls the packet at `p` until both flags equal `flag` and returns its data, or `None`
    /// once `timeout_ns` has passed without it. Traps on flag 0.
    ///
    /// # Safety
    /// As for [`write`](Self::write).
    #[inline(always)]
    pub unsafe fn poll(p: *const LlPacket, flag: u32, timeout_ns: u64) -> Option<u64> {
        // SAFETY: forwarded to the caller.
        unsafe { poll_words(p, flag, timeout_ns) }.map(|w| w[0])
    }
}

/// An LL8 packet (MSCCL++'s LL8 layout): 4 data bytes and one copy of the flag in one
/// 8-byte word, stored with one `st.volatile.global.u64` and loaded with one
/// `ld.volatile.global.u64`. The word is single-copy atomic, so a reader that sees the flag
/// has the data of the same store. It takes the same scratch per data byte as [`LlPacket`]
/// (8 bytes per 4) with one 8-byte access per packet, and gives a block of `n` threads one
/// packet each for `4 n` bytes, where LL16 leaves half of them idle.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ll8Packet {
    /// The 4 data bytes.
    pub data: u32,
    /// The flag.
    pub flag: u32,
}

const _: () = assert!(core::mem::size_of::<Ll8Packet>() == 8);

impl Ll8Packet {
    /// The packet carrying `data` with `flag`.
    #[inline(always)]
    pub const fn new(data: u32, flag: u32) -> Ll8Packet {
        Ll8Packet { data, flag }
    }

    /// The word as stored: `data | flag << 32`.
    #[inline(always)]
    pub const fn to_word(self) -> u64 {
        word(self.data, self.flag)
    }

    /// The packet whose stored word is `w` (inverse of [`to_word`](Self::to_word)).
    #[inline(always)]
    pub const fn from_word(w: u64) -> Ll8Packet {
        Ll8Packet {
            data: w as u32,
            flag: (w >> 32) as u32,
        }
    }

    /// Stores `data` with `flag` at `p` with one 8-byte volatile store. Traps on flag 0.
    ///
    /// # Safety
    /// `p` must point to a live, 8-byte aligned packet slot in global memory that is only
    /// accessed through this module while shared.
    #[inline(always)]
    pub unsafe fn write(p: *mut Ll8Packet, data: u32, flag: u32) {
        check_flag(flag);
        // Volatile (relaxed.sys) 8-byte store: single-copy atomic, data with its flag.
        // SAFETY: caller guarantees a live aligned global slot with atomic-only access.
        unsafe { arch::st_volatile_u64(p as *mut u64, Ll8Packet::new(data, flag).to_word()) };
    }

    /// Loads the packet at `p` once: its data if its flag equals `flag`, else `None`. Traps
    /// on flag 0.
    ///
    /// # Safety
    /// As for [`write`](Self::write).
    #[inline(always)]
    pub unsafe fn read(p: *const Ll8Packet, flag: u32) -> Option<u32> {
        check_flag(flag);
        // SAFETY: caller guarantees a live aligned global slot with atomic-only access.
        let pk = Ll8Packet::from_word(unsafe { arch::ld_volatile_u64(p as *const u64) });
        if pk.flag == flag { Some(pk.data) } else { None }
    }
}

/// A wide LL packet: 16 data bytes in two LL16 halves, each with its own flags, 32 bytes
/// written with two 16-byte stores (see the [module](self)).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlWidePacket {
    /// Data bytes 0..8.
    pub lo: LlPacket,
    /// Data bytes 8..16.
    pub hi: LlPacket,
}

const _: () = assert!(core::mem::size_of::<LlWidePacket>() == 32);

impl LlWidePacket {
    /// The packet carrying `data` (`data[0]` = bytes 0..8, little-endian) with `flag`.
    #[inline(always)]
    pub const fn new(data: [u64; 2], flag: u32) -> LlWidePacket {
        LlWidePacket {
            lo: LlPacket::new(data[0], flag),
            hi: LlPacket::new(data[1], flag),
        }
    }

    /// The 16 data bytes as two little-endian `u64`.
    #[inline(always)]
    pub const fn data(self) -> [u64; 2] {
        [self.lo.data(), self.hi.data()]
    }

    /// Whether all four copies of the flag equal `flag`.
    #[inline(always)]
    pub const fn has_flag(self, flag: u32) -> bool {
        self.lo.has_flag(flag) && self.hi.has_flag(flag)
    }

    /// Stores `data` with `flag` at `p` with two 16-byte volatile stores. Traps on flag 0.
    ///
    /// # Safety
    /// `p` must point to a live, 16-byte aligned 32-byte packet slot in global memory that
    /// is only accessed through this module while shared.
    #[inline(always)]
    pub unsafe fn write(p: *mut LlWidePacket, data: [u64; 2], flag: u32) {
        check_flag(flag);
        let p = p as *mut LlPacket;
        let [a, b] = LlPacket::new(data[0], flag).to_words();
        let [c, d] = LlPacket::new(data[1], flag).to_words();
        // Two volatile (relaxed.sys) 16-byte stores, in either order for the reader: every
        // word carries the flag (module docs).
        // SAFETY: caller guarantees 32 live aligned global bytes with atomic-only access.
        unsafe {
            arch::st_volatile_v2_u64(p as *mut u64, a, b);
            arch::st_volatile_v2_u64(p.add(1) as *mut u64, c, d);
        }
    }

    /// Loads the packet at `p` once: its data if all four flags equal `flag`, else `None`.
    /// Traps on flag 0.
    ///
    /// # Safety
    /// As for [`write`](Self::write).
    #[inline(always)]
    pub unsafe fn read(p: *const LlWidePacket, flag: u32) -> Option<[u64; 2]> {
        check_flag(flag);
        let p = p as *const LlPacket;
        // Two volatile 16-byte loads; the per-word flag check validates each data half.
        // SAFETY: caller guarantees 32 live aligned global bytes with atomic-only access.
        let (lo, hi) = unsafe {
            (
                LlPacket::from_words(arch::ld_volatile_v2_u64(p as *const u64)),
                LlPacket::from_words(arch::ld_volatile_v2_u64(p.add(1) as *const u64)),
            )
        };
        let pk = LlWidePacket { lo, hi };
        if pk.has_flag(flag) {
            Some(pk.data())
        } else {
            None
        }
    }

    /// Polls the packet at `p` until all flags equal `flag` and returns its data, or `None`
    /// once `timeout_ns` has passed without it. Traps on flag 0.
    ///
    /// # Safety
    /// As for [`write`](Self::write).
    #[inline(always)]
    pub unsafe fn poll(p: *const LlWidePacket, flag: u32, timeout_ns: u64) -> Option<[u64; 2]> {
        // SAFETY: forwarded to the caller.
        unsafe { poll_words(p, flag, timeout_ns) }
    }
}

/// A packet format usable by [`pack`] / [`unpack`] and memory channels: a fixed number of
/// data bytes (at most 16) validated by flags within the packet. Slots are aligned to the
/// packet's own alignment (16 bytes, 8 for [`Ll8Packet`]).
pub trait Packet: Copy {
    /// Data bytes per packet, 1..=16.
    const DATA_BYTES: u64;

    /// Stores a packet carrying the first [`DATA_BYTES`](Self::DATA_BYTES) bytes of `data`
    /// (little-endian words) with `flag`. Traps on flag 0.
    ///
    /// # Safety
    /// `p` must point to a live packet slot in global memory, aligned as `Self`, that is
    /// only accessed through packet functions while shared.
    unsafe fn write_words(p: *mut Self, data: [u64; 2], flag: u32);

    /// Loads the packet at `p` once: its data words (unused bytes zero) if every flag in it
    /// equals `flag`, else `None`. Traps on flag 0.
    ///
    /// # Safety
    /// As for [`write_words`](Self::write_words).
    unsafe fn read_words(p: *const Self, flag: u32) -> Option<[u64; 2]>;
}

impl Packet for LlPacket {
    const DATA_BYTES: u64 = 8;
    #[inline(always)]
    unsafe fn write_words(p: *mut Self, data: [u64; 2], flag: u32) {
        // SAFETY: forwarded to the caller.
        unsafe { LlPacket::write(p, data[0], flag) }
    }
    #[inline(always)]
    unsafe fn read_words(p: *const Self, flag: u32) -> Option<[u64; 2]> {
        // SAFETY: forwarded to the caller.
        unsafe { LlPacket::read(p, flag) }.map(|d| [d, 0])
    }
}

impl Packet for Ll8Packet {
    const DATA_BYTES: u64 = 4;
    #[inline(always)]
    unsafe fn write_words(p: *mut Self, data: [u64; 2], flag: u32) {
        // SAFETY: forwarded to the caller.
        unsafe { Ll8Packet::write(p, data[0] as u32, flag) }
    }
    #[inline(always)]
    unsafe fn read_words(p: *const Self, flag: u32) -> Option<[u64; 2]> {
        // SAFETY: forwarded to the caller.
        unsafe { Ll8Packet::read(p, flag) }.map(|d| [d as u64, 0])
    }
}

impl Packet for LlWidePacket {
    const DATA_BYTES: u64 = 16;
    #[inline(always)]
    unsafe fn write_words(p: *mut Self, data: [u64; 2], flag: u32) {
        // SAFETY: forwarded to the caller.
        unsafe { LlWidePacket::write(p, data, flag) }
    }
    #[inline(always)]
    unsafe fn read_words(p: *const Self, flag: u32) -> Option<[u64; 2]> {
        // SAFETY: forwarded to the caller.
        unsafe { LlWidePacket::read(p, flag) }
    }
}

/// Polls a packet until its flags equal `flag` (data words) or `timeout_ns` passes (`None`).
///
/// # Safety
/// As for [`Packet::write_words`].
#[inline(always)]
pub unsafe fn poll_words<P: Packet>(p: *const P, flag: u32, timeout_ns: u64) -> Option<[u64; 2]> {
    let mut start = None;
    let mut round = 0u32;
    loop {
        // SAFETY: forwarded to the caller.
        if let Some(d) = unsafe { P::read_words(p, flag) } {
            return Some(d);
        }
        // The timer is read only once the packet is late: the fast path is one load.
        let now = arch::global_timer_ns();
        let t0 = *start.get_or_insert(now);
        if now.wrapping_sub(t0) > timeout_ns {
            return None;
        }
        arch::spin_backoff(round);
        round = round.saturating_add(1);
    }
}

/// Bytes of packet scratch that `data_bytes` of data take as packets of type `P`
/// (`ceil(data_bytes / DATA_BYTES) * size_of::<P>()`); `None` on overflow.
#[inline(always)]
pub const fn scratch_bytes<P: Packet>(data_bytes: u64) -> Option<u64> {
    data_bytes
        .div_ceil(P::DATA_BYTES)
        .checked_mul(core::mem::size_of::<P>() as u64)
}

/// Reads `n` (1..=16) bytes at `src`, any alignment, as two little-endian words (bytes past
/// `n` zero), with the widest accesses the alignment allows. Never reads past `src + n`.
///
/// # Safety
/// `src..src + n` must be valid for reads and not written concurrently.
#[inline(always)]
pub(crate) unsafe fn load_chunk(src: *const u8, n: u64) -> [u64; 2] {
    let a = src as usize;
    if n == 16 && a.is_multiple_of(16) {
        // SAFETY: 16 valid aligned bytes (caller contract).
        let [lo, hi] = unsafe { arch::ld_weak_v2_u64(src as *const u64) };
        return [u64::from_le(lo), u64::from_le(hi)];
    }
    let mut w = [0u64; 2];
    let mut k = 0u64;
    while k < n {
        let p = src.wrapping_add(k as usize);
        let m = n - k;
        if m >= 8 {
            // SAFETY: 8 valid bytes at p (k + 8 <= n); unaligned reads are allowed.
            let v = unsafe {
                if (p as usize).is_multiple_of(8) {
                    (p as *const u64).read()
                } else {
                    (p as *const u64).read_unaligned()
                }
            };
            w[(k / 8) as usize] = u64::from_le(v);
            k += 8;
        } else {
            // SAFETY: p < src + n (caller contract).
            let b = unsafe { p.read() };
            w[(k / 8) as usize] |= (b as u64) << (8 * (k % 8));
            k += 1;
        }
    }
    w
}

/// Writes the first `n` (1..=16) bytes of the little-endian words `w` at `dst`, any
/// alignment, with the widest accesses the alignment allows. Never writes past `dst + n`.
///
/// # Safety
/// `dst..dst + n` must be valid for writes and not accessed concurrently.
#[inline(always)]
pub(crate) unsafe fn store_chunk(dst: *mut u8, n: u64, w: [u64; 2]) {
    let a = dst as usize;
    if n == 16 && a.is_multiple_of(16) {
        // SAFETY: 16 valid aligned bytes (caller contract).
        unsafe { arch::st_weak_v2_u64(dst as *mut u64, w[0].to_le(), w[1].to_le()) };
        return;
    }
    let mut k = 0u64;
    while k < n {
        let p = dst.wrapping_add(k as usize);
        let m = n - k;
        let v = w[(k / 8) as usize];
        if m >= 8 && k.is_multiple_of(8) {
            // SAFETY: 8 valid bytes at p (k + 8 <= n); unaligned writes are allowed.
            unsafe {
                if (p as usize).is_multiple_of(8) {
                    (p as *mut u64).write(v.to_le())
                } else {
                    (p as *mut u64).write_unaligned(v.to_le())
                }
            };
            k += 8;
        } else {
            // SAFETY: p < dst + n (caller contract).
            unsafe { p.write((v >> (8 * (k % 8))) as u8) };
            k += 1;
        }
    }
}

/// Checks the thread partition of a block-wide operation: `threads > 0`, `thread <
/// threads`; traps otherwise (a bad partition would silently skip data).
#[inline(always)]
pub(crate) fn check_partition(thread: u32, threads: u32) {
    if threads == 0 || thread >= threads {
        arch::trap();
    }
}

/// Sends `size` bytes at `src` (any alignment) as packets of type `P` with `flag` into
/// `dst[..ceil(size / P::DATA_BYTES)]`: packet `i` carries bytes `i * DATA_BYTES ..`, the
/// last one zero-padded. Thread `thread` of `threads` writes packets `thread`, `thread +
/// threads`, …; every thread of the partition must call it with the same arguments. Traps
/// on flag 0 or a bad partition.
///
/// # Safety
/// `src..src + size` must be valid for reads and not written concurrently; `dst` must point
/// to `ceil(size / P::DATA_BYTES)` live packet slots in global memory (the first one
/// 16-byte aligned),
/// accessed only through packet functions while shared.
#[inline(always)]
pub unsafe fn pack<P: Packet>(
    dst: *mut P,
    src: *const u8,
    size: u64,
    thread: u32,
    threads: u32,
    flag: u32,
) {
    check_partition(thread, threads);
    check_flag(flag);
    let n = size.div_ceil(P::DATA_BYTES);
    let mut i = thread as u64;
    while i < n {
        let off = i * P::DATA_BYTES;
        let len = if size - off < P::DATA_BYTES {
            size - off
        } else {
            P::DATA_BYTES
        };
        // SAFETY: off + len <= size, and packet i < n (caller contract).
        unsafe {
            let d = load_chunk(src.wrapping_add(off as usize), len);
            P::write_words(dst.wrapping_add(i as usize), d, flag);
        }
        i += threads as u64;
    }
}

/// Receives `size` bytes into `dst` (any alignment) from the packets of type `P` at `src`,
/// waiting for each of this thread's packets (`thread`, `thread + threads`, …) to carry
/// `flag`. Returns `false` as soon as one of them has not arrived within `timeout_ns` of
/// starting to wait for it (that packet's bytes and those of this thread's later packets are
/// not written); every thread of the partition must call it with the same arguments. Traps
/// on flag 0 or a bad partition.
///
/// # Safety
/// `dst..dst + size` must be valid for writes and not accessed concurrently; `src` must
/// point to `ceil(size / P::DATA_BYTES)` live packet slots (the first one 16-byte aligned)
/// in global memory, accessed only through packet functions while shared.
#[inline(always)]
pub unsafe fn unpack<P: Packet>(
    dst: *mut u8,
    src: *const P,
    size: u64,
    thread: u32,
    threads: u32,
    flag: u32,
    timeout_ns: u64,
) -> bool {
    check_partition(thread, threads);
    check_flag(flag);
    let n = size.div_ceil(P::DATA_BYTES);
    let mut i = thread as u64;
    while i < n {
        let off = i * P::DATA_BYTES;
        let len = if size - off < P::DATA_BYTES {
            size - off
        } else {
            P::DATA_BYTES
        };
        // SAFETY: packet i < n and off + len <= size (caller contract).
        match unsafe { poll_words(src.wrapping_add(i as usize), flag, timeout_ns) } {
            // SAFETY: as above.
            Some(d) => unsafe { store_chunk(dst.wrapping_add(off as usize), len, d) },
            None => return false,
        }
        i += threads as u64;
    }
    true
}

/// [`unpack`] whose waits also give up when the abort word `abort` (null: none) is non-zero:
/// [`ChannelError::Aborted`] within about twice [`ABORT_LOOK_NS`] of it, else
/// [`ChannelError::Timeout`] as [`unpack`] would return `false`, except that past the first
/// `ABORT_LOOK_NS` the time waited counts against `timeout_ns` for all of this thread's
/// packets together rather than for each.
///
/// For its first `ABORT_LOOK_NS` it is exactly [`unpack`]: the word (host memory) is read
/// only by a wait that is already that late, and then once per `ABORT_LOOK_NS`, in a cold
/// call that starts this thread's packets again from the first. The ones it took already
/// still carry `flag` (the writer rewrites a slot only once the reader has shown it
/// consumed it), so taking them again writes the same bytes. A packet that is there is
/// taken whatever the word says.
///
/// Why this shape (the memory_channel bench's LL ping-pong rows, one H200, two ranks under
/// MPS, against the code without the look): a look at the first late poll of every wait
/// made them 1.3-5.7x slower (a block of threads each reading host memory); a look inside
/// the poll loop that short waits skip cost 1-4%; one inlined unpack in a loop of 50 us
/// parts cost 7% at 8 bytes. This one measured 0.93-0.98x on the LL16 rows and 1.07x on
/// the LL8 block row.
///
/// # Safety
/// As for [`unpack`]; `abort` null or a live, aligned word written atomically.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // `unpack`'s arguments and the abort word
pub(crate) unsafe fn unpack_or_abort<P: Packet>(
    dst: *mut u8,
    src: *const P,
    size: u64,
    thread: u32,
    threads: u32,
    flag: u32,
    timeout_ns: u64,
    abort: *const u64,
) -> Result<(), ChannelError> {
    let first = if abort.is_null() {
        timeout_ns
    } else {
        timeout_ns.min(ABORT_LOOK_NS)
    };
    // SAFETY: forwarded to the caller.
    if unsafe { unpack(dst, src, size, thread, threads, flag, first) } {
        return Ok(());
    }
    if first == timeout_ns {
        return Err(ChannelError::Timeout);
    }
    // SAFETY: forwarded to the caller.
    unsafe {
        unpack_late(
            dst,
            src,
            size,
            thread,
            threads,
            flag,
            timeout_ns - first,
            abort,
        )
    }
}

/// The rest of an [`unpack_or_abort`] that is [`ABORT_LOOK_NS`] late (`timeout_ns`: what is
/// left of its timeout).
///
/// # Safety
/// As for [`unpack_or_abort`], with `abort` not null.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)] // `unpack`'s arguments and the abort word
unsafe fn unpack_late<P: Packet>(
    dst: *mut u8,
    src: *const P,
    size: u64,
    thread: u32,
    threads: u32,
    flag: u32,
    mut timeout_ns: u64,
    abort: *const u64,
) -> Result<(), ChannelError> {
    loop {
        // Acquire: a word that says the peer left is written after the host learnt that
        // every packet the peer sent had landed; the last look below must see them.
        // SAFETY: `abort` live, aligned and written atomically (caller contract).
        let word = unsafe { arch::ld_acquire_sys_u64(abort) };
        if word != 0 {
            // One last look (no waiting): packets that are there are taken.
            // SAFETY: forwarded to the caller.
            if unsafe { unpack(dst, src, size, thread, threads, flag, 0) } {
                return Ok(());
            }
            return Err(ChannelError::from_abort_word(word));
        }
        let part = timeout_ns.min(ABORT_LOOK_NS);
        // SAFETY: forwarded to the caller.
        if unsafe { unpack(dst, src, size, thread, threads, flag, part) } {
            return Ok(());
        }
        timeout_ns -= part;
        if timeout_ns == 0 {
            return Err(ChannelError::Timeout);
        }
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;
