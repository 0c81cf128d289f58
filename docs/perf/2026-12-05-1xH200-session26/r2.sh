#!/usr/bin/env bash
# Twenty-sixth session, call 2, one H200, every rank on GPU 0, each step under an MPS daemon
# of its own: other people's code through libmscclpp_nccl.so alone (ONLY=ours: no real NCCL
# loaded) on main dc38327 (first such run since session 23): nccl-tests 2.19.6, every test,
# float, 8 B-8 MB, four ranks as 2 simulated hosts of 2; PyTorch (torch-check.sh) on the
# same layout; the training loop (two ranks, its built-in checks); hosts of different sizes
# (4 + 2 ranks, cut into groups of 2: never run on a GPU); and a stalled rank (SIGSTOP in
# the middle of an all-reduce loop): the other rank's error should come one device timeout
# (4 s here) after the stop, not two (deed54f).
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=.gpu/s; R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
ALL="all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter alltoallv hypercube graph"
( export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests \
    WORK=/tmp/ncclt RUN_TIMEOUT=60 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS=sum TYPES=float NP=4
  OUT=$R/hosts2x2 MSCCLPP_SIMULATE_HOSTS=2 timeout 200 scripts/with-mps.sh nccl/scripts/nccl-tests.sh $ALL ) \
  > $R/nccl-tests-hosts2x2.txt 2>&1; st nccl-tests-hosts2x2 $?
( OUT=$R/torch2x2 ONLY=ours MSCCLPP_NCCL_SO=$PWD/$S/libmscclpp_nccl.so RUN_TIMEOUT=80 NPROC=4 TORCH_CHECK_DEVICE=0 \
  MSCCLPP_SIMULATE_HOSTS=2 timeout 110 scripts/with-mps.sh nccl/scripts/torch-check.sh ) > $R/torch-2x2.txt 2>&1; st torch-2x2 $?
( time timeout 80 scripts/with-mps.sh $S/train-dp --preset compute --steps 20 --nranks 2 \
  --json $R/train-dp.json ) > $R/train-dp.txt 2>&1; st train-dp $?
( time MSCCLPP_TEST_HOST_SIZES=4,2 MSCCLPP_TEST_TIMEOUT_S=120 MSCCLPP_TEST_MAX_BYTES=16M timeout 130 \
  scripts/with-mps.sh $S/gpu_cross_host --test-threads 1 ) > $R/gpu_cross_host-4+2.txt 2>&1; st gpu_cross_host-4+2 $?
cat > /tmp/stall.sh <<'EOS'
now() { date +%s.%N | cut -c1-14; }
stamp() { while IFS= read -r l; do echo "$(now) $l"; done; }
MSCCLPP_DEVICE_TIMEOUT=4 "$1" --nranks 2 -b 64K -e 64K -n 200000000 -w 1 > >(stamp) 2>&1 &
pid=$!
sleep 12
kid=""
for k in $(pgrep -P $pid); do grep -qz '^MSCCLPP_RANK=1$' /proc/$k/environ 2>/dev/null && kid=$k; done
echo "$(now) launcher $pid, children: $(pgrep -P $pid | tr '\n' ' '); SIGSTOP to rank 1: $kid"
kill -STOP "$kid"
wait $pid; rc=$?; echo "$(now) launcher exit $rc"
EOS
( timeout 45 scripts/with-mps.sh bash /tmp/stall.sh $S/mscclpp-perf ) > $R/stall.txt 2>&1; st stall $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
