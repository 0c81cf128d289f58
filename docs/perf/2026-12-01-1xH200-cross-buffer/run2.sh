#!/usr/bin/env bash
# One-GPU run 2 (session 8): host-mapped TCP buffers with the receiver's polling and the
# copy-engine fill of large payloads. Everything is tarred into $OUT/r2.tgz.
cd "$(dirname "$0")/.." || exit 1
[ -d .gpu/b ] || tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r2; mkdir -p $R; B=.gpu/b; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
MSCCLPP_TEST_TIMEOUT_S=60 timeout 120 scripts/with-mps.sh $B/gpu_proxy_channel --test-threads 1 tcp_ > $R/gpu_proxy_channel-tcp.txt 2>&1; st proxy-tcp $?
P="--nranks 2 --simulate-hosts 2 -n 20 -w 5"
for i in 1 2; do for k in host device host-nospin; do
  case $k in host-nospin) e="MSCCLPP_CROSS_BUFFER=host MSCCLPP_TCP_SPIN_US=0";; *) e="MSCCLPP_CROSS_BUFFER=$k";; esac
  env $e timeout 100 scripts/with-mps.sh $B/mscclpp-perf $P -b 8 -e 64M -f 4 --json $R/allreduce-$k-$i.json > $R/allreduce-$k-$i.txt 2>&1; st "allreduce-$k-$i" $?
done; done
for k in host device; do
  MSCCLPP_CROSS_BUFFER=$k timeout 100 scripts/with-mps.sh $B/mscclpp-perf $P --op sendrecv -b 8 -e 16M -f 4 --json $R/sendrecv-$k-1.json > $R/sendrecv-$k-1.txt 2>&1; st "sendrecv-$k" $?
  MSCCLPP_CROSS_BUFFER=$k timeout 100 scripts/with-mps.sh $B/mscclpp-perf $P -G 20 -b 8 -e 1M -f 4 --json $R/allreduce-graph-$k-1.json > $R/allreduce-graph-$k-1.txt 2>&1; st "allreduce-graph-$k" $?
done
MSCCLPP_TEST_TIMEOUT_S=90 timeout 200 scripts/with-mps.sh $B/gpu_cross_host --test-threads 1 > $R/gpu_cross_host.txt 2>&1; st tests-2hosts $?
MSCCLPP_TEST_RANKS_PER_HOST=2 MSCCLPP_TEST_TIMEOUT_S=90 timeout 150 scripts/with-mps.sh $B/gpu_cross_host --test-threads 1 > $R/gpu_cross_host-2x2.txt 2>&1; st tests-2x2 $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2; rm -rf $R
