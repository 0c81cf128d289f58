//! The exported C functions: NCCL's API (each under its `nccl` and `pnccl` names).
//!
//! Every export runs its body in [`guard`]: a panic becomes `ncclInternalError`, every
//! failure leaves its text for `ncclGetLastError`.

use std::ffi::{c_char, c_int, c_void};
use std::time::Duration;

use mscclpp_host::bootstrap::BootstrapConfig;
use mscclpp_host::collectives::{DataType, P2pOp, PreMulScalar};

use crate::comm::{
    self, Comm, ConfigCopy, Handle, Inner, RealChild, RealSetup, decode_color_key,
    encode_color_key, lookup, new_id, null, parse_id, real_of, register, unregister,
};
use crate::dispatch::{self, Launch};
use crate::error::{Failure, guard, last_error, last_error_ptr};
use crate::group;
use crate::log::{self, Path};
use crate::real::{self, Ptr, RawUniqueId, Real, Team, need};
use crate::types::{
    self, ABI_VERSION_CODE, MAX_RED_OP, NUM_OPS, NativeCall, NcclConfig, NcclDataType, NcclRedOp,
    NcclResult, SPLIT_NOCOLOR, dtype_name, is_builtin_op, op_name, read_config, result,
    shrink_members, split_members,
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
        Handle::Foreign(p) => match real::real() {
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
    real::real_result(call, real, rc, r)
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
    real::real_result(call, real, p, r)
}

// ---------------------------------------------------------------------------------------
// Version, ids, errors

export! {
    /// `ncclGetVersion`: the real NCCL's version code when one is loaded (programs test it
    /// for features the fallback serves), else 22800 (the 2.28 ABI this library follows).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> NcclResult {
        guard("ncclGetVersion", || {
            check_out("ncclGetVersion", "version", version)?;
            let v = real::real().map(|r| r.version).unwrap_or(ABI_VERSION_CODE);
            // SAFETY: checked non-null; the caller's int.
            unsafe { *version = v };
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclGetUniqueId`: a bootstrap id of this library (its root listens on 127.0.0.1 in
    /// this process: the ranks must be on this machine).
    fn ncclGetUniqueId / pncclGetUniqueId(unique_id: *mut RawUniqueId) -> NcclResult {
        guard("ncclGetUniqueId", || {
            check_out("ncclGetUniqueId", "uniqueId", unique_id)?;
            let call = "ncclGetUniqueId";
            let id = match comm::env_comm_id(call, &BootstrapConfig::default())? {
                Some(id) => {
                    log::info(&format!("{call}: {} fixes the root at {}", comm::COMM_ID_ENV, id.root_addr()));
                    id
                }
                None => new_id(call)?,
            };
            let mut raw = RawUniqueId { internal: [0; 128] };
            for (d, s) in raw.internal.iter_mut().zip(id.as_bytes()) {
                *d = *s as c_char;
            }
            // SAFETY: checked non-null; the caller's 128 bytes.
            unsafe { unique_id.write(raw) };
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
                    if let Ok(real) = real::real()
                        && let Some(f) = real.fns.get_last_error
                    {
                        // SAFETY: NCCL's signature; its own communicator.
                        return unsafe { f(p) };
                    }
                }
                Handle::Ours(c) => {
                    if last_error().is_empty()
                        && let Some(Ok(inner)) = c.state.get()
                        && let (Ok(real), Some(rc)) = (real::real(), inner.real)
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
            if let Ok(real) = real::real()
                && let Some(f) = real.fns.reset_debug_init
            {
                // SAFETY: NCCL's signature, no arguments.
                unsafe { f() }
            }
        });
    }
}

// ---------------------------------------------------------------------------------------
// Communicators

/// The common part of the `ncclCommInitRank*` calls.
///
/// # Safety
/// `out` is writable when non-null; `config` null or a valid config.
unsafe fn init_rank(
    call: &str,
    out: *mut Ptr,
    nranks: c_int,
    id: &RawUniqueId,
    rank: c_int,
    config: *mut NcclConfig,
) -> Result<NcclResult, Failure> {
    check_out(call, "comm", out)?;
    // NULL until made, as in NCCL: a failed set-up leaves no stale handle that cleanup
    // code would then end (or pass to the real NCCL).
    // SAFETY: checked non-null; the caller's out-parameter.
    unsafe { *out = null() };
    if nranks < 1 {
        return Err(Failure::arg(format!("{call}: nranks {nranks} < 1")));
    }
    check_rank(call, "rank", rank, nranks as usize)?;
    // SAFETY: caller contract.
    let view = unsafe { read_config(config) }.map_err(|e| Failure::arg(format!("{call}: {e}")))?;
    let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    let id = parse_id(call, &bytes)?;
    let gpu = comm::current_gpu(call)?;
    // SAFETY: checked by read_config.
    let cfg = unsafe { ConfigCopy::new(config) };
    let c = Box::new(
        Comm::new(rank as usize, nranks as usize, gpu.clone(), view.blocking).with_config(&cfg),
    );
    if group::depth() > 0 {
        let p = register(c);
        // SAFETY: checked non-null.
        unsafe { *out = p };
        group::defer(group::Pending {
            comm: p as usize,
            id,
            cfg,
        });
        return Ok(result::SUCCESS);
    }
    let inner = comm::set_up(
        call,
        nranks as usize,
        rank as usize,
        id,
        &gpu,
        RealSetup::Create(cfg),
    )?;
    let _ = c.state.set(Ok(inner));
    // SAFETY: checked non-null.
    unsafe { *out = register(c) };
    Ok(result::SUCCESS)
}

export! {
    /// `ncclCommInitRank`: joins the ranks of `comm_id` on the current CUDA device. Inside a
    /// group the set-up runs at `ncclGroupEnd`.
    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut Ptr, nranks: c_int, comm_id: RawUniqueId, rank: c_int,
    ) -> NcclResult {
        guard("ncclCommInitRank", || {
            // SAFETY: caller contract.
            unsafe {
                init_rank("ncclCommInitRank", comm, nranks, &comm_id, rank, std::ptr::null_mut())
            }
        })
    }
}

export! {
    /// `ncclCommInitRankConfig`: as `ncclCommInitRank`; the config goes to the real NCCL's
    /// communicator, made blocking. Calls always block (a nonblocking config is allowed;
    /// calls return `ncclSuccess` when done).
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut Ptr, nranks: c_int, comm_id: RawUniqueId, rank: c_int, config: *mut NcclConfig,
    ) -> NcclResult {
        guard("ncclCommInitRankConfig", || {
            // SAFETY: caller contract.
            unsafe { init_rank("ncclCommInitRankConfig", comm, nranks, &comm_id, rank, config) }
        })
    }
}

export! {
    /// `ncclCommInitRankScalable`: as `ncclCommInitRankConfig` with the first of the ids
    /// (one bootstrap root is enough for the rank counts this library serves).
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut Ptr, nranks: c_int, myrank: c_int, n_id: c_int,
        comm_ids: *mut RawUniqueId, config: *mut NcclConfig,
    ) -> NcclResult {
        guard("ncclCommInitRankScalable", || {
            let call = "ncclCommInitRankScalable";
            if n_id < 1 {
                return Err(Failure::arg(format!("{call}: nId {n_id} < 1")));
            }
            check_out(call, "commIds", comm_ids)?;
            // SAFETY: checked non-null; at least one id (nId >= 1).
            let id = unsafe { *comm_ids };
            // SAFETY: caller contract.
            unsafe { init_rank(call, newcomm, nranks, &id, myrank, config) }
        })
    }
}

export! {
    /// `ncclCommInitAll`: one communicator per device of `devlist` (or devices 0..ndev) in
    /// this process, set up together.
    fn ncclCommInitAll / pncclCommInitAll(comms: *mut Ptr, ndev: c_int, devlist: *const c_int) -> NcclResult {
        guard("ncclCommInitAll", || {
            let call = "ncclCommInitAll";
            check_out(call, "comms", comms)?;
            if ndev < 1 {
                return Err(Failure::arg(format!("{call}: ndev {ndev} < 1")));
            }
            let n = ndev as usize;
            let devs: Vec<c_int> = if devlist.is_null() {
                (0..ndev).collect()
            } else {
                // SAFETY: the caller's array of ndev ints.
                unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
            };
            if let Some(bad) = devs.iter().find(|&&d| d < 0) {
                return Err(Failure::arg(format!("{call}: device {bad} < 0")));
            }
            comm::current_gpu(call)?; // fails fast without a GPU
            let id = new_id(call)?;
            let mut gpus = Vec::new();
            for &d in &devs {
                gpus.push(comm::open_gpu(call, d as usize)?);
            }
            let jobs = gpus
                .iter()
                .enumerate()
                .map(|(i, g)| (n, i, id, g.clone(), ConfigCopy::NONE))
                .collect();
            let results = comm::set_up_many(call, jobs);
            if let Some(f) = results.iter().find_map(|r| r.as_ref().err()).cloned() {
                return Err(f);
            }
            for (i, (r, g)) in results.into_iter().zip(gpus).enumerate() {
                let c = Box::new(Comm::new(i, n, g, true));
                let _ = c.state.set(r);
                // SAFETY: the caller's array of ndev handles.
                unsafe { *comms.add(i) = register(c) };
            }
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclCommSplit`: ranks with the same color form a new communicator, ordered by key
    /// (then by rank); `NCCL_SPLIT_NOCOLOR` takes part and gets NULL. Collective over the
    /// parent. The real NCCL's communicator is split alongside.
    fn ncclCommSplit / pncclCommSplit(
        comm: Ptr, color: c_int, key: c_int, newcomm: *mut Ptr, config: *mut NcclConfig,
    ) -> NcclResult {
        guard("ncclCommSplit", || {
            let call = "ncclCommSplit";
            check_out(call, "newcomm", newcomm)?;
            // NULL until made (as NCCL): see `init_rank`.
            // SAFETY: checked non-null; the caller's out-parameter.
            unsafe { *newcomm = null() };
            if color < 0 && color != SPLIT_NOCOLOR {
                return Err(Failure::arg(format!("{call}: color {color} < 0 (and not NCCL_SPLIT_NOCOLOR)")));
            }
            let c = match target(call, comm)? {
                Target::Real(real, p) => {
                    return pass(call, real, p, |real, p| {
                        let f = need(call, real, real.fns.comm_split)?;
                        // SAFETY: NCCL's signature, the caller's arguments.
                        Ok(unsafe { f(p, color, key, newcomm, config) })
                    });
                }
                Target::Ours(c) => c,
            };
            let inner = c.ready(call)?;
            // SAFETY: caller contract.
            let view = unsafe { read_config(config) }.map_err(|e| Failure::arg(format!("{call}: {e}")))?;
            // SAFETY: checked by read_config.
            let child_cfg = unsafe { ConfigCopy::for_child(config, c.config()) };
            let blocking = if config.is_null() { c.blocking } else { view.blocking };
            // The real split first: every parent rank calls it, the no-color ones included.
            let (real_new, real_missing) = match (inner.real, real::real()) {
                (Some(rc), Ok(real)) => {
                    let how = RealChild::Split { color, key };
                    let child = comm::real_child(call, real, rc, &c.gpu, child_cfg, how)?;
                    let missing = child.is_none().then(|| "the real ncclCommSplit made no communicator for this rank".to_string());
                    (child, missing)
                }
                _ => (None, inner.real_missing.clone()),
            };
            let coll = match &inner.coll {
                Ok(coll) => coll,
                // On the real NCCL alone: so is the child.
                Err(why) => return real_only_child(call, c, why, real_new, blocking, None, newcomm),
            };
            let bs = coll.communicator().bootstrap();
            let boot = |e: mscclpp_host::bootstrap::BootstrapError| Failure::from_comm(call, &e.into());
            // Ranks may reach a split far apart (as a set-up): wait as long as for late ranks
            // there. The rest of the split follows at once on every rank.
            let late = bs.as_async().config().late_wait();
            let all = bs.all_gather_within(&encode_color_key(color, key), late).map_err(boot)?;
            let ck: Vec<(c_int, c_int)> = all
                .iter()
                .map(|b| decode_color_key(b).unwrap_or((SPLIT_NOCOLOR, 0)))
                .collect();
            let members = split_members(&ck, c.rank);
            let leader = members.as_ref().is_some_and(|(m, _)| m[0] == c.rank);
            let payload = if leader { new_id(call)?.as_bytes().to_vec() } else { Vec::new() };
            let ids = bs.all_gather(&payload).map_err(boot)?;
            let Some((m, place)) = members else {
                // SAFETY: checked non-null.
                unsafe { *newcomm = null() };
                return Ok(result::SUCCESS);
            };
            let id = parse_id(call, &ids[m[0]])?;
            let new = Box::new(Comm::new(place, m.len(), c.gpu.clone(), blocking).with_config(&child_cfg));
            let inner = c.on_device(|| {
                comm::set_up(call, m.len(), place, id, &c.gpu, RealSetup::Given(real_new, real_missing))
            })?;
            let _ = new.state.set(Ok(inner));
            // SAFETY: checked non-null.
            unsafe { *newcomm = register(new) };
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclCommShrink`: the ranks not in `exclude_ranks_list` form a new communicator in
    /// rank order (the excluded ranks do not call). The real communicator is shrunk
    /// alongside. `NCCL_SHRINK_ABORT` first stops the parent's operations in flight (as
    /// `ncclCommRevoke` does); other flags are refused.
    fn ncclCommShrink / pncclCommShrink(
        comm: Ptr, exclude_ranks_list: *mut c_int, exclude_ranks_count: c_int,
        newcomm: *mut Ptr, config: *mut NcclConfig, shrink_flags: c_int,
    ) -> NcclResult {
        guard("ncclCommShrink", || {
            let call = "ncclCommShrink";
            check_out(call, "newcomm", newcomm)?;
            // NULL until made (as NCCL): see `init_rank`.
            // SAFETY: checked non-null; the caller's out-parameter.
            unsafe { *newcomm = null() };
            if exclude_ranks_count < 0 {
                return Err(Failure::arg(format!("{call}: excludeRanksCount {exclude_ranks_count} < 0")));
            }
            if shrink_flags & !SHRINK_ABORT != 0 {
                return Err(Failure::arg(format!(
                    "{call}: shrinkFlags {shrink_flags:#x} (NCCL_SHRINK_DEFAULT 0 or NCCL_SHRINK_ABORT 1)"
                )));
            }
            check_ptr(call, "excludeRanksList", exclude_ranks_list.cast(), exclude_ranks_count as usize)?;
            let c = match target(call, comm)? {
                Target::Real(real, p) => {
                    return pass(call, real, p, |real, p| {
                        let f = need(call, real, real.fns.comm_shrink)?;
                        // SAFETY: NCCL's signature, the caller's arguments.
                        Ok(unsafe { f(p, exclude_ranks_list, exclude_ranks_count, newcomm, config, shrink_flags) })
                    });
                }
                Target::Ours(c) => c,
            };
            let inner = c.ready(call)?;
            // SAFETY: caller contract.
            let view = unsafe { read_config(config) }.map_err(|e| Failure::arg(format!("{call}: {e}")))?;
            // SAFETY: checked by read_config.
            let child_cfg = unsafe { ConfigCopy::for_child(config, c.config()) };
            let excluded: Vec<c_int> = if exclude_ranks_count == 0 {
                Vec::new()
            } else {
                // SAFETY: checked non-null; the caller's array.
                unsafe { std::slice::from_raw_parts(exclude_ranks_list, exclude_ranks_count as usize) }.to_vec()
            };
            for &e in &excluded {
                check_rank(call, "excluded rank", e, c.nranks)?;
            }
            let Some((m, place)) = shrink_members(c.nranks, &excluded, c.rank) else {
                return Err(Failure::arg(format!("{call}: this rank ({}) is in excludeRanksList", c.rank)));
            };
            // NCCL_SHRINK_ABORT: the parent's operations in flight stop first (ours as on
            // ncclCommRevoke, so the parent is then destroyed without a barrier; the real
            // shrink below does the same on the real side).
            if shrink_flags & SHRINK_ABORT != 0 {
                revoke_ours(call, c, inner);
            }
            let (real_new, real_missing) = match (inner.real, real::real()) {
                (Some(rc), Ok(real)) => {
                    let how = RealChild::Shrink { exclude: excluded.clone(), flags: shrink_flags };
                    let child = comm::real_child(call, real, rc, &c.gpu, child_cfg, how)?;
                    let missing = child.is_none().then(|| "the real ncclCommShrink made no communicator for this rank".to_string());
                    (child, missing)
                }
                _ => (None, inner.real_missing.clone()),
            };
            let blocking = if config.is_null() { c.blocking } else { view.blocking };
            let coll = match &inner.coll {
                Ok(coll) => coll,
                Err(why) => {
                    let place = Some((place, m.len()));
                    return real_only_child(call, c, why, real_new, blocking, place, newcomm);
                }
            };
            let bs = coll.communicator().bootstrap();
            let boot = |e: mscclpp_host::bootstrap::BootstrapError| Failure::from_comm(call, &e.into());
            let seq = inner.shrink_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tag = 0x5348_5249_0000_0000u64 | seq;
            let id = if m[0] == c.rank {
                let id = new_id(call)?;
                for &p in &m[1..] {
                    bs.send(p, tag, id.as_bytes()).map_err(boot)?;
                }
                id
            } else {
                // The new communicator's rank 0 may come far later (as at a set-up).
                let late = bs.as_async().config().late_wait();
                parse_id(call, &bs.recv_within(m[0], tag, late).map_err(boot)?)?
            };
            let new = Box::new(Comm::new(place, m.len(), c.gpu.clone(), blocking).with_config(&child_cfg));
            let inner = c.on_device(|| {
                comm::set_up(call, m.len(), place, id, &c.gpu, RealSetup::Given(real_new, real_missing))
            })?;
            let _ = new.state.set(Ok(inner));
            // SAFETY: checked non-null.
            unsafe { *newcomm = register(new) };
            Ok(result::SUCCESS)
        })
    }
}

/// `NCCL_SHRINK_ABORT`.
const SHRINK_ABORT: c_int = 1;

/// The child of a split or shrink of a communicator on the real NCCL alone (ours could not
/// be set up: `why`): on the real child `real_new` alone (`NULL` when the real split gave
/// none: no color). `place`: this rank's place and the child's size when known (a shrink),
/// else asked of the real child.
fn real_only_child(
    call: &str,
    c: &Comm,
    why: &str,
    real_new: Option<real::RealComm>,
    blocking: bool,
    place: Option<(usize, usize)>,
    newcomm: *mut Ptr,
) -> Result<NcclResult, Failure> {
    let Some(rc) = real_new else {
        // SAFETY: checked non-null by the caller.
        unsafe { *newcomm = null() };
        return Ok(result::SUCCESS);
    };
    let (place, size) = match place {
        Some(p) => p,
        None => {
            let real = real::real().map_err(|e| Failure::usage(format!("{call}: {e}")))?;
            let ask =
                |what: &str, f: Option<unsafe extern "C" fn(Ptr, *mut c_int) -> NcclResult>| {
                    let f = need(call, real, f)?;
                    let mut v: c_int = 0;
                    // SAFETY: NCCL's signature; the real child, an out-pointer to a local.
                    real::real_result(call, real, rc.0, unsafe { f(rc.0, &mut v) })
                        .map_err(|e| Failure::new(e.code, format!("{} ({what})", e.msg)))?;
                    Ok::<usize, Failure>(v.max(0) as usize)
                };
            (
                ask("rank", real.fns.comm_user_rank)?,
                ask("count", real.fns.comm_count)?,
            )
        }
    };
    let new = Box::new(Comm::new(place, size, c.gpu.clone(), blocking));
    let _ = new.state.set(Ok(Inner::real_only(rc, why.to_string())));
    // SAFETY: checked non-null by the caller.
    unsafe { *newcomm = register(new) };
    Ok(result::SUCCESS)
}

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
            if let (Some(rc), Ok(real)) = (inner.real, real::real())
                && let Some(f) = real.fns.comm_finalize
            {
                // SAFETY: NCCL's signature; the real communicator.
                let r = unsafe { f(rc.0) };
                return real::real_result(call, real, rc.0, r);
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
    if let (Some(rc), Ok(real)) = (inner.real, real::real()) {
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
            if let (Some(rc), Ok(real)) = (inner.real, real::real()) {
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
fn revoke_ours(call: &str, c: &Comm, inner: &Inner) -> bool {
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
    let (rc, real) = (inner.real?, real::real().ok()?);
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

// ---------------------------------------------------------------------------------------
// Collectives

/// Runs a native collective on the caller's stream (with this device's context current), or,
/// inside a group, keeps it for the outermost `ncclGroupEnd` (see [`group`]).
#[allow(clippy::too_many_arguments)]
fn native(
    call: &'static str,
    c: &Comm,
    inner: &Inner,
    dt: &'static str,
    op: &'static str,
    launch: Launch,
    stream: Ptr,
) -> Result<NcclResult, Failure> {
    log::call_path(call, c.rank, c.nranks, dt, op, Path::Native);
    if group::depth() > 0 {
        group::add_coll(c as *const Comm as Ptr, call, launch, stream);
        return Ok(result::SUCCESS);
    }
    c.launch_native(call, inner, launch, stream)
}

export! {
    /// `ncclAllReduce`: native for every operation on every type (unless
    /// `MSCCLPP_NCCL_FALLBACK` names it; pre-multiplied sums, made here, are always native).
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        op: NcclRedOp, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclAllReduce", || {
            let call = "ncclAllReduce";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.all_reduce)?(sendbuff.cast_mut(), recvbuff, count, datatype, op, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_ptr(call, "sendbuff", sendbuff, count)?;
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            let premul = resolve_op(call, inner, op, datatype)?;
            match dispatch::reducing(&inner.fallback, NativeCall::AllReduce, datatype, op, premul) {
                Ok((dtype, o)) => {
                    let l = Launch::AllReduce { send: sendbuff as u64, recv: recvbuff as u64, count, dtype, op: o };
                    native(call, c, inner, dt, op_name(op), l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this all-reduce", why, dt, op_name(op), run),
            }
        })
    }
}

export! {
    /// `ncclAllGather`: native for every data type (it moves bytes), unless
    /// `MSCCLPP_NCCL_FALLBACK` names it.
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: NcclDataType,
        comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclAllGather", || {
            let call = "ncclAllGather";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.all_gather)?(sendbuff.cast_mut(), recvbuff, sendcount, datatype, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_ptr(call, "sendbuff", sendbuff, sendcount)?;
            check_ptr(call, "recvbuff", recvbuff, sendcount)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::AllGather, datatype) {
                Ok(dtype) => {
                    let l = Launch::AllGather { send: sendbuff as u64, recv: recvbuff as u64, count: sendcount, dtype };
                    native(call, c, inner, dt, "-", l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this all-gather", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclReduceScatter`: native as `ncclAllReduce`.
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: NcclDataType,
        op: NcclRedOp, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclReduceScatter", || {
            let call = "ncclReduceScatter";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.reduce_scatter)?(sendbuff.cast_mut(), recvbuff, recvcount, datatype, op, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_ptr(call, "sendbuff", sendbuff, recvcount)?;
            check_ptr(call, "recvbuff", recvbuff, recvcount)?;
            let inner = c.usable(call)?;
            let premul = resolve_op(call, inner, op, datatype)?;
            match dispatch::reducing(&inner.fallback, NativeCall::ReduceScatter, datatype, op, premul) {
                Ok((dtype, o)) => {
                    let l = Launch::ReduceScatter { send: sendbuff as u64, recv: recvbuff as u64, count: recvcount, dtype, op: o };
                    native(call, c, inner, dt, op_name(op), l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this reduce-scatter", why, dt, op_name(op), run),
            }
        })
    }
}

export! {
    /// `ncclBroadcast`: native for every data type (unless `MSCCLPP_NCCL_FALLBACK` names
    /// `broadcast`).
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclBroadcast", || {
            let call = "ncclBroadcast";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.broadcast)?(sendbuff.cast_mut(), recvbuff, count, datatype, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            if c.rank == root as usize {
                check_ptr(call, "sendbuff", sendbuff, count)?;
            }
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::Broadcast, datatype) {
                Ok(dtype) => {
                    let l = Launch::Broadcast { send: sendbuff as u64, recv: recvbuff as u64, count, dtype, root: root as usize };
                    native(call, c, inner, dt, "-", l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this broadcast", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclBcast` (in place): native as `ncclBroadcast`.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void, count: usize, datatype: NcclDataType, root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclBcast", || {
            let call = "ncclBcast";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.bcast)?(buff, count, datatype, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            check_ptr(call, "buff", buff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::Broadcast, datatype) {
                Ok(dtype) => {
                    let l = Launch::Broadcast { send: buff as u64, recv: buff as u64, count, dtype, root: root as usize };
                    native(call, c, inner, dt, "-", l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this broadcast", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclReduce`: native as `ncclAllReduce`.
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        op: NcclRedOp, root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclReduce", || {
            let call = "ncclReduce";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.reduce)?(sendbuff.cast_mut(), recvbuff, count, datatype, op, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            check_ptr(call, "sendbuff", sendbuff, count)?;
            if c.rank == root as usize {
                check_ptr(call, "recvbuff", recvbuff, count)?;
            }
            let inner = c.usable(call)?;
            let premul = resolve_op(call, inner, op, datatype)?;
            match dispatch::reducing(&inner.fallback, NativeCall::Reduce, datatype, op, premul) {
                Ok((dtype, o)) => {
                    let l = Launch::Reduce {
                        send: sendbuff as u64, recv: recvbuff as u64, count, dtype, op: o, root: root as usize,
                    };
                    native(call, c, inner, dt, op_name(op), l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this reduce", why, dt, op_name(op), run),
            }
        })
    }
}

export! {
    /// `ncclAlltoAll`: native for every data type (unless `MSCCLPP_NCCL_FALLBACK` names
    /// `alltoall`).
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclAlltoAll", || {
            let call = "ncclAlltoAll";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.all_to_all)?(sendbuff.cast_mut(), recvbuff, count, datatype, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_ptr(call, "sendbuff", sendbuff, count)?;
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::AllToAll, datatype) {
                Ok(dtype) => {
                    let l = Launch::AllToAll { send: sendbuff as u64, recv: recvbuff as u64, count, dtype };
                    native(call, c, inner, dt, "-", l, stream)
                }
                Err(why) => forward_because(call, c, inner, "this all-to-all", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclGather`: native for every data type as the sends and receives it stands for
    /// (every rank's piece to the root; the root's own by a stream copy, none in place),
    /// unless `MSCCLPP_NCCL_FALLBACK` names `sendrecv`; inside a group they run with the
    /// group's other sends and receives at the outermost `ncclGroupEnd`.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclGather", || {
            let call = "ncclGather";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.gather)?(sendbuff.cast_mut(), recvbuff, count, datatype, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            check_ptr(call, "sendbuff", sendbuff, count)?;
            if c.rank == root as usize {
                check_ptr(call, "recvbuff", recvbuff, count)?;
            }
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::SendRecv, datatype) {
                Ok(dtype) => {
                    let ops = rooted_ops(call, RootedKind::Gather, c.rank, c.nranks, root as usize,
                        sendbuff as u64, recvbuff as u64, count, dtype)?;
                    p2p(call, c, comm, inner, dt, &ops, stream)
                }
                Err(why) => forward_because(call, c, inner, "this gather", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclScatter`: native as [`ncclGather`], the other way (the root's piece `q` to rank
    /// `q`).
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: NcclDataType,
        root: c_int, comm: Ptr, stream: Ptr,
    ) -> NcclResult {
        guard("ncclScatter", || {
            let call = "ncclScatter";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.scatter)?(sendbuff.cast_mut(), recvbuff, count, datatype, root, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "root", root, c.nranks)?;
            if c.rank == root as usize {
                check_ptr(call, "sendbuff", sendbuff, count)?;
            }
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::SendRecv, datatype) {
                Ok(dtype) => {
                    let ops = rooted_ops(call, RootedKind::Scatter, c.rank, c.nranks, root as usize,
                        sendbuff as u64, recvbuff as u64, count, dtype)?;
                    p2p(call, c, comm, inner, dt, &ops, stream)
                }
                Err(why) => forward_because(call, c, inner, "this scatter", why, dt, "-", run),
            }
        })
    }
}

/// Native sends and receives (one for `ncclSend`/`ncclRecv`, several for a gather or
/// scatter): at once as one group outside a group, else kept for the outermost
/// `ncclGroupEnd` (see [`group`]).
fn p2p(
    call: &'static str,
    c: &'static Comm,
    comm: Ptr,
    inner: &Inner,
    dt: &'static str,
    ops: &[P2pOp],
    stream: Ptr,
) -> Result<NcclResult, Failure> {
    log::call_path(call, c.rank, c.nranks, dt, "-", Path::Native);
    if group::depth() > 0 {
        for op in ops {
            group::add_p2p(comm, *op, stream);
        }
        return Ok(result::SUCCESS);
    }
    let ops: Vec<(P2pOp, Ptr)> = ops.iter().map(|op| (*op, stream)).collect();
    group::run_p2p(call, c, inner, &ops)?;
    Ok(result::SUCCESS)
}

/// Which rooted operation [`rooted_ops`] spells out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RootedKind {
    /// Every rank's `count` elements to slot `rank` of the root's `recv`.
    Gather,
    /// Slot `q` of the root's `send` to rank `q`'s `recv`.
    Scatter,
}

/// The sends and receives of rank `rank`'s part of a gather or scatter of `count` elements
/// per rank with `root`, in rank order. The root's own piece is a send to and a receive
/// from itself (a stream copy), left out when it is in place (the same address). A count
/// whose root buffer (`nranks` pieces) would not fit the address space is refused.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rooted_ops(
    call: &str,
    kind: RootedKind,
    rank: usize,
    nranks: usize,
    root: usize,
    send: u64,
    recv: u64,
    count: usize,
    dtype: DataType,
) -> Result<Vec<P2pOp>, Failure> {
    let Some(piece) = count
        .checked_mul(dtype.size())
        .filter(|p| p.checked_mul(nranks).is_some())
    else {
        return Err(Failure::arg(format!(
            "{call}: count {count} x {} bytes x {nranks} ranks overflows",
            dtype.size()
        )));
    };
    if count == 0 {
        return Ok(Vec::new());
    }
    let piece = piece as u64;
    let send_op = |buf, peer| P2pOp::Send {
        buf,
        count,
        dtype,
        peer,
    };
    let recv_op = |buf, peer| P2pOp::Recv {
        buf,
        count,
        dtype,
        peer,
    };
    // The root's slots: its output's (gather) or its input's (scatter); in place when the
    // root's own piece already sits in its slot.
    let (slots, own) = match kind {
        RootedKind::Gather => (recv, send),
        RootedKind::Scatter => (send, recv),
    };
    let in_place = rank == root && own == slots + root as u64 * piece;
    let at_root = (0..nranks)
        .filter(|&q| rank == root && !(in_place && q == root))
        .map(|q| (slots + q as u64 * piece, q));
    let mine = (!in_place).then_some((own, root));
    Ok(match kind {
        RootedKind::Gather => (mine.into_iter().map(|(b, p)| send_op(b, p)))
            .chain(at_root.map(|(b, q)| recv_op(b, q)))
            .collect(),
        RootedKind::Scatter => (at_root.map(|(b, q)| send_op(b, q)))
            .chain(mine.into_iter().map(|(b, p)| recv_op(b, p)))
            .collect(),
    })
}

export! {
    /// `ncclSend`: native for every data type (unless `MSCCLPP_NCCL_FALLBACK` names
    /// `send`/`recv`); inside a group it runs, paired with the group's receives, at the
    /// outermost `ncclGroupEnd`.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: Ptr,
        stream: Ptr,
    ) -> NcclResult {
        guard("ncclSend", || {
            let call = "ncclSend";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.send)?(sendbuff.cast_mut(), count, datatype, peer, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "peer", peer, c.nranks)?;
            check_ptr(call, "sendbuff", sendbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::SendRecv, datatype) {
                Ok(dtype) => {
                    let op = P2pOp::Send { buf: sendbuff as u64, count, dtype, peer: peer as usize };
                    p2p(call, c, comm, inner, dt, &[op], stream)
                }
                Err(why) => forward_because(call, c, inner, "this send", why, dt, "-", run),
            }
        })
    }
}

export! {
    /// `ncclRecv`: native as `ncclSend`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void, count: usize, datatype: NcclDataType, peer: c_int, comm: Ptr,
        stream: Ptr,
    ) -> NcclResult {
        guard("ncclRecv", || {
            let call = "ncclRecv";
            let dt = check_dtype(call, datatype)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.recv)?(recvbuff, count, datatype, peer, p, stream) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            check_rank(call, "peer", peer, c.nranks)?;
            check_ptr(call, "recvbuff", recvbuff, count)?;
            let inner = c.usable(call)?;
            match dispatch::moving(&inner.fallback, NativeCall::SendRecv, datatype) {
                Ok(dtype) => {
                    let op = P2pOp::Recv { buf: recvbuff as u64, count, dtype, peer: peer as usize };
                    p2p(call, c, comm, inner, dt, &[op], stream)
                }
                Err(why) => forward_because(call, c, inner, "this receive", why, dt, "-", run),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------
// Groups

export! {
    /// `ncclGroupStart` (see the `group` module: mirrored on the real NCCL).
    fn ncclGroupStart / pncclGroupStart() -> NcclResult {
        guard("ncclGroupStart", group::start)
    }
}

export! {
    /// `ncclGroupEnd`: runs deferred set-ups, then (outermost) the group's native sends and
    /// receives, then ends the real NCCL's group.
    fn ncclGroupEnd / pncclGroupEnd() -> NcclResult {
        guard("ncclGroupEnd", || group::end("ncclGroupEnd", None))
    }
}

export! {
    /// `ncclGroupSimulateEnd`: ends the group like `ncclGroupEnd` without launching its
    /// native collectives, sends and receives, the real NCCL simulating its part (`sim_info`
    /// is left as is without one).
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(sim_info: Ptr) -> NcclResult {
        guard("ncclGroupSimulateEnd", || {
            check_out("ncclGroupSimulateEnd", "simInfo", sim_info)?;
            group::end("ncclGroupSimulateEnd", Some(sim_info))
        })
    }
}

// ---------------------------------------------------------------------------------------
// Memory, registration, windows, device communicators, reduction operations

export! {
    /// `ncclMemAlloc`: the real NCCL's (when loaded), else `cuMemAlloc` in the current
    /// context.
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut Ptr, size: usize) -> NcclResult {
        guard("ncclMemAlloc", || {
            let call = "ncclMemAlloc";
            check_out(call, "ptr", ptr)?;
            if let Ok(real) = real::real() {
                let f = need(call, real, real.fns.mem_alloc)?;
                // SAFETY: NCCL's signature, the caller's out-pointer.
                let r = unsafe { f(ptr, size) };
                return real::real_result(call, real, null(), r);
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
            if let Ok(real) = real::real() {
                let f = need(call, real, real.fns.mem_free)?;
                // SAFETY: NCCL's signature; its own allocation.
                let r = unsafe { f(ptr) };
                return real::real_result(call, real, null(), r);
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
            if inner.real.is_some() && real::real().is_ok() {
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
            if inner.real.is_some() && real::real().is_ok() {
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

export! {
    /// `ncclDevCommCreate` (NCCL 2.28 device API): on the real communicator.
    fn ncclDevCommCreate / pncclDevCommCreate(comm: Ptr, reqs: *const c_void, out_dev_comm: Ptr) -> NcclResult {
        guard("ncclDevCommCreate", || {
            let call = "ncclDevCommCreate";
            check_out(call, "reqs", reqs)?;
            check_out(call, "outDevComm", out_dev_comm)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.dev_comm_create)?(p, reqs, out_dev_comm) })
            };
            match target(call, comm)? {
                Target::Real(real, p) => pass(call, real, p, run),
                Target::Ours(c) => forward(call, c, c.ready(call)?, "the device API", "-", "-", run),
            }
        })
    }
}

export! {
    /// `ncclDevCommDestroy`: on the real communicator.
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: Ptr, dev_comm: *const c_void) -> NcclResult {
        guard("ncclDevCommDestroy", || {
            let call = "ncclDevCommDestroy";
            check_out(call, "devComm", dev_comm)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.dev_comm_destroy)?(p, dev_comm) })
            };
            match target(call, comm)? {
                Target::Real(real, p) => pass(call, real, p, run),
                Target::Ours(c) => forward(call, c, c.ready(call)?, "the device API", "-", "-", run),
            }
        })
    }
}

export! {
    /// `ncclCommQueryProperties` (newer NCCL): on the real communicator.
    fn ncclCommQueryProperties / pncclCommQueryProperties(comm: Ptr, props: Ptr) -> NcclResult {
        guard("ncclCommQueryProperties", || {
            let call = "ncclCommQueryProperties";
            check_out(call, "props", props)?;
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.comm_query_properties)?(p, props) })
            };
            match target(call, comm)? {
                Target::Real(real, p) => pass(call, real, p, run),
                Target::Ours(c) => forward(call, c, c.ready(call)?, "the device API", "-", "-", run),
            }
        })
    }
}

/// A query of the device API with no error channel: the real NCCL's answer (`pick` finds
/// its function, `ask` calls it) for a foreign communicator or the real one beside ours,
/// else `ours` for ours, else `none` (a null or unknown communicator, a panic).
fn device_query<F: Copy, R>(
    comm: Ptr,
    pick: impl Fn(&Real) -> Option<F>,
    ask: impl Fn(F, Ptr) -> R,
    ours: impl Fn(&Comm) -> R,
    none: impl Fn() -> R,
) -> R {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let f = real::real().ok().and_then(&pick);
        match lookup(comm) {
            Handle::Null => none(),
            Handle::Foreign(p) => f.map_or_else(&none, |f| ask(f, p)),
            Handle::Ours(c) => {
                if let (Some(f), Some(Ok(inner))) = (f, c.state.get())
                    && let Some(rc) = inner.real
                {
                    return ask(f, rc.0);
                }
                ours(c)
            }
        }
    }))
    .unwrap_or_else(|_| none())
}

/// A team query of the device API: a team of the whole communicator (`ours`) when the real
/// NCCL cannot answer.
fn team(
    comm: Ptr,
    pick: impl Fn(&Real) -> Option<unsafe extern "C" fn(Ptr) -> Team>,
    ours: impl Fn(&Comm) -> Team,
) -> Team {
    // SAFETY (the call): NCCL's signature, on its own communicator or the real one beside
    // ours.
    device_query(comm, pick, |f, p| unsafe { f(p) }, ours, Team::default)
}

/// Every rank of `nranks`, this one at `rank`.
fn world_team(nranks: usize, rank: usize) -> Team {
    Team {
        n_ranks: nranks as c_int,
        rank: rank as c_int,
        stride: 1,
    }
}

/// NCCL's rail team (the outer factor of the LSA team by its size) when the LSA team is
/// every rank: this rank alone, the stride the LSA team's size.
fn rail_team(nranks: usize) -> Team {
    Team {
        n_ranks: 1,
        rank: 0,
        stride: nranks as c_int,
    }
}

/// A team rank query of the device API (no error channel: -1 when there is no answer).
fn team_rank(
    comm: Ptr,
    tm: Team,
    rank: c_int,
    pick: impl Fn(&Real) -> Option<unsafe extern "C" fn(Ptr, Team, c_int) -> c_int>,
) -> c_int {
    device_query(
        comm,
        pick,
        // SAFETY: NCCL's signature, on its own communicator or the real one beside ours.
        |f, p| unsafe { f(p, tm, rank) },
        |c| team_rank_formula(c.rank, tm, rank),
        || -1,
    )
}

/// NCCL's formula: `rank`'s place in the world (or LSA team) from this rank's `me`, for
/// team `tm` whose place of this rank is `tm.rank` (-1 on overflow).
fn team_rank_formula(me: usize, tm: Team, rank: c_int) -> c_int {
    let v = me as i64 + (rank as i64 - tm.rank as i64) * tm.stride as i64;
    c_int::try_from(v).unwrap_or(-1)
}

export! {
    /// `ncclTeamWorld` (device API, host side): the real NCCL's answer for the real
    /// communicator, else every rank.
    fn ncclTeamWorld / pncclTeamWorld(comm: Ptr) -> Team {
        team(comm, |r| r.fns.team_world, |c| world_team(c.nranks, c.rank))
    }
}

export! {
    /// `ncclTeamLsa` (device API, host side): as `ncclTeamWorld` (one machine).
    fn ncclTeamLsa / pncclTeamLsa(comm: Ptr) -> Team {
        team(comm, |r| r.fns.team_lsa, |c| world_team(c.nranks, c.rank))
    }
}

export! {
    /// `ncclTeamRail` (device API, host side): the real NCCL's answer for the real
    /// communicator, else the outer factor of the LSA team (here every rank): a team of one.
    fn ncclTeamRail / pncclTeamRail(comm: Ptr) -> Team {
        team(comm, |r| r.fns.team_rail, |c| rail_team(c.nranks))
    }
}

export! {
    /// `ncclTeamRankToWorld` (device API, host side): the world rank of `rank` of team `tm`:
    /// the real NCCL's answer for the real communicator, else NCCL's formula
    /// (`comm's rank + (rank - tm.rank) * tm.stride`); -1 for a null or unknown
    /// communicator.
    fn ncclTeamRankToWorld / pncclTeamRankToWorld(comm: Ptr, tm: Team, rank: c_int) -> c_int {
        team_rank(comm, tm, rank, |r| r.fns.team_rank_to_world)
    }
}

export! {
    /// `ncclTeamRankToLsa` (device API, host side): as `ncclTeamRankToWorld` (the LSA team
    /// is every rank here).
    fn ncclTeamRankToLsa / pncclTeamRankToLsa(comm: Ptr, tm: Team, rank: c_int) -> c_int {
        team_rank(comm, tm, rank, |r| r.fns.team_rank_to_lsa)
    }
}

export! {
    /// `ncclGinBarrierCreateRequirement` (device API): on the real communicator.
    fn ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(
        comm: Ptr, tm: Team, n_barriers: c_int, out_handle: Ptr, out_req: Ptr,
    ) -> NcclResult {
        guard("ncclGinBarrierCreateRequirement", || {
            let call = "ncclGinBarrierCreateRequirement";
            check_out(call, "outHandle", out_handle)?;
            check_out(call, "outReq", out_req)?;
            let run = move |real: &'static Real, p: Ptr| {
                let f = need(call, real, real.fns.gin_barrier_create_requirement)?;
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { f(p, tm, n_barriers, out_handle, out_req) })
            };
            match target(call, comm)? {
                Target::Real(real, p) => pass(call, real, p, run),
                Target::Ours(c) => forward(call, c, c.ready(call)?, "the device API", "-", "-", run),
            }
        })
    }
}

export! {
    /// `ncclRedOpCreatePreMulSum`: made here (native calls): a host scalar
    /// (`ncclScalarHostImmediate`) is read now, a device one (`ncclScalarDevice`) by every
    /// call that uses the operation, when it runs.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut NcclRedOp, scalar: Ptr, datatype: NcclDataType, residence: c_int, comm: Ptr,
    ) -> NcclResult {
        guard("ncclRedOpCreatePreMulSum", || {
            let call = "ncclRedOpCreatePreMulSum";
            check_out(call, "op", op)?;
            check_out(call, "scalar", scalar)?;
            check_dtype(call, datatype)?;
            let dtype = types::native_dtype(datatype)
                .ok_or_else(|| Failure::arg(format!("{call}: invalid data type {datatype}")))?;
            let s = match residence {
                types::SCALAR_DEVICE => PreMulScalar::Device { dtype, ptr: scalar as u64 },
                types::SCALAR_HOST_IMMEDIATE => {
                    let mut bits = 0u64;
                    // SAFETY: NCCL's contract: `scalar` points at one element of `datatype`
                    // in host memory (checked non-null); at most 8 bytes into `bits`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            scalar as *const u8,
                            &mut bits as *mut u64 as *mut u8,
                            dtype.size(),
                        )
                    };
                    PreMulScalar::Host { dtype, bits }
                }
                r => {
                    return Err(Failure::arg(format!(
                        "{call}: invalid residence {r} (0: ncclScalarDevice, 1: ncclScalarHostImmediate)"
                    )));
                }
            };
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.red_op_create_pre_mul_sum)?(op, scalar, datatype, residence, p) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            let inner = c.ready(call)?;
            let made = inner.premul_ops.create(s).map_err(|e| Failure::arg(format!("{call}: {e}")))?;
            // SAFETY: checked non-null; the caller's output.
            unsafe { *op = made };
            Ok(result::SUCCESS)
        })
    }
}

export! {
    /// `ncclRedOpDestroy`: forgets an operation made by `ncclRedOpCreatePreMulSum` on this
    /// communicator (a built-in one, an unknown one or one destroyed already is an invalid
    /// argument).
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: NcclRedOp, comm: Ptr) -> NcclResult {
        guard("ncclRedOpDestroy", || {
            let call = "ncclRedOpDestroy";
            let run = move |real: &'static Real, p: Ptr| {
                // SAFETY: NCCL's signature, the caller's arguments.
                Ok(unsafe { need(call, real, real.fns.red_op_destroy)?(op, p) })
            };
            let c = match target(call, comm)? {
                Target::Real(real, p) => return pass(call, real, p, run),
                Target::Ours(c) => c,
            };
            let inner = c.ready(call)?;
            inner.premul_ops.destroy(op).map_err(|e| Failure::arg(format!("{call}: {e}")))?;
            Ok(result::SUCCESS)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs every rank's sends and receives of one group on host memory: a send from `a`
    /// to `b` pairs with `b`'s receive from `a` in call order (what the native group does),
    /// and each rank's ops must pass `plan_p2p`. Returns the number of bytes copied.
    fn emulate(all: &[Vec<P2pOp>]) -> usize {
        let parts = dispatch::parts;
        let mut moved = 0;
        for (r, ops) in all.iter().enumerate() {
            dispatch::plan_p2p(r, ops).unwrap_or_else(|e| panic!("rank {r}: {e}"));
            for (q, theirs) in all.iter().enumerate() {
                let sends: Vec<_> = ops.iter().map(parts).filter(|p| p.0 && p.3 == q).collect();
                let recvs: Vec<_> = theirs
                    .iter()
                    .map(parts)
                    .filter(|p| !p.0 && p.3 == r)
                    .collect();
                assert_eq!(sends.len(), recvs.len(), "{r} -> {q}: sends and receives");
                for (s, d) in sends.iter().zip(&recvs) {
                    assert_eq!(s.2, d.2, "{r} -> {q}: sizes");
                    // SAFETY: the test's own buffers, of the sizes the ops name; disjoint
                    // (a piece never goes to its own place: those ops are left out).
                    unsafe { std::ptr::copy_nonoverlapping(s.1 as *const u8, d.1 as *mut u8, s.2) };
                    moved += s.2;
                }
            }
        }
        moved
    }

    #[test]
    fn gather_and_scatter_spelled_as_sends_and_receives_move_every_piece_once() {
        for (n, count, dtype) in [
            (2, 5, DataType::F32),
            (3, 1, DataType::U8),
            (4, 7, DataType::F16),
        ] {
            let es = dtype.size();
            let piece = count * es;
            let byte = |r: usize, i: usize| (r * 31 + i * 7 + 1) as u8;
            for root in 0..n {
                for in_place in [false, true] {
                    // Gather: rank r's piece (its own buffer, or its slot of the root's
                    // output in place) lands in slot r of the root's output.
                    let mut outs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; n * piece]).collect();
                    let mut ins: Vec<Vec<u8>> = (0..n)
                        .map(|r| (0..piece).map(|i| byte(r, i)).collect())
                        .collect();
                    outs[root][root * piece..(root + 1) * piece].copy_from_slice(&ins[root]);
                    let all: Vec<Vec<P2pOp>> = (0..n)
                        .map(|r| {
                            let recv = outs[r].as_mut_ptr() as u64;
                            let send = if in_place && r == root {
                                recv + (r * piece) as u64
                            } else {
                                ins[r].as_mut_ptr() as u64
                            };
                            rooted_ops(
                                "t",
                                RootedKind::Gather,
                                r,
                                n,
                                root,
                                send,
                                recv,
                                count,
                                dtype,
                            )
                            .unwrap()
                        })
                        .collect();
                    let moved = emulate(&all);
                    let want: Vec<u8> = (0..n)
                        .flat_map(|r| (0..piece).map(move |i| byte(r, i)))
                        .collect();
                    assert_eq!(
                        outs[root], want,
                        "gather n={n} root={root} in_place={in_place}"
                    );
                    assert_eq!(moved, (n - in_place as usize) * piece, "gather bytes moved");
                    for (r, o) in outs.iter().enumerate().filter(|(r, _)| *r != root) {
                        assert!(o.iter().all(|&b| b == 0), "gather wrote rank {r}'s output");
                    }
                    // Scatter: slot q of the root's input lands in rank q's output (its own
                    // buffer, or, in place on the root, already there).
                    let mut src: Vec<u8> = (0..n)
                        .flat_map(|q| (0..piece).map(move |i| byte(q, i)))
                        .collect();
                    let mut outs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; piece]).collect();
                    let all: Vec<Vec<P2pOp>> = (0..n)
                        .map(|r| {
                            let send = src.as_mut_ptr() as u64;
                            let recv = if in_place && r == root {
                                send + (r * piece) as u64
                            } else {
                                outs[r].as_mut_ptr() as u64
                            };
                            let send = if r == root {
                                send
                            } else {
                                ins[r].as_mut_ptr() as u64
                            };
                            rooted_ops(
                                "t",
                                RootedKind::Scatter,
                                r,
                                n,
                                root,
                                send,
                                recv,
                                count,
                                dtype,
                            )
                            .unwrap()
                        })
                        .collect();
                    let moved = emulate(&all);
                    for q in 0..n {
                        let got = if in_place && q == root {
                            &src[q * piece..(q + 1) * piece]
                        } else {
                            &outs[q][..]
                        };
                        let want: Vec<u8> = (0..piece).map(|i| byte(q, i)).collect();
                        assert_eq!(got, &want[..], "scatter n={n} root={root} to {q}");
                    }
                    assert_eq!(
                        moved,
                        (n - in_place as usize) * piece,
                        "scatter bytes moved"
                    );
                }
            }
        }
        let none = rooted_ops("t", RootedKind::Gather, 0, 2, 1, 8, 16, 0, DataType::F32).unwrap();
        assert!(none.is_empty(), "nothing to move for count 0");
        let e = rooted_ops(
            "t",
            RootedKind::Scatter,
            1,
            2,
            1,
            8,
            16,
            usize::MAX / 4,
            DataType::F64,
        )
        .unwrap_err();
        assert_eq!(e.code, result::INVALID_ARGUMENT);
        assert!(
            rooted_ops(
                "t",
                RootedKind::Gather,
                0,
                8,
                1,
                8,
                16,
                1 << 20,
                DataType::F64
            )
            .is_ok()
        );
    }

    #[test]
    fn argument_checks() {
        assert!(check_dtype("t", 9).is_ok());
        assert_eq!(
            check_dtype("t", 12).unwrap_err().code,
            result::INVALID_ARGUMENT
        );
        assert_eq!(
            check_dtype("t", -1).unwrap_err().code,
            result::INVALID_ARGUMENT
        );
        assert!(check_op("t", None, 4).is_ok());
        assert_eq!(
            check_op("t", None, -3).unwrap_err().code,
            result::INVALID_ARGUMENT
        );
        assert!(check_rank("t", "root", 1, 2).is_ok());
        assert!(check_rank("t", "root", 2, 2).is_err());
        assert!(check_rank("t", "root", -1, 2).is_err());
        assert!(check_ptr("t", "x", std::ptr::null(), 0).is_ok());
        assert!(check_ptr("t", "x", std::ptr::null(), 1).is_err());
    }

    #[test]
    fn calls_on_null_or_unknown_comms_fail_cleanly() {
        let _l = crate::error::TEST_LOCK
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        // SAFETY: valid out-pointer; a null communicator.
        let r = unsafe { ncclCommCount(std::ptr::null_mut(), &mut n) };
        assert_eq!(r, result::INVALID_ARGUMENT);
        assert!(last_error().contains("comm is NULL"), "{}", last_error());
        // SAFETY: a bad data type is refused before anything is dereferenced.
        let r = unsafe {
            ncclAllReduce(
                std::ptr::null(),
                std::ptr::null_mut(),
                0,
                99,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, result::INVALID_ARGUMENT);
        assert!(last_error().contains("data type 99"), "{}", last_error());
        // SAFETY: a group without a start.
        assert_eq!(unsafe { ncclGroupEnd() }, result::INVALID_USAGE);
        // Ending a NULL communicator (a split's NOCOLOR child) is done already, as in NCCL.
        // SAFETY: NULL communicators.
        unsafe {
            assert_eq!(ncclCommFinalize(std::ptr::null_mut()), result::SUCCESS);
            assert_eq!(ncclCommDestroy(std::ptr::null_mut()), result::SUCCESS);
            assert_eq!(ncclCommAbort(std::ptr::null_mut()), result::SUCCESS);
        }
    }
}

#[cfg(test)]
mod team_tests {
    use super::*;

    #[test]
    fn team_ranks_follow_nccls_formula() {
        // World team of 8, this rank 5: team rank 2 is world rank 2.
        let world = world_team(8, 5);
        assert_eq!(
            world,
            Team {
                n_ranks: 8,
                rank: 5,
                stride: 1
            }
        );
        assert_eq!(team_rank_formula(5, world, 2), 2);
        // A strided team (every 4th rank, this rank its place 1 of 2): its place 0 is 5 - 4.
        let rail = Team {
            n_ranks: 2,
            rank: 1,
            stride: 4,
        };
        assert_eq!(team_rank_formula(5, rail, 0), 1);
        assert_eq!(team_rank_formula(5, rail, 1), 5);
        // Overflow gives -1 rather than a wrapped rank.
        let huge = Team {
            n_ranks: 2,
            rank: 0,
            stride: c_int::MAX,
        };
        assert_eq!(team_rank_formula(5, huge, 2), -1);
        // The rail team when the LSA team is every rank: this rank alone.
        assert_eq!(
            rail_team(8),
            Team {
                n_ranks: 1,
                rank: 0,
                stride: 8
            }
        );
        assert_eq!(team_rank_formula(5, rail_team(8), 0), 5);
    }
}
