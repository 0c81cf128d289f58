#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r5; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r5.tgz -C $OUT r5; }
P="scripts/with-mps.sh .gpu/b/mscclpp-perf --nranks 2 -b 32M -e 256M -f 2 -n 10 -w 2"
for pass in 1 2; do
  timeout 60 $P --algo auto --json $R/mem-$pass.json > $R/mem-$pass.txt 2>&1; st mem-$pass $?
  timeout 60 $P --algo proxy --json $R/p-default-$pass.json > $R/p-default-$pass.txt 2>&1; st p-default-$pass $?
  for cfg in "8 8 1048576" "16 16 0" "16 16 1048576" "32 32 0" "32 16 0"; do
    set -- $cfg; n=l$1-b$2-c$3
    E="MSCCLPP_PROXY_LANES=$1 MSCCLPP_PROXY_BLOCKS=$2"; [ $3 != 0 ] && E="$E MSCCLPP_PROXY_CHUNK_BYTES=$3"
    timeout 60 env $E $P --algo proxy --json $R/p-$n-$pass.json > $R/p-$n-$pass.txt 2>&1; st p-$n-$pass $?
  done
done
