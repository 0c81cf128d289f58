#!/usr/bin/env bash
# Run 1 on 2x H200: every collective against NCCL, proxy, simulated hosts, train-dp, benches.
cd "$(dirname "$0")/.." || exit 1
tar xzf .gpu/b.tgz -C .gpu || exit 1
B=.gpu/b; R=$OUT/r1; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
T0=$(date +%s)
snap() { tar czf $OUT/r1.tgz -C $OUT r1; }
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a $R/steps.txt; snap; }
nvidia-smi -L > $R/gpus.txt; nvidia-smi topo -m >> $R/gpus.txt 2>&1
P="-b 8 -e 512M -f 4 -n 20 -w 5"
perf() { # name timeout args...
  local n=$1 t=$2; shift 2
  timeout $t $B/mscclpp-perf "$@" --compare nccl --json $R/$n.json > $R/$n.txt 2>&1; st $n $?
}
perf allreduce-graph 50 $P -G 10
perf allreduce-plain 50 $P
perf allgather-graph 50 --op allgather $P -G 10
perf allgather-plain 50 --op allgather $P
perf sendrecv-graph 50 --op sendrecv $P -G 10
perf sendrecv-plain 50 --op sendrecv $P
perf broadcast-graph 50 --op broadcast $P -G 10
MSCCLPP_BROADCAST_ALGO=pipelined perf broadcast-pipe-graph 40 --op broadcast -b 512K -e 512M -f 4 -n 20 -w 5 -G 10
perf reduce-graph 50 --op reduce $P -G 10
MSCCLPP_REDUCE_ALGO=pipelined perf reduce-pipe-graph 40 --op reduce -b 512K -e 512M -f 4 -n 20 -w 5 -G 10
perf reducescatter-graph 50 --op reducescatter $P -G 10
perf alltoall-graph 50 --op alltoall $P -G 10
perf proxy-allreduce 40 --algo proxy -b 32M -e 512M -f 2 -n 20 -w 5
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo perf simhosts-allreduce 70 --simulate-hosts 2 -b 8 -e 512M -f 8 -n 5 -w 2
timeout 40 $B/memory_channel --bench > $R/memory_channel.txt 2>&1; st memory_channel $?
for m in stream cpu; do MSCCLPP_PROXY_FLAG=$m timeout 40 $B/proxy_channel --bench > $R/proxy_channel-$m.txt 2>&1; st proxy_channel-$m $?; done
timeout 60 $B/train-dp --preset comm --baseline --compare nccl --json $R/train-comm.json > $R/train-comm.txt 2>&1; st train-comm $?
timeout 50 $B/train-dp --preset comm --allreduce-blocks 32 --compare nccl --json $R/train-comm-b32.json > $R/train-comm-b32.txt 2>&1; st train-comm-b32 $?
timeout 50 $B/train-dp --preset compute --baseline --compare nccl --json $R/train-compute.json > $R/train-compute.txt 2>&1; st train-compute $?
echo done >> $R/steps.txt; snap
