//! A mesh's sending side: links dialed to peers (the ring at `init`, others lazily),
//! posting data on them, and closing.

use super::*;

impl Mesh {
    pub(super) async fn link(
        self: &Arc<Self>,
        peer: usize,
        op: Op,
    ) -> Result<&Link, BootstrapError> {
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
    pub(super) fn successor(&self) -> usize {
        (self.rank + 1) % self.nranks
    }

    /// The error naming the first rank known lost, else a rank known to have closed.
    pub(super) fn first_gone_error(&self, op: Op) -> Option<BootstrapError> {
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

    pub(super) async fn dial(
        self: &Arc<Self>,
        peer: usize,
        op: Op,
    ) -> Result<Link, BootstrapError> {
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
        link::watch(&stream, link::link_timeout(self.config.link_timeout));
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
    pub(super) async fn post(
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

    pub(super) fn link_error(&self, peer: usize, link: &Link, op: Op) -> BootstrapError {
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

    pub(super) fn check_size(&self, len: usize, op: Op) -> Result<(), BootstrapError> {
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
