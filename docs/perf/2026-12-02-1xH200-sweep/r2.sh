#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1 MSCCLPP_TEST_TRACE=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
T=all_reduce_matches_the_cpu_reference_from_4_bytes_to_1_gib
( time MSCCLPP_TEST_MAX_BYTES=16M MSCCLPP_TEST_TIMEOUT_S=100 timeout 240 scripts/with-mps.sh .gpu/v/gc-main --test-threads 1 ) > $R/main-16M-all.txt 2>&1; st main-16M-all $?
( time MSCCLPP_TEST_MAX_BYTES=16M MSCCLPP_TEST_TIMEOUT_S=100 timeout 115 scripts/with-mps.sh .gpu/v/gc-raw --test-threads 1 --exact $T ) > $R/raw-16M.txt 2>&1; st raw-16M $?
( time MSCCLPP_TEST_TIMEOUT_S=250 timeout 265 scripts/with-mps.sh .gpu/v/gc-main --test-threads 1 --exact $T ) > $R/main-full.txt 2>&1; st main-full $?
