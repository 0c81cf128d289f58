#!/usr/bin/env python3
"""SVG plots of a machine kind's baseline: ours against NCCL, per collective.

usage: plot-baseline.py KIND [--plain] [--ops OP,...] [--dtype T] [--ranks N] [--out DIR]

reads benches/records/KIND.jsonl (or the file given as KIND when it ends in .jsonl) and
writes one SVG per collective, DIR/KIND-OP.svg (default DIR: docs/guide/img): on the left
the time per call against the size (both axes logarithmic), on the right the bus bandwidth
against the size, our rows as a solid line, NCCL's from the same runs dashed. Rows are
those under a CUDA graph (--plain: plain launches), of one data type (default float), one
rank count (default: the most common) and one real host; where a size was recorded more
than once, the last row counts. Standard library only; the output has no date in it, so
plots of unchanged data stay byte for byte the same.
"""

import argparse
import collections
import math
import os
import sys
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in scripts/
import baseline_rows  # noqa: E402

NAMES = {
    "allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter",
    "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all-to-all",
    "sendrecv": "send/recv",
}
OURS, NCCL = "#1f5fa8", "#d9731a"
PANEL_W, PANEL_H = 400, 260
LEFT, TOP, GAP, BOTTOM, RIGHT = 64, 58, 88, 62, 20


def size_label(b):
    for unit, n in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n}{unit}"
    return f"{b}"


def nice_step(span, ticks=5):
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt(v):
    return f"{v:g}" if v >= 1 or v == 0 else f"{v:.2g}"


class Panel:
    """One chart: x is log2(size); y is log10(time) or linear bandwidth."""

    def __init__(self, x0, sizes, ys, log_y, ylabel):
        self.x0, self.log_y, self.ylabel = x0, log_y, ylabel
        self.lx = math.log2(min(sizes)), math.log2(max(sizes))
        if self.lx[0] == self.lx[1]:
            self.lx = self.lx[0] - 1, self.lx[1] + 1
        if log_y:
            lo, hi = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
            self.ly = (lo, hi if hi > lo else lo + 1)
            self.yticks = [10 ** e for e in range(self.ly[0], self.ly[1] + 1)]
        else:
            step = nice_step(max(ys))
            top = math.ceil(max(ys) / step) * step
            self.ly = (0, top)
            self.yticks = [i * step for i in range(int(round(top / step)) + 1)]

    def x(self, size):
        f = (math.log2(size) - self.lx[0]) / (self.lx[1] - self.lx[0])
        return self.x0 + f * PANEL_W

    def y(self, v):
        if self.log_y:
            f = (math.log10(v) - self.ly[0]) / (self.ly[1] - self.ly[0])
        else:
            f = (v - self.ly[0]) / (self.ly[1] - self.ly[0])
        return TOP + PANEL_H - f * PANEL_H

    def axes(self, sizes):
        out = [f'<rect x="{self.x0}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" '
               f'fill="none" stroke="#888"/>']
        for t in self.yticks:
            y = self.y(t)
            out.append(f'<line x1="{self.x0}" y1="{y:.1f}" x2="{self.x0 + PANEL_W}" '
                       f'y2="{y:.1f}" stroke="#e4e4e4"/>')
            out.append(f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end">'
                       f'{fmt(t)}</text>')
        if self.log_y:
            # 2x and 5x each power of ten, fainter.
            for e in range(self.ly[0], self.ly[1]):
                for m in (2, 5):
                    y = self.y(m * 10 ** e)
                    out.append(f'<line x1="{self.x0}" y1="{y:.1f}" x2="{self.x0 + PANEL_W}" '
                               f'y2="{y:.1f}" stroke="#f0f0f0"/>')
                    out.append(f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end" '
                               f'fill="#888">{fmt(m * 10 ** e)}</text>')
        # Size ticks every 8x from the smallest size (every 4x on short sweeps).
        lo, hi = int(math.log2(min(sizes))), int(math.log2(max(sizes)))
        every = 3 if hi - lo > 12 else 2
        for e in range(lo, hi + 1):
            if (e - lo) % every:
                continue
            x = self.x(2 ** e)
            out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + PANEL_H}" '
                       f'stroke="#e4e4e4"/>')
            out.append(f'<text x="{x:.1f}" y="{TOP + PANEL_H + 16}" text-anchor="middle">'
                       f'{size_label(2 ** e)}</text>')
        cx = self.x0 + PANEL_W / 2
        out.append(f'<text x="{cx}" y="{TOP + PANEL_H + 36}" text-anchor="middle">'
                   f'size (bytes)</text>')
        out.append(f'<text x="{self.x0 - 46}" y="{TOP + PANEL_H / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 {self.x0 - 46} {TOP + PANEL_H / 2})">'
                   f'{escape(self.ylabel)}</text>')
        return out

    def series(self, points, color, dashed, marker):
        if not points:
            return []
        path = " ".join(f"{'M' if i == 0 else 'L'}{self.x(s):.1f},{self.y(v):.1f}"
                        for i, (s, v) in enumerate(points))
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        out = [f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>']
        for s, v in points:
            x, y = self.x(s), self.y(v)
            if marker == "square":
                out.append(f'<rect x="{x - 3:.1f}" y="{y - 3:.1f}" width="6" height="6" '
                           f'fill="{color}"/>')
            else:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>')
        return out


def plot(kind, op, rows):
    """The SVG text of one collective's rows (sorted by size, one per size)."""
    sizes = [r["size"] for r in rows]
    ours_t = [(r["size"], r["time_us"]) for r in rows]
    nccl_t = [(r["size"], r["nccl_time_us"]) for r in rows if r.get("nccl_time_us")]
    ours_b = [(r["size"], baseline_rows.busbw(op, r["size"], r["ranks"], r["time_us"]))
              for r in rows]
    nccl_b = [(r["size"], baseline_rows.busbw(op, r["size"], r["ranks"], r["nccl_time_us"]))
              for r in rows if r.get("nccl_time_us")]
    left = Panel(LEFT, sizes, [v for _, v in ours_t + nccl_t], True, "time per call (us)")
    right = Panel(LEFT + PANEL_W + GAP, sizes, [v for _, v in ours_b + nccl_b] + [1e-9], False,
                  "bus bandwidth (GB/s)")
    width = LEFT + 2 * PANEL_W + GAP + RIGHT
    height = TOP + PANEL_H + BOTTOM
    r0 = rows[0]
    where = (f"{r0['ranks']} ranks, {r0['hosts']} host{'s' if r0['hosts'] > 1 else ''}, "
             f"{'CUDA graph' if r0['graph'] else 'plain launches'}")
    commits = sorted({r["commit"] for r in rows})
    versions = sorted({r["nccl_version"] for r in rows if r.get("nccl_version")})
    sub = f"commit {', '.join(commits)}"
    if versions:
        sub += f"; NCCL {', '.join(versions)} in the same runs"
    elif not nccl_t:
        sub += "; no NCCL in these runs"
    sub += f"; benches/records/{kind}.jsonl"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" '
        f'font-size="11" fill="#222">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">'
        f'{escape(NAMES.get(op, op))} {escape(r0["dtype"])}, {escape(where)} ({escape(kind)})'
        f'</text>',
        f'<text x="{LEFT}" y="37" fill="#555">{escape(sub)}</text>',
    ]
    for panel, ours, nccl in ((left, ours_t, nccl_t), (right, ours_b, nccl_b)):
        out += panel.axes(sizes)
        out += panel.series(nccl, NCCL, True, "square")
        out += panel.series(ours, OURS, False, "circle")
    lx = LEFT + 2 * PANEL_W + GAP - 120
    legend = [("mscclpp", OURS, "")] + ([("NCCL", NCCL, ' stroke-dasharray="6 4"')]
                                         if nccl_t else [])
    for i, (name, color, dash) in enumerate(legend):
        y = 18 + 16 * i
        out.append(f'<line x1="{lx}" y1="{y - 4}" x2="{lx + 24}" y2="{y - 4}" stroke="{color}" '
                   f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 30}" y="{y}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def select(rows, op, graph, dtype, ranks):
    """One row per size (the last recorded) of `op`, on one real host."""
    by_size = {}
    for r in rows:
        if (r["op"], r["graph"], r["dtype"], r["hosts"], r["hosts_simulated"]) != \
                (op, graph, dtype, 1, False):
            continue
        if ranks is not None and r["ranks"] != ranks:
            continue
        by_size[r["size"]] = r
    return [by_size[s] for s in sorted(by_size)]


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="plot-baseline.py",
        usage="%(prog)s KIND [--plain] [--ops OP,...] [--dtype T] [--ranks N] [--out DIR]",
        description="One SVG per collective of a machine kind's baseline: time and bus "
                    "bandwidth against size, ours and NCCL's.")
    ap.add_argument("kind", help="machine kind (benches/records/KIND.jsonl) or a .jsonl file")
    ap.add_argument("--plain", action="store_true",
                    help="plot plain launches (default: rows under a CUDA graph)")
    ap.add_argument("--ops", help="comma-separated collectives (default: every one with rows)")
    ap.add_argument("--dtype", default="float", help="data type (default: float)")
    ap.add_argument("--ranks", type=int, help="rank count (default: the most common)")
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                               "guide", "img")
    ap.add_argument("--out", default=default_out, help="folder (default: docs/guide/img)")
    args = ap.parse_args(argv)
    if args.kind.endswith(".jsonl"):
        path, kind = args.kind, os.path.basename(args.kind)[:-len(".jsonl")]
    else:
        path, kind = os.path.join(baseline_rows.records_dir(), args.kind + ".jsonl"), args.kind
    try:
        rows = baseline_rows.read_rows(path)
    except baseline_rows.RowError as e:
        ap.exit(2, f"plot-baseline.py: {e}\n")
    ops = args.ops.split(",") if args.ops else [o for o in baseline_rows.OPS
                                                if any(r["op"] == o for r in rows)]
    bad = [o for o in ops if o not in baseline_rows.OPS]
    if bad:
        ap.error(f"--ops: {', '.join(bad)}: none of {', '.join(baseline_rows.OPS)}")
    ranks = args.ranks
    if ranks is None:
        ranks = collections.Counter(r["ranks"] for r in rows).most_common(1)[0][0]
    os.makedirs(args.out, exist_ok=True)
    written = 0
    for op in ops:
        chosen = select(rows, op, not args.plain, args.dtype, ranks)
        if not chosen:
            print(f"{op}: no rows ({'plain' if args.plain else 'graph'}, {args.dtype}, "
                  f"{ranks} ranks, one host)")
            continue
        name = f"{kind}-{op}{'-plain' if args.plain else ''}.svg"
        with open(os.path.join(args.out, name), "w") as f:
            f.write(plot(kind, op, chosen))
        print(f"{os.path.normpath(os.path.join(args.out, name))}: {len(chosen)} sizes")
        written += 1
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
