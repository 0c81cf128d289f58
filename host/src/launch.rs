//! Launch conventions: who am I, how many are we, where is the root; and a local launcher.
//!
//! [`Launch::from_env`] understands the variables of six launchers; the first convention
//! with any of its variables set decides (so MPI launchers inside a Slurm allocation win over
//! the allocation's own `SLURM_*`):
//!
//! | convention | rank | nranks | local rank |
//! |---|---|---|---|
//! | ours | `MSCCLPP_RANK` | `MSCCLPP_NRANKS` | `MSCCLPP_LOCAL_RANK` |
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | Open MPI | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//! | MVAPICH2 | `MV2_COMM_WORLD_RANK` | `MV2_COMM_WORLD_SIZE` | `MV2_COMM_WORLD_LOCAL_RANK` |
//! | MPICH (Hydra), Intel MPI | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID`, else `PMI_LOCAL_RANK` |
//! | Slurm | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//!
//! A partial set (a rank without its number of ranks, or the reverse, or a local rank
//! alone) is an error naming the missing variable, never a job of one.
//!
//! The root comes from `MSCCLPP_BOOTSTRAP` (a unique id or `ip:port`), else from torchrun's
//! `MASTER_ADDR` with port `MSCCLPP_BOOTSTRAP_PORT`, or `MASTER_PORT + 1` by default (rank
//! 0 then runs the root there): torch's own store already listens on `MASTER_PORT`, and
//! every rank computes the same port without talking. `MSCCLPP_BOOTSTRAP_TIMEOUT` (seconds)
//! sets the bootstrap timeout, `MSCCLPP_RENDEZVOUS_TIMEOUT` how far apart the ranks may
//! reach the root. With an `ip:port` root, `MSCCLPP_BOOTSTRAP_SECRET` (read by
//! the bootstrap, see [`BootstrapConfig::secret`]) authenticates the ranks.
//!
//! [`LocalLauncher`] starts N processes on this machine with our variables set, forwards
//! their output with a `[rank N] ` prefix and reports how each ended, killing them all at
//! its timeout.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::bootstrap::{
    BlockingBootstrap, Bootstrap, BootstrapConfig, BootstrapError, BootstrapRoot, ENV_JOB_ID, Root,
};
use crate::settings::{Settings, SettingsError};

/// Our rank variable.
pub const ENV_RANK: &str = "MSCCLPP_RANK";
/// Our number-of-ranks variable.
pub const ENV_NRANKS: &str = "MSCCLPP_NRANKS";
/// Our local-rank variable.
pub const ENV_LOCAL_RANK: &str = "MSCCLPP_LOCAL_RANK";
/// Our root variable: a unique id or `ip:port`.
pub const ENV_BOOTSTRAP: &str = "MSCCLPP_BOOTSTRAP";
/// Bootstrap timeout in seconds (fractions allowed).
pub const ENV_BOOTSTRAP_TIMEOUT: &str = "MSCCLPP_BOOTSTRAP_TIMEOUT";
/// How long the rendezvous may take, in seconds (fractions allowed): the time between the
/// first rank and the last reaching the root
/// ([`BootstrapConfig::rendezvous_timeout`](crate::bootstrap::BootstrapConfig::rendezvous_timeout)).
/// Default: the bootstrap timeout; in the NCCL library, 30 minutes.
pub const ENV_RENDEZVOUS_TIMEOUT: &str = "MSCCLPP_RENDEZVOUS_TIMEOUT";
/// Port of the root on `MASTER_ADDR` (torchrun), instead of `MASTER_PORT` +
/// [`MASTER_PORT_OFFSET`].
pub const ENV_BOOTSTRAP_PORT: &str = "MSCCLPP_BOOTSTRAP_PORT";
/// With `MASTER_ADDR`/`MASTER_PORT` and no `MSCCLPP_BOOTSTRAP_PORT`, the root listens on
/// `MASTER_PORT` plus this: `MASTER_PORT` itself is torch's store.
pub const MASTER_PORT_OFFSET: u16 = 1;

/// The launcher whose variables were used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchSource {
    /// `MSCCLPP_*`.
    Mscclpp,
    /// torchrun (`RANK`, `WORLD_SIZE`, ...).
    Torchrun,
    /// Open MPI (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// MVAPICH2 (`MV2_COMM_WORLD_*`).
    Mvapich,
    /// A PMI launcher: MPICH's Hydra `mpiexec`, Intel MPI (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
    /// Slurm (`SLURM_PROCID`, ...).
    Slurm,
}

struct Convention {
    source: LaunchSource,
    rank: &'static str,
    nranks: &'static str,
    /// Local-rank variables, the first set one wins.
    local_rank: &'static [&'static str],
}

mod stacks;

/// How long [`LocalLauncher::stacks`] gives `gdb` per rank (a loaded 2-core CI machine
/// took more than 30 s for a rank of 26 threads).
const STACKS_LIMIT: Duration = Duration::from_secs(60);

const CONVENTIONS: [Convention; 6] = [
    Convention {
        source: LaunchSource::Mscclpp,
        rank: ENV_RANK,
        nranks: ENV_NRANKS,
        local_rank: &[ENV_LOCAL_RANK],
    },
    Convention {
        source: LaunchSource::Torchrun,
        rank: "RANK",
        nranks: "WORLD_SIZE",
        local_rank: &["LOCAL_RANK"],
    },
    Convention {
        source: LaunchSource::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        nranks: "OMPI_COMM_WORLD_SIZE",
        local_rank: &["OMPI_COMM_WORLD_LOCAL_RANK"],
    },
    // Before PMI: MVAPICH2 under Hydra sets both.
    Convention {
        source: LaunchSource::Mvapich,
        rank: "MV2_COMM_WORLD_RANK",
        nranks: "MV2_COMM_WORLD_SIZE",
        local_rank: &["MV2_COMM_WORLD_LOCAL_RANK"],
    },
    // Before Slurm: mpiexec inside an allocation also sees the batch step's SLURM_PROCID.
    Convention {
        source: LaunchSource::Pmi,
        rank: "PMI_RANK",
        nranks: "PMI_SIZE",
        local_rank: &["MPI_LOCALRANKID", "PMI_LOCAL_RANK"],
    },
    Convention {
        source: LaunchSource::Slurm,
        rank: "SLURM_PROCID",
        nranks: "SLURM_NTASKS",
        local_rank: &["SLURM_LOCALID"],
    },
];

/// Errors of [`Launch`] and [`LocalLauncher`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// No launcher variables at all: the process was started alone.
    #[error(
        "not started by a launcher: set MSCCLPP_RANK and MSCCLPP_NRANKS (or run under torchrun, mpirun, mpiexec or srun)"
    )]
    NotLaunched,
    /// A launcher variable is set without the one it needs (a rank without the number of
    /// ranks, a local rank without a rank, ...): a partial launch, not a job of one.
    #[error("{found} is set but {missing} is not (a partial set of launcher variables)")]
    Incomplete {
        /// The variable found.
        found: &'static str,
        /// Its missing partner.
        missing: &'static str,
    },
    /// A variable that should be a number is not.
    #[error("{var}={value:?} is not a non-negative integer")]
    BadNumber {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The rank is not below the number of ranks.
    #[error("{rank_var}={rank} is out of range for {nranks_var}={nranks}")]
    RankOutOfRange {
        /// Rank variable.
        rank_var: &'static str,
        /// Its value.
        rank: usize,
        /// Number-of-ranks variable.
        nranks_var: &'static str,
        /// Its value.
        nranks: usize,
    },
    /// No root address.
    #[error(
        "no bootstrap root: ranks come from {launcher:?} variables, but neither MSCCLPP_BOOTSTRAP (a unique id or ip:port) nor MASTER_ADDR and MASTER_PORT is set{hint}"
    )]
    MissingRoot {
        /// Where rank and nranks came from.
        launcher: LaunchSource,
        /// How to pass it with that launcher.
        hint: &'static str,
    },
    /// The root variable cannot be used.
    #[error("{var}={value:?}: {reason}")]
    BadRoot {
        /// The variable.
        var: &'static str,
        /// Its value (cut short where it may hold a unique id's secret).
        value: String,
        /// Why.
        reason: String,
    },
    /// A setting of ours (`MSCCLPP_*`: a number, a timeout, a port) does not parse.
    #[error("{0}")]
    Settings(#[from] SettingsError),
    /// The launcher could not find its own executable.
    #[error("cannot find the current executable: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// A process could not be started.
    #[error("cannot start rank {rank} ({program}): {source}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The launcher's root could not be started.
    #[error("cannot start the bootstrap root: {0}")]
    Root(#[from] BootstrapError),
}

/// What a launcher told this process.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Launch {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub nranks: usize,
    /// Rank on this node, if the launcher said.
    pub local_rank: Option<usize>,
    /// Where the root is.
    pub root: BootstrapRoot,
    /// Bootstrap timeout, if `MSCCLPP_BOOTSTRAP_TIMEOUT` is set.
    pub timeout: Option<Duration>,
    /// Rendezvous timeout, if `MSCCLPP_RENDEZVOUS_TIMEOUT` is set.
    pub rendezvous_timeout: Option<Duration>,
    /// Whose variables gave rank and nranks.
    pub source: LaunchSource,
}

impl Launch {
    /// Reads the process's settings ([`Settings::global`]) and the other launchers'
    /// variables from the process environment.
    pub fn from_env() -> Result<Launch, LaunchError> {
        Launch::from_settings(Settings::global()?, |name| std::env::var(name).ok())
    }

    /// Reads variables through `get` (so tests need not touch the process environment):
    /// ours as [`Settings::from_lookup`] reads them, the other launchers' as they are.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Launch, LaunchError> {
        let settings = Settings::from_lookup(&get)?;
        Launch::from_settings(&settings, get)
    }

    /// Reads our variables from `settings` ([`Settings::rank`], [`Settings::nranks`],
    /// [`Settings::local_rank`], [`Settings::bootstrap`], [`Settings::bootstrap_port`] and
    /// the two timeouts) and the other launchers' through `other`.
    pub fn from_settings(
        settings: &Settings,
        other: impl Fn(&str) -> Option<String>,
    ) -> Result<Launch, LaunchError> {
        // Ours come parsed; as text here they take the same path as the other launchers'
        // (whose conventions are a table of variable names).
        let ours = |name: &str| -> Option<Option<String>> {
            let n = |v: Option<usize>| v.map(|v| v.to_string());
            Some(match name {
                ENV_RANK => n(settings.rank),
                ENV_NRANKS => n(settings.nranks),
                ENV_LOCAL_RANK => n(settings.local_rank),
                ENV_BOOTSTRAP => settings.bootstrap.clone(),
                ENV_BOOTSTRAP_PORT => settings.bootstrap_port.map(|p| p.to_string()),
                _ => return None,
            })
        };
        let get = |name: &str| {
            ours(name)
                .unwrap_or_else(|| other(name))
                .filter(|v| !v.trim().is_empty())
        };
        let number = |var: &'static str| -> Result<Option<usize>, LaunchError> {
            match get(var) {
                None => Ok(None),
                Some(value) => value
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| LaunchError::BadNumber { var, value }),
            }
        };
        let mut found = None;
        for c in &CONVENTIONS {
            let local = c.local_rank.iter().copied().find(|v| get(v).is_some());
            match (number(c.rank)?, number(c.nranks)?) {
                (Some(rank), Some(nranks)) => {
                    found = Some((c, rank, nranks));
                    break;
                }
                (Some(_), None) => {
                    return Err(LaunchError::Incomplete {
                        found: c.rank,
                        missing: c.nranks,
                    });
                }
                (None, Some(_)) => {
                    return Err(LaunchError::Incomplete {
                        found: c.nranks,
                        missing: c.rank,
                    });
                }
                (None, None) => {
                    if let Some(local) = local {
                        return Err(LaunchError::Incomplete {
                            found: local,
                            missing: c.rank,
                        });
                    }
                }
            }
        }
        let Some((c, rank, nranks)) = found else {
            // Our root variable alone is a partial launch too: the ranks would be lost.
            if get(ENV_BOOTSTRAP).is_some() {
                return Err(LaunchError::Incomplete {
                    found: ENV_BOOTSTRAP,
                    missing: ENV_RANK,
                });
            }
            return Err(LaunchError::NotLaunched);
        };
        if rank >= nranks {
            return Err(LaunchError::RankOutOfRange {
                rank_var: c.rank,
                rank,
                nranks_var: c.nranks,
                nranks,
            });
        }
        let local_rank = match c.local_rank.iter().copied().find(|v| get(v).is_some()) {
            Some(var) => number(var)?,
            None => None,
        };
        let root = match (get(ENV_BOOTSTRAP), get("MASTER_ADDR"), get("MASTER_PORT")) {
            (Some(value), _, _) => {
                value
                    .parse()
                    .map_err(|e: BootstrapError| LaunchError::BadRoot {
                        var: ENV_BOOTSTRAP,
                        value: crate::bootstrap::redacted(&value),
                        reason: e.to_string(),
                    })?
            }
            (None, Some(addr), Some(master_port)) => {
                let port = match get(ENV_BOOTSTRAP_PORT) {
                    Some(value) => match value.trim().parse::<u16>() {
                        Ok(p) if p != 0 => p,
                        _ => {
                            return Err(LaunchError::BadRoot {
                                var: ENV_BOOTSTRAP_PORT,
                                value,
                                reason: "not a port number in 1..=65535".into(),
                            });
                        }
                    },
                    None => master_port
                        .trim()
                        .parse::<u16>()
                        .ok()
                        .and_then(|p| p.checked_add(MASTER_PORT_OFFSET))
                        .ok_or_else(|| LaunchError::BadRoot {
                            var: "MASTER_PORT",
                            value: master_port.clone(),
                            reason: format!(
                                "not a port number below {} (the bootstrap root listens on MASTER_PORT + {MASTER_PORT_OFFSET}; set {ENV_BOOTSTRAP_PORT} to choose another port)",
                                65536 - MASTER_PORT_OFFSET as u32
                            ),
                        })?,
                };
                let host = addr.trim().trim_start_matches('[').trim_end_matches(']');
                let spec = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                spec.parse()
                    .map_err(|e: BootstrapError| LaunchError::BadRoot {
                        var: "MASTER_ADDR",
                        value: addr,
                        reason: e.to_string(),
                    })?
            }
            (None, Some(_), None) => {
                return Err(LaunchError::Incomplete {
                    found: "MASTER_ADDR",
                    missing: "MASTER_PORT",
                });
            }
            (None, None, Some(_)) => {
                return Err(LaunchError::Incomplete {
                    found: "MASTER_PORT",
                    missing: "MASTER_ADDR",
                });
            }
            (None, None, None) => {
                return Err(LaunchError::MissingRoot {
                    launcher: c.source,
                    hint: match c.source {
                        LaunchSource::OpenMpi => {
                            " (pass it with mpirun -x MSCCLPP_BOOTSTRAP=ip:port)"
                        }
                        LaunchSource::Pmi | LaunchSource::Mvapich => {
                            " (pass it with mpiexec -genv MSCCLPP_BOOTSTRAP ip:port)"
                        }
                        LaunchSource::Slurm => {
                            " (export it before srun; srun passes the environment)"
                        }
                        _ => "",
                    },
                });
            }
        };
        if let BootstrapRoot::Addr(a) = root
            && a.port() == 0
        {
            let var = if get(ENV_BOOTSTRAP).is_some() {
                ENV_BOOTSTRAP
            } else {
                "MASTER_PORT"
            };
            return Err(LaunchError::BadRoot {
                var,
                value: a.to_string(),
                reason: "port 0 names no port the other ranks could reach".into(),
            });
        }
        Ok(Launch {
            rank,
            nranks,
            local_rank,
            root,
            timeout: settings.bootstrap_timeout,
            rendezvous_timeout: settings.rendezvous_timeout,
            source: c.source,
        })
    }

    /// The default [`BootstrapConfig`] with this launch's timeouts, where set.
    pub fn config(&self) -> BootstrapConfig {
        with_timeouts(self.timeout, self.rendezvous_timeout)
    }

    /// Initialises the bootstrap this launch describes.
    ///
    /// # Cancel safety
    ///
    /// As for [`Bootstrap::init`].
    pub async fn bootstrap(&self) -> Result<Bootstrap, BootstrapError> {
        Bootstrap::init_with_config(self.nranks, self.rank, self.root, self.config()).await
    }

    /// Initialises the bootstrap this launch describes, blocking.
    pub fn blocking_bootstrap(&self) -> Result<BlockingBootstrap, BootstrapError> {
        BlockingBootstrap::init_with_config(self.nranks, self.rank, self.root, self.config())
    }
}

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

/// `MemAvailable` of this machine (`/proc/meminfo`) in bytes: what the ranks launched on it
/// may allocate together, for checks made before they do (the perf tool's and the training
/// example's sizes on the Host transport). `None` where it cannot be read (not Linux).
pub fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
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

/// Starts N local processes of one program with the `MSCCLPP_*` variables set (the launcher
/// runs the root and passes its unique id), forwards their stdout and stderr line by line
/// with a `[rank N] ` prefix, and waits for all of them, killing those left at the timeout.
///
/// ```no_run
/// use mscclpp_host::launch::{Launch, LaunchError, LocalLauncher};
/// # fn run_rank(_: Launch) {}
/// match Launch::from_env() {
///     Ok(launch) => run_rank(launch),
///     Err(LaunchError::NotLaunched) => {
///         let report = LocalLauncher::current_exe(4)?.run()?;
///         std::process::exit(if report.success() { 0 } else { 1 });
///     }
///     Err(e) => panic!("{e}"),
/// }
/// # Ok::<(), LaunchError>(())
/// ```
#[derive(Clone, Debug)]
pub struct LocalLauncher {
    nranks: usize,
    program: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    timeout: Duration,
    bootstrap_timeout: Option<Duration>,
    capture: bool,
    unprefixed_stdout: Option<usize>,
    stop_after_failure: Option<Duration>,
    stacks: bool,
}

impl LocalLauncher {
    /// Launches `nranks` copies of the current executable with its current arguments.
    pub fn current_exe(nranks: usize) -> Result<LocalLauncher, LaunchError> {
        let program = std::env::current_exe().map_err(LaunchError::CurrentExe)?;
        Ok(LocalLauncher::command(nranks, program).args(std::env::args_os().skip(1)))
    }

    /// Launches `nranks` copies of `program` (no arguments until [`args`](Self::args)).
    pub fn command(nranks: usize, program: impl Into<PathBuf>) -> LocalLauncher {
        LocalLauncher {
            nranks,
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
            timeout: Duration::from_secs(300),
            bootstrap_timeout: None,
            capture: false,
            unprefixed_stdout: None,
            stop_after_failure: None,
            stacks: stacks::wanted_by_env(),
        }
    }

    /// Replaces the arguments.
    pub fn args<I, S>(mut self, args: I) -> LocalLauncher
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Sets one more environment variable for every rank. Each launch gives its ranks a
    /// fresh job identity in `MSCCLPP_JOB_ID` ([`BootstrapConfig::job_id`]) unless this sets
    /// one.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> LocalLauncher {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Kills every rank still running after `timeout` (default 300 s).
    pub fn timeout(mut self, timeout: Duration) -> LocalLauncher {
        self.timeout = timeout;
        self
    }

    /// Sets the ranks' bootstrap timeout (`MSCCLPP_BOOTSTRAP_TIMEOUT`) and the root's.
    pub fn bootstrap_timeout(mut self, timeout: Duration) -> LocalLauncher {
        self.bootstrap_timeout = Some(timeout);
        self
    }

    /// Once a rank has failed (exited with another status than 0, or by a signal), kills the
    /// ranks still running `grace` later, as mpirun does, instead of waiting for them until
    /// the timeout (a rank stopped or stuck where no departure reaches it would hold the
    /// whole job). The grace lets the others report what they saw; most fail on their own
    /// within a second or two of a peer's exit. It ends early once every rank still
    /// running is stopped by a signal (`SIGSTOP`: state `T`), as such a rank cannot report
    /// anything. Off by default.
    pub fn stop_after_failure(mut self, grace: Duration) -> LocalLauncher {
        self.stop_after_failure = Some(grace);
        self
    }

    /// Reads every thread's stack of each rank it kills (at the timeout, or after another
    /// rank failed) with `gdb`, if it is on `PATH`, into [`RankExit::stacks`] (up to 60 s
    /// per rank, before the kill): where a hung rank stood, function, file and line. Off by
    /// default, on where `MSCCLPP_LAUNCH_STACKS` is set (not to `0`), as in `.ci/run`.
    pub fn stacks(mut self, on: bool) -> LocalLauncher {
        self.stacks = on;
        self
    }

    /// Collects the ranks' prefixed output into [`LaunchReport::output`] instead of printing
    /// it.
    pub fn capture_output(mut self, capture: bool) -> LocalLauncher {
        self.capture = capture;
        self
    }

    /// Forwards the stdout of `rank` without the `[rank N] ` prefix (for a rank that prints a
    /// report on behalf of all, such as a table); its stderr keeps the prefix.
    pub fn unprefixed_stdout(mut self, rank: usize) -> LocalLauncher {
        self.unprefixed_stdout = Some(rank);
        self
    }

    /// Runs the ranks to completion (or the timeout) and reports how each ended.
    ///
    /// Blocks the calling thread (threads forward the output).
    pub fn run(&self) -> Result<LaunchReport, LaunchError> {
        // The ranks read their timeouts from their environment: what this launcher sets for
        // them (`bootstrap_timeout`, then `env`), else what they inherit. The root here
        // reads the same.
        let mut settings = Settings::global()?.clone();
        for (k, v) in &self.envs {
            if let (Some(k), Some(v)) = (k.to_str(), v.to_str())
                && [ENV_BOOTSTRAP_TIMEOUT, ENV_RENDEZVOUS_TIMEOUT].contains(&k)
            {
                settings.set(k, v)?;
            }
        }
        let mut config = bootstrap_config_from(&settings);
        if let Some(t) = self.bootstrap_timeout {
            config = config.with_timeout(t);
        }
        // The root lives in the launcher, so the ranks are equals; it stops with `_root`.
        let root = Root::bind(
            std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
            config,
        )?
        .spawn()?;
        let id = root.unique_id().to_string();
        // A fresh job identity for this launch (unless `env` gives one), so that a bootstrap
        // of the "ip:port" form that the ranks start themselves admits ranks of this launch
        // only.
        let job = (!self.envs.iter().any(|(k, _)| *k == *ENV_JOB_ID)).then(|| {
            format!(
                "local-{}-{:016x}",
                std::process::id(),
                rand::random::<u64>()
            )
        });
        let mut children: Vec<Child> = Vec::with_capacity(self.nranks);
        let mut forwarders = Vec::new();
        for rank in 0..self.nranks {
            let mut cmd = Command::new(&self.program);
            cmd.args(&self.args)
                .envs(self.envs.iter().map(|(k, v)| (k, v)))
                .env(ENV_RANK, rank.to_string())
                .env(ENV_NRANKS, self.nranks.to_string())
                .env(ENV_LOCAL_RANK, rank.to_string())
                .env(ENV_BOOTSTRAP, &id)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(t) = self.bootstrap_timeout {
                cmd.env(ENV_BOOTSTRAP_TIMEOUT, t.as_secs_f64().to_string());
            }
            if let Some(job) = &job {
                cmd.env(ENV_JOB_ID, job);
            }
            orphan::die_with_launcher(&mut cmd);
            let mut child = match cmd.spawn() {
                Ok(child) => child,
                Err(source) => {
                    for mut c in children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    return Err(LaunchError::Spawn {
                        rank,
                        program: self.program.display().to_string(),
                        source,
                    });
                }
            };
            if let Some(out) = child.stdout.take() {
                let prefix = self.unprefixed_stdout != Some(rank);
                forwarders.push(forward(rank, out, false, prefix, self.capture));
            }
            if let Some(err) = child.stderr.take() {
                forwarders.push(forward(rank, err, true, true, self.capture));
            }
            children.push(child);
        }
        let deadline = Instant::now() + self.timeout;
        let mut exits: Vec<Option<RankExit>> = vec![None; self.nranks];
        // The first rank that failed, and when the others are stopped.
        let mut failed: Option<(usize, Instant)> = None;
        while exits.iter().any(Option::is_none) {
            for (rank, child) in children.iter_mut().enumerate() {
                if exits[rank].is_none()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    // A rank that ended before the rendezvous completed: the others are told
                    // at once, naming it, instead of waiting for the bootstrap timeout (the
                    // root ignores this once the rendezvous is over).
                    root.rank_ended(rank, status.to_string());
                    if let (None, false, Some(grace)) =
                        (failed, status.success(), self.stop_after_failure)
                    {
                        failed = Some((rank, Instant::now() + grace));
                    }
                    exits[rank] = Some(RankExit {
                        rank,
                        status,
                        killed_at_timeout: false,
                        stopped_after: None,
                        threads: Vec::new(),
                        stacks: Vec::new(),
                    });
                }
            }
            let now = Instant::now();
            // The grace lets running ranks report; a rank stopped by a signal (SIGSTOP)
            // cannot, so once every rank left is stopped the grace is over.
            let all_left_stopped = || {
                (children.iter().zip(&exits))
                    .filter(|(_, e)| e.is_none())
                    .all(|(c, _)| crate::procfs::process_stopped(c.id()))
            };
            let stop = failed
                .filter(|&(_, at)| now >= at || all_left_stopped())
                .map(|(q, _)| q);
            if now >= deadline || stop.is_some() {
                for (rank, child) in children.iter_mut().enumerate() {
                    if exits[rank].is_none() {
                        let threads = thread_states(child.id());
                        let stacks = if self.stacks {
                            stacks::thread_stacks(child.id(), STACKS_LIMIT)
                        } else {
                            Vec::new()
                        };
                        let _ = child.kill();
                        if let Ok(status) = child.wait() {
                            exits[rank] = Some(RankExit {
                                rank,
                                status,
                                killed_at_timeout: stop.is_none(),
                                stopped_after: stop,
                                threads,
                                stacks,
                            });
                        }
                    }
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut output = Vec::new();
        for f in forwarders {
            if let Ok(lines) = f.join() {
                output.extend(lines);
            }
        }
        drop(root);
        let ranks = exits
            .into_iter()
            .enumerate()
            .map(|(rank, e)| {
                e.unwrap_or_else(|| RankExit {
                    rank,
                    status: failed_status(),
                    killed_at_timeout: true,
                    stopped_after: None,
                    threads: Vec::new(),
                    stacks: Vec::new(),
                })
            })
            .collect();
        Ok(LaunchReport { ranks, output })
    }
}

/// Ranks that end with their launcher.
mod orphan {
    use std::process::Command;

    /// Makes the child `cmd` starts receive SIGTERM when the launcher's thread that starts
    /// it ends (Linux: `PR_SET_PDEATHSIG`), so that a launcher that is killed (or dies)
    /// does not leave its ranks running as orphans until their next write to its pipe
    /// fails; a child whose launcher is already gone when it starts exits at once.
    /// [`LocalLauncher::run`](super::LocalLauncher::run) starts the ranks from the thread
    /// that waits for them, so the signal comes only when the launcher is gone. Elsewhere:
    /// nothing.
    #[cfg(target_os = "linux")]
    pub(super) fn die_with_launcher(cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let launcher = std::process::id() as libc::pid_t;
        let hook = move || {
            // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number reads no memory; it is
            // async-signal-safe, as the child between fork and exec requires.
            if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: getppid takes nothing and is async-signal-safe.
            if unsafe { libc::getppid() } != launcher {
                // The launcher ended before the rank started (no allocation here: another
                // thread of the parent may have held the allocator's lock at the fork).
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        };
        // SAFETY: the hook calls only async-signal-safe functions (prctl, getppid) and
        // allocates nothing (its errors are raw OS error codes).
        unsafe { cmd.pre_exec(hook) };
    }

    /// Elsewhere: nothing (see the Linux version).
    #[cfg(not(target_os = "linux"))]
    pub(super) fn die_with_launcher(_cmd: &mut Command) {}
}

/// A failing status for a child whose status could not be read (it cannot be waited on).
fn failed_status() -> ExitStatus {
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

/// Prefixes one line of a rank's output.
fn prefixed(rank: usize, line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    format!("[rank {rank}] {}", text.trim_end_matches(['\n', '\r']))
}

fn forward(
    rank: usize,
    pipe: impl Read + Send + 'static,
    is_stderr: bool,
    prefix: bool,
    capture: bool,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        let mut captured = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return captured,
                Ok(_) => {
                    let text = if prefix {
                        prefixed(rank, &line)
                    } else {
                        String::from_utf8_lossy(&line)
                            .trim_end_matches(['\n', '\r'])
                            .to_string()
                    };
                    if capture {
                        captured.push(text);
                    } else if is_stderr {
                        // eprintln!/println! (not io::stdout) so the test harness captures it.
                        eprintln!("{text}");
                    } else {
                        println!("{text}");
                        let _ = std::io::stdout().flush();
                    }
                }
            }
        }
    })
}

/// The default [`BootstrapConfig`] with the timeouts of `settings`
/// ([`Settings::bootstrap_timeout`], [`Settings::rendezvous_timeout`]), where set.
pub fn bootstrap_config_from(settings: &Settings) -> BootstrapConfig {
    with_timeouts(settings.bootstrap_timeout, settings.rendezvous_timeout)
}

/// The default [`BootstrapConfig`] with these timeouts, where given.
fn with_timeouts(timeout: Option<Duration>, rendezvous: Option<Duration>) -> BootstrapConfig {
    let mut config = BootstrapConfig::default();
    if let Some(t) = timeout {
        config = config.with_timeout(t);
    }
    if let Some(t) = rendezvous {
        config = config.with_rendezvous_timeout(t);
    }
    config
}

#[cfg(test)]
mod tests;
