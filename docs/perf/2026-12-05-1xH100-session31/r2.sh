#!/usr/bin/env bash
# Thirty-first session, call 1 (binaries of 4f33e9f): where the ~8 s between a device
# timeout and rank 0's error goes (session 30: stop to error = timeout + ~9 s on the GPU,
# timeout + 1 s on the Host transport). Rank 1 of a 2-rank 64 KB all-reduce is stopped 8 s
# in with MSCCLPP_DEVICE_TIMEOUT=2 while sample.py records rank 0's threads every 0.2 s
# (state, CPU ticks, system call), under MPS and plain. Then session 30's r8.sh (late ranks
# through PyTorch, gpu_native).
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r2; mkdir -p $R; T0=$(date +%s); D=$PWD/docs/perf/2026-12-05-1xH100-session31
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
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
echo "\$(now) SIGSTOP to rank 1: \$k1 (rank 0: \$k0)"
kill -STOP "\$k1"
wait \$pid; rc=\$?; echo "\$(now) launcher exit \$rc"
wait
echo "---- rank 0's threads (sample.py)"; cat /tmp/sample.txt
EOS
for mode in mps plain; do
  if [ $mode = mps ]; then W=scripts/with-mps.sh; else W=; fi
  ( timeout 60 $W bash /tmp/stall.sh $S/mscclpp-perf ) > $R/stall-$mode.txt 2>&1; st stall-$mode $?
done
bash docs/perf/2026-12-05-1xH100-session30/r8.sh; st r8 $?
cp -r $OUT/r8 $R/ 2>/dev/null
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
