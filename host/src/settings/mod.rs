//! Every setting of the library, the NCCL library (`nccl/`) and the perf tool, as typed
//! fields of one [`Settings`], read from the environment once per process.
//!
//! A setting's value comes from, in order: the API (a field set in [`Settings::init`]'s
//! closure, or a [`Settings`] built and passed explicitly), the environment variable
//! (`MSCCLPP_*`, plus NCCL's `NCCL_SOCKET_IFNAME` and `NCCL_COMM_ID`), the default. A
//! variable set to a blank value counts as unset.
//!
//! The process environment is read once, at the first [`Settings::global`] (or
//! [`Settings::init`]); a process that starts others (a launcher, a test that runs ranks as
//! processes) passes variables through their environment, which each child reads once in
//! its turn. Tests build a [`Settings`] with [`Settings::from_vars`] instead of changing the
//! process environment.
//!
//! A value that does not parse is an error ([`SettingsError`]) naming the variable, the
//! value and the forms accepted, returned by [`Settings::global`] to every caller; an
//! `MSCCLPP_*` variable that is no setting here (a typo, say) is named on stderr once, with
//! the nearest known name. Variables read at build time or by test harnesses only are
//! listed in [`OTHER_VARS`], for the reference (`docs/guide/08-settings.md`, written by
//! [`reference_markdown`]) and so that they draw no warning.
//!
//! Variables that describe the job rather than configure the library (the launchers' own,
//! such as torchrun's `RANK` or Slurm's `SLURM_JOB_ID`) and paths of the system
//! (`NCCL_HOME`, `HOME`) are read where they are used, not here.
//!
//! This module is the bottom layer of the crate: it uses no other module of it.

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

mod reference;
#[cfg(test)]
mod tests;
mod values;

pub use reference::*;
pub use values::*;

/// A variable of the reference: its name, type, default, meaning and reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    /// The environment variable.
    pub name: &'static str,
    /// The kind of value, as a user writes it.
    pub kind: &'static str,
    /// The value when unset.
    pub default: &'static str,
    /// What it does (its field's documentation).
    pub meaning: &'static str,
    /// Which component reads it.
    pub reader: &'static str,
}

/// One variable whose value does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue {
    /// The variable.
    pub var: String,
    /// Its value.
    pub value: String,
    /// The forms it accepts.
    pub expected: String,
}

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?}: expected {}",
            self.var, self.value, self.expected
        )
    }
}

/// Settings that could not be read: every variable whose value does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    /// The variables at fault, in the order of the reference.
    pub bad: Vec<BadValue>,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.bad.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{b}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SettingsError {}

/// Why [`Settings::init`] did not apply its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitError {
    /// The settings were read before (by [`Settings::global`] or an earlier `init`): the
    /// process runs with those.
    AlreadyRead,
    /// The environment holds values that do not parse.
    Invalid(SettingsError),
}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitError::AlreadyRead => f.write_str(
                "the settings were already read in this process: set them before the library's \
                 first use",
            ),
            InitError::Invalid(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for InitError {}

/// Components, as the reference names them.
const LAUNCH: &str = "host: launch (`Launch::from_env`, `LocalLauncher`)";
const BOOTSTRAP: &str = "host: bootstrap";
const COMMUNICATOR: &str = "host: communicator";
const COLLECTIVES: &str = "host: collectives";
const PROXY: &str = "host: proxy";
const CUDA: &str = "host: kernel loading";
const TCP: &str = "host: TCP transport";
const IB: &str = "host: IB transport";
const NCCL: &str = "NCCL library";
const NCCL_AND_PERF: &str = "NCCL library, perf tool";
const PERF: &str = "perf tool (set by it for its ranks)";

/// Defines [`Settings`] and [`VARS`] from one list: each field with its documentation, type,
/// default, variable, kind of value, default as written, reader and parser.
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])+
        $field:ident: $ty:ty = $default:expr;
        $var:literal, $kind:literal, $default_text:literal, $reader:expr, $parse:expr;
    )+) => {
        /// The settings of one process: every variable of the library, the NCCL library and
        /// the perf tool as a typed field (see the [module](self) for where values come from).
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub struct Settings {
            $(
                $(#[doc = $doc])+
                #[doc = concat!("\n\nVariable `", $var, "`; default: ", $default_text, ".")]
                pub $field: $ty,
            )+
            /// `MSCCLPP_*` variables of the environment that are no setting.
            unknown: Vec<String>,
        }

        impl Default for Settings {
            fn default() -> Self {
                Settings {
                    $($field: $default,)+
                    unknown: Vec::new(),
                }
            }
        }

        /// The variables that are fields of [`Settings`], in the order of the fields.
        pub const VARS: &[Var] = &[$(
            Var {
                name: $var,
                kind: $kind,
                default: $default_text,
                meaning: concat!($($doc, "\n"),+),
                reader: $reader,
            },
        )+];

        impl Settings {
            /// Sets the field of variable `var` from `value` (not blank); `None` when `var`
            /// is no field, else the parse's result (the forms accepted on error).
            fn apply(&mut self, var: &str, value: &str) -> Option<Result<(), String>> {
                match var {
                    $($var => {
                        let parse: fn(&str) -> Result<$ty, String> = $parse;
                        Some(parse(value).map(|v| self.$field = v))
                    })+
                    _ => None,
                }
            }

            /// Sets the field of variable `var` to its default; `false` when `var` is no
            /// field.
            fn reset_field(&mut self, var: &str) -> bool {
                match var {
                    $($var => {
                        self.$field = $default;
                        true
                    })+
                    _ => false,
                }
            }
        }
    };
}

settings! {
    /// This process's rank, with `MSCCLPP_NRANKS` (the launcher convention tried first).
    rank: Option<usize> = None;
    "MSCCLPP_RANK", "whole number", "unset", LAUNCH, |v| whole(v, 0, u32::MAX as u64).map(Some);

    /// The number of ranks of the job.
    nranks: Option<usize> = None;
    "MSCCLPP_NRANKS", "whole number", "unset", LAUNCH, |v| whole(v, 1, u32::MAX as u64).map(Some);

    /// This process's rank among those of its machine.
    local_rank: Option<usize> = None;
    "MSCCLPP_LOCAL_RANK", "whole number", "unset", LAUNCH,
        |v| whole(v, 0, u32::MAX as u64).map(Some);

    /// Where the bootstrap root is: a unique id (256 hex digits), or `ip:port` or
    /// `host:port` (rank 0 then runs the root there). Unset: torchrun's `MASTER_ADDR` with
    /// port `MSCCLPP_BOOTSTRAP_PORT`.
    bootstrap: Option<String> = None;
    "MSCCLPP_BOOTSTRAP", "unique id or ip:port", "unset", LAUNCH, |v| text(v).map(Some);

    /// The root's port on `MASTER_ADDR` (torchrun).
    bootstrap_port: Option<u16> = None;
    "MSCCLPP_BOOTSTRAP_PORT", "port (1 to 65535)", "`MASTER_PORT` + 1", LAUNCH,
        |v| whole(v, 1, 65_535).map(Some);

    /// How long any wait of the bootstrap lasts before it fails (connecting, each message).
    bootstrap_timeout: Option<Duration> = None;
    "MSCCLPP_BOOTSTRAP_TIMEOUT", "seconds (fractions allowed)", "30 s",
        "host: launch, NCCL library", |v| seconds(v, 1e9).map(Some);

    /// How far apart the ranks may reach the root: the time between the first rank's
    /// arrival and the last's.
    rendezvous_timeout: Option<Duration> = None;
    "MSCCLPP_RENDEZVOUS_TIMEOUT", "seconds (fractions allowed)",
        "the bootstrap timeout; 30 minutes in the NCCL library", "host: launch, NCCL library",
        |v| seconds(v, 1e9).map(Some);

    /// How long the network between two ranks may stay silent before their bootstrap
    /// connection counts as lost (TCP keepalive probes once a connection is idle for 1 s,
    /// then every second; unacknowledged data for as long): every rank's calls then fail,
    /// naming the two hosts. A link down for less than this minus 2 s is survived.
    link_timeout: Option<Duration> = None;
    "MSCCLPP_LINK_TIMEOUT", "seconds (whole, at least 2)", "3 s (`BootstrapConfig::link_timeout`)",
        BOOTSTRAP, |v| seconds(v, 86_400.0).map(Some);

    /// The shared secret of the `ip:port` root form, hashed into its id: every rank must
    /// see the same one. An API value (`BootstrapConfig::with_secret`) comes first.
    bootstrap_secret: Option<String> = None;
    "MSCCLPP_BOOTSTRAP_SECRET", "text", "none", BOOTSTRAP, |v| text(v).map(Some);

    /// The job a rank belongs to: the same on every rank of one job, another on every
    /// other job (the local launcher sets a fresh one); unset, the launchers' own job ids
    /// (torchrun, Slurm, PMIx, Open MPI) are used.
    job_id: Option<String> = None;
    "MSCCLPP_JOB_ID", "text", "the launcher's job id", BOOTSTRAP, |v| text(v).map(Some);

    /// This machine's identity in the bootstrap: ranks with different ids are on
    /// different hosts to the collectives.
    host_id: Option<String> = None;
    "MSCCLPP_HOST_ID", "text", "hostname/boot-id", BOOTSTRAP, |v| text(v).map(Some);

    /// Splits one machine into this many simulated hosts (rank `r` of `n` on host
    /// `simhost{r * hosts / n}`), so that collectives run across hosts on one machine.
    /// Ignored when `MSCCLPP_HOST_ID` is set.
    simulate_hosts: Option<usize> = None;
    "MSCCLPP_SIMULATE_HOSTS", "whole number (1 or more)", "unset (one host)", BOOTSTRAP,
        |v| whole(v, 1, u32::MAX as u64).map(Some);

    /// Whether a launcher prints the threads' stacks (with gdb) of ranks that time out or
    /// die, unless told otherwise.
    launch_stacks: bool = false;
    "MSCCLPP_LAUNCH_STACKS", "yes/no", "no", LAUNCH, flag;

    /// How long a GPU wait of the kernels lasts before it reports which rank it waited
    /// for; overrides `CommConfig::device_timeout`. Lowering it on one rank makes that rank
    /// report first.
    device_timeout: Option<Duration> = None;
    "MSCCLPP_DEVICE_TIMEOUT", "seconds (fractions allowed, at most 86400)",
        "`CommConfig::device_timeout`", COMMUNICATOR, |v| seconds(v, 86_400.0).map(Some);

    /// How the proxy signals after the data of a put: `stream` (a stream write after the
    /// copies) or `cpu` (a CPU store once the copies are done). Every rank must use the
    /// same mode; overrides `CommConfig::proxy_flag`.
    proxy_flag: Option<ProxyFlagMode> = None;
    "MSCCLPP_PROXY_FLAG", "stream, cpu", "`CommConfig::proxy_flag` (stream)", COMMUNICATOR,
        |v| ProxyFlagMode::parse(v).map(Some);

    /// Whether each proxy reports how it spent its time when it stops (`1`).
    proxy_stats: bool = false;
    "MSCCLPP_PROXY_STATS", "yes/no", "no", PROXY, flag;

    /// The kind of kernel image loaded: `auto` (machine code when it was built for the
    /// device, else PTX), `ptx` (the driver compiles it, once per machine and driver) or
    /// `cubin` (machine code or an error).
    kernel_image: ImagePolicy = ImagePolicy::Auto;
    "MSCCLPP_KERNEL_IMAGE", "auto, ptx, cubin", "auto", CUDA, ImagePolicy::parse;

    /// Sockets per TCP connection ("stripes"); `auto`: 4 where a large put is written to
    /// its stripes at once (`MSCCLPP_TCP_PARALLEL`), else 2.
    tcp_conns: Option<usize> = None;
    "MSCCLPP_TCP_CONNS", "whole number (1 to 64) or auto", "auto (4 above 4 cores, else 2)",
        TCP, |v| or_auto(v, |v| whole(v, 1, 64));

    /// Largest piece of a put on one TCP socket (a tail of less than 4 KiB may be spread over
    /// the other pieces).
    tcp_chunk: usize = 512 << 10;
    "MSCCLPP_TCP_CHUNK", "bytes (4 KiB to 64 MiB)", "512 KiB", TCP,
        |v| bytes(v, 4096, 64 << 20);

    /// Whether a TCP put of several chunks is written to its stripes by one thread each,
    /// at once (`yes`), or by the proxy's thread alone, one chunk after the other (`no`);
    /// `auto`: yes on machines with more than 4 cores.
    tcp_parallel: Option<bool> = None;
    "MSCCLPP_TCP_PARALLEL", "yes/no or auto", "auto (yes above 4 cores)", TCP, auto_flag;

    /// The congestion control of the TCP transport's sockets (`cubic`, `bbr`, ...; one the
    /// kernel allows: `/proc/sys/net/ipv4/tcp_allowed_congestion_control`, or any loaded
    /// one with `CAP_NET_ADMIN`). Unset: the system's default
    /// (`net.ipv4.tcp_congestion_control`).
    tcp_congestion: Option<TcpCongestion> = None;
    "MSCCLPP_TCP_CONGESTION", "a congestion control name", "the system's", TCP,
        |v| TcpCongestion::parse(v).map(Some);

    /// How long any wait of the TCP transport lasts before it fails (connecting, a
    /// write, a signal).
    tcp_timeout: Duration = Duration::from_secs(10);
    "MSCCLPP_TCP_TIMEOUT_MS", "milliseconds (1 to 3600000)", "10000", TCP,
        |v| whole::<u64>(v, 1, 3_600_000).map(Duration::from_millis);

    /// The interfaces to listen on, as NCCL's `NCCL_SOCKET_IFNAME`: comma-separated
    /// prefixes, `=` for exact names, `^` to exclude. Unset: `NCCL_SOCKET_IFNAME`.
    socket_ifname: Option<String> = None;
    "MSCCLPP_SOCKET_IFNAME", "interface list", "`NCCL_SOCKET_IFNAME`",
        "host: TCP transport, bootstrap root of the NCCL library", |v| Ok(Some(v.trim().to_string()));

    /// NCCL's interface choice, read when `MSCCLPP_SOCKET_IFNAME` is unset (so that a job
    /// set up for NCCL picks the same interface).
    nccl_socket_ifname: Option<String> = None;
    "NCCL_SOCKET_IFNAME", "interface list", "unset: the bootstrap's interface (NCCL's order for a root of the NCCL library)",
        "host: TCP transport, bootstrap root of the NCCL library", |v| Ok(Some(v.trim().to_string()));

    /// The RDMA device of IB connections: a name (`mlx5_0`) or an index.
    ib_device: Option<String> = None;
    "MSCCLPP_IB_DEVICE", "name or index", "the first device", IB, |v| text(v).map(Some);

    /// The port of the RDMA device (from 1).
    ib_port: u8 = 1;
    "MSCCLPP_IB_PORT", "whole number (0 to 255)", "1", IB, |v| whole(v, 0, 255);

    /// The GID index of the port.
    ib_gid_index: u8 = 0;
    "MSCCLPP_IB_GID_INDEX", "whole number (0 to 255)", "0", IB, |v| whole(v, 0, 255);

    /// When IB connections stage their buffer through host memory: `1` always, `0`
    /// never (GPU memory must register), `auto` only GPU buffers that cannot be
    /// registered. Overrides `IbConfig::staging`.
    ib_staging: Option<StagingMode> = None;
    "MSCCLPP_IB_STAGING", "1, 0, auto", "`IbConfig::staging` (auto)", IB,
        |v| StagingMode::parse(v).map(Some);

    /// Bytes of the scratch buffer each rank of the collectives registers.
    coll_scratch_bytes: usize = 256 << 20;
    "MSCCLPP_COLL_SCRATCH_BYTES", "bytes", "256 MiB", COLLECTIVES, |v| bytes(v, 0, u64::MAX);

    /// Largest message (bytes per rank) of the one-shot packet path.
    coll_packet_max_bytes: usize = 1 << 20;
    "MSCCLPP_COLL_PACKET_MAX_BYTES", "bytes", "1 MiB", COLLECTIVES, |v| bytes(v, 0, u64::MAX);

    /// Most blocks of a two-shot or all-gather kernel (1 to 128; GPU only).
    coll_max_blocks: u32 = 128;
    "MSCCLPP_COLL_MAX_BLOCKS", "whole number", "128", COLLECTIVES,
        |v| whole(v, 0, u32::MAX as u64);

    /// Threads per block of the GPU kernels (a multiple of 32, 32 to 512).
    coll_threads: u32 = 512;
    "MSCCLPP_COLL_THREADS", "whole number", "512", COLLECTIVES,
        |v| whole(v, 0, u32::MAX as u64);

    /// Sends and receives of at most this many bytes go as LL packets (0: never). Must be
    /// equal on every rank.
    p2p_packet_max_bytes: usize = 512 << 10;
    "MSCCLPP_P2P_PACKET_MAX_BYTES", "bytes", "512 KiB", COLLECTIVES, |v| bytes(v, 0, u64::MAX);

    /// Blocks of every LL send and receive on a GPU (1 to 16).
    p2p_packet_blocks: u32 = 16;
    "MSCCLPP_P2P_PACKET_BLOCKS", "whole number", "16", COLLECTIVES,
        |v| whole(v, 0, u32::MAX as u64);

    /// Larger sends and receives: pieces in flight per block (1 to 4).
    p2p_depth: u32 = 2;
    "MSCCLPP_P2P_DEPTH", "whole number", "2", COLLECTIVES, |v| whole(v, 0, u32::MAX as u64);

    /// Pipelined broadcast and reduce: pieces in flight per block and link (1 to 8).
    rooted_depth: u32 = 8;
    "MSCCLPP_ROOTED_DEPTH", "whole number", "8", COLLECTIVES, |v| whole(v, 0, u32::MAX as u64);

    /// Pipelined broadcast and reduce: the smallest piece (at most 16 MiB).
    rooted_piece_bytes: usize = 256 << 10;
    "MSCCLPP_ROOTED_PIECE_BYTES", "bytes", "256 KiB", COLLECTIVES, |v| bytes(v, 0, u64::MAX);

    /// Across hosts: send/recv with ranks on other hosts is set up when there are at most
    /// this many of them. Must be equal on every rank.
    p2p_remote_max: usize = 16;
    "MSCCLPP_P2P_REMOTE_MAX", "whole number", "16", COLLECTIVES, |v| whole(v, 0, u64::MAX);

    /// Across hosts: the network of the proxy channels between hosts. Must agree on every
    /// rank.
    cross_transport: CrossTransport = CrossTransport::Auto;
    "MSCCLPP_CROSS_TRANSPORT", "auto, tcp, ib", "auto (IB when built with it and a device is there)",
        COLLECTIVES, CrossTransport::parse;

    /// Across hosts, on a GPU whose partners are all reached over TCP: where the buffers of
    /// the channels between hosts live, pinned host memory mapped into the device (`host`)
    /// or device memory staged by the copy engine (`device`). Each rank may choose.
    cross_buffer: CrossBuffer = CrossBuffer::Host;
    "MSCCLPP_CROSS_BUFFER", "host, device", "host", COLLECTIVES, CrossBuffer::parse;

    /// Across hosts, on the Host backend: most payload bytes of one round with the other
    /// hosts (at least 4 KiB). Must be equal on every rank.
    host_cross_round_bytes: usize = 1 << 20;
    "MSCCLPP_HOST_CROSS_ROUND_BYTES", "bytes", "1 MiB", COLLECTIVES, |v| bytes(v, 0, u64::MAX);

    /// Across hosts: the ranks on other hosts this rank sends to or receives from
    /// (`13,+8,-8`: absolute ranks and ranks relative to this one, a relative rank outside
    /// the job skipped; `all`; `none`). Overrides `CollConfig::p2p_peers`.
    p2p_peers: PeerList = PeerList::All;
    "MSCCLPP_P2P_PEERS", "rank list, all, none", "all (`CollConfig::p2p_peers`)", COLLECTIVES,
        PeerList::parse;

    /// The all-reduce algorithm of calls that leave it to the library; `auto` leaves it to
    /// `CollConfig::all_reduce_algo`.
    allreduce_algo: AllReduceAlgo = AllReduceAlgo::Auto;
    "MSCCLPP_ALLREDUCE_ALGO", "auto, oneshot, twoshot, readreduce, allpairs, proxy", "auto",
        COLLECTIVES, AllReduceAlgo::parse;

    /// The all-gather algorithm of calls that leave it to the library; `auto` leaves it to
    /// `CollConfig::all_gather_algo`.
    allgather_algo: AllGatherAlgo = AllGatherAlgo::Auto;
    "MSCCLPP_ALLGATHER_ALGO", "auto, memory, proxy, packets", "auto", COLLECTIVES,
        AllGatherAlgo::parse;

    /// The broadcast algorithm above the LL size; `auto` leaves it to
    /// `CollConfig::broadcast_algo`.
    broadcast_algo: RootedAlgo = RootedAlgo::Auto;
    "MSCCLPP_BROADCAST_ALGO", "auto, rounds, pipelined", "auto", COLLECTIVES, RootedAlgo::parse;

    /// The reduce algorithm above the LL size; `auto` leaves it to `CollConfig::reduce_algo`.
    reduce_algo: RootedAlgo = RootedAlgo::Auto;
    "MSCCLPP_REDUCE_ALGO", "auto, rounds, pipelined", "auto", COLLECTIVES, RootedAlgo::parse;

    /// Programmatic dependent launch of the latency kernels (sm_90 PTX): `auto` is on with
    /// one rank per GPU and off when ranks share a GPU, `0` off, `1` on (also on a shared
    /// GPU, halving the block cap of every rank there).
    pdl: PdlMode = PdlMode::Auto;
    "MSCCLPP_PDL", "0, 1, auto", "auto", COLLECTIVES, PdlMode::parse;

    /// Proxy lanes built at set-up for the proxy-channel collectives (1 to 8); `auto`: 8.
    proxy_lanes: Option<u32> = None;
    "MSCCLPP_PROXY_LANES", "whole number or auto", "8", COLLECTIVES, auto_whole;

    /// Lanes a proxy-channel call uses; `auto`: chosen by size.
    proxy_blocks: Option<u32> = None;
    "MSCCLPP_PROXY_BLOCKS", "whole number or auto", "auto", COLLECTIVES, auto_whole;

    /// Bytes of each piece a proxy-channel call is cut into; `auto`: chosen by size.
    proxy_chunk_bytes: Option<u64> = None;
    "MSCCLPP_PROXY_CHUNK_BYTES", "bytes or auto", "auto", COLLECTIVES, auto_bytes;

    /// Blocks per lane that feed a proxy-channel call; `auto`: chosen by size.
    proxy_workers: Option<u32> = None;
    "MSCCLPP_PROXY_WORKERS", "whole number or auto", "auto", COLLECTIVES, auto_whole;

    /// What the NCCL library prints on stderr: `WARN` failures, `INFO` (or `TRACE`) also
    /// the setup of each communicator and which path served each kind of call.
    debug: DebugLevel = DebugLevel::None;
    "MSCCLPP_DEBUG", "NONE, WARN, INFO", "NONE", NCCL, DebugLevel::parse;

    /// Calls the NCCL library forwards to the real NCCL instead of running them itself:
    /// `all`, or operation names separated by commas, spaces or semicolons (`allreduce`,
    /// `allgather`, `reducescatter`, `broadcast`, `reduce`, `alltoall`, `sendrecv`; unknown
    /// names are warned about). OR-ed over the ranks.
    nccl_fallback: Vec<String> = Vec::new();
    "MSCCLPP_NCCL_FALLBACK", "list of operations, or all", "none", NCCL, |v| Ok(words(v));

    /// The real NCCL: a library file or a folder holding `libnccl.so.2`; `none` (or `off`,
    /// `no`, `0`) for none (the NCCL library then has no fallback).
    nccl_lib: NcclLib = NcclLib::Search;
    "MSCCLPP_NCCL_LIB", "path, or none", "searched (Python packages, `NCCL_HOME`, system)",
        NCCL_AND_PERF, |v| Ok(nccl_lib(v));

    /// Whether the NCCL library may hand a communicator whose set-up failed on our side to
    /// the real NCCL (agreed over the ranks: off if any rank says no).
    nccl_setup_fallback: bool = true;
    "MSCCLPP_NCCL_SETUP_FALLBACK", "yes/no", "yes", NCCL, flag;

    /// NCCL's fixed root address (`ip:port`, `[ipv6]:port` or `host:port`):
    /// `ncclGetUniqueId` starts no root, rank 0 hosts ours on the next port.
    nccl_comm_id: Option<String> = None;
    "NCCL_COMM_ID", "ip:port", "unset (a root per `ncclGetUniqueId`)", NCCL,
        |v| Ok(Some(v.trim().to_string()));

    /// Internal: set by the perf tool once its ranks' library path is prepared.
    perf_nccl_prepared: bool = false;
    "MSCCLPP_PERF_NCCL_PREPARED", "yes/no", "no", PERF, flag;

    /// Internal: the NCCL file the perf tool prepared its ranks with (for its header).
    perf_nccl_path: Option<String> = None;
    "MSCCLPP_PERF_NCCL_PATH", "path", "unset", PERF, |v| text(v).map(Some);
}

/// `auto` (`None`), or what `parse` reads.
fn or_auto<T>(v: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Option<T>, String> {
    if v.trim().eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    parse(v).map(Some).map_err(|e| format!("{e}, or auto"))
}

/// A whole number, or `auto` (`None`).
fn auto_whole(v: &str) -> Result<Option<u32>, String> {
    or_auto(v, |v| whole(v, 0, u32::MAX as u64))
}

/// Yes/no, or `auto` (`None`).
fn auto_flag(v: &str) -> Result<Option<bool>, String> {
    or_auto(v, flag)
}

/// A byte count, or `auto` (`None`).
fn auto_bytes(v: &str) -> Result<Option<u64>, String> {
    or_auto(v, |v| bytes(v, 0, u64::MAX))
}

/// Words separated by commas, semicolons or spaces.
fn words(v: &str) -> Vec<String> {
    v.split([',', ';', ' ', '\t'])
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// A `MSCCLPP_NCCL_LIB` value.
fn nccl_lib(v: &str) -> NcclLib {
    let v = v.trim();
    if ["none", "off", "0", "no"].contains(&v.to_ascii_lowercase().as_str()) {
        NcclLib::Off
    } else {
        NcclLib::Path(PathBuf::from(v))
    }
}

/// The settings of this process, once read.
static GLOBAL: OnceLock<Result<Settings, SettingsError>> = OnceLock::new();

impl Settings {
    /// The defaults overridden by the variables `vars` gives (name, value): the variables of
    /// [`VARS`] set their field (blank values count as unset), other `MSCCLPP_*` names that
    /// are not [known](is_known) are kept as [`unknown`](Self::unknown), any other name is
    /// ignored. Every value that does not parse is named in the error.
    pub fn from_vars<K, V>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Settings, SettingsError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut s = Settings::default();
        let mut bad = Vec::new();
        for (k, v) in vars {
            let (k, v) = (k.as_ref(), v.as_ref());
            if let Err(e) = s.set(k, v) {
                bad.extend(e.bad);
            }
        }
        // The reference's order, whatever the environment's.
        bad.sort_by_key(|b| VARS.iter().position(|v| v.name == b.var));
        if bad.is_empty() {
            Ok(s)
        } else {
            Err(SettingsError { bad })
        }
    }

    /// [`from_vars`](Self::from_vars) of the variables `get` answers, asked for each name
    /// of [`VARS`] (a launcher's view of its children's environment, say).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        Settings::from_vars(
            VARS.iter()
                .filter_map(|v| get(v.name).map(|value| (v.name, value))),
        )
    }

    /// [`from_vars`](Self::from_vars) of the process environment, read now. A value that is
    /// not Unicode is an error naming its variable.
    pub fn from_env() -> Result<Settings, SettingsError> {
        let mut bad = Vec::new();
        let mut vars = Vec::new();
        for (k, v) in std::env::vars_os() {
            let Ok(k) = k.into_string() else { continue };
            match v.into_string() {
                Ok(v) => vars.push((k, v)),
                Err(v) if VARS.iter().any(|var| var.name == k) => bad.push(BadValue {
                    var: k,
                    value: v.to_string_lossy().into_owned(),
                    expected: "valid UTF-8".into(),
                }),
                Err(v) => vars.push((k, v.to_string_lossy().into_owned())),
            }
        }
        match Settings::from_vars(vars) {
            Ok(s) if bad.is_empty() => Ok(s),
            Ok(_) => Err(SettingsError { bad }),
            Err(mut e) => {
                e.bad.extend(bad);
                Err(e)
            }
        }
    }

    /// Sets one variable by name, as the environment would: `value` parsed into its field
    /// (blank: the default). An `MSCCLPP_*` name that is no setting is recorded as
    /// [`unknown`](Self::unknown); other names are ignored.
    pub fn set(&mut self, var: &str, value: &str) -> Result<(), SettingsError> {
        let result = if value.trim().is_empty() {
            self.reset_field(var).then_some(Ok(()))
        } else {
            self.apply(var, value)
        };
        match result {
            Some(Ok(())) => Ok(()),
            Some(Err(expected)) => Err(SettingsError {
                bad: vec![BadValue {
                    var: var.to_string(),
                    value: value.to_string(),
                    expected,
                }],
            }),
            None => {
                if var.starts_with("MSCCLPP_")
                    && !is_known(var)
                    && !self.unknown.iter().any(|u| u == var)
                {
                    self.unknown.push(var.to_string());
                }
                Ok(())
            }
        }
    }

    /// `MSCCLPP_*` variables given that are no setting of this library (typos, or settings
    /// of another version), in the order given.
    pub fn unknown(&self) -> &[String] {
        &self.unknown
    }

    /// This process's settings: the environment's, read at the first call (or those of
    /// [`init`](Self::init)); every later call returns the same. The first read names each
    /// unknown `MSCCLPP_*` variable on stderr.
    pub fn global() -> Result<&'static Settings, SettingsError> {
        GLOBAL
            .get_or_init(Settings::read_process)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// [`global`](Self::global), or the defaults when the environment holds bad values,
    /// for readers that cannot fail (diagnostics). The error is printed once on stderr;
    /// callers that can fail report it with [`global`](Self::global).
    pub fn global_or_default() -> &'static Settings {
        static DEFAULTS: OnceLock<Settings> = OnceLock::new();
        match Settings::global() {
            Ok(s) => s,
            Err(e) => DEFAULTS.get_or_init(|| {
                warn_line(&format!(
                    "mscclpp: settings: {e}; using the defaults for now"
                ));
                Settings::default()
            }),
        }
    }

    /// Sets this process's settings before the library first reads them: the
    /// environment's, then `api` applied to them (so a value set here wins over the
    /// environment). Fails when they were read already ([`InitError::AlreadyRead`]: the
    /// process keeps those) or the environment holds bad values.
    pub fn init(api: impl FnOnce(&mut Settings)) -> Result<&'static Settings, InitError> {
        let mut ran = false;
        let got = GLOBAL.get_or_init(|| {
            ran = true;
            let mut s = Settings::read_process()?;
            api(&mut s);
            Ok(s)
        });
        match (ran, got) {
            (false, _) => Err(InitError::AlreadyRead),
            (true, Ok(s)) => Ok(s),
            (true, Err(e)) => Err(InitError::Invalid(e.clone())),
        }
    }

    /// The environment's settings, with a warning for each unknown `MSCCLPP_*` variable.
    fn read_process() -> Result<Settings, SettingsError> {
        let s = Settings::from_env()?;
        for name in &s.unknown {
            let hint = nearest(name).map_or(String::new(), |n| format!(" (did you mean {n}?)"));
            warn_line(&format!(
                "mscclpp: warning: {name} is set but is no setting of this library{hint}; \
                 see docs/guide/08-settings.md"
            ));
        }
        Ok(s)
    }
}

/// Writes `line` on stderr in one write (lines of ranks sharing stderr stay whole).
fn warn_line(line: &str) {
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}
