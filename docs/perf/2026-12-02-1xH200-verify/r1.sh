#!/usr/bin/env bash
# Thirteenth session, call 1: the GPU suites on main 2d2b891 (barrier fix 30142f6, proxy
# workers 9d33e1e), two ranks under MPS on one H200.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
M=scripts/with-mps.sh
nvidia-smi -L > $R/gpus.txt 2>&1
git log -1 --format=%H > $R/commit.txt 2>/dev/null
( time timeout 230 env MSCCLPP_TEST_MAX_BYTES=256M MSCCLPP_TEST_TIMEOUT_S=100 $M .gpu/b/gpu_collectives --test-threads 1 ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
( time timeout 110 env MSCCLPP_TEST_TIMEOUT_S=100 $M .gpu/b/gpu_collectives_more --test-threads 1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
( time timeout 100 env MSCCLPP_TEST_TIMEOUT_S=90 $M .gpu/b/gpu_proxy_channel --test-threads 1 ) > $R/gpu_proxy_channel.txt 2>&1; st gpu_proxy_channel $?
( time timeout 60 env MSCCLPP_TEST_TIMEOUT_S=50 $M .gpu/b/gpu_proxy_flag --test-threads 1 ) > $R/gpu_proxy_flag.txt 2>&1; st gpu_proxy_flag $?
( time timeout 70 env MSCCLPP_TEST_TIMEOUT_S=60 $M .gpu/b/gpu_litmus --test-threads 1 ) > $R/gpu_litmus.txt 2>&1; st gpu_litmus $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
