#!/usr/bin/env bash
# Twenty-second session, call 4, one H200, four ranks on GPU 0 under one MPS daemon: the
# failures of call 3 again, with the library now printing the error that
# ncclCommGetAsyncError reports: alltoallv on one host of 4 (from 8 B, then from 256 B),
# broadcast and reduce on 2 simulated hosts of 2; each twice.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests
export WORK=$WORK RUN_TIMEOUT=45 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS="sum" TYPES="float" NP=4
for i in 1 2; do
  ( OUT=$R/a2av-$i timeout 60 nccl/scripts/nccl-tests.sh alltoallv ) > $R/a2av-$i.txt 2>&1; st a2av-$i $?
  ( OUT=$R/a2av256-$i SIZES="-b 256 -e 8M -f 32" timeout 60 nccl/scripts/nccl-tests.sh alltoallv ) > $R/a2av256-$i.txt 2>&1; st a2av256-$i $?
  ( OUT=$R/bcast-$i MSCCLPP_SIMULATE_HOSTS=2 timeout 60 nccl/scripts/nccl-tests.sh broadcast reduce ) > $R/bcast-$i.txt 2>&1; st bcast-$i $?
done
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
