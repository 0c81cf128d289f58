//! NCCL's C types with their 2.2x ABI values, and what maps onto ours.

use std::ffi::{c_char, c_int, c_uint};

use mscclpp_host::collectives::{DataType, ReduceOp};

/// `ncclResult_t` (a C enum: `int`).
pub type NcclResult = c_int;
/// `ncclDataType_t`.
pub type NcclDataType = c_int;
/// `ncclRedOp_t`.
pub type NcclRedOp = c_int;

/// Result codes.
pub mod result {
    use super::NcclResult;
    /// Success.
    pub const SUCCESS: NcclResult = 0;
    /// A CUDA call failed.
    pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
    /// A system call or the environment failed (no GPU, sockets, ...).
    pub const SYSTEM_ERROR: NcclResult = 2;
    /// A bug of the library.
    pub const INTERNAL_ERROR: NcclResult = 3;
    /// A bad argument.
    pub const INVALID_ARGUMENT: NcclResult = 4;
    /// A call in a state that does not allow it, or something not available.
    pub const INVALID_USAGE: NcclResult = 5;
    /// A peer failed.
    pub const REMOTE_ERROR: NcclResult = 6;
    /// A nonblocking operation is still running.
    pub const IN_PROGRESS: NcclResult = 7;
    /// Number of result codes of the 2.28 ABI.
    pub const NUM_RESULTS: NcclResult = 8;
}

/// The NCCL version code our ABI follows (2.28.x): reported when no real NCCL is loaded.
pub const ABI_VERSION_CODE: c_int = 22800;

/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;
/// `ncclNumOps`: the first value of a dynamic (`ncclRedOpCreatePreMulSum`) operation.
pub const NUM_OPS: NcclRedOp = 5;
/// `ncclMaxRedOp` for a 4-byte enum.
pub const MAX_RED_OP: NcclRedOp = 0x7fff_ffff;
/// `ncclNumTypes` of the 2.28 ABI.
pub const NUM_TYPES: NcclDataType = 12;
/// `ncclSum`.
pub const OP_SUM: NcclRedOp = 0;
/// The magic of `ncclConfig_t` and `ncclSimInfo_t`-style structs (`NCCL_CONFIG_INITIALIZER`).
pub const CONFIG_MAGIC: c_uint = 0xcafe_beef;

/// Name of a data type as nccl-tests prints it, or `None` for a value outside the ABI.
pub fn dtype_name(d: NcclDataType) -> Option<&'static str> {
    Some(match d {
        0 => "int8",
        1 => "uint8",
        2 => "int32",
        3 => "uint32",
        4 => "int64",
        5 => "uint64",
        6 => "half",
        7 => "float",
        8 => "double",
        9 => "bfloat16",
        10 => "f8e4m3",
        11 => "f8e5m2",
        _ => return None,
    })
}

/// Bytes per element of a valid data type.
pub fn dtype_size(d: NcclDataType) -> Option<usize> {
    Some(match d {
        0 | 1 | 10 | 11 => 1,
        6 | 9 => 2,
        2 | 3 => 4,
        4 | 5 | 8 => 8,
        7 => 4,
        _ => return None,
    })
}

/// Our data type for an NCCL one (every type of the 2.28 ABI has one).
pub fn native_dtype(d: NcclDataType) -> Option<DataType> {
    Some(match d {
        0 => DataType::I8,
        1 => DataType::U8,
        2 => DataType::I32,
        3 => DataType::U32,
        4 => DataType::I64,
        5 => DataType::U64,
        6 => DataType::F16,
        7 => DataType::F32,
        8 => DataType::F64,
        9 => DataType::Bf16,
        10 => DataType::Fp8E4M3,
        11 => DataType::Fp8E5M2,
        _ => return None,
    })
}

/// Our operation for a built-in NCCL one (`None` for `ncclRedOpCreatePreMulSum`'s, whose
/// scalars the communicator holds: `comm::PreMulOps`).
pub fn native_op(op: NcclRedOp) -> Option<ReduceOp> {
    Some(match op {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Prod,
        2 => ReduceOp::Max,
        3 => ReduceOp::Min,
        4 => ReduceOp::Avg,
        _ => return None,
    })
}

/// Name of a reduction operation (dynamic ones are `premulsum`).
pub fn op_name(op: NcclRedOp) -> &'static str {
    match op {
        0 => "sum",
        1 => "prod",
        2 => "max",
        3 => "min",
        4 => "avg",
        _ => "premulsum",
    }
}

/// `ncclScalarDevice`: a pre-multiplied sum's scalar in device memory, read by each call.
pub const SCALAR_DEVICE: c_int = 0;
/// `ncclScalarHostImmediate`: the scalar in host memory, read at `ncclRedOpCreatePreMulSum`.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;

/// Whether `op` is a built-in operation.
pub fn is_builtin_op(op: NcclRedOp) -> bool {
    (0..NUM_OPS).contains(&op)
}

/// NCCL's text for a result code (our own words).
pub fn error_string(r: NcclResult) -> &'static std::ffi::CStr {
    match r {
        result::SUCCESS => c"no error",
        result::UNHANDLED_CUDA_ERROR => c"unhandled cuda error (a CUDA call failed)",
        result::SYSTEM_ERROR => c"unhandled system error (no GPU, network, memory or file)",
        result::INTERNAL_ERROR => c"internal error (please report it)",
        result::INVALID_ARGUMENT => c"invalid argument (see ncclGetLastError)",
        result::INVALID_USAGE => c"invalid usage (see ncclGetLastError)",
        result::REMOTE_ERROR => c"remote process exited or there was a network error",
        result::IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

/// `ncclConfig_t` of NCCL 2.28 (`ncclConfig_v22800`): a versioned header (`size`, `magic`,
/// `version`) then the fields. Callers built against older headers pass a shorter struct:
/// only the fields within `size` are read.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclConfig {
    /// `sizeof(ncclConfig_t)` of the caller's header.
    pub size: usize,
    /// [`CONFIG_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// 0: nonblocking calls allowed; 1 or unset: blocking.
    pub blocking: c_int,
    /// Thread block cluster size.
    pub cga_cluster_size: c_int,
    /// Fewest CTAs.
    pub min_ctas: c_int,
    /// Most CTAs.
    pub max_ctas: c_int,
    /// Network plugin name.
    pub net_name: *const c_char,
    /// Share resources with split children.
    pub split_share: c_int,
    /// Network traffic class.
    pub traffic_class: c_int,
    /// Communicator name.
    pub comm_name: *const c_char,
    /// CollNet on/off.
    pub collnet_enable: c_int,
    /// CTA policy flags.
    pub cta_policy: c_int,
    /// Share resources with shrink children.
    pub shrink_share: c_int,
    /// NVLS CTAs.
    pub nvls_ctas: c_int,
    /// Channels per network peer.
    pub n_channels_per_net_peer: c_int,
    /// NVLink-centric scheduling.
    pub nvlink_centric_sched: c_int,
}

/// `NCCL_CONFIG_UNDEF_INT`.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;

impl NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER` of our header (NCCL 2.28): every setting unset.
    pub fn initializer() -> NcclConfig {
        NcclConfig {
            size: std::mem::size_of::<NcclConfig>(),
            magic: CONFIG_MAGIC,
            version: ABI_VERSION_CODE as c_uint,
            blocking: CONFIG_UNDEF_INT,
            cga_cluster_size: CONFIG_UNDEF_INT,
            min_ctas: CONFIG_UNDEF_INT,
            max_ctas: CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: CONFIG_UNDEF_INT,
            traffic_class: CONFIG_UNDEF_INT,
            comm_name: std::ptr::null(),
            collnet_enable: CONFIG_UNDEF_INT,
            cta_policy: CONFIG_UNDEF_INT,
            shrink_share: CONFIG_UNDEF_INT,
            nvls_ctas: CONFIG_UNDEF_INT,
            n_channels_per_net_peer: CONFIG_UNDEF_INT,
            nvlink_centric_sched: CONFIG_UNDEF_INT,
        }
    }
}

/// What we read from a caller's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigView {
    /// `blocking` (unset means blocking).
    pub blocking: bool,
}

impl Default for ConfigView {
    fn default() -> Self {
        ConfigView { blocking: true }
    }
}

/// Checks a caller's config header and reads the fields we use.
///
/// # Safety
/// `cfg` is null or points to at least 16 readable bytes, and to `size` bytes when its
/// header is valid.
pub unsafe fn read_config(cfg: *const NcclConfig) -> Result<ConfigView, String> {
    if cfg.is_null() {
        return Ok(ConfigView::default());
    }
    // SAFETY: the header (size, magic, version) is present in every version (caller contract).
    let (size, magic) = unsafe { ((*cfg).size, (*cfg).magic) };
    if magic != CONFIG_MAGIC {
        return Err(format!(
            "config has magic {magic:#x}, not {CONFIG_MAGIC:#x}: initialise it with \
             NCCL_CONFIG_INITIALIZER"
        ));
    }
    let blocking_end = std::mem::offset_of!(NcclConfig, blocking) + 4;
    if size < blocking_end {
        return Ok(ConfigView::default());
    }
    // SAFETY: within `size` bytes (checked above).
    let blocking = unsafe { (*cfg).blocking };
    // As NCCL: unset (NCCL_CONFIG_UNDEF_INT) means blocking; anything but 0 and 1 is refused.
    match blocking {
        0 => Ok(ConfigView { blocking: false }),
        1 | CONFIG_UNDEF_INT => Ok(ConfigView { blocking: true }),
        v => Err(format!(
            "config has blocking = {v}: it must be 0 (nonblocking) or 1 (blocking), or left \
             unset"
        )),
    }
}

/// The calls that can run on our collectives, as `MSCCLPP_NCCL_FALLBACK` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeCall {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclBroadcast` and `ncclBcast`.
    Broadcast,
    /// `ncclReduce`.
    Reduce,
    /// `ncclAlltoAll`.
    AllToAll,
    /// `ncclSend` and `ncclRecv`: one switch for both, since a send and its receive must run
    /// on the same transport.
    SendRecv,
}

impl NativeCall {
    /// Every native call.
    pub const ALL: [NativeCall; 7] = [
        NativeCall::AllReduce,
        NativeCall::AllGather,
        NativeCall::ReduceScatter,
        NativeCall::Broadcast,
        NativeCall::Reduce,
        NativeCall::AllToAll,
        NativeCall::SendRecv,
    ];

    /// The name `MSCCLPP_NCCL_FALLBACK` takes (and the log prints).
    pub fn name(self) -> &'static str {
        match self {
            NativeCall::AllReduce => "allreduce",
            NativeCall::AllGather => "allgather",
            NativeCall::ReduceScatter => "reducescatter",
            NativeCall::Broadcast => "broadcast",
            NativeCall::Reduce => "reduce",
            NativeCall::AllToAll => "alltoall",
            NativeCall::SendRecv => "sendrecv",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Which native calls `MSCCLPP_NCCL_FALLBACK` sends to the real NCCL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fallback {
    /// One bit per [`NativeCall`] forwarded (`all` sets every bit).
    pub mask: u8,
    /// Names not understood (warned about).
    pub unknown: Vec<String>,
    /// Sends and receives are forwarded whatever the mask says: our collectives cannot
    /// reach some ranks on other hosts (more of them than `MSCCLPP_P2P_REMOTE_MAX`; set at
    /// set-up when any rank says so).
    pub p2p_off: bool,
}

impl Fallback {
    /// Every call forwarded.
    pub const ALL_MASK: u8 = (1 << NativeCall::ALL.len()) - 1;

    /// Reads `all`, `none`, or a comma-separated list of calls (`allreduce`, `allgather`,
    /// `reducescatter`, `broadcast`/`bcast`, `reduce`, `alltoall`, `send`/`recv`/`sendrecv`
    /// (all three mean both directions); any case, `_`/`-` and an `nccl` prefix ignored;
    /// `gather` and `scatter` are accepted and change nothing: they follow `sendrecv`, as the
    /// sends and receives they are made of).
    pub fn parse(s: &str) -> Fallback {
        let mut f = Fallback::default();
        for word in s.split([',', ' ', ';']).filter(|w| !w.trim().is_empty()) {
            let w: String = word
                .trim()
                .to_ascii_lowercase()
                .chars()
                .filter(|c| *c != '_' && *c != '-')
                .collect();
            let w = w.strip_prefix("nccl").unwrap_or(&w).to_string();
            let call = match w.as_str() {
                "all" => {
                    f.mask = Self::ALL_MASK;
                    continue;
                }
                "none" | "0" | "" | "gather" | "scatter" => continue,
                "allreduce" => NativeCall::AllReduce,
                "allgather" => NativeCall::AllGather,
                "reducescatter" => NativeCall::ReduceScatter,
                "broadcast" | "bcast" => NativeCall::Broadcast,
                "reduce" => NativeCall::Reduce,
                "alltoall" => NativeCall::AllToAll,
                "send" | "recv" | "sendrecv" | "p2p" => NativeCall::SendRecv,
                _ => {
                    f.unknown.push(word.trim().to_string());
                    continue;
                }
            };
            f.mask |= call.bit();
        }
        f
    }

    /// Whether `MSCCLPP_NCCL_FALLBACK` names `call` (on some rank).
    pub fn named(&self, call: NativeCall) -> bool {
        self.mask & call.bit() != 0
    }

    /// Whether `call` may run natively.
    pub fn native(&self, call: NativeCall) -> bool {
        !self.named(call) && !(self.p2p_off && call == NativeCall::SendRecv)
    }

    /// The names of the calls that may run natively, comma-separated (`-` for none).
    pub fn native_names(&self) -> String {
        let v: Vec<&str> = NativeCall::ALL
            .iter()
            .filter(|c| self.native(**c))
            .map(|c| c.name())
            .collect();
        if v.is_empty() {
            "-".into()
        } else {
            v.join(",")
        }
    }
}

/// Rank order of a split: the members with `colors[me]`'s color, ordered by key then by
/// parent rank. Returns `None` for [`SPLIT_NOCOLOR`], else the members' parent ranks and
/// `me`'s place among them.
pub fn split_members(colors_keys: &[(c_int, c_int)], me: usize) -> Option<(Vec<usize>, usize)> {
    let (color, _) = colors_keys[me];
    if color == SPLIT_NOCOLOR {
        return None;
    }
    let mut members: Vec<usize> = (0..colors_keys.len())
        .filter(|&r| colors_keys[r].0 == color)
        .collect();
    members.sort_by_key(|&r| (colors_keys[r].1, r));
    let place = members
        .iter()
        .position(|&r| r == me)
        .expect("me is a member");
    Some((members, place))
}

/// Members of a shrink: every rank of `nranks` not excluded, in rank order; `me`'s place, or
/// `None` when `me` is excluded.
pub fn shrink_members(nranks: usize, excluded: &[c_int], me: usize) -> Option<(Vec<usize>, usize)> {
    let members: Vec<usize> = (0..nranks)
        .filter(|&r| !excluded.iter().any(|&e| e >= 0 && e as usize == r))
        .collect();
    let place = members.iter().position(|&r| r == me)?;
    Some((members, place))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_values() {
        assert_eq!(result::IN_PROGRESS, 7);
        assert_eq!(native_dtype(7), Some(DataType::F32));
        assert_eq!(native_dtype(6), Some(DataType::F16));
        assert_eq!(native_dtype(9), Some(DataType::Bf16));
        for d in 0..NUM_TYPES {
            let ours = native_dtype(d).unwrap();
            assert_eq!(Some(ours.size()), dtype_size(d), "{d}");
            assert_eq!(Some(ours.name()), dtype_name(d), "{d}");
        }
        for d in [12, -1] {
            assert_eq!(native_dtype(d), None, "{d}");
        }
        for op in 0..NUM_OPS {
            assert_eq!(native_op(op).unwrap().name(), op_name(op), "{op}");
        }
        assert_eq!(native_op(NUM_OPS), None);
        assert_eq!(dtype_name(8), Some("double"));
        assert_eq!(dtype_name(NUM_TYPES), None);
        assert_eq!(dtype_size(8), Some(8));
        assert_eq!(dtype_size(9), Some(2));
        assert_eq!(dtype_size(12), None);
        assert!(is_builtin_op(4) && !is_builtin_op(5) && !is_builtin_op(-1));
        assert_eq!(op_name(4), "avg");
    }

    #[test]
    fn config_layout_is_nccl_2_28() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(NcclConfig, blocking), 16);
        assert_eq!(offset_of!(NcclConfig, net_name), 32);
        assert_eq!(offset_of!(NcclConfig, split_share), 40);
        assert_eq!(offset_of!(NcclConfig, comm_name), 48);
        assert_eq!(offset_of!(NcclConfig, collnet_enable), 56);
        assert_eq!(offset_of!(NcclConfig, nvlink_centric_sched), 76);
        assert_eq!(size_of::<NcclConfig>(), 80);
    }

    #[test]
    fn config_checks() {
        let mut c = NcclConfig::initializer();
        assert_eq!(
            (c.size, c.magic, c.version),
            (size_of::<NcclConfig>(), CONFIG_MAGIC, 22800)
        );
        c.blocking = 0;
        // SAFETY: a live local.
        assert_eq!(
            unsafe { read_config(&c) },
            Ok(ConfigView { blocking: false })
        );
        c.blocking = CONFIG_UNDEF_INT;
        // SAFETY: as above.
        assert_eq!(
            unsafe { read_config(&c) },
            Ok(ConfigView { blocking: true })
        );
        c.blocking = 1;
        // SAFETY: as above.
        assert_eq!(
            unsafe { read_config(&c) },
            Ok(ConfigView { blocking: true })
        );
        // NCCL refuses other values ("Invalid config blocking attribute value 5").
        for v in [5, -1, 2] {
            c.blocking = v;
            // SAFETY: as above.
            let e = unsafe { read_config(&c) }.unwrap_err();
            assert!(e.contains(&format!("blocking = {v}")), "{e}");
        }
        c.blocking = 1;
        c.magic = 0;
        // SAFETY: as above.
        assert!(unsafe { read_config(&c) }.is_err());
        // SAFETY: null is allowed.
        assert_eq!(
            unsafe { read_config(std::ptr::null()) },
            Ok(ConfigView::default())
        );
    }

    #[test]
    fn fallback_parse() {
        let f = Fallback::parse("all");
        assert!(NativeCall::ALL.iter().all(|c| !f.native(*c)));
        assert_eq!(f.native_names(), "-");
        let f = Fallback::parse("ncclAllReduce, reduce_scatter");
        assert!(!f.native(NativeCall::AllReduce) && !f.native(NativeCall::ReduceScatter));
        assert!(f.native(NativeCall::AllGather) && f.native(NativeCall::SendRecv));
        assert!(f.unknown.is_empty());
        let f = Fallback::parse("all-gather,bogus");
        assert!(f.native(NativeCall::AllReduce) && !f.native(NativeCall::AllGather));
        assert_eq!(f.unknown, vec!["bogus".to_string()]);
        assert_eq!(Fallback::parse(""), Fallback::default());
        assert_eq!(
            Fallback::default().native_names(),
            "allreduce,allgather,reducescatter,broadcast,reduce,alltoall,sendrecv"
        );
        // A send and its receive must agree: either name forwards both.
        for w in ["send", "ncclRecv", "SendRecv"] {
            let f = Fallback::parse(w);
            assert!(!f.native(NativeCall::SendRecv), "{w}");
            assert_eq!(f.mask.count_ones(), 1, "{w}");
        }
        let f = Fallback::parse("bcast;ncclAlltoAll reduce gather");
        assert!(!f.native(NativeCall::Broadcast) && !f.native(NativeCall::AllToAll));
        assert!(!f.native(NativeCall::Reduce) && f.native(NativeCall::ReduceScatter));
        assert!(f.unknown.is_empty());
    }

    #[test]
    fn split_order() {
        // rank: (color, key)
        let ck = [(0, 5), (1, 0), (0, 5), (0, -1), (SPLIT_NOCOLOR, 0), (1, 0)];
        assert_eq!(split_members(&ck, 0), Some((vec![3, 0, 2], 1)));
        assert_eq!(split_members(&ck, 2), Some((vec![3, 0, 2], 2)));
        assert_eq!(split_members(&ck, 3), Some((vec![3, 0, 2], 0)));
        assert_eq!(split_members(&ck, 5), Some((vec![1, 5], 1)));
        assert_eq!(split_members(&ck, 4), None);
    }

    #[test]
    fn shrink_order() {
        assert_eq!(shrink_members(4, &[1], 2), Some((vec![0, 2, 3], 1)));
        assert_eq!(shrink_members(4, &[1, 3], 0), Some((vec![0, 2], 0)));
        assert_eq!(shrink_members(4, &[1], 1), None);
        assert_eq!(shrink_members(2, &[], 1), Some((vec![0, 1], 1)));
    }

    #[test]
    fn error_strings_cover_every_code() {
        let unknown = error_string(-1);
        for r in 0..result::NUM_RESULTS {
            assert_ne!(error_string(r), unknown, "{r}");
        }
    }
}
