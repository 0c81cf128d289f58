#!/usr/bin/env bash
# Twentieth session, call 3, one H200, two ranks under one MPS daemon: 41c7996 (xp2p looks
# at a refused bit at most once per 50 us) against 529a0b8. r2's send/recv across two
# simulated hosts was too noisy to tell (20-50 iterations); here 200 iterations, old/new
# alternated four times, then the send/recv test of the GPU cross-host suite on 41c7996.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
G="--nranks 2 --simulate-hosts 2 --op sendrecv -b 8 -e 2M -f 4 -n 200 -w 20"
for i in 1 2 3 4; do
  for b in old new; do
    timeout 80 $S/$b/mscclpp-perf $G > $R/sendrecv-simhosts-$b-$i.txt 2>&1; st sendrecv-$b-$i $?
  done
done
( time timeout 150 $S/new/gpu_cross_host --test-threads 1 send_recv ) > $R/gpu_cross_host_send_recv.txt 2>&1; st gpu_cross_host_send_recv $?
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
