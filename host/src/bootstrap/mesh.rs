//! Connections between ranks after the rendezvous, and the mailbox they deliver into.
//!
//! Each rank listens on one socket. To send to a peer, a rank dials it once (lazily, except
//! the ring successor, dialed in `init`) and keeps that connection as a one-way *link*: frames
//! go from the dialer to the listener; the reverse direction only ever carries the hello
//! acknowledgement and a final goodbye. One writer task per link serialises frames (so a
//! cancelled `send` never leaves half a frame behind); one reader task per connection in each
//! direction delivers data into the mailbox and watches for the peer's end.
//!
//! Failure detection: a connection that ends without a [`Message::Goodbye`] means the peer
//! died. The rank that sees it marks the peer lost and tells every other rank
//! ([`Message::PeerLost`]), so that ranks with no connection to the dead rank, or that wait on
//! a live rank stuck behind it, fail at once with an error naming it. Because every rank dials
//! its ring successor during `init`, every death is seen by at least one live rank. Errors
//! name the first rank lost; news of a later loss is preceded, on each connection, by news
//! of the first, so that survivors leaving after the first loss are not blamed for it.
//!
//! Stalls: a rank that is alive but stuck (stopped, or busy in its own code) breaks no
//! connection, so only timeouts see it, and a healthy rank waiting on a rank that waits on
//! it times out at about the same moment as that rank. A rank whose wait times out tells
//! every other rank at once that it gave up, and on whom ([`Message::PeerStalled`]); a rank
//! whose wait for such a rank times out names the rank that one gave up on (following the
//! chain of reports) as the root cause, after a short grace in which news of a loss wins.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OnceCell, mpsc, oneshot};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{Instant, timeout, timeout_at};

use super::error::{BootstrapError, GaveUp, Op, Refusal, StuckProcess};
use super::unique_id::UniqueId;
use super::wire::{
    self, Channel, Frame, FrameLimits, Hello, MAGIC, Message, PROTOCOL_VERSION, PeerInfo,
};
use super::{BootstrapConfig, LOSS_NEWS_GRACE};

/// How long a refusal or goodbye may take to write before we give up on a peer.
const COURTESY_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `close` waits (at most; never beyond the configured timeout) for news of a lost
/// rank to reach the other ranks.
const NOTICE_WAIT: Duration = Duration::from_secs(5);
/// How long `close` waits for the writers to flush their goodbyes.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
enum PeerStatus {
    Alive,
    /// Sent a goodbye.
    Closed,
    /// Connection ended without a goodbye; the detail says what was seen.
    Lost(String),
}

/// A rank's [`Message::PeerStalled`] report: the rank it gave up waiting for, the operation
/// it gave up in, and when the report came (a wait follows only reports that came after it
/// began: an older one is about an earlier wait, which may since have ended well).
#[derive(Clone, Debug)]
struct StallReport {
    waiting_for: usize,
    op: String,
    at: Instant,
    /// What the reporter (or a report it followed) saw of `waiting_for`'s process; empty:
    /// nothing.
    seen: String,
}

impl StallReport {
    /// What the report says, as waits name it.
    fn gave_up(self) -> GaveUp {
        GaveUp {
            waiting_for: self.waiting_for,
            op: self.op,
            seen: Some(self.seen).filter(|s| !s.is_empty()),
        }
    }
}

/// This rank's own stall report: the rank its wait was for, the root cause it named, its
/// operation, and when that wait began.
#[derive(Debug)]
struct OwnReport {
    from: usize,
    root: usize,
    op: String,
    began: Instant,
    /// What the report said was seen of `root`'s process (empty: nothing).
    seen: String,
}

#[derive(Debug)]
struct MailState {
    queues: HashMap<(usize, Channel), VecDeque<Vec<u8>>>,
    status: Vec<PeerStatus>,
    /// Whether the peer's link to us is open: while it is, data from the peer may still be
    /// on its way even if the peer already said goodbye on our link to it.
    incoming_open: Vec<bool>,
    /// The lost ranks in the order they were marked lost (the first: the loss every
    /// collective operation reports).
    lost_order: Vec<usize>,
    /// The ranks known to have closed their bootstrap, in the order this rank learnt it:
    /// from their goodbyes, or from another rank's [`Message::PeerClosed`] news (which does
    /// not change their status here: their own goodbye may still be on its way).
    closed_order: Vec<usize>,
    /// For each rank in `closed_order`: the bootstrap collectives it completed before it
    /// closed, as its news said.
    closed_done: Vec<Option<u64>>,
    /// For each rank that closed and said why ([`Message::PeerClosed`]'s `why`): the first
    /// reason that reached this rank.
    closed_why: Vec<Option<String>>,
    /// For each rank that left: the calls its goodbye named, if it named any.
    left_after: Vec<Option<u64>>,
    /// For each rank that left: whether its goodbye said that all of its work had ended.
    left_idle: Vec<bool>,
    /// Whether the loss hooks ran for a lost rank (they run in `lost_order`).
    hooked: Vec<bool>,
    /// For each rank: the latest [`Message::PeerStalled`] report it sent.
    gave_up: Vec<Option<StallReport>>,
}

/// At most this long a loss waits for its news to reach the survivors' sockets before the
/// waits of this process learn of it (see `mark_lost`).
const NEWS_FLUSH: Duration = Duration::from_millis(200);

/// A frame queued for a link's writer task.
struct Outgoing {
    message: Message,
    payload: Bytes,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

#[derive(Debug)]
struct Link {
    tx: mpsc::UnboundedSender<Outgoing>,
    /// Set by the writer task when the connection failed.
    broken: Arc<OnceLock<String>>,
}

#[derive(Debug)]
pub(crate) struct Mesh {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    id: UniqueId,
    pub(crate) peers: Vec<PeerInfo>,
    pub(crate) config: BootstrapConfig,
    state: Mutex<MailState>,
    notify: Notify,
    links: Vec<OnceCell<Link>>,
    /// Writers of the back direction of accepted connections (news of lost ranks, goodbye).
    back: Mutex<Vec<Option<mpsc::UnboundedSender<Outgoing>>>>,
    /// Accept loop and readers: aborted on close.
    tasks: Mutex<Vec<AbortHandle>>,
    /// Link writers: left to flush their goodbye on close, awaited by `close`.
    writers: Mutex<Vec<JoinHandle<()>>>,
    /// Tasks dialing a rank to tell it of a lost rank: awaited by `close`, so that a rank
    /// that fails and leaves still passes the news on.
    notices: Mutex<Vec<JoinHandle<()>>>,
    closing: AtomicBool,
    /// Bootstrap collectives this rank completed (see [`Message::PeerClosed`]).
    collectives_done: AtomicU64,
    /// Called (outside the locks) with each rank that becomes lost and the detail.
    loss_hooks: Mutex<Vec<LossHook>>,
    /// Called (outside the locks) with each rank that leaves and the calls it named.
    leave_hooks: Mutex<Vec<LeaveHook>>,
    /// What this rank's goodbye names (`Bootstrap::set_calls_at_close`).
    calls_at_close: Mutex<Option<u64>>,
    /// Whether this rank's goodbye says its work ended (`Bootstrap::set_work_ended_at_close`).
    idle_at_close: AtomicBool,
    /// This rank's latest stall report ([`Mesh::gave_up_on`]). Locked before `state`, never
    /// while holding it.
    own_report: Mutex<Option<OwnReport>>,
    /// Why this rank closes, if it says ([`Mesh::set_leaving_why`]): sent in its own
    /// [`Message::PeerClosed`] before its goodbye.
    leaving_why: Mutex<Option<String>>,
}

/// The function of a [`LeaveHook`]: called with a rank that left, the calls it named, and
/// whether its goodbye said that all of its work had ended.
pub(crate) type LeaveFn = dyn Fn(usize, Option<u64>, bool) + Send + Sync;

/// A callback told of ranks that leave ([`Mesh::on_peer_left`]).
#[derive(Clone)]
pub(crate) struct LeaveHook(pub(crate) Arc<LeaveFn>);

impl std::fmt::Debug for LeaveHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaveHook")
    }
}

/// The function of a [`LossHook`]: called with a lost rank and the detail.
pub(crate) type LossFn = dyn Fn(usize, &str) + Send + Sync;

/// A callback told of lost ranks ([`Mesh::on_peer_lost`]).
#[derive(Clone)]
pub(crate) struct LossHook(pub(crate) Arc<LossFn>);

impl std::fmt::Debug for LossHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LossHook")
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data inconsistent (every
    // critical section is a single insert/remove), so poisoning is ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Mesh {
    pub(crate) fn new(
        rank: usize,
        id: UniqueId,
        peers: Vec<PeerInfo>,
        config: BootstrapConfig,
    ) -> Arc<Mesh> {
        let nranks = peers.len();
        Arc::new(Mesh {
            rank,
            nranks,
            id,
            peers,
            config,
            state: Mutex::new(MailState {
                queues: HashMap::new(),
                status: vec![PeerStatus::Alive; nranks],
                incoming_open: vec![false; nranks],
                lost_order: Vec::new(),
                closed_order: Vec::new(),
                closed_done: vec![None; nranks],
                closed_why: vec![None; nranks],
                left_after: vec![None; nranks],
                left_idle: vec![false; nranks],
                hooked: vec![false; nranks],
                gave_up: vec![None; nranks],
            }),
            notify: Notify::new(),
            links: (0..nranks).map(|_| OnceCell::new()).collect(),
            back: Mutex::new((0..nranks).map(|_| None).collect()),
            tasks: Mutex::new(Vec::new()),
            writers: Mutex::new(Vec::new()),
            notices: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
            collectives_done: AtomicU64::new(0),
            loss_hooks: Mutex::new(Vec::new()),
            leave_hooks: Mutex::new(Vec::new()),
            calls_at_close: Mutex::new(None),
            idle_at_close: AtomicBool::new(false),
            own_report: Mutex::new(None),
            leaving_why: Mutex::new(None),
        })
    }

    /// Makes this rank say, when it closes, that it closes because of `why` (its own error;
    /// see [`Bootstrap::set_leaving_why`](super::Bootstrap::set_leaving_why)). The first
    /// reason set is kept; none is kept once another rank is known lost, or closed before
    /// completing the bootstrap collectives this rank has.
    pub(crate) fn set_leaving_why(&self, why: &str) {
        // Gone: lost, or closed before completing the bootstrap collectives this rank has
        // (or with no record of them): not a rank that finished its work and left.
        let done = self.collectives_done.load(Ordering::Acquire);
        let others_gone = {
            let st = lock(&self.state);
            !st.lost_order.is_empty()
                || st
                    .closed_order
                    .iter()
                    .any(|&p| st.closed_done[p].is_none_or(|d| d <= done))
        };
        if others_gone {
            return;
        }
        lock(&self.leaving_why)
            .get_or_insert_with(|| wire::bounded(why, wire::MAX_CLOSED_WHY_LEN).into());
    }

    /// Why `peer` closed, as it said (the first reason that reached this rank).
    pub(crate) fn closed_why(&self, peer: usize) -> Option<String> {
        lock(&self.state).closed_why.get(peer).cloned().flatten()
    }

    /// Makes this rank's goodbye name `calls` ([`Message::GoodbyeAfter`]).
    pub(crate) fn set_calls_at_close(&self, calls: u64) {
        *lock(&self.calls_at_close) = Some(calls);
    }

    /// Makes this rank's goodbye say that all of its work had ended
    /// ([`Message::GoodbyeIdle`]).
    pub(crate) fn set_work_ended_at_close(&self) {
        self.idle_at_close.store(true, Ordering::Release);
    }

    /// The goodbye this rank sends.
    fn goodbye(&self) -> Message {
        match *lock(&self.calls_at_close) {
            Some(calls) => Message::GoodbyeAfter { calls },
            None if self.idle_at_close.load(Ordering::Acquire) => Message::GoodbyeIdle,
            None => Message::Goodbye,
        }
    }

    /// The calls `peer`'s goodbye named, once it left.
    pub(crate) fn left_after(&self, peer: usize) -> Option<u64> {
        lock(&self.state).left_after.get(peer).copied().flatten()
    }

    /// Registers `hook`, called with every rank that leaves (says goodbye) and the calls
    /// its goodbye named, once per rank; at once for a rank that already left.
    pub(crate) fn on_peer_left(&self, hook: LeaveHook) {
        // The hooks' lock first, as in `mark_closed`: a rank leaving meanwhile is told to
        // this hook exactly once (by that rank's `mark_closed`, or below).
        let mut hooks = lock(&self.leave_hooks);
        let left: Vec<(usize, Option<u64>, bool)> = {
            let st = lock(&self.state);
            (st.status.iter().enumerate())
                .filter(|(_, s)| matches!(s, PeerStatus::Closed))
                .map(|(p, _)| (p, st.left_after[p], st.left_idle[p]))
                .collect()
        };
        hooks.push(hook.clone());
        drop(hooks);
        for (p, calls, idle) in left {
            (hook.0)(p, calls, idle);
        }
    }

    /// Whether `peer` is known lost (seen or reported).
    pub(crate) fn was_lost(&self, peer: usize) -> bool {
        matches!(
            lock(&self.state).status.get(peer),
            Some(PeerStatus::Lost(_))
        )
    }

    /// Whether `peer` said goodbye (closed its bootstrap politely).
    pub(crate) fn has_left(&self, peer: usize) -> bool {
        matches!(lock(&self.state).status.get(peer), Some(PeerStatus::Closed))
    }

    /// Registers `hook`, called with every rank this rank learns is lost (seen or
    /// reported), once per rank; at once for a rank already lost.
    pub(crate) fn on_peer_lost(&self, hook: LossHook) {
        let lost: Vec<(usize, String)> = {
            let st = lock(&self.state);
            (st.status.iter().enumerate())
                .filter_map(|(p, s)| match s {
                    PeerStatus::Lost(d) => Some((p, d.clone())),
                    _ => None,
                })
                .collect()
        };
        lock(&self.loss_hooks).push(hook.clone());
        for (p, d) in lost {
            (hook.0)(p, &d);
        }
    }

    /// Runs the loss hooks for `peer` and, first, for every rank lost before it whose hooks
    /// have not run: a loss whose hooks wait for its news to go out (`mark_lost`) must not
    /// be overtaken by a later one's (the first hook call raises the abort word that names
    /// the lost rank).
    fn run_loss_hooks(&self, peer: usize) {
        let due: Vec<(usize, String)> = {
            let mut st = lock(&self.state);
            let Some(pos) = st.lost_order.iter().position(|&p| p == peer) else {
                return;
            };
            let order: Vec<usize> = st.lost_order[..=pos].to_vec();
            let mut due = Vec::new();
            for p in order {
                if !st.hooked[p] {
                    st.hooked[p] = true;
                    if let PeerStatus::Lost(d) = &st.status[p] {
                        due.push((p, d.clone()));
                    }
                }
            }
            due
        };
        let hooks = lock(&self.loss_hooks).clone();
        for (p, detail) in due {
            for h in &hooks {
                (h.0)(p, &detail);
            }
        }
    }

    fn spawn_tracked<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = tokio::spawn(fut);
        let mut tasks = lock(&self.tasks);
        if self.closing.load(Ordering::Acquire) {
            handle.abort();
        } else {
            tasks.push(handle.abort_handle());
        }
    }

    fn limits(&self) -> FrameLimits {
        FrameLimits::with_max_payload(self.config.max_message_size)
    }

    /// Starts accepting peer connections on `listener`.
    pub(crate) fn start(self: &Arc<Self>, listener: TcpListener) {
        let mesh = Arc::clone(self);
        self.spawn_tracked(async move { mesh.accept_loop(listener).await });
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let mesh = Arc::clone(&self);
                    self.spawn_tracked(async move { mesh.serve_incoming(stream).await });
                }
                // Out of descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn check_hello(&self, hello: &Hello) -> Result<usize, Refusal> {
        if hello.magic != MAGIC {
            return Err(Refusal::BadMagic);
        }
        if hello.version != PROTOCOL_VERSION {
            return Err(Refusal::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: hello.version,
            });
        }
        if !self.id.secret_matches(&hello.secret) {
            return Err(Refusal::WrongSecret);
        }
        if hello.nranks as usize != self.nranks {
            return Err(Refusal::NranksMismatch {
                rank: hello.from,
                nranks: hello.nranks,
                expected: self.nranks as u32,
            });
        }
        if hello.to as usize != self.rank {
            return Err(Refusal::WrongDestination {
                to: hello.to,
                actual: self.rank as u32,
            });
        }
        let from = hello.from as usize;
        if from >= self.nranks || from == self.rank {
            return Err(Refusal::RankOutOfRange {
                rank: hello.from,
                nranks: self.nranks as u32,
            });
        }
        Ok(from)
    }

    /// Handshake of an accepted connection, then its reader loop.
    async fn serve_incoming(self: Arc<Self>, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let first = timeout(
            self.config.timeout,
            wire::read_frame(&mut rd, &FrameLimits::HANDSHAKE),
        )
        .await;
        let hello = match first {
            Ok(Ok(Some(Frame {
                message: Message::Hello(hello),
                ..
            }))) => hello,
            Ok(Ok(Some(frame))) => {
                let what = format!("{:?}", frame.message);
                refuse(&mut wr, Refusal::UnexpectedMessage(what)).await;
                return;
            }
            Ok(Err(wire::FrameError::Io(_))) | Ok(Ok(None)) | Err(_) => return,
            Ok(Err(wire::FrameError::OtherVersion { theirs })) => {
                let ours = PROTOCOL_VERSION;
                refuse(&mut wr, Refusal::VersionMismatch { ours, theirs }).await;
                return;
            }
            // A length or encoding error: not one of ours, or a broken one.
            Ok(Err(e)) => {
                refuse(&mut wr, Refusal::MalformedFrame(e.to_string())).await;
                return;
            }
        };
        let from = match self.check_hello(&hello) {
            Ok(from) => from,
            Err(reason) => {
                refuse(&mut wr, reason).await;
                return;
            }
        };
        // Marked open before the acknowledgement, so that no data can arrive before it is.
        let duplicate = std::mem::replace(&mut lock(&self.state).incoming_open[from], true);
        if duplicate {
            refuse(&mut wr, Refusal::DuplicateConnection { from: hello.from }).await;
            return;
        }
        // The acknowledgement goes through the connection's writer task, registered under
        // the same lock `begin_close` takes: either `begin_close` sees this writer and sends
        // it a goodbye, or we see `closing` and refuse. Never a silent close.
        let (tx, rx) = mpsc::unbounded_channel();
        self.track_writer(tokio::spawn(write_loop(wr, rx, Arc::new(OnceLock::new()))));
        let reply = |message| Outgoing {
            message,
            payload: Bytes::new(),
            done: None,
        };
        {
            let mut back = lock(&self.back);
            if self.closing.load(Ordering::Acquire) {
                let _ = tx.send(reply(Message::Refused(Refusal::Closing)));
                return;
            }
            let _ = tx.send(reply(Message::HelloAck));
            back[from] = Some(tx);
        }
        self.read_incoming(from, rd).await;
    }

    async fn read_incoming(self: Arc<Self>, from: usize, mut rd: OwnedReadHalf) {
        let limits = self.limits();
        loop {
            match wire::read_frame(&mut rd, &limits).await {
                Ok(Some(Frame {
                    message: Message::Data { channel },
                    payload,
                })) => self.deliver(from, channel, payload),
                Ok(Some(Frame { message, .. })) if message.is_goodbye() => {
                    lock(&self.state).incoming_open[from] = false;
                    self.mark_closed(from, message.calls_named(), message.work_ended());
                    return;
                }
                Ok(Some(Frame { message, .. })) => {
                    if !self.note_news(from, &message) {
                        let detail = format!("it sent an unexpected {message:?} frame");
                        self.mark_lost(from, detail);
                        return;
                    }
                }
                Ok(None) => {
                    self.mark_lost(
                        from,
                        "its connection closed without a goodbye; the process probably died".into(),
                    );
                    return;
                }
                Err(e) => {
                    self.mark_lost(from, format!("its connection failed: {e}"));
                    return;
                }
            }
        }
    }

    /// Records a news item `from` sent (a lost, closed or stalled rank); `false` for any
    /// other message.
    fn note_news(self: &Arc<Self>, from: usize, message: &Message) -> bool {
        match message {
            Message::PeerLost { rank, detail } => {
                self.note_reported_loss(*rank as usize, detail, from)
            }
            Message::PeerClosed {
                rank,
                collectives,
                why,
            } => self.note_reported_closure(*rank as usize, *collectives, why),
            Message::PeerStalled { rank, op, seen } => {
                self.note_reported_stall(from, *rank as usize, op.clone(), seen.clone())
            }
            _ => return false,
        }
        true
    }

    /// Reads the back direction of a link: news of lost, closed and stalled ranks, then a
    /// goodbye or the end.
    async fn watch_link(self: Arc<Self>, peer: usize, mut rd: OwnedReadHalf) {
        let limits = FrameLimits::with_max_payload(0);
        loop {
            match wire::read_frame(&mut rd, &limits).await {
                Ok(Some(Frame { message, .. })) if message.is_goodbye() => {
                    return self.mark_closed(peer, message.calls_named(), message.work_ended());
                }
                Ok(Some(Frame { message, .. })) => {
                    if !self.note_news(peer, &message) {
                        let detail = format!("it sent an unexpected {message:?} frame");
                        return self.mark_lost(peer, detail);
                    }
                }
                Ok(None) => {
                    let detail =
                        "its connection closed without a goodbye; the process probably died";
                    return self.mark_lost(peer, detail.into());
                }
                Err(e) => return self.mark_lost(peer, format!("its connection failed: {e}")),
            }
        }
    }

    fn track_writer(&self, writer: JoinHandle<()>) {
        let mut writers = lock(&self.writers);
        writers.retain(|w| !w.is_finished());
        writers.push(writer);
    }

    fn deliver(&self, from: usize, channel: Channel, payload: Vec<u8>) {
        lock(&self.state)
            .queues
            .entry((from, channel))
            .or_default()
            .push_back(payload);
        self.notify.notify_waiters();
    }

    fn mark_closed(&self, peer: usize, calls: Option<u64>, idle: bool) {
        // The hooks' lock around the change of status, as in `on_peer_left`: a hook
        // registered meanwhile either sees the peer closed there or is in the list here.
        let hooks = {
            let hooks = lock(&self.leave_hooks);
            let mut st = lock(&self.state);
            let newly = matches!(st.status[peer], PeerStatus::Alive);
            if newly {
                st.status[peer] = PeerStatus::Closed;
                st.left_after[peer] = calls;
                st.left_idle[peer] = idle;
                if !st.closed_order.contains(&peer) {
                    st.closed_order.push(peer);
                }
            }
            if newly { hooks.clone() } else { Vec::new() }
        };
        self.notify.notify_waiters();
        for h in &hooks {
            (h.0)(peer, calls, idle);
        }
    }

    /// Marks `peer` lost after seeing it die, and tells the other ranks.
    ///
    /// When another rank was lost first, its news goes out again ahead of this one on every
    /// connection: a rank that hears of `peer` from us then knows of the first loss already.
    /// (A survivor that leaves after the first loss can look lost to a rank that never heard
    /// of the first, whose news may still be on its way over a new connection; without
    /// this, that rank blamed the survivor.)
    fn mark_lost(self: &Arc<Self>, peer: usize, detail: String) {
        if self.closing.load(Ordering::Acquire) {
            return;
        }
        let (changed, first) = {
            let mut st = lock(&self.state);
            if matches!(st.status[peer], PeerStatus::Alive) {
                st.status[peer] = PeerStatus::Lost(format!("{detail}, seen by rank {}", self.rank));
                st.lost_order.push(peer);
                let first = st.lost_order[0];
                let earlier = match &st.status[first] {
                    PeerStatus::Lost(d) if first != peer => Some(Message::PeerLost {
                        rank: first as u32,
                        detail: d.clone(),
                    }),
                    _ => None,
                };
                (true, earlier)
            } else {
                (false, None)
            }
        };
        if !changed {
            return;
        }
        let notice = Message::PeerLost {
            rank: peer as u32,
            detail,
        };
        let notices: Vec<Message> = first.into_iter().chain([notice]).collect();
        // Receivers that fire once the news is on each survivor's socket.
        let flushed = self.spread_news(&notices, peer, true);
        // The waits of this process learn of the loss (and the loss hooks raise the abort
        // word) only once the news is on every survivor's socket, or after NEWS_FLUSH: a
        // caller that fails on this loss and leaves at once (`process::exit`) would otherwise
        // close its connections before the news went out, and a survivor that saw the
        // connection end first would blame the caller instead of `peer`.
        self.hooks_once_flushed(peer, flushed);
    }

    /// Wakes this process's waits and runs the loss hooks for `peer` once every receiver of
    /// `flushed` has fired (the news is on each survivor's socket) or after `NEWS_FLUSH`.
    fn hooks_once_flushed(
        self: &Arc<Self>,
        peer: usize,
        flushed: Vec<oneshot::Receiver<Result<(), String>>>,
    ) {
        let mesh = Arc::clone(self);
        tokio::spawn(async move {
            let _ = timeout(NEWS_FLUSH, async {
                for on_socket in flushed {
                    let _ = on_socket.await;
                }
            })
            .await;
            mesh.notify.notify_waiters();
            mesh.run_loss_hooks(peer);
        });
    }

    /// Queues `notices` for every live rank but this one and `skip`: on each connection with it
    /// (either direction), so that it goes out ahead of any later goodbye on that connection
    /// and ahead of the end of each; a rank with no connection yet is dialed by a task that
    /// `close` awaits. Returns receivers that fire once the news is on each rank's socket.
    fn spread_news(
        self: &Arc<Self>,
        notices: &[Message],
        skip: usize,
        dial: bool,
    ) -> Vec<oneshot::Receiver<Result<(), String>>> {
        let mut flushed = Vec::new();
        for other in 0..self.nranks {
            if other == self.rank || other == skip || !self.is_alive(other) {
                continue;
            }
            // Queued now on every connection with `other` (either direction), so that it goes
            // out before any later goodbye on that connection, and ahead of the end of each:
            // `other` may see either end first when this process exits.
            let mut queued = |tx: &mpsc::UnboundedSender<Outgoing>| {
                notices.iter().all(|message| {
                    let (done, on_socket) = oneshot::channel();
                    flushed.push(on_socket);
                    tx.send(Outgoing {
                        message: message.clone(),
                        payload: Bytes::new(),
                        done: Some(done),
                    })
                    .is_ok()
                })
            };
            let on_link = self.links[other].get().is_some_and(|link| queued(&link.tx));
            let on_back = lock(&self.back)[other].as_ref().is_some_and(&mut queued);
            if on_link || on_back || !dial {
                continue;
            }
            let mesh = Arc::clone(self);
            let notices = notices.to_vec();
            let (done, on_socket) = oneshot::channel();
            flushed.push(on_socket);
            let task = tokio::spawn(async move {
                let last = notices.len() - 1;
                let mut done = Some(done);
                for (i, notice) in notices.into_iter().enumerate() {
                    let d = if i == last { done.take() } else { None };
                    let _ = mesh.post(other, notice, Bytes::new(), d, Op::Init).await;
                }
                if mesh.closing.load(Ordering::Acquire) {
                    // `begin_close` missed this new link: say goodbye here.
                    let goodbye = mesh.goodbye();
                    let _ = mesh
                        .post(other, goodbye, Bytes::new(), None, Op::Init)
                        .await;
                }
            });
            lock(&self.notices).push(task);
        }
        flushed
    }

    /// Marks `peer` lost on the word of rank `reporter`, and passes the news on over the
    /// connections this rank has.
    ///
    /// Passing it on keeps the order of causes: a rank that fails on this loss and leaves
    /// at once (`process::exit`) ends its connections, and a rank that sees one of them end
    /// before it has read the news from the rank that saw `peer` die (its reader of that
    /// other connection not yet scheduled: dozens of ranks on two cores) would blame the
    /// leaver. With the news ahead of the end on the same connection, it reads the news
    /// first. As in [`mark_lost`](Self::mark_lost), this process's waits learn of the loss
    /// once the news is on those sockets (or after `NEWS_FLUSH`).
    fn note_reported_loss(self: &Arc<Self>, peer: usize, detail: &str, reporter: usize) {
        if peer >= self.nranks || peer == self.rank {
            return;
        }
        // News passed on already says who saw the loss.
        let detail = if detail.contains(", seen by rank ") {
            detail.to_string()
        } else {
            format!("{detail}, seen by rank {reporter}")
        };
        let changed = {
            let mut st = lock(&self.state);
            let alive = matches!(st.status[peer], PeerStatus::Alive);
            if alive {
                st.status[peer] = PeerStatus::Lost(detail.clone());
                st.lost_order.push(peer);
            }
            alive
        };
        if !changed {
            self.notify.notify_waiters();
            return;
        }
        let flushed = if self.closing.load(Ordering::Acquire) {
            Vec::new()
        } else {
            let notice = Message::PeerLost {
                rank: peer as u32,
                detail,
            };
            self.spread_news(&[notice], peer, false)
        };
        self.hooks_once_flushed(peer, flushed);
    }

    /// Records another rank's news that `peer` closed its bootstrap (see
    /// [`Message::PeerClosed`]).
    fn note_reported_closure(&self, peer: usize, collectives: u64, why: &str) {
        if peer >= self.nranks || peer == self.rank {
            return;
        }
        {
            let mut st = lock(&self.state);
            if !st.closed_order.contains(&peer) {
                st.closed_order.push(peer);
            }
            st.closed_done[peer].get_or_insert(collectives);
            if !why.is_empty() {
                st.closed_why[peer]
                    .get_or_insert_with(|| wire::bounded(why, wire::MAX_CLOSED_WHY_LEN).into());
            }
        }
        self.notify.notify_waiters();
    }

    /// Records `reporter`'s word that it gave up waiting for `peer` in `op` (see
    /// [`Message::PeerStalled`]); its latest report counts. A report about this rank, or
    /// about a rank out of range, or by a rank about itself, means nothing here and is
    /// ignored, as news of a loss out of range is.
    ///
    /// If this rank has given up itself and the chain behind the rank it waited for now
    /// ends at another rank than the one its report named (its report went out before the
    /// others came, as happens when the waits along a chain time out together), it reports
    /// again, naming that rank: the ranks waiting on this one then follow the chain without
    /// a connection to the ranks further along it (reports are not dialed for).
    fn note_reported_stall(
        self: &Arc<Self>,
        reporter: usize,
        peer: usize,
        op: String,
        seen: String,
    ) {
        if peer >= self.nranks || peer == self.rank || peer == reporter {
            return;
        }
        let op = wire::bounded(&op, wire::MAX_STALLED_OP_LEN).to_owned();
        let seen = wire::bounded(&seen, wire::MAX_STALLED_OP_LEN).to_owned();
        let mut own = lock(&self.own_report);
        lock(&self.state).gave_up[reporter] = Some(StallReport {
            waiting_for: peer,
            op,
            at: Instant::now(),
            seen,
        });
        self.notify.notify_waiters();
        let update = own.as_mut().and_then(|own| {
            let behind = self.stall_behind(own.from, Some(own.began))?;
            let root = behind.waiting_for;
            if root == self.rank {
                return None;
            }
            // Again when the chain ends further on, or when what was seen of the same root
            // comes only now (the ranks behind this one may have no other way to learn it).
            let seen = behind.seen.unwrap_or_default();
            let news = root != own.root || (own.seen.is_empty() && !seen.is_empty());
            if !news {
                return None;
            }
            own.root = root;
            own.seen = seen;
            Some((root, own.op.clone(), own.seen.clone()))
        });
        drop(own);
        if let Some((root, op, mut seen)) = update
            && !self.closing.load(Ordering::Acquire)
        {
            // This rank's own look, if it can look (outside the lock: it reads /proc).
            if let Some(mine) = self.seen_of(root) {
                seen = mine;
            }
            let report = Message::peer_stalled(root as u32, &op, &seen);
            drop(self.spread_news(&[report], root, false));
        }
    }

    /// The latest [`Message::PeerStalled`] report `reporter` sent: the rank it gave up
    /// waiting for and the operation it gave up in (as sent: not followed along a chain).
    pub(crate) fn stall_reported_by(&self, reporter: usize) -> Option<GaveUp> {
        let st = lock(&self.state);
        Some(st.gave_up.get(reporter).cloned().flatten()?.gave_up())
    }

    /// The root cause behind `peer`, if `peer` reported giving up on some rank (a report
    /// that came at or after `since`, if given): that rank, or, if that one reported giving
    /// up on another, that other, and so on to the end of the chain (a rank seen twice ends
    /// it), with the operation of the last report.
    pub(crate) fn stall_behind(&self, peer: usize, since: Option<Instant>) -> Option<GaveUp> {
        let st = lock(&self.state);
        stall_behind(&st, peer, since)
    }

    /// Records that this rank completed `n` bootstrap collectives (said in its goodbye's
    /// [`Message::PeerClosed`]).
    pub(crate) fn set_collectives_done(&self, n: u64) {
        self.collectives_done.fetch_max(n, Ordering::AcqRel);
    }

    /// `rank`'s process id if this process can look at it (see
    /// [`Bootstrap::local_pid`](super::Bootstrap::local_pid)).
    pub(crate) fn local_pid(&self, rank: usize) -> Option<u32> {
        let (me, them) = (self.peers.get(self.rank)?, self.peers.get(rank)?);
        (rank != self.rank
            && !me.process_space.is_empty()
            && me.process_space == them.process_space
            && them.pid != me.pid)
            .then_some(them.pid)
    }

    /// What this rank sees of `rank`'s process, if it can look at it and it is not making
    /// progress (`rank 1 (pid 42) is stopped by a signal ...`; see
    /// [`stuck_ranks`](Self::stuck_ranks)).
    fn seen_of(&self, rank: usize) -> Option<String> {
        self.stuck_process(rank).map(|s| s.to_string())
    }

    /// `rank` as a [`StuckProcess`], if it is alive to the bootstrap, this rank can look at
    /// its process, and that is not making progress.
    fn stuck_process(&self, rank: usize) -> Option<StuckProcess> {
        if !self.is_alive(rank) {
            return None;
        }
        let pid = self.local_pid(rank)?;
        let reason = crate::procfs::stuck_reason(pid)?;
        Some(StuckProcess {
            rank,
            pid,
            reason: reason.to_owned(),
        })
    }

    /// See [`Bootstrap::stuck_ranks`](super::Bootstrap::stuck_ranks).
    pub(crate) fn stuck_ranks(&self) -> Vec<StuckProcess> {
        // A rank that closed or was lost is named as such by the waits; its process may
        // have ended on purpose, and its pid may since be another process's.
        (0..self.nranks)
            .filter_map(|rank| self.stuck_process(rank))
            .collect()
    }

    fn is_alive(&self, peer: usize) -> bool {
        matches!(lock(&self.state).status[peer], PeerStatus::Alive)
    }

    fn status_error(&self, peer: usize, op: Op) -> Option<BootstrapError> {
        let st = lock(&self.state);
        match &st.status[peer] {
            PeerStatus::Alive => None,
            PeerStatus::Closed => Some(self.closed_error(&st, peer, op)),
            PeerStatus::Lost(detail) => Some(BootstrapError::PeerLost {
                rank: self.rank,
                op,
                peer,
                detail: detail.clone(),
            }),
        }
    }

    /// Waits for the next message from `from` on `channel`.
    ///
    /// Fails when `from` is gone and nothing from it is queued, when any rank was lost and
    /// `collective` is set, or after the configured timeout (see [`Mesh::gave_up_on`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message is taken off its queue only in the poll that returns it.
    /// Cancelled after the timeout, while it waits for news, the other ranks may have been
    /// told that this rank gave up.
    pub(crate) async fn wait_message(
        self: &Arc<Self>,
        from: usize,
        channel: Channel,
        op: Op,
        collective: bool,
    ) -> Result<Vec<u8>, BootstrapError> {
        self.wait_message_within(from, channel, op, collective, self.config.timeout)
            .await
    }

    /// [`wait_message`](Self::wait_message) with a timeout of `wait` instead of the
    /// configured one.
    pub(crate) async fn wait_message_within(
        self: &Arc<Self>,
        from: usize,
        channel: Channel,
        op: Op,
        collective: bool,
        wait: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        let began = Instant::now();
        let wait = wait.min(super::LONGEST_WAIT);
        let deadline = began + wait;
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = lock(&self.state);
                if let Some(queue) = st.queues.get_mut(&(from, channel))
                    && let Some(message) = queue.pop_front()
                {
                    if queue.is_empty() {
                        st.queues.remove(&(from, channel));
                    }
                    return Ok(message);
                }
                // A lost rank dooms every collective; name it rather than whoever we wait on.
                let lost = st.lost_order.first().copied().filter(|_| collective);
                // So does a rank that closed before completing this collective (the first
                // known); its own status may still be alive here (news from another rank).
                let doomed = match channel {
                    Channel::Collective { seq, .. } if collective && lost.is_none() => st
                        .closed_order
                        .iter()
                        .copied()
                        .find(|&x| st.closed_done[x].is_some_and(|done| done <= seq)),
                    _ => None,
                };
                if let Some(peer) = doomed {
                    return Err(self.closed_error(&st, peer, op));
                }
                let gone = lost.or(match &st.status[from] {
                    PeerStatus::Alive => None,
                    PeerStatus::Closed if st.incoming_open[from] => None,
                    _ => Some(from),
                });
                if let Some(peer) = gone {
                    drop(st);
                    return Err(self
                        .status_error(peer, op)
                        .unwrap_or_else(|| BootstrapError::Protocol("peer status".into())));
                }
            }
            if timeout_at(deadline, notified).await.is_err() {
                return Err(self.gave_up_on(from, op, began, wait).await);
            }
        }
    }

    /// Tells the ranks this one has connections with that it gave up waiting for `from` in
    /// `op` (a wait that began at `began`), naming the root cause known now: `from`, or the
    /// rank that `from` said it gave up on since then (followed along the chain); see
    /// [`Mesh::gave_up_on`]. Also for waits outside the bootstrap (a collective's device
    /// timeout). Nothing while closing, for this rank or out of range.
    pub(crate) fn report_stall(self: &Arc<Self>, from: usize, op: &str, began: Instant) {
        if from >= self.nranks || from == self.rank || self.closing.load(Ordering::Acquire) {
            return;
        }
        // Held while the chain is read, so that a report that comes meanwhile either is in
        // it or finds this one set and re-reports (`note_reported_stall`).
        let mut own = lock(&self.own_report);
        let behind = self.stall_behind(from, Some(began));
        let root = behind.as_ref().map_or(from, |g| g.waiting_for);
        // What this rank sees of the root's process if it can look at it, else what the
        // report it followed saw: ranks on other machines learn it this way.
        let seen = self
            .seen_of(root)
            .or(behind.and_then(|g| g.seen))
            .unwrap_or_default();
        let report = Message::peer_stalled(root as u32, op, &seen);
        *own = Some(OwnReport {
            from,
            root,
            op: op.to_owned(),
            began,
            seen,
        });
        drop(own);
        // The rank given up on ignores news about itself.
        drop(self.spread_news(&[report], root, false));
    }

    /// The error of a wait for `from` in `op` that timed out.
    ///
    /// First tells the other ranks that this one gave up ([`Message::PeerStalled`]),
    /// naming the root cause known now: `from`, or the rank that `from` said it gave up on
    /// since this wait `began` (followed along the chain). At once, not after the grace
    /// below: ranks waiting on this one began waiting at about the same moment, so their
    /// waits are timing out now too, and they have only their own grace to hear it. Only
    /// over the connections this rank has (either direction), never by dialing: a rank
    /// waiting on this one in a collective has one (the ring successor is dialed at init,
    /// and every other pair that exchanged a message has a link), and a job whose ranks
    /// all time out at once opens no sockets for it.
    ///
    /// Then waits [`LOSS_NEWS_GRACE`] for news. News of a loss wins, as in every
    /// collective (the lost rank is named). Otherwise the timeout names `from` and, if
    /// `from` said it gave up on some rank, the root cause behind it. The grace is waited
    /// out in full, even once `from`'s report is here: the report of the rank it names may
    /// still be on its way, and may lead further along the chain.
    async fn gave_up_on(
        self: &Arc<Self>,
        from: usize,
        op: Op,
        began: Instant,
        after: Duration,
    ) -> BootstrapError {
        self.report_stall(from, &op.to_string(), began);
        if let Some((peer, detail)) = self.wait_for_loss(LOSS_NEWS_GRACE).await {
            return BootstrapError::PeerLost {
                rank: self.rank,
                op,
                peer,
                detail,
            };
        }
        BootstrapError::Timeout {
            rank: self.rank,
            op,
            waiting_for: format!("rank {from}"),
            after,
            gave_up: self.stall_behind(from, Some(began)).map(Box::new),
            stuck: self.stuck_ranks().into(),
        }
    }

    /// Why a wait for `peer` outside the bootstrap cannot end well, if it cannot: `peer` was
    /// lost, or else another rank was lost (the first known), or else `peer` closed its
    /// bootstrap (a rank that leaves during setup most likely left because of a loss, so a
    /// loss is named first).
    pub(crate) fn hopeless(&self, peer: usize, op: Op) -> Option<BootstrapError> {
        let own = self.status_error(peer, op.clone());
        if let Some(e @ BootstrapError::PeerLost { .. }) = own {
            return Some(e);
        }
        match self.first_lost() {
            Some((first, detail)) => Some(BootstrapError::PeerLost {
                rank: self.rank,
                op,
                peer: first,
                detail,
            }),
            None => own,
        }
    }

    /// The first rank known lost, and what was seen.
    pub(crate) fn first_lost(&self) -> Option<(usize, String)> {
        let st = lock(&self.state);
        let &first = st.lost_order.first()?;
        match &st.status[first] {
            PeerStatus::Lost(detail) => Some((first, detail.clone())),
            _ => None,
        }
    }

    /// The error that what this rank knows of `peer` makes of a wait for it in `op`: lost,
    /// closed (its goodbye here, or news of it from another rank, with why it left if it
    /// said), or `None` while nothing is known.
    fn news_error(&self, peer: usize, op: Op) -> Option<BootstrapError> {
        if let Some(e) = self.status_error(peer, op.clone()) {
            return Some(e);
        }
        let st = lock(&self.state);
        st.closed_order
            .contains(&peer)
            .then(|| self.closed_error(&st, peer, op))
    }

    /// A wait's error in `op` because `peer` closed its bootstrap, with what it had said
    /// (that it gave up on some rank; why it left), from the locked state.
    fn closed_error(&self, st: &MailState, peer: usize, op: Op) -> BootstrapError {
        BootstrapError::PeerClosed {
            rank: self.rank,
            op,
            peer,
            gave_up: stall_behind(st, peer, None).map(Box::new),
            said: st.closed_why[peer].clone(),
        }
    }

    /// Whether `e` is all the news there will be: a loss, or a closed rank whose reason is
    /// here or cannot come any more (its own goodbye came, after its reason if it gave one).
    fn news_complete(&self, e: &BootstrapError) -> bool {
        match e {
            BootstrapError::PeerLost { .. } => true,
            BootstrapError::PeerClosed { peer, said, .. } => {
                said.is_some() || matches!(lock(&self.state).status[*peer], PeerStatus::Closed)
            }
            _ => false,
        }
    }

    /// Waits at most `grace` for `known` (what this rank knows now) to be `complete` (say,
    /// [`news_complete`](Self::news_complete)); returns what it names then (a closed rank
    /// without its reason, when the reason did not come in time; `None`: nothing known).
    async fn wait_for_news(
        &self,
        grace: Duration,
        known: impl Fn() -> Option<BootstrapError>,
        complete: impl Fn(&BootstrapError) -> bool,
    ) -> Option<BootstrapError> {
        let deadline = Instant::now() + grace.min(self.config.timeout);
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let now = known();
            if now.as_ref().is_some_and(&complete) {
                return now;
            }
            if timeout_at(deadline, notified).await.is_err() {
                return known();
            }
        }
    }

    /// Waits at most `grace` for some rank to be known lost; returns it and what was seen.
    pub(crate) async fn wait_for_loss(&self, grace: Duration) -> Option<(usize, String)> {
        let deadline = Instant::now() + grace.min(self.config.timeout);
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(lost) = self.first_lost() {
                return Some(lost);
            }
            if timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Puts a message for this rank into its own mailbox.
    pub(crate) fn deliver_to_self(&self, channel: Channel, payload: Vec<u8>) {
        self.deliver(self.rank, channel, payload);
    }

    async fn link(self: &Arc<Self>, peer: usize, op: Op) -> Result<&Link, BootstrapError> {
        self.links[peer]
            .get_or_try_init(|| self.dial(peer, op))
            .await
    }

    /// Dials the ring successor now rather than on first use, so that every rank's death is
    /// seen by some live rank.
    ///
    /// A failure is blamed on the first rank known lost, else the first known to have closed
    /// (with why it left, if it said; waiting up to [`LOSS_NEWS_GRACE`] for that news): a
    /// job with such a rank cannot start, and the successor this rank dialed most likely
    /// closed because of it (it refused, or closed during the handshake).
    pub(crate) async fn connect_ring(self: &Arc<Self>) -> Result<(), BootstrapError> {
        if self.nranks > 1
            && let Err(e) = self.link(self.successor(), Op::Init).await
        {
            // Only for a failure a gone rank explains: the successor refused or closed, or
            // news names a loss or a rank that said why. A socket error of a healthy job
            // (a firewall, an unreachable address) stays as it is.
            let gone = matches!(
                &e,
                BootstrapError::PeerClosed { .. }
                    | BootstrapError::PeerLost { .. }
                    | BootstrapError::Protocol(_)
                    | BootstrapError::RefusedByPeer {
                        reason: Refusal::Closing,
                        ..
                    }
            ) || match &e {
                BootstrapError::Io { source, .. } => peer_gone(source.kind()),
                BootstrapError::Frame {
                    source: wire::FrameError::Io(source),
                    ..
                } => peer_gone(source.kind()),
                _ => false,
            };
            let news = || self.first_gone_error(Op::Init);
            // Complete only with a loss or a reason: the successor's own refusal marks it
            // closed without one, while the rank that failed first may have said why.
            let named = |e: &BootstrapError| {
                matches!(
                    e,
                    BootstrapError::PeerLost { .. }
                        | BootstrapError::PeerClosed { said: Some(_), .. }
                )
            };
            let known = match gone {
                true => self.wait_for_news(LOSS_NEWS_GRACE, news, named).await,
                false => news(),
            };
            return Err(match known {
                Some(k) if named(&k) => k,
                Some(k @ BootstrapError::PeerClosed { peer, .. }) if peer == self.successor() => k,
                _ => e,
            });
        }
        Ok(())
    }

    /// The rank this one dials at init (the next on the ring).
    fn successor(&self) -> usize {
        (self.rank + 1) % self.nranks
    }

    /// The error naming the first rank known lost, else a rank known to have closed.
    fn first_gone_error(&self, op: Op) -> Option<BootstrapError> {
        if let Some((peer, detail)) = self.first_lost() {
            return Some(BootstrapError::PeerLost {
                rank: self.rank,
                op,
                peer,
                detail,
            });
        }
        // The order in which this rank heard of closures is not the order they happened:
        // prefer a rank that said why (it failed by itself), then one whose news came with
        // a record (its own, or passed on), then the first heard of.
        let first = {
            let st = lock(&self.state);
            let order = &st.closed_order;
            order
                .iter()
                .find(|&&p| st.closed_why[p].is_some())
                .or_else(|| order.iter().find(|&&p| st.closed_done[p].is_some()))
                .or_else(|| order.first())
                .copied()?
        };
        self.news_error(first, op)
    }

    async fn dial(self: &Arc<Self>, peer: usize, op: Op) -> Result<Link, BootstrapError> {
        let addr: SocketAddr = self.peers[peer].addr;
        let io_err = |context: String, source: std::io::Error| BootstrapError::Io {
            rank: self.rank,
            context,
            source,
        };
        let stream = match timeout(self.config.timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                // After the rendezvous every rank listens until it closes: a refusal means
                // that `peer` is gone. Its goodbye (with why it left) or its loss may reach
                // this rank through another one a moment later; name it from that news (not
                // while closing: nobody reads the error then).
                let news = || self.news_error(peer, op.clone());
                let known = if peer_gone(e.kind()) && !self.closing.load(Ordering::Acquire) {
                    let complete = |e: &BootstrapError| self.news_complete(e);
                    self.wait_for_news(LOSS_NEWS_GRACE, news, complete).await
                } else {
                    news()
                };
                return Err(known.unwrap_or_else(|| {
                    io_err(format!("{op}: cannot connect to rank {peer} at {addr}"), e)
                }));
            }
            Err(_) => {
                return Err(BootstrapError::Timeout {
                    rank: self.rank,
                    op,
                    waiting_for: format!("a connection to rank {peer} at {addr}"),
                    after: self.config.timeout,
                    gave_up: None,
                    stuck: self.stuck_ranks().into(),
                });
            }
        };
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let hello = Message::Hello(Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            secret: self.id.secret(),
            nranks: self.nranks as u32,
            from: self.rank as u32,
            to: peer as u32,
        });
        let handshake_context = format!(
            "rank {}: {op}: handshake with rank {peer} at {addr}",
            self.rank
        );
        let frame_err = |source| BootstrapError::Frame {
            context: handshake_context,
            source,
        };
        let reply = timeout(self.config.timeout, async {
            wire::write_frame(&mut wr, &hello, &[]).await?;
            wire::read_frame(&mut rd, &FrameLimits::HANDSHAKE).await
        })
        .await
        .map_err(|_| BootstrapError::Timeout {
            rank: self.rank,
            op: op.clone(),
            waiting_for: format!("rank {peer} to answer the handshake"),
            after: self.config.timeout,
            gave_up: None,
            stuck: self.stuck_ranks().into(),
        })?
        .map_err(frame_err)?;
        match reply {
            Some(Frame {
                message: Message::HelloAck,
                ..
            }) => {}
            Some(Frame {
                message: Message::Refused(reason),
                ..
            }) => {
                if reason == Refusal::Closing {
                    self.mark_closed(peer, None, false);
                }
                return Err(BootstrapError::RefusedByPeer {
                    rank: self.rank,
                    peer,
                    reason,
                });
            }
            Some(frame) => {
                return Err(BootstrapError::Protocol(format!(
                    "rank {}: rank {peer} answered the handshake with {:?}",
                    self.rank, frame.message
                )));
            }
            None => {
                return Err(self.status_error(peer, op).unwrap_or_else(|| {
                    BootstrapError::Protocol(format!(
                        "rank {}: rank {peer} closed the connection during the handshake",
                        self.rank
                    ))
                }));
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let broken = Arc::new(OnceLock::new());
        self.track_writer(tokio::spawn(write_loop(wr, rx, Arc::clone(&broken))));
        let mesh = Arc::clone(self);
        self.spawn_tracked(async move { mesh.watch_link(peer, rd).await });
        Ok(Link { tx, broken })
    }

    /// Queues a frame to `peer`, dialing it first if needed. With `done`, the writer reports
    /// when the frame is on the socket.
    async fn post(
        self: &Arc<Self>,
        peer: usize,
        message: Message,
        payload: Bytes,
        done: Option<oneshot::Sender<Result<(), String>>>,
        op: Op,
    ) -> Result<(), BootstrapError> {
        let link = self.link(peer, op.clone()).await?;
        let out = Outgoing {
            message,
            payload,
            done,
        };
        if link.tx.send(out).is_err() {
            return Err(self.link_error(peer, link, op));
        }
        Ok(())
    }

    fn link_error(&self, peer: usize, link: &Link, op: Op) -> BootstrapError {
        self.status_error(peer, op.clone())
            .unwrap_or_else(|| BootstrapError::PeerLost {
                rank: self.rank,
                op,
                peer,
                detail: link
                    .broken
                    .get()
                    .cloned()
                    .unwrap_or_else(|| "the connection to it is closed".into()),
            })
    }

    /// Queues data for `peer` without waiting for it to be written; a failure shows up as
    /// the peer being lost.
    pub(crate) async fn post_data(
        self: &Arc<Self>,
        peer: usize,
        channel: Channel,
        payload: Bytes,
        op: Op,
    ) -> Result<(), BootstrapError> {
        self.check_size(payload.len(), op.clone())?;
        if peer == self.rank {
            self.deliver_to_self(channel, payload.to_vec());
            return Ok(());
        }
        self.post(peer, Message::Data { channel }, payload, None, op)
            .await
    }

    /// Sends data to `peer` and waits until it is written to the socket.
    ///
    /// # Cancel safety
    ///
    /// Once the frame is queued, cancelling does not take it back: it is written whole or the
    /// connection fails.
    pub(crate) async fn send_data(
        self: &Arc<Self>,
        peer: usize,
        channel: Channel,
        payload: Bytes,
        op: Op,
    ) -> Result<(), BootstrapError> {
        self.check_size(payload.len(), op.clone())?;
        if peer == self.rank {
            self.deliver_to_self(channel, payload.to_vec());
            return Ok(());
        }
        let (done_tx, done_rx) = oneshot::channel();
        self.post(
            peer,
            Message::Data { channel },
            payload,
            Some(done_tx),
            op.clone(),
        )
        .await?;
        match done_rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(detail)) => {
                Err(self
                    .status_error(peer, op.clone())
                    .unwrap_or(BootstrapError::PeerLost {
                        rank: self.rank,
                        op,
                        peer,
                        detail,
                    }))
            }
            Err(_) => Err(BootstrapError::PeerLost {
                rank: self.rank,
                op,
                peer,
                detail: "the connection to it was closed".into(),
            }),
        }
    }

    fn check_size(&self, len: usize, op: Op) -> Result<(), BootstrapError> {
        if len > self.config.max_message_size {
            return Err(BootstrapError::InvalidArgument(format!(
                "rank {}: {op}: message of {len} bytes exceeds max_message_size ({} bytes)",
                self.rank, self.config.max_message_size
            )));
        }
        Ok(())
    }

    /// Starts closing: stops readers, queues goodbyes. Safe to call more than once and from
    /// outside a runtime.
    pub(crate) fn begin_close(&self, goodbye: bool) {
        if self.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        let back: Vec<_> = lock(&self.back)
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        if goodbye {
            // A rank that leaves after a failure passes the news on with its goodbye, so
            // that peers blame the lost rank, not the one that left.
            // Likewise the first rank it knows to have closed, and itself, each with the
            // collectives it completed: a rank whose set-up failed leaves politely, and the
            // ranks waiting in a collective it never completed learn so at once.
            let own_why = lock(&self.leaving_why).clone().unwrap_or_default();
            let news: Vec<Message> = {
                let st = lock(&self.state);
                let lost = st.lost_order.first().and_then(|&p| match &st.status[p] {
                    PeerStatus::Lost(detail) => Some(Message::PeerLost {
                        rank: p as u32,
                        detail: detail.clone(),
                    }),
                    _ => None,
                });
                // The first with a record (a goodbye that came without one, as a late
                // notice's does, leaves that rank without).
                let closed = st.closed_order.iter().find_map(|&p| {
                    st.closed_done[p].map(|collectives| {
                        let why = st.closed_why[p].as_deref().unwrap_or_default();
                        Message::peer_closed(p as u32, collectives, why)
                    })
                });
                let me = Message::peer_closed(
                    self.rank as u32,
                    self.collectives_done.load(Ordering::Acquire),
                    &own_why,
                );
                lost.into_iter().chain(closed).chain([me]).collect()
            };
            let goodbye = self.goodbye();
            let links = self.links.iter().filter_map(|l| l.get()).map(|l| &l.tx);
            for tx in links.chain(back.iter()) {
                for message in news.iter().cloned().chain([goodbye.clone()]) {
                    let _ = tx.send(Outgoing {
                        message,
                        payload: Bytes::new(),
                        done: None,
                    });
                }
            }
        } else {
            for task in lock(&self.notices).drain(..) {
                task.abort();
            }
            for writer in lock(&self.writers).drain(..) {
                writer.abort();
            }
        }
    }

    /// Closes with goodbyes and waits (bounded) for them to be written.
    pub(crate) async fn close(&self) {
        let notices: Vec<JoinHandle<()>> = lock(&self.notices).drain(..).collect();
        let deadline = Instant::now() + NOTICE_WAIT.min(self.config.timeout);
        for task in notices {
            // Past the deadline it is left to finish on its own: aborting it mid-handshake
            // would look to its target like this rank dying.
            let _ = timeout_at(deadline, task).await;
        }
        self.begin_close(true);
        let deadline = Instant::now() + FLUSH_WAIT;
        let writers: Vec<JoinHandle<()>> = lock(&self.writers).drain(..).collect();
        for writer in writers {
            let abort = writer.abort_handle();
            if timeout_at(deadline, writer).await.is_err() {
                abort.abort();
            }
        }
    }
}

/// Whether a socket error to a peer, after the rendezvous, means that the peer is gone (it
/// listened until it closed: a refusal, or a reset of a connection it had not accepted).
fn peer_gone(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::{
        ConnectionAborted, ConnectionRefused, ConnectionReset, UnexpectedEof,
    };
    matches!(
        kind,
        ConnectionRefused | ConnectionReset | ConnectionAborted | UnexpectedEof
    )
}

/// [`Mesh::stall_behind`] on the locked state.
fn stall_behind(st: &MailState, peer: usize, since: Option<Instant>) -> Option<GaveUp> {
    let mut seen = HashSet::from([peer]);
    let mut behind = None;
    let mut at = peer;
    while let Some(r) = st.gave_up.get(at).cloned().flatten() {
        if since.is_some_and(|t| r.at < t) || !seen.insert(r.waiting_for) {
            break;
        }
        at = r.waiting_for;
        behind = Some(r.gave_up());
    }
    behind
}

async fn refuse(wr: &mut OwnedWriteHalf, reason: Refusal) {
    let _ = timeout(
        COURTESY_WRITE_TIMEOUT,
        wire::write_frame(wr, &Message::Refused(reason), &[]),
    )
    .await;
    let _ = timeout(COURTESY_WRITE_TIMEOUT, wr.shutdown()).await;
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    broken: Arc<OnceLock<String>>,
) {
    while let Some(out) = rx.recv().await {
        let goodbye = out.message.is_goodbye();
        match wire::write_frame(&mut wr, &out.message, &out.payload).await {
            Ok(()) => {
                if let Some(done) = out.done {
                    let _ = done.send(Ok(()));
                }
                if goodbye {
                    break;
                }
            }
            Err(e) => {
                let detail = format!("writing to it failed: {e}");
                let _ = broken.set(detail.clone());
                if let Some(done) = out.done {
                    let _ = done.send(Err(detail.clone()));
                }
                rx.close();
                while let Some(out) = rx.recv().await {
                    if let Some(done) = out.done {
                        let _ = done.send(Err(detail.clone()));
                    }
                }
                return;
            }
        }
    }
    let _ = timeout(COURTESY_WRITE_TIMEOUT, wr.shutdown()).await;
}

#[cfg(test)]
mod tests;
