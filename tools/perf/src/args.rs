//! Command line: nccl-tests' flags plus ours, parsed with clap and then validated into a
//! [`Config`] (sizes in order, a sweep of bounded length, a data type the collectives have).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::host::collectives::{AllReduceAlgo, DataType, PreMulScalar, ReduceOp};

use super::PerfError;

pub use crate::host::units::parse_size;

/// nccl-tests' default for `-b` and `-e`: 32 MiB.
pub const DEFAULT_BYTES: u64 = 32 << 20;
/// nccl-tests' default for `-i`: 1 MiB.
pub const DEFAULT_STEP_BYTES: u64 = 1 << 20;
/// Longest sweep accepted (a typo such as `-i 1` over gigabytes would never end).
pub const MAX_SIZES: usize = 4096;

/// `mscclpp-perf`: nccl-tests for this library. Flags as in nccl-tests (`-b -e -f -i -n -w
/// -c -d -o -G`), plus the operation, the algorithm, local ranks, and NCCL side by side.
#[derive(Debug, Clone, Parser, PartialEq)]
#[command(
    name = "mscclpp-perf",
    version,
    about = "Collective bandwidth and latency, with nccl-tests' columns",
    long_about = "All-reduce, all-gather, reduce-scatter, broadcast, reduce, all-to-all and \
        send/recv bandwidth and latency, with nccl-tests' columns.\n\n\
        Started alone it spawns one process per local GPU (or --nranks); under mpirun, \
        torchrun or srun (or with MSCCLPP_RANK/MSCCLPP_NRANKS/MSCCLPP_BOOTSTRAP) every \
        process is one rank. Without a GPU it runs on the Host transport (CPU threads, \
        shared memory) and says so.\n\n\
        NCCL for --compare nccl is loaded at run time: libnccl.so by the usual library \
        search, else MSCCLPP_NCCL_LIB (the library file or its directory), else the PyPI \
        package nvidia-nccl-cu12/cu13 in a Python site-packages.",
    // `-b -1` is a bad size for -b, not an unknown flag `-1`.
    allow_negative_numbers = true
)]
pub struct Args {
    /// Collective to measure.
    #[arg(long = "op", value_enum, default_value_t = Collective::AllReduce)]
    pub collective: Collective,
    /// Smallest size in bytes (suffixes K, M, G: powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    pub min_bytes: u64,
    /// Largest size in bytes (suffixes K, M, G).
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Multiply the size by this factor at each step (nccl-tests: 1 = use --stepbytes).
    #[arg(short = 'f', long = "stepfactor", default_value_t = 1)]
    pub step_factor: u64,
    /// Add this many bytes at each step when --stepfactor is 1 (suffixes K, M, G).
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = parse_size)]
    pub step_bytes: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: u32,
    /// Warm-up iterations per size (not timed).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub warmup_iters: u32,
    /// Check results (0: no, otherwise yes); #wrong counts mismatching elements.
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u32,
    /// Element type: float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64,
    /// f8e4m3, f8e5m2 (every collective; fp8 reductions accumulate in f32 and round once).
    /// Aliases: NCCL's names (float32, float16, float64, char, int, float8e4m3, ...) and short
    /// ones (f32, fp16, bf16, f64, i8, u8, i32, u32, i64, u64, fp8_e4m3, fp8_e5m2).
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_dtype)]
    pub dtype: DataType,
    /// Reduction operation of all-reduce, reduce-scatter and reduce: sum, prod, min, max, avg
    /// (the sum divided once by the number of ranks), mulsum (alias premulsum: a
    /// pre-multiplied sum, each rank's input times its own scalar, then summed; the scalar is
    /// nccl-tests' one: 1 on even ranks, 2 on odd ranks).
    #[arg(short = 'o', long = "redop", default_value = "sum", value_parser = parse_redop)]
    pub redop: Redop,
    /// Root rank of broadcast and reduce.
    #[arg(long, default_value_t = 0)]
    pub root: usize,
    /// Number of CUDA graph launches; the timed iterations are captured into one graph.
    /// 0: plain launches.
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0)]
    pub graph_launches: u32,
    /// All-reduce algorithm.
    #[arg(long, value_enum, default_value_t = AlgoArg::Auto)]
    pub algo: AlgoArg,
    /// Local processes to spawn when started alone (default: one per GPU, 2 without a GPU).
    #[arg(long)]
    pub nranks: Option<usize>,
    /// Split the ranks into N simulated hosts (rank r on `simhost{r * N / nranks}`, as
    /// `MSCCLPP_HOST_ID` would), so the collectives run across hosts over TCP loopback. N
    /// must divide the rank count. With `--compare nccl`, set NCCL_P2P_DISABLE=1
    /// NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo for NCCL to do the same.
    #[arg(long, value_name = "N")]
    pub simulate_hosts: Option<usize>,
    /// Where the spawned ranks run: `cpus`, each on its own share of this process's CPUs
    /// (a core each for 2 ranks on 2 cores, as mpirun binds by default; nothing when there
    /// are fewer CPUs than ranks), or `none`, wherever the scheduler puts them.
    #[arg(long, value_enum, default_value_t = BindArg::Cpus)]
    pub bind: BindArg,
    /// Run this library too, on the same buffers in the same run, and print the ratio.
    #[arg(long, value_enum)]
    pub compare: Option<CompareWith>,
    /// Write every row and the run's metadata as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw bus bandwidth and latency against size as an SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// The collective measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Collective {
    /// All-reduce (nccl-tests' all_reduce_perf).
    #[value(name = "allreduce", alias = "all_reduce", alias = "all-reduce")]
    AllReduce,
    /// All-gather (nccl-tests' all_gather_perf).
    #[value(name = "allgather", alias = "all_gather", alias = "all-gather")]
    AllGather,
    /// Reduce-scatter (nccl-tests' reduce_scatter_perf; size = one rank's whole input).
    #[value(
        name = "reducescatter",
        alias = "reduce_scatter",
        alias = "reduce-scatter"
    )]
    ReduceScatter,
    /// Broadcast from `--root` (nccl-tests' broadcast_perf).
    #[value(name = "broadcast")]
    Broadcast,
    /// Reduce to `--root` (nccl-tests' reduce_perf).
    #[value(name = "reduce")]
    Reduce,
    /// All-to-all (nccl-tests' alltoall_perf; size = one rank's whole input).
    #[value(name = "alltoall", alias = "all_to_all", alias = "all-to-all")]
    AllToAll,
    /// Send to rank + 1 and receive from rank - 1 in one group (nccl-tests' sendrecv_perf).
    #[value(name = "sendrecv", alias = "send_recv", alias = "send-recv")]
    SendRecv,
}

impl Collective {
    /// Name printed in the header and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reducescatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "alltoall",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// Whether it reduces (takes `-o`).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }

    /// Whether it has a root (`--root`).
    pub fn rooted(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce)
    }
}

/// `--algo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AlgoArg {
    /// Chosen by the library by size and rank count.
    Auto,
    /// One-shot LL packets.
    Oneshot,
    /// Two-shot (reduce-scatter + all-gather).
    Twoshot,
    /// Two-shot with the reduction fused into NVLink reads.
    Readreduce,
    /// All-pairs: every rank puts its whole input into every peer's scratch, then reduces.
    Allpairs,
    /// Over proxy channels (copy engine); all-gather too.
    Proxy,
}

impl AlgoArg {
    /// The library's all-reduce algorithm.
    pub fn all_reduce(self) -> AllReduceAlgo {
        match self {
            AlgoArg::Auto => AllReduceAlgo::Auto,
            AlgoArg::Oneshot => AllReduceAlgo::OneShot,
            AlgoArg::Twoshot => AllReduceAlgo::TwoShot,
            AlgoArg::Readreduce => AllReduceAlgo::ReadReduce,
            AlgoArg::Allpairs => AllReduceAlgo::AllPairs,
            AlgoArg::Proxy => AllReduceAlgo::Proxy,
        }
    }
}

/// `--bind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BindArg {
    /// Each rank on its own share of the CPUs.
    Cpus,
    /// No binding.
    None,
}

/// `--compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompareWith {
    /// NVIDIA's NCCL, loaded at run time.
    Nccl,
}

/// `-o`: the reduction the tool runs, as nccl-tests names it. The library's operation of a
/// rank ([`ReduceOp`]) depends, for `mulsum`, on the rank and the type: see
/// [`Redop::reduce_op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redop {
    /// Element-wise sum.
    Sum,
    /// Element-wise product.
    Prod,
    /// Element-wise minimum.
    Min,
    /// Element-wise maximum.
    Max,
    /// The sum divided once by the number of ranks.
    Avg,
    /// Pre-multiplied sum (NCCL's `ncclRedOpCreatePreMulSum`, a host scalar): each rank's
    /// input times its own scalar ([`check::premul_scalar`](super::check::premul_scalar):
    /// nccl-tests' 1 on even ranks, 2 on odd ranks), then summed.
    MulSum,
}

impl Redop {
    /// Every operation, in nccl-tests' order of names.
    pub const ALL: [Redop; 6] = [
        Redop::Sum,
        Redop::Prod,
        Redop::Min,
        Redop::Max,
        Redop::Avg,
        Redop::MulSum,
    ];

    /// The name nccl-tests prints (`mulsum` for the pre-multiplied sum).
    pub fn name(self) -> &'static str {
        match self {
            Redop::MulSum => "mulsum",
            op => op.combining().name(),
        }
    }

    /// The library's operation that combines two elements (a pre-multiplied sum, once its
    /// inputs are scaled: the sum).
    pub fn combining(self) -> ReduceOp {
        match self {
            Redop::Sum | Redop::MulSum => ReduceOp::Sum,
            Redop::Prod => ReduceOp::Prod,
            Redop::Min => ReduceOp::Min,
            Redop::Max => ReduceOp::Max,
            Redop::Avg => ReduceOp::Avg,
        }
    }

    /// The library's operation that rank `rank` passes for data of `dtype`: the operation
    /// itself, or for `mulsum` a pre-multiplied sum by this rank's host scalar.
    pub fn reduce_op(self, dtype: DataType, rank: usize) -> ReduceOp {
        match self {
            Redop::MulSum => ReduceOp::PreMulSum(PreMulScalar::Host {
                dtype,
                bits: super::check::premul_scalar(dtype, rank),
            }),
            op => op.combining(),
        }
    }
}

/// Parses `-d`: nccl-tests' names (`float half bfloat16 double int8 uint8 int32 uint32 int64
/// uint64 f8e4m3 f8e5m2`), NCCL's enum names without the `nccl` prefix (`float32`, `float16`,
/// `float64`, `char`, `int`, `float8e4m3`, `float8e5m2`) and the short Rust-style ones
/// (`f32`, `fp16`, `bf16`, `i8`, `u64`, `fp8_e4m3`, `e5m2`, ...).
pub fn parse_dtype(text: &str) -> Result<DataType, String> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.strip_prefix("nccl").unwrap_or(&t);
    Ok(match t {
        "float" | "float32" | "f32" | "fp32" => DataType::F32,
        "half" | "float16" | "f16" | "fp16" => DataType::F16,
        "bfloat16" | "bf16" => DataType::Bf16,
        "double" | "float64" | "f64" | "fp64" => DataType::F64,
        "int8" | "char" | "i8" => DataType::I8,
        "uint8" | "u8" => DataType::U8,
        "int32" | "int" | "i32" => DataType::I32,
        "uint32" | "u32" => DataType::U32,
        "int64" | "i64" => DataType::I64,
        "uint64" | "u64" => DataType::U64,
        "f8e4m3" | "float8e4m3" | "fp8e4m3" | "fp8_e4m3" | "f8_e4m3" | "e4m3" => DataType::Fp8E4M3,
        "f8e5m2" | "float8e5m2" | "fp8e5m2" | "fp8_e5m2" | "f8_e5m2" | "e5m2" => DataType::Fp8E5M2,
        "all" => {
            return Err(
                "-d all is not supported: run one data type per invocation (the JSON report \
                 and the plot hold one)"
                    .into(),
            );
        }
        _ => {
            return Err(format!(
                "unknown datatype {text:?} (use {})",
                DataType::ALL.map(DataType::name).join(", ")
            ));
        }
    })
}

/// Parses `-o`: nccl-tests' names (`sum prod min max avg mulsum`, also with NCCL's `nccl`
/// prefix; `premulsum` for `mulsum`).
pub fn parse_redop(text: &str) -> Result<Redop, String> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.strip_prefix("nccl").unwrap_or(&t);
    Ok(match t {
        "sum" => Redop::Sum,
        "prod" | "product" => Redop::Prod,
        "min" => Redop::Min,
        "max" => Redop::Max,
        "avg" | "average" | "mean" => Redop::Avg,
        "mulsum" | "premulsum" => Redop::MulSum,
        "all" => {
            return Err("-o all is not supported: run one reduction per invocation".into());
        }
        _ => {
            return Err(format!(
                "unknown reduction {text:?} (use sum, prod, min, max, avg or mulsum)"
            ));
        }
    })
}

/// Validated settings of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The parsed arguments.
    pub args: Args,
    /// The byte sizes to measure, in order (before rounding to whole elements).
    pub sizes: Vec<u64>,
}

impl Config {
    /// Checks what clap cannot: size order, step, iteration counts, sweep length.
    pub fn new(args: Args) -> Result<Config, PerfError> {
        let bad = |m: String| Err(PerfError::Args(m));
        if args.min_bytes > args.max_bytes {
            return bad(format!(
                "-b/--minbytes ({}) is larger than -e/--maxbytes ({})",
                args.min_bytes, args.max_bytes
            ));
        }
        if args.iters == 0 {
            return bad("-n/--iters must be at least 1".into());
        }
        if args.nranks == Some(0) {
            return bad("--nranks must be at least 1".into());
        }
        if args.simulate_hosts == Some(0) {
            return bad("--simulate-hosts must be at least 1".into());
        }
        if let (Some(h), Some(n)) = (args.simulate_hosts, args.nranks)
            && !n.is_multiple_of(h)
        {
            return bad(format!(
                "--simulate-hosts {h} does not divide --nranks {n} (every simulated host needs \
                 the same number of ranks)"
            ));
        }
        if args.step_factor == 0 {
            return bad("-f/--stepfactor must be at least 1".into());
        }
        if let Some(p) = &args.plot
            && let Some(ext) = p.extension()
            && !ext.eq_ignore_ascii_case("svg")
        {
            return bad(format!(
                "--plot {}: the plot is an SVG image; name the file .svg",
                p.display()
            ));
        }
        let sizes = size_sweep(
            args.min_bytes,
            args.max_bytes,
            args.step_factor,
            args.step_bytes,
        )?;
        Ok(Config { args, sizes })
    }

    /// Whether results are checked.
    pub fn check(&self) -> bool {
        self.args.check != 0
    }

    /// Checks the output files (`--json`, `--plot`) before the run: see
    /// [`check_outputs`](super::json::check_outputs). Once, in the process that writes them.
    pub fn check_outputs(&self) -> Result<(), PerfError> {
        let a = &self.args;
        super::json::check_outputs(&[("--json", a.json.as_deref()), ("--plot", a.plot.as_deref())])
            .map_err(PerfError::Args)
    }
}

/// nccl-tests' sweep: from `min` to `max` inclusive, multiplying by `factor` when it is
/// above 1, else adding `step` bytes.
pub fn size_sweep(min: u64, max: u64, factor: u64, step: u64) -> Result<Vec<u64>, PerfError> {
    if min == 0 || min > max {
        return Err(PerfError::Args(format!(
            "bad size range {min}..{max} (need 1 <= minbytes <= maxbytes)"
        )));
    }
    if factor <= 1 && step == 0 {
        return Err(PerfError::Args(
            "-i/--stepbytes must be at least 1 when -f/--stepfactor is 1".into(),
        ));
    }
    let mut sizes = Vec::new();
    let mut size = min;
    loop {
        sizes.push(size);
        if sizes.len() > MAX_SIZES {
            return Err(PerfError::Args(format!(
                "the sweep {min}..{max} has more than {MAX_SIZES} sizes: raise -f/--stepfactor \
                 or -i/--stepbytes"
            )));
        }
        let next = if factor > 1 {
            size.checked_mul(factor)
        } else {
            size.checked_add(step)
        };
        match next {
            Some(n) if n <= max => size = n,
            _ => break,
        }
    }
    Ok(sizes)
}
