//! The collectives across hosts, built from the cross-host step of `cross.rs`: the
//! hierarchical all-reduce and reduce (one-shot or two-shot across hosts), all-gather,
//! reduce-scatter, broadcast (two-shot from [`CROSS_TWO_SHOT_SAVES`] bytes) and all-to-all.

use super::cross::{Cross, Exec, two_shot_code};
use super::descriptor::{all_gather_tag, all_reduce_tag};
use super::select::two_shot_pays;
use super::{AllGatherAlgo, AllReduceAlgo, Collectives, DataType, ReduceOp};
use crate::communicator::CommError;
use mscclpp_device::collectives::cross::{GATHER, HEADER_ONLY, PER_DEST, PICK, REDUCE};
use mscclpp_device::collectives::{cross as xk, desc};

/// Refuses an average of 8-bit integers over more ranks than the type holds (the quotient's
/// divisor is the rank count in the type, as in the kernels).
fn check_avg(call: &str, op: ReduceOp, dtype: DataType, nranks: usize) -> Result<(), CommError> {
    let max = match dtype {
        DataType::I8 => i8::MAX as usize,
        DataType::U8 => u8::MAX as usize,
        _ => usize::MAX,
    };
    if op == ReduceOp::Avg && nranks > max {
        return Err(CommError::InvalidArgument(format!(
            "{call}: the average of {dtype} over {nranks} ranks is not supported (the rank \
             count does not fit the type); sum, then divide"
        )));
    }
    Ok(())
}

impl Collectives {
    /// The call descriptor and step flags of an all-reduce (`root`: a reduce) across hosts
    /// with `algo` (one-shot or two-shot; a reduce's is unused), and the local steps'
    /// operation (an average sums; the step divides once).
    fn all_reduce_plan(
        &self,
        cross: &Cross,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: Option<usize>,
        algo: AllReduceAlgo,
    ) -> ([u64; 2], u64, ReduceOp) {
        // The one-shot descriptor keeps the `Auto` code it always had.
        let code = if algo == AllReduceAlgo::TwoShot {
            algo
        } else {
            AllReduceAlgo::Auto
        };
        let descr = [
            count as u64,
            match root {
                None => all_reduce_tag(code, dtype, op),
                Some(r) => desc::rooted_tag(
                    desc::REDUCE,
                    super::descriptor::dtype_code(dtype),
                    super::descriptor::op_desc(op),
                    if algo == AllReduceAlgo::TwoShot {
                        two_shot_code()
                    } else {
                        0
                    },
                    r as u64,
                ),
            },
        ];
        let mut flags = xk::flags(REDUCE, self.nranks() as u32);
        if let Some(r) = root {
            flags = xk::to_host(flags, cross.topo.host_of(r) as u32);
        }
        let step_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        (descr, flags, step_op)
    }

    /// Across hosts: hierarchical all-reduce (see the [module](self)) on `ex`; with `root`,
    /// a reduce: the partners send to the root's host only, whose ranks reduce and gather
    /// the shards, and only the root writes `recv`.
    ///
    /// Per round, `L * c` elements (`L` ranks per host): the local reduce-scatter leaves
    /// this host's partial of the shard of this local index (`c` elements, summed in local
    /// rank order; one rank per host: the input itself), the exchange with the partners
    /// reduces it over the hosts in host order, and the local all-gather spreads the shards.
    /// The exchange is
    /// - one-shot (any `algo` but [`AllReduceAlgo::TwoShot`]): the partial goes whole to
    ///   every partner (a reduce: to the root's host only) and each reduces all of them:
    ///   `(H - 1) * c` elements sent per rank for `H` hosts, one round;
    /// - two-shot: `c` is a multiple of `H`, piece `h` of the partial goes to host `h`
    ///   ([`PER_DEST`]), which reduces it over the hosts, then a [`GATHER`] step hands every
    ///   partner (a reduce: the root's host only) every reduced piece: `2 * (H - 1) * c / H`
    ///   elements per rank (a reduce: the root's host receives that instead of
    ///   `(H - 1) * c`), two rounds (with two hosts the gather is a [`PICK`] of the
    ///   partner's piece: this host's is in place). The same sources in the same order: the
    ///   same bits.
    ///
    /// # Safety
    /// `send`/`recv` valid memory of `ex`'s kind for `count` elements (equal or disjoint;
    /// `recv` on the root only for a reduce), until the stream ran the call.
    #[allow(clippy::too_many_arguments)]
    // Long (~140 lines): one closure runs the local reduce-scatter, the rounds across hosts
    // (one-shot or two-shot, all-reduce or reduce) and the local all-gather on one staged
    // shard; cut apart, the pieces would pass that shard's pointers and offsets around.
    pub(super) unsafe fn cross_all_reduce(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: Option<usize>,
        algo: AllReduceAlgo,
    ) -> Result<(), CommError> {
        let call = ex.name(if root.is_some() {
            "reduce"
        } else {
            "all_reduce"
        });
        check_avg(call, op, dtype, self.nranks())?;
        let two_shot = algo == AllReduceAlgo::TwoShot;
        let algo = if two_shot {
            algo
        } else {
            AllReduceAlgo::OneShot
        };
        let s = dtype.size();
        self.cross_call(call, ex, |cross, shard, stage| {
            let (descr, flags, step_op) = self.all_reduce_plan(cross, count, dtype, op, root, algo);
            let (nl, nh, me) = (cross.nlocal(), cross.hosts(), cross.topo.host);
            // Reduce: the root's host reduces, the root keeps the result.
            let root_host = root.map(|r| cross.topo.host_of(r));
            let reducing = root_host.is_none_or(|h| h == me);
            let is_root = root.is_none_or(|r| r == self.rank());
            // Two-shot's pieces and exchanges (one-shot's step is `flags`).
            let scatter = xk::flags(REDUCE | PER_DEST, self.nranks() as u32);
            // With two hosts the gather copies the partner's piece alone (PICK): this host's
            // is in place already.
            let gather = xk::flags(if nh == 2 { PICK } else { GATHER }, 0);
            let gather = match root_host {
                None => gather,
                Some(h) => xk::to_host(gather, h as u32),
            };
            // A shard fills at most a slot's payload (one-shot) or the shard buffer, in nh
            // pieces of at most a slot's payload (two-shot).
            let unit = if two_shot { nh } else { 1 };
            let most = cross.payload() / s / unit * unit;
            let mut off = 0usize;
            while off < count {
                let rem = count - off;
                let c = rem.div_ceil(nl).next_multiple_of(unit).min(most);
                let (q, len) = (c / unit, rem.min(nl * c));
                let at = |b: u64| b + (off * s) as u64;
                // The reduced shard: straight into recv when this rank keeps a whole round
                // of one shard, else the shard buffer.
                let res = if nl == 1 && len == c && is_root {
                    at(recv)
                } else {
                    shard
                };
                let out = if reducing { res } else { 0 };
                // SAFETY (every step below): send and recv hold count elements (caller
                // contract); the stage holds nl * payload >= nl * c elements, the shard
                // payload >= c, a send slot's payload >= q.
                unsafe {
                    // 1. This host's partial of the shard of this local index (past len,
                    // the stage's stale bytes, reduced but never written out).
                    let input = if len == nl * c {
                        at(send)
                    } else {
                        self.x_copy(ex, stage, at(send), len * s)?;
                        stage
                    };
                    let rs =
                        |to: u64| self.local_reduce_scatter(ex, call, input, to, c, dtype, step_op);
                    if two_shot {
                        let partial = if nl == 1 {
                            input
                        } else {
                            rs(shard)?;
                            shard
                        };
                        for h in 0..nh {
                            let from = partial + (h * q * s) as u64;
                            self.x_copy(ex, cross.send_payload(h), from, q * s)?;
                        }
                        // 2. This host's piece, reduced over the hosts in host order (the
                        // average's quotient included) into its place in the result.
                        let mine = res + (me * q * s) as u64;
                        self.x_step(ex, cross, call, 0, mine, descr, q * s, scatter, 0)?;
                        // 3. Every host's reduced piece to every partner (a reduce: to the
                        // root's host only): the whole shard. With two hosts, the partner's
                        // piece (PICK) to its place.
                        // GATHER: the shard and the pieces' stride; PICK: the partner's
                        // place (none where this rank keeps nothing) and the partner's host.
                        let (to, stride) = match (nh, out) {
                            (2, 0) => (0, 1 - me),
                            (2, _) => (out + ((1 - me) * q * s) as u64, 1 - me),
                            _ => (out, q * s),
                        };
                        self.x_step(ex, cross, call, mine, to, descr, q * s, gather, stride)?;
                    } else {
                        // Into the own send slot (one rank per host: the step copies the
                        // input there).
                        let src = if nl == 1 {
                            input
                        } else {
                            rs(cross.send_payload(me))?;
                            0
                        };
                        // 2, 3. Every host's partial from the partners (a reduce: to the
                        // root's host only), reduced in host order (the average's quotient
                        // included).
                        self.x_step(ex, cross, call, src, out, descr, c * s, flags, 0)?;
                    }
                    // 4. Every local index's shard to every local rank (a reduce: on the
                    // root's host, kept by the root only).
                    if reducing && nl == 1 && is_root {
                        self.x_copy(ex, at(recv), res, len * s)?;
                    } else if reducing && nl > 1 {
                        let whole = len == nl * c && root.is_none();
                        let at_recv = is_root.then(|| at(recv));
                        let shape = (c * s, len * s, whole);
                        self.spread(ex, call, (shard, stage), at_recv, shape, dtype)?;
                    }
                }
                off += len;
            }
            Ok(())
        })
    }

    /// The last step of an all-reduce round with several ranks per host: the local
    /// all-gather of every local index's `shard` (`(shard bytes, round bytes, whole)`),
    /// straight into `recv` when the round is `whole` (a full round of an all-reduce), else
    /// through `stage` and a copy of the round's bytes into `recv` (`None`: a reduce's
    /// non-root, which keeps nothing).
    ///
    /// # Safety
    /// `shard` valid for its bytes, `stage` for the local ranks' shards, `recv` for the
    /// round's bytes (`L` shards when `whole`), memory of `ex`'s kind.
    unsafe fn spread(
        &self,
        ex: Exec<'_>,
        call: &str,
        (shard, stage): (u64, u64),
        recv: Option<u64>,
        (shard_bytes, round_bytes, whole): (usize, usize, bool),
        dtype: DataType,
    ) -> Result<(), CommError> {
        // SAFETY: caller contract.
        unsafe {
            match recv {
                Some(r) if whole => self.local_all_gather(ex, call, shard, r, shard_bytes, dtype),
                _ => {
                    self.local_all_gather(ex, call, shard, stage, shard_bytes, dtype)?;
                    match recv {
                        Some(r) => self.x_copy(ex, r, stage, round_bytes),
                        None => Ok(()),
                    }
                }
            }
        }
    }

    /// Across hosts: all-gather of `bytes` per rank on `ex` (see the [module](self)). Per
    /// round, a piece of every rank's input goes to the partners (the step gathers the
    /// hosts' pieces), then the local all-gather and copies to their places.
    ///
    /// # Safety
    /// `send` valid for `bytes`, `recv` for `nranks * bytes` (in place as the one-host call),
    /// memory of `ex`'s kind until the stream ran the call.
    pub(super) unsafe fn cross_all_gather(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let call = ex.name("all_gather");
        let descr = [bytes as u64, all_gather_tag(AllGatherAlgo::Auto, dtype)];
        let flags = xk::flags(GATHER, 0);
        self.cross_call(call, ex, |cross, shard, stage| {
            let (nl, nh) = (cross.nlocal(), cross.hosts());
            // Each round: a piece of every rank's data; nh pieces gathered per local rank.
            let piece = cross.payload() / nh / 16 * 16;
            let mut off = 0usize;
            while off < bytes {
                let p = piece.min(bytes - off);
                let src = send + off as u64;
                // SAFETY (every step below): send holds bytes, recv nranks * bytes (caller
                // contract); the shard holds payload >= nh * p bytes, the stage nl *
                // payload >= nl * nh * p.
                unsafe {
                    if nl == 1 {
                        // One rank per host: rank h is host h; the pieces go to their places.
                        let out = recv + off as u64;
                        self.x_step(ex, cross, call, src, out, descr, p, flags, bytes)?;
                    } else {
                        self.x_step(ex, cross, call, src, shard, descr, p, flags, p)?;
                        self.local_all_gather(ex, call, shard, stage, nh * p, dtype)?;
                        for lq in 0..nl {
                            for h in 0..nh {
                                let to = recv + (cross.topo.rank_at(h, lq) * bytes + off) as u64;
                                let from = stage + ((lq * nh + h) * p) as u64;
                                self.x_copy(ex, to, from, p)?;
                            }
                        }
                    }
                }
                off += p;
            }
            Ok(())
        })
    }

    /// Across hosts: reduce-scatter of `count` elements per rank on `ex` (`send` holds
    /// `nranks * count`, block `g` for rank `g`). Each round: the blocks are arranged by
    /// local index (local index `l` gets, in host order, the blocks of the ranks of local
    /// index `l`), reduce-scattered inside the host (local order), and each host's partial of
    /// block `g` sent to `g`'s host, where the step reduces them in host order.
    ///
    /// # Safety
    /// `send` valid for `nranks * count` elements, `recv` for `count` (in place as the
    /// one-host call), memory of `ex`'s kind until the stream ran the call.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn cross_reduce_scatter(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = ex.name("reduce_scatter");
        check_avg(call, op, dtype, self.nranks())?;
        let s = dtype.size();
        let step_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let tag = desc::tag(
            desc::REDUCE_SCATTER,
            super::descriptor::dtype_code(dtype),
            super::descriptor::op_desc(op),
            0,
        );
        let descr = [count as u64, tag];
        let flags = xk::flags(REDUCE | PER_DEST, self.nranks() as u32);
        self.cross_call(call, ex, |cross, shard, stage| {
            let (nl, nh) = (cross.nlocal(), cross.hosts());
            // Per round, c elements of every block: the stage holds nl * nh * c of them, the
            // local result nh * c (the shard), then one piece per send slot.
            let cap = cross.payload() / nh / s;
            let mut off = 0usize;
            while off < count {
                let c = (count - off).min(cap);
                // SAFETY (every step below): send holds nranks * count elements, recv count
                // (caller contract); the stage holds nl * payload >= nl * nh * c elements,
                // the shard payload >= nh * c, each send slot's payload >= c.
                unsafe {
                    for lq in 0..nl {
                        for h in 0..nh {
                            let g = cross.topo.rank_at(h, lq);
                            let from = send + ((g * count + off) * s) as u64;
                            let to = stage + ((lq * nh + h) * c * s) as u64;
                            self.x_copy(ex, to, from, c * s)?;
                        }
                    }
                    // This host's partial of the blocks of this local index, host by host.
                    let partial = if nl == 1 {
                        stage
                    } else {
                        self.local_reduce_scatter(ex, call, stage, shard, nh * c, dtype, step_op)?;
                        shard
                    };
                    for h in 0..nh {
                        let from = partial + (h * c * s) as u64;
                        self.x_copy(ex, cross.send_payload(h), from, c * s)?;
                    }
                    let out = recv + (off * s) as u64;
                    self.x_step(ex, cross, call, 0, out, descr, c * s, flags, 0)?;
                }
                off += c;
            }
            Ok(())
        })
    }

    /// Across hosts: broadcast of `bytes` from `root` on `ex`: the root's data goes to the
    /// ranks of its local index on the other hosts (the other local indexes do not exchange),
    /// then each host broadcasts it from that local index.
    ///
    /// # Safety
    /// `send` valid for `bytes` on the root, `recv` for `bytes` everywhere, memory of `ex`'s
    /// kind until the stream ran the call.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn cross_broadcast(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<(), CommError> {
        let call = ex.name("broadcast");
        self.cross_call(call, ex, |cross, shard, _| {
            let topo = &cross.topo;
            let root_host = topo.host_of(root);
            let root_local = topo.hosts[root_host]
                .iter()
                .position(|&r| r == root)
                .expect("listed");
            let two_shot = two_shot_pays(cross.hosts(), bytes);
            let code = if two_shot { two_shot_code() } else { 0 };
            let tag = desc::rooted_tag(
                desc::BROADCAST,
                super::descriptor::dtype_code(dtype),
                0,
                code,
                root as u64,
            );
            let descr = [bytes as u64, tag];
            if topo.local == root_local && two_shot {
                // SAFETY: caller contract; the shard is the cross state's.
                unsafe {
                    self.broadcast_two_shot(
                        ex, call, cross, send, recv, bytes, root_host, descr, shard,
                    )?
                };
            } else if topo.local == root_local {
                let me = topo.host;
                let mut off = 0;
                while off < bytes {
                    let p = cross.payload().min(bytes - off);
                    // The root puts its piece; the others send headers and copy the root's.
                    let (src, flags) = if me == root_host {
                        (send + off as u64, xk::flags(PICK, 0))
                    } else {
                        (0, xk::flags(PICK | HEADER_ONLY, 0))
                    };
                    let out = if me == root_host && send == recv {
                        0
                    } else {
                        recv + off as u64
                    };
                    // SAFETY: send holds bytes on the root, recv bytes (caller contract).
                    unsafe { self.x_step(ex, cross, call, src, out, descr, p, flags, root_host)? };
                    off += p;
                }
            } else {
                // The other local indices carry nothing across hosts, but trade the call's
                // header with their partners once: hosts that disagree on the root (or the
                // size) then find it on every rank, where before the root's group waited for
                // a round that another host's ranks of its index never sent.
                let flags = xk::flags(xk::NONE, 0) | HEADER_ONLY;
                // SAFETY: no bytes: the step copies nothing in or out.
                unsafe { self.x_step(ex, cross, call, 0, 0, descr, 0, flags, 0)? };
            }
            if cross.nlocal() > 1 {
                // SAFETY: recv holds bytes; on the local root it holds the data now.
                unsafe { self.local_broadcast(ex, call, recv, bytes, dtype, root_local)? };
            }
            Ok(())
        })
    }

    /// The cross-host part of a two-shot broadcast from host `root_host` (its rank of this
    /// local index is the root): per round, `p` bytes in `H` pieces of `q`; the root puts
    /// piece `h` to host `h` alone (a [`PER_DEST`] [`PICK`] step, the others send headers),
    /// then a [`GATHER`] step hands every partner every piece. The root's link carries `2 *
    /// (H - 1) / H` of the bytes instead of `H - 1` times them.
    ///
    /// # Safety
    /// As for [`cross_broadcast`](Self::cross_broadcast); `shard` the cross state's.
    #[allow(clippy::too_many_arguments)]
    unsafe fn broadcast_two_shot(
        &self,
        ex: Exec<'_>,
        call: &str,
        cross: &Cross,
        send: u64,
        recv: u64,
        bytes: usize,
        root_host: usize,
        descr: [u64; 2],
        shard: u64,
    ) -> Result<(), CommError> {
        let (nh, me) = (cross.hosts(), cross.topo.host);
        let most = cross.payload() / nh;
        let scatter = if me == root_host {
            xk::flags(PICK | PER_DEST, 0)
        } else {
            xk::flags(PICK | PER_DEST | HEADER_ONLY, 0)
        };
        let gather = xk::flags(GATHER, 0);
        let mut off = 0;
        while off < bytes {
            let p = (bytes - off).min(nh * most);
            let q = p.div_ceil(nh);
            // Straight into recv when the pieces fill it exactly, else through the shard
            // (payload >= nh * q bytes).
            let direct = p == nh * q;
            let whole = if direct { recv + off as u64 } else { shard };
            let mine = whole + (me * q) as u64;
            // SAFETY (every step below): send holds bytes on the root, recv bytes (caller
            // contract); a send slot's payload holds q bytes.
            unsafe {
                if me == root_host {
                    for h in 0..nh {
                        // The last pieces may be short (or empty) past p.
                        let valid = p.saturating_sub(h * q).min(q);
                        let from = send + (off + h * q) as u64;
                        self.x_copy(ex, cross.send_payload(h), from, valid)?;
                    }
                }
                self.x_step(ex, cross, call, 0, mine, descr, q, scatter, root_host)?;
                self.x_step(ex, cross, call, mine, whole, descr, q, gather, q)?;
                if !direct {
                    self.x_copy(ex, recv + off as u64, shard, p)?;
                }
            }
            off += p;
        }
        Ok(())
    }

    /// Across hosts: all-to-all of `bytes` per pair on `ex` (`send` and `recv` hold `nranks *
    /// bytes`). Each round, a piece of every block: an all-to-all inside the host hands local
    /// index `l` every block of this host meant for the ranks of local index `l` (on every
    /// host); each rank puts its partner on host `h` the blocks for it (a send slot per
    /// host, the own host's too), the step gathers every host's blocks, and they are copied
    /// to their places by source rank.
    ///
    /// # Safety
    /// `send` and `recv` valid for `nranks * bytes`, disjoint, memory of `ex`'s kind until the
    /// stream ran the call.
    pub(super) unsafe fn cross_all_to_all(
        &self,
        ex: Exec<'_>,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let call = ex.name("all_to_all");
        let tag = desc::tag(desc::ALL_TO_ALL, super::descriptor::dtype_code(dtype), 0, 0);
        let descr = [bytes as u64, tag];
        let flags = xk::flags(GATHER | PER_DEST, 0);
        self.cross_call(call, ex, |cross, _, stage| {
            let (nl, nh) = (cross.nlocal(), cross.hosts());
            // Pieces of p bytes (whole elements): the stage holds the arranged input and the
            // local all-to-all's output (nl * nh * p each), later the gathered blocks; a
            // slot nl * p.
            let s = dtype.size();
            let p_max = ((cross.payload() / (2 * nh)).min(cross.payload() / nl) / s * s).max(s);
            let mut off = 0usize;
            while off < bytes {
                let p = p_max.min(bytes - off);
                let half = (nl * nh * p) as u64;
                // SAFETY (every step below): send and recv hold nranks * bytes (caller
                // contract); the stage holds nl * payload >= 2 * nl * nh * p bytes; a send
                // slot's payload >= nl * p.
                unsafe {
                    // Input arranged by destination local index, then host.
                    for ld in 0..nl {
                        for hd in 0..nh {
                            let g = cross.topo.rank_at(hd, ld);
                            let from = send + (g * bytes + off) as u64;
                            let to = stage + ((ld * nh + hd) * p) as u64;
                            self.x_copy(ex, to, from, p)?;
                        }
                    }
                    // From every local rank ls: its blocks for (hd, l), hd in host order.
                    let local_out = if nl == 1 {
                        stage
                    } else {
                        let out = stage + half;
                        self.local_all_to_all(ex, call, stage, out, nh * p, dtype)?;
                        out
                    };
                    for hd in 0..nh {
                        for ls in 0..nl {
                            let from = local_out + ((ls * nh + hd) * p) as u64;
                            let to = cross.send_payload(hd) + (ls * p) as u64;
                            self.x_copy(ex, to, from, p)?;
                        }
                    }
                    // Host hs's blocks (nl * p bytes, by source local index) at stage +
                    // hs * nl * p.
                    self.x_step(ex, cross, call, 0, stage, descr, nl * p, flags, nl * p)?;
                    for hs in 0..nh {
                        for ls in 0..nl {
                            let g = cross.topo.rank_at(hs, ls);
                            let from = stage + ((hs * nl + ls) * p) as u64;
                            self.x_copy(ex, recv + (g * bytes + off) as u64, from, p)?;
                        }
                    }
                }
                off += p;
            }
            Ok(())
        })
    }
}
