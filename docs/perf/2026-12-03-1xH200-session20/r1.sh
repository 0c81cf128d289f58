#!/usr/bin/env bash
# Twentieth session, call 1, one H200, two ranks under one MPS daemon: 213b573 (user
# channels' waits end when their peer left) against 529a0b8. First the GPU tests of the
# change (user waits: abort, kill, leave; memory channels; LL litmus; collectives'
# departures), then the memory_channel bench (semaphore and LL ping-pong rows, old/new
# alternated five times) and the perf tool's all-reduce and all-gather 128 KB-8 MB under a
# graph (the kernels whose cold abort look changed its arguments), alternated twice.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
nvidia-smi -L > $R/gpus.txt 2>&1
timeout 150 $S/new/gpu_proxy_channel --test-threads 1 --nocapture p2p_user_waits > $R/proxy-user-waits.txt 2>&1; st proxy-user-waits $?
timeout 60 $S/new/gpu_memory_channel --test-threads 1 --nocapture > $R/memory-channel.txt 2>&1; st memory-channel $?
timeout 60 $S/new/gpu_litmus --test-threads 1 --nocapture ll_packets > $R/litmus-ll.txt 2>&1; st litmus-ll $?
( time timeout 100 $S/new/gpu_collectives --test-threads 1 departed ) > $R/departed.txt 2>&1; st departed $?
for i in 1 2 3 4 5; do
  for b in old new; do
    timeout 90 $S/$b/memory_channel > $R/bench-$b-$i.txt 2>&1; st bench-$b-$i $?
  done
done
G="--nranks 2 -b 128K -e 8M -f 2 -n 100 -w 10 -G 10"
for i in 1 2; do
  for b in old new; do
    timeout 60 $S/$b/mscclpp-perf $G > $R/allreduce-$b-$i.txt 2>&1; st allreduce-$b-$i $?
    timeout 60 $S/$b/mscclpp-perf --op allgather $G > $R/allgather-$b-$i.txt 2>&1; st allgather-$b-$i $?
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
