//! Errors of the bootstrap.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::wire::FrameError;

/// Why the root or a peer refused a connection. Sent over the wire, so the refused side can
/// say exactly what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The first frame was not an mscclpp bootstrap handshake.
    #[error("not an mscclpp bootstrap handshake (bad magic)")]
    BadMagic,
    /// Protocol versions differ.
    #[error("protocol version {theirs} is not supported (this side speaks {ours})")]
    VersionMismatch {
        /// Version of the refusing side.
        ours: u32,
        /// Version presented.
        theirs: u32,
    },
    /// The secret does not match the unique id.
    #[error(
        "wrong secret: the unique id does not belong to this bootstrap (a stale id, or \
         another job's root at this address)"
    )]
    WrongSecret,
    /// A rank at or beyond `nranks`.
    #[error("rank {rank} is out of range for {nranks} ranks")]
    RankOutOfRange {
        /// Rank presented.
        rank: u32,
        /// Number of ranks.
        nranks: u32,
    },
    /// A second join for a rank that has already joined: the first one keeps the rank
    /// (first come wins), the second is refused.
    #[error(
        "rank {rank} has already joined this rendezvous from another connection (the first join keeps the rank)"
    )]
    DuplicateRank {
        /// The duplicated rank.
        rank: u32,
    },
    /// A rank was started with another number of ranks.
    #[error(
        "rank {rank} was started with nranks = {nranks}, but the job at this root has nranks = \
         {expected} (a rank started with the wrong size, or a rank of another job that was \
         given the same root address)"
    )]
    NranksMismatch {
        /// Rank presented.
        rank: u32,
        /// Its nranks.
        nranks: u32,
        /// nranks of the ranks that joined first.
        expected: u32,
    },
    /// A rank of another job reached this job's root: two jobs were given one `"ip:port"`
    /// (the root's job and the rank's differ, as their launchers name them; see
    /// [`BootstrapConfig::job_id`](super::BootstrapConfig::job_id)). The rank is refused and
    /// the root waits on for its own.
    #[error(
        "another job ({}, {nranks} ranks) is using this root address; this rank belongs to \
         {} ({their_nranks} ranks). Give each job its own address (MSCCLPP_BOOTSTRAP, or \
         MASTER_PORT), or the same MSCCLPP_JOB_ID to every rank of one job",
        job_name(job),
        job_name(theirs)
    )]
    OtherJob {
        /// The job of the root (of its rank 0).
        job: String,
        /// The number of ranks of the root's job.
        nranks: u32,
        /// The job of the refused rank.
        theirs: String,
        /// The number of ranks the refused rank was started with.
        their_nranks: u32,
    },
    /// A peer connection reached the wrong rank.
    #[error("the connection was meant for rank {to}, but reached rank {actual}")]
    WrongDestination {
        /// Rank the dialer wanted.
        to: u32,
        /// Rank that answered.
        actual: u32,
    },
    /// A second connection from the same peer.
    #[error("rank {from} is already connected")]
    DuplicateConnection {
        /// The dialing rank.
        from: u32,
    },
    /// The first frame was a valid frame of the wrong kind.
    #[error("unexpected first message: {0}")]
    UnexpectedMessage(String),
    /// The peer is closing its bootstrap.
    #[error("the rank is closing its bootstrap")]
    Closing,
    /// The rendezvous did not complete within the root's timeout.
    #[error(
        "the rendezvous timed out after {timeout_ms} ms; {missing} never joined \
         (how far apart the ranks may arrive is the root's rendezvous timeout: \
         MSCCLPP_RENDEZVOUS_TIMEOUT, in seconds, where a launcher or the NCCL library starts \
         the root, else BootstrapConfig::rendezvous_timeout){}",
        refused_joins(refused)
    )]
    RendezvousTimeout {
        /// Ranks that never joined.
        missing: RankRanges,
        /// The root's timeout.
        timeout_ms: u64,
        /// Joins the root refused meanwhile (who, and why), the first few only.
        refused: Vec<String>,
    },
    /// The rendezvous was aborted because of another rank's error.
    #[error("the rendezvous was aborted: {cause}")]
    Aborted {
        /// What made the root abort.
        cause: Box<Refusal>,
    },
    /// The first frame's length prefix or encoding is wrong (the text says which length).
    #[error("malformed handshake frame: {0}")]
    MalformedFrame(String),
    /// A rank ended before the rendezvous completed (its launcher told the root).
    #[error("rank {rank} ended before the rendezvous completed ({how})")]
    RankEnded {
        /// The rank that ended.
        rank: u32,
        /// How it ended (its exit status).
        how: String,
    },
}

/// A job identity ([`Join::job`](super::wire::Join::job)) for messages.
fn job_name(job: &str) -> String {
    if job.is_empty() {
        "no job id".into()
    } else {
        format!("job {job}")
    }
}

/// A set of ranks as ascending runs, for messages: `rank 5`, `ranks 1-99999`, `ranks 1-3, 7
/// and 9-12`. A message about a large job stays short (and fits a frame): the first
/// [`MAX_RUNS`](Self::MAX_RUNS) runs are kept, and the others counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankRanges {
    /// The runs kept, first and last rank of each, ascending and apart.
    runs: Vec<(u32, u32)>,
    /// Ranks in the runs left out.
    left_out: u64,
    /// Runs left out.
    runs_left_out: u64,
}

impl RankRanges {
    /// Most runs a set keeps for its message.
    pub const MAX_RUNS: usize = 8;

    /// The set of `ranks` (in any order; repeats count once).
    pub fn new(ranks: impl IntoIterator<Item = u32>) -> RankRanges {
        let mut sorted: Vec<u32> = ranks.into_iter().collect();
        sorted.sort_unstable();
        sorted.dedup();
        let mut set = RankRanges::default();
        let mut ranks = sorted.into_iter().peekable();
        while let Some(first) = ranks.next() {
            let mut last = first;
            while ranks.next_if(|&r| Some(r) == last.checked_add(1)).is_some() {
                last += 1;
            }
            if set.runs.len() < Self::MAX_RUNS {
                set.runs.push((first, last));
            } else {
                set.left_out += u64::from(last - first) + 1;
                set.runs_left_out += 1;
            }
        }
        set
    }

    /// How many ranks the set holds.
    pub fn len(&self) -> u64 {
        self.runs
            .iter()
            .map(|&(a, b)| u64::from(b - a) + 1)
            .sum::<u64>()
            + self.left_out
    }

    /// Whether the set holds no rank.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The ranks of the runs kept, ascending (all of them when none was left out).
    pub fn ranks(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().flat_map(|&(a, b)| a..=b)
    }
}

impl fmt::Display for RankRanges {
    /// `no rank`, `rank 5`, `ranks 1-99999`, `ranks 1-3, 7 and 9-12`, `ranks 0, 2, ..., 14
    /// and 1,000 more in 996 runs`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = |&(a, b): &(u32, u32)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        };
        let runs: Vec<String> = self.runs.iter().map(run).collect();
        match runs.as_slice() {
            [] => f.write_str("no rank"),
            [one] if self.len() == 1 => write!(f, "rank {one}"),
            [only] if self.runs_left_out == 0 => write!(f, "ranks {only}"),
            [rest @ .., last] if self.runs_left_out == 0 => {
                write!(f, "ranks {} and {last}", rest.join(", "))
            }
            _ => write!(
                f,
                "ranks {} and {} more in {} more runs ({} in all)",
                runs.join(", "),
                self.left_out,
                self.runs_left_out,
                self.len()
            ),
        }
    }
}

fn refused_joins(refused: &[String]) -> String {
    if refused.is_empty() {
        String::new()
    } else {
        format!("; joins refused meanwhile: {}", refused.join("; "))
    }
}

/// The operation an error happened in.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// `init`: rendezvous and connection setup.
    Init,
    /// `all_gather`.
    AllGather,
    /// `barrier`.
    Barrier,
    /// `broadcast`.
    Broadcast,
    /// `send` with this tag.
    Send(u64),
    /// `recv` with this tag.
    Recv(u64),
    /// [`send_named`](super::Bootstrap::send_named): a send the caller named (errors show
    /// the name, not the tag).
    SendNamed(Arc<str>),
    /// [`recv_named`](super::Bootstrap::recv_named): a receive the caller named.
    RecvNamed(Arc<str>),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Init => f.write_str("init"),
            Op::AllGather => f.write_str("all_gather"),
            Op::Barrier => f.write_str("barrier"),
            Op::Broadcast => f.write_str("broadcast"),
            Op::Send(tag) => write!(f, "send (tag {tag})"),
            Op::Recv(tag) => write!(f, "recv (tag {tag})"),
            Op::SendNamed(what) => write!(f, "sending {what}"),
            Op::RecvNamed(what) => write!(f, "receiving {what}"),
        }
    }
}

/// A rank's word that it gave up waiting for another rank in some operation (its wait timed
/// out; [`wire::Message::PeerStalled`](super::wire::Message::PeerStalled)). Errors carry it
/// to name the root cause of a stall rather than the healthy rank stuck behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GaveUp {
    /// The rank given up on: the root cause as far as the ranks knew (a rank that had
    /// itself given up on another is followed to that other).
    pub waiting_for: usize,
    /// The operation in which the report that names `waiting_for` gave up (as the
    /// reporting rank printed it).
    pub op: String,
    /// What a rank on `waiting_for`'s machine saw of its process when it gave up
    /// (`rank 1 (pid 42) is stopped by a signal ...`), if it saw something wrong: how a
    /// rank on another machine learns that a process is stopped or stuck in the kernel.
    pub seen: Option<String>,
}

/// A rank on this machine whose process was not making progress when a wait of this rank
/// timed out, as `/proc` showed it then (stopped by a signal or a debugger, in an
/// uninterruptible kernel wait, ended): most likely why the wait timed out, whichever rank
/// it waited for. Found only for ranks whose processes this rank can look at (the same
/// machine and process id namespace; [`Bootstrap::local_pid`](super::Bootstrap::local_pid)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StuckProcess {
    /// The rank.
    pub rank: usize,
    /// Its process id.
    pub pid: u32,
    /// What `/proc` showed, as a phrase ("is stopped by a debugger").
    pub reason: String,
}

impl fmt::Display for StuckProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} (pid {}) {}", self.rank, self.pid, self.reason)
    }
}

/// `"; on this machine, rank 1 (pid 42) is stopped ..., and rank 3 ..."`, or nothing.
pub(crate) fn stuck_note(stuck: &[StuckProcess]) -> String {
    if stuck.is_empty() {
        return String::new();
    }
    let all: Vec<String> = stuck.iter().map(ToString::to_string).collect();
    format!("; on this machine, {}", all.join(", and "))
}

/// `; on its machine, rank 1 (pid 42) is stopped ...` for what `g` says was seen of its
/// rank's process, unless `stuck` (what this rank saw itself) names that rank already.
fn seen_note(g: &GaveUp, stuck: &[StuckProcess]) -> String {
    match &g.seen {
        Some(seen) if !stuck.iter().any(|s| s.rank == g.waiting_for) => {
            format!("; on its machine, {seen}")
        }
        _ => String::new(),
    }
}

/// `, which had given up, stuck behind rank 1 (all_gather)` (and what was seen of rank 1 on
/// its machine, [`seen_note`]) for a wait whose rank had given up, or nothing.
pub(crate) fn gave_up_note(gave_up: Option<&GaveUp>, stuck: &[StuckProcess]) -> String {
    match gave_up {
        Some(g) => format!(
            ", which had given up, stuck behind rank {} ({}){}",
            g.waiting_for,
            g.op,
            seen_note(g, stuck)
        ),
        None => String::new(),
    }
}

fn itself_gave_up(gave_up: &Option<Box<GaveUp>>, stuck: &[StuckProcess]) -> String {
    gave_up_note(gave_up.as_deref(), stuck)
}

fn closed_after(gave_up: &Option<Box<GaveUp>>) -> String {
    match gave_up {
        Some(g) => format!(
            " (it had given up, stuck behind rank {} in {}{})",
            g.waiting_for,
            g.op,
            seen_note(g, &[])
        ),
        None => String::new(),
    }
}

fn closed_saying(said: &Option<String>) -> String {
    match said {
        Some(why) => format!("; it said why: {why}"),
        None => String::new(),
    }
}

/// Errors of the bootstrap. Each names the rank, peer, address or limit involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// An argument is invalid (the message says which and why).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The root could not be reached before the timeout.
    #[error(
        "rank {rank}: cannot reach the bootstrap root at {addr} after {attempts} attempts in {waited:?}: {source}"
    )]
    RootUnreachable {
        /// This rank.
        rank: usize,
        /// The root's address.
        addr: SocketAddr,
        /// Connection attempts made.
        attempts: u32,
        /// Time spent trying.
        waited: Duration,
        /// The last connection error.
        #[source]
        source: std::io::Error,
    },
    /// The root refused this rank.
    #[error("rank {rank}: the bootstrap root at {addr} refused the connection: {reason}")]
    RefusedByRoot {
        /// This rank.
        rank: usize,
        /// The root's address.
        addr: SocketAddr,
        /// Why.
        reason: Refusal,
    },
    /// A peer refused this rank's connection.
    #[error("rank {rank}: rank {peer} refused the connection: {reason}")]
    RefusedByPeer {
        /// This rank.
        rank: usize,
        /// The refusing peer.
        peer: usize,
        /// Why.
        reason: Refusal,
    },
    /// The root's rendezvous failed (returned by [`Root::run`](super::Root::run)).
    #[error("bootstrap root: {0}")]
    RendezvousFailed(Refusal),
    /// A peer died or its connection broke without a goodbye.
    #[error("rank {rank}: {op} failed: rank {peer} was lost ({detail})")]
    PeerLost {
        /// This rank.
        rank: usize,
        /// The operation.
        op: Op,
        /// The lost rank.
        peer: usize,
        /// What was seen, and by whom.
        detail: String,
    },
    /// A peer closed its bootstrap while this rank still needed it.
    #[error(
        "rank {rank}: {op} failed: rank {peer} has closed its bootstrap{}{}",
        closed_after(gave_up),
        closed_saying(said)
    )]
    PeerClosed {
        /// This rank.
        rank: usize,
        /// The operation.
        op: Op,
        /// The closed rank.
        peer: usize,
        /// Set when `peer` had said, before it closed, that it gave up waiting for another
        /// rank (most likely why it closed).
        gave_up: Option<Box<GaveUp>>,
        /// Why `peer` closed, as it said: its own error (a set-up that failed on it; see
        /// [`Bootstrap::set_leaving_why`](super::Bootstrap::set_leaving_why)). `None`: it
        /// said nothing, or its word has not reached this rank.
        said: Option<String>,
    },
    /// A wait ran out of time.
    #[error(
        "rank {rank}: {op} timed out after {after:?} waiting for {waiting_for}{}{}",
        itself_gave_up(gave_up, stuck),
        stuck_note(stuck)
    )]
    Timeout {
        /// This rank.
        rank: usize,
        /// The operation.
        op: Op,
        /// What the rank was waiting for (a rank or the root).
        waiting_for: String,
        /// The timeout.
        after: Duration,
        /// Set when the rank waited for had itself given up waiting for another rank (it
        /// said so): that other rank, followed along the chain of such reports, is the root
        /// cause, and `waiting_for` only waited on it. `None`: no such report came.
        gave_up: Option<Box<GaveUp>>,
        /// Ranks of this machine whose processes could not be making progress when the wait
        /// timed out (most likely the cause); empty when none was seen or none can be looked at.
        stuck: Box<[StuckProcess]>,
    },
    /// A socket operation of a rank failed.
    #[error("rank {rank}: {context}: {source}")]
    Io {
        /// This rank.
        rank: usize,
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A socket or thread operation of the bootstrap root failed (binding its port, say).
    #[error("bootstrap root: {context}: {source}")]
    RootIo {
        /// What was being done, with the address.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A frame could not be read, decoded or written.
    #[error("{context}: {source}")]
    Frame {
        /// What was being done, with whom.
        context: String,
        /// The error.
        #[source]
        source: FrameError,
    },
    /// A peer or the root sent a valid frame that makes no sense at this point.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An earlier collective was cancelled midway.
    #[error(
        "rank {rank}: the bootstrap is poisoned: a collective was cancelled midway, so the ranks no longer agree on the collective sequence"
    )]
    Poisoned {
        /// This rank.
        rank: usize,
    },
    /// A blocking call was made from inside a tokio runtime.
    #[error(
        "BlockingBootstrap was called from inside a tokio runtime, where it cannot block; use the async Bootstrap there"
    )]
    InsideRuntime,
}
