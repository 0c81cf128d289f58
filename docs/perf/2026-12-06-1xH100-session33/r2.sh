#!/usr/bin/env bash
# Thirty-third session, call 2: one-shot all-reduce under a CUDA graph, 2 ranks on GPU 0
# under MPS, builds alternating in one daemon:
# - ab8: 8 B only, 1000 iterations, 8 rounds of base (98724f9, the build before mismatch
#   detection, before PDL), head without PDL and head with MSCCLPP_PDL=1: #13's cost;
# - abcg: 8 B-32 KB, 3 rounds of 03fe1b4 (before the rank-once change, 1bf7efd) and head,
#   each without and with PDL: the codegen change.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r2; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r2.tgz -C $OUT r2; }
nvidia-smi -L > $R/gpu.txt 2>&1
cat > /tmp/ab8.sh <<EOS
for i in 1 2 3 4 5 6 7 8; do
  for v in base head head-pdl; do
    P=$S/mscclpp-perf; E=MSCCLPP_PDL=0
    case \$v in base) P=$S/mscclpp-perf-98724f9; E=;; head-pdl) E=MSCCLPP_PDL=1;; esac
    echo "## \$v \$i"
    env \$E timeout 60 \$P --nranks 2 -b 8 -e 8 -n 1000 -w 50 -G 10 2>&1 | grep -v "^#"
  done
done
EOS
( timeout 250 scripts/with-mps.sh bash /tmp/ab8.sh ) > $R/ab8.txt 2>&1; st ab8 $?
python3 docs/perf/2026-12-06-1xH100-session33/abpair.py $R/ab8.txt $R/ab8.json > $R/ab8-ratios.txt 2>&1
cat > /tmp/abcg.sh <<EOS
for i in 1 2 3; do
  for v in old head old-pdl head-pdl; do
    P=$S/mscclpp-perf; E=MSCCLPP_PDL=0
    case \$v in old*) P=$S/mscclpp-perf-03fe1b4;; esac
    case \$v in *-pdl) E=MSCCLPP_PDL=1;; esac
    echo "## \$v \$i"
    env \$E timeout 60 \$P --nranks 2 -b 8 -e 32K -f 4 -n 200 -w 10 -G 10 2>&1 | grep -v "^#"
  done
done
EOS
( timeout 250 scripts/with-mps.sh bash /tmp/abcg.sh ) > $R/abcg.txt 2>&1; st abcg $?
python3 docs/perf/2026-12-06-1xH100-session33/abpair.py $R/abcg.txt $R/abcg.json > $R/abcg-ratios.txt 2>&1
echo done >> $R/steps.txt; tar czf $OUT/r2.tgz -C $OUT r2
