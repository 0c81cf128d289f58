#!/usr/bin/env bash
# Thirty-second session, call 2: other people's code on this session's NCCL library, 2 ranks
# on GPU 0 under MPS: PyTorch 2.11 plain and through libmscclpp_nccl.so with the real NCCL
# beside it, with TORCH_CHECK_SPLIT=1 (a group split from the default one: ncclCommSplit,
# whose real half now runs on its own thread, blocking); nccl-tests 2.19.6 on the library
# alone; gpu_native (no real NCCL).
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
nvidia-smi -L > $R/gpu.txt 2>&1
M=scripts/with-mps.sh
L=$S/libmscclpp_nccl.so
( time timeout 240 env OUT=$R TORCH_CHECK_DEVICE=0 TORCH_CHECK_SPLIT=1 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=110 \
  $M bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
( export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$L NCCL_TESTS_SRC=$S/nccl-tests \
    WORK=/tmp/ncclt RUN_TIMEOUT=40 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS=sum TYPES=float
  OUT=$R/np2 NP=2 timeout 170 $M nccl/scripts/nccl-tests.sh all_reduce all_gather reduce_scatter \
    broadcast alltoall sendrecv ) > $R/nccl-tests-np2.txt 2>&1; st nccl-tests-np2 $?
( time MSCCLPP_NCCL_LIB=none timeout 100 $M $S/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
