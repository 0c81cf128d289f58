#!/usr/bin/env bash
# Eighteenth session, call 1: bb4a403 (keep_waiting takes t0 by value) against ec5dbc7
# (before the send/recv departure change) and `dw` (bb4a403 with block 0's last warp
# carrying no data: the descriptor threads idle at every size), one-shot under a graph 8 B-64 KB, two ranks under
# one MPS daemon, alternating three times (the A/B session 17's r4 asked for); then the
# departure tests, gpu_collectives and gpu_collectives_more on bb4a403 in the same daemon.
cd "$(dirname "$0")/.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
  exec scripts/with-mps.sh bash "$0"
fi
R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
G="--nranks 2 -b 8 -e 64K -f 2 -n 200 -w 20 -G 10"
for i in 1 2 3; do
  for b in ec5 new dw; do
    bin=.gpu/$b/mscclpp-perf; [ $b = new ] && bin=.gpu/b/mscclpp-perf
    timeout 60 $bin $G > $R/allreduce-graph-$b-$i.txt 2>&1; st graph-$b-$i $?
  done
done
( time timeout 100 .gpu/b/gpu_collectives --test-threads 1 departed ) > $R/departed.txt 2>&1; st departed $?
( time timeout 200 .gpu/b/gpu_collectives --test-threads 1 ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
( time timeout 150 .gpu/b/gpu_collectives_more --test-threads 1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
