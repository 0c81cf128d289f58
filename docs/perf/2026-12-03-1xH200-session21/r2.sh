#!/usr/bin/env bash
# Twenty-first session, call 2, one H200, two ranks under one MPS daemon: other people's
# code on main 6fa34fd (first such run since session 13, 2026-12-02: the fault words,
# descriptor warps and departures of sessions 14-21 had never been through it).
# nccl-tests 2.19.6 through libmscclpp_nccl.so alone (ONLY=ours: no real NCCL loaded, so a
# forwarded call would fail), every reducing test with every type and op, the rest with
# every type, graph; then the C API's native-call test. Correctness only (two ranks
# time-sliced on one GPU).
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests
export WORK=$WORK RUN_TIMEOUT=40 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1"
( OUT=$R TYPES="float half bfloat16 int32 int8 double" timeout 300 nccl/scripts/nccl-tests.sh \
  all_gather broadcast alltoall sendrecv graph ) > $R/nccl-tests-move.txt 2>&1; st nccl-tests-move $?
( OUT=$R TYPES="float bfloat16 int32 int8 double" OPS="sum prod max min avg" timeout 420 \
  nccl/scripts/nccl-tests.sh all_reduce reduce_scatter reduce ) > $R/nccl-tests-reduce.txt 2>&1; st nccl-tests-reduce $?
( time MSCCLPP_NCCL_LIB=none timeout 90 $S/new/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
