//! [`MemoryChannel`]: one side of a memory channel (docs/guide/06-design.md §7). The peer's
//! buffer and packet scratch are mapped into this GPU, and the threads of a block move the
//! data themselves with loads and stores over NVLink/PCIe, synchronised by a
//! [`DeviceSemaphore`].
//!
//! # Operations
//!
//! - [`put`](MemoryChannel::put) (local → remote) and [`get`](MemoryChannel::get)
//!   (remote → local): bulk copies by all threads of a block;
//! - [`read`](MemoryChannel::read) / [`write`](MemoryChannel::write): one element of the
//!   remote buffer;
//! - [`put_packets`](MemoryChannel::put_packets) /
//!   [`unpack_packets`](MemoryChannel::unpack_packets): LL packets ([`crate::packet`]),
//!   data and flag together, for small messages without a signal;
//! - [`signal`](MemoryChannel::signal), [`relaxed_signal`](MemoryChannel::relaxed_signal),
//!   [`wait`](MemoryChannel::wait), [`poll`](MemoryChannel::poll): the semaphore (callable
//!   from any number of threads at once; concurrent waits each take a signal of their own:
//!   see "Threads and timeouts" in [`crate::semaphore`]).
//!
//! # Copies and visibility
//!
//! A copy is split among the `threads` threads of a partition (usually a block: `thread`
//! = `thread_idx_x()`, `threads` = `block_dim_x()`); each thread copies its own 16-byte
//! words, in no particular order, with weak loads and stores: nothing about a copy is
//! visible or ordered until a release publishes it. The contract is:
//!
//! ```text
//! sender block                          receiver block
//!   ch.put(dst, src, n, t, nt)            if t == 0 { ch.wait() }   // acquire
//!   sync_threads()                        sync_threads()
//!   if t == 0 { ch.signal() } // release  ... read local[dst..dst+n] ...
//! ```
//!
//! The barrier orders every thread's stores before thread 0's release add; the peer's
//! acquiring wait and its barrier order them before every thread's loads there. For
//! [`get`](MemoryChannel::get) the roles turn round: the owner of the data writes it,
//! barriers and signals; the getter waits, barriers, gets, and (before the owner may
//! overwrite the source) barriers and signals back, because the release also orders the
//! getter's *loads* before the owner's later stores. The sources of a put may be
//! overwritten once the put returns in every thread (a barrier).
//!
//! # Alignment
//!
//! Any offsets and sizes are correct. When the source and destination addresses are equal
//! modulo 16, the head bytes up to the first 16-byte boundary are copied byte by byte, the
//! middle with 16-byte vector loads and stores (four in flight per thread), and the tail
//! bytes byte by byte. Otherwise the copy uses the widest unit (8, 4, 2 or 1 bytes) in
//! which both addresses agree, which is correct but slower (down to one byte per access
//! when the addresses differ in parity); keep offsets 16-byte aligned for full speed.
//! Overlapping source and destination ranges (possible only when a channel's local and
//! remote buffers are the same memory) give unspecified bytes in the overlap.
//!
//! # Bounds
//!
//! Every operation checks its byte ranges against the lengths given at construction
//! (`offset + size <= len`, with overflow caught) and traps before touching memory if one
//! does not fit; packet scratch offsets must also be 16-byte aligned and flags non-zero.
//! A trap ends the kernel with an error the host sees, so bad offsets never write out of
//! bounds nor corrupt data silently. The lengths themselves are trusted: the host validates
//! them at setup.
//!
//! # Timeouts
//!
//! [`wait`](MemoryChannel::wait) and [`unpack_packets`](MemoryChannel::unpack_packets)
//! trap after the semaphore's timeout ([`timeout_ns`](MemoryChannel::timeout_ns));
//! [`wait_timeout`](MemoryChannel::wait_timeout) returns `false` and
//! [`try_unpack_packets`](MemoryChannel::try_unpack_packets) an error instead. The
//! semaphore's waits and the packet waits also give up when the communicator is aborted
//! ([`try_wait`](MemoryChannel::try_wait) and `try_unpack_packets` say which).

use core::fmt;
use core::marker::PhantomData;

use crate::arch;
use crate::packet::{self, LlPacket, Packet, check_partition};
use crate::semaphore::DeviceSemaphore;

/// One side of a memory channel, passed by value to kernels (`#[repr(C)]`, `Copy`). See
/// the [module](self) for the copy, visibility, alignment and bounds contracts.
///
/// `'a` is the lifetime of the memory the handle points at (buffers, scratches, counters):
/// a handle from `Communicator::memory_channels` borrows its communicator, so it cannot be
/// used after the communicator is dropped. The lifetime is a zero-sized marker; the layout
/// kernels see is unchanged.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemoryChannel<'a> {
    local: *mut u8,
    local_len: u64,
    remote: *mut u8,
    remote_len: u64,
    packets_in: *mut u8,
    packets_out: *mut u8,
    packets_len: u64,
    semaphore: DeviceSemaphore<'a>,
    _memory: PhantomData<&'a ()>,
}

const _: () = assert!(core::mem::size_of::<MemoryChannel<'static>>() == 96);

// SAFETY: addresses and numbers only; the memory behind them is accessed under the
// contracts of `from_raw_parts` and the module's protocol.
unsafe impl Send for MemoryChannel<'_> {}
// SAFETY: as above.
unsafe impl Sync for MemoryChannel<'_> {}

impl fmt::Debug for MemoryChannel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryChannel")
            .field("local", &self.local)
            .field("local_len", &self.local_len)
            .field("remote", &self.remote)
            .field("remote_len", &self.remote_len)
            .field("packets_in", &self.packets_in)
            .field("packets_out", &self.packets_out)
            .field("packets_len", &self.packets_len)
            .field("semaphore", &self.semaphore)
            .finish()
    }
}

/// Element types of [`MemoryChannel::read`] / [`MemoryChannel::write`]: plain data for
/// which every bit pattern is a valid value, so reading whatever the peer left in its buffer
/// is never undefined behaviour. Implemented for the integer and float types and arrays of
/// them.
///
/// # Safety
/// Implement it only for `Copy` types without padding for which every bit pattern of
/// `size_of::<Self>()` bytes is a valid value (e.g. a `#[repr(transparent)]` wrapper of a
/// `u16` holding an f16).
pub unsafe trait PlainData: Copy {}

macro_rules! plain_data {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive number: no padding, every bit pattern valid.
        unsafe impl PlainData for $t {}
    )*};
}
plain_data!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64
);
// SAFETY: an array of plain data has no padding between elements and every element is valid.
unsafe impl<T: PlainData, const N: usize> PlainData for [T; N] {}

/// `offset..offset + size` within `len` bytes, or a trap.
#[inline(always)]
fn check_range(offset: u64, size: u64, len: u64) {
    match offset.checked_add(size) {
        Some(end) if end <= len => {}
        _ => arch::trap(),
    }
}

/// A unit of a bulk copy: a naturally aligned load and store of `BYTES` bytes.
trait CopyUnit: Copy {
    const BYTES: u64;
    /// # Safety
    /// `p` valid for `BYTES` aligned bytes, not written concurrently.
    unsafe fn load(p: *const u8) -> Self;
    /// # Safety
    /// `p` valid for `BYTES` aligned bytes, not accessed concurrently.
    unsafe fn store(p: *mut u8, v: Self);
}

/// Sixteen bytes, moved with one vector load and one vector store.
#[derive(Clone, Copy)]
struct Vec16([u64; 2]);

impl CopyUnit for Vec16 {
    const BYTES: u64 = 16;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: forwarded (16 valid aligned bytes).
        Vec16(unsafe { arch::ld_weak_v2_u64(p as *const u64) })
    }
    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        // SAFETY: forwarded (16 valid aligned bytes).
        unsafe { arch::st_weak_v2_u64(p as *mut u64, v.0[0], v.0[1]) }
    }
}

macro_rules! plain_unit {
    ($($t:ty),*) => {$(
        impl CopyUnit for $t {
            const BYTES: u64 = core::mem::size_of::<$t>() as u64;
            #[inline(always)]
            unsafe fn load(p: *const u8) -> Self {
                // SAFETY: forwarded (valid aligned bytes, no racing write).
                unsafe { (p as *const $t).read() }
            }
            #[inline(always)]
            unsafe fn store(p: *mut u8, v: Self) {
                // SAFETY: forwarded (valid aligned bytes, no racing access).
                unsafe { (p as *mut $t).write(v) }
            }
        }
    )*};
}
plain_unit!(u64, u32, u16, u8);

/// Copies `count` units from `src` to `dst` (both aligned to `U::BYTES`), unit `i` by
/// thread `i % threads`, four units in flight per thread so loads overlap.
///
/// # Safety
/// Both ranges valid and aligned, not overlapping, not accessed concurrently by others.
#[inline(always)]
unsafe fn copy_units<U: CopyUnit>(
    dst: *mut u8,
    src: *const u8,
    count: u64,
    thread: u64,
    threads: u64,
) {
    let at = |p: *const u8, i: u64| p.wrapping_add((i * U::BYTES) as usize);
    let atm = |p: *mut u8, i: u64| p.wrapping_add((i * U::BYTES) as usize);
    let mut i = thread;
    // i + 3 * threads cannot overflow: count <= len / BYTES and threads < 2^32.
    while i + 3 * threads < count {
        // SAFETY: the four indices are < count (caller contract).
        unsafe {
            let a = U::load(at(src, i));
            let b = U::load(at(src, i + threads));
            let c = U::load(at(src, i + 2 * threads));
            let d = U::load(at(src, i + 3 * threads));
            U::store(atm(dst, i), a);
            U::store(atm(dst, i + threads), b);
            U::store(atm(dst, i + 2 * threads), c);
            U::store(atm(dst, i + 3 * threads), d);
        }
        i += 4 * threads;
    }
    while i < count {
        // SAFETY: i < count (caller contract).
        unsafe { U::store(atm(dst, i), U::load(at(src, i))) };
        i += threads;
    }
}

/// Copies `size` bytes from `src` to `dst` with the widest unit `U` both agree on:
/// head bytes up to `U`'s alignment, the middle in units, then the tail bytes.
///
/// # Safety
/// `(src as usize) % U::BYTES == (dst as usize) % U::BYTES`; both ranges valid, not
/// overlapping, not accessed concurrently by others.
#[inline(always)]
unsafe fn copy_aligned<U: CopyUnit>(
    dst: *mut u8,
    src: *const u8,
    size: u64,
    thread: u64,
    threads: u64,
) {
    let mis = (src as usize as u64) % U::BYTES;
    let head = if mis == 0 {
        0
    } else {
        (U::BYTES - mis).min(size)
    };
    let count = (size - head) / U::BYTES;
    let body = count * U::BYTES;
    let tail = size - head - body;
    // SAFETY: head, body and tail partition the valid ranges; after `head` bytes both
    // addresses are aligned to U::BYTES (equal residues).
    unsafe {
        copy_units::<u8>(dst, src, head, thread, threads);
        let (d, s) = (
            dst.wrapping_add(head as usize),
            src.wrapping_add(head as usize),
        );
        copy_units::<U>(d, s, count, thread, threads);
        let (d, s) = (d.wrapping_add(body as usize), s.wrapping_add(body as usize));
        copy_units::<u8>(d, s, tail, thread, threads);
    }
}

/// Copies of at least this many bytes by a block of one CPU thread go to `memcpy`
/// ([`copy`]); shorter ones stay inline.
#[cfg(not(target_arch = "nvptx64"))]
const HOST_MEMCPY_FROM: u64 = 256;

/// Block-cooperative copy of `size` bytes, any alignment (see the module's Alignment).
///
/// # Safety
/// Both ranges valid, not overlapping, not accessed concurrently by others; the partition
/// checked.
#[inline(always)]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, size: u64, thread: u32, threads: u32) {
    // A block of one CPU thread (the Host backend runs most kernels on the calling thread)
    // copies all but small ranges with the C library's memcpy, which uses the widest moves
    // the CPU has (Host backend, 2 ranks as 2 hosts on loopback: all-reduce from 32 KB
    // 0.85-0.94x the time of the 16-byte loop below).
    #[cfg(not(target_arch = "nvptx64"))]
    if threads == 1 && size >= HOST_MEMCPY_FROM {
        // SAFETY: caller contract (valid, not overlapping); this thread copies it all.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, size as usize) };
        return;
    }
    let (t, nt) = (thread as u64, threads as u64);
    // Low bits in which the two addresses differ decide the widest common unit.
    let diff = (src as usize ^ dst as usize) & 15;
    // SAFETY: forwarded; each branch's unit divides both residues equally.
    unsafe {
        if diff == 0 {
            copy_aligned::<Vec16>(dst, src, size, t, nt)
        } else {
            copy_misaligned(dst, src, size, t, nt, diff)
        }
    }
}

/// The paths of [`copy`] for buffers that differ in alignment mod 16. Kept out of line: inlined
/// next to the 16-byte path they multiplied the kernels' register demand (about 250 per
/// thread, which caps blocks at 256 threads).
///
/// # Safety
/// As for [`copy`]; `diff` is `(src ^ dst) & 15`, non-zero.
#[inline(never)]
unsafe fn copy_misaligned(dst: *mut u8, src: *const u8, size: u64, t: u64, nt: u64, diff: usize) {
    // SAFETY: forwarded; each branch's unit divides both residues equally.
    unsafe {
        if diff & 7 == 0 {
            copy_aligned::<u64>(dst, src, size, t, nt)
        } else if diff & 3 == 0 {
            copy_aligned::<u32>(dst, src, size, t, nt)
        } else if diff & 1 == 0 {
            copy_aligned::<u16>(dst, src, size, t, nt)
        } else {
            copy_units::<u8>(dst, src, size, t, nt)
        }
    }
}

impl<'a> MemoryChannel<'a> {
    /// Assembles a handle (the host's communicator does this). `local`: this rank's buffer;
    /// `remote`: the peer's buffer mapped into this GPU; `packets_in`: this rank's packet
    /// scratch (the peer writes packets into it); `packets_out`: the peer's packet scratch
    /// mapped here (this rank writes packets into it); `packets_len`: bytes of each scratch.
    ///
    /// # Safety
    /// Each pointer must be valid for its length (`local_len`, `remote_len`, `packets_len`
    /// for both scratches) while kernels use the handle (a length may be 0, with any
    /// pointer); the scratches must be 16-byte aligned, zeroed before first use and accessed
    /// only through packet functions while shared; `semaphore` must satisfy
    /// [`DeviceSemaphore::from_raw_parts`] and pair with the peer's channel. All must stay
    /// live for `'a` (the caller picks `'a`; nothing checks it).
    #[allow(clippy::too_many_arguments)] // the host side is coded against this signature
    pub unsafe fn from_raw_parts(
        local: *mut u8,
        local_len: u64,
        remote: *mut u8,
        remote_len: u64,
        packets_in: *mut u8,
        packets_out: *mut u8,
        packets_len: u64,
        semaphore: DeviceSemaphore<'a>,
    ) -> MemoryChannel<'a> {
        MemoryChannel {
            local,
            local_len,
            remote,
            remote_len,
            packets_in,
            packets_out,
            packets_len,
            semaphore,
            _memory: PhantomData,
        }
    }

    /// This rank's buffer.
    #[inline]
    pub fn local_ptr(&self) -> *mut u8 {
        self.local
    }

    /// The peer's buffer, mapped here.
    #[inline]
    pub fn remote_ptr(&self) -> *mut u8 {
        self.remote
    }

    /// This rank's packet scratch (the peer writes packets into it).
    #[inline]
    pub fn packets_in_ptr(&self) -> *mut u8 {
        self.packets_in
    }

    /// The peer's packet scratch, mapped here (this rank writes packets into it).
    #[inline]
    pub fn packets_out_ptr(&self) -> *mut u8 {
        self.packets_out
    }

    /// Bytes of the local buffer.
    #[inline]
    pub fn local_len(&self) -> u64 {
        self.local_len
    }

    /// Bytes of the remote buffer.
    #[inline]
    pub fn remote_len(&self) -> u64 {
        self.remote_len
    }

    /// Bytes of each packet scratch.
    #[inline]
    pub fn packets_len(&self) -> u64 {
        self.packets_len
    }

    /// The semaphore's timeout, in ns (for [`wait`](Self::wait) and
    /// [`unpack_packets`](Self::unpack_packets)).
    #[inline]
    pub fn timeout_ns(&self) -> u64 {
        self.semaphore.timeout_ns()
    }

    /// The channel's semaphore.
    #[inline]
    pub fn semaphore(&self) -> DeviceSemaphore<'a> {
        self.semaphore
    }

    /// The address of `local[offset..offset + size]`, after checking that the range fits
    /// (traps otherwise): for kernels that fill or read their own buffer directly.
    #[inline]
    pub fn local_range(&self, offset: u64, size: u64) -> *mut u8 {
        check_range(offset, size, self.local_len);
        self.local.wrapping_add(offset as usize)
    }

    /// Copies `local[src_offset..][..size]` to `remote[dst_offset..][..size]`; called by
    /// every thread of a partition (`thread` of `threads`) with the same arguments. Any
    /// alignment; ordered and made visible only by a barrier and a
    /// [`signal`](Self::signal) (module docs). Traps if a range does not fit or the
    /// partition is bad.
    #[inline]
    pub fn put(&self, dst_offset: u64, src_offset: u64, size: u64, thread: u32, threads: u32) {
        check_partition(thread, threads);
        check_range(src_offset, size, self.local_len);
        check_range(dst_offset, size, self.remote_len);
        // SAFETY: both ranges were checked against the buffers' lengths (constructor
        // contract); the protocol keeps others off them during the copy.
        unsafe {
            copy(
                self.remote.wrapping_add(dst_offset as usize),
                self.local.wrapping_add(src_offset as usize),
                size,
                thread,
                threads,
            )
        }
    }

    /// Copies `remote[src_offset..][..size]` to `local[dst_offset..][..size]`; as
    /// [`put`](Self::put) with the directions swapped. The peer's data must have been
    /// published to this block first (peer barrier + signal, [`wait`](Self::wait) here,
    /// then a barrier).
    #[inline]
    pub fn get(&self, dst_offset: u64, src_offset: u64, size: u64, thread: u32, threads: u32) {
        check_partition(thread, threads);
        check_range(src_offset, size, self.remote_len);
        check_range(dst_offset, size, self.local_len);
        // SAFETY: as in `put`.
        unsafe {
            copy(
                self.local.wrapping_add(dst_offset as usize),
                self.remote.wrapping_add(src_offset as usize),
                size,
                thread,
                threads,
            )
        }
    }

    /// Element `index` of the remote buffer viewed as an array of `T` (byte offset `index *
    /// size_of::<T>()`), with one weak load (unaligned positions are read byte by byte).
    /// Ordered like [`get`](Self::get). Traps if the element does not fit.
    ///
    /// `T` is [`PlainData`], so whatever bytes are there form a valid value.
    #[inline]
    pub fn read<T: PlainData>(&self, index: u64) -> T {
        let p = self.remote_element::<T>(index);
        // SAFETY: the element lies inside the remote buffer (checked); the caller's protocol
        // keeps writers off it; every bit pattern is a valid `T` (`PlainData`).
        unsafe {
            if (p as usize).is_multiple_of(core::mem::align_of::<T>()) {
                (p as *const T).read()
            } else {
                (p as *const T).read_unaligned()
            }
        }
    }

    /// Writes `v` to element `index` of the remote buffer viewed as an array of `T`, with one
    /// weak store (unaligned positions byte by byte). Ordered like [`put`](Self::put).
    /// Traps if the element does not fit.
    #[inline]
    pub fn write<T: PlainData>(&self, index: u64, v: T) {
        let p = self.remote_element::<T>(index);
        // SAFETY: the element lies inside the remote buffer (checked); the caller's protocol
        // keeps other accesses off it.
        unsafe {
            if (p as usize).is_multiple_of(core::mem::align_of::<T>()) {
                (p as *mut T).write(v)
            } else {
                (p as *mut T).write_unaligned(v)
            }
        }
    }

    #[inline(always)]
    fn remote_element<T>(&self, index: u64) -> *mut u8 {
        let size = core::mem::size_of::<T>() as u64;
        match index.checked_mul(size) {
            Some(off) => {
                check_range(off, size, self.remote_len);
                self.remote.wrapping_add(off as usize)
            }
            None => arch::trap(),
        }
    }

    /// Checks `offset..offset + scratch_bytes::<P>(size)` against the packet scratch and
    /// 16-byte alignment; traps otherwise.
    #[inline(always)]
    fn check_packets<P: Packet>(&self, offset: u64, size: u64) {
        match packet::scratch_bytes::<P>(size) {
            Some(bytes) if offset.is_multiple_of(16) => {
                check_range(offset, bytes, self.packets_len)
            }
            _ => arch::trap(),
        }
    }

    /// Sends `local[src_offset..][..size]` (any alignment and size) as [`LlPacket`]s with
    /// `flag` into the peer's scratch at byte `dst_offset` (a multiple of 16), taking
    /// [`scratch_bytes::<LlPacket>(size)`](packet::scratch_bytes) = 2 × `size` rounded up to
    /// 16 bytes there. Called by every thread of a partition with the same arguments; no
    /// signal is needed, the peer's [`unpack_packets`](Self::unpack_packets) waits for the
    /// flag. Traps if a range does not fit, the offset is misaligned, `flag` is 0 or the
    /// partition is bad.
    #[inline]
    pub fn put_packets(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        thread: u32,
        threads: u32,
        flag: u32,
    ) {
        self.put_packets_of::<LlPacket>(dst_offset, src_offset, size, thread, threads, flag);
    }

    /// [`put_packets`](Self::put_packets) with packets of type `P` (e.g.
    /// [`LlWidePacket`](crate::packet::LlWidePacket)); the peer must unpack the same type.
    #[inline]
    pub fn put_packets_of<P: Packet>(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        thread: u32,
        threads: u32,
        flag: u32,
    ) {
        check_range(src_offset, size, self.local_len);
        self.check_packets::<P>(dst_offset, size);
        // SAFETY: the source range and the packet slots were checked against the buffers
        // (constructor contract: 16-byte aligned scratch, packet-only access).
        unsafe {
            packet::pack::<P>(
                self.packets_out.wrapping_add(dst_offset as usize) as *mut P,
                self.local.wrapping_add(src_offset as usize),
                size,
                thread,
                threads,
                flag,
            )
        }
    }

    /// Receives `size` bytes into `local[dst_offset..]` (any alignment) from the
    /// [`LlPacket`]s the peer put at byte `src_offset` (a multiple of 16) of this rank's
    /// scratch, waiting for each to carry `flag`; traps if one has not arrived within the
    /// semaphore's timeout or the communicator is aborted first. Called by every thread of a
    /// partition with the same arguments; each thread waits only for its own packets, so a
    /// barrier is needed before other threads read the bytes. Traps on bad ranges, flag 0 or
    /// a bad partition.
    #[inline]
    pub fn unpack_packets(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        thread: u32,
        threads: u32,
        flag: u32,
    ) {
        let t = self.timeout_ns();
        if self
            .try_unpack_packets_of::<LlPacket>(
                dst_offset, src_offset, size, thread, threads, flag, t,
            )
            .is_err()
        {
            arch::trap();
        }
    }

    /// [`unpack_packets`](Self::unpack_packets) that returns instead of trapping when one of
    /// this thread's packets has not arrived within `timeout_ns`
    /// ([`ChannelError::Timeout`](super::ChannelError::Timeout)) or the communicator is
    /// aborted while it waits ([`ChannelError::Aborted`](super::ChannelError::Aborted)), or
    /// the peer left without sending them
    /// ([`ChannelError::PeerLeft`](super::ChannelError::PeerLeft)), within about twice
    /// [`ABORT_LOOK_NS`](crate::semaphore::ABORT_LOOK_NS) of the news (a packet wait reads
    /// the abort word only once it is that late, so that short waits cost nothing).
    /// The bytes of that packet and of this thread's later ones are then not written.
    /// Packets that are there are taken even after an abort. On a channel with an abort
    /// word (a communicator's), the time waited past the first `ABORT_LOOK_NS` counts
    /// against `timeout_ns` for all of this thread's packets together, not for each.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the block partition and flag are all needed
    pub fn try_unpack_packets(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        thread: u32,
        threads: u32,
        flag: u32,
        timeout_ns: u64,
    ) -> Result<(), super::ChannelError> {
        self.try_unpack_packets_of::<LlPacket>(
            dst_offset, src_offset, size, thread, threads, flag, timeout_ns,
        )
    }

    /// [`try_unpack_packets`](Self::try_unpack_packets) with packets of type `P`.
    #[inline]
    #[allow(clippy::too_many_arguments)] // the block partition and flag are all needed
    pub fn try_unpack_packets_of<P: Packet>(
        &self,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        thread: u32,
        threads: u32,
        flag: u32,
        timeout_ns: u64,
    ) -> Result<(), super::ChannelError> {
        check_range(dst_offset, size, self.local_len);
        self.check_packets::<P>(src_offset, size);
        // SAFETY: as in `put_packets_of`, for this rank's scratch and the local range; the
        // abort word null or live (the semaphore's contract).
        unsafe {
            packet::unpack_or_abort::<P>(
                self.local.wrapping_add(dst_offset as usize),
                self.packets_in.wrapping_add(src_offset as usize) as *const P,
                size,
                thread,
                threads,
                flag,
                timeout_ns,
                self.semaphore.abort_word(),
            )
        }
    }

    /// [`DeviceSemaphore::signal`]: a release add to the peer's counter. Call it from one
    /// thread after a block barrier to publish the block's puts.
    #[inline]
    pub fn signal(&self) {
        self.semaphore.signal();
    }

    /// [`DeviceSemaphore::relaxed_signal`]: an add that orders nothing.
    #[inline]
    pub fn relaxed_signal(&self) {
        self.semaphore.relaxed_signal();
    }

    /// [`DeviceSemaphore::wait`]: acquire-waits for the peer's next signal; traps after the
    /// timeout. Follow it with a block barrier before other threads read.
    #[inline]
    pub fn wait(&self) {
        self.semaphore.wait();
    }

    /// [`DeviceSemaphore::wait_timeout`].
    #[inline]
    pub fn wait_timeout(&self, timeout_ns: u64) -> bool {
        self.semaphore.wait_timeout(timeout_ns)
    }

    /// [`DeviceSemaphore::try_wait`]: gives up on the timeout or when the communicator is
    /// aborted, saying which.
    #[inline]
    pub fn try_wait(&self, timeout_ns: u64) -> Result<(), super::ChannelError> {
        self.semaphore.try_wait(timeout_ns)
    }

    /// [`DeviceSemaphore::poll`].
    #[inline]
    pub fn poll(&self) -> bool {
        self.semaphore.poll()
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
pub(crate) mod tests;
