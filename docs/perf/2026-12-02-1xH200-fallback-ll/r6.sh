#!/usr/bin/env bash
# Fourteenth session, call 6: the NCCL library's two GPU tests after their shared harness
# moved to nccl/tests/common (ebf1ba9); one H200 under MPS.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r6; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r6.tgz -C $OUT r6; }
M=scripts/with-mps.sh
( time timeout 100 env MSCCLPP_REQUIRE_NCCL=1 $M .gpu/b/gpu_setup_fallback --test-threads 1 ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
( time timeout 100 $M .gpu/b/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
echo done >> $R/steps.txt; tar czf $OUT/r6.tgz -C $OUT r6
