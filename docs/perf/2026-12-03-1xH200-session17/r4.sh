#!/usr/bin/env bash
# Seventeenth session, call 4: one-shot's call descriptor sent before the data instead of
# after it. `new` = db39cea (descriptor after the data, as on main), `descfirst` = 2514c72
# with the descriptor threads' send_desc moved before their data sends (nothing else),
# `nodesc` = ec5dbc7 without one-shot's descriptor send and check. Two ranks under one MPS
# daemon, alternating three times, graph 8 B-64 KB (factor 2). `ec5` = ec5dbc7 itself (the
# waits took t0 by value then).
cd "$(dirname "$0")/.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
  exec scripts/with-mps.sh bash "$0"
fi
R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
G="--nranks 2 -b 8 -e 64K -f 2 -n 200 -w 20 -G 10"
for i in 1 2 3; do
  for b in ec5 new descfirst nodesc; do
    bin=.gpu/$b/mscclpp-perf; [ $b = new ] && bin=.gpu/b/mscclpp-perf
    timeout 60 $bin $G > $R/allreduce-graph-$b-$i.txt 2>&1; st graph-$b-$i $?
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
