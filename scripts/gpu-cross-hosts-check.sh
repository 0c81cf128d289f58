#!/usr/bin/env bash
# GPU checks of the cross-host work: send/recv across hosts (the remote_p2p kernel), the two-shot
# forms across three or more hosts, two hosts of two ranks, hosts of different sizes (4 + 2,
# as groups of 2), train-dp, nccl-tests and PyTorch across simulated hosts. On the development machine (Rust, no GPU), build and pack:
#
#   scripts/gpu-cross-hosts-check.sh --pack     # -> .gpu/b.tgz (about 12 MB)
#
# (PACK_EXTRA="gpu_litmus gpu_fifo ..." packs those test binaries too, PACK_FILES="path ..."
# those files.)
#
# then call the device tool with carry [".gpu"] and command
# `scripts/gpu-cross-hosts-check.sh` (on nvidia-h200-x2 every step; on one GPU see below).
#
# On a machine with ONE GPU (nvidia-h200) every rank is on GPU 0: every step runs under an MPS
# daemon of its own (a kernel that traps in one MPS client fails every client of that daemon,
# so one failing step would fail the rest), and the runs against NCCL are left out (NCCL
# refuses two ranks on one GPU). STEPS="1 2 ..." runs only those steps; step 10 (the 2x2
# all-gather without MPS) runs only when named.
#
# Logs go to $OUT/xh (tarred into $OUT/xh.tgz after every step, so a timeout keeps them).
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = --pack ]; then
  set -e
  cargo build --release --workspace --bins --tests
  cargo build --release -p mscclpp-nccl
  rm -rf .gpu/b && mkdir -p .gpu/b
  for t in gpu_cross_host gpu_collectives_scatter_rooted_p2p gpu_proxy_channel ${PACK_EXTRA:-}; do
    # The newest build of each test (cargo keeps older hashes beside it).
    cp "$(ls -t target/release/deps/$t-* | grep -E "/$t-[0-9a-f]{16}$" | head -1)" .gpu/b/$t
  done
  cp target/release/{mscclpp-perf,train-dp,libmscclpp_nccl.so} .gpu/b/
  # Other files to carry (PACK_FILES="path ..."), e.g. an older build to compare with.
  for f in ${PACK_FILES:-}; do cp "$f" .gpu/b/; done
  strip .gpu/b/*
  # nccl-tests' source (unmodified, built on the GPU machine by nccl/scripts/nccl-tests.sh,
  # which looks for it in .gpu/b/nccl-tests): the device copy of the tree has no shared/.
  NT=${NCCL_TESTS_SRC:-../shared/third_party/nccl-tests-2.19.6}
  if [ -d "$NT" ]; then cp -r "$NT" .gpu/b/nccl-tests; else echo "no nccl-tests at $NT: not packed" >&2; fi
  tar czf .gpu/b.tgz -C .gpu b && rm -rf .gpu/b
  ls -l .gpu/b.tgz
  exit 0
fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
CMP="--compare nccl" M="" NR=""
[ "$NGPU" = 1 ] && {
  CMP="" M=scripts/with-mps.sh NR="--nranks 2"
  export NCCL_TESTS_DEVICE=0 TORCH_CHECK_DEVICE=0
}
# Each test's ranks stop (and print what they said) before the step's own limit.
export MSCCLPP_TEST_TIMEOUT_S=${MSCCLPP_TEST_TIMEOUT_S:-200}
want() { { [ -z "${STEPS:-}" ] && [ "$1" != 10 ]; } || [[ " ${STEPS:-} " == *" $1 "* ]]; }
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

# 1. Two GPUs as two hosts: every cross-host test, send/recv included.
want 1 && { timeout 300 $M $B/gpu_cross_host --test-threads 1 > "$R/gpu_cross_host.txt" 2>&1
  st gpu_cross_host $?; }
# 2. Two hosts of two ranks (four processes: under MPS unless there is a GPU per rank).
#    On one H200 (four ranks on GPU 0) it hung until the block cap for ranks sharing a GPU
#    (with the cap: passed); with a GPU per rank it is the layout of
#    real hosts of two GPUs.
M4=scripts/with-mps.sh M3=scripts/with-mps.sh
[ "$NGPU" -ge 4 ] && M4=""
[ "$NGPU" -ge 3 ] && M3=""
want 2 && { MSCCLPP_TEST_RANKS_PER_HOST=2 timeout 300 $M4 $B/gpu_cross_host \
  --test-threads 1 > "$R/gpu_cross_host-2x2.txt" 2>&1; st gpu_cross_host-2x2 $?; }
# 3. Three hosts (three processes, MPS unless a GPU each): large calls take the two-shot forms.
want 3 && { MSCCLPP_TEST_HOSTS=3 timeout 300 $M3 $B/gpu_cross_host \
  --test-threads 1 > "$R/gpu_cross_host-3.txt" 2>&1; st gpu_cross_host-3 $?; }
# 4. Send/recv inside one host is unchanged (the local group's indexes equal the ranks).
want 4 && { timeout 120 $M $B/gpu_collectives_scatter_rooted_p2p --test-threads 1 send \
  > "$R/gpu_collectives_scatter_rooted_p2p-send.txt" 2>&1; st gpu_collectives_scatter_rooted_p2p-send $?; }
# 5. Against NCCL's socket transport, two GPUs as two hosts (ours alone on one GPU).
P="-b 8 -e 64M -f 4 -n 20 -w 5"
want 5 && { env $SOCK timeout 120 $M $B/mscclpp-perf $NR --simulate-hosts 2 --op sendrecv $P $CMP \
  --json "$R/sendrecv-simhosts.json" > "$R/sendrecv-simhosts.txt" 2>&1; st sendrecv-simhosts $?
  env $SOCK timeout 120 $M $B/mscclpp-perf $NR --simulate-hosts 2 $P $CMP \
  --json "$R/allreduce-simhosts.json" > "$R/allreduce-simhosts.txt" 2>&1; st allreduce-simhosts $?; }
# 6. Three ranks as three hosts (MPS): one-shot against two-shot, ours only.
want 6 && for a in oneshot twoshot; do
  timeout 120 scripts/with-mps.sh $B/mscclpp-perf --nranks 3 --simulate-hosts 3 --algo $a \
    -b 64K -e 64M -f 4 -n 10 -w 3 --json "$R/allreduce-3hosts-$a.json" \
    > "$R/allreduce-3hosts-$a.txt" 2>&1; st "allreduce-3hosts-$a" $?
done
# 7. Other people's code across simulated hosts: nccl-tests through our NCCL library, its
#    two ranks as two hosts (MSCCLPP_SIMULATE_HOSTS; needs .gpu/b/libmscclpp_nccl.so).
want 7 && [ -f $B/libmscclpp_nccl.so ] && {
  ( MSCCLPP_SIMULATE_HOSTS=2 ONLY=ours MSCCLPP_NCCL_SO=$PWD/$B/libmscclpp_nccl.so WORK=/tmp/ncclt \
    RUN_TIMEOUT=60 TYPES=float OPS=sum SIZES="-b 8 -e 32M -f 8" \
    timeout 250 $M nccl/scripts/nccl-tests.sh sendrecv all_reduce all_gather broadcast ) \
    > "$R/nccl-tests-simhosts.txt" 2>&1; st nccl-tests-simhosts $?; }
# 8. PyTorch through our library across two simulated hosts (torchrun passes the variable on).
want 8 && [ -f $B/libmscclpp_nccl.so ] && {
  ( MSCCLPP_SIMULATE_HOSTS=2 ONLY=ours MSCCLPP_NCCL_SO=$PWD/$B/libmscclpp_nccl.so RUN_TIMEOUT=90 \
    timeout 150 $M nccl/scripts/torch-check.sh ) > "$R/torch-simhosts.txt" 2>&1; st torch-simhosts $?; }
# 9. The training loop across two simulated hosts against NCCL (socket transport for both
#    sides' cross-host traffic is not forced here: NCCL picks its own).
want 9 && { timeout 200 $M $B/train-dp --preset compute --steps 20 $NR --simulate-hosts 2 $CMP \
  --json "$R/train-simhosts.json" > "$R/train-simhosts.txt" 2>&1; st train-simhosts $?; }
# 10. The 2x2 all-gather test WITHOUT MPS (four processes time-sliced on whatever GPUs there
#     are): on one GPU it separates MPS from our code in the 2x2 hang (slow, but it should
#     pass if the hang is about MPS).
want 10 && { MSCCLPP_TEST_RANKS_PER_HOST=2 MSCCLPP_TEST_TIMEOUT_S=150 timeout 180 \
  $B/gpu_cross_host --test-threads 1 --exact cross_host_all_gather_places_every_rank \
  > "$R/gpu_cross_host-2x2-nomps.txt" 2>&1; st gpu_cross_host-2x2-nomps $?; }
# 11. Hosts of different sizes (4 + 2 ranks): the library cuts them into three groups of 2
#     (memory channels inside a group; the two groups of the larger host talk over the copy
#     engine). Six processes: MPS unless there are six GPUs.
M6=scripts/with-mps.sh
[ "$NGPU" -ge 6 ] && M6=""
want 11 && { MSCCLPP_TEST_HOST_SIZES=4,2 timeout 300 $M6 $B/gpu_cross_host \
  --test-threads 1 > "$R/gpu_cross_host-4+2.txt" 2>&1; st gpu_cross_host-4+2 $?; }
echo done >> "$R/steps.txt"; snap
