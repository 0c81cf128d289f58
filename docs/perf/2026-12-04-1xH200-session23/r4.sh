#!/usr/bin/env bash
# Twenty-third session, call 4, one H200: the GPU test suites of the collectives with this
# session's build (two ranks on GPU 0 under MPS: dependent launch now off there), which r3
# cut at 90 s; and ncclGetLastError(NULL) after a failure, GetAsyncError and CommAbort (C,
# one rank; r3's try ran with MSCCLPP_SIMULATE_HOSTS=2 set and failed its set-up).
cd "$(dirname "$0")/../.." || exit 1
S=.gpu/s; R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
( gcc -O1 -I nccl/include $S/c/lasterr.c $PWD/$S/new/libmscclpp_nccl.so -o /tmp/lasterr && \
  MSCCLPP_NCCL_LIB=none MSCCLPP_DEBUG=WARN timeout 60 /tmp/lasterr ) > $R/lasterr.txt 2>&1; st lasterr $?
for t in gpu_collectives gpu_collectives_more gpu_cross_host; do
  ( timeout 170 scripts/with-mps.sh $S/new/$t --test-threads=1 ) > $R/$t.txt 2>&1; st $t $?
done
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
