use super::iface::*;
use super::setup::*;
use super::*;

#[test]
fn ifname_spec_as_nccl() {
    assert!(ifname_matches("eth", "eth0"));
    assert!(ifname_matches("ib,eth", "eth1"));
    assert!(!ifname_matches("eth", "lo"));
    assert!(ifname_matches("^docker,lo", "eth0"));
    assert!(!ifname_matches("^docker,lo", "docker0"));
    assert!(ifname_matches("=eth0", "eth0"));
    assert!(!ifname_matches("=eth0", "eth01"));
    assert!(!ifname_matches("^=lo", "lo"));
}

fn iface(name: &str, ip: &str) -> (String, IpAddr) {
    (name.to_string(), ip.parse().unwrap())
}

#[test]
fn the_root_address_follows_nccl_order_without_a_setting() {
    let lo = iface("lo", "127.0.0.1");
    let eth = iface("eth0", "10.0.0.5");
    let eth6 = iface("eth1", "fd00::5");
    let ib = iface("ib0", "192.168.1.7");
    let docker = iface("docker0", "172.17.0.1");
    let ip = |found: &[(String, IpAddr)]| default_root_ip(found).to_string();
    assert_eq!(ip(&[lo.clone(), eth.clone(), ib.clone()]), "192.168.1.7");
    assert_eq!(ip(&[lo.clone(), docker.clone(), eth.clone()]), "10.0.0.5");
    assert_eq!(ip(&[lo.clone(), docker.clone(), eth6.clone()]), "fd00::5");
    assert_eq!(ip(&[lo.clone(), docker.clone()]), "172.17.0.1");
    assert_eq!(ip(std::slice::from_ref(&lo)), "127.0.0.1");
    assert_eq!(ip(&[]), "127.0.0.1");
}

#[test]
fn a_named_interface_is_used_or_refused_with_every_interface_named() {
    let found = [iface("lo", "127.0.0.1"), iface("eth0", "10.0.0.5")];
    let ip = matching_ip(NCCL_SOCKET_IFNAME_ENV, "=lo", &found).unwrap();
    assert_eq!(ip.to_string(), "127.0.0.1");
    let ip = matching_ip(SOCKET_IFNAME_ENV, "^lo", &found).unwrap();
    assert_eq!(ip.to_string(), "10.0.0.5");
    let e = matching_ip(NCCL_SOCKET_IFNAME_ENV, "ib", &found)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("NCCL_SOCKET_IFNAME=ib") && e.contains("lo 127.0.0.1, eth0 10.0.0.5"),
        "{e}"
    );
}

#[test]
fn the_default_root_address_takes_connections() {
    // On this machine, whatever it picks (its own address, or loopback) must accept a
    // connection from here, as ranks on the same machine make.
    let ip = default_root_ip(&interfaces().unwrap());
    let l = TcpListener::bind((ip, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let _c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    let (_s, _) = l.accept().unwrap();
}

#[test]
fn loopback_is_listed() {
    let found = interfaces().unwrap();
    assert!(found.iter().any(|(_, ip)| ip.is_loopback()), "{found:?}");
}

/// Rank 1 of 3 waits in `accept_for` for sockets that rank 0 (alive) never opens while
/// rank 2 dies (its bootstrap dropped without a goodbye): the wait ends as soon as the
/// loss is known, naming rank 2, not at the 20 s timeout; a wait for rank 2 itself
/// fails at once. Before the loss, `hopeless` knows nothing: at once for a wait, after
/// its grace for a side that already failed.
#[test]
fn socket_waits_end_when_a_rank_is_lost() {
    use crate::bootstrap::{BlockingBootstrap, BootstrapConfig, create_unique_id};
    let id = create_unique_id().unwrap();
    let config = BootstrapConfig::default().with_timeout(Duration::from_secs(30));
    let timeout = Duration::from_secs(20);
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let config0 = config.clone();
        s.spawn(move || {
            let bs = BlockingBootstrap::init_with_config(3, 0, id, config0).unwrap();
            bs.barrier().unwrap();
            // Alive, opening nothing, until rank 1 is done.
            let _ = done_rx.recv_timeout(Duration::from_secs(60));
        });
        let config2 = config.clone();
        s.spawn(move || {
            let bs = BlockingBootstrap::init_with_config(3, 2, id, config2).unwrap();
            bs.barrier().unwrap();
            let _ = die_rx.recv_timeout(Duration::from_secs(60));
            bs.abandon();
        });
        let bs = BlockingBootstrap::init_with_config(3, 1, id, config.clone()).unwrap();
        bs.barrier().unwrap();
        let t0 = Instant::now();
        assert!(hopeless(bs.as_async(), 0, &sockets_op(7), false).is_none());
        assert!(t0.elapsed() < LOSS_NEWS_GRACE);
        let t0 = Instant::now();
        assert!(hopeless(bs.as_async(), 0, &sockets_op(7), true).is_none());
        assert!(t0.elapsed() >= LOSS_NEWS_GRACE);
        die_tx.send(()).unwrap();
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let mut setup = TcpSetup {
            listener: Some((l, addr)),
            ..TcpSetup::default()
        };
        let t0 = Instant::now();
        let e = setup
            .accept_for(bs.as_async(), 0, 7, 2, timeout)
            .unwrap_err()
            .to_string();
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(10), "{took:?}: {e}");
        assert!(
            e.contains("rank 2 was lost") && e.contains("TCP sockets of the connection (tag 7)"),
            "{e}"
        );
        let t0 = Instant::now();
        let e = setup
            .accept_for(bs.as_async(), 2, 7, 2, timeout)
            .unwrap_err()
            .to_string();
        assert!(t0.elapsed() < Duration::from_secs(1), "{e}");
        assert!(e.contains("rank 2 was lost"), "{e}");
        // A side that failed (refused) learns the loss at once now.
        let t0 = Instant::now();
        let e = hopeless(bs.as_async(), 0, &sockets_op(7), true).map(|e| e.to_string());
        assert!(t0.elapsed() < LOSS_NEWS_GRACE, "{e:?}");
        assert!(e.is_some_and(|e| e.contains("rank 2 was lost")));
        done_tx.send(()).unwrap();
    });
}

/// `n` loopback connections: (this side's streams, the peer's).
fn stream_pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let addr = l.local_addr().unwrap();
    (0..n)
        .map(|_| {
            let peer = TcpStream::connect(addr).unwrap();
            (l.accept().unwrap().0, peer)
        })
        .unzip()
}

/// A host-memory link of `stripes` streams receiving into `buf`, its flag in `flag`.
fn host_link(
    stripes: usize,
    buf: &mut [u8],
    flag: &AtomicU64,
    timeout: Duration,
) -> (TcpLink, Vec<TcpStream>) {
    sending_host_link(stripes, buf, flag, timeout, None)
}

/// [`host_link`], its puts reading from host address `host_src` (none: it sends no data).
fn sending_host_link(
    stripes: usize,
    buf: &mut [u8],
    flag: &AtomicU64,
    timeout: Duration,
    host_src: Option<u64>,
) -> (TcpLink, Vec<TcpStream>) {
    let (ours, peer) = stream_pairs(stripes);
    let sink = Sink {
        buffer: buf.as_mut_ptr() as u64,
        len: buf.len() as u64,
        inbound: flag as *const AtomicU64 as u64,
    };
    let config = TcpConfig {
        conns: stripes,
        chunk: 512 << 10,
        timeout,
        parallel: false,
        congestion: None,
    };
    let link = TcpLink::new(ours, sink, (1, 7), config, None, host_src, None).unwrap();
    (link, peer)
}

/// Two host-memory links joined over `stripes` loopback streams: `a` sends from `src`
/// (and receives into `a_sink`), `b` receives into `dst` with its flag in `flag`; and a
/// plane over `a` alone, with chunks of `chunk` bytes, writing stripes at once when
/// `parallel`.
fn plane_pair(
    stripes: usize,
    chunk: usize,
    parallel: bool,
    (src, a_sink): (&mut [u8], &mut [u8]),
    dst: &mut [u8],
    flags: &[AtomicU64; 2],
) -> (TcpPlane, Route, TcpLink, TcpLink) {
    let (ours, theirs) = stream_pairs(stripes);
    let config = TcpConfig {
        conns: stripes,
        chunk,
        timeout: Duration::from_secs(20),
        parallel,
        congestion: None,
    };
    let sink = |buf: &mut [u8], flag: &AtomicU64| Sink {
        buffer: buf.as_mut_ptr() as u64,
        len: buf.len() as u64,
        inbound: flag as *const AtomicU64 as u64,
    };
    let host = Some(src.as_ptr() as u64);
    let a = TcpLink::new(
        ours,
        sink(a_sink, &flags[0]),
        (1, 7),
        config,
        None,
        host,
        None,
    );
    let b = TcpLink::new(
        theirs,
        sink(dst, &flags[1]),
        (0, 7),
        config,
        None,
        None,
        None,
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let (plane, route) = plane_of(&a, src, dst.len(), chunk);
    (plane, route, a, b)
}

/// A plane over link `a` alone (reading puts from `src`, chunks of `chunk` bytes) and the
/// route of its connection to a peer buffer of `remote_len` bytes.
fn plane_of(a: &TcpLink, src: &[u8], remote_len: usize, chunk: usize) -> (TcpPlane, Route) {
    let plane = TcpPlane {
        links: vec![Some((a.tx.clone(), a.shared.clone(), a.host_src))],
        gone: vec![false],
        drained: vec![false],
        chunk,
        stage: None,
    };
    let route = Route {
        id: 0,
        local: src.as_ptr() as u64,
        local_len: src.len() as u64,
        remote: 0,
        remote_len: remote_len as u64,
        remote_flag: 0,
    };
    (plane, route)
}

/// A put of many chunks (not a multiple of the chunk), written inline or by a thread per
/// stripe, lands whole at its offset, and its signal comes after it: the stripes' shares
/// cover every chunk once and the signal's per-stripe counts match what each carried.
#[test]
fn a_put_over_several_stripes_lands_whole_written_inline_or_at_once() {
    for (stripes, parallel) in [(3, false), (3, true), (4, true), (1, true)] {
        let size = (1 << 20) + 37;
        let mut src: Vec<u8> = (0..size + 64).map(|i| (i * 7 + i / 251) as u8).collect();
        let (mut a_sink, mut dst) = (vec![0u8; 64], vec![0u8; size + 128]);
        let flags = [AtomicU64::new(0), AtomicU64::new(0)];
        let (mut plane, route, a, b) = plane_pair(
            stripes,
            64 << 10,
            parallel,
            (&mut src, &mut a_sink),
            &mut dst,
            &flags,
        );
        let writers = |a: &TcpLink| a.tx.lock().unwrap().writers.is_some();
        // A put of one chunk starts no writer threads, nor does one of several chunks
        // below PARALLEL_MIN; the first of several chunks and at least that size does.
        plane.put(&route, 0, 0, 64 << 10).unwrap();
        assert!(
            !writers(&a),
            "{stripes} stripes: writers for a put of one chunk"
        );
        plane.put(&route, 0, 0, PARALLEL_MIN - 1).unwrap();
        assert!(
            !writers(&a),
            "{stripes} stripes: writers for a put below PARALLEL_MIN"
        );
        plane.put(&route, 100, 5, size as u64).unwrap();
        assert_eq!(writers(&a), parallel && stripes > 1, "{stripes} stripes");
        plane.signal(&route, 9).unwrap();
        assert!(
            eventually(|| flags[1].load(Ordering::Acquire) == 9),
            "{stripes} stripes, parallel {parallel}: the signal never came"
        );
        // A second put over the first, from another offset: every chunk is rewritten.
        plane.put(&route, 100, 0, size as u64).unwrap();
        plane.signal(&route, 10).unwrap();
        assert!(eventually(|| flags[1].load(Ordering::Acquire) == 10));
        drop((a, b));
        // The puts at offset 0 (from the same source) are under the others.
        assert!(dst[..100] == src[..100]);
        assert!(
            dst[100..100 + size] == src[..size],
            "{stripes} stripes, parallel {parallel}: the data differ"
        );
        assert!(dst[100 + size..].iter().all(|&x| x == 0));
    }
}

/// A parallel put of fewer chunks than stripes is cut evenly: every stripe carries a
/// share, and the data land whole.
#[test]
fn a_parallel_put_of_few_chunks_is_cut_over_every_stripe() {
    let size = (1 << 20) + 32;
    let mut src: Vec<u8> = (0..size).map(|i| (i * 13 + i / 509) as u8).collect();
    let (mut a_sink, mut dst) = (vec![0u8; 64], vec![0u8; size]);
    let flags = [AtomicU64::new(0), AtomicU64::new(0)];
    let (mut plane, route, a, b) = plane_pair(
        4,
        512 << 10,
        true,
        (&mut src, &mut a_sink),
        &mut dst,
        &flags,
    );
    plane.put(&route, 0, 0, size as u64).unwrap();
    plane.signal(&route, 1).unwrap();
    assert!(eventually(|| flags[1].load(Ordering::Acquire) == 1));
    let sent = a.tx.lock().unwrap().sent.clone();
    assert!(sent.iter().all(|&n| n > 0), "shares per stripe: {sent:?}");
    assert_eq!(sent.iter().sum::<u64>(), size as u64);
    drop((a, b));
    assert!(dst == src, "the data differ");
}

/// Inline, a put a little longer than a chunk (a payload and its 32-byte header) goes as
/// halves on two stripes, not as a chunk on one and 32 bytes on the other; so does one of
/// two chunks and a tail under a page. The data land whole.
#[test]
fn an_inline_put_of_few_chunks_is_cut_evenly_over_the_stripes() {
    let chunk = 512u64 << 10;
    // Chunks of a put: as many as fit in the stripes, evenly (rounded up to 4 KiB).
    assert_eq!(even_chunk(chunk + 32, chunk, 2), 266_240); // 65 pages of 4 KiB
    // A tail under a page spread over the other chunks: 1 MiB + 32 in two.
    assert_eq!(even_chunk(2 * chunk + 32, chunk, 2), 528_384); // 129 pages
    assert_eq!(even_chunk(2 * chunk + 32, chunk, 4), 528_384);
    // A longer tail: more chunks than stripes keep whole chunks, fewer are cut evenly.
    assert_eq!(even_chunk(2 * chunk + 8192, chunk, 2), chunk);
    assert_eq!(even_chunk(2 * chunk + 8192, chunk, 4), 352_256); // 86 pages
    assert_eq!(even_chunk(1000, chunk, 2), chunk);
    assert_eq!(even_chunk(chunk, chunk, 2), chunk);

    let long = 2 * chunk as usize + 32;
    let mut src: Vec<u8> = (0..long).map(|i| (i * 11 + i / 397) as u8).collect();
    let (mut a_sink, mut dst) = (vec![0u8; 64], vec![0u8; long]);
    let flags = [AtomicU64::new(0), AtomicU64::new(0)];
    let (mut plane, route, a, b) = plane_pair(
        2,
        chunk as usize,
        false,
        (&mut src, &mut a_sink),
        &mut dst,
        &flags,
    );
    let mut before = vec![0u64; 2];
    for (epoch, size, piece) in [(1, chunk + 32, 266_240), (2, long as u64, 528_384)] {
        // Both stripes' shares of this put: one piece and the rest.
        plane.put(&route, 0, 0, size).unwrap();
        plane.signal(&route, epoch).unwrap();
        assert!(eventually(|| flags[1].load(Ordering::Acquire) == epoch));
        let sent = a.tx.lock().unwrap().sent.clone();
        let mut shares: Vec<u64> = sent.iter().zip(&before).map(|(n, b)| n - b).collect();
        shares.sort();
        assert_eq!(shares, [size - piece, piece], "{size} bytes: {sent:?}");
        before = sent;
    }
    drop((a, b));
    assert!(dst == src, "the data differ");
}

/// With parallel writes, a put to a peer whose sockets are gone fails naming the peer
/// (every writer's failure is waited for, none hangs).
#[test]
fn a_parallel_put_to_a_closed_peer_fails_naming_it() {
    let mut src = vec![1u8; 8 << 20];
    let (mut a_sink, mut dst) = (vec![0u8; 64], vec![0u8; 8 << 20]);
    let flags = [AtomicU64::new(0), AtomicU64::new(0)];
    let (mut plane, route, a, b) =
        plane_pair(3, 64 << 10, true, (&mut src, &mut a_sink), &mut dst, &flags);
    drop(b);
    let t0 = Instant::now();
    let mut err = None;
    for _ in 0..20 {
        if let Err(e) = plane.put(&route, 0, 0, 8 << 20) {
            err = Some(e);
            break;
        }
    }
    let e = err
        .expect("puts to a closed peer kept succeeding")
        .to_string();
    assert!(e.contains("rank 1"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    drop(a);
}

fn frame(words: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    put_u64s(&mut out, words);
    out
}

/// Waits up to 10 s for `done`.
fn eventually(done: impl Fn() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// A peer puts on stripe 1, signals, and leaves; its stripe 2 (which carried nothing)
/// is read closed before stripe 1's data comes. The signal still waits for that data
/// and raises the flag; then the link counts as drained. Before, stripe 0 gave up as
/// soon as any stripe had ended ("another stripe failed"): the peer's last signal was
/// lost and the wait for it timed out.
#[test]
fn a_signal_waits_for_its_data_when_another_stripe_closed_first() {
    let mut buf = vec![0u8; 256];
    let flag = AtomicU64::new(0);
    let (link, mut peer) = host_link(3, &mut buf, &flag, Duration::from_secs(20));
    peer[0]
        .write_all(&frame(&[OP_SIGNAL, 1, 3, 0, 100, 0]))
        .unwrap();
    peer[2].shutdown(std::net::Shutdown::Write).unwrap();
    // Stripe 2's end is seen (the link counts as lost) before the data comes.
    assert!(eventually(|| link.shared.ended[2].load(Ordering::Acquire)));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        flag.load(Ordering::Acquire),
        0,
        "the flag came before its data"
    );
    let mut data = frame(&[OP_DATA, 16, 100]);
    data.extend((0..100u8).map(|i| i ^ 0x5a));
    peer[1].write_all(&data).unwrap();
    assert!(
        eventually(|| flag.load(Ordering::Acquire) == 1),
        "signal 1 was not raised: {:?}",
        link.shared.lost()
    );
    assert!((0..100).all(|i| buf[16 + i] == i as u8 ^ 0x5a));
    peer.clear();
    assert!(eventually(
        || link.shared.drained.load(Ordering::Acquire) == 3
    ));
    drop(link);
}

/// The stripe a signal waits on ends short of the bytes the signal counts: the link is
/// lost naming that stripe and the counts, and the flag stays down.
#[test]
fn a_signal_whose_stripe_ended_short_loses_the_link_naming_it() {
    let mut buf = vec![0u8; 256];
    let flag = AtomicU64::new(0);
    let (link, mut peer) = host_link(2, &mut buf, &flag, Duration::from_secs(20));
    peer[0]
        .write_all(&frame(&[OP_SIGNAL, 1, 2, 0, 64]))
        .unwrap();
    let mut data = frame(&[OP_DATA, 0, 8]);
    data.extend([1u8; 8]);
    peer[1].write_all(&data).unwrap();
    peer[1].shutdown(std::net::Shutdown::Write).unwrap();
    assert!(eventually(|| link.shared.lost().is_some_and(|e| e
        .to_string()
        .contains("stripe 1 ended after 8 of the 64 bytes"))));
    assert_eq!(flag.load(Ordering::Acquire), 0);
    drop(link);
}

/// Frames that do not fit are refused in words that say what was wrong: a data frame's
/// length, a signal with the wrong number of counts.
#[test]
fn bad_frames_are_named() {
    let mut buf = vec![0u8; 64];
    let flag = AtomicU64::new(0);
    let (link, mut peer) = host_link(2, &mut buf, &flag, Duration::from_secs(20));
    peer[1]
        .write_all(&frame(&[OP_DATA, 8, u64::MAX - 4]))
        .unwrap();
    assert!(eventually(|| link.shared.lost().is_some()));
    let e = link.shared.lost().unwrap().to_string();
    assert!(
        e.contains("length 18446744073709551611") && e.contains("buffer of 64 bytes"),
        "{e}"
    );
    drop(link);
    let (link, mut peer) = host_link(2, &mut buf, &flag, Duration::from_secs(20));
    peer[0]
        .write_all(&frame(&[OP_SIGNAL, 1, 3, 0, 0, 0]))
        .unwrap();
    assert!(eventually(|| link.shared.lost().is_some()));
    let e = link.shared.lost().unwrap().to_string();
    assert!(
        e.contains("counts for 3 stripes") && e.contains("with 2 counts"),
        "{e}"
    );
    drop(link);
}

/// A link dropped while bytes from the peer sit unread (its receiver had stopped on a
/// bad frame) still delivers everything this side had queued to send: the close is
/// orderly, not a reset, which would have thrown the queued bytes away.
#[test]
fn a_dropped_link_delivers_what_it_had_queued_though_the_peer_sent_more() {
    let mut buf = vec![0u8; 64];
    let flag = AtomicU64::new(0);
    let (link, mut peer) = host_link(1, &mut buf, &flag, Duration::from_secs(20));
    peer[0].write_all(&frame(&[99, 0, 0])).unwrap();
    assert!(eventually(|| link.shared.ended[0].load(Ordering::Acquire)));
    // Bytes no receiver will read.
    peer[0].write_all(&[7u8; 4096]).unwrap();
    // This side's send queue filled (the peer reads nothing yet).
    let out = link.sockets[0].try_clone().unwrap();
    out.set_nonblocking(true).unwrap();
    let chunk = [0x5au8; 64 << 10];
    let mut queued = 0usize;
    loop {
        match (&out).write(&chunk) {
            Ok(n) => queued += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the send queue: {e}"),
        }
    }
    drop(out);
    std::thread::sleep(Duration::from_millis(50));
    drop(link);
    peer[0]
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (mut got, mut b) = (0usize, vec![0u8; 64 << 10]);
    loop {
        match peer[0].read(&mut b) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => panic!("after {got} of the {queued} bytes queued: {e}"),
        }
    }
    assert_eq!(got, queued);
}

#[test]
fn wire_round_trip_and_garbage() {
    let a: SocketAddr = "127.0.0.1:4242".parse().unwrap();
    assert_eq!(decode_wire(&encode_wire(a, 3)), Some((a, 3)));
    assert_eq!(decode_wire(b"127.0.0.1:1|0"), None);
    assert_eq!(decode_wire(b"nonsense"), None);
    assert_eq!(decode_wire(&[0xff, 0xfe]), None);
}

/// A put of one chunk with its signal goes on stripe 0 as one data frame followed by the
/// signal frame counting it, even when plain puts of one chunk have moved the round robin
/// to another stripe: the receiver that applies the signal holds the data too.
#[test]
fn a_put_of_one_chunk_with_its_signal_goes_on_stripe_zero_with_it() {
    let src: Vec<u8> = (0..100_000u32).map(|i| (i * 13 + i / 7) as u8).collect();
    let mut a_sink = vec![0u8; 64];
    let flag = AtomicU64::new(0);
    let host = Some(src.as_ptr() as u64);
    let timeout = Duration::from_secs(20);
    let (a, mut theirs) = sending_host_link(2, &mut a_sink, &flag, timeout, host);
    let (mut plane, route) = plane_of(&a, &src, 1 << 20, 64 << 10);
    let read = |s: &mut TcpStream, n: usize| {
        let mut b = vec![0u8; n];
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.read_exact(&mut b).unwrap();
        b
    };
    // A plain put of one chunk goes on stripe 0 and moves the round robin to stripe 1.
    plane.put(&route, 0, 0, 100).unwrap();
    let mut want = frame(&[OP_DATA, 0, 100]);
    want.extend_from_slice(&src[..100]);
    assert_eq!(read(&mut theirs[0], want.len()), want);
    // Larger than the 16 KiB written whole before, within one chunk.
    let size = 40_000u64;
    plane.put_with_signal(&route, 256, 3, size, 5).unwrap();
    let mut want = frame(&[OP_DATA, 256, size]);
    want.extend_from_slice(&src[3..3 + size as usize]);
    want.extend(frame(&[OP_SIGNAL, 5, 2, 100 + size, 0]));
    assert!(
        read(&mut theirs[0], want.len()) == want,
        "stripe 0 did not carry the put and its signal"
    );
    theirs[1].set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(theirs[1].read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
        "stripe 1 carried part of the put"
    );
    drop(plane);
    drop(a);
}

/// A frame whose header comes in pieces (the receiver's non-blocking poll sees only the
/// first bytes) is applied whole.
#[test]
fn a_frame_whose_header_comes_in_pieces_is_applied() {
    let mut buf = vec![0u8; 256];
    let flag = AtomicU64::new(0);
    let (link, mut peer) = host_link(1, &mut buf, &flag, Duration::from_secs(20));
    let mut bytes = frame(&[OP_DATA, 8, 50]);
    bytes.extend((0..50u8).map(|i| i ^ 0x33));
    bytes.extend(frame(&[OP_SIGNAL, 4, 1, 50]));
    for (k, part) in [&bytes[..5], &bytes[5..30], &bytes[30..]]
        .into_iter()
        .enumerate()
    {
        peer[0].write_all(part).unwrap();
        // Within the poll's window for the first pause, past it for the second.
        std::thread::sleep(Duration::from_micros([20, 5000][k.min(1)]));
    }
    assert!(
        eventually(|| flag.load(Ordering::Acquire) == 4),
        "the flag never came: {:?}",
        link.shared.lost()
    );
    assert!((0..50).all(|i| buf[8 + i] == i as u8 ^ 0x33));
    drop(link);
}

/// A long payload that comes in pieces, one pause within the receiver's poll inside a frame
/// and one past it (the receiver then blocks in its read), is applied whole; a peer that
/// closes inside a payload loses the link as closed in the middle of a frame, not as a peer
/// that left between frames.
#[test]
fn a_payload_in_pieces_is_applied_and_a_close_inside_it_is_named() {
    let mut buf = vec![0u8; 64 << 10];
    let flag = AtomicU64::new(0);
    let (link, mut peer) = host_link(1, &mut buf, &flag, Duration::from_secs(20));
    let len = 40_000usize;
    let mut bytes = frame(&[OP_DATA, 0, len as u64]);
    bytes.extend((0..len).map(|i| (i % 253) as u8));
    bytes.extend(frame(&[OP_SIGNAL, 2, 1, len as u64]));
    let cut = [HEADER + 1000, HEADER + 30_000];
    let parts = [&bytes[..cut[0]], &bytes[cut[0]..cut[1]], &bytes[cut[1]..]];
    for (part, pause_us) in parts.into_iter().zip([20, 5000, 0]) {
        peer[0].write_all(part).unwrap();
        std::thread::sleep(Duration::from_micros(pause_us));
    }
    assert!(
        eventually(|| flag.load(Ordering::Acquire) == 2),
        "the flag never came: {:?}",
        link.shared.lost()
    );
    assert!((0..len).all(|i| buf[i] == (i % 253) as u8));
    drop(link);

    let (link, mut peer) = host_link(1, &mut buf, &flag, Duration::from_secs(20));
    let mut bytes = frame(&[OP_DATA, 0, 1000]);
    bytes.extend([7u8; 300]);
    peer[0].write_all(&bytes).unwrap();
    peer.clear();
    assert!(
        eventually(|| link
            .shared
            .lost()
            .is_some_and(|e| e.to_string().contains("in the middle of a frame"))),
        "{:?}",
        link.shared.lost()
    );
    drop(link);
}

/// Frames that come in one write (a small put, a put longer than what is read ahead at
/// once, a signal) are applied whole and in order: the receiver's read-ahead hands each
/// frame its own bytes, and the long payload's tail goes straight to its place.
#[test]
fn frames_read_ahead_together_are_applied_in_order() {
    let mut buf = vec![0u8; 200 << 10];
    let flag = AtomicU64::new(0);
    let (link, mut peer) = host_link(1, &mut buf, &flag, Duration::from_secs(20));
    let long = 150_000usize;
    let mut bytes = frame(&[OP_DATA, 0, 100]);
    bytes.extend((0..100u32).map(|i| i as u8 ^ 0x11));
    bytes.extend(frame(&[OP_DATA, 128, long as u64]));
    bytes.extend((0..long).map(|i| (i % 251) as u8));
    // The same small range again, last: order matters.
    bytes.extend(frame(&[OP_DATA, 0, 3]));
    bytes.extend([9u8, 8, 7]);
    bytes.extend(frame(&[OP_SIGNAL, 6, 1, 103 + long as u64]));
    peer[0].write_all(&bytes).unwrap();
    assert!(
        eventually(|| flag.load(Ordering::Acquire) == 6),
        "the flag never came: {:?}",
        link.shared.lost()
    );
    assert_eq!(buf[..3], [9, 8, 7]);
    assert!((3..100).all(|i| buf[i] == i as u8 ^ 0x11));
    assert!((0..long).all(|i| buf[128 + i] == (i % 251) as u8));
    assert!(buf[128 + long..].iter().all(|&x| x == 0));
    drop(link);
}

/// A congestion control that is set reaches every socket of the link; one the kernel does
/// not have fails the link, naming the variable, the value and the ones allowed.
#[test]
fn the_congestion_control_is_set_on_every_socket_or_refused_by_name() {
    let link = |name: &str, streams: Vec<TcpStream>| {
        let mut flag_buf = [0u8; 64];
        let flag = AtomicU64::new(0);
        let config = TcpConfig {
            conns: streams.len(),
            chunk: 64 << 10,
            timeout: Duration::from_secs(5),
            parallel: false,
            congestion: Some(TcpCongestion::parse(name).unwrap()),
        };
        let sink = Sink {
            buffer: flag_buf.as_mut_ptr() as u64,
            len: flag_buf.len() as u64,
            inbound: &flag as *const AtomicU64 as u64,
        };
        TcpLink::new(streams, sink, (1, 7), config, None, None, None)
    };
    // Reno is built into every Linux kernel and always allowed.
    let (ours, _peer) = stream_pairs(3);
    let probes: Vec<TcpStream> = ours.iter().map(|s| s.try_clone().unwrap()).collect();
    let made = link("reno", ours).expect("reno is always allowed");
    for s in &probes {
        assert_eq!(rustix::net::sockopt::tcp_congestion(s).unwrap(), "reno");
    }
    drop(made);
    let (ours, _peer) = stream_pairs(1);
    let Err(e) = link("no-such-cc", ours) else {
        panic!("an unknown algorithm is refused");
    };
    for says in ["MSCCLPP_TCP_CONGESTION=no-such-cc", "refused", "reno"] {
        assert!(e.contains(says), "{says:?} in {e}");
    }
}

/// The `auto` sockets follow the parallel writes (4, else 2); a value that is set wins.
#[test]
fn auto_sockets_follow_the_parallel_writes() {
    let config = |parallel, conns| {
        let mut s = Settings::default();
        s.tcp_parallel = Some(parallel);
        s.tcp_conns = conns;
        let c = TcpConfig::from_settings(&s);
        (c.parallel, c.conns)
    };
    assert_eq!(config(true, None), (true, 4));
    assert_eq!(config(false, None), (false, 2));
    assert_eq!(config(true, Some(2)), (true, 2));
    assert_eq!(config(false, Some(8)), (false, 8));
}
