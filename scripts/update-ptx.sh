#!/usr/bin/env bash
# Usage: scripts/update-ptx.sh [--check]
#
# Compiles the device crate to PTX with the pinned nightly (the project's own pipeline:
# host/build.rs with MSCCLPP_DEVICE_BUILD=nightly) and writes it, with its stamp, to host/ptx/,
# the PTX that stable and packaged builds of mscclpp-host embed. Run it after changing the
# device crate, the device builder or the pinned nightly, and commit host/ptx/.
# The build has no feature `testing`, so the shipped PTX has no test kernels (host/build.rs
# refuses to export a build with them).
#
# --check: build into a temporary directory instead and fail unless host/ptx/ equals it byte
# for byte (CI). Without ptxas, to save its minute: the shipped PTX is compiled with ptxas by
# every other build that finds one.
#
# Arches: those of host/ptx/stamp.txt, or MSCCLPP_PTX_ARCHES when set (default sm_90).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/update-ptx.sh [--check]" >&2; exit 2; }
check=0
case $# in
  0) ;;
  1) [ "$1" = --check ] || usage; check=1 ;;
  *) usage ;;
esac

shipped=host/ptx
if [ -z "${MSCCLPP_PTX_ARCHES-}" ] && [ -f "$shipped/stamp.txt" ]; then
  MSCCLPP_PTX_ARCHES=$(awk '$1 == "ptx" {printf "%s%s", sep, $2; sep=","}' "$shipped/stamp.txt")
fi
export MSCCLPP_PTX_ARCHES=${MSCCLPP_PTX_ARCHES:-sm_90}
# The stamp names the pinned nightly: build with it, not with an override.
unset MSCCLPP_DEVICE_TOOLCHAIN

if [ "$check" = 1 ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  PTXAS=none MSCCLPP_REQUIRE_PTXAS=0 MSCCLPP_PTX_EXPORT_DIR="$out" \
    cargo check -p mscclpp-host --quiet
  if ! diff -rq -x .gitattributes "$shipped" "$out"; then
    diff "$shipped/stamp.txt" "$out/stamp.txt" || true
    echo "error: $shipped differs from a fresh build of the device crate;" \
         "run scripts/update-ptx.sh and commit $shipped" >&2
    exit 1
  fi
  echo "$shipped equals a fresh build ($MSCCLPP_PTX_ARCHES)"
else
  MSCCLPP_PTX_EXPORT_DIR="$PWD/$shipped" cargo check -p mscclpp-host --quiet
  echo "wrote $shipped ($MSCCLPP_PTX_ARCHES):"
  ls -l "$shipped"
fi
