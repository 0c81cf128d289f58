#!/usr/bin/env bash
# Twenty-second session, call 1, one H200, two ranks under one MPS daemon, on main 8e2e961:
# sends and receives our collectives cannot make (two simulated hosts, MSCCLPP_P2P_REMOTE_MAX=0)
# go to the real NCCL. gpu_setup_fallback (both tests, the real NCCL required), nccl-tests
# sendrecv/gather/scatter/all_reduce through our library with the real NCCL beside it on two
# simulated hosts with the limit at 0, then gpu_native. Correctness only.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
( time MSCCLPP_REQUIRE_NCCL=1 timeout 200 $S/new/gpu_setup_fallback --test-threads 1 --nocapture ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
export NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests
export WORK=$WORK RUN_TIMEOUT=60 SIZES="-b 8 -e 4M -f 32" ITERS="-n 2 -w 1" TYPES="float" OPS="sum"
( OUT=$R MSCCLPP_SIMULATE_HOSTS=2 MSCCLPP_P2P_REMOTE_MAX=0 MSCCLPP_DEBUG=INFO timeout 330 nccl/scripts/nccl-tests.sh \
  sendrecv gather scatter all_reduce ) > $R/nccl-tests-p2p-off.txt 2>&1; st nccl-tests-p2p-off $?
( time MSCCLPP_NCCL_LIB=none timeout 90 $S/new/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
