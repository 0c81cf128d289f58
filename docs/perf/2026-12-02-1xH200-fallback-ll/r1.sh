#!/usr/bin/env bash
# Fourteenth session, call 1: the set-up fallback (7d2233e) and the real NCCL on one GPU
# (NCCL_HOSTID per rank): gpu_setup_fallback, gpu_native, PyTorch plain vs ours, nccl-tests
# real vs ours; two ranks on one H200 under MPS.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
M=scripts/with-mps.sh
L=$PWD/.gpu/b/libmscclpp_nccl.so
export LD_LIBRARY_PATH=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib | head -1)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
( time timeout 200 env MSCCLPP_REQUIRE_NCCL=1 $M .gpu/b/gpu_setup_fallback --test-threads 1 --nocapture ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
( time timeout 100 $M .gpu/b/gpu_native --test-threads 1 --nocapture ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 230 env OUT=$R TORCH_CHECK_DEVICE=0 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=110 $M bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
( time timeout 200 env OUT=$R NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$L WORK=/tmp/ncclt RUN_TIMEOUT=30 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" TYPES="float" OPS="sum avg" $M bash nccl/scripts/nccl-tests.sh all_reduce all_gather sendrecv ) > $R/nccl-tests.txt 2>&1; st nccl-tests $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
