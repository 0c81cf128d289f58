#!/usr/bin/env bash
# Twenty-second session, call 3, one H200, four ranks as processes on GPU 0 under one MPS
# daemon (first nccl-tests runs through our library with more than two ranks): nccl-tests
# 2.19.6 through libmscclpp_nccl.so alone (ONLY=ours), float, every test, as 2 simulated
# hosts of 2 ranks (hierarchical collectives: memory channels in a host, TCP across), then
# as one host of 4. Correctness only.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests
export WORK=$WORK RUN_TIMEOUT=60 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS="sum" TYPES="float" NP=4
ALL="all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter alltoallv hypercube graph"
( OUT=$R/hosts2x2 MSCCLPP_SIMULATE_HOSTS=2 timeout 270 nccl/scripts/nccl-tests.sh $ALL ) > $R/nccl-tests-hosts2x2.txt 2>&1; st nccl-tests-hosts2x2 $?
( OUT=$R/host1x4 timeout 240 nccl/scripts/nccl-tests.sh $ALL ) > $R/nccl-tests-host1x4.txt 2>&1; st nccl-tests-host1x4 $?
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
