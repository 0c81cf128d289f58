#!/usr/bin/env bash
# Twenty-second session, call 2, one H200, ranks as processes under one MPS daemon: other
# people's code on our library's paths *across hosts* (first time): nccl-tests 2.19.6
# through libmscclpp_nccl.so alone (ONLY=ours: no real NCCL loaded, so a forwarded call
# would fail) with the two ranks as two simulated hosts (MSCCLPP_SIMULATE_HOSTS=2: every
# collective and send/recv across them over TCP loopback), every test incl. gather, scatter,
# alltoallv, hypercube and each under CUDA graphs; then PyTorch (torch-check.sh, ONLY=ours)
# with the same two simulated hosts. Correctness only.
cd "$(dirname "$0")/../.." || exit 1
if [ "${MSCCLPP_UNDER_MPS:-}" != 1 ]; then
  exec scripts/with-mps.sh bash "$0"
fi
S=.gpu/s; R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests
export WORK=$WORK RUN_TIMEOUT=60 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS="sum"
( OUT=$R/hosts2 MSCCLPP_SIMULATE_HOSTS=2 TYPES="float bfloat16" timeout 330 nccl/scripts/nccl-tests.sh \
  all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter alltoallv hypercube graph_all ) > $R/nccl-tests-hosts2.txt 2>&1; st nccl-tests-hosts2 $?
( OUT=$R/torch MSCCLPP_SIMULATE_HOSTS=2 TORCH_CHECK_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so timeout 200 nccl/scripts/torch-check.sh ) > $R/torch-hosts2.txt 2>&1; st torch-hosts2 $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
