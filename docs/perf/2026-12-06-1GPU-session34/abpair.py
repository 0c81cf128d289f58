#!/usr/bin/env python3
"""Paired ratios of an A/B log (`## NAME ROUND` headers, then mscclpp-perf rows): for each
round and size, each build's out-of-place time over the first build's in the same round;
then per size and build the median, min and max of those ratios, and the ratio of means.
Usage: abpair.py LOG [JSON]"""
import collections, json, statistics, sys

t = {}  # (build, round, bytes) -> us
order = []
name = rnd = None
for line in open(sys.argv[1]):
    if line.startswith("## "):
        w = line.split()
        name, rnd = w[1], int(w[2])
        if name not in order:
            order.append(name)
        continue
    f = line.split()
    if name and len(f) >= 13 and f[0].isdigit():
        t[(name, rnd, int(f[0]))] = float(f[5])
base = order[0]
sizes = sorted({s for _, _, s in t})
rounds = sorted({r for _, r, _ in t})
out = {"unit": "us, out of place", "base": base, "builds": order, "rows": []}
print(f"{'bytes':>6} {'build':>10} {'rounds':>6} {'mean us':>8} {'base us':>8} {'ratio of means':>14} {'median':>7} {'min':>6} {'max':>6}")
for s in sizes:
    for b in order[1:]:
        pairs = [(t[(b, r, s)], t[(base, r, s)]) for r in rounds if (b, r, s) in t and (base, r, s) in t]
        if not pairs:
            continue
        ratios = [x / y for x, y in pairs]
        mb = statistics.mean(x for x, _ in pairs)
        ma = statistics.mean(y for _, y in pairs)
        row = {"bytes": s, "build": b, "rounds": len(pairs), "mean_us": round(mb, 3),
               "base_mean_us": round(ma, 3), "ratio_of_means": round(mb / ma, 4),
               "median_ratio": round(statistics.median(ratios), 4),
               "min_ratio": round(min(ratios), 4), "max_ratio": round(max(ratios), 4),
               "ratios": [round(x, 4) for x in ratios]}
        out["rows"].append(row)
        print(f"{s:>6} {b:>10} {len(pairs):>6} {mb:8.3f} {ma:8.3f} {mb / ma:14.4f} "
              f"{row['median_ratio']:7.4f} {row['min_ratio']:6.4f} {row['max_ratio']:6.4f}")
if len(sys.argv) > 2:
    json.dump(out, open(sys.argv[2], "w"), indent=1)
