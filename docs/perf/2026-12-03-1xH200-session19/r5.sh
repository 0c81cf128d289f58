#!/usr/bin/env bash
# Nineteenth session, call 5, one H200, two ranks under one MPS daemon: two candidate
# builds of the LL-packet waits' abort look, each with its GPU tests (abort/kill of user
# waits, memory channels, LL litmus), then the memory_channel bench's LL rows, old =
# e047f40 against D2 (r4: the thread's old unpack for 50 us, then a cold call that looks and
# unpacks again) and F (one inlined unpack in a loop: 50 us, a look, 50 us, ...),
# alternated five times.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r5; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r5.tgz -C $OUT r5; }
nvidia-smi -L > $R/gpus.txt 2>&1
for v in F D2; do
  timeout 100 $S/$v/gpu_proxy_channel --test-threads 1 --nocapture p2p_user_waits > $R/$v-proxy-abort.txt 2>&1; st $v-proxy-abort $?
  timeout 60 $S/$v/gpu_memory_channel --test-threads 1 --nocapture > $R/$v-memory-channel.txt 2>&1; st $v-memory-channel $?
  timeout 60 $S/$v/gpu_litmus --test-threads 1 --nocapture ll_packets > $R/$v-litmus-ll.txt 2>&1; st $v-litmus-ll $?
done
for i in 1 2 3 4 5; do
  for b in old D2 F; do
    timeout 90 $S/$b/memory_channel > $R/bench-$b-$i.txt 2>&1; st bench-$b-$i $?
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r5.tgz -C $OUT r5
