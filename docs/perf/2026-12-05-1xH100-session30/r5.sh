#!/usr/bin/env bash
# Thirtieth session, call 4: machine code embedded beside the PTX (the cubin ptxas makes at
# build time). (1) First-run cost: the perf tool, 2 ranks under MPS, 8 B-1 MB, with the JIT
# cache empty (a fresh CUDA_CACHE_PATH) and then warm, loading the PTX
# (MSCCLPP_KERNEL_IMAGE=ptx: the driver compiles it) or the cubin (the default), same binary,
# twice each, alternated. (2) The GPU suites and tools again with the cubin loaded.
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=$PWD/.gpu/s; R=$OUT/r5; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=130 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r5.tgz -C $OUT r5; }
nvidia-smi -L > $R/gpu.txt 2>&1; nvidia-smi --query-gpu=driver_version --format=csv,noheader >> $R/gpu.txt 2>&1
$S/mscclpp > $R/mscclpp.txt 2>&1; st mscclpp $?
for rep in 1 2; do
  for img in ptx cubin; do
    C=$(mktemp -d /tmp/jit.XXXXXX)
    for cache in cold warm; do
      ( MSCCLPP_KERNEL_IMAGE=$img CUDA_CACHE_PATH=$C timeout 120 scripts/with-mps.sh bash -c \
        's=$(date +%s.%N); "$0" --nranks 2 -b 8 -e 1M -f 8 -n 5 -w 1; rc=$?; e=$(date +%s.%N); echo "wall $(awk "BEGIN{printf \"%.2f\", $e - $s}") rc $rc"' \
        $S/mscclpp-perf ) > $R/perf-$img-$cache-$rep.txt 2>&1
      echo "$img $cache rep $rep: $(grep '^wall' $R/perf-$img-$cache-$rep.txt) cache $(du -sk $C | cut -f1) KiB" | tee -a $R/first-run.txt
    done
    rm -rf $C
  done
done
st first-run 0
( time timeout 150 scripts/with-mps.sh $S/gpu_collectives --test-threads=1 ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
( time timeout 60 $S/gpu_proxy_channel --test-threads=1 ) > $R/gpu_proxy_channel.txt 2>&1; st gpu_proxy_channel $?
( time MSCCLPP_NCCL_LIB=none timeout 100 scripts/with-mps.sh $S/gpu_native --test-threads 1 ) > $R/gpu_native.txt 2>&1; st gpu_native $?
( time timeout 80 scripts/with-mps.sh $S/train-dp --preset compute --steps 20 --nranks 2 \
  --json $R/train-dp.json ) > $R/train-dp.txt 2>&1; st train-dp $?
( time timeout 30 $S/custom-kernel-example ) > $R/custom-kernel.txt 2>&1; st custom-kernel $?
( export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$S/libmscclpp_nccl.so NCCL_TESTS_SRC=$S/nccl-tests \
    WORK=/tmp/ncclt RUN_TIMEOUT=60 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS=sum TYPES=float
  OUT=$R/np2 NP=2 timeout 150 scripts/with-mps.sh nccl/scripts/nccl-tests.sh all_reduce all_gather reduce_scatter sendrecv ) \
  > $R/nccl-tests-np2.txt 2>&1; st nccl-tests-np2 $?
left=$(( 560 - ($(date +%s) - T0) ))
if [ $left -gt 100 ]; then
  ( time timeout $left scripts/with-mps.sh $S/gpu_collectives_more --test-threads=1 ) > $R/gpu_collectives_more.txt 2>&1; st gpu_collectives_more $?
fi
echo done >> $R/steps.txt; tar czf $OUT/r5.tgz -C $OUT r5
