#!/usr/bin/env bash
# Run 4 on 2x H200: the changed send/recv, broadcast, reduce, all-reduce against NCCL;
# GPU send/recv tests; PyTorch; nccl-tests; train-dp.
cd "$(dirname "$0")/.." || exit 1
tar xzf .gpu/b.tgz -C .gpu || exit 1
B=.gpu/b; R=$OUT/r4; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_NCCL_SO=$PWD/$B/libmscclpp_nccl.so
T0=$(date +%s)
snap() { tar czf $OUT/r4.tgz -C $OUT r4 torch nccl-tests 2>/dev/null; }
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a $R/steps.txt; snap; }
perf() { local n=$1 t=$2; shift 2; timeout $t $B/mscclpp-perf "$@" --compare nccl --json $R/$n.json > $R/$n.txt 2>&1; st $n $?; }
P="-b 8 -e 128M -f 4 -n 20 -w 5"
perf sendrecv-graph 30 --op sendrecv $P -G 10
perf broadcast-graph 20 --op broadcast $P -G 10
perf reduce-graph 20 --op reduce $P -G 10
perf allreduce-graph 15 -b 8 -e 8M -f 2 -n 20 -w 5 -G 10
perf sendrecv-plain 20 --op sendrecv $P
( time timeout 60 $B/gpu_collectives_more --test-threads 1 send pipelined ) > $R/gpu_collectives_more-send.txt 2>&1; st gpu-send $?
( RUN_TIMEOUT=60 timeout 100 nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch $?
( WORK=/tmp/ncclt RUN_TIMEOUT=25 TYPES=float OPS=sum SIZES="-b 8 -e 128M -f 4" timeout 110 nccl/scripts/nccl-tests.sh sendrecv broadcast reduce all_reduce ) > $R/nccl-tests.txt 2>&1; st nccl-tests $?
timeout 50 $B/train-dp --preset comm --baseline --compare nccl --json $R/train-comm.json > $R/train-comm.txt 2>&1; st train-comm $?
echo done >> $R/steps.txt; snap
