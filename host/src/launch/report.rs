//! How a local launch ended: each rank's exit, with the threads (and stacks) of a rank the
//! launcher killed.

use std::process::ExitStatus;

#[cfg(doc)]
use super::LocalLauncher;

/// How one launched process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankExit {
    /// Its rank.
    pub rank: usize,
    /// Its exit status (after the kill, if it was killed).
    pub status: ExitStatus,
    /// Whether the launcher killed it at the timeout.
    pub killed_at_timeout: bool,
    /// The rank whose failure made the launcher stop this one, when it did
    /// ([`LocalLauncher::stop_after_failure`]).
    pub stopped_after: Option<usize>,
    /// When it was killed (at the timeout, or after another rank failed): its threads just
    /// before the kill, one line each
    /// (`name state wait-channel`, read from `/proc` on Linux: where a hung rank stood,
    /// e.g. `mscclpp-proxy-0 S futex_wait_queue`); else empty.
    pub threads: Vec<String>,
    /// With [`LocalLauncher::stacks`], when it was killed: every thread's stack just before
    /// the kill, read with `gdb` (a `thread "name" (LWP n)` line per thread, then its frames
    /// as `#n function at file:line`, cut to the innermost frame and ours), or one line
    /// saying why there are none; else empty.
    pub stacks: Vec<String>,
}

/// The threads of process `pid` as `name state wait-channel` lines (Linux `/proc`; empty
/// elsewhere or when the process is gone). The state is `R` running, `S` sleeping, `D`
/// uninterruptible; the wait channel is the kernel function a sleeping thread waits in
/// (`0` while running).
pub fn thread_states(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<(u64, String)> = tasks
        .filter_map(Result::ok)
        .filter_map(|t| {
            let tid = t.file_name().to_string_lossy().parse::<u64>().ok()?;
            let read = |f: &str| std::fs::read_to_string(t.path().join(f)).ok();
            let stat = read("stat")?;
            let (name, state) = crate::procfs::parse_stat(&stat)?;
            let wchan = read("wchan").unwrap_or_default();
            let wchan = if wchan.trim().is_empty() {
                "0"
            } else {
                wchan.trim()
            };
            Some((tid, format!("{name} {state} {wchan}")))
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, l)| l).collect()
}

/// How a whole launch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchReport {
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankExit>,
    /// With [`LocalLauncher::capture_output`]: every line the ranks printed, prefixed with
    /// `[rank N] ` (stdout lines of a rank, then its stderr lines; no prefix on the stdout of
    /// the rank named by [`LocalLauncher::unprefixed_stdout`]); else empty.
    pub output: Vec<String>,
}

impl RankExit {
    /// A rank that ended by itself with `status`.
    pub(super) fn ended(rank: usize, status: ExitStatus) -> RankExit {
        RankExit {
            rank,
            status,
            killed_at_timeout: false,
            stopped_after: None,
            threads: Vec::new(),
            stacks: Vec::new(),
        }
    }
}

impl LaunchReport {
    /// Whether every rank exited with status 0.
    pub fn success(&self) -> bool {
        self.ranks
            .iter()
            .all(|r| r.status.success() && !r.killed_at_timeout && r.stopped_after.is_none())
    }
}

impl std::fmt::Display for LaunchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in &self.ranks {
            write!(f, "[rank {}] {}", r.rank, r.status)?;
            if r.killed_at_timeout {
                f.write_str(" (killed at the launch timeout)")?;
            }
            if let Some(q) = r.stopped_after {
                write!(f, " (stopped by the launcher: rank {q} had failed)")?;
            }
            writeln!(f)?;
            if !r.threads.is_empty() {
                writeln!(
                    f,
                    "[rank {}] its threads before the kill: {}",
                    r.rank,
                    r.threads.join("; ")
                )?;
            }
            if !r.stacks.is_empty() {
                writeln!(f, "[rank {}] its stacks before the kill (gdb):", r.rank)?;
                for line in &r.stacks {
                    writeln!(f, "[rank {}]   {line}", r.rank)?;
                }
            }
        }
        Ok(())
    }
}

/// A failing status for a child whose status could not be read (it cannot be waited on).
pub(super) fn failed_status() -> ExitStatus {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        ExitStatus::from_raw(1 << 8)
    }
    #[cfg(not(unix))]
    {
        use std::os::windows::process::ExitStatusExt;
        ExitStatus::from_raw(1)
    }
}
