#!/usr/bin/env bash
# Twenty-third session, call 6, one H200: r5's asyncerr.c built as nccl-tests is (against
# the real NCCL's header and libnccl.so.2) and run with our library in LD_PRELOAD
# (MSCCLPP_NCCL_LIB=none), then with the real NCCL's header but our library linked directly.
cd "$(dirname "$0")/../.." || exit 1
S=.gpu/s; R=$OUT/r6; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
P=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl | head -1)
mkdir -p /tmp/nl && ln -sf $P/lib/libnccl.so.2 /tmp/nl/libnccl.so
gcc -O1 -I $P/include -I /usr/local/cuda/include $S/c/asyncerr.c -L/tmp/nl -lnccl -o /tmp/asyncerr-real > $R/build.txt 2>&1 || { cat $R/build.txt; exit 1; }
ldd /tmp/asyncerr-real | grep -i nccl >> $R/build.txt
( LD_LIBRARY_PATH=$P/lib LD_PRELOAD=$PWD/$S/new/libmscclpp_nccl.so MSCCLPP_NCCL_LIB=none MSCCLPP_DEBUG=WARN \
    timeout 60 scripts/with-mps.sh /tmp/asyncerr-real ) > $R/preload.txt 2>&1; echo "== preload rc=$?" >> $R/steps.txt
( LD_LIBRARY_PATH=$P/lib LD_PRELOAD=$PWD/$S/new/libmscclpp_nccl.so MSCCLPP_DEBUG=WARN \
    timeout 60 scripts/with-mps.sh /tmp/asyncerr-real ) > $R/preload-real-beside.txt 2>&1; echo "== preload-real-beside rc=$?" >> $R/steps.txt
