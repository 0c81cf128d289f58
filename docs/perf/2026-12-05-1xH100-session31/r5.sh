#!/usr/bin/env bash
# Thirty-first session, call 4: where one-shot's extra time over the build before mismatch
# detection goes (r4: +0.1 us at 8 B, +0.5 us at 8 KB under a CUDA graph, one H100, MPS).
# Builds: base = 98724f9; head = 7b0ae47; nodesc = head without one-shot's descriptor send
# and check; grid = head with base's one-shot grid (no descriptor-only warp); head256 = head
# with MSCCLPP_COLL_THREADS=256. 2 ranks on GPU 0 under MPS, 8 B-64 KB, alternating 3 times.
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r5; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r5.tgz -C $OUT r5; }
nvidia-smi -L > $R/gpu.txt 2>&1
cat > /tmp/ab.sh <<EOS
for i in 1 2 3; do
  for v in base head nodesc grid head256; do
    P=$S/mscclpp-perf-\$v; E=
    case \$v in head) P=$S/mscclpp-perf;; head256) P=$S/mscclpp-perf; E=MSCCLPP_COLL_THREADS=256;; esac
    echo "## \$v graph \$i"
    env \$E timeout 60 \$P --nranks 2 -b 8 -e 64K -f 2 -n 100 -w 5 -G 10 2>&1 | grep -v "^#"
  done
done
EOS
( timeout 400 scripts/with-mps.sh bash /tmp/ab.sh ) > $R/ab.txt 2>&1; st ab $?
echo done >> $R/steps.txt; tar czf $OUT/r5.tgz -C $OUT r5
