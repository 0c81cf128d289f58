#!/usr/bin/env bash
# Runs a command with a CUDA MPS control daemon of its own, so that several processes on ONE
# GPU run their kernels concurrently instead of time-slicing (two ranks of the perf tool, the
# GPU tests or nccl-tests with NCCL_TESTS_DEVICE=0 on a one-GPU machine). The daemon is
# stopped when the command ends; no GPU setting (compute mode, clocks, MIG) is changed.
#
#   scripts/with-mps.sh target/release/mscclpp-perf --nranks 2 -b 8 -e 64K -f 8 -G 10
#
# Numbers from two ranks on one GPU measure our code against itself (an A/B of two builds in
# one run); the peer traffic stays in the GPU's memory instead of crossing NVLink, and the
# real NCCL refuses two ranks on one GPU.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mscclpp-mps}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mscclpp-mps-log}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
command -v nvidia-cuda-mps-control >/dev/null || { echo "$0: no nvidia-cuda-mps-control" >&2; exit 2; }
nvidia-cuda-mps-control -d || { echo "$0: the MPS daemon did not start (see $CUDA_MPS_LOG_DIRECTORY)" >&2; exit 2; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
sleep 1
"$@"
