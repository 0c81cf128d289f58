#!/usr/bin/env bash
# One-GPU run of the host-mapped cross buffer (session 8): tests, then A/B of the cross
# buffer kinds in one run (same binary, MSCCLPP_CROSS_BUFFER=host|device alternated).
cd "$(dirname "$0")/.." || exit 1
[ -d .gpu/b ] || tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/xh; mkdir -p $R; B=.gpu/b; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; }
MSCCLPP_TEST_TIMEOUT_S=90 timeout 200 scripts/with-mps.sh $B/gpu_cross_host --test-threads 1 > $R/gpu_cross_host.txt 2>&1; st tests-2hosts $?
P="--nranks 2 --simulate-hosts 2 -n 20 -w 5"
ab() { # name, extra args
  for i in 1 2; do for k in host device; do
    MSCCLPP_CROSS_BUFFER=$k timeout 100 scripts/with-mps.sh $B/mscclpp-perf $P $2 --json $R/$1-$k-$i.json > $R/$1-$k-$i.txt 2>&1; st "$1-$k-$i" $?
  done; done
}
ab allreduce "-b 8 -e 64M -f 4"
ab sendrecv "--op sendrecv -b 8 -e 16M -f 4"
MSCCLPP_TEST_RANKS_PER_HOST=2 MSCCLPP_TEST_TIMEOUT_S=90 timeout 150 scripts/with-mps.sh $B/gpu_cross_host --test-threads 1 > $R/gpu_cross_host-2x2.txt 2>&1; st tests-2x2 $?
echo done >> $R/steps.txt
