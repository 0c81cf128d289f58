#!/usr/bin/env bash
# Thirteenth session, call 2: peers' code (PyTorch, nccl-tests) on libmscclpp_nccl.so alone and
# the training loop, main 2d2b891, two ranks on one H200 under MPS.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
M=scripts/with-mps.sh
L=$PWD/.gpu/b/libmscclpp_nccl.so
( time timeout 200 env OUT=$R ONLY=ours TORCH_CHECK_DEVICE=0 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=150 $M bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
( time timeout 230 env OUT=$R ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$L WORK=/tmp/ncclt RUN_TIMEOUT=30 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" TYPES="float bfloat16" OPS="sum max" $M bash nccl/scripts/nccl-tests.sh all_reduce all_gather reduce_scatter sendrecv alltoall graph ) > $R/nccl-tests.txt 2>&1; st nccl-tests $?
( time timeout 90 $M .gpu/b/train-dp --preset compute --steps 20 --nranks 2 --json $R/train-dp.json ) > $R/train-dp.txt 2>&1; st train-dp $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
