#!/usr/bin/env bash
# Fourteenth session, call 4: after the bootstrap change (a loss reaches the waits and the
# abort word once its news is on the survivors' sockets; hooks in loss order): the GPU
# suites that set up over the bootstrap, the NCCL library's tests, train-dp; one H200, MPS.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
M=scripts/with-mps.sh
( time timeout 150 env MSCCLPP_REQUIRE_NCCL=1 $M .gpu/b/gpu_setup_fallback --test-threads 1 --nocapture ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
( time timeout 100 $M .gpu/b/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 150 $M .gpu/b/gpu_collectives_more --test-threads 1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
( time timeout 120 $M .gpu/b/gpu_cross_host --test-threads 1 ) > $R/gpu_cross_host.txt 2>&1; st gpu_cross_host $?
( time timeout 100 $M .gpu/b/train-dp --preset compute --steps 20 --nranks 2 --json $R/train-dp.json ) > $R/train-dp.txt 2>&1; st train-dp $?
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
