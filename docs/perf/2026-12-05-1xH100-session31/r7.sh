#!/usr/bin/env bash
# Thirty-first session, call 6: is one-shot's extra block the cost from 4 KB up? head's grid
# holds units + 32 threads (a descriptor warp without data), so from 4 KB it has one block
# more than base's. "fit" = head with blocks = ceil(units / threads) (the descriptor warp
# kept; 32 data threads take two units); "head-pdl" = head with MSCCLPP_PDL=1 (programmatic
# dependent launch, off by default when ranks share a GPU). base = 98724f9. 2 ranks on GPU
# 0 under MPS, 8 B-64 KB, CUDA graph, alternating 3 times.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r7; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r7.tgz -C $OUT r7; }
nvidia-smi -L > $R/gpu.txt 2>&1
cat > /tmp/ab.sh <<EOS
for i in 1 2 3; do
  for v in base head fit head-pdl; do
    P=$S/mscclpp-perf-\$v; E=
    case \$v in head) P=$S/mscclpp-perf;; head-pdl) P=$S/mscclpp-perf; E=MSCCLPP_PDL=1;; esac
    echo "## \$v \$i"
    env \$E timeout 60 \$P --nranks 2 -b 8 -e 64K -f 2 -n 100 -w 5 -G 10 2>&1 | grep -v "^#"
  done
done
EOS
( timeout 300 scripts/with-mps.sh bash /tmp/ab.sh ) > $R/ab.txt 2>&1; st ab $?
echo done >> $R/steps.txt; tar czf $OUT/r7.tgz -C $OUT r7
