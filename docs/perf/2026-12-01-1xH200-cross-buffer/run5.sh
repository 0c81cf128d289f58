#!/usr/bin/env bash
# One-GPU run 5 (session 8): three simulated hosts (the two-shot forms: per-destination
# reducing rounds, grid-reduced, over host-mapped buffers), MPS.
cd "$(dirname "$0")/.." || exit 1
[ -d .gpu/b ] || tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r5; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
MSCCLPP_TEST_HOSTS=3 MSCCLPP_TEST_TIMEOUT_S=75 timeout 170 scripts/with-mps.sh .gpu/b/gpu_cross_host --test-threads 1 > $R/gpu_cross_host-3.txt 2>&1
echo "== tests-3hosts rc=$? t=$(( $(date +%s) - T0 ))s" | tee -a $R/steps.txt
