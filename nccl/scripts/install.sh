#!/usr/bin/env bash
# Installs libmscclpp_nccl.so as a drop-in NCCL under PREFIX:
#
#   nccl/scripts/install.sh PREFIX [LIBRARY]     # LIBRARY: target/release/libmscclpp_nccl.so
#
#   PREFIX/lib/libmscclpp_nccl.so
#   PREFIX/lib/libnccl.so.2 -> libmscclpp_nccl.so   (what programs built against NCCL load)
#   PREFIX/lib/libnccl.so   -> libmscclpp_nccl.so   (what `cc ... -lnccl` links to)
#   PREFIX/include/nccl.h                           (our header, NCCL 2.28's ABI)
#
# Then `LD_LIBRARY_PATH=PREFIX/lib program` runs an NCCL program on us without LD_PRELOAD,
# and `cc app.c -IPREFIX/include -LPREFIX/lib -lnccl` builds against us. The real NCCL, for
# the calls we forward, is still found as docs/guide/03-nccl-library.md says; a libnccl.so.2 that is this
# library (these links) is never taken for it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] && [ $# -le 2 ] || { sed -n 2,14p "$0" >&2; exit 2; }
PREFIX=$1
LIB=${2:-$ROOT/target/release/libmscclpp_nccl.so}
[ -f "$LIB" ] || { echo "install.sh: no $LIB (cargo build --release -p mscclpp-nccl)" >&2; exit 2; }
mkdir -p "$PREFIX/lib" "$PREFIX/include"
install -m 0755 "$LIB" "$PREFIX/lib/libmscclpp_nccl.so"
ln -sfn libmscclpp_nccl.so "$PREFIX/lib/libnccl.so.2"
ln -sfn libmscclpp_nccl.so "$PREFIX/lib/libnccl.so"
install -m 0644 "$ROOT/nccl/include/nccl.h" "$PREFIX/include/nccl.h"
echo "installed into $PREFIX: lib/libmscclpp_nccl.so (and libnccl.so.2, libnccl.so), include/nccl.h"
