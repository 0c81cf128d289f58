#!/usr/bin/env bash
# Twenty-sixth session, call 1, one H200 (two ranks as processes on GPU 0, each step under
# an MPS daemon of its own): the GPU test suites of the collectives and the NCCL library's
# native-call tests on main dc38327, the first GPU run of sessions 24-25's work (zero-element
# calls checked like any other, zero-byte sends and receives as transfers, the descriptor
# check that stops after another wait's timeout, named send/recv peers, abort and
# revoke/shrink through the C API).
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=.gpu/s; R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=130 MSCCLPP_TEST_MAX_BYTES=64M PTXAS=/usr/local/cuda/bin/ptxas MSCCLPP_REQUIRE_PTXAS=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
nvidia-smi -L > $R/gpu.txt 2>&1
for t in gpu_collectives gpu_collectives_more gpu_cross_host; do
  ( time timeout 140 scripts/with-mps.sh $S/$t --test-threads=1 ) > $R/$t.txt 2>&1; st $t $?
done
( time MSCCLPP_NCCL_LIB=none timeout 100 scripts/with-mps.sh $S/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 60 $S/gpu_smoke --test-threads 1 ) > $R/gpu_smoke.txt 2>&1; st gpu_smoke $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
