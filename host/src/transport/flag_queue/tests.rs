use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::cuda::CudaError;

fn engine_error(what: &str) -> TransportError {
    TransportError::Cuda(CudaError::InvalidArgument(what.into()))
}

/// A copy engine the test drives by hand: `completed` copies have finished; a mark is the
/// number of copies issued when it was recorded.
#[derive(Debug, Default)]
struct Hand {
    issued: u64,
    completed: u64,
    marks: usize,
    queries: usize,
    waits: usize,
    recycled: Vec<u64>,
    fail_mark: bool,
    fail_query: bool,
    fail_wait: bool,
}

impl CopyEngine for Hand {
    type Mark = u64;
    fn mark(&mut self) -> Result<u64, TransportError> {
        if self.fail_mark {
            return Err(engine_error("mark"));
        }
        self.marks += 1;
        Ok(self.issued)
    }
    fn reached(&mut self, mark: &u64) -> Result<bool, TransportError> {
        self.queries += 1;
        if self.fail_query {
            return Err(engine_error("query"));
        }
        Ok(*mark <= self.completed)
    }
    fn wait_all(&mut self) -> Result<(), TransportError> {
        self.waits += 1;
        if self.fail_wait {
            return Err(engine_error("wait"));
        }
        self.completed = self.issued;
        Ok(())
    }
    fn recycle(&mut self, mark: u64) {
        self.recycled.push(mark);
    }
}

/// The queue, its engine and every store it made.
#[derive(Default)]
struct Rig {
    q: FlagQueue<u64>,
    e: Hand,
    stored: Vec<(u64, u64)>,
}

impl Rig {
    fn copy(&mut self) {
        self.e.issued += 1;
        self.q.copied();
    }
    fn signal(&mut self, addr: u64, epoch: u64) {
        let stored = &mut self.stored;
        self.q.signal(addr, epoch, &mut |a, v| stored.push((a, v)));
    }
    fn progress(&mut self) -> Result<bool, TransportError> {
        let stored = &mut self.stored;
        self.q
            .progress(&mut self.e, &mut |a, v| stored.push((a, v)))
    }
    fn flush(&mut self) -> Result<(), TransportError> {
        let stored = &mut self.stored;
        self.q.flush(&mut self.e, &mut |a, v| stored.push((a, v)))
    }
    fn engine_calls(&self) -> usize {
        self.e.marks + self.e.queries + self.e.waits
    }
}

#[test]
fn a_signal_with_nothing_outstanding_is_stored_at_once_without_engine_work() {
    let mut r = Rig::default();
    r.signal(0x100, 1);
    assert_eq!(r.stored, [(0x100, 1)]);
    assert!(!r.progress().unwrap(), "nothing waits");
    r.flush().unwrap();
    r.signal(0x100, 2);
    assert_eq!(r.stored, [(0x100, 1), (0x100, 2)]);
    assert_eq!(r.engine_calls(), 0, "no mark, query or wait: {:?}", r.e);
}

#[test]
fn a_signal_waits_for_every_copy_issued_before_it_on_any_connection() {
    let mut r = Rig::default();
    r.copy(); // connection A's put
    r.copy(); // connection B's put
    r.signal(0xb0, 1); // B's signal: after both (one stream's order)
    assert!(r.stored.is_empty());
    assert!(r.progress().unwrap(), "a signal waits");
    assert_eq!(r.e.marks, 1);
    r.e.completed = 1;
    assert!(r.progress().unwrap());
    assert!(
        r.stored.is_empty(),
        "one of two copies done: {:?}",
        r.stored
    );
    r.e.completed = 2;
    assert!(r.progress().unwrap(), "stored this turn");
    assert_eq!(r.stored, [(0xb0, 1)]);
    assert!(!r.progress().unwrap(), "idle again");
    assert_eq!(r.e.recycled, [2], "the reached mark is given back");
    // Everything known complete: the next signal goes at once.
    r.signal(0xb0, 2);
    assert_eq!(r.stored.last(), Some(&(0xb0, 2)));
}

#[test]
fn a_signal_without_data_never_overtakes_an_earlier_waiting_signal() {
    let mut r = Rig::default();
    r.copy();
    r.signal(0xa0, 1); // waits for the copy
    r.signal(0xb0, 1); // no data of its own, but after A's signal
    r.signal(0xa0, 2);
    assert!(r.stored.is_empty(), "{:?}", r.stored);
    r.progress().unwrap();
    assert!(r.stored.is_empty());
    r.e.completed = 1;
    r.progress().unwrap();
    assert_eq!(r.stored, [(0xa0, 1), (0xb0, 1), (0xa0, 2)]);
}

#[test]
fn signals_are_released_as_far_as_the_reached_marks_go() {
    let mut r = Rig::default();
    r.copy();
    r.copy();
    r.signal(0xa0, 1);
    r.progress().unwrap(); // mark covering 2 copies
    r.copy();
    r.copy();
    r.copy();
    r.signal(0xa0, 2);
    r.progress().unwrap(); // mark covering 5
    assert_eq!(r.e.marks, 2);
    r.e.completed = 3;
    r.progress().unwrap();
    assert_eq!(
        r.stored,
        [(0xa0, 1)],
        "the first mark is reached, not the second"
    );
    r.e.completed = 5;
    r.progress().unwrap();
    assert_eq!(r.stored, [(0xa0, 1), (0xa0, 2)]);
}

#[test]
fn marks_are_lazy_one_per_turn_and_only_when_a_waiting_signal_lacks_one() {
    let mut r = Rig::default();
    r.copy();
    r.copy();
    assert!(
        !r.progress().unwrap(),
        "copies without a signal need no mark"
    );
    assert_eq!(r.e.marks, 0);
    r.signal(0xa0, 1);
    r.signal(0xb0, 1);
    r.progress().unwrap();
    r.progress().unwrap();
    r.progress().unwrap();
    assert_eq!(r.e.marks, 1, "one mark covers both signals, made once");
    r.copy();
    r.signal(0xa0, 2);
    r.progress().unwrap();
    assert_eq!(
        r.e.marks, 2,
        "a new copy behind a new signal needs a new mark"
    );
}

#[test]
fn a_signal_then_flush_costs_one_wait_and_no_mark() {
    let mut r = Rig::default();
    r.copy();
    r.signal(0xa0, 1); // the kernel's put_with_signal: DATA | FLAG | SYNC
    r.flush().unwrap();
    assert_eq!(r.stored, [(0xa0, 1)]);
    assert_eq!((r.e.marks, r.e.queries, r.e.waits), (0, 0, 1));
    assert_eq!(r.e.completed, 1, "the flag was stored after the wait");
}

#[test]
fn flush_with_nothing_outstanding_calls_nothing() {
    let mut r = Rig::default();
    r.copy();
    r.flush().unwrap();
    assert_eq!(r.e.waits, 1);
    r.flush().unwrap();
    r.signal(0xa0, 1);
    r.flush().unwrap();
    assert_eq!(
        r.e.waits, 1,
        "nothing was outstanding the second and third time"
    );
    assert_eq!(r.stored, [(0xa0, 1)]);
}

#[test]
fn flush_stores_every_waiting_signal_in_order_and_retires_the_marks() {
    let mut r = Rig::default();
    r.copy();
    r.signal(0xa0, 1);
    r.progress().unwrap();
    r.copy();
    r.signal(0xb0, 1);
    r.progress().unwrap();
    r.flush().unwrap();
    assert_eq!(r.stored, [(0xa0, 1), (0xb0, 1)]);
    assert_eq!(r.e.recycled, [1, 2]);
    assert_eq!(r.q.waiting(), 0);
    assert!(!r.q.outstanding());
}

#[test]
fn a_failed_query_falls_back_to_waiting_then_stores_and_reports() {
    let mut r = Rig::default();
    r.copy();
    r.signal(0xa0, 1);
    r.e.fail_query = true;
    let e = r.progress().unwrap_err();
    assert!(e.to_string().contains("query"), "{e}");
    assert_eq!(r.e.waits, 1, "waited for the copies before storing");
    assert_eq!(r.e.completed, 1);
    assert_eq!(r.stored, [(0xa0, 1)]);
    assert_eq!(r.q.waiting(), 0, "nothing left behind");
}

#[test]
fn a_failed_mark_falls_back_to_waiting_then_stores_and_reports() {
    let mut r = Rig::default();
    r.copy();
    r.signal(0xa0, 1);
    r.e.fail_mark = true;
    let e = r.progress().unwrap_err();
    assert!(e.to_string().contains("mark"), "{e}");
    assert_eq!(r.e.waits, 1);
    assert_eq!(r.stored, [(0xa0, 1)]);
}

#[test]
fn a_failed_wait_still_stores_the_signals_and_reports() {
    let mut r = Rig::default();
    r.copy();
    r.signal(0xa0, 1);
    r.e.fail_wait = true;
    let e = r.flush().unwrap_err();
    assert!(e.to_string().contains("wait"), "{e}");
    assert_eq!(r.stored, [(0xa0, 1)], "the peer is not left waiting");
    // The queue is usable afterwards.
    r.e.fail_wait = false;
    r.signal(0xa0, 2);
    assert_eq!(r.stored.last(), Some(&(0xa0, 2)));
}

#[derive(Debug, Clone)]
enum Op {
    Copy,
    Signal(u8),
    Progress,
    Complete(u8),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Copy),
        3 => (0u8..3).prop_map(Op::Signal),
        3 => Just(Op::Progress),
        2 => (0u8..4).prop_map(Op::Complete),
        1 => Just(Op::Flush),
    ]
}

proptest! {
    /// Against a model: every flag is stored only after the copies issued before its
    /// signal completed, flags are stored in signal order, a signal with nothing
    /// outstanding is stored at once, and after a flush nothing waits.
    #[test]
    fn flags_follow_their_copies_in_order(ops in proptest::collection::vec(op(), 1..200)) {
        let mut r = Rig::default();
        // Per signal, in issue order: (addr, epoch, copies issued before it).
        let mut sent: Vec<(u64, u64, u64)> = Vec::new();
        let mut epochs = [0u64; 3];
        // Copies completed when each store happened: checked below.
        let mut store_checks: Vec<(u64, u64, u64)> = Vec::new();
        for o in ops {
            let before = r.stored.len();
            match o {
                Op::Copy => r.copy(),
                Op::Signal(c) => {
                    epochs[c as usize] += 1;
                    let addr = 0x1000 + 8 * c as u64;
                    // Nothing outstanding as far as the queue knows (it learns of completions
                    // only through marks and flushes); the store checks below make sure it
                    // never knows more than the engine did.
                    let idle = r.q.waiting() == 0 && !r.q.outstanding();
                    sent.push((addr, epochs[c as usize], r.e.issued));
                    r.signal(addr, epochs[c as usize]);
                    prop_assert_eq!(r.stored.len() - before, usize::from(idle));
                }
                Op::Progress => { r.progress().unwrap(); }
                Op::Complete(k) => {
                    r.e.completed = (r.e.completed + k as u64).min(r.e.issued);
                }
                Op::Flush => {
                    r.flush().unwrap();
                    prop_assert_eq!(r.q.waiting(), 0);
                    prop_assert_eq!(r.stored.len(), sent.len());
                }
            }
            for &(a, v) in &r.stored[before..] {
                store_checks.push((a, v, r.e.completed));
            }
        }
        prop_assert!(r.stored.len() <= sent.len());
        for (i, &(a, v, completed)) in store_checks.iter().enumerate() {
            let (sa, sv, after) = sent[i];
            prop_assert_eq!((a, v), (sa, sv), "store {} out of order", i);
            prop_assert!(completed >= after,
                "flag {:#x}={} stored with {} copies done, {} needed", a, v, completed, after);
        }
    }
}

/// A copy engine on its own thread, as the GPU's: copies and marks run in order, each
/// after a random delay, on words of shared memory.
struct Threaded {
    ops: mpsc::Sender<EngineOp>,
    submitted: u64,
    finished: Arc<AtomicU64>,
}

enum EngineOp {
    Copy {
        src: Arc<Vec<AtomicU64>>,
        src_at: usize,
        dst: Arc<Vec<AtomicU64>>,
        dst_at: usize,
        words: usize,
    },
    Mark(Arc<AtomicBool>),
}

impl Threaded {
    fn start(seed: u64) -> (Threaded, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel::<EngineOp>();
        let finished = Arc::new(AtomicU64::new(0));
        let fin = finished.clone();
        let t = std::thread::spawn(move || {
            let mut x = seed | 1;
            for op in rx {
                // xorshift: a delay of 0-63 spins, sometimes a yield.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                for _ in 0..(x % 64) {
                    std::hint::spin_loop();
                }
                if x.is_multiple_of(16) {
                    std::thread::yield_now();
                }
                match op {
                    EngineOp::Copy {
                        src,
                        src_at,
                        dst,
                        dst_at,
                        words,
                    } => {
                        for i in 0..words {
                            let v = src[src_at + i].load(Ordering::Relaxed);
                            dst[dst_at + i].store(v, Ordering::Relaxed);
                        }
                    }
                    // Release: the copies before it happen before a query that sees it.
                    EngineOp::Mark(m) => m.store(true, Ordering::Release),
                }
                // Release: as for the marks, for `wait_all`.
                fin.fetch_add(1, Ordering::Release);
            }
        });
        (
            Threaded {
                ops: tx,
                submitted: 0,
                finished,
            },
            t,
        )
    }

    fn submit(&mut self, op: EngineOp) {
        self.submitted += 1;
        self.ops.send(op).expect("engine thread alive");
    }
}

impl CopyEngine for Threaded {
    type Mark = Arc<AtomicBool>;
    fn mark(&mut self) -> Result<Self::Mark, TransportError> {
        let m = Arc::new(AtomicBool::new(false));
        self.submit(EngineOp::Mark(m.clone()));
        Ok(m)
    }
    fn reached(&mut self, mark: &Self::Mark) -> Result<bool, TransportError> {
        // Acquire: pairs with the engine's release (the copies before it are visible).
        Ok(mark.load(Ordering::Acquire))
    }
    fn wait_all(&mut self) -> Result<(), TransportError> {
        let t0 = Instant::now();
        // Acquire: pairs with the engine's release after each op.
        while self.finished.load(Ordering::Acquire) < self.submitted {
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(engine_error("engine thread stuck"));
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// End to end on threads: a proxy loop issues puts on two connections to an asynchronous
/// engine and raises flags through the queue; a reader per connection polls its flag and
/// checks that the data under it is at least as new as the flag says (the copy of epoch `e`
/// writes `e` into every word; a signal-only epoch promises the data of the last epoch that
/// had a put). A flag stored before its copy shows as an older word.
#[test]
fn data_is_never_older_than_the_flag_above_it() {
    const WORDS: usize = 64;
    const SLOTS: usize = 8; // source slots per connection, reused after a flush
    const EPOCHS: usize = 3000;
    for seed in [0x9e37_79b9_7f4a_7c15u64, 0x0123_4567_89ab_cdef] {
        // Which epochs carry a put (about 4 in 5; the first always), and for each epoch
        // the newest data its flag promises.
        let mut x = seed;
        let mut has_put = vec![[false; 2]; EPOCHS + 1];
        let mut promised = vec![[0u64; 2]; EPOCHS + 1];
        for e in 1..=EPOCHS {
            for c in 0..2 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                has_put[e][c] = e == 1 || x % 5 != 0;
                promised[e][c] = if has_put[e][c] {
                    e as u64
                } else {
                    promised[e - 1][c]
                };
            }
        }
        let promised = Arc::new(promised);
        let src: [Arc<Vec<AtomicU64>>; 2] = std::array::from_fn(|_| {
            Arc::new((0..WORDS * SLOTS).map(|_| AtomicU64::new(0)).collect())
        });
        let dst: [Arc<Vec<AtomicU64>>; 2] =
            std::array::from_fn(|_| Arc::new((0..WORDS).map(|_| AtomicU64::new(0)).collect()));
        let flags: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let readers: Vec<_> = (0..2)
            .map(|c| {
                let (dst, flags) = (dst[c].clone(), flags.clone());
                let promised = promised.clone();
                std::thread::spawn(move || {
                    let mut bad = Vec::new();
                    let mut seen = 0;
                    let mut looks = 0u64;
                    let t0 = Instant::now();
                    // Until the last flag has been seen and checked (or a deadline).
                    while seen < EPOCHS as u64 && t0.elapsed() < Duration::from_secs(120) {
                        // Acquire: pairs with the proxy's release store of the flag.
                        let f = flags[c].load(Ordering::Acquire);
                        assert!(f >= seen, "flag {c} went back from {seen} to {f}");
                        seen = f;
                        let want = promised[f as usize][c];
                        for (i, w) in dst.iter().enumerate() {
                            let v = w.load(Ordering::Relaxed);
                            if v < want && bad.len() < 8 {
                                bad.push((f, i, v));
                            }
                        }
                        looks += 1;
                    }
                    (seen, bad, looks)
                })
            })
            .collect();
        let (mut engine, engine_thread) = Threaded::start(seed);
        let mut q: FlagQueue<Arc<AtomicBool>> = FlagQueue::default();
        let mut store = |addr: u64, epoch: u64| {
            // SAFETY (test): `addr` is the address of one of `flags`, alive here.
            let f = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
            // Release: the reader that acquires this epoch sees what the proxy acquired
            // from the engine's mark (the copies).
            f.store(epoch, Ordering::Release);
        };
        for (e, puts) in has_put.iter().enumerate().skip(1) {
            let slot = e % SLOTS;
            if slot == 0 {
                // The sources are about to be reused: every copy must be done.
                q.flush(&mut engine, &mut store).unwrap();
            }
            for c in 0..2 {
                if puts[c] {
                    for w in &src[c][slot * WORDS..(slot + 1) * WORDS] {
                        w.store(e as u64, Ordering::Relaxed);
                    }
                    engine.submit(EngineOp::Copy {
                        src: src[c].clone(),
                        src_at: slot * WORDS,
                        dst: dst[c].clone(),
                        dst_at: 0,
                        words: WORDS,
                    });
                    q.copied();
                }
                q.signal(flags[c].as_ptr() as u64, e as u64, &mut store);
                q.progress(&mut engine, &mut store).unwrap();
            }
        }
        q.flush(&mut engine, &mut store).unwrap();
        assert_eq!(q.waiting(), 0);
        for (c, r) in readers.into_iter().enumerate() {
            let (seen, bad, looks) = r.join().unwrap();
            assert!(
                bad.is_empty(),
                "connection {c}: (flag, word, value) {bad:?}"
            );
            assert!(looks > 0);
            assert_eq!(seen, EPOCHS as u64, "the reader saw the last flag");
            let last = promised[EPOCHS][c];
            assert!(
                dst[c].iter().all(|w| w.load(Ordering::Relaxed) == last),
                "the last copy landed"
            );
        }
        drop(engine);
        engine_thread.join().unwrap();
    }
}
