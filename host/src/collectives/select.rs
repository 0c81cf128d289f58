//! Every choice among algorithms, in one place: which all-reduce, all-gather, broadcast and
//! reduce algorithm `Auto` takes, which path (LL packets or the scratch) a reduce-scatter,
//! reduce, broadcast or all-to-all takes, which kernels an all-reduce of a type runs, and the
//! across-hosts choices (two-shot, the grid reduction over a host-mapped buffer).
//!
//! Each threshold says what set it. Three more live with the settings, as their defaults: the
//! Host backend's round across hosts `CollConfig::host_cross_round_bytes` (1 MiB: see there),
//! the LL / one-shot limit `CollConfig::packet_max_bytes` (1 MiB: one-shot was slower than
//! all-pairs at 2 MiB on 2x H200, commit f029be1; two-shot as fast from 2 MiB, 9bb003f) and
//! the send/recv LL limit `CollConfig::p2p_packet_max_bytes` (512 KiB: 13.66 us as packets
//! against 18.11 pipelined at 512 KB in one 2x H200 run, 8b93b35; not re-measured since).
//! The choice is the same on every rank: it reads only the call, the config and the
//! topology, all equal across ranks.

use super::cross::Cross;
use super::{AllGatherAlgo, AllReduceAlgo, Collectives, DataType, ReduceOp, RootedAlgo};
use crate::communicator::CommError;
use mscclpp_device::collectives::one_shot_max_bytes;

/// Largest all-reduce (bytes per rank) [`AllReduceAlgo::Auto`] sends one-shot with two ranks.
/// Set by one 2x H200 run under a CUDA graph against NCCL (commit 7a5cbd3; its all-reduce
/// graph rows are in `benches/records/nvidia-h200-x2.jsonl`): all-pairs took 8.4 us at
/// 512 KB and 9.8 us at 1 MB where one-shot took 9.6 and 13.5.
pub const TWO_RANK_ONE_SHOT_MAX: usize = 256 << 10;

/// Largest all-reduce (bytes per rank) [`AllReduceAlgo::Auto`] sends one-shot on the Host
/// backend with three or more ranks (two: [`HOST_TWO_RANK_ONE_SHOT_MAX`]); two-shot above.
/// Set by two runs of `mscclpp-perf --nranks 3 --algo oneshot|twoshot -b 128 -e 16K -f 2
/// -n 20000` on a 2-vCPU VM (commit 755846b; 3 ranks on 2 cores, so unbound): one-shot
/// 8.5-9.4 us at 1 KB against 17-19 for two-shot, 12.6-14.0 against 17-19 at 2 KB, 20-22
/// against 18-20 at 4 KB (LL packets double what crosses memory and poll per 8 bytes).
pub const HOST_ONE_SHOT_MAX: usize = 2 << 10;

/// [`HOST_ONE_SHOT_MAX`] for two ranks, whose all-pairs path takes over above it. Set by
/// three runs of `mscclpp-perf --nranks 2 --algo oneshot|allpairs -b 64 -e 512 -f 2 -n
/// 200000` on a 2-vCPU VM (commit 2ac7f40, ranks bound to a core each), out of place:
/// one-shot 0.33-0.34 us at 128 B against 0.36-0.42 for all-pairs, 0.45-0.47 against
/// 0.37-0.40 at 256 B and 0.70-0.71 against 0.39-0.40 at 512 B. A core reads the other's LL
/// packets line by line as they are written (a coherence miss each); all-pairs waits for
/// one flag and then copies.
pub const HOST_TWO_RANK_ONE_SHOT_MAX: usize = 128;

/// Largest all-reduce (bytes per rank) [`AllReduceAlgo::Auto`] sends all-pairs with two
/// ranks on the Host backend; two-shot above (and for more ranks). Set by one run of
/// `mscclpp-perf --nranks 2 --algo allpairs|twoshot` on the 2-core CI machine (commit
/// ef680ab), two rounds: all-pairs 1.4-1.6 us at 2 KB against 2.1, even at 8 KB, two-shot
/// ahead from 32 KB (12-14 against 13-16 us) and far ahead from 2 MB (385-425 against
/// 500-546 us; 16 MB 3.0-3.3 against 5.4-5.7 ms): all-pairs copies the whole input to the
/// peer and reduces all of it on each rank, where two-shot moves and reduces half.
pub const HOST_ALL_PAIRS_MAX: usize = 16 << 10;

/// Message size (bytes) above which [`RootedAlgo::Auto`] pipelines a broadcast or reduce.
/// Set by the same 2x H200 run (commit 7a5cbd3; the broadcast and reduce rows of
/// `benches/records/nvidia-h200-x2.jsonl` are this choice's): with depth 8 and pieces of at
/// least 256 KiB, pipelined broadcast took 105 us at 32 MB and 376 us at 128 MB against 117
/// and 452 in rounds (NCCL 110 and 386), reduce 106 and 386 against 130 and 428 (NCCL 102
/// and 376); at 2-8 MB rounds were as fast or faster.
pub const ROOTED_PIPELINED_ABOVE: usize = 8 << 20;

/// Across three hosts or more, [`AllReduceAlgo::Auto`] runs the two-shot all-reduce across
/// hosts once it sends at least this many bytes per rank less than one-shot does. One-shot
/// puts this rank's whole shard (`c` bytes: the call's bytes over the ranks of a host) to
/// every partner, `(H - 1) * c` for `H` hosts, in one round; two-shot reduce-scatters the
/// shard across hosts and all-gathers the pieces, `2 * (H - 1) * c / H` in two rounds. The
/// second round costs one network latency (tens of microseconds over TCP); at 256 KiB saved
/// that is a few tens of microseconds of link time at 10-25 GB/s per rank. Set by that
/// estimate, not by a measurement (commit 0f5ae2f; not yet run across real hosts).
pub const CROSS_TWO_SHOT_SAVES: usize = 256 << 10;

/// Whether splitting `bytes` that one rank would send whole to every other host into a
/// scatter and a gather across hosts saves [`CROSS_TWO_SHOT_SAVES`] bytes on its link: from
/// three hosts (`hosts - 1` copies against `2 * (hosts - 1) / hosts`).
pub(super) fn two_shot_pays(hosts: usize, bytes: usize) -> bool {
    hosts >= 3 && (hosts - 1) * bytes - 2 * (hosts - 1) * bytes / hosts >= CROSS_TWO_SHOT_SAVES
}

/// From this many payload bytes, a reducing round over a host-mapped cross buffer leaves
/// its reduction to reducing blocks beside the step's one (`cross_step` launched on a
/// grid): one block reads the payloads from host memory over PCIe several times slower
/// than a grid does. The grid reduction was measured (1x H200, commit 97286fa: without it
/// the host-mapped form lost 12-18%); the 256 KiB threshold itself was not swept.
pub(super) const MAPPED_GRID_REDUCE_BYTES: usize = 256 << 10;

/// Whether `dtype` and `op` have the sum-only kernels (every algorithm): sums of f32, f16
/// and bf16. Every other all-reduce runs the any-operation kernels, which exist for
/// one-shot, two-shot and proxy only (see [`route`]).
pub(super) fn sum_kernels(dtype: DataType, op: ReduceOp) -> bool {
    op == ReduceOp::Sum && matches!(dtype, DataType::F32 | DataType::F16 | DataType::Bf16)
}

/// The algorithm an all-reduce of `dtype` and `op` runs for the resolved `algo`: read-reduce
/// and all-pairs only for the sums of [`sum_kernels`]; two-shot for the others (their
/// kernels are not built, to keep the embedded PTX small). The same on every rank.
pub(super) fn route(algo: AllReduceAlgo, dtype: DataType, op: ReduceOp) -> AllReduceAlgo {
    match algo {
        AllReduceAlgo::ReadReduce | AllReduceAlgo::AllPairs if !sum_kernels(dtype, op) => {
            AllReduceAlgo::TwoShot
        }
        a => a,
    }
}

/// [`AllReduceAlgo::Auto`] inside one host with nothing forced: one-shot up to
/// `one_shot_limit` bytes per rank (what the packet scratch carries; for two GPU ranks at
/// most [`TWO_RANK_ONE_SHOT_MAX`], on the Host backend at most [`HOST_ONE_SHOT_MAX`], for
/// two ranks [`HOST_TWO_RANK_ONE_SHOT_MAX`]), above
/// all-pairs for two ranks (on the Host backend up to [`HOST_ALL_PAIRS_MAX`]) and two-shot
/// for more.
pub(super) fn auto_all_reduce(
    gpu: bool,
    nranks: usize,
    bytes: usize,
    one_shot_limit: usize,
) -> AllReduceAlgo {
    let one_shot_max = match (gpu, nranks == 2) {
        (false, true) => HOST_TWO_RANK_ONE_SHOT_MAX,
        (false, false) => HOST_ONE_SHOT_MAX,
        (true, true) => TWO_RANK_ONE_SHOT_MAX,
        (true, false) => usize::MAX,
    };
    if bytes <= one_shot_limit.min(one_shot_max) {
        AllReduceAlgo::OneShot
    } else if nranks == 2 && (gpu || bytes <= HOST_ALL_PAIRS_MAX) {
        AllReduceAlgo::AllPairs
    } else {
        AllReduceAlgo::TwoShot
    }
}

impl Collectives {
    /// The algorithm [`AllReduceAlgo::Auto`] resolves to for `bytes` per rank
    /// (`MSCCLPP_ALLREDUCE_ALGO` first, then the config): one-shot up to `packet_max_bytes`
    /// (for two ranks, up to [`TWO_RANK_ONE_SHOT_MAX`]; on the Host backend up to
    /// [`HOST_ONE_SHOT_MAX`], for two ranks [`HOST_TWO_RANK_ONE_SHOT_MAX`]);
    /// above, all-pairs for two ranks (the same NVLink traffic as two-shot with one barrier
    /// less per round; measured faster on 2x H200 from 2 MB to 8 MB and from 128 MB up,
    /// within 5% between) and two-shot for more ranks (all-pairs would send `nranks - 1`
    /// times the input).
    ///
    /// Across hosts ([`hosts`](Self::hosts) above 1) it answers with the cross-host
    /// algorithm instead: [`AllReduceAlgo::OneShot`] or [`AllReduceAlgo::TwoShot`] (see
    /// [Across hosts](super#across-hosts)).
    pub fn choose_all_reduce(&self, bytes: usize) -> AllReduceAlgo {
        if let Some(c) = self.cross() {
            return self.cross_all_reduce_algo(c, AllReduceAlgo::Auto, bytes);
        }
        if let Some(a) = self.env_all_reduce {
            return a;
        }
        if self.config.all_reduce_algo != AllReduceAlgo::Auto {
            return self.config.all_reduce_algo;
        }
        let limit = self.config.packet_max_bytes.min(self.one_shot_max_bytes());
        auto_all_reduce(self.runs_on_gpu(), self.nranks(), bytes, limit)
    }

    /// Resolves `algo` for `bytes` and checks it can carry them.
    pub(super) fn resolve(
        &self,
        algo: AllReduceAlgo,
        bytes: usize,
    ) -> Result<AllReduceAlgo, CommError> {
        let algo = match algo {
            AllReduceAlgo::Auto => self.choose_all_reduce(bytes),
            a => a,
        };
        if algo == AllReduceAlgo::OneShot && bytes > self.one_shot_max_bytes() {
            return Err(CommError::InvalidArgument(format!(
                "all_reduce: one-shot carries at most {} bytes per rank (packet scratch); \
                 {bytes} asked (raise CollConfig::packet_max_bytes or use TwoShot)",
                self.one_shot_max_bytes()
            )));
        }
        Ok(algo)
    }

    /// The algorithm [`AllGatherAlgo::Auto`] resolves to for `bytes` per rank
    /// (`MSCCLPP_ALLGATHER_ALGO`, then the config): LL packets up to the one-shot size
    /// (`packet_max_bytes`, as all-reduce: nccl-tests on 2x H200 had the memory-channel
    /// all-gather at 13-16 us from 32 B to 512 KB where NCCL takes 8-13), memory channels
    /// above.
    pub fn choose_all_gather(&self, bytes: usize) -> AllGatherAlgo {
        match (self.env_all_gather, self.config.all_gather_algo) {
            (Some(a), _) => a,
            (None, AllGatherAlgo::Auto) => {
                if bytes <= self.config.packet_max_bytes.min(self.one_shot_max_bytes()) {
                    AllGatherAlgo::Packets
                } else {
                    AllGatherAlgo::Memory
                }
            }
            (None, a) => a,
        }
    }

    /// Resolves an all-gather algorithm for `bytes` per rank and checks it can carry them.
    pub(super) fn resolve_all_gather(
        &self,
        call: &str,
        algo: AllGatherAlgo,
        bytes: usize,
    ) -> Result<AllGatherAlgo, CommError> {
        let algo = match algo {
            AllGatherAlgo::Auto => self.choose_all_gather(bytes),
            a => a,
        };
        if algo == AllGatherAlgo::Packets && bytes > self.one_shot_max_bytes() {
            return Err(CommError::InvalidArgument(format!(
                "{call}: the packet algorithm carries at most {} bytes per rank (packet \
                 scratch); {bytes} asked (raise CollConfig::packet_max_bytes or use Memory)",
                self.one_shot_max_bytes()
            )));
        }
        Ok(algo)
    }

    /// Across hosts: whether a broadcast of `bytes` takes its two-shot form (the root
    /// scatters a piece per host, then the hosts all-gather; see [Across
    /// hosts](super#across-hosts)). `false` on one host.
    pub fn broadcast_two_shot_across_hosts(&self, bytes: usize) -> bool {
        self.cross()
            .is_some_and(|c| two_shot_pays(c.topo.hosts.len(), bytes))
    }

    /// The all-reduce (and reduce) algorithm across hosts for `requested` and `bytes` per
    /// rank:
    /// [`AllReduceAlgo::OneShot`] (every partner gets this rank's whole shard, one round) or
    /// [`AllReduceAlgo::TwoShot`] (the shard reduce-scattered across hosts, then the pieces
    /// all-gathered: two rounds, `2 / H` of one-shot's bytes for `H` hosts). `OneShot` and
    /// `TwoShot` are taken as asked (from the call, then `MSCCLPP_ALLREDUCE_ALGO`, then
    /// [`CollConfig::all_reduce_algo`]); anything else is `Auto`: two-shot from three hosts
    /// once it saves [`CROSS_TWO_SHOT_SAVES`] bytes per rank. Equal on every rank for equal
    /// calls and settings (a rank that chose otherwise fails the call as a mismatch: the
    /// two descriptors differ).
    pub(super) fn cross_all_reduce_algo(
        &self,
        cross: &Cross,
        requested: AllReduceAlgo,
        bytes: usize,
    ) -> AllReduceAlgo {
        let asked = [
            Some(requested),
            self.env_all_reduce,
            Some(self.config.all_reduce_algo),
        ];
        if let Some(a) = asked
            .into_iter()
            .flatten()
            .find(|a| matches!(a, AllReduceAlgo::OneShot | AllReduceAlgo::TwoShot))
        {
            return a;
        }
        if two_shot_pays(cross.hosts(), bytes.div_ceil(cross.nlocal())) {
            AllReduceAlgo::TwoShot
        } else {
            AllReduceAlgo::OneShot
        }
    }

    /// The algorithm of a broadcast (`reduce` false) or reduce above the LL size:
    /// `MSCCLPP_BROADCAST_ALGO` / `MSCCLPP_REDUCE_ALGO`, then
    /// [`CollConfig::broadcast_algo`](super::CollConfig::broadcast_algo) /
    /// [`reduce_algo`](super::CollConfig::reduce_algo); [`Auto`](RootedAlgo::Auto)
    /// resolves by the message's `bytes`: [`Pipelined`](RootedAlgo::Pipelined) above
    /// [`ROOTED_PIPELINED_ABOVE`], else
    /// [`Rounds`](RootedAlgo::Rounds) (never `Auto` here).
    pub fn rooted_algo(&self, reduce: bool, bytes: usize) -> RootedAlgo {
        let algo = if reduce {
            self.env_reduce.unwrap_or(self.config.reduce_algo)
        } else {
            self.env_broadcast.unwrap_or(self.config.broadcast_algo)
        };
        match algo {
            RootedAlgo::Auto if bytes > super::select::ROOTED_PIPELINED_ABOVE => {
                RootedAlgo::Pipelined
            }
            RootedAlgo::Auto => RootedAlgo::Rounds,
            a => a,
        }
    }

    /// Whether a reduce-scatter, reduce, broadcast or all-to-all sending `pair_bytes` to each
    /// peer takes the LL path: up to `packet_max_bytes` and what a packet half holds (the
    /// same limit as one-shot all-reduce's).
    pub(super) fn takes_ll_path(&self, pair_bytes: usize) -> bool {
        let fits = one_shot_max_bytes(self.ctx.packets_len);
        pair_bytes <= self.config.packet_max_bytes.min(fits as usize)
    }
}
