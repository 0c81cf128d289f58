#!/usr/bin/env bash
# Nineteenth session, call 3: the packet waits keep the abort look in registers (r2 had a 32-byte stack frame), one H200,
# two ranks under one MPS daemon. GPU tests that cover the changed kernels, then the
# memory_channel bench (LL ping-pong rows) of e047f40 (old) against this build (new),
# alternated five times.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
nvidia-smi -L > $R/gpus.txt 2>&1
timeout 120 $S/gpu_proxy_channel --test-threads 1 --nocapture p2p_user_waits > $R/proxy-abort.txt 2>&1; st proxy-abort $?
timeout 150 $S/gpu_memory_channel --test-threads 1 --nocapture > $R/memory-channel.txt 2>&1; st memory-channel $?
timeout 90 $S/gpu_litmus --test-threads 1 --nocapture ll_packets > $R/litmus-ll.txt 2>&1; st litmus-ll $?
for i in 1 2 3 4 5; do
  for b in old new; do
    timeout 90 $S/memory_channel-$b > $R/bench-$b-$i.txt 2>&1; st bench-$b-$i $?
  done
done
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
