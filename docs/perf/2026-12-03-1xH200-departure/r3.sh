#!/usr/bin/env bash
# Sixteenth session, call 3: what the departure check costs, as an A/B of two builds of the
# perf tool in one run, two ranks on one H200 under one MPS daemon: `old` = main at 074dfc6
# (before 046e654), `new` = d727476 (the waits' slow path also copies and compares the
# departure word; the fast paths are unchanged). Alternating old/new, twice; CUDA graph
# 8 B-4 MB (one-shot up to 64 KB, then two-shot) and plain launches 8 B-64 KB.
cd "$(dirname "$0")/.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
  exec scripts/with-mps.sh bash "$0"
fi
R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
G="--nranks 2 -b 8 -e 4M -f 8 -n 100 -w 20 -G 10"
P="--nranks 2 -b 8 -e 64K -f 8 -n 100 -w 20"
for i in 1 2; do
  for b in old new; do
    bin=.gpu/old/mscclpp-perf; [ $b = new ] && bin=.gpu/b/mscclpp-perf
    timeout 90 $bin $G > $R/allreduce-graph-$b-$i.txt 2>&1; st graph-$b-$i $?
    timeout 90 $bin $P > $R/allreduce-plain-$b-$i.txt 2>&1; st plain-$b-$i $?
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
