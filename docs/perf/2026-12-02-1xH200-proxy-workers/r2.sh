#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
PY=/opt/torch/.venv/bin/python; [ -x $PY ] || PY=python3
timeout 60 $PY .gpu/ce.py > $R/ce.txt 2>&1; st ce $?
P="scripts/with-mps.sh .gpu/b/mscclpp-perf --nranks 2 -b 64M -e 256M -f 4 -n 10 -w 2"
for pass in 1 2; do
  timeout 60 $P --algo auto --json $R/mem-$pass.json > $R/mem-$pass.txt 2>&1; st mem-$pass $?
  i=0
  for cfg in default MSCCLPP_COLL_THREADS=1024 "MSCCLPP_PROXY_FLAG=cpu MSCCLPP_COLL_SCRATCH_BYTES=1073741824" "MSCCLPP_PROXY_FLAG=cpu MSCCLPP_COLL_SCRATCH_BYTES=1073741824 MSCCLPP_COLL_THREADS=1024" "MSCCLPP_PROXY_STREAMS=2 MSCCLPP_COLL_SCRATCH_BYTES=1073741824" MSCCLPP_PROXY_STREAMS=8 "MSCCLPP_PROXY_FLAG=cpu MSCCLPP_COLL_THREADS=1024"; do
    i=$((i+1)); echo "p$i: $cfg" >> $R/configs.txt
    E="MSCCLPP_PROXY_STATS=1"; [ "$cfg" != default ] && E="$E $cfg"
    timeout 70 env $E $P --algo proxy --json $R/p$i-$pass.json > $R/p$i-$pass.txt 2>&1; st p$i-$pass $?
  done
done
