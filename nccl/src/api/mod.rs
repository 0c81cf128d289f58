//! The exported C functions: NCCL's API (each under its `nccl` and `pnccl` names).
//!
//! - `create`: unique ids, `ncclCommInitRank*`, `ncclCommInitAll`, splits and shrinks;
//! - `state`: finalize, destroy, abort, revoke, asynchronous errors, size/device/rank;
//! - `collectives`: all-reduce ... scatter, and pre-multiplied-sum operations;
//! - `p2p`: `ncclSend`/`ncclRecv` and groups;
//! - `memory`: `ncclMemAlloc`/`ncclMemFree`, registration, windows;
//! - `device`: device communicators, teams and requirements (the 2.28 device API);
//! - `library`: the version, result-code texts, the last error.
//!
//! This module holds what they share: the export macro and the argument checks.
//!
//! Every export runs its body in [`guard`](crate::error::guard): a panic becomes
//! `ncclInternalError`, every failure leaves its text for `ncclGetLastError`.

use std::ffi::{c_int, c_void};

use mscclpp_host::collectives::PreMulScalar;

use crate::comm::{Comm, Handle, Inner, lookup, real_of};
use crate::dispatch;
use crate::error::Failure;
use crate::log::{self, Path};
use crate::system_nccl::{self, Ptr, Real};
use crate::types::{
    self, MAX_RED_OP, NUM_OPS, NcclDataType, NcclRedOp, NcclResult, dtype_name, is_builtin_op,
};

/// Defines `$pname` with the body and `$name` calling it.
macro_rules! export {
    ($(#[doc = $doc:literal])* fn $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty $body:block) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// NCCL's C contract: pointers valid for what they describe, communicators made by
        /// this library (or by the real NCCL, which then serves the call).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $pname($($arg: $ty),*) -> $ret $body

        #[doc = concat!("Same as [`", stringify!($pname), "`].")]
        ///
        /// # Safety
        #[doc = concat!("As for [`", stringify!($pname), "`].")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the same function under NCCL's other name; the same contract.
            unsafe { $pname($($arg),*) }
        }
    };
}

/// Marks this library, so that the real-NCCL finder never loads it as the real one.
#[unsafe(no_mangle)]
pub static mscclpp_nccl_is_not_nccl: c_int = 1;

/// What a communicator handle resolves to for a call.
enum Target {
    Ours(&'static Comm),
    /// Not ours, with a real NCCL loaded: pass the call on unchanged.
    Real(&'static Real, Ptr),
}

fn target(call: &str, comm: Ptr) -> Result<Target, Failure> {
    match lookup(comm) {
        Handle::Null => Err(Failure::arg(format!("{call}: comm is NULL"))),
        Handle::Ours(c) => Ok(Target::Ours(c)),
        Handle::Foreign(p) => match system_nccl::real() {
            Ok(r) => Ok(Target::Real(r, p)),
            Err(_) => Err(Failure::arg(format!(
                "{call}: {p:?} is not a communicator of this library"
            ))),
        },
    }
}

fn check_dtype(call: &str, dt: NcclDataType) -> Result<&'static str, Failure> {
    dtype_name(dt).ok_or_else(|| {
        Failure::arg(format!(
            "{call}: invalid data type {dt} (0..{})",
            types::NUM_TYPES - 1
        ))
    })
}

fn check_op(call: &str, inner: Option<&Inner>, op: NcclRedOp) -> Result<(), Failure> {
    if is_builtin_op(op) {
        return Ok(());
    }
    let made = (NUM_OPS..=MAX_RED_OP).contains(&op)
        && inner.is_none_or(|i| i.premul_ops.get(op).is_some());
    if made {
        Ok(())
    } else {
        Err(Failure::arg(format!(
            "{call}: invalid reduction operation {op} (0..4, or one made by \
             ncclRedOpCreatePreMulSum on this communicator)"
        )))
    }
}

/// [`check_op`], then the scalar of a pre-multiplied sum (`None` for a built-in operation),
/// whose type must be the call's.
fn resolve_op(
    call: &str,
    inner: &Inner,
    op: NcclRedOp,
    datatype: NcclDataType,
) -> Result<Option<PreMulScalar>, Failure> {
    check_op(call, Some(inner), op)?;
    let Some(s) = inner.premul_ops.get(op) else {
        return Ok(None);
    };
    match types::native_dtype(datatype) {
        Some(d) if d == s.dtype() => Ok(Some(s)),
        _ => Err(Failure::arg(format!(
            "{call}: operation {op} is a pre-multiplied sum of {}, the call's data type is {}",
            s.dtype(),
            dtype_name(datatype).unwrap_or("?")
        ))),
    }
}

fn check_ptr(call: &str, what: &str, p: *const c_void, count: usize) -> Result<(), Failure> {
    if p.is_null() && count > 0 {
        return Err(Failure::arg(format!(
            "{call}: {what} is NULL with count {count}"
        )));
    }
    Ok(())
}

fn check_out<T>(call: &str, what: &str, p: *const T) -> Result<(), Failure> {
    if p.is_null() {
        return Err(Failure::arg(format!("{call}: {what} is NULL")));
    }
    Ok(())
}

fn check_rank(call: &str, what: &str, r: c_int, nranks: usize) -> Result<(), Failure> {
    if r < 0 || r as usize >= nranks {
        return Err(Failure::arg(format!(
            "{call}: {what} {r} is out of range (0..{})",
            nranks.saturating_sub(1)
        )));
    }
    Ok(())
}

/// Calls the real NCCL on the real communicator beside ours.
fn forward(
    call: &str,
    c: &Comm,
    inner: &Inner,
    what: &str,
    dt: &str,
    op: &str,
    f: impl FnOnce(&'static Real, Ptr) -> Result<NcclResult, Failure>,
) -> Result<NcclResult, Failure> {
    forward_because(call, c, inner, what, "", dt, op, f)
}

/// [`forward`] for a call that could have been native: `why` it is not (said only when
/// there is no real NCCL; nothing is formatted on the way through).
#[allow(clippy::too_many_arguments)]
fn forward_because(
    call: &str,
    c: &Comm,
    inner: &Inner,
    what: &str,
    why: dispatch::Why,
    dt: &str,
    op: &str,
    f: impl FnOnce(&'static Real, Ptr) -> Result<NcclResult, Failure>,
) -> Result<NcclResult, Failure> {
    let (real, rc) = real_of(call, inner, what).map_err(|mut e| {
        if !why.is_empty() {
            e.msg = format!("{} [{dt} {op}: {why}]", e.msg);
        }
        e
    })?;
    log::call_path(call, c.rank, c.nranks, dt, op, Path::Fallback);
    let r = f(real, rc)?;
    system_nccl::real_result(call, real, rc, r)
}

/// Passes a call on a communicator that is not ours to the real NCCL unchanged.
fn pass(
    call: &str,
    real: &'static Real,
    p: Ptr,
    f: impl FnOnce(&'static Real, Ptr) -> Result<NcclResult, Failure>,
) -> Result<NcclResult, Failure> {
    log::call_path(call, 0, 0, "-", "-", Path::PassThrough);
    let r = f(real, p)?;
    system_nccl::real_result(call, real, p, r)
}

mod collectives;
mod create;
mod device;
mod library;
mod memory;
mod p2p;
mod state;

pub use collectives::*;
pub use create::*;
pub use device::*;
pub use library::*;
pub use memory::*;
pub use p2p::*;
pub use state::*;

#[cfg(test)]
mod tests;
