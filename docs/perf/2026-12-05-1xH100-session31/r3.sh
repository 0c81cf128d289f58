#!/usr/bin/env bash
# Thirty-first session, call 2: r2 found rank 0 spinning on the CPU for 8 s after its 1 s
# wait for news, before printing the error: the perf tool drops its buffers (which waits
# for the stream) before it prints, and the stream still held the calls queued behind the
# one that timed out. The same stop (and a SIGKILL) with the binary of 4f33e9f ("old") and
# with the failing threads' claim moved from a host-memory atomic per thread to one
# device-memory swap per call ("new"), each twice, under MPS, MSCCLPP_DEVICE_TIMEOUT=2.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s); D=$PWD/docs/perf/2026-12-05-1xH100-session31
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
nvidia-smi -L > $R/gpu.txt 2>&1
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
cat > /tmp/stall.sh <<EOS
now() { date +%s.%N | cut -c1-14; }
stamp() { while IFS= read -r l; do echo "\$(now) \$l"; done; }
MSCCLPP_DEVICE_TIMEOUT=2 "\$1" --nranks 2 -b 64K -e 64K -n 200000000 -w 1 > >(stamp) 2>&1 &
pid=\$!
sleep 8
k0=""; k1=""
for k in \$(pgrep -P \$pid); do
  grep -qz '^MSCCLPP_RANK=1\$' /proc/\$k/environ 2>/dev/null && k1=\$k
  grep -qz '^MSCCLPP_RANK=0\$' /proc/\$k/environ 2>/dev/null && k0=\$k
done
$PY $D/sample.py \$k0 20 0.2 > /tmp/sample.txt 2>&1 &
sleep 0.5
echo "\$(now) SIG\$2 to rank 1: \$k1 (rank 0: \$k0)"
kill -\$2 "\$k1"
wait \$pid; rc=\$?; echo "\$(now) launcher exit \$rc"
wait
echo "---- rank 0's threads (sample.py)"; cat /tmp/sample.txt
EOS
for i in 1 2; do
  for v in old new; do
    P=$S/mscclpp-perf; [ $v = new ] && P=$S/mscclpp-perf-new
    ( timeout 60 scripts/with-mps.sh bash /tmp/stall.sh $P STOP ) > $R/stall-$v-$i.txt 2>&1; st stall-$v-$i $?
  done
done
for v in old new; do
  P=$S/mscclpp-perf; [ $v = new ] && P=$S/mscclpp-perf-new
  ( timeout 60 scripts/with-mps.sh bash /tmp/stall.sh $P KILL ) > $R/kill-$v.txt 2>&1; st kill-$v $?
done
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
