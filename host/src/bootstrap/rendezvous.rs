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
    let join = join_message(nranks, rank, join_secret, config, listen_addr)?;
    wire::write_frame(&mut stream, &join, &[])
        .await
        .map_err(frame_err(rank, root_addr, "joining"))?;
    let reply = await_reply(&mut stream, rank, root_addr, config)
        .await?
        .map_err(frame_err(rank, root_addr, "waiting for"))?;
    let peers = peer_table(reply, rank, root_addr)?;
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

/// The join message of `rank` (of `nranks`), listening for peers at `listen_addr`.
fn join_message(
    nranks: usize,
    rank: usize,
    join_secret: [u8; SECRET_BYTES],
    config: &BootstrapConfig,
    listen_addr: SocketAddr,
) -> Result<Message, BootstrapError> {
    let settings =
        Settings::global().map_err(|e| BootstrapError::InvalidArgument(e.to_string()))?;
    Ok(Message::Join(Join {
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
    }))
}

/// Waits for the root's answer to the join on `stream` (the frame, or why it could not be
/// read), up to the rendezvous timeout and a little more; says on stderr, during a long
/// rendezvous, that this rank still waits.
async fn await_reply(
    stream: &mut TcpStream,
    rank: usize,
    root_addr: SocketAddr,
    config: &BootstrapConfig,
) -> Result<Result<Option<Frame>, wire::FrameError>, BootstrapError> {
    // The root's own deadline runs from the first join; wait a little longer so that its
    // more precise verdict (which ranks are missing) arrives first.
    let wait = config.rendezvous_wait() + Duration::from_millis(500);
    let limits = FrameLimits::with_max_payload(wire::MAX_PEER_TABLE_LEN);
    timeout(wait, async {
        // A long rendezvous (as the root's, see `root::NOTICE_EVERY`) says on this rank's
        // stderr too that it still waits: the root's notice is in one process's output
        // only, perhaps on another machine.
        let long = config.rendezvous_wait() > config.timeout;
        let began = Instant::now();
        let mut next = began + config.timeout;
        let mut read = std::pin::pin!(wire::read_frame(stream, &limits));
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
    })
}

/// The peer table in the root's answer `reply`, or the error it stands for (a refusal, a
/// closed connection, another message).
fn peer_table(
    reply: Option<Frame>,
    rank: usize,
    root_addr: SocketAddr,
) -> Result<Vec<wire::PeerInfo>, BootstrapError> {
    match reply {
        Some(Frame {
            message: Message::Welcome,
            payload,
        }) => {
            wire::decode_peer_table(&payload).map_err(frame_err(rank, root_addr, "peer table from"))
        }
        Some(Frame {
            message: Message::Refused(reason),
            ..
        }) => Err(BootstrapError::RefusedByRoot {
            rank,
            addr: root_addr,
            reason,
        }),
        Some(frame) => Err(BootstrapError::Protocol(format!(
            "rank {rank}: the bootstrap root at {root_addr} answered with {:?}",
            frame.message
        ))),
        None => Err(BootstrapError::Protocol(format!(
            "rank {rank}: the bootstrap root at {root_addr} closed the connection during the rendezvous"
        ))),
    }
}

/// What a frame error of `rank`'s exchange with the root at `root_addr` becomes (`what`
/// the rank was doing: "joining", "waiting for", ...).
fn frame_err(
    rank: usize,
    root_addr: SocketAddr,
    what: &str,
) -> impl FnOnce(wire::FrameError) -> BootstrapError + use<> {
    let context = format!("rank {rank}: {what} the bootstrap root at {root_addr}");
    move |source| BootstrapError::Frame { context, source }
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
