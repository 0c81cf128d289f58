#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r1; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
P="scripts/with-mps.sh .gpu/b/mscclpp-perf --nranks 2 -b 64M -e 256M -f 4 -n 10 -w 2"
for pass in 1 2; do
  timeout 60 $P --algo auto --json $R/mem-$pass.json > $R/mem-$pass.txt 2>&1; st mem-$pass $?
  for cfg in default MSCCLPP_PROXY_FLAG=cpu MSCCLPP_PROXY_STREAMS=2 MSCCLPP_PROXY_STREAMS=8 MSCCLPP_PROXY_BLOCKS=4 MSCCLPP_COLL_SCRATCH_BYTES=1073741824 "MSCCLPP_PROXY_FLAG=cpu MSCCLPP_PROXY_BLOCKS=4"; do
    n=$(echo "$cfg" | sed 's/MSCCLPP_//g; s/ /+/g; s/=/-/g')
    E="MSCCLPP_PROXY_STATS=1"; [ "$cfg" != default ] && E="$E $cfg"
    timeout 60 env $E $P --algo proxy --json $R/p-$n-$pass.json > $R/p-$n-$pass.txt 2>&1; st p-$n-$pass $?
  done
done
