//! How the proxy-channel collectives ([`AllReduceAlgo::Proxy`], [`AllGatherAlgo::Proxy`])
//! are cut: lanes (proxy channels to every peer), blocks per lane and chunk size, all
//! recorded in the call's tag so that ranks that disagree fail with a mismatch instead of
//! corrupting data.
//! The device side and the scratch layout are in `mscclpp_device::collectives::proxy`;
//! the design is in docs/guide/06-design.md §8, "Proxy-channel collectives".
//!
//! [`AllReduceAlgo::Proxy`]: super::AllReduceAlgo::Proxy
//! [`AllGatherAlgo::Proxy`]: super::AllGatherAlgo::Proxy

use mscclpp_device::collectives::proxy::{
    MAX_PROXY_LANES, MAX_PROXY_WORKERS, proxy_layout, proxy_workers,
};
use mscclpp_device::collectives::{MAX_BLOCKS, desc};

use super::Collectives;
use crate::communicator::CommError;

/// Lanes (proxy channels per peer, so most blocks of a proxy call) built by default.
const DEFAULT_LANES: u32 = 8;
/// From this size on the default plan uses two lanes (one below): more lanes would cut the
/// scratch into smaller slots, so smaller chunks and more proxy triggers.
const TWO_LANES_FROM: u64 = 8 << 20;
/// Bytes of a lane's share per block the default plan aims at (blocks per lane, up to
/// [`DEFAULT_WORKERS`]).
const BYTES_PER_WORKER: u64 = 512 << 10;
/// Most blocks per lane the default plan takes (2 lanes of 16: 32 blocks).
const DEFAULT_WORKERS: u32 = 16;
/// The smallest chunk the default plan cuts (smaller shares go as one chunk).
const MIN_CHUNK: u64 = 64 << 10;
/// Chunks per block share the default plan aims at: as many as a block keeps in flight with
/// 8 slots (`L + 1 = 4`). Fewer, larger chunks cost the proxy fewer triggers (on P2P each
/// is a `cuMemcpyAsync` and a flag write by one CPU thread, a few microseconds: at 32 MiB
/// that thread, not the link, may set the pace); more overlap staging with the transfer
/// better. Not measured: `MSCCLPP_PROXY_CHUNK_BYTES` overrides it.
const CHUNKS_PER_SHARE: u64 = 4;
/// The largest chunk a tag can carry (`desc::PIECE_SHIFT`: 20 bits of 16-byte units).
const MAX_CHUNK: u64 = 0xf_ffff * 16;

/// The proxy collectives' settings: `None` picks by size (see [`Collectives::proxy_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProxyPipe {
    /// Lanes built at setup (1..=`MAX_PROXY_LANES`): the most blocks of a call.
    pub(super) lanes: u32,
    /// Lanes every call uses, 1..=`lanes` (named from when a lane had one block).
    pub(super) blocks: Option<u32>,
    /// Bytes per chunk (a multiple of 16, at most `MAX_CHUNK`; the kernel caps it at a slot).
    pub(super) chunk: Option<u64>,
    /// Blocks per lane, 1..=`MAX_PROXY_WORKERS` (each stages and reduces a part of every
    /// chunk of its lane).
    pub(super) workers: Option<u32>,
}

impl ProxyPipe {
    /// Checks the settings (`what` names their source in the error).
    pub(super) fn checked(
        lanes: u32,
        blocks: Option<u32>,
        chunk: Option<u64>,
        what: &str,
    ) -> Result<Self, CommError> {
        if !(1..=MAX_PROXY_LANES as u32).contains(&lanes) {
            return Err(CommError::InvalidArgument(format!(
                "{what}: {lanes} proxy lanes; 1..={MAX_PROXY_LANES}"
            )));
        }
        if let Some(b) = blocks
            && !(1..=lanes).contains(&b)
        {
            return Err(CommError::InvalidArgument(format!(
                "{what}: {b} proxy blocks; 1..={lanes} (one lane of proxy channels each; \
                 {lanes} lanes were built: MSCCLPP_PROXY_LANES, at most {MAX_PROXY_LANES})"
            )));
        }
        if let Some(c) = chunk
            && (c == 0 || !c.is_multiple_of(16) || c > MAX_CHUNK)
        {
            return Err(CommError::InvalidArgument(format!(
                "{what}: proxy chunk of {c} bytes; a multiple of 16 in 16..={MAX_CHUNK}"
            )));
        }
        Ok(ProxyPipe {
            lanes,
            blocks,
            chunk,
            workers: None,
        })
    }

    /// These settings with `workers` blocks per lane (`what` names their source in the
    /// error).
    pub(super) fn with_workers(self, workers: Option<u32>, what: &str) -> Result<Self, CommError> {
        if let Some(w) = workers
            && !(1..=MAX_PROXY_WORKERS).contains(&w)
        {
            return Err(CommError::InvalidArgument(format!(
                "{what}: {w} blocks per proxy lane; 1..={MAX_PROXY_WORKERS}"
            )));
        }
        if let (Some(w), Some(b)) = (workers, self.blocks)
            && (w * b) as usize > MAX_BLOCKS
        {
            return Err(CommError::InvalidArgument(format!(
                "{what}: {b} proxy lanes of {w} blocks is {} blocks; at most {MAX_BLOCKS}",
                w * b
            )));
        }
        Ok(ProxyPipe { workers, ..self })
    }

    /// `MSCCLPP_PROXY_LANES`, `MSCCLPP_PROXY_BLOCKS`, `MSCCLPP_PROXY_CHUNK_BYTES` and
    /// `MSCCLPP_PROXY_WORKERS` of `s`, when set.
    pub(super) fn from_settings(s: &crate::settings::Settings) -> Result<Self, CommError> {
        Self::checked(
            s.proxy_lanes.unwrap_or(DEFAULT_LANES),
            s.proxy_blocks,
            s.proxy_chunk_bytes,
            "MSCCLPP_PROXY_LANES / MSCCLPP_PROXY_BLOCKS / MSCCLPP_PROXY_CHUNK_BYTES",
        )?
        .with_workers(s.proxy_workers, "MSCCLPP_PROXY_WORKERS")
    }
}

impl Collectives {
    /// Sets how the proxy-channel collectives cut a call: `blocks`, the lanes a call uses
    /// (1..=the lanes built at setup, 8 unless `MSCCLPP_PROXY_LANES` said otherwise; each lane
    /// is one proxy channel to every peer and moves its share of the message, staged and
    /// reduced by the blocks [`set_proxy_workers`](Self::set_proxy_workers) gives it; the
    /// name is from when a lane had one block) and `chunk_bytes` (a multiple of 16; the unit
    /// each put moves, capped at a staging slot); `None` picks by size, as do the environment
    /// variables `MSCCLPP_PROXY_BLOCKS` and `MSCCLPP_PROXY_CHUNK_BYTES` read by
    /// [`Collectives::new`]. Every rank must use the same settings: a call whose ranks differ
    /// fails on every rank with [`CommError::CallMismatch`].
    pub fn set_proxy_pipeline(
        &mut self,
        blocks: Option<u32>,
        chunk_bytes: Option<usize>,
    ) -> Result<(), CommError> {
        self.proxy_pipe = ProxyPipe::checked(
            self.proxy_pipe.lanes,
            blocks,
            chunk_bytes.map(|c| c as u64),
            "set_proxy_pipeline",
        )?
        .with_workers(self.proxy_pipe.workers, "set_proxy_pipeline")?;
        Ok(())
    }

    /// Sets how many blocks drive each lane of a proxy-channel collective (1..=16; `None`
    /// picks by size, as does `MSCCLPP_PROXY_WORKERS` read by [`Collectives::new`]): the
    /// lane's chunks are cut among them for staging and reducing, so a lane moves large
    /// chunks (few proxy triggers) with the memory bandwidth of several blocks. Every rank
    /// must use the same setting ([`CommError::CallMismatch`] otherwise).
    pub fn set_proxy_workers(&mut self, workers: Option<u32>) -> Result<(), CommError> {
        self.proxy_pipe = self.proxy_pipe.with_workers(workers, "set_proxy_workers")?;
        Ok(())
    }

    /// The plan of a proxy call of `bytes` (per rank): `(blocks, chunk, workers)`, the grid
    /// (`lanes * workers` blocks), the chunk and the blocks per lane.
    ///
    /// By default two lanes from [`TWO_LANES_FROM`] bytes (one below; at most the lanes
    /// built), one block per lane and [`BYTES_PER_WORKER`] of its share up to
    /// [`DEFAULT_WORKERS`] (and at most `CollConfig::max_blocks` in all; one block per lane
    /// on the Host backend, where blocks are CPU threads), and chunks of a
    /// quarter of a lane's share (at least 64 KiB unless the share is smaller, at most a
    /// slot), so a lane keeps several chunks in flight. Few lanes make large slots, so large
    /// chunks and few proxy triggers (each a `cuMemcpyAsync` of 5-8 us of CPU on P2P); the
    /// workers give every lane the memory bandwidth of several blocks. On one H200 (two
    /// ranks under MPS) this plan took 0.49-0.51x the time of the old one (8 lanes of one
    /// block) at 256 MiB and 0.40-0.53x at 64 MiB.
    pub(super) fn proxy_plan(&self, bytes: usize) -> (u32, u64, u32) {
        self.proxy_plan_for(bytes, self.runs_on_gpu())
    }

    /// [`proxy_plan`](Self::proxy_plan) for a GPU backend (`on_gpu`) or the Host backend.
    pub(super) fn proxy_plan_for(&self, bytes: usize, on_gpu: bool) -> (u32, u64, u32) {
        let (region, n) = (self.ctx.scratch_len, self.ctx.nranks as u64);
        let bytes = bytes as u64;
        let most = self.config.max_blocks.max(1);
        let mut lanes = self.proxy_pipe.blocks.unwrap_or_else(|| {
            let lanes = if bytes >= TWO_LANES_FROM { 2 } else { 1 };
            lanes.min(self.proxy_pipe.lanes).min(most)
        });
        // Slots too small for the lanes asked: fewer lanes (one always has >= 64 bytes:
        // a region holds at least 2 KiB and there are at most 8 ranks).
        while lanes > 1 && proxy_layout(region, n, lanes as u64).slot < 64 {
            lanes -= 1;
        }
        let layout = proxy_layout(region, n, lanes as u64);
        let share = bytes.div_ceil(lanes as u64);
        let chunk = self.proxy_pipe.chunk.unwrap_or_else(|| {
            share
                .div_ceil(CHUNKS_PER_SHARE)
                .max(MIN_CHUNK.min(share))
                .next_multiple_of(16)
        });
        let workers = match self.proxy_pipe.workers {
            Some(w) => w,
            // On the Host backend the proxy's memcpy moves the bytes and every block is CPU
            // threads: more of them only compete for the cores.
            None if !on_gpu => 1,
            None => share
                .div_ceil(BYTES_PER_WORKER)
                .clamp(1, DEFAULT_WORKERS as u64) as u32,
        }
        .min(MAX_BLOCKS as u32 / lanes)
        .min((most / lanes).max(1))
        .max(1);
        (
            lanes * workers,
            chunk.clamp(16, layout.slot.clamp(16, MAX_CHUNK)),
            workers,
        )
    }

    /// `tag` of a proxy call of `bytes` with its plan: the chunk in the tag's piece field and
    /// the blocks per lane less one in its depth field ([`desc::with_pipe`]), the lanes in
    /// its root field (unused by these collectives; [`proxy_tag_plan`] reads them all).
    pub(super) fn proxy_tag(&self, tag: u64, bytes: usize) -> u64 {
        let (blocks, chunk, workers) = self.proxy_plan(bytes);
        let lanes = blocks / workers;
        desc::with_pipe(tag, chunk, workers - 1) | (lanes as u64 & 0xff) << desc::ROOT_SHIFT
    }
}

/// How a proxy call's tag cuts it (see [`Collectives::proxy_tag`]), for mismatch messages:
/// `[2 proxy blocks, chunks of 64 bytes]`, or with several blocks per lane `[2 proxy lanes
/// of 4 blocks, chunks of 64 bytes]`.
pub(super) fn proxy_tag_plan(tag: u64) -> String {
    let (lanes, workers) = (desc::root(tag), proxy_workers(tag));
    let chunk = desc::piece(tag);
    if workers == 1 {
        format!("[{lanes} proxy blocks, chunks of {chunk} bytes]")
    } else {
        format!("[{lanes} proxy lanes of {workers} blocks, chunks of {chunk} bytes]")
    }
}
