#!/usr/bin/env bash
# nccl-tests on the real NCCL, then on libmscclpp_nccl.so (LD_PRELOAD, falling back to the
# same real NCCL), with data checks (-c 1), and a side-by-side table of the two.
#
#   nccl/scripts/nccl-tests.sh [test ...]     # default: the default set below
#
# Tests: all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv graph (the
# default set; "graph": all_reduce of float sum captured into CUDA graphs, -G 20), and on
# request gather scatter alltoallv hypercube (grouped sends and receives) and graph_all
# (every test once under -G 20). A command of the GPU
# tool may run 10 minutes: split the list across calls if needed (the build is kept in
# $WORK between calls of one machine; logs go to $OUT/nccl-tests).
#
# Needs, from the project root: nccl-tests 2.19.6 source (see SRC below),
# target/release/libmscclpp_nccl.so (cargo build --release -p mscclpp-nccl; carry it),
# nvcc in $CUDA_HOME (/usr/local/cuda), Open MPI's mpirun, and NCCL's headers and library
# (default: PyTorch's wheel in /opt/torch/.venv, nvidia/nccl/{include,lib}).
#
# Settings: NP (ranks, 2), SIZES ("-b 8 -e 64M -f 8"), ITERS ("-n 20 -w 5"), TYPES, OPS,
# NCCL_PKG (folder with include/nccl.h and lib/libnccl.so.2), MSCCLPP_NCCL_SO, WORK.
# Every MSCCLPP_* variable reaches our library's ranks only (the real NCCL's runs do not see
# them): MSCCLPP_SIMULATE_HOSTS=N runs them as N simulated hosts (across hosts over TCP on
# one machine). MSCCLPP_NCCL_FALLBACK (e.g. all)
# reaches our library's ranks, to check the forwarded path with the same tests, and so does
# MSCCLPP_P2P_REMOTE_MAX (0 with simulated hosts: sends and receives go to the real NCCL).
# Our library's WARN lines fail a run unless they match the regular expression EXPECT_WARN
# (for runs that set up a warned-about case on purpose, as the one above).
# ONLY=ours skips the real NCCL's runs and loads no real NCCL beside ours
# (MSCCLPP_NCCL_LIB=none: a call we would forward fails instead); with
# NCCL_TESTS_DEVICE=0 every rank uses GPU 0 (nccl-tests' own variable), so a one-GPU
# machine can check our calls with two ranks. The real NCCL refuses two ranks on one GPU of
# one host: with NCCL_TESTS_DEVICE set and a real NCCL in use, each rank gets its own
# NCCL_HOSTID, so the real NCCL sees one host per rank and joins them over its socket
# transport on loopback (correct, and slow: its times then say nothing of NVLink).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/nccl-tests-out}
LOGS=$OUT/nccl-tests
WORK=${WORK:-/tmp/mscclpp-nccl-tests}
NP=${NP:-2}
SIZES=${SIZES:--b 8 -e 64M -f 8}
ITERS=${ITERS:--n 20 -w 5}
TYPES=${TYPES:-float half bfloat16 int32 int8 double}
OPS=${OPS:-sum prod max min avg}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# The source: NCCL_TESTS_SRC, else the first of shared/nccl-tests, what the GPU packs carry
# (.gpu/b/nccl-tests) and the copy beside the project.
SRC=${NCCL_TESTS_SRC:-}
if [ -z "$SRC" ]; then
  for d in "$ROOT/shared/nccl-tests" "$ROOT/.gpu/b/nccl-tests" "$ROOT/../shared/third_party/nccl-tests-2.19.6"; do
    [ -d "$d" ] && { SRC=$d; break; }
  done
fi
SRC=${SRC:-$ROOT/shared/nccl-tests}
LIB=${MSCCLPP_NCCL_SO:-$ROOT/target/release/libmscclpp_nccl.so}
MPI_HOME=${MPI_HOME:-/usr/lib/x86_64-linux-gnu/openmpi}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$LOGS" "$WORK"

die() { echo "nccl-tests.sh: $*" >&2; exit 2; }
[ -d "$SRC" ] || die "no nccl-tests source at $SRC (copy nccl-tests 2.19.6 there)"
[ -f "$LIB" ] || die "no $LIB (cargo build --release -p mscclpp-nccl, and carry target/release/libmscclpp_nccl.so)"
if [ -z "${NCCL_PKG:-}" ]; then
  NCCL_PKG=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl 2>/dev/null | head -1)
fi
[ -f "${NCCL_PKG:-}/include/nccl.h" ] || die "no NCCL headers: set NCCL_PKG to a folder with include/nccl.h and lib/libnccl.so.2"
REAL=$(ls "$NCCL_PKG"/lib/libnccl.so.2* 2>/dev/null | head -1)
[ -f "$REAL" ] || die "no libnccl.so.2 in $NCCL_PKG/lib"

# An NCCL_HOME of our own: the wheel ships only libnccl.so.2, the link step wants libnccl.so.
HOME_DIR=$WORK/nccl-home
mkdir -p "$HOME_DIR/lib"
ln -sfn "$NCCL_PKG/include" "$HOME_DIR/include"
ln -sf "$REAL" "$HOME_DIR/lib/libnccl.so.2"
ln -sf "$REAL" "$HOME_DIR/lib/libnccl.so"
BUILD=$WORK/build
{
  echo "real NCCL: $REAL"
  echo "ours: $LIB ($(stat -c %s "$LIB") bytes, $(date -r "$LIB" -u +%FT%TZ))"
  echo "nccl-tests: $SRC; nvcc: $("$CUDA_HOME/bin/nvcc" --version | tail -1)"
  nvidia-smi -L 2>/dev/null
} | tee "$LOGS/setup.txt"

if [ ! -x "$BUILD/all_reduce_perf" ]; then
  echo "=== building nccl-tests into $BUILD"
  make -C "$SRC" -j16 MPI=1 MPI_HOME="$MPI_HOME" NCCL_HOME="$HOME_DIR" CUDA_HOME="$CUDA_HOME" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$BUILD" >"$LOGS/build.log" 2>&1 \
    || { tail -30 "$LOGS/build.log"; die "build failed (log: $LOGS/build.log)"; }
fi

LDP="$HOME_DIR/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mpi() {
  # mpi <which: real|ours> <log> <binary> <args...>
  local which=$1 log=$2; shift 2
  local extra=()
  if [ "$which" = ours ]; then
    local real_lib=$REAL
    [ "${ONLY:-}" = ours ] && real_lib=none
    extra=(-x LD_PRELOAD="$LIB" -x MSCCLPP_NCCL_LIB="$real_lib" -x MSCCLPP_DEBUG="${MSCCLPP_DEBUG:-INFO}")
  fi
  local wrap=()
  if [ -n "${NCCL_TESTS_DEVICE:-}" ]; then
    extra+=(-x NCCL_TESTS_DEVICE)
    if [ "$which" = real ] || [ "${ONLY:-}" != ours ]; then
      # Ranks sharing a GPU as hosts of their own, for the real NCCL (see the top).
      extra+=(-x NCCL_SOCKET_IFNAME=lo -x NCCL_IB_DISABLE=1)
      wrap=(bash -c 'NCCL_HOSTID=nccl-tests-rank-$OMPI_COMM_WORLD_RANK exec "$@"' _)
    fi
  fi
  # Our library only: every other MSCCLPP_* variable of the caller, e.g. the ranks as
  # simulated hosts (MSCCLPP_SIMULATE_HOSTS), calls sent to the real NCCL on purpose
  # (MSCCLPP_NCCL_FALLBACK=all checks forwarding), MSCCLPP_P2P_REMOTE_MAX,
  # MSCCLPP_DEVICE_TIMEOUT, MSCCLPP_PDL.
  if [ "$which" = ours ]; then
    local v
    for v in $(compgen -e | grep '^MSCCLPP_'); do
      case $v in MSCCLPP_NCCL_SO | MSCCLPP_NCCL_LIB | MSCCLPP_DEBUG) ;; *) extra+=(-x "$v") ;; esac
    done
  fi
  echo "--- $which: $* " | tee -a "$LOGS/commands.txt"
  timeout "${RUN_TIMEOUT:-300}" mpirun --allow-run-as-root --bind-to none -np "$NP" \
    -x LD_LIBRARY_PATH="$LDP" -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST \
    -x NVSHMEM_DISABLE_NVLS "${extra[@]}" "${wrap[@]}" "$@" >"$log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || echo "    exit $rc (log: $log)" | tee -a "$LOGS/commands.txt"
  return 0
}

run_both() {
  # run_both <name> <binary> <args...>: the real NCCL, then ours, on the same arguments
  local name=$1 bin=$2; shift 2
  mkdir -p "$LOGS/real" "$LOGS/ours"
  [ "${ONLY:-}" = ours ] || mpi real "$LOGS/real/$name.log" "$BUILD/$bin" "$@"
  mpi ours "$LOGS/ours/$name.log" "$BUILD/$bin" "$@"
}

TESTS=${*:-all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv graph}
for t in $TESTS; do
  case $t in
    all_reduce | reduce_scatter | reduce)
      for d in $TYPES; do
        for o in $OPS; do
          run_both "${t}_${d}_${o}" "${t}_perf" $SIZES $ITERS -c 1 -d "$d" -o "$o"
        done
      done ;;
    all_gather | broadcast | alltoall | sendrecv | gather | scatter | alltoallv | hypercube)
      for d in $TYPES; do
        run_both "${t}_${d}" "${t}_perf" $SIZES $ITERS -c 1 -d "$d"
      done ;;
    graph)
      run_both "all_reduce_graph_float_sum" all_reduce_perf $SIZES $ITERS -c 1 -d float -o sum -G 20 ;;
    graph_all)
      # Every test once under CUDA graphs (float; sum where it reduces).
      for b in all_reduce reduce_scatter reduce; do
        run_both "${b}_graph_float_sum" "${b}_perf" $SIZES $ITERS -c 1 -d float -o sum -G 20
      done
      for b in all_gather broadcast alltoall sendrecv gather scatter alltoallv hypercube; do
        run_both "${b}_graph_float" "${b}_perf" $SIZES $ITERS -c 1 -d float -G 20
      done ;;
    *) die "unknown test $t" ;;
  esac
done

python3 "$ROOT/nccl/scripts/side_by_side.py" "$LOGS/real" "$LOGS/ours" | tee "$LOGS/side_by_side.txt"
exit "${PIPESTATUS[0]}"
