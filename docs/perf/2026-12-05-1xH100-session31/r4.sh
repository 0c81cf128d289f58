#!/usr/bin/env bash
# Thirty-first session, call 3: what mismatch detection costs at 8 B-8 KB under a CUDA graph
# on one GPU (issue 13's goal: <= 2% at 8 B against the build before it). "base" = 98724f9
# (main before the fault branch: no call descriptors, no fault words), "head" = this
# session's build; 2 ranks on GPU 0 under MPS, alternating, 4 runs each; then plain
# launches once each.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r4; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r4.tgz -C $OUT r4; }
nvidia-smi -L > $R/gpu.txt 2>&1
cat > /tmp/ab.sh <<EOS
for i in 1 2 3 4; do
  for v in base head; do
    P=$S/mscclpp-perf; [ \$v = base ] && P=$S/mscclpp-perf-base
    echo "## \$v graph \$i"
    timeout 60 \$P --nranks 2 -b 8 -e 8K -f 4 -n 100 -w 5 -G 10 2>&1 | grep -v "^#"
  done
done
for v in base head; do
  P=$S/mscclpp-perf; [ \$v = base ] && P=$S/mscclpp-perf-base
  echo "## \$v plain"
  timeout 60 \$P --nranks 2 -b 8 -e 8K -f 4 -n 1000 -w 20 2>&1 | grep -v "^#"
done
EOS
( timeout 300 scripts/with-mps.sh bash /tmp/ab.sh ) > $R/ab.txt 2>&1; st ab $?
echo done >> $R/steps.txt; tar czf $OUT/r4.tgz -C $OUT r4
