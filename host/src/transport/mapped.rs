//! The P2P and Host transports' part of connection setup ([`MappedSetup`]): describe the
//! buffer, flags and packet scratch as memory the peer maps (IPC handles, shared-memory names
//! published for that peer), and map the peer's.
//!
//! Shared memory (Host backend) has no name until a setup round shares it: each segment is
//! given a fresh name per peer just before the description carrying it is sent; the peer
//! removes the name as soon as it has mapped the segment (the round removes the names of
//! every description it received but did not map); this side removes every name it
//! published when the round ends (acknowledged, failed, or unwound).

use std::collections::HashMap;
use std::sync::Arc;

use crate::cuda::{DeviceBuffer, Gpu, IpcMemHandle, PeerMapping};

use super::backend::Backend;
use super::buffer::{Buffer, BufferMem};
use super::error::CommError;
use super::host::HostPlane;
use super::p2p::{P2pPlane, PROXY_FLAG_ENV, ProxyFlagMode};
use super::setup::{
    ChannelKind, ConnInfo, Connection, FlagMemory, HostFlags, MemHandle, PeerMem,
    PendingConnection, Round, SetupContext, TransportSetup, mismatch,
};
use super::shm::{ShmError, ShmSegment, remove_name};
use super::{DataPlane, Route, TransportKind};

/// Whether `p`'s inbound counter is a host one in this round (a P2P proxy channel in the
/// `cpu` flag mode).
fn host_flags_for<'a>(round: &Round<'a>, p: &PendingConnection) -> Option<&'a HostFlags> {
    (p.kind == ChannelKind::Proxy && p.transport == TransportKind::P2p)
        .then(|| round.flags.host_flags())
        .flatten()
}

/// Shared-memory names this side published in one setup round, one per segment and peer;
/// every one is removed when this drops (the round's end, on every path).
#[derive(Debug, Default)]
struct Published {
    names: HashMap<(usize, usize), String>,
}

impl Published {
    /// The handle of `seg` for `peer`: a name published for this peer in this round.
    fn handle(&mut self, seg: &ShmSegment, peer: usize) -> Result<MemHandle, ShmError> {
        let key = (seg.as_ptr() as usize, peer);
        let name = match self.names.get(&key) {
            Some(n) => n.clone(),
            None => {
                let n = seg.publish()?;
                self.names.insert(key, n.clone());
                n
            }
        };
        Ok(MemHandle::Shm {
            name,
            len: seg.len() as u64,
        })
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        for name in self.names.values() {
            // A peer that mapped the segment removed the name already.
            let _ = remove_name(name);
        }
    }
}

fn describe(
    buffer: &Buffer,
    backend: &Backend,
    peer: usize,
    published: &mut Published,
) -> Result<MemHandle, CommError> {
    match (buffer.mem(), backend) {
        (BufferMem::Device(d), Backend::Gpu(gpu)) => Ok(ipc_handle(d, gpu)?),
        (BufferMem::Host(s), _) => Ok(published.handle(s, peer)?),
        _ => Err(CommError::InvalidArgument(
            "buffer does not belong to this backend".into(),
        )),
    }
}

pub(crate) fn ipc_handle(d: &DeviceBuffer, gpu: &Gpu) -> Result<MemHandle, CommError> {
    let h = d.ipc_handle()?;
    Ok(MemHandle::Ipc {
        handle: h.bytes.to_vec(),
        len: h.len,
        device_ptr: d.device_ptr(),
        ordinal: gpu.info().ordinal as u32,
    })
}

/// Maps a peer's memory (deduplicated per handle: CUDA cannot open one IPC handle twice in
/// a process).
fn map_peer(
    handle: &MemHandle,
    same_process: bool,
    backend: &Backend,
    cache: &mut HashMap<MemHandle, (Arc<PeerMem>, u64)>,
) -> Result<(Arc<PeerMem>, u64), CommError> {
    if let Some(m) = cache.get(handle) {
        return Ok(m.clone());
    }
    let mapped = match (handle, backend) {
        (MemHandle::Shm { name, len }, _) => {
            let seg = ShmSegment::open(name, *len as usize)?;
            // Mapped: the name (published for this rank alone) has done its job.
            remove_name(name)?;
            let addr = seg.as_ptr() as u64;
            (Arc::new(PeerMem::Shm { _segment: seg }), addr)
        }
        (
            MemHandle::Ipc {
                device_ptr,
                ordinal,
                ..
            },
            Backend::Gpu(gpu),
        ) if same_process => {
            if *ordinal as usize != gpu.info().ordinal {
                let peer = Gpu::open(*ordinal as usize)?;
                gpu.enable_peer_access(&peer)?;
            }
            (Arc::new(PeerMem::Direct), *device_ptr)
        }
        (MemHandle::Ipc { handle, len, .. }, Backend::Gpu(gpu)) => {
            let mut bytes = [0u8; 64];
            if handle.len() != 64 {
                return Err(CommError::InvalidArgument(format!(
                    "peer sent an IPC handle of {} bytes (64 expected)",
                    handle.len()
                )));
            }
            bytes.copy_from_slice(handle);
            let m = PeerMapping::open(gpu, &IpcMemHandle { bytes, len: *len })?;
            let addr = m.device_ptr();
            (Arc::new(PeerMem::Ipc { _mapping: m }), addr)
        }
        (MemHandle::Remote { .. }, _) => {
            return Err(CommError::InvalidArgument(
                "peer described RDMA memory for a connection that is not IB".into(),
            ));
        }
        (MemHandle::Ipc { .. }, Backend::Host) => {
            return Err(CommError::InvalidArgument(
                "peer described GPU memory but this communicator has no GPU".into(),
            ));
        }
    };
    cache.insert(handle.clone(), mapped.clone());
    Ok(mapped)
}

/// The P2P and Host transports' setup: describe the buffer, flags and packet scratch as
/// memory the peer maps (IPC handles, shared-memory names published for that peer), and map
/// the peer's.
#[derive(Debug, Default)]
pub(crate) struct MappedSetup {
    /// Every name published this round, removed when the round ends.
    published: Published,
    /// The peers' memory mapped this round, one mapping per handle.
    cache: HashMap<MemHandle, (Arc<PeerMem>, u64)>,
}

impl TransportSetup for MappedSetup {
    fn crosses_hosts(&self) -> bool {
        false
    }

    fn describe(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        k: usize,
    ) -> Result<ConnInfo, CommError> {
        let backend = round.ctx.backend();
        let published = &mut self.published;
        Ok(ConnInfo {
            tag: p.tag,
            transport: p.transport,
            kind: p.kind,
            packets: p
                .packets
                .as_ref()
                .map(|b| describe(b, backend, p.remote_rank, published))
                .transpose()?,
            packets_len: p.packets.as_ref().map_or(0, |b| b.len() as u64),
            pid: round.pid,
            buffer_len: p.buffer.len() as u64,
            buffer: describe(&p.buffer, backend, p.remote_rank, published)?,
            flags: match (round.flags, host_flags_for(round, p)) {
                (FlagMemory::Host { _inbound: s, .. }, _) => published.handle(s, p.remote_rank)?,
                (_, Some(h)) => published.handle(&h.segment, p.remote_rank)?,
                _ => round.flags_handle.clone(),
            },
            flag_index: k as u32,
            wire: None,
            failed: None,
        })
    }

    fn connect(
        &mut self,
        round: &Round<'_>,
        p: &PendingConnection,
        peer: &ConnInfo,
        k: usize,
    ) -> Result<Connection, CommError> {
        let ctx = round.ctx;
        let bs = ctx.bootstrap().as_async();
        let same_process =
            peer.pid == round.pid && bs.host_id(p.remote_rank) == bs.host_id(ctx.rank());
        let host_flags = host_flags_for(round, p);
        if let (Backend::Gpu(_), ChannelKind::Proxy, TransportKind::P2p) =
            (ctx.backend(), p.kind, p.transport)
        {
            // The peer's proxy stores where this rank's kernels poll, and the reverse: both
            // ends must use the same mode.
            let peer_mode = match peer.flags {
                MemHandle::Shm { .. } => ProxyFlagMode::Cpu,
                _ => ProxyFlagMode::Stream,
            };
            if peer_mode != ctx.proxy_flag_mode() {
                return Err(mismatch(
                    p.remote_rank,
                    p.tag,
                    format!(
                        "proxy flag modes differ: {} here, {peer_mode} on the peer (set \
                         {PROXY_FLAG_ENV} or CommConfig::proxy_flag alike on every rank)",
                        ctx.proxy_flag_mode()
                    ),
                ));
            }
        }
        let cache = &mut self.cache;
        let (buf_mem, buf_addr) = map_peer(&peer.buffer, same_process, ctx.backend(), cache)?;
        let (flag_mem, flag_addr) = map_peer(&peer.flags, same_process, ctx.backend(), cache)?;
        let flags_len = match &peer.flags {
            MemHandle::Ipc { len, .. } | MemHandle::Shm { len, .. } | MemHandle::Remote { len } => {
                *len
            }
        };
        if (peer.flag_index as u64 + 1) * 8 > flags_len {
            return Err(mismatch(
                p.remote_rank,
                p.tag,
                "peer's flag index is outside its flag memory",
            ));
        }
        let peer_packets = match &peer.packets {
            Some(h) => Some(map_peer(h, same_process, ctx.backend(), cache)?),
            None => None,
        };
        let id = round.id(k);
        Ok(Connection {
            link: None,
            id,
            remote_rank: p.remote_rank,
            tag: p.tag,
            transport: p.transport,
            route: Route {
                id,
                local: p.buffer.addr(),
                local_len: p.buffer.len() as u64,
                remote: buf_addr,
                remote_len: peer.buffer_len,
                remote_flag: flag_addr + peer.flag_index as u64 * 8,
            },
            inbound: host_flags.map_or(round.inbound(k), |h| h.device_addr(k)),
            expected: round.expected(k),
            kind: p.kind,
            packets_in: p.packets.as_ref().map_or(0, |b| b.addr()),
            packets_out: peer_packets.as_ref().map_or(0, |(_, a)| *a),
            packets_len: p.packets.as_ref().map_or(0, |b| b.len() as u64),
            _local: p.buffer.clone(),
            _local_packets: p.packets.clone(),
            _peer_buffer: buf_mem,
            _peer_flags: flag_mem,
            _peer_packets: peer_packets.map(|(m, _)| m),
        })
    }

    fn plane(&self, ctx: &dyn SetupContext, _: &[u64]) -> Result<Box<dyn DataPlane>, CommError> {
        Ok(match ctx.backend() {
            Backend::Gpu(gpu) => Box::new(P2pPlane::with_mode(
                gpu.new_stream()?,
                ctx.proxy_flag_mode(),
            )),
            Backend::Host => Box::new(HostPlane),
        })
    }
}
