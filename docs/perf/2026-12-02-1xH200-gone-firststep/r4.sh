#!/usr/bin/env bash
# Fifteenth session, call 4: the abort test fixed (both ranks finish their copies before
# either launches): twice against this head, once against the old std::mem::forget (must
# fail), outside MPS (one process, two ranks as threads); then the two-process native test
# under MPS alone (in call 3 it ran after the broken abort test in the same MPS server and
# failed with CUDA_ERROR_LAUNCH_FAILED).
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
A="--exact abort_frees_the_communicators_memory --nocapture"
( time timeout 100 .gpu/b/gpu_native $A ) > $R/abort-1.txt 2>&1; st abort-1 $?
( time timeout 100 .gpu/b/gpu_native $A ) > $R/abort-2.txt 2>&1; st abort-2 $?
( time timeout 100 .gpu/old/gpu_native_forget $A ) > $R/abort-forget.txt 2>&1; st abort-forget-must-fail $?
( time timeout 100 scripts/with-mps.sh .gpu/b/gpu_native --exact native_calls_through_the_c_api_on_gpus ) > $R/native.txt 2>&1; st native $?
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
