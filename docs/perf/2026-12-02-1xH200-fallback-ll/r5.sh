#!/usr/bin/env bash
# Fourteenth session, call 5: gpu_cross_host again (call 4 stopped it at 120 s in its fourth
# test), with the suite's own rank timeout and output.
cd "$(dirname "$0")/.." || exit 1
[ -d .gpu/b ] || tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r5; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r5.tgz -C $OUT r5; }
( time timeout 330 env MSCCLPP_TEST_TIMEOUT_S=150 scripts/with-mps.sh .gpu/b/gpu_cross_host --test-threads 1 --nocapture ) > $R/gpu_cross_host.txt 2>&1; st gpu_cross_host $?
echo done >> $R/steps.txt; tar czf $OUT/r5.tgz -C $OUT r5
