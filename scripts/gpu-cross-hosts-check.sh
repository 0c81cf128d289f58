#!/usr/bin/env bash
# First GPU checks of the cross-host work written without device time (2026-12-01, fifth
# session): send/recv across hosts (the xp2p kernel), the two-shot forms across three or more
# hosts, train-dp across simulated hosts. For the device tool on nvidia-h200-x2, with the
# release binaries packed as the other sessions did:
#
#   .gpu/b/{gpu_cross_host,gpu_collectives_more,mscclpp-perf,train-dp,libmscclpp_nccl.so}
#   tar czf .gpu/b.tgz -C .gpu b;  run: carry [".gpu"], command scripts/gpu-cross-hosts-check.sh
#
# Logs go to $OUT/xh (tarred into $OUT/xh.tgz after every step, so a timeout keeps them).
cd "$(dirname "$0")/.." || exit 1
[ -d .gpu/b ] || tar xzf .gpu/b.tgz -C .gpu || exit 1
B=.gpu/b
R=${OUT:-/tmp}/xh
mkdir -p "$R"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
T0=$(date +%s)
snap() { tar czf "${OUT:-/tmp}/xh.tgz" -C "${OUT:-/tmp}" xh 2>/dev/null; }
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; snap; }
# NCCL on its socket transport over loopback, as issue #17's numbers were taken.
SOCK="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo"

# 1. Two GPUs as two hosts: every cross-host test, send/recv included; then two hosts of two
#    ranks (four processes on two GPUs: under MPS).
timeout 300 $B/gpu_cross_host --test-threads 1 > "$R/gpu_cross_host.txt" 2>&1; st gpu_cross_host $?
MSCCLPP_TEST_RANKS_PER_HOST=2 timeout 300 scripts/with-mps.sh $B/gpu_cross_host --test-threads 1 \
  > "$R/gpu_cross_host-2x2.txt" 2>&1; st gpu_cross_host-2x2 $?
# 2. Three hosts (three processes, MPS): large calls take the two-shot forms.
MSCCLPP_TEST_HOSTS=3 timeout 300 scripts/with-mps.sh $B/gpu_cross_host --test-threads 1 \
  > "$R/gpu_cross_host-3.txt" 2>&1; st gpu_cross_host-3 $?
# 3. Send/recv inside one host is unchanged (the local group's indexes equal the ranks).
timeout 120 $B/gpu_collectives_more --test-threads 1 send > "$R/gpu_collectives_more-send.txt" 2>&1
st gpu_collectives_more-send $?
# 4. Against NCCL's socket transport, two GPUs as two hosts.
P="-b 8 -e 64M -f 4 -n 20 -w 5"
env $SOCK timeout 120 $B/mscclpp-perf --simulate-hosts 2 --op sendrecv $P --compare nccl \
  --json "$R/sendrecv-simhosts.json" > "$R/sendrecv-simhosts.txt" 2>&1; st sendrecv-simhosts $?
env $SOCK timeout 120 $B/mscclpp-perf --simulate-hosts 2 $P --compare nccl \
  --json "$R/allreduce-simhosts.json" > "$R/allreduce-simhosts.txt" 2>&1; st allreduce-simhosts $?
# 5. Three ranks as three hosts on two GPUs (MPS): one-shot against two-shot, ours only.
for a in oneshot twoshot; do
  timeout 120 scripts/with-mps.sh $B/mscclpp-perf --nranks 3 --simulate-hosts 3 --algo $a \
    -b 64K -e 64M -f 4 -n 10 -w 3 --json "$R/allreduce-3hosts-$a.json" \
    > "$R/allreduce-3hosts-$a.txt" 2>&1; st "allreduce-3hosts-$a" $?
done
# 6. Other people's code across simulated hosts: nccl-tests through our NCCL library, its
#    two ranks as two hosts (MSCCLPP_SIMULATE_HOSTS; needs .gpu/b/libmscclpp_nccl.so).
if [ -f $B/libmscclpp_nccl.so ]; then
  ( MSCCLPP_SIMULATE_HOSTS=2 ONLY=ours MSCCLPP_NCCL_SO=$PWD/$B/libmscclpp_nccl.so WORK=/tmp/ncclt \
    RUN_TIMEOUT=60 TYPES=float OPS=sum SIZES="-b 8 -e 32M -f 8" \
    timeout 250 nccl/scripts/nccl-tests.sh sendrecv all_reduce all_gather broadcast ) \
    > "$R/nccl-tests-simhosts.txt" 2>&1; st nccl-tests-simhosts $?
fi
# PyTorch through our library across two simulated hosts (torchrun passes the variable on).
if [ -f $B/libmscclpp_nccl.so ]; then
  ( MSCCLPP_SIMULATE_HOSTS=2 ONLY=ours MSCCLPP_NCCL_SO=$PWD/$B/libmscclpp_nccl.so RUN_TIMEOUT=90 \
    timeout 150 nccl/scripts/torch-check.sh ) > "$R/torch-simhosts.txt" 2>&1; st torch-simhosts $?
fi
# 7. The training loop across two simulated hosts against NCCL (socket transport for both
#    sides' cross-host traffic is not forced here: NCCL picks its own).
timeout 200 $B/train-dp --preset compute --steps 20 --simulate-hosts 2 --compare nccl \
  --json "$R/train-simhosts.json" > "$R/train-simhosts.txt" 2>&1; st train-simhosts $?
echo done >> "$R/steps.txt"; snap
