#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
[ -d .gpu/b ] || tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r7; mkdir -p $R; V=.gpu/v; B=.gpu/b; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r7.tgz -C $OUT r7; }
M=scripts/with-mps.sh
S="--nranks 2 -b 8 -e 512K -f 4 -n 200 -w 20"
for i in 1 2; do for v in copy end; do
  timeout 60 $M $V/perf-$v --op sendrecv $S -G 10 --json $R/sendrecv-graph-$v-$i.json > $R/sendrecv-graph-$v-$i.txt 2>&1; st sr-graph-$v-$i $?
  timeout 60 $M $V/perf-$v --op sendrecv $S --json $R/sendrecv-plain-$v-$i.json > $R/sendrecv-plain-$v-$i.txt 2>&1; st sr-plain-$v-$i $?
done; done
MSCCLPP_TEST_TIMEOUT_S=100 timeout 130 $M $B/gpu_collectives_more --test-threads 1 send graph > $R/gpu_collectives_more.txt 2>&1; st gpu-more $?
echo done >> $R/steps.txt; tar czf $OUT/r7.tgz -C $OUT r7
