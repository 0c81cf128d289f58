#!/usr/bin/env bash
# Thirty-second session, call 3: one-shot all-reduce, head (ctx.rank read once per unit,
# 1bf7efd and after) against 03fe1b4 (the commit before), 8 B-64 KB under a CUDA graph, 2
# ranks on GPU 0 under MPS, alternating 3 times, each with PDL as deployed there (off when
# ranks share a GPU) and with MSCCLPP_PDL=1.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
nvidia-smi -L > $R/gpu.txt 2>&1
cat > /tmp/ab.sh <<EOS
for i in 1 2 3; do
  for v in old head old-pdl head-pdl; do
    P=$S/mscclpp-perf; E=MSCCLPP_PDL=0
    case \$v in old*) P=$S/mscclpp-perf-old;; esac
    case \$v in *-pdl) E=MSCCLPP_PDL=1;; esac
    echo "## \$v \$i"
    env \$E timeout 60 \$P --nranks 2 -b 8 -e 64K -f 2 -n 100 -w 5 -G 10 2>&1 | grep -v "^#"
  done
done
EOS
( timeout 400 scripts/with-mps.sh bash /tmp/ab.sh ) > $R/ab.txt 2>&1; st ab $?
python3 docs/perf/2026-12-05-1xH100-session31/abmean.py $R/ab.txt $R/ab.json > $R/ab-means.txt 2>&1
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
