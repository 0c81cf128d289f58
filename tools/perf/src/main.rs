//! `mscclpp-perf`: nccl-tests' all-reduce / all-gather measurements for mscclpp, with NCCL
//! side by side on request. See `mscclpp-perf --help` and [`mscclpp_perf`].

fn main() -> std::process::ExitCode {
    mscclpp_perf::main()
}
