//! Memory and registration: `ncclMemAlloc`/`ncclMemFree`, buffer registration and
//! windows.

use std::ffi::c_int;

use crate::comm::{self, null};
use crate::error::{Failure, guard};
use crate::system_nccl::{self, Ptr, Real, need};
use crate::types::{NcclResult, result};

use super::{Target, check_out, check_ptr, forward, pass, target};

export! {
    /// `ncclMemAlloc`: the real NCCL's (when loaded), else `cuMemAlloc` in the current
    /// context.
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut Ptr, size: usize) -> NcclResult {
        guard("ncclMemAlloc", || {
            let call = "ncclMemAlloc";
            check_out(call, "ptr", ptr)?;
            if let Ok(real) = system_nccl::real() {
                let f = need(call, real, real.fns.mem_alloc)?;
                // SAFETY: NCCL's signature, the caller's out-pointer.
                let r = unsafe { f(ptr, size) };
                return system_nccl::real_result(call, real, null(), r);
            }
            if size == 0 {
                // SAFETY: checked non-null.
                unsafe { *ptr = null() };
                return Ok(result::SUCCESS);
            }
            comm::current_gpu(call)?;
            // SAFETY: a plain device allocation in the current context.
            let p = unsafe { cudarc::driver::result::malloc_sync(size) }
                .map_err(|e| Failure::new(result::UNHANDLED_CUDA_ERROR, format!("{call}: cuMemAlloc: {e:?}")))?;
            // SAFETY: checked non-null.
            unsafe { *ptr = p as Ptr };
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclMemFree`: frees what `ncclMemAlloc` returned.
    fn ncclMemFree / pncclMemFree(ptr: Ptr) -> NcclResult {
        guard("ncclMemFree", || {
            let call = "ncclMemFree";
            if let Ok(real) = system_nccl::real() {
                let f = need(call, real, real.fns.mem_free)?;
                // SAFETY: NCCL's signature; its own allocation.
                let r = unsafe { f(ptr) };
                return system_nccl::real_result(call, real, null(), r);
            }
            if ptr.is_null() {
                return Ok(result::SUCCESS);
            }
            // SAFETY: an allocation of ncclMemAlloc's cuMemAlloc (caller contract).
            unsafe { cudarc::driver::result::free_sync(ptr as u64) }
                .map_err(|e| Failure::new(result::UNHANDLED_CUDA_ERROR, format!("{call}: cuMemFree: {e:?}")))?;
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclCommRegister`: registers with the real communicator (for the calls it serves);
    /// without one, a no-op that returns a handle (our kernels need no registration).
    fn ncclCommRegister / pncclCommRegister(comm: Ptr, buff: Ptr, size: usize, handle: *mut Ptr) -> NcclResult {
        guard("ncclCommRegister", || {
            let call = "ncclCommRegister";
            check_out(call, "handle", handle)?;
            check_ptr(call, "buff", buff, size)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.comm_register)?(p, buff, size, handle) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            let inner = c.ready(call)?;
            if inner.real.is_some() && system_nccl::real().is_ok() {
                return forward(call, c, inner, "registration", "-", "-", run);
            }
            // SAFETY: checked non-null.
            unsafe { *handle = if buff.is_null() { 1 as Ptr } else { buff } };
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclCommDeregister`.
    fn ncclCommDeregister / pncclCommDeregister(comm: Ptr, handle: Ptr) -> NcclResult {
        guard("ncclCommDeregister", || {
            let call = "ncclCommDeregister";
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.comm_deregister)?(p, handle) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            let inner = c.ready(call)?;
            if inner.real.is_some() && system_nccl::real().is_ok() {
                return forward(call, c, inner, "registration", "-", "-", run);
            }
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclCommWindowRegister`: on the real communicator (symmetric memory is the real
    /// NCCL's).
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: Ptr, buff: Ptr, size: usize, win: *mut Ptr, win_flags: c_int,
    ) -> NcclResult {
        guard("ncclCommWindowRegister", || {
            let call = "ncclCommWindowRegister";
            check_out(call, "win", win)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.comm_window_register)?(p, buff, size, win, win_flags) })
            };
            match target(call, comm)? {
                Target::Real(real, p) => pass(call, real, p, run),
                Target::Ours(c) => forward(call, c, c.ready(call)?, "window registration", "-", "-", run),
            }
        })
    }
}

export! {
    /// `ncclCommWindowDeregister`.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: Ptr, win: Ptr) -> NcclResult {
        guard("ncclCommWindowDeregister", || {
            let call = "ncclCommWindowDeregister";
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.comm_window_deregister)?(p, win) })
            };
            match target(call, comm)? {
                Target::Real(real, p) => pass(call, real, p, run),
                Target::Ours(c) => forward(call, c, c.ready(call)?, "window registration", "-", "-", run),
            }
        })
    }
}
