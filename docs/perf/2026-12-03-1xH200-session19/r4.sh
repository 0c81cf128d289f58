#!/usr/bin/env bash
# Nineteenth session, call 4: five builds of the memory_channel bench (LL ping-pong rows),
# alternated five times under one MPS daemon, one H200: old = e047f40 (packet waits never
# read the abort word); A = the abort look inside the poll loop, taken once a wait is 50 us
# late (r3's build); B = the first 50 us through the old poll loop, then a loop of looks and
# 50 us polls, per packet, inlined; D = the thread's whole old unpack for 50 us, then looks
# and 50 us unpacks from its first packet again, inlined; D2 = D with the late part a cold
# call.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
nvidia-smi -L > $R/gpus.txt 2>&1
for i in 1 2 3 4 5; do
  for b in old A B D D2; do
    timeout 90 $S/memory_channel-$b > $R/bench-$b-$i.txt 2>&1; st bench-$b-$i $?
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
