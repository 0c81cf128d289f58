#!/usr/bin/env bash
# Twenty-third session, call 1, one H200, four ranks on GPU 0 as two simulated hosts of two:
# the broadcast hang at 256 KiB (session 22), A/B. nccl-tests broadcast_perf at 256 KiB only,
# 20 iterations queued (-n 20 -w 5), through libmscclpp_nccl.so alone (ONLY=ours), each run
# under an MPS daemon of its own:
#   old:      session 22's library (programmatic dependent launch on, shared GPU or not)
#   old-pdl0: the same library with MSCCLPP_PDL=0
#   new:      this session's (dependent launch off when ranks share the GPU;
#             MSCCLPP_DEVICE_TIMEOUT=10 so a hang costs 10 s)
cd "$(dirname "$0")/../.." || exit 1
S=.gpu/s; R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
export ONLY=ours NCCL_TESTS_DEVICE=0 NCCL_TESTS_SRC=$PWD/$S/nccl-tests WORK=/tmp/ncclt
export SIZES="-b 256K -e 256K" ITERS="-n 20 -w 5" TYPES="float" NP=4 MSCCLPP_SIMULATE_HOSTS=2
one() { # one <name> <lib> <timeout> [VAR=value ...]
  local name=$1 lib=$2 t=$3; shift 3
  ( env "$@" OUT=$R/$name MSCCLPP_NCCL_SO=$PWD/$S/$lib/libmscclpp_nccl.so RUN_TIMEOUT=$t \
      timeout $((t + 150)) scripts/with-mps.sh nccl/scripts/nccl-tests.sh broadcast ) > $R/$name.txt 2>&1
  st $name $?
}
for i in 1 2 3 4 5 6; do one new-$i new 40 MSCCLPP_DEVICE_TIMEOUT=10; done
for i in 1 2 3 4 5 6; do one old-pdl0-$i old 50 MSCCLPP_PDL=0; done
for i in 1 2 3 4 5 6; do one old-$i old 45; done
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
