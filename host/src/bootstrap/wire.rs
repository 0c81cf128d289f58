//! Wire format of the bootstrap: length-prefixed frames of a bincode header and raw payload.
//!
//! Every frame is
//!
//! ```text
//! header_len: u32 LE | payload_len: u64 LE | header: bincode(Message) | payload: raw bytes
//! ```
//!
//! The header is small (a [`Message`]); bulk data travels in the payload so that it is never
//! copied into an encoding buffer. What is validated here: both lengths against
//! [`FrameLimits`] *before* any allocation, the header decodes to exactly `header_len` bytes,
//! and bincode never allocates more than [`MAX_HEADER_LEN`] for a claimed collection. What is
//! not: the meaning of a message (magic, version, secret, ranks), which the handshakes in
//! `root` and `mesh` check on every connection.
//!
//! The module is public so that fuzzers and tools can drive the decoder; [`decode_frame`] is
//! the sans-I/O form of the async reader and shares all its checks.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::error::Refusal;

/// Magic at the start of every handshake and of every [`UniqueId`](super::UniqueId).
pub const MAGIC: [u8; 8] = *b"MSCCLPPB";
/// Version of the bootstrap protocol; peers and ids of another version are refused.
///
/// Version 2: refusals for malformed frames and the refused joins in a rendezvous timeout.
/// Version 3: [`Message::GoodbyeAfter`].
/// Version 4: [`Message::GoodbyeIdle`].
/// Version 5: [`Message::PeerClosed`].
/// Version 6: [`Refusal::RankEnded`]; process ids in [`Join`] and
/// [`PeerInfo`].
/// Version 7: [`Message::PeerStalled`].
/// Version 8: the process space of each rank ([`Join::process_space`],
/// [`PeerInfo::process_space`]); why a rank closed, in [`Message::PeerClosed`]; what was
/// seen of a stalled rank's process, in [`Message::PeerStalled`].
/// Version 9: the ranks that never joined as runs, in [`Refusal::RendezvousTimeout`]
/// ([`RankRanges`](super::RankRanges)).
/// Version 10: the job each rank belongs to ([`Join::job`]), and
/// [`Refusal::OtherJob`].
pub const PROTOCOL_VERSION: u32 = 10;
/// Bytes of the fixed frame prefix (`header_len` and `payload_len`).
pub const PREFIX_LEN: usize = 12;
/// Largest header any frame may carry.
pub const MAX_HEADER_LEN: usize = 16 * 1024;
/// Largest peer table the root may send (bytes of its payload).
pub const MAX_PEER_TABLE_LEN: usize = 64 * 1024 * 1024;
/// Longest host id a rank may present.
pub const MAX_HOST_ID_LEN: usize = 256;
/// Longest job identity a rank may present ([`Join::job`]; longer ones are cut at a
/// character boundary by the rank).
pub const MAX_JOB_ID_LEN: usize = 128;
/// Longest operation name a [`Message::PeerStalled`] carries (bytes; longer names are cut at
/// a character boundary by [`Message::peer_stalled`], and on receipt).
pub const MAX_STALLED_OP_LEN: usize = 256;
/// Longest reason a [`Message::PeerClosed`] carries (bytes; longer ones are cut at a
/// character boundary by [`Message::peer_closed`], and on receipt).
pub const MAX_CLOSED_WHY_LEN: usize = 1024;
/// A payload is read into a buffer of at most this size up front; larger payloads grow the
/// buffer as bytes actually arrive, so a lying length prefix cannot make us allocate much.
const INITIAL_PAYLOAD_CAPACITY: usize = 4 * 1024 * 1024;

/// Size limits a reader enforces on each frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest accepted header, in bytes (at most [`MAX_HEADER_LEN`]).
    pub max_header: usize,
    /// Largest accepted payload, in bytes.
    pub max_payload: usize,
}

impl FrameLimits {
    /// Limits for the first frame of an unauthenticated connection: a small header, no payload.
    pub const HANDSHAKE: FrameLimits = FrameLimits {
        max_header: 1024,
        max_payload: 0,
    };

    /// Limits for an authenticated connection whose payloads may be `max_payload` bytes.
    pub const fn with_max_payload(max_payload: usize) -> FrameLimits {
        FrameLimits {
            max_header: MAX_HEADER_LEN,
            max_payload,
        }
    }
}

/// Which mailbox a data frame goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Channel {
    /// A user `send(peer, tag, ..)`.
    User(u64),
    /// Step `step` of the collective with sequence number `seq`.
    Collective {
        /// Sequence number of the collective on this bootstrap (same on every rank).
        seq: u64,
        /// Step or round inside the collective.
        step: u32,
    },
}

/// First frame a rank sends to the root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Join {
    /// Must be [`MAGIC`].
    pub magic: [u8; 8],
    /// Must be [`PROTOCOL_VERSION`].
    pub version: u32,
    /// Secret from the unique id.
    pub secret: [u8; 32],
    /// Number of ranks the rank was started with.
    pub nranks: u32,
    /// The rank's rank.
    pub rank: u32,
    /// Where the rank accepts connections from its peers.
    pub listen_addr: SocketAddr,
    /// Identifies the rank's node (ranks with equal ids share a node).
    pub host_id: String,
    /// The rank's process id (on its node).
    pub pid: u32,
    /// Where `pid` means something: the machine and its process id namespace
    /// (`hostname/boot-id/pid-namespace`, at most [`MAX_HOST_ID_LEN`] bytes), whatever
    /// `host_id` says (simulated hosts split one machine). Ranks with equal, non-empty
    /// values can look at each other's processes.
    pub process_space: String,
    /// The job the rank belongs to, as its launcher names it (`MSCCLPP_JOB_ID=...`,
    /// `SLURM_JOB_ID=...`; see [`BootstrapConfig::job_id`](super::BootstrapConfig::job_id)),
    /// at most [`MAX_JOB_ID_LEN`] bytes; empty when nothing names it. The root of the
    /// `"ip:port"` form refuses a rank of another job ([`Refusal::OtherJob`]). Not a secret.
    pub job: String,
}

/// First frame a rank sends to a peer it dials.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Must be [`MAGIC`].
    pub magic: [u8; 8],
    /// Must be [`PROTOCOL_VERSION`].
    pub version: u32,
    /// Secret from the unique id.
    pub secret: [u8; 32],
    /// Number of ranks of the dialing rank.
    pub nranks: u32,
    /// The dialing rank.
    pub from: u32,
    /// The rank it means to reach.
    pub to: u32,
}

/// One entry of the peer table the root sends to every rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// Where the rank accepts peer connections.
    pub addr: SocketAddr,
    /// The rank's host id.
    pub host_id: String,
    /// The rank's process id (on its host).
    pub pid: u32,
    /// Where `pid` means something ([`Join::process_space`]).
    pub process_space: String,
}

/// Header of a frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Rank to root: join the rendezvous.
    Join(Join),
    /// Root to rank: the rendezvous is complete; the payload is the bincode peer table
    /// (`Vec<PeerInfo>`, indexed by rank).
    Welcome,
    /// Root or peer to a connecting rank: the connection is refused.
    Refused(Refusal),
    /// Rank to rank: open a connection.
    Hello(Hello),
    /// Rank to rank: the hello is accepted.
    HelloAck,
    /// Rank to rank: the payload is a message for `channel`.
    Data {
        /// Mailbox of the message.
        channel: Channel,
    },
    /// Rank to rank: the sender is closing its bootstrap on purpose.
    Goodbye,
    /// Rank to rank: `rank` was lost (its connection broke without a goodbye).
    PeerLost {
        /// The lost rank.
        rank: u32,
        /// What the reporting rank saw.
        detail: String,
    },
    /// Rank to rank: a [`Goodbye`](Message::Goodbye) from a rank whose collectives had made
    /// `calls` calls, all finished (see `Bootstrap::set_calls_at_close`).
    GoodbyeAfter {
        /// The number of calls.
        calls: u64,
    },
    /// Rank to rank: a [`Goodbye`](Message::Goodbye) from a rank all of whose work had
    /// ended (its kernels and its proxy's transfers), so everything it sent had landed (see
    /// `Bootstrap::set_work_ended_at_close`). A [`GoodbyeAfter`](Message::GoodbyeAfter)
    /// says this too.
    GoodbyeIdle,
    /// Rank to rank, just before a goodbye: `rank` closed its bootstrap after completing
    /// `collectives` bootstrap collectives. Sent about the sender itself, and about the
    /// first rank the sender knew to have closed before it: the ranks pass it along, so
    /// that a rank waiting in a collective that a closed rank never completed fails at
    /// once, naming that rank (a rank whose set-up failed, say), not the neighbour that
    /// failed because of it.
    PeerClosed {
        /// The rank that closed.
        rank: u32,
        /// The bootstrap collectives it completed (every one before that number).
        collectives: u64,
        /// Why it closed, as it said (its own error: a set-up that failed on it), at most
        /// [`MAX_CLOSED_WHY_LEN`] bytes; empty when it said nothing. Build it with
        /// [`Message::peer_closed`], which bounds it.
        why: String,
    },
    /// Rank to rank: the sender gave up waiting for `rank` in `op` (its wait timed out).
    /// `rank` is the root cause as far as the sender knew: when the rank it waited for had
    /// itself reported giving up on another, that other (followed to the end of the chain).
    /// Sent the moment the wait times out, so that ranks waiting on the sender, whose waits
    /// time out at about the same moment, can name the stalled rank rather than the sender.
    /// Build it with [`Message::peer_stalled`], which bounds `op`.
    PeerStalled {
        /// The rank the sender gave up waiting for.
        rank: u32,
        /// The operation the sender gave up in (at most [`MAX_STALLED_OP_LEN`] bytes).
        op: String,
        /// What was seen of `rank`'s process on its own machine, by the sender or a rank
        /// whose report it followed (`rank 1 (pid 42) is stopped by a signal ...`; at most
        /// [`MAX_STALLED_OP_LEN`] bytes); empty when nothing was seen.
        seen: String,
    },
}

impl Message {
    /// A [`PeerStalled`](Message::PeerStalled) report with `op` and `seen` cut to
    /// [`MAX_STALLED_OP_LEN`] bytes (at a character boundary), so that a long operation
    /// name (a caller's [`recv_named`](super::Bootstrap::recv_named)) never makes the frame
    /// too large to encode.
    pub fn peer_stalled(rank: u32, op: &str, seen: &str) -> Message {
        Message::PeerStalled {
            rank,
            op: bounded(op, MAX_STALLED_OP_LEN).to_owned(),
            seen: bounded(seen, MAX_STALLED_OP_LEN).to_owned(),
        }
    }

    /// A [`PeerClosed`](Message::PeerClosed) news item with `why` cut to
    /// [`MAX_CLOSED_WHY_LEN`] bytes (at a character boundary).
    pub fn peer_closed(rank: u32, collectives: u64, why: &str) -> Message {
        Message::PeerClosed {
            rank,
            collectives,
            why: bounded(why, MAX_CLOSED_WHY_LEN).to_owned(),
        }
    }

    /// Whether this is a goodbye ([`Goodbye`](Message::Goodbye),
    /// [`GoodbyeAfter`](Message::GoodbyeAfter) or [`GoodbyeIdle`](Message::GoodbyeIdle)).
    pub fn is_goodbye(&self) -> bool {
        matches!(
            self,
            Message::Goodbye | Message::GoodbyeAfter { .. } | Message::GoodbyeIdle
        )
    }

    /// Whether this goodbye says that all of the sender's work had ended
    /// ([`GoodbyeAfter`](Message::GoodbyeAfter) or [`GoodbyeIdle`](Message::GoodbyeIdle)).
    pub fn work_ended(&self) -> bool {
        matches!(self, Message::GoodbyeAfter { .. } | Message::GoodbyeIdle)
    }

    /// The calls a [`GoodbyeAfter`](Message::GoodbyeAfter) names; `None` for any other frame.
    pub fn calls_named(&self) -> Option<u64> {
        match self {
            Message::GoodbyeAfter { calls } => Some(*calls),
            _ => None,
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends at a character boundary.
pub(crate) fn bounded(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The header.
    pub message: Message,
    /// The payload (empty for most messages).
    pub payload: Vec<u8>,
}

/// Why a frame could not be encoded, read or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The header length is 0 or above the limit.
    #[error("frame header length {len} is outside 1..={max} bytes")]
    HeaderSize {
        /// Claimed header length.
        len: u64,
        /// Limit in force.
        max: usize,
    },
    /// The payload length is above the limit.
    #[error("frame payload length {len} exceeds the limit of {max} bytes")]
    PayloadTooLarge {
        /// Claimed payload length.
        len: u64,
        /// Limit in force.
        max: usize,
    },
    /// The header bytes are not a valid message.
    #[error("frame header does not decode: {0}")]
    Decode(String),
    /// The header is a handshake ([`Join`] or [`Hello`]) of another protocol version, whose
    /// fields differ from this version's (so it does not decode as a message of ours).
    #[error(
        "a handshake of bootstrap protocol version {theirs} (this build speaks version {PROTOCOL_VERSION})"
    )]
    OtherVersion {
        /// The version the handshake says.
        theirs: u32,
    },
    /// The header decoded from fewer bytes than announced.
    #[error("frame header decoded from {used} of its {len} bytes (wrong header length)")]
    TrailingBytes {
        /// Bytes the decoder used.
        used: usize,
        /// Announced header length.
        len: usize,
    },
    /// A message could not be encoded (too large for the header limit).
    #[error("cannot encode frame: {0}")]
    Encode(String),
    /// The stream ended inside a frame.
    #[error("connection closed in the middle of a frame ({got} of {expected} bytes)")]
    Truncated {
        /// Bytes of the current part expected.
        expected: u64,
        /// Bytes received.
        got: u64,
    },
    /// The underlying stream failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

fn header_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_HEADER_LEN>()
}

/// Encodes the prefix and header of a frame whose payload has `payload_len` bytes.
pub fn encode_head(message: &Message, payload_len: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; PREFIX_LEN];
    let header = bincode::serde::encode_to_vec(message, header_config())
        .map_err(|e| FrameError::Encode(e.to_string()))?;
    if header.is_empty() || header.len() > MAX_HEADER_LEN {
        return Err(FrameError::HeaderSize {
            len: header.len() as u64,
            max: MAX_HEADER_LEN,
        });
    }
    out[..4].copy_from_slice(&(header.len() as u32).to_le_bytes());
    out[4..12].copy_from_slice(&(payload_len as u64).to_le_bytes());
    out.extend_from_slice(&header);
    Ok(out)
}

/// Encodes a whole frame into one buffer.
pub fn encode_frame(message: &Message, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    let mut out = encode_head(message, payload.len())?;
    out.extend_from_slice(payload);
    Ok(out)
}

/// Checks a frame prefix against `limits`; returns `(header_len, payload_len)`.
pub fn parse_prefix(
    prefix: &[u8; PREFIX_LEN],
    limits: &FrameLimits,
) -> Result<(usize, usize), FrameError> {
    let header_len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as u64;
    let mut p = [0u8; 8];
    p.copy_from_slice(&prefix[4..12]);
    let payload_len = u64::from_le_bytes(p);
    let max_header = limits.max_header.min(MAX_HEADER_LEN);
    if header_len == 0 || header_len > max_header as u64 {
        return Err(FrameError::HeaderSize {
            len: header_len,
            max: max_header,
        });
    }
    if payload_len > limits.max_payload as u64 {
        return Err(FrameError::PayloadTooLarge {
            len: payload_len,
            max: limits.max_payload,
        });
    }
    // Both fit in usize: they are bounded by limits that are usizes.
    Ok((header_len as usize, payload_len as usize))
}

/// Decodes a header that must span all of `bytes`.
pub fn decode_header(bytes: &[u8]) -> Result<Message, FrameError> {
    let (message, used) = bincode::serde::decode_from_slice::<Message, _>(bytes, header_config())
        .map_err(|e| match handshake_version(bytes) {
        Some(theirs) if theirs != PROTOCOL_VERSION => FrameError::OtherVersion { theirs },
        _ => FrameError::Decode(e.to_string()),
    })?;
    if used != bytes.len() {
        return Err(FrameError::TrailingBytes {
            used,
            len: bytes.len(),
        });
    }
    Ok(message)
}

/// The start that every version's [`Join`] and [`Hello`] share: the magic, then the version.
#[derive(Deserialize)]
struct HandshakeStart {
    magic: [u8; 8],
    version: u32,
}

/// [`Message`]'s first variants, as every protocol version numbers them, with only the start
/// of the two handshakes: enough to read another version's handshake.
#[derive(Deserialize)]
enum HandshakeOnly {
    Join(HandshakeStart),
    Welcome,
    Refused,
    Hello(HandshakeStart),
}

/// The protocol version of a header that starts as a [`Join`] or [`Hello`] with our
/// [`MAGIC`] (of any version: their first fields never change), else `None`.
pub fn handshake_version(bytes: &[u8]) -> Option<u32> {
    match bincode::serde::decode_from_slice::<HandshakeOnly, _>(bytes, header_config()) {
        Ok((HandshakeOnly::Join(h) | HandshakeOnly::Hello(h), _)) if h.magic == MAGIC => {
            Some(h.version)
        }
        _ => None,
    }
}

/// Decodes one frame from the front of `buf`.
///
/// Returns `Ok(None)` when `buf` holds a valid but incomplete frame, and
/// `Ok(Some((frame, consumed)))` when a whole frame was decoded. Limits are checked as soon
/// as the prefix is complete, before waiting for the rest.
pub fn decode_frame(
    buf: &[u8],
    limits: &FrameLimits,
) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(prefix) = buf.first_chunk::<PREFIX_LEN>() else {
        return Ok(None);
    };
    let (header_len, payload_len) = parse_prefix(prefix, limits)?;
    let total = PREFIX_LEN + header_len + payload_len;
    if buf.len() < total {
        return Ok(None);
    }
    let message = decode_header(&buf[PREFIX_LEN..PREFIX_LEN + header_len])?;
    let payload = buf[PREFIX_LEN + header_len..total].to_vec();
    Ok(Some((Frame { message, payload }, total)))
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` if the stream ended before the first byte.
async fn read_exact_or_eof<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
) -> Result<bool, FrameError> {
    let mut got = 0;
    while got < buf.len() {
        let n = r.read(&mut buf[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(FrameError::Truncated {
                expected: buf.len() as u64,
                got: got as u64,
            });
        }
        got += n;
    }
    Ok(true)
}

/// Reads `len` payload bytes, growing the buffer only as data arrives.
async fn read_payload<R: AsyncRead + Unpin>(r: &mut R, len: usize) -> Result<Vec<u8>, FrameError> {
    use bytes::BufMut;
    let mut buf = Vec::with_capacity(len.min(INITIAL_PAYLOAD_CAPACITY));
    while buf.len() < len {
        let remaining = len - buf.len();
        if buf.capacity() == buf.len() {
            buf.reserve_exact(remaining.min(buf.len().max(4096)));
        }
        let n = r.read_buf(&mut (&mut buf).limit(remaining)).await?;
        if n == 0 {
            return Err(FrameError::Truncated {
                expected: len as u64,
                got: buf.len() as u64,
            });
        }
    }
    Ok(buf)
}

/// Reads one frame; `Ok(None)` when the stream ended cleanly between frames.
///
/// # Cancel safety
///
/// Not cancel safe: a cancelled read loses the bytes of a partly read frame, after which the
/// stream is out of step. Readers in this crate own their stream in one task and never cancel
/// a read except to close the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: &FrameLimits,
) -> Result<Option<Frame>, FrameError> {
    let mut prefix = [0u8; PREFIX_LEN];
    if !read_exact_or_eof(r, &mut prefix).await? {
        return Ok(None);
    }
    let (header_len, payload_len) = parse_prefix(&prefix, limits)?;
    let mut header = vec![0u8; header_len];
    if !read_exact_or_eof(r, &mut header).await? {
        return Err(FrameError::Truncated {
            expected: header_len as u64,
            got: 0,
        });
    }
    let message = decode_header(&header)?;
    let payload = if payload_len == 0 {
        Vec::new()
    } else {
        read_payload(r, payload_len).await?
    };
    Ok(Some(Frame { message, payload }))
}

/// Payloads up to this size are copied behind the header so a frame is one write.
const COALESCE_LIMIT: usize = 64 * 1024;

/// Writes one frame.
///
/// # Cancel safety
///
/// Not cancel safe: a cancelled write may leave half a frame on the stream. The bootstrap
/// writes from one task per connection that is never cancelled mid-frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    message: &Message,
    payload: &[u8],
) -> Result<(), FrameError> {
    if payload.len() <= COALESCE_LIMIT {
        let frame = encode_frame(message, payload)?;
        w.write_all(&frame).await?;
    } else {
        let head = encode_head(message, payload.len())?;
        w.write_all(&head).await?;
        w.write_all(payload).await?;
    }
    Ok(())
}

/// Encodes the peer table carried by a `Welcome`.
pub fn encode_peer_table(peers: &[PeerInfo]) -> Result<Vec<u8>, FrameError> {
    bincode::serde::encode_to_vec(
        peers,
        bincode::config::standard().with_limit::<MAX_PEER_TABLE_LEN>(),
    )
    .map_err(|e| FrameError::Encode(e.to_string()))
}

/// Decodes the peer table carried by a `Welcome`.
pub fn decode_peer_table(bytes: &[u8]) -> Result<Vec<PeerInfo>, FrameError> {
    let (peers, used) = bincode::serde::decode_from_slice::<Vec<PeerInfo>, _>(
        bytes,
        bincode::config::standard().with_limit::<MAX_PEER_TABLE_LEN>(),
    )
    .map_err(|e| FrameError::Decode(e.to_string()))?;
    if used != bytes.len() {
        return Err(FrameError::TrailingBytes {
            used,
            len: bytes.len(),
        });
    }
    Ok(peers)
}

#[cfg(test)]
mod tests;
