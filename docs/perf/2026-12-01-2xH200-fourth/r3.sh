#!/usr/bin/env bash
# Run 3 (diagnostics) on 2x H200: PyTorch check logs, send/recv latency knobs, pipelined shapes.
cd "$(dirname "$0")/.." || exit 1
tar xzf .gpu/b.tgz -C .gpu || exit 1
B=.gpu/b; R=$OUT/r3; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_NCCL_SO=$PWD/$B/libmscclpp_nccl.so
T0=$(date +%s)
snap() { tar czf $OUT/r3.tgz -C $OUT r3 torch 2>/dev/null; }
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a $R/steps.txt; snap; }
S="-b 8 -e 128K -f 16 -n 50 -w 5 -G 10"
timeout 25 $B/mscclpp-perf --op sendrecv $S > $R/sr-default.txt 2>&1; st sr-default $?
MSCCLPP_P2P_PACKET_BLOCKS=1 timeout 15 $B/mscclpp-perf --op sendrecv $S > $R/sr-llb1.txt 2>&1; st sr-llb1 $?
MSCCLPP_COLL_THREADS=128 timeout 15 $B/mscclpp-perf --op sendrecv $S > $R/sr-t128.txt 2>&1; st sr-t128 $?
MSCCLPP_P2P_PACKET_BLOCKS=1 MSCCLPP_COLL_THREADS=128 timeout 15 $B/mscclpp-perf --op sendrecv $S > $R/sr-llb1-t128.txt 2>&1; st sr-llb1-t128 $?
MSCCLPP_PDL=0 timeout 15 $B/mscclpp-perf --op sendrecv $S > $R/sr-pdl0.txt 2>&1; st sr-pdl0 $?
timeout 15 $B/mscclpp-perf --op broadcast $S > $R/bc-small.txt 2>&1; st bc-small $?
A="-b 256K -e 1M -f 2 -n 50 -w 5 -G 10"
timeout 15 $B/mscclpp-perf $A > $R/ar-mid.txt 2>&1; st ar-mid $?
MSCCLPP_PDL=0 timeout 15 $B/mscclpp-perf $A > $R/ar-mid-pdl0.txt 2>&1; st ar-mid-pdl0 $?
MSCCLPP_ALLREDUCE_ALGO=allpairs timeout 15 $B/mscclpp-perf $A > $R/ar-mid-allpairs.txt 2>&1; st ar-mid-allpairs $?
for op in broadcast reduce; do
  U=$(echo $op | tr a-z A-Z)
  for d in 2 8; do for pc in 16384 262144; do
    env MSCCLPP_${U}_ALGO=pipelined MSCCLPP_ROOTED_DEPTH=$d MSCCLPP_ROOTED_PIECE_BYTES=$pc timeout 15 $B/mscclpp-perf --op $op -b 2M -e 128M -f 4 -n 20 -w 3 -G 5 > $R/sweep-$op-d$d-p$pc.txt 2>&1; st sweep-$op-d$d-p$pc $?
  done; done
  env MSCCLPP_${U}_ALGO=pipelined MSCCLPP_COLL_MAX_BLOCKS=64 timeout 15 $B/mscclpp-perf --op $op -b 2M -e 128M -f 4 -n 20 -w 3 -G 5 > $R/sweep-$op-b64.txt 2>&1; st sweep-$op-b64 $?
done
( RUN_TIMEOUT=80 timeout 170 nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch $?
echo done >> $R/steps.txt; snap
