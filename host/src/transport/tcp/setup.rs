//! Setting a TCP connection up: the listener's address over the bootstrap, the lower rank
//! connecting, the hello on each socket.

use super::*;

/// The TCP setup of one round: the listener (opened by the first description) and the
/// sockets accepted for connections not finished yet.
#[derive(Debug, Default)]
pub(crate) struct TcpSetup {
    pub(super) listener: Option<(TcpListener, SocketAddr)>,
    pub(super) config: Option<TcpConfig>,
    /// Accepted sockets by (rank, tag, stripe), with the stripe count their hello gave.
    pub(super) accepted: HashMap<(usize, u32, usize), (TcpStream, usize)>,
    /// The round's host-mapped inbound counters (one per connection of the round), made by
    /// the first connection over a host-mapped buffer and shared by the round's others.
    pub(super) host_flags: Option<Arc<MappedHostBuffer>>,
}

/// What a side's description carries for TCP: where it listens, and how many sockets it
/// wants per connection (the two sides use the smaller).
pub(super) fn encode_wire(addr: SocketAddr, conns: usize) -> Vec<u8> {
    format!("{addr}|{conns}").into_bytes()
}

pub(super) fn decode_wire(raw: &[u8]) -> Option<(SocketAddr, usize)> {
    let s = std::str::from_utf8(raw).ok()?;
    let (addr, conns) = s.split_once('|')?;
    let conns = conns.parse().ok().filter(|n| (1..=64).contains(n))?;
    Some((addr.parse().ok()?, conns))
}

/// Why a setup wait for `peer`'s sockets (`op`) cannot end well, from the bootstrap
/// ([`Bootstrap::wait_is_hopeless`]), preferring a lost rank: when only `peer`'s departure
/// is known, or nothing is but this side already failed (`failed`: its connection was
/// refused), it waits up to [`LOSS_NEWS_GRACE`] for news of a loss, since a rank that
/// leaves during setup most likely left because of one. `None`: nothing known (after the
/// grace, where it waited).
pub(super) fn hopeless(
    bootstrap: &Bootstrap,
    peer: usize,
    op: &Op,
    failed: bool,
) -> Option<crate::bootstrap::BootstrapError> {
    use crate::bootstrap::BootstrapError::PeerLost;
    let mut known = bootstrap.wait_is_hopeless(peer, op.clone());
    if matches!(known, Some(PeerLost { .. })) || (known.is_none() && !failed) {
        return known;
    }
    let deadline = Instant::now() + LOSS_NEWS_GRACE;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        match bootstrap.wait_is_hopeless(peer, op.clone()) {
            Some(e @ PeerLost { .. }) => return Some(e),
            Some(e) => known = Some(e),
            None => {}
        }
    }
    known
}

/// The bootstrap operation a setup wait for the sockets of connection `tag` is named as.
pub(super) fn sockets_op(tag: u32) -> Op {
    Op::RecvNamed(format!("the TCP sockets of the connection ({})", ConnTag(tag)).into())
}

impl TcpSetup {
    /// Accepts until the sockets of (`peer`, `tag`) are all here, or the timeout, or until
    /// `bootstrap` knows that they will not come (`peer` left or was lost, or another rank
    /// was lost: the setup round fails anyway).
    pub(super) fn accept_for(
        &mut self,
        bootstrap: &Bootstrap,
        peer: usize,
        tag: u32,
        stripes: usize,
        timeout: Duration,
    ) -> Result<Vec<TcpStream>, CommError> {
        let (listener, _) = self
            .listener
            .as_ref()
            .ok_or_else(|| CommError::State("TCP connection without a listener".into()))?;
        let deadline = Instant::now() + timeout;
        // Built once: the loop below asks the bootstrap on every empty poll.
        let op = sockets_op(tag);
        while (0..stripes).any(|s| !self.accepted.contains_key(&(peer, tag, s))) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let hello = (|| -> io::Result<[u64; 5]> {
                        s.set_nonblocking(false)?;
                        s.set_read_timeout(Some(timeout))?;
                        let mut raw = [0u8; 40];
                        s.read_exact(&mut raw)?;
                        let mut w = u64s(&raw);
                        Ok([(); 5].map(|()| w.next().unwrap_or(0)))
                    })();
                    // Anything that is not a hello of ours is dropped.
                    if let Ok([HELLO_MAGIC, rank, t, stripe, n]) = hello {
                        self.accepted
                            .insert((rank as usize, t as u32, stripe as usize), (s, n as usize));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Some(e) = hopeless(bootstrap, peer, &op, false) {
                        return Err(e.into());
                    }
                    if Instant::now() > deadline {
                        return Err(mismatch(
                            peer,
                            tag,
                            format!(
                                "rank {peer} did not open its {stripes} TCP socket(s) within {timeout:?}"
                            ),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => {
                    return Err(mismatch(peer, tag, format!("accepting TCP sockets: {e}")));
                }
            }
        }
        let mut out = Vec::with_capacity(stripes);
        for s in 0..stripes {
            let (stream, n) = self
                .accepted
                .remove(&(peer, tag, s))
                .expect("checked above");
            if n != stripes {
                return Err(mismatch(
                    peer,
                    tag,
                    format!("the peer opened {n} TCP sockets, {stripes} expected"),
                ));
            }
            out.push(stream);
        }
        Ok(out)
    }
}

impl TransportSetup for TcpSetup {
    fn crosses_hosts(&self) -> bool {
        true
    }

    fn describe(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        _k: usize,
    ) -> Result<ConnInfo, CommError> {
        let unavailable = |reason: String| CommError::TransportUnavailable {
            transport: TransportKind::Tcp,
            reason,
        };
        let config = match self.config {
            Some(c) => c,
            None => *self
                .config
                .insert(TcpConfig::from_env().map_err(|e| unavailable(e.to_string()))?),
        };
        let addr = match &self.listener {
            Some((_, a)) => *a,
            None => {
                let ip = listen_ip(round.ctx.bootstrap().as_async().listen_addr().ip())
                    .map_err(|e| unavailable(e.to_string()))?;
                let l = TcpListener::bind((ip, 0))
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|e| unavailable(format!("cannot listen on {ip}: {e}")))?;
                let a = l
                    .local_addr()
                    .map_err(|e| unavailable(format!("listener address: {e}")))?;
                self.listener.insert((l, a)).1
            }
        };
        Ok(ConnInfo {
            wire: Some(encode_wire(addr, config.conns)),
            ..remote_info(p, round.pid)
        })
    }

    fn connect(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        peer: &ConnInfo,
        k: usize,
    ) -> Result<Connection, CommError> {
        let (rank, tag) = (p.remote_rank, p.tag);
        let config = self.config.unwrap_or_default();
        let (addr, conns) = peer
            .wire
            .as_deref()
            .and_then(decode_wire)
            .ok_or_else(|| mismatch(rank, tag, "the peer sent no TCP address"))?;
        let stripes = conns.min(config.conns);
        let me = round.ctx.rank();
        let streams = if me < rank {
            let mut out = Vec::with_capacity(stripes);
            for s in 0..stripes {
                let stream = TcpStream::connect_timeout(&addr, config.timeout)
                    .and_then(|mut st| {
                        let mut hello = Vec::with_capacity(40);
                        put_u64s(
                            &mut hello,
                            &[HELLO_MAGIC, me as u64, tag as u64, s as u64, stripes as u64],
                        );
                        st.set_write_timeout(Some(config.timeout))?;
                        st.write_all(&hello)?;
                        Ok(st)
                    })
                    .map_err(|e| {
                        // Refused: its listener is gone, so the peer failed, most likely
                        // because a rank died; name that rank if the news comes soon.
                        let op = sockets_op(tag);
                        match hopeless(round.ctx.bootstrap().as_async(), rank, &op, true) {
                            Some(lost) => lost.into(),
                            None => mismatch(
                                rank,
                                tag,
                                format!("connecting to rank {rank} at {addr}: {e}"),
                            ),
                        }
                    })?;
                out.push(stream);
            }
            out
        } else {
            let bootstrap = round.ctx.bootstrap().as_async();
            self.accept_for(bootstrap, rank, tag, stripes, config.timeout)?
        };
        let len = p.buffer.len() as u64;
        let (sink, stage, host_src, flags, device_inbound) =
            match (round.ctx.backend(), p.buffer.mapped_host_addr()) {
                (Backend::Gpu(gpu), Some(host)) => {
                    // Host-mapped: the receivers write the buffer and the counter directly.
                    let flags = match &self.host_flags {
                        Some(f) => f.clone(),
                        None => self
                            .host_flags
                            .insert(Arc::new(
                                MappedHostBuffer::alloc(gpu, round.flag_bytes as usize).map_err(
                                    |e| mismatch(rank, tag, format!("host-mapped counters: {e}")),
                                )?,
                            ))
                            .clone(),
                    };
                    let at = k as u64 * 8;
                    let sink = Sink {
                        buffer: host,
                        len,
                        inbound: flags.host_ptr() as u64 + at,
                    };
                    let device = flags.device_ptr() + at;
                    (sink, None, Some(host), Some(flags), Some(device))
                }
                (backend, _) => {
                    let sink = Sink {
                        buffer: p.buffer.addr(),
                        len,
                        inbound: round.inbound(k),
                    };
                    // The Host backend's buffer is host memory the sockets use as it is.
                    let (stage, host_src) = match backend {
                        Backend::Gpu(gpu) => (Some((gpu, config.chunk)), None),
                        Backend::Host => (None, Some(sink.buffer)),
                    };
                    (sink, stage, host_src, None, None)
                }
            };
        let link = TcpLink::new(streams, sink, (rank, tag), config, stage, host_src, flags)
            .map_err(|e| mismatch(rank, tag, e))?;
        let mut conn = Connection::remote(round, p, k, 0, peer.buffer_len, 0, Box::new(link));
        if let Some(device) = device_inbound {
            conn.inbound = device;
        }
        Ok(conn)
    }

    fn plane(&self, ctx: &dyn SetupContext, _: &[u64]) -> Result<Box<dyn DataPlane>, CommError> {
        let config = TcpConfig::from_env().map_err(|e| CommError::TransportUnavailable {
            transport: TransportKind::Tcp,
            reason: e.to_string(),
        })?;
        let links: Vec<Option<PlaneLink>> = ctx
            .connections()
            .iter()
            .map(|c| {
                c.link_as::<TcpLink>()
                    .map(|l| (l.tx.clone(), l.shared.clone(), l.host_src))
            })
            .collect();
        // Staging slots only where a link stages (device memory on a GPU).
        let stages = links.iter().flatten().any(|(_, _, host)| host.is_none());
        let stage = match ctx.backend() {
            Backend::Gpu(gpu) if stages => {
                let cuda = |e: CudaError| CommError::TransportUnavailable {
                    transport: TransportKind::Tcp,
                    reason: format!("host staging of GPU puts: {e}"),
                };
                let stream = gpu.shared_stream(StreamRole::StageOut).map_err(cuda)?;
                Some(Slots::new(gpu, stream, config.chunk).map_err(cuda)?)
            }
            _ => None,
        };
        Ok(Box::new(TcpPlane {
            gone: vec![false; links.len()],
            drained: vec![false; links.len()],
            links,
            chunk: config.chunk,
            stage,
        }))
    }
}
