//! Transports: how a proxy moves bytes and flags between ranks, behind one trait.
//!
//! Like wgpu-hal's backends, each transport implements [`DataPlane`] and the proxy does not
//! know which one it drives; the Host transport runs anywhere (CI, machines without a GPU).
//!
//! - [`TransportKind::P2p`]: CUDA IPC (across processes) or peer access (same process),
//!   copies with `cuMemcpyAsync` on the proxy's stream (copy engine), the flag with
//!   `cuStreamWriteValue64` on the same stream after the data, or (the `cpu`
//!   [`p2p::ProxyFlagMode`]) a CPU store into host memory the peer GPU polls, once the
//!   copies before it are known complete.
//! - [`TransportKind::Host`]: POSIX shared memory ([`shm`]), copies with memcpy by the
//!   proxy thread, the flag with a release store after the data.
//! - [`TransportKind::Ib`]: RDMA WRITEs on one RC queue pair per connection ([`ib`]), the
//!   flag an 8-byte inline write after the data (cargo feature `ib` for real devices).
//! - [`TransportKind::Tcp`]: sockets ([`tcp`]), several per connection, puts striped over
//!   them in chunks, the flag a frame after the data (Host backend).
//!
//! A proxy serving connections of several transports drives a [`PlaneSet`], which hands
//! each route to its connection's plane.
//!
//! Validation: [`Route::check`] refuses any put whose offset + size leaves either buffer,
//! before a byte moves; the planes themselves trust their routes.

pub(crate) mod backend;
pub(crate) mod buffer;
pub(crate) mod error;
mod flag_queue;
pub mod host;
pub mod ib;
pub(crate) mod mapped;
pub mod p2p;
pub(crate) mod setup;
pub mod shm;
pub(crate) mod tags;
pub mod tcp;
mod tcp_stage;

use serde::{Deserialize, Serialize};

/// The transports a connection can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransportKind {
    /// NVLink / PCIe peer copies by the copy engine (needs GPUs that can access each other).
    P2p,
    /// Shared memory and memcpy by the proxy thread (no GPU needed; one machine).
    Host,
    /// InfiniBand / RoCE RDMA writes by the NIC (cargo feature `ib`; needs an RDMA device).
    Ib,
    /// Plain TCP sockets moved by the proxy (no RDMA needed; across machines; Host backend).
    Tcp,
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportKind::P2p => "P2P",
            TransportKind::Host => "Host",
            TransportKind::Ib => "IB",
            TransportKind::Tcp => "TCP",
        })
    }
}

/// Errors of the data plane.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A CUDA call of the P2P transport failed.
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    /// An InfiniBand operation failed.
    #[error(transparent)]
    Ib(#[from] ib::IbError),
    /// A TCP connection failed (its peer is gone, or a setting is wrong).
    #[error(transparent)]
    Tcp(#[from] tcp::TcpError),
    /// A put that would leave one of the two buffers.
    #[error(
        "put of {size} bytes from offset {src_offset} to offset {dst_offset} does not fit \
         (local buffer {local_len} bytes, remote buffer {remote_len} bytes)"
    )]
    OutOfBounds {
        /// Destination offset.
        dst_offset: u64,
        /// Source offset.
        src_offset: u64,
        /// Size.
        size: u64,
        /// Local (source) buffer size.
        local_len: u64,
        /// Remote (destination) buffer size.
        remote_len: u64,
    },
}

/// Where one connection's puts and flags go, as addresses valid in this process (device
/// addresses for P2P, host addresses for Host); for IB, the remote addresses are the peer's
/// virtual addresses inside its registrations (never dereferenced here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The connection's id (its index in the proxy), for planes that keep per-connection
    /// state (IB: the queue pair).
    pub id: u32,
    /// Start of the local (source) buffer.
    pub local: u64,
    /// Its size in bytes.
    pub local_len: u64,
    /// Start of the peer's (destination) buffer, mapped here.
    pub remote: u64,
    /// Its size in bytes.
    pub remote_len: u64,
    /// The peer's inbound counter for this connection, mapped here (8-byte aligned).
    pub remote_flag: u64,
}

impl Route {
    /// Refuses a put that would leave either buffer.
    pub fn check(&self, dst_offset: u64, src_offset: u64, size: u64) -> Result<(), TransportError> {
        let fits = |off: u64, len: u64| off.checked_add(size).is_some_and(|end| end <= len);
        if fits(dst_offset, self.remote_len) && fits(src_offset, self.local_len) {
            Ok(())
        } else {
            Err(TransportError::OutOfBounds {
                dst_offset,
                src_offset,
                size,
                local_len: self.local_len,
                remote_len: self.remote_len,
            })
        }
    }
}

/// What a proxy does for triggers. Operations on one plane complete in the order they were
/// issued (one stream, or one thread), which is what makes the flag-after-data protocol work.
pub trait DataPlane: Send {
    /// Queues a copy of `size` bytes from `route.local + src_offset` to
    /// `route.remote + dst_offset`. The caller has checked the route.
    fn put(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), TransportError>;
    /// Queues the write of `epoch` to the peer's inbound counter, after all earlier puts.
    fn signal(&mut self, route: &Route, epoch: u64) -> Result<(), TransportError>;
    /// A [`put`](Self::put) followed by a [`signal`](Self::signal) on the same connection
    /// (the kernel's `put_with_signal`; the route already checked): a plane may send both at
    /// once. As the two calls, the signal goes even when the put fails (the error is
    /// returned: the proxy records it and the kernel learns of it), so the peer is never
    /// left waiting. The default makes the two calls.
    fn put_with_signal(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        epoch: u64,
    ) -> Result<(), TransportError> {
        put_then_signal(self, route, dst_offset, src_offset, size, epoch)
    }
    /// Waits until everything queued so far has completed (sources may be reused).
    fn flush(&mut self) -> Result<(), TransportError>;
    /// Work the plane does on its own, called by the proxy on every turn of its loop
    /// (IB host staging: copy arrived data into GPU memory, then raise the inbound counter).
    /// Returns whether anything was done. Never waits. The default does nothing.
    fn progress(&mut self) -> Result<bool, TransportError> {
        Ok(false)
    }
    /// Called once by a stopping proxy after its last trigger: completes what the plane
    /// still holds back (the P2P `cpu` flag mode stores its waiting flags). The default does
    /// nothing.
    fn finish(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
    /// Appends to `gone` the connections (route ids) found since the last call whose peer
    /// can deliver nothing more (TCP: a stream of the connection ended or broke, so what
    /// the peer sent before has been received), each once. Called by the proxy when its
    /// FIFO is empty; never waits. The default finds none.
    fn take_gone(&mut self, gone: &mut Vec<u32>) {
        let _ = gone;
    }
    /// Appends to `drained` the connections (route ids) found since the last call on which
    /// the peer has closed every stream cleanly after everything it sent had landed here
    /// (its data and flags written, staged copies complete), each once. Called by the proxy
    /// when its FIFO is empty; never waits. The default (planes whose peer writes directly,
    /// or whose end cannot be told apart from a loss) finds none.
    fn take_drained(&mut self, drained: &mut Vec<u32>) {
        let _ = drained;
    }
    /// Delivers everything the peers' writes have put here so far and returns once it is
    /// visible where they aimed it (IB host staging: the recorded ranges copied out of the
    /// mirror and the flags written, the copies complete). Called by the proxy when the
    /// communicator asks (a peer left with its writes complete, and the user handles' waits
    /// for it may give up once what it wrote is delivered). The default (planes whose peers
    /// write in place) has nothing to do.
    fn settle(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}

/// [`DataPlane::put_with_signal`] as its two calls: the signal goes even when the put
/// fails; the first error is returned. The default, and a plane's way for what it does not
/// send at once.
pub(crate) fn put_then_signal<P: DataPlane + ?Sized>(
    plane: &mut P,
    route: &Route,
    dst_offset: u64,
    src_offset: u64,
    size: u64,
    epoch: u64,
) -> Result<(), TransportError> {
    let put = plane.put(route, dst_offset, src_offset, size);
    let signal = plane.signal(route, epoch);
    put.and(signal)
}

/// Several planes behind one: each connection's operations go to the plane of its transport
/// (by [`Route::id`]); `flush` flushes them all.
pub struct PlaneSet {
    planes: Vec<Box<dyn DataPlane>>,
    plane_of: Vec<usize>,
}

impl std::fmt::Debug for PlaneSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaneSet")
            .field("planes", &self.planes.len())
            .field("plane_of", &self.plane_of)
            .finish()
    }
}

impl PlaneSet {
    /// `plane_of[id]` is the index in `planes` serving connection `id`.
    pub fn new(planes: Vec<Box<dyn DataPlane>>, plane_of: Vec<usize>) -> PlaneSet {
        PlaneSet { planes, plane_of }
    }

    fn plane(&mut self, route: &Route) -> Result<&mut Box<dyn DataPlane>, TransportError> {
        self.plane_of
            .get(route.id as usize)
            .and_then(|&p| self.planes.get_mut(p))
            .ok_or(TransportError::Ib(ib::IbError::UnknownConnection(route.id)))
    }
}

impl DataPlane for PlaneSet {
    fn put(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), TransportError> {
        self.plane(route)?.put(route, dst_offset, src_offset, size)
    }

    fn signal(&mut self, route: &Route, epoch: u64) -> Result<(), TransportError> {
        self.plane(route)?.signal(route, epoch)
    }

    fn put_with_signal(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        epoch: u64,
    ) -> Result<(), TransportError> {
        self.plane(route)?
            .put_with_signal(route, dst_offset, src_offset, size, epoch)
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        let mut first = Ok(());
        for p in &mut self.planes {
            if let Err(e) = p.flush() {
                first = first.and(Err(e));
            }
        }
        first
    }

    fn progress(&mut self) -> Result<bool, TransportError> {
        let mut did = false;
        let mut first = Ok(());
        for p in &mut self.planes {
            match p.progress() {
                Ok(d) => did |= d,
                Err(e) => first = first.and(Err(e)),
            }
        }
        first.map(|()| did)
    }

    fn finish(&mut self) -> Result<(), TransportError> {
        let mut first = Ok(());
        for p in &mut self.planes {
            if let Err(e) = p.finish() {
                first = first.and(Err(e));
            }
        }
        first
    }

    fn take_gone(&mut self, gone: &mut Vec<u32>) {
        for p in &mut self.planes {
            p.take_gone(gone);
        }
    }

    fn take_drained(&mut self, drained: &mut Vec<u32>) {
        for p in &mut self.planes {
            p.take_drained(drained);
        }
    }

    fn settle(&mut self) -> Result<(), TransportError> {
        let mut first = Ok(());
        for p in &mut self.planes {
            if let Err(e) = p.settle() {
                first = first.and(Err(e));
            }
        }
        first
    }
}

#[cfg(test)]
pub(crate) mod tests;
