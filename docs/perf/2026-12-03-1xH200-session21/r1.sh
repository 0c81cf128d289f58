#!/usr/bin/env bash
# Twenty-first session, call 1, one H200, two ranks under one MPS daemon: 6fa34fd (user TCP
# proxy channels learn of a polite departure). Every gpu_proxy_channel test (the new TCP
# leave test among them), the GPU cross-host suite (its TCP receivers changed), and one
# all-reduce over 2 simulated hosts (TCP loopback) with the perf tool as a smoke run.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
( time timeout 150 $S/new/gpu_proxy_channel --test-threads 1 --nocapture user_waits ) > $R/proxy-user-waits.txt 2>&1; st proxy-user-waits $?
( time timeout 200 $S/new/gpu_proxy_channel --test-threads 1 --skip user_waits ) > $R/proxy-rest.txt 2>&1; st proxy-rest $?
( time timeout 200 $S/new/gpu_cross_host --test-threads 1 ) > $R/gpu_cross_host.txt 2>&1; st gpu_cross_host $?
timeout 80 $S/new/mscclpp-perf --nranks 2 --simulate-hosts 2 -b 8 -e 4M -f 8 -n 50 -w 5 > $R/allreduce-simhosts.txt 2>&1; st allreduce-simhosts $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
