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
use super::link;
use super::unique_id::UniqueId;
use super::wire::{
    self, Channel, Frame, FrameLimits, Hello, MAGIC, Message, PROTOCOL_VERSION, PeerInfo,
};
use super::{BootstrapConfig, LOSS_NEWS_GRACE};

mod incoming;
mod mailbox;
mod news;
mod outgoing;

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
