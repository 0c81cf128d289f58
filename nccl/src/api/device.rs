//! NCCL's device API on the host side: device communicators, their properties, teams
//! and requirements.

use std::ffi::{c_int, c_void};

use crate::comm::{Comm, Handle, lookup};
use crate::error::guard;
use crate::system_nccl::{self, Ptr, Real, Team, need};
use crate::types::NcclResult;

use super::{Target, check_out, forward, pass, target};

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
        let f = system_nccl::real().ok().and_then(&pick);
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

#[cfg(test)]
mod tests {
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
