#!/usr/bin/env bash
# Fifteenth session, call 1: the cross-host step's gone-partner change (4f10dbd) on the GPU
# (gpu_cross_host; train-dp across two simulated hosts) and the GPU path's first-step
# parameter check (41e790b): correct runs (2 and 3 ranks, bf16 + graph, baseline) and the
# lr-off fault, which must fail; two or three ranks on one H200 under MPS.
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
M=scripts/with-mps.sh
T=".gpu/b/train-dp --layers 4 --width 1024 --batch 240 --steps 10 --check-grads"
( time timeout 60 $M $T --nranks 2 --baseline --json $R/td-2.json ) > $R/td-2.txt 2>&1; st td-2 $?
( time timeout 60 $M $T --nranks 3 --json $R/td-3.json ) > $R/td-3.txt 2>&1; st td-3 $?
( time timeout 60 $M $T --nranks 2 --graph --grad-dtype bf16 --json $R/td-bf16-graph.json ) > $R/td-bf16-graph.txt 2>&1; st td-bf16-graph $?
( time timeout 60 env TRAIN_DP_FAULT=lr-off $M $T --nranks 2 ) > $R/td-lr-off.txt 2>&1; st td-lr-off-must-fail $?
( time timeout 90 $M $T --nranks 2 --simulate-hosts 2 --json $R/td-2hosts.json ) > $R/td-2hosts.txt 2>&1; st td-2hosts $?
( time timeout 300 $M .gpu/b/gpu_cross_host --test-threads 1 ) > $R/gpu_cross_host.txt 2>&1; st gpu_cross_host $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
