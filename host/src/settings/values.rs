//! The kinds of values settings take: the enums a setting chooses ([`Choice`]), the ranks of
//! `MSCCLPP_P2P_PEERS`, and the parsers of numbers, sizes, durations and yes/no.

use super::*;

/// A setting with a fixed set of values (an enum): the words each value is written as.
pub trait Choice: Sized + Copy + 'static {
    /// Each accepted word (lower case) and its value; the first word of each value is its
    /// name.
    const WORDS: &'static [(&'static str, Self)];
    /// The accepted forms, for errors and the reference.
    const EXPECTED: &'static str;

    /// Reads `text` (surrounding spaces and case ignored).
    fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim().to_ascii_lowercase();
        Self::WORDS
            .iter()
            .find(|(w, _)| *w == t)
            .map(|&(_, v)| v)
            .ok_or_else(|| Self::EXPECTED.to_string())
    }
}

/// All-reduce algorithm ([`Settings::allreduce_algo`], and each call's choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllReduceAlgo {
    /// Chosen by size and rank count (and `MSCCLPP_ALLREDUCE_ALGO`).
    Auto,
    /// Every rank sends its whole input as LL packets to every peer; each reduces locally.
    /// One kernel, no separate signal: lowest latency for small messages.
    OneShot,
    /// Reduce-scatter then all-gather through the scratch, with semaphores: for large ones.
    /// Each rank puts the peers' parts of its input into their scratch (NVLink writes).
    TwoShot,
    /// Two-shot where each rank stages the peers' parts in its own scratch and the owner
    /// reduces while reading them over NVLink (read-reduce), overlapping the reduction with
    /// the transfer.
    ReadReduce,
    /// Every rank puts its whole input into every peer's scratch and reduces all of it
    /// locally: two barriers per round against three for `TwoShot`, at twice its NVLink
    /// traffic; for mid sizes.
    AllPairs,
    /// Over proxy channels: the copy engine (P2P) or the proxy's memcpy (Host) moves the
    /// data between scratches, one block stages and reduces. For peers whose memory cannot
    /// be mapped; never chosen by `Auto`.
    Proxy,
}

impl Choice for AllReduceAlgo {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("auto", Self::Auto),
        ("oneshot", Self::OneShot),
        ("one-shot", Self::OneShot),
        ("one_shot", Self::OneShot),
        ("twoshot", Self::TwoShot),
        ("two-shot", Self::TwoShot),
        ("two_shot", Self::TwoShot),
        ("readreduce", Self::ReadReduce),
        ("read-reduce", Self::ReadReduce),
        ("read_reduce", Self::ReadReduce),
        ("allpairs", Self::AllPairs),
        ("all-pairs", Self::AllPairs),
        ("all_pairs", Self::AllPairs),
        ("proxy", Self::Proxy),
    ];
    const EXPECTED: &'static str = "auto, oneshot, twoshot, readreduce, allpairs or proxy";
}

/// All-gather algorithm ([`Settings::allgather_algo`], and each call's choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllGatherAlgo {
    /// Chosen by size and rank count (and `MSCCLPP_ALLGATHER_ALGO`).
    Auto,
    /// GPU threads copy over memory channels.
    Memory,
    /// Over proxy channels (copy engine / proxy memcpy); never chosen by `Auto`.
    Proxy,
    /// Every rank writes its input as LL packets into every peer's packet scratch: no
    /// signal, no barrier (as one-shot all-reduce); for small messages, up to the one-shot
    /// size per rank.
    Packets,
}

impl Choice for AllGatherAlgo {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("auto", Self::Auto),
        ("memory", Self::Memory),
        ("proxy", Self::Proxy),
        ("packets", Self::Packets),
        ("ll", Self::Packets),
    ];
    const EXPECTED: &'static str = "auto, memory, proxy or packets";
}

/// Algorithm of a broadcast or reduce above the LL size (messages up to the collectives'
/// `packet_max_bytes` always go as LL packets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RootedAlgo {
    /// Chosen by size (and `MSCCLPP_BROADCAST_ALGO` / `MSCCLPP_REDUCE_ALGO`): `Pipelined`
    /// above the collectives' `ROOTED_PIPELINED_ABOVE`, else `Rounds`.
    Auto,
    /// Through the scratch in rounds, a semaphore barrier per round (the put path).
    Rounds,
    /// Pieces streamed through the scratch with no barrier per round: the receiving side
    /// copies out (or reduces) piece `k` while piece `k + 1` arrives, as the pipelined
    /// send/receive. Broadcast passes the pieces down a chain of the ranks from the root
    /// (each link carries the data once); reduce has every rank write into its slot of the
    /// root's scratch. Pieces per the collectives' `rooted_piece_bytes` and `rooted_depth`.
    Pipelined,
}

impl Choice for RootedAlgo {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("auto", Self::Auto),
        ("rounds", Self::Rounds),
        ("put", Self::Rounds),
        ("pipelined", Self::Pipelined),
        ("pipe", Self::Pipelined),
    ];
    const EXPECTED: &'static str = "auto, rounds or pipelined";
}

/// The network between hosts ([`Settings::cross_transport`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrossTransport {
    /// InfiniBand / RoCE when this build has the `ib` feature and the machine an RDMA
    /// device (as NCCL prefers its IB transport), TCP otherwise.
    Auto,
    /// TCP sockets.
    Tcp,
    /// RDMA writes (the `ib` feature and an RDMA device).
    Ib,
}

impl Choice for CrossTransport {
    const WORDS: &'static [(&'static str, Self)] =
        &[("auto", Self::Auto), ("tcp", Self::Tcp), ("ib", Self::Ib)];
    const EXPECTED: &'static str = "auto, tcp or ib";
}

/// Where the buffers of the proxy channels across hosts live on a GPU reached over TCP
/// ([`Settings::cross_buffer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrossBuffer {
    /// Pinned host memory mapped into the device, which the sockets read and write.
    Host,
    /// Device memory, staged through pinned slots by the copy engine.
    Device,
}

impl Choice for CrossBuffer {
    const WORDS: &'static [(&'static str, Self)] =
        &[("host", Self::Host), ("device", Self::Device)];
    const EXPECTED: &'static str = "`host` or `device`";
}

/// Programmatic dependent launch of the latency kernels ([`Settings::pdl`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PdlMode {
    /// On with one rank per GPU, off when ranks share a GPU.
    Auto,
    /// Off.
    Off,
    /// On, also when ranks share a GPU (their block cap is then halved).
    On,
}

impl Choice for PdlMode {
    const WORDS: &'static [(&'static str, Self)] =
        &[("auto", Self::Auto), ("0", Self::Off), ("1", Self::On)];
    const EXPECTED: &'static str =
        "0 (no dependent launch), 1 (dependent launch, also when ranks share a GPU) or auto";
}

/// What kind of kernel image is loaded ([`Settings::kernel_image`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImagePolicy {
    /// A cubin when one fits the device and the driver takes it, else PTX.
    Auto,
    /// PTX only.
    Ptx,
    /// A cubin only.
    Cubin,
}

impl Choice for ImagePolicy {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("auto", Self::Auto),
        ("ptx", Self::Ptx),
        ("cubin", Self::Cubin),
    ];
    const EXPECTED: &'static str = "auto, ptx or cubin";
}

/// How a proxy signals the flag after the data of a put ([`Settings::proxy_flag`]). Both
/// ends of a connection must use the same mode. Only proxy channels on a GPU backend are
/// affected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ProxyFlagMode {
    /// `cuStreamWriteValue64` on the proxy's stream after the copies (the seed's way).
    #[default]
    Stream,
    /// A CPU store into host memory the peer GPU polls, once the copies are known done.
    Cpu,
}

impl Choice for ProxyFlagMode {
    const WORDS: &'static [(&'static str, Self)] = &[("stream", Self::Stream), ("cpu", Self::Cpu)];
    const EXPECTED: &'static str = "`stream` or `cpu`";
}

/// The name of a TCP congestion control algorithm ([`Settings::tcp_congestion`]), as the
/// kernel spells it (`cubic`, `bbr`, `reno`, ...): at most 15 letters, digits, `_` or `-`,
/// kept inline so that the TCP transport's settings stay `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcpCongestion {
    len: u8,
    name: [u8; Self::MAX],
}

impl TcpCongestion {
    /// The longest name the kernel takes (`TCP_CA_NAME_MAX` less its terminating zero).
    pub const MAX: usize = 15;

    /// Reads `text` (surrounding spaces ignored, case kept: the kernel's names are case
    /// sensitive).
    pub fn parse(text: &str) -> Result<TcpCongestion, String> {
        let t = text.trim();
        let ok = !t.is_empty()
            && t.len() <= Self::MAX
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            return Err(format!(
                "a congestion control name of 1 to {} letters, digits, `_` or `-` \
                 (as in /proc/sys/net/ipv4/tcp_available_congestion_control)",
                Self::MAX
            ));
        }
        let mut name = [0; Self::MAX];
        name[..t.len()].copy_from_slice(t.as_bytes());
        Ok(TcpCongestion {
            len: t.len() as u8,
            name,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.name[..self.len as usize]).expect("checked ASCII")
    }
}

impl fmt::Debug for TcpCongestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TcpCongestion({:?})", self.as_str())
    }
}

impl fmt::Display for TcpCongestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When an IB connection stages its buffer through host memory ([`Settings::ib_staging`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StagingMode {
    /// GPU buffers that cannot be registered (no dma-buf, no nvidia-peermem) are staged;
    /// host buffers never are.
    #[default]
    Auto,
    /// Every IB connection stages its buffer (GPU or host), e.g. to test the path.
    Always,
    /// Never: a GPU buffer that cannot be registered fails setup naming both reasons.
    Never,
}

impl Choice for StagingMode {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("auto", Self::Auto),
        ("1", Self::Always),
        ("always", Self::Always),
        ("on", Self::Always),
        ("true", Self::Always),
        ("0", Self::Never),
        ("never", Self::Never),
        ("off", Self::Never),
        ("false", Self::Never),
    ];
    const EXPECTED: &'static str = "1 (always), 0 (never) or auto";
}

/// How much the NCCL library prints on stderr ([`Settings::debug`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DebugLevel {
    /// Nothing.
    None,
    /// Failures.
    Warn,
    /// Failures, setup and the path of each kind of call.
    Info,
}

impl Choice for DebugLevel {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("none", Self::None),
        ("version", Self::None),
        ("0", Self::None),
        ("warn", Self::Warn),
        ("info", Self::Info),
        ("trace", Self::Info),
        ("abort", Self::Info),
        ("debug", Self::Info),
    ];
    const EXPECTED: &'static str = "NONE, VERSION, WARN, INFO, TRACE, ABORT or DEBUG";
}

/// Which NCCL the NCCL library falls back to, or the perf tool compares with
/// ([`Settings::nccl_lib`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum NcclLib {
    /// Search the usual places.
    #[default]
    Search,
    /// None: no fallback (`none`, `off`, `no`, `0`).
    Off,
    /// This library file, or a folder holding `libnccl.so.2`.
    Path(PathBuf),
}

/// One entry of [`PeerList::Ranks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerRank {
    /// This rank (`13`).
    Absolute(u64),
    /// This far from the rank of the reader (`+8`, `-8`).
    Relative(i64),
}

/// The ranks on other hosts a rank sends to or receives from ([`Settings::p2p_peers`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum PeerList {
    /// Every rank on another host (`all`): the collectives' default.
    #[default]
    All,
    /// These ranks (`none`: no rank).
    Ranks(Vec<PeerRank>),
}

impl PeerList {
    /// The forms accepted.
    pub const EXPECTED: &'static str = "ranks separated by commas or spaces, each absolute (13) \
                                        or relative to the rank (+8, -8), or all, or none";

    /// Reads `text`: ranks separated by commas or spaces, each absolute (`13`) or relative
    /// (`+8`, `-8`); `all` or blank: [`PeerList::All`]; `none`: no rank.
    pub fn parse(text: &str) -> Result<PeerList, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "all" => return Ok(PeerList::All),
            "none" => return Ok(PeerList::Ranks(Vec::new())),
            _ => {}
        }
        let mut out = Vec::new();
        for item in text
            .split([',', ' '])
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (sign, digits) = match item.as_bytes()[0] {
                b'+' => (1, &item[1..]),
                b'-' => (-1, &item[1..]),
                _ => (0, item),
            };
            let n = digits
                .parse::<u64>()
                .ok()
                .filter(|&n| sign == 0 || n <= i64::MAX as u64)
                .ok_or_else(|| {
                    format!("{item:?} is not a rank (expected e.g. 13, +8 or -8, or all / none)")
                })?;
            out.push(match sign {
                0 => PeerRank::Absolute(n),
                s => PeerRank::Relative(s * n as i64),
            });
        }
        Ok(PeerList::Ranks(out))
    }
}

/// A whole number in `lo..=hi`.
pub(super) fn whole<T: TryFrom<u64>>(text: &str, lo: u64, hi: u64) -> Result<T, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| format!("a whole number from {lo} to {hi}"))
}

/// A byte count in `lo..=hi` ([`parse_bytes`]'s forms).
pub(super) fn bytes<T: TryFrom<u64>>(text: &str, lo: u64, hi: u64) -> Result<T, String> {
    let expected = || {
        format!(
            "a byte count from {lo} to {hi} (a number with an optional K, M, G or T suffix, \
             e.g. 64K)"
        )
    };
    parse_bytes(text)
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(expected)
}

/// Seconds above 0 and at most `max` (fractions allowed).
pub(super) fn seconds(text: &str, max: f64) -> Result<Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= max)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("a number of seconds above 0 and at most {max}"))
}

/// Yes or no.
pub(super) fn flag(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("1, true, yes or on; 0, false, no or off".into()),
    }
}

/// Any text, kept as written.
pub(super) fn text(text: &str) -> Result<String, String> {
    Ok(text.to_string())
}

/// Parses a byte count the way nccl-tests does: a number with an optional suffix `K`, `M`,
/// `G` or `T` (powers of 1024; `KB`, `KiB` and a trailing `B` are accepted too). Fractions are
/// allowed when the result is a whole number of bytes (`1.5K`). Zero is allowed.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "{text:?} is not a size (expected e.g. 8, 64K, 32M, 1G)"
        ));
    }
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "{text:?}: unknown size suffix {:?} (use K, M, G or T)",
                suffix.trim()
            ));
        }
    };
    let unit = 1u64 << shift;
    if let Some((whole, frac)) = number.split_once('.') {
        if frac.contains('.') || (whole.is_empty() && frac.is_empty()) {
            return Err(format!("{text:?} is not a size"));
        }
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a size"))?;
        let bytes = value * unit as f64;
        if !(bytes.is_finite() && bytes < u64::MAX as f64) || bytes.fract() != 0.0 {
            return Err(format!("{text:?} is not a whole number of bytes"));
        }
        Ok(bytes as u64)
    } else {
        number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(unit))
            .ok_or_else(|| format!("{text:?} is too large"))
    }
}
