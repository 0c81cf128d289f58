#!/usr/bin/env bash
# Eighteenth session, call 3: where the data-free descriptor warp sits. `base` = bb4a403,
# `new` = cc1cbee (block 0's last warp), `lw` = cc1cbee with the grid's last warp (the last
# block's) as the descriptor warp instead: data thread = global thread below the data
# threads' count, one compare (branch `lastwarp`). Two ranks under one MPS daemon, graph,
# alternating three times: all-reduce 8 B-256 KB; all-gather, reduce-scatter, broadcast,
# all-to-all 8 B-64 KB.
cd "$(dirname "$0")/.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
  exec scripts/with-mps.sh bash "$0"
fi
R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
for i in 1 2 3; do
  for b in base new lw; do
    bin=.gpu/$b/mscclpp-perf; [ $b = new ] && bin=.gpu/b/mscclpp-perf
    timeout 60 $bin --nranks 2 -b 8 -e 256K -f 2 -n 200 -w 20 -G 10 > $R/allreduce-$b-$i.txt 2>&1; st allreduce-$b-$i $?
    for op in allgather reducescatter broadcast alltoall; do
      timeout 60 $bin --op $op --nranks 2 -b 8 -e 64K -f 4 -n 200 -w 20 -G 10 > $R/$op-$b-$i.txt 2>&1; st $op-$b-$i $?
    done
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
