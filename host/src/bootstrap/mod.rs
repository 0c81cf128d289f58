//! Bootstrap: the control plane every rank uses to find the others and exchange handles.
//!
//! One process creates a [`UniqueId`] ([`create_unique_id`], which starts a [`Root`]) and
//! hands it to every rank; each rank calls [`Bootstrap::init`] with its rank and the number
//! of ranks. The seed's `"ip:port"` form also works: rank 0 then runs the root at that
//! address ([`BootstrapRoot::Addr`]), and the secret is derived from a shared string
//! ([`BootstrapConfig::secret`], `MSCCLPP_BOOTSTRAP_SECRET`) or, without one, is all zeros
//! (unauthenticated). After `init`, ranks talk directly:
//! [`all_gather`](Bootstrap::all_gather), [`barrier`](Bootstrap::barrier),
//! [`broadcast`](Bootstrap::broadcast), and tagged [`send`](Bootstrap::send) /
//! [`recv`](Bootstrap::recv).
//!
//! Everything is async on tokio; [`BlockingBootstrap`] wraps it for callers outside a
//! runtime.
//!
//! What is checked: every connection (to the root or between ranks) starts with a handshake
//! holding the magic, the protocol version and the id's secret; a bad one is refused on that
//! connection alone. At the root, a join that does not fit the job (other nranks, rank out of
//! range, rank already joined) is refused on its connection too, and the rendezvous goes on:
//! the first join for a rank keeps it. Frames are length-prefixed with limits checked before allocation
//! ([`wire`]). Every wait has a timeout ([`BootstrapConfig::timeout`]; the rendezvous's is
//! [`BootstrapConfig::rendezvous_wait`]); a rank that dies
//! makes every other rank's pending and later collectives fail with
//! [`BootstrapError::PeerLost`] naming it; one that closes (says goodbye) before completing
//! a collective makes every rank waiting in it fail at once with
//! [`BootstrapError::PeerClosed`] naming it, however far along the ring (each rank that
//! leaves passes on the first rank it knew to have closed, with the collectives it
//! completed: [`wire::Message::PeerClosed`]). A rank that stalls (alive, but stuck) is seen
//! only by timeouts; a rank whose wait times out tells the others
//! ([`wire::Message::PeerStalled`]), so that a rank waiting on it names the stalled rank
//! behind it ([`BootstrapError::Timeout`]'s `gave_up`), not only the rank it waited for.
//! A timeout also names the ranks of this machine whose processes are not making progress
//! when it looks (stopped, in an uninterruptible kernel wait, ended: its `stuck`,
//! [`Bootstrap::stuck_ranks`]). What is not: a peer that passed the handshake is
//! trusted to follow the protocol (a deviation is treated as that peer being lost).
//!
//! Collectives must be called in the same order on every rank. They are serialised per
//! rank, so sharing a `Bootstrap` between tasks is fine, but the order across ranks is the
//! caller's to keep.
//!
//! ```no_run
//! # fn demo() -> Result<(), mscclpp_host::bootstrap::BootstrapError> {
//! use mscclpp_host::bootstrap::{BlockingBootstrap, create_unique_id};
//! let id = create_unique_id()?; // on one process; pass `id.to_string()` to the others
//! # let (nranks, rank) = (1, 0);
//! let bootstrap = BlockingBootstrap::init(nranks, rank, id)?;
//! let all = bootstrap.all_gather(&rank.to_le_bytes())?;
//! assert_eq!(all.len(), nranks);
//! bootstrap.barrier()?;
//! # Ok(()) }
//! ```

mod blocking;
mod config;
mod error;
mod link;
pub(crate) use link::is_network_loss;
mod mesh;
mod rendezvous;
mod root;
mod unique_id;
pub mod wire;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, sleep, timeout, timeout_at};

pub use blocking::BlockingBootstrap;
pub use config::*;
pub use error::{BootstrapError, GaveUp, Op, RankRanges, Refusal, StuckProcess};
pub(crate) use error::{gave_up_note, stuck_note};
pub use root::{Root, RootHandle, create_unique_id, create_unique_id_at};
pub(crate) use unique_id::redacted;
pub use unique_id::{SECRET_BYTES, UNIQUE_ID_BYTES, UniqueId, UniqueIdError};

use crate::settings::Settings;
use mesh::Mesh;
use rendezvous::*;
use wire::{Channel, Frame, FrameLimits, Join, MAGIC, MAX_HOST_ID_LEN, Message, PROTOCOL_VERSION};

/// How long a failed collective (or a transport's setup wait, or a step across hosts whose
/// partner's connection ended) waits for news of a lost rank before reporting its own
/// cause.
pub(crate) const LOSS_NEWS_GRACE: Duration = Duration::from_millis(500);

/// Largest number of ranks a bootstrap accepts.
pub const MAX_NRANKS: usize = 1 << 20;

/// The longest wait the bootstrap keeps as a deadline: one this far is none in practice,
/// and `Instant` arithmetic cannot overflow on it (`Duration::MAX` would).
pub(crate) const LONGEST_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// One rank's bootstrap: connected to every other rank (lazily), ready for collectives and
/// point-to-point messages.
///
/// Dropping it closes it politely (peers see a goodbye, not a death); [`close`](Self::close)
/// does the same and waits for the goodbyes to be written.
#[derive(Debug)]
pub struct Bootstrap {
    mesh: Arc<Mesh>,
    local_rank: usize,
    nranks_per_node: usize,
    collective_seq: tokio::sync::Mutex<u64>,
    poisoned: AtomicBool,
}

struct PoisonGuard<'a> {
    flag: &'a AtomicBool,
    armed: bool,
}

impl Drop for PoisonGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.flag.store(true, Ordering::Release);
        }
    }
}

/// Aborts the root that rank 0 hosts for the `"ip:port"` form if `init` fails.
struct HostedRoot(Option<tokio::task::JoinHandle<Result<(), BootstrapError>>>);

impl Drop for HostedRoot {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

impl Bootstrap {
    /// Joins the rendezvous as `rank` of `nranks` with the default [`BootstrapConfig`].
    ///
    /// # Cancel safety
    ///
    /// Cancelling drops every connection made so far; the other ranks' `init` then fails.
    pub async fn init(
        nranks: usize,
        rank: usize,
        root: impl Into<BootstrapRoot>,
    ) -> Result<Bootstrap, BootstrapError> {
        Self::init_with_config(nranks, rank, root, BootstrapConfig::default()).await
    }

    /// Joins the rendezvous as `rank` of `nranks`.
    ///
    /// A `rank >= nranks` still contacts the root, so that the whole job fails at once with
    /// the reason rather than timing out.
    ///
    /// # Cancel safety
    ///
    /// As for [`init`](Self::init).
    pub async fn init_with_config(
        nranks: usize,
        rank: usize,
        root: impl Into<BootstrapRoot>,
        config: BootstrapConfig,
    ) -> Result<Bootstrap, BootstrapError> {
        if nranks == 0 || nranks > MAX_NRANKS {
            return Err(BootstrapError::InvalidArgument(format!(
                "nranks = {nranks} is outside 1..={MAX_NRANKS}"
            )));
        }
        if rank > u32::MAX as usize {
            return Err(BootstrapError::InvalidArgument(format!(
                "rank {rank} is out of range for {nranks} ranks"
            )));
        }
        let root = root.into();
        // A unique id's root listens before the id exists: one that refuses connections for
        // a bootstrap timeout is gone. Rank 0 hosts an `ip:port` root, and may come late.
        let connect_wait = match root {
            BootstrapRoot::Id(_) => config.timeout.min(config.rendezvous_wait()),
            BootstrapRoot::Addr(_) => config.rendezvous_wait(),
        };
        let (id, join_secret, mut hosted) = match root {
            BootstrapRoot::Id(id) => (id, id.secret(), HostedRoot(None)),
            BootstrapRoot::Addr(addr) => {
                if addr.port() == 0 {
                    return Err(BootstrapError::InvalidArgument(format!(
                        "bootstrap root {addr}: port 0 names no port the other ranks could reach; give rank 0's real port (or use a unique id)"
                    )));
                }
                let id = config.address_id(addr);
                if rank == 0 {
                    // Rank 0 joins its own root with a secret no other process knows, so
                    // that nobody can take its place.
                    let rank0_secret: [u8; SECRET_BYTES] = rand::random();
                    let root = Root::bind_hosted(
                        id,
                        nranks,
                        rank0_secret,
                        config.effective_job_id(),
                        config.clone(),
                    )?;
                    (id, rank0_secret, HostedRoot(Some(tokio::spawn(root.run()))))
                } else {
                    (id, id.secret(), HostedRoot(None))
                }
            }
        };
        let (listener, peers) =
            rendezvous(nranks, rank, &id, join_secret, &config, connect_wait).await?;
        // The root has sent every welcome before ours completes... except those after ours:
        // let it finish on its own.
        if let Some(task) = hosted.0.take() {
            drop(task);
        }
        let host_id = &peers[rank].host_id;
        let local_rank = peers[..rank]
            .iter()
            .filter(|p| &p.host_id == host_id)
            .count();
        let nranks_per_node = peers.iter().filter(|p| &p.host_id == host_id).count();
        let mesh = Mesh::new(rank, id, peers, config);
        mesh.start(listener);
        let bootstrap = Bootstrap {
            mesh,
            local_rank,
            nranks_per_node,
            collective_seq: tokio::sync::Mutex::new(0),
            poisoned: AtomicBool::new(false),
        };
        if let Err(e) = bootstrap.mesh.connect_ring().await {
            // Politely, with the goodbyes written (a drop would only queue them): the ranks
            // it has connections with then learn that it closed, and what it knew of the
            // rank that closed first, rather than seeing it die.
            bootstrap.mesh.close().await;
            return Err(e);
        }
        Ok(bootstrap)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.mesh.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.mesh.nranks
    }

    /// Rank among the ranks of this node (same host id), counted in rank order.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Number of ranks on this rank's node.
    pub fn nranks_per_node(&self) -> usize {
        self.nranks_per_node
    }

    /// Host id of `rank` (ranks with equal host ids share a node), `None` if out of range.
    pub fn host_id(&self, rank: usize) -> Option<&str> {
        self.mesh.peers.get(rank).map(|p| p.host_id.as_str())
    }

    /// The process id `rank` reported at the rendezvous (on its host; `None` out of range).
    pub fn pid(&self, rank: usize) -> Option<u32> {
        self.mesh.peers.get(rank).map(|p| p.pid)
    }

    /// Makes this rank say, when its bootstrap closes, that it closes because of `why`: its
    /// own error (a set-up that failed on it), which the other ranks then show in the errors
    /// that name it ([`BootstrapError::PeerClosed`]'s `said`), instead of only "closed its
    /// bootstrap". The first reason set is kept; at most
    /// [`MAX_CLOSED_WHY_LEN`](wire::MAX_CLOSED_WHY_LEN) bytes are sent. Ignored once another
    /// rank is known lost, or closed before completing the bootstrap collectives this rank
    /// has: this rank's failure then most likely follows from that rank's, whose own word
    /// (or loss) the others are told of, and a second reason would only repeat it.
    /// [`Collectives::new`](crate::collectives::Collectives::new) and
    /// [`Communicator::from_bootstrap`](crate::communicator::Communicator::from_bootstrap)
    /// set it when they fail on this rank by themselves.
    pub fn set_leaving_why(&self, why: &str) {
        self.mesh.set_leaving_why(why);
    }

    /// Why `rank` closed its bootstrap, as it said ([`set_leaving_why`](Self::set_leaving_why)),
    /// once that reached this rank; `None` otherwise and out of range.
    pub fn closed_why(&self, rank: usize) -> Option<String> {
        self.mesh.closed_why(rank)
    }

    /// `rank`'s process id if this process can look at that process: same machine, same
    /// process id namespace (whatever the host ids say), another process. `None` otherwise,
    /// out of range, or where the process space is unknown.
    pub fn local_pid(&self, rank: usize) -> Option<u32> {
        self.mesh.local_pid(rank)
    }

    /// The ranks still alive to the bootstrap whose processes this rank can look at
    /// ([`local_pid`](Self::local_pid)) and that are not making progress now, as `/proc`
    /// shows them: stopped by a signal or a debugger, in an uninterruptible kernel wait at
    /// this moment, or ended. What a wait that timed out names beside the rank it waited for
    /// ([`StuckProcess`]).
    pub fn stuck_ranks(&self) -> Vec<StuckProcess> {
        self.mesh.stuck_ranks()
    }

    /// Whether `rank` is known to be lost: its connection ended without a goodbye (the
    /// process probably died), or another rank said so.
    pub fn was_lost(&self, rank: usize) -> bool {
        self.mesh.was_lost(rank)
    }

    /// What `rank` said it gave up waiting for, if its wait for some rank timed out: the
    /// latest such report it sent ([`wire::Message::PeerStalled`]), naming the rank it gave
    /// up on (the root cause as far as it knew) and the operation. `None` while it sent none,
    /// for a report about this rank (ignored), and out of range.
    pub fn stall_reported_by(&self, rank: usize) -> Option<GaveUp> {
        self.mesh.stall_reported_by(rank)
    }

    /// Tells the ranks this one has connections with that it gave up waiting for `rank` in
    /// `op`, a wait outside the bootstrap (a collective's device timeout, say) that began at
    /// `began`, as a bootstrap wait that times out does: a rank whose wait for this one
    /// times out then names the root cause behind it ([`stall_behind`](Self::stall_behind)).
    /// Nothing for this rank, out of range, or once closing.
    pub fn report_stall(&self, rank: usize, op: &str, began: std::time::Instant) {
        self.mesh
            .report_stall(rank, op, tokio::time::Instant::from_std(began));
    }

    /// The root cause behind `rank`, if `rank` reported giving up waiting for some rank at
    /// or after `since`: that rank, or the rank it reported, and so on along the chain of
    /// reports (a rank seen twice ends it), with the operation of the last report.
    pub fn stall_behind(&self, rank: usize, since: std::time::Instant) -> Option<GaveUp> {
        self.mesh
            .stall_behind(rank, Some(tokio::time::Instant::from_std(since)))
    }

    /// Address this rank accepts peer connections on.
    pub fn listen_addr(&self) -> SocketAddr {
        self.mesh.peers[self.mesh.rank].addr
    }

    /// The configuration in force.
    pub fn config(&self) -> &BootstrapConfig {
        &self.mesh.config
    }

    /// Whether `rank` has left: it closed its bootstrap politely (a goodbye, e.g. its
    /// communicator was dropped or destroyed), as opposed to being lost.
    pub fn has_left(&self, rank: usize) -> bool {
        self.mesh.has_left(rank)
    }

    /// The number of calls `rank` said, in its goodbye, its collectives had made (all
    /// finished) when it left; `None` while it has not left or when it named none.
    pub fn left_after(&self, rank: usize) -> Option<u64> {
        self.mesh.left_after(rank)
    }

    /// Makes this rank's goodbye name `calls`: the calls its collectives made, all of them
    /// finished (`Collectives` sets it when dropped). Peers compare it with their own calls
    /// ([`on_peer_left`](Self::on_peer_left)): a call beyond it can never complete.
    pub fn set_calls_at_close(&self, calls: u64) {
        self.mesh.set_calls_at_close(calls);
    }

    /// Calls `hook(rank, calls)` from the bootstrap's tasks as soon as `rank` leaves (says
    /// goodbye), with the calls its goodbye named ([`set_calls_at_close`](Self::set_calls_at_close)),
    /// once per rank, and at once for ranks that already left. The hook must be quick and
    /// must not block.
    pub fn on_peer_left(&self, hook: impl Fn(usize, Option<u64>) + Send + Sync + 'static) {
        self.mesh
            .on_peer_left(mesh::LeaveHook(Arc::new(move |rank, calls, _| {
                hook(rank, calls)
            })));
    }

    /// Makes this rank's goodbye say that all of its work had ended (its kernels and its
    /// proxy's transfers), so that everything it sent had landed: peers then know that a
    /// wait for it still unanswered will never be answered
    /// ([`on_peer_departed`](Self::on_peer_departed)). `Communicator` sets it when dropped,
    /// once its work ended. ([`set_calls_at_close`](Self::set_calls_at_close) says it too.)
    pub fn set_work_ended_at_close(&self) {
        self.mesh.set_work_ended_at_close();
    }

    /// Calls `hook(rank, work_ended)` from the bootstrap's tasks as soon as `rank` leaves
    /// (says goodbye), with whether its goodbye said that all of its work had ended
    /// ([`set_work_ended_at_close`](Self::set_work_ended_at_close)), once per rank, and at
    /// once for ranks that already left. The hook must be quick and must not block.
    pub fn on_peer_departed(&self, hook: impl Fn(usize, bool) + Send + Sync + 'static) {
        self.mesh
            .on_peer_left(mesh::LeaveHook(Arc::new(move |rank, _, idle| {
                hook(rank, idle)
            })));
    }

    /// Calls `hook(rank, detail)` from the bootstrap's tasks as soon as this rank learns
    /// that `rank` is lost (its connection ended without a goodbye, or another rank says
    /// so), once per lost rank, and at once for ranks already lost. The hook must be quick
    /// and must not block (it runs on the runtime's threads): e.g. raise a flag.
    pub fn on_peer_lost(&self, hook: impl Fn(usize, &str) + Send + Sync + 'static) {
        self.mesh.on_peer_lost(mesh::LossHook(Arc::new(hook)));
    }

    /// Why a wait for `peer` outside the bootstrap (a transport's sockets during connection
    /// setup) cannot end well, if it cannot: `peer` closed its bootstrap or was lost, or
    /// another rank was lost (the first one known), as the error of `op`. Such waits look at
    /// it between their polls instead of running to their own timeout.
    pub(crate) fn wait_is_hopeless(&self, peer: usize, op: Op) -> Option<BootstrapError> {
        self.mesh.hopeless(peer, op)
    }

    fn check_peer(&self, peer: usize, op: Op) -> Result<(), BootstrapError> {
        if peer >= self.nranks() {
            return Err(BootstrapError::InvalidArgument(format!(
                "rank {}: {op}: peer {peer} is out of range for {} ranks",
                self.rank(),
                self.nranks()
            )));
        }
        Ok(())
    }

    async fn collective<'a, T, Fut>(
        &'a self,
        op: Op,
        body: impl FnOnce(u64) -> Fut,
    ) -> Result<T, BootstrapError>
    where
        Fut: Future<Output = Result<T, BootstrapError>> + 'a,
    {
        let mut seq = self.collective_seq.lock().await;
        if self.poisoned.load(Ordering::Acquire) {
            return Err(BootstrapError::Poisoned { rank: self.rank() });
        }
        let this = *seq;
        *seq += 1;
        let mut guard = PoisonGuard {
            flag: &self.poisoned,
            armed: true,
        };
        let result = body(this).await;
        guard.armed = false;
        if result.is_ok() {
            self.mesh.set_collectives_done(this + 1);
        }
        match result {
            // A rank that closed without completing this collective (the first known: the
            // waits name it, from its goodbye or from news that the ranks it failed passed
            // on) started it, unless a rank was lost: a rank that leaves passes on what it
            // knew of losses before its goodbye, so that news is here already. No grace:
            // along a ring, each rank that waited one out passed the failure on half a
            // second later.
            Err(e @ BootstrapError::PeerClosed { .. }) => match self.mesh.first_lost() {
                Some((lost, detail)) => Err(BootstrapError::PeerLost {
                    rank: self.rank(),
                    op,
                    peer: lost,
                    detail,
                }),
                None => Err(e),
            },
            // A peer that left or refused mid-collective most likely left because some rank
            // died; give the news a moment to arrive and blame the root cause.
            Err(e) if !matches!(e, BootstrapError::PeerLost { .. }) => {
                match self.mesh.wait_for_loss(LOSS_NEWS_GRACE).await {
                    Some((peer, detail)) => Err(BootstrapError::PeerLost {
                        rank: self.rank(),
                        op,
                        peer,
                        detail,
                    }),
                    None => Err(e),
                }
            }
            other => other,
        }
    }

    /// Gathers every rank's `data`; element `r` of the result is rank `r`'s. Contributions
    /// may differ in length. Runs a ring (n - 1 steps, each rank forwarding one block).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelling midway leaves the ranks out of step, so the bootstrap is
    /// then poisoned and every later collective fails with [`BootstrapError::Poisoned`].
    pub async fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        self.all_gather_within(data, self.mesh.config.timeout).await
    }

    /// [`all_gather`](Self::all_gather), each wait bounded by `wait` instead of the
    /// configured timeout: for ranks that may arrive far apart (see
    /// [`barrier_within`](Self::barrier_within)).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe; see [`all_gather`](Self::all_gather).
    pub async fn all_gather_within(
        &self,
        data: &[u8],
        wait: Duration,
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        self.collective(Op::AllGather, |seq| self.all_gather_ring(seq, data, wait))
            .await
    }

    async fn all_gather_ring(
        &self,
        seq: u64,
        data: &[u8],
        wait: Duration,
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let (n, rank) = (self.nranks(), self.rank());
        let op = Op::AllGather;
        let mut blocks = vec![Bytes::new(); n];
        blocks[rank] = Bytes::copy_from_slice(data);
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        for step in 0..n.saturating_sub(1) {
            let channel = Channel::Collective {
                seq,
                step: step as u32,
            };
            let outgoing = blocks[(rank + n - step) % n].clone();
            self.mesh
                .post_data(next, channel, outgoing, op.clone())
                .await?;
            let incoming = self
                .mesh
                .wait_message_within(prev, channel, op.clone(), true, wait)
                .await?;
            blocks[(rank + n - step - 1) % n] = Bytes::from(incoming);
        }
        Ok(blocks.into_iter().map(Vec::from).collect())
    }

    /// Waits until every rank has entered the barrier (dissemination: log2(n) rounds).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe; see [`all_gather`](Self::all_gather).
    pub async fn barrier(&self) -> Result<(), BootstrapError> {
        self.barrier_within(self.mesh.config.timeout).await
    }

    /// [`barrier`](Self::barrier), each wait bounded by `wait` instead of the configured
    /// timeout: for ranks that may arrive far apart (teardown at the end of a program, where
    /// one rank first saves a checkpoint). A lost or departed rank still fails it at once.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe; see [`all_gather`](Self::all_gather).
    pub async fn barrier_within(&self, wait: Duration) -> Result<(), BootstrapError> {
        self.collective(Op::Barrier, |seq| self.dissemination_barrier(seq, wait))
            .await
    }

    async fn dissemination_barrier(&self, seq: u64, wait: Duration) -> Result<(), BootstrapError> {
        let (n, rank) = (self.nranks(), self.rank());
        let mut distance = 1;
        let mut round = 0u32;
        while distance < n {
            let channel = Channel::Collective { seq, step: round };
            self.mesh
                .post_data((rank + distance) % n, channel, Bytes::new(), Op::Barrier)
                .await?;
            self.mesh
                .wait_message_within((rank + n - distance) % n, channel, Op::Barrier, true, wait)
                .await?;
            distance *= 2;
            round += 1;
        }
        Ok(())
    }

    /// Sends `data` from `root` to every rank and returns it (on `root` too). `data` is
    /// read on `root` only. Runs a binomial tree.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe; see [`all_gather`](Self::all_gather).
    pub async fn broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        self.check_peer(root, Op::Broadcast)?;
        self.collective(Op::Broadcast, |seq| {
            self.binomial_broadcast(seq, root, data)
        })
        .await
    }

    async fn binomial_broadcast(
        &self,
        seq: u64,
        root: usize,
        data: &[u8],
    ) -> Result<Vec<u8>, BootstrapError> {
        let (n, rank) = (self.nranks(), self.rank());
        let op = Op::Broadcast;
        let channel = Channel::Collective { seq, step: 0 };
        let relative = (rank + n - root) % n;
        let mut block = if relative == 0 {
            Bytes::copy_from_slice(data)
        } else {
            Bytes::new()
        };
        let mut mask = 1;
        while mask < n {
            if relative & mask != 0 {
                let parent = (relative - mask + root) % n;
                block = Bytes::from(
                    self.mesh
                        .wait_message(parent, channel, op.clone(), true)
                        .await?,
                );
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if relative + mask < n {
                let child = (relative + mask + root) % n;
                self.mesh
                    .post_data(child, channel, block.clone(), op.clone())
                    .await?;
            }
            mask >>= 1;
        }
        Ok(Vec::from(block))
    }

    /// Sends `data` to `peer` under `tag`; returns once it is written to the socket.
    /// Messages to one peer with one tag arrive in order.
    ///
    /// # Cancel safety
    ///
    /// Once this has queued the message (which happens on its first poll if the connection
    /// exists), cancelling does not take it back: it is delivered whole, or the connection
    /// fails. Cancelled before that, nothing is sent.
    pub async fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<(), BootstrapError> {
        self.send_as(peer, tag, data, Op::Send(tag)).await
    }

    /// [`send`](Self::send) under a name: errors say "sending {what}" instead of showing the
    /// tag (for callers whose tags are internal encodings). `recv` or
    /// [`recv_named`](Self::recv_named) receives it; the name does not travel.
    ///
    /// # Cancel safety
    ///
    /// As for [`send`](Self::send).
    pub async fn send_named(
        &self,
        peer: usize,
        tag: u64,
        what: &str,
        data: &[u8],
    ) -> Result<(), BootstrapError> {
        self.send_as(peer, tag, data, Op::SendNamed(what.into()))
            .await
    }

    async fn send_as(
        &self,
        peer: usize,
        tag: u64,
        data: &[u8],
        op: Op,
    ) -> Result<(), BootstrapError> {
        self.check_peer(peer, op.clone())?;
        let r = self
            .mesh
            .send_data(peer, Channel::User(tag), Bytes::copy_from_slice(data), op)
            .await;
        self.blame_loss(r)
    }

    /// A point-to-point failure because the peer closed its bootstrap, as the loss of the
    /// first rank known lost where there is one: a rank that leaves while others still
    /// expect it most likely left because a rank died (as in a setup round), and a rank
    /// that leaves passes on the losses it knew before its goodbye, so that news is here.
    fn blame_loss<T>(&self, r: Result<T, BootstrapError>) -> Result<T, BootstrapError> {
        match r {
            Err(BootstrapError::PeerClosed {
                rank,
                op,
                peer,
                gave_up,
                said,
            }) => match self.mesh.first_lost() {
                Some((lost, detail)) => Err(BootstrapError::PeerLost {
                    rank,
                    op,
                    peer: lost,
                    detail: format!(
                        "{detail}; rank {peer}, which this waited for, has closed its \
                         bootstrap since"
                    ),
                }),
                None => Err(BootstrapError::PeerClosed {
                    rank,
                    op,
                    peer,
                    gave_up,
                    said,
                }),
            },
            other => other,
        }
    }

    /// Receives the next message `peer` sent under `tag`. Messages under other tags that
    /// arrive first are kept for their own `recv`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message is taken only by the `recv` that returns it.
    pub async fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>, BootstrapError> {
        self.recv_as(peer, tag, Op::Recv(tag), self.mesh.config.timeout)
            .await
    }

    /// [`recv`](Self::recv) bounded by `wait` instead of the configured timeout: for a
    /// sender that may come far later (see [`barrier_within`](Self::barrier_within)).
    ///
    /// # Cancel safety
    ///
    /// As for [`recv`](Self::recv).
    pub async fn recv_within(
        &self,
        peer: usize,
        tag: u64,
        wait: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        self.recv_as(peer, tag, Op::Recv(tag), wait).await
    }

    /// [`recv`](Self::recv) under a name: errors say "receiving {what}" instead of showing
    /// the tag.
    ///
    /// # Cancel safety
    ///
    /// As for [`recv`](Self::recv).
    pub async fn recv_named(
        &self,
        peer: usize,
        tag: u64,
        what: &str,
    ) -> Result<Vec<u8>, BootstrapError> {
        self.recv_as(
            peer,
            tag,
            Op::RecvNamed(what.into()),
            self.mesh.config.timeout,
        )
        .await
    }

    async fn recv_as(
        &self,
        peer: usize,
        tag: u64,
        op: Op,
        wait: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        self.check_peer(peer, op.clone())?;
        let r = self
            .mesh
            .wait_message_within(peer, Channel::User(tag), op, false, wait)
            .await;
        self.blame_loss(r)
    }

    /// Closes the bootstrap, telling every connected peer (a goodbye), and waits (at most
    /// about a second) for that to be written.
    ///
    /// # Cancel safety
    ///
    /// Cancelling skips waiting; the goodbyes are still queued.
    pub async fn close(self) {
        self.mesh.close().await;
    }

    /// Drops every connection at once without a goodbye, as if the process had died: peers
    /// see this rank as lost. For fault-injection tests.
    pub fn abandon(self) {
        self.mesh.begin_close(false);
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.mesh.begin_close(true);
    }
}

#[cfg(test)]
mod tests;
