#!/usr/bin/env bash
# Eighteenth session, call 5: the committed build (19d97cb, the pack) against `base` =
# bb4a403 with the perf tool's JSON, two ranks under one MPS daemon, graph, alternating
# twice: all-reduce 8 B-256 KB, all-gather and reduce-scatter 8 B-64 KB.
cd "$(dirname "$0")/.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
  exec scripts/with-mps.sh bash "$0"
fi
R=$OUT/r5; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r5.tgz -C $OUT r5; }
for i in 1 2; do
  for b in base main; do
    bin=.gpu/$b/mscclpp-perf; [ $b = main ] && bin=.gpu/b/mscclpp-perf
    timeout 60 $bin --nranks 2 -b 8 -e 256K -f 2 -n 200 -w 20 -G 10 --json $R/allreduce-$b-$i.json > $R/allreduce-$b-$i.txt 2>&1; st allreduce-$b-$i $?
    for op in allgather reducescatter; do
      timeout 60 $bin --op $op --nranks 2 -b 8 -e 64K -f 4 -n 200 -w 20 -G 10 --json $R/$op-$b-$i.json > $R/$op-$b-$i.txt 2>&1; st $op-$b-$i $?
    done
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r5.tgz -C $OUT r5
