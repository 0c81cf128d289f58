#!/usr/bin/env bash
# Thirtieth session, call 3: why rank 0 of a 2-rank all-reduce under MPS says nothing when
# rank 1 is stopped with SIGSTOP (r3's stall-mps.txt: rank 0 running at 8 s with the GPU
# idle, asleep on a futex at 20 s, no error in 36 s; without MPS it named the stopped rank
# 15 s after the stop). Looks at rank 0 with stackscan.py (a crude stack scan; the machine
# has no gdb) while rank 0 is held by SIGSTOP for a moment, and at the MPS server's threads;
# then the same run with CUDA_MODULE_LOADING=EAGER (a kernel loaded lazily under MPS waits
# for the whole server's work), and with rank 1 stopped only 4 s in.
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=.gpu/s; R=$OUT/r4; mkdir -p $R; T0=$(date +%s); H=$PWD/docs/perf/2026-12-05-1xH100-session30
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
( ls /usr/local/cuda/bin; command -v gdb cuda-gdb strace perf eu-stack addr2line readelf python3 ) > $R/tools.txt 2>&1
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
cat > /tmp/stall.sh <<EOS
H=$H; PY=$PY; FIRST=\${FIRST:-12}
EOS
cat >> /tmp/stall.sh <<'EOS'
now() { date +%s.%N | cut -c1-14; }
stamp() { while IFS= read -r l; do echo "$(now) $l"; done; }
look() {
  echo "$(now) ---- look: $1"
  for p in $r0 $kid $(pgrep -f nvidia-cuda-mps-server); do
    echo "-- pid $p $(cat /proc/$p/comm 2>/dev/null): $(grep -E '^State' /proc/$p/status 2>/dev/null)"
    for t in /proc/$p/task/*; do
      echo "   $(basename $t) $(cat $t/comm 2>/dev/null) $(awk '{print $3}' $t/stat 2>/dev/null) wchan=$(cat $t/wchan 2>/dev/null) sys=$(cut -d' ' -f1 $t/syscall 2>/dev/null)"
    done
  done
  kill -STOP $r0; sleep 0.2
  timeout 60 $PY $H/stackscan.py $r0 49152 2>&1 | head -150
  kill -CONT $r0
  timeout 10 nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader 2>&1 | tail -1
}
"$1" --nranks 2 -b 64K -e 64K -n 200000000 -w 1 > >(stamp) 2>&1 &
pid=$!
sleep $FIRST
kid=""; r0=""
for k in $(pgrep -P $pid); do
  grep -qz '^MSCCLPP_RANK=1$' /proc/$k/environ 2>/dev/null && kid=$k
  grep -qz '^MSCCLPP_RANK=0$' /proc/$k/environ 2>/dev/null && r0=$k
done
echo "$(now) launcher $pid, rank 0: $r0; SIGSTOP to rank 1: $kid"
kill -STOP "$kid"
sleep 8; look "8 s after the stop"
sleep 10; look "20 s after the stop"
sleep 5; echo "$(now) SIGCONT to rank 1"; kill -CONT "$kid"
sleep 8; echo "$(now) 8 s after the SIGCONT"
kill -TERM $pid 2>/dev/null; sleep 2; kill -KILL $pid $r0 $kid 2>/dev/null
wait $pid; rc=$?; echo "$(now) launcher exit $rc"
EOS
export MSCCLPP_DEVICE_TIMEOUT=4
( timeout 80 scripts/with-mps.sh bash /tmp/stall.sh $S/mscclpp-perf-syms ) > $R/stall-mps.txt 2>&1; st stall-mps $?
( CUDA_MODULE_LOADING=EAGER timeout 80 scripts/with-mps.sh bash /tmp/stall.sh $S/mscclpp-perf-syms ) > $R/stall-mps-eager.txt 2>&1; st stall-mps-eager $?
( FIRST=4 timeout 80 scripts/with-mps.sh bash /tmp/stall.sh $S/mscclpp-perf-syms ) > $R/stall-mps-at4.txt 2>&1; st stall-mps-at4 $?
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
