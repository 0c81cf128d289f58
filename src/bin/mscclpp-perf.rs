//! `mscclpp-perf`: nccl-tests' all-reduce / all-gather measurements for mscclpp, with NCCL
//! side by side on request. See `mscclpp-perf --help` and [`mscclpp::perf`].

fn main() -> std::process::ExitCode {
    mscclpp::perf::main()
}
