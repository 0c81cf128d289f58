#!/usr/bin/env bash
# Thirteenth session, call 4: gpu_collectives' whole suite with no size cap (4 B-1 GiB), main
# plus a23cde3 (log lines only), two ranks on one H200 under MPS.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
( time timeout 520 env MSCCLPP_TEST_TIMEOUT_S=480 scripts/with-mps.sh .gpu/b/gpu_collectives --test-threads 1 ) > $R/gpu_collectives-1g.txt 2>&1; st gpu_collectives-1g $?
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
