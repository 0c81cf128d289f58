#!/usr/bin/env bash
# Fourteenth session, call 2: the bare LL exchange bench (two ranks as threads on one H200),
# the set-up fallback test after this session's fix (peer-closed counted as a peer loss), gpu_native,
# and nccl-tests with every call forwarded (MSCCLPP_NCCL_FALLBACK=all) against the real NCCL
# on one GPU (NCCL_HOSTID per rank).
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
M=scripts/with-mps.sh
L=$PWD/.gpu/b/libmscclpp_nccl.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
( time timeout 120 .gpu/b/ll_exchange --bench ) > $R/ll_exchange.txt 2>&1; st ll_exchange $?
( time timeout 120 .gpu/b/ll_exchange --bench ) > $R/ll_exchange-2.txt 2>&1; st ll_exchange-2 $?
( time timeout 150 env MSCCLPP_REQUIRE_NCCL=1 $M .gpu/b/gpu_setup_fallback --test-threads 1 --nocapture ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
( time timeout 100 $M .gpu/b/gpu_native --test-threads 1 --nocapture ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 240 env OUT=$R MSCCLPP_NCCL_FALLBACK=all NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$L WORK=/tmp/ncclt RUN_TIMEOUT=30 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" TYPES="float" OPS="sum" $M bash nccl/scripts/nccl-tests.sh all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv ) > $R/nccl-tests-fallback-all.txt 2>&1; st nccl-tests-fallback-all $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
