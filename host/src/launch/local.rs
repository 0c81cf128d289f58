//! [`LocalLauncher`]: N processes of one program on this machine, with our variables set.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::forward::forward;
use super::report::{LaunchReport, RankExit, failed_status, thread_states};
use super::{
    ENV_BOOTSTRAP, ENV_BOOTSTRAP_TIMEOUT, ENV_LOCAL_RANK, ENV_NRANKS, ENV_RANK,
    ENV_RENDEZVOUS_TIMEOUT, LaunchError, affinity, bootstrap_config_from, orphan, stacks,
};
use crate::bootstrap::{BootstrapConfig, ENV_JOB_ID, Root, RootHandle};
use crate::settings::Settings;

/// How long [`LocalLauncher::stacks`] gives `gdb` per rank (a loaded 2-core CI machine
/// took more than 30 s for a rank of 26 threads).
const STACKS_LIMIT: Duration = Duration::from_secs(60);

/// `MemAvailable` of this machine (`/proc/meminfo`) in bytes: what the ranks launched on it
/// may allocate together, for checks made before they do (the perf tool's and the training
/// example's sizes on the Host transport). `None` where it cannot be read (not Linux).
pub fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
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
    bind_cpus: bool,
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
            bind_cpus: false,
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

    /// Binds each rank to its own share of the CPUs this process may run on (contiguous,
    /// in order: with 2 ranks on 2 cores, a core each), as `mpirun` does by default for
    /// two ranks; nothing when there are fewer CPUs than ranks. A rank's threads hand
    /// work to each other (its kernel's wait, its proxy, its sockets' receivers); left to
    /// the scheduler on a small machine, they are spread over the other ranks' cores.
    /// Off by default.
    pub fn bind_cpus(mut self, on: bool) -> LocalLauncher {
        self.bind_cpus = on;
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
        // The root lives in the launcher, so the ranks are equals; it stops with `root`.
        let root = Root::bind(
            std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
            self.root_config()?,
        )?
        .spawn()?;
        let id = root.unique_id().to_string();
        let job = self.job_id();
        let mut children: Vec<Child> = Vec::with_capacity(self.nranks);
        let mut forwarders = Vec::new();
        let cpus = self
            .bind_cpus
            .then(|| affinity::shares(&affinity::allowed_cpus(), self.nranks))
            .flatten();
        for rank in 0..self.nranks {
            let mut cmd = self.rank_command(rank, &id, job.as_deref());
            if let Some(cpus) = &cpus {
                affinity::bind(&mut cmd, &cpus[rank]);
            }
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
        let exits = self.wait(&mut children, &root);
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
                    killed_at_timeout: true,
                    ..RankExit::ended(rank, failed_status())
                })
            })
            .collect();
        Ok(LaunchReport { ranks, output })
    }

    /// The root's configuration: the ranks read their timeouts from their environment (what
    /// this launcher sets for them, `bootstrap_timeout`, then `env`, else what they
    /// inherit), and the root here reads the same.
    fn root_config(&self) -> Result<BootstrapConfig, LaunchError> {
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
        Ok(config)
    }

    /// A fresh job identity for this launch (unless `env` gives one), so that a bootstrap
    /// of the "ip:port" form that the ranks start themselves admits ranks of this launch
    /// only.
    fn job_id(&self) -> Option<String> {
        (!self.envs.iter().any(|(k, _)| *k == *ENV_JOB_ID)).then(|| {
            format!(
                "local-{}-{:016x}",
                std::process::id(),
                rand::random::<u64>()
            )
        })
    }

    /// The command that starts `rank`, with the root's unique id `id` and the job identity.
    fn rank_command(&self, rank: usize, id: &str, job: Option<&str>) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .env(ENV_RANK, rank.to_string())
            .env(ENV_NRANKS, self.nranks.to_string())
            .env(ENV_LOCAL_RANK, rank.to_string())
            .env(ENV_BOOTSTRAP, id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(t) = self.bootstrap_timeout {
            cmd.env(ENV_BOOTSTRAP_TIMEOUT, t.as_secs_f64().to_string());
        }
        if let Some(job) = job {
            cmd.env(ENV_JOB_ID, job);
        }
        orphan::die_with_launcher(&mut cmd);
        cmd
    }

    /// Waits for every child to end, telling `root` of each that does, and kills those
    /// left at the timeout (or, with [`stop_after_failure`](Self::stop_after_failure), once
    /// the grace after a failure is over). `None`: a killed child that could not be waited
    /// on.
    fn wait(&self, children: &mut [Child], root: &RootHandle) -> Vec<Option<RankExit>> {
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
                    exits[rank] = Some(RankExit::ended(rank, status));
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
                        exits[rank] = self.kill(rank, child, stop);
                    }
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        exits
    }

    /// Kills `child` (rank `rank`), having read its threads (and with
    /// [`stacks`](Self::stacks), their stacks): at the timeout, or `stop`ped after that
    /// rank failed. `None` where it cannot be waited on.
    fn kill(&self, rank: usize, child: &mut Child, stop: Option<usize>) -> Option<RankExit> {
        let threads = thread_states(child.id());
        let stacks = if self.stacks {
            stacks::thread_stacks(child.id(), STACKS_LIMIT)
        } else {
            Vec::new()
        };
        let _ = child.kill();
        let status = child.wait().ok()?;
        Some(RankExit {
            killed_at_timeout: stop.is_none(),
            stopped_after: stop,
            threads,
            stacks,
            ..RankExit::ended(rank, status)
        })
    }
}
