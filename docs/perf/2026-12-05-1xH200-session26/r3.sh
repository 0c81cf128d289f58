#!/usr/bin/env bash
# Twenty-sixth session, call 3, one H200, each step under an MPS daemon of its own: r2's
# stalled-rank check again with the fix it led to (calls queued behind one that gave up for
# good give up at once: the record of a timeout or abort counts as an abort at the waits'
# looks); then the test of r1's gpu_cross_host (two ranks as two hosts) that r1's
# 140 s limit cut, the graph replay, alone, with its time.
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
sed -n "/^cat > \/tmp\/stall.sh <<'EOS'/,/^EOS/p" docs/perf/2026-12-05-1xH200-session26/r2.sh | sed '1d;$d' > /tmp/stall.sh
for i in 1; do
  ( timeout 45 scripts/with-mps.sh bash /tmp/stall.sh $S/mscclpp-perf ) > $R/stall-$i.txt 2>&1; st stall-$i $?
done
( time MSCCLPP_TEST_TIMEOUT_S=120 MSCCLPP_TEST_MAX_BYTES=64M timeout 125 scripts/with-mps.sh $S/gpu_cross_host \
  --test-threads 1 --exact cross_host_all_reduce_replays_under_a_cuda_graph -Z unstable-options --report-time ) > $R/gpu_cross_host.txt 2>&1; st gpu_cross_host $?
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
