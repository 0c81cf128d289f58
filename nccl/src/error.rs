//! Errors: the failure type of the Rust side, the last-error text of `ncclGetLastError`, and
//! the guard every export runs in (no panic crosses the C boundary).

use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use mscclpp_host::communicator::CommError;
use mscclpp_host::cuda::CudaError;

use crate::types::{NcclResult, result};

/// A failed call: the code returned to C and the text kept for `ncclGetLastError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The `ncclResult_t`.
    pub code: NcclResult,
    /// What went wrong.
    pub msg: String,
}

impl Failure {
    /// A failure with `code`.
    pub fn new(code: NcclResult, msg: impl Into<String>) -> Failure {
        Failure {
            code,
            msg: msg.into(),
        }
    }

    /// `ncclInvalidArgument`.
    pub fn arg(msg: impl Into<String>) -> Failure {
        Failure::new(result::INVALID_ARGUMENT, msg)
    }

    /// `ncclInvalidUsage`.
    pub fn usage(msg: impl Into<String>) -> Failure {
        Failure::new(result::INVALID_USAGE, msg)
    }

    /// The failure of a communicator error, prefixed by the call.
    pub fn from_comm(call: &str, e: &CommError) -> Failure {
        let code = match e {
            CommError::Cuda(CudaError::Driver { .. }) => result::UNHANDLED_CUDA_ERROR,
            CommError::Cuda(CudaError::InvalidArgument(_)) | CommError::InvalidArgument(_) => {
                result::INVALID_ARGUMENT
            }
            CommError::Cuda(_) | CommError::Shm(_) | CommError::TransportUnavailable { .. } => {
                result::SYSTEM_ERROR
            }
            CommError::Bootstrap(_) | CommError::Proxy(_) | CommError::Ib(_) => {
                result::REMOTE_ERROR
            }
            CommError::Mismatch { .. } | CommError::State(_) | CommError::CallMismatch(_) => {
                result::INVALID_USAGE
            }
            CommError::Aborted(_) | CommError::Timeout(_) => result::REMOTE_ERROR,
            CommError::ContextLost(_) => result::UNHANDLED_CUDA_ERROR,
        };
        Failure::new(code, format!("{call}: {e}"))
    }
}

/// Size of the last-error buffer (texts are cut to fit).
const LAST_ERROR_BYTES: usize = 4096;

/// The last error text, NUL-terminated; one for the process, as NCCL's.
static LAST_ERROR: Mutex<[u8; LAST_ERROR_BYTES]> = Mutex::new([0; LAST_ERROR_BYTES]);

/// Keeps `msg` as the last error (cut at a character boundary to fit, NULs dropped).
pub fn set_last_error(msg: &str) {
    let mut buf = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    let mut n = 0;
    for ch in msg.chars().filter(|&c| c != '\0') {
        let mut tmp = [0u8; 4];
        let s = ch.encode_utf8(&mut tmp).as_bytes();
        if n + s.len() >= LAST_ERROR_BYTES {
            break;
        }
        buf[n..n + s.len()].copy_from_slice(s);
        n += s.len();
    }
    buf[n] = 0;
}

/// The last error text (empty when none).
pub fn last_error() -> String {
    let buf = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    let end = buf.iter().position(|&b| b == 0).unwrap_or(LAST_ERROR_BYTES);
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The address of the last-error buffer, for `ncclGetLastError`. The text stays readable
/// (the buffer is static); like NCCL's, a later error overwrites it.
pub fn last_error_ptr() -> *const c_char {
    let buf = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    buf.as_ptr().cast()
}

/// Runs an export's body: a panic becomes `ncclInternalError`, a failure its code; both
/// leave their text for `ncclGetLastError` (and print it under `MSCCLPP_DEBUG=WARN` or
/// more).
pub fn guard(call: &str, body: impl FnOnce() -> Result<NcclResult, Failure>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code)) => code,
        Ok(Err(f)) => {
            crate::log::warn(&f.msg);
            set_last_error(&f.msg);
            f.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let msg = format!("{call}: internal error (panic: {what})");
            set_last_error(&msg);
            crate::log::warn(&msg);
            result::INTERNAL_ERROR
        }
    }
}

/// Serialises the unit tests that read the (process-wide) last error.
#[cfg(test)]
pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_turns_panics_and_failures_into_codes() {
        let _l = TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(guard("t", || Ok(result::SUCCESS)), result::SUCCESS);
        assert_eq!(
            guard("t", || Err(Failure::arg("bad thing"))),
            result::INVALID_ARGUMENT
        );
        assert_eq!(last_error(), "bad thing");
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = guard("tcall", || panic!("boom"));
        std::panic::set_hook(prev);
        assert_eq!(r, result::INTERNAL_ERROR);
        assert!(last_error().contains("tcall") && last_error().contains("boom"));
    }

    #[test]
    fn last_error_is_cut_to_fit() {
        let _l = TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let long = "é".repeat(LAST_ERROR_BYTES);
        set_last_error(&long);
        let got = last_error();
        assert!(got.len() < LAST_ERROR_BYTES && got.chars().all(|c| c == 'é'));
    }
}
