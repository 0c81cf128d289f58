#!/usr/bin/env bash
# Sixteenth session, call 2: the departure tests again after the harness fix (rank 1 now
# prints its 'ok' line), three times each, two ranks under MPS on one H200.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
M=scripts/with-mps.sh
for i in 1 2 3; do
  ( time timeout 120 $M .gpu/b/gpu_collectives --test-threads 1 a_call_a_departed ) > $R/departed-$i.txt 2>&1; st departed-$i $?
done
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
