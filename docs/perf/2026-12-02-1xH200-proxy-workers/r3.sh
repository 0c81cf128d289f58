#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
P="scripts/with-mps.sh .gpu/b/mscclpp-perf --nranks 2 -b 64M -e 256M -f 4 -n 10 -w 2"
for pass in 1; do
  timeout 60 $P --algo auto --json $R/mem-$pass.json > $R/mem-$pass.txt 2>&1; st mem-$pass $?
  i=0
  for cfg in default MSCCLPP_PROXY_WORKERS=4 "MSCCLPP_PROXY_BLOCKS=4 MSCCLPP_PROXY_WORKERS=8" "MSCCLPP_PROXY_BLOCKS=2 MSCCLPP_PROXY_WORKERS=16" "MSCCLPP_PROXY_BLOCKS=2 MSCCLPP_PROXY_WORKERS=8" "MSCCLPP_PROXY_FLAG=cpu MSCCLPP_PROXY_BLOCKS=4 MSCCLPP_PROXY_WORKERS=8" "MSCCLPP_PROXY_FLAG=cpu MSCCLPP_PROXY_BLOCKS=2 MSCCLPP_PROXY_WORKERS=16"; do
    i=$((i+1)); [ $pass = 1 ] && echo "p$i: $cfg" >> $R/configs.txt
    E="MSCCLPP_PROXY_STATS=1"; [ "$cfg" != default ] && E="$E $cfg"
    timeout 60 env $E $P --algo proxy --json $R/p$i-$pass.json > $R/p$i-$pass.txt 2>&1; st p$i-$pass $?
  done
done
timeout 60 env MSCCLPP_PROXY_BLOCKS=2 MSCCLPP_PROXY_WORKERS=16 scripts/with-mps.sh .gpu/b/mscclpp-perf --nranks 2 --op allgather -b 16M -e 256M -f 4 -n 10 -w 2 --algo proxy --json $R/ag-w.json > $R/ag-w.txt 2>&1; st ag-w $?
timeout 60 scripts/with-mps.sh .gpu/b/mscclpp-perf --nranks 2 --op allgather -b 16M -e 256M -f 4 -n 10 -w 2 --algo proxy --json $R/ag-d.json > $R/ag-d.txt 2>&1; st ag-d $?
T=$(ls .gpu/b/ | grep -m1 '^gpu_collectives$' || true)
timeout 150 env MSCCLPP_PROXY_WORKERS=8 MSCCLPP_TEST_MAX_BYTES=64M MSCCLPP_TEST_TIMEOUT_S=140 scripts/with-mps.sh .gpu/b/gpu_collectives --test-threads 1 --exact all_reduce_matches_the_cpu_reference_from_4_bytes_to_1_gib > $R/gc-w8.txt 2>&1; st gc-w8 $?
timeout 100 env MSCCLPP_PROXY_WORKERS=8 MSCCLPP_TEST_TIMEOUT_S=90 scripts/with-mps.sh .gpu/b/gpu_collectives --test-threads 1 --exact all_gather_places_every_rank_from_2_bytes_to_512_mib > $R/gc-ag-w8.txt 2>&1; st gc-ag-w8 $?
