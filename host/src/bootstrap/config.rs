//! What a bootstrap is told: its config, where the root is, and the identities a rank
//! carries to it (job, host, process space).

use super::*;

/// Shared secret of the `"ip:port"` form (any string; every rank must see the same one).
pub const ENV_BOOTSTRAP_SECRET: &str = "MSCCLPP_BOOTSTRAP_SECRET";

/// The job a rank belongs to (any string, the same on every rank of one job and another on
/// every other job); the local launcher sets a fresh one for its ranks. See
/// [`BootstrapConfig::job_id`].
pub const ENV_JOB_ID: &str = "MSCCLPP_JOB_ID";

/// Variables that launchers set to the same value on every rank of one job and to another
/// value for every other job, in the order they are tried: ours, torchrun's, Slurm's (with
/// the step: two `srun`s of one allocation are two jobs), PMIx's (Open MPI 5, `prterun`)
/// and Open MPI 4's (its `mpirun`'s address).
pub(super) const JOB_ID_VARS: &[&str] = &[
    ENV_JOB_ID,
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_orte_hnp_uri",
];

/// The job identity that `get` (an environment) gives: the first of `MSCCLPP_JOB_ID`,
/// `TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`, `PMIX_NAMESPACE` and `OMPI_MCA_orte_hnp_uri` that is
/// set and not blank, as `VAR=value` (Slurm's with `.step`), cut to
/// [`MAX_JOB_ID_LEN`](wire::MAX_JOB_ID_LEN) bytes; empty when none is set (ranks started by
/// hand: nothing tells two such jobs apart but their sizes).
pub fn job_id_from(get: impl Fn(&str) -> Option<String>) -> String {
    let set = |var: &str| get(var).filter(|v| !v.trim().is_empty());
    for var in JOB_ID_VARS {
        if let Some(value) = set(var) {
            let value = match (*var, set("SLURM_STEP_ID")) {
                ("SLURM_JOB_ID", Some(step)) => format!("{value}.{step}"),
                _ => value,
            };
            return wire::bounded(&format!("{var}={value}"), wire::MAX_JOB_ID_LEN).to_owned();
        }
    }
    String::new()
}

/// Settings of a bootstrap (rank or root). The defaults suit production; tests shorten the
/// timeout.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct BootstrapConfig {
    /// Bound on every wait: each handshake and each message a collective or `recv` waits
    /// for (the `_within` variants, such as [`Bootstrap::barrier_within`], take their
    /// own); also the rendezvous's, unless [`rendezvous_timeout`](Self::rendezvous_timeout)
    /// is set. Default 30 s.
    pub timeout: Duration,
    /// Bound on the rendezvous alone: reaching the root (with retries; at most
    /// [`timeout`](Self::timeout) for a [`UniqueId`]'s root, which listens before the id
    /// exists) and waiting, once the first rank has joined, for the last one. Ranks may reach it far apart (one loads a
    /// model or downloads data first), where every later wait is between ranks that are all
    /// there. `None`: [`timeout`](Self::timeout). The NCCL library sets 30 minutes (NCCL
    /// waits for ever).
    pub rendezvous_timeout: Option<Duration>,
    /// Largest message (one rank's `all_gather` contribution, one `send`). Default 1 GiB.
    pub max_message_size: usize,
    /// Identity of this rank's node; ranks with equal ids count as one node. Default: the
    /// `MSCCLPP_HOST_ID` variable, else `MSCCLPP_SIMULATE_HOSTS` (see
    /// [`simulated_host_id`]), else hostname and boot id.
    pub host_id: Option<String>,
    /// Address this rank listens on for its peers. Default: the local address of its
    /// connection to the root (the interface that reaches the root).
    pub listen_ip: Option<IpAddr>,
    /// Shared secret of the `"ip:port"` form ([`BootstrapRoot::Addr`]), hashed into the id's
    /// secret ([`UniqueId::for_address_with_secret`]); ignored with a [`UniqueId`], which
    /// carries its own. Default: the `MSCCLPP_BOOTSTRAP_SECRET` variable; without either the
    /// form is unauthenticated (anyone who can reach the ports can join as a rank that has
    /// not joined yet).
    pub secret: Option<String>,
    /// The job this rank belongs to, the same on every rank of one job and another for
    /// every other job. The root of the `"ip:port"` form ([`BootstrapRoot::Addr`]) admits
    /// only ranks of its rank 0's job, so that two jobs given one address never mix: a rank
    /// of the other job is refused, naming both jobs ([`Refusal::OtherJob`]), and the root
    /// waits on for its own rank. Default: from the environment ([`job_id_from`]):
    /// `MSCCLPP_JOB_ID` (which the local launcher sets), else the launcher's own job id
    /// (torchrun, Slurm, PMIx, Open MPI), else none; ranks started by hand then share no job
    /// id, and only a rank started with another number of ranks is refused
    /// ([`Refusal::NranksMismatch`]): give every rank of one job the same `MSCCLPP_JOB_ID` to
    /// make the check exact. A [`UniqueId`]'s root does not look at it: the id's secret
    /// already belongs to one job.
    pub job_id: Option<String>,
    /// How long the network between this rank and a peer may stay silent before their
    /// connection counts as lost: TCP keepalive
    /// probes once a connection has been idle for 1 s, then one a second, and a bound on
    /// unacknowledged data. A lost connection fails every rank's calls, naming the two hosts;
    /// a link that is down for less than this minus 2 s is survived. Default 3 s; the
    /// `MSCCLPP_LINK_TIMEOUT` variable overrides it.
    pub link_timeout: Duration,
}

impl Default for BootstrapConfig {
    fn default() -> Self {
        BootstrapConfig {
            timeout: Duration::from_secs(30),
            rendezvous_timeout: None,
            max_message_size: 1 << 30,
            host_id: None,
            listen_ip: None,
            secret: None,
            job_id: None,
            link_timeout: Duration::from_secs(3),
        }
    }
}

impl BootstrapConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`timeout`](Self::timeout).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`rendezvous_timeout`](Self::rendezvous_timeout).
    pub fn with_rendezvous_timeout(mut self, timeout: Duration) -> Self {
        self.rendezvous_timeout = Some(timeout);
        self
    }

    /// How long the rendezvous may take: [`rendezvous_timeout`](Self::rendezvous_timeout),
    /// else [`timeout`](Self::timeout).
    pub fn rendezvous_wait(&self) -> Duration {
        self.rendezvous_timeout
            .unwrap_or(self.timeout)
            .min(LONGEST_WAIT)
    }

    /// How long a wait for a rank that may come late (a teardown, a split: ranks reach them
    /// as far apart as a rendezvous) may take: the longer of
    /// [`rendezvous_wait`](Self::rendezvous_wait) and [`timeout`](Self::timeout), so that it
    /// is never shorter than an ordinary wait.
    pub fn late_wait(&self) -> Duration {
        self.rendezvous_wait().max(self.timeout)
    }

    /// Sets [`max_message_size`](Self::max_message_size).
    pub fn with_max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Sets [`host_id`](Self::host_id).
    pub fn with_host_id(mut self, host_id: impl Into<String>) -> Self {
        self.host_id = Some(host_id.into());
        self
    }

    /// Sets [`listen_ip`](Self::listen_ip).
    pub fn with_listen_ip(mut self, ip: IpAddr) -> Self {
        self.listen_ip = Some(ip);
        self
    }

    /// Sets [`secret`](Self::secret).
    pub fn with_secret(mut self, secret: impl Into<String>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// Sets [`job_id`](Self::job_id).
    pub fn with_job_id(mut self, job: impl Into<String>) -> Self {
        self.job_id = Some(job.into());
        self
    }

    /// The job identity in force: [`job_id`](Self::job_id) (cut to
    /// [`MAX_JOB_ID_LEN`](wire::MAX_JOB_ID_LEN) bytes), else the environment's
    /// ([`job_id_from`]).
    pub fn effective_job_id(&self) -> String {
        match &self.job_id {
            Some(job) => wire::bounded(job, wire::MAX_JOB_ID_LEN).to_owned(),
            None => {
                let ours = Settings::global_or_default().job_id.clone();
                job_id_from(|var| match var {
                    ENV_JOB_ID => ours.clone(),
                    other => std::env::var(other).ok(),
                })
            }
        }
    }

    /// The shared secret in force: [`secret`](Self::secret), else `MSCCLPP_BOOTSTRAP_SECRET`
    /// (unset or empty: none).
    pub(super) fn effective_secret(&self) -> Option<String> {
        self.secret
            .clone()
            .or_else(|| Settings::global_or_default().bootstrap_secret.clone())
            .filter(|s| !s.is_empty())
    }

    /// The id of the `"ip:port"` form ([`BootstrapRoot::Addr`]) for the root at `addr`: every
    /// rank computes the same, with the secret in force ([`secret`](Self::secret), else
    /// `MSCCLPP_BOOTSTRAP_SECRET`) hashed in, or none.
    pub fn address_id(&self, addr: SocketAddr) -> UniqueId {
        match self.effective_secret() {
            Some(secret) => UniqueId::for_address_with_secret(addr, &secret),
            None => UniqueId::for_address(addr),
        }
    }
}

/// Where the root is: a [`UniqueId`], or the seed's `"ip:port"` (rank 0 runs the root there;
/// the secret comes from [`BootstrapConfig::secret`], else there is none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootstrapRoot {
    /// A root started by [`create_unique_id`] or [`Root`].
    Id(UniqueId),
    /// Rank 0 starts the root on this address; the others connect to it.
    Addr(SocketAddr),
}

impl From<UniqueId> for BootstrapRoot {
    fn from(id: UniqueId) -> Self {
        BootstrapRoot::Id(id)
    }
}

impl From<SocketAddr> for BootstrapRoot {
    fn from(addr: SocketAddr) -> Self {
        BootstrapRoot::Addr(addr)
    }
}

impl FromStr for BootstrapRoot {
    type Err = BootstrapError;

    /// Reads a unique id (256 hex digits), an `ip:port`, or a `host:port` (resolved now,
    /// IPv4 preferred).
    fn from_str(s: &str) -> Result<Self, BootstrapError> {
        let s = s.trim();
        if s.len() == UNIQUE_ID_BYTES * 2 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return s
                .parse::<UniqueId>()
                .map(BootstrapRoot::Id)
                .map_err(|e| BootstrapError::InvalidArgument(format!("bootstrap root: {e}")));
        }
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Ok(BootstrapRoot::Addr(addr));
        }
        let invalid = |why: String| {
            BootstrapError::InvalidArgument(format!(
                "bootstrap root {:?} is neither a unique id (256 hex digits) nor ip:port / \
                 host:port: {why}",
                redacted(s)
            ))
        };
        let addrs: Vec<SocketAddr> = s
            .to_socket_addrs()
            .map_err(|e| invalid(e.to_string()))?
            .collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .map(BootstrapRoot::Addr)
            .ok_or_else(|| invalid("it resolves to no address".into()))
    }
}

impl std::fmt::Display for BootstrapRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootstrapRoot::Id(id) => id.fmt(f),
            BootstrapRoot::Addr(addr) => addr.fmt(f),
        }
    }
}

/// The host id of `rank` of `nranks` when one machine is split into `hosts` simulated hosts
/// (the value of `MSCCLPP_SIMULATE_HOSTS`, [`Settings::simulate_hosts`]):
/// `simhost{rank * hosts / nranks}`, as `mscclpp-perf --simulate-hosts` and `train-dp
/// --simulate-hosts` name them, so that any program (nccl-tests, PyTorch through the NCCL
/// library) can run its collectives across hosts on one machine. `None` for `None`. More
/// hosts than ranks (a communicator split from a larger one) puts every rank on a host of
/// its own; 0 hosts counts as 1.
pub fn simulated_host_id(hosts: Option<usize>, rank: usize, nranks: usize) -> Option<String> {
    let h = hosts?.clamp(1, nranks.max(1));
    Some(format!("simhost{}", rank * h / nranks.max(1)))
}

/// This machine's node identity: `MSCCLPP_HOST_ID` if set, else `hostname/boot-id`.
pub fn default_host_id() -> String {
    if let Some(id) = &Settings::global_or_default().host_id {
        return truncate(id.clone());
    }
    machine_id()
}

/// This machine as `hostname/boot-id`, whatever `MSCCLPP_HOST_ID` says (simulated hosts
/// split one machine; this names the machine itself).
pub(crate) fn machine_id() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let host = read("/proc/sys/kernel/hostname")
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    let id = match read("/proc/sys/kernel/random/boot_id") {
        Some(boot) => format!("{host}/{boot}"),
        None => host,
    };
    truncate(id)
}

/// This process's process space: [`machine_id`] and its process id namespace
/// (`/proc/self/ns/pid`), so that ranks in containers of one machine, whose process ids mean
/// different processes, are told apart. Ranks with equal values can look at each other's
/// processes ([`Bootstrap::local_pid`]).
///
/// Empty (no rank looks at another's process) unless all of it can be read and `/proc` shows
/// this process under its own process id: a `/proc` mounted for another pid namespace (after
/// `unshare --pid` without a new mount) numbers processes differently from the pids the
/// ranks report.
pub(crate) fn process_space_id() -> String {
    let ns = std::fs::read_link("/proc/self/ns/pid").ok();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok();
    let own = std::fs::read_link("/proc/self")
        .ok()
        .is_some_and(|p| p.to_str() == Some(&std::process::id().to_string()));
    match (ns, boot) {
        (Some(ns), Some(boot)) if own && !boot.trim().is_empty() => {
            truncate(format!("{}/{}", machine_id(), ns.to_string_lossy()))
        }
        _ => String::new(),
    }
}

pub(super) fn truncate(mut s: String) -> String {
    if s.len() > MAX_HOST_ID_LEN {
        let mut end = MAX_HOST_ID_LEN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}
