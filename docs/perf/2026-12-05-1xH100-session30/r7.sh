#!/usr/bin/env bash
# Thirtieth session, call 6 (889154a): how the time from SIGSTOP to rank 0's error scales
# with the device timeout (r6: 13.0 s at MSCCLPP_DEVICE_TIMEOUT=4, where the Host transport
# takes 5.0 s): 2 s and 6 s, 2 ranks under MPS, 64 KB all-reduce, stop at 8 s.
cd "$(dirname "$0")/../../.." || exit 1
[ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu || exit 1
S=.gpu/s; R=$OUT/r7; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r7.tgz -C $OUT r7; }
cat > /tmp/stall.sh <<'EOS'
now() { date +%s.%N | cut -c1-14; }
stamp() { while IFS= read -r l; do echo "$(now) $l"; done; }
MSCCLPP_DEVICE_TIMEOUT=$DT "$1" --nranks 2 -b 64K -e 64K -n 200000000 -w 1 > >(stamp) 2>&1 &
pid=$!
sleep 8
kid=""
for k in $(pgrep -P $pid); do grep -qz '^MSCCLPP_RANK=1$' /proc/$k/environ 2>/dev/null && kid=$k; done
echo "$(now) SIGSTOP to rank 1: $kid"
kill -STOP "$kid"
wait $pid; rc=$?; echo "$(now) launcher exit $rc"
EOS
for dt in 2 6; do
  ( DT=$dt timeout 45 scripts/with-mps.sh bash /tmp/stall.sh $S/mscclpp-perf ) > $R/stall-dt$dt.txt 2>&1; st stall-dt$dt $?
done
echo done >> $R/steps.txt; tar czf $OUT/r7.tgz -C $OUT r7
