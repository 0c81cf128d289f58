//! What rank 0 prints before the table: the run's parameters, the notes that apply to it,
//! the ranks' devices and the column headers.

use std::io::Write;

use super::args::{AlgoArg, Collective, Config, Redop};
use super::check;
use super::nccl;
use super::report;
use super::sweep::redop_name;

pub(super) fn print_header(
    config: &Config,
    nranks: usize,
    hosts_devices: &[(String, String)],
    on_gpu: bool,
    nccl_version: &Option<String>,
) {
    let a = &config.args;
    let algo = format!("{:?}", a.algo).to_lowercase();
    if !on_gpu {
        println!("no GPU: running on the Host transport (CPU threads, shared memory)");
    }
    println!(
        "# mscclpp-perf {}: {} {}, redop {}, algo {}, {} ranks",
        env!("CARGO_PKG_VERSION"),
        a.collective.name(),
        a.dtype,
        redop_name(config),
        algo,
        nranks
    );
    if a.collective == Collective::AllGather && !matches!(a.algo, AlgoArg::Auto | AlgoArg::Proxy) {
        println!(
            "# --algo {algo} is an all-reduce algorithm: all-gather takes auto or proxy, and runs \
             as the library chooses (the rows name it)"
        );
    }
    println!(
        "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} \
         validation: {} graph: {}",
        a.min_bytes,
        a.max_bytes,
        if a.step_factor > 1 {
            format!("{}(factor)", a.step_factor)
        } else {
            format!("{}(bytes)", a.step_bytes)
        },
        a.warmup_iters,
        a.iters,
        u32::from(config.check()),
        a.graph_launches
    );
    if on_gpu {
        println!("# timing: CUDA events on each rank's stream; time = max over ranks");
    } else {
        println!("# timing: wall clock on each rank; time = max over ranks");
        if a.graph_launches > 0 {
            println!(
                "# -G {} ignored: no CUDA graphs on the Host transport",
                a.graph_launches
            );
        }
        if matches!(a.collective, Collective::AllGather | Collective::AllToAll) {
            println!(
                "# in-place {} on the Host transport sends from a copy of the rank's input \
                 (host slices cannot alias)",
                a.collective.name()
            );
        }
    }
    if a.collective.rooted() {
        println!("# root {}", a.root);
    }
    if !a.collective.reduces() && a.redop != Redop::Sum {
        println!(
            "# -o {} ignored: {} does not reduce",
            a.redop.name(),
            a.collective.name()
        );
    }
    if a.collective.reduces() && check::is_fp8(a.dtype) {
        println!(
            "# {} {}: widened to f32, reduced in f32 and rounded once to {} (the library \
             moves 4 bytes per element)",
            a.dtype,
            a.redop.name(),
            a.dtype
        );
    }
    if a.collective.reduces() && a.redop == Redop::MulSum {
        println!(
            "# mulsum: each rank's input times its own scalar (nccl-tests': 1 on even ranks, 2 \
             on odd ranks), then summed"
        );
    }
    if a.collective == Collective::SendRecv {
        println!(
            "# sendrecv: rank r sends to r+1 and receives from r-1 in one group; in place is \
             not supported (the in-place columns are a second out-of-place run)"
        );
    }
    if let Some(v) = nccl_version {
        println!(
            "# NCCL {v}{} on the same buffers; ratio = NCCL time / mscclpp time (= mscclpp \
             busbw / NCCL busbw); NCCL_NVLS_ENABLE=0",
            nccl::found_path()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        );
    }
    println!("#");
    println!("# Using devices");
    for (rank, (host, device)) in hosts_devices.iter().enumerate() {
        println!("#  Rank {rank:2} on {host} {device}");
    }
    println!("#");
    for line in report::header(a.compare.is_some()) {
        println!("{line}");
    }
    let _ = std::io::stdout().flush();
}
