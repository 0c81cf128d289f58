#!/usr/bin/env bash
# Sixteenth session, call 1: a call that a rank which left never made fails at once
# (046e654: fault::LEFT, guards, GoodbyeAfter) on one H200, ranks as processes under MPS:
# the new GPU tests (over packets, over semaphores) with the rest of gpu_collectives (the
# kernels' wait paths changed), the other collectives, the NCCL library's native tests
# (ranks as threads sharing a context: a dropped Collectives now synchronises the context,
# at most 1 s, before its goodbye), the setup fallback and the cross-host suite (whose
# step contexts must not read the new word).
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
M=scripts/with-mps.sh
( time timeout 120 $M .gpu/b/gpu_collectives --test-threads 1 --nocapture a_call_a_departed ) > $R/departed.txt 2>&1; st departed $?
( time timeout 200 $M .gpu/b/gpu_collectives --test-threads 1 ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
( time timeout 120 $M .gpu/b/gpu_collectives_more --test-threads 1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
( time timeout 90 .gpu/b/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 60 $M .gpu/b/gpu_setup_fallback --test-threads 1 ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
( time timeout 150 $M .gpu/b/gpu_cross_host --test-threads 1 ) > $R/gpu_cross_host.txt 2>&1; st gpu_cross_host $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
