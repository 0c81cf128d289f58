#!/usr/bin/env bash
# Fifteenth session, call 3: ncclCommAbort frees the communicator's memory (the commit after
# fbf0c5c): gpu_native with its new abort test, the same test built against the old
# std::mem::forget (must fail: the control), and PyTorch, whose process-group shutdown
# aborts its communicators; two ranks on one H200 (MPS for the two-process runs).
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
M=scripts/with-mps.sh
L=$PWD/.gpu/b/libmscclpp_nccl.so
( time timeout 120 $M .gpu/b/gpu_native --test-threads 1 --nocapture ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 120 .gpu/old/gpu_native_forget --exact abort_frees_the_communicators_memory --nocapture ) > $R/gpu_native_forget.txt 2>&1; st gpu_native_forget-must-fail $?
export LD_LIBRARY_PATH=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib | head -1)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
( time timeout 200 env OUT=$R TORCH_CHECK_DEVICE=0 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=110 $M bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
