#!/usr/bin/env bash
# Eighteenth session, call 4: `fw` = the pack (cc1cbee with the descriptor threads as block
# 0's FIRST warp, thread p for rank p, and the data threads the grid's threads after it: one
# compare) against `new` = cc1cbee (block 0's last warp) and `base` = bb4a403. Two ranks
# under one MPS daemon, graph, alternating three times: all-reduce 8 B-256 KB; all-gather,
# reduce-scatter, broadcast, all-to-all 8 B-64 KB. Then gpu_collectives and
# gpu_collectives_more on `fw` in the same daemon.
cd "$(dirname "$0")/.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
  exec scripts/with-mps.sh bash "$0"
fi
R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
for i in 1 2 3; do
  for b in base new fw; do
    bin=.gpu/$b/mscclpp-perf; [ $b = fw ] && bin=.gpu/b/mscclpp-perf
    timeout 60 $bin --nranks 2 -b 8 -e 256K -f 2 -n 200 -w 20 -G 10 > $R/allreduce-$b-$i.txt 2>&1; st allreduce-$b-$i $?
    for op in allgather reducescatter broadcast alltoall; do
      timeout 60 $bin --op $op --nranks 2 -b 8 -e 64K -f 4 -n 200 -w 20 -G 10 > $R/$op-$b-$i.txt 2>&1; st $op-$b-$i $?
    done
  done
done
( time timeout 200 .gpu/b/gpu_collectives --test-threads 1 ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
( time timeout 150 .gpu/b/gpu_collectives_more --test-threads 1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
