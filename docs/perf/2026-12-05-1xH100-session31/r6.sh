#!/usr/bin/env bash
# Thirty-first session, call 5: which commit since 98724f9 (before mismatch detection) made
# one-shot slower from 4 KB up (r4, r5: +0.45-0.7 us at 4-64 KB under a CUDA graph, one H100,
# MPS). mscclpp-perf built at the commits that changed the one-shot kernel's files, run
# alternately 3 times: 2 ranks on GPU 0 under MPS, 8 B-64 KB, CUDA graph.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r6; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r6.tgz -C $OUT r6; }
nvidia-smi -L > $R/gpu.txt 2>&1
cat > /tmp/ab.sh <<EOS
for i in 1 2 3; do
  for v in base e86b410 6b9ba14 cf503e5 ef1c64c c4e4f0a 4bb1435 fe61870 ec5dbc7 cc1cbee head; do
    P=$S/mscclpp-perf-\$v; [ \$v = head ] && P=$S/mscclpp-perf
    echo "## \$v \$i"
    timeout 60 \$P --nranks 2 -b 8 -e 64K -f 2 -n 100 -w 5 -G 10 2>&1 | grep -v "^#"
  done
done
EOS
( timeout 400 scripts/with-mps.sh bash /tmp/ab.sh ) > $R/ab.txt 2>&1; st ab $?
echo done >> $R/steps.txt; tar czf $OUT/r6.tgz -C $OUT r6
