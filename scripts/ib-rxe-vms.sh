#!/usr/bin/env bash
# The IB transport on a real verbs stack: Soft-RoCE (rdma_rxe) between two QEMU guests.
#
#   scripts/ib-rxe-vms.sh            # as root: installs what it needs, builds, boots, runs
#
# This machine's kernel has no RDMA, so two `qemu-system-x86_64 -accel tcg` guests boot
# Debian bookworm's kernel (the one the host's distribution ships: the host's binaries and
# libraries run unchanged in them) from a busybox initramfs holding the rxe modules,
# libibverbs with the rxe provider, the perftest/ibverbs tools and our `ib_rank` example
# (built here with `--features ib`). Their e1000 NICs are joined by a `-netdev socket` on
# 127.0.0.1; each guest runs `rdma link add rxe0 type rxe netdev eth0`, finds its IPv4
# RoCE v2 GID, then runs the steps below against the other guest: guest 0 is rank 0 (and
# the bootstrap root, 10.0.0.1), guest 1 rank 1 (10.0.0.2).
#
#   verbs-info      ibv_devinfo sees rxe0 with an active port
#   rc-pingpong     ibv_rc_pingpong between the guests (the stack itself works)
#   ib-loopback     guest 0 only: tests/ib_loopback.rs (two processes over the one rxe0,
#                   MSCCLPP_REQUIRE_IB=1), unless IB_RXE_LOOPBACK=0
#   <phase>         ib_rank <phase> on both guests: raw verbs (writes, inline flag, the
#                   limits and error completions of the real provider), Communicator
#                   connections over TransportKind::Ib with DevConn put/signal/wait/flush,
#                   the Host-backend collectives over IB, and a send to and a receive from
#                   a peer that left
#
# Every wait is bounded (qemu, each guest command); the work directory (mktemp) and the
# guests are removed on exit, also on failure. Prints one PASS/FAIL line per step and
# guest, then a summary; exits non-zero when anything failed. Emulation is slow: this is a
# correctness run (ibv_rc_pingpong: 45-65 ms per 4 KiB round trip between the guests).
#
# Settings (environment):
#   IB_RXE_PHASES     the ib_rank phases to run (default "verbs conn collectives
#                     peer-gone-send peer-gone-recv"; see examples/ib_rank.rs)
#   IB_RXE_BIN        an already built ib_rank binary (skips the cargo builds; no ib-loopback)
#   IB_RXE_LOOPBACK=0 leaves out the ib-loopback step (and its build)
#   IB_RXE_TIMEOUT    seconds each guest may run in all (default 1500)
#   IB_RXE_MEM        guest memory in MiB (default 1024)
#   IB_RXE_KEEP=1     keep the work directory (guest logs) and print where it is
#   IB_RXE_RECORD=F   append the result as a JSON line to F (benches/records/checks/ib-rxe-vms.jsonl)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PHASES=${IB_RXE_PHASES-"verbs conn collectives peer-gone-send peer-gone-recv"}
TIMEOUT=${IB_RXE_TIMEOUT:-1500}
MEM=${IB_RXE_MEM:-1024}
START=$(date +%s)

say() { printf '[ib-rxe-vms %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { say "FAIL: $*"; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ib-rxe-vms.XXXXXX")
PIDS=()
cleanup() {
    local rc=$?
    # The guests (their pid files: `timeout` does not pass a KILL on), then their timeouts.
    for f in "$WORK"/qemu*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "${IB_RXE_KEEP:-0}" = 1 ]; then
        say "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. what the host needs -------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "run as root (apt-get install, and the initramfs keeps root-owned files)"
NEED=(qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils perftest
      libibverbs-dev iproute2 cmake clang cpio)
MISSING=()
for p in "${NEED[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || MISSING+=("$p")
done
if [ ${#MISSING[@]} -gt 0 ]; then
    say "installing ${MISSING[*]}"
    timeout 600 apt-get install -y -q --no-install-recommends "${MISSING[@]}" >"$WORK/apt.log" 2>&1 \
        || { timeout 300 apt-get update -q >>"$WORK/apt.log" 2>&1 \
             && timeout 600 apt-get install -y -q --no-install-recommends "${MISSING[@]}" >>"$WORK/apt.log" 2>&1; } \
        || { tail -20 "$WORK/apt.log" >&2; die "apt-get install ${MISSING[*]}"; }
fi

# --- 2. our binary ------------------------------------------------------------------------
if [ -n "${IB_RXE_BIN:-}" ]; then
    BIN=$IB_RXE_BIN
else
    say "building examples/ib_rank.rs (--features ib)"
    TARGET=${CARGO_TARGET_DIR:-$REPO/target}
    (cd "$REPO" && timeout 1800 nice -n 10 cargo build -q --features ib --example ib_rank) \
        || die "cargo build --features ib --example ib_rank"
    BIN=$TARGET/debug/examples/ib_rank
    if [ "${IB_RXE_LOOPBACK:-1}" != 0 ]; then
        say "building tests/ib_loopback.rs (--features ib)"
        (cd "$REPO" && timeout 1800 nice -n 10 cargo test --features ib --test ib_loopback \
            --no-run) >"$WORK/loopback-build.log" 2>&1 \
            || { tail -30 "$WORK/loopback-build.log" >&2; die "cargo test --features ib --test ib_loopback --no-run"; }
        LOOPBACK=$(sed -n 's/.*Executable .*(\(.*\))$/\1/p' "$WORK/loopback-build.log" | tail -1)
        [ -n "$LOOPBACK" ] || die "no test binary named in $WORK/loopback-build.log"
        case $LOOPBACK in /*) ;; *) LOOPBACK=$REPO/$LOOPBACK ;; esac
    fi
fi
[ -x "$BIN" ] || die "no binary at $BIN"

# --- 3. the guests' kernel and initramfs --------------------------------------------------
say "fetching the guest kernel"
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-6/ {print $2; exit}')
[ -n "$KPKG" ] || die "apt-cache finds no linux-image-6.* behind linux-image-amd64 (apt-get update?)"
(cd "$WORK" && timeout 300 apt-get download -q "$KPKG" >/dev/null 2>&1) \
    || die "apt-get download $KPKG"
dpkg-deb -x "$WORK"/"$KPKG"_*.deb "$WORK/kernel"
KVER=${KPKG#linux-image-}
VMLINUZ=$WORK/kernel/boot/vmlinuz-$KVER
[ -f "$VMLINUZ" ] || die "no $VMLINUZ in $KPKG"

ROOT=$WORK/root
mkdir -p "$ROOT"/{bin,sbin,proc,sys,dev,tmp,etc,lib/modules,usr/bin,run}
cp /bin/busybox "$ROOT/bin/busybox"
for m in crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe e1000; do
    f=$(find "$WORK/kernel/lib/modules/$KVER" -name "$m.ko*" | head -1)
    [ -n "$f" ] || die "module $m not in $KPKG"
    case $f in
        *.ko.xz) xz -dc "$f" >"$ROOT/lib/modules/$m.ko" ;;
        *.ko.zst) zstd -qdc "$f" >"$ROOT/lib/modules/$m.ko" ;;
        *) cp "$f" "$ROOT/lib/modules/$m.ko" ;;
    esac
done

# A file and, for an ELF object, every shared library it loads, at the same paths.
copy_with_libs() {
    local f lib
    for f in "$@"; do
        [ -e "$f" ] || die "missing $f on the host"
        mkdir -p "$ROOT$(dirname "$f")"
        cp -L "$f" "$ROOT$f"
        ldd "$f" 2>/dev/null | awk '/=> \// {print $3} /^[[:space:]]*\// {print $1}' |
            while read -r lib; do
                [ -e "$ROOT$lib" ] && continue
                mkdir -p "$ROOT$(dirname "$lib")"
                cp -L "$lib" "$ROOT$lib"
            done
    done
}
PROVIDER=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null | head -1)
[ -n "$PROVIDER" ] || die "no rxe provider (ibverbs-providers) on the host"
LIBIBVERBS=$(readlink -f /usr/lib/x86_64-linux-gnu/libibverbs.so.1)
copy_with_libs /usr/bin/rdma /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong "$PROVIDER" \
    "$LIBIBVERBS" /usr/lib/x86_64-linux-gnu/libibverbs.so.1
mkdir -p "$ROOT/etc/libibverbs.d"
cp /etc/libibverbs.d/rxe.driver "$ROOT/etc/libibverbs.d/"
# Our binary, without its debug sections (a third of the size to unpack in the guest).
objcopy --strip-debug "$BIN" "$WORK/ib_rank"
copy_with_libs "$WORK/ib_rank"
mv "$ROOT$WORK/ib_rank" "$ROOT/bin/ib_rank"
if [ -n "${LOOPBACK:-}" ]; then
    objcopy --strip-debug "$LOOPBACK" "$WORK/ib_loopback"
    copy_with_libs "$WORK/ib_loopback"
    mv "$ROOT$WORK/ib_loopback" "$ROOT/bin/ib_loopback"
fi
ldconfig -r "$ROOT" 2>/dev/null || true

cat >"$ROOT/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
R=$(sed -n 's/.*rxe_rank=\([0-9]\).*/\1/p' /proc/cmdline)
PHASES=$(sed -n 's/.*rxe_phases=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' ')
STEP_TIMEOUT=$(sed -n 's/.*rxe_step_timeout=\([0-9]*\).*/\1/p' /proc/cmdline)
ME=10.0.0.$((R + 1)); PEER=10.0.0.$((2 - R))
result() { echo "RXE-RESULT guest$R $1 $2"; }
finish() { echo "RXE-DONE guest$R"; sync; poweroff -f; }
step() { # name, command...: runs it bounded, prints its result
    n=$1; shift
    echo "RXE-STEP guest$R $n: $*"
    if timeout -s KILL "$STEP_TIMEOUT" "$@"; then result "$n" PASS; else result "$n" "FAIL(rc=$?)"; fi
}
for m in crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe e1000; do
    insmod /lib/modules/$m.ko || { result "insmod-$m" FAIL; finish; }
done
ip link set lo up
ip link set eth0 up
ip addr add $ME/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || { result rdma-link-add FAIL; finish; }
# The IPv4-mapped RoCE v2 GID (rxe lists it once eth0 has the address).
GID=
for i in 0 1 2 3 4 5 6 7 8 9; do
    for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
        n=${g##*/}
        t=$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n 2>/dev/null)
        case "$(cat $g):$t" in 0000:0000:0000:0000:0000:ffff:*:*"RoCE v2") GID=$n; break;; esac
    done
    [ -n "$GID" ] && break
    sleep 1
done
[ -n "$GID" ] || { result roce-v2-gid FAIL; ls /sys/class/infiniband/rxe0/ports/1/gid_attrs/types; finish; }
echo "RXE-INFO guest$R gid_index=$GID gid=$(cat /sys/class/infiniband/rxe0/ports/1/gids/$GID)"
export MSCCLPP_IB_GID_INDEX=$GID MSCCLPP_IB_DEVICE=rxe0
# Emulated guests on a loaded host stall for seconds: the bootstrap's 3 s link timeout
# took such a stall for a lost network.
export MSCCLPP_LINK_TIMEOUT=30
# The peer must answer before anything runs (both guests boot at their own pace).
ok=
for i in $(seq 1 120); do ping -c 1 -W 1 $PEER >/dev/null 2>&1 && { ok=1; break; }; done
[ -n "$ok" ] || { result ping-peer FAIL; finish; }
result ping-peer PASS
step verbs-info sh -c 'ibv_devinfo -v -d rxe0 | tee /tmp/devinfo | grep -q PORT_ACTIVE'
grep -E "max_qp_wr|max_sge|max_inline|max_mr_size|page_size_cap|max_qp_rd_atom|active_mtu|link_layer" /tmp/devinfo | sed "s/^/RXE-DEVINFO guest$R /"
if [ "$R" = 0 ]; then
    step rc-pingpong ibv_rc_pingpong -d rxe0 -g $GID -n 20 -s 4096 -p 18515
else
    sleep 3
    step rc-pingpong ibv_rc_pingpong -d rxe0 -g $GID -n 20 -s 4096 -p 18515 10.0.0.1
fi
port=29500
for p in $PHASES; do
    port=$((port + 1))
    # Each phase is a fresh job: its own root port; the peer's root may start late.
    MSCCLPP_RANK=$R MSCCLPP_NRANKS=2 MSCCLPP_BOOTSTRAP=10.0.0.1:$port \
    MSCCLPP_BOOTSTRAP_TIMEOUT=240 MSCCLPP_JOB_ID=ib-rxe-$p \
    MSCCLPP_HOST_ID=guest$R step "$p" /bin/ib_rank "$p"
done
if [ "$R" = 0 ] && [ -x /bin/ib_loopback ]; then
    MSCCLPP_REQUIRE_IB=1 step ib-loopback /bin/ib_loopback --exact \
        ib_ping_pong_between_two_processes --nocapture --test-threads=1
fi
finish
EOF
chmod +x "$ROOT/init"
(cd "$ROOT" && find . | cpio -o -H newc --quiet | gzip -1 >"$WORK/initrd.gz")
say "initramfs: $(du -h "$WORK/initrd.gz" | cut -f1) (kernel $KVER)"

# --- 4. boot the two guests ---------------------------------------------------------------
NETPORT=$((20000 + $$ % 20000))
STEP_TIMEOUT=$(( TIMEOUT / 3 ))
boot() { # rank, -netdev socket option
    local r=$1 net=$2
    timeout -s KILL "$TIMEOUT" nice -n 10 qemu-system-x86_64 -accel tcg -m "$MEM" -smp 1 \
        -nodefaults -display none -no-reboot -pidfile "$WORK/qemu$r.pid" \
        -kernel "$VMLINUZ" -initrd "$WORK/initrd.gz" \
        -append "console=ttyS0 panic=-1 quiet loglevel=4 rxe_rank=$r rxe_phases=${PHASES// /,} rxe_step_timeout=$STEP_TIMEOUT" \
        -serial "file:$WORK/guest$r.log" \
        -netdev "socket,id=n0,$net" -device "e1000,netdev=n0,mac=52:54:00:12:34:0$((r + 1))" \
        >"$WORK/qemu$r.out" 2>&1 &
    PIDS+=($!)
}
say "booting guest0 (listens on 127.0.0.1:$NETPORT) and guest1"
boot 0 "listen=127.0.0.1:$NETPORT"
sleep 2
boot 1 "connect=127.0.0.1:$NETPORT"
# Progress while waiting: each guest's step lines as they come.
shown0=0 shown1=0
while kill -0 "${PIDS[0]}" 2>/dev/null || kill -0 "${PIDS[1]}" 2>/dev/null; do
    sleep 5
    for r in 0 1; do
        eval "shown=\$shown$r"
        n=$(grep -c "^RXE-" "$WORK/guest$r.log" 2>/dev/null || true)
        if [ "${n:-0}" -gt "$shown" ]; then
            grep "^RXE-" "$WORK/guest$r.log" | tr -d '\r' | sed -n "$((shown + 1)),${n}p" >&2
            eval "shown$r=$n"
        fi
    done
done
wait "${PIDS[0]}" || true
wait "${PIDS[1]}" || true
# The serial console ends lines with CR LF.
for r in 0 1; do
    [ -f "$WORK/guest$r.log" ] && tr -d '\r' <"$WORK/guest$r.log" >"$WORK/guest$r.txt" && mv "$WORK/guest$r.txt" "$WORK/guest$r.log"
done
ELAPSED=$(( $(date +%s) - START ))

# --- 5. summary ---------------------------------------------------------------------------
status=0
echo "== ib-rxe-vms: results (${ELAPSED} s in all) =="
for r in 0 1; do
    log=$WORK/guest$r.log
    if ! grep -q "^RXE-DONE guest$r" "$log" 2>/dev/null; then
        echo "guest$r: FAIL: did not finish within ${TIMEOUT} s; its console ends with:"
        tail -30 "$log" 2>/dev/null | sed 's/^/    /'
        cat "$WORK/qemu$r.out" 2>/dev/null | sed 's/^/    qemu: /'
        status=1
    fi
    grep "^RXE-RESULT" "$log" 2>/dev/null | sed 's/^RXE-RESULT //'
    if grep "^RXE-RESULT" "$log" 2>/dev/null | grep -qv " PASS$"; then
        status=1
        echo "--- guest$r console, failed steps ---"
        grep -v "^RXE-DEVINFO" "$log" | tail -60 | sed 's/^/    /'
    fi
done
for step in ping-peer verbs-info rc-pingpong $PHASES ${LOOPBACK:+ib-loopback}; do
    for r in 0 1; do
        [ "$step" = ib-loopback ] && [ $r = 1 ] && continue
        grep -q "^RXE-RESULT guest$r $step PASS" "$WORK/guest$r.log" 2>/dev/null \
            || { [ $status = 1 ] || echo "guest$r $step: no result"; status=1; }
    done
done
grep -h "^RXE-DEVINFO guest0\|^RXE-INFO\|^RXE-FACT" "$WORK"/guest*.log 2>/dev/null | sort -u | sed 's/^/  /'
if [ -n "${IB_RXE_RECORD:-}" ]; then
    passed=$(grep -h "^RXE-RESULT" "$WORK"/guest*.log | awk '$4 == "PASS" {print $2 ":" $3}' | paste -sd' ')
    failed=$(grep -h "^RXE-RESULT" "$WORK"/guest*.log | awk '$4 != "PASS" {print $2 ":" $3}' | paste -sd' ')
    grep -h "^RXE-FACT" "$WORK"/guest*.log | sed 's/^RXE-FACT //' | sort -u >"$WORK/facts"
    python3 - "$IB_RXE_RECORD" "$ELAPSED" "$status" "$passed" "$failed" "$KPKG" "$PHASES" "$WORK/facts" <<'PY'
import json, subprocess, sys, datetime, os
f, secs, status, passed, failed, kpkg, phases, facts = sys.argv[1:]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
row = {
    "test": "ib-rxe-vms",
    "command": f"IB_RXE_PHASES='{phases}' scripts/ib-rxe-vms.sh",
    "commit": commit,
    "machine": f"{os.cpu_count()}-core x86_64 VM, no KVM: two qemu -accel tcg guests, {kpkg}, rdma_rxe over e1000 + -netdev socket",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "seconds": int(secs),
    "result": "pass" if status == "0" else "fail",
    "passed": passed.split(),
    "failed": failed.split(),
    "facts": open(facts).read().splitlines(),
}
with open(f, "a") as out:
    out.write(json.dumps(row) + "\n")
PY
    say "recorded in $IB_RXE_RECORD"
fi
if [ $status = 0 ]; then
    echo "ib-rxe-vms: PASS (${ELAPSED} s)"
else
    echo "ib-rxe-vms: FAIL (${ELAPSED} s)"
fi
exit $status
