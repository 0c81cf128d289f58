//! Ranks bound to a share of the launcher's CPUs each, as `mpirun` binds two ranks to a
//! core each by default: a rank's threads (its kernel's, its proxy's, its sockets'
//! receivers) then hand work to each other on their own cores instead of being spread
//! over the others' by the scheduler.

use std::process::Command;

/// The CPUs each of `n` ranks gets of `allowed` (in its order): contiguous shares, sizes
/// differing by at most one; `None` when there are fewer CPUs than ranks (sharing CPUs,
/// the ranks are left to the scheduler).
pub(super) fn shares(allowed: &[usize], n: usize) -> Option<Vec<Vec<usize>>> {
    let c = allowed.len();
    if n == 0 || c < n {
        return None;
    }
    Some(
        (0..n)
            .map(|r| allowed[r * c / n..(r + 1) * c / n].to_vec())
            .collect(),
    )
}

/// The CPUs this thread may run on, in order (empty where that cannot be read).
#[cfg(target_os = "linux")]
pub(super) fn allowed_cpus() -> Vec<usize> {
    use rustix::thread::{CpuSet, sched_getaffinity};
    sched_getaffinity(None).map_or_else(
        |_| Vec::new(),
        |set| (0..CpuSet::MAX_CPU).filter(|&i| set.is_set(i)).collect(),
    )
}

/// Elsewhere: none known (no binding).
#[cfg(not(target_os = "linux"))]
pub(super) fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

/// Makes the child `cmd` starts run on `cpus` only, from before it runs anything (its
/// threads inherit it). Best effort: a binding the system refuses leaves the child
/// unbound. Elsewhere than on Linux: nothing.
#[cfg(target_os = "linux")]
pub(super) fn bind(cmd: &mut Command, cpus: &[usize]) {
    use rustix::thread::{CpuSet, sched_setaffinity};
    use std::os::unix::process::CommandExt;
    let mut set = CpuSet::new();
    for &c in cpus.iter().filter(|&&c| c < CpuSet::MAX_CPU) {
        set.set(c);
    }
    let hook = move || {
        // A refusal (a CPU gone offline since) leaves the rank unbound: not worth failing
        // its start for.
        let _ = sched_setaffinity(None, &set);
        Ok(())
    };
    // SAFETY: the hook makes one raw system call (sched_setaffinity on a set built before
    // the fork) and allocates nothing: async-signal-safe, as the child between fork and
    // exec requires.
    unsafe { cmd.pre_exec(hook) };
}

/// Elsewhere: nothing.
#[cfg(not(target_os = "linux"))]
pub(super) fn bind(_cmd: &mut Command, _cpus: &[usize]) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank gets CPUs, no CPU goes to two ranks, all are used, in order; fewer CPUs
    /// than ranks bind nothing.
    #[test]
    fn ranks_get_contiguous_disjoint_shares_of_the_cpus() {
        assert_eq!(shares(&[0, 1], 2), Some(vec![vec![0], vec![1]]));
        assert_eq!(shares(&[2, 5, 7], 2), Some(vec![vec![2], vec![5, 7]]));
        assert_eq!(
            shares(&[0, 1, 2, 3, 4, 5, 6, 7], 3),
            Some(vec![vec![0, 1], vec![2, 3, 4], vec![5, 6, 7]])
        );
        assert_eq!(shares(&[0], 2), None);
        assert_eq!(shares(&[], 1), None);
        assert_eq!(shares(&[0, 1], 0), None);
        for n in 1..=16 {
            let cpus: Vec<usize> = (0..16).collect();
            let got = shares(&cpus, n).unwrap();
            assert!(got.iter().all(|s| !s.is_empty()), "{n} ranks");
            assert_eq!(got.concat(), cpus, "{n} ranks");
        }
    }
}
