#!/usr/bin/env python3
"""Means of an A/B log (`## NAME ...` headers, then mscclpp-perf rows): out-of-place time in
us per size and build, and each build's ratio to the first. Usage: abmean.py LOG [JSON]"""
import collections, json, sys

runs = collections.defaultdict(list)
order, name = [], None
for line in open(sys.argv[1]):
    if line.startswith("## "):
        words = line.split()[1:]
        name = "-".join(w for w in words if not w.isdigit())
        if name not in order:
            order.append(name)
        continue
    f = line.split()
    if name and len(f) >= 13 and f[0].isdigit():
        runs[(name, int(f[0]))].append(float(f[5]))
sizes = sorted({s for _, s in runs})
mean = {k: sum(v) / len(v) for k, v in runs.items()}
print("bytes " + " ".join(f"{n:>9}" for n in order) + "  " + " ".join(f"{n}/{order[0]}" for n in order[1:]))
for s in sizes:
    row = [mean.get((n, s)) for n in order]
    print(f"{s:>5} " + " ".join(f"{x:9.2f}" if x else "        -" for x in row) + "  " +
          " ".join(f"{x / row[0]:.3f}" if x and row[0] else "-" for x in row[1:]))
if len(sys.argv) > 2:
    json.dump({"unit": "us, out of place, mean of runs", "builds": order,
               "rows": [{"bytes": s, **{n: {"mean_us": round(mean[(n, s)], 3), "runs": runs[(n, s)]}
                                         for n in order if (n, s) in mean}} for s in sizes]},
              open(sys.argv[2], "w"), indent=1)
