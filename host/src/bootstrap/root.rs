//! The root: the rendezvous point where ranks learn each other's addresses.
//!
//! The root accepts one connection per rank and checks each join: the handshake (frame
//! lengths, magic, version, secret) and its place in the job (nranks agree, rank in range, rank
//! not taken yet). A bad join is refused on its own connection, with the reason, and the
//! rendezvous goes on: a stray or hostile client cannot end it. Two joins for one rank: the
//! first keeps it (first come wins) while its connection is alive. Once all ranks have joined
//! it sends each the peer table and ends; if the timeout passes first, every waiting rank is
//! told which ranks never joined and which joins were refused meanwhile. The owner of a
//! spawned root that learns that a rank ended before the rendezvous completed (a launcher
//! whose child exited: [`RootHandle::rank_ended`]) makes it tell every rank so at once,
//! naming that rank, instead of letting them wait for the timeout.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};

use super::BootstrapConfig;
use super::error::{BootstrapError, RankRanges, Refusal};
use super::unique_id::{SECRET_BYTES, UniqueId};
use super::wire::{
    self, Frame, FrameLimits, Join, MAGIC, MAX_HOST_ID_LEN, MAX_JOB_ID_LEN, Message,
    PROTOCOL_VERSION, PeerInfo,
};

/// How many refused joins the root remembers for its timeout message.
const REFUSALS_KEPT: usize = 8;
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
    /// Number of ranks, when known before the first join (the `"ip:port"` form).
    nranks: Option<usize>,
    /// A rank that must present its own secret instead of the id's (rank 0 of the
    /// `"ip:port"` form, whose process hosts the root).
    reserved: Option<(u32, [u8; SECRET_BYTES])>,
    /// The job whose ranks alone may join (the `"ip:port"` form: rank 0's), else any.
    job: Option<String>,
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
        let local = listener
            .local_addr()
            .map_err(|source| BootstrapError::RootIo {
                context: format!("local address of the root bound on {addr}"),
                source,
            })?;
        Ok(Root {
            listener,
            id: UniqueId::random(local),
            config,
            nranks: None,
            reserved: None,
            job: None,
        })
    }

    /// Binds a root for an existing id (the `"ip:port"` form: rank 0 hosts the root) that
    /// expects `nranks` ranks of `job` and admits rank 0 only with `rank0_secret` (known to
    /// this process alone), so that no other process can take rank 0's place.
    pub(crate) fn bind_hosted(
        id: UniqueId,
        nranks: usize,
        rank0_secret: [u8; SECRET_BYTES],
        job: String,
        config: BootstrapConfig,
    ) -> Result<Root, BootstrapError> {
        let listener = bind_listener(id.root_addr()).map_err(|e| match e {
            BootstrapError::RootIo { context, source } => BootstrapError::RootIo {
                context: format!(
                    "rank 0 hosts the root of the \"ip:port\" form but {context}{}",
                    bind_hint(&source)
                ),
                source,
            },
            other => other,
        })?;
        Ok(Root {
            listener,
            id,
            config,
            nranks: Some(nranks),
            reserved: Some((0, rank0_secret)),
            job: Some(job),
        })
    }

    /// The id ranks use to reach this root.
    pub fn unique_id(&self) -> UniqueId {
        self.id
    }

    /// Serves one rendezvous.
    ///
    /// Waits without a deadline for the first rank (drop the future or the
    /// [`RootHandle`] to stop it), then at most the configured rendezvous timeout
    /// ([`BootstrapConfig::rendezvous_wait`]) for the others.
    /// Returns `Ok` once every rank has the peer table, or the reason the rendezvous failed;
    /// every rank that reached the root has been told that reason.
    ///
    /// # Cancel safety
    ///
    /// Cancelling drops every connection; ranks waiting on the root then fail.
    pub async fn run(self) -> Result<(), BootstrapError> {
        let (_keep, control) = watch::channel(Control::Run);
        self.run_until(control).await
    }

    /// Runs the root on its own thread (with its own single-threaded runtime).
    pub fn spawn(self) -> Result<RootHandle, BootstrapError> {
        let id = self.id;
        let (cancel, control) = watch::channel(Control::Run);
        let thread = std::thread::Builder::new()
            .name("mscclpp-bootstrap-root".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|source| BootstrapError::RootIo {
                        context: "cannot start a tokio runtime".into(),
                        source,
                    })?;
                runtime.block_on(self.run_until(control))
            })
            .map_err(|source| BootstrapError::RootIo {
                context: "cannot start its thread".into(),
                source,
            })?;
        Ok(RootHandle {
            id,
            cancel: Some(cancel),
            thread: Some(thread),
        })
    }

    /// Serves the rendezvous, obeying `control` (a dropped sender, a detached handle, is no
    /// command).
    async fn run_until(self, mut control: watch::Receiver<Control>) -> Result<(), BootstrapError> {
        let addr = self.id.root_addr();
        let listener =
            TcpListener::from_std(self.listener).map_err(|source| BootstrapError::RootIo {
                context: format!("listening on {addr}"),
                source,
            })?;
        let mut rendezvous = Rendezvous {
            addr,
            config: self.config,
            nranks: self.nranks,
            job: self.job,
            deadline: None,
            joined: BTreeMap::new(),
            refused: Vec::new(),
        };
        let reserved = self.reserved;
        let (tx, mut rx) = mpsc::channel::<Handshake>(64);
        let mut handshakes = JoinSet::new();
        let mut controlled = true;
        // Once a rank ended before the rendezvous completed: why it cannot complete (every
        // later join is refused with it, until the timeout).
        let mut failed: Option<Refusal> = None;
        // A long rendezvous (its timeout above the bootstrap timeout: the NCCL library's 30
        // minutes) says which ranks it still waits for, first once the bootstrap timeout has
        // passed, then every NOTICE_EVERY.
        let long = rendezvous.config.rendezvous_wait() > rendezvous.config.timeout;
        let mut notice: Option<Instant> = None;
        let mut began: Option<Instant> = None;
        loop {
            let deadline = rendezvous.deadline;
            if long && failed.is_none() && notice.is_none() && deadline.is_some() {
                let first = Instant::now();
                began = Some(first);
                notice = Some(first + rendezvous.config.timeout);
            }
            tokio::select! {
                _ = sleep_until(notice.unwrap_or_else(Instant::now)),
                    if notice.is_some() && failed.is_none() => {
                    let waited = began.map(|b| b.elapsed()).unwrap_or_default();
                    crate::diag::eprint_line(&waiting_notice(
                        &addr.to_string(),
                        &rendezvous.missing(),
                        waited,
                        rendezvous.config.rendezvous_wait(),
                    ));
                    notice = notice.map(|n| n + NOTICE_EVERY);
                }
                changed = control.changed(), if controlled => {
                    if changed.is_err() {
                        controlled = false;
                        continue;
                    }
                    let command = control.borrow_and_update().clone();
                    match command {
                        Control::Run => {}
                        Control::Shutdown => {
                            let cause = Refusal::Aborted { cause: Box::new(
                                Refusal::UnexpectedMessage("the root was shut down".into())) };
                            rendezvous.abort_all(&cause).await;
                            return Err(BootstrapError::RendezvousFailed(cause));
                        }
                        Control::RankEnded { rank, how } => {
                            if failed.is_none() {
                                let cause = Refusal::RankEnded { rank, how };
                                rendezvous.abort_all(&cause).await;
                                rendezvous.deadline.get_or_insert_with(|| {
                                    Instant::now() + rendezvous.config.rendezvous_wait()
                                });
                                failed = Some(cause);
                            }
                        }
                    }
                }
                accepted = listener.accept() => {
                    if let Ok((stream, from)) = accepted {
                        let tx = tx.clone();
                        let id = self.id;
                        let wait = rendezvous.config.timeout;
                        handshakes.spawn(async move {
                            let outcome = handshake(stream, &id, reserved, wait).await;
                            let _ = tx.send(Handshake { from, outcome }).await;
                        });
                    } else {
                        // Out of descriptors and the like: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                Some(Handshake { from, outcome }) = rx.recv() => {
                    match outcome {
                        Ok((mut stream, _)) if failed.is_some() => {
                            send_refusal(&mut stream, failed.clone().expect("checked")).await;
                        }
                        Ok((stream, join)) => {
                            if let Some(result) = rendezvous.admit(stream, from, join).await {
                                return result;
                            }
                        }
                        Err(Some(refusal)) => rendezvous.note_refusal(from, None, &refusal),
                        Err(None) => {}
                    }
                }
                _ = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    if let Some(cause) = failed {
                        return Err(BootstrapError::RendezvousFailed(cause));
                    }
                    return Err(rendezvous.time_out().await);
                }
                Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            }
        }
    }
}

/// Bytes of each refused join's text kept for the timeout message, which must fit a frame.
const REFUSAL_TEXT_KEPT: usize = 300;

/// How often a long rendezvous repeats which ranks it still waits for.
pub(crate) const NOTICE_EVERY: Duration = Duration::from_secs(300);

/// The line a long rendezvous prints while it waits: which ranks, for how long so far, and
/// for how long at most.
pub(crate) fn waiting_notice(
    root: &str,
    missing: &RankRanges,
    waited: Duration,
    limit: Duration,
) -> String {
    format!(
        "mscclpp: the bootstrap root at {root} has waited {}s for {missing} to join; it \
         waits up to {}s in all (MSCCLPP_RENDEZVOUS_TIMEOUT), then names them",
        waited.as_secs(),
        limit.as_secs()
    )
}

/// What to check when rank 0 cannot listen on the root's address, by the error's kind:
/// the port is taken (`EADDRINUSE`), the address is not this machine's (`EADDRNOTAVAIL`),
/// or the port needs privileges.
fn bind_hint(source: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    match source.kind() {
        ErrorKind::AddrInUse => {
            "; another process is listening on that port (torchrun's store holds MASTER_PORT; \
             MSCCLPP_BOOTSTRAP or MSCCLPP_BOOTSTRAP_PORT choose the root's port)"
        }
        ErrorKind::AddrNotAvailable => {
            "; that address is not one of this machine's: rank 0 listens on it, so it must be \
             an address of rank 0's machine (check MSCCLPP_BOOTSTRAP or MASTER_ADDR, and that \
             rank 0 runs on that machine)"
        }
        ErrorKind::PermissionDenied => {
            "; ports below 1024 need privileges: choose another port (MSCCLPP_BOOTSTRAP or \
             MSCCLPP_BOOTSTRAP_PORT)"
        }
        _ => "",
    }
}

fn bind_listener(addr: SocketAddr) -> Result<std::net::TcpListener, BootstrapError> {
    let io = |source| BootstrapError::RootIo {
        context: format!("cannot listen on {addr}"),
        source,
    };
    let listener = std::net::TcpListener::bind(addr).map_err(io)?;
    listener.set_nonblocking(true).map_err(io)?;
    Ok(listener)
}

/// What a handshake task reports to the rendezvous.
struct Handshake {
    from: SocketAddr,
    /// The checked join, or the refusal already sent (`None`: the client left or stalled).
    outcome: Result<(TcpStream, Join), Option<Refusal>>,
}

/// Reads and checks a rank's join; refuses it on this connection if it is bad.
async fn handshake(
    stream: TcpStream,
    id: &UniqueId,
    reserved: Option<(u32, [u8; SECRET_BYTES])>,
    wait: Duration,
) -> Result<(TcpStream, Join), Option<Refusal>> {
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
            } else if !secret_ok(id, reserved, &join) {
                Refusal::WrongSecret
            } else if join.host_id.len() > MAX_HOST_ID_LEN {
                Refusal::UnexpectedMessage(format!(
                    "host id of {} bytes (at most {MAX_HOST_ID_LEN})",
                    join.host_id.len()
                ))
            } else if join.process_space.len() > MAX_HOST_ID_LEN {
                Refusal::UnexpectedMessage(format!(
                    "process space of {} bytes (at most {MAX_HOST_ID_LEN})",
                    join.process_space.len()
                ))
            } else if join.job.len() > MAX_JOB_ID_LEN {
                Refusal::UnexpectedMessage(format!(
                    "job id of {} bytes (at most {MAX_JOB_ID_LEN})",
                    join.job.len()
                ))
            } else {
                return Ok((stream, join));
            }
        }
        Ok(Ok(Some(frame))) => Refusal::UnexpectedMessage(format!("{:?}", frame.message)),
        Ok(Err(wire::FrameError::Io(_))) | Ok(Ok(None)) | Err(_) => return Err(None),
        Ok(Err(wire::FrameError::OtherVersion { theirs })) => Refusal::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs,
        },
        Ok(Err(e)) => Refusal::MalformedFrame(e.to_string()),
    };
    send_refusal(&mut stream, refusal.clone()).await;
    Err(Some(refusal))
}

/// The reserved rank must present its own secret; every other rank the id's.
fn secret_ok(id: &UniqueId, reserved: Option<(u32, [u8; SECRET_BYTES])>, join: &Join) -> bool {
    match reserved {
        Some((rank, secret)) if rank == join.rank => {
            join.secret
                .iter()
                .zip(&secret)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
        }
        _ => id.secret_matches(&join.secret),
    }
}

/// Whether a connection the root holds for a joined rank has been closed by the other side.
fn hung_up(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.try_read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

async fn send_refusal(stream: &mut TcpStream, reason: Refusal) {
    let _ = timeout(
        COURTESY_WRITE_TIMEOUT,
        wire::write_frame(stream, &Message::Refused(reason), &[]),
    )
    .await;
}

struct Rendezvous {
    /// The root's address (for its messages).
    addr: SocketAddr,
    config: BootstrapConfig,
    nranks: Option<usize>,
    /// The job whose ranks alone may join (see `Root::job`).
    job: Option<String>,
    deadline: Option<Instant>,
    joined: BTreeMap<usize, (TcpStream, PeerInfo)>,
    /// The first refused joins, for the timeout message.
    refused: Vec<String>,
}

impl Rendezvous {
    /// Handles one join whose handshake passed; `Some` when the rendezvous is over.
    ///
    /// A join that does not fit the job (other nranks, rank out of range, rank taken) is
    /// refused on its own connection; the rendezvous goes on.
    async fn admit(
        &mut self,
        mut stream: TcpStream,
        from: SocketAddr,
        join: Join,
    ) -> Option<Result<(), BootstrapError>> {
        let rank = join.rank as usize;
        let nranks = join.nranks as usize;
        let expected = *self.nranks.get_or_insert(nranks);
        let refusal = if let Some(job) = &self.job
            && join.job != *job
        {
            Some(Refusal::OtherJob {
                job: job.clone(),
                nranks: expected as u32,
                theirs: join.job.clone(),
                their_nranks: join.nranks,
            })
        } else if nranks != expected {
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
        } else if let Some((held, _)) = self.joined.get(&rank)
            && !hung_up(held)
        {
            Some(Refusal::DuplicateRank { rank: join.rank })
        } else {
            None
        };
        if let Some(refusal) = refusal {
            send_refusal(&mut stream, refusal.clone()).await;
            if self.job.is_some()
                && matches!(
                    refusal,
                    Refusal::OtherJob { .. } | Refusal::NranksMismatch { .. }
                )
            {
                // Two jobs given one address: say so where this job's output goes, too.
                crate::diag::eprint_line(&format!(
                    "mscclpp: the bootstrap root at {} refused a join as rank {} of {} from \
                     {from}: {refusal}; it waits on for its own ranks",
                    self.addr, join.rank, join.nranks
                ));
            }
            self.note_refusal(from, Some(&join), &refusal);
            return None;
        }
        // The deadline runs from the first join that fits the job.
        self.deadline
            .get_or_insert_with(|| Instant::now() + self.config.rendezvous_wait());
        self.joined.insert(
            rank,
            (
                stream,
                PeerInfo {
                    addr: join.listen_addr,
                    host_id: join.host_id,
                    pid: join.pid,
                    process_space: join.process_space,
                },
            ),
        );
        if self.joined.len() < expected {
            return None;
        }
        Some(self.welcome().await)
    }

    /// Remembers a refused join (the first few) for the timeout message.
    fn note_refusal(&mut self, from: SocketAddr, join: Option<&Join>, refusal: &Refusal) {
        if self.refused.len() < REFUSALS_KEPT {
            let who = match join {
                Some(j) => format!("a join as rank {} of {} from {from}", j.rank, j.nranks),
                None => format!("a connection from {from}"),
            };
            let what = format!("{who}: {refusal}");
            self.refused
                .push(wire::bounded(&what, REFUSAL_TEXT_KEPT).to_string());
        } else if self.refused.len() == REFUSALS_KEPT {
            self.refused.push("and more".into());
        }
    }

    /// Tells every joined rank the rendezvous failed.
    async fn abort_all(&mut self, reason: &Refusal) {
        let joined = std::mem::take(&mut self.joined);
        for (_, (mut stream, _)) in joined {
            send_refusal(&mut stream, reason.clone()).await;
        }
    }

    /// The ranks that have not joined (none before the first join).
    fn missing(&self) -> RankRanges {
        let expected = self.nranks.unwrap_or(0);
        RankRanges::new(
            (0..expected)
                .filter(|r| !self.joined.contains_key(r))
                .map(|r| r as u32),
        )
    }

    async fn time_out(&mut self) -> BootstrapError {
        let cause = Refusal::RendezvousTimeout {
            missing: self.missing(),
            timeout_ms: self.config.rendezvous_wait().as_millis() as u64,
            refused: self.refused.clone(),
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
                    // Every rank joined: this one did not take the table in time.
                    return Err(BootstrapError::RootIo {
                        context: format!(
                            "sending the peer table to rank {rank} (it joined, but did not \
                             take the table within {:?})",
                            self.config.timeout
                        ),
                        source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                    });
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

/// What the owner of a spawned root tells it.
#[derive(Clone, Debug)]
enum Control {
    Run,
    /// A rank ended before the rendezvous completed ([`RootHandle::rank_ended`]).
    RankEnded {
        rank: u32,
        how: String,
    },
    /// Stop (the handle was dropped).
    Shutdown,
}

/// A root running on its own thread. Dropping the handle stops the root (unless detached).
#[derive(Debug)]
pub struct RootHandle {
    id: UniqueId,
    cancel: Option<watch::Sender<Control>>,
    thread: Option<std::thread::JoinHandle<Result<(), BootstrapError>>>,
}

impl RootHandle {
    /// The id ranks use to reach this root.
    pub fn unique_id(&self) -> UniqueId {
        self.id
    }

    /// Waits for the rendezvous to end and returns its outcome.
    ///
    /// Bounded by the root's rendezvous timeout once the first rank has joined; before that
    /// it waits for the first rank.
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

    /// Tells the root that `rank` ended (`how`: e.g. its exit status) before the rendezvous
    /// completed, as a launcher learns when a child exits: every rank that joined, and every
    /// rank that joins later, is refused at once with a reason naming it, instead of waiting
    /// for the timeout. Nothing happens once the rendezvous has completed (a rank ending
    /// then is the peers' business).
    pub fn rank_ended(&self, rank: usize, how: impl Into<String>) {
        if let Some(cancel) = &self.cancel {
            let _ = cancel.send(Control::RankEnded {
                rank: u32::try_from(rank).unwrap_or(u32::MAX),
                how: how.into(),
            });
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
            let _ = cancel.send(Control::Shutdown);
        }
    }
}
