//! The IB transport's part of connection setup: register the buffer (or its host staging
//! mirror), the inbound counters and a control block, create a queue pair, send its address
//! and keys in the connection's description, and connect it from the peer's (INIT → RTR →
//! RTS).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::transport::DataPlane;
use crate::transport::backend::Backend;
use crate::transport::error::CommError;
use crate::transport::setup::{
    ConnInfo, Connection, Link, MemHandle, PendingConnection, Round, SetupContext, TransportSetup,
    mismatch, remote_info,
};

use super::plane::PeerDepartures;
use super::{
    CONTROL_BYTES, CudaStagingCopy, HostMemory, HostStagingCopy, IbEndpoint, IbHandshake, IbLink,
    IbPlane, LinkStaging, MemoryKind, MemoryRegistration, QpTransition, QueuePair, RdmaRegion,
    StagingMode, Verbs, decode_handshake, encode_handshake,
};

/// The RDMA device of a communicator's IB connections.
#[derive(Debug)]
pub(crate) struct IbSession {
    verbs: Arc<dyn Verbs>,
}

impl IbSession {
    pub(crate) fn new(verbs: Arc<dyn Verbs>) -> IbSession {
        IbSession { verbs }
    }
}

/// The IB side of a set-up connection: its queue pair (shared with the proxy's plane) and the
/// keys, with the registrations kept alive as long as the connection.
#[derive(Debug)]
pub(crate) struct IbConnection {
    qp: Arc<Mutex<Box<dyn QueuePair>>>,
    lkey: u32,
    rkey: u32,
    flag_rkey: u32,
    /// Host staging on either side (see `transport::ib::staging`).
    staging: Option<LinkStaging>,
    /// Dropped before `_memory` (field order): deregister, then free.
    _registrations: Vec<Arc<MemoryRegistration>>,
    _memory: Vec<Arc<HostMemory>>,
}

/// An IB connection between sending its handshake and connecting its queue pair.
struct IbPrep {
    qp: Box<dyn QueuePair>,
    psn: u32,
    /// What the NIC addresses for our buffer: the buffer's registration, or its mirror's.
    local: Arc<MemoryRegistration>,
    /// The inbound counters' registration (None when staged: our proxy writes the counter).
    flags: Option<Arc<MemoryRegistration>>,
    /// The staging mirror of our buffer, when staged.
    mirror: Option<Arc<HostMemory>>,
    control: Arc<HostMemory>,
    control_reg: Arc<MemoryRegistration>,
}

/// A mirror of a staged buffer with its registration.
type Mirror = (Arc<HostMemory>, Arc<MemoryRegistration>);

/// Registers `[addr, addr + len)` once per setup round.
fn register_once(
    verbs: &dyn Verbs,
    registrations: &mut HashMap<(u64, u64), Arc<MemoryRegistration>>,
    addr: u64,
    len: u64,
    kind: MemoryKind,
) -> Result<Arc<MemoryRegistration>, CommError> {
    if let Some(r) = registrations.get(&(addr, len)) {
        return Ok(r.clone());
    }
    // SAFETY: callers pass memory of this communicator that outlives the registration: a
    // connection's buffer or staging memory (the connection keeps them and drops the
    // registrations first), or the round's flag memory (kept in `flag_memory`, which
    // outlives every connection of the round: connections are dropped first).
    let r = Arc::new(unsafe { verbs.register(addr, len, kind) }?);
    registrations.insert((addr, len), r.clone());
    Ok(r)
}

/// Registers an IB connection's memory (staging its buffer when asked to, or when a GPU
/// buffer cannot be registered in [`StagingMode::Auto`]) and creates its queue pair (INIT).
fn prepare_ib(
    round: &Round<'_>,
    p: &PendingConnection,
    registrations: &mut HashMap<(u64, u64), Arc<MemoryRegistration>>,
    mirrors: &mut HashMap<(u64, u64), Mirror>,
) -> Result<IbPrep, CommError> {
    let ctx = round.ctx;
    let (inbound_base, flag_bytes) = (round.inbound_base, round.flag_bytes);
    let session = ctx
        .ib_session()
        .ok_or_else(|| CommError::State("IB connection without an opened RDMA device".into()))?;
    let verbs = session.verbs.as_ref();
    let mode = StagingMode::from_env()?.unwrap_or(ctx.ib_config().staging);
    let (addr, len) = (p.buffer.addr(), p.buffer.len() as u64);
    let direct = match (ctx.backend(), mode) {
        (_, StagingMode::Always) => None,
        (_, _) if mirrors.contains_key(&(addr, len)) => None,
        (Backend::Host, _) => Some(register_once(
            verbs,
            registrations,
            addr,
            len,
            MemoryKind::Host,
        )?),
        (Backend::Gpu(_), StagingMode::Never) => Some(register_once(
            verbs,
            registrations,
            addr,
            len,
            MemoryKind::Gpu,
        )?),
        // Auto: GPUDirect RDMA when the adapter takes the GPU memory, else host staging.
        (Backend::Gpu(_), StagingMode::Auto) => {
            register_once(verbs, registrations, addr, len, MemoryKind::Gpu).ok()
        }
    };
    let (local, flags, mirror) = match direct {
        Some(local) => {
            let flags_kind = match ctx.backend() {
                Backend::Gpu(_) => MemoryKind::Gpu,
                Backend::Host => MemoryKind::Host,
            };
            let flags = register_once(verbs, registrations, inbound_base, flag_bytes, flags_kind)?;
            (local, Some(flags), None)
        }
        None => {
            let (mem, reg) = match mirrors.get(&(addr, len)) {
                Some(m) => m.clone(),
                None => {
                    let mem = Arc::new(match ctx.backend() {
                        Backend::Gpu(gpu) => HostMemory::pinned(gpu, len as usize)?,
                        Backend::Host => HostMemory::heap(len as usize)?,
                    });
                    let reg =
                        register_once(verbs, registrations, mem.addr(), len, MemoryKind::Host)?;
                    mirrors.insert((addr, len), (mem.clone(), reg.clone()));
                    (mem, reg)
                }
            };
            (reg, None, Some(mem))
        }
    };
    let control = Arc::new(HostMemory::heap(CONTROL_BYTES as usize)?);
    let control_reg = register_once(
        verbs,
        registrations,
        control.addr(),
        control.len(),
        MemoryKind::Host,
    )?;
    let mut qp = verbs.create_qp(ctx.ib_config().depth)?;
    qp.modify(QpTransition::Init)?;
    let psn = rand::random::<u32>() & 0xff_ffff;
    Ok(IbPrep {
        qp,
        psn,
        local,
        flags,
        mirror,
        control,
        control_reg,
    })
}

/// The description of an IB connection: its handshake (queue pair, the buffer or its
/// mirror, where the flag goes, the control block) wrapped in a [`ConnInfo`].
fn ib_info(
    round: &Round<'_>,
    p: &PendingConnection,
    prep: &IbPrep,
    k: usize,
) -> Result<ConnInfo, CommError> {
    let port = round.ctx.ib_session().map(|s| s.verbs.port());
    let port = port.ok_or_else(|| CommError::State("no RDMA device".into()))?;
    let len = p.buffer.len() as u64;
    let control = RdmaRegion {
        addr: prep.control.addr(),
        len: prep.control.len(),
        rkey: prep.control_reg.rkey,
    };
    let (buffer, flag) = match (&prep.mirror, &prep.flags) {
        // Staged: the peer writes into the mirror and its flag into the control block.
        (Some(mirror), _) => (
            RdmaRegion {
                addr: mirror.addr(),
                len,
                rkey: prep.local.rkey,
            },
            RdmaRegion {
                addr: control.addr,
                len: 8,
                rkey: control.rkey,
            },
        ),
        (None, Some(flags)) => (
            RdmaRegion {
                addr: p.buffer.addr(),
                len,
                rkey: prep.local.rkey,
            },
            RdmaRegion {
                addr: round.inbound(k),
                len: 8,
                rkey: flags.rkey,
            },
        ),
        (None, None) => {
            return Err(CommError::State(
                "IB connection prepared without flag memory".into(),
            ));
        }
    };
    let handshake = IbHandshake {
        endpoint: IbEndpoint {
            lid: port.lid,
            gid: port.gid,
            mtu: port.mtu,
            qpn: prep.qp.qpn(),
            psn: prep.psn,
        },
        buffer,
        flag,
        staged: prep.mirror.is_some(),
        control,
    };
    Ok(ConnInfo {
        flags: MemHandle::Remote {
            len: round.flag_bytes,
        },
        flag_index: k as u32,
        wire: Some(encode_handshake(&handshake)),
        ..remote_info(p, round.pid)
    })
}

/// Connects an IB connection's queue pair to the peer's (RTR, RTS) from its handshake.
fn connect_ib(
    round: &Round<'_>,
    p: &PendingConnection,
    peer: &ConnInfo,
    mut prep: IbPrep,
    k: usize,
) -> Result<Connection, CommError> {
    let (rank, tag) = (p.remote_rank, p.tag);
    let raw = peer
        .wire
        .as_ref()
        .ok_or_else(|| mismatch(rank, tag, "the peer sent no InfiniBand handshake"))?;
    let hs = decode_handshake(raw).map_err(|e| mismatch(rank, tag, e.to_string()))?;
    if hs.buffer.len != peer.buffer_len {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "the peer's IB buffer region ({} bytes) differs from its buffer ({} bytes)",
                hs.buffer.len, peer.buffer_len
            ),
        ));
    }
    prep.qp.modify(QpTransition::ReadyToReceive(&hs.endpoint))?;
    prep.qp
        .modify(QpTransition::ReadyToSend { psn: prep.psn })?;
    let staging = (prep.mirror.is_some() || hs.staged).then(|| LinkStaging {
        mirror: prep.mirror.as_ref().map(|m| (m.addr(), prep.local.lkey)),
        peer_staged: hs.staged,
        buffer: p.buffer.addr(),
        buffer_len: p.buffer.len() as u64,
        inbound: round.inbound(k),
        control: prep.control.addr(),
        peer_control: (hs.control.addr, hs.control.rkey),
        progress: Arc::default(),
    });
    let lkey = prep.local.lkey;
    let mut registrations = vec![prep.local, prep.control_reg];
    registrations.extend(prep.flags);
    let mut memory = vec![prep.control];
    memory.extend(prep.mirror);
    Ok(Connection::remote(
        round,
        p,
        k,
        hs.buffer.addr,
        hs.buffer.len,
        hs.flag.addr,
        Box::new(IbConnection {
            qp: Arc::new(Mutex::new(prep.qp)),
            lkey,
            rkey: hs.buffer.rkey,
            flag_rkey: hs.flag.rkey,
            staging,
            _registrations: registrations,
            _memory: memory,
        }),
    ))
}

impl IbConnection {
    /// Whether this side's buffer goes through a host staging mirror.
    pub(crate) fn staged(&self) -> bool {
        self.staging.as_ref().is_some_and(|s| s.mirror.is_some())
    }
}

impl Link for IbConnection {}

/// The IB setup of one round: the connections prepared before the exchange, and the
/// registrations and mirrors shared by the round's connections.
#[derive(Default)]
pub(crate) struct IbSetup {
    preps: HashMap<usize, IbPrep>,
    registrations: HashMap<(u64, u64), Arc<MemoryRegistration>>,
    mirrors: HashMap<(u64, u64), Mirror>,
}

impl TransportSetup for IbSetup {
    fn crosses_hosts(&self) -> bool {
        true
    }

    fn describe(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        k: usize,
    ) -> Result<ConnInfo, CommError> {
        let prep = prepare_ib(round, p, &mut self.registrations, &mut self.mirrors)?;
        let info = ib_info(round, p, &prep, k)?;
        self.preps.insert(k, prep);
        Ok(info)
    }

    fn connect(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        peer: &ConnInfo,
        k: usize,
    ) -> Result<Connection, CommError> {
        let prep = self
            .preps
            .remove(&k)
            .ok_or_else(|| CommError::State("IB connection was not prepared".into()))?;
        connect_ib(round, p, peer, prep, k)
    }

    fn plane(
        &self,
        ctx: &dyn SetupContext,
        epochs: &[u64],
    ) -> Result<Box<dyn DataPlane>, CommError> {
        let links = ctx
            .connections()
            .iter()
            .map(|c| {
                c.link_as::<IbConnection>().map(|i| IbLink {
                    qp: i.qp.clone(),
                    peer: c.remote_rank(),
                    tag: c.tag(),
                    lkey: i.lkey,
                    rkey: i.rkey,
                    flag_rkey: i.flag_rkey,
                    staging: i.staging.clone(),
                })
            })
            .collect();
        let mut plane = IbPlane::new(links, epochs, ctx.ib_config())?;
        // The bootstrap's goodbyes tell the plane which peers can send nothing more (the
        // queue pairs cannot: see the plane's docs). The hook holds the set weakly: it
        // outlives the plane (hooks stay registered with the bootstrap).
        let departures = Arc::new(PeerDepartures::default());
        let weak = Arc::downgrade(&departures);
        ctx.bootstrap()
            .as_async()
            .on_peer_departed(move |rank, work_ended| {
                if work_ended && let Some(d) = weak.upgrade() {
                    d.note_left(rank);
                }
            });
        plane = plane.with_departures(departures);
        if ctx.connections().iter().any(Connection::ib_staged) {
            plane = plane.with_staging_copy(match ctx.backend() {
                Backend::Gpu(gpu) => Box::new(CudaStagingCopy::new(gpu.new_stream()?)),
                Backend::Host => Box::new(HostStagingCopy),
            });
        }
        Ok(Box::new(plane))
    }
}
