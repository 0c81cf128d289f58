#!/usr/bin/env bash
# Thirty-first session, call 8: session 28's kill harness (SIGKILL at 5 points, 4 ranks as 2
# simulated hosts, all-reduce 1 KB-1 MB, -n 3000) with 4f33e9f ("old") and 7b0ae47 ("new")
# in one call, under MPS: the time from the kill to the survivors' errors and to the job's
# end.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r9; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r9.tgz -C $OUT r9; }
nvidia-smi -L > $R/gpu.txt 2>&1
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
K=docs/perf/2026-12-05-host-setup-kills/kill.py
for v in old new; do
  P=$S/mscclpp-perf-old; [ $v = new ] && P=$S/mscclpp-perf
  cat > /tmp/kills.sh <<EOS
for spec in "0 --delay 0.3" "1 --delay 1.0" "3 --delay 2.0" "1 --after-lines 3" "2 --after-lines 5"; do
  set -- \$spec; r=\$1; shift
  echo "#### rank \$r \$*"
  MSCCLPP_PERF=$P timeout 50 $PY $K --quiet --rank \$r "\$@" -- --op allreduce --nranks 4 \
    --simulate-hosts 2 -b 1K -e 1M -f 4 -n 3000 -w 5
done
EOS
  ( timeout 200 scripts/with-mps.sh bash /tmp/kills.sh ) > $R/kills-$v.txt 2>&1; st kills-$v $?
done
echo done >> $R/steps.txt; tar czf $OUT/r9.tgz -C $OUT r9
