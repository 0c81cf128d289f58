//! Making communicators: unique ids, `ncclCommInitRank*`, `ncclCommInitAll`, splits
//! and shrinks.

use std::ffi::{c_char, c_int};

use mscclpp_host::bootstrap::BootstrapConfig;

use crate::comm::{
    self, Comm, ConfigCopy, Inner, RealChild, RealSetup, decode_color_key, encode_color_key,
    new_id, null, parse_id, register,
};
use crate::error::{Failure, guard};
use crate::group;
use crate::log;
use crate::system_nccl::{self, Ptr, RawUniqueId, need};
use crate::types::{
    NcclConfig, NcclResult, SPLIT_NOCOLOR, read_config, result, shrink_members, split_members,
};

use super::state::revoke_ours;
use super::{Target, check_out, check_ptr, check_rank, pass, target};

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
            let (real_new, real_missing) = match (inner.real, system_nccl::real()) {
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
            let (real_new, real_missing) = match (inner.real, system_nccl::real()) {
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
    real_new: Option<system_nccl::RealComm>,
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
            let real = system_nccl::real().map_err(|e| Failure::usage(format!("{call}: {e}")))?;
            let ask =
                |what: &str, f: Option<unsafe extern "C" fn(Ptr, *mut c_int) -> NcclResult>| {
                    let f = need(call, real, f)?;
                    let mut v: c_int = 0;
                    // SAFETY: NCCL's signature; the real child, an out-pointer to a local.
                    system_nccl::real_result(call, real, rc.0, unsafe { f(rc.0, &mut v) })
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
