//! Collectives across hosts (issue #17), Host backend: ranks of one host keep the memory
//! channels and kernels of a one-host [`Collectives`] (over the *local group*: the host's
//! ranks, indexed by local index), and reach the other hosts through proxy channels over
//! [`TransportKind::Tcp`] to their *partners*: the ranks with the same local index on the
//! other hosts (one per host). Design notes and the order of summation:
//! `docs/tcp-transport.md`, "Collectives across hosts".
//!
//! Every cross-host step is an *exchange* of one round: this rank puts a 32-byte header (the
//! round number and the call's descriptor) and a payload from a send slot of its cross
//! buffer into its slot of every partner's receive area, with the signal, then waits for
//! every partner's signal and checks their headers. Rounds alternate between two halves of
//! the buffer: a rank writes a partner's half of round `k + 2` only after it has received
//! that partner's round `k + 1`, which the partner sends only after it has read its half of
//! round `k`, so no acknowledgement is needed. The ranks of one cross group (one local
//! index) exchange among themselves only; different groups never meet, so a group whose
//! ranks all skip a step (a broadcast's other groups) stays in step.
//!
//! Calls block (the Host backend's calls do anyway), allocate nothing (staging is sized at
//! setup), and every wait is bounded by the device timeout and stopped by an abort. A
//! cross-host failure (a timeout, an abort, a lost peer, calls that differ between hosts) is
//! sticky: the rounds of the partners no longer agree, so every later call returns it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use mscclpp_device::channel::DevConn;
use mscclpp_device::collectives::{Bytes, Dyn, Reduce, desc, op};

use super::{
    AllGatherAlgo, CollConfig, Collectives, DataType, ReduceOp, all_gather_tag, all_reduce_tag,
};
use crate::communicator::{Buffer, CommError, Communicator};
use crate::transport::TransportKind;

/// Connection tag of the cross-host buffer.
pub(super) const TAG_CROSS: u32 = 0xC011_0005;
/// Bytes of the header before every payload: round, descriptor (`n`, tag), payload bytes.
const HDR: usize = 32;
/// How long one `wait_timeout` waits before the abort word and the clock are looked at.
const WAIT_SLICE_NS: u64 = 1_000_000;

/// The hosts of a communicator: its ranks grouped by bootstrap host id, hosts in the order of
/// their lowest rank, ranks ascending within a host.
#[derive(Debug, Clone)]
pub(super) struct Topology {
    /// `hosts[h]`: the ranks of host `h`.
    pub(super) hosts: Vec<Vec<usize>>,
    /// This rank's host.
    pub(super) host: usize,
    /// This rank's index in its host's ranks.
    pub(super) local: usize,
}

impl Topology {
    /// Reads every rank's host id from the bootstrap (every rank reads the same table, so
    /// every rank builds the same topology and refuses alike).
    pub(super) fn of(comm: &Communicator) -> Result<Topology, CommError> {
        let bs = comm.bootstrap().as_async();
        let mut ids: Vec<String> = Vec::new();
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        for r in 0..comm.nranks() {
            let id = bs.host_id(r).unwrap_or("?").to_string();
            match ids.iter().position(|x| *x == id) {
                Some(h) => hosts[h].push(r),
                None => {
                    ids.push(id);
                    hosts.push(vec![r]);
                }
            }
        }
        let me = comm.rank();
        let host = hosts
            .iter()
            .position(|h| h.contains(&me))
            .expect("every rank is on a host");
        let local = hosts[host].iter().position(|&r| r == me).expect("listed");
        let max = mscclpp_device::collectives::MAX_RANKS;
        if let Some((h, ranks)) = hosts.iter().enumerate().find(|(_, r)| r.len() > max) {
            return Err(CommError::InvalidArgument(format!(
                "collectives: host {:?} has {} ranks; at most {max} ranks per host are \
                 supported (memory channels between the ranks of a host)",
                ids[h],
                ranks.len()
            )));
        }
        if hosts.len() > 1
            && let Some(h) = hosts.iter().position(|r| r.len() != hosts[0].len())
        {
            return Err(CommError::InvalidArgument(format!(
                "collectives: host {:?} has {} ranks and host {:?} {}; collectives across \
                 hosts need the same number of ranks on every host (each rank's partners on \
                 the other hosts are the ranks of its local index)",
                ids[0],
                hosts[0].len(),
                ids[h],
                hosts[h].len()
            )));
        }
        Ok(Topology { hosts, host, local })
    }

    /// Ranks of this rank's host (the local group), ascending.
    pub(super) fn group(&self) -> &[usize] {
        &self.hosts[self.host]
    }

    /// The rank of local index `local` on host `h`.
    pub(super) fn rank_at(&self, h: usize, local: usize) -> usize {
        self.hosts[h][local]
    }
}

/// What a call holds while it runs: the round counter and the staging memory.
#[derive(Debug)]
struct State {
    /// Rounds exchanged so far with the partners (both halves alternate on it).
    round: u64,
    /// A reduced shard / the gathered pieces of one round (`payload` bytes).
    shard: Vec<u8>,
    /// The local group's side of one round (`nlocal * payload` bytes).
    stage: Vec<u8>,
    /// Set once a cross-host step failed: every later call returns it.
    broken: Option<CommError>,
}

/// The cross-host state of a [`Collectives`] spanning hosts.
#[derive(Debug)]
pub(super) struct Cross {
    pub(super) topo: Topology,
    /// `conns[h]`: the proxy channel (TCP) to this rank's partner on host `h`; `None` for
    /// the own host.
    conns: Vec<Option<DevConn<'static>>>,
    /// Host address of the cross buffer: two halves of `hosts` send slots then `hosts`
    /// receive slots, `slot` bytes each.
    base: usize,
    slot: usize,
    timeout: Duration,
    state: Mutex<State>,
    _buf: Buffer,
}

/// Bytes of each slot of the cross buffer for `hosts` hosts: the buffer holds `4 * hosts`
/// slots in `scratch_bytes / 2` (so its size does not grow with the job), each at least
/// 4 KiB and at least 16 payload bytes per host (an all-gather round gathers a piece of 16
/// bytes or more from every host into one slot's worth).
fn slot_bytes(config: &CollConfig, hosts: usize) -> usize {
    (config.scratch_bytes / 2 / (4 * hosts))
        .max(4096)
        .max(16 * hosts + HDR)
        .next_multiple_of(16)
}

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

/// A connection request made before the communicator's setup, completed by
/// [`Cross::finish`].
pub(super) struct Pending {
    topo: Topology,
    buf: Buffer,
    slot: usize,
    /// `(host, index in device_connections)` of each partner's channel.
    channels: Vec<(usize, usize)>,
}

impl Cross {
    /// Registers the cross buffer and asks for a TCP proxy channel to every partner (the
    /// setup itself is the caller's `connection_setup`).
    pub(super) fn connect(
        comm: &mut Communicator,
        config: &CollConfig,
        topo: Topology,
    ) -> Result<Pending, CommError> {
        let nh = topo.hosts.len();
        let slot = slot_bytes(config, nh);
        let buf = comm.alloc_buffer(4 * nh * slot)?;
        let mut channels = Vec::new();
        for h in (0..nh).filter(|&h| h != topo.host) {
            let p = topo.rank_at(h, topo.local);
            channels.push((h, comm.connect(p, &buf, TAG_CROSS, TransportKind::Tcp)?));
        }
        Ok(Pending {
            topo,
            buf,
            slot,
            channels,
        })
    }

    /// After the setup: takes the channels' handles.
    pub(super) fn finish(comm: &Communicator, p: Pending) -> Result<Cross, CommError> {
        // SAFETY: the handles are kept in the Cross, which lives in the Collectives next to
        // `comm` (which owns their memory), and are used only while it lives.
        let all = unsafe { comm.device_connections_detached() };
        let nh = p.topo.hosts.len();
        let mut conns = vec![None; nh];
        for (h, i) in p.channels {
            conns[h] = Some(all[i]);
        }
        let nlocal = p.topo.group().len();
        let payload = p.slot - HDR;
        let base = p.buf.host_ptr().ok_or_else(|| {
            CommError::InvalidArgument(
                "collectives across hosts run on the Host backend only".into(),
            )
        })? as usize;
        Ok(Cross {
            conns,
            base,
            slot: p.slot,
            timeout: comm.device_timeout(),
            state: Mutex::new(State {
                round: 0,
                shard: vec![0; payload],
                stage: vec![0; nlocal * payload],
                broken: None,
            }),
            topo: p.topo,
            _buf: p.buf,
        })
    }

    fn hosts(&self) -> usize {
        self.topo.hosts.len()
    }

    fn nlocal(&self) -> usize {
        self.topo.group().len()
    }

    /// Payload bytes of a slot (a multiple of 16).
    fn payload(&self) -> usize {
        self.slot - HDR
    }

    /// Offset in the cross buffer of send slot `h` (receive slot with `recv`) of `round`'s
    /// half.
    fn slot_off(&self, round: u64, recv: bool, h: usize) -> usize {
        let nh = self.hosts();
        ((round as usize & 1) * 2 * nh + usize::from(recv) * nh + h) * self.slot
    }

    /// Payload address of a slot.
    fn payload_ptr(&self, round: u64, recv: bool, h: usize) -> *mut u8 {
        (self.base + self.slot_off(round, recv, h) + HDR) as *mut u8
    }
}

impl Collectives {
    /// The cross-host state, or `None` for a one-host `Collectives`.
    pub(super) fn cross(&self) -> Option<&Cross> {
        self.cross.as_ref()
    }

    /// The error of a call that is not built across hosts.
    pub(super) fn not_across_hosts(&self, call: &str) -> Result<(), CommError> {
        match &self.cross {
            None => Ok(()),
            Some(c) => Err(CommError::InvalidArgument(format!(
                "{call}: not supported across hosts (this Collectives spans {} hosts); \
                 across hosts every collective but send/recv is built",
                c.hosts()
            ))),
        }
    }

    /// Runs `body` with the cross state locked, after the pending errors; a failure of the
    /// body is kept and returned by every later call (see the [module](self)).
    fn cross_call(
        &self,
        call: &str,
        body: impl FnOnce(&Cross, &mut State) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        self.host_only(call)?;
        let cross = self.cross.as_ref().expect("a cross-host Collectives");
        let mut st = cross.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = &st.broken {
            return Err(copy_error(call, e));
        }
        self.check_fault(call, true)?;
        let r = body(cross, &mut st);
        // Any failure inside (a local step's too) may leave this rank's rounds behind its
        // partners': the next exchange would pair different rounds.
        if let Err(e) = &r {
            st.broken = Some(copy_error(call, e));
        }
        r
    }

    /// One round with the partners: for every other host `h` (with `lens[h]` payload bytes,
    /// taken from send slot `src(h)` of the round's half where the caller put them), put the
    /// header and payload into the partner's receive slot of this host, with the signal;
    /// then wait for every partner's and check their headers. `skip`: hosts not exchanged
    /// with this round.
    fn exchange(
        &self,
        cross: &Cross,
        st: &mut State,
        call: &str,
        descr: [u64; 2],
        lens: impl Fn(usize) -> usize,
        src: impl Fn(usize) -> usize,
    ) -> Result<(), CommError> {
        let round = st.round;
        st.round += 1;
        let me = cross.topo.host;
        for h in (0..cross.hosts()).filter(|&h| h != me) {
            let (len, from) = (lens(h), src(h));
            let off = cross.slot_off(round, false, from);
            let hdr = [round, descr[0], descr[1], len as u64];
            // SAFETY: the send slot's header lies in the cross buffer (this rank's own);
            // no put reads it now (the last put of this half's slots completed when its
            // try_put_with_signal returned).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    hdr.as_ptr() as *const u8,
                    (cross.base + off) as *mut u8,
                    HDR,
                )
            };
            let dst = cross.slot_off(round, true, me);
            let conn = cross.conns[h].as_ref().expect("a partner's channel");
            if conn
                .try_put_with_signal(dst as u64, off as u64, (HDR + len) as u64)
                .is_err()
            {
                let why = self.comm.proxy_error().unwrap_or_else(|| {
                    "the proxy did not take the put within the FIFO timeout".into()
                });
                return Err(CommError::State(format!(
                    "{call}: rank {}: the put to rank {} (host {h}) failed: {why}; the \
                     collectives cannot be used any more",
                    self.rank(),
                    cross.topo.rank_at(h, cross.topo.local)
                )));
            }
        }
        for h in (0..cross.hosts()).filter(|&h| h != me) {
            let peer = cross.topo.rank_at(h, cross.topo.local);
            let conn = cross.conns[h].as_ref().expect("a partner's channel");
            let start = Instant::now();
            while !conn.wait_timeout(WAIT_SLICE_NS) {
                if let Some(reason) = self.comm.abort_reason() {
                    return Err(CommError::Aborted(format!(
                        "{call}: rank {}: {reason} (while waiting for rank {peer} on host \
                         {h}); the collectives cannot be used any more",
                        self.rank()
                    )));
                }
                if let Some(e) = self.comm.proxy_error() {
                    return Err(CommError::State(format!(
                        "{call}: rank {}: {e}; the collectives cannot be used any more",
                        self.rank()
                    )));
                }
                if start.elapsed() > cross.timeout {
                    return Err(CommError::Timeout(format!(
                        "{call}: rank {} waited {:?} for rank {peer} (host {h}, over TCP) and \
                         gave up: that rank did not take part, or is stuck; the collectives \
                         cannot be used any more",
                        self.rank(),
                        cross.timeout
                    )));
                }
            }
            let mut hdr = [0u64; 4];
            // SAFETY: the receive slot's header, published by the wait (the TCP receiver
            // writes the data before it raises the counter).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (cross.base + cross.slot_off(round, true, h)) as *const u8,
                    hdr.as_mut_ptr() as *mut u8,
                    HDR,
                )
            };
            if hdr[0] != round || [hdr[1], hdr[2]] != descr {
                let theirs = if hdr[0] != round {
                    format!("its round {} where this rank is at {round}", hdr[0])
                } else {
                    describe([hdr[1], hdr[2]])
                };
                return Err(CommError::State(format!(
                    "{call}: the ranks called collectives differently across hosts: rank {} \
                     called {}, rank {peer} (host {h}) {theirs}; the collectives cannot be \
                     used any more",
                    self.rank(),
                    describe(descr)
                )));
            }
        }
        Ok(())
    }

    /// Host backend, across hosts: hierarchical all-reduce (see the [module](self)); with
    /// `root`, a reduce: the partners send to the root's host only, whose ranks reduce and
    /// gather the shards, and only the root writes `recv`.
    ///
    /// # Safety
    /// `send`/`recv` valid host memory for `count` elements (equal or disjoint).
    pub(super) unsafe fn cross_all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: Option<usize>,
    ) -> Result<(), CommError> {
        let call = if root.is_some() {
            "reduce_host"
        } else {
            "all_reduce_host"
        };
        check_avg(call, op, dtype, self.nranks())?;
        let s = dtype.size();
        // Avg: sums in every step, the quotient once at the end.
        let step_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let descr = [
            count as u64,
            match root {
                None => all_reduce_tag(super::AllReduceAlgo::Auto, dtype, op),
                Some(r) => desc::rooted_tag(
                    desc::REDUCE,
                    super::dtype_code(dtype),
                    super::op_desc(op),
                    0,
                    r as u64,
                ),
            },
        ];
        let type_op = desc::type_op(all_reduce_tag(super::AllReduceAlgo::Auto, dtype, step_op));
        let n_all = self.nranks() as u32;
        self.cross_call(call, |cross, st| {
            let nl = cross.nlocal();
            let me = cross.topo.host;
            // Reduce: the root's host reduces, the root keeps the result.
            let root_host = root.map(|r| {
                (0..cross.hosts())
                    .find(|&h| cross.topo.hosts[h].contains(&r))
                    .expect("root checked")
            });
            let reducing = root_host.is_none_or(|h| h == me);
            let is_root = root.is_none_or(|r| r == self.rank());
            let cap = cross.payload() / s;
            let mut off = 0usize;
            while off < count {
                let rem = count - off;
                let c = rem.div_ceil(nl).min(cap);
                let len = rem.min(nl * c);
                let round = st.round;
                let own = cross.payload_ptr(round, false, cross.topo.host);
                // 1. This host's sum of the shard of this local index, into the own send slot.
                // SAFETY: send holds count elements (caller contract); the stage holds
                // nl * payload >= nl * c elements; the send slot holds payload bytes.
                unsafe {
                    let src = (send as *const u8).add(off * s);
                    if nl == 1 {
                        std::ptr::copy_nonoverlapping(src, own, len * s);
                    } else {
                        let input = if len == nl * c {
                            src
                        } else {
                            std::ptr::copy_nonoverlapping(src, st.stage.as_mut_ptr(), len * s);
                            st.stage.as_ptr()
                        };
                        self.local_reduce_scatter(
                            call,
                            input as u64,
                            own as u64,
                            c,
                            dtype,
                            step_op,
                        )?;
                    }
                }
                // 2. Every host's sum of it, from the partners (reduce: to the root's host).
                let lens = |h| {
                    if root_host.is_none_or(|r| r == h) {
                        c * s
                    } else {
                        0
                    }
                };
                self.exchange(cross, st, call, descr, lens, |_| me)?;
                if !reducing {
                    off += len;
                    continue;
                }
                // 3. Reduced in host order (the same on every partner), the average's quotient.
                let shard = st.shard.as_mut_ptr();
                reduce_hosts(cross, round, shard, c * s, type_op);
                if op == ReduceOp::Avg {
                    // SAFETY: the shard holds c elements of the type.
                    unsafe { finish_avg(shard, c, dtype, n_all) };
                }
                // 4. Every local index's shard to every local rank (reduce: gathered on the
                // root's host, kept by the root only).
                // SAFETY: recv holds count elements (caller contract).
                unsafe {
                    let dst = (recv as *mut u8).add(off * s);
                    if nl == 1 {
                        if is_root {
                            std::ptr::copy_nonoverlapping(shard, dst, len * s);
                        }
                    } else if len == nl * c && root.is_none() {
                        self.local_all_gather(call, shard as u64, dst as u64, c * s, dtype)?;
                    } else {
                        let stage = st.stage.as_mut_ptr();
                        self.local_all_gather(call, shard as u64, stage as u64, c * s, dtype)?;
                        if is_root {
                            std::ptr::copy_nonoverlapping(stage, dst, len * s);
                        }
                    }
                }
                off += len;
            }
            Ok(())
        })
    }

    /// Host backend, across hosts: all-gather (see the [module](self)); `bytes` per rank.
    ///
    /// # Safety
    /// `send` valid for `bytes`, `recv` for `nranks * bytes` (in place as the one-host call).
    pub(super) unsafe fn cross_all_gather(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let call = "all_gather_host";
        let descr = [bytes as u64, all_gather_tag(AllGatherAlgo::Auto, dtype)];
        self.cross_call(call, |cross, st| {
            let (nl, nh) = (cross.nlocal(), cross.hosts());
            let me = cross.topo.host;
            // Each round: a piece of every rank's data; nh pieces gathered per local rank.
            let piece = cross.payload() / nh / 16 * 16;
            let mut off = 0usize;
            while off < bytes {
                let p = piece.min(bytes - off);
                let round = st.round;
                // SAFETY: send holds bytes (caller contract); a send slot holds payload >= p.
                unsafe {
                    let src = (send as *const u8).add(off);
                    std::ptr::copy_nonoverlapping(src, cross.payload_ptr(round, false, me), p);
                }
                self.exchange(cross, st, call, descr, |_| p, |_| me)?;
                // The pieces of this local index's ranks, in host order.
                let shard = st.shard.as_mut_ptr();
                for h in 0..nh {
                    let from = cross.payload_ptr(round, h != me, h);
                    // SAFETY: slots of payload >= p bytes; the shard holds payload >= nh * p.
                    unsafe { std::ptr::copy_nonoverlapping(from, shard.add(h * p), p) };
                }
                let (gathered, stride) = if nl == 1 {
                    (shard as *const u8, 0)
                } else {
                    let stage = st.stage.as_mut_ptr();
                    // SAFETY: the stage holds nl * payload >= nl * nh * p bytes.
                    unsafe {
                        self.local_all_gather(call, shard as u64, stage as u64, nh * p, dtype)?
                    };
                    (stage as *const u8, nh * p)
                };
                for lq in 0..nl {
                    for h in 0..nh {
                        let g = cross.topo.rank_at(h, lq);
                        // SAFETY: recv holds nranks * bytes (caller contract); the source
                        // block holds nh * p bytes per local index.
                        unsafe {
                            let from = gathered.add(lq * stride + h * p);
                            let to = (recv as *mut u8).add(g * bytes + off);
                            if !std::ptr::eq(from, to) {
                                std::ptr::copy(from, to, p);
                            }
                        }
                    }
                }
                off += p;
            }
            Ok(())
        })
    }

    /// Host backend, across hosts: reduce-scatter of `count` elements per rank (`send` holds
    /// `nranks * count`, block `g` for rank `g`). Each round: the blocks are arranged by local
    /// index (local index `l` gets, in host order, the blocks of the ranks of local index `l`),
    /// reduce-scattered inside the host (local order), and each host's partial of block `g`
    /// sent to `g`'s host, where it is reduced in host order.
    ///
    /// # Safety
    /// `send` valid for `nranks * count` elements, `recv` for `count` (in place as the
    /// one-host call).
    pub(super) unsafe fn cross_reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let call = "reduce_scatter_host";
        check_avg(call, op, dtype, self.nranks())?;
        let s = dtype.size();
        let step_op = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        let tag = desc::tag(
            desc::REDUCE_SCATTER,
            super::dtype_code(dtype),
            super::op_desc(op),
            0,
        );
        let descr = [count as u64, tag];
        let type_op = desc::type_op(desc::tag(
            desc::REDUCE_SCATTER,
            super::dtype_code(dtype),
            super::op_desc(step_op),
            0,
        ));
        let n_all = self.nranks() as u32;
        self.cross_call(call, |cross, st| {
            let (nl, nh) = (cross.nlocal(), cross.hosts());
            // Per round, c elements of every block: the stage holds nl * nh * c of them, the
            // local result nh * c (in the send slots, one per host).
            let cap = (cross.payload() / nh).min(cross.payload()) / s;
            let mut off = 0usize;
            while off < count {
                let c = (count - off).min(cap);
                let round = st.round;
                // SAFETY: send holds nranks * count elements; the stage nl * payload bytes
                // >= nl * nh * c elements; each send slot payload >= c elements.
                unsafe {
                    let stage = st.stage.as_mut_ptr();
                    for lq in 0..nl {
                        for h in 0..nh {
                            let g = cross.topo.rank_at(h, lq);
                            std::ptr::copy_nonoverlapping(
                                (send as *const u8).add((g * count + off) * s),
                                stage.add((lq * nh + h) * c * s),
                                c * s,
                            );
                        }
                    }
                    // This host's partial of the blocks of this local index, host by host,
                    // gathered in the shard, then spread over the send slots.
                    let shard = st.shard.as_mut_ptr();
                    if nl == 1 {
                        std::ptr::copy_nonoverlapping(stage, shard, nh * c * s);
                    } else {
                        self.local_reduce_scatter(
                            call,
                            stage as u64,
                            shard as u64,
                            nh * c,
                            dtype,
                            step_op,
                        )?;
                    }
                    for h in 0..nh {
                        std::ptr::copy_nonoverlapping(
                            shard.add(h * c * s),
                            cross.payload_ptr(round, false, h),
                            c * s,
                        );
                    }
                }
                self.exchange(cross, st, call, descr, |_| c * s, |h| h)?;
                // SAFETY: recv holds count elements.
                unsafe {
                    let out = (recv as *mut u8).add(off * s);
                    reduce_hosts(cross, round, out, c * s, type_op);
                    if op == ReduceOp::Avg {
                        finish_avg(out, c, dtype, n_all);
                    }
                }
                off += c;
            }
            Ok(())
        })
    }

    /// Host backend, across hosts: broadcast of `bytes` from `root`: the root's data goes
    /// over TCP to the ranks of its local index on the other hosts (the other local indexes
    /// do not exchange), then each host broadcasts it from that local index.
    ///
    /// # Safety
    /// `send` valid for `bytes` on the root, `recv` for `bytes` everywhere.
    pub(super) unsafe fn cross_broadcast(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<(), CommError> {
        let call = "broadcast_host";
        let tag = desc::rooted_tag(desc::BROADCAST, super::dtype_code(dtype), 0, 0, root as u64);
        let descr = [bytes as u64, tag];
        self.cross_call(call, |cross, st| {
            let topo = &cross.topo;
            let root_host = (0..topo.hosts.len())
                .find(|&h| topo.hosts[h].contains(&root))
                .expect("root checked");
            let root_local = topo.hosts[root_host]
                .iter()
                .position(|&r| r == root)
                .expect("listed");
            if topo.local == root_local {
                let me = topo.host;
                let mut off = 0;
                while off < bytes {
                    let p = cross.payload().min(bytes - off);
                    let round = st.round;
                    let lens = |_| if me == root_host { p } else { 0 };
                    if me == root_host {
                        // SAFETY: send holds bytes on the root; the slot payload >= p.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                (send as *const u8).add(off),
                                cross.payload_ptr(round, false, me),
                                p,
                            )
                        };
                    }
                    self.exchange(cross, st, call, descr, lens, |_| me)?;
                    if me != root_host {
                        // SAFETY: recv holds bytes; the receive slot p.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                cross.payload_ptr(round, true, root_host),
                                (recv as *mut u8).add(off),
                                p,
                            )
                        };
                    } else if send != recv {
                        // SAFETY: as above, disjoint or equal (checked by the caller).
                        unsafe {
                            std::ptr::copy(
                                (send as *const u8).add(off),
                                (recv as *mut u8).add(off),
                                p,
                            )
                        };
                    }
                    off += p;
                }
            }
            if cross.nlocal() > 1 {
                // SAFETY: recv holds bytes; on the local root it holds the data now.
                unsafe { self.local_broadcast(call, recv, bytes, dtype, root_local)? };
            }
            Ok(())
        })
    }

    /// Host backend, across hosts: all-to-all of `bytes` per pair (`send` and `recv` hold
    /// `nranks * bytes`). Each round, a piece of every block: an all-to-all inside the host
    /// hands local index `l` every block of this host meant for the ranks of local index `l`
    /// (on every host); then each rank sends its partner on host `h` the blocks for it (one
    /// exchange) and places what it receives by source rank.
    ///
    /// # Safety
    /// `send` and `recv` valid for `nranks * bytes`, disjoint.
    pub(super) unsafe fn cross_all_to_all(
        &self,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let call = "all_to_all_host";
        let tag = desc::tag(desc::ALL_TO_ALL, super::dtype_code(dtype), 0, 0);
        let descr = [bytes as u64, tag];
        self.cross_call(call, |cross, st| {
            let (nl, nh) = (cross.nlocal(), cross.hosts());
            let me = cross.topo.host;
            // Pieces of p bytes (whole elements): the stage holds the arranged input and the
            // local all-to-all's output (nl * nh * p each), a slot nl * p.
            let s = dtype.size();
            let p_max = ((cross.payload() / (2 * nh)).min(cross.payload() / nl) / s * s).max(s);
            let mut off = 0usize;
            while off < bytes {
                let p = p_max.min(bytes - off);
                let round = st.round;
                let half = nl * nh * p;
                let stage = st.stage.as_mut_ptr();
                // SAFETY: send and recv hold nranks * bytes (caller contract); the stage holds
                // nl * payload >= 2 * nl * nh * p bytes; a send slot payload >= nl * p.
                unsafe {
                    // Input arranged by destination local index, then host.
                    for ld in 0..nl {
                        for hd in 0..nh {
                            let g = cross.topo.rank_at(hd, ld);
                            std::ptr::copy_nonoverlapping(
                                (send as *const u8).add(g * bytes + off),
                                stage.add((ld * nh + hd) * p),
                                p,
                            );
                        }
                    }
                    // From every local rank ls: its blocks for (hd, l), hd in host order.
                    let local_out = if nl == 1 {
                        stage as *const u8
                    } else {
                        let out = stage.add(half);
                        self.local_all_to_all(call, stage as u64, out as u64, nh * p, dtype)?;
                        out as *const u8
                    };
                    for hd in 0..nh {
                        for ls in 0..nl {
                            let from = local_out.add((ls * nh + hd) * p);
                            if hd == me {
                                let g = cross.topo.rank_at(me, ls);
                                let to = (recv as *mut u8).add(g * bytes + off);
                                std::ptr::copy_nonoverlapping(from, to, p);
                            } else {
                                let to = cross.payload_ptr(round, false, hd).add(ls * p);
                                std::ptr::copy_nonoverlapping(from, to, p);
                            }
                        }
                    }
                }
                self.exchange(cross, st, call, descr, |_| nl * p, |h| h)?;
                for hs in (0..nh).filter(|&h| h != me) {
                    for ls in 0..nl {
                        let g = cross.topo.rank_at(hs, ls);
                        // SAFETY: the receive slot holds nl * p bytes (published by the
                        // wait); recv holds nranks * bytes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                cross.payload_ptr(round, true, hs).add(ls * p),
                                (recv as *mut u8).add(g * bytes + off),
                                p,
                            )
                        };
                    }
                }
                off += p;
            }
            Ok(())
        })
    }

    /// The local group's all-gather of `bytes` per rank (rank `l`'s at `recv + l * bytes`).
    ///
    /// # Safety
    /// `send` valid for `bytes`, `recv` for `nlocal * bytes`, disjoint.
    unsafe fn local_all_gather(
        &self,
        call: &str,
        send: u64,
        recv: u64,
        bytes: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let algo = match self.choose_all_gather(bytes) {
            AllGatherAlgo::Packets if bytes > self.one_shot_max_bytes() => AllGatherAlgo::Memory,
            AllGatherAlgo::Proxy | AllGatherAlgo::Auto => AllGatherAlgo::Memory,
            a => a,
        };
        // SAFETY: caller contract.
        unsafe { self.run_all_gather_kernel(call, send, recv, bytes as u64, dtype, algo) }
    }
}

/// Reduces the round's payloads of every host in host order (this host's from its own send
/// slot, the others' from the receive slots) into `out`, `len` bytes, with `type_op`
/// (`op | dtype << 8`): the same sources in the same order on every partner.
fn reduce_hosts(cross: &Cross, round: u64, out: *mut u8, len: usize, type_op: u32) {
    let me = cross.topo.host;
    let nh = cross.hosts();
    let src = |h: usize| cross.payload_ptr(round, h != me, h) as *const u8;
    // Up to 64 sources per pass; more hosts are folded in passes whose first source is the
    // result so far (still host order).
    let mut v: [*const u8; 64] = [std::ptr::null(); 64];
    let mut h = 0;
    while h < nh {
        let mut k = 0;
        if h > 0 {
            v[0] = out;
            k = 1;
        }
        while k < v.len() && h < nh {
            v[k] = src(h);
            k += 1;
            h += 1;
        }
        // SAFETY: every source holds len bytes of the round (the own send slot written by
        // this rank, receive slots published by the waits); out holds len bytes and is
        // either disjoint from them or the first source (read before written, element by
        // element); called outside a launch, as one thread (the host arch's block of one).
        unsafe { Bytes::reduce_out(&v[..k], out, std::ptr::null_mut(), len as u64, 0, type_op) };
    }
}

/// The average's quotient: every element of `buf` divided by `n` as the kernels do it
/// (`Reduce::finish1` of average).
///
/// # Safety
/// `buf` valid for `count` elements of `dtype`.
unsafe fn finish_avg(buf: *mut u8, count: usize, dtype: DataType, n: u32) {
    let code = op::AVG | (super::dtype_code(dtype) as u32) << 8;
    let s = dtype.size();
    for i in 0..count {
        // SAFETY: element i of buf (caller contract).
        unsafe {
            let p = buf.add(i * s);
            let mut bits = [0u8; 8];
            std::ptr::copy_nonoverlapping(p, bits.as_mut_ptr(), s);
            let a = u64::from_le_bytes(bits);
            let q = match s {
                1 => <Dyn<1> as Reduce>::finish1(code, a, n),
                2 => <Dyn<2> as Reduce>::finish1(code, a, n),
                4 => <Dyn<4> as Reduce>::finish1(code, a, n),
                _ => <Dyn<8> as Reduce>::finish1(code, a, n),
            };
            std::ptr::copy_nonoverlapping(q.to_le_bytes().as_ptr(), p, s);
        }
    }
}

/// A cross-host call descriptor in words (`super::describe`, whose algorithm names are the
/// one-host kernels'; these calls carry none).
fn describe(d: [u64; 2]) -> String {
    let s = super::describe(d);
    match s.strip_suffix(" (?)").or_else(|| s.strip_suffix(" (put)")) {
        Some(head) => format!("{head} (across hosts)"),
        None => s,
    }
}

/// A sticky error again, for another call.
fn copy_error(call: &str, e: &CommError) -> CommError {
    let m = format!("{call}: an earlier call failed: {e}");
    match e {
        CommError::Timeout(_) => CommError::Timeout(m),
        CommError::Aborted(_) => CommError::Aborted(m),
        _ => CommError::State(m),
    }
}
