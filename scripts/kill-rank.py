#!/usr/bin/env python3
"""Kill (or stop) one rank of an mscclpp-perf job and time what the others do.

usage: kill-rank.py [--rank R] [--sig KILL|STOP|TERM|none] [--delay S | --after-lines N |
                    --after-re RE] [--device-timeout S] [--quiet] -- PERF-ARGS...

Starts `mscclpp-perf PERF-ARGS` (the binary in $MSCCLPP_PERF, default
target/release/mscclpp-perf; it launches its ranks itself), finds each rank's process by
its MSCCLPP_RANK, and sends rank R the signal S seconds after every rank was started
(--delay), after the N-th table row (--after-lines), or after a line matching RE. Then it
prints every output line with its time relative to the signal, the job's exit status and
how long it took to end after the signal, the job's processes still alive, and the
/dev/shm entries and listening TCP ports the job left behind. A job that runs past 130 s
after the start is left to end by itself (the script still waits for it).

Example, a kill 2 s into a 4-rank all-reduce loop on the Host transport:

    MSCCLPP_PERF=target/release/mscclpp-perf python3 scripts/kill-rank.py --rank 1 \\
        --delay 2 -- --nranks 4 --op allreduce -b 1K -e 1M -f 4 -n 3000 -w 5
"""

import argparse
import os
import re
import signal
import subprocess
import threading
import time

ROW = re.compile(r"^\s+\d+\s+\d+\s+\S+")


def parse_args():
    ap = argparse.ArgumentParser(
        prog="kill-rank.py",
        usage="%(prog)s [--rank R] [--sig KILL|STOP|TERM|none] [--delay S | --after-lines N "
              "| --after-re RE] [--device-timeout S] [--quiet] -- PERF-ARGS...",
        description="Signal one rank of an mscclpp-perf job ($MSCCLPP_PERF) and time how "
                    "the job ends.")
    ap.add_argument("--rank", type=int, default=1, help="the rank to signal (default 1)")
    ap.add_argument("--sig", default="KILL", help="KILL (default), STOP, TERM, or none")
    when = ap.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, help="seconds after every rank was started")
    when.add_argument("--after-lines", type=int, help="after this many table rows")
    when.add_argument("--after-re", help="after a line matching this regular expression")
    ap.add_argument("--device-timeout", help="MSCCLPP_DEVICE_TIMEOUT for the job")
    ap.add_argument("--quiet", action="store_true",
                    help="leave out the table rows printed before the signal")
    ap.add_argument("perf_args", nargs=argparse.REMAINDER, metavar="-- PERF-ARGS")
    a = ap.parse_args()
    a.perf_args = a.perf_args[1:] if a.perf_args[:1] == ["--"] else a.perf_args
    if not a.perf_args:
        ap.error("give the perf tool's arguments after --")
    if a.sig != "none" and not hasattr(signal, "SIG" + a.sig):
        ap.error(f"--sig {a.sig}: no such signal")
    if a.sig != "none" and a.delay is None and a.after_lines is None and a.after_re is None:
        ap.error("say when: --delay, --after-lines or --after-re")
    return a


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def rank_pids(launcher):
    """{rank: pid} of the launcher's child processes that carry MSCCLPP_RANK."""
    kids = set()
    try:
        for tid in os.listdir(f"/proc/{launcher}/task"):
            with open(f"/proc/{launcher}/task/{tid}/children") as f:
                kids.update(f.read().split())
    except OSError:
        pass
    out = {}
    for k in kids:
        try:
            with open(f"/proc/{k}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"MSCCLPP_RANK="):
                out[int(kv.split(b"=", 1)[1])] = int(k)
    return out


def listening(pids):
    """Lines of `ss -ltnpH` that belong to `pids`, or None without `ss`."""
    try:
        ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    except OSError:
        return None
    return [line for line in ss.splitlines() if any(f"pid={p}," in line for p in pids)]


def main():
    a = parse_args()
    perf = os.environ.get("MSCCLPP_PERF", "target/release/mscclpp-perf")
    env = dict(os.environ)
    if a.device_timeout is not None:
        env["MSCCLPP_DEVICE_TIMEOUT"] = a.device_timeout
    nranks = 2
    for i, x in enumerate(a.perf_args[:-1]):
        if x == "--nranks":
            nranks = int(a.perf_args[i + 1])
    shm_before = shm_entries()
    t0 = time.time()
    job = subprocess.Popen([perf] + a.perf_args, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, text=True, errors="replace")
    lines, lock, rows, due = [], threading.Lock(), [0], threading.Event()

    def read(stream, name):
        for line in stream:
            with lock:
                lines.append((time.time(), name, line.rstrip("\n")))
                if ROW.match(line):
                    rows[0] += 1
                if a.after_lines is not None and rows[0] >= a.after_lines:
                    due.set()
                if a.after_re and re.search(a.after_re, line):
                    due.set()

    readers = [threading.Thread(target=read, args=(job.stdout, "out"), daemon=True),
               threading.Thread(target=read, args=(job.stderr, "err"), daemon=True)]
    for t in readers:
        t.start()
    ranks = {}
    while job.poll() is None and len(ranks) < nranks:
        ranks = rank_pids(job.pid)
        time.sleep(0.005)
    started = time.time()
    pids = set(ranks.values()) | {job.pid}
    t_signal = None
    if a.sig != "none":
        if a.delay is not None:
            while job.poll() is None and time.time() < started + a.delay:
                time.sleep(0.002)
        else:
            while job.poll() is None and not due.wait(0.01):
                pass
        if job.poll() is None and a.rank in ranks:
            t_signal = time.time()
            os.kill(ranks[a.rank], getattr(signal, "SIG" + a.sig))
            print(f"## sent SIG{a.sig} to rank {a.rank} pid {ranks[a.rank]} at "
                  f"+{t_signal - t0:.3f}s (rows so far {rows[0]})")
        elif job.poll() is None:
            print(f"## rank {a.rank} not found among {sorted(ranks)}: no signal sent")
        else:
            print("## the job ended before the signal")
    ports = set()
    while job.poll() is None and time.time() - t0 < 130:
        for line in listening(pids) or []:
            ports.add(line.split()[3])
        time.sleep(0.2)
    rc = job.wait()
    t_end = time.time()
    for t in readers:
        t.join(2)
    ref = t_signal or t0
    for t, name, line in lines:
        if a.quiet and name == "out" and not (t_signal and t >= t_signal - 0.001):
            continue
        print(f"{t - ref:+8.3f} {name}: {line}")
    after = f" exit_after_signal={t_end - t_signal:.3f}s" if t_signal else ""
    print(f"## rc={rc} total={t_end - t0:.2f}s{after}")
    time.sleep(0.3)
    alive = [p for p in sorted(pids) if os.path.exists(f"/proc/{p}")]
    print(f"## ranks {sorted(ranks.items())} launcher {job.pid}; alive after: {alive}")
    new = shm_entries() - shm_before
    ours = [s for s in sorted(new) if any(f"-{p}-" in s for p in pids)]
    print(f"## new /dev/shm: {sorted(new)}; from the job's processes: {ours}")
    left = listening(pids)
    if left is None:
        print("## listening ports not checked (no ss)")
    else:
        print(f"## listening ports of the job after: {left}; seen while running: {len(ports)}")


if __name__ == "__main__":
    main()
