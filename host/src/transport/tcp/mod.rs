//! The TCP transport: proxy channels over plain sockets, for machines without RDMA (NCCL's
//! socket transport plays this part there).
//!
//! Each connection has `MSCCLPP_TCP_CONNS` sockets to its peer ("stripes"; by default 4
//! on machines with more than 4 cores, else 2: `PARALLEL_CONNS`), set
//! up by the lower rank connecting to the higher rank's listener (address exchanged in the
//! connection's description over the bootstrap). Both directions of a connection share the
//! sockets: this side's proxy writes frames, this side's receiver threads (one per socket,
//! started at setup, stopped when the connection drops) read the peer's.
//!
//! - A put is cut into chunks of at most `MSCCLPP_TCP_CHUNK` bytes (default 512 KiB; a put
//!   of several chunks but no more than there are stripes, evenly; a tail of less than
//!   4 KiB spread over the others), sent
//!   round-robin over the stripes as `DATA(dst_offset, len)` frames straight from the
//!   registered buffer; the receiver reads each chunk straight into its registered buffer at
//!   `dst_offset` (bounds-checked again there: the peer is not trusted), then adds `len` to
//!   its stripe's count of bytes received.
//! - A put of several chunks and at least `PARALLEL_MIN` bytes is written to its stripes
//!   at once, cut into as many chunks as there are stripes when that makes them smaller, by
//!   the proxy's thread
//!   (stripe 0) and a writer thread per other stripe (`send.rs`), when
//!   `MSCCLPP_TCP_PARALLEL` says so (by default on machines with more than 4 cores): one
//!   thread's copies into the kernel's socket buffers were the limit on loopback. The put
//!   returns once every writer is done, as the inline one does.
//! - A signal is a `SIGNAL(epoch, sent[0..stripes])` frame on stripe 0, carrying how many
//!   data bytes the sender had written on each stripe. Stripe 0's receiver raises the
//!   inbound counter (release) only once every stripe has received that many bytes, so the
//!   data is visible before the signal however the stripes interleave.
//! - Memory is bounded: nothing is buffered here beyond one small frame (the kernel's socket
//!   buffers do the rest); a put returns once its bytes are written to the sockets, so
//!   [`DataPlane::flush`] has nothing to wait for and the source may be reused.
//! - Every wait has a timeout (`MSCCLPP_TCP_TIMEOUT_MS`, default 10 s): connecting,
//!   accepting, a write that makes no progress, a frame that stops halfway, a signal whose
//!   data does not arrive.
//! - A peer that dies closes its sockets: the receivers see it at once and the next put or
//!   signal to it fails with [`TcpError::PeerLost`], naming the rank.
//!
//! The interface: `MSCCLPP_SOCKET_IFNAME` (else `NCCL_SOCKET_IFNAME`) as NCCL's (comma-separated
//! name prefixes, `^` to exclude them, `=` for exact names); unset, the address the
//! bootstrap listens on.
//!
//! On the Host backend the registered buffers are host memory that the sockets read and
//! write directly. On the GPU backend the bytes pass through pinned host slots
//! (`tcp_stage.rs`): the proxy copies each chunk of a put out of the device
//! (the next chunk's copy queued while the current one is written to the socket), and each
//! receiver reads a chunk into a slot and queues its copy into the device buffer on the
//! copy stream; the signal's flag is then written on that stream
//! (`cuStreamWriteValue64`), after every copy of the data before it. A connection over a
//! *host-mapped* buffer ([`Communicator::alloc_mapped_buffer`]: pinned host memory the
//! kernels reach over PCIe) skips all of that, as on the Host backend: puts are written to
//! the sockets straight from the buffer (the kernel's trigger is a system-scope release of
//! what it wrote there), the receivers read straight into it, and the signal's flag is a
//! CPU store (release) into a host-mapped inbound counter that the kernel polls. This is
//! the latency path of the collectives across hosts (their cross buffer is host-mapped on
//! the GPU backend): per hop, no copy engine work and no stream to wait for. Every connection of
//! the process on one device shares that receive stream, and the proxies one send stream
//! (`Gpu::shared_stream`): a stream per connection made a process with a few peers pass
//! the driver's count of hardware work queues, and a copy queued behind the spinning kernel
//! that waits for it never ran (seen on one H200 with three simulated hosts under MPS).
//!
//! Not validated: who connects. A hello names a rank and tag, and anyone who can reach the
//! listener during setup could claim them (as with NCCL's sockets; the bootstrap's secret
//! is not carried here).
//!
//! [`Communicator::alloc_mapped_buffer`]: crate::communicator::Communicator::alloc_mapped_buffer

use std::collections::HashMap;
use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;

use crate::bootstrap::{Bootstrap, LOSS_NEWS_GRACE, Op};
use crate::cuda::{CudaError, Gpu, MappedHostBuffer, StreamRole, write_u64_async};
use crate::settings::{Settings, TcpCongestion};

use super::backend::Backend;
use super::error::CommError;
use super::setup::{
    ConnInfo, Connection, Link, PendingConnection, Round, SetupContext, TransportSetup, mismatch,
    remote_info,
};
use super::tags::ConnTag;
use super::tcp_stage::Slots;
use super::{DataPlane, Route, TransportError, TransportKind, put_then_signal};

mod iface;
mod receive;
mod send;
mod setup;
#[cfg(test)]
mod tests;

pub use iface::{listen_ip, root_ip};
use receive::*;
use send::{Share, Writers};
pub(crate) use setup::TcpSetup;

/// Environment variable: sockets per connection (1 to 64, or `auto`: 4 with parallel writes,
/// else 2).
pub const TCP_CONNS_ENV: &str = "MSCCLPP_TCP_CONNS";
/// Environment variable: largest chunk of a put on one socket, in bytes (4 KiB to 64 MiB,
/// default 512 KiB; a tail of less than 4 KiB may be spread over the other chunks).
pub const TCP_CHUNK_ENV: &str = "MSCCLPP_TCP_CHUNK";
/// Environment variable: how long any wait of the transport lasts before it fails, in
/// milliseconds (default 10 000).
pub const TCP_TIMEOUT_ENV: &str = "MSCCLPP_TCP_TIMEOUT_MS";
/// Environment variable: which interface to listen on (as `NCCL_SOCKET_IFNAME`).
pub const SOCKET_IFNAME_ENV: &str = "MSCCLPP_SOCKET_IFNAME";
/// NCCL's variable for the same choice, read when [`SOCKET_IFNAME_ENV`] is not set (so that
/// a job set up for NCCL picks the same interface on us).
pub const NCCL_SOCKET_IFNAME_ENV: &str = "NCCL_SOCKET_IFNAME";

const HELLO_MAGIC: u64 = 0x4d53_4350_5443_5031; // "MSCPTCP1"
const OP_DATA: u64 = 1;
const OP_SIGNAL: u64 = 2;
const HEADER: usize = 24;
/// Sockets per connection by default where large puts are written to their stripes at
/// once. One H100, two ranks as two hosts (nccl-tests all_reduce through the NCCL library,
/// host-mapped cross buffer), against 2 sockets: 4 with the even cut (a 1 MiB piece of the
/// cross-host step in four 260 KiB chunks) took 0.71-0.83x the time at 2-128 MB (128 MB:
/// 29.8 to 21.3 ms, NCCL's sockets 32 ms); 4 or 8 sockets of 512 KiB chunks took the same
/// time as 2, since such a piece filled only two.
const PARALLEL_CONNS: usize = 4;
/// Puts below this size are written by the proxy's thread alone, chunk after chunk, even
/// where large ones go to their stripes at once: a 512 KiB all-reduce whose put went to
/// writer threads in 256 KiB chunks took 1.2-1.3x the time of 2 sockets of 512 KiB (same
/// setting as above; inline, 1.1x, within that size's spread).
const PARALLEL_MIN: u64 = 1 << 20;
/// Puts staged out of the device up to this size go out with their signal in one write.
const SMALL: usize = 16 * 1024;
/// How often a blocked receiver looks at its connection's state.
const POLL: Duration = Duration::from_millis(100);

/// Errors of the TCP transport.
#[derive(Debug, thiserror::Error)]
pub enum TcpError {
    /// The peer is gone (closed its sockets, died, or stopped making progress).
    #[error("TCP connection ({}) with rank {peer} is lost: {why}", ConnTag(*tag))]
    PeerLost {
        /// The peer's rank.
        peer: usize,
        /// The connection's tag.
        tag: u32,
        /// What was seen.
        why: String,
    },
    /// A setting that cannot work.
    #[error("invalid TCP transport setting: {0}")]
    Config(String),
    /// No interface matches `MSCCLPP_SOCKET_IFNAME` (or `NCCL_SOCKET_IFNAME`).
    #[error("no network interface matches {var}={spec} (interfaces: {found})")]
    NoInterface {
        /// The variable that was read.
        var: &'static str,
        /// The setting.
        spec: String,
        /// The interfaces found.
        found: String,
    },
}

/// Settings of the TCP transport, from the environment ([`Settings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConfig {
    /// Sockets per connection.
    pub conns: usize,
    /// Largest chunk of a put on one socket (a tail of less than 4 KiB may be spread over
    /// the other chunks).
    pub chunk: usize,
    /// Timeout of every wait.
    pub timeout: Duration,
    /// A put of several chunks is written to its stripes by a thread each, at once (else
    /// by the proxy's thread, one chunk after the other).
    pub parallel: bool,
    /// The sockets' congestion control; `None`: the system's default.
    pub congestion: Option<TcpCongestion>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig::from_settings(&Settings::default())
    }
}

impl TcpConfig {
    /// The defaults, overridden by `MSCCLPP_TCP_CONNS`, `MSCCLPP_TCP_CHUNK`,
    /// `MSCCLPP_TCP_TIMEOUT_MS`, `MSCCLPP_TCP_PARALLEL` and `MSCCLPP_TCP_CONGESTION`.
    pub fn from_env() -> Result<TcpConfig, TcpError> {
        let s = Settings::global().map_err(|e| TcpError::Config(e.to_string()))?;
        Ok(TcpConfig::from_settings(s))
    }

    /// The values of `settings` ([`Settings::tcp_conns`], [`Settings::tcp_chunk`],
    /// [`Settings::tcp_timeout`], [`Settings::tcp_parallel`],
    /// [`Settings::tcp_congestion`]). Their `auto`: parallel
    /// writes on machines with more than 4 cores (with fewer, the writer threads would take
    /// the cores the receivers and the ranks' own work need), and then 4 sockets
    /// (`PARALLEL_CONNS`), else 2.
    pub fn from_settings(settings: &Settings) -> TcpConfig {
        let parallel = settings
            .tcp_parallel
            .unwrap_or(!crate::machine::few_cores());
        let conns = if parallel { PARALLEL_CONNS } else { 2 };
        TcpConfig {
            conns: settings.tcp_conns.unwrap_or(conns),
            chunk: settings.tcp_chunk,
            timeout: settings.tcp_timeout,
            parallel,
            congestion: settings.tcp_congestion,
        }
    }
}

/// Sets the congestion control `cc` on `socket`, or says why the kernel refused it and which
/// ones it allows.
fn set_congestion(socket: &TcpStream, cc: TcpCongestion) -> Result<(), String> {
    rustix::net::sockopt::set_tcp_congestion(socket, cc.as_str()).map_err(|e| {
        let allowed = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
            .map(|a| a.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        format!(
            "MSCCLPP_TCP_CONGESTION={cc}: the kernel refused it ({e}); allowed without \
             CAP_NET_ADMIN: {allowed}"
        )
    })
}

fn u64s(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
}

fn put_u64s(out: &mut Vec<u8>, words: &[u64]) {
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

/// State a connection's receivers share with its sender.
#[derive(Debug)]
struct Shared {
    peer: usize,
    tag: u32,
    timeout: Duration,
    /// Data bytes each stripe's receiver has written into the local buffer.
    received: Box<[AtomicU64]>,
    /// Per stripe: its receiver has stopped, so its count in `received` is final.
    ended: Box<[AtomicBool]>,
    /// The connection is being dropped (receivers stop quietly).
    closing: AtomicBool,
    /// Receivers whose stream the peer closed between frames, after every frame before had
    /// been applied (its data and flags written, staged copies complete): when all of them
    /// have, everything the peer sent on the connection has landed.
    drained: AtomicUsize,
    /// Why the peer is gone, once it is, and whether that is only that a stream ended
    /// cleanly (which a later, more telling reason replaces: a signal whose data that
    /// stream never brought).
    lost: Mutex<Option<(String, bool)>>,
    lost_flag: AtomicBool,
}

impl Shared {
    fn lose(&self, why: String) {
        self.lose_as(why, false);
    }

    /// Records why the peer is gone (the first reason, unless `ended` only said a stream
    /// ended: see `lost`).
    fn lose_as(&self, why: String, ended: bool) {
        if self.closing.load(Ordering::Acquire) {
            return;
        }
        let mut lost = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        if lost.as_ref().is_none_or(|(_, weak)| *weak && !ended) {
            *lost = Some((why, ended));
        }
        self.lost_flag.store(true, Ordering::Release);
    }

    fn lost(&self) -> Option<TcpError> {
        if !self.lost_flag.load(Ordering::Acquire) {
            return None;
        }
        let why = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        Some(self.error(why.as_ref().map(|(w, _)| w.clone()).unwrap_or_default()))
    }

    fn error(&self, why: String) -> TcpError {
        TcpError::PeerLost {
            peer: self.peer,
            tag: self.tag,
            why,
        }
    }
}

/// What a receiver writes into: the local buffer and the connection's inbound counter.
#[derive(Debug, Clone, Copy)]
struct Sink {
    buffer: u64,
    len: u64,
    inbound: u64,
}

enum Stop {
    /// The connection is being dropped.
    Closing,
    /// The peer closed the stream between frames.
    Ended,
    /// The peer is gone or misbehaved: why.
    Lost(String),
}

/// The sending side of a connection: its sockets and how many data bytes went on each.
#[derive(Debug)]
struct Tx {
    streams: Vec<TcpStream>,
    sent: Vec<u64>,
    next: usize,
    /// The frame headers of one write (a data frame's, a signal frame).
    scratch: Vec<u8>,
    /// Puts of several chunks may write their stripes at once (parallel writes on, more
    /// than one stripe, puts read from host memory).
    parallel: bool,
    /// The threads writing stripes `1..` of such a put: started at the first one, so that
    /// connections that never carry one (most of a large job's) cost no threads.
    writers: Option<Writers>,
}

impl Tx {
    /// Appends a `SIGNAL(epoch, sent[0..stripes])` frame to the scratch: the data bytes sent
    /// so far on each stripe, which the peer's stripe 0 waits for before raising the flag.
    fn push_signal(&mut self, epoch: u64) {
        put_u64s(
            &mut self.scratch,
            &[OP_SIGNAL, epoch, self.streams.len() as u64],
        );
        put_u64s(&mut self.scratch, &self.sent);
    }
}

/// A TCP connection's state, kept by its [`Connection`]: the sockets, the sender state the
/// proxy's plane uses, and the receiver threads (stopped and joined on drop).
#[derive(Debug)]
pub(crate) struct TcpLink {
    tx: Arc<Mutex<Tx>>,
    shared: Arc<Shared>,
    /// Clones of the sockets, to shut them down on drop.
    sockets: Vec<TcpStream>,
    receivers: Vec<JoinHandle<()>>,
    /// The host address puts read the local buffer from (the buffer itself on the Host
    /// backend, a host-mapped buffer's host address); `None`: staged out of the device.
    host_src: Option<u64>,
    /// For a host-mapped local buffer: the host-mapped inbound counters the receivers store
    /// into (kept until the receivers are joined, and as long as the connection).
    _flags: Option<Arc<MappedHostBuffer>>,
}

impl Link for TcpLink {}

impl Drop for TcpLink {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        for s in &self.sockets {
            let _ = s.shutdown(Shutdown::Both);
        }
        for r in self.receivers.drain(..) {
            let _ = r.join();
        }
        // What the peer sent that no receiver read is read and dropped, so that the close
        // is orderly: closing a socket with unread bytes makes Linux reset the connection
        // and throw away what this side had still queued to send (its last put and signal).
        for s in &self.sockets {
            drain_unread(s);
        }
    }
}

/// Reads and drops what has arrived on `stream` and nobody read (at most 64 MiB), without
/// waiting for more.
fn drain_unread(stream: &TcpStream) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = [0u8; 64 << 10];
    let mut left: usize = 64 << 20;
    while left > 0 {
        match (&*stream).read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

impl TcpLink {
    /// `stage`: on the GPU backend, the device and the bytes per receiver slot (`None`
    /// for a host-mapped buffer, whose `sink` holds host addresses); `host_src`: as the
    /// field; `flags`: a host-mapped buffer's inbound counters. Of `config`, the timeout
    /// and whether puts read from host memory (`host_src`) write their stripes at once.
    fn new(
        streams: Vec<TcpStream>,
        sink: Sink,
        (peer, tag): (usize, u32),
        config: TcpConfig,
        stage: Option<(&Gpu, usize)>,
        host_src: Option<u64>,
        flags: Option<Arc<MappedHostBuffer>>,
    ) -> Result<TcpLink, String> {
        let timeout = config.timeout;
        let shared = Arc::new(Shared {
            peer,
            tag,
            timeout,
            received: streams.iter().map(|_| AtomicU64::new(0)).collect(),
            ended: streams.iter().map(|_| AtomicBool::new(false)).collect(),
            closing: AtomicBool::new(false),
            drained: AtomicUsize::new(0),
            lost: Mutex::new(None),
            lost_flag: AtomicBool::new(false),
        });
        let sock = |e: io::Error| format!("starting the TCP receivers: {e}");
        let mut sockets = Vec::with_capacity(streams.len());
        for s in &streams {
            s.set_nodelay(true).map_err(sock)?;
            s.set_write_timeout(Some(timeout)).map_err(sock)?;
            s.set_read_timeout(Some(POLL)).map_err(sock)?;
            if let Some(cc) = config.congestion {
                set_congestion(s, cc)?;
            }
            sockets.push(s.try_clone().map_err(sock)?);
        }
        let copy_stream: Option<Arc<CudaStream>> = match stage {
            Some((gpu, _)) => Some(
                gpu.shared_stream(StreamRole::StageIn)
                    .map_err(|e| format!("the copy stream of the host staging: {e}"))?,
            ),
            None => None,
        };
        let mut link = TcpLink {
            tx: Arc::new(Mutex::new(Tx {
                sent: vec![0; streams.len()],
                streams: Vec::new(),
                next: 0,
                scratch: Vec::with_capacity(2 * HEADER + 8 * streams.len()),
                parallel: false,
                writers: None,
            })),
            shared: shared.clone(),
            sockets,
            receivers: Vec::new(),
            host_src,
            _flags: flags,
        };
        let mut senders = Vec::with_capacity(streams.len());
        for (stripe, s) in streams.into_iter().enumerate() {
            senders.push(s.try_clone().map_err(sock)?);
            let shared = shared.clone();
            let recv_stage = match (stage, &copy_stream) {
                (Some((gpu, len)), Some(cs)) => Some((
                    gpu.clone(),
                    Slots::new(gpu, cs.clone(), len)
                        .map_err(|e| format!("pinned host slots of {len} bytes: {e}"))?,
                )),
                _ => None,
            };
            // On error, `link` drops: the threads started so far are stopped and joined.
            link.receivers.push(
                std::thread::Builder::new()
                    .name(format!("mscclpp-tcp-{peer}-{tag}-{stripe}"))
                    .spawn(move || receive(s, stripe, sink, shared, recv_stage))
                    .map_err(sock)?,
            );
        }
        let mut tx = link.tx.lock().unwrap_or_else(PoisonError::into_inner);
        tx.parallel = config.parallel && host_src.is_some() && senders.len() > 1;
        tx.streams = senders;
        drop(tx);
        Ok(link)
    }
}

/// A connection's sender state, the state it shares with its receivers, and the host
/// address its puts read from (`None`: staged out of the device).
type PlaneLink = (Arc<Mutex<Tx>>, Arc<Shared>, Option<u64>);

/// The TCP data plane: writes each connection's frames to its sockets.
#[derive(Debug)]
pub struct TcpPlane {
    links: Vec<Option<PlaneLink>>,
    /// Per link: reported by [`DataPlane::take_gone`] already.
    gone: Vec<bool>,
    /// Per link: reported by [`DataPlane::take_drained`] already.
    drained: Vec<bool>,
    chunk: usize,
    /// On the GPU backend: the slots puts are copied out of the device through.
    stage: Option<Slots>,
}

/// A [`PlaneLink`] borrowed: the sender state, the shared state and the host source.
type LinkRef<'a> = (&'a Mutex<Tx>, &'a Arc<Shared>, Option<u64>);

/// The link of `route`, and the host address its puts read from (`None`: staged out of
/// the device).
fn link_of<'a>(
    links: &'a [Option<PlaneLink>],
    route: &Route,
) -> Result<LinkRef<'a>, TransportError> {
    match links.get(route.id as usize) {
        Some(Some((tx, shared, host_src))) => match shared.lost() {
            Some(e) => Err(e.into()),
            None => Ok((tx, shared, *host_src)),
        },
        _ => Err(TcpError::Config(format!(
            "connection {} has no TCP sockets in this proxy",
            route.id
        ))
        .into()),
    }
}

/// Writes `parts` to `stream` (gathered: one system call while the socket takes it all),
/// naming the peer on failure (and marking it lost).
fn send<const N: usize>(
    stream: &mut TcpStream,
    parts: [&[u8]; N],
    shared: &Shared,
) -> Result<(), TransportError> {
    let mut slices = parts.map(io::IoSlice::new);
    let mut left = &mut slices[..];
    // Empty parts first (a zero advance skips them).
    io::IoSlice::advance_slices(&mut left, 0);
    while !left.is_empty() {
        match stream.write_vectored(left) {
            Ok(0) => return Err(lost_writing(shared, "the socket took no bytes".into())),
            Ok(n) => io::IoSlice::advance_slices(&mut left, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let why = match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        format!("no write progress for {:?}", shared.timeout)
                    }
                    _ => format!("writing: {e}"),
                };
                return Err(lost_writing(shared, why));
            }
        }
    }
    Ok(())
}

/// Marks the peer lost because a write failed (`why`) and returns the error to report.
#[cold]
fn lost_writing(shared: &Shared, why: String) -> TransportError {
    shared.lose(why.clone());
    shared.lost().unwrap_or_else(|| shared.error(why)).into()
}

/// The size of each chunk when `size` bytes go round-robin over `stripes` sockets in chunks
/// of about `most`. One chunk if it fits. A tail of less than a page past two chunks or more
/// is spread over the others rather than sent alone (a 1 MiB round and its 32-byte header:
/// two chunks, a little over `most`, not three). A put of no more chunks than there are
/// stripes, or one whose tail was spread, is cut evenly (rounded up to 4 KiB, so the last
/// may be shorter); other puts go in chunks of `most`.
fn even_chunk(size: u64, most: u64, stripes: u64) -> u64 {
    let chunks = size.div_ceil(most);
    if chunks < 2 {
        return most;
    }
    let tail = size % most;
    if chunks > 2 && tail != 0 && tail < 4096 {
        return size.div_ceil(chunks - 1).next_multiple_of(4096);
    }
    if chunks > stripes {
        return most;
    }
    size.div_ceil(chunks).next_multiple_of(4096).min(most)
}

impl DataPlane for TcpPlane {
    fn put(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), TransportError> {
        route.check(dst_offset, src_offset, size)?;
        let chunk = self.chunk as u64;
        let (tx, shared, host) = link_of(&self.links, route)?;
        let mut tx = tx.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = &mut *tx;
        let Some(base) = host else {
            let slots = self
                .stage
                .as_mut()
                .expect("the plane has slots while a link stages");
            return put_staged(
                tx, shared, slots, route, dst_offset, src_offset, size, chunk,
            );
        };
        let chunks = if size < PARALLEL_MIN {
            1
        } else {
            size.div_ceil(chunk)
        };
        if chunks >= 2 && tx.parallel && tx.writers.is_none() {
            // Without threads (none could be started), the put is written inline.
            tx.writers = tx.streams[1..]
                .iter()
                .map(TcpStream::try_clone)
                .collect::<io::Result<Vec<_>>>()
                .and_then(|clones| Writers::start(clones, shared))
                .ok();
            tx.parallel = tx.writers.is_some();
        }
        if let Some(w) = &tx.writers
            && chunks >= 2
        {
            // Every stripe gets a share: at most a chunk, at least 4 KiB, evenly cut.
            let streams = (w.len() + 1) as u64;
            let chunk = chunk.min(size.div_ceil(streams).next_multiple_of(4096));
            let stripes = (size.div_ceil(chunk) as usize).min(w.len() + 1);
            let share = |first: usize| Share {
                src: base + src_offset,
                dst: dst_offset,
                size,
                chunk,
                first: first as u64,
                step: stripes as u64,
            };
            for j in 1..stripes {
                w.hand(j, share(j));
            }
            // SAFETY: the route's local range was checked above (`base` is the host address
            // of the same buffer) and is kept alive by the connection while the proxy runs;
            // the DevConn contract keeps writers off the source until the put's signal or
            // flush, which come after this put, and the writers are waited for below.
            let mut failed = unsafe { share(0).write(&mut tx.streams[0], &mut tx.scratch, shared) }
                .err()
                .map(|e| e.to_string());
            tx.sent[0] += share(0).bytes();
            for j in 1..stripes {
                if let Err(e) = w.finish(j) {
                    failed.get_or_insert(e);
                }
                tx.sent[j] += share(j).bytes();
            }
            return match failed {
                None => Ok(()),
                Some(why) => Err(shared.lost().unwrap_or_else(|| shared.error(why)).into()),
            };
        }
        // A put a little longer than a chunk (a payload and its header) goes as halves on
        // two stripes, not as a chunk on one and a tail of a few bytes on the other.
        let chunk = even_chunk(size, chunk, tx.streams.len() as u64);
        let mut done = 0;
        while done < size {
            let n = chunk.min(size - done);
            let stripe = tx.next;
            tx.next = (tx.next + 1) % tx.streams.len();
            // SAFETY: the route's local range was checked above (`base` is the host address
            // of the same buffer) and is kept alive by the connection while the proxy runs;
            // the DevConn contract keeps writers off the source until the put's signal or
            // flush, and a kernel's trigger releases (system scope) what it wrote before.
            let src = unsafe {
                std::slice::from_raw_parts((base + src_offset + done) as *const u8, n as usize)
            };
            tx.scratch.clear();
            put_u64s(&mut tx.scratch, &[OP_DATA, dst_offset + done, n]);
            send(&mut tx.streams[stripe], [&tx.scratch, src], shared)?;
            tx.sent[stripe] += n;
            done += n;
        }
        Ok(())
    }

    fn signal(&mut self, route: &Route, epoch: u64) -> Result<(), TransportError> {
        let (tx, shared, _) = link_of(&self.links, route)?;
        // Staged puts are in the sockets when they return, like the others.
        let mut tx = tx.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = &mut *tx;
        tx.scratch.clear();
        tx.push_signal(epoch);
        send(&mut tx.streams[0], [&tx.scratch], shared)
    }

    /// A put of one chunk (at most 16 KiB when staged out of the device) and its signal go
    /// out on stripe 0 as one gathered write (the data frame, then the signal frame counting
    /// it): one system call, no copy of a host source, and one receiver applies both in one
    /// wake-up (the signal of a put sent on another stripe would wait for that stripe's
    /// receiver). Larger puts, and a put that fails, take the two calls.
    fn put_with_signal(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        epoch: u64,
    ) -> Result<(), TransportError> {
        let Ok((tx, shared, host)) = link_of(&self.links, route) else {
            return put_then_signal(self, route, dst_offset, src_offset, size, epoch);
        };
        // A GPU connection's staging slot holds one chunk; small ones are copied whole.
        let most = if host.is_some() {
            self.chunk
        } else {
            SMALL.min(self.chunk)
        } as u64;
        if size == 0 || size > most || route.check(dst_offset, src_offset, size).is_err() {
            return put_then_signal(self, route, dst_offset, src_offset, size, epoch);
        }
        let mut tx = tx.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = &mut *tx;
        let src = route.local + src_offset;
        let payload: &[u8] = match (host, self.stage.as_mut()) {
            // SAFETY: the route's local range was checked above (`base` the host address
            // of the same buffer) and is kept alive by the connection while the proxy runs;
            // the DevConn contract keeps writers off the source until the put's signal,
            // which is this call, and the kernel's trigger released what it wrote there.
            (Some(base), _) => unsafe {
                std::slice::from_raw_parts((base + src_offset) as *const u8, size as usize)
            },
            (None, None) => unreachable!("the plane has slots while a link stages"),
            (None, Some(slots)) => {
                let staged = (|| -> Result<usize, TransportError> {
                    let i = slots.take()?;
                    // SAFETY: inside the route's local device range (checked above), kept by
                    // the connection while the proxy runs; the DevConn contract keeps kernels
                    // from writing the source until this signal, and the copy is waited for
                    // below, before this call returns.
                    unsafe { slots.fill(i, src, size as usize)? };
                    slots.wait(i)?;
                    Ok(i)
                })();
                match staged {
                    Ok(i) => slots.bytes(i, size as usize),
                    Err(e) => {
                        // As a failed put: the signal still goes (without the data).
                        tx.scratch.clear();
                        tx.push_signal(epoch);
                        return send(&mut tx.streams[0], [&tx.scratch], shared).and(Err(e));
                    }
                }
            }
        };
        tx.scratch.clear();
        put_u64s(&mut tx.scratch, &[OP_DATA, dst_offset, size]);
        tx.sent[0] += size;
        tx.push_signal(epoch);
        let (data, signal) = tx.scratch.split_at(HEADER);
        send(&mut tx.streams[0], [data, payload, signal], shared)
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        // Every put and signal is in the sockets when its call returns.
        Ok(())
    }

    /// Links whose peer is lost (`Shared::lose`: a receiver's stream ended or broke, or
    /// a write failed). A stream ends only after everything the peer wrote to it before;
    /// signals wait for their data on the other stripes, so what the peer sent lands
    /// within moments of this report (the waits give it a grace).
    fn take_gone(&mut self, gone: &mut Vec<u32>) {
        for (id, link) in self.links.iter().enumerate() {
            if let Some((_, shared, _)) = link
                && !self.gone[id]
                // Acquire: pairs with `lose`'s release (nothing else is read through it).
                && shared.lost_flag.load(Ordering::Acquire)
            {
                self.gone[id] = true;
                gone.push(id as u32);
            }
        }
    }

    /// Links on which the peer closed every stream between frames after all it had sent
    /// was applied (`Shared::drained` counts every stripe's receiver).
    fn take_drained(&mut self, drained: &mut Vec<u32>) {
        for (id, link) in self.links.iter().enumerate() {
            if let Some((_, shared, _)) = link
                && !self.drained[id]
                // Acquire: pairs with the receivers' release (their writes have landed).
                && shared.drained.load(Ordering::Acquire) == shared.received.len()
            {
                self.drained[id] = true;
                drained.push(id as u32);
            }
        }
    }
}

/// A put on the GPU backend: chunks of at most `chunk` bytes (and a slot) copied out of the
/// device through the two slots, the next chunk's copy queued before the current chunk is
/// written to its socket.
#[allow(clippy::too_many_arguments)]
fn put_staged(
    tx: &mut Tx,
    shared: &Shared,
    slots: &mut Slots,
    route: &Route,
    dst_offset: u64,
    src_offset: u64,
    size: u64,
    chunk: u64,
) -> Result<(), TransportError> {
    let step = chunk.min(slots.len() as u64);
    let pieces = size.div_ceil(step);
    let piece = |k: u64| (k * step, step.min(size - k * step));
    let src = route.local + src_offset;
    let fill = |slots: &mut Slots, k: u64| -> Result<usize, TransportError> {
        let (off, n) = piece(k);
        let i = slots.take()?;
        // SAFETY: inside the route's local device range (checked by the caller), which the
        // connection keeps while the proxy runs; the DevConn contract keeps kernels from
        // writing the source until the put's signal or flush, which come after this put
        // returns, and this put waits for the copy before it returns.
        unsafe { slots.fill(i, src + off, n as usize)? };
        Ok(i)
    };
    if pieces == 0 {
        return Ok(());
    }
    let mut cur = fill(slots, 0)?;
    for k in 0..pieces {
        let next = if k + 1 < pieces {
            Some(fill(slots, k + 1)?)
        } else {
            None
        };
        slots.wait(cur)?;
        let (off, n) = piece(k);
        let stripe = tx.next;
        tx.next = (tx.next + 1) % tx.streams.len();
        tx.scratch.clear();
        put_u64s(&mut tx.scratch, &[OP_DATA, dst_offset + off, n]);
        send(
            &mut tx.streams[stripe],
            [&tx.scratch, slots.bytes(cur, n as usize)],
            shared,
        )?;
        tx.sent[stripe] += n;
        if let Some(j) = next {
            cur = j;
        }
    }
    Ok(())
}
