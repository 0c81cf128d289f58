#!/usr/bin/env bash
# Twenty-third session, call 3, one H200, four ranks on GPU 0 (2 simulated hosts of 2 unless
# said), nccl-tests 2.19.6 through libmscclpp_nccl.so alone (ONLY=ours), each run under an MPS
# daemon of its own, with the library of this call (dependent launch off on a shared GPU;
# MSCCLPP_PDL=1 turns it on there with half the block cap):
#   pdl1-N:  r1's broadcast stress (256 KiB, 20 calls queued) with MSCCLPP_PDL=1, six times:
#            the dependent path, with room for two grids per rank
#   pdl1-all: every test, float, 8 B-8 MB, with MSCCLPP_PDL=1
#   types:   every test but graph, bfloat16 and double, max and avg, 8 B-8 MB (default)
#   lasterr: ncclGetLastError(NULL) after a failure, after GetAsyncError, after CommAbort (C)
#   gpu tests: gpu_collectives, gpu_collectives_more, gpu_cross_host (two ranks on GPU 0)
cd "$(dirname "$0")/../.." || exit 1
S=.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/new/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests
export WORK=/tmp/ncclt TYPES="float" NP=4 MSCCLPP_SIMULATE_HOSTS=2 MSCCLPP_DEVICE_TIMEOUT=15
( gcc -O1 -I nccl/include $S/c/lasterr.c $PWD/$S/new/libmscclpp_nccl.so -o /tmp/lasterr && \
  MSCCLPP_NCCL_LIB=none MSCCLPP_DEBUG=WARN timeout 60 /tmp/lasterr ) > $R/lasterr.txt 2>&1; st lasterr $?
for i in 1 2 3 4 5 6; do
  ( OUT=$R/pdl1-$i MSCCLPP_PDL=1 SIZES="-b 256K -e 256K" ITERS="-n 20 -w 5" RUN_TIMEOUT=45 \
      timeout 200 scripts/with-mps.sh nccl/scripts/nccl-tests.sh broadcast ) > $R/pdl1-$i.txt 2>&1; st pdl1-$i $?
done
export SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" RUN_TIMEOUT=50
ALL="all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter alltoallv hypercube graph"
( OUT=$R/pdl1-all MSCCLPP_PDL=1 OPS=sum timeout 200 scripts/with-mps.sh nccl/scripts/nccl-tests.sh $ALL ) > $R/pdl1-all.txt 2>&1; st pdl1-all $?
( OUT=$R/types TYPES="bfloat16 double" OPS="max avg" timeout 170 scripts/with-mps.sh nccl/scripts/nccl-tests.sh ${ALL% graph} ) > $R/types.txt 2>&1; st types $?
unset MSCCLPP_SIMULATE_HOSTS MSCCLPP_DEVICE_TIMEOUT
for t in gpu_collectives gpu_collectives_more gpu_cross_host; do
  ( timeout 90 scripts/with-mps.sh $S/new/$t --test-threads=1 ) > $R/$t.txt 2>&1; st $t $?
done
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
