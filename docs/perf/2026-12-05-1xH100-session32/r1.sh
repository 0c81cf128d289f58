#!/usr/bin/env bash
# Thirty-second session, call 1: the GPU tests of this session's changes, 2 ranks on GPU 0
# under MPS: gpu_collectives (its typed-API test now all-reduces across a seam between two
# cuMemCreate segments), gpu_setup_fallback with the real NCCL beside ours (its p2p mode now
# splits inside a group, from a nonblocking parent, and destroys a NOCOLOR child as NULL),
# gpu_proxy_channel's TCP tests (the signal wait and the drain at close).
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && rm -rf .gpu/s && tar xzf .gpu/s.tgz -C .gpu || exit 1
S=$PWD/.gpu/s; R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
nvidia-smi -L > $R/gpu.txt 2>&1
M=scripts/with-mps.sh
( time timeout 200 $M $S/gpu_collectives --test-threads 1 ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
NL=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib | head -1)
( time timeout 200 env LD_LIBRARY_PATH=$NL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} MSCCLPP_REQUIRE_NCCL=1 \
  $M $S/gpu_setup_fallback --test-threads 1 --nocapture ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
( time timeout 120 env MSCCLPP_TEST_TIMEOUT_S=100 $M $S/gpu_proxy_channel --test-threads 1 tcp_ ) \
  > $R/gpu_proxy_channel-tcp.txt 2>&1; st gpu_proxy_channel-tcp $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
