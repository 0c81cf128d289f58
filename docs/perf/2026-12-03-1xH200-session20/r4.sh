#!/usr/bin/env bash
# Twentieth session, call 4, one H200, two ranks under one MPS daemon: the GPU suites on
# main's head 5b99e1e (the communicator's drop now waits for its context before its
# goodbye, the fault area grew per-peer words): every gpu_* test binary but the cross-host
# one (r2 ran it), gpu_collectives capped at 64 MiB.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s/new; R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
for t in gpu_smoke gpu_fifo gpu_memory_channel gpu_litmus gpu_proxy_flag gpu_proxy_channel gpu_collectives_more gpu_collectives; do
  ( time timeout 200 $S/$t --test-threads 1 ) > $R/$t.txt 2>&1; st $t $?
done
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
