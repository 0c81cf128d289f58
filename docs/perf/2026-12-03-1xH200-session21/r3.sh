#!/usr/bin/env bash
# Twenty-first session, call 3, one H200, two ranks under one MPS daemon, main 6fa34fd:
# PyTorch 2.11 through libmscclpp_nccl.so alone (torch-check.sh, ONLY=ours: every call must
# be served by us), and the training loop (two ranks, its built-in checks).
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
( OUT=$R ONLY=ours TORCH_CHECK_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so RUN_TIMEOUT=120 \
  timeout 200 nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
( time timeout 150 $S/new/train-dp --preset compute --steps 20 --nranks 2 ) > $R/train-dp.txt 2>&1; st train-dp $?
( time timeout 150 $S/new/train-dp --preset compute --steps 20 --nranks 2 --simulate-hosts 2 ) > $R/train-dp-simhosts.txt 2>&1; st train-dp-simhosts $?
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
