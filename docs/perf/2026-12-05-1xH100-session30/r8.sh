#!/usr/bin/env bash
# Thirtieth session, call 7 (c1abfa7): the NCCL library's late-rank bounds on a GPU. PyTorch,
# 2 ranks on GPU 0 under MPS, our library alone, MSCCLPP_BOOTSTRAP_TIMEOUT=3 and ranks 8 s
# apart at the first collective and at destroy_process_group (late.py); then gpu_native
# (split, shrink, abort, revoke, destroy).
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && tar xzf .gpu/s.tgz -C .gpu || exit 1
S=$PWD/.gpu/s; R=$OUT/r8; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; }
nvidia-smi -L > $R/gpu.txt 2>&1
( DEV=0 LATE=8 MSCCLPP_BOOTSTRAP_TIMEOUT=3 LD_PRELOAD=$S/libmscclpp_nccl.so MSCCLPP_NCCL_LIB=none \
  timeout 50 scripts/with-mps.sh /opt/torch/.venv/bin/python -m torch.distributed.run --nproc_per_node 2 \
  docs/perf/2026-12-05-1xH100-session30/late.py ) > $R/late.txt 2>&1; st late $?
( time MSCCLPP_NCCL_LIB=none timeout 40 scripts/with-mps.sh $S/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
