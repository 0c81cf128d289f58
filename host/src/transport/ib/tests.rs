//! The IB transport against `FakeVerbs`: handshake codec, queue-pair states, the plane's
//! signalling, flushing and error paths; and what a machine without RDMA reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::fake::{FakeFabric, FakeVerbs};
use super::*;
use crate::transport::{DataPlane, Route, TransportError};

fn handshake() -> IbHandshake {
    IbHandshake {
        endpoint: IbEndpoint {
            lid: 7,
            gid: [0; 16],
            mtu: 4096,
            qpn: 0x1234,
            psn: 0xabcdef,
        },
        buffer: RdmaRegion {
            addr: 0x7f00_0000_0000,
            len: 1 << 20,
            rkey: 0x55,
        },
        flag: RdmaRegion {
            addr: 0x7f00_1000_0008,
            len: 8,
            rkey: 0x66,
        },
        staged: false,
        control: RdmaRegion {
            addr: 0x7f00_2000_0000,
            len: CONTROL_BYTES,
            rkey: 0x77,
        },
    }
}

prop_compose! {
    fn valid_handshake()(
        lid in any::<u16>(), gid in any::<[u8; 16]>(), mtu in prop::sample::select(vec![256u32, 512, 1024, 2048, 4096]),
        qpn in 2u32..=0xff_ffff, psn in 0u32..=0xff_ffff,
        baddr in 0u64..(1 << 56), blen in 1u64..(1 << 40), brkey in any::<u32>(),
        faddr in (0u64..(1 << 56)).prop_map(|a| a & !7), frkey in any::<u32>(),
        staged in any::<bool>(), caddr in (0u64..(1 << 56)).prop_map(|a| a & !7), crkey in any::<u32>(),
    ) -> IbHandshake {
        let gid = if lid == 0 && gid == [0; 16] { [1; 16] } else { gid };
        // A staged side's flag is its control block's epoch word.
        let faddr = if staged { caddr } else { faddr };
        IbHandshake {
            endpoint: IbEndpoint { lid, gid, mtu, qpn, psn },
            buffer: RdmaRegion { addr: baddr, len: blen, rkey: brkey },
            flag: RdmaRegion { addr: faddr, len: 8, rkey: frkey },
            staged,
            control: RdmaRegion { addr: caddr, len: CONTROL_BYTES, rkey: crkey },
        }
    }
}

proptest! {
    #[test]
    fn handshake_round_trips(h in valid_handshake()) {
        prop_assert_eq!(decode_handshake(&encode_handshake(&h)).unwrap(), h);
    }

    #[test]
    fn garbage_is_refused_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        // Random bytes almost never carry the magic; when they do, the rest must still decode
        // and validate. Either way: an error or a valid handshake, never a panic.
        if let Ok(h) = decode_handshake(&bytes) {
            prop_assert!(h.validate().is_ok());
        }
    }

    #[test]
    fn every_strict_prefix_and_any_extension_is_refused(h in valid_handshake(), cut in any::<prop::sample::Index>(), extra in 1usize..8) {
        let bytes = encode_handshake(&h);
        let n = cut.index(bytes.len());
        prop_assert!(decode_handshake(&bytes[..n]).is_err());
        let mut longer = bytes.clone();
        longer.extend(std::iter::repeat_n(0u8, extra));
        prop_assert!(decode_handshake(&longer).is_err());
    }
}

#[test]
fn handshake_fields_are_validated() {
    let ok = handshake();
    assert!(ok.validate().is_ok());
    let cases: Vec<(&str, IbHandshake)> = vec![
        ("qpn beyond 24 bits", {
            let mut h = ok;
            h.endpoint.qpn = 1 << 24;
            h
        }),
        ("special qpn 1", {
            let mut h = ok;
            h.endpoint.qpn = 1;
            h
        }),
        ("psn beyond 24 bits", {
            let mut h = ok;
            h.endpoint.psn = 1 << 24;
            h
        }),
        ("mtu", {
            let mut h = ok;
            h.endpoint.mtu = 3000;
            h
        }),
        ("no address", {
            let mut h = ok;
            h.endpoint.lid = 0;
            h
        }),
        ("empty buffer", {
            let mut h = ok;
            h.buffer.len = 0;
            h
        }),
        ("wrapping buffer", {
            let mut h = ok;
            h.buffer.addr = u64::MAX - 4;
            h
        }),
        ("flag of 7 bytes", {
            let mut h = ok;
            h.flag.len = 7;
            h
        }),
        ("unaligned flag", {
            let mut h = ok;
            h.flag.addr += 4;
            h
        }),
        ("short control block", {
            let mut h = ok;
            h.control.len -= 8;
            h
        }),
        ("unaligned control block", {
            let mut h = ok;
            h.control.addr += 4;
            h
        }),
        ("staged, flag elsewhere", {
            let mut h = ok;
            h.staged = true;
            h
        }),
    ];
    for (what, h) in cases {
        let e = decode_handshake(&encode_handshake(&h)).unwrap_err();
        assert!(matches!(e, IbError::BadHandshake(_)), "{what}: {e}");
    }
    let mut bytes = encode_handshake(&ok);
    bytes[0] = b'X';
    assert!(
        decode_handshake(&bytes)
            .unwrap_err()
            .to_string()
            .contains("magic")
    );
    let mut bytes = encode_handshake(&ok);
    bytes[4] = 9;
    assert!(
        decode_handshake(&bytes)
            .unwrap_err()
            .to_string()
            .contains("version")
    );
    assert!(decode_handshake(&[0; 1000]).is_err());
}

#[test]
fn transition_table() {
    use QpState::*;
    let all = [Reset, Init, ReadyToReceive, ReadyToSend, Error];
    let legal = [
        (Reset, Init),
        (Init, Init),
        (Init, ReadyToReceive),
        (ReadyToReceive, ReadyToSend),
        (ReadyToSend, ReadyToSend),
    ];
    for from in all {
        for to in all {
            let expect = legal.contains(&(from, to)) || to == Reset || to == Error;
            assert_eq!(
                check_transition(1, from, to).is_ok(),
                expect,
                "{from:?} -> {to:?}"
            );
        }
    }
}

fn endpoint(v: &FakeVerbs, qp: &dyn QueuePair) -> IbEndpoint {
    let p = v.port();
    IbEndpoint {
        lid: p.lid,
        gid: p.gid,
        mtu: p.mtu,
        qpn: qp.qpn(),
        psn: 0,
    }
}

#[test]
fn fake_queue_pairs_refuse_illegal_transitions_and_early_posts() {
    let fabric = FakeFabric::new();
    let v = FakeVerbs::new(&fabric);
    let mut qp = v.create_qp(16).unwrap();
    let me = endpoint(&v, qp.as_ref());
    let wr = WriteRequest {
        wr_id: 1,
        source: WriteSource::Inline([0; 8]),
        remote_addr: 0,
        rkey: 0,
        signaled: true,
    };
    assert!(matches!(
        qp.post_write(&wr),
        Err(IbError::NotReadyToSend {
            state: QpState::Reset,
            ..
        })
    ));
    for bad in [
        QpTransition::ReadyToReceive(&me),
        QpTransition::ReadyToSend { psn: 0 },
    ] {
        let e = qp.modify(bad).unwrap_err();
        assert!(matches!(e, IbError::IllegalTransition { .. }), "{e}");
    }
    assert_eq!(qp.state(), QpState::Reset);
    qp.modify(QpTransition::Init).unwrap();
    assert!(qp.modify(QpTransition::ReadyToSend { psn: 0 }).is_err());
    assert!(matches!(
        qp.post_write(&wr),
        Err(IbError::NotReadyToSend {
            state: QpState::Init,
            ..
        })
    ));
    qp.modify(QpTransition::ReadyToReceive(&me)).unwrap();
    assert!(qp.post_write(&wr).is_err(), "RTR cannot send");
    qp.modify(QpTransition::ReadyToSend { psn: 0 }).unwrap();
    assert_eq!(qp.state(), QpState::ReadyToSend);
    assert!(qp.modify(QpTransition::Init).is_err(), "RTS -> INIT");
}

/// Two fake devices with one connected pair of queue pairs, a source and a destination
/// buffer and a flag word, all registered.
struct Pair {
    a: FakeVerbs,
    _b: FakeVerbs,
    src: Vec<u8>,
    dst: Vec<u8>,
    flag: Box<AtomicU64>,
    qp_a: Arc<Mutex<Box<dyn QueuePair>>>,
    _qp_b: Box<dyn QueuePair>,
    regs: Vec<MemoryRegistration>,
}

impl Pair {
    fn new(len: usize) -> Pair {
        let fabric = FakeFabric::new();
        let (a, b) = (FakeVerbs::new(&fabric), FakeVerbs::new(&fabric));
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let dst = vec![0u8; len];
        let flag = Box::new(AtomicU64::new(0));
        // SAFETY: the three regions live in `Pair` next to their registrations, which are
        // dropped first (field order) or together with them.
        let regs = unsafe {
            vec![
                a.register(src.as_ptr() as u64, len as u64, MemoryKind::Host)
                    .unwrap(),
                b.register(dst.as_ptr() as u64, len as u64, MemoryKind::Host)
                    .unwrap(),
                b.register(flag.as_ptr() as u64, 8, MemoryKind::Host)
                    .unwrap(),
            ]
        };
        let mut qa = a.create_qp(16).unwrap();
        let mut qb = b.create_qp(16).unwrap();
        let (ea, eb) = (endpoint(&a, qa.as_ref()), endpoint(&b, qb.as_ref()));
        for (q, remote) in [(&mut qa, &eb), (&mut qb, &ea)] {
            q.modify(QpTransition::Init).unwrap();
            q.modify(QpTransition::ReadyToReceive(remote)).unwrap();
            q.modify(QpTransition::ReadyToSend { psn: 0 }).unwrap();
        }
        Pair {
            a,
            _b: b,
            src,
            dst,
            flag,
            qp_a: Arc::new(Mutex::new(qa)),
            _qp_b: qb,
            regs,
        }
    }

    fn route(&self) -> Route {
        Route {
            id: 0,
            local: self.src.as_ptr() as u64,
            local_len: self.src.len() as u64,
            remote: self.dst.as_ptr() as u64,
            remote_len: self.dst.len() as u64,
            remote_flag: self.flag.as_ptr() as u64,
        }
    }

    fn link(&self) -> IbLink {
        IbLink {
            qp: self.qp_a.clone(),
            peer: 3,
            tag: 42,
            lkey: self.regs[0].lkey,
            rkey: self.regs[1].rkey,
            flag_rkey: self.regs[2].rkey,
            staging: None,
        }
    }

    fn plane(&self, signal_every: u32, timeout: Duration) -> IbPlane {
        let config = IbConfig {
            depth: 16,
            signal_every,
            timeout,
            staging: StagingMode::Auto,
        };
        IbPlane::new(vec![Some(self.link())], &[0], config).unwrap()
    }
}

#[test]
fn puts_and_flag_land_in_order_and_flush_waits_for_all() {
    let p = Pair::new(4096);
    let r = p.route();
    let mut plane = p.plane(4, Duration::from_secs(5));
    // 40 puts of 100 bytes then a signal: more than the queue depth, so the plane must wait
    // for completions while posting; the fake executes 2 requests per poll.
    for i in 0..40u64 {
        plane.put(&r, i * 100, i * 100, 100).unwrap();
    }
    plane.signal(&r, 1).unwrap();
    plane.flush().unwrap();
    assert_eq!(&p.dst[..4000], &p.src[..4000], "every put landed by flush");
    assert!(p.dst[4000..].iter().all(|b| *b == 0));
    assert_eq!(p.flag.load(Ordering::Acquire), 1);
    let posted = p.a.knobs.posted.load(Ordering::Relaxed);
    let signaled = p.a.knobs.signaled.load(Ordering::Relaxed);
    // 41 requests, every 4th signalled (10), plus the flush fence (the 41st was unsignalled).
    assert_eq!((posted, signaled), (42, 11), "selective signalling");
    // A flush with nothing outstanding posts nothing.
    plane.flush().unwrap();
    assert_eq!(p.a.knobs.posted.load(Ordering::Relaxed), 42);
}

#[test]
fn flush_fence_rewrites_the_current_epoch_not_an_old_one() {
    let p = Pair::new(256);
    let r = p.route();
    let config = IbConfig {
        depth: 16,
        signal_every: 8,
        timeout: Duration::from_secs(5),
        staging: StagingMode::Auto,
    };
    // A relaunched proxy: the peer's counter already holds 5.
    p.flag.store(5, Ordering::Relaxed);
    let mut plane = IbPlane::new(vec![Some(p.link())], &[5], config).unwrap();
    plane.put(&r, 0, 0, 8).unwrap();
    plane.flush().unwrap();
    assert_eq!(p.flag.load(Ordering::Acquire), 5, "fence kept the epoch");
    plane.signal(&r, 6).unwrap();
    plane.put(&r, 8, 8, 8).unwrap();
    plane.flush().unwrap();
    assert_eq!(p.flag.load(Ordering::Acquire), 6);
    assert_eq!(&p.dst[..16], &p.src[..16]);
}

/// A stopping proxy's `finish` completes what was posted and never flushed (puts and a
/// signal: the peer may take them as landed once this rank's goodbye comes), and on a link
/// that stalls it gives up after `FINISH_WAIT` at most, even with a longer plane timeout.
#[test]
fn finish_lands_what_was_posted_and_gives_up_on_a_stalled_link() {
    let p = Pair::new(1024);
    let r = p.route();
    let mut plane = p.plane(8, Duration::from_secs(5));
    plane.put(&r, 0, 0, 1000).unwrap();
    plane.signal(&r, 1).unwrap();
    assert_eq!(
        p.flag.load(Ordering::Acquire),
        0,
        "the fake runs writes only when polled"
    );
    plane.finish().unwrap();
    assert_eq!(&p.dst[..1000], &p.src[..1000]);
    assert_eq!(p.flag.load(Ordering::Acquire), 1);
    let stalled = Pair::new(256);
    let r = stalled.route();
    stalled
        .a
        .knobs
        .completions_per_poll
        .store(0, Ordering::Relaxed);
    let mut plane = stalled.plane(8, Duration::from_secs(60));
    plane.put(&r, 0, 0, 64).unwrap();
    let start = Instant::now();
    let e = plane.finish().unwrap_err();
    let took = start.elapsed();
    assert!(
        took >= plane::FINISH_WAIT && took < plane::FINISH_WAIT + Duration::from_secs(3),
        "finish gave up after {took:?}"
    );
    assert!(
        matches!(e, TransportError::Ib(IbError::Timeout { peer: 3, .. })),
        "{e}"
    );
}

#[test]
fn stalled_link_times_out_naming_the_connection() {
    let p = Pair::new(256);
    let r = p.route();
    p.a.knobs.completions_per_poll.store(0, Ordering::Relaxed);
    let mut plane = p.plane(4, Duration::from_millis(50));
    plane.put(&r, 0, 0, 64).unwrap();
    let start = Instant::now();
    let e = plane.flush().unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            TransportError::Ib(IbError::Timeout {
                connection: 0,
                peer: 3,
                tag: 42,
                ..
            })
        ),
        "{msg}"
    );
    assert!(msg.contains("rank 3") && msg.contains("tag 42"), "{msg}");
}

#[test]
fn wrong_remote_key_is_an_error_completion_naming_the_peer() {
    let p = Pair::new(256);
    let r = p.route();
    let mut link = p.link();
    link.rkey ^= 0x1000;
    let config = IbConfig {
        depth: 16,
        signal_every: 4,
        timeout: Duration::from_secs(5),
        staging: StagingMode::Auto,
    };
    let mut plane = IbPlane::new(vec![Some(link)], &[0], config).unwrap();
    plane.put(&r, 0, 0, 64).unwrap();
    let e = plane.flush().unwrap_err().to_string();
    assert!(e.contains("remote access error"), "{e}");
    assert!(
        e.contains("connection 0") && e.contains("rank 3") && e.contains("tag 42"),
        "{e}"
    );
    assert!(p.dst.iter().all(|b| *b == 0), "nothing written");
    // The connection stays failed: later operations report it instead of hanging.
    let again = plane.put(&r, 0, 0, 8).unwrap_err().to_string();
    assert!(again.contains("already failed"), "{again}");
    assert!(plane.signal(&r, 1).is_err());
}

/// Polls `qp` until `n` completions came (the fake executes writes as it is polled).
fn poll_n(qp: &Mutex<Box<dyn QueuePair>>, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    for _ in 0..100 {
        qp.lock().unwrap().poll(&mut out).unwrap();
        if out.len() >= n {
            break;
        }
    }
    out
}

/// What Soft-RoCE (rdma_rxe, two machines, scripts/ib-rxe-vms.sh) reported, as the fake
/// reports it: a zero-length write succeeds whatever the remote key; a wrong key fails its
/// request with status 10 even unsignalled, the request behind it completes flushed
/// (status 5), in posting order, and nothing lands; the queue pair then refuses posts; a
/// local range outside its registration is status 4; a peer whose queue pair is gone,
/// status 12.
#[test]
fn queue_pair_errors_are_the_statuses_soft_roce_reports() {
    let p = Pair::new(256);
    let write = |wr_id, source, rkey, signaled| WriteRequest {
        wr_id,
        source,
        remote_addr: p.dst.as_ptr() as u64,
        rkey,
        signaled,
    };
    let data = WriteSource::Registered {
        addr: p.src.as_ptr() as u64,
        len: 64,
        lkey: p.regs[0].lkey,
    };
    let empty = WriteSource::Registered {
        addr: 0,
        len: 0,
        lkey: p.regs[0].lkey,
    };
    let (good, bad) = (p.regs[1].rkey, p.regs[1].rkey ^ 0x00ff_ff00);
    {
        let mut qp = p.qp_a.lock().unwrap();
        qp.post_write(&write(1, empty, bad, true)).unwrap();
    }
    assert_eq!(
        poll_n(&p.qp_a, 1),
        [Completion {
            wr_id: 1,
            error: None
        }],
        "zero-length write with a wrong key"
    );
    {
        let mut qp = p.qp_a.lock().unwrap();
        qp.post_write(&write(2, data, bad, false)).unwrap();
        qp.post_write(&write(3, data, good, true)).unwrap();
    }
    let c = poll_n(&p.qp_a, 2);
    assert_eq!(c.len(), 2, "{c:?}");
    let status = |c: &Completion| c.error.clone().unwrap_or_default();
    assert_eq!(c[0].wr_id, 2);
    assert!(
        status(&c[0]).starts_with("remote access error") && status(&c[0]).contains("(status 10)"),
        "{c:?}"
    );
    assert_eq!(c[1].wr_id, 3);
    assert!(
        status(&c[1]).starts_with("work request flushed") && status(&c[1]).contains("(status 5)"),
        "{c:?}"
    );
    assert!(p.dst.iter().all(|b| *b == 0), "nothing landed");
    let again = p
        .qp_a
        .lock()
        .unwrap()
        .post_write(&write(4, data, good, true));
    assert!(
        matches!(
            again,
            Err(IbError::NotReadyToSend {
                state: QpState::Error,
                ..
            })
        ),
        "{again:?}"
    );

    let p = Pair::new(256);
    let outside = WriteSource::Registered {
        addr: p.src.as_ptr() as u64 + 224,
        len: 64,
        lkey: p.regs[0].lkey,
    };
    let write = |source| WriteRequest {
        wr_id: 1,
        source,
        remote_addr: p.dst.as_ptr() as u64,
        rkey: p.regs[1].rkey,
        signaled: true,
    };
    p.qp_a.lock().unwrap().post_write(&write(outside)).unwrap();
    let c = poll_n(&p.qp_a, 1);
    assert!(
        c.len() == 1 && status(&c[0]).starts_with("local protection error (status 4)"),
        "{c:?}"
    );

    let p = Pair::new(256);
    drop(p._qp_b);
    let qp_a = &p.qp_a;
    let gone = WriteRequest {
        wr_id: 1,
        source: WriteSource::Inline([1; 8]),
        remote_addr: 0,
        rkey: 0,
        signaled: true,
    };
    qp_a.lock().unwrap().post_write(&gone).unwrap();
    let c = poll_n(qp_a, 1);
    assert!(
        c.len() == 1
            && status(&c[0]).starts_with("transport retry counter exceeded")
            && status(&c[0]).contains("(status 12)"),
        "{c:?}"
    );
}

/// A peer that left with its work ended: its connections are reported gone once, the
/// others not; before it left, none.
#[test]
fn connections_of_a_peer_that_left_are_gone_once() {
    use super::plane::PeerDepartures;
    let p = Pair::new(64);
    let departures = Arc::new(PeerDepartures::default());
    let mut plane = p
        .plane(4, Duration::from_secs(5))
        .with_departures(departures.clone());
    let mut gone = Vec::new();
    plane.take_gone(&mut gone);
    assert!(gone.is_empty(), "nobody left yet: {gone:?}");
    departures.note_left(5);
    plane.take_gone(&mut gone);
    assert!(gone.is_empty(), "rank 5 has no connection here: {gone:?}");
    // The link's peer is rank 3.
    departures.note_left(3);
    plane.take_gone(&mut gone);
    assert_eq!(gone, [0]);
    plane.take_gone(&mut gone);
    assert_eq!(gone, [0], "reported once");
    // A plane made after the peer left reports it too.
    let mut later = p
        .plane(4, Duration::from_secs(5))
        .with_departures(departures.clone());
    let mut gone = Vec::new();
    later.take_gone(&mut gone);
    assert_eq!(gone, [0]);
}

#[test]
fn local_range_outside_the_registration_is_a_local_protection_error() {
    let p = Pair::new(256);
    let mut r = p.route();
    // The route claims a larger local buffer than was registered: the proxy's bounds check
    // passes, the verbs (fake NIC) refuse.
    r.local_len = 512;
    let mut plane = p.plane(1, Duration::from_secs(5));
    // The error may come from the post (which reaps what completed) or from the flush.
    let e = match plane.put(&r, 0, 300, 56) {
        Err(e) => e,
        Ok(()) => plane.flush().unwrap_err(),
    };
    assert!(e.to_string().contains("local protection"), "{e}");
}

#[test]
fn out_of_bounds_puts_are_refused_before_posting() {
    let p = Pair::new(256);
    let r = p.route();
    let mut plane = p.plane(4, Duration::from_secs(5));
    for (d, s, n) in [(250, 0, 8), (0, 250, 8), (u64::MAX, 0, 2)] {
        let e = plane.put(&r, d, s, n).unwrap_err();
        assert!(matches!(e, TransportError::OutOfBounds { .. }), "{e}");
    }
    assert_eq!(p.a.knobs.posted.load(Ordering::Relaxed), 0);
}

#[test]
fn unknown_connection_and_bad_config_are_errors() {
    let p = Pair::new(64);
    let mut r = p.route();
    r.id = 5;
    let mut plane = p.plane(4, Duration::from_secs(1));
    assert!(matches!(
        plane.put(&r, 0, 0, 8),
        Err(TransportError::Ib(IbError::UnknownConnection(5)))
    ));
    for (depth, every) in [(16, 0), (16, 16), (1, 1)] {
        let c = IbConfig {
            depth,
            signal_every: every,
            timeout: Duration::from_secs(1),
            staging: StagingMode::Auto,
        };
        assert!(IbPlane::new(vec![], &[], c).is_err(), "{depth} {every}");
    }
}

#[test]
fn registration_failure_is_reported() {
    let fabric = FakeFabric::new();
    let v = FakeVerbs::new(&fabric);
    v.knobs
        .fail_registration
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let buf = [0u8; 64];
    // SAFETY: `buf` outlives the (failed) registration.
    let e = unsafe { v.register(buf.as_ptr() as u64, 64, MemoryKind::Gpu) }.unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            IbError::Registration {
                memory: "GPU",
                len: 64,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains(v.device_name()), "{msg}");
}

#[test]
fn device_selection_by_name_or_index_and_its_errors() {
    let names = vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
    let sel = |d: Option<&str>| Selection {
        device: d.map(str::to_string),
        port: 1,
        gid_index: 0,
    };
    assert_eq!(sel(None).pick(&names).unwrap(), 0);
    assert_eq!(sel(Some("mlx5_1")).pick(&names).unwrap(), 1);
    assert_eq!(sel(Some("1")).pick(&names).unwrap(), 1);
    for bad in ["mlx5_9", "2", "-1", ""] {
        let e = sel(Some(bad)).pick(&names).unwrap_err().to_string();
        assert!(e.contains("0: mlx5_0, 1: mlx5_1"), "{bad}: {e}");
        assert!(e.contains(IB_DEVICE_ENV), "{e}");
    }
    let e = sel(None).pick(&[]).unwrap_err().to_string();
    assert!(e.contains("no RDMA device"), "{e}");
    assert!(
        e.contains("P2p") && e.contains("Host"),
        "names the alternatives: {e}"
    );
}

#[test]
fn wc_status_names_cover_the_common_failures() {
    assert!(wc_status_name(10).contains("remote access"));
    assert!(wc_status_name(12).contains("retry"));
    assert_eq!(wc_status_name(999), "status 999");
}

/// On this machine: either the real device opens, or the error says what is missing and
/// what would work. Without the `ib` feature it says the library was built without it.
#[test]
fn opening_without_a_device_says_what_was_found_and_what_works() {
    match open_from_env() {
        Ok(v) => eprintln!("RDMA device present: {}", v.device_name()),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                matches!(e, IbError::Unavailable(_) | IbError::NoSuchDevice { .. }),
                "{msg}"
            );
            if cfg!(feature = "ib") {
                assert!(
                    msg.contains("libibverbs") || msg.contains("device") || msg.contains("port"),
                    "{msg}"
                );
            } else {
                assert!(
                    msg.contains("built without the cargo feature `ib`"),
                    "{msg}"
                );
            }
            if !msg.contains(IB_DEVICE_ENV) && !msg.contains("port") {
                assert!(msg.contains("P2p") && msg.contains("Host"), "{msg}");
            }
        }
    }
}

#[test]
fn flags_are_little_endian_on_the_wire() {
    let p = Pair::new(64);
    let r = p.route();
    let mut plane = p.plane(4, Duration::from_secs(5));
    let epoch = 0x0102_0304_0506_0708u64;
    plane.signal(&r, epoch).unwrap();
    plane.flush().unwrap();
    // The bytes in memory, whatever this machine's byte order.
    assert_eq!(
        p.flag.load(Ordering::Acquire).to_ne_bytes(),
        epoch.to_le_bytes()
    );
}

#[test]
fn staging_mode_and_records_parse_and_refuse() {
    use super::staging::{decode_record, encode_record};
    for (v, m) in [
        ("1", StagingMode::Always),
        (" always ", StagingMode::Always),
        ("0", StagingMode::Never),
        ("AUTO", StagingMode::Auto),
    ] {
        assert_eq!(crate::settings::Choice::parse(v), Ok(m), "{v}");
    }
    let e = crate::settings::Settings::from_vars([(IB_STAGING_ENV, "sometimes")])
        .unwrap_err()
        .to_string();
    assert!(e.contains(IB_STAGING_ENV), "{e}");
    assert_eq!(IbConfig::default().staging, StagingMode::Auto);
    for (off, size) in [(0, 1), (4095, 1), (u32::MAX as u64, u32::MAX as u64)] {
        assert_eq!(
            decode_record(encode_record(off, size).unwrap()),
            (off, size)
        );
    }
    assert!(
        encode_record(0, 0).is_none(),
        "zero-size puts are not recorded"
    );
    assert!(encode_record(1 << 32, 1).is_none());
    assert!(encode_record(0, 1 << 32).is_none());
}
