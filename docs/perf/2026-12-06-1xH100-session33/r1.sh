#!/usr/bin/env bash
# Thirty-third session, call 1, 2 ranks on GPU 0 under MPS:
# - gpu_collectives, whose typed-API test all-reduces across the seam of two cuMemCreate
#   segments with every algorithm, after waiting for its input copy to land (session 32's
#   failure of that test read a rank's input before its pageable cuMemcpyHtoD had landed);
# - gpu_setup_fallback with the real NCCL beside ours (the NOCOLOR split under
#   MSCCLPP_SIMULATE_HOSTS, fixed in 85653b6; the fallback agreement's report copy now on
#   its own stream);
# - PyTorch 2.11 on the library alone (ONLY=ours) with TORCH_CHECK_SPLIT=1 (split_group) and
#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (a 48 MiB tensor across segments);
# - nccl-tests 2.19.6 on the library alone; gpu_native.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && rm -rf .gpu/s && tar xzf .gpu/s.tgz -C .gpu || exit 1
S=$PWD/.gpu/s; R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=150
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
nvidia-smi -L > $R/gpu.txt 2>&1
M=scripts/with-mps.sh
L=$S/libmscclpp_nccl.so
( time timeout 100 $M $S/gpu_collectives --test-threads 1 typed_api ) > $R/gpu_collectives-typed.txt 2>&1; st gpu_collectives-typed $?
NL=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib | head -1)
( time timeout 100 env LD_LIBRARY_PATH=$NL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} MSCCLPP_REQUIRE_NCCL=1 \
  $M $S/gpu_setup_fallback --test-threads 1 --nocapture ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
( time timeout 150 env OUT=$R ONLY=ours TORCH_CHECK_DEVICE=0 TORCH_CHECK_SPLIT=1 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=130 \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $M bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
( time MSCCLPP_NCCL_LIB=none timeout 60 $M $S/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$L NCCL_TESTS_SRC=$S/nccl-tests \
    WORK=/tmp/ncclt RUN_TIMEOUT=40 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS=sum TYPES=float
  OUT=$R/np2 NP=2 timeout 170 $M nccl/scripts/nccl-tests.sh all_reduce all_gather reduce_scatter \
    broadcast alltoall sendrecv ) > $R/nccl-tests-np2.txt 2>&1; st nccl-tests-np2 $?
R2=$(( 560 - $(date +%s) + T0 ))
[ $R2 -gt 60 ] && { ( time timeout $R2 $M $S/gpu_collectives --test-threads 1 --skip typed_api ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?; }
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
