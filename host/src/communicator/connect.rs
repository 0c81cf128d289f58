//! Asking for connections and setting them up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp_device::fifo;

use super::{Backend, Buffer, ChannelKind, CommError, Communicator, setup};
use crate::transport::TransportKind;
use crate::transport::buffer::BufferMem;
use crate::transport::ib::{self, IbError};
use crate::transport::setup::PendingConnection;

impl Communicator {
    /// Asks for a proxy channel to `remote_rank` whose puts copy from `buffer` into the
    /// peer's buffer of its matching `connect(this rank, _, tag, _)`. Returns the channel's
    /// index in [`device_connections`](Self::device_connections). Nothing is exchanged until
    /// [`connection_setup`](Self::connection_setup).
    pub fn connect(
        &mut self,
        remote_rank: usize,
        buffer: &Buffer,
        tag: u32,
        transport: TransportKind,
    ) -> Result<usize, CommError> {
        self.add_pending(remote_rank, buffer, tag, transport, ChannelKind::Proxy, 0)
    }

    /// Asks for a memory channel to `remote_rank` over `buffer` (the peer's matching
    /// `connect_memory` buffer must have the same size) with a packet scratch of
    /// `packet_bytes` on each side (0 for none; a multiple of 16). Returns the channel's
    /// index in [`memory_channels`](Self::memory_channels). Set up by
    /// [`connection_setup`](Self::connection_setup) together with proxy channels; tags are
    /// shared with `connect`.
    pub fn connect_memory(
        &mut self,
        remote_rank: usize,
        buffer: &Buffer,
        tag: u32,
        transport: TransportKind,
        packet_bytes: usize,
    ) -> Result<usize, CommError> {
        if !packet_bytes.is_multiple_of(16) {
            return Err(CommError::InvalidArgument(format!(
                "connect_memory: packet scratch of {packet_bytes} bytes is not a multiple of 16"
            )));
        }
        self.add_pending(
            remote_rank,
            buffer,
            tag,
            transport,
            ChannelKind::Memory,
            packet_bytes,
        )
    }

    fn add_pending(
        &mut self,
        remote_rank: usize,
        buffer: &Buffer,
        tag: u32,
        transport: TransportKind,
        kind: ChannelKind,
        packet_bytes: usize,
    ) -> Result<usize, CommError> {
        if self.proxy_mut().is_some() {
            return Err(CommError::State(
                "connect after proxy_launch: stop the proxy first".into(),
            ));
        }
        let nranks = self.nranks();
        if remote_rank >= nranks {
            return Err(CommError::InvalidArgument(format!(
                "connect: remote rank {remote_rank} does not exist ({nranks} ranks)"
            )));
        }
        if remote_rank == self.rank() {
            return Err(CommError::InvalidArgument(format!(
                "connect: rank {remote_rank} is this rank; connections go to other ranks"
            )));
        }
        if buffer.len() as u64 > fifo::MAX_OFFSET + 1 {
            return Err(CommError::InvalidArgument(format!(
                "connect: buffer of {} bytes is larger than a trigger can address ({} bytes)",
                buffer.len(),
                fifo::MAX_OFFSET + 1
            )));
        }
        self.check_transport(transport, kind)?;
        if buffer.is_mapped() && (transport != TransportKind::Tcp || kind != ChannelKind::Proxy) {
            return Err(CommError::InvalidArgument(format!(
                "connect: a host-mapped buffer (alloc_mapped_buffer) serves TCP proxy channels \
                 only, not {transport:?}"
            )));
        }
        let matches_backend = matches!(
            (buffer.mem(), &self.backend),
            (BufferMem::Device(_) | BufferMem::Mapped(_), Backend::Gpu(_))
                | (BufferMem::Host(_), Backend::Host)
        );
        if !matches_backend {
            return Err(CommError::InvalidArgument(
                "connect: the buffer was not allocated by this communicator's backend".into(),
            ));
        }
        // Peers map shared memory by name, except over IB (nothing is mapped); a segment gets
        // names in one setup round only.
        if let BufferMem::Host(s) = buffer.mem()
            && s.was_shared()
            && !matches!(transport, TransportKind::Ib | TransportKind::Tcp)
        {
            return Err(CommError::InvalidArgument(
                "connect: this shared-memory buffer was already shared in an earlier setup; allocate a new buffer".into(),
            ));
        }
        if !self.tags.insert((remote_rank, tag)) {
            return Err(CommError::InvalidArgument(format!(
                "connect: tag {tag} is already used for a connection to rank {remote_rank}"
            )));
        }
        let total = self.connections.len() + self.pending.len();
        if total as u32 > fifo::MAX_CONNECTION_ID {
            self.tags.remove(&(remote_rank, tag));
            return Err(CommError::InvalidArgument(format!(
                "connect: at most {} connections per communicator",
                fifo::MAX_CONNECTION_ID + 1
            )));
        }
        let packets = match packet_bytes {
            0 => None,
            n => match self.alloc_buffer(n) {
                Ok(b) => Some(b),
                Err(e) => {
                    self.tags.remove(&(remote_rank, tag));
                    return Err(e);
                }
            },
        };
        let index = self.connections.iter().filter(|c| c.kind() == kind).count()
            + self.pending.iter().filter(|p| p.kind == kind).count();
        self.pending.push(PendingConnection {
            remote_rank,
            tag,
            buffer: buffer.clone(),
            transport,
            kind,
            packets,
        });
        Ok(index)
    }

    /// Whether this communicator can make a `kind` channel over `transport`: its backend's
    /// own transport, TCP or IB (which opens the RDMA device), and memory channels only
    /// where the peer's memory can be mapped.
    fn check_transport(
        &mut self,
        transport: TransportKind,
        kind: ChannelKind,
    ) -> Result<(), CommError> {
        let ours = self.backend.transport();
        if transport == TransportKind::Tcp {
            if kind == ChannelKind::Memory {
                return Err(CommError::TransportUnavailable {
                    transport,
                    reason: "memory channels load and store the peer's memory, which TCP cannot \
                             map; use a proxy channel (connect) over TCP"
                        .into(),
                });
            }
        } else if transport == TransportKind::Ib {
            if kind == ChannelKind::Memory {
                return Err(CommError::TransportUnavailable {
                    transport,
                    reason: "memory channels load and store the peer's memory, which RDMA cannot \
                             map; use a proxy channel (connect) over IB"
                        .into(),
                });
            }
            self.open_ib()?;
        } else if transport != ours {
            let reason = match (transport, &self.backend) {
                (TransportKind::P2p, Backend::Host) => "this communicator runs without a GPU; use TransportKind::Host (or TransportKind::Tcp or TransportKind::Ib across machines)".to_string(),
                _ => format!("this communicator runs on a GPU; use TransportKind::{ours:?} (or TransportKind::Ib across machines)"),
            };
            return Err(CommError::TransportUnavailable { transport, reason });
        }
        Ok(())
    }

    /// Opens the RDMA device (once) for IB connections.
    fn open_ib(&mut self) -> Result<(), CommError> {
        if self.ib.is_none() {
            let verbs = ib::open_from_env().map_err(|e| match e {
                IbError::Unavailable(_) | IbError::NoSuchDevice { .. } => {
                    CommError::TransportUnavailable {
                        transport: TransportKind::Ib,
                        reason: e.to_string(),
                    }
                }
                e => CommError::Ib(e),
            })?;
            self.ib = Some(ib::setup::IbSession::new(verbs));
        }
        Ok(())
    }

    /// Uses `verbs` for IB connections instead of opening a device (tests: the fake).
    #[cfg(test)]
    pub(crate) fn use_ib_verbs(&mut self, verbs: Arc<dyn ib::Verbs>) {
        self.ib = Some(ib::setup::IbSession::new(verbs));
    }

    /// Exchanges the pending connections' memory with their peers and maps the peers'
    /// (collective over the ranks that connect to each other; every rank should call it).
    pub fn connection_setup(&mut self) -> Result<(), CommError> {
        if self.proxy_mut().is_some() {
            return Err(CommError::State(
                "connection_setup after proxy_launch: stop the proxy first".into(),
            ));
        }
        let pending = std::mem::take(&mut self.pending);
        let first_id = self.connections.len() as u32;
        let (conns, flags) = setup::establish(self, pending, first_id)?;
        for c in &conns {
            if c.transport() == TransportKind::Tcp {
                self.fault.await_drain(c.remote_rank());
            }
            if c.ib_staged() {
                self.fault.await_settle(c.remote_rank());
            }
        }
        self.connections.extend(conns);
        self.flag_memory.push(flags);
        // The proxy is stopped (checked above), so nobody changes the epochs meanwhile.
        let epochs: Vec<AtomicU64> = (0..self.connections.len())
            .map(|i| AtomicU64::new(self.epochs.get(i).map_or(0, |e| e.load(Ordering::Relaxed))))
            .collect();
        self.epochs = Arc::from(epochs);
        Ok(())
    }
}
