#!/usr/bin/env bash
# Thirteenth session, call 5: the NCCL library with ncclGetUniqueId's root on NCCL's interface
# choice (not 127.0.0.1) and native ncclGather/ncclScatter: its GPU test, PyTorch and
# nccl-tests (source found in the pack by default), two ranks on one H200 under MPS.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r5; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r5.tgz -C $OUT r5; }
M=scripts/with-mps.sh
L=$PWD/.gpu/b/libmscclpp_nccl.so
(ip -4 addr 2>/dev/null || cat /proc/net/dev) | grep -E "inet|^[0-9]" | sed 's/ brd.*//' > $R/interfaces.txt
( time timeout 100 $M .gpu/b/gpu_native --test-threads 1 --nocapture ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 120 env OUT=$R ONLY=ours TORCH_CHECK_DEVICE=0 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=100 $M bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
( time timeout 240 env OUT=$R ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$L WORK=/tmp/ncclt RUN_TIMEOUT=30 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" TYPES="float" OPS="sum" $M bash nccl/scripts/nccl-tests.sh gather scatter alltoallv hypercube graph_all ) > $R/nccl-tests.txt 2>&1; st nccl-tests $?
echo done >> $R/steps.txt; tar czf $OUT/r5.tgz -C $OUT r5
