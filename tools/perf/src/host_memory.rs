//! Host memory of a sweep on the Host transport. Without a GPU every rank's buffers are
//! host memory, and the ranks of one machine share it. Linux overcommits: each buffer
//! passes `try_reserve` on its own while the ranks together need more than the machine
//! has, and the run then grinds (or meets the OOM killer) instead of failing. So what the
//! machine's ranks need together for the sweep's largest size is compared with
//! `MemAvailable` before anything is allocated: by the tool before it launches its own
//! ranks, else by every rank. Device memory (a GPU's buffers) is not checked here.
//!
//! The ranks' shared memory (the collectives' scratch, reserved when the collectives are
//! set up) lives in `/dev/shm`, which can be much smaller than the machine's memory (64 MiB
//! in a container by default), so it is also compared with the space free there.

/// `MemAvailable` in bytes ([`mem_available`](crate::host::launch::mem_available));
/// `None` where it cannot be read (not Linux), and then nothing is checked.
pub(super) fn available() -> Option<u64> {
    crate::host::launch::mem_available()
}

/// What the ranks of one machine need for a sweep, and what they may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Need {
    /// The sweep's largest size (bytes, as given on the command line).
    pub size: u64,
    /// Host memory one rank holds at most for it (bytes).
    pub per_rank: u128,
    /// Ranks on this machine.
    pub ranks: usize,
}

impl Need {
    /// Ok when the ranks fit in `available` bytes; else the reason, naming the size, the
    /// need per rank, the ranks counted and `MemAvailable`.
    pub fn check(&self, available: u64) -> Result<(), String> {
        let ranks = self.ranks.max(1);
        let together = self.per_rank.saturating_mul(ranks as u128);
        if together <= u128::from(available) {
            return Ok(());
        }
        Err(format!(
            "the sweep's largest size, {} bytes, needs {} of host memory per rank on the Host \
             transport (send, receive and check buffers, and the collectives' scratch): {} for \
             the {ranks} ranks of this machine, which do not fit in this machine's memory \
             (MemAvailable {}); choose a smaller size (-b/-e) or fewer ranks",
            self.size,
            amount(self.per_rank),
            amount(together),
            amount(u128::from(available)),
        ))
    }
}

/// The size and free space of `/dev/shm`; `None` where it cannot be read, and then
/// nothing is checked.
pub(super) fn shm_space() -> Option<crate::host::transport::shm::ShmSpace> {
    crate::host::transport::shm::shm_space()
}

/// Ok when the shared memory of `ranks` ranks, `per_rank` bytes each (the collectives'
/// scratch), fits in the free space of `/dev/shm` (`space`); else the reason, naming the
/// need, `/dev/shm`'s size and free space, and how to raise it.
pub(super) fn check_shm(
    per_rank: u128,
    ranks: usize,
    space: crate::host::transport::shm::ShmSpace,
) -> Result<(), String> {
    let ranks = ranks.max(1);
    let together = per_rank.saturating_mul(ranks as u128);
    if together <= u128::from(space.free) {
        return Ok(());
    }
    Err(format!(
        "the Host transport keeps the collectives' scratch, {} per rank \
         (MSCCLPP_COLL_SCRATCH_BYTES), in /dev/shm: {} for the {ranks} ranks of this machine, \
         but /dev/shm holds {} with {} free; raise its size (a container: `docker run \
         --shm-size=<size>` or `--ipc=host`; else, as root, `mount -o remount,size=<size> \
         /dev/shm`), or set a smaller MSCCLPP_COLL_SCRATCH_BYTES, or run fewer ranks",
        amount(per_rank),
        amount(together),
        amount(u128::from(space.size)),
        amount(u128::from(space.free)),
    ))
}

/// `bytes` in binary units, one decimal (`1.5 GiB`).
pub(super) fn amount(bytes: u128) -> String {
    crate::host::transport::shm::bytes_text(bytes)
}
