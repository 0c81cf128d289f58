#!/usr/bin/env bash
# One-GPU run 3 (session 8, final build): host-mapped TCP buffers against device ones, A/B
# in one run. Everything is tarred into $OUT/r3.tgz.
cd "$(dirname "$0")/.." || exit 1
[ -d .gpu/b ] || tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r3; mkdir -p $R; B=.gpu/b; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
MSCCLPP_TEST_TIMEOUT_S=60 timeout 120 scripts/with-mps.sh $B/gpu_proxy_channel --test-threads 1 tcp_ > $R/gpu_proxy_channel-tcp.txt 2>&1; st proxy-tcp $?
P="--nranks 2 --simulate-hosts 2 -n 20 -w 5"
for i in 1 2; do for k in host device; do
  MSCCLPP_CROSS_BUFFER=$k timeout 100 scripts/with-mps.sh $B/mscclpp-perf $P -b 8 -e 64M -f 4 --json $R/allreduce-$k-$i.json > $R/allreduce-$k-$i.txt 2>&1; st "allreduce-$k-$i" $?
done; done
for k in host device; do
  MSCCLPP_CROSS_BUFFER=$k timeout 100 scripts/with-mps.sh $B/mscclpp-perf $P --op sendrecv -b 8 -e 16M -f 4 --json $R/sendrecv-$k-1.json > $R/sendrecv-$k-1.txt 2>&1; st "sendrecv-$k" $?
  MSCCLPP_CROSS_BUFFER=$k timeout 100 scripts/with-mps.sh $B/mscclpp-perf $P -G 20 -b 8 -e 1M -f 4 --json $R/allreduce-graph-$k-1.json > $R/allreduce-graph-$k-1.txt 2>&1; st "allreduce-graph-$k" $?
done
MSCCLPP_TEST_TIMEOUT_S=90 timeout 200 scripts/with-mps.sh $B/gpu_cross_host --test-threads 1 > $R/gpu_cross_host.txt 2>&1; st tests-2hosts $?
MSCCLPP_TEST_RANKS_PER_HOST=2 MSCCLPP_TEST_TIMEOUT_S=90 timeout 150 scripts/with-mps.sh $B/gpu_cross_host --test-threads 1 > $R/gpu_cross_host-2x2.txt 2>&1; st tests-2x2 $?
for k in host device; do
  MSCCLPP_CROSS_BUFFER=$k timeout 90 scripts/with-mps.sh $B/mscclpp-perf --nranks 4 --simulate-hosts 2 -n 10 -w 3 -b 1K -e 16M -f 4 --json $R/allreduce2x2-$k-1.json > $R/allreduce2x2-$k-1.txt 2>&1; st "allreduce2x2-$k" $?
done
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3; rm -rf $R
