//! `ncclGroupStart` / `ncclGroupEnd`: a per-thread depth.
//!
//! - Each of our group calls is mirrored on the real NCCL (when one is loaded), so that
//!   forwarded calls made inside a group land in the real NCCL's group and run (fused, send
//!   and receive paired) at the real `ncclGroupEnd`.
//! - Native collectives inside a group are kept until the outermost `ncclGroupEnd`, as
//!   NCCL enqueues a group's work there. Each communicator's are then launched in call
//!   order, before its sends and receives, all on the stream of its first call, which the
//!   group's other streams of that communicator are joined to (events), as NCCL does. Every
//!   rank makes the same calls, so each communicator sees the same order everywhere; they
//!   never block the host, so one thread may drive several GPUs' native calls in a group.
//!   A group ended by `ncclGroupSimulateEnd` launches none of them (nor its sends and
//!   receives): NCCL only estimates such a group's time. A finalize or destroy inside a
//!   group launches that communicator's kept work first; an abort drops it.
//! - Native sends and receives inside a group are kept until the outermost `ncclGroupEnd`,
//!   then run per communicator as one launch of [`Collectives::group`] (all progressing
//!   together, as NCCL pairs a group's sends and receives), or in rounds past its size (see
//!   [`dispatch::plan_p2p`]). They run before the real NCCL's group ends, on every rank
//!   alike. A group never mixes native and forwarded sends/receives (see [`dispatch`]).
//! - A communicator set-up (`ncclCommInitRank*`) inside a group is deferred to the outermost
//!   `ncclGroupEnd`, which runs the deferred set-ups of the thread together, one thread each
//!   (a single thread driving several GPUs cannot set them up one after the other: each
//!   waits for the others).

use std::cell::RefCell;

use mscclpp_host::bootstrap::UniqueId;
use mscclpp_host::collectives::{Collectives, P2pOp};

use crate::comm::{self, Comm, ConfigCopy, Handle, Inner};
use crate::dispatch::{self, Launch};
use crate::error::Failure;
use crate::system_nccl::{self, Ptr};
use crate::types::{NcclResult, result};

/// A set-up waiting for the end of the group.
pub struct Pending {
    /// The handle already returned to the caller.
    pub comm: usize,
    /// The bootstrap id.
    pub id: UniqueId,
    /// The caller's config.
    pub cfg: ConfigCopy,
}

#[derive(Default)]
struct Group {
    /// For each open level: whether the real NCCL's group was opened with it.
    levels: Vec<bool>,
    pending: Vec<Pending>,
    /// Native sends and receives: (communicator handle, operation, stream).
    p2p: Vec<(usize, P2pOp, Ptr)>,
    /// Native collectives, in call order.
    colls: Vec<Coll>,
}

/// A native collective kept for the outermost `ncclGroupEnd`.
struct Coll {
    /// The communicator handle.
    comm: usize,
    /// The NCCL call that made it (for errors).
    call: &'static str,
    launch: Launch,
    stream: Ptr,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Open group levels on this thread.
pub fn depth() -> usize {
    GROUP.with(|g| g.borrow().levels.len())
}

/// `ncclGroupStart`.
pub fn start() -> Result<NcclResult, Failure> {
    let mut mirrored = false;
    if let Ok(real) = system_nccl::real()
        && let Some(f) = real.fns.group_start
    {
        // SAFETY: NCCL's signature, no arguments.
        let r = unsafe { f() };
        system_nccl::real_result("ncclGroupStart", real, comm::null(), r)?;
        mirrored = true;
    }
    GROUP.with(|g| g.borrow_mut().levels.push(mirrored));
    Ok(result::SUCCESS)
}

/// Defers a set-up to the outermost `ncclGroupEnd`.
pub fn defer(p: Pending) {
    GROUP.with(|g| g.borrow_mut().pending.push(p));
}

/// Keeps a native collective of communicator `comm` for the outermost `ncclGroupEnd`.
pub fn add_coll(comm: Ptr, call: &'static str, launch: Launch, stream: Ptr) {
    GROUP.with(|g| {
        g.borrow_mut().colls.push(Coll {
            comm: comm as usize,
            call,
            launch,
            stream,
        })
    });
}

/// Keeps a native send or receive for the outermost `ncclGroupEnd`.
pub fn add_p2p(comm: Ptr, op: P2pOp, stream: Ptr) {
    GROUP.with(|g| g.borrow_mut().p2p.push((comm as usize, op, stream)));
}

/// `ncclGroupEnd` (or `ncclGroupSimulateEnd` with `sim`: the real NCCL's simulation).
pub fn end(call: &'static str, sim: Option<Ptr>) -> Result<NcclResult, Failure> {
    let (mirrored, pending, p2p, colls) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        let level = g.levels.pop();
        if g.levels.is_empty() {
            (
                level,
                std::mem::take(&mut g.pending),
                std::mem::take(&mut g.p2p),
                std::mem::take(&mut g.colls),
            )
        } else {
            (level, Vec::new(), Vec::new(), Vec::new())
        }
    });
    let Some(mirrored) = mirrored else {
        return Err(Failure::usage(format!(
            "{call}: no group is open (ncclGroupStart was not called on this thread)"
        )));
    };
    let mut first_failure = run_pending(call, pending);
    // A simulated end launches nothing of ours either (every rank simulates alike). A real
    // NCCL in the group without ncclGroupSimulateEnd (before 2.22) can only end it for real,
    // running its part: ours then runs too, so that the two halves agree.
    let cannot_simulate =
        mirrored && system_nccl::real().is_ok_and(|r| r.fns.group_simulate_end.is_none());
    if sim.is_some() && cannot_simulate {
        crate::log::warn(&format!(
            "{call}: the real NCCL has no ncclGroupSimulateEnd, so the group is ended for real"
        ));
    }
    if (sim.is_none() || cannot_simulate)
        && let Err(f) = run_kept(call, colls, p2p)
        && first_failure.is_none()
    {
        first_failure = Some(f);
    }
    let mut code = result::SUCCESS;
    if mirrored && let Ok(real) = system_nccl::real() {
        let r = match (sim, real.fns.group_simulate_end, real.fns.group_end) {
            // SAFETY: NCCL's signature; the caller's simInfo.
            (Some(info), Some(f), _) => unsafe { f(info) },
            // SAFETY: NCCL's signature, no arguments.
            (_, _, Some(f)) => unsafe { f() },
            _ => result::SUCCESS,
        };
        code = system_nccl::real_result(call, real, comm::null(), r)?;
    }
    match first_failure {
        Some(f) => Err(f),
        None => Ok(code),
    }
}

/// Runs the deferred set-ups together; their results go into the communicators. Returns the
/// first failure.
fn run_pending(call: &str, pending: Vec<Pending>) -> Option<Failure> {
    if pending.is_empty() {
        return None;
    }
    let mut jobs = Vec::new();
    let mut comms = Vec::new();
    for p in pending {
        match comm::lookup(p.comm as Ptr) {
            Handle::Ours(c) => {
                jobs.push((c.nranks, c.rank, p.id, c.gpu.clone(), p.cfg));
                comms.push(c);
            }
            _ => continue, // destroyed before the group ended
        }
    }
    let results = comm::set_up_many(call, jobs);
    let mut first = None;
    for (c, r) in comms.into_iter().zip(results) {
        if let Err(f) = &r
            && first.is_none()
        {
            first = Some(f.clone());
        }
        let _ = c.state.set(r);
    }
    first
}

/// Runs the kept collectives and sends/receives, per communicator in the order of first use
/// (the collectives', then the sends/receives'); every communicator is tried, and one whose
/// work fails launches nothing more of this group. Returns the first failure.
fn run_kept(
    call: &'static str,
    colls: Vec<Coll>,
    p2p: Vec<(usize, P2pOp, Ptr)>,
) -> Result<(), Failure> {
    let mut comms: Vec<usize> = Vec::new();
    for h in colls.iter().map(|k| k.comm).chain(p2p.iter().map(|o| o.0)) {
        if !comms.contains(&h) {
            comms.push(h);
        }
    }
    let mut first = Ok(());
    for handle in comms {
        let mine: Vec<&Coll> = colls.iter().filter(|k| k.comm == handle).collect();
        let ops: Vec<(P2pOp, Ptr)> = p2p
            .iter()
            .filter(|(c, _, _)| *c == handle)
            .map(|(_, o, s)| (*o, *s))
            .collect();
        let name = mine.first().map_or(call, |k| k.call);
        let r = match comm::lookup(handle as Ptr) {
            Handle::Ours(c) => c
                .usable(name)
                .and_then(|inner| run_comm(call, c, inner, &mine, &ops)),
            _ => Err(Failure::usage(format!(
                "{name}: its communicator was destroyed before ncclGroupEnd"
            ))),
        };
        if let Err(f) = r
            && first.is_ok()
        {
            first = Err(f);
        }
    }
    first
}

/// Launches this thread's kept work of communicator `c` (`comm`, its handle) now and takes it
/// out of the group: a finalize or destroy inside a group comes after the group's work on
/// that communicator, as in NCCL, and none of it may outlive the communicator.
pub fn flush(call: &'static str, comm: Ptr, c: &Comm, inner: &Inner) -> Result<(), Failure> {
    let (colls, ops) = take(comm);
    if colls.is_empty() && ops.is_empty() {
        return Ok(());
    }
    let mine: Vec<&Coll> = colls.iter().collect();
    run_comm(call, c, inner, &mine, &ops)
}

/// Drops this thread's kept work of communicator `comm` (an abort: none of it is to run).
pub fn discard(comm: Ptr) {
    drop(take(comm));
}

/// Takes this thread's kept collectives and sends/receives of communicator `comm` out of
/// the group.
fn take(comm: Ptr) -> (Vec<Coll>, Vec<(P2pOp, Ptr)>) {
    let h = comm as usize;
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        let (colls, rest): (Vec<Coll>, Vec<Coll>) = std::mem::take(&mut g.colls)
            .into_iter()
            .partition(|k| k.comm == h);
        g.colls = rest;
        let (ops, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut g.p2p)
            .into_iter()
            .partition(|o| o.0 == h);
        g.p2p = rest;
        (colls, ops.into_iter().map(|(_, o, s)| (o, s)).collect())
    })
}

/// Runs a rank's native sends and receives of one group (see [`dispatch::plan_p2p`]) on the
/// first operation's stream; the other streams of the group wait for it, and it for them
/// (events), as NCCL joins a group's streams.
pub fn run_p2p(
    call: &'static str,
    c: &Comm,
    inner: &Inner,
    ops: &[(P2pOp, Ptr)],
) -> Result<(), Failure> {
    run_comm(call, c, inner, &[], ops)
}

/// Runs one communicator's work of a group: its collectives in call order, then its sends
/// and receives (see [`dispatch::plan_p2p`]), all on the stream of its first call. The
/// group's other streams of this communicator wait for that stream before, and it for them
/// after (events), as NCCL joins a group's streams: a communicator's calls share its
/// scratch and call counters, so they must not run on two streams at once.
fn run_comm(
    call: &'static str,
    c: &Comm,
    inner: &Inner,
    colls: &[&Coll],
    ops: &[(P2pOp, Ptr)],
) -> Result<(), Failure> {
    let plan = if ops.is_empty() {
        None
    } else {
        let plain: Vec<P2pOp> = ops.iter().map(|(o, _)| *o).collect();
        Some(
            dispatch::plan_p2p(c.rank, &plain)
                .map_err(|e| Failure::usage(format!("{call}: {e}")))?,
        )
    };
    let mut streams: Vec<Ptr> = Vec::new();
    for s in colls
        .iter()
        .map(|k| k.stream)
        .chain(ops.iter().map(|o| o.1))
    {
        if !streams.contains(&s) {
            streams.push(s);
        }
    }
    let Some(&first) = streams.first() else {
        return Ok(());
    };
    let cuda = |what: &str, e: cudarc::driver::DriverError| {
        Failure::new(
            result::UNHANDLED_CUDA_ERROR,
            format!("{call}: {what}: {e:?}"),
        )
    };
    // SAFETY: the caller's streams of this device.
    let main = unsafe { c.stream(first) };
    // SAFETY: as above.
    let others: Vec<_> = streams[1..]
        .iter()
        .map(|&s| unsafe { c.stream(s) })
        .collect();
    c.on_device(|| {
        for o in &others {
            main.join(o)
                .map_err(|e| cuda("joining the group's streams", e))?;
        }
        for k in colls {
            c.launch_native(k.call, inner, k.launch, first)?;
        }
        if let Some(plan) = &plan {
            for &(src, dst, bytes) in &plan.self_copies {
                // SAFETY: the caller's device buffers of `bytes` each (a send to and a
                // receive from the own rank of equal size), on its stream.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, main.cu_stream())
                }
                .map_err(|e| cuda("cuMemcpyDtoDAsync (send to the own rank)", e))?;
            }
            run_launches(inner.ours(call)?, &plan.launches, &main)
                .map_err(|e| Failure::from_comm(call, &e))?;
        }
        for o in &others {
            o.join(&main)
                .map_err(|e| cuda("joining the group's streams", e))?;
        }
        Ok(())
    })
}

fn run_launches(
    coll: &Collectives,
    launches: &[Vec<P2pOp>],
    stream: &mscclpp_host::cuda::CudaStream,
) -> Result<(), mscclpp_host::communicator::CommError> {
    for l in launches {
        // SAFETY: the caller's device buffers (NCCL's contract: valid until the group's
        // work completes on its streams), checked by the collectives.
        unsafe { coll.group(l, stream) }?;
    }
    Ok(())
}
