#!/usr/bin/env bash
cd "$(dirname "$0")/.." || exit 1
rm -rf .gpu/b && tar xzf .gpu/b.tgz -C .gpu || exit 1
R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
A="--nranks 2 -b 1M -e 256M -f 4 -n 10 -w 2"
for pass in 1 2; do
  timeout 60 scripts/with-mps.sh .gpu/b/mscclpp-perf $A --algo auto --json $R/ar-mem-$pass.json > $R/ar-mem-$pass.txt 2>&1; st ar-mem-$pass $?
  timeout 60 scripts/with-mps.sh .gpu/v/perf-main $A --algo proxy --json $R/ar-old-$pass.json > $R/ar-old-$pass.txt 2>&1; st ar-old-$pass $?
  timeout 60 env MSCCLPP_PROXY_STATS=1 scripts/with-mps.sh .gpu/b/mscclpp-perf $A --algo proxy --json $R/ar-new-$pass.json > $R/ar-new-$pass.txt 2>&1; st ar-new-$pass $?
done
timeout 60 scripts/with-mps.sh .gpu/v/perf-main $A --op allgather --algo proxy --json $R/ag-old.json > $R/ag-old.txt 2>&1; st ag-old $?
timeout 60 scripts/with-mps.sh .gpu/b/mscclpp-perf $A --op allgather --algo proxy --json $R/ag-new.json > $R/ag-new.txt 2>&1; st ag-new $?
timeout 60 scripts/with-mps.sh .gpu/b/mscclpp-perf $A --op allgather --algo auto --json $R/ag-mem.json > $R/ag-mem.txt 2>&1; st ag-mem $?
timeout 120 env MSCCLPP_TEST_MAX_BYTES=256M MSCCLPP_TEST_TIMEOUT_S=110 scripts/with-mps.sh .gpu/b/gpu_collectives --test-threads 1 --exact all_reduce_matches_the_cpu_reference_from_4_bytes_to_1_gib > $R/gc-ar.txt 2>&1; st gc-ar $?
timeout 100 env MSCCLPP_TEST_TIMEOUT_S=90 scripts/with-mps.sh .gpu/b/gpu_collectives --test-threads 1 --exact all_gather_places_every_rank_from_2_bytes_to_512_mib > $R/gc-ag.txt 2>&1; st gc-ag $?
