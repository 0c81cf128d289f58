//! Why waits and calls give up, below everything that waits: the abort word and the fault
//! area a rank's host and kernels share, and [`ChannelError`], what a channel's or a
//! semaphore's wait returns.
//!
//! The fault area of a rank ([`CollContext::fault`](crate::collectives::CollContext::fault)): word indices and record kinds.
//!
//! The host writes [`ABORT`] (non-zero: stop every wait of every call now). Waits look
//! at the rank's [local fault words](crate::collectives::local_fault) in their slow path (every
//! [`SLOW_POLLS`](crate::collectives::SLOW_POLLS) failed polls, with the clock), and one waiting thread
//! of the rank at a time reads [`ABORT`] here at most every
//! [`HOST_LOOK_NS`](crate::collectives::local_fault::HOST_LOOK_NS), copying it locally once set. A
//! kernel whose wait fails (abort, timeout) or which finds that the ranks disagree about
//! the call records it once: the call's first failing thread swaps `seq + 1` into the
//! local [`STOP`](crate::collectives::local_fault::STOP) word, which makes the other waits of that
//! call on this rank give up, and adds 1 to [`CLAIM`]; if it saw 0 there, it writes
//! [`SEQ`], [`PEER`], [`OWN`], [`THEIRS`] and [`PLACE`], then publishes the kind in
//! [`RECORD`] with a release store. The host reads
//! [`RECORD`] (acquire) and the details after it, and clears a mismatch record (zeroing
//! [`RECORD`] then [`CLAIM`]) once reported; timeouts and aborts stay, and the looks at
//! [`ABORT`] treat them as one: the waits of every later call give up
//! ([`AFTER_FAILURE`](crate::collectives::local_fault::AFTER_FAILURE)).

use core::fmt;

/// Least time between two looks at the host's abort word by one waiting thread (a read of
/// mapped host memory is a PCIe round trip on a GPU).
pub const ABORT_LOOK_NS: u64 = 50_000;

/// `u64` words of the fault area.
pub const FAULT_WORDS: usize = PROXY_REFUSED + PROXY_REFUSED_WORDS;

/// Non-zero: abort every wait (written by the host: `1 + rank` of a lost rank, or
/// [`ABORT_REQUESTED`]).
pub const ABORT: usize = 0;
/// Unused (the stop word moved to [`STOP`](crate::collectives::local_fault::STOP), in the rank's own
/// memory); kept so the other indexes do not move.
pub const STOP: usize = 1;
/// Added to by every call of [`record`](crate::collectives::CollContext::record): by the one thread of
/// a failed call that claimed it in the local stop word, and by the direct callers; the
/// one that saw 0 writes the record.
pub const CLAIM: usize = 2;
/// The record's kind ([`TIMEOUT`], [`MISMATCH`], [`ABORTED`]), 0 for none; published
/// last, with release.
pub const RECORD: usize = 3;
/// The failed call's sequence number.
pub const SEQ: usize = 4;
/// The rank waited for (timeout) or that disagrees (mismatch).
pub const PEER: usize = 5;
/// Two words: this rank's call descriptor (`n`, tag; see [`desc`](crate::collectives::desc)).
pub const OWN: usize = 6;
/// Two words: the peer's call descriptor (mismatch).
pub const THEIRS: usize = 8;
/// What was waited for ([`AT_SEMAPHORE`], [`AT_PACKET`], [`AT_DESCRIPTOR`], [`AT_PROXY`]).
pub const PLACE: usize = 10;
/// Not used (it held the proxy's refused bits before they grew to
/// [`PROXY_REFUSED_WORDS`] words at [`PROXY_REFUSED`]).
pub const UNUSED_11: usize = 11;
/// Non-zero once a cross-host round ([`cross`](crate::collectives::cross)) failed on this rank:
/// every later round skips its work (the partners' rounds may no longer pair), and the
/// host reports the failure from then on.
pub const CROSS_BROKEN: usize = 12;
/// Non-zero once a rank of this context's group left (closed its communicator
/// politely) after `LEFT - 1` calls, the fewest of any that left: a call with a larger
/// or equal sequence number can never complete, so its waits give up (recorded as
/// [`ABORTED`] at [`AT_LEFT`]; contexts with [`guard::LEFT`](crate::collectives::guard::LEFT) only).
/// Written by the host once the rank's goodbye names its count; lowered, never raised.
pub const LEFT: usize = 13;
/// Bit `p` set once rank `p` of this context's group (its index in the group) left
/// (closed its communicator politely) after every piece of its GPU work had ended, so
/// that everything it wrote had landed before its goodbye: a wait for it that is still
/// unanswered after that is never answered (contexts with
/// [`guard::PEERS`](crate::collectives::guard::PEERS) give up, recorded as [`ABORTED`] at
/// [`AT_LEFT`]). Written by the host (bits only added).
pub const LEFT_PEERS: usize = 14;
/// The first of [`PROXY_REFUSED_WORDS`] words of bits of the proxy channels (`DevConn`)
/// whose triggers the proxy refused or failed: connection `id` has the bit
/// [`refused_bit`]`(id)`. Set by the proxy (atomic or) before it publishes a flagged
/// tail (`fifo::TAIL_FAULT`), or, without a flagged tail, when it finds the
/// connection's peer gone (nothing more can arrive from it); cleared by the host when it
/// starts a proxy.
pub const PROXY_REFUSED: usize = 16;
/// Words of refused bits: connections `0..64 * PROXY_REFUSED_WORDS` each have their own
/// bit (a rank of 8 GPUs with 8 proxy lanes per peer has more than 64 connections);
/// beyond that, ids share bits modulo that many (a refusal may then be reported on
/// another connection too).
pub const PROXY_REFUSED_WORDS: usize = 4;

/// Word (index in the fault area) and mask of connection `id`'s refused bit.
#[inline(always)]
pub const fn refused_bit(id: u32) -> (usize, u64) {
    let bit = id as usize % (64 * PROXY_REFUSED_WORDS);
    (PROXY_REFUSED + bit / 64, 1 << (bit % 64))
}
/// The host's value of [`ABORT`] for `Communicator::abort` (a lost rank `r` is `1 + r`).
pub const ABORT_REQUESTED: u64 = u64::MAX;
/// The first of the per-peer abort words, which follow the fault area's
/// [`FAULT_WORDS`] (one per rank of the communicator): rank `p`'s
/// is word `PEER_ABORT + p`. The user channels to `p` (`DevConn`, `MemoryChannel`)
/// look at it instead of [`ABORT`]. The host writes the value of [`ABORT`] into every
/// one of them when it aborts, and [`left_word`]`(p)` into `p`'s alone when `p` left
/// with all of its work ended.
pub const PEER_ABORT: usize = FAULT_WORDS;
/// Marks a per-peer abort word ([`PEER_ABORT`]) that says its rank left (below
/// [`ABORT_REQUESTED`], above any `1 + rank`).
pub const LEFT_MARK: u64 = 1 << 62;
/// The per-peer abort word that says `rank` left (closed its communicator politely)
/// after all of its work had ended: a wait for it still unanswered after the word was
/// read never will be.
#[inline(always)]
pub const fn left_word(rank: u32) -> u64 {
    LEFT_MARK | (1 + rank as u64)
}
/// The rank a [`left_word`] names; `None` for any other word.
#[inline(always)]
pub const fn left_rank(word: u64) -> Option<u32> {
    if word != ABORT_REQUESTED && word & LEFT_MARK != 0 {
        Some((word & !LEFT_MARK).wrapping_sub(1) as u32)
    } else {
        None
    }
}
/// A wait timed out.
pub const TIMEOUT: u64 = 1;
/// The ranks called different collectives (descriptors differ).
pub const MISMATCH: u64 = 2;
/// A wait saw the abort word.
pub const ABORTED: u64 = 3;
/// A semaphore wait (barrier, all-gather piece).
pub const AT_SEMAPHORE: u64 = 1;
/// An LL data packet (one-shot).
pub const AT_PACKET: u64 = 2;
/// A peer's call descriptor.
pub const AT_DESCRIPTOR: u64 = 3;
/// A proxy channel's signal.
pub const AT_PROXY: u64 = 4;
/// A send and a receive of different sizes found by this call (see
/// [`send_recv`](crate::collectives::send_recv)).
pub const AT_P2P: u64 = 5;
/// An earlier LL send of this rank that its receiver found of another size, reported
/// by a later send to that receiver (see [`send_recv`](crate::collectives::send_recv)).
pub const AT_P2P_EARLIER: u64 = 6;
/// Queueing a proxy channel's put (the FIFO stayed full for its timeout: the proxy
/// stopped serving), or the flush at the end of a proxy collective timing out.
pub const AT_PROXY_QUEUE: u64 = 7;
/// The flush at the end of a proxy collective: the proxy refused or failed one of the
/// call's puts (the host's proxy errors say which and why; recorded as [`ABORTED`]).
pub const AT_PROXY_FLUSH: u64 = 8;
/// A partner's round across hosts ([`cross`](crate::collectives::cross)): [`PEER`] is its host
/// index, [`OWN`] and [`THEIRS`] the two call descriptors of a mismatch.
pub const AT_CROSS: u64 = 9;
/// A partner across hosts at another round ([`cross`](crate::collectives::cross)): [`PEER`] is its
/// host index, word 0 of [`OWN`] and [`THEIRS`] the two rounds, word 1 the tags.
pub const AT_CROSS_ROUND: u64 = 10;
/// A send or receive with a rank on another host ([`remote_p2p`](crate::collectives::send_recv_proxy)): [`PEER`] is
/// that rank; a mismatch holds the two sizes as
/// [`p2p_desc`](crate::collectives::send_recv::p2p_desc)s.
pub const AT_REMOTE_P2P: u64 = 11;
/// A partner across hosts ([`cross`](crate::collectives::cross)) whose connection is gone: this
/// rank's put of its round to it was refused or failed by the proxy, or its round did
/// not come within a grace after the proxy found it gone. [`PEER`] is the partner's
/// host index; recorded as [`ABORTED`] only when no other wait failed and no partner's
/// round showed a mismatch (which says more).
pub const AT_CROSS_GONE: u64 = 12;
/// A wait of a call that a rank which left never made ([`LEFT`]; [`PEER`] is the rank
/// waited for, the host names the one that left), or, on the send/receive context, a
/// wait for a rank that left ([`LEFT_PEERS`]; [`PEER`] is that rank).
pub const AT_LEFT: u64 = 13;
/// A send or receive with a rank on another host ([`remote_p2p`](crate::collectives::send_recv_proxy)) whose
/// connection is gone: the proxy refused this rank's put to it, or found its streams
/// ended and what it sent before did not complete the operation within a grace (it
/// left, or its connection broke). [`PEER`] is that rank; recorded as [`ABORTED`].
pub const AT_REMOTE_P2P_GONE: u64 = 14;
/// A send or receive and a collective that cannot pair (recorded as [`ABORTED`]: the
/// collectives cannot be used any more): on the send/receive context, [`PEER`] is
/// inside collective call [`THEIRS`] (its descriptor) while this rank waits for it in
/// a send or receive ([`OWN`]); on the collectives' context, [`PEER`] waits in a send or
/// receive ([`THEIRS`], the send/receive group's descriptor it left in place of its
/// own) while this rank is in collective [`OWN`]. Each rank's calls run in order, so
/// neither can go on.
pub const AT_P2P_COLLECTIVE: u64 = 15;
/// This rank's own reduction of a round across hosts: the reducing blocks of its
/// [`cross_step`](crate::collectives::cross::cross_step) grid did not all finish within the
/// device timeout, or one gave up waiting for a piece, while every partner's payload had
/// come ([`PEER`] is this rank's host index). Nothing of a partner is at fault.
pub const AT_CROSS_REDUCE: u64 = 16;

/// Why a channel operation did not succeed (the `try_` methods of [`DevConn`](crate::channel::DevConn),
/// [`MemoryChannel`](crate::channel::MemoryChannel) and [`DeviceSemaphore`](crate::semaphore::DeviceSemaphore)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelError {
    /// The wait ran out of time.
    Timeout,
    /// The communicator was aborted: `word` is its abort word (`1 + rank` of a lost rank,
    /// or `u64::MAX` for `Communicator::abort`).
    Aborted {
        /// The abort word.
        word: u64,
    },
    /// The channel's peer left (closed its communicator politely) once all of its work
    /// had ended, and what this wait waits for had not arrived by then (looked at again
    /// after the news): it never will.
    PeerLeft {
        /// The rank that left.
        rank: u32,
    },
    /// The proxy refused a trigger of this connection (a put outside the buffers, an
    /// unknown connection id) or failed to carry one out; the host's
    /// `Communicator::proxy_errors` says which and why.
    ProxyRefused {
        /// The connection.
        connection: u32,
    },
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ChannelError::Timeout => f.write_str("the wait timed out"),
            ChannelError::Aborted { word: u64::MAX } => {
                f.write_str("the communicator was aborted (abort())")
            }
            ChannelError::Aborted { word } => {
                write!(f, "the communicator was aborted: rank {} is gone", word - 1)
            }
            ChannelError::PeerLeft { rank } => write!(
                f,
                "rank {rank} left (closed its communicator after its work ended) without \
                 sending what this wait waits for"
            ),
            ChannelError::ProxyRefused { connection } => write!(
                f,
                "the proxy refused or failed a trigger of connection {connection} (see the \
                 host's proxy errors)"
            ),
        }
    }
}

impl core::error::Error for ChannelError {}

impl ChannelError {
    /// The error a wait gives up with on seeing the non-zero abort word `word` of its
    /// channel: [`PeerLeft`](ChannelError::PeerLeft) for a
    /// [`left_word`], else
    /// [`Aborted`](ChannelError::Aborted).
    #[inline]
    pub fn from_abort_word(word: u64) -> ChannelError {
        match left_rank(word) {
            Some(rank) => ChannelError::PeerLeft { rank },
            None => ChannelError::Aborted { word },
        }
    }
}
