#!/usr/bin/env python3
"""Kill harness: h.py [--rank R] [--sig KILL|STOP|none] [--after-lines N | --delay S] [--dt S] -- perf args"""
import argparse, os, re, signal, subprocess, sys, threading, time

P = os.environ.get("MSCCLPP_PERF", "target/release/mscclpp-perf")
ap = argparse.ArgumentParser()
ap.add_argument("--rank", type=int, default=1)
ap.add_argument("--sig", default="KILL")
ap.add_argument("--delay", type=float, default=None, help="seconds after all ranks spawned")
ap.add_argument("--after-lines", type=int, default=None, help="kill after N data rows printed")
ap.add_argument("--after-re", default=None, help="kill after a line matching")
ap.add_argument("--dt", default=None, help="MSCCLPP_DEVICE_TIMEOUT")
ap.add_argument("--quiet", action="store_true")
ap.add_argument("rest", nargs=argparse.REMAINDER)
a = ap.parse_args()
args = a.rest[1:] if a.rest and a.rest[0] == "--" else a.rest

def shm():
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()

env = dict(os.environ)
if a.dt is not None:
    env["MSCCLPP_DEVICE_TIMEOUT"] = a.dt
shm0 = shm()
t0 = time.time()
proc = subprocess.Popen([P] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, errors="replace")
lines = []
lock = threading.Lock()
rows = [0]
ev = threading.Event()
row_re = re.compile(r"^\s+\d+\s+\d+\s+\S+")

def rd(f, name):
    for ln in f:
        t = time.time()
        with lock:
            lines.append((t, name, ln.rstrip("\n")))
            if row_re.match(ln):
                rows[0] += 1
            if a.after_lines is not None and rows[0] >= a.after_lines:
                ev.set()
            if a.after_re and re.search(a.after_re, ln):
                ev.set()

ths = [threading.Thread(target=rd, args=(proc.stdout, "out"), daemon=True),
       threading.Thread(target=rd, args=(proc.stderr, "err"), daemon=True)]
for t in ths: t.start()

def children():
    out = {}
    try:
        kids = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
    except Exception:
        kids = []
    # all tasks' children
    try:
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            kids += open(f"/proc/{proc.pid}/task/{tid}/children").read().split()
    except Exception:
        pass
    for k in set(kids):
        try:
            e = open(f"/proc/{k}/environ", "rb").read().split(b"\0")
            for kv in e:
                if kv.startswith(b"MSCCLPP_RANK="):
                    out[int(kv.split(b"=")[1])] = int(k)
        except Exception:
            pass
    return out

nr = None
for i, x in enumerate(args):
    if x == "--nranks": nr = int(args[i + 1])
kids = {}
while proc.poll() is None and len(kids) < (nr or 2):
    kids = children(); time.sleep(0.005)
tspawn = time.time()
allpids = set(kids.values()) | {proc.pid}
tkill = None
if a.sig != "none":
    if a.delay is not None:
        while proc.poll() is None and time.time() < tspawn + a.delay:
            time.sleep(0.002)
    else:
        while proc.poll() is None and not ev.wait(0.01):
            pass
    if proc.poll() is None:
        pid = kids.get(a.rank)
        tkill = time.time()
        try:
            os.kill(pid, getattr(signal, "SIG" + a.sig))
            print(f"## sent SIG{a.sig} to rank {a.rank} pid {pid} at +{tkill - t0:.3f}s (rows so far {rows[0]})")
        except Exception as e:
            print(f"## kill failed: {e}")
    else:
        print("## job ended before kill")
# monitor ports while running
ports = set()
while proc.poll() is None:
    try:
        ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    except Exception:
        ss = ""
    for l in ss.splitlines():
        for p in allpids:
            if f"pid={p}," in l:
                ports.add((p, l.split()[3]))
    if time.time() - t0 > 130:
        break
    time.sleep(0.2)
rc = proc.wait()
tend = time.time()
for t in ths: t.join(2)
ref = tkill or t0
for t, n, l in lines:
    if a.quiet and not (tkill and t >= tkill - 0.001) and n == "out":
        continue
    print(f"{t - ref:+8.3f} {n}: {l}")
print(f"## rc={rc} total={tend - t0:.2f}s" + (f" exit_after_kill={tend - tkill:.3f}s" if tkill else ""))
time.sleep(0.3)
leftover = []
for p in allpids:
    if os.path.exists(f"/proc/{p}"):
        try:
            st = open(f"/proc/{p}/stat").read().split()[2]
        except Exception:
            st = "?"
        leftover.append((p, st))
print(f"## pids {sorted(kids.items())} launcher {proc.pid}; alive after: {leftover}")
new = shm() - shm0
mine = [s for s in new if any(f"-{p}-" in s for p in allpids)]
print(f"## new /dev/shm: {sorted(new)}; from our pids: {mine}")
try:
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    lp = [l for l in ss.splitlines() if any(f"pid={p}," in l for p in allpids)]
    print(f"## listening ports by our pids after: {lp}; seen while running: {len(ports)}")
except OSError as e:
    print(f"## listening ports not checked: {e}")
