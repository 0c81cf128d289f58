//! Channels: the device side of a connection between two ranks.
//!
//! - [`proxy`]: [`DevConn`], the seed's proxy channel: the GPU pushes triggers into a FIFO
//!   and a CPU proxy moves the data (copy engine, RDMA or memcpy).
//! - [`memory`]: [`MemoryChannel`]: the peer's memory is mapped and the GPU's threads move
//!   the data themselves with loads and stores.

pub mod memory;
pub mod proxy;

pub use memory::{MemoryChannel, PlainData};
pub use proxy::DevConn;

use core::fmt;

/// Why a channel operation did not succeed (the `try_` methods of [`DevConn`],
/// [`MemoryChannel`] and [`DeviceSemaphore`](crate::semaphore::DeviceSemaphore)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelError {
    /// The wait ran out of time.
    Timeout,
    /// The communicator was aborted: `word` is its abort word (`1 + rank` of a lost rank,
    /// or `u64::MAX` for `Communicator::abort`).
    Aborted {
        /// The abort word.
        word: u64,
    },
    /// The channel's peer left (closed its communicator politely) once all of its work
    /// had ended, and what this wait waits for had not arrived by then (looked at again
    /// after the news): it never will.
    PeerLeft {
        /// The rank that left.
        rank: u32,
    },
    /// The proxy refused a trigger of this connection (a put outside the buffers, an
    /// unknown connection id) or failed to carry one out; the host's
    /// `Communicator::proxy_errors` says which and why.
    ProxyRefused {
        /// The connection.
        connection: u32,
    },
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ChannelError::Timeout => f.write_str("the wait timed out"),
            ChannelError::Aborted { word: u64::MAX } => {
                f.write_str("the communicator was aborted (abort())")
            }
            ChannelError::Aborted { word } => {
                write!(f, "the communicator was aborted: rank {} is gone", word - 1)
            }
            ChannelError::PeerLeft { rank } => write!(
                f,
                "rank {rank} left (closed its communicator after its work ended) without \
                 sending what this wait waits for"
            ),
            ChannelError::ProxyRefused { connection } => write!(
                f,
                "the proxy refused or failed a trigger of connection {connection} (see the \
                 host's proxy errors)"
            ),
        }
    }
}

impl core::error::Error for ChannelError {}

impl ChannelError {
    /// The error a wait gives up with on seeing the non-zero abort word `word` of its
    /// channel: [`PeerLeft`](ChannelError::PeerLeft) for a
    /// [`fault::left_word`](crate::collectives::fault::left_word), else
    /// [`Aborted`](ChannelError::Aborted).
    #[inline]
    pub fn from_abort_word(word: u64) -> ChannelError {
        match crate::collectives::fault::left_rank(word) {
            Some(rank) => ChannelError::PeerLeft { rank },
            None => ChannelError::Aborted { word },
        }
    }
}
