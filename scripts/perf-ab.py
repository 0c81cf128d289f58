#!/usr/bin/env python3
"""Ratio table of two builds measured in one run, round by round.

usage: perf-ab.py PREFIX DIR A B [--record FILE [--commit C] [--command CMD]]

reads DIR/PREFIX-A-<round>.json and DIR/PREFIX-B-<round>.json (mscclpp-perf --json; the
builds alternate within each round) and prints, per size, each build's mean time (out of
place and in place together), the mean of the per-round ratios B/A and their spread
(min-max over the rounds). With --record, appends build B's mean out-of-place times (the
baseline's measure: out of place and in place differ by up to 1.26x at 8-16 MB on an H100)
to FILE as rows of the baseline schema (benches/records/README.md), with the ratio to A and
its spread in each row's note: e.g. `--record benches/records/nvidia-h100-x1.jsonl --commit
<B's commit>`.
"""

import argparse
import glob
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in scripts/
import baseline_rows  # noqa: E402


def times(path):
    """{bytes: [out-of-place us, in-place us]} of one mscclpp-perf --json file."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {
        r["bytes"]: [r["mscclpp"]["out_of_place"]["time_us"], r["mscclpp"]["in_place"]["time_us"]]
        for r in rows
    }


def round_files(d, prefix, build):
    """{round: path} of one build's files."""
    out = {}
    name = re.compile(re.escape(f"{prefix}-{build}-") + r"(\d+)\.json")
    for p in glob.glob(os.path.join(d, f"{prefix}-{build}-*.json")):
        # Exactly PREFIX-BUILD-<round>.json: build `head` is not `head-nopdl`.
        m = name.fullmatch(os.path.basename(p))
        if m:
            out[int(m.group(1))] = p
    return out


def main():
    ap = argparse.ArgumentParser(
        prog="perf-ab.py",
        usage="%(prog)s PREFIX DIR A B [--record FILE [--commit C] [--command CMD]]",
        description="Per-size ratio B/A of two builds' mscclpp-perf --json files "
                    "DIR/PREFIX-{A,B}-<round>.json, the builds alternating within each round.")
    ap.add_argument("prefix")
    ap.add_argument("dir")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--record", metavar="FILE",
                    help="append build B's mean times to this baseline file "
                         "(benches/records/KIND.jsonl)")
    ap.add_argument("--commit", help="with --record: build B's commit (default: HEAD)")
    ap.add_argument("--command", help="with --record: the command that ran (default: the "
                                      "reports' command line)")
    args = ap.parse_args()
    fa = round_files(args.dir, args.prefix, args.a)
    fb = round_files(args.dir, args.prefix, args.b)
    both = sorted(set(fa) & set(fb))
    if not both:
        raise SystemExit(f"no round has both {args.a} and {args.b} under {args.dir}")
    ra = {k: times(fa[k]) for k in both}
    rb = {k: times(fb[k]) for k in both}
    sizes = sorted(set.intersection(*(set(ra[k]) & set(rb[k]) for k in both)))
    print(f"{args.prefix}: {len(both)} rounds")
    print(f"{'bytes':>10} {args.a + ' us':>12} {args.b + ' us':>12} {'B/A':>7} {'min-max':>13}")
    logs = []
    means = {}
    for s in sizes:
        a = [sum(ra[k][s]) / 2 for k in both]
        b = [sum(rb[k][s]) / 2 for k in both]
        ratio = [y / x for x, y in zip(a, b)]
        mean = sum(ratio) / len(ratio)
        logs.append(math.log(mean))
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        print(f"{s:>10} {ma:>12.2f} {mb:>12.2f} {mean:>7.3f} {min(ratio):>6.3f}-{max(ratio):.3f}")
        out_of_place = sum(rb[k][s][0] for k in both) / len(both)
        means[s] = (out_of_place, mean, min(ratio), max(ratio))
    print("geomean B/A", round(math.exp(sum(logs) / len(logs)), 3))
    if args.record:
        record(args, fb[both[0]], len(both), means)


def record(args, template, nrounds, means):
    """Appends build B's mean out-of-place time per size to args.record, shaped by one of
    B's reports."""
    commit = args.commit or baseline_rows.git_commit(os.path.dirname(os.path.abspath(__file__)))
    if not commit:
        raise SystemExit("no commit known for build B: give --commit")
    try:
        rows = baseline_rows.read_rows(template, commit=commit, command=args.command)
    except baseline_rows.RowError as e:
        raise SystemExit(str(e)) from e
    out = []
    for r in rows:
        if r["size"] not in means:
            continue
        t, mean, lo, hi = means[r["size"]]
        r["time_us"] = round(t, 3)
        r["busbw_gbps"] = round(baseline_rows.busbw(r["op"], r["size"], r["ranks"], t), 3)
        r["nccl_time_us"] = r["nccl_version"] = None
        r["note"] = (f"mean of {nrounds} rounds (A/B against {args.a}, both places: "
                     f"{mean:.4f}x, per round {lo:.4f}-{hi:.4f})")
        out.append(r)
    baseline_rows.append_rows(args.record, out)
    print(f"recorded {len(out)} row(s) of {args.b} into {args.record} (commit {commit})")


if __name__ == "__main__":
    main()
