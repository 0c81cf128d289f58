#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
[ -d .gpu/b ] || tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r6; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_NCCL_SO=$PWD/.gpu/b/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/.gpu/nccl-tests
snap() { tar czf $OUT/r6.tgz -C $OUT r6 nccl-tests torch 2>/dev/null; }
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; snap; }
ONLY=ours NCCL_TESTS_DEVICE=0 RUN_TIMEOUT=40 SIZES="-b 8 -e 8M -f 32" ITERS="-n 5 -w 2" TYPES="float int8 bfloat16" \
  timeout 260 scripts/with-mps.sh bash nccl/scripts/nccl-tests.sh sendrecv alltoall > $R/nccl-tests.txt 2>&1; st nccl-tests $?
ONLY=ours TORCH_CHECK_DEVICE=0 RUN_TIMEOUT=100 timeout 130 nccl/scripts/torch-check.sh > $R/torch-check.txt 2>&1; st torch $?
echo done >> $R/steps.txt; snap
