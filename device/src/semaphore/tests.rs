use super::*;
use crate::arch::{Dim3, launch};
use core::sync::atomic::{AtomicU64, Ordering};
use std::boxed::Box;

const LONG_NS: u64 = 60_000_000_000;
const SHORT_NS: u64 = 2_000_000;

/// Both sides' words: inbound and expected of side 0, then of side 1.
struct Words(Box<[AtomicU64; 5]>);

impl Words {
    fn new() -> Words {
        Words(Box::new([const { AtomicU64::new(0) }; 5]))
    }
    /// The abort word both sides' waits look at.
    fn abort(&self, word: u64) {
        self.0[4].store(word, Ordering::Relaxed);
    }
    fn side(&self, i: usize, timeout_ns: u64) -> DeviceSemaphore<'_> {
        let w = |k: usize| self.0[k].as_ptr();
        // SAFETY: live, aligned words, zero at first, accessed only atomically while shared
        // (the expected word only by this side's waits).
        unsafe {
            DeviceSemaphore::from_raw_parts(
                w(2 * i),
                w(2 * (1 - i)),
                w(2 * i + 1),
                timeout_ns,
                w(4),
            )
        }
    }
    fn inbound(&self, i: usize) -> u64 {
        self.0[2 * i].load(Ordering::Relaxed)
    }
    fn expected(&self, i: usize) -> u64 {
        self.0[2 * i + 1].load(Ordering::Relaxed)
    }
}

#[test]
fn signal_raises_the_peer_and_wait_consumes_one() {
    let w = Words::new();
    let (a, b) = (w.side(0, LONG_NS), w.side(1, LONG_NS));
    a.signal();
    a.relaxed_signal();
    assert_eq!((w.inbound(0), w.inbound(1)), (0, 2));
    b.wait();
    assert_eq!(w.expected(1), 1);
    assert!(b.poll());
    assert_eq!(w.expected(1), 2);
    assert!(!b.poll(), "two signals, two waits");
    assert!(!b.wait_timeout(SHORT_NS));
    assert_eq!(w.expected(1), 2, "a failed wait consumes nothing");
    a.signal();
    assert!(b.wait_timeout(SHORT_NS));
    assert_eq!(w.inbound(0), 0, "nothing flows the other way");
}

#[test]
fn wait_traps_after_its_timeout() {
    let w = Words::new();
    let b = w.side(1, SHORT_NS);
    let r = launch(Dim3::x(1), Dim3::x(1), || b.wait());
    assert_eq!(r, Err(crate::arch::LaunchError::Panicked("trap".into())));
    assert_eq!(w.expected(1), 0);
}

#[test]
fn signals_from_many_threads_are_all_counted() {
    let w = Words::new();
    let (a, b) = (w.side(0, LONG_NS), w.side(1, LONG_NS));
    std::thread::scope(|s| {
        s.spawn(|| {
            launch(Dim3::x(4), Dim3::x(8), || {
                if crate::arch::thread_idx_x().is_multiple_of(2) {
                    a.signal();
                } else {
                    a.relaxed_signal();
                }
            })
            .unwrap()
        });
        for _ in 0..32 {
            b.wait();
        }
    });
    assert!(!b.poll());
    assert_eq!(w.inbound(1), 32);
}

#[test]
fn data_written_before_signal_is_read_after_wait() {
    // Plain (non-atomic) data words, published by the release signal and acquired by the
    // wait; the reader's signal back hands the words to the writer again.
    const ROUNDS: u64 = 20_000;
    let w = Words::new();
    let (a, b) = (w.side(0, LONG_NS), w.side(1, LONG_NS));
    let mut data = Box::new([0u64; 8]);
    let p = data.as_mut_ptr() as usize;
    std::thread::scope(|s| {
        s.spawn(move || {
            let p = p as *mut u64;
            for r in 1..=ROUNDS {
                for i in 0..8 {
                    // SAFETY: the reader is not reading: it signalled after its last read.
                    unsafe { p.add(i).write(r * 8 + i as u64) };
                }
                a.signal();
                a.wait();
            }
        });
        let p = p as *const u64;
        for r in 1..=ROUNDS {
            b.wait();
            for i in 0..8 {
                // SAFETY: the writer wrote before its signal and waits for ours.
                assert_eq!(unsafe { p.add(i).read() }, r * 8 + i as u64, "round {r}");
            }
            b.signal();
        }
    });
    assert_eq!(data[7], ROUNDS * 8 + 7);
    assert_eq!((w.inbound(0), w.inbound(1)), (ROUNDS, ROUNDS));
}

#[test]
fn semaphore_is_laid_out_for_the_host() {
    assert_eq!(core::mem::size_of::<DeviceSemaphore<'static>>(), 40);
    assert_eq!(
        core::mem::offset_of!(DeviceSemaphore<'static>, timeout_ns),
        24
    );
    let w = Words::new();
    let s = std::format!("{:?}", w.side(0, 7));
    assert!(s.contains("timeout_ns: 7"), "{s}");
    assert_eq!(w.side(0, 7).timeout_ns(), 7);
}

#[test]
fn an_abort_ends_a_wait_long_before_its_timeout_and_consumes_nothing() {
    use crate::channel::ChannelError;
    let w = Words::new();
    let a = w.side(0, 60_000_000_000);
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            w.abort(3);
        });
        assert_eq!(
            a.try_wait(60_000_000_000),
            Err(ChannelError::Aborted { word: 3 })
        );
    });
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(1), "{took:?}");
    assert_eq!(w.expected(0), 0, "nothing consumed");
    // A signal that is there is still taken at once; a wait for one that is not gives up.
    w.side(1, 1).signal();
    assert!(a.poll());
    assert!(!a.wait_timeout(60_000_000_000));
}

/// The "left" word of a peer (written by the host once everything the peer sent had
/// landed) ends a wait only when the signal is not there on a look after the word: a signal
/// that came before it is taken, even if it lands after the wait's last poll.
#[test]
fn a_left_word_ends_a_wait_only_when_its_signal_is_not_there() {
    use crate::channel::ChannelError;
    use crate::collectives::fault::{ABORT_REQUESTED, left_rank, left_word};
    let w = Words::new();
    let (a, b) = (w.side(0, LONG_NS), w.side(1, LONG_NS));
    w.abort(left_word(1));
    let inbound = w.0[0].as_ptr() as *const u64;
    let mut last = None;
    // The look itself: the signal is not there, then it is (it landed after the poll).
    // SAFETY: live, aligned words.
    let look =
        |last: &mut Option<u64>| unsafe { look_at_abort(w.0[4].as_ptr(), 0, last, inbound, 1) };
    assert_eq!(look(&mut last), Err(ChannelError::PeerLeft { rank: 1 }));
    b.signal();
    last = None;
    assert_eq!(look(&mut last), Ok(()));
    // Through the wait: the signal is taken, the next wait gives up at once.
    let started = std::time::Instant::now();
    assert_eq!(a.try_wait(LONG_NS), Ok(()));
    assert_eq!(a.try_wait(LONG_NS), Err(ChannelError::PeerLeft { rank: 1 }));
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(w.expected(0), 1, "the failed wait consumed nothing");
    // Words that are not "left" words stay aborts.
    for word in [1, 3, 1 << 40, ABORT_REQUESTED] {
        assert_eq!(left_rank(word), None, "{word:#x}");
        assert_eq!(
            ChannelError::from_abort_word(word),
            ChannelError::Aborted { word }
        );
    }
    for rank in [0, 1, 7, u32::MAX - 1] {
        assert_eq!(left_rank(left_word(rank)), Some(rank));
    }
}

/// Runs `waiters` CPU threads of one launch, each a `wait_timeout(timeout_ns)` on side 1,
/// while side 0 raises `signals` signals, 150 ms apart, the first once the waits are under
/// way; returns how many of the waits returned `true`.
fn concurrent_waits(w: &Words, waiters: u32, signals: u64, timeout_ns: u64) -> u32 {
    use core::sync::atomic::AtomicU32;
    let (a, b) = (w.side(0, LONG_NS), w.side(1, LONG_NS));
    let took = AtomicU32::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..signals {
                std::thread::sleep(std::time::Duration::from_millis(150));
                a.signal();
            }
        });
        launch(Dim3::x(1), Dim3::x(waiters), || {
            if b.wait_timeout(timeout_ns) {
                took.fetch_add(1, Ordering::Relaxed);
            }
        })
        .unwrap();
    });
    took.into_inner()
}

/// Waits from several threads at once take one signal each: with fewer signals than waits,
/// exactly as many waits succeed as there are signals, the others time out, and no signal
/// is lost (the next wait takes the next one).
#[test]
fn concurrent_waits_take_one_signal_each() {
    for (waiters, signals) in [(2, 1), (8, 1), (8, 3)] {
        let w = Words::new();
        let took = concurrent_waits(&w, waiters, signals, 1_000_000_000);
        assert_eq!(
            took, signals as u32,
            "{waiters} waits for {signals} signal(s): {took} succeeded"
        );
        assert_eq!(
            w.expected(1),
            signals,
            "{waiters} waits, {signals} signal(s)"
        );
        let (a, b) = (w.side(0, LONG_NS), w.side(1, LONG_NS));
        a.signal();
        assert!(b.wait_timeout(SHORT_NS), "the signal after them is taken");
        assert!(!b.poll(), "and only it");
    }
}

/// Polls from several threads at once take every signal exactly once (the signals are all
/// there first, so that the polls race for them).
#[test]
fn concurrent_polls_take_every_signal_once() {
    use core::sync::atomic::AtomicU64;
    const SIGNALS: u64 = 200_000;
    let w = Words::new();
    let (a, b) = (w.side(0, LONG_NS), w.side(1, LONG_NS));
    for _ in 0..SIGNALS {
        a.relaxed_signal();
    }
    let took = AtomicU64::new(0);
    launch(Dim3::x(1), Dim3::x(4), || {
        let mut mine = 0;
        crate::arch::sync_threads();
        while b.poll() {
            mine += 1;
        }
        took.fetch_add(mine, Ordering::Relaxed);
    })
    .unwrap();
    assert_eq!(took.into_inner(), SIGNALS);
    assert_eq!(w.expected(1), SIGNALS);
}

/// Spins until `cond` holds; panics after 10 s.
fn until(cond: impl Fn() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within 10 s: {what}"
        );
        std::hint::spin_loop();
    }
}

/// A wait that gives up while a later wait holds a ticket hands its own back only after
/// that one has (tickets go back last first), or takes its signal if it comes meanwhile:
/// no signal is lost to a wait that gave up.
#[test]
fn a_wait_that_gives_up_hands_its_ticket_back_after_later_ones() {
    use std::time::Duration;
    // No signal: the early wait (300 ms) returns after the later one (900 ms) gave up.
    let w = Words::new();
    let b = w.side(1, LONG_NS);
    let started = std::time::Instant::now();
    let (early, late) = std::thread::scope(|s| {
        let early = s.spawn(|| (b.wait_timeout(300_000_000), started.elapsed()));
        until(|| w.expected(1) == 1, "the early wait took its ticket");
        let late = s.spawn(|| (b.wait_timeout(900_000_000), started.elapsed()));
        until(|| w.expected(1) == 2, "the later wait took its ticket");
        (early.join().unwrap(), late.join().unwrap())
    });
    assert!(!early.0 && !late.0, "no signal: {early:?} {late:?}");
    // The later wait starts after `started` and gives up 900 ms after its start, so an
    // early wait that waited for its hand-back returns 900 ms or more after `started`
    // (comparing the two threads' own clock readings raced: the early wait may read its
    // clock a moment before the later one, which hands back first, reads its own).
    assert!(
        early.1 >= Duration::from_millis(900),
        "the early wait returned before the later one gave up: {early:?} {late:?}"
    );
    assert_eq!(w.expected(1), 0, "both tickets handed back");
    // A signal after the early wait's timeout but before the later one's goes to the early
    // wait (its ticket), and the later wait times out.
    let w = Words::new();
    let (a, b) = (w.side(0, LONG_NS), w.side(1, LONG_NS));
    let (early, late) = std::thread::scope(|s| {
        let early = s.spawn(|| b.wait_timeout(300_000_000));
        until(|| w.expected(1) == 1, "the early wait took its ticket");
        let late = s.spawn(|| b.wait_timeout(1_500_000_000));
        until(|| w.expected(1) == 2, "the later wait took its ticket");
        std::thread::sleep(Duration::from_millis(500));
        a.signal();
        (early.join().unwrap(), late.join().unwrap())
    });
    assert!(early && !late, "early {early}, late {late}");
    assert_eq!(w.expected(1), 1);
    a.signal();
    assert!(
        b.wait_timeout(SHORT_NS),
        "the next signal is the next wait's"
    );
}
