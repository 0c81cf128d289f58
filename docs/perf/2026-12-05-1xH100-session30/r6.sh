#!/usr/bin/env bash
# Thirtieth session, call 5, binaries of 889154a (cubin embedded): session 26's stall check
# once more on an empty JIT cache (a fresh CUDA_CACHE_PATH), where r4 found set-up still
# compiling PTX 20 s after the stop; then session 28's kill harness (SIGKILL at 5 points,
# SIGSTOP once; 4 ranks as 2 simulated hosts), all under MPS.
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=.gpu/s; R=$OUT/r6; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r6.tgz -C $OUT r6; }
nvidia-smi -L > $R/gpu.txt 2>&1
D=docs/perf/2026-12-05-1xH200-session26
sed -n "/^cat > \/tmp\/stall.sh <<'EOS'/,/^EOS/p" $D/r2.sh | sed '1d;$d' > /tmp/stall.sh
export CUDA_CACHE_PATH=$(mktemp -d /tmp/jit.XXXXXX)
( timeout 45 scripts/with-mps.sh bash /tmp/stall.sh $S/mscclpp-perf ) > $R/stall-cold-cubin.txt 2>&1; st stall-cold-cubin $?
echo "JIT cache after: $(du -sk $CUDA_CACHE_PATH | cut -f1) KiB" >> $R/stall-cold-cubin.txt
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
K=docs/perf/2026-12-05-host-setup-kills/kill.py
cat > /tmp/kills.sh <<EOS
for spec in "0 --delay 0.3" "1 --delay 1.0" "3 --delay 2.0" "1 --after-lines 3" "2 --after-lines 5" \
    "1 --sig STOP --dt 3 --after-lines 3"; do
  set -- \$spec; r=\$1; shift
  echo "#### rank \$r \$*"
  MSCCLPP_PERF=$S/mscclpp-perf timeout 50 $PY $K --quiet --rank \$r "\$@" -- --op allreduce --nranks 4 \
    --simulate-hosts 2 -b 1K -e 1M -f 4 -n 3000 -w 5
done
EOS
( timeout 200 scripts/with-mps.sh bash /tmp/kills.sh ) > $R/kills.txt 2>&1; st kills $?
echo done >> $R/steps.txt; tar czf $OUT/r6.tgz -C $OUT r6
