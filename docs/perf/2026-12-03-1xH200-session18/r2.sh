#!/usr/bin/env bash
# Eighteenth session, call 2: cc1cbee (block 0's last warp carries the descriptors and no
# data, in one-shot, all-gather packets and the LL paths) against `base` = bb4a403, two ranks
# under one MPS daemon, graph, alternating three times: all-reduce 8 B-256 KB, all-gather,
# reduce-scatter, broadcast and all-to-all 8 B-64 KB; then gpu_collectives and
# gpu_collectives_more on cc1cbee in the same daemon.
cd "$(dirname "$0")/.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
  exec scripts/with-mps.sh bash "$0"
fi
R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
for i in 1 2 3; do
  for b in base new; do
    bin=.gpu/$b/mscclpp-perf; [ $b = new ] && bin=.gpu/b/mscclpp-perf
    timeout 60 $bin --nranks 2 -b 8 -e 256K -f 2 -n 200 -w 20 -G 10 > $R/allreduce-$b-$i.txt 2>&1; st allreduce-$b-$i $?
    for op in allgather reducescatter broadcast alltoall; do
      timeout 60 $bin --op $op --nranks 2 -b 8 -e 64K -f 4 -n 200 -w 20 -G 10 > $R/$op-$b-$i.txt 2>&1; st $op-$b-$i $?
    done
  done
done
# Grid shape: one-shot with blocks of 256 and 128 threads (MSCCLPP_COLL_THREADS) on cc1cbee.
for th in 256 128; do
  MSCCLPP_COLL_THREADS=$th timeout 60 .gpu/b/mscclpp-perf --nranks 2 -b 8 -e 256K -f 2 -n 200 -w 20 -G 10 > $R/allreduce-new-threads$th.txt 2>&1; st allreduce-threads$th $?
done
( time timeout 200 .gpu/b/gpu_collectives --test-threads 1 ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
( time timeout 150 .gpu/b/gpu_collectives_more --test-threads 1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
