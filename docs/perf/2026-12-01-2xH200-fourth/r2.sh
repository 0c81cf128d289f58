#!/usr/bin/env bash
# Run 2 on 2x H200: PyTorch and nccl-tests through libmscclpp_nccl.so beside the real NCCL,
# train-dp against NCCL, a pipelined broadcast/reduce shape sweep, one-shot 512 KB A/B.
cd "$(dirname "$0")/.." || exit 1
tar xzf .gpu/b.tgz -C .gpu || exit 1
B=.gpu/b; R=$OUT/r2; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_NCCL_SO=$PWD/$B/libmscclpp_nccl.so
T0=$(date +%s)
snap() { tar czf $OUT/r2.tgz -C $OUT r2 torch nccl-tests ncclt-bin 2>/dev/null; }
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a $R/steps.txt; snap; }
( RUN_TIMEOUT=150 timeout 200 nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch $?
export WORK=/tmp/ncclt RUN_TIMEOUT=40
( TYPES=float OPS=sum SIZES="-b 8 -e 512M -f 4" timeout 230 nccl/scripts/nccl-tests.sh ) > $R/nccl-tests-float.txt 2>&1; st nccl-tests-float $?
mkdir -p $OUT/ncclt-bin && cp $WORK/build/*_perf $OUT/ncclt-bin/ 2>/dev/null
timeout 60 $B/train-dp --preset comm --baseline --compare nccl --json $R/train-comm.json > $R/train-comm.txt 2>&1; st train-comm $?
for bl in 32; do timeout 40 $B/train-dp --preset comm --allreduce-blocks $bl --compare nccl --json $R/train-comm-b$bl.json > $R/train-comm-b$bl.txt 2>&1; st train-comm-b$bl $?; done
# one-shot at 256 KB-1 MB: PDL off, and all-pairs instead
S="-b 256K -e 1M -f 2 -n 50 -w 5 -G 10"
timeout 20 $B/mscclpp-perf $S > $R/ar-mid.txt 2>&1; st ar-mid $?
MSCCLPP_PDL=0 timeout 20 $B/mscclpp-perf $S > $R/ar-mid-pdl0.txt 2>&1; st ar-mid-pdl0 $?
MSCCLPP_ALLREDUCE_ALGO=allpairs timeout 20 $B/mscclpp-perf $S > $R/ar-mid-allpairs.txt 2>&1; st ar-mid-allpairs $?
# pipelined broadcast/reduce shapes at 8-128 MB
for op in broadcast reduce; do
  U=$(echo $op | tr a-z A-Z)
  for d in 2 4 8; do for pc in 16K 128K; do
    env MSCCLPP_${U}_ALGO=pipelined MSCCLPP_ROOTED_DEPTH=$d MSCCLPP_ROOTED_PIECE_BYTES=$pc timeout 15 $B/mscclpp-perf --op $op -b 8M -e 128M -f 4 -n 20 -w 3 -G 5 > $R/sweep-$op-d$d-p$pc.txt 2>&1; st sweep-$op-d$d-p$pc $?
  done; done
  env MSCCLPP_${U}_ALGO=pipelined MSCCLPP_COLL_MAX_BLOCKS=64 timeout 15 $B/mscclpp-perf --op $op -b 8M -e 128M -f 4 -n 20 -w 3 -G 5 > $R/sweep-$op-b64.txt 2>&1; st sweep-$op-b64 $?
  env MSCCLPP_${U}_ALGO=pipelined MSCCLPP_COLL_THREADS=1024 timeout 15 $B/mscclpp-perf --op $op -b 8M -e 128M -f 4 -n 20 -w 3 -G 5 > $R/sweep-$op-t1024.txt 2>&1; st sweep-$op-t1024 $?
done
( ONLY=ours TYPES="bfloat16 int32" OPS="max prod" SIZES="-b 8 -e 8M -f 8" timeout 90 nccl/scripts/nccl-tests.sh all_reduce reduce_scatter reduce ) > $R/nccl-tests-ours-types.txt 2>&1; st nccl-tests-ours-types $?
echo done >> $R/steps.txt; snap
