#!/usr/bin/env bash
# Twentieth session, call 2, one H200, two ranks under one MPS daemon: 87e9f33 (send/recv
# across hosts ends when the peer left; the peer-left user waits) against 529a0b8. The GPU
# cross-host suite (2 simulated hosts; send/recv across hosts runs the changed xp2p kernel),
# the user-wait tests again on this build, then send/recv across 2 simulated hosts (TCP
# loopback) with the perf tool, old/new alternated three times.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
( time timeout 200 $S/new/gpu_cross_host --test-threads 1 ) > $R/gpu_cross_host.txt 2>&1; st gpu_cross_host $?
timeout 100 $S/new/gpu_proxy_channel --test-threads 1 --nocapture p2p_user_waits > $R/proxy-user-waits.txt 2>&1; st proxy-user-waits $?
( time timeout 100 $S/new/gpu_collectives --test-threads 1 departed ) > $R/departed.txt 2>&1; st departed $?
G="--nranks 2 --simulate-hosts 2 --op sendrecv -b 8 -e 4M -f 4 -n 50 -w 5"
for i in 1 2 3; do
  for b in old new; do
    timeout 80 $S/$b/mscclpp-perf $G > $R/sendrecv-simhosts-$b-$i.txt 2>&1; st sendrecv-$b-$i $?
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
