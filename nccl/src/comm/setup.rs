//! Setting communicators up: ours and the real NCCL's beside it (one rank, a group of them,
//! a child of a split or shrink), and the fall-back when ours cannot be made.

use super::*;

/// A copy of a caller's config (the fields of our 2.28 layout within its `size`), so that a
/// set-up deferred to `ncclGroupEnd` does not read the caller's memory later.
#[derive(Clone, Copy)]
pub struct ConfigCopy(Option<NcclConfig>);

// SAFETY: the two string pointers in a config are the caller's (valid through the set-up,
// as NCCL requires); the copy only carries them to the real NCCL.
unsafe impl Send for ConfigCopy {}

impl ConfigCopy {
    /// No config.
    pub const NONE: ConfigCopy = ConfigCopy(None);

    /// Copies `cfg` (already checked by `read_config`).
    ///
    /// # Safety
    /// `cfg` is null or a valid config of `size` bytes.
    pub unsafe fn new(cfg: *const NcclConfig) -> ConfigCopy {
        if cfg.is_null() {
            return ConfigCopy(None);
        }
        let ours = std::mem::size_of::<NcclConfig>();
        // SAFETY: the header is readable (caller contract).
        let size = unsafe { (*cfg).size }.min(ours);
        // SAFETY: all-zero bytes are a valid NcclConfig (integers and null pointers).
        let mut copy: NcclConfig = unsafe { std::mem::zeroed() };
        // SAFETY: `size` bytes are readable at `cfg` and writable in `copy`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                cfg.cast::<u8>(),
                (&mut copy as *mut NcclConfig).cast::<u8>(),
                size,
            )
        };
        copy.size = size;
        ConfigCopy(Some(copy))
    }
}

impl ConfigCopy {
    /// A child's config: `cfg` (a caller's config, checked by `read_config`), else, when it
    /// is NULL, `parent`'s (the one the parent was made with, as NCCL's children inherit it).
    ///
    /// # Safety
    /// `cfg` is null or a valid config of its `size` bytes.
    pub unsafe fn for_child(cfg: *const NcclConfig, parent: ConfigCopy) -> ConfigCopy {
        if cfg.is_null() {
            return parent;
        }
        // SAFETY: caller contract.
        unsafe { ConfigCopy::new(cfg) }
    }

    /// The copy without its two strings (`netName`, `commName`: the caller's memory, which
    /// NCCL reads during the call only), to keep beyond it.
    pub(super) fn without_strings(&self) -> ConfigCopy {
        ConfigCopy(self.0.map(|mut c| {
            c.net_name = std::ptr::null();
            c.comm_name = std::ptr::null();
            c
        }))
    }

    /// The copy with `blocking` set (NCCL's initializer where there was no config).
    pub(super) fn blocking(self) -> NcclConfig {
        let mut c = self.0.unwrap_or_else(NcclConfig::initializer);
        c.blocking = 1;
        // A short (older) config that ends before the field grows to hold it.
        c.size = c.size.max(std::mem::offset_of!(NcclConfig, blocking) + 4);
        c
    }
}

/// How long a real split or shrink that answered "in progress" may take to settle.
pub(super) const CHILD_WAIT: Duration = Duration::from_secs(120);

/// Whether the real communicator `comm`'s work in progress (a nonblocking split's) has
/// settled within `limit`, polling `ncclCommGetAsyncError`.
pub(super) fn settles(real: &Real, comm: RealComm, limit: Duration) -> bool {
    let Some(f) = real.fns.comm_get_async_error else {
        return false;
    };
    let start = std::time::Instant::now();
    loop {
        let mut state: c_int = result::IN_PROGRESS;
        // SAFETY: NCCL's signature; the real communicator; a live out-parameter.
        let r = unsafe { f(comm.0, &mut state) };
        if r != result::SUCCESS || state != result::IN_PROGRESS {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Which real call makes a child communicator.
pub enum RealChild {
    /// `ncclCommSplit(parent, color, key, ..)`.
    Split {
        /// The caller's color.
        color: c_int,
        /// The caller's key.
        key: c_int,
    },
    /// `ncclCommShrink(parent, exclude, .., flags)`.
    Shrink {
        /// The ranks left out.
        exclude: Vec<c_int>,
        /// The caller's shrink flags.
        flags: c_int,
    },
}

/// Makes the real NCCL's child of `parent` (split or shrink, collective over the parent's
/// ranks), done when this returns: on a thread of its own with `gpu`'s context current, and
/// with `blocking` 1 in the config it gets (`cfg`'s other settings kept: the caller's, or
/// the parent's, see [`ConfigCopy::for_child`]). The real NCCL writes the child's handle when
/// the child is made: inside a group (the real NCCL's group is per thread, and ours is
/// mirrored on it) that is at the real `ncclGroupEnd`, and for a nonblocking parent (whose
/// mode a split takes, whatever the child's config says) later still: both after the call
/// has returned, with no child for our communicator. Parents are blocking (`create_real`),
/// and the thread has no group. Should the real NCCL still answer "in progress", its work is
/// waited for (at most `CHILD_WAIT`), and the slot it writes into outlives it. `None`: the
/// real NCCL made none for this rank.
pub fn real_child(
    call: &str,
    real: &'static Real,
    parent: RealComm,
    gpu: &Gpu,
    cfg: ConfigCopy,
    how: RealChild,
) -> Result<Option<RealComm>, Failure> {
    let (split, shrink) = match &how {
        RealChild::Split { .. } => (
            Some(crate::system_nccl::need(call, real, real.fns.comm_split)?),
            None,
        ),
        RealChild::Shrink { .. } => (
            None,
            Some(crate::system_nccl::need(call, real, real.fns.comm_shrink)?),
        ),
    };
    let gpu = gpu.clone();
    let job = move || -> Result<(NcclResult, RealComm), CudaError> {
        // The whole handle (Send), not its pointer field alone.
        let parent: RealComm = parent;
        gpu.bind()?;
        let mut cfg = cfg.blocking();
        // On the heap: if the real NCCL still answers "in progress" (its split takes the
        // parent's mode, and `create_real` makes parents blocking, so it should not), it
        // writes the handle later; the slot is then kept for that write (below).
        let out: Box<Ptr> = Box::new(std::ptr::null_mut());
        let slot = Box::into_raw(out);
        let r = match (how, split, shrink) {
            // SAFETY: NCCL's signature; the parent is the real NCCL's; `slot` lives until
            // the real NCCL has written it (below); `cfg` through the call, which is
            // outside any group (a thread of its own) and blocking (above), so the real
            // NCCL has copied the config when it returns.
            (RealChild::Split { color, key }, Some(f), _) => unsafe {
                f(parent.0, color, key, slot, &mut cfg)
            },
            (RealChild::Shrink { mut exclude, flags }, _, Some(f)) => {
                let n = exclude.len() as c_int;
                // SAFETY: as above; `exclude` holds `n` ranks.
                unsafe { f(parent.0, exclude.as_mut_ptr(), n, slot, &mut cfg, flags) }
            }
            _ => result::INTERNAL_ERROR,
        };
        let done = r != result::IN_PROGRESS || settles(real, parent, CHILD_WAIT);
        if !done {
            // The real NCCL may still write the slot: it stays (8 bytes), and this rank's
            // child has no real communicator.
            return Ok((r, RealComm(std::ptr::null_mut())));
        }
        // SAFETY: from Box::into_raw above; the real NCCL is done with it (it returned, or
        // its work settled).
        let out = unsafe { Box::from_raw(slot) };
        Ok((r, RealComm(*out)))
    };
    let done = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("mscclpp-nccl-child".into())
            .spawn_scoped(s, job)
            .map(|h| h.join())
    });
    let (code, child) = match done {
        Err(e) => {
            return Err(Failure::new(
                result::SYSTEM_ERROR,
                format!("{call}: starting a thread for the real NCCL's child: {e}"),
            ));
        }
        Ok(Err(_)) => {
            return Err(Failure::new(
                result::INTERNAL_ERROR,
                format!("{call}: the real NCCL's child: its thread panicked"),
            ));
        }
        Ok(Ok(Err(e))) => {
            return Err(Failure::new(
                result::UNHANDLED_CUDA_ERROR,
                format!("{call}: {e}"),
            ));
        }
        Ok(Ok(Ok(v))) => v,
    };
    real_result(call, real, parent.0, code)?;
    Ok((!child.0.is_null()).then_some(child))
}

/// How the real communicator of a new communicator comes about.
pub enum RealSetup {
    /// Rank 0 gets a real unique id and broadcasts it over our bootstrap; every rank calls
    /// the real `ncclCommInitRankConfig`.
    Create(ConfigCopy),
    /// Already made (by a real split or shrink).
    Given(Option<RealComm>, Option<String>),
}

/// Sets up a communicator (collective over the ranks of `id`): the bootstrap, the real
/// NCCL's communicator, then ours. When ours fails on some rank and every rank has a real
/// communicator, the communicator runs on the real NCCL alone ([`crate::setup_fallback`]). Runs on a
/// thread where `gpu`'s context is (made) current.
pub fn set_up(
    call: &str,
    nranks: usize,
    rank: usize,
    id: UniqueId,
    gpu: &Gpu,
    real_setup: RealSetup,
) -> Result<Inner, Failure> {
    gpu.bind()
        .map_err(|e| Failure::new(result::UNHANDLED_CUDA_ERROR, format!("{call}: {e}")))?;
    let config = CommConfig {
        bootstrap: bootstrap_config(call)?,
        ..CommConfig::default()
    };
    let root = bootstrap_root(id, env_comm_id(call, &config.bootstrap)?);
    let bootstrap =
        BlockingBootstrap::init_with_config(nranks, rank, root, config.bootstrap.clone())
            .map_err(|e| Failure::from_comm(call, &e.into()))?;
    let (mut fallback, strict) = agree_fallback(call, &bootstrap)?;
    // The real communicator first, so that it is there if ours cannot be made.
    let (real, real_missing) = match real_setup {
        RealSetup::Given(r, why) => (r, why),
        RealSetup::Create(cfg) => match create_real(call, &bootstrap, cfg) {
            Ok(made) => made,
            Err(f) => {
                // Said as this rank's bootstrap closes (it drops with the error).
                let why = format!(
                    "creating its real NCCL communicator failed on it: {}",
                    f.msg
                );
                bootstrap.as_async().set_leaving_why(&why);
                return Err(f);
            }
        },
    };
    let deadline = config.bootstrap.timeout;
    let coll = match make_ours(bootstrap, gpu, config) {
        Ok((coll, None)) => coll,
        Ok((coll, Some(why))) => {
            fallback.p2p_off = true;
            log::warn(&format!(
                "rank {rank}/{nranks}: sends and receives (and gather, scatter) go to the real \
                 NCCL{}: {why}",
                if real.is_some() {
                    ""
                } else {
                    ", which is unavailable, so they fail"
                }
            ));
            coll
        }
        Err(e) => return fall_back(call, rank, nranks, real, real_missing, strict, deadline, &e),
    };
    log_set_up(&coll, gpu, (rank, nranks), &fallback, &real, &real_missing);
    Ok(Inner::new(Ok(coll), real, real_missing, fallback))
}

/// The operations forwarded to the real NCCL (`MSCCLPP_NCCL_FALLBACK`, the union over the
/// ranks), and whether a set-up failure of ours is fatal (strict on some rank).
fn agree_fallback(call: &str, bootstrap: &BlockingBootstrap) -> Result<(Fallback, bool), Failure> {
    let boot = |e: mscclpp_host::bootstrap::BootstrapError| Failure::from_comm(call, &e.into());
    let mut fallback = Fallback::parse(&settings_of(call)?.nccl_fallback.join(","));
    if !fallback.unknown.is_empty() {
        log::warn(&format!(
            "MSCCLPP_NCCL_FALLBACK: unknown operation(s) {:?} (known: all, allreduce, \
             allgather, reducescatter, broadcast, reduce, alltoall, sendrecv)",
            fallback.unknown
        ));
    }
    // Every rank must send a call the same way (see `dispatch`): a call forwarded on any
    // rank is forwarded on all. Likewise a set-up failure of ours is fatal if any rank
    // says so.
    let strict_here = !setup_fallback::enabled();
    let agreed = bootstrap
        .all_gather(&[fallback.mask, strict_here as u8])
        .map_err(boot)?;
    let union = agreed
        .iter()
        .fold(0, |m, b| m | b.first().copied().unwrap_or(0));
    let strict = agreed.iter().any(|b| b.get(1).is_some_and(|&s| s != 0));
    if union != fallback.mask {
        log::warn(&format!(
            "MSCCLPP_NCCL_FALLBACK differs between the ranks: forwarding what any rank names \
             (mask {union:#x}, this rank {:#x})",
            fallback.mask
        ));
        fallback.mask = union;
    }
    Ok((fallback, strict))
}

/// Our communicator and collectives over `bootstrap`, once every rank has them, with why
/// sends and receives go to the real NCCL when any rank says they must (ours cannot reach
/// some ranks on other hosts).
fn make_ours(
    bootstrap: BlockingBootstrap,
    gpu: &Gpu,
    config: CommConfig,
) -> Result<(Collectives, Option<String>), mscclpp_host::communicator::CommError> {
    Communicator::from_bootstrap(bootstrap, Backend::Gpu(gpu.clone()), config)
        .and_then(|comm| match CollConfig::from_env() {
            Ok(c) => Collectives::new(comm, c),
            Err(e) => {
                let why = format!("reading its collectives' settings failed on it: {e}");
                comm.bootstrap().as_async().set_leaving_why(&why);
                Err(e)
            }
        })
        .and_then(|coll| {
            // Ours is up on every rank only once every rank says so; in the same step the
            // ranks agree whether sends and receives go to the real NCCL (ours cannot reach
            // some ranks on other hosts).
            let off = coll.send_recv_across_hosts_off();
            let said = coll
                .communicator()
                .bootstrap()
                .all_gather(&[off.is_some() as u8])?;
            let any = said.iter().any(|b| b.first().is_some_and(|&o| o != 0));
            Ok((
                coll,
                any.then(|| off.unwrap_or_else(|| "so says another rank".into())),
            ))
        })
}

/// Logs a communicator that is up: where it runs, what runs natively and what the
/// fall-back is.
fn log_set_up(
    coll: &Collectives,
    gpu: &Gpu,
    (rank, nranks): (usize, usize),
    fallback: &Fallback,
    real: &Option<RealComm>,
    real_missing: &Option<String>,
) {
    // Across hosts, say on which: a simulated split (MSCCLPP_SIMULATE_HOSTS) shows here.
    let hosts = match coll.hosts() {
        1 => String::new(),
        n => format!(
            ", host {} (one of {n})",
            coll.communicator()
                .bootstrap()
                .as_async()
                .host_id(rank)
                .unwrap_or("?")
        ),
    };
    log::info(&format!(
        "rank {rank}/{nranks} on CUDA device {} ({}){hosts}: native {}; fallback: {}",
        gpu.info().ordinal,
        gpu.info().name,
        fallback.native_names(),
        match (real, real_missing, system_nccl::real_opt()) {
            (Some(_), _, Some(r)) => format!("{} (version {})", r.path, r.version),
            (_, Some(why), _) => format!("unavailable: {why}"),
            _ => "unavailable".into(),
        }
    ));
}

/// After our set-up failed with `e` on this rank (or a peer's failure reached it): the
/// communicator on the real NCCL alone when there is a real communicator and no rank is
/// strict, else the failure (the real communicator aborted).
#[allow(clippy::too_many_arguments)]
pub(super) fn fall_back(
    call: &str,
    rank: usize,
    nranks: usize,
    real: Option<RealComm>,
    real_missing: Option<String>,
    strict: bool,
    deadline: std::time::Duration,
    e: &mscclpp_host::communicator::CommError,
) -> Result<Inner, Failure> {
    let mut own = Failure::from_comm(call, e);
    let (Some(rc), Ok(r), false) = (real, system_nccl::real(), strict) else {
        if let (Some(rc), Ok(r)) = (real, system_nccl::real())
            && let Some(abort) = r.fns.comm_abort
        {
            // SAFETY: NCCL's signature; the real communicator, not used after this.
            let _ = unsafe { abort(rc.0) };
        }
        own.msg = match (strict, real_missing) {
            (true, _) => format!(
                "{} (not falling back to the real NCCL: {}=0 on some rank)",
                own.msg,
                setup_fallback::SETUP_FALLBACK_ENV
            ),
            (false, Some(why)) => format!("{} (no real NCCL to fall back to: {why})", own.msg),
            (false, None) => own.msg,
        };
        return Err(own);
    };
    let mine = setup_fallback::encode_report(setup_fallback::is_peer_loss(e), &e.to_string());
    let reports = setup_fallback::gather_reports(call, r, rc, rank, nranks, &mine, deadline)
        .map_err(|f| {
            Failure::new(
                own.code,
                format!(
                    "{}; and falling back to the real NCCL failed: {}",
                    own.msg, f.msg
                ),
            )
        })?;
    let why = setup_fallback::summarize(&reports);
    log::warn(&format!(
        "rank {rank}/{nranks}: mscclpp could not set up this communicator ({why}); every call \
         on it runs on the real NCCL ({}, version {})",
        r.path, r.version
    ));
    Ok(Inner::real_only(rc, why))
}

/// Creates the real communicator when every rank has a real NCCL (agreed over `bs`);
/// `(None, why)` otherwise.
pub(super) fn create_real(
    call: &str,
    bs: &BlockingBootstrap,
    cfg: ConfigCopy,
) -> Result<(Option<RealComm>, Option<String>), Failure> {
    let boot = |e: mscclpp_host::bootstrap::BootstrapError| Failure::from_comm(call, &e.into());
    let mine = system_nccl::real();
    let have = bs.all_gather(&[mine.is_ok() as u8]).map_err(boot)?;
    let Ok(real) = mine else {
        return Ok((None, Some(mine.err().unwrap_or_default().to_string())));
    };
    let without: Vec<usize> = (0..have.len())
        .filter(|&r| have[r].first() != Some(&1))
        .collect();
    if !without.is_empty() {
        return Ok((None, Some(format!("no real NCCL on rank(s) {without:?}"))));
    }
    let mut id = RawUniqueId { internal: [0; 128] };
    let mut payload = Vec::new();
    if bs.rank() == 0 {
        let get = real.fns.get_unique_id.expect("checked at load");
        // SAFETY: NCCL's signature; `id` is a live out-parameter.
        let r = unsafe { get(&mut id) };
        if r == result::SUCCESS {
            payload = id.internal.iter().map(|&c| c as u8).collect();
        }
    }
    let got = bs.broadcast(0, &payload).map_err(boot)?;
    if got.len() != 128 {
        return Err(Failure::new(
            result::SYSTEM_ERROR,
            format!(
                "{call}: rank 0 could not get a unique id from the real NCCL: {}",
                // SAFETY: null is allowed.
                unsafe { real.last_error(std::ptr::null_mut()) }
            ),
        ));
    }
    for (d, s) in id.internal.iter_mut().zip(&got) {
        *d = *s as _;
    }
    let mut out: Ptr = std::ptr::null_mut();
    let (n, r) = (bs.nranks() as c_int, bs.rank() as c_int);
    // Blocking, whatever the caller's config (or NCCL_COMM_BLOCKING) says: our calls block
    // anyway, and a nonblocking real communicator would make its splits and shrinks
    // nonblocking too (they take the parent's mode), writing their child's handle later.
    let mut blocking = cfg.blocking();
    let code = match real.fns.comm_init_rank_config {
        Some(f) => {
            // SAFETY: NCCL's signature; out-pointer to a local, a config alive here.
            unsafe { f(&mut out, n, id, r, &mut blocking) }
        }
        None => {
            let f = real.fns.comm_init_rank.expect("checked at load");
            // SAFETY: NCCL's signature; out-pointer to a local.
            unsafe { f(&mut out, n, id, r) }
        }
    };
    real_result(call, real, std::ptr::null_mut(), code)?;
    Ok((Some(RealComm(out)), None))
}

/// Runs `set_up` for several ranks of this process at once (one thread each, each on its
/// own GPU), as `ncclCommInitAll` and a group of set-ups need.
pub fn set_up_many(
    call: &str,
    jobs: Vec<(usize, usize, UniqueId, Gpu, ConfigCopy)>,
) -> Vec<Result<Inner, Failure>> {
    /// A result carried back across threads.
    struct Carry(Result<Inner, Failure>);
    // SAFETY: see `Comm`'s Send: the inner is only handed from the set-up thread to ours.
    unsafe impl Send for Carry {}
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(nranks, rank, id, gpu, cfg)| {
                s.spawn(move || Carry(set_up(call, nranks, rank, id, &gpu, RealSetup::Create(cfg))))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(c) => c.0,
                Err(_) => Err(Failure::new(
                    result::INTERNAL_ERROR,
                    format!("{call}: a set-up thread panicked"),
                )),
            })
            .collect()
    })
}
