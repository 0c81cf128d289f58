#!/usr/bin/env bash
# Seventeenth session, call 1: ec5dbc7 (the cleanup after the departure change), under MPS:
# the departure tests, gpu_collectives, gpu_collectives_more, gpu_native, gpu_setup_fallback.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
M=scripts/with-mps.sh
( time timeout 120 $M .gpu/b/gpu_collectives --test-threads 1 --nocapture a_call_a_departed ) > $R/departed.txt 2>&1; st departed $?
( time timeout 200 $M .gpu/b/gpu_collectives --test-threads 1 ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
( time timeout 150 $M .gpu/b/gpu_collectives_more --test-threads 1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
( time timeout 60 .gpu/b/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
