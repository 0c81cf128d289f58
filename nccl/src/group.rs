//! `ncclGroupStart` / `ncclGroupEnd`: a per-thread depth.
//!
//! - Each of our group calls is mirrored on the real NCCL (when one is loaded), so that
//!   forwarded calls made inside a group land in the real NCCL's group and run (fused, send
//!   and receive paired) at the real `ncclGroupEnd`.
//! - Native calls inside a group are launched at once, in call order. Every rank makes the
//!   same calls, so each stream sees the same order everywhere; they never block the host,
//!   so one thread may drive several GPUs' native calls in a group.
//! - A communicator set-up (`ncclCommInitRank*`) inside a group is deferred to the outermost
//!   `ncclGroupEnd`, which runs the deferred set-ups of the thread together, one thread each
//!   (a single thread driving several GPUs cannot set them up one after the other: each
//!   waits for the others).

use std::cell::RefCell;

use mscclpp_host::bootstrap::UniqueId;

use crate::comm::{self, ConfigCopy, Handle};
use crate::error::Failure;
use crate::real::{self, Ptr};
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
    if let Ok(real) = real::real()
        && let Some(f) = real.fns.group_start
    {
        // SAFETY: NCCL's signature, no arguments.
        let r = unsafe { f() };
        comm::real_result("ncclGroupStart", real, comm::null(), r)?;
        mirrored = true;
    }
    GROUP.with(|g| g.borrow_mut().levels.push(mirrored));
    Ok(result::SUCCESS)
}

/// Defers a set-up to the outermost `ncclGroupEnd`.
pub fn defer(p: Pending) {
    GROUP.with(|g| g.borrow_mut().pending.push(p));
}

/// `ncclGroupEnd` (or `ncclGroupSimulateEnd` with `sim`: the real NCCL's simulation).
pub fn end(call: &str, sim: Option<Ptr>) -> Result<NcclResult, Failure> {
    let (mirrored, pending) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        let level = g.levels.pop();
        let pending = if g.levels.is_empty() {
            std::mem::take(&mut g.pending)
        } else {
            Vec::new()
        };
        (level, pending)
    });
    let Some(mirrored) = mirrored else {
        return Err(Failure::usage(format!(
            "{call}: no group is open (ncclGroupStart was not called on this thread)"
        )));
    };
    let first_failure = run_pending(call, pending);
    let mut code = result::SUCCESS;
    if mirrored && let Ok(real) = real::real() {
        let r = match (sim, real.fns.group_simulate_end, real.fns.group_end) {
            // SAFETY: NCCL's signature; the caller's simInfo.
            (Some(info), Some(f), _) => unsafe { f(info) },
            // SAFETY: NCCL's signature, no arguments.
            (_, _, Some(f)) => unsafe { f() },
            _ => result::SUCCESS,
        };
        code = comm::real_result(call, real, comm::null(), r)?;
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
