#!/usr/bin/env bash
# Twenty-eighth session, call 1, one H200, every rank a process on GPU 0, each step under an
# MPS daemon of its own, main at the commit named in README.md (sessions 26-27's work, never
# run on a GPU): the stalled-rank check session 26 could not run (r3 there: calls queued
# behind one that gave up for good give up at once), the collectives' GPU suite (with its
# test of 64 queued calls behind a stalled rank), the cross-host suite whole (TCP transport
# between simulated hosts; the DevConn sync that now gives up at the abort word), the proxy
# channel suite, and ranks killed with SIGKILL across 2 simulated hosts under the perf tool
# (session 27's setup-kill harness, Host-transport record in ../2026-12-05-host-setup-kills),
# and one rank stopped with SIGSTOP mid-sweep (3 s device timeout).
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=.gpu/s; R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
export MSCCLPP_TEST_TIMEOUT_S=130 MSCCLPP_TEST_MAX_BYTES=64M
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
nvidia-smi -L > $R/gpu.txt 2>&1
D=docs/perf/2026-12-05-1xH200-session26
sed -n "/^cat > \/tmp\/stall.sh <<'EOS'/,/^EOS/p" $D/r2.sh | sed '1d;$d' > /tmp/stall.sh
( timeout 45 scripts/with-mps.sh bash /tmp/stall.sh $S/mscclpp-perf ) > $R/stall.txt 2>&1; st stall $?
( time timeout 150 scripts/with-mps.sh $S/gpu_collectives --test-threads=1 -Z unstable-options --report-time ) \
  > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
( time MSCCLPP_TEST_TIMEOUT_S=160 timeout 170 scripts/with-mps.sh $S/gpu_cross_host --test-threads=1 \
  -Z unstable-options --report-time ) > $R/gpu_cross_host.txt 2>&1; st gpu_cross_host $?
( time timeout 60 $S/gpu_proxy_channel --test-threads=1 ) > $R/gpu_proxy_channel.txt 2>&1; st gpu_proxy_channel $?
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
( timeout 150 scripts/with-mps.sh bash /tmp/kills.sh ) > $R/kills.txt 2>&1; st kills $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
