#!/usr/bin/env bash
# Twenty-second session, call 6, one H200, two ranks on GPU 0 under one MPS daemon, our
# library alone (ONLY=ours), 12b1412: the send/recv paths again after 8b9bbf9, which also
# halves a group's grid when two ranks share a GPU (cap 66: 2 lanes x 33 blocks instead of
# 2 x 64): sendrecv, gather, scatter, alltoallv, hypercube, float and bfloat16, 8 B-64 MB.
# Correctness only.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r6; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r6.tgz -C $OUT r6; }
export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests
export WORK=$WORK RUN_TIMEOUT=60 SIZES="-b 8 -e 64M -f 8" ITERS="-n 2 -w 1" OPS="sum" TYPES="float bfloat16"
( OUT=$R/p2p timeout 240 nccl/scripts/nccl-tests.sh sendrecv gather scatter alltoallv hypercube ) > $R/nccl-tests-p2p.txt 2>&1; st nccl-tests-p2p $?
echo done >> $R/steps.txt; tar czf $OUT/r6.tgz -C $OUT r6
