//! How the proxy-channel collectives ([`AllReduceAlgo::Proxy`], [`AllGatherAlgo::Proxy`])
//! are cut: blocks (one lane of proxy channels each) and chunk size, both recorded in the
//! call's tag so that ranks that disagree fail with a mismatch instead of corrupting data.
//! The device side and the scratch layout are in `mscclpp_device::collectives::proxy`;
//! the design note is `docs/proxy-pipeline.md`.
//!
//! [`AllReduceAlgo::Proxy`]: super::AllReduceAlgo::Proxy
//! [`AllGatherAlgo::Proxy`]: super::AllGatherAlgo::Proxy

use mscclpp_device::collectives::desc;
use mscclpp_device::collectives::proxy::{MAX_PROXY_LANES, proxy_layout};

use super::Collectives;
use crate::communicator::CommError;

/// Lanes (proxy channels per peer, so most blocks of a proxy call) built by default.
const DEFAULT_LANES: u32 = 8;
/// Bytes per block the default plan aims at: a block stages and reduces its share while
/// the copy engine moves the others', so large messages spread over every lane.
const BYTES_PER_BLOCK: u64 = 2 << 20;
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
    /// Blocks of every call, 1..=`lanes`.
    pub(super) blocks: Option<u32>,
    /// Bytes per chunk (a multiple of 16, at most `MAX_CHUNK`; the kernel caps it at a slot).
    pub(super) chunk: Option<u64>,
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
        })
    }

    /// `MSCCLPP_PROXY_LANES`, `MSCCLPP_PROXY_BLOCKS` and `MSCCLPP_PROXY_CHUNK_BYTES`, when
    /// set.
    pub(super) fn from_env() -> Result<Self, CommError> {
        let get = |name: &str| -> Result<Option<u64>, CommError> {
            match std::env::var(name) {
                Ok(v) if v.trim().is_empty() || v.trim() == "auto" => Ok(None),
                Ok(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                    CommError::InvalidArgument(format!("{name}={v:?} is not a number"))
                }),
                Err(_) => Ok(None),
            }
        };
        let small = |v: u64| v.min(u32::MAX as u64) as u32;
        let lanes = get("MSCCLPP_PROXY_LANES")?.map_or(DEFAULT_LANES, small);
        let blocks = get("MSCCLPP_PROXY_BLOCKS")?.map(small);
        let chunk = get("MSCCLPP_PROXY_CHUNK_BYTES")?;
        Self::checked(
            lanes,
            blocks,
            chunk,
            "MSCCLPP_PROXY_LANES / MSCCLPP_PROXY_BLOCKS / MSCCLPP_PROXY_CHUNK_BYTES",
        )
    }
}

impl Collectives {
    /// Sets how the proxy-channel collectives cut a call: `blocks` (1..=the lanes built at
    /// setup, 8 unless `MSCCLPP_PROXY_LANES` said otherwise; each block drives its own lane of
    /// proxy channels to every peer and stages and reduces its share of the message) and
    /// `chunk_bytes` (a multiple of 16; the unit each put moves, capped at a staging slot);
    /// `None` picks by size, as do the environment variables `MSCCLPP_PROXY_BLOCKS` and
    /// `MSCCLPP_PROXY_CHUNK_BYTES` read by [`Collectives::new`]. Every rank must use the same
    /// settings: a call whose ranks differ fails on every rank with
    /// [`CommError::CallMismatch`].
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
        )?;
        Ok(())
    }

    /// The plan of a proxy call of `bytes` (per rank): `(blocks, chunk)`. By default one
    /// block per 2 MiB (at most the lanes built, 8 by default), and chunks of a quarter of a block's share (at least 64
    /// KiB unless the share is smaller, at most a slot), so a block keeps several chunks in
    /// flight.
    pub(super) fn proxy_plan(&self, bytes: usize) -> (u32, u64) {
        let (region, n) = (self.ctx.scratch_len, self.ctx.nranks as u64);
        let bytes = bytes as u64;
        let mut blocks = self.proxy_pipe.blocks.unwrap_or_else(|| {
            bytes
                .div_ceil(BYTES_PER_BLOCK)
                .clamp(1, self.proxy_pipe.lanes as u64)
                .min(self.config.max_blocks.max(1) as u64) as u32
        });
        // Slots too small for the blocks asked: fewer blocks (one always has >= 64 bytes:
        // a region holds at least 2 KiB and there are at most 8 ranks).
        while blocks > 1 && proxy_layout(region, n, blocks as u64).slot < 64 {
            blocks -= 1;
        }
        let layout = proxy_layout(region, n, blocks as u64);
        let chunk = self.proxy_pipe.chunk.unwrap_or_else(|| {
            let share = bytes.div_ceil(blocks as u64);
            share
                .div_ceil(CHUNKS_PER_SHARE)
                .max(MIN_CHUNK.min(share))
                .next_multiple_of(16)
        });
        (blocks, chunk.clamp(16, layout.slot.clamp(16, MAX_CHUNK)))
    }

    /// `tag` of a proxy call of `bytes` with its plan: the chunk in the tag's piece field
    /// ([`desc::with_pipe`]) and the block count in its root field (unused by these
    /// collectives: [`proxy_tag_blocks`] reads it).
    pub(super) fn proxy_tag(&self, tag: u64, bytes: usize) -> u64 {
        let (blocks, chunk) = self.proxy_plan(bytes);
        desc::with_pipe(tag, chunk, 0) | (blocks as u64 & 0xff) << desc::ROOT_SHIFT
    }
}

/// The block count of a proxy call's tag (see [`Collectives::proxy_tag`]).
pub(super) fn proxy_tag_blocks(tag: u64) -> u64 {
    desc::root(tag) as u64
}
