//! One rank of a two-rank job over a real RDMA device (feature `ib`): what
//! `scripts/ib-rxe-vms.sh` runs in each of its two Soft-RoCE guests, one process per guest.
//! Every check compares with values computed here from the ranks and indexes, and a failed
//! one ends the process with an error (non-zero exit).
//!
//! ```text
//! MSCCLPP_RANK=r MSCCLPP_NRANKS=2 MSCCLPP_BOOTSTRAP=10.0.0.1:29501 \
//!   MSCCLPP_IB_DEVICE=rxe0 MSCCLPP_IB_GID_INDEX=1 ib_rank <phase>
//! ```
//!
//! Phases:
//! - `verbs`: the verbs layer alone (`open_from_env`, registrations, queue pairs connected
//!   through the bootstrap): RDMA writes with an inline flag after them, a zero-length write,
//!   the order of completions, and the error completions the fake verbs imitate (a wrong
//!   remote key, a local range outside its registration, a peer whose queue pair is gone),
//!   each error and its time printed as `RXE-FACT` lines.
//! - `conn`: a `Communicator` (Host backend) with one `TransportKind::Ib` connection,
//!   `DevConn` put/signal/wait/flush in both directions, every word checked.
//! - `collectives`: the Host-backend collectives with `CrossTransport::Ib` between the two
//!   hosts, small sizes, against sums computed here.
//! - `peer-gone-recv`, `peer-gone-send`: rank 1 sends one message over IB and leaves; rank
//!   0 receives it, waits until the bootstrap reports rank 1 gone, and its next receive
//!   (send) with rank 1 must fail within 30 s naming it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::BlockingBootstrap;
use mscclpp::host::collectives::{CollConfig, Collectives, CrossTransport, Exec, ReduceOp};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::launch::Launch;
use mscclpp::host::transport::TransportKind;
use mscclpp::host::transport::ib::{
    Completion, IbEndpoint, MemoryKind, QpTransition, QueuePair, Verbs, WriteRequest, WriteSource,
    open_from_env,
};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let phase = std::env::args().nth(1).unwrap_or_default();
    let result = match phase.as_str() {
        "verbs" => verbs(),
        "conn" => conn(),
        "collectives" => collectives(),
        "peer-gone-recv" => peer_gone("recv"),
        "peer-gone-send" => peer_gone("send"),
        _ => Err(format!(
            "usage: ib_rank verbs|conn|collectives|peer-gone-recv|peer-gone-send (got {phase:?}), with \
             MSCCLPP_RANK, MSCCLPP_NRANKS=2 and MSCCLPP_BOOTSTRAP set"
        )
        .into()),
    };
    match result {
        Ok(()) => println!("ib_rank {phase}: ok"),
        Err(e) => {
            println!("ib_rank {phase}: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

fn bootstrap() -> Res<BlockingBootstrap> {
    let launch = Launch::from_env()?;
    if launch.nranks != 2 {
        return Err(format!("two ranks needed, MSCCLPP_NRANKS={}", launch.nranks).into());
    }
    Ok(launch.blocking_bootstrap()?)
}

/// Word `i` that rank `r` writes in round `round`: distinct per rank, round and index.
fn pattern(r: usize, round: u64, i: u64) -> u64 {
    ((r as u64 + 1) << 56) ^ (round << 32) ^ i.wrapping_mul(0x9e37_79b9)
}

/// Fails unless `cond`, with `what`.
fn check(cond: bool, what: impl FnOnce() -> String) -> Res {
    if cond { Ok(()) } else { Err(what().into()) }
}

// ---------------------------------------------------------------------------------------
// verbs

/// Words of each rank's receive area (the first half of its registered buffer; the second
/// half holds what it sends); the last word of each queue pair's slice is the flag the peer
/// writes.
const WORDS: usize = 64 * 1024;
/// Queue pairs of the verbs phase, one per check that may leave its pair in error.
const MAIN: usize = 0;
const ZERO: usize = 1;
const BAD_KEY: usize = 2;
const LOCAL: usize = 3;
const GONE: usize = 4;
const QPS: usize = 5;

/// What a rank tells its peer: its port, queue pairs and buffer.
fn encode(ep: &IbEndpoint, qpns: &[u32], addr: u64, len: u64, rkey: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(ep.lid.to_le_bytes());
    b.extend(ep.gid);
    b.extend(ep.mtu.to_le_bytes());
    for q in qpns {
        b.extend(q.to_le_bytes());
    }
    b.extend(addr.to_le_bytes());
    b.extend(len.to_le_bytes());
    b.extend(rkey.to_le_bytes());
    b
}

struct Peer {
    endpoints: Vec<IbEndpoint>,
    addr: u64,
    len: u64,
    rkey: u32,
}

fn decode(b: &[u8]) -> Res<Peer> {
    check(b.len() == 2 + 16 + 4 + 4 * QPS + 8 + 8 + 4, || {
        format!("peer's verbs record has {} bytes", b.len())
    })?;
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let lid = u16::from_le_bytes([b[0], b[1]]);
    let gid: [u8; 16] = b[2..18].try_into().unwrap();
    let mtu = u32_at(18);
    let endpoints = (0..QPS)
        .map(|q| IbEndpoint {
            lid,
            gid,
            mtu,
            qpn: u32_at(22 + 4 * q),
            psn: psn_of(u32_at(22 + 4 * q)),
        })
        .collect();
    let o = 22 + 4 * QPS;
    Ok(Peer {
        endpoints,
        addr: u64_at(o),
        len: u64_at(o + 8),
        rkey: u32_at(o + 16),
    })
}

/// The starting PSN of queue pair `qpn` (both sides derive it; any 24-bit value works).
fn psn_of(qpn: u32) -> u32 {
    qpn.wrapping_mul(2_654_435_761) & 0xff_ffff
}

/// Polls `qp` until `n` completions came or `limit` passed.
fn completions(
    qp: &mut dyn QueuePair,
    n: usize,
    limit: Duration,
) -> Res<(Vec<Completion>, Duration)> {
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        qp.poll(&mut out)?;
        if start.elapsed() > limit {
            return Err(
                format!("{} of {n} completions after {limit:?}: {out:?}", out.len()).into(),
            );
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok((out, start.elapsed()))
}

/// Waits until the word at `p` reads `want` (written by the peer's NIC).
fn wait_word(p: *const u64, want: u64, limit: Duration) -> Res {
    // SAFETY: `p` is an aligned word of the live registered buffer; the NIC writes it, so it
    // is read atomically.
    let word = unsafe { AtomicU64::from_ptr(p as *mut u64) };
    let start = Instant::now();
    while word.load(Ordering::Acquire) != want {
        if start.elapsed() > limit {
            return Err(format!(
                "flag still {:#x}, not {want:#x}, after {limit:?}",
                word.load(Ordering::Acquire)
            )
            .into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

fn write(
    wr_id: u64,
    source: WriteSource,
    remote_addr: u64,
    rkey: u32,
    signaled: bool,
) -> WriteRequest {
    WriteRequest {
        wr_id,
        source,
        remote_addr,
        rkey,
        signaled,
    }
}

fn fact(me: usize, what: &str) {
    println!("RXE-FACT rank {me}: {what}");
}

fn verbs() -> Res {
    let bs = bootstrap()?;
    let me = bs.rank();
    let verbs: std::sync::Arc<dyn Verbs> = open_from_env()?;
    let port = verbs.port();
    fact(
        me,
        &format!(
            "device {} port {} mtu {} ethernet {} gid index {}",
            verbs.device_name(),
            port.port,
            port.mtu,
            port.ethernet,
            port.gid_index
        ),
    );
    // One buffer; queue pair q writes the peer's slice q, whose last word is its flag.
    let mut buf = vec![0u64; 2 * WORDS];
    let base = buf.as_mut_ptr() as u64;
    let bytes = (2 * WORDS * 8) as u64;
    // SAFETY: `buf` outlives `mr` (dropped at the end of this function, `mr` first).
    let mr = unsafe { verbs.register(base, bytes, MemoryKind::Host)? };
    let mut qps: Vec<Box<dyn QueuePair>> = (0..QPS)
        .map(|_| verbs.create_qp(64))
        .collect::<Result<_, _>>()?;
    let qpns: Vec<u32> = qps.iter().map(|q| q.qpn()).collect();
    let mine = IbEndpoint {
        lid: port.lid,
        gid: port.gid,
        mtu: port.mtu,
        qpn: 0,
        psn: 0,
    };
    let all = bs.all_gather(&encode(&mine, &qpns, base, bytes, mr.rkey))?;
    let peer = decode(&all[1 - me])?;
    check(peer.len == bytes, || {
        format!("peer registered {} bytes, not {bytes}", peer.len)
    })?;
    for (q, remote) in qps.iter_mut().zip(&peer.endpoints) {
        q.modify(QpTransition::Init)?;
        q.modify(QpTransition::ReadyToReceive(remote))?;
        q.modify(QpTransition::ReadyToSend {
            psn: psn_of(q.qpn()),
        })?;
    }
    bs.barrier()?;
    let slice = WORDS / QPS;
    let remote_word = |q: usize, i: usize| peer.addr + ((q * slice + i) * 8) as u64;
    let local_word = |q: usize, i: usize| base + ((q * slice + i) * 8) as u64;
    let source_word = |q: usize, i: usize| local_word(q, i) + (WORDS * 8) as u64;
    let flag_index = slice - 1;

    // 1. Four registered writes (three unsignalled) then an inline 8-byte flag: the flag
    // lands last, the data before it is complete when the peer sees it.
    let data_words = slice - 8;
    let source = WORDS + MAIN * slice;
    for (i, w) in buf[source..source + data_words].iter_mut().enumerate() {
        *w = pattern(me, 1, i as u64);
    }
    let piece = data_words / 4;
    let qp = qps[MAIN].as_mut();
    for k in 0..4 {
        let src = WriteSource::Registered {
            addr: source_word(MAIN, k * piece),
            len: (piece * 8) as u32,
            lkey: mr.lkey,
        };
        qp.post_write(&write(
            k as u64 + 1,
            src,
            remote_word(MAIN, k * piece),
            peer.rkey,
            k == 3,
        ))?;
    }
    let flag = WriteSource::Inline(7u64.to_le_bytes());
    qp.post_write(&write(
        5,
        flag,
        remote_word(MAIN, flag_index),
        peer.rkey,
        true,
    ))?;
    let (c, took) = completions(qp, 2, Duration::from_secs(60))?;
    check(
        c == [
            Completion {
                wr_id: 4,
                error: None,
            },
            Completion {
                wr_id: 5,
                error: None,
            },
        ],
        || format!("completions of 4 writes and a flag: {c:?}"),
    )?;
    wait_word(
        (local_word(MAIN, flag_index)) as *const u64,
        7,
        Duration::from_secs(60),
    )?;
    let got = &buf[MAIN * slice..MAIN * slice + 4 * piece];
    let bad = (0..got.len()).find(|&i| got[i] != pattern(1 - me, 1, i as u64));
    check(bad.is_none(), || {
        let i = bad.unwrap();
        format!(
            "word {i} after the flag: {:#x}, want {:#x}",
            got[i],
            pattern(1 - me, 1, i as u64)
        )
    })?;
    fact(
        me,
        &format!(
            "{} KiB in 4 writes and a flag completed in {took:?}",
            piece * 4 * 8 / 1024
        ),
    );

    // 2. Completions of signalled requests come back in posting order.
    for k in 0..32u64 {
        let src = WriteSource::Inline((100 + k).to_le_bytes());
        qp.post_write(&write(
            100 + k,
            src,
            remote_word(ZERO, 8 + k as usize % 8),
            peer.rkey,
            true,
        ))?;
    }
    let (c, _) = completions(qp, 32, Duration::from_secs(60))?;
    let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
    check(
        ids == (100..132).collect::<Vec<_>>() && c.iter().all(|c| c.error.is_none()),
        || format!("32 signalled writes completed as {c:?}"),
    )?;

    // 3. A zero-length write (no scatter/gather entry) completes; the responder checks no
    // key for it, so a wrong one passes too.
    let qz = qps[ZERO].as_mut();
    let empty = WriteSource::Registered {
        addr: 0,
        len: 0,
        lkey: mr.lkey,
    };
    qz.post_write(&write(1, empty, remote_word(ZERO, 0), peer.rkey, true))?;
    qz.post_write(&write(
        2,
        empty,
        remote_word(ZERO, 0),
        peer.rkey ^ 0x00ff_ff00,
        true,
    ))?;
    let (c, _) = completions(qz, 2, Duration::from_secs(60))?;
    fact(
        me,
        &format!("zero-length writes, right key then wrong key: {c:?}"),
    );
    check(
        c == [
            Completion {
                wr_id: 1,
                error: None,
            },
            Completion {
                wr_id: 2,
                error: None,
            },
        ],
        || format!("zero-length writes: {c:?}"),
    )?;
    bs.barrier()?;

    // 4. A wrong remote key (rank 0 writes): an error completion for the unsignalled request,
    // then "flushed" for the signalled one behind it; nothing lands.
    if me == 0 {
        let qb = qps[BAD_KEY].as_mut();
        let src = WriteSource::Registered {
            addr: source_word(BAD_KEY, 0),
            len: 64,
            lkey: mr.lkey,
        };
        buf[WORDS + BAD_KEY * slice..WORDS + BAD_KEY * slice + 8].fill(0x5555);
        let start = Instant::now();
        qb.post_write(&write(
            1,
            src,
            remote_word(BAD_KEY, 0),
            peer.rkey ^ 0x00ff_ff00,
            false,
        ))?;
        qb.post_write(&write(2, src, remote_word(BAD_KEY, 0), peer.rkey, true))?;
        let (c, _) = completions(qb, 2, Duration::from_secs(60))?;
        fact(
            me,
            &format!("wrong rkey, after {:?}: {c:?}", start.elapsed()),
        );
        check(
            c.len() == 2
                && c[0].wr_id == 1
                && c[0]
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("remote access error"))
                && c[1].wr_id == 2
                && c[1].error.as_deref().is_some_and(|e| e.contains("flushed")),
            || format!("wrong rkey: {c:?}"),
        )?;
        let again = qb.post_write(&write(3, src, remote_word(BAD_KEY, 0), peer.rkey, true));
        fact(me, &format!("post after the error: {again:?}"));
    }
    bs.barrier()?;
    if me == 1 {
        let got = &buf[BAD_KEY * slice..BAD_KEY * slice + 8];
        check(got.iter().all(|w| *w == 0), || {
            format!("a refused write landed: {got:?}")
        })?;
    }

    // 5. A local range beyond the registration (rank 0): a local error completion.
    if me == 0 {
        let ql = qps[LOCAL].as_mut();
        let src = WriteSource::Registered {
            addr: base + bytes - 32,
            len: 64,
            lkey: mr.lkey,
        };
        ql.post_write(&write(1, src, remote_word(LOCAL, 0), peer.rkey, true))?;
        let (c, _) = completions(ql, 1, Duration::from_secs(60))?;
        fact(me, &format!("local range past the registration: {c:?}"));
        check(
            c.len() == 1
                && c[0]
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("local protection")),
            || format!("local range past the registration: {c:?}"),
        )?;
    }
    bs.barrier()?;

    // 6. The peer's queue pair destroyed (rank 1 drops it): rank 0's write is retried
    // until the retry counter runs out (about 1 s per try, 6 retries).
    if me == 1 {
        drop(qps.remove(GONE));
    }
    bs.barrier()?;
    if me == 0 {
        let qg = qps[GONE].as_mut();
        let src = WriteSource::Inline(1u64.to_le_bytes());
        qg.post_write(&write(1, src, remote_word(GONE, 0), peer.rkey, true))?;
        let (c, took) = completions(qg, 1, Duration::from_secs(120))?;
        fact(
            me,
            &format!("peer's queue pair destroyed, after {took:?}: {c:?}"),
        );
        check(
            c.len() == 1
                && c[0]
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("retry counter exceeded")),
            || format!("write to a destroyed queue pair: {c:?}"),
        )?;
    }
    bs.barrier()?;
    drop(qps);
    drop(mr);
    drop(buf);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// conn

fn conn() -> Res {
    let bs = bootstrap()?;
    let config = CommConfig {
        device_timeout: Duration::from_secs(120),
        ..CommConfig::default()
    };
    let mut comm = Communicator::from_bootstrap(bs, Backend::Host, config)?;
    let me = comm.rank();
    let peer = 1 - me;
    let buf = comm.alloc_buffer(1 << 20)?;
    comm.connect(peer, &buf, 0, TransportKind::Ib)?;
    comm.connection_setup()?;
    let kinds: Vec<TransportKind> = comm.connections().iter().map(|c| c.transport()).collect();
    check(kinds == [TransportKind::Ib], || {
        format!("connections: {kinds:?}")
    })?;
    let conn = comm.device_connections()[0];
    comm.proxy_launch()?;
    let sizes = [8usize, 4096, 1000 * 8, 1 << 20];
    let start = Instant::now();
    let mut moved = 0;
    for round in 1..=24u64 {
        // Each size in both directions (rounds alternate between the writers).
        let words = sizes[(round as usize / 2) % sizes.len()] / 8;
        if (round % 2 == 1) == (me == 0) {
            let v: Vec<u64> = (0..words as u64).map(|i| pattern(me, round, i)).collect();
            buf.write(0, &v)?;
            // A put in two pieces, then the signal; flush before the buffer is reused.
            let half = (words / 2) as u64 * 8;
            conn.put_at(0, 0, half);
            conn.try_put_with_signal(half, half, words as u64 * 8 - half)
                .map_err(|e| format!("round {round}: put with signal: {e:?}"))?;
            conn.try_flush()
                .map_err(|e| format!("round {round}: flush: {e:?}"))?;
            moved += words * 8;
        } else {
            conn.try_wait(60_000_000_000)
                .map_err(|e| format!("round {round}: wait: {e:?}"))?;
            let mut v = vec![0u64; words];
            buf.read(0, &mut v)?;
            let bad = (0..words).find(|&i| v[i] != pattern(peer, round, i as u64));
            check(bad.is_none(), || {
                let i = bad.unwrap();
                format!(
                    "round {round}: word {i} is {:#x}, want {:#x}",
                    v[i],
                    pattern(peer, round, i as u64)
                )
            })?;
        }
        // The next round's writer reuses the buffer the reader just checked.
        comm.bootstrap().barrier()?;
    }
    fact(
        me,
        &format!(
            "24 rounds over one IB connection ({} KiB sent here) in {:?}",
            moved / 1024,
            start.elapsed()
        ),
    );
    comm.bootstrap().barrier()?;
    comm.proxy_stop()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// collectives

fn collectives_over_ib() -> Res<Collectives> {
    let bs = bootstrap()?;
    let config = CommConfig {
        device_timeout: Duration::from_secs(120),
        ..CommConfig::default()
    };
    let comm = Communicator::from_bootstrap(bs, Backend::Host, config)?;
    let coll = Collectives::new(
        comm,
        CollConfig {
            scratch_bytes: 64 << 10,
            packet_max_bytes: 4 << 10,
            cross_transport: CrossTransport::Ib,
            ..CollConfig::default()
        },
    )?;
    check(coll.hosts() == 2, || {
        format!(
            "{} hosts (set MSCCLPP_HOST_ID differently per guest)",
            coll.hosts()
        )
    })?;
    let ib = coll
        .communicator()
        .connections()
        .iter()
        .filter(|k| k.transport() == TransportKind::Ib)
        .count();
    check(ib > 0, || "no IB connection between the hosts".into())?;
    Ok(coll)
}

/// Rank `r`'s element `i`: small integers, so every f32 sum is exact.
fn value(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 11) as f32 - 5.0
}

fn collectives() -> Res {
    let coll = collectives_over_ib()?;
    let (n, r) = (coll.nranks(), coll.rank());
    let start = Instant::now();
    for count in [1usize, 5, 1001, 3001] {
        let send: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
        let sum: Vec<f32> = (0..count)
            .map(|i| (0..n).map(|q| value(q, i)).sum())
            .collect();
        let mut out = vec![0f32; count];
        coll.all_reduce(&send, &mut out, ReduceOp::Sum, Exec::Host)?;
        check(out == sum, || {
            format!("all-reduce of {count}: {:?}", &out[..count.min(8)])
        })?;
        let max: Vec<f32> = (0..count)
            .map(|i| (0..n).map(|q| value(q, i)).fold(f32::MIN, f32::max))
            .collect();
        let mut inplace = send.clone();
        coll.all_reduce_in_place(&mut inplace, ReduceOp::Max, Exec::Host)?;
        check(inplace == max, || {
            format!("in-place max all-reduce of {count}")
        })?;
        // Reduce to rank 1 (written there only).
        let mut red = vec![7f32; count];
        coll.reduce(&send, &mut red, ReduceOp::Sum, 1, Exec::Host)?;
        if r == 1 {
            check(red == sum, || format!("reduce of {count}"))?;
        } else {
            check(red.iter().all(|&x| x == 7.0), || {
                format!("reduce of {count} wrote on rank 0")
            })?;
        }
        // All-gather: rank q's block is value(q, .).
        let mut gathered = vec![0f32; n * count];
        coll.all_gather(&send, &mut gathered, Exec::Host)?;
        let want: Vec<f32> = (0..n)
            .flat_map(|q| (0..count).map(move |i| value(q, i)))
            .collect();
        check(gathered == want, || format!("all-gather of {count}"))?;
        // Reduce-scatter of n blocks: rank r gets the sums of block r.
        let blocks: Vec<f32> = (0..n * count).map(|i| value(r, i)).collect();
        let mut rs = vec![0f32; count];
        coll.reduce_scatter(&blocks, &mut rs, ReduceOp::Sum, Exec::Host)?;
        let want: Vec<f32> = (0..count)
            .map(|i| (0..n).map(|q| value(q, r * count + i)).sum())
            .collect();
        check(rs == want, || format!("reduce-scatter of {count}"))?;
        // Broadcast from rank 0.
        let mut b = vec![0f32; count];
        coll.broadcast(&send, &mut b, 0, Exec::Host)?;
        let want: Vec<f32> = (0..count).map(|i| value(0, i)).collect();
        check(b == want, || format!("broadcast of {count}"))?;
        // All-to-all: block q of rank r goes to rank q's block r.
        let mut a2a = vec![0f32; n * count];
        coll.all_to_all(&blocks, &mut a2a, Exec::Host)?;
        let want: Vec<f32> = (0..n)
            .flat_map(|q| (0..count).map(move |i| value(q, r * count + i)))
            .collect();
        check(a2a == want, || format!("all-to-all of {count}"))?;
        // Send/recv: rank 0 sends, rank 1 receives.
        if r == 0 {
            coll.send(&send, 1, Exec::Host)?;
        } else {
            let mut got = vec![0f32; count];
            coll.recv(&mut got, 0, Exec::Host)?;
            let want: Vec<f32> = (0..count).map(|i| value(0, i)).collect();
            check(got == want, || format!("send/recv of {count}"))?;
        }
    }
    fact(
        r,
        &format!("collectives over IB, 4 sizes, in {:?}", start.elapsed()),
    );
    coll.communicator().bootstrap().barrier()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// peer-gone

/// Rank 1 sends one message and leaves; rank 0 receives it, waits until the bootstrap
/// reports rank 1 gone, then makes `op` (`recv` or `send`) with rank 1, which must fail
/// within 30 s naming it.
fn peer_gone(op: &str) -> Res {
    let coll = collectives_over_ib()?;
    let r = coll.rank();
    let sent: Vec<u32> = (0..1001).map(|i| (i * 13 + 5) as u32).collect();
    if r == 1 {
        coll.send(&sent, 0, Exec::Host)?;
        // Leaves: its collectives, proxy and queue pairs go.
        drop(coll);
        return Ok(());
    }
    let mut got = vec![0u32; sent.len()];
    coll.recv(&mut got, 1, Exec::Host)?;
    check(got == sent, || "the message sent before rank 1 left".into())?;
    let start = Instant::now();
    while !coll.communicator().bootstrap().as_async().has_left(1) {
        check(start.elapsed() < Duration::from_secs(60), || {
            "rank 1 did not leave within 60 s".into()
        })?;
        std::thread::sleep(Duration::from_millis(10));
    }
    let start = Instant::now();
    let e = match op {
        "recv" => coll.recv(&mut got, 1, Exec::Host),
        _ => coll.send(&sent, 1, Exec::Host),
    };
    let took = start.elapsed();
    let m = match e {
        Err(e) => e.to_string(),
        Ok(()) => return Err(format!("a {op} with rank 1, which left, succeeded").into()),
    };
    fact(
        r,
        &format!("{op} with a rank that left failed after {took:?}: {m}"),
    );
    check(m.contains("rank 1"), || {
        format!("the error does not name rank 1: {m}")
    })?;
    check(took < Duration::from_secs(30), || {
        format!("took {took:?}: {m}")
    })?;
    Ok(())
}
