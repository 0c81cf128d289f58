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
        // SAFETY: live, aligned words, zero at first, accessed atomically while shared (the
        // expected word only by this side's one waiter).
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
