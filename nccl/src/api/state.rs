//! A communicator's end and state: finalize, destroy, abort, revoke, its asynchronous
//! error, and its size, device and rank.

use std::ffi::c_int;
use std::time::Duration;

use crate::comm::{self, Comm, Inner, unregister};
use crate::error::{Failure, guard};
use crate::group;
use crate::log;
use crate::system_nccl::{self, Ptr, Real, need};
use crate::types::{NcclResult, result};

use super::{Target, check_out, pass, target};

/// Waits for this GPU's work, then for every rank's (a bootstrap barrier): after it no peer
/// kernel reads or writes our memory. Nothing of ours to wait for on the real NCCL alone.
fn quiesce(call: &str, gpu: &mscclpp_host::cuda::Gpu, inner: &Inner) -> Result<(), Failure> {
    let Ok(coll) = &inner.coll else {
        return Ok(());
    };
    comm::on_gpu(gpu, || gpu.synchronize())
        .map_err(|e| Failure::new(result::UNHANDLED_CUDA_ERROR, format!("{call}: {e}")))?;
    // Ranks reach the end of a program far apart (PyTorch's destroy_process_group finalizes
    // every communicator, after rank 0 may have saved a checkpoint for minutes): wait as
    // long as for late ranks at set-up. A rank that died or left fails it at once.
    let bs = coll.communicator().bootstrap();
    bs.barrier_within(bs.as_async().config().late_wait())
        .map_err(|e| Failure::from_comm(call, &e.into()))
}

export! {
    /// `ncclCommFinalize`: waits for this communicator's work on every rank (collective),
    /// and finalizes the real communicator. NULL has nothing to finalize (as in NCCL).
    fn ncclCommFinalize / pncclCommFinalize(comm: Ptr) -> NcclResult {
        guard("ncclCommFinalize", || {
            let call = "ncclCommFinalize";
            if comm.is_null() {
                return Ok(result::SUCCESS);
            }
            let c = match target(call, comm)? {
                Target::Real(real, p) => {
                    return pass(call, real, p, |real, p| {
                        // SAFETY: NCCL's signature.
                        Ok(unsafe { need(call, real, real.fns.comm_finalize)?(p) })
                    });
                }
                Target::Ours(c) => c,
            };
            let inner = c.usable(call)?;
            if inner.finalized.swap(true, std::sync::atomic::Ordering::AcqRel) {
                // As NCCL ("prevent double finalize").
                return Err(Failure::arg(format!(
                    "{call}: the communicator was already finalized (destroy it next)"
                )));
            }
            // This thread's kept group work on the communicator first (a finalize inside a
            // group comes after the group's work, as in NCCL). A finalize that fails may be
            // tried again.
            let done = group::flush(call, comm, c, inner).and_then(|()| quiesce(call, &c.gpu, inner));
            if let Err(f) = done {
                inner.finalized.store(false, std::sync::atomic::Ordering::Release);
                return Err(f);
            }
            if let (Some(rc), Ok(real)) = (inner.real, system_nccl::real())
                && let Some(f) = real.fns.comm_finalize
            {
                // SAFETY: NCCL's signature; the real communicator.
                let r = unsafe { f(rc.0) };
                return system_nccl::real_result(call, real, rc.0, r);
            }
            Ok(result::SUCCESS)
        })
    }
}

/// How long `ncclCommAbort` waits for the aborted communicator's memory to be freed.
const ABORT_RECLAIM_WAIT: Duration = Duration::from_secs(5);

/// Frees an aborted communicator's resources (GPU memory, peer mappings, proxy thread,
/// bootstrap) on a thread of its own and waits up to [`ABORT_RECLAIM_WAIT`] for it. Our
/// kernels end within moments of the abort word; a kernel that does not (another library's
/// stuck on a dead peer, which `cuMemFree`'s implicit synchronisation would wait for) must
/// not hang the abort: the thread is then left to finish in the background, with a warning.
fn reclaim_after_abort(call: &str, gpu: mscclpp_host::cuda::Gpu, inner: Inner) {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("mscclpp-nccl-reclaim".into())
        .spawn(move || {
            comm::on_gpu(&gpu, || {
                let _ = gpu.bind();
                drop(inner);
            });
            let _ = done_tx.send(());
        });
    match spawned {
        Ok(_) => {
            if done_rx.recv_timeout(ABORT_RECLAIM_WAIT).is_err() {
                log::warn(&format!(
                    "{call}: the aborted communicator's resources are still in use after \
                     {ABORT_RECLAIM_WAIT:?} (a kernel on this GPU that does not end?); they are \
                     freed in the background once it ends"
                ));
            }
        }
        // The closure, and with it the communicator, was dropped on this thread.
        Err(e) => log::warn(&format!(
            "{call}: no thread to free the aborted communicator's resources ({e}); freed \
             on this thread"
        )),
    }
}

/// Destroy (`abort == false`) or abort a communicator. A NULL one is done already, as in
/// NCCL: cleanup code ends every child of a split, and a rank that split with
/// `NCCL_SPLIT_NOCOLOR` got NULL.
fn end_comm(call: &'static str, comm: Ptr, abort: bool) -> Result<NcclResult, Failure> {
    if comm.is_null() {
        return Ok(result::SUCCESS);
    }
    match target(call, comm)? {
        Target::Real(real, p) => {
            return pass(call, real, p, |real, p| {
                let f = if abort {
                    need(call, real, real.fns.comm_abort)?
                } else {
                    need(call, real, real.fns.comm_destroy)?
                };
                // SAFETY: NCCL's signature.
                Ok(unsafe { f(p) })
            });
        }
        Target::Ours(c) => match c.usable(call) {
            // This thread's kept group work on it: launched before a destroy (which comes
            // after the group's work, as in NCCL), dropped at an abort; none of it may
            // outlive the communicator.
            Ok(inner) if !abort => {
                if let Err(f) = group::flush(call, comm, c, inner) {
                    log::warn(&f.msg);
                }
            }
            _ => group::discard(comm),
        },
    }
    let c = unregister(comm).ok_or_else(|| Failure::arg(format!("{call}: comm is gone")))?;
    let Comm { gpu, state, .. } = *c;
    let Some(Ok(inner)) = state.into_inner() else {
        return Ok(result::SUCCESS);
    };
    let mut code = result::SUCCESS;
    if let (Some(rc), Ok(real)) = (inner.real, system_nccl::real()) {
        let f = if abort {
            real.fns.comm_abort
        } else {
            real.fns.comm_destroy
        };
        if let Some(f) = f {
            // SAFETY: NCCL's signature; the real communicator, not used after this.
            code = unsafe { f(rc.0) };
        }
    }
    // A revoked communicator was aborted on our side already; no barrier with ranks that
    // may be gone.
    let revoked = inner.revoked.load(std::sync::atomic::Ordering::Acquire);
    if abort || revoked {
        // Raise the abort word: our kernels waiting on a peer give up within their next slow
        // poll. They may still be running now, and freeing the memory they use waits for
        // them (cuMemFree synchronises), so the memory is freed on a thread of its own,
        // waited for a bounded time.
        if let Ok(coll) = &inner.coll {
            coll.abort();
        }
        reclaim_after_abort(call, gpu, inner);
    } else {
        if !inner.finalized.load(std::sync::atomic::Ordering::Acquire)
            && let Err(f) = quiesce(call, &gpu, &inner)
        {
            log::warn(&f.msg);
        }
        comm::on_gpu(&gpu, || drop(inner));
    }
    if code != result::SUCCESS && code != result::IN_PROGRESS {
        return Err(Failure::new(
            code,
            format!("{call}: the real NCCL's communicator: error {code}"),
        ));
    }
    Ok(result::SUCCESS)
}

export! {
    /// `ncclCommDestroy`: waits for the work of every rank (unless finalized), then frees
    /// ours and destroys the real communicator.
    fn ncclCommDestroy / pncclCommDestroy(comm: Ptr) -> NcclResult {
        guard("ncclCommDestroy", || end_comm("ncclCommDestroy", comm, false))
    }
}

export! {
    /// `ncclCommAbort`: aborts the real communicator and drops ours without waiting (its
    /// GPU memory stays until the process ends: kernels stuck on a dead peer may still use
    /// it until the device timeout traps them).
    fn ncclCommAbort / pncclCommAbort(comm: Ptr) -> NcclResult {
        guard("ncclCommAbort", || end_comm("ncclCommAbort", comm, true))
    }
}

export! {
    /// `ncclCommRevoke` (NCCL 2.28): stops this rank's operations in flight on the
    /// communicator without freeing it (ours: the abort word, which our kernels' waits give
    /// up on; the real communicator beside it: the real `ncclCommRevoke`).
    /// `ncclCommGetAsyncError` then says `ncclInProgress` until this GPU's work has ended,
    /// then `ncclSuccess`; later collectives fail; destroy, abort, split and shrink may
    /// follow (`ncclCommFinalize` may not). `revokeFlags` must be 0 (`NCCL_REVOKE_DEFAULT`).
    fn ncclCommRevoke / pncclCommRevoke(comm: Ptr, revoke_flags: c_int) -> NcclResult {
        guard("ncclCommRevoke", || {
            let call = "ncclCommRevoke";
            if revoke_flags != 0 {
                return Err(Failure::arg(format!(
                    "{call}: revokeFlags {revoke_flags} is not NCCL_REVOKE_DEFAULT (0)"
                )));
            }
            let c = match target(call, comm)? {
                Target::Real(real, p) => {
                    return pass(call, real, p, |real, p| {
                        // SAFETY: NCCL's signature.
                        Ok(unsafe { need(call, real, real.fns.comm_revoke)?(p, revoke_flags) })
                    });
                }
                Target::Ours(c) => c,
            };
            let inner = c.ready(call)?;
            if !revoke_ours(call, c, inner) {
                return Ok(result::SUCCESS);
            }
            let mut code = result::SUCCESS;
            if let (Some(rc), Ok(real)) = (inner.real, system_nccl::real()) {
                match real.fns.comm_revoke {
                    // SAFETY: NCCL's signature; the real communicator.
                    Some(f) => code = unsafe { f(rc.0, revoke_flags) },
                    None => log::warn(&format!(
                        "{call}: the real NCCL ({}) has no ncclCommRevoke: its operations in \
                         flight on this communicator are not stopped",
                        real.path
                    )),
                }
            }
            if code != result::SUCCESS && code != result::IN_PROGRESS {
                return Err(Failure::new(
                    code,
                    format!("{call}: the real NCCL's communicator: error {code}"),
                ));
            }
            Ok(result::SUCCESS)
        })
    }
}

/// Revokes our side of `c` (once; `false` if it already was): raises the abort word (our
/// kernels' waits give up at their next slow poll) and marks it revoked; a thread of its own
/// marks it quiet once this GPU's work has ended, so that the caller does not wait.
pub(super) fn revoke_ours(call: &str, c: &Comm, inner: &Inner) -> bool {
    if inner
        .revoked
        .swap(true, std::sync::atomic::Ordering::AcqRel)
    {
        return false;
    }
    if let Ok(coll) = &inner.coll {
        coll.abort();
    }
    let (gpu, quiet) = (c.gpu.clone(), inner.revoke_quiet.clone());
    let spawned = std::thread::Builder::new()
        .name("mscclpp-nccl-revoke".into())
        .spawn(move || {
            comm::on_gpu(&gpu, || {
                let _ = gpu.bind();
                let _ = gpu.synchronize();
            });
            quiet.store(true, std::sync::atomic::Ordering::Release);
        });
    if let Err(e) = spawned {
        log::warn(&format!(
            "{call}: no thread to wait for the GPU's work ({e}); waiting on this one"
        ));
        let _ = comm::on_gpu(&c.gpu, || c.gpu.synchronize());
        inner
            .revoke_quiet
            .store(true, std::sync::atomic::Ordering::Release);
    }
    true
}

export! {
    /// `ncclCommGetAsyncError`: `ncclInProgress` while a set-up deferred to `ncclGroupEnd`
    /// waits, the set-up's failure, errors reported by our proxy, else the real
    /// communicator's state.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: Ptr, async_error: *mut NcclResult) -> NcclResult {
        guard("ncclCommGetAsyncError", || {
            let call = "ncclCommGetAsyncError";
            check_out(call, "asyncError", async_error)?;
            let c = match target(call, comm)? {
                Target::Real(real, p) => {
                    return pass(call, real, p, |real, p| {
                        // SAFETY: NCCL's signature, the caller's out-pointer.
                        Ok(unsafe { need(call, real, real.fns.comm_get_async_error)?(p, async_error) })
                    });
                }
                Target::Ours(c) => c,
            };
            let state = match c.state.get() {
                None => result::IN_PROGRESS,
                Some(Err(f)) => f.code,
                Some(Ok(inner)) if inner.revoked.load(std::sync::atomic::Ordering::Acquire) => {
                    // In progress until this GPU's work has ended (and the real
                    // communicator's too), then success: as NCCL's revoke.
                    if !inner.revoke_quiet.load(std::sync::atomic::Ordering::Acquire) {
                        result::IN_PROGRESS
                    } else {
                        real_async_state(inner).unwrap_or(result::SUCCESS)
                    }
                }
                Some(Ok(inner)) => {
                    let (errors, dropped) = inner
                        .coll
                        .as_ref()
                        .map_or((Vec::new(), 0), |coll| coll.communicator().proxy_errors());
                    // The error is kept for `ncclGetLastError` and printed once (callers
                    // such as PyTorch's watchdog poll this).
                    let report = |msg: &str| {
                        crate::error::set_last_error(msg);
                        if !inner.async_warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            log::warn(&format!("rank {}/{}: {msg}", c.rank, c.nranks));
                        }
                    };
                    if let Ok(Err(e)) = inner.coll.as_ref().map(|coll| coll.async_error()) {
                        // Our kernels' record: a mismatch, an abort (a dead peer), a timeout
                        // or a lost CUDA context.
                        let f = crate::error::Failure::from_comm(call, &e);
                        report(&f.msg);
                        f.code
                    } else if let Some(first) = errors.first() {
                        report(&format!(
                            "{call}: the proxy reported {} error(s) ({dropped} more dropped); first: {first}",
                            errors.len()
                        ));
                        result::REMOTE_ERROR
                    } else {
                        real_async_state(inner).unwrap_or(result::SUCCESS)
                    }
                }
            };
            // SAFETY: checked non-null.
            unsafe { *async_error = state };
            Ok(result::SUCCESS)
        })
    }
}

/// The real communicator's `ncclCommGetAsyncError` (its failure, else its state), when there
/// is a real communicator beside ours and the real NCCL has the call.
fn real_async_state(inner: &Inner) -> Option<NcclResult> {
    let (rc, real) = (inner.real?, system_nccl::real().ok()?);
    let f = real.fns.comm_get_async_error?;
    let mut r = result::SUCCESS;
    // SAFETY: NCCL's signature; the real communicator; out-pointer to a local.
    let code = unsafe { f(rc.0, &mut r) };
    Some(if code != result::SUCCESS { code } else { r })
}

/// `ncclCommCount` / `CuDevice` / `UserRank`.
fn comm_int(
    call: &str,
    comm: Ptr,
    out: *mut c_int,
    ours: impl FnOnce(&Comm) -> usize,
    theirs: impl FnOnce(&Real) -> Option<unsafe extern "C" fn(Ptr, *mut c_int) -> NcclResult>,
) -> Result<NcclResult, Failure> {
    check_out(call, "output", out)?;
    match target(call, comm)? {
        Target::Real(real, p) => pass(call, real, p, |real, p| {
            let f = need(call, real, theirs(real))?;
            // SAFETY: NCCL's signature, the caller's out-pointer.
            Ok(unsafe { f(p, out) })
        }),
        Target::Ours(c) => {
            // SAFETY: checked non-null.
            unsafe { *out = ours(c) as c_int };
            Ok(result::SUCCESS)
        }
    }
}

export! {
    /// `ncclCommCount`: number of ranks.
    fn ncclCommCount / pncclCommCount(comm: Ptr, count: *mut c_int) -> NcclResult {
        guard("ncclCommCount", || comm_int("ncclCommCount", comm, count, |c| c.nranks, |r| r.fns.comm_count))
    }
}

export! {
    /// `ncclCommCuDevice`: the CUDA device.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: Ptr, device: *mut c_int) -> NcclResult {
        guard("ncclCommCuDevice", || comm_int("ncclCommCuDevice", comm, device, |c| c.device(), |r| r.fns.comm_cu_device))
    }
}

export! {
    /// `ncclCommUserRank`: this rank.
    fn ncclCommUserRank / pncclCommUserRank(comm: Ptr, rank: *mut c_int) -> NcclResult {
        guard("ncclCommUserRank", || comm_int("ncclCommUserRank", comm, rank, |c| c.rank, |r| r.fns.comm_user_rank))
    }
}
