#!/usr/bin/env bash
# Thirteenth session, call 3: PyTorch and nccl-tests on libmscclpp_nccl.so alone (with the
# whole-line log fix), and the cross-host GPU tests, two (four) ranks on one H200 under MPS.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
M=scripts/with-mps.sh
L=$PWD/.gpu/b/libmscclpp_nccl.so
( time timeout 120 env OUT=$R ONLY=ours TORCH_CHECK_DEVICE=0 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=100 $M bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
( time timeout 200 env OUT=$R ONLY=ours NCCL_TESTS_DEVICE=0 NCCL_TESTS_SRC=$PWD/.gpu/nccl-tests MSCCLPP_NCCL_SO=$L WORK=/tmp/ncclt RUN_TIMEOUT=30 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" TYPES="float bfloat16" OPS="sum max" $M bash nccl/scripts/nccl-tests.sh all_reduce all_gather reduce_scatter sendrecv alltoall graph ) > $R/nccl-tests.txt 2>&1; st nccl-tests $?
( time timeout 150 env MSCCLPP_TEST_TIMEOUT_S=140 $M .gpu/b/gpu_cross_host --test-threads 1 ) > $R/gpu_cross_host.txt 2>&1; st gpu_cross_host $?
( time timeout 150 env MSCCLPP_TEST_TIMEOUT_S=140 MSCCLPP_TEST_RANKS_PER_HOST=2 $M .gpu/b/gpu_cross_host --test-threads 1 ) > $R/gpu_cross_host-2x2.txt 2>&1; st gpu_cross_host-2x2 $?
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
