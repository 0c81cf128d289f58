//! Why a call failed: reading the fault record the kernels and the host share, and naming
//! the cause (a mismatch, a stalled or departed peer, a timeout, an abort) in the error.

use super::Collectives;
use super::cross;
use super::cross::{WORK_QUEUES_ENV, is_cross, two_shot_code, work_queue_hint};
use super::descriptor::{describe, describe_pair};
use crate::communicator::{Backend, CommError, FaultRecord};
use mscclpp_device::collectives::{desc, fault};

impl Collectives {
    /// After a device wait for `peer` timed out in `what`: tells the other ranks through the
    /// bootstrap that this rank gave up on `peer` ([`Bootstrap::report_stall`]), so that a
    /// rank stuck behind this one names the root cause, and waits up to
    /// [`STALL_NEWS_GRACE`] for `peer`'s own report: when `peer` had itself given up on
    /// another rank (it waited, alive, for a stalled one), returns what it said (see
    /// [`stall_texts`](Self::stall_texts)). Once per `Collectives` (the first timeout;
    /// calls queued behind it repeat it for the same peer).
    fn stall_behind(&self, peer: usize, what: &str) -> Option<crate::bootstrap::GaveUp> {
        let mut noted = self.stall_noted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, behind)) = noted.as_ref() {
            return behind.clone().filter(|_| *p == peer);
        }
        let bs = self.comm.bootstrap().as_async();
        let now = std::time::Instant::now();
        // The wait began about a device timeout ago; a report older than that is about
        // something else.
        let began = now
            .checked_sub(self.comm.device_timeout() + std::time::Duration::from_secs(1))
            .unwrap_or(now);
        bs.report_stall(peer, what, began);
        let behind = loop {
            if let Some(g) = bs.stall_behind(peer, began) {
                break Some(g);
            }
            if now.elapsed() >= STALL_NEWS_GRACE {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        *noted = Some((peer, behind.clone()));
        behind
    }

    /// [`stall_texts`](Self::stall_texts)'s second note alone (a timeout whose rank is not
    /// known).
    pub(super) fn stuck_note(&self) -> String {
        crate::bootstrap::stuck_note(&self.comm.bootstrap().as_async().stuck_ranks())
    }

    /// The two notes of a device timeout for `peer` in `what`, from one look at this
    /// machine's processes (so that they agree): `, which had given up, stuck behind rank R
    /// (...)` when `peer` had given up on another rank ([`stall_behind`](Self::stall_behind);
    /// with what was seen of R on its machine, unless this rank sees R itself), and `; on
    /// this machine, rank R (pid P) is stopped by a signal ...` for the ranks whose processes
    /// this rank can look at and that are not making progress now
    /// ([`Bootstrap::stuck_ranks`](crate::bootstrap::Bootstrap::stuck_ranks)): most likely
    /// why the wait timed out, whichever rank it waited for.
    pub(super) fn stall_texts(&self, peer: usize, what: &str) -> (String, String) {
        let behind = self.stall_behind(peer, what);
        let stuck = self.comm.bootstrap().as_async().stuck_ranks();
        (
            crate::bootstrap::gave_up_note(behind.as_ref(), &stuck),
            crate::bootstrap::stuck_note(&stuck),
        )
    }

    /// `" (rank R had left: it closed its communicator)"` when `rank` said goodbye to the
    /// bootstrap (a wait for it can then never end: the usual cause is a rank that called
    /// fewer collectives than the others), else nothing.
    pub(super) fn left_note(&self, rank: usize) -> String {
        if self.comm.bootstrap().as_async().has_left(rank) {
            format!(" (rank {rank} had left: it closed its communicator)")
        } else {
            String::new()
        }
    }
}

/// Whether `e` comes from another rank (lost, closed, stalled, refusing, a socket to it
/// failing, or an abort), not from this rank's own set-up: such a failure is not this
/// rank's to explain.
pub(super) fn caused_by_another_rank(e: &CommError) -> bool {
    matches!(
        e,
        CommError::Aborted(_)
            | CommError::Timeout(_)
            | CommError::Bootstrap(
                crate::bootstrap::BootstrapError::PeerLost { .. }
                    | crate::bootstrap::BootstrapError::PeerClosed { .. }
                    | crate::bootstrap::BootstrapError::Timeout { .. }
                    | crate::bootstrap::BootstrapError::Poisoned { .. }
                    | crate::bootstrap::BootstrapError::RefusedByPeer { .. }
                    | crate::bootstrap::BootstrapError::Protocol(_)
                    | crate::bootstrap::BootstrapError::Io { .. }
            )
    )
}

/// How long a collective's timeout error waits for the report of the rank it waited for
/// ([`Collectives::stall_note`]): the waits along a chain time out at about the same time,
/// but not exactly (a wait's clock restarts when data arrives; seen 0.5 s apart on the Host
/// transport), and the error comes this much later once, at the end of a device timeout.
const STALL_NEWS_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

impl Collectives {
    /// Remembers a lost context so that every later call says so.
    pub(super) fn note_lost(&self, e: &CommError) {
        if let CommError::ContextLost(m) = e {
            let mut l = self.context_lost.lock().unwrap_or_else(|e| e.into_inner());
            l.get_or_insert_with(|| m.clone());
        }
    }

    pub(super) fn noted<T>(&self, r: Result<T, CommError>) -> Result<T, CommError> {
        if let Err(e) = &r {
            self.note_lost(e);
        }
        r
    }

    /// The pending error of the collectives, for call `call`: a lost context, an abort,
    /// then a kernel's record (a mismatch record, with `mismatch` only, is cleared once
    /// returned; without, it is left for `async_error`).
    pub(super) fn check_fault(&self, call: &str, mismatch: bool) -> Result<(), CommError> {
        if let Some(m) = self
            .context_lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            return Err(CommError::ContextLost(format!("{call}: {m}")));
        }
        let area = self.comm.fault_area();
        if let Some(reason) = area.abort_reason() {
            return Err(CommError::Aborted(format!(
                "{call}: rank {}: {reason}; the collectives cannot be used any more",
                self.rank()
            )));
        }
        // A cross-host step's record is never cleared (the partners' rounds may no longer
        // pair): every later call returns it.
        let Some(rec) = area
            .record()
            .filter(|r| mismatch || r.kind != fault::MISMATCH || cross::is_cross(r.place))
        else {
            return match self.cross() {
                Some(_) => self.cross_fault(call),
                None => Ok(()),
            };
        };
        if cross::is_cross(rec.place) {
            return Err(self.cross_error(call, &rec));
        }
        let e = self.fault_error(call, &rec);
        if rec.kind == fault::MISMATCH {
            area.clear_record();
        }
        Err(e)
    }

    /// The error a kernel's record stands for.
    // Long (~150 lines): one match over the record's kinds (mismatch, timeout with its
    // place, abort, departure), each naming its cause; kept together so that every kind's
    // text is read side by side.
    fn fault_error(&self, call: &str, rec: &FaultRecord) -> CommError {
        let me = self.rank();
        // Across hosts the kernels inside a host name their peer by local index.
        let rec = &match self.cross() {
            Some(c) if !matches!(rec.place, fault::AT_REMOTE_P2P | fault::AT_REMOTE_P2P_GONE) => {
                FaultRecord {
                    peer: c.topo.group().get(rec.peer).copied().unwrap_or(rec.peer),
                    ..*rec
                }
            }
            _ => *rec,
        };
        match rec.kind {
            fault::MISMATCH if desc::field(rec.own[1], desc::KIND_SHIFT) == desc::SEND_RECV => {
                CommError::CallMismatch(format!("{call}: {}", p2p_mismatch(me, rec)))
            }
            // This rank's own round across hosts failed earlier (its record says why).
            fault::MISMATCH if rec.own[1] == desc::BROKEN => {
                self.cross_fault(call).err().unwrap_or_else(|| {
                    CommError::State(format!(
                        "{call}: rank {me}: a round across hosts failed earlier; the \
                         collectives cannot be used any more"
                    ))
                })
            }
            fault::MISMATCH if rec.theirs[1] == desc::BROKEN => CommError::State(format!(
                "{call}: rank {} of this host could not take part in collective #{}: a round \
                 across hosts failed on it earlier (it reports why), so the call failed on \
                 rank {me} too (its output is undefined); the collectives cannot be used any \
                 more",
                rec.peer,
                rec.seq + 1,
            )),
            fault::MISMATCH => {
                let (own, theirs) = describe_pair(rec.own, rec.theirs);
                CommError::CallMismatch(format!(
                    "{call}: the ranks called collective #{} differently: rank {me} called \
                     {own}, rank {} {theirs}; every rank reports this error and the call did \
                     nothing (its output is undefined); the collectives stay usable",
                    rec.seq + 1,
                    rec.peer,
                ))
            }
            fault::TIMEOUT => {
                let on_gpu = matches!(self.comm.backend(), Backend::Gpu(_));
                let queues = proxy_wait_hint(rec.place, on_gpu, || {
                    std::env::var(cross::WORK_QUEUES_ENV).ok()
                })
                .map_or(String::new(), |hint| format!("; {hint}"));
                // Across hosts a local step's peer is an index in the host's group.
                let what = format!("collective #{} ({})", rec.seq + 1, describe(rec.own));
                let (left, (behind, stuck)) = match self.cross() {
                    None => (self.left_note(rec.peer), self.stall_texts(rec.peer, &what)),
                    Some(c) => match c.topo.hosts[c.topo.host].get(rec.peer) {
                        Some(&rank) => (String::new(), self.stall_texts(rank, &what)),
                        None => (String::new(), (String::new(), self.stuck_note())),
                    },
                };
                CommError::Timeout(format!(
                    "{call}: rank {me} waited {:?} for rank {} ({}){behind} in collective #{} \
                     ({}) and gave up: that rank did not take part, or is \
                     stuck{left}{queues}{stuck}; the collectives cannot be used any more",
                    self.comm.device_timeout(),
                    rec.peer,
                    place_name(rec.place),
                    rec.seq + 1,
                    describe(rec.own)
                ))
            }
            fault::ABORTED if rec.place == fault::AT_P2P_COLLECTIVE => {
                let (own, theirs) = (describe(rec.own), describe(rec.theirs));
                let what = if desc::field(rec.own[1], desc::KIND_SHIFT) == desc::SEND_RECV {
                    format!(
                        "send/recv launch #{} ({own}) cannot complete: rank {} called a \
                         collective ({theirs}) instead of the matching send or receive",
                        rec.seq + 1,
                        rec.peer,
                    )
                } else {
                    format!(
                        "collective #{} ({own}) cannot complete: rank {} waits in {theirs} \
                         for a send or receive that no rank makes before this collective",
                        rec.seq + 1,
                        rec.peer,
                    )
                };
                CommError::State(format!(
                    "{call}: rank {me}: {what} (each rank's calls run in order, so neither can \
                     go on; the usual cause: the ranks called sends, receives and collectives \
                     in different orders); the collectives cannot be used any more"
                ))
            }
            fault::ABORTED
                if rec.place == fault::AT_LEFT
                    && desc::field(rec.own[1], desc::KIND_SHIFT) == desc::SEND_RECV =>
            {
                CommError::Aborted(format!(
                    "{call}: rank {me}: send/recv launch #{} ({}) cannot complete: rank {} left \
                     (it closed its communicator, its work done) without the matching send or \
                     receive (the usual cause: that rank posted fewer sends or receives to \
                     this one, or returned early on an error of its own); the collectives \
                     cannot be used any more",
                    rec.seq + 1,
                    describe(rec.own),
                    rec.peer,
                ))
            }
            fault::ABORTED if rec.place == fault::AT_REMOTE_P2P_GONE => {
                let proxy = self
                    .comm
                    .proxy_error()
                    .map_or(String::new(), |e| format!(" (the proxy reported: {e})"));
                let how = if self.comm.bootstrap().as_async().has_left(rec.peer) {
                    "left (it closed its communicator)"
                } else {
                    "lost its connection to this rank"
                };
                CommError::Aborted(format!(
                    "{call}: rank {me}: send/recv launch #{} ({}) cannot complete: rank {}, on \
                     another host, {how} before the matching send or receive completed \
                     (its connections to this rank ended: TCP streams closed, or over IB its \
                     goodbye){proxy}; the collectives cannot be used any more",
                    rec.seq + 1,
                    describe(rec.own),
                    rec.peer,
                ))
            }
            fault::ABORTED if rec.place == fault::AT_LEFT => {
                let (who, calls) = self.comm.fault_area().left().unwrap_or((rec.peer, rec.seq));
                CommError::Aborted(format!(
                    "{call}: rank {me}: collective #{} ({}) cannot complete: rank {who} left \
                     (it closed its communicator) after {calls} collective call{}, so it \
                     never makes this one (the usual cause: that rank made fewer calls, or \
                     returned early on an error of its own); the collectives cannot be used \
                     any more",
                    rec.seq + 1,
                    describe(rec.own),
                    if calls == 1 { "" } else { "s" },
                ))
            }
            _ => CommError::Aborted(format!(
                "{call}: rank {me}: collective #{} ({}) was aborted while waiting for rank {} \
                 ({}); the collectives cannot be used any more",
                rec.seq + 1,
                describe(rec.own),
                rec.peer,
                place_name(rec.place)
            )),
        }
    }
}

/// A send and a receive of different sizes, as rank `me` recorded it: "rank 1 sent 4000
/// bytes to rank 0, which expected 6000", then what it means on this side.
fn p2p_mismatch(me: usize, rec: &FaultRecord) -> String {
    use mscclpp_device::collectives::send_recv::P2P_XFER_SHIFT;
    let (own, theirs, peer) = (rec.own[0], rec.theirs[0], rec.peer);
    let sent = desc::field(rec.own[1], desc::ALGO_SHIFT) == 1;
    let xfer = (rec.own[1] >> P2P_XFER_SHIFT) & 0xff_ffff;
    let (from, to, sent_n, want_n) = if sent {
        (me, peer, own, theirs)
    } else {
        (peer, me, theirs, own)
    };
    let what = format!(
        "rank {from} sent {sent_n} bytes to rank {to}, which expected {want_n} (transfer #{} \
         from rank {from} to rank {to}, counted modulo 2^24)",
        xfer + 1
    );
    let here = if rec.place == fault::AT_P2P_EARLIER {
        format!(
            "; rank {me} learnt it from a note of rank {to}, at the end of that send or of its \
             next send to rank {to} (an LL send, at most p2p_packet_max_bytes, does not wait \
             for its receiver); this call's other transfers completed"
        )
    } else if sent {
        "; nothing was sent".to_string()
    } else {
        "; the receive buffer is undefined".to_string()
    };
    format!("{what}{here}; sends and receives between the two ranks stay usable")
}

/// What a failed wait waited for.
fn place_name(place: u64) -> &'static str {
    match place {
        fault::AT_P2P | fault::AT_P2P_EARLIER => "its matching send or receive",
        fault::AT_REMOTE_P2P | fault::AT_REMOTE_P2P_GONE => {
            "its matching send or receive, across hosts"
        }
        fault::AT_SEMAPHORE => "a semaphore signal",
        fault::AT_PACKET => "data packets",
        fault::AT_DESCRIPTOR => "its call descriptor",
        fault::AT_PROXY => "a proxy-channel signal",
        fault::AT_PROXY_QUEUE => "its proxy: a queued put or the final flush",
        fault::AT_PROXY_FLUSH => {
            "its proxy, which refused or failed a put of the call (see Communicator::proxy_errors)"
        }
        _ => "a signal",
    }
}

/// What a timeout at `place` should add about `CUDA_DEVICE_MAX_CONNECTIONS` (read by
/// `queues` only when it matters): on a GPU backend a proxy-channel wait ([`fault::AT_PROXY`],
/// [`fault::AT_PROXY_QUEUE`]) waits for copies the proxy queued on a stream of its own, which
/// with too few hardware work queues can sit behind the waiting kernel (see
/// `cross::work_queue_hint`).
pub(super) fn proxy_wait_hint(
    place: u64,
    on_gpu: bool,
    queues: impl FnOnce() -> Option<String>,
) -> Option<String> {
    if on_gpu && matches!(place, fault::AT_PROXY | fault::AT_PROXY_QUEUE) {
        cross::work_queue_hint(queues().as_deref())
    } else {
        None
    }
}

impl Collectives {
    /// A cross-host failure recorded in the fault area, as `call`'s error.
    pub(super) fn cross_fault(&self, call: &str) -> Result<(), CommError> {
        let area = self.comm.fault_area();
        if let Some(rec) = area.record().filter(|r| is_cross(r.place)) {
            return Err(self.cross_error(call, &rec));
        }
        if area.cross_broken() {
            return Err(CommError::State(format!(
                "{call}: rank {}: a round across hosts failed earlier (another failure holds \
                 the fault record); the collectives cannot be used any more",
                self.rank()
            )));
        }
        Ok(())
    }

    /// The communicator's abort reason, waiting up to
    /// [`LOSS_NEWS_GRACE`](crate::bootstrap::LOSS_NEWS_GRACE) for one: a
    /// partner whose TCP sockets ended has most likely died, and the bootstrap's news of it
    /// (which sets the abort) can trail the sockets' end on a loaded machine; `None` if no
    /// abort came (the partner left politely, or is gone for another reason).
    fn abort_reason_soon(&self) -> Option<crate::communicator::AbortReason> {
        let deadline = std::time::Instant::now() + crate::bootstrap::LOSS_NEWS_GRACE;
        loop {
            if let Some(r) = self.comm.abort_reason() {
                return Some(r);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The error a cross-host step's record stands for (never cleared: the partners' rounds
    /// may no longer pair).
    pub(super) fn cross_error(&self, call: &str, rec: &FaultRecord) -> CommError {
        let me = self.rank();
        let h = rec.peer;
        let (peer, host) = match self.cross() {
            Some(c) if h < c.hosts() => (
                c.topo.rank_at(h, c.topo.local).to_string(),
                c.topo.host_name(h),
            ),
            _ => ("?".into(), format!("host {h}")),
        };
        match rec.kind {
            _ if rec.place == fault::AT_CROSS_GONE
                && let Some(reason) = self.abort_reason_soon() =>
            {
                // The partner's sockets ended because it died: say so as the loss the
                // bootstrap reports (as every other wait of this rank does), not as a
                // departure.
                CommError::Aborted(format!(
                    "{call}: rank {me}: {reason} (while waiting for rank {peer} on {host}, \
                     across hosts); the collectives cannot be used any more"
                ))
            }
            _ if rec.place == fault::AT_CROSS_GONE => {
                let proxy = self
                    .comm
                    .proxy_error()
                    .map_or(String::new(), |e| format!(": {e}"));
                CommError::State(format!(
                    "{call}: rank {me} lost its connection across hosts to rank {peer} \
                     ({host}): that rank left or failed before its part of this call \
                     arrived{proxy}; the collectives cannot be used any more"
                ))
            }
            fault::MISMATCH if rec.place == fault::AT_CROSS_ROUND => CommError::State(format!(
                "{call}: the ranks called collectives differently across hosts: rank {peer} \
                 ({host}) is at its round {} across hosts where rank {me} is at {}; the \
                 collectives cannot be used any more",
                rec.theirs[0], rec.own[0]
            )),
            fault::MISMATCH => CommError::State(format!(
                "{call}: the ranks called collectives differently across hosts: rank {me} \
                 called {}, rank {peer} ({host}) {}; the collectives cannot be used any more",
                describe_cross(rec.own),
                describe_cross(rec.theirs)
            )),
            _ if rec.place == fault::AT_CROSS_REDUCE => CommError::Timeout(format!(
                "{call}: rank {me}: every partner's part of {} across hosts arrived, but this \
                 rank's own reducing blocks did not finish within {:?} (the GPU kept them \
                 from running: other work on it, or MPS limits); no other rank is at fault; \
                 the collectives cannot be used any more",
                describe_cross(rec.own),
                self.comm.device_timeout()
            )),
            fault::TIMEOUT => {
                let proxy = self
                    .comm
                    .proxy_error()
                    .map_or(String::new(), |e| format!(" (the proxy reported: {e})"));
                let queues = match self.comm.backend() {
                    Backend::Gpu(_) => {
                        work_queue_hint(std::env::var(WORK_QUEUES_ENV).ok().as_deref())
                    }
                    Backend::Host => None,
                }
                .map_or(String::new(), |hint| format!("; {hint}"));
                let (left, (behind, stuck)) = match self.cross() {
                    Some(c) if h < c.hosts() => {
                        let rank = c.topo.rank_at(h, c.topo.local);
                        let what = format!("{} across hosts", describe_cross(rec.own));
                        (self.left_note(rank), self.stall_texts(rank, &what))
                    }
                    _ => (String::new(), (String::new(), self.stuck_note())),
                };
                CommError::Timeout(format!(
                    "{call}: rank {me} waited {:?} for rank {peer} ({host}, across hosts){behind} \
                     in {} and gave up: that rank did not take part, or is \
                     stuck{left}{proxy}{queues}{stuck}; the collectives cannot be used any more",
                    self.comm.device_timeout(),
                    describe_cross(rec.own)
                ))
            }
            _ => {
                let reason = self
                    .comm
                    .abort_reason()
                    .map_or("the communicator was aborted".into(), |r| r.to_string());
                CommError::Aborted(format!(
                    "{call}: rank {me}: {reason} (while waiting for rank {peer} on {host}); \
                     the collectives cannot be used any more"
                ))
            }
        }
    }
}

/// A cross-host call descriptor in words (`super::descriptor::describe`, whose algorithm
/// names are the one-host kernels'; these calls carry none).
fn describe_cross(d: [u64; 2]) -> String {
    let [n, tag] = d;
    // The two-shot forms' descriptors hold what one-shot's hold: their algorithm code is
    // read here, and the rest as one-shot's.
    let kind = desc::field(tag, desc::KIND_SHIFT);
    let two_shot = matches!(kind, desc::ALL_REDUCE | desc::REDUCE | desc::BROADCAST)
        && desc::field(tag, desc::ALGO_SHIFT) == two_shot_code();
    let (tag, how) = if two_shot {
        (tag & !(0xff << desc::ALGO_SHIFT), "two-shot across hosts")
    } else {
        (tag, "across hosts")
    };
    let s = super::descriptor::describe([n, tag]);
    match s.strip_suffix(" (?)").or_else(|| s.strip_suffix(" (put)")) {
        Some(head) => format!("{head} ({how})"),
        None => s,
    }
}
