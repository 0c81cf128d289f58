//! The root: the rendezvous point where ranks learn each other's addresses.
//!
//! The root accepts one connection per rank, checks each rank's handshake (magic, version,
//! secret: a bad one is refused on that connection only, and the rendezvous goes on), then
//! checks the job (nranks agree, ranks in range, no rank twice: any of these aborts the whole
//! rendezvous, and every rank that has contacted or later contacts the root is told why).
//! Once all ranks have joined it sends each the peer table and ends.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};

use super::BootstrapConfig;
use super::error::{BootstrapError, Refusal};
use super::unique_id::UniqueId;
use super::wire::{
    self, Frame, FrameLimits, Join, MAGIC, MAX_HOST_ID_LEN, Message, PROTOCOL_VERSION, PeerInfo,
};

/// Root's stand-in for "this rank" in error messages.
const ROOT: usize = usize::MAX;
/// How long the root waits for ranks to hang up after the welcome (so that the ranks, not the
/// root's port, hold the TIME_WAIT state and the port can be bound again at once).
const LINGER: Duration = Duration::from_secs(2);
const COURTESY_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// A bound rendezvous root, not yet running.
///
/// ```no_run
/// # async fn demo() -> Result<(), mscclpp_host::bootstrap::BootstrapError> {
/// use mscclpp_host::bootstrap::{BootstrapConfig, Root};
/// let root = Root::bind("127.0.0.1:0".parse().unwrap(), BootstrapConfig::default())?;
/// let id = root.unique_id(); // hand this to every rank
/// tokio::spawn(root.run());
/// # let _ = id; Ok(()) }
/// ```
#[derive(Debug)]
pub struct Root {
    listener: std::net::TcpListener,
    id: UniqueId,
    config: BootstrapConfig,
}

/// Starts a root on an ephemeral port of 127.0.0.1 in a background thread and returns its id
/// (the seed's `mscclppGetUniqueId`). The root serves one rendezvous, then ends; it lives at
/// most as long as this process.
pub fn create_unique_id() -> Result<UniqueId, BootstrapError> {
    create_unique_id_at(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        BootstrapConfig::default(),
    )
}

/// Like [`create_unique_id`], listening on `addr` (port 0 picks a free port). The address
/// goes into the id as bound, so give one the ranks can reach (not `0.0.0.0`).
pub fn create_unique_id_at(
    addr: SocketAddr,
    config: BootstrapConfig,
) -> Result<UniqueId, BootstrapError> {
    let handle = Root::bind(addr, config)?.spawn()?;
    let id = handle.unique_id();
    handle.detach();
    Ok(id)
}

impl Root {
    /// Binds a root on `addr` with a fresh random secret.
    pub fn bind(addr: SocketAddr, config: BootstrapConfig) -> Result<Root, BootstrapError> {
        let listener = bind_listener(addr)?;
        let local = listener.local_addr().map_err(|source| BootstrapError::Io {
            rank: ROOT,
            context: format!("bootstrap root on {addr}: local address"),
            source,
        })?;
        Ok(Root {
            listener,
            id: UniqueId::random(local),
            config,
        })
    }

    /// Binds a root for an existing id (the `"ip:port"` form: rank 0 hosts the root).
    pub(crate) fn bind_for(id: UniqueId, config: BootstrapConfig) -> Result<Root, BootstrapError> {
        Ok(Root {
            listener: bind_listener(id.root_addr())?,
            id,
            config,
        })
    }

    /// The id ranks use to reach this root.
    pub fn unique_id(&self) -> UniqueId {
        self.id
    }

    /// Serves one rendezvous.
    ///
    /// Waits without a deadline for the first rank (drop the future or the
    /// [`RootHandle`] to stop it), then at most the configured timeout for the others.
    /// Returns `Ok` once every rank has the peer table, or the reason the rendezvous failed;
    /// every rank that reached the root has been told that reason.
    ///
    /// # Cancel safety
    ///
    /// Cancelling drops every connection; ranks waiting on the root then fail.
    pub async fn run(self) -> Result<(), BootstrapError> {
        self.run_until(std::future::pending()).await
    }

    /// Runs the root on its own thread (with its own single-threaded runtime).
    pub fn spawn(self) -> Result<RootHandle, BootstrapError> {
        let id = self.id;
        let (cancel, mut cancelled) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("mscclpp-bootstrap-root".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|source| BootstrapError::Io {
                        rank: ROOT,
                        context: "bootstrap root: cannot start a tokio runtime".into(),
                        source,
                    })?;
                runtime.block_on(self.run_until(async move {
                    // A dropped sender (detached handle) is not a cancellation.
                    if cancelled.wait_for(|c| *c).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }))
            })
            .map_err(|source| BootstrapError::Io {
                rank: ROOT,
                context: "bootstrap root: cannot start its thread".into(),
                source,
            })?;
        Ok(RootHandle {
            id,
            cancel: Some(cancel),
            thread: Some(thread),
        })
    }

    async fn run_until(self, cancel: impl Future<Output = ()>) -> Result<(), BootstrapError> {
        let addr = self.id.root_addr();
        let listener =
            TcpListener::from_std(self.listener).map_err(|source| BootstrapError::Io {
                rank: ROOT,
                context: format!("bootstrap root on {addr}"),
                source,
            })?;
        let mut rendezvous = Rendezvous {
            config: self.config,
            nranks: None,
            deadline: None,
            joined: BTreeMap::new(),
            contacted: BTreeSet::new(),
            failure: None,
        };
        let (tx, mut rx) = mpsc::channel::<(TcpStream, Join)>(64);
        let mut handshakes = JoinSet::new();
        let mut cancel = std::pin::pin!(cancel);
        loop {
            let deadline = rendezvous.deadline;
            tokio::select! {
                _ = &mut cancel => {
                    let cause = Refusal::Aborted { cause: Box::new(Refusal::UnexpectedMessage(
                        "the root was shut down".into())) };
                    rendezvous.abort_all(&cause).await;
                    return Err(BootstrapError::RendezvousFailed(cause));
                }
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        let tx = tx.clone();
                        let id = self.id;
                        let wait = rendezvous.config.timeout;
                        handshakes.spawn(async move {
                            if let Some(joined) = handshake(stream, &id, wait).await {
                                let _ = tx.send(joined).await;
                            }
                        });
                    } else {
                        // Out of descriptors and the like: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                Some((stream, join)) = rx.recv() => {
                    if let Some(result) = rendezvous.admit(stream, join).await {
                        return result;
                    }
                }
                _ = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    return Err(rendezvous.time_out().await);
                }
                Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            }
        }
    }
}

fn bind_listener(addr: SocketAddr) -> Result<std::net::TcpListener, BootstrapError> {
    let io = |source| BootstrapError::Io {
        rank: ROOT,
        context: format!("cannot start the bootstrap root on {addr}"),
        source,
    };
    let listener = std::net::TcpListener::bind(addr).map_err(io)?;
    listener.set_nonblocking(true).map_err(io)?;
    Ok(listener)
}

/// Reads and checks a rank's join; refuses it on this connection if it is bad.
async fn handshake(stream: TcpStream, id: &UniqueId, wait: Duration) -> Option<(TcpStream, Join)> {
    let _ = stream.set_nodelay(true);
    let mut stream = stream;
    let first = timeout(wait, wire::read_frame(&mut stream, &FrameLimits::HANDSHAKE)).await;
    let refusal = match first {
        Ok(Ok(Some(Frame {
            message: Message::Join(join),
            ..
        }))) => {
            if join.magic != MAGIC {
                Refusal::BadMagic
            } else if join.version != PROTOCOL_VERSION {
                Refusal::VersionMismatch {
                    ours: PROTOCOL_VERSION,
                    theirs: join.version,
                }
            } else if !id.secret_matches(&join.secret) {
                Refusal::WrongSecret
            } else if join.host_id.len() > MAX_HOST_ID_LEN {
                Refusal::UnexpectedMessage(format!(
                    "host id of {} bytes (at most {MAX_HOST_ID_LEN})",
                    join.host_id.len()
                ))
            } else {
                return Some((stream, join));
            }
        }
        Ok(Ok(Some(frame))) => Refusal::UnexpectedMessage(format!("{:?}", frame.message)),
        Ok(Err(wire::FrameError::Io(_))) | Ok(Ok(None)) | Err(_) => return None,
        Ok(Err(_)) => Refusal::BadMagic,
    };
    send_refusal(&mut stream, refusal).await;
    None
}

async fn send_refusal(stream: &mut TcpStream, reason: Refusal) {
    let _ = timeout(
        COURTESY_WRITE_TIMEOUT,
        wire::write_frame(stream, &Message::Refused(reason), &[]),
    )
    .await;
}

struct Rendezvous {
    config: BootstrapConfig,
    nranks: Option<usize>,
    deadline: Option<Instant>,
    joined: BTreeMap<usize, (TcpStream, PeerInfo)>,
    /// In-range ranks that reached the root (joined, or were told of a failure).
    contacted: BTreeSet<usize>,
    failure: Option<Refusal>,
}

impl Rendezvous {
    /// Handles one checked join; `Some` when the rendezvous is over.
    async fn admit(
        &mut self,
        mut stream: TcpStream,
        join: Join,
    ) -> Option<Result<(), BootstrapError>> {
        let rank = join.rank as usize;
        let nranks = join.nranks as usize;
        if self.nranks.is_none() {
            self.nranks = Some(nranks);
            self.deadline = Some(Instant::now() + self.config.timeout);
        }
        let expected = self.nranks.unwrap_or(nranks);
        if let Some(cause) = &self.failure {
            let cause = cause.clone();
            send_refusal(
                &mut stream,
                Refusal::Aborted {
                    cause: Box::new(cause.clone()),
                },
            )
            .await;
            if rank < expected {
                self.contacted.insert(rank);
            }
            return self.finished_after_failure();
        }
        let refusal = if nranks != expected {
            Some(Refusal::NranksMismatch {
                rank: join.rank,
                nranks: join.nranks,
                expected: expected as u32,
            })
        } else if rank >= expected {
            Some(Refusal::RankOutOfRange {
                rank: join.rank,
                nranks: join.nranks,
            })
        } else if self.joined.contains_key(&rank) {
            Some(Refusal::DuplicateRank { rank: join.rank })
        } else {
            None
        };
        if let Some(cause) = refusal {
            send_refusal(&mut stream, cause.clone()).await;
            if rank < expected {
                self.contacted.insert(rank);
            }
            self.failure = Some(cause.clone());
            self.abort_all(&Refusal::Aborted {
                cause: Box::new(cause),
            })
            .await;
            return self.finished_after_failure();
        }
        self.contacted.insert(rank);
        self.joined.insert(
            rank,
            (
                stream,
                PeerInfo {
                    addr: join.listen_addr,
                    host_id: join.host_id,
                },
            ),
        );
        if self.joined.len() < expected {
            return None;
        }
        Some(self.welcome().await)
    }

    fn finished_after_failure(&self) -> Option<Result<(), BootstrapError>> {
        let expected = self.nranks.unwrap_or(0);
        if self.contacted.len() >= expected {
            self.failure
                .clone()
                .map(|f| Err(BootstrapError::RendezvousFailed(f)))
        } else {
            None
        }
    }

    /// Tells every joined rank the rendezvous failed.
    async fn abort_all(&mut self, reason: &Refusal) {
        let joined = std::mem::take(&mut self.joined);
        for (_, (mut stream, _)) in joined {
            send_refusal(&mut stream, reason.clone()).await;
        }
    }

    async fn time_out(&mut self) -> BootstrapError {
        if let Some(failure) = self.failure.clone() {
            return BootstrapError::RendezvousFailed(failure);
        }
        let expected = self.nranks.unwrap_or(0);
        let missing: Vec<u32> = (0..expected)
            .filter(|r| !self.joined.contains_key(r))
            .map(|r| r as u32)
            .collect();
        let cause = Refusal::RendezvousTimeout {
            missing,
            timeout_ms: self.config.timeout.as_millis() as u64,
        };
        self.abort_all(&cause).await;
        BootstrapError::RendezvousFailed(cause)
    }

    async fn welcome(&mut self) -> Result<(), BootstrapError> {
        let peers: Vec<PeerInfo> = self.joined.values().map(|(_, p)| p.clone()).collect();
        let table = wire::encode_peer_table(&peers).map_err(|source| BootstrapError::Frame {
            context: "bootstrap root: encoding the peer table".into(),
            source,
        })?;
        let mut streams: Vec<TcpStream> = std::mem::take(&mut self.joined)
            .into_values()
            .map(|(s, _)| s)
            .collect();
        let deadline = Instant::now() + self.config.timeout;
        for (rank, stream) in streams.iter_mut().enumerate() {
            let sent = timeout_at(
                deadline,
                wire::write_frame(stream, &Message::Welcome, &table),
            )
            .await;
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(source)) => {
                    return Err(BootstrapError::Frame {
                        context: format!("bootstrap root: sending the peer table to rank {rank}"),
                        source,
                    });
                }
                Err(_) => {
                    return Err(BootstrapError::RendezvousFailed(
                        Refusal::RendezvousTimeout {
                            missing: vec![rank as u32],
                            timeout_ms: self.config.timeout.as_millis() as u64,
                        },
                    ));
                }
            }
        }
        // Let the ranks hang up first (see LINGER).
        let linger = Instant::now() + LINGER;
        for stream in &mut streams {
            let mut byte = [0u8; 1];
            let _ = timeout_at(linger, stream.read(&mut byte)).await;
        }
        Ok(())
    }
}

/// A root running on its own thread. Dropping the handle stops the root (unless detached).
#[derive(Debug)]
pub struct RootHandle {
    id: UniqueId,
    cancel: Option<watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<Result<(), BootstrapError>>>,
}

impl RootHandle {
    /// The id ranks use to reach this root.
    pub fn unique_id(&self) -> UniqueId {
        self.id
    }

    /// Waits for the rendezvous to end and returns its outcome.
    ///
    /// Bounded by the root's timeout once the first rank has joined; before that it waits for
    /// the first rank.
    pub fn join(mut self) -> Result<(), BootstrapError> {
        match self.thread.take() {
            Some(thread) => thread.join().unwrap_or_else(|_| {
                Err(BootstrapError::Protocol(
                    "the bootstrap root thread panicked".into(),
                ))
            }),
            None => Ok(()),
        }
    }

    /// Lets the root run on after the handle is dropped (until it ends or the process exits).
    pub fn detach(mut self) {
        self.cancel = None;
        self.thread = None;
    }
}

impl Drop for RootHandle {
    fn drop(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            let _ = cancel.send(true);
        }
    }
}
