//! Waiting for messages in the mailbox, with the errors a wait ends in when a peer leaves,
//! dies or stalls.

use super::*;

impl Mesh {
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
        let wait = wait.min(super::super::LONGEST_WAIT);
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
    pub(super) async fn gave_up_on(
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
    pub(super) fn news_error(&self, peer: usize, op: Op) -> Option<BootstrapError> {
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
    pub(super) fn closed_error(&self, st: &MailState, peer: usize, op: Op) -> BootstrapError {
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
    pub(super) fn news_complete(&self, e: &BootstrapError) -> bool {
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
    pub(super) async fn wait_for_news(
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
}
