#!/usr/bin/env bash
# Thirty-fourth session, call 2, one GPU, 2 ranks on GPU 0 under MPS. r1 found head's
# one-shot at 8 B faster WITH the call descriptor than with it compiled out (N). The guess:
# the waits' look at the host's abort word (a few PCIe reads, at most every 50 us per rank)
# stalls the thread that makes it; in head the descriptor thread, which waits first, usually
# makes it, in N the data thread. F = head with F.patch (a wait looks at the host only after
# waiting 20 us); NF = N + F.patch; WF = W + F.patch.
# - abfix / abfixp: 8 B under a CUDA graph, 10 rounds of 1000, builds N head F NF WF 98724f9
#   without PDL, N head F NF with MSCCLPP_PDL=1 (10 rounds);
# - abfixcg: F against head, 8 B-32 KB, 4 rounds of 500, with and without PDL;
# - the fault tests of gpu_collectives built with F (mismatch, stalled rank, departed rank
#   over packets and semaphores, p2p with a departed rank, graph replay);
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/w ] || tar xzf .gpu/w.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/w; R=$OUT/r2; mkdir -p $R; T0=$(date +%s); D=docs/perf/2026-12-06-1xH100-session33  # its abpair.py
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
nvidia-smi -L > $R/gpu.txt 2>&1
ab() { # NAME ENV ROUNDS BUILDS... -- perf arguments
  local name=$1 env=$2 rounds=$3; shift 3; local builds=()
  while [ "$1" != -- ]; do builds+=("$1"); shift; done; shift
  { for i in $(seq 1 $rounds); do for v in "${builds[@]}"; do
      echo "## $v $i"; env $env timeout 60 $S/perf-$v --nranks 2 "$@" 2>&1 | grep -v "^#"
  done; done; } > /tmp/$name.log 2>&1
}
export -f ab; export S
( timeout 200 scripts/with-mps.sh bash -c 'ab abfix MSCCLPP_PDL=0 10 N head F NF WF 98724f9 -- -b 8 -e 8 -n 1000 -w 50 -G 10; ab abfixp MSCCLPP_PDL=1 10 N head F NF -- -b 8 -e 8 -n 1000 -w 50 -G 10' ); st abfix $?
( timeout 150 scripts/with-mps.sh bash -c 'ab abfixcg MSCCLPP_PDL=0 4 head F -- -b 8 -e 32K -f 4 -n 500 -w 20 -G 10; ab abfixcgp MSCCLPP_PDL=1 4 head F -- -b 8 -e 32K -f 4 -n 500 -w 20 -G 10' ); st abfixcg $?
for n in abfix abfixp abfixcg abfixcgp; do cp /tmp/$n.log $R/$n.txt; python3 $D/abpair.py $R/$n.txt $R/$n.json > $R/$n-ratios.txt 2>&1; done
( timeout 150 scripts/with-mps.sh $S/gpu_collectives --test-threads 1 mismatched calls_queued a_call_a_departed a_receive a_large_send replays ) > $R/gpu_collectives.txt 2>&1; st gpu_collectives $?
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
