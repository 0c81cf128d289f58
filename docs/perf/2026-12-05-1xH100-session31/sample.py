#!/usr/bin/env python3
"""Samples a process's threads without stopping it: every INTERVAL seconds for DURATION
seconds, one line per thread whose state, CPU ticks or system call changed since the last
sample: wall time, thread name, state (R running, S sleeping, T stopped), CPU ticks
(user+system) and the system call it is in (/proc/TID/syscall: its number, or 'running').
Usage: sample.py PID DURATION INTERVAL"""
import os, sys, time

pid, dur, step = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
last = {}
end = time.time() + dur
while time.time() < end:
    now = time.time()
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        print(f"{now:.3f} process {pid} gone", flush=True)
        break
    for tid in tids:
        try:
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            st = open(f"/proc/{pid}/task/{tid}/stat").read()
            f = st[st.rindex(")") + 2:].split()
            state, ticks = f[0], int(f[11]) + int(f[12])
            sc = open(f"/proc/{pid}/task/{tid}/syscall").read().split()
            call = sc[0] if sc else "?"
        except OSError:
            continue
        key = (state, call)
        prev = last.get(tid)
        if prev is None or prev[0] != key or ticks - prev[1] > 0:
            print(f"{now:.3f} {tid} {comm} {state} ticks={ticks} syscall={call}", flush=True)
        last[tid] = (key, ticks)
    time.sleep(step)
