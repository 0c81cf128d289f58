#!/usr/bin/env bash
# Thirty-third session, call 3: r2 showed head with PDL ~4% slower than 03fe1b4 with PDL at
# 8 B-512 B (3 rounds). This isolates 1bf7efd (one-shot reads ctx.rank/nranks once per unit):
# head, head with 1bf7efd reverted (rev) and 03fe1b4 (old), with MSCCLPP_PDL=1 and without,
# 8 rounds, 8 B-32 KB under a CUDA graph, 2 ranks on GPU 0 under MPS. Then PyTorch again
# (torch-check.sh's warning grep no longer takes PyTorch's own "..._WARNING" for ours).
cd "$(dirname "$0")/../../.." || exit 1
mkdir -p .gpu && { [ -d .gpu/s ] || tar xzf .gpu/s.tgz -C .gpu; } || exit 1
S=$PWD/.gpu/s; R=$OUT/r3; mkdir -p $R; T0=$(date +%s)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MSCCLPP_REQUIRE_GPU=1
st() { echo "== $1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/steps.txt"; tar czf $OUT/r3.tgz -C $OUT r3; }
nvidia-smi -L > $R/gpu.txt 2>&1
cat > /tmp/abpdl.sh <<EOS
for i in 1 2 3 4 5 6 7 8; do
  for v in head-pdl rev-pdl old-pdl head rev; do
    P=$S/mscclpp-perf; E=MSCCLPP_PDL=0
    case \$v in rev*) P=$S/mscclpp-perf-rev1bf7efd;; old*) P=$S/mscclpp-perf-03fe1b4;; esac
    case \$v in *-pdl) E=MSCCLPP_PDL=1;; esac
    echo "## \$v \$i"
    env \$E timeout 60 \$P --nranks 2 -b 8 -e 32K -f 4 -n 500 -w 20 -G 10 2>&1 | grep -v "^#"
  done
done
EOS
( timeout 300 scripts/with-mps.sh bash /tmp/abpdl.sh ) > $R/abpdl.txt 2>&1; st abpdl $?
python3 docs/perf/2026-12-06-1xH100-session33/abpair.py $R/abpdl.txt $R/abpdl.json > $R/abpdl-ratios.txt 2>&1
L=$S/libmscclpp_nccl.so
( time timeout 150 env OUT=$R ONLY=ours TORCH_CHECK_DEVICE=0 TORCH_CHECK_SPLIT=1 MSCCLPP_NCCL_SO=$L RUN_TIMEOUT=130 \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True scripts/with-mps.sh bash nccl/scripts/torch-check.sh ) > $R/torch-check.txt 2>&1; st torch-check $?
echo done >> $R/steps.txt; tar czf $OUT/r3.tgz -C $OUT r3
