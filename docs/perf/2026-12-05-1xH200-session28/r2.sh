#!/usr/bin/env bash
# Twenty-eighth session, call 2, one H200, every rank on GPU 0, each step under an MPS daemon
# of its own: other people's code through libmscclpp_nccl.so alone (ONLY=ours: no real NCCL
# loaded) after session 27's bootstrap protocol 6 (process ids in the peer table, the root
# told of ranks that ended): nccl-tests 2.19.6, every test, float, 8 B-8 MB, two ranks on one
# host and four ranks as 2 simulated hosts of 2; PyTorch (torch-check.sh) as 2 hosts of 2;
# then the NCCL library's native-call tests, the other collectives' GPU suite and the
# training loop's built-in checks.
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=.gpu/s; R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=130 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
ALL="all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter alltoallv hypercube graph"
( export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests \
    WORK=/tmp/ncclt RUN_TIMEOUT=60 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS=sum TYPES=float
  OUT=$R/hosts2x2 NP=4 MSCCLPP_SIMULATE_HOSTS=2 timeout 200 scripts/with-mps.sh nccl/scripts/nccl-tests.sh $ALL ) \
  > $R/nccl-tests-hosts2x2.txt 2>&1; st nccl-tests-hosts2x2 $?
( export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests \
    WORK=/tmp/ncclt RUN_TIMEOUT=60 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS=sum TYPES=float
  OUT=$R/np2 NP=2 timeout 120 scripts/with-mps.sh nccl/scripts/nccl-tests.sh $ALL ) \
  > $R/nccl-tests-np2.txt 2>&1; st nccl-tests-np2 $?
( OUT=$R/torch2x2 ONLY=ours MSCCLPP_NCCL_SO=$PWD/$S/libmscclpp_nccl.so RUN_TIMEOUT=80 NPROC=4 TORCH_CHECK_DEVICE=0 \
  MSCCLPP_SIMULATE_HOSTS=2 timeout 110 scripts/with-mps.sh nccl/scripts/torch-check.sh ) > $R/torch-2x2.txt 2>&1; st torch-2x2 $?
( time MSCCLPP_NCCL_LIB=none timeout 100 scripts/with-mps.sh $S/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 80 scripts/with-mps.sh $S/train-dp --preset compute --steps 20 --nranks 2 \
  --json $R/train-dp.json ) > $R/train-dp.txt 2>&1; st train-dp $?
( time timeout 140 scripts/with-mps.sh $S/gpu_collectives_more --test-threads=1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
