#!/usr/bin/env bash
# Seventeenth session, call 3: send/recv with a rank that left (guard::PEERS), then what the
# call descriptors cost today: `new` = this build, `nodesc` = main ec5dbc7 with one-shot's
# descriptor send and check removed (nothing else), two ranks under one MPS daemon,
# alternating three times, graph 8 B-64 KB.
cd "$(dirname "$0")/.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
  exec scripts/with-mps.sh bash "$0"
fi
R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
( time timeout 150 .gpu/b/gpu_collectives --test-threads 1 --nocapture departed ) > $R/departed.txt 2>&1; st departed $?
G="--nranks 2 -b 8 -e 64K -f 8 -n 200 -w 20 -G 10"
for i in 1 2 3; do
  for b in nodesc new; do
    bin=.gpu/nodesc/mscclpp-perf; [ $b = new ] && bin=.gpu/b/mscclpp-perf
    timeout 90 $bin $G > $R/allreduce-graph-$b-$i.txt 2>&1; st graph-$b-$i $?
  done
done
( time timeout 200 .gpu/b/gpu_collectives --test-threads 1 ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
( time timeout 150 .gpu/b/gpu_collectives_more --test-threads 1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
