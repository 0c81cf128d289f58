#!/usr/bin/env python3
"""Ratio table of two builds measured in one run, round by round.

    python3 scripts/perf-ab.py PREFIX DIR A B [--jsonl FILE --commit C --command CMD --machine M]

reads DIR/PREFIX-A-<round>.json and DIR/PREFIX-B-<round>.json (mscclpp-perf --json; the
builds alternate within each round) and prints, per size, each build's mean time (out of
place and in place together), the mean of the per-round ratios B/A and their spread
(min-max over the rounds). With --jsonl, appends one record per size to FILE (JSON lines:
the benchmark records), with the command, commit and machine given.
"""

import argparse
import glob
import json
import math
import os
import re


def times(path):
    """{bytes: [out-of-place us, in-place us]} of one mscclpp-perf --json file."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {
        r["bytes"]: [r["mscclpp"]["out_of_place"]["time_us"], r["mscclpp"]["in_place"]["time_us"]]
        for r in rows
    }


def rounds(d, prefix, build):
    """{round: times} of one build's files."""
    out = {}
    for p in glob.glob(os.path.join(d, f"{prefix}-{build}-*.json")):
        m = re.search(r"-(\d+)\.json$", p)
        if m:
            out[int(m.group(1))] = times(p)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("dir")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--jsonl")
    ap.add_argument("--commit", default="")
    ap.add_argument("--command", default="")
    ap.add_argument("--machine", default="")
    args = ap.parse_args()
    ra, rb = rounds(args.dir, args.prefix, args.a), rounds(args.dir, args.prefix, args.b)
    both = sorted(set(ra) & set(rb))
    if not both:
        raise SystemExit(f"no round has both {args.a} and {args.b} under {args.dir}")
    sizes = sorted(set.intersection(*(set(ra[k]) & set(rb[k]) for k in both)))
    print(f"{args.prefix}: {len(both)} rounds")
    print(f"{'bytes':>10} {args.a + ' us':>12} {args.b + ' us':>12} {'B/A':>7} {'min-max':>13}")
    logs = []
    records = []
    for s in sizes:
        a = [sum(ra[k][s]) / 2 for k in both]
        b = [sum(rb[k][s]) / 2 for k in both]
        ratio = [y / x for x, y in zip(a, b)]
        mean = sum(ratio) / len(ratio)
        logs.append(math.log(mean))
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        print(f"{s:>10} {ma:>12.2f} {mb:>12.2f} {mean:>7.3f} {min(ratio):>6.3f}-{max(ratio):.3f}")
        records.append({
            "prefix": args.prefix, "bytes": s, "rounds": len(both),
            "a": args.a, "b": args.b, "a_us": round(ma, 3), "b_us": round(mb, 3),
            "b_over_a": round(mean, 4), "min": round(min(ratio), 4), "max": round(max(ratio), 4),
            "machine": args.machine, "commit": args.commit, "command": args.command,
        })
    print("geomean B/A", round(math.exp(sum(logs) / len(logs)), 3))
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
