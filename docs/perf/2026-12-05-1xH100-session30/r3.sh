#!/usr/bin/env bash
# Thirtieth session, call 1, one GPU, every rank on GPU 0. First: session 29's open #13
# finding (2 ranks, MSCCLPP_DEVICE_TIMEOUT=4, 64 KB all-reduce with -n 200000000, SIGSTOP to
# rank 1: no error in 33 s), rerun with what rank 0 is doing 8 s and 20 s after the stop
# (thread states, kernel wait channels, gdb stacks where gdb exists, nvidia-smi), then a
# SIGCONT to rank 1 at 24 s (does rank 0 go on, or report?), once under MPS and once without
# (two contexts time-sliced). Then nccl-tests np2 through libmscclpp_nccl.so alone (peers'
# code against bootstrap protocol 8) and the cross-host GPU suite test by test, with the
# time left.
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=130 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
nvidia-smi -L > $R/gpu.txt 2>&1; command -v gdb >> $R/gpu.txt 2>&1
cat > /tmp/stall.sh <<'EOS'
now() { date +%s.%N | cut -c1-14; }
stamp() { while IFS= read -r l; do echo "$(now) $l"; done; }
look() {
  echo "$(now) ---- look: $1"
  for p in $r0 $kid; do
    echo "-- pid $p: $(grep -E '^State' /proc/$p/status 2>/dev/null)"
    for t in /proc/$p/task/*; do
      echo "   $(basename $t) $(cat $t/comm 2>/dev/null) $(awk '{print $3}' $t/stat 2>/dev/null) wchan=$(cat $t/wchan 2>/dev/null)"
    done
  done
  if command -v gdb >/dev/null; then
    timeout 20 gdb -p $r0 -batch -ex "thread apply all bt 12" 2>&1 | grep -E '^Thread|^#' | head -120
  fi
  timeout 10 nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1 | head
  timeout 10 nvidia-smi --query-gpu=utilization.gpu --format=csv 2>&1 | tail -1
}
MSCCLPP_DEVICE_TIMEOUT=4 "$1" --nranks 2 -b 64K -e 64K -n 200000000 -w 1 > >(stamp) 2>&1 &
pid=$!
sleep 12
kid=""; r0=""
for k in $(pgrep -P $pid); do
  grep -qz '^MSCCLPP_RANK=1$' /proc/$k/environ 2>/dev/null && kid=$k
  grep -qz '^MSCCLPP_RANK=0$' /proc/$k/environ 2>/dev/null && r0=$k
done
echo "$(now) launcher $pid, children: $(pgrep -P $pid | tr '\n' ' '); rank 0: $r0; SIGSTOP to rank 1: $kid"
kill -STOP "$kid"
sleep 8; look "8 s after the stop"
sleep 12; look "20 s after the stop"
sleep 4; echo "$(now) SIGCONT to rank 1"; kill -CONT "$kid"
sleep 8; look "8 s after the SIGCONT"
kill -TERM $pid 2>/dev/null; sleep 2; kill -KILL $pid $r0 $kid 2>/dev/null
wait $pid; rc=$?; echo "$(now) launcher exit $rc"
EOS
( timeout 80 scripts/with-mps.sh bash /tmp/stall.sh $S/mscclpp-perf ) > $R/stall-mps.txt 2>&1; st stall-mps $?
( timeout 80 bash /tmp/stall.sh $S/mscclpp-perf ) > $R/stall-plain.txt 2>&1; st stall-plain $?
( export ONLY=ours NCCL_TESTS_DEVICE=0 MSCCLPP_NCCL_SO=$PWD/$S/libmscclpp_nccl.so NCCL_TESTS_SRC=$PWD/$S/nccl-tests \
    WORK=/tmp/ncclt RUN_TIMEOUT=60 SIZES="-b 8 -e 8M -f 32" ITERS="-n 2 -w 1" OPS=sum TYPES=float
  OUT=$R/np2 NP=2 timeout 150 scripts/with-mps.sh nccl/scripts/nccl-tests.sh \
    all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv gather scatter alltoallv hypercube graph ) \
  > $R/nccl-tests-np2.txt 2>&1; st nccl-tests-np2 $?
$S/gpu_cross_host --list 2>/dev/null | grep ': test$' | sed 's/: test$//' > /tmp/xh.txt
while read -r t; do
  left=$(( 575 - ($(date +%s) - T0) )); [ $left -gt 20 ] || { echo "== $t not run: no time left" >> $R/steps.txt; continue; }
  ( time MSCCLPP_TEST_TIMEOUT_S=$(( left - 5 )) timeout $left scripts/with-mps.sh $S/gpu_cross_host --exact "$t" \
    --test-threads=1 ) >> $R/gpu_cross_host.txt 2>&1; st "gpu_cross_host $t" $?
done < /tmp/xh.txt
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
