#!/usr/bin/env bash
# Seventeenth session, call 2: does the mismatch-detection cost at 8 B under a graph (+8% on
# 2x H200, 2026-11-30) show under MPS on one H200? `old` = 98724f9 (main before the fault
# branch: no call descriptors, no fault words), `new` = ec5dbc7 (main now). Two ranks under
# one MPS daemon, alternating old/new three times; graph 8 B-64 KB.
cd "$(dirname "$0")/.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
  exec scripts/with-mps.sh bash "$0"
fi
R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
G="--nranks 2 -b 8 -e 64K -f 8 -n 200 -w 20 -G 10"
for i in 1 2 3; do
  for b in old new; do
    bin=.gpu/old/mscclpp-perf; [ $b = new ] && bin=.gpu/b/mscclpp-perf
    timeout 90 $bin $G > $R/allreduce-graph-$b-$i.txt 2>&1; st graph-$b-$i $?
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
