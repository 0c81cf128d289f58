#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1 MSCCLPP_TEST_MAX_BYTES=1M MSCCLPP_TEST_TRACE=1 MSCCLPP_TEST_TIMEOUT_S=100
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
nvidia-smi > $R/smi.txt 2>&1
for v in main raw; do
  ( time timeout 115 scripts/with-mps.sh .gpu/v/gc-$v --test-threads 1 --exact all_reduce_matches_the_cpu_reference_from_4_bytes_to_1_gib ) > $R/$v.txt 2>&1; st $v $?
done
