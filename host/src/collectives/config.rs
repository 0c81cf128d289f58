//! Settings of [`Collectives`](super::Collectives) ([`CollConfig`]).

use super::set_up::settings;
use super::{AllGatherAlgo, AllReduceAlgo, CrossTransport, RootedAlgo};
use crate::communicator::CommError;
use crate::settings::{CrossBuffer, Settings};

/// Settings of [`Collectives`](super::Collectives).
#[derive(Debug, Clone)]
pub struct CollConfig {
    /// Bytes of the scratch buffer each rank registers, in two equal regions: one for
    /// all-pairs, one shared by the other algorithms (each pipelines larger messages
    /// through its region, in rounds). All-pairs has its own so that it needs no barrier at
    /// the end of a call.
    pub scratch_bytes: usize,
    /// Largest message (bytes per rank) the one-shot packet path serves; [`Auto`] uses it
    /// up to this size. Each peer pair gets `4 *` this in packet scratch.
    ///
    /// [`Auto`]: AllReduceAlgo::Auto
    pub packet_max_bytes: usize,
    /// Most blocks of a two-shot or all-gather kernel (1..=128; GPU only).
    pub max_blocks: u32,
    /// Threads per block of the GPU kernels (a multiple of 32, 32..=512).
    pub threads: u32,
    /// The all-reduce algorithm of calls that pass [`AllReduceAlgo::Auto`] (the typed and
    /// host calls), unless `MSCCLPP_ALLREDUCE_ALGO` is set.
    pub all_reduce_algo: AllReduceAlgo,
    /// The all-gather algorithm of calls that pass [`AllGatherAlgo::Auto`], unless
    /// `MSCCLPP_ALLGATHER_ALGO` is set.
    pub all_gather_algo: AllGatherAlgo,
    /// Sends and receives of at most this many bytes go as LL packets, with no rendezvous
    /// (0: never). Each peer pair gets `4 *` this in packet scratch. Must be equal on every
    /// rank, as the two following.
    pub p2p_packet_max_bytes: usize,
    /// Blocks of every LL send and receive on a GPU (1..=16; at most the blocks a transfer
    /// may use).
    pub p2p_packet_blocks: u32,
    /// Larger sends and receives: pieces in flight per block (1..=4): the sender fills the
    /// next while the receiver copies one out.
    pub p2p_depth: u32,
    /// The broadcast algorithm above the LL size, unless `MSCCLPP_BROADCAST_ALGO` is set.
    pub broadcast_algo: RootedAlgo,
    /// The reduce algorithm above the LL size, unless `MSCCLPP_REDUCE_ALGO` is set.
    pub reduce_algo: RootedAlgo,
    /// [`RootedAlgo::Pipelined`]: pieces in flight per block and link (1..=8).
    pub rooted_depth: u32,
    /// [`RootedAlgo::Pipelined`]: the smallest piece (bytes; pieces aim at 8 per block,
    /// capped by what the scratch holds per block and depth). At most 16 MiB.
    pub rooted_piece_bytes: usize,
    /// Across hosts: the network transport of the proxy channels between hosts (the
    /// cross-host steps and send/recv with other hosts). Must agree on every rank.
    pub cross_transport: CrossTransport,
    /// Across hosts: send/recv with ranks on other hosts is set up (two network channels,
    /// TCP or IB, and `scratch_bytes / 8`, between 32 KiB and 2 MiB, of buffer per such
    /// rank) when there are at most this many of them; above, such sends and receives are
    /// refused. Must be equal on every rank. Ignored once any rank names its peers
    /// ([`p2p_peers`](Self::p2p_peers)). Ranks of this rank's machine that the collectives
    /// put in another group (machines of different sizes) are always reached and not
    /// counted: they need no network.
    pub p2p_remote_max: usize,
    /// Across hosts: the ranks on other hosts this rank sends to or receives from, when
    /// known (a pipeline stage's neighbours, say). `None` (the default): every rank on
    /// another host, while there are at most [`p2p_remote_max`](Self::p2p_remote_max).
    /// `Some(ranks)`: these (ranks of this rank's host are always reached and ignored
    /// here). A pair is connected when either of its ranks names the other, so ranks may
    /// name different lists, and the limit does not apply. Every rank's buffer for these
    /// holds a region (`scratch_bytes / 8`, between 32 KiB and 2 MiB) per peer of the rank
    /// with the most peers, so a rank that names many makes every rank's buffer that large
    /// (the two buffers a channel joins are of one size). `MSCCLPP_P2P_PEERS` overrides
    /// it ([`P2P_PEERS_ENV`](super::P2P_PEERS_ENV): `13,+8,-8`, absolute ranks and ranks
    /// relative to this one; `all`, `none`).
    pub p2p_peers: Option<Vec<usize>>,
    /// Across hosts, on a GPU whose partners are all reached over TCP: the cross buffer and
    /// the send/recv buffer are pinned host memory mapped into the device (`true`, the
    /// default; the sockets read and write them directly, and a signal is a CPU store the
    /// kernel polls) rather than device memory staged by the copy engine (`false`). Each
    /// rank may choose for itself (the wire is the same); `MSCCLPP_CROSS_BUFFER=host|device`
    /// ([`CROSS_BUFFER_ENV`](super::CROSS_BUFFER_ENV)) sets it in
    /// [`from_env`](Self::from_env).
    pub cross_buffer_host: bool,
    /// Across hosts, on the Host backend: most payload bytes of one round with the partners
    /// (at least 4 KiB; a round also carries at most what a slot of the cross buffer holds,
    /// `scratch_bytes / 2 / (3 * hosts)`). Must be equal on every rank: the set-up fails,
    /// naming every rank's, when it is not. The same slots serve every round, so rounds this
    /// small keep them in the CPU cache: with rounds as large as the slot (21 MiB for two
    /// hosts), the input, the send and receive slots and the output of a 16 MB all-reduce
    /// fell out of the cache before the reduction read them. 1 MiB (the
    /// default) took 4.9 ms at 16 MB against 9.1 for the slot, and 2.5 ms at 8 MB against 4.1
    /// (two ranks as two simulated hosts, 2-vCPU VM, `mscclpp-perf --nranks 2
    /// --simulate-hosts 2 -b 256K -e 32M -f 2`, median of 5 interleaved runs, commit
    /// 5f5f931); 256 KiB was within noise of it, 512 KiB slower at 8 MB and up.
    pub host_cross_round_bytes: usize,
}

impl Default for CollConfig {
    /// The defaults of the settings ([`Settings::default`]), with no environment.
    fn default() -> Self {
        CollConfig::from_settings(&Settings::default())
    }
}

impl CollConfig {
    /// The defaults, with `MSCCLPP_COLL_SCRATCH_BYTES`, `MSCCLPP_COLL_PACKET_MAX_BYTES`,
    /// `MSCCLPP_COLL_MAX_BLOCKS`, `MSCCLPP_COLL_THREADS`, `MSCCLPP_P2P_PACKET_MAX_BYTES`,
    /// `MSCCLPP_P2P_PACKET_BLOCKS`, `MSCCLPP_P2P_DEPTH`, `MSCCLPP_ROOTED_DEPTH`,
    /// `MSCCLPP_ROOTED_PIECE_BYTES`, `MSCCLPP_P2P_REMOTE_MAX`, `MSCCLPP_CROSS_TRANSPORT`
    /// (`auto`, `tcp`, `ib`), `MSCCLPP_CROSS_BUFFER` (`host`, `device`) and
    /// `MSCCLPP_HOST_CROSS_ROUND_BYTES` applied when set.
    pub fn from_env() -> Result<CollConfig, CommError> {
        Ok(CollConfig::from_settings(settings()?))
    }

    /// The values of `settings` (see [`from_env`](Self::from_env)); the algorithms stay
    /// `Auto` and the peers `None` (their variables override the config when the
    /// collectives are made).
    pub fn from_settings(s: &Settings) -> CollConfig {
        CollConfig {
            scratch_bytes: s.coll_scratch_bytes,
            packet_max_bytes: s.coll_packet_max_bytes,
            max_blocks: s.coll_max_blocks,
            threads: s.coll_threads,
            all_reduce_algo: AllReduceAlgo::Auto,
            all_gather_algo: AllGatherAlgo::Auto,
            p2p_packet_max_bytes: s.p2p_packet_max_bytes,
            p2p_packet_blocks: s.p2p_packet_blocks,
            p2p_depth: s.p2p_depth,
            broadcast_algo: RootedAlgo::Auto,
            reduce_algo: RootedAlgo::Auto,
            rooted_depth: s.rooted_depth,
            rooted_piece_bytes: s.rooted_piece_bytes,
            p2p_remote_max: s.p2p_remote_max,
            p2p_peers: None,
            cross_transport: s.cross_transport,
            cross_buffer_host: s.cross_buffer == CrossBuffer::Host,
            host_cross_round_bytes: s.host_cross_round_bytes,
        }
    }

    pub(super) fn validate(&self) -> Result<(), CommError> {
        let bad = |m: String| Err(CommError::InvalidArgument(format!("collectives: {m}")));
        if self.scratch_bytes < 4096 {
            return bad(format!(
                "scratch of {} bytes; at least 4096",
                self.scratch_bytes
            ));
        }
        if self.packet_max_bytes == 0 || self.packet_max_bytes > 1 << 30 {
            return bad(format!(
                "packet_max_bytes {} is not in 1..=1 GiB",
                self.packet_max_bytes
            ));
        }
        if !(1..=mscclpp_device::collectives::MAX_BLOCKS as u32).contains(&self.max_blocks) {
            return bad(format!(
                "max_blocks {} is not in 1..={}",
                self.max_blocks,
                mscclpp_device::collectives::MAX_BLOCKS
            ));
        }
        if !(32..=512).contains(&self.threads) || !self.threads.is_multiple_of(32) {
            return bad(format!(
                "threads {} is not a multiple of 32 in 32..=512",
                self.threads
            ));
        }
        if self.p2p_packet_max_bytes > 4 << 20 {
            return bad(format!(
                "p2p_packet_max_bytes {} is above 4 MiB",
                self.p2p_packet_max_bytes
            ));
        }
        use mscclpp_device::collectives::send_recv::{P2P_LL_BLOCKS, P2P_MAX_DEPTH};
        if !(1..=P2P_LL_BLOCKS).contains(&self.p2p_packet_blocks) {
            return bad(format!(
                "p2p_packet_blocks {} is not in 1..={P2P_LL_BLOCKS}",
                self.p2p_packet_blocks
            ));
        }
        if !(1..=P2P_MAX_DEPTH).contains(&self.p2p_depth) {
            return bad(format!(
                "p2p_depth {} is not in 1..={P2P_MAX_DEPTH}",
                self.p2p_depth
            ));
        }
        use mscclpp_device::collectives::pipe::{PIPE_MAX_DEPTH, PIPE_MAX_PIECE};
        if !(1..=PIPE_MAX_DEPTH).contains(&self.rooted_depth) {
            return bad(format!(
                "rooted_depth {} is not in 1..={PIPE_MAX_DEPTH}",
                self.rooted_depth
            ));
        }
        if self.rooted_piece_bytes as u64 > PIPE_MAX_PIECE {
            return bad(format!(
                "rooted_piece_bytes {} is above {PIPE_MAX_PIECE}",
                self.rooted_piece_bytes
            ));
        }
        if self.host_cross_round_bytes < 4096 {
            return bad(format!(
                "host_cross_round_bytes {} is below 4 KiB",
                self.host_cross_round_bytes
            ));
        }
        Ok(())
    }
}
