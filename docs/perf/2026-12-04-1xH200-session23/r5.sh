#!/usr/bin/env bash
# Twenty-third session, call 5, one H200: ncclGetLastError(NULL) after an asynchronous error
# and ncclCommAbort, as nccl-tests reads it (asyncerr.c: two ranks on GPU 0, rank 1 leaves),
# with MSCCLPP_DEBUG=INFO and WARN, and with a 3 s device timeout.
cd "$(dirname "$0")/../.." || exit 1
S=.gpu/s; R=$OUT/r5; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gcc -O1 -I nccl/include $S/c/asyncerr.c $PWD/$S/new/libmscclpp_nccl.so -o /tmp/asyncerr > $R/build.txt 2>&1 || exit 1
for dbg in INFO WARN; do
  ( MSCCLPP_NCCL_LIB=none MSCCLPP_DEBUG=$dbg MSCCLPP_DEVICE_TIMEOUT=3 timeout 60 scripts/with-mps.sh /tmp/asyncerr ) > $R/asyncerr-$dbg.txt 2>&1
  echo "== $dbg rc=$?" >> $R/steps.txt
done
