//! The fault area of a communicator: the words that its host and its kernels both read and
//! write while kernels run (see `mscclpp_device::collectives::fault` for the layout).
//!
//! On a GPU it is mapped pinned host memory (the kernels read the abort word over PCIe, in
//! the slow path of their waits only; the host reads the records directly, without a stream
//! synchronisation); on the host backend it is plain memory. The host raises the abort word
//! on [`Communicator::abort`](super::Communicator::abort) and when the bootstrap reports a
//! lost rank (a hook on the bootstrap, so within milliseconds of the peer's death).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use mscclpp_device::collectives::{FAULT_WORDS, fault};

use crate::bootstrap::BlockingBootstrap;
use crate::cuda::{Gpu, MappedHostBuffer};

use super::CommError;

#[derive(Debug)]
enum Memory {
    Mapped(MappedHostBuffer),
    Host(Box<[AtomicU64]>),
}

/// Why a communicator was aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbortReason {
    /// A rank died (its bootstrap connection ended without a goodbye).
    Lost {
        /// The lost rank.
        rank: usize,
        /// What the bootstrap saw.
        detail: String,
    },
    /// [`Communicator::abort`](super::Communicator::abort) was called.
    Requested,
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // A rank behind a lost network may well be alive: say only that it is cut off.
            AbortReason::Lost { rank, detail } if crate::bootstrap::is_network_loss(detail) => {
                write!(f, "rank {rank} cannot be reached: {detail}")
            }
            AbortReason::Lost { rank, detail } => write!(f, "rank {rank} is gone: {detail}"),
            AbortReason::Requested => f.write_str("the communicator was aborted (abort())"),
        }
    }
}

/// The fault area and the host's side of an abort.
///
/// Past the [`FAULT_WORDS`] that the collectives use come one abort word per rank
/// ([`fault::PEER_ABORT`]), which the user handles to that rank look at: the host writes
/// the abort into all of them, and into rank `p`'s alone that `p` left after all of its
/// work had ended ([`fault::left_word`]; with TCP connections to `p`, once they have also
/// drained).
#[derive(Debug)]
pub(crate) struct FaultArea {
    mem: Memory,
    /// Ranks of the communicator (per-peer abort words).
    nranks: usize,
    reason: Mutex<Option<AbortReason>>,
    /// The rank of the collectives' group that left after the fewest calls, and those calls
    /// (what [`fault::LEFT`] holds, plus one).
    left: Mutex<Option<(usize, u64)>>,
    /// Per rank: what its "left" word waits for ([`note_peer_left`](Self::note_peer_left)).
    departures: Mutex<Vec<Departure>>,
    /// Settle passes asked of the proxy so far ([`settle_asked`](Self::settle_asked)).
    settle_asked: AtomicU64,
}

/// What the host knows of a peer's polite departure.
#[derive(Debug, Clone, Copy, Default)]
struct Departure {
    /// It said goodbye with all of its work ended.
    left: bool,
    /// It has TCP connections to this rank that it has not closed cleanly yet
    /// ([`FaultArea::await_drain`], [`FaultArea::note_peer_drained`]).
    undrained: bool,
    /// It writes over IB into staged buffers here, whose arrivals this rank's proxy
    /// delivers: its word waits for a settle pass that began after it left
    /// ([`FaultArea::await_settle`], [`FaultArea::note_settled`]).
    unsettled: bool,
    /// The settle pass asked for when it left (0: none asked).
    ticket: u64,
}

impl FaultArea {
    /// Zeroed fault words and `nranks` per-peer abort words: mapped pinned memory of
    /// `gpu`, or host memory.
    pub(crate) fn new(gpu: Option<&Gpu>, nranks: usize) -> Result<Arc<FaultArea>, CommError> {
        let words = FAULT_WORDS + nranks;
        let mem = match gpu {
            Some(g) => Memory::Mapped(MappedHostBuffer::alloc(g, words * 8)?),
            None => Memory::Host((0..words).map(|_| AtomicU64::new(0)).collect()),
        };
        Ok(Arc::new(FaultArea {
            mem,
            nranks,
            reason: Mutex::new(None),
            left: Mutex::new(None),
            departures: Mutex::new(vec![Departure::default(); nranks]),
            settle_asked: AtomicU64::new(0),
        }))
    }

    /// Raises the abort words when `bootstrap` reports a lost rank, and a rank's own word
    /// when it leaves with its work ended ([`note_peer_left`](Self::note_peer_left)), for as
    /// long as the area lives.
    pub(crate) fn watch(self: &Arc<Self>, bootstrap: &BlockingBootstrap) {
        let weak: Weak<FaultArea> = Arc::downgrade(self);
        bootstrap.as_async().on_peer_lost(move |rank, detail| {
            if let Some(area) = weak.upgrade() {
                area.abort(AbortReason::Lost {
                    rank,
                    detail: detail.to_string(),
                });
            }
        });
        let weak: Weak<FaultArea> = Arc::downgrade(self);
        bootstrap
            .as_async()
            .on_peer_departed(move |rank, work_ended| {
                if work_ended && let Some(area) = weak.upgrade() {
                    area.note_peer_left(rank);
                }
            });
    }

    /// The words as the host sees them (the fault words, then the per-peer abort words).
    fn words(&self) -> &[AtomicU64] {
        match &self.mem {
            Memory::Host(w) => w,
            // SAFETY: FAULT_WORDS + nranks live, 8-byte aligned words of pinned memory
            // owned by `self`; every host access is atomic, and kernels access them only
            // atomically or with volatile stores of whole words.
            Memory::Mapped(m) => unsafe {
                std::slice::from_raw_parts(
                    m.host_ptr() as *const AtomicU64,
                    FAULT_WORDS + self.nranks,
                )
            },
        }
    }

    /// The index in the area of `peer`'s abort word, which the user handles to `peer` look
    /// at ([`DevConn::with_abort_index`](mscclpp_device::channel::DevConn::with_abort_index);
    /// a memory channel's semaphore gets its address).
    pub(crate) fn peer_abort_index(&self, peer: usize) -> usize {
        assert!(peer < self.nranks, "peer {peer} of {} ranks", self.nranks);
        fault::PEER_ABORT + peer
    }

    /// Notes that `peer` left (said goodbye) after all of its work had ended, so that
    /// everything it wrote itself had landed: the user handles' waits for it give up once
    /// they have looked again ([`ChannelError::PeerLeft`](mscclpp_device::channel::ChannelError::PeerLeft)),
    /// at once where it has no TCP connection to this rank, else once it has closed all of
    /// them cleanly ([`note_peer_drained`](Self::note_peer_drained)): what it sent over TCP
    /// is written here by this rank's receivers, which may still be at work when the
    /// goodbye comes. An abort already in the word stays.
    pub(crate) fn note_peer_left(&self, peer: usize) {
        self.departure(peer, |d| {
            d.left = true;
            if d.unsettled && d.ticket == 0 {
                d.ticket = self.settle_asked.fetch_add(1, Ordering::AcqRel) + 1;
            }
        });
    }

    /// Notes that `peer` has IB connections into staged buffers of this rank (set up): its
    /// "left" word then also waits for the proxy to have delivered what arrived
    /// ([`note_settled`](Self::note_settled)).
    pub(crate) fn await_settle(&self, peer: usize) {
        self.departure(peer, |d| d.unsettled = true);
    }

    /// Settle passes asked for so far (the proxy's [`SettleHook`](crate::proxy::SettleHook)).
    pub(crate) fn settle_asked(&self) -> u64 {
        self.settle_asked.load(Ordering::Acquire)
    }

    /// Notes that the proxy finished a settle pass that began once `asked` passes had been
    /// asked for: every peer that left before is settled.
    pub(crate) fn note_settled(&self, asked: u64) {
        let mut all = self.departures.lock().unwrap_or_else(|e| e.into_inner());
        for (peer, d) in all.iter_mut().enumerate() {
            if d.ticket != 0 && d.ticket <= asked {
                d.unsettled = false;
                self.write_left(peer, d);
            }
        }
    }

    /// Notes that `peer` has TCP connections to this rank (set up): its "left" word then
    /// also waits for [`note_peer_drained`](Self::note_peer_drained).
    pub(crate) fn await_drain(&self, peer: usize) {
        self.departure(peer, |d| d.undrained = true);
    }

    /// Notes that `peer` closed every stream of every TCP connection to this rank between
    /// frames, after all it had sent was applied here (the proxy's
    /// [`DataPlane::take_drained`](crate::transport::DataPlane::take_drained)).
    pub(crate) fn note_peer_drained(&self, peer: usize) {
        self.departure(peer, |d| d.undrained = false);
    }

    /// Updates `peer`'s departure and writes its "left" word once it left and is drained.
    fn departure(&self, peer: usize, update: impl FnOnce(&mut Departure)) {
        if peer >= self.nranks {
            return;
        }
        let mut all = self.departures.lock().unwrap_or_else(|e| e.into_inner());
        let d = &mut all[peer];
        update(d);
        self.write_left(peer, d);
    }

    /// Writes `peer`'s "left" word if it left and nothing it sent is still on its way.
    fn write_left(&self, peer: usize, d: &Departure) {
        if d.left && !d.undrained && !d.unsettled {
            let _ = self.words()[self.peer_abort_index(peer)].compare_exchange(
                0,
                fault::left_word(peer as u32),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// The address kernels use (the device address of the mapping on a GPU).
    pub(crate) fn kernel_ptr(&self) -> *mut u64 {
        match &self.mem {
            Memory::Host(w) => w.as_ptr() as *mut u64,
            Memory::Mapped(m) => m.device_ptr() as *mut u64,
        }
    }

    /// Aborts: every wait of every kernel of this communicator gives up at its next look at
    /// the area (within microseconds on a GPU, a fraction of a millisecond on CPU threads).
    /// The first reason is kept.
    pub(crate) fn abort(&self, reason: AbortReason) {
        let word = match &reason {
            AbortReason::Lost { rank, .. } => 1 + *rank as u64,
            AbortReason::Requested => fault::ABORT_REQUESTED,
        };
        {
            let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                *r = Some(reason);
            }
        }
        let words = self.words();
        let _ = words[fault::ABORT].compare_exchange(0, word, Ordering::AcqRel, Ordering::Acquire);
        // The same word for the user handles, over a peer's "left" (an abort says more)
        // but not over an earlier abort.
        for w in &words[fault::PEER_ABORT..] {
            let mut old = w.load(Ordering::Acquire);
            // Retries only while another thread changes the word between the load and the
            // exchange; each retry sees a newer value, and an abort word ends it.
            while old == 0 || fault::left_rank(old).is_some() {
                match w.compare_exchange_weak(old, word, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => break,
                    Err(now) => old = now,
                }
            }
        }
    }

    /// Notes that `rank`, of the group whose kernels advance the collectives' call counter
    /// alike, left after `calls` calls: those kernels' waits in any later call give up
    /// ([`fault::LEFT`], lowered to the fewest calls of any rank that left).
    pub(crate) fn note_left(&self, rank: usize, calls: u64) {
        let mut l = self.left.lock().unwrap_or_else(|e| e.into_inner());
        if l.is_some_and(|(_, c)| c <= calls) {
            return;
        }
        *l = Some((rank, calls));
        self.words()[fault::LEFT].store(calls.saturating_add(1), Ordering::Release);
    }

    /// Notes that the rank at `index` of the group (the send/receive context's rank index)
    /// left with its work done: the send/receive waits for it give up once they have looked
    /// again ([`fault::LEFT_PEERS`]).
    pub(crate) fn note_left_peer(&self, index: usize) {
        if index < 64 {
            self.words()[fault::LEFT_PEERS].fetch_or(1 << index, Ordering::Release);
        }
    }

    /// The rank that left after the fewest calls, and those calls ([`note_left`](Self::note_left)).
    pub(crate) fn left(&self) -> Option<(usize, u64)> {
        *self.left.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks proxy channel `connection` as refused by the proxy (its bit
    /// [`fault::refused_bit`]); the proxy thread calls this before it publishes the flagged
    /// tail of the refused trigger.
    pub(crate) fn mark_proxy_refused(&self, connection: u32) {
        let (word, mask) = fault::refused_bit(connection);
        // Release: ordered before the proxy's later release store of the tail anyway; the
        // kernel reads the word after acquiring that tail.
        self.words()[word].fetch_or(mask, Ordering::Release);
    }

    /// Whether proxy channel `connection`'s refused bit is set (what its kernel-side sync
    /// looks at after a flagged tail).
    #[cfg(test)]
    pub(crate) fn is_proxy_refused(&self, connection: u32) -> bool {
        let (word, mask) = fault::refused_bit(connection);
        self.words()[word].load(Ordering::Acquire) & mask != 0
    }

    /// Clears the proxy's refused connections (when a proxy starts, with a clean FIFO tail).
    pub(crate) fn clear_proxy_refused(&self) {
        for w in &self.words()[fault::PROXY_REFUSED..][..fault::PROXY_REFUSED_WORDS] {
            w.store(0, Ordering::Release);
        }
    }

    /// Whether a cross-host step failed on this rank ([`fault::CROSS_BROKEN`]).
    pub(crate) fn cross_broken(&self) -> bool {
        self.words()[fault::CROSS_BROKEN].load(Ordering::Acquire) != 0
    }

    /// Why the communicator was aborted, if it was.
    pub(crate) fn abort_reason(&self) -> Option<AbortReason> {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The published record, if any: `(kind, seq, peer, own, theirs, place)`.
    pub(crate) fn record(&self) -> Option<FaultRecord> {
        let w = self.words();
        let kind = w[fault::RECORD].load(Ordering::Acquire);
        if kind == 0 {
            return None;
        }
        let get = |i: usize| w[i].load(Ordering::Relaxed);
        Some(FaultRecord {
            kind,
            seq: get(fault::SEQ),
            peer: get(fault::PEER) as usize,
            own: [get(fault::OWN), get(fault::OWN + 1)],
            theirs: [get(fault::THEIRS), get(fault::THEIRS + 1)],
            place: get(fault::PLACE),
        })
    }

    /// Clears a reported record, so that the next failure is recorded. Only while no kernel
    /// of the communicator runs (else a record being written may be lost).
    pub(crate) fn clear_record(&self) {
        let w = self.words();
        w[fault::RECORD].store(0, Ordering::Release);
        w[fault::CLAIM].store(0, Ordering::Release);
    }
}

/// A kernel's record of a failed call (see `mscclpp_device::collectives::fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FaultRecord {
    pub(crate) kind: u64,
    pub(crate) seq: u64,
    pub(crate) peer: usize,
    pub(crate) own: [u64; 2],
    pub(crate) theirs: [u64; 2],
    pub(crate) place: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection of a large rank (8 GPUs, 8 proxy lanes per peer: more than 64
    /// connections) has its own refused bit, and clearing clears them all.
    #[test]
    fn refused_bits_are_per_connection_beyond_64() {
        let area = FaultArea::new(None, 2).unwrap();
        area.mark_proxy_refused(70);
        assert!(area.is_proxy_refused(70));
        for id in (0..(64 * fault::PROXY_REFUSED_WORDS) as u32).filter(|&i| i != 70) {
            assert!(
                !area.is_proxy_refused(id),
                "connection {id} reads 70's refusal"
            );
        }
        area.mark_proxy_refused(3);
        area.mark_proxy_refused(255);
        area.clear_proxy_refused();
        for id in [3, 70, 255] {
            assert!(
                !area.is_proxy_refused(id),
                "{id} still refused after clearing"
            );
        }
        // The bits lie in the fault area, past every other word.
        let (first, _) = fault::refused_bit(0);
        let (last, _) = fault::refused_bit(u32::MAX);
        assert!(first > fault::CROSS_BROKEN && last < mscclpp_device::collectives::FAULT_WORDS);
    }

    /// A peer's "left" word is written at its goodbye when it has no TCP connection here,
    /// else only once it is also drained (in either order); an abort is not overwritten, and
    /// other ranks' words are not touched.
    #[test]
    fn a_left_word_waits_for_the_tcp_connections_to_drain() {
        let area = FaultArea::new(None, 4).unwrap();
        let word = |p: usize| area.words()[area.peer_abort_index(p)].load(Ordering::Acquire);
        let left = |p: usize| fault::left_word(p as u32);
        // No TCP: at the goodbye.
        area.note_peer_left(1);
        assert_eq!(word(1), left(1));
        // TCP, goodbye first: not until drained.
        area.await_drain(2);
        area.note_peer_left(2);
        assert_eq!(word(2), 0, "written before the TCP connections drained");
        area.note_peer_drained(2);
        assert_eq!(word(2), left(2));
        // TCP, drained first (the goodbye came late): at the goodbye.
        area.await_drain(3);
        area.note_peer_drained(3);
        assert_eq!(word(3), 0, "drained is no goodbye");
        area.note_peer_left(3);
        assert_eq!(word(3), left(3));
        assert_eq!(word(0), 0);
        // An abort wins over a left word, and a later left does not replace it.
        area.abort(AbortReason::Requested);
        area.note_peer_left(0);
        for p in 0..4 {
            assert_eq!(word(p), fault::ABORT_REQUESTED, "rank {p}");
        }
        // A rank out of range is ignored.
        area.note_peer_left(4);
        area.await_drain(9);
    }

    /// A peer writing into staged IB buffers here: its word waits for a settle pass that
    /// began after its goodbye (one that began before does not count), and with TCP too for
    /// both; a pass asked for once serves every peer that left before it.
    #[test]
    fn a_left_word_waits_for_a_settle_pass_begun_after_the_goodbye() {
        let area = FaultArea::new(None, 4).unwrap();
        let word = |p: usize| area.words()[area.peer_abort_index(p)].load(Ordering::Acquire);
        let left = |p: usize| fault::left_word(p as u32);
        area.await_settle(1);
        area.await_settle(2);
        area.await_settle(3);
        area.await_drain(3);
        assert_eq!(area.settle_asked(), 0);
        // A pass before anyone left settles nobody.
        area.note_settled(0);
        area.note_peer_left(1);
        assert_eq!(word(1), 0, "written before a settle pass");
        assert_eq!(area.settle_asked(), 1);
        area.note_peer_left(2);
        // Leaving twice asks once.
        area.note_peer_left(2);
        assert_eq!(area.settle_asked(), 2);
        // A pass that began when one had been asked for: rank 1 only.
        area.note_settled(1);
        assert_eq!((word(1), word(2)), (left(1), 0));
        area.note_settled(2);
        assert_eq!(word(2), left(2));
        // Settled but not drained: not yet.
        area.note_peer_left(3);
        area.note_settled(area.settle_asked());
        assert_eq!(word(3), 0, "written before the TCP connections drained");
        area.note_peer_drained(3);
        assert_eq!(word(3), left(3));
        assert_eq!(word(0), 0);
    }
}
