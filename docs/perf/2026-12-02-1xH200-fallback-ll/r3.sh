#!/usr/bin/env bash
# Fourteenth session, call 3: the ll_exchange bench with alternating order, the set-up
# fallback test (NCCL's type name fixed in its check), and PyTorch with our set-up made to
# fail on every rank (SETUP_FALLBACK=1: every call on the real NCCL) against the plain run;
# one H200 (bench: two ranks as threads; the rest under MPS, NCCL_HOSTID per rank).
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
M=scripts/with-mps.sh
L=$PWD/.gpu/b/libmscclpp_nccl.so
( time timeout 120 .gpu/b/ll_exchange --bench ) > $R/ll_exchange.txt 2>&1; st ll_exchange $?
( time timeout 120 .gpu/b/ll_exchange --bench ) > $R/ll_exchange-2.txt 2>&1; st ll_exchange-2 $?
( time timeout 150 env MSCCLPP_REQUIRE_NCCL=1 $M .gpu/b/gpu_setup_fallback --test-threads 1 --nocapture ) > $R/gpu_setup_fallback.txt 2>&1; st gpu_setup_fallback $?
( time timeout 300 env OUT=$R SETUP_FALLBACK=1 TORCH_CHECK_DEVICE=0 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=130 $M bash nccl/scripts/torch-check.sh ) > $R/torch-check-setup-fallback.txt 2>&1; st torch-check-setup-fallback $?
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
