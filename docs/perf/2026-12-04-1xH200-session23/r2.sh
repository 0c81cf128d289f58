#!/usr/bin/env bash
# Twenty-third session, call 2, one H200, four ranks on GPU 0 with the fix of r1 (no
# dependent launch on a shared GPU): session 22's r3 again, nccl-tests 2.19.6 through
# libmscclpp_nccl.so alone (ONLY=ours), float, 8 B-8 MB, every test, as 2 simulated hosts of
# 2 and as one host of 4, each under an MPS daemon of its own; then PyTorch (torch-check.sh,
# ONLY=ours) with four ranks as 2 simulated hosts of 2. Correctness only.
cd "$(dirname "$0")/../.." || exit 1
S=.gpu/s; R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests
export WORK=/tmp/ncclt RUN_TIMEOUT=60 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS="sum" TYPES="float" NP=4
ALL="all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter alltoallv hypercube graph"
( OUT=$R/hosts2x2 MSCCLPP_SIMULATE_HOSTS=2 timeout 250 scripts/with-mps.sh nccl/scripts/nccl-tests.sh $ALL ) > $R/nccl-tests-hosts2x2.txt 2>&1; st nccl-tests-hosts2x2 $?
( OUT=$R/host1x4 timeout 220 scripts/with-mps.sh nccl/scripts/nccl-tests.sh $ALL ) > $R/nccl-tests-host1x4.txt 2>&1; st nccl-tests-host1x4 $?
( OUT=$R/torch2x2 RUN_TIMEOUT=100 NPROC=4 TORCH_CHECK_DEVICE=0 MSCCLPP_SIMULATE_HOSTS=2 timeout 150 scripts/with-mps.sh nccl/scripts/torch-check.sh ) > $R/torch-2x2.txt 2>&1; st torch-2x2 $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
