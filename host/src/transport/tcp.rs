//! The TCP transport: proxy channels over plain sockets, for machines without RDMA (NCCL's
//! socket transport plays this part there).
//!
//! Each connection has `MSCCLPP_TCP_CONNS` sockets to its peer (default 2, "stripes"), set
//! up by the lower rank connecting to the higher rank's listener (address exchanged in the
//! connection's description over the bootstrap). Both directions of a connection share the
//! sockets: this side's proxy writes frames, this side's receiver threads (one per socket,
//! started at setup, stopped when the connection drops) read the peer's.
//!
//! - A put is cut into chunks of at most `MSCCLPP_TCP_CHUNK` bytes (default 512 KiB), sent
//!   round-robin over the stripes as `DATA(dst_offset, len)` frames straight from the
//!   registered buffer; the receiver reads each chunk straight into its registered buffer at
//!   `dst_offset` (bounds-checked again there: the peer is not trusted), then adds `len` to
//!   its stripe's count of bytes received.
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
use crate::settings::Settings;

use super::backend::Backend;
use super::error::CommError;
use super::setup::{
    ConnInfo, Connection, Link, PendingConnection, Round, SetupContext, TransportSetup, mismatch,
    remote_info,
};
use super::tags::ConnTag;
use super::tcp_stage::Slots;
use super::{DataPlane, Route, TransportError, TransportKind, put_then_signal};

/// Environment variable: sockets per connection (1 to 64, default 2).
pub const TCP_CONNS_ENV: &str = "MSCCLPP_TCP_CONNS";
/// Environment variable: largest chunk of a put on one socket, in bytes (4 KiB to 64 MiB,
/// default 512 KiB).
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
/// Puts up to this size go out as one write with their header.
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
    /// Largest chunk of a put on one socket.
    pub chunk: usize,
    /// Timeout of every wait.
    pub timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig::from_settings(&Settings::default())
    }
}

impl TcpConfig {
    /// The defaults, overridden by `MSCCLPP_TCP_CONNS`, `MSCCLPP_TCP_CHUNK` and
    /// `MSCCLPP_TCP_TIMEOUT_MS`.
    pub fn from_env() -> Result<TcpConfig, TcpError> {
        let s = Settings::global().map_err(|e| TcpError::Config(e.to_string()))?;
        Ok(TcpConfig::from_settings(s))
    }

    /// The values of `settings` ([`Settings::tcp_conns`], [`Settings::tcp_chunk`],
    /// [`Settings::tcp_timeout`]).
    pub fn from_settings(settings: &Settings) -> TcpConfig {
        TcpConfig {
            conns: settings.tcp_conns,
            chunk: settings.tcp_chunk,
            timeout: settings.tcp_timeout,
        }
    }
}

/// The interfaces of this machine with their addresses (IPv4 first, then IPv6; no
/// link-local IPv6, which would need a scope).
fn interfaces() -> io::Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes the head of a list that we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null name is a NUL-terminated string of the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: a non-null address starts with its family; the casts below follow it.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family == libc::AF_INET {
            // SAFETY: AF_INET addresses are sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            v4.push((name, IpAddr::V4(ip)));
        } else if family == libc::AF_INET6 {
            // SAFETY: AF_INET6 addresses are sockaddr_in6.
            let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            if !ip.is_unicast_link_local() {
                v6.push((name, IpAddr::V6(ip)));
            }
        }
    }
    // SAFETY: `head` came from getifaddrs and nothing of it is used after this.
    unsafe { libc::freeifaddrs(head) };
    v4.extend(v6);
    Ok(v4)
}

/// Whether interface `name` matches an `NCCL_SOCKET_IFNAME`-style `spec`.
fn ifname_matches(spec: &str, name: &str) -> bool {
    let (exclude, spec) = match spec.strip_prefix('^') {
        Some(s) => (true, s),
        None => (false, spec),
    };
    let (exact, spec) = match spec.strip_prefix('=') {
        Some(s) => (true, s),
        None => (false, spec),
    };
    let hit = spec
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| {
            if exact {
                name == p
            } else {
                name.starts_with(p)
            }
        });
    hit != exclude
}

/// The interface setting: `MSCCLPP_SOCKET_IFNAME`, else `NCCL_SOCKET_IFNAME` (blank values
/// count as unset), with the variable's name.
fn ifname_spec() -> Result<Option<(&'static str, String)>, TcpError> {
    let s = Settings::global().map_err(|e| TcpError::Config(e.to_string()))?;
    Ok([
        (SOCKET_IFNAME_ENV, &s.socket_ifname),
        (NCCL_SOCKET_IFNAME_ENV, &s.nccl_socket_ifname),
    ]
    .into_iter()
    .find_map(|(var, v)| v.clone().map(|v| (var, v))))
}

/// This machine's interfaces, or a [`TcpError::NoInterface`] for `var`/`spec` that says why
/// they could not be listed.
fn interfaces_for(var: &'static str, spec: &str) -> Result<Vec<(String, IpAddr)>, TcpError> {
    interfaces().map_err(|e| TcpError::NoInterface {
        var,
        spec: spec.to_string(),
        found: format!("cannot list them: {e}"),
    })
}

/// The first address of an interface of `found` that matches `spec`, or the error naming
/// `var`, `spec` and every interface.
fn matching_ip(
    var: &'static str,
    spec: &str,
    found: &[(String, IpAddr)],
) -> Result<IpAddr, TcpError> {
    found
        .iter()
        .find(|(name, _)| ifname_matches(spec, name))
        .map(|(_, ip)| *ip)
        .ok_or_else(|| TcpError::NoInterface {
            var,
            spec: spec.to_string(),
            found: found
                .iter()
                .map(|(n, ip)| format!("{n} {ip}"))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The address to listen on: the first address of an interface matching
/// `MSCCLPP_SOCKET_IFNAME` (else `NCCL_SOCKET_IFNAME`), else `default` (the bootstrap's).
pub fn listen_ip(default: IpAddr) -> Result<IpAddr, TcpError> {
    let Some((var, spec)) = ifname_spec()? else {
        return Ok(default);
    };
    matching_ip(var, &spec, &interfaces_for(var, &spec)?)
}

/// The address a bootstrap root created without an address (the NCCL library's
/// `ncclGetUniqueId`) listens on, so that ranks on other machines can reach it: an
/// interface matching `MSCCLPP_SOCKET_IFNAME` (else `NCCL_SOCKET_IFNAME`); unset, NCCL's
/// own order: an `ib*` interface, else any but `docker*` and `lo*`, else `docker*`, else
/// loopback (IPv4 before IPv6 in each).
pub fn root_ip() -> Result<IpAddr, TcpError> {
    match ifname_spec()? {
        Some((var, spec)) => matching_ip(var, &spec, &interfaces_for(var, &spec)?),
        None => Ok(default_root_ip(&interfaces().unwrap_or_default())),
    }
}

/// [`root_ip`]'s choice among `found` (in [`interfaces`]' order) when no interface is named;
/// 127.0.0.1 when none fits.
fn default_root_ip(found: &[(String, IpAddr)]) -> IpAddr {
    ["ib", "^docker,lo", "docker", "lo"]
        .into_iter()
        .find_map(|spec| {
            found
                .iter()
                .find(|(name, ip)| ifname_matches(spec, name) && !ip.is_unspecified())
                .map(|(_, ip)| *ip)
        })
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
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

/// Fills `buf` from `stream` (whose read timeout is [`POLL`]). Between frames (`idle`),
/// waiting is unbounded; inside a frame, no progress for the shared timeout is an error.
fn read_full(
    stream: &mut TcpStream,
    buf: &mut [u8],
    idle: bool,
    shared: &Shared,
) -> Result<(), Stop> {
    let mut got = 0;
    let mut last = Instant::now();
    while got < buf.len() {
        if shared.closing.load(Ordering::Acquire) {
            return Err(Stop::Closing);
        }
        match stream.read(&mut buf[got..]) {
            Ok(0) if idle && got == 0 => return Err(Stop::Ended),
            Ok(0) => {
                return Err(Stop::Lost(
                    "the peer closed the connection in the middle of a frame".into(),
                ));
            }
            Ok(n) => {
                got += n;
                last = Instant::now();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if !(idle && got == 0) && last.elapsed() > shared.timeout {
                    return Err(Stop::Lost(format!(
                        "no data for {:?} in the middle of a frame",
                        shared.timeout
                    )));
                }
            }
            Err(e) => return Err(Stop::Lost(format!("reading: {e}"))),
        }
    }
    Ok(())
}

/// A GPU receiver's staging: the device's context (bound by the receiver thread) and the
/// receiver's slots, on the process's shared receive stream.
type RecvStage = (Gpu, Slots);

fn cuda_lost(e: CudaError) -> Stop {
    Stop::Lost(format!("staging through host memory: {e}"))
}

/// One stripe's receiver: applies the peer's frames until the connection drops or the peer
/// goes.
fn receive(
    mut stream: TcpStream,
    stripe: usize,
    sink: Sink,
    shared: Arc<Shared>,
    mut stage: Option<RecvStage>,
) {
    let stopped = (|| -> Result<(), Stop> {
        if let Some((gpu, _)) = &stage {
            gpu.bind().map_err(cuda_lost)?;
        }
        loop {
            let mut hdr = [0u8; HEADER];
            read_full(&mut stream, &mut hdr, true, &shared)?;
            let [op, a, b]: [u64; 3] = {
                let mut w = u64s(&hdr);
                [w.next(), w.next(), w.next()].map(|x| x.unwrap_or(0))
            };
            match op {
                OP_DATA => {
                    let (dst, len) = (a, b);
                    if dst.checked_add(len).is_none_or(|end| end > sink.len) {
                        return Err(Stop::Lost(format!(
                            "the peer sent a data frame of length {len} for offset {dst}, \
                             outside the buffer of {} bytes",
                            sink.len
                        )));
                    }
                    match stage.as_mut() {
                        None => {
                            // SAFETY: the range is inside the local buffer (checked above),
                            // which the connection keeps mapped until this thread is joined.
                            // The DevConn contract keeps readers off the range until the
                            // signal after it.
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(
                                    (sink.buffer + dst) as *mut u8,
                                    len as usize,
                                )
                            };
                            read_full(&mut stream, dst, false, &shared)?;
                        }
                        Some((_, slots)) => {
                            let mut off = 0;
                            while off < len {
                                let n = (len - off).min(slots.len() as u64) as usize;
                                let i = slots.take().map_err(cuda_lost)?;
                                read_full(&mut stream, slots.bytes(i, n), false, &shared)?;
                                // SAFETY: inside the local device buffer (checked above), which
                                // the connection keeps until this thread is joined, and this
                                // thread waits for its copies before it ends. The DevConn
                                // contract keeps kernels off the range until the signal after
                                // it, which the copy stream writes after this copy.
                                unsafe { slots.drain(i, sink.buffer + dst + off, n) }
                                    .map_err(cuda_lost)?;
                                off += n as u64;
                            }
                        }
                    }
                    // Release: whoever acquires this count sees the bytes written above (or,
                    // staged, the copies queued above: the flag is queued after them).
                    shared.received[stripe].fetch_add(len, Ordering::Release);
                }
                OP_SIGNAL if stripe == 0 && b as usize == shared.received.len() => {
                    let mut raw = vec![0u8; b as usize * 8];
                    read_full(&mut stream, &mut raw, false, &shared)?;
                    for (s, want) in u64s(&raw).enumerate() {
                        wait_stripe(&shared, s, want, a)?;
                    }
                    if let Some((_, slots)) = &stage {
                        // SAFETY: `inbound` is an aligned word of the round's device flag
                        // memory, which outlives the connection; this thread waits for the
                        // stream before it ends (below), so the write runs before that.
                        unsafe { write_u64_async(sink.inbound, a, slots.stream()) }
                            .map_err(cuda_lost)?;
                        continue;
                    }
                    // SAFETY: `inbound` is an aligned word of the round's flag memory, which
                    // outlives the connection (and so this thread); it is only accessed
                    // atomically.
                    let flag = unsafe { AtomicU64::from_ptr(sink.inbound as *mut u64) };
                    // Release: the waiter's acquire load of this epoch sees every byte
                    // acquired above.
                    flag.store(a, Ordering::Release);
                }
                OP_SIGNAL => {
                    return Err(Stop::Lost(format!(
                        "the peer sent a signal frame on stripe {stripe} with counts for {b} \
                         stripes (signals come on stripe 0 with {} counts)",
                        shared.received.len()
                    )));
                }
                _ => {
                    return Err(Stop::Lost(format!(
                        "the peer sent an unknown frame (op {op}) on stripe {stripe}"
                    )));
                }
            }
        }
    })();
    let mut landed = true;
    if let Some((_, slots)) = stage.as_mut() {
        // The device buffer and the flag may go once this thread is joined: no copy or flag
        // write of this connection may still be queued. The slots' copies are on the same
        // stream, so its synchronize covers them (the stream is shared, so it may hold other
        // connections' work too, which ends on its own).
        if let Err(e) = slots.synchronize() {
            shared.lose(format!("staging through host memory: {e}"));
            landed = false;
        }
    }
    // Release: a signal waiting for this stripe's data (`wait_stripe`) sees the final count.
    shared.ended[stripe].store(true, Ordering::Release);
    match stopped {
        Err(Stop::Lost(why)) => shared.lose(why),
        Err(Stop::Ended) => {
            shared.lose_as("the peer closed the connection".into(), true);
            if landed {
                // Release: whoever acquires the count sees everything this stripe wrote
                // (the staged copies completed above).
                shared.drained.fetch_add(1, Ordering::Release);
            }
        }
        Ok(()) | Err(Stop::Closing) => {}
    }
}

/// Waits until stripe `s` has applied `want` data bytes, which the peer sent before signal
/// `epoch`. Stops only when that stripe's receiver has stopped short of them, when it makes
/// no progress for the timeout, or when the connection is being dropped: not because
/// another stripe ended or a write to the peer failed, since what the peer sent on stripe
/// `s` before it went still lands (a peer that puts, signals and leaves).
fn wait_stripe(shared: &Shared, s: usize, want: u64, epoch: u64) -> Result<(), Stop> {
    // Acquire: pairs with the receivers' release of their counts (their bytes are written).
    let mut got = shared.received[s].load(Ordering::Acquire);
    let mut last = Instant::now();
    while got < want {
        if shared.closing.load(Ordering::Acquire) {
            return Err(Stop::Closing);
        }
        // Acquire: pairs with the release in `receive` once the stripe stopped, after its
        // last count, so the count read next is final.
        if shared.ended[s].load(Ordering::Acquire) {
            let got = shared.received[s].load(Ordering::Acquire);
            if got < want {
                return Err(Stop::Lost(format!(
                    "stripe {s} ended after {got} of the {want} bytes sent on it before \
                     signal {epoch}"
                )));
            }
            return Ok(());
        }
        if last.elapsed() > shared.timeout {
            return Err(Stop::Lost(format!(
                "the data before signal {epoch} did not arrive on stripe {s}: {got} of \
                 {want} bytes, none for {:?}",
                shared.timeout
            )));
        }
        std::thread::yield_now();
        let now = shared.received[s].load(Ordering::Acquire);
        if now > got {
            (got, last) = (now, Instant::now());
        }
    }
    Ok(())
}

/// The sending side of a connection: its sockets and how many data bytes went on each.
#[derive(Debug)]
struct Tx {
    streams: Vec<TcpStream>,
    sent: Vec<u64>,
    next: usize,
    /// One small frame (header + a small put, or a signal).
    scratch: Vec<u8>,
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
    /// field; `flags`: a host-mapped buffer's inbound counters.
    fn new(
        streams: Vec<TcpStream>,
        sink: Sink,
        (peer, tag): (usize, u32),
        timeout: Duration,
        stage: Option<(&Gpu, usize)>,
        host_src: Option<u64>,
        flags: Option<Arc<MappedHostBuffer>>,
    ) -> Result<TcpLink, String> {
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
                scratch: Vec::with_capacity(HEADER + SMALL),
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
        link.tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .streams = senders;
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

/// The link of `route`, and the host address its puts read from (`None`: staged out of
/// the device).
fn link_of<'a>(
    links: &'a [Option<PlaneLink>],
    route: &Route,
) -> Result<(&'a Mutex<Tx>, &'a Shared, Option<u64>), TransportError> {
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

/// Writes `parts` to `stream`, naming the peer on failure (and marking it lost).
fn send(stream: &mut TcpStream, parts: &[&[u8]], shared: &Shared) -> Result<(), TransportError> {
    for part in parts {
        if let Err(e) = stream.write_all(part) {
            let why = match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    format!("no write progress for {:?}", shared.timeout)
                }
                _ => format!("writing: {e}"),
            };
            shared.lose(why.clone());
            return Err(shared.lost().unwrap_or_else(|| shared.error(why)).into());
        }
    }
    Ok(())
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
            if src.len() <= SMALL {
                tx.scratch.extend_from_slice(src);
                send(&mut tx.streams[stripe], &[&tx.scratch], shared)?;
            } else {
                send(&mut tx.streams[stripe], &[&tx.scratch, src], shared)?;
            }
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
        send(&mut tx.streams[0], &[&tx.scratch], shared)
    }

    /// A put of at most 16 KiB (and one chunk) and its signal go out as one write on stripe
    /// 0 (the data frame, then the signal frame counting it): one system call, and one
    /// receiver applies both in one wake-up (the signal of a put sent on another stripe
    /// waits for that stripe's receiver). Larger puts, and a put that fails, take the two
    /// calls.
    fn put_with_signal(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
        epoch: u64,
    ) -> Result<(), TransportError> {
        // At most one chunk (a GPU connection's staging slot holds one).
        let small = SMALL.min(self.chunk) as u64;
        if size == 0 || size > small || route.check(dst_offset, src_offset, size).is_err() {
            return put_then_signal(self, route, dst_offset, src_offset, size, epoch);
        }
        let (tx, shared, host) = link_of(&self.links, route)?;
        let mut tx = tx.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = &mut *tx;
        tx.scratch.clear();
        put_u64s(&mut tx.scratch, &[OP_DATA, dst_offset, size]);
        let src = route.local + src_offset;
        match (host, self.stage.as_mut()) {
            // SAFETY: the route's local range was checked above (`base` the host address
            // of the same buffer) and is kept alive by the connection while the proxy runs;
            // the DevConn contract keeps writers off the source until the put's signal,
            // which is this call, and the kernel's trigger released what it wrote there.
            (Some(base), _) => tx.scratch.extend_from_slice(unsafe {
                std::slice::from_raw_parts((base + src_offset) as *const u8, size as usize)
            }),
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
                    Ok(i) => tx.scratch.extend_from_slice(slots.bytes(i, size as usize)),
                    Err(e) => {
                        // As a failed put: the signal still goes (without the data).
                        tx.scratch.clear();
                        tx.push_signal(epoch);
                        return send(&mut tx.streams[0], &[&tx.scratch], shared).and(Err(e));
                    }
                }
            }
        }
        tx.sent[0] += size;
        tx.push_signal(epoch);
        send(&mut tx.streams[0], &[&tx.scratch], shared)
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
            &[&tx.scratch, slots.bytes(cur, n as usize)],
            shared,
        )?;
        tx.sent[stripe] += n;
        if let Some(j) = next {
            cur = j;
        }
    }
    Ok(())
}

/// The TCP setup of one round: the listener (opened by the first description) and the
/// sockets accepted for connections not finished yet.
#[derive(Debug, Default)]
pub(crate) struct TcpSetup {
    listener: Option<(TcpListener, SocketAddr)>,
    config: Option<TcpConfig>,
    /// Accepted sockets by (rank, tag, stripe), with the stripe count their hello gave.
    accepted: HashMap<(usize, u32, usize), (TcpStream, usize)>,
    /// The round's host-mapped inbound counters (one per connection of the round), made by
    /// the first connection over a host-mapped buffer and shared by the round's others.
    host_flags: Option<Arc<MappedHostBuffer>>,
}

/// What a side's description carries for TCP: where it listens, and how many sockets it
/// wants per connection (the two sides use the smaller).
fn encode_wire(addr: SocketAddr, conns: usize) -> Vec<u8> {
    format!("{addr}|{conns}").into_bytes()
}

fn decode_wire(raw: &[u8]) -> Option<(SocketAddr, usize)> {
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
fn hopeless(
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
fn sockets_op(tag: u32) -> Op {
    Op::RecvNamed(format!("the TCP sockets of the connection ({})", ConnTag(tag)).into())
}

impl TcpSetup {
    /// Accepts until the sockets of (`peer`, `tag`) are all here, or the timeout, or until
    /// `bootstrap` knows that they will not come (`peer` left or was lost, or another rank
    /// was lost: the setup round fails anyway).
    fn accept_for(
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
        let link = TcpLink::new(
            streams,
            sink,
            (rank, tag),
            config.timeout,
            stage,
            host_src,
            flags,
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifname_spec_as_nccl() {
        assert!(ifname_matches("eth", "eth0"));
        assert!(ifname_matches("ib,eth", "eth1"));
        assert!(!ifname_matches("eth", "lo"));
        assert!(ifname_matches("^docker,lo", "eth0"));
        assert!(!ifname_matches("^docker,lo", "docker0"));
        assert!(ifname_matches("=eth0", "eth0"));
        assert!(!ifname_matches("=eth0", "eth01"));
        assert!(!ifname_matches("^=lo", "lo"));
    }

    fn iface(name: &str, ip: &str) -> (String, IpAddr) {
        (name.to_string(), ip.parse().unwrap())
    }

    #[test]
    fn the_root_address_follows_nccl_order_without_a_setting() {
        let lo = iface("lo", "127.0.0.1");
        let eth = iface("eth0", "10.0.0.5");
        let eth6 = iface("eth1", "fd00::5");
        let ib = iface("ib0", "192.168.1.7");
        let docker = iface("docker0", "172.17.0.1");
        let ip = |found: &[(String, IpAddr)]| default_root_ip(found).to_string();
        assert_eq!(ip(&[lo.clone(), eth.clone(), ib.clone()]), "192.168.1.7");
        assert_eq!(ip(&[lo.clone(), docker.clone(), eth.clone()]), "10.0.0.5");
        assert_eq!(ip(&[lo.clone(), docker.clone(), eth6.clone()]), "fd00::5");
        assert_eq!(ip(&[lo.clone(), docker.clone()]), "172.17.0.1");
        assert_eq!(ip(std::slice::from_ref(&lo)), "127.0.0.1");
        assert_eq!(ip(&[]), "127.0.0.1");
    }

    #[test]
    fn a_named_interface_is_used_or_refused_with_every_interface_named() {
        let found = [iface("lo", "127.0.0.1"), iface("eth0", "10.0.0.5")];
        let ip = matching_ip(NCCL_SOCKET_IFNAME_ENV, "=lo", &found).unwrap();
        assert_eq!(ip.to_string(), "127.0.0.1");
        let ip = matching_ip(SOCKET_IFNAME_ENV, "^lo", &found).unwrap();
        assert_eq!(ip.to_string(), "10.0.0.5");
        let e = matching_ip(NCCL_SOCKET_IFNAME_ENV, "ib", &found)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("NCCL_SOCKET_IFNAME=ib") && e.contains("lo 127.0.0.1, eth0 10.0.0.5"),
            "{e}"
        );
    }

    #[test]
    fn the_default_root_address_takes_connections() {
        // On this machine, whatever it picks (its own address, or loopback) must accept a
        // connection from here, as ranks on the same machine make.
        let ip = default_root_ip(&interfaces().unwrap());
        let l = TcpListener::bind((ip, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let _c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        let (_s, _) = l.accept().unwrap();
    }

    #[test]
    fn loopback_is_listed() {
        let found = interfaces().unwrap();
        assert!(found.iter().any(|(_, ip)| ip.is_loopback()), "{found:?}");
    }

    /// Rank 1 of 3 waits in `accept_for` for sockets that rank 0 (alive) never opens while
    /// rank 2 dies (its bootstrap dropped without a goodbye): the wait ends as soon as the
    /// loss is known, naming rank 2, not at the 20 s timeout; a wait for rank 2 itself
    /// fails at once. Before the loss, `hopeless` knows nothing: at once for a wait, after
    /// its grace for a side that already failed.
    #[test]
    fn socket_waits_end_when_a_rank_is_lost() {
        use crate::bootstrap::{BlockingBootstrap, BootstrapConfig, create_unique_id};
        let id = create_unique_id().unwrap();
        let config = BootstrapConfig::default().with_timeout(Duration::from_secs(30));
        let timeout = Duration::from_secs(20);
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let config0 = config.clone();
            s.spawn(move || {
                let bs = BlockingBootstrap::init_with_config(3, 0, id, config0).unwrap();
                bs.barrier().unwrap();
                // Alive, opening nothing, until rank 1 is done.
                let _ = done_rx.recv_timeout(Duration::from_secs(60));
            });
            let config2 = config.clone();
            s.spawn(move || {
                let bs = BlockingBootstrap::init_with_config(3, 2, id, config2).unwrap();
                bs.barrier().unwrap();
                let _ = die_rx.recv_timeout(Duration::from_secs(60));
                bs.abandon();
            });
            let bs = BlockingBootstrap::init_with_config(3, 1, id, config.clone()).unwrap();
            bs.barrier().unwrap();
            let t0 = Instant::now();
            assert!(hopeless(bs.as_async(), 0, &sockets_op(7), false).is_none());
            assert!(t0.elapsed() < LOSS_NEWS_GRACE);
            let t0 = Instant::now();
            assert!(hopeless(bs.as_async(), 0, &sockets_op(7), true).is_none());
            assert!(t0.elapsed() >= LOSS_NEWS_GRACE);
            die_tx.send(()).unwrap();
            let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
            l.set_nonblocking(true).unwrap();
            let addr = l.local_addr().unwrap();
            let mut setup = TcpSetup {
                listener: Some((l, addr)),
                ..TcpSetup::default()
            };
            let t0 = Instant::now();
            let e = setup
                .accept_for(bs.as_async(), 0, 7, 2, timeout)
                .unwrap_err()
                .to_string();
            let took = t0.elapsed();
            assert!(took < Duration::from_secs(10), "{took:?}: {e}");
            assert!(
                e.contains("rank 2 was lost")
                    && e.contains("TCP sockets of the connection (tag 7)"),
                "{e}"
            );
            let t0 = Instant::now();
            let e = setup
                .accept_for(bs.as_async(), 2, 7, 2, timeout)
                .unwrap_err()
                .to_string();
            assert!(t0.elapsed() < Duration::from_secs(1), "{e}");
            assert!(e.contains("rank 2 was lost"), "{e}");
            // A side that failed (refused) learns the loss at once now.
            let t0 = Instant::now();
            let e = hopeless(bs.as_async(), 0, &sockets_op(7), true).map(|e| e.to_string());
            assert!(t0.elapsed() < LOSS_NEWS_GRACE, "{e:?}");
            assert!(e.is_some_and(|e| e.contains("rank 2 was lost")));
            done_tx.send(()).unwrap();
        });
    }

    /// `n` loopback connections: (this side's streams, the peer's).
    fn stream_pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = l.local_addr().unwrap();
        (0..n)
            .map(|_| {
                let peer = TcpStream::connect(addr).unwrap();
                (l.accept().unwrap().0, peer)
            })
            .unzip()
    }

    /// A host-memory link of `stripes` streams receiving into `buf`, its flag in `flag`.
    fn host_link(
        stripes: usize,
        buf: &mut [u8],
        flag: &AtomicU64,
        timeout: Duration,
    ) -> (TcpLink, Vec<TcpStream>) {
        let (ours, peer) = stream_pairs(stripes);
        let sink = Sink {
            buffer: buf.as_mut_ptr() as u64,
            len: buf.len() as u64,
            inbound: flag as *const AtomicU64 as u64,
        };
        let link = TcpLink::new(ours, sink, (1, 7), timeout, None, None, None).unwrap();
        (link, peer)
    }

    fn frame(words: &[u64]) -> Vec<u8> {
        let mut out = Vec::new();
        put_u64s(&mut out, words);
        out
    }

    /// Waits up to 10 s for `done`.
    fn eventually(done: impl Fn() -> bool) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// A peer puts on stripe 1, signals, and leaves; its stripe 2 (which carried nothing)
    /// is read closed before stripe 1's data comes. The signal still waits for that data
    /// and raises the flag; then the link counts as drained. Before, stripe 0 gave up as
    /// soon as any stripe had ended ("another stripe failed"): the peer's last signal was
    /// lost and the wait for it timed out.
    #[test]
    fn a_signal_waits_for_its_data_when_another_stripe_closed_first() {
        let mut buf = vec![0u8; 256];
        let flag = AtomicU64::new(0);
        let (link, mut peer) = host_link(3, &mut buf, &flag, Duration::from_secs(20));
        peer[0]
            .write_all(&frame(&[OP_SIGNAL, 1, 3, 0, 100, 0]))
            .unwrap();
        peer[2].shutdown(std::net::Shutdown::Write).unwrap();
        // Stripe 2's end is seen (the link counts as lost) before the data comes.
        assert!(eventually(|| link.shared.ended[2].load(Ordering::Acquire)));
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            flag.load(Ordering::Acquire),
            0,
            "the flag came before its data"
        );
        let mut data = frame(&[OP_DATA, 16, 100]);
        data.extend((0..100u8).map(|i| i ^ 0x5a));
        peer[1].write_all(&data).unwrap();
        assert!(
            eventually(|| flag.load(Ordering::Acquire) == 1),
            "signal 1 was not raised: {:?}",
            link.shared.lost()
        );
        assert!((0..100).all(|i| buf[16 + i] == i as u8 ^ 0x5a));
        peer.clear();
        assert!(eventually(
            || link.shared.drained.load(Ordering::Acquire) == 3
        ));
        drop(link);
    }

    /// The stripe a signal waits on ends short of the bytes the signal counts: the link is
    /// lost naming that stripe and the counts, and the flag stays down.
    #[test]
    fn a_signal_whose_stripe_ended_short_loses_the_link_naming_it() {
        let mut buf = vec![0u8; 256];
        let flag = AtomicU64::new(0);
        let (link, mut peer) = host_link(2, &mut buf, &flag, Duration::from_secs(20));
        peer[0]
            .write_all(&frame(&[OP_SIGNAL, 1, 2, 0, 64]))
            .unwrap();
        let mut data = frame(&[OP_DATA, 0, 8]);
        data.extend([1u8; 8]);
        peer[1].write_all(&data).unwrap();
        peer[1].shutdown(std::net::Shutdown::Write).unwrap();
        assert!(eventually(|| link.shared.lost().is_some_and(|e| e
            .to_string()
            .contains("stripe 1 ended after 8 of the 64 bytes"))));
        assert_eq!(flag.load(Ordering::Acquire), 0);
        drop(link);
    }

    /// Frames that do not fit are refused in words that say what was wrong: a data frame's
    /// length, a signal with the wrong number of counts.
    #[test]
    fn bad_frames_are_named() {
        let mut buf = vec![0u8; 64];
        let flag = AtomicU64::new(0);
        let (link, mut peer) = host_link(2, &mut buf, &flag, Duration::from_secs(20));
        peer[1]
            .write_all(&frame(&[OP_DATA, 8, u64::MAX - 4]))
            .unwrap();
        assert!(eventually(|| link.shared.lost().is_some()));
        let e = link.shared.lost().unwrap().to_string();
        assert!(
            e.contains("length 18446744073709551611") && e.contains("buffer of 64 bytes"),
            "{e}"
        );
        drop(link);
        let (link, mut peer) = host_link(2, &mut buf, &flag, Duration::from_secs(20));
        peer[0]
            .write_all(&frame(&[OP_SIGNAL, 1, 3, 0, 0, 0]))
            .unwrap();
        assert!(eventually(|| link.shared.lost().is_some()));
        let e = link.shared.lost().unwrap().to_string();
        assert!(
            e.contains("counts for 3 stripes") && e.contains("with 2 counts"),
            "{e}"
        );
        drop(link);
    }

    /// A link dropped while bytes from the peer sit unread (its receiver had stopped on a
    /// bad frame) still delivers everything this side had queued to send: the close is
    /// orderly, not a reset, which would have thrown the queued bytes away.
    #[test]
    fn a_dropped_link_delivers_what_it_had_queued_though_the_peer_sent_more() {
        let mut buf = vec![0u8; 64];
        let flag = AtomicU64::new(0);
        let (link, mut peer) = host_link(1, &mut buf, &flag, Duration::from_secs(20));
        peer[0].write_all(&frame(&[99, 0, 0])).unwrap();
        assert!(eventually(|| link.shared.ended[0].load(Ordering::Acquire)));
        // Bytes no receiver will read.
        peer[0].write_all(&[7u8; 4096]).unwrap();
        // This side's send queue filled (the peer reads nothing yet).
        let out = link.sockets[0].try_clone().unwrap();
        out.set_nonblocking(true).unwrap();
        let chunk = [0x5au8; 64 << 10];
        let mut queued = 0usize;
        loop {
            match (&out).write(&chunk) {
                Ok(n) => queued += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the send queue: {e}"),
            }
        }
        drop(out);
        std::thread::sleep(Duration::from_millis(50));
        drop(link);
        peer[0]
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (mut got, mut b) = (0usize, vec![0u8; 64 << 10]);
        loop {
            match peer[0].read(&mut b) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => panic!("after {got} of the {queued} bytes queued: {e}"),
            }
        }
        assert_eq!(got, queued);
    }

    #[test]
    fn wire_round_trip_and_garbage() {
        let a: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        assert_eq!(decode_wire(&encode_wire(a, 3)), Some((a, 3)));
        assert_eq!(decode_wire(b"127.0.0.1:1|0"), None);
        assert_eq!(decode_wire(b"nonsense"), None);
        assert_eq!(decode_wire(&[0xff, 0xfe]), None);
    }
}
