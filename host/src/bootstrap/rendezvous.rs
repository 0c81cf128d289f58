//! A rank's way to the root: connecting (with back-off while the root starts) and joining,
//! which returns the peer table.

use super::*;

/// Reaches the root (retrying for `connect_wait`), joins, and returns this rank's listener
/// and the peer table (waited for up to the rendezvous timeout).
pub(super) async fn rendezvous(
    nranks: usize,
    rank: usize,
    id: &UniqueId,
    join_secret: [u8; SECRET_BYTES],
    config: &BootstrapConfig,
    connect_wait: Duration,
) -> Result<(TcpListener, Vec<wire::PeerInfo>), BootstrapError> {
    let root_addr = id.root_addr();
    let mut stream = connect_with_backoff(rank, root_addr, connect_wait).await?;
    let _ = stream.set_nodelay(true);
    let io = |context: String| {
        move |source| BootstrapError::Io {
            rank,
            context,
            source,
        }
    };
    let local_ip = match config.listen_ip {
        Some(ip) => ip,
        None => stream
            .local_addr()
            .map_err(io("local address of the root connection".into()))?
            .ip(),
    };
    let listener = TcpListener::bind((local_ip, 0))
        .await
        .map_err(io(format!("cannot listen for peers on {local_ip}")))?;
    let listen_addr = listener
        .local_addr()
        .map_err(io("local address of the peer listener".into()))?;
    let settings =
        Settings::global().map_err(|e| BootstrapError::InvalidArgument(e.to_string()))?;
    let join = Message::Join(Join {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        secret: join_secret,
        nranks: nranks as u32,
        rank: rank as u32,
        listen_addr,
        pid: std::process::id(),
        process_space: process_space_id(),
        job: config.effective_job_id(),
        host_id: truncate(match &config.host_id {
            Some(id) => id.clone(),
            None if settings.host_id.is_some() => default_host_id(),
            None => simulated_host_id(settings.simulate_hosts, rank, nranks)
                .unwrap_or_else(default_host_id),
        }),
    });
    let frame_err = |what: &str| {
        let context = format!("rank {rank}: {what} the bootstrap root at {root_addr}");
        move |source| BootstrapError::Frame { context, source }
    };
    wire::write_frame(&mut stream, &join, &[])
        .await
        .map_err(frame_err("joining"))?;
    // The root's own deadline runs from the first join; wait a little longer so that its
    // more precise verdict (which ranks are missing) arrives first.
    let wait = config.rendezvous_wait() + Duration::from_millis(500);
    let limits = FrameLimits::with_max_payload(wire::MAX_PEER_TABLE_LEN);
    let reply = timeout(wait, async {
        // A long rendezvous (as the root's, see `root::NOTICE_EVERY`) says on this rank's
        // stderr too that it still waits: the root's notice is in one process's output
        // only, perhaps on another machine.
        let long = config.rendezvous_wait() > config.timeout;
        let began = Instant::now();
        let mut next = began + config.timeout;
        let mut read = std::pin::pin!(wire::read_frame(&mut stream, &limits));
        loop {
            tokio::select! {
                r = &mut read => break r,
                _ = tokio::time::sleep_until(next), if long => {
                    crate::diag::eprint_line(&format!(
                        "mscclpp: rank {rank} has waited {}s at the bootstrap root at \
                         {root_addr} for the other ranks to join; it waits up to {}s in all \
                         (the rendezvous timeout: MSCCLPP_RENDEZVOUS_TIMEOUT)",
                        began.elapsed().as_secs(),
                        config.rendezvous_wait().as_secs()
                    ));
                    next += root::NOTICE_EVERY;
                }
            }
        }
    })
    .await
    .map_err(|_| BootstrapError::Timeout {
        rank,
        op: Op::Init,
        waiting_for: format!("the bootstrap root at {root_addr} to complete the rendezvous"),
        after: wait,
        gave_up: None,
        stuck: Box::default(),
    })?
    .map_err(frame_err("waiting for"))?;
    let peers = match reply {
        Some(Frame {
            message: Message::Welcome,
            payload,
        }) => wire::decode_peer_table(&payload).map_err(frame_err("peer table from"))?,
        Some(Frame {
            message: Message::Refused(reason),
            ..
        }) => {
            return Err(BootstrapError::RefusedByRoot {
                rank,
                addr: root_addr,
                reason,
            });
        }
        Some(frame) => {
            return Err(BootstrapError::Protocol(format!(
                "rank {rank}: the bootstrap root at {root_addr} answered with {:?}",
                frame.message
            )));
        }
        None => {
            return Err(BootstrapError::Protocol(format!(
                "rank {rank}: the bootstrap root at {root_addr} closed the connection during the rendezvous"
            )));
        }
    };
    if peers.len() != nranks || peers[rank].addr != listen_addr {
        return Err(BootstrapError::Protocol(format!(
            "rank {rank}: the peer table from the root has {} entries (expected {nranks}) or misplaces this rank",
            peers.len()
        )));
    }
    // Hang up first, so that the TIME_WAIT state stays on our side, not on the root's port.
    drop(stream);
    Ok((listener, peers))
}

/// Connects to the root, retrying with exponential backoff (10 ms doubling to 500 ms) until
/// `wait` has passed: the root may not be listening yet.
pub(super) async fn connect_with_backoff(
    rank: usize,
    addr: SocketAddr,
    wait: Duration,
) -> Result<TcpStream, BootstrapError> {
    let start = Instant::now();
    let deadline = start + wait;
    let mut delay = Duration::from_millis(10);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let error = match timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => e,
            Err(_) => std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
        };
        if Instant::now() + delay >= deadline {
            return Err(BootstrapError::RootUnreachable {
                rank,
                addr,
                attempts,
                waited: start.elapsed(),
                source: error,
            });
        }
        sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}
