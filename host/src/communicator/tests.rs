//! Communicator over the Host transport, ranks as threads of this process.

use std::time::Duration;

use super::*;
use crate::bootstrap::create_unique_id;
use crate::proxy::ProxyError;
use crate::transport::TransportKind;
use mscclpp_device::arch::{Dim3, launch};
use mscclpp_device::channel::{ChannelError, DevConn};
use mscclpp_device::kernels::smoke::probe_value;

fn config() -> CommConfig {
    CommConfig {
        fifo_slots: 8,
        device_timeout: Duration::from_secs(20),
        bootstrap: BootstrapConfig::default().with_timeout(Duration::from_secs(20)),
        ib: IbConfig::default(),
        proxy_flag: Default::default(),
    }
}

/// Runs `f(comm)` on `n` host-backed ranks (threads) and returns their results in rank order.
fn ranks<T: Send>(n: usize, f: impl Fn(Communicator) -> T + Sync) -> Vec<T> {
    ranks_with(n, |_| config(), f)
}

/// [`ranks`] with each rank's settings from `cfg(rank)`.
fn ranks_with<T: Send>(
    n: usize,
    cfg: impl Fn(usize) -> CommConfig + Sync,
    f: impl Fn(Communicator) -> T + Sync,
) -> Vec<T> {
    let id = create_unique_id().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (f, cfg) = (&f, &cfg);
                s.spawn(move || {
                    let c = cfg(r);
                    let bs =
                        BlockingBootstrap::init_with_config(n, r, id, c.bootstrap.clone()).unwrap();
                    f(Communicator::from_bootstrap(bs, Backend::Host, c).unwrap())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn fill(buf: &Buffer, seed: u64, round: u64) {
    let words: Vec<u64> = (0..buf.len() as u64 / 8)
        .map(|i| probe_value(seed, round, i))
        .collect();
    buf.write(0, &words).unwrap();
}

fn check(buf: &Buffer, seed: u64, round: u64, what: &str) {
    let mut words = vec![0u64; buf.len() / 8];
    buf.read(0, &mut words).unwrap();
    for (i, w) in words.iter().enumerate() {
        assert_eq!(*w, probe_value(seed, round, i as u64), "{what}: word {i}");
    }
}

#[test]
fn ping_pong_moves_random_data_every_round() {
    const ROUNDS: u64 = 300;
    ranks(2, |mut comm| {
        let me = comm.rank();
        let peer = 1 - me;
        let buf = comm.alloc_buffer(4096).unwrap();
        comm.connect(peer, &buf, 7, TransportKind::Host).unwrap();
        comm.connection_setup().unwrap();
        let conn = comm.device_connections()[0];
        comm.proxy_launch().unwrap();
        for round in 1..=ROUNDS {
            // Rank 0 sends in odd rounds, rank 1 in even ones; the other checks.
            if (round % 2 == 1) == (me == 0) {
                fill(&buf, me as u64, round);
                conn.put_with_signal(0, 0, 4096);
            } else {
                conn.wait();
                check(&buf, peer as u64, round, "ping-pong");
            }
        }
        comm.proxy_stop().unwrap();
    });
}

#[test]
fn all_gather_with_put_signal_wait_on_3_and_8_ranks() {
    for n in [3usize, 8] {
        let chunk = 256usize;
        ranks(n, |mut comm| {
            let me = comm.rank();
            let buf = comm.alloc_buffer(chunk * n).unwrap();
            let mine: Vec<u64> = (0..chunk as u64 / 8)
                .map(|i| probe_value(me as u64, 1, i))
                .collect();
            buf.write(me * chunk, &mine).unwrap();
            for peer in (0..n).filter(|p| *p != me) {
                comm.connect(peer, &buf, 1, TransportKind::Host).unwrap();
            }
            comm.connection_setup().unwrap();
            let conns = comm.device_connections();
            comm.proxy_launch().unwrap();
            let off = (me * chunk) as u64;
            for c in &conns {
                c.put(off, chunk as u64);
            }
            for c in &conns {
                c.signal();
            }
            for c in &conns {
                c.wait();
            }
            for r in 0..n {
                let mut got = vec![0u64; chunk / 8];
                buf.read(r * chunk, &mut got).unwrap();
                for (i, w) in got.iter().enumerate() {
                    assert_eq!(
                        *w,
                        probe_value(r as u64, 1, i as u64),
                        "{n} ranks: rank {me} chunk {r} word {i}"
                    );
                }
            }
            comm.proxy_stop().unwrap();
        });
    }
}

#[test]
fn bad_connect_arguments_are_refused_with_the_reason() {
    ranks(2, |mut comm| {
        let buf = comm.alloc_buffer(64).unwrap();
        let e = comm.connect(2, &buf, 0, TransportKind::Host).unwrap_err();
        assert!(
            e.to_string()
                .contains("remote rank 2 does not exist (2 ranks)"),
            "{e}"
        );
        let me = comm.rank();
        let e = comm.connect(me, &buf, 0, TransportKind::Host).unwrap_err();
        assert!(e.to_string().contains("is this rank"), "{e}");
        let e = comm
            .connect(1 - me, &buf, 0, TransportKind::P2p)
            .unwrap_err();
        assert!(
            matches!(
                e,
                CommError::TransportUnavailable {
                    transport: TransportKind::P2p,
                    ..
                }
            ),
            "{e}"
        );
        let e = comm
            .connect(1 - me, &buf, 0, TransportKind::Ib)
            .unwrap_err();
        // No RDMA device on CI machines; without the `ib` feature the error says so.
        if let CommError::TransportUnavailable { reason, .. } = &e {
            assert!(reason.contains("InfiniBand"), "{e}");
        } else {
            panic!("IB without a device: {e}");
        }
        assert!(matches!(
            comm.alloc_buffer(0),
            Err(CommError::InvalidArgument(_))
        ));
        comm.connect(1 - me, &buf, 5, TransportKind::Host).unwrap();
        let e = comm
            .connect(1 - me, &buf, 5, TransportKind::Host)
            .unwrap_err();
        assert!(e.to_string().contains("tag 5 is already used"), "{e}");
        comm.connection_setup().unwrap();
        assert!(
            comm.proxy_stop().is_err(),
            "stop without launch is a state error"
        );
    });
}

#[test]
fn buffer_sizes_that_differ_fail_on_both_sides() {
    let results = ranks(2, |mut comm| {
        let size = if comm.rank() == 0 { 128 } else { 256 };
        let buf = comm.alloc_buffer(size).unwrap();
        comm.connect(1 - comm.rank(), &buf, 3, TransportKind::Host)
            .unwrap();
        comm.connection_setup().map_err(|e| e.to_string())
    });
    for (r, res) in results.iter().enumerate() {
        let e = res.as_ref().expect_err("setup must fail");
        assert!(e.contains("buffer sizes differ"), "rank {r}: {e}");
    }
}

#[test]
fn proxy_reports_malformed_triggers_and_keeps_serving() {
    ranks(2, |mut comm| {
        let me = comm.rank();
        let buf = comm.alloc_buffer(1024).unwrap();
        comm.connect(1 - me, &buf, 9, TransportKind::Host).unwrap();
        comm.connection_setup().unwrap();
        let good = comm.device_connections()[0];
        let fifo = comm.fifo.device_handle();
        // SAFETY: a handle over this communicator's live FIFO and counters, with an id no
        // connection has.
        let unknown = unsafe {
            DevConn::from_raw_parts(
                fifo,
                5,
                comm.connections[0].inbound as *mut u64,
                comm.connections[0].expected as *mut u64,
                1_000_000_000,
                comm.fault.kernel_ptr(),
            )
        };
        comm.proxy_launch().unwrap();
        if me == 0 {
            unknown.put(0, 8);
            good.put_at(1000, 0, 100); // beyond the 1024-byte buffers
            fill(&buf, 0, 1);
            // Still served after the bad ones, but the connection's refused put is reported.
            assert_eq!(
                good.try_put_with_signal(0, 0, 1024),
                Err(ChannelError::ProxyRefused { connection: 0 })
            );
            assert_eq!(
                unknown.try_flush(),
                Err(ChannelError::ProxyRefused { connection: 5 })
            );
        } else {
            good.wait();
            check(&buf, 0, 1, "after malformed triggers");
        }
        comm.bootstrap().barrier().unwrap();
        let r = comm.proxy_stop();
        if me == 0 {
            let Err(CommError::Proxy(errors)) = r else {
                panic!("expected proxy errors, got {r:?}")
            };
            // The unknown connection's flush is refused too.
            assert_eq!(errors.len(), 3, "{errors:?}");
            assert!(
                matches!(
                    errors[0],
                    ProxyError::UnknownConnection { connection: 5, .. }
                ),
                "{}",
                errors[0]
            );
            assert!(
                matches!(errors[1], ProxyError::OutOfBounds { connection: 0, .. }),
                "{}",
                errors[1]
            );
        } else {
            r.unwrap();
        }
    });
}

#[test]
fn proxy_stop_serves_triggers_queued_before_it() {
    ranks(2, |mut comm| {
        let me = comm.rank();
        let buf = comm.alloc_buffer(8 * 64).unwrap();
        comm.connect(1 - me, &buf, 2, TransportKind::Host).unwrap();
        comm.connection_setup().unwrap();
        let conn = comm.device_connections()[0];
        if me == 0 {
            fill(&buf, 4, 4);
            // Queue 8 triggers (a full ring of 8) while no proxy runs, then launch and stop
            // at once: every one of them must still be served.
            for i in 0..7u64 {
                conn.put(i * 64, 64);
            }
            conn.put(7 * 64, 64);
            comm.proxy_launch().unwrap();
            comm.proxy_stop().unwrap();
            comm.proxy_launch().unwrap();
            conn.signal();
            comm.proxy_stop().unwrap();
        } else {
            conn.wait();
            check(&buf, 4, 4, "queued before stop");
        }
        comm.bootstrap().barrier().unwrap();
    });
}

#[test]
fn memory_channels_move_data_packets_and_signals_on_cpu_threads() {
    use mscclpp_device::arch::{Dim3, launch};
    use mscclpp_device::kernels::memory_test;
    ranks(2, |mut comm| {
        let me = comm.rank();
        let buf = comm.alloc_buffer(8192).unwrap();
        let e = comm
            .connect_memory(1 - me, &buf, 4, TransportKind::Host, 24)
            .unwrap_err();
        assert!(e.to_string().contains("not a multiple of 16"), "{e}");
        assert_eq!(
            comm.connect_memory(1 - me, &buf, 4, TransportKind::Host, 8192 * 2)
                .unwrap(),
            0
        );
        comm.connection_setup().unwrap();
        assert!(
            comm.device_connections().is_empty(),
            "a memory channel is not a proxy channel"
        );
        let ch = comm.memory_channels()[0];
        let errors = std::sync::atomic::AtomicU64::new(0);
        let perr = errors.as_ptr() as usize;
        // Odd size and offsets: the copy must handle unaligned heads and tails.
        launch(Dim3::x(1), Dim3::x(8), || {
            // SAFETY: the channel's memory is owned by `comm` for the whole launch; the
            // offsets + size fit the 8192-byte buffers.
            unsafe {
                memory_test::memory_ping_pong(ch, 1001, 20, me as u32, 5, 3, 7, perr as *mut u64)
            }
        })
        .unwrap();
        launch(Dim3::x(1), Dim3::x(8), || {
            // SAFETY: as above; 4000 bytes of data fit the 16 KiB packet scratch.
            unsafe {
                memory_test::memory_packet_ping_pong(ch, 4000, 30, me as u32, 6, perr as *mut u64)
            }
        })
        .unwrap();
        launch(Dim3::x(1), Dim3::x(1), || {
            // SAFETY: as above.
            unsafe { memory_test::memory_signal_ping_pong(ch, 100, me as u32) }
        })
        .unwrap();
        assert_eq!(
            errors.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "rank {me}: wrong words"
        );
        comm.bootstrap().barrier().unwrap();
    });
}

/// IB connections end to end over the fake fabric (ranks are threads, each with its own fake
/// device): handshake over the bootstrap, queue pairs INIT → RTR → RTS, the proxy driving
/// the IB plane next to a Host connection (a plane set), flushes, and a relaunched proxy
/// continuing the epochs.
#[test]
fn ib_connections_over_the_fake_fabric_move_data_next_to_host_ones() {
    use crate::transport::ib::fake::{FakeFabric, FakeVerbs};
    const ROUNDS: u64 = 200;
    let fabric = FakeFabric::new();
    ranks(2, |mut comm| {
        comm.use_ib_verbs(Arc::new(FakeVerbs::new(&fabric)));
        let me = comm.rank();
        let peer = 1 - me;
        let ib_buf = comm.alloc_buffer(4096).unwrap();
        let host_buf = comm.alloc_buffer(64).unwrap();
        assert_eq!(
            comm.connect(peer, &ib_buf, 0, TransportKind::Ib).unwrap(),
            0
        );
        assert_eq!(
            comm.connect(peer, &host_buf, 1, TransportKind::Host)
                .unwrap(),
            1
        );
        comm.connection_setup().unwrap();
        assert_eq!(comm.connections()[0].transport(), TransportKind::Ib);
        let conns = comm.device_connections();
        let (ib, host) = (conns[0], conns[1]);
        for half in 0..2 {
            comm.proxy_launch().unwrap();
            for round in 1 + half * ROUNDS / 2..=(half + 1) * ROUNDS / 2 {
                if (round % 2 == 1) == (me == 0) {
                    fill(&ib_buf, me as u64, round);
                    let cut = (round * 8) % 4096;
                    ib.put(0, cut);
                    ib.put_with_signal(cut, cut, 4096 - cut);
                    if round % 7 == 0 {
                        ib.flush();
                    }
                    fill(&host_buf, me as u64 + 10, round);
                    host.put_with_signal(0, 0, 64);
                } else {
                    ib.wait();
                    check(&ib_buf, peer as u64, round, "IB ping-pong");
                    host.wait();
                    check(&host_buf, peer as u64 + 10, round, "Host next to IB");
                }
            }
            // Both sides finished the half before either stops its proxy.
            comm.bootstrap().barrier().unwrap();
            comm.proxy_stop().unwrap();
        }
    });
}

#[test]
fn ib_is_refused_for_memory_channels_and_where_no_device_opens() {
    use crate::transport::ib::fake::{FakeFabric, FakeVerbs};
    let fabric = FakeFabric::new();
    ranks(2, |mut comm| {
        let peer = 1 - comm.rank();
        let buf = comm.alloc_buffer(64).unwrap();
        let e = comm
            .connect_memory(peer, &buf, 0, TransportKind::Ib, 0)
            .unwrap_err();
        assert!(
            matches!(
                e,
                CommError::TransportUnavailable {
                    transport: TransportKind::Ib,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("proxy channel"), "{e}");
        match comm.connect(peer, &buf, 1, TransportKind::Ib) {
            // A machine with an RDMA device opens it; nothing more to check here.
            Ok(_) => {}
            Err(e) => {
                let msg = e.to_string();
                assert!(matches!(e, CommError::TransportUnavailable { .. }), "{msg}");
                if !cfg!(feature = "ib") {
                    assert!(
                        msg.contains("built without the cargo feature `ib`"),
                        "{msg}"
                    );
                }
            }
        }
        // The failed connect left no tag behind: the same tag works once a device exists.
        comm.use_ib_verbs(Arc::new(FakeVerbs::new(&fabric)));
        comm.connect(peer, &buf, 1, TransportKind::Ib).unwrap();
        // Keep both ranks alive until both are done (no setup round follows).
        comm.bootstrap().barrier().unwrap();
    });
}

fn staging_config(mode: ib::StagingMode) -> CommConfig {
    let mut c = config();
    c.ib.staging = mode;
    c
}

/// Host staging end to end over the fake fabric, both directions: every IB connection of
/// rank 0 (and, in the first pass, of rank 1) is forced to stage, so puts copy buffer →
/// mirror before the RDMA WRITE and arrivals are copied mirror → buffer by the receiving
/// proxy before it raises the counter. Random data every round, puts that split the range,
/// rounds with more puts than the ring has records (credits), flushes, a proxy relaunch
/// in the middle; and the last 64 bytes, which no put touches, keep what the receiver wrote
/// there itself (only recorded ranges are copied).
#[test]
fn ib_host_staging_moves_random_data_both_ways_and_copies_only_recorded_ranges() {
    use crate::transport::ib::fake::{FakeFabric, FakeVerbs};
    use ib::StagingMode::{Always, Auto};
    const ROUNDS: u64 = 60;
    const LEN: usize = 4096;
    const SENT: u64 = 4032;
    for rank1 in [Always, Auto] {
        let fabric = FakeFabric::new();
        let cfg = |r: usize| staging_config(if r == 0 { Always } else { rank1 });
        ranks_with(2, cfg, |mut comm| {
            comm.use_ib_verbs(Arc::new(FakeVerbs::new(&fabric)));
            let me = comm.rank();
            let peer = 1 - me;
            let buf = comm.alloc_buffer(LEN).unwrap();
            comm.connect(peer, &buf, 0, TransportKind::Ib).unwrap();
            comm.connection_setup().unwrap();
            let staged = me == 0 || rank1 == Always;
            assert_eq!(comm.connections()[0].ib_staged(), staged, "rank {me}");
            let conn = comm.device_connections()[0];
            let words = |seed: u64, round: u64| -> Vec<u64> {
                (0..LEN as u64 / 8)
                    .map(|i| probe_value(seed, round, i))
                    .collect()
            };
            for half in 0..2 {
                comm.proxy_launch().unwrap();
                for round in 1 + half * ROUNDS / 2..=(half + 1) * ROUNDS / 2 {
                    if (round % 2 == 1) == (me == 0) {
                        buf.write(0, &words(me as u64, round)).unwrap();
                        if round % 5 == 0 {
                            // More puts than the peer's ring has records, then the signal.
                            for i in 0..SENT / 8 {
                                conn.put(i * 8, 8);
                            }
                            conn.signal();
                        } else {
                            let cut = (round * 8) % SENT;
                            conn.put(0, cut);
                            conn.put_with_signal(cut, cut, SENT - cut);
                        }
                        if round % 7 == 0 {
                            conn.flush();
                        }
                    } else {
                        // Our own bytes where no put lands, written before the peer's data
                        // arrives (the peer is told nothing about them).
                        let tail = words(100 + me as u64, round);
                        buf.write(SENT as usize, &tail[SENT as usize / 8..])
                            .unwrap();
                        conn.wait();
                        let mut got = vec![0u64; LEN / 8];
                        buf.read(0, &mut got).unwrap();
                        let want = words(peer as u64, round);
                        for i in 0..LEN / 8 {
                            let w = if i < SENT as usize / 8 {
                                want[i]
                            } else {
                                tail[i]
                            };
                            assert_eq!(got[i], w, "rank {me} round {round} word {i}");
                        }
                    }
                    // The next sender overwrites its buffer only after this round's receiver
                    // has checked it (the buffer is the source and the destination).
                    comm.bootstrap().barrier().unwrap();
                }
                comm.proxy_stop().unwrap();
            }
        });
    }
}

/// A rank whose IB setup fails before its handshake (here: the fake refuses to register its
/// buffer) tells its peer, which fails at once naming that rank and the reason, instead of
/// waiting for the bootstrap's timeout (20 s in these tests).
#[test]
fn ib_setup_failure_on_one_rank_fails_the_peer_at_once() {
    use crate::transport::ib::fake::{FakeFabric, FakeVerbs};
    let fabric = FakeFabric::new();
    let start = std::time::Instant::now();
    let errors = ranks(2, |mut comm| {
        let verbs = Arc::new(FakeVerbs::new(&fabric));
        if comm.rank() == 1 {
            verbs
                .knobs
                .fail_registration
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        comm.use_ib_verbs(verbs);
        let peer = 1 - comm.rank();
        let buf = comm.alloc_buffer(256).unwrap();
        comm.connect(peer, &buf, 3, TransportKind::Ib).unwrap();
        let e = comm.connection_setup().unwrap_err();
        comm.bootstrap().barrier().unwrap();
        e
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    let (e0, e1) = (errors[0].to_string(), errors[1].to_string());
    assert!(matches!(errors[1], CommError::Ib(_)), "{e1}");
    assert!(e1.contains("fake: registration refused"), "{e1}");
    assert!(
        matches!(
            errors[0],
            CommError::Mismatch {
                peer: 1,
                tag: 3,
                ..
            }
        ),
        "{e0}"
    );
    assert!(
        e0.contains("rank 1 could not set up its side") && e0.contains("registration refused"),
        "{e0}"
    );
}

/// A staged receiver whose proxy never runs stops returning credits: the sender's proxy
/// reports it after the IB timeout instead of hanging, and later puts fail at once.
#[test]
fn ib_staging_ring_that_is_never_drained_is_reported() {
    use crate::transport::ib::fake::{FakeFabric, FakeVerbs};
    let fabric = FakeFabric::new();
    ranks_with(
        2,
        |_| {
            let mut c = staging_config(ib::StagingMode::Always);
            c.ib.timeout = Duration::from_millis(300);
            c
        },
        |mut comm| {
            comm.use_ib_verbs(Arc::new(FakeVerbs::new(&fabric)));
            let me = comm.rank();
            let buf = comm.alloc_buffer(4096).unwrap();
            comm.connect(1 - me, &buf, 0, TransportKind::Ib).unwrap();
            comm.connection_setup().unwrap();
            if me == 0 {
                let conn = comm.device_connections()[0];
                comm.proxy_launch().unwrap();
                let start = std::time::Instant::now();
                for i in 0..2 * ib::RING {
                    conn.put((i * 8) % 4096, 8);
                }
                let e = comm.proxy_stop().unwrap_err().to_string();
                assert!(start.elapsed() < Duration::from_secs(10));
                assert!(
                    e.contains("host staging") && e.contains("rank 1") && e.contains("ring"),
                    "{e}"
                );
            }
            comm.bootstrap().barrier().unwrap();
        },
    );
}

#[test]
fn a_put_outside_the_buffer_fails_the_next_signal_and_is_reported_at_once() {
    ranks(2, |mut comm| {
        let me = comm.rank();
        let buf = comm.alloc_buffer(1024).unwrap();
        comm.connect(1 - me, &buf, 1, TransportKind::Host).unwrap();
        comm.connect(1 - me, &buf, 2, TransportKind::Host).unwrap();
        comm.connection_setup().unwrap();
        let conns = comm.device_connections();
        let (bad, other) = (conns[0], conns[1]);
        comm.proxy_launch().unwrap();
        if me == 0 {
            bad.put_at(1000, 8, 100);
            let r = launch(Dim3::x(1), Dim3::x(1), || {
                assert_eq!(
                    bad.try_signal(),
                    Err(ChannelError::ProxyRefused { connection: 0 })
                );
                // Every later sync of that connection says so too; another one's does not.
                assert!(bad.try_flush().is_err());
                assert_eq!(other.try_signal(), Ok(()));
            });
            r.unwrap();
            // The host has it while the proxy still runs.
            let e = comm.proxy_error().expect("the proxy reported the put");
            for part in [
                "connection 0",
                "rank 1",
                "offset 1000",
                "100 bytes",
                "1024 bytes",
            ] {
                assert!(e.contains(part), "{part:?} missing from {e:?}");
            }
            assert_eq!(comm.proxy_errors().0.len(), 1);
        } else {
            // Both signals arrive: the refused put does not leave the peer waiting.
            bad.wait();
            other.wait();
        }
        comm.bootstrap().barrier().unwrap();
        let r = comm.proxy_stop();
        assert_eq!(r.is_err(), me == 0, "{r:?}");
        if me == 0 {
            // A relaunched proxy starts clean.
            comm.proxy_launch().unwrap();
            assert_eq!(bad.try_signal(), Ok(()));
            assert_eq!(comm.proxy_error(), None);
        } else {
            comm.proxy_launch().unwrap();
            bad.wait();
        }
        comm.bootstrap().barrier().unwrap();
        comm.proxy_stop().unwrap();
    });
}

/// Rank 0 waits, in a kernel on CPU threads, for a signal that never comes, while another
/// thread aborts the communicator after 200 ms: the wait must end with the abort, within a
/// second of it.
fn user_wait_ends_at_abort(
    wait: impl Fn() -> Result<(), ChannelError> + Sync,
    comm: &Communicator,
) {
    let aborted_at = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            *aborted_at.lock().unwrap() = Some(std::time::Instant::now());
            comm.abort();
        });
        let r = std::sync::Mutex::new(None);
        launch(Dim3::x(1), Dim3::x(1), || {
            *r.lock().unwrap() = Some(wait());
        })
        .unwrap();
        let took = aborted_at.lock().unwrap().expect("aborted").elapsed();
        assert_eq!(
            r.into_inner().unwrap(),
            Some(Err(ChannelError::Aborted { word: u64::MAX }))
        );
        assert!(
            took < Duration::from_secs(1),
            "the wait ended {took:?} after the abort"
        );
    });
}

#[test]
fn user_waits_on_memory_and_proxy_channels_end_at_abort() {
    ranks(2, |mut comm| {
        let me = comm.rank();
        let buf = comm.alloc_buffer(1024).unwrap();
        comm.connect(1 - me, &buf, 1, TransportKind::Host).unwrap();
        comm.connect_memory(1 - me, &buf, 2, TransportKind::Host, 256)
            .unwrap();
        comm.connection_setup().unwrap();
        comm.proxy_launch().unwrap();
        // Both ranks are set up before rank 0 aborts (rank 1 never signals nor sends).
        comm.bootstrap().barrier().unwrap();
        if me == 0 {
            let conn = comm.device_connections()[0];
            let ch = comm.memory_channels()[0];
            let long = 60_000_000_000;
            user_wait_ends_at_abort(|| ch.try_wait(long), &comm);
            // Already aborted: the next waits give up at once, packet waits included.
            assert!(!ch.wait_timeout(long));
            assert_eq!(
                ch.try_unpack_packets(0, 0, 64, 0, 1, 1, long),
                Err(ChannelError::Aborted { word: u64::MAX })
            );
            assert_eq!(
                conn.try_wait(long),
                Err(ChannelError::Aborted { word: u64::MAX })
            );
        }
        comm.bootstrap().barrier().unwrap();
        comm.proxy_stop().unwrap();
    });
    // The same for a proxy channel's wait, on a fresh communicator.
    ranks(2, |mut comm| {
        let me = comm.rank();
        let buf = comm.alloc_buffer(1024).unwrap();
        comm.connect(1 - me, &buf, 1, TransportKind::Host).unwrap();
        comm.connection_setup().unwrap();
        comm.proxy_launch().unwrap();
        comm.bootstrap().barrier().unwrap();
        if me == 0 {
            let conn = comm.device_connections()[0];
            user_wait_ends_at_abort(|| conn.try_wait(60_000_000_000), &comm);
        }
        comm.bootstrap().barrier().unwrap();
        comm.proxy_stop().unwrap();
    });
}

/// A proxy channel's flush (the FIFO sync: waiting for the proxy to pop a trigger), with no
/// proxy running to pop it, ends at the communicator's abort within a second, not at the
/// FIFO's 20 s timeout (the stress loop caught a rank spinning in this sync while its
/// peers were gone: the sync looked only at the clock).
#[test]
fn a_proxy_channel_sync_ends_at_abort() {
    on_rank_0_with_no_proxy(|comm, conn| {
        user_wait_ends_at_abort(|| conn.try_flush(), comm);
        assert_eq!(
            conn.try_put_with_signal(0, 0, 8),
            Err(ChannelError::Aborted { word: u64::MAX })
        );
    });
}

/// Two ranks, each with a Host proxy channel to the other and no proxy launched (nothing
/// pops the triggers): runs `f` on rank 0 with its communicator and the channel's handle.
fn on_rank_0_with_no_proxy(f: impl Fn(&Communicator, DevConn<'_>) + Sync) {
    ranks(2, |mut comm| {
        let me = comm.rank();
        let buf = comm.alloc_buffer(1024).unwrap();
        comm.connect(1 - me, &buf, 1, TransportKind::Host).unwrap();
        comm.connection_setup().unwrap();
        comm.bootstrap().barrier().unwrap();
        if me == 0 {
            f(&comm, comm.device_connections()[0]);
        }
        comm.bootstrap().barrier().unwrap();
    });
}

/// A push into a full FIFO (no proxy runs to pop it) ends at the communicator's abort within
/// a second, not at the FIFO's 20 s timeout; after the abort a plain put into the full ring
/// returns at once (dropped, not a trap) and the next signal reports the abort.
#[test]
fn a_push_into_a_full_fifo_ends_at_abort() {
    on_rank_0_with_no_proxy(|comm, conn| {
        let slots = config().fifo_slots;
        launch(Dim3::x(1), Dim3::x(1), || {
            for _ in 0..slots {
                conn.put_at(0, 0, 8);
            }
        })
        .unwrap();
        user_wait_ends_at_abort(|| conn.try_put_with_signal_queued(0, 0, 8), comm);
        let start = std::time::Instant::now();
        launch(Dim3::x(1), Dim3::x(1), || conn.put(0, 8)).unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "a put into the full ring after the abort took {:?}",
            start.elapsed()
        );
        assert_eq!(
            conn.try_signal(),
            Err(ChannelError::Aborted { word: u64::MAX })
        );
    });
}

/// Rank 1 sends one signal on a memory channel and on a proxy channel (over `transport`,
/// after a 64 KiB put into rank 0's buffer) and one set of LL packets, then leaves (drops
/// its communicator). Rank 0's waits, started before, take what was sent; its next waits,
/// for what never comes, end with `PeerLeft { rank: 1 }` within a second of the goodbye
/// instead of at their 60 s timeout. A wait on the channel of a rank that is still there
/// (rank 2) is not touched. `staging`: IB over the fake fabric, with these staging modes
/// (rank 0's, the others').
fn user_waits_end_when_their_peer_leaves(transport: TransportKind) {
    user_waits_end_when_their_peer_leaves_with(transport, None);
}

fn user_waits_end_when_their_peer_leaves_with(
    transport: TransportKind,
    staging: Option<[ib::StagingMode; 2]>,
) {
    const PUT: usize = 64 << 10;
    let left_at = std::sync::Mutex::new(None::<std::time::Instant>);
    let fabric = crate::transport::ib::fake::FakeFabric::new();
    let cfg = |r: usize| match staging {
        Some(modes) => staging_config(modes[usize::from(r != 0)]),
        None => config(),
    };
    ranks_with(3, cfg, |mut comm| {
        if staging.is_some() {
            comm.use_ib_verbs(Arc::new(crate::transport::ib::fake::FakeVerbs::new(
                &fabric,
            )));
        }
        let me = comm.rank();
        let buf = comm.alloc_buffer(1024).unwrap();
        let data = comm.alloc_buffer(PUT).unwrap();
        let peers: &[usize] = match me {
            0 => &[1, 2],
            _ => &[0],
        };
        for &p in peers {
            comm.connect(p, &data, 1, transport).unwrap();
            comm.connect_memory(p, &buf, 2, TransportKind::Host, 256)
                .unwrap();
        }
        comm.connection_setup().unwrap();
        if let Some(modes) = staging {
            let staged = modes[usize::from(me != 0)] == ib::StagingMode::Always;
            assert_eq!(comm.connections()[0].ib_staged(), staged, "rank {me}");
        }
        comm.proxy_launch().unwrap();
        comm.bootstrap().barrier().unwrap();
        let long = 60_000_000_000;
        match me {
            0 => {
                let conns = comm.device_connections();
                let chans = comm.memory_channels();
                // Connections to rank 1 come first (connect order).
                let (conn, ch) = (conns[0], chans[0]);
                let r = std::sync::Mutex::new(Vec::new());
                launch(Dim3::x(1), Dim3::x(1), || {
                    let mut r = r.lock().unwrap();
                    r.push(ch.try_unpack_packets(0, 0, 64, 0, 1, 1, long));
                    r.push(ch.try_wait(long));
                    r.push(conn.try_wait(long));
                    r.push(ch.try_unpack_packets(0, 0, 64, 0, 1, 2, long));
                    r.push(ch.try_wait(long));
                    r.push(conn.try_wait(long));
                })
                .unwrap();
                let took = left_at.lock().unwrap().expect("rank 1 left").elapsed();
                let left = Err(ChannelError::PeerLeft { rank: 1 });
                assert_eq!(
                    r.into_inner().unwrap(),
                    [Ok(()), Ok(()), Ok(()), left, left, left],
                    "{transport}"
                );
                assert!(took < Duration::from_secs(1), "{transport}: took {took:?}");
                // The put before the signal landed whole.
                let mut got = vec![0u8; PUT];
                data.read(0, &mut got).unwrap();
                for (i, &b) in got.iter().enumerate() {
                    assert_eq!(b, (i % 251) as u8, "{transport}: byte {i}");
                }
                // Rank 2 is still there: its channel's wait times out as before.
                assert_eq!(chans[1].try_wait(1_000_000), Err(ChannelError::Timeout));
                assert_eq!(conns[1].try_wait(1_000_000), Err(ChannelError::Timeout));
                comm.bootstrap().send(2, 0, b"done").unwrap();
            }
            1 => {
                let bytes: Vec<u8> = (0..PUT).map(|i| (i % 251) as u8).collect();
                data.write(0, &bytes).unwrap();
                let conn = comm.device_connections()[0];
                let ch = comm.memory_channels()[0];
                launch(Dim3::x(1), Dim3::x(1), || {
                    ch.put_packets(0, 0, 64, 0, 1, 1);
                    ch.signal();
                    conn.put(0, PUT as u64);
                    conn.signal();
                })
                .unwrap();
                comm.proxy_stop().unwrap();
                // Leave while rank 0 still waits (its first waits may even start after).
                std::thread::sleep(Duration::from_millis(100));
                *left_at.lock().unwrap() = Some(std::time::Instant::now());
                drop(comm);
                return;
            }
            _ => {
                comm.bootstrap().recv(0, 0).unwrap();
            }
        }
        comm.proxy_stop().unwrap();
    });
}

#[test]
fn user_waits_for_a_rank_that_left_end_at_its_goodbye() {
    user_waits_end_when_their_peer_leaves(TransportKind::Host);
}

/// Over TCP the "left" word also waits until the peer closed its streams after its last
/// frame ([`FaultArea::note_peer_drained`]): the put and the signal sent just before the
/// goodbye are taken, the next wait ends with `PeerLeft`.
#[test]
fn user_waits_over_tcp_for_a_rank_that_left_end_once_its_streams_drained() {
    user_waits_end_when_their_peer_leaves(TransportKind::Tcp);
}

/// Over IB (the fake fabric) the leaving rank's proxy completes its writes before the
/// goodbye (its plane's `finish`), so the put and the signal it sent last are taken; with
/// rank 0 receiving into a staged buffer, its proxy delivers them out of the mirror in a
/// settle pass before rank 1's "left" word is written. Rank 1 stages too in the second
/// case (its puts go through its mirror).
#[test]
fn user_waits_over_ib_for_a_rank_that_left_end_once_its_writes_landed() {
    use ib::StagingMode::{Always, Auto};
    for modes in [[Auto, Auto], [Always, Auto], [Always, Always]] {
        user_waits_end_when_their_peer_leaves_with(TransportKind::Ib, Some(modes));
    }
}

/// One proxy drives a Host and a TCP connection at once (two planes behind one `PlaneSet`),
/// and a buffer given to TCP in a later round needs no new name; TCP refuses memory
/// channels.
#[test]
fn tcp_and_host_connections_share_one_proxy() {
    ranks(2, |mut comm| {
        let me = comm.rank();
        let peer = 1 - me;
        let a = comm.alloc_buffer(4096).unwrap();
        let b = comm.alloc_buffer(1 << 16).unwrap();
        let e = comm
            .connect_memory(peer, &b, 9, TransportKind::Tcp, 0)
            .unwrap_err();
        assert!(
            matches!(
                e,
                CommError::TransportUnavailable {
                    transport: TransportKind::Tcp,
                    ..
                }
            ),
            "{e}"
        );
        comm.connect(peer, &a, 0, TransportKind::Host).unwrap();
        comm.connect(peer, &b, 1, TransportKind::Tcp).unwrap();
        comm.connection_setup().unwrap();
        // `a` was shared by name in the first round: Host refuses it now, TCP does not.
        assert!(comm.connect(peer, &a, 2, TransportKind::Host).is_err());
        comm.connect(peer, &a, 3, TransportKind::Tcp).unwrap();
        comm.connection_setup().unwrap();
        let kinds: Vec<_> = comm.connections().iter().map(|c| c.transport()).collect();
        assert_eq!(
            kinds,
            [TransportKind::Host, TransportKind::Tcp, TransportKind::Tcp]
        );
        let conns = comm.device_connections();
        comm.proxy_launch().unwrap();
        for round in 1..=3u64 {
            fill(&a, me as u64, round);
            fill(&b, me as u64 + 10, round);
            comm.bootstrap().barrier().unwrap();
            // Round 2 moves `a` over TCP instead of shared memory. Each rank sends its
            // half (the buffers are both sources and destinations).
            let a_conn = if round == 2 { &conns[2] } else { &conns[0] };
            let half = |buf: &Buffer| (buf.len() / 2) as u64;
            a_conn.put(me as u64 * half(&a), half(&a));
            conns[1].put(me as u64 * half(&b), half(&b));
            a_conn.signal();
            conns[1].signal();
            a_conn.wait();
            conns[1].wait();
            for (buf, seed, what) in [(&a, peer as u64, "a"), (&b, peer as u64 + 10, "b")] {
                let mut words = vec![0u64; buf.len() / 8];
                buf.read(0, &mut words).unwrap();
                let theirs = peer * words.len() / 2..(peer + 1) * words.len() / 2;
                for i in theirs {
                    let want = probe_value(seed, round, i as u64);
                    assert_eq!(words[i], want, "{what}, round {round}: word {i}");
                }
            }
            comm.bootstrap().barrier().unwrap();
        }
        comm.proxy_stop().unwrap();
    });
}

/// Error messages name the collectives' connections by what they carry (no internal
/// numbers), and a user's connection by its tag.
#[test]
fn connection_tags_are_named_in_messages() {
    let cross = ConnTag(0xC011_0005).to_string();
    assert!(
        cross.contains("rounds across hosts") && !cross.contains("0xc0110005"),
        "{cross}"
    );
    let lane = ConnTag(0xC011_0103).to_string();
    assert!(lane.contains("proxy lane 3"), "{lane}");
    assert_eq!(ConnTag(7).to_string(), "tag 7");
    let e = crate::transport::tcp::TcpError::PeerLost {
        peer: 1,
        tag: 0xC011_0005,
        why: "the peer closed the connection".into(),
    }
    .to_string();
    assert!(
        e.contains("rounds across hosts") && !e.contains("3222339589"),
        "{e}"
    );
}

/// `MSCCLPP_DEVICE_TIMEOUT` takes seconds (whole or fractional), is unset when empty, and
/// names itself when it cannot be read.
#[test]
fn device_timeout_env_values_are_read_or_refused_by_name() {
    let read = |v: &str| {
        crate::settings::Settings::from_vars([(DEVICE_TIMEOUT_ENV, v)]).map(|s| s.device_timeout)
    };
    assert_eq!(read("10").unwrap(), Some(Duration::from_secs(10)));
    assert_eq!(read(" 2.5 ").unwrap(), Some(Duration::from_millis(2500)));
    // Empty: unset, as MSCCLPP_BOOTSTRAP_TIMEOUT.
    assert_eq!(read("").unwrap(), None);
    assert_eq!(read("  ").unwrap(), None);
    for bad in ["0", "-1", "ten", "inf", "NaN", "86401"] {
        let e = read(bad).unwrap_err().to_string();
        assert!(
            e.contains(DEVICE_TIMEOUT_ENV) && e.contains(&format!("{bad:?}")),
            "{bad}: {e}"
        );
    }
}
