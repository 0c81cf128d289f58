#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1 MSCCLPP_TEST_TRACE=1 MSCCLPP_TEST_TIMEOUT_S=195
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
T=all_reduce_matches_the_cpu_reference_from_4_bytes_to_1_gib
nproc > $R/nproc.txt
for v in main raw; do
  ( time timeout 205 scripts/with-mps.sh .gpu/v/gc-$v --test-threads 1 --exact $T ) > $R/$v-full.txt 2>&1; st $v-full $?
done
