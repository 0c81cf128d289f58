//! Connection setup, the round: what two ranks exchange over the bootstrap, around each
//! transport's part of it.
//!
//! For each pending connection, both sides send a [`ConnInfo`] (bincode over the bootstrap's
//! tagged send/recv) describing their buffer and the inbound counter the peer's proxy must
//! write, check the peer's against their own (transport, buffer size, machine), finish the
//! connection, then send an acknowledgement. The round (flag memory, the exchange, the
//! acknowledgements, error handling) is the same for every transport, and is here; what a
//! transport puts into its description, how it finishes a connection from the peer's, and
//! which data plane its proxy drives are behind [`TransportSetup`], one implementation per
//! transport ([`setup_of`] is the registry; see `transport::setup`), which sees the
//! communicator only as a [`SetupContext`](crate::transport::setup::SetupContext).
//!
//! Shared memory (Host backend) has no name until a setup round shares it: each segment is
//! given a fresh name per peer just before the description carrying it is sent; the peer
//! removes the name as soon as it has mapped the segment, and removes the names of every
//! description it received but did not map; this side removes every name it published
//! when the round ends (acknowledged, failed, or unwound). A bootstrap error (a peer that
//! died) does not cut the exchange short: every description still goes out and every one
//! that arrived is read, so names sent by a rank that died are removed by their receivers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::{Backend, ChannelKind, CommError, Communicator, ConnTag, PendingConnection};
use crate::cuda::DeviceBuffer;
use crate::proxy::{ProxyTask, RefusedHook, SettleHook, StartHook};
use crate::transport::mapped::ipc_handle;
use crate::transport::p2p::ProxyFlagMode;
use crate::transport::setup::{
    ConnInfo, Connection, FlagMemory, HostFlags, MemHandle, Round, TransportSetup, mismatch,
    remote_info, setup_of,
};
use crate::transport::shm::{ShmSegment, remove_name};
use crate::transport::{PlaneSet, TransportKind};

/// Bootstrap tags of setup messages: a high marker | the connection's tag.
const INFO_TAG: u64 = 0x4d53_4350_0000_0000;
const ACK_TAG: u64 = 0x4d53_4341_0000_0000;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Ack {
    Mapped,
    Failed(String),
}

/// What a side that could not prepare a connection sends instead of its description.
fn failed_info(p: &PendingConnection, pid: u32, reason: String) -> ConnInfo {
    ConnInfo {
        failed: Some(reason),
        ..remote_info(p, pid)
    }
}

/// Removes the shared-memory names in a peer's description (they were published for this
/// rank alone), whether or not this rank mapped them.
fn remove_names(info: &ConnInfo) {
    for h in [Some(&info.buffer), Some(&info.flags), info.packets.as_ref()]
        .into_iter()
        .flatten()
    {
        if let MemHandle::Shm { name, .. } = h {
            let _ = remove_name(name);
        }
    }
}

/// The inbound counters and expected epochs of a round of `n` connections: the memory, its
/// handle for peers, and the two base addresses; with `host_inbound` (GPU backend), also
/// host inbound counters for the round's P2P proxy channels (`cpu` flag mode).
fn alloc_flags(
    backend: &Backend,
    n: usize,
    host_inbound: bool,
) -> Result<(FlagMemory, MemHandle, u64, u64), CommError> {
    let bytes = n * 8;
    Ok(match backend {
        Backend::Gpu(gpu) => {
            let inbound = DeviceBuffer::zeroed(gpu, bytes)?;
            let expected = DeviceBuffer::zeroed(gpu, bytes)?;
            let handle = ipc_handle(&inbound, gpu)?;
            let host = host_inbound.then(|| HostFlags::new(gpu, n)).transpose()?;
            let (i, e) = (inbound.device_ptr(), expected.device_ptr());
            (
                FlagMemory::Device {
                    _inbound: inbound,
                    _expected: expected,
                    host,
                },
                handle,
                i,
                e,
            )
        }
        Backend::Host => {
            let inbound = ShmSegment::create(bytes)?;
            let expected: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
            // Placeholder: each peer gets a name of its own (`flags_for`).
            let handle = MemHandle::Shm {
                name: String::new(),
                len: inbound.len() as u64,
            };
            let (i, e) = (inbound.as_ptr() as u64, expected.as_ptr() as u64);
            (
                FlagMemory::Host {
                    _inbound: inbound,
                    _expected: expected,
                },
                handle,
                i,
                e,
            )
        }
    })
}

/// One setup per transport of a round. Dropped when the round ends, on every path out (the
/// mapped transports remove the names they published then).
type Setups = HashMap<TransportKind, Box<dyn TransportSetup>>;

/// The setup of `kind` in a round's `setups`.
fn setup_for(setups: &mut Setups, kind: TransportKind) -> &mut dyn TransportSetup {
    setups
        .get_mut(&kind)
        .expect("a setup per transport of the round")
        .as_mut()
}

/// Sets up `pending` (ids from `first_id`): describe, exchange, check, connect (each
/// transport its own way), acknowledge.
pub(super) fn establish(
    comm: &Communicator,
    pending: Vec<PendingConnection>,
    first_id: u32,
) -> Result<(Vec<Connection>, FlagMemory), CommError> {
    let n = pending.len();
    if n == 0 {
        return Ok((Vec::new(), FlagMemory::None));
    }
    // A failure before the exchange is not returned at once: every peer still gets a
    // description (marked failed, with the reason), so it fails promptly too.
    // Host inbound counters only when a P2P proxy channel of the round needs them.
    let host_inbound = comm.proxy_flag == ProxyFlagMode::Cpu
        && pending
            .iter()
            .any(|p| p.kind == ChannelKind::Proxy && p.transport == TransportKind::P2p);
    let (flags, flags_handle, inbound_base, expected_base, round_error) =
        match alloc_flags(&comm.backend, n, host_inbound) {
            Ok((f, h, i, e)) => (f, h, i, e, None),
            Err(e) => (
                FlagMemory::None,
                MemHandle::Remote { len: 0 },
                0,
                0,
                Some(e),
            ),
        };
    let bs = &comm.bootstrap;
    let pid = std::process::id();
    let round = Round {
        ctx: comm,
        pid,
        first_id,
        inbound_base,
        flag_bytes: (n * 8) as u64,
        expected_base,
        flags: &flags,
        flags_handle: &flags_handle,
    };
    let mut setups: Setups = HashMap::new();
    for p in &pending {
        setups
            .entry(p.transport)
            .or_insert_with(|| setup_of(p.transport));
    }
    // 1. Describe every connection before any description is sent (see `describe`).
    let (outgoing, mut local_errors) =
        describe(&mut setups, &round, &pending, round_error.as_ref())?;
    // 2. Send every description first (sends are buffered by the receiver), then receive.
    let mut first_error: Option<CommError> = None;
    for (peer, tag, bytes) in outgoing {
        // A peer that is gone is not a reason to stop: the others still get theirs.
        let what = format!("the setup info of the connection ({})", ConnTag(tag));
        if let Err(e) = bs.send_named(peer, INFO_TAG | tag as u64, &what, &bytes) {
            first_error.get_or_insert(e.into());
        }
    }
    let my_host = bs.as_async().host_id(comm.rank()).map(str::to_string);
    let mut conns = Vec::with_capacity(n);
    for (k, p) in pending.into_iter().enumerate() {
        // What a peer sent before dying is still delivered; what it did not send fails at
        // once (the bootstrap names the lost rank).
        let received = recv_info(comm, &p);
        let local_error = local_errors[k].take();
        let (peer_info, result) = match received {
            Ok(info) => {
                let result = match local_error {
                    Some(e) => Err(e),
                    None => {
                        let hosts = (my_host.as_deref(), bs.as_async().host_id(p.remote_rank));
                        let setup = setup_for(&mut setups, p.transport);
                        finish(setup, &round, &p, &info, k, hosts)
                    }
                };
                (Some(info), result)
            }
            Err(e) => (None, Err(local_error.unwrap_or(e))),
        };
        if let Some(info) = &peer_info {
            remove_names(info);
        }
        send_ack(comm, &p, &result, &mut first_error)?;
        match result {
            Ok(c) => conns.push(c),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    // 3. Wait for every peer's acknowledgement, then end the round (our shared-memory names
    // are removed).
    await_acks(comm, &conns, &mut first_error);
    // Every peer has mapped (or will not map) what it was sent: no name is needed any more.
    drop(setups);
    if let Some(e) = round_error.or(first_error) {
        return Err(e);
    }
    Ok((conns, flags))
}

/// Encoded descriptions, each with the peer and the tag it goes to.
type Outgoing = Vec<(usize, u32, Vec<u8>)>;

/// Step 1 of a round: describes every connection (every name published, every queue pair
/// created, every listener open) before any description is sent, since a peer removes a
/// name as soon as it has mapped the segment, and a segment whose names are all gone cannot
/// be given another (tmpfs links an unnamed file only until its first link goes). Returns
/// what to send to whom (encoded) and each connection's local error: a connection that
/// could not be prepared (or all of them, after `round_error`) is sent as failed.
fn describe(
    setups: &mut Setups,
    round: &Round<'_>,
    pending: &[PendingConnection],
    round_error: Option<&CommError>,
) -> Result<(Outgoing, Vec<Option<CommError>>), CommError> {
    let mut local_errors: Vec<Option<CommError>> = Vec::with_capacity(pending.len());
    let mut outgoing = Vec::with_capacity(pending.len());
    for (k, p) in pending.iter().enumerate() {
        let built = match round_error {
            Some(e) => Err(CommError::State(e.to_string())),
            None => setup_for(setups, p.transport).describe(round, p, k),
        };
        let info = match built {
            Ok(info) => {
                local_errors.push(None);
                info
            }
            Err(e) => {
                let info = failed_info(p, round.pid, e.to_string());
                local_errors.push(Some(e));
                info
            }
        };
        let bytes = bincode::serde::encode_to_vec(&info, bincode::config::standard())
            .map_err(|e| CommError::InvalidArgument(format!("encoding connection info: {e}")))?;
        outgoing.push((p.remote_rank, p.tag, bytes));
    }
    Ok((outgoing, local_errors))
}

/// The peer's description of connection `p`, or why there is none.
fn recv_info(comm: &Communicator, p: &PendingConnection) -> Result<ConnInfo, CommError> {
    let raw = comm.bootstrap.recv_named(
        p.remote_rank,
        INFO_TAG | p.tag as u64,
        &format!("the setup info of the connection ({})", ConnTag(p.tag)),
    )?;
    bincode::serde::decode_from_slice::<ConnInfo, _>(&raw, bincode::config::standard())
        .map(|(info, _)| info)
        .map_err(|e| {
            mismatch(
                p.remote_rank,
                p.tag,
                format!("undecodable connection info: {e}"),
            )
        })
}

/// Finishes connection `k` (`p`) from the peer's description: the peer's own failure, or
/// a mismatch with ours (`hosts`: this rank's host and the peer's), is an error.
fn finish(
    setup: &mut dyn TransportSetup,
    round: &Round<'_>,
    p: &PendingConnection,
    peer: &ConnInfo,
    k: usize,
    (my_host, peer_host): (Option<&str>, Option<&str>),
) -> Result<Connection, CommError> {
    if let Some(reason) = &peer.failed {
        return Err(mismatch(
            p.remote_rank,
            p.tag,
            format!("rank {} could not set up its side: {reason}", p.remote_rank),
        ));
    }
    check_peer(p, peer, setup.crosses_hosts(), my_host, peer_host)?;
    setup.connect(round, p, peer, k)
}

/// Tells the peer of `p` how this side of the connection ended (a failed send is noted in
/// `first_error`).
fn send_ack(
    comm: &Communicator,
    p: &PendingConnection,
    result: &Result<Connection, CommError>,
    first_error: &mut Option<CommError>,
) -> Result<(), CommError> {
    let ack = match result {
        Ok(_) => Ack::Mapped,
        Err(e) => Ack::Failed(e.to_string()),
    };
    let ack = bincode::serde::encode_to_vec(&ack, bincode::config::standard())
        .map_err(|e| CommError::InvalidArgument(format!("encoding ack: {e}")))?;
    let what = format!(
        "the setup acknowledgement of the connection ({})",
        ConnTag(p.tag)
    );
    let sent = comm
        .bootstrap
        .send_named(p.remote_rank, ACK_TAG | p.tag as u64, &what, &ack);
    if let Err(e) = sent {
        first_error.get_or_insert(e.into());
    }
    Ok(())
}

/// Step 3 of a round: waits for the peer's acknowledgement of each of `conns`; the first
/// failure (a peer that could not set up its side, or is gone) goes into `first_error`.
fn await_acks(comm: &Communicator, conns: &[Connection], first_error: &mut Option<CommError>) {
    for c in conns {
        let what = format!(
            "the setup acknowledgement of the connection ({})",
            ConnTag(c.tag())
        );
        let raw = match comm
            .bootstrap
            .recv_named(c.remote_rank(), ACK_TAG | c.tag() as u64, &what)
        {
            Ok(raw) => raw,
            Err(e) => {
                first_error.get_or_insert(e.into());
                continue;
            }
        };
        let ack: Ack = bincode::serde::decode_from_slice(&raw, bincode::config::standard())
            .map(|(a, _)| a)
            .unwrap_or_else(|e| Ack::Failed(format!("undecodable acknowledgement: {e}")));
        if let Ack::Failed(reason) = ack {
            first_error.get_or_insert(mismatch(
                c.remote_rank(),
                c.tag(),
                format!("the peer could not set up its side: {reason}"),
            ));
        }
    }
}

fn check_peer(
    mine: &PendingConnection,
    peer: &ConnInfo,
    crosses_hosts: bool,
    my_host: Option<&str>,
    peer_host: Option<&str>,
) -> Result<(), CommError> {
    let (rank, tag) = (mine.remote_rank, mine.tag);
    if peer.tag != tag {
        return Err(mismatch(
            rank,
            tag,
            format!("peer answered for tag {}", peer.tag),
        ));
    }
    if peer.transport != mine.transport {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "transports differ: {} here, {} on the peer",
                mine.transport, peer.transport
            ),
        ));
    }
    if peer.kind != mine.kind {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "channel kinds differ: {:?} here, {:?} on the peer",
                mine.kind, peer.kind
            ),
        ));
    }
    let my_packets = mine.packets.as_ref().map_or(0, |b| b.len() as u64);
    if peer.packets_len != my_packets {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "packet scratch sizes differ: {my_packets} bytes here, {} bytes on the peer",
                peer.packets_len
            ),
        ));
    }
    if peer.buffer_len != mine.buffer.len() as u64 {
        return Err(mismatch(
            rank,
            tag,
            format!(
                "buffer sizes differ: {} bytes here, {} bytes on the peer",
                mine.buffer.len(),
                peer.buffer_len
            ),
        ));
    }
    // Network transports connect machines; the others need the peer's memory mapped here.
    if my_host != peer_host && !crosses_hosts {
        return Err(CommError::TransportUnavailable {
            transport: mine.transport,
            reason: format!(
                "rank {rank} is on another machine ({} vs {}); {} connects ranks of one machine (IB or TCP is needed across machines)",
                peer_host.unwrap_or("?"),
                my_host.unwrap_or("?"),
                mine.transport
            ),
        });
    }
    Ok(())
}

/// The proxy's task for `comm`'s connections: one data plane per transport in use (a
/// [`PlaneSet`] when there are several).
pub(super) fn proxy_task(comm: &Communicator) -> Result<ProxyTask, CommError> {
    let routes = comm.connections.iter().map(|c| c.route).collect();
    let consumer = comm
        .fifo
        .consumer()
        .map_err(|e| CommError::State(format!("proxy FIFO: {e}")))?;
    // The proxy is stopped (the caller checks), so the epochs are stable.
    let epochs: Vec<u64> = comm
        .epochs
        .iter()
        .map(|e| e.load(Ordering::Relaxed))
        .collect();
    // Transports in order of first use; with no connection, the backend's own.
    let mut kinds: Vec<TransportKind> = Vec::new();
    for c in &comm.connections {
        if !kinds.contains(&c.transport()) {
            kinds.push(c.transport());
        }
    }
    if kinds.is_empty() {
        kinds.push(comm.backend.transport());
    }
    let mut planes = Vec::with_capacity(kinds.len());
    for &kind in &kinds {
        planes.push(setup_of(kind).plane(comm, &epochs)?);
    }
    let plane = if planes.len() == 1 {
        planes.pop().expect("one plane")
    } else {
        let plane_of = comm
            .connections
            .iter()
            .map(|c| kinds.iter().position(|&k| k == c.transport()).unwrap_or(0))
            .collect();
        Box::new(PlaneSet::new(planes, plane_of))
    };
    let on_start: Option<StartHook> = match &comm.backend {
        Backend::Gpu(gpu) => {
            let g = gpu.clone();
            Some(Box::new(move || {
                let _ = g.bind();
            }))
        }
        Backend::Host => None,
    };
    // The new consumer starts with a clean tail; so do the refused connections.
    comm.fault.clear_proxy_refused();
    let fault = comm.fault.clone();
    let on_refused: RefusedHook = Box::new(move |id| fault.mark_proxy_refused(id));
    // A peer's TCP connections still to be drained (closed by the peer after all it sent
    // landed); when the last one is, the fault area learns that the peer is drained.
    let fault = comm.fault.clone();
    let peer_of: Vec<usize> = comm.connections.iter().map(|c| c.remote_rank()).collect();
    let mut open = vec![0usize; comm.nranks()];
    for c in comm
        .connections
        .iter()
        .filter(|c| c.transport() == TransportKind::Tcp)
    {
        open[c.remote_rank()] += 1;
    }
    let on_drained: RefusedHook = Box::new(move |id| {
        if let Some(&peer) = peer_of.get(id as usize)
            && let Some(n) = open.get_mut(peer)
            && *n > 0
        {
            *n -= 1;
            if *n == 0 {
                fault.note_peer_drained(peer);
            }
        }
    });
    // Peers that left are settled (what they wrote into staged buffers delivered) before
    // their "left" words are written.
    let (asks, fault) = (comm.fault.clone(), comm.fault.clone());
    let settle = SettleHook {
        asked: Box::new(move || asks.settle_asked()),
        done: Box::new(move |n| fault.note_settled(n)),
    };
    Ok(ProxyTask {
        consumer,
        routes,
        epochs: comm.epochs.clone(),
        plane,
        on_start,
        peers: comm.connections.iter().map(|c| c.remote_rank()).collect(),
        on_refused: Some(on_refused),
        on_drained: Some(on_drained),
        settle: Some(settle),
        stats: crate::proxy::stats_wanted(),
        waiters_serve: matches!(comm.backend, Backend::Host),
    })
}
