#!/usr/bin/env bash
# Thirty-fourth session, call 1, one GPU, 2 ranks on GPU 0 under MPS (scripts/with-mps.sh):
# - abdet / abdetp: what mismatch detection (#13) costs one-shot all-reduce at 8 B under a
#   CUDA graph (-G 10), 12 rounds of 1000 iterations, builds alternating in one daemon:
#   N = head with one-shot's call descriptor compiled out (N.patch: no send, no check; the
#   descriptor warp kept), head, K = head sending the descriptor without checking it
#   (K.patch), W = N on a one-warp grid (W.patch: no descriptor warp either), base =
#   98724f9 (before detection and PDL); abdet without PDL (MSCCLPP_PDL=0), abdetp with
#   (MSCCLPP_PDL=1; base has no PDL and is left out there);
# - abcg: session 33's r3, left unrun: head (1bf7efd reverted in 5bec96d) against 03fe1b4,
#   with and without PDL, 8 B-32 KB, 8 rounds of 500;
# - the ll_exchange bench (one-shot against the bare LL exchange, ranks as threads);
# - PyTorch on the library (torch-check.sh with the fixed warning grep).
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/v ] || tar xzf .gpu/v.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/v; R=$OUT/r1; mkdir -p $R; T0=$(date +%s); D=docs/perf/2026-12-06-1xH100-session33  # its abpair.py
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r1.tgz -C $OUT r1; }
nvidia-smi -L > $R/gpu.txt 2>&1
ab() { # NAME ENV ROUNDS BUILDS... ; then the perf arguments after --
  local name=$1 env=$2 rounds=$3; shift 3; local builds=()
  while [ "$1" != -- ]; do builds+=("$1"); shift; done; shift
  { for i in $(seq 1 $rounds); do for v in "${builds[@]}"; do
      echo "## $v $i"; env $env timeout 60 $S/perf-${v%-pdl} --nranks 2 "$@" 2>&1 | grep -v "^#"
  done; done; } > /tmp/$name.sh.log 2>&1
}
export -f ab; export S
( timeout 200 scripts/with-mps.sh bash -c 'ab abdet MSCCLPP_PDL=0 12 N head K W 98724f9 -- -b 8 -e 8 -n 1000 -w 50 -G 10' ); st abdet $?
cp /tmp/abdet.sh.log $R/abdet.txt; python3 $D/abpair.py $R/abdet.txt $R/abdet.json > $R/abdet-ratios.txt 2>&1
( timeout 150 scripts/with-mps.sh bash -c 'ab abdetp MSCCLPP_PDL=1 12 N head K W -- -b 8 -e 8 -n 1000 -w 50 -G 10' ); st abdetp $?
cp /tmp/abdetp.sh.log $R/abdetp.txt; python3 $D/abpair.py $R/abdetp.txt $R/abdetp.json > $R/abdetp-ratios.txt 2>&1
( timeout 200 scripts/with-mps.sh bash -c 'ab abcg MSCCLPP_PDL=0 8 03fe1b4 head -- -b 8 -e 32K -f 4 -n 500 -w 20 -G 10; ab abcgp MSCCLPP_PDL=1 8 03fe1b4 head -- -b 8 -e 32K -f 4 -n 500 -w 20 -G 10' ); st abcg $?
for n in abcg abcgp; do cp /tmp/$n.sh.log $R/$n.txt; python3 $D/abpair.py $R/$n.txt $R/$n.json > $R/$n-ratios.txt 2>&1; done
( timeout 120 $S/ll_exchange --bench ) > $R/ll_exchange.txt 2>&1; st ll_exchange $?
L=$S/libmscclpp_nccl.so
( time timeout 150 env OUT=$R ONLY=ours TORCH_CHECK_DEVICE=0 TORCH_CHECK_SPLIT=1 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=130 \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True scripts/with-mps.sh bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
echo done >> $R/steps.txt; tar czf $OUT/r1.tgz -C $OUT r1
