//! Calls about the library itself: its version, result-code texts, the last error.

use std::ffi::{c_char, c_int};

use crate::comm::{Handle, lookup};
use crate::error::{guard, last_error, last_error_ptr};
use crate::system_nccl::{self, Ptr};
use crate::types::{self, ABI_VERSION_CODE, NcclResult, result};

use super::check_out;

export! {
    /// `ncclGetVersion`: the real NCCL's version code when one is loaded (programs test it
    /// for features the fallback serves), else 22800 (the 2.28 ABI this library follows).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> NcclResult {
        guard("ncclGetVersion", || {
            check_out("ncclGetVersion", "version", version)?;
            let v = system_nccl::real().map(|r| r.version).unwrap_or(ABI_VERSION_CODE);
            // SAFETY: checked non-null; the caller's int.
            unsafe { *version = v };
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclGetErrorString`: a static text for each result code.
    fn ncclGetErrorString / pncclGetErrorString(code: NcclResult) -> *const c_char {
        std::panic::catch_unwind(|| types::error_string(code).as_ptr())
            .unwrap_or(c"internal error".as_ptr())
    }
}

export! {
    /// `ncclGetLastError`: the text of the last failure (process-wide, as NCCL's), or the
    /// real NCCL's for its communicators.
    fn ncclGetLastError / pncclGetLastError(comm: Ptr) -> *const c_char {
        std::panic::catch_unwind(|| {
            match lookup(comm) {
                Handle::Foreign(p) => {
                    if let Ok(real) = system_nccl::real()
                        && let Some(f) = real.fns.get_last_error
                    {
                        // SAFETY: NCCL's signature; its own communicator.
                        return unsafe { f(p) };
                    }
                }
                Handle::Ours(c) => {
                    if last_error().is_empty()
                        && let Some(Ok(inner)) = c.state.get()
                        && let (Ok(real), Some(rc)) = (system_nccl::real(), inner.real)
                        && let Some(f) = real.fns.get_last_error
                    {
                        // SAFETY: as above, the real communicator beside ours.
                        return unsafe { f(rc.0) };
                    }
                }
                Handle::Null => {}
            }
            last_error_ptr()
        })
        .unwrap_or(c"internal error".as_ptr())
    }
}

export! {
    /// `ncclResetDebugInit` (deprecated in NCCL): passed to the real NCCL when loaded.
    fn ncclResetDebugInit / pncclResetDebugInit() -> () {
        let _ = std::panic::catch_unwind(|| {
            if let Ok(real) = system_nccl::real()
                && let Some(f) = real.fns.reset_debug_init
            {
                // SAFETY: NCCL's signature, no arguments.
                unsafe { f() }
            }
        });
    }
}
