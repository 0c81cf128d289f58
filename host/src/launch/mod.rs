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

mod affinity;
mod forward;
mod local;
mod orphan;
mod report;
mod stacks;

use std::time::Duration;

use crate::bootstrap::{
    BlockingBootstrap, Bootstrap, BootstrapConfig, BootstrapError, BootstrapRoot,
};
use crate::settings::{Settings, SettingsError};

pub use local::{LocalLauncher, mem_available};
pub use report::{LaunchReport, RankExit, thread_states};

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
        let vars = Vars { settings, other };
        let (c, rank, nranks) = vars.convention()?;
        if rank >= nranks {
            return Err(LaunchError::RankOutOfRange {
                rank_var: c.rank,
                rank,
                nranks_var: c.nranks,
                nranks,
            });
        }
        let local_rank = match c.local_rank.iter().copied().find(|v| vars.get(v).is_some()) {
            Some(var) => vars.number(var)?,
            None => None,
        };
        let root = vars.root(c.source)?;
        if let BootstrapRoot::Addr(a) = root
            && a.port() == 0
        {
            let var = if vars.get(ENV_BOOTSTRAP).is_some() {
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

/// The variables [`Launch::from_settings`] reads: ours from the parsed settings, as text, so
/// that they take the same path as the other launchers' (whose conventions are a table of
/// variable names), and the others' through a lookup. Blank values count as unset.
struct Vars<'a, F> {
    settings: &'a Settings,
    other: F,
}

impl<F: Fn(&str) -> Option<String>> Vars<'_, F> {
    /// The value of `name`, if set and not blank.
    fn get(&self, name: &str) -> Option<String> {
        self.ours(name)
            .unwrap_or_else(|| (self.other)(name))
            .filter(|v| !v.trim().is_empty())
    }

    /// Our variable `name` from the settings (`None`: not one of ours).
    fn ours(&self, name: &str) -> Option<Option<String>> {
        let s = self.settings;
        let n = |v: Option<usize>| v.map(|v| v.to_string());
        Some(match name {
            ENV_RANK => n(s.rank),
            ENV_NRANKS => n(s.nranks),
            ENV_LOCAL_RANK => n(s.local_rank),
            ENV_BOOTSTRAP => s.bootstrap.clone(),
            ENV_BOOTSTRAP_PORT => s.bootstrap_port.map(|p| p.to_string()),
            _ => return None,
        })
    }

    /// The value of `var` as a number, if set.
    fn number(&self, var: &'static str) -> Result<Option<usize>, LaunchError> {
        match self.get(var) {
            None => Ok(None),
            Some(value) => value
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| LaunchError::BadNumber { var, value }),
        }
    }

    /// The first convention with any of its variables set, with its rank and number of
    /// ranks; a partial set is an error.
    fn convention(&self) -> Result<(&'static Convention, usize, usize), LaunchError> {
        for c in &CONVENTIONS {
            let local = c.local_rank.iter().copied().find(|v| self.get(v).is_some());
            match (self.number(c.rank)?, self.number(c.nranks)?) {
                (Some(rank), Some(nranks)) => return Ok((c, rank, nranks)),
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
        // Our root variable alone is a partial launch too: the ranks would be lost.
        if self.get(ENV_BOOTSTRAP).is_some() {
            return Err(LaunchError::Incomplete {
                found: ENV_BOOTSTRAP,
                missing: ENV_RANK,
            });
        }
        Err(LaunchError::NotLaunched)
    }

    /// The root: `MSCCLPP_BOOTSTRAP`, else `MASTER_ADDR` and `MASTER_PORT`; `source` (whose
    /// variables gave the ranks) says how to pass it when there is none.
    fn root(&self, source: LaunchSource) -> Result<BootstrapRoot, LaunchError> {
        match (
            self.get(ENV_BOOTSTRAP),
            self.get("MASTER_ADDR"),
            self.get("MASTER_PORT"),
        ) {
            (Some(value), _, _) => {
                value
                    .parse()
                    .map_err(|e: BootstrapError| LaunchError::BadRoot {
                        var: ENV_BOOTSTRAP,
                        value: crate::bootstrap::redacted(&value),
                        reason: e.to_string(),
                    })
            }
            (None, Some(addr), Some(master_port)) => {
                let port = self.master_root_port(master_port)?;
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
                    })
            }
            (None, Some(_), None) => Err(LaunchError::Incomplete {
                found: "MASTER_ADDR",
                missing: "MASTER_PORT",
            }),
            (None, None, Some(_)) => Err(LaunchError::Incomplete {
                found: "MASTER_PORT",
                missing: "MASTER_ADDR",
            }),
            (None, None, None) => Err(LaunchError::MissingRoot {
                launcher: source,
                hint: match source {
                    LaunchSource::OpenMpi => " (pass it with mpirun -x MSCCLPP_BOOTSTRAP=ip:port)",
                    LaunchSource::Pmi | LaunchSource::Mvapich => {
                        " (pass it with mpiexec -genv MSCCLPP_BOOTSTRAP ip:port)"
                    }
                    LaunchSource::Slurm => " (export it before srun; srun passes the environment)",
                    _ => "",
                },
            }),
        }
    }

    /// The root's port on `MASTER_ADDR`: `MSCCLPP_BOOTSTRAP_PORT`, else `master_port` (the
    /// value of `MASTER_PORT`) + [`MASTER_PORT_OFFSET`].
    fn master_root_port(&self, master_port: String) -> Result<u16, LaunchError> {
        match self.get(ENV_BOOTSTRAP_PORT) {
            Some(value) => match value.trim().parse::<u16>() {
                Ok(p) if p != 0 => Ok(p),
                _ => Err(LaunchError::BadRoot {
                    var: ENV_BOOTSTRAP_PORT,
                    value,
                    reason: "not a port number in 1..=65535".into(),
                }),
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
                }),
        }
    }
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
