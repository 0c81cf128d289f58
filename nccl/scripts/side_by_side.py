#!/usr/bin/env python3
"""Side by side: nccl-tests logs of the real NCCL and of libmscclpp_nccl.so.

    side_by_side.py REAL_DIR OURS_DIR

Both folders hold one log per run (same file names). For every run and row (size, type,
operation) it prints the out-of-place and in-place times of both and the ratio ours/real,
the #wrong counts, and, per run, errors (NCCL failures, exits, missing rows). Under
MSCCLPP_DEBUG=INFO our logs also say which path served each kind of call: the table shows
it per run. Exit status 1 when any #wrong is non-zero, a run failed, or rows are missing.
Our library's WARN lines count as errors, except those matching the regular expression in
EXPECT_WARN (a run that sets up a warned-about case on purpose); those are listed, once.
"""

import os
import re
import sys

ERROR_PATTERNS = [
    re.compile(p)
    for p in (
        r"NCCL failure",
        r"NCCL error",
        r"Test failure",
        r"CUDA failure",
        r"\bFAILED\b",
        r"Segmentation fault",
        r"Aborted",
        r"mpirun noticed",
        r"exited on signal",
        r"] WARN ",
    )
]
EXPECTED_WARN = re.compile(os.environ["EXPECT_WARN"]) if os.environ.get("EXPECT_WARN") else None
PATH_RE = re.compile(r"INFO rank \d+/\d+: (\S+) (\S+) (\S+) -> (native|fallback|pass-through)")


def parse(path):
    """Rows {(size, type, redop): (t_oop, wrong_oop, t_ip, wrong_ip)}, errors, paths, and
    the expected warnings seen."""
    rows, errors, paths = {}, [], set()
    expected = set()
    if not os.path.exists(path):
        return rows, ["missing log"], paths, expected
    with open(path, errors="replace") as f:
        for line in f:
            m = PATH_RE.search(line)
            if m:
                paths.add(f"{m.group(1)} {m.group(2)} {m.group(3)}: {m.group(4)}")
            if EXPECTED_WARN and "] WARN " in line and EXPECTED_WARN.search(line):
                expected.add(line.split("] WARN ", 1)[1].strip()[:200])
                continue
            if any(p.search(line) for p in ERROR_PATTERNS):
                errors.append(line.strip()[:200])
                continue
            if line.startswith("#"):
                continue
            tok = line.split()
            # size count type [redop] root, then time algbw busbw #wrong twice (hypercube
            # prints no redop at all).
            if len(tok) < 12 or not tok[0].isdigit():
                continue
            try:
                size = int(tok[0])
                t_oop, wrong_oop = float(tok[-8]), tok[-5]
                t_ip, wrong_ip = float(tok[-4]), tok[-1]
            except ValueError:
                continue
            redop = tok[3] if len(tok) >= 13 else "none"
            rows[(size, tok[2], redop)] = (t_oop, wrong_oop, t_ip, wrong_ip)
    return rows, errors, paths, expected


def wrong_count(w):
    try:
        return int(w)
    except ValueError:
        return 0 if w in ("N/A",) else 1


def human(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n}{unit}" if unit == "B" else f"{n:g}{unit}"
        n /= 1024
    return str(n)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    real_dir, ours_dir = sys.argv[1], sys.argv[2]
    names = sorted(
        set(os.listdir(real_dir) if os.path.isdir(real_dir) else [])
        | set(os.listdir(ours_dir) if os.path.isdir(ours_dir) else [])
    )
    bad = 0
    total_wrong = {"real": 0, "ours": 0}
    summary = []
    for name in names:
        if not name.endswith(".log"):
            continue
        real, real_err, _, _ = parse(os.path.join(real_dir, name))
        if not os.path.isdir(real_dir) or not os.listdir(real_dir):
            real_err = []  # the real NCCL did not run (ONLY=ours): nothing is missing
        ours, ours_err, paths, expected = parse(os.path.join(ours_dir, name))
        print(f"\n== {name[:-4]}")
        if paths:
            print("   paths: " + "; ".join(sorted(paths)))
        for w in sorted({w.split(": ", 1)[-1] for w in expected}):
            print(f"   expected warning (EXPECT_WARN): ...: {w}")
        print(
            f"   {'size':>8} {'type':>9} {'op':>5} | {'real us':>9} {'ours us':>9} {'ratio':>6}"
            f" | {'real ip':>9} {'ours ip':>9} {'ratio':>6} | wrong real/ours"
        )
        keys = sorted(set(real) | set(ours))
        run_wrong = 0
        for k in keys:
            r, o = real.get(k), ours.get(k)
            def cell(x, i):
                return f"{x[i]:9.2f}" if x else f"{'-':>9}"
            def ratio(i):
                if r and o and r[i] > 0:
                    return f"{o[i] / r[i]:6.2f}"
                return f"{'-':>6}"
            wr = (wrong_count(r[1]) + wrong_count(r[3])) if r else 0
            wo = (wrong_count(o[1]) + wrong_count(o[3])) if o else 0
            total_wrong["real"] += wr
            total_wrong["ours"] += wo
            run_wrong += wo
            print(
                f"   {human(k[0]):>8} {k[1]:>9} {k[2]:>5} | {cell(r, 0)} {cell(o, 0)} {ratio(0)}"
                f" | {cell(r, 2)} {cell(o, 2)} {ratio(2)} | {wr}/{wo}"
            )
        missing = [k for k in real if k not in ours]
        for label, errs in (("real", real_err), ("ours", ours_err)):
            for e in errs[:5]:
                print(f"   ERROR ({label}): {e}")
        if missing:
            print(f"   ERROR: {len(missing)} row(s) of the real run missing from ours")
        if not ours:
            print("   ERROR: no result rows in our log")
        failed = bool(ours_err) or bool(missing) or not ours or run_wrong > 0
        bad += failed
        summary.append(f"{'FAIL' if failed else 'ok  '} {name[:-4]}")
    print("\n== summary")
    for s in summary:
        print("   " + s)
    print(
        f"   runs: {len(summary)}, failed: {bad}, #wrong real: {total_wrong['real']}, "
        f"#wrong ours: {total_wrong['ours']}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
