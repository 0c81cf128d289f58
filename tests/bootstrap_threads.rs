//! Bootstrap with every rank in this process (tokio tasks or threads), on 127.0.0.1 only.

use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::time::Duration;

use mscclpp::host::bootstrap::wire::{self, FrameLimits, Hello, MAGIC, Message, PROTOCOL_VERSION};
use mscclpp::host::bootstrap::{
    BlockingBootstrap, Bootstrap, BootstrapConfig, BootstrapError, BootstrapRoot, RankRanges,
    Refusal, Root, UniqueId, create_unique_id, create_unique_id_at,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Short enough that a failure test fails fast, long enough for a loaded 2-core machine.
fn config() -> BootstrapConfig {
    BootstrapConfig::new().with_timeout(Duration::from_secs(5))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// A port nobody listens on (bound, then released).
fn free_port() -> u16 {
    StdListener::bind(localhost(0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What rank `r` contributes: ragged sizes, content depending on the rank.
fn payload(r: usize) -> Vec<u8> {
    (0..(r * 37 + 5)).map(|i| (i * 7 + r * 13) as u8).collect()
}

/// Inits `nranks` ranks as tasks against `root` and returns the bootstraps in rank order.
async fn init_all(nranks: usize, root: BootstrapRoot, config: BootstrapConfig) -> Vec<Bootstrap> {
    let tasks: Vec<_> = (0..nranks)
        .map(|rank| {
            let config = config.clone();
            tokio::spawn(Bootstrap::init_with_config(nranks, rank, root, config))
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap().unwrap());
    }
    out
}

/// Every operation once, checking the results against what each rank contributed.
async fn exercise(bs: &Bootstrap) -> Result<(), BootstrapError> {
    let (r, n) = (bs.rank(), bs.nranks());
    for _ in 0..2 {
        let all = bs.all_gather(&payload(r)).await?;
        assert_eq!(all.len(), n);
        for (i, got) in all.iter().enumerate() {
            assert_eq!(got, &payload(i), "rank {r}: block of rank {i}");
        }
    }
    bs.barrier().await?;
    for root in 0..n {
        let data = if r == root {
            payload(root + 100)
        } else {
            Vec::new()
        };
        assert_eq!(bs.broadcast(root, &data).await?, payload(root + 100));
    }
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    bs.send(next, 7, &payload(r)).await?;
    assert_eq!(bs.recv(prev, 7).await?, payload(prev));
    bs.barrier().await?;
    Ok(())
}

fn run_tasks(nranks: usize) {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let ranks = init_all(nranks, id.into(), config()).await;
        for (r, bs) in ranks.iter().enumerate() {
            assert_eq!((bs.rank(), bs.nranks()), (r, nranks));
            // All in one process: one node.
            assert_eq!((bs.local_rank(), bs.nranks_per_node()), (r, nranks));
        }
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|bs| {
                tokio::spawn(async move {
                    exercise(&bs).await?;
                    bs.close().await;
                    Ok::<_, BootstrapError>(())
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap().unwrap();
        }
    });
}

#[test]
fn tasks_1_rank() {
    run_tasks(1);
}

#[test]
fn tasks_2_ranks() {
    run_tasks(2);
}

#[test]
fn tasks_3_ranks() {
    run_tasks(3);
}

#[test]
fn tasks_8_ranks() {
    run_tasks(8);
}

fn run_threads(nranks: usize) {
    let id = create_unique_id().unwrap();
    let threads: Vec<_> = (0..nranks)
        .map(|rank| {
            std::thread::spawn(move || {
                let bs = BlockingBootstrap::init_with_config(nranks, rank, id, config()).unwrap();
                let all = bs.all_gather(&payload(rank)).unwrap();
                let expected: Vec<_> = (0..nranks).map(payload).collect();
                assert_eq!(all, expected);
                bs.barrier().unwrap();
                let root = nranks / 2;
                let data = if rank == root {
                    b"hello".to_vec()
                } else {
                    Vec::new()
                };
                assert_eq!(bs.broadcast(root, &data).unwrap(), b"hello");
                let (next, prev) = ((rank + 1) % nranks, (rank + nranks - 1) % nranks);
                bs.send(next, 1, &payload(rank)).unwrap();
                assert_eq!(bs.recv(prev, 1).unwrap(), payload(prev));
                bs.barrier().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn threads_1_rank() {
    run_threads(1);
}

#[test]
fn threads_2_ranks() {
    run_threads(2);
}

#[test]
fn threads_3_ranks() {
    run_threads(3);
}

#[test]
fn threads_8_ranks() {
    run_threads(8);
}

#[test]
fn all_gather_of_large_blocks() {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let ranks = init_all(3, id.into(), config()).await;
        let block =
            |r: usize| -> Vec<u8> { (0..(1 << 20) + r).map(|i| (i % 251 + r) as u8).collect() };
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|bs| tokio::spawn(async move { bs.all_gather(&block(bs.rank())).await }))
            .collect();
        for h in handles {
            let all = h.await.unwrap().unwrap();
            for (r, got) in all.iter().enumerate() {
                assert!(got == &block(r), "block of rank {r} differs");
            }
        }
    });
}

#[test]
fn recv_buffers_out_of_order_tags() {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let mut ranks = init_all(2, id.into(), config()).await;
        let one = ranks.pop().unwrap();
        let zero = ranks.pop().unwrap();
        for tag in [3u64, 1, 2, 1] {
            zero.send(1, tag, format!("tag {tag}").as_bytes())
                .await
                .unwrap();
        }
        // Received in another order than sent; same-tag messages keep their order.
        for tag in [2u64, 1, 3, 1] {
            assert_eq!(
                one.recv(0, tag).await.unwrap(),
                format!("tag {tag}").as_bytes()
            );
        }
        // A message to oneself.
        one.send(1, 9, b"me").await.unwrap();
        assert_eq!(one.recv(1, 9).await.unwrap(), b"me");
    });
}

#[test]
fn local_rank_follows_host_ids() {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let hosts = ["node-a", "node-b", "node-a", "node-a"];
        let tasks: Vec<_> = hosts
            .iter()
            .enumerate()
            .map(|(rank, host)| {
                let config = config().with_host_id(*host);
                tokio::spawn(Bootstrap::init_with_config(4, rank, id, config))
            })
            .collect();
        // Keep every rank alive until all are initialised (a rank dials its successor).
        let mut ranks = Vec::new();
        for t in tasks {
            ranks.push(t.await.unwrap().unwrap());
        }
        let mut got = Vec::new();
        for bs in &ranks {
            got.push((bs.local_rank(), bs.nranks_per_node()));
            assert_eq!(bs.host_id(1), Some("node-b"));
        }
        assert_eq!(got, vec![(0, 3), (0, 1), (1, 3), (2, 3)]);
    });
}

#[test]
fn ip_port_form_retries_until_rank0_starts_the_root() {
    let addr = localhost(free_port());
    runtime().block_on(async {
        let late: Vec<_> = (1..3)
            .map(|rank| tokio::spawn(Bootstrap::init_with_config(3, rank, addr, config())))
            .collect();
        // Ranks 1 and 2 are already retrying: nothing listens on `addr` yet.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let zero = Bootstrap::init_with_config(3, 0, addr, config())
            .await
            .unwrap();
        let mut ranks = vec![zero];
        for t in late {
            ranks.push(t.await.unwrap().unwrap());
        }
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|bs| tokio::spawn(async move { exercise(&bs).await }))
            .collect();
        for h in handles {
            h.await.unwrap().unwrap();
        }
    });
}

#[test]
fn unreachable_root_fails_after_retrying() {
    // A socket bound but never listening holds the port, so no other test's listener can
    // take it while connections to it are refused (a port merely found free could be).
    let rt = runtime();
    let reserved = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(localhost(0)).unwrap();
        s
    });
    let addr = reserved.local_addr().unwrap();
    drop(rt);
    let config = config().with_timeout(Duration::from_millis(400));
    let err = BlockingBootstrap::init_with_config(2, 1, addr, config).unwrap_err();
    match err {
        BootstrapError::RootUnreachable {
            rank,
            addr: a,
            attempts,
            ..
        } => {
            assert_eq!((rank, a), (1, addr));
            assert!(attempts >= 2, "no retry: {attempts} attempt(s)");
        }
        other => panic!("unexpected error: {other}"),
    }
}

#[test]
fn wrong_secret_is_refused_and_others_are_unaffected() {
    runtime().block_on(async {
        let root = Root::bind(localhost(0), config()).unwrap();
        let id = root.unique_id();
        let root = tokio::spawn(root.run());
        let forged = UniqueId::new(id.root_addr(), [7; 32]);
        let err = Bootstrap::init_with_config(2, 0, forged, config())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                BootstrapError::RefusedByRoot {
                    reason: Refusal::WrongSecret,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("wrong secret"), "{err}");
        let ranks = init_all(2, id.into(), config()).await;
        root.await.unwrap().unwrap();

        // The same at a rank's own listener.
        let mut s = TcpStream::connect(ranks[1].listen_addr()).await.unwrap();
        let hello = Message::Hello(Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            secret: [7; 32],
            nranks: 2,
            from: 0,
            to: 1,
        });
        wire::write_frame(&mut s, &hello, &[]).await.unwrap();
        let reply = wire::read_frame(&mut s, &FrameLimits::HANDSHAKE)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reply.message, Message::Refused(Refusal::WrongSecret));

        let handles: Vec<_> = ranks
            .into_iter()
            .map(|bs| tokio::spawn(async move { exercise(&bs).await }))
            .collect();
        for h in handles {
            h.await.unwrap().unwrap();
        }
    });
}

#[test]
fn garbage_and_oversize_frames_are_refused_without_harm() {
    runtime().block_on(async {
        let root = Root::bind(localhost(0), config()).unwrap();
        let id = root.unique_id();
        let root = tokio::spawn(root.run());
        // Claims a 4 GiB header, then a huge payload, then plain noise.
        let garbage = [
            [0xffu8, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0].to_vec(),
            [8u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f].to_vec(),
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ];
        for bytes in &garbage {
            let mut s = TcpStream::connect(id.root_addr()).await.unwrap();
            s.write_all(bytes).await.unwrap();
            // The root answers with a refusal (or just closes); it never hangs on us.
            let reply = tokio::time::timeout(
                Duration::from_secs(5),
                wire::read_frame(&mut s, &FrameLimits::HANDSHAKE),
            )
            .await
            .expect("the root neither refused nor closed");
            if let Ok(Some(frame)) = reply {
                assert_malformed_length(&frame.message);
            }
        }
        let ranks = init_all(2, id.into(), config()).await;
        root.await.unwrap().unwrap();
        for bytes in &garbage {
            let mut s = TcpStream::connect(ranks[0].listen_addr()).await.unwrap();
            s.write_all(bytes).await.unwrap();
            let reply = tokio::time::timeout(
                Duration::from_secs(5),
                wire::read_frame(&mut s, &FrameLimits::HANDSHAKE),
            )
            .await
            .expect("the rank neither refused nor closed");
            if let Ok(Some(frame)) = reply {
                assert_malformed_length(&frame.message);
            }
        }
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|bs| tokio::spawn(async move { exercise(&bs).await }))
            .collect();
        for h in handles {
            h.await.unwrap().unwrap();
        }
    });
}

/// A refusal of a frame whose length prefix is wrong says so (not "bad magic").
fn assert_malformed_length(message: &Message) {
    match message {
        Message::Refused(r @ Refusal::MalformedFrame(_)) => {
            assert!(r.to_string().contains("length"), "{r}")
        }
        other => panic!("expected a malformed-frame refusal, got {other:?}"),
    }
}

/// Starts a root and the given (nranks, rank) joiners; returns the root's and ranks' results.
async fn rendezvous_with(
    joiners: &[(usize, usize)],
    config: BootstrapConfig,
) -> (Result<(), BootstrapError>, Vec<BootstrapError>) {
    let root = Root::bind(localhost(0), config.clone()).unwrap();
    let id = root.unique_id();
    let root = tokio::spawn(root.run());
    let tasks: Vec<_> = joiners
        .iter()
        .map(|&(nranks, rank)| {
            tokio::spawn(Bootstrap::init_with_config(
                nranks,
                rank,
                id,
                config.clone(),
            ))
        })
        .collect();
    let mut errors = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(bs) => panic!("rank {} joined a broken rendezvous", bs.rank()),
            Err(e) => errors.push(e),
        }
    }
    (root.await.unwrap(), errors)
}

fn refusal(e: &BootstrapError) -> &Refusal {
    match e {
        BootstrapError::RefusedByRoot { reason, .. } => reason,
        other => panic!("expected a refusal by the root, got: {other}"),
    }
}

#[test]
fn rank_out_of_range_fails_that_rank_only() {
    runtime().block_on(async {
        // Rank 2 never comes: the root times out naming it and the refused join.
        let config = config().with_timeout(Duration::from_secs(2));
        let (root, errors) = rendezvous_with(&[(3, 0), (3, 1), (3, 5)], config).await;
        let expected = Refusal::RankOutOfRange { rank: 5, nranks: 3 };
        assert_eq!(refusal(&errors[2]), &expected);
        let timeout = match root {
            Err(BootstrapError::RendezvousFailed(r)) => r,
            other => panic!("root: {other:?}"),
        };
        assert!(
            matches!(&timeout, Refusal::RendezvousTimeout { missing, refused, .. }
                if missing == &RankRanges::new([2]) && refused.len() == 1),
            "{timeout}"
        );
        let text = timeout.to_string();
        assert!(
            text.contains("rank 2 never joined") && text.contains("rank 5 of 3"),
            "{text}"
        );
        for e in &errors[..2] {
            assert_eq!(refusal(e), &timeout, "{e}");
        }
    });
}

#[test]
fn duplicate_rank_is_refused_and_the_first_keeps_it() {
    runtime().block_on(async {
        let root = Root::bind(localhost(0), config()).unwrap();
        let id = root.unique_id();
        let root = tokio::spawn(root.run());
        let first: Vec<_> = (0..2)
            .map(|rank| tokio::spawn(Bootstrap::init_with_config(3, rank, id, config())))
            .collect();
        // Rank 1 again, once the first rank 1 has surely joined (the root answers in order
        // of arrival; a second try after a refusal would be refused too).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let err = Bootstrap::init_with_config(3, 1, id, config())
            .await
            .unwrap_err();
        assert_eq!(refusal(&err), &Refusal::DuplicateRank { rank: 1 }, "{err}");
        assert!(
            err.to_string().contains("rank 1 has already joined"),
            "{err}"
        );
        let last = tokio::spawn(Bootstrap::init_with_config(3, 2, id, config()));
        let mut ranks = Vec::new();
        for t in first.into_iter().chain([last]) {
            ranks.push(t.await.unwrap().unwrap());
        }
        root.await.unwrap().unwrap();
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|bs| tokio::spawn(async move { exercise(&bs).await }))
            .collect();
        for h in handles {
            h.await.unwrap().unwrap();
        }
    });
}

#[test]
fn nranks_mismatch_fails_the_odd_rank_only() {
    runtime().block_on(async {
        let root = Root::bind(localhost(0), config()).unwrap();
        let id = root.unique_id();
        let root = tokio::spawn(root.run());
        let first = tokio::spawn(Bootstrap::init_with_config(2, 0, id, config()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let err = Bootstrap::init_with_config(3, 1, id, config())
            .await
            .unwrap_err();
        assert!(
            matches!(
                refusal(&err),
                Refusal::NranksMismatch {
                    rank: 1,
                    nranks: 3,
                    expected: 2
                }
            ),
            "{err}"
        );
        let second = Bootstrap::init_with_config(2, 1, id, config())
            .await
            .unwrap();
        let first = first.await.unwrap().unwrap();
        root.await.unwrap().unwrap();
        let (a, b) = tokio::join!(exercise(&first), exercise(&second));
        a.unwrap();
        b.unwrap();
    });
}

/// How the victim of [`departed_rank_is_named`] leaves.
#[derive(Clone, Copy, PartialEq)]
enum Leaves {
    /// It drops its connections, as if killed.
    Lost,
    /// It closes its bootstrap politely, as a rank whose set-up failed does; each survivor
    /// whose `op` fails closes too, as a failing process would.
    Closed,
}

/// Runs `op` on every rank but `victim`, which leaves (`how`) while the others wait in
/// `op`; every survivor must fail naming the victim (with a closed victim, before this
/// session, the ranks along the ring each named the neighbour that failed before them,
/// half a second apart, and a barrier waited out its timeout).
fn departed_rank_is_named(nranks: usize, victim: usize, op: &'static str, how: Leaves) {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let ranks = init_all(nranks, id.into(), config()).await;
        let mut handles = Vec::new();
        for bs in ranks {
            if bs.rank() == victim {
                handles.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    match how {
                        Leaves::Lost => bs.abandon(),
                        Leaves::Closed => bs.close().await,
                    }
                    Ok(())
                }));
            } else {
                handles.push(tokio::spawn(async move {
                    let r = match op {
                        "barrier" => bs.barrier().await,
                        _ => bs.all_gather(&payload(bs.rank())).await.map(drop),
                    };
                    if how == Leaves::Closed {
                        bs.close().await;
                    }
                    r
                }));
            }
        }
        for (rank, h) in handles.into_iter().enumerate() {
            let result = h.await.unwrap();
            if rank == victim {
                continue;
            }
            let peer = match (how, result) {
                (Leaves::Lost, Err(BootstrapError::PeerLost { peer, .. })) => peer,
                (Leaves::Closed, Err(BootstrapError::PeerClosed { peer, .. })) => peer,
                (_, other) => panic!("rank {rank}: expected {victim} named, got {other:?}"),
            };
            assert_eq!(peer, victim, "rank {rank} blamed the wrong rank");
        }
    });
}

#[test]
fn lost_rank_during_all_gather_is_named() {
    departed_rank_is_named(4, 2, "all_gather", Leaves::Lost);
}

#[test]
fn lost_rank_during_barrier_is_named() {
    departed_rank_is_named(8, 5, "barrier", Leaves::Lost);
}

#[test]
fn closed_rank_during_all_gather_is_named_by_every_rank() {
    departed_rank_is_named(8, 2, "all_gather", Leaves::Closed);
}

#[test]
fn closed_rank_during_barrier_is_named_by_every_rank() {
    departed_rank_is_named(6, 4, "barrier", Leaves::Closed);
}

#[test]
fn recv_times_out_naming_the_peer() {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let config = config().with_timeout(Duration::from_millis(300));
        let ranks = init_all(2, id.into(), config).await;
        let err = ranks[0].recv(1, 42).await.unwrap_err();
        match &err {
            BootstrapError::Timeout {
                rank: 0,
                waiting_for,
                ..
            } => {
                assert_eq!(waiting_for, "rank 1")
            }
            other => panic!("{other}"),
        }
        assert!(err.to_string().contains("recv (tag 42)"), "{err}");
    });
}

#[test]
fn closed_peer_fails_recv_instead_of_waiting() {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let mut ranks = init_all(2, id.into(), config()).await;
        ranks.pop().unwrap().close().await;
        let err = ranks[0].recv(1, 1).await.unwrap_err();
        assert!(
            matches!(
                err,
                BootstrapError::PeerClosed {
                    rank: 0,
                    peer: 1,
                    ..
                }
            ),
            "{err}"
        );
    });
}

/// Rank 1 of 4 stalls: alive (its bootstrap still answers), but it never enters `op`; it
/// sleeps well past the timeout, then leaves. The others run `op`, whose pattern makes some
/// rank wait on a healthy rank that waits on rank 1 (`waits_on[r]`: the rank whose message
/// rank `r` was waiting for when its wait timed out). Every failing rank must name rank 1:
/// one that waited on it directly with the plain timeout, the others as the root cause
/// behind the healthy rank they waited for (before protocol version 7 they named that
/// healthy rank alone, as the ones in the `kill.py --sig STOP` record did).
fn stalled_rank_is_named(op: &'static str, waits_on: [usize; 4]) {
    const STALLED: usize = 1;
    let timeout = Duration::from_secs(2);
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let ranks = init_all(4, id.into(), config().with_timeout(timeout)).await;
        let mut handles = Vec::new();
        for bs in ranks {
            handles.push(tokio::spawn(async move {
                if bs.rank() == STALLED {
                    tokio::time::sleep(timeout + Duration::from_secs(3)).await;
                    return (Ok(()), bs);
                }
                let r = match op {
                    "barrier" => bs.barrier().await,
                    _ => bs.all_gather(&payload(bs.rank())).await.map(drop),
                };
                // Kept open until every rank has failed: a goodbye would turn a slower
                // rank's timeout into a closed peer.
                (r, bs)
            }));
        }
        let mut kept = Vec::new();
        for (rank, h) in handles.into_iter().enumerate() {
            let (result, bs) = h.await.unwrap();
            kept.push(bs);
            if rank == STALLED {
                continue;
            }
            let err = result.expect_err("a collective without rank 1 completed");
            let w = waits_on[rank];
            let (waiting_for, gave_up) = match &err {
                BootstrapError::Timeout {
                    rank: r,
                    waiting_for,
                    gave_up,
                    ..
                } if *r == rank => (waiting_for, gave_up),
                other => panic!("rank {rank}: expected a timeout, got {other}"),
            };
            assert_eq!(waiting_for, &format!("rank {w}"), "rank {rank}: {err}");
            if w == STALLED {
                assert_eq!(gave_up, &None, "rank {rank}: {err}");
                assert_eq!(
                    err.to_string(),
                    format!("rank {rank}: {op} timed out after 2s waiting for rank 1")
                );
            } else {
                let g = gave_up.as_ref().unwrap_or_else(|| {
                    panic!("rank {rank} blamed rank {w} alone, not rank 1 behind it: {err}")
                });
                assert_eq!((g.waiting_for, g.op.as_str()), (STALLED, op), "{err}");
                assert_eq!(
                    err.to_string(),
                    format!(
                        "rank {rank}: {op} timed out after 2s waiting for rank {w}, which had \
                         given up, stuck behind rank 1 ({op})"
                    )
                );
            }
        }
        // The reports that came (over the connections the ranks had: none is dialed for
        // one) named rank 1 or the rank their sender waited on (whichever it knew as the
        // root cause when its wait timed out).
        for (rank, bs) in kept.iter().enumerate().filter(|(r, _)| *r != STALLED) {
            for other in (0..4).filter(|&o| o != rank && o != STALLED) {
                if let Some(g) = bs.stall_reported_by(other) {
                    assert!(
                        g.waiting_for == STALLED || g.waiting_for == waits_on[other],
                        "rank {rank}: rank {other} reported {g:?}"
                    );
                }
            }
        }
        for bs in kept {
            bs.close().await;
        }
    });
}

/// Barrier of 4 (dissemination): in round 0 rank 2 waits on rank 1; rank 3 gets rank 2's
/// round-0 message and in round 1 waits on rank 1; rank 0 in round 1 waits on rank 2.
#[test]
fn stalled_rank_is_named_behind_the_rank_stuck_on_it_in_barrier() {
    stalled_rank_is_named("barrier", [2, 1, 1, 1]);
}

/// All-gather of 4 (ring): rank 2 waits on rank 1 at step 0, rank 3 on rank 2 at step 1,
/// rank 0 on rank 3 at step 2: a chain of three to follow.
#[test]
fn stalled_rank_is_named_behind_a_chain_in_all_gather() {
    stalled_rank_is_named("all_gather", [3, 1, 1, 2]);
}

/// A rank that gave up waiting for a stalled rank and then closed its bootstrap: a later
/// wait on it fails as a closed peer, saying what it had given up on.
#[test]
fn a_rank_that_gave_up_and_left_names_the_rank_it_gave_up_on() {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let config = config().with_timeout(Duration::from_secs(1));
        let mut ranks = init_all(3, id.into(), config).await;
        let (b2, b1, b0) = (
            ranks.pop().unwrap(),
            ranks.pop().unwrap(),
            ranks.pop().unwrap(),
        );
        // Rank 1 stalls (never sends); rank 2 gives up on it, plainly, and leaves.
        let err = b2.recv(1, 5).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "rank 2: recv (tag 5) timed out after 1s waiting for rank 1"
        );
        b2.close().await;
        let err = b0.recv(2, 6).await.unwrap_err();
        match &err {
            BootstrapError::PeerClosed {
                rank: 0,
                peer: 2,
                gave_up: Some(g),
                ..
            } => assert_eq!((g.waiting_for, g.op.as_str()), (1, "recv (tag 5)")),
            other => panic!("{other}"),
        }
        assert_eq!(
            err.to_string(),
            "rank 0: recv (tag 6) failed: rank 2 has closed its bootstrap (it had given up, \
             stuck behind rank 1 in recv (tag 5))"
        );
        b1.close().await;
        b0.close().await;
    });
}

#[test]
fn cancelled_collective_poisons_the_bootstrap() {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let ranks = init_all(2, id.into(), config()).await;
        // Rank 1 never joins, so the all-gather is still running when it is cancelled.
        let cancelled =
            tokio::time::timeout(Duration::from_millis(50), ranks[0].all_gather(b"x")).await;
        assert!(cancelled.is_err());
        let err = ranks[0].barrier().await.unwrap_err();
        assert!(matches!(err, BootstrapError::Poisoned { rank: 0 }), "{err}");
    });
}

#[test]
fn oversize_send_is_rejected() {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let config = config().with_max_message_size(1024);
        let ranks = init_all(2, id.into(), config).await;
        let err = ranks[0].send(1, 0, &[0u8; 1025]).await.unwrap_err();
        assert!(matches!(err, BootstrapError::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("1025"), "{err}");
    });
}

#[test]
fn bad_arguments_are_errors() {
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let err = Bootstrap::init(0, 0, id).await.unwrap_err();
        assert!(matches!(err, BootstrapError::InvalidArgument(_)), "{err}");
        let ranks = init_all(2, id.into(), config()).await;
        let err = ranks[0].send(2, 0, b"").await.unwrap_err();
        assert!(err.to_string().contains("peer 2 is out of range"), "{err}");
        let err = ranks[0].broadcast(9, b"").await.unwrap_err();
        assert!(matches!(err, BootstrapError::InvalidArgument(_)), "{err}");
        // Blocking calls inside a runtime are refused, not a panic.
        let err = BlockingBootstrap::init(1, 0, id).unwrap_err();
        assert!(matches!(err, BootstrapError::InsideRuntime), "{err}");
    });
}

#[test]
fn unique_id_string_reaches_the_same_root() {
    let root = create_unique_id_at(localhost(0), config()).unwrap();
    let text = root.to_string();
    let parsed: BootstrapRoot = text.parse().unwrap();
    assert_eq!(parsed, BootstrapRoot::Id(root));
    let bs = BlockingBootstrap::init_with_config(1, 0, parsed, config()).unwrap();
    assert_eq!(bs.all_gather(b"solo").unwrap(), vec![b"solo".to_vec()]);
}

#[test]
fn missing_rank_makes_the_root_time_out_naming_it() {
    runtime().block_on(async {
        let config = config().with_timeout(Duration::from_millis(800));
        let (root, errors) = rendezvous_with(&[(3, 0), (3, 2)], config).await;
        let expected = Refusal::RendezvousTimeout {
            missing: RankRanges::new([1]),
            timeout_ms: 800,
            refused: Vec::new(),
        };
        match root {
            Err(BootstrapError::RendezvousFailed(r)) => assert_eq!(r, expected),
            other => panic!("root: {other:?}"),
        }
        for e in &errors {
            assert_eq!(refusal(e), &expected, "{e}");
            assert!(e.to_string().contains("rank 1 never joined"), "{e}");
        }
    });
}

/// Two ranks of `root` (a fresh unique id's when `None`), rank `late_rank` starting `late`
/// after the other, each under `config`; each rank's outcome.
fn late_join(
    config: BootstrapConfig,
    root: Option<BootstrapRoot>,
    late_rank: usize,
    late: Duration,
) -> Vec<Result<BlockingBootstrap, BootstrapError>> {
    let root = root.unwrap_or_else(|| {
        BootstrapRoot::Id(create_unique_id_at(localhost(0), config.clone()).unwrap())
    });
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let config = config.clone();
            std::thread::spawn(move || {
                if rank == late_rank {
                    std::thread::sleep(late);
                }
                BlockingBootstrap::init_with_config(2, rank, root, config)
            })
        })
        .collect();
    ranks.into_iter().map(|h| h.join().unwrap()).collect()
}

/// `f` on every rank of `bs` at once, one thread each; the results in rank order.
fn on_each<T: Send>(
    bs: &[BlockingBootstrap],
    f: impl Fn(&BlockingBootstrap) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = bs.iter().map(|b| s.spawn(|| f(b))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Both ranks joined: they exchange a byte each.
fn exchange(bs: Vec<Result<BlockingBootstrap, BootstrapError>>) {
    let bs: Vec<BlockingBootstrap> = bs.into_iter().map(|r| r.unwrap()).collect();
    let got = on_each(&bs, |b| b.all_gather(&[b.rank() as u8]).unwrap());
    assert_eq!(got, vec![vec![vec![0u8], vec![1u8]]; 2]);
}

/// Ranks may reach the root far apart (one loads a model first): the rendezvous waits the
/// rendezvous timeout for the last one, not the bootstrap timeout, in both directions.
#[test]
fn the_rendezvous_waits_its_own_timeout_for_a_late_rank() {
    // A rank three bootstrap timeouts late still joins.
    let config = BootstrapConfig::new()
        .with_timeout(Duration::from_secs(1))
        .with_rendezvous_timeout(Duration::from_secs(20));
    exchange(late_join(config.clone(), None, 1, Duration::from_secs(3)));
    // With an `ip:port` root, rank 0 hosts it and may be the late one: the others keep
    // trying to reach it for the rendezvous timeout.
    let addr = BootstrapRoot::Addr(localhost(free_port()));
    exchange(late_join(config, Some(addr), 0, Duration::from_secs(3)));
    // A short rendezvous timeout bounds it even under a long bootstrap timeout: rank 0 is
    // told that rank 1 never joined, with the rendezvous timeout.
    let config = BootstrapConfig::new()
        .with_timeout(Duration::from_secs(10))
        .with_rendezvous_timeout(Duration::from_secs(1));
    let started = std::time::Instant::now();
    let joined = late_join(config, None, 1, Duration::from_secs(3));
    let Err(e) = &joined[0] else {
        panic!("rank 0 must fail")
    };
    assert_eq!(
        refusal(e),
        &Refusal::RendezvousTimeout {
            missing: RankRanges::new([1]),
            timeout_ms: 1000,
            refused: Vec::new(),
        },
        "{e}"
    );
    assert!(
        e.to_string().contains("MSCCLPP_RENDEZVOUS_TIMEOUT"),
        "the error says what to raise: {e}"
    );
    // Rank 1 came after the root had ended: it cannot reach it, but does not wait for the
    // long bootstrap timeout either (the rendezvous timeout bounds its retries: about 4 s
    // in all, where the bootstrap timeout would make it 13).
    assert!(joined[1].is_err());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// A barrier, an all-gather and a receive with a wait of their own tolerate a rank that
/// arrives long after the bootstrap timeout (teardown after one rank saved a checkpoint, a
/// split, a shrink's new rank 0); the plain barrier does not.
#[test]
fn late_ranks_are_waited_for_by_the_within_variants() {
    let config = BootstrapConfig::new().with_timeout(Duration::from_secs(1));
    let bs: Vec<BlockingBootstrap> = late_join(config, None, 1, Duration::ZERO)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let late = Duration::from_secs(3);
    let outcome = |wait: Option<Duration>| {
        on_each(&bs, |b| {
            if b.rank() == 1 {
                std::thread::sleep(late);
            }
            match wait {
                Some(w) => b.barrier_within(w),
                None => b.barrier(),
            }
        })
    };
    let r = outcome(Some(Duration::from_secs(20)));
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    // The same for an all-gather (ncclCommSplit's first exchange) and a receive from a late
    // sender (ncclCommShrink's wait for its new rank 0).
    let long = Duration::from_secs(20);
    on_each(&bs, |b| {
        // Rank 0 waits for each, rank 1 comes `late` to each.
        if b.rank() == 1 {
            std::thread::sleep(late);
            b.send(0, 7, b"id").unwrap();
            std::thread::sleep(late);
        } else {
            assert_eq!(b.recv_within(1, 7, long).unwrap(), b"id");
        }
        let all = b.all_gather_within(&[b.rank() as u8], long).unwrap();
        assert_eq!(all, vec![vec![0u8], vec![1u8]]);
    });
    // Rank 0 gives up after 1 s; rank 1, arriving late, finds rank 0 gave up (or waits its
    // own second): rank 0 fails with a timeout of the configured second.
    let r = outcome(None);
    match &r[0] {
        Err(BootstrapError::Timeout { after, .. }) => {
            assert_eq!(*after, Duration::from_secs(1))
        }
        other => panic!("rank 0: {other:?}"),
    }
}

/// A goodbye names the calls its sender set (`set_calls_at_close`), or none: peers read it
/// (`left_after`), and a leave hook is told once per rank that leaves, and at once of the
/// ranks that already left when it is registered.
#[test]
fn goodbyes_name_the_calls_their_sender_set() {
    use std::sync::{Arc, Mutex};
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let mut bs = init_all(3, BootstrapRoot::Id(id), config()).await;
        let (b2, b1, b0) = (bs.pop().unwrap(), bs.pop().unwrap(), bs.pop().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        b0.on_peer_left(move |r, calls| s.lock().unwrap().push((r, calls)));
        assert_eq!(b0.left_after(1), None);
        b1.set_calls_at_close(7);
        b1.close().await;
        b2.close().await;
        let t0 = std::time::Instant::now();
        while !(b0.has_left(1) && b0.has_left(2)) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the goodbyes did not arrive"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!((b0.left_after(1), b0.left_after(2)), (Some(7), None));
        // The hook is told just after a departure is recorded (outside the bootstrap's
        // locks), so it may lag `has_left` by a moment.
        while seen.lock().unwrap().len() < 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the hook was not told of both departures"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, vec![(1, Some(7)), (2, None)]);
        let late = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&late);
        b0.on_peer_left(move |r, calls| l.lock().unwrap().push((r, calls)));
        let mut got = late.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, vec![(1, Some(7)), (2, None)]);
    });
}

/// A goodbye says whether all of its sender's work had ended: set by
/// `set_work_ended_at_close`, and implied by `set_calls_at_close`; a plain close says
/// nothing. A departure hook is told so once per rank, and at once of ranks that had left.
#[test]
fn goodbyes_say_whether_the_work_ended() {
    use std::sync::{Arc, Mutex};
    runtime().block_on(async {
        let id = create_unique_id().unwrap();
        let mut bs = init_all(4, BootstrapRoot::Id(id), config()).await;
        let b3 = bs.pop().unwrap();
        let b2 = bs.pop().unwrap();
        let b1 = bs.pop().unwrap();
        let b0 = bs.pop().unwrap();
        // Links are made on first use: rank 0 talks to every rank once.
        for (r, b) in [(1, &b1), (2, &b2), (3, &b3)] {
            b0.send(r, 0, b"hi").await.unwrap();
            assert_eq!(b.recv(0, 0).await.unwrap(), b"hi");
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        b0.on_peer_departed(move |r, ended| s.lock().unwrap().push((r, ended)));
        b1.set_work_ended_at_close();
        b1.close().await;
        b2.set_calls_at_close(3);
        b2.close().await;
        b3.close().await;
        let t0 = std::time::Instant::now();
        while !(1..4).all(|r| b0.has_left(r)) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the goodbyes did not arrive"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // As above: the hook may lag `has_left` by a moment.
        while seen.lock().unwrap().len() < 3 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the hook was not told of every departure"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let want = vec![(1, true), (2, true), (3, false)];
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, want);
        let late = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&late);
        b0.on_peer_departed(move |r, ended| l.lock().unwrap().push((r, ended)));
        let mut got = late.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, want);
        // The calls hook still sees only the calls.
        assert_eq!(b0.left_after(1), None);
        assert_eq!(b0.left_after(2), Some(3));
    });
}

/// A spawned root whose owner says a rank ended refuses the waiting ranks at once with a
/// reason naming it, and every later join too; dropping the handle of another root refuses
/// its waiting rank with "the root was shut down". Neither waits for the 5 s timeout.
#[test]
fn a_spawned_root_refuses_at_once_when_told_a_rank_ended_or_when_dropped() {
    runtime().block_on(async {
        let config = BootstrapConfig::new().with_timeout(Duration::from_secs(30));
        let handle = Root::bind(localhost(0), config.clone())
            .unwrap()
            .spawn()
            .unwrap();
        let id = handle.unique_id();
        let waiting = tokio::spawn(Bootstrap::init_with_config(3, 0, id, config.clone()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t0 = std::time::Instant::now();
        handle.rank_ended(2, "signal: 9 (SIGKILL)");
        for err in [
            waiting.await.unwrap().unwrap_err(),
            // A join after the news.
            Bootstrap::init_with_config(3, 1, id, config.clone())
                .await
                .unwrap_err(),
        ] {
            assert!(
                matches!(
                    &err,
                    BootstrapError::RefusedByRoot {
                        reason: Refusal::RankEnded { rank: 2, .. },
                        ..
                    }
                ),
                "{err}"
            );
            assert!(
                err.to_string()
                    .contains("rank 2 ended before the rendezvous completed (signal: 9 (SIGKILL))"),
                "{err}"
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        drop(handle);

        let handle = Root::bind(localhost(0), config.clone())
            .unwrap()
            .spawn()
            .unwrap();
        let waiting = tokio::spawn(Bootstrap::init_with_config(
            2,
            0,
            handle.unique_id(),
            config.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t0 = std::time::Instant::now();
        drop(handle);
        let err = waiting.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("the root was shut down"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    });
}

/// A receive from a rank that closed its bootstrap after another rank was lost names the
/// lost rank (the likely reason the other left, as in a setup round where a rank died), and
/// says that the awaited rank closed since.
#[test]
fn a_receive_from_a_rank_that_left_after_a_loss_names_the_lost_rank() {
    let id = create_unique_id().unwrap();
    let config = BootstrapConfig::new().with_timeout(Duration::from_secs(20));
    // Every rank out of the bootstrap barrier before rank 2 goes.
    let all = &std::sync::Barrier::new(3);
    std::thread::scope(|s| {
        let c2 = config.clone();
        s.spawn(move || {
            let bs = BlockingBootstrap::init_with_config(3, 2, id, c2).unwrap();
            bs.barrier().unwrap();
            all.wait();
            bs.abandon();
        });
        let c1 = config.clone();
        s.spawn(move || {
            let bs = BlockingBootstrap::init_with_config(3, 1, id, c1).unwrap();
            bs.barrier().unwrap();
            all.wait();
            let t0 = std::time::Instant::now();
            while !bs.as_async().was_lost(2) {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "rank 2's loss never seen"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            drop(bs);
        });
        let bs = BlockingBootstrap::init_with_config(3, 0, id, config.clone()).unwrap();
        bs.barrier().unwrap();
        all.wait();
        let err = bs.recv_named(1, 9, "the setup info").unwrap_err();
        assert!(
            matches!(err, BootstrapError::PeerLost { peer: 2, .. }),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("receiving the setup info failed: rank 2 was lost")
                && text.contains("rank 1, which this waited for, has closed its bootstrap since"),
            "{text}"
        );
    });
}
