#!/usr/bin/env python3
"""Crude stacks of a process's sleeping threads, for machines without gdb: reads each
thread's stack pointer from /proc/PID/task/TID/syscall, scans the words above it (the
stack grows down) for addresses inside executable file mappings, and names them with
addr2line (which needs the binary's symbols: do not strip it). A scan finds return
addresses and also stale ones left by earlier calls, so read it from the top as a guess,
not a proof. Usage: stackscan.py PID [BYTES]"""
import os, subprocess, sys

pid = int(sys.argv[1]); nbytes = int(sys.argv[2]) if len(sys.argv) > 2 else 65536
maps = []
for line in open(f"/proc/{pid}/maps"):
    f = line.split()
    if len(f) >= 6 and "x" in f[1] and f[5].startswith("/"):
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        maps.append((lo, hi, int(f[2], 16), f[5]))
loads = {}
def vaddr(path, off):
    if path not in loads:
        segs = []
        try:
            out = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True).stdout
            for l in out.splitlines():
                p = l.split()
                if p and p[0] == "LOAD":
                    segs.append((int(p[1], 16), int(p[2], 16), int(p[4], 16)))
        except OSError:
            pass
        loads[path] = segs
    for o, v, sz in loads[path]:
        if o <= off < o + sz:
            return v + off - o
    return off
mem = open(f"/proc/{pid}/mem", "rb", 0)
for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
    comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
    sc = open(f"/proc/{pid}/task/{tid}/syscall").read().split()
    print(f"== thread {tid} {comm}: syscall {' '.join(sc[:1])}")
    if len(sc) < 3:
        continue
    sp = int(sc[-2], 16)
    hits = []
    try:
        mem.seek(sp); data = mem.read(nbytes)
    except OSError as e:
        print(f"   cannot read the stack: {e}"); continue
    for i in range(0, len(data) - 7, 8):
        a = int.from_bytes(data[i:i + 8], "little")
        for lo, hi, off, path in maps:
            if lo <= a < hi:
                hits.append((path, vaddr(path, a - lo + off)))
                break
    byfile = {}
    for path, v in hits:
        byfile.setdefault(path, []).append(v)
    names = {}
    for path, vs in byfile.items():
        try:
            out = subprocess.run(["addr2line", "-f", "-C", "-e", path] + [hex(v) for v in vs],
                                 capture_output=True, text=True, timeout=60).stdout.splitlines()
            for j, v in enumerate(vs):
                names[(path, v)] = out[2 * j] if 2 * j < len(out) else "?"
        except (OSError, subprocess.SubprocessError):
            pass
    seen = 0
    for path, v in hits:
        n = names.get((path, v), "??")
        if n in ("??", "?"):
            n = ""
        print(f"   {os.path.basename(path)}+{v:#x} {n[:160]}")
        seen += 1
        if seen >= 60:
            break
