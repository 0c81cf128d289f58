//! A mesh's listening side: accepting peers' connections, checking their hellos, and
//! reading what they send into the mailbox.

use super::*;

impl Mesh {
    /// Starts accepting peer connections on `listener`.
    pub(crate) fn start(self: &Arc<Self>, listener: TcpListener) {
        let mesh = Arc::clone(self);
        self.spawn_tracked(async move { mesh.accept_loop(listener).await });
    }

    pub(super) async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
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

    pub(super) fn check_hello(&self, hello: &Hello) -> Result<usize, Refusal> {
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
    pub(super) async fn serve_incoming(self: Arc<Self>, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        link::watch(&stream, link::link_timeout(self.config.link_timeout));
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

    pub(super) async fn read_incoming(self: Arc<Self>, from: usize, mut rd: OwnedReadHalf) {
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
                    let detail = self.failure_detail(from, &e);
                    self.mark_lost(from, detail);
                    return;
                }
            }
        }
    }

    /// Records a news item `from` sent (a lost, closed or stalled rank); `false` for any
    /// other message.
    pub(super) fn note_news(self: &Arc<Self>, from: usize, message: &Message) -> bool {
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
    pub(super) async fn watch_link(self: Arc<Self>, peer: usize, mut rd: OwnedReadHalf) {
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
                Err(e) => {
                    let detail = self.failure_detail(peer, &e);
                    return self.mark_lost(peer, detail);
                }
            }
        }
    }

    /// What a failed read of `peer`'s connection says: the network between the two hosts
    /// was lost (probes or data unanswered for the link timeout, or no route), or the
    /// connection failed otherwise.
    fn failure_detail(&self, peer: usize, e: &wire::FrameError) -> String {
        match e {
            wire::FrameError::Io(io) if link::network_lost(io.kind()) => link::lost_detail(
                &self.peers[self.rank].host_id,
                &self.peers[peer].host_id,
                self.peers[peer].addr,
                link::link_timeout(self.config.link_timeout),
                io,
            ),
            e => format!("its connection failed: {e}"),
        }
    }

    pub(super) fn track_writer(&self, writer: JoinHandle<()>) {
        let mut writers = lock(&self.writers);
        writers.retain(|w| !w.is_finished());
        writers.push(writer);
    }

    pub(super) fn deliver(&self, from: usize, channel: Channel, payload: Vec<u8>) {
        lock(&self.state)
            .queues
            .entry((from, channel))
            .or_default()
            .push_back(payload);
        self.notify.notify_waiters();
    }
}
