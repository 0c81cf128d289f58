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
# Already inside a daemon of this script (a script that wraps itself and calls us again): run.
[ "${MSCCLPP_UNDER_MPS:-}" = 1 ] && exec "$@"
export MSCCLPP_UNDER_MPS=1
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mscclpp-mps}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mscclpp-mps-log}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
command -v nvidia-cuda-mps-control >/dev/null || { echo "$0: no nvidia-cuda-mps-control" >&2; exit 2; }
# A daemon left on our pipe directory by a run that was killed (timeout) is ours: stop it.
if [ -S "$CUDA_MPS_PIPE_DIRECTORY/control" ] && echo quit | nvidia-cuda-mps-control 2>/dev/null; then
  sleep 2
fi
nvidia-cuda-mps-control -d || { echo "$0: the MPS daemon did not start (see $CUDA_MPS_LOG_DIRECTORY)" >&2; exit 2; }
# Each client's work queues: MPS clients share one pool and get few by default, and streams
# then alias onto the same queue. A spinning kernel of a collective would then hold up the
# copies and flag writes that another stream of the same process queues for it (the TCP
# transport's receivers, the proxy's copy engine) and never see them: a deadlock from three
# processes on one GPU up. The caller may set another value.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-8}
# Stop the command (its whole process group: a launcher's ranks too) and the daemon when
# this script is stopped (timeout sends TERM here).
child=0
trap 'echo quit | nvidia-cuda-mps-control' EXIT
trap '[ $child -gt 0 ] && kill -TERM -- -$child 2>/dev/null; sleep 1; kill -KILL -- -$child 2>/dev/null; exit 143' TERM INT
sleep 1
setsid "$@" &
child=$!
wait $child
