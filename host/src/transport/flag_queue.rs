//! [`FlagQueue`]: the ordering of CPU-stored flags behind copy-engine copies (the P2P
//! transport's `cpu` flag mode, [`ProxyFlagMode::Cpu`](super::p2p::ProxyFlagMode::Cpu)).
//!
//! In the `stream` mode the flag is a stream-ordered write after the copies, so the stream
//! orders it. In the `cpu` mode the proxy thread stores the flag itself, into host memory
//! that the peer GPU polls, and must first learn that every copy issued before the signal
//! has completed. This module is that bookkeeping, without any CUDA call of its own: the
//! engine behind it ([`CopyEngine`]) records completion *marks* (CUDA events on the proxy's
//! stream) and answers whether one is reached, so the logic runs, and is tested, on the
//! host with a fake engine.
//!
//! Rules (each one is a test in `flag_queue/tests.rs`):
//! - copies are counted as they are issued ([`FlagQueue::copied`]); a signal waits for
//!   every copy issued before it, on any connection (the seed's contract, the same as one
//!   stream gives);
//! - a signal with nothing outstanding (no copy issued since the last known completion, no
//!   signal waiting) is stored at once: no engine call at all;
//! - signals are stored in the order they were issued, never one before an earlier one
//!   (flags are epochs: a late store of an older epoch would move a counter backwards);
//! - marks are recorded lazily, at most one per [`FlagQueue::progress`] turn and only when a
//!   waiting signal is not covered by a mark yet, so a signal followed at once by a flush
//!   (the kernel's `signal` is FLAG|SYNC) costs no mark: the flush waits for the copies and
//!   stores the flag;
//! - [`FlagQueue::flush`] waits for every issued copy (only if one is outstanding) and then
//!   stores every waiting signal;
//! - when the engine fails to record or query a mark, the queue falls back to waiting for
//!   every copy (order kept while the engine still works); when the wait fails too, the
//!   copies are taken as ended and the signals behind them are still stored (the peer is
//!   not left waiting; the proxy records the error, as for a refused put); the error is
//!   returned either way.

use std::collections::VecDeque;

use super::TransportError;

/// What a [`FlagQueue`] needs from the copy engine.
pub(crate) trait CopyEngine {
    /// A completion mark (a recorded CUDA event).
    type Mark;
    /// Records a mark that is reached once every copy issued so far has completed.
    fn mark(&mut self) -> Result<Self::Mark, TransportError>;
    /// Whether `mark` is reached, without waiting.
    fn reached(&mut self, mark: &Self::Mark) -> Result<bool, TransportError>;
    /// Waits until every copy issued so far has completed.
    fn wait_all(&mut self) -> Result<(), TransportError>;
    /// Takes back a mark that is no longer needed (for reuse).
    fn recycle(&mut self, mark: Self::Mark) {
        drop(mark);
    }
}

/// A signal waiting for copies: store `epoch` at `addr` once `after` copies have completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Waiting {
    after: u64,
    addr: u64,
    epoch: u64,
}

/// Copies issued and completed, marks in flight and signals waiting (see the
/// [module](self)). `M` is the engine's mark type.
#[derive(Debug)]
pub(crate) struct FlagQueue<M> {
    /// Copies issued so far.
    issued: u64,
    /// Copies known to have completed (a prefix of the issued ones: the stream completes in
    /// order).
    done: u64,
    /// Marks in flight, oldest first, each with the number of copies it covers.
    marks: VecDeque<(u64, M)>,
    /// Signals waiting, oldest first (their `after` never decreases).
    waiting: VecDeque<Waiting>,
}

impl<M> Default for FlagQueue<M> {
    fn default() -> Self {
        FlagQueue {
            issued: 0,
            done: 0,
            marks: VecDeque::new(),
            waiting: VecDeque::new(),
        }
    }
}

impl<M> FlagQueue<M> {
    /// Counts a copy just issued on the engine.
    pub(crate) fn copied(&mut self) {
        self.issued += 1;
    }

    /// Signals waiting for copies.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether an issued copy is not yet known to have completed.
    pub(crate) fn outstanding(&self) -> bool {
        self.done < self.issued
    }

    /// Stores `epoch` at `addr` (through `store`) after every copy issued so far: at once
    /// when nothing is outstanding and no signal waits, else queued behind them.
    pub(crate) fn signal(&mut self, addr: u64, epoch: u64, store: &mut impl FnMut(u64, u64)) {
        if self.waiting.is_empty() && !self.outstanding() {
            store(addr, epoch);
        } else {
            self.waiting.push_back(Waiting {
                after: self.issued,
                addr,
                epoch,
            });
        }
    }

    /// One turn: records a mark if a waiting signal has none yet, takes the reached marks
    /// off and stores the signals they release. Returns whether a signal was stored or is
    /// still waiting (the proxy keeps spinning while one is).
    pub(crate) fn progress<E: CopyEngine<Mark = M>>(
        &mut self,
        engine: &mut E,
        store: &mut impl FnMut(u64, u64),
    ) -> Result<bool, TransportError> {
        let Some(last) = self.waiting.back().map(|w| w.after) else {
            return Ok(false);
        };
        let mut result = Ok(());
        let covered = self.marks.back().map_or(self.done, |(c, _)| *c);
        if covered < last {
            match engine.mark() {
                Ok(m) => self.marks.push_back((self.issued, m)),
                Err(e) => result = Err(e),
            }
        }
        while result.is_ok()
            && let Some((covers, m)) = self.marks.front()
        {
            let covers = *covers;
            match engine.reached(m) {
                Ok(false) => break,
                Ok(true) => self.retire_front(engine, covers),
                Err(e) => {
                    // The copies it covers ended (in error): release what waits on them.
                    self.retire_front(engine, covers);
                    result = Err(e);
                }
            }
        }
        if let Err(e) = result {
            // A failed mark or query: fall back to waiting for every copy (the order is
            // kept wherever the engine still works); if that fails too, the copies are
            // taken as ended, so the signals are stored and the peer is not left waiting.
            let _ = engine.wait_all();
            self.finish_all(engine, store);
            return Err(e);
        }
        let before = self.waiting.len();
        self.release(store);
        Ok(self.waiting.len() < before || !self.waiting.is_empty())
    }

    /// Waits for every issued copy if one is outstanding, then stores every waiting signal.
    /// On an engine error the signals are stored all the same and the error returned.
    pub(crate) fn flush<E: CopyEngine<Mark = M>>(
        &mut self,
        engine: &mut E,
        store: &mut impl FnMut(u64, u64),
    ) -> Result<(), TransportError> {
        let result = if self.outstanding() {
            engine.wait_all()
        } else {
            Ok(())
        };
        self.finish_all(engine, store);
        result
    }

    fn retire_front<E: CopyEngine<Mark = M>>(&mut self, engine: &mut E, covers: u64) {
        if let Some((_, m)) = self.marks.pop_front() {
            engine.recycle(m);
        }
        self.done = self.done.max(covers);
    }

    /// Takes every issued copy as complete: retires the marks, stores the signals.
    fn finish_all<E: CopyEngine<Mark = M>>(
        &mut self,
        engine: &mut E,
        store: &mut impl FnMut(u64, u64),
    ) {
        while let Some((_, m)) = self.marks.pop_front() {
            engine.recycle(m);
        }
        self.done = self.issued;
        self.release(store);
    }

    /// Stores the waiting signals whose copies have completed, in order.
    fn release(&mut self, store: &mut impl FnMut(u64, u64)) {
        while let Some(w) = self.waiting.front() {
            if w.after > self.done {
                break;
            }
            store(w.addr, w.epoch);
            self.waiting.pop_front();
        }
    }
}

#[cfg(test)]
mod tests;
