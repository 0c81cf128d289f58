//! What the perf tool's integration tests share.

use std::process::Command;

/// `cmd` with GPUs hidden, no launcher's variables but those of `env`, and `env`: the tool
/// then starts its own ranks on the Host transport, whatever the test's environment.
pub fn alone(cmd: &mut Command, env: &[(&str, &str)]) {
    cmd.env("CUDA_VISIBLE_DEVICES", "");
    for var in [
        "MSCCLPP_RANK",
        "MSCCLPP_NRANKS",
        "MSCCLPP_LOCAL_RANK",
        "MSCCLPP_BOOTSTRAP",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "MSCCLPP_HOST_ID",
        "MSCCLPP_SIMULATE_HOSTS",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
}
