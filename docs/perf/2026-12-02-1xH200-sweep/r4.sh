#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1 MSCCLPP_TEST_TRACE=1 MSCCLPP_TEST_TIMEOUT_S=170
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
T=all_reduce_matches_the_cpu_reference_from_4_bytes_to_1_gib
( time timeout 200 scripts/with-mps.sh .gpu/v/gc-main --test-threads 1 ) > $R/main-all.txt 2>&1; st main-all $?
for k in 1 2; do
  ( time timeout 100 env MSCCLPP_TEST_TIMEOUT_S=90 scripts/with-mps.sh .gpu/v/gc-raw --test-threads 1 --exact $T ) > $R/raw-full-$k.txt 2>&1; st raw-full-$k $?
done
