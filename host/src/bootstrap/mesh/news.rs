//! What a mesh learns of its peers: closures, losses and stalls, its own and those other
//! ranks report, spread to every rank and turned into errors that name the root cause.

use super::*;

impl Mesh {
    pub(super) fn mark_closed(&self, peer: usize, calls: Option<u64>, idle: bool) {
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
    pub(super) fn mark_lost(self: &Arc<Self>, peer: usize, detail: String) {
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
    pub(super) fn hooks_once_flushed(
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
    pub(super) fn spread_news(
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
    pub(super) fn note_reported_loss(self: &Arc<Self>, peer: usize, detail: &str, reporter: usize) {
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
    pub(super) fn note_reported_closure(&self, peer: usize, collectives: u64, why: &str) {
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
    pub(super) fn note_reported_stall(
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
    /// [`Bootstrap::local_pid`](super::super::Bootstrap::local_pid)).
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
    pub(super) fn seen_of(&self, rank: usize) -> Option<String> {
        self.stuck_process(rank).map(|s| s.to_string())
    }

    /// `rank` as a [`StuckProcess`], if it is alive to the bootstrap, this rank can look at
    /// its process, and that is not making progress.
    pub(super) fn stuck_process(&self, rank: usize) -> Option<StuckProcess> {
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

    /// See [`Bootstrap::stuck_ranks`](super::super::Bootstrap::stuck_ranks).
    pub(crate) fn stuck_ranks(&self) -> Vec<StuckProcess> {
        // A rank that closed or was lost is named as such by the waits; its process may
        // have ended on purpose, and its pid may since be another process's.
        (0..self.nranks)
            .filter_map(|rank| self.stuck_process(rank))
            .collect()
    }

    pub(super) fn is_alive(&self, peer: usize) -> bool {
        matches!(lock(&self.state).status[peer], PeerStatus::Alive)
    }

    pub(super) fn status_error(&self, peer: usize, op: Op) -> Option<BootstrapError> {
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
}
