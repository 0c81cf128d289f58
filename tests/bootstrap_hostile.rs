//! Hostile and misused bootstraps, on 127.0.0.1 only: raw TCP clients that join the root with
//! wrong ranks, wrong nranks, wrong secrets or broken frames must be refused without harming
//! the job, and errors must name real ranks and operations.

use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::wire::{
    self, FrameLimits, Hello, Join, MAGIC, MAX_HOST_ID_LEN, Message, PROTOCOL_VERSION,
};
use mscclpp::host::bootstrap::{
    BlockingBootstrap, Bootstrap, BootstrapConfig, BootstrapError, BootstrapRoot, Refusal, Root,
    create_unique_id_at,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The placeholder the root used to print as its rank.
const PLACEHOLDER_RANK: &str = "18446744073709551615";

fn config() -> BootstrapConfig {
    BootstrapConfig::new().with_timeout(Duration::from_secs(10))
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

fn free_port() -> u16 {
    StdListener::bind(localhost(0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn join(secret: [u8; 32], nranks: u32, rank: u32) -> Message {
    Message::Join(Join {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        secret,
        nranks,
        rank,
        listen_addr: localhost(9),
        host_id: "intruder".into(),
        pid: 1,
        process_space: "intruder".into(),
        job: String::new(),
    })
}

/// Connects (retrying while the root is not up yet, at most 10 s).
async fn connect(addr: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(addr).await {
            Ok(s) => return s,
            Err(e) if Instant::now() > deadline => panic!("cannot reach {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Sends raw bytes to `addr` and returns the refusal it answers with (it must answer or
/// close within 5 s). The connection is kept open until the answer, like an attacker would.
async fn raw_reply(addr: SocketAddr, bytes: &[u8]) -> Option<Refusal> {
    let mut s = connect(addr).await;
    s.write_all(bytes).await.unwrap();
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        wire::read_frame(&mut s, &FrameLimits::HANDSHAKE),
    )
    .await
    .expect("neither refused nor closed within 5 s");
    match reply {
        Ok(Some(frame)) => match frame.message {
            Message::Refused(r) => Some(r),
            other => panic!("a hostile client got {other:?}"),
        },
        _ => None,
    }
}

async fn hostile_join(addr: SocketAddr, message: &Message) -> Refusal {
    let frame = wire::encode_frame(message, &[]).unwrap();
    raw_reply(addr, &frame)
        .await
        .expect("the root closed without saying why")
}

/// Every rank gathers its rank; checks the result.
async fn gather_ranks(ranks: Vec<Bootstrap>) {
    let n = ranks.len();
    let tasks: Vec<_> = ranks
        .into_iter()
        .map(|bs| tokio::spawn(async move { bs.all_gather(&[bs.rank() as u8]).await }))
        .collect();
    for t in tasks {
        let all = t.await.unwrap().unwrap();
        assert_eq!(all, (0..n).map(|r| vec![r as u8]).collect::<Vec<_>>());
    }
}

#[test]
fn ip_port_root_survives_hostile_joins() {
    runtime().block_on(async {
        let addr = localhost(free_port());
        let root = BootstrapRoot::Addr(addr);
        let rank0 = tokio::spawn(Bootstrap::init_with_config(3, 0, root, config()));
        let zero = [0u8; 32];
        // Each of these used to abort the whole job (or take a rank).
        assert_eq!(
            hostile_join(addr, &join(zero, 3, 7)).await,
            Refusal::RankOutOfRange { rank: 7, nranks: 3 }
        );
        assert_eq!(
            hostile_join(addr, &join(zero, 5, 1)).await,
            Refusal::NranksMismatch {
                rank: 1,
                nranks: 5,
                expected: 3
            }
        );
        // Rank 0 is the hosting process's own; nobody else can join as rank 0.
        assert_eq!(
            hostile_join(addr, &join(zero, 3, 0)).await,
            Refusal::WrongSecret
        );
        assert_eq!(
            hostile_join(addr, &join([9; 32], 3, 1)).await,
            Refusal::WrongSecret
        );
        // An over-long host id or process space: refused, naming the field and its length
        // (rank 1 stays free for the real one).
        let long = "x".repeat(MAX_HOST_ID_LEN + 1);
        for field in ["host id", "process space", "job id"] {
            let mut m = join(zero, 3, 1);
            let mut max = MAX_HOST_ID_LEN;
            if let Message::Join(j) = &mut m {
                match field {
                    "host id" => j.host_id = long.clone(),
                    "process space" => j.process_space = long.clone(),
                    _ => {
                        j.job = long.clone();
                        max = wire::MAX_JOB_ID_LEN;
                    }
                }
            }
            let r = hostile_join(addr, &m).await;
            let want = format!("{field} of {} bytes (at most {max})", long.len());
            assert!(r.to_string().contains(&want), "{field}: {r}");
        }
        // A join of version 7 (fields before process_space: this version's with an empty
        // process space and job, their trailing length bytes cut): a version mismatch, not a
        // broken frame.
        let mut old = join(zero, 3, 1);
        if let Message::Join(j) = &mut old {
            j.version = 7;
            j.process_space.clear();
            j.job.clear();
        }
        let mut frame = wire::encode_frame(&old, &[]).unwrap();
        for _ in 0..2 {
            assert_eq!(
                frame.pop(),
                Some(0),
                "an empty process space and job end the header"
            );
        }
        let header_len = u32::from_le_bytes(frame[..4].try_into().unwrap()) - 2;
        frame[..4].copy_from_slice(&header_len.to_le_bytes());
        assert_eq!(
            raw_reply(addr, &frame).await,
            Some(Refusal::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: 7
            })
        );
        // A length prefix claiming a 4 GiB header: refused, and the refusal says "length".
        let bad = raw_reply(addr, &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0])
            .await
            .expect("no refusal for a bad length");
        assert!(matches!(bad, Refusal::MalformedFrame(_)), "{bad}");
        assert!(bad.to_string().contains("length"), "{bad}");
        let bad = raw_reply(
            addr,
            &[8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
        )
        .await
        .expect("no refusal for a bad payload length");
        assert!(bad.to_string().contains("payload length"), "{bad}");
        // A client that connects and says nothing, then leaves.
        drop(connect(addr).await);

        let others: Vec<_> = (1..3)
            .map(|rank| tokio::spawn(Bootstrap::init_with_config(3, rank, root, config())))
            .collect();
        let mut ranks = vec![rank0.await.unwrap().unwrap()];
        for t in others {
            ranks.push(t.await.unwrap().unwrap());
        }
        gather_ranks(ranks).await;
    });
}

#[test]
fn ip_port_first_join_keeps_the_rank() {
    runtime().block_on(async {
        let addr = localhost(free_port());
        let root = BootstrapRoot::Addr(addr);
        let early: Vec<_> = (0..2)
            .map(|rank| tokio::spawn(Bootstrap::init_with_config(3, rank, root, config())))
            .collect();
        // Give ranks 0 and 1 time to join, then try to steal rank 1.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            hostile_join(addr, &join([0; 32], 3, 1)).await,
            Refusal::DuplicateRank { rank: 1 }
        );
        let last = tokio::spawn(Bootstrap::init_with_config(3, 2, root, config()));
        let mut ranks = Vec::new();
        for t in early.into_iter().chain([last]) {
            ranks.push(t.await.unwrap().unwrap());
        }
        gather_ranks(ranks).await;
    });
}

#[test]
fn ip_port_secret_refuses_joins_without_it() {
    runtime().block_on(async {
        let addr = localhost(free_port());
        let root = BootstrapRoot::Addr(addr);
        let with_secret = || config().with_secret("job-4242");
        let rank0 = tokio::spawn(Bootstrap::init_with_config(3, 0, root, with_secret()));
        // Unauthenticated joins, even for a free rank, are refused; the job goes on.
        assert_eq!(
            hostile_join(addr, &join([0; 32], 3, 1)).await,
            Refusal::WrongSecret
        );
        let err = Bootstrap::init_with_config(3, 2, root, config().with_secret("job-4243"))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                BootstrapError::RefusedByRoot {
                    rank: 2,
                    reason: Refusal::WrongSecret,
                    ..
                }
            ),
            "{err}"
        );
        let others: Vec<_> = (1..3)
            .map(|rank| tokio::spawn(Bootstrap::init_with_config(3, rank, root, with_secret())))
            .collect();
        let mut ranks = vec![rank0.await.unwrap().unwrap()];
        for t in others {
            ranks.push(t.await.unwrap().unwrap());
        }
        // The ranks' own listeners want the secret too.
        let hello = Message::Hello(Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            secret: [0; 32],
            nranks: 3,
            from: 0,
            to: 1,
        });
        assert_eq!(
            hostile_join(ranks[1].listen_addr(), &hello).await,
            Refusal::WrongSecret
        );
        gather_ranks(ranks).await;
    });
}

#[test]
fn refused_joins_are_named_when_the_root_times_out() {
    runtime().block_on(async {
        let root = Root::bind(localhost(0), config().with_timeout(Duration::from_secs(1))).unwrap();
        let id = root.unique_id();
        let root = tokio::spawn(root.run());
        let quick = BootstrapConfig::new().with_timeout(Duration::from_secs(1));
        let rank0 = tokio::spawn(Bootstrap::init_with_config(2, 0, id, quick.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let err = Bootstrap::init_with_config(2, 7, id, quick).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "rank 7: the bootstrap root at {} refused the connection: rank 7 is out of range for 2 ranks",
                id.root_addr()
            )
        );
        let err = rank0.await.unwrap().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("rank 1 never joined"), "{text}");
        assert!(
            text.contains("a join as rank 7 of 2 from 127.0.0.1:")
                && text.contains("out of range"),
            "{text}"
        );
        let text = root.await.unwrap().unwrap_err().to_string();
        assert!(text.contains("rank 7 of 2"), "{text}");
    });
}

#[test]
fn port_zero_is_refused_at_once() {
    let root: BootstrapRoot = "127.0.0.1:0".parse().unwrap();
    for rank in [0, 1] {
        let start = Instant::now();
        let err = BlockingBootstrap::init(2, rank, root).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        assert!(matches!(err, BootstrapError::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("port 0"), "{err}");
    }
}

#[test]
fn root_errors_name_the_root_not_a_placeholder_rank() {
    let busy = StdListener::bind(localhost(0)).unwrap();
    let addr = busy.local_addr().unwrap();
    let err = Root::bind(addr, config()).unwrap_err();
    let text = err.to_string();
    assert!(!text.contains(PLACEHOLDER_RANK), "{text}");
    assert!(
        text.starts_with("bootstrap root: ") && text.contains(&addr.to_string()),
        "{text}"
    );
    let err = create_unique_id_at(addr, config()).unwrap_err().to_string();
    assert!(!err.contains(PLACEHOLDER_RANK), "{err}");
    // The ip:port form: rank 0 cannot host the root on a taken port, and says what to do.
    let err = BlockingBootstrap::init_with_config(2, 0, addr, config())
        .unwrap_err()
        .to_string();
    assert!(!err.contains(PLACEHOLDER_RANK), "{err}");
    assert!(
        err.contains("rank 0")
            && err.contains("another process is listening")
            && err.contains("MSCCLPP_BOOTSTRAP_PORT"),
        "{err}"
    );
    drop(busy);
}

#[test]
fn named_messages_show_names_not_tags() {
    // The communicator's setup tags look like this: a marker in the high bits.
    let tag = 0x4d53_4350_0000_0003u64;
    let id = create_unique_id_at(localhost(0), config()).unwrap();
    let quick = BootstrapConfig::new().with_timeout(Duration::from_millis(500));
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let quick = quick.clone();
            std::thread::spawn(move || BlockingBootstrap::init_with_config(2, rank, id, quick))
        })
        .collect();
    let mut ranks: Vec<_> = ranks
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    let what = "the setup info of connection tag 3";
    let err = ranks[0].recv_named(1, tag, what).unwrap_err().to_string();
    assert!(
        err.contains("rank 0: receiving the setup info of connection tag 3")
            && err.contains("rank 1"),
        "{err}"
    );
    assert!(!err.contains(&tag.to_string()), "{err}");
    let err = ranks[0]
        .send_named(5, tag, what, b"x")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sending the setup info of connection tag 3"),
        "{err}"
    );
    assert!(!err.contains(&tag.to_string()), "{err}");
    // Still delivered as a plain tagged message.
    ranks[1].send_named(0, tag, what, b"info").unwrap();
    assert_eq!(ranks[0].recv(1, tag).unwrap(), b"info");
    drop(ranks.pop());
    let err = ranks[0].recv_named(1, tag, what).unwrap_err().to_string();
    assert!(
        err.contains("receiving the setup info of connection tag 3"),
        "{err}"
    );
    assert!(!err.contains(&tag.to_string()), "{err}");
}

/// Rank 0 of 100,000 alone, hosting the root (the `ip:port` form): the rendezvous times out
/// and rank 0 (the root's caller too) is told which ranks never joined as one short range.
/// The list of 99,999 ranks used to exceed a frame, and rank 0 only heard that the root
/// closed the connection.
#[test]
fn a_rendezvous_of_a_huge_job_names_its_missing_ranks_as_ranges() {
    let addr = localhost(free_port());
    let config = BootstrapConfig::new()
        .with_timeout(Duration::from_secs(5))
        .with_rendezvous_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let err = BlockingBootstrap::init_with_config(100_000, 0, addr, config)
        .unwrap_err()
        .to_string();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(err.contains("ranks 1-99999 never joined"), "{err}");
    assert!(!err.contains("closed the connection"), "{err}");
    assert!(err.len() < 1000, "{} bytes: {err}", err.len());
}

/// Rank 0 of the `ip:port` form given an address that is not this machine's (192.0.2.1,
/// reserved for documentation): it says so, not that another process listens there (the
/// hint for a taken port, checked in `root_errors_name_the_root_not_a_placeholder_rank`).
#[test]
fn an_address_not_of_this_machine_is_named_as_such() {
    let addr: SocketAddr = "192.0.2.1:29500".parse().unwrap();
    let started = Instant::now();
    let err = BlockingBootstrap::init_with_config(2, 0, addr, config())
        .unwrap_err()
        .to_string();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.contains("not one of this machine's") && err.contains("192.0.2.1:29500"),
        "{err}"
    );
    assert!(!err.contains("listening"), "{err}");
}
