#!/usr/bin/env bash
# Thirty-first session, call 7: the GPU suites whose failure paths go through the changed
# CollContext::fail (one claim per call), on this session's build: gpu_collectives
# (mismatches, a stalled peer, abort, departures), gpu_collectives_more, gpu_native; 2 ranks
# on GPU 0 under MPS.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r8; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r8.tgz -C $OUT r8; }
nvidia-smi -L > $R/gpu.txt 2>&1
for t in gpu_collectives gpu_collectives_more gpu_native; do
  ( time timeout 250 scripts/with-mps.sh $S/$t --test-threads 1 ) > $R/$t.txt 2>&1; st $t $?
done
echo done >> $R/steps.txt; tar czf $OUT/r8.tgz -C $OUT r8
