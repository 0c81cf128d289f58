#!/usr/bin/env bash
# Fifteenth session, call 2: train-dp with its 1-rank baseline (call 1's 60 s limit was too
# short for two CPU references); the NCCL library at this session's head with peers' code
# (PyTorch plain vs ours, nccl-tests real vs ours) and its GPU suites (gpu_native,
# gpu_setup_fallback: the review refactors of the last session were not run on a GPU);
# two ranks on one H200 under MPS.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
M=scripts/with-mps.sh
L=$PWD/.gpu/b/libmscclpp_nccl.so
T=".gpu/b/train-dp --layers 4 --width 1024 --batch 240 --steps 10 --check-grads"
( time timeout 120 $M $T --nranks 2 --baseline --json $R/td-2.json ) > $R/td-2.txt 2>&1; st td-2 $?
export LD_LIBRARY_PATH=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib | head -1)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
( time timeout 100 env MSCCLPP_REQUIRE_NCCL=1 $M .gpu/b/gpu_setup_fallback --test-threads 1 --nocapture ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
( time timeout 60 $M .gpu/b/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 200 env OUT=$R TORCH_CHECK_DEVICE=0 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=110 $M bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
( time timeout 150 env OUT=$R NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$L WORK=/tmp/ncclt RUN_TIMEOUT=30 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" TYPES="float" OPS="sum" $M bash nccl/scripts/nccl-tests.sh all_reduce all_gather reduce_scatter sendrecv ) > $R/nccl-tests.txt 2>&1; st nccl-tests $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
