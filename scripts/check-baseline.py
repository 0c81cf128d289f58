#!/usr/bin/env python3
"""Compare a benchmark run with a machine kind's baseline, or record it into the baseline.

usage: check-baseline.py (--kind KIND | --baseline FILE) [--band FRACTION] RUN [RUN ...]
       check-baseline.py --record (--kind KIND | --baseline FILE) [--commit C]
                         [--command CMD] [--note TEXT] RUN [RUN ...]

RUN is an `mscclpp-perf --json` report or JSON lines in the baseline schema
(benches/records/README.md). KIND names benches/records/KIND.jsonl (`nvidia-h200-x2`,
`nvidia-h100-x1`, `host-2core`, ...).

Check: each row of the run is matched with the baseline's row of the same op, dtype, size,
ranks, hosts (and whether they were simulated) and launch mode (plain or graph); where the
baseline holds several, the last one (the latest recorded) counts. A row slower than
baseline x (1 + band) is a regression; every regression is named, and so is every row
without a baseline. Exit status: 1 if any row regressed, 0 otherwise, 2 on bad input.

Record (--record): appends the run's rows to the baseline, with the commit (default: the
short hash of this repository's HEAD, `+dirty` with uncommitted changes) and the command
(default: the report's own command line, output files left out).

Only our time is compared. NCCL's time from the same run, where both sides have one, is
printed next to it: a machine that is slower as a whole moves both.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in scripts/
import baseline_rows  # noqa: E402

DEFAULT_BAND = 0.10
BAND_HELP = (
    "noise band, a fraction of the baseline's time: a row is a regression when it takes "
    "longer than baseline x (1 + band) (default %(default)s: the spread of one build's "
    "repeated runs under a CUDA graph was within +-7%% on one H100; plain launches and "
    "the Host transport spread wider, up to +-25%%: give those --band 0.3)"
)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="check-baseline.py",
        usage="%(prog)s (--kind KIND | --baseline FILE) [--band FRACTION] RUN [RUN ...]\n"
              "       %(prog)s --record (--kind KIND | --baseline FILE) [--commit C] "
              "[--command CMD] [--note TEXT] RUN [RUN ...]",
        description="Compare an mscclpp-perf run with a machine kind's baseline "
                    "(benches/records/KIND.jsonl), or append it there with --record. "
                    "Exit status 1 when a row regressed beyond the band, 0 otherwise, "
                    "2 on bad input.",
    )
    ap.add_argument("runs", nargs="+", metavar="RUN",
                    help="mscclpp-perf --json report, or JSON lines in the baseline schema")
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--kind", help="machine kind: the baseline is "
                                      "benches/records/KIND.jsonl")
    which.add_argument("--baseline", help="the baseline file itself")
    ap.add_argument("--band", type=float, default=DEFAULT_BAND, help=BAND_HELP)
    ap.add_argument("--record", action="store_true",
                    help="append the run's rows to the baseline instead of checking them")
    ap.add_argument("--commit", help="with --record: the commit the run's binary was built "
                                     "from (default: this repository's HEAD)")
    ap.add_argument("--command", help="with --record: the command that ran (default: the "
                                      "report's command line), e.g. with its environment "
                                      "or launcher")
    ap.add_argument("--note", help="with --record: a note kept with every row")
    args = ap.parse_args(argv)
    if not 0 <= args.band < 10:
        ap.error(f"--band {args.band}: give a fraction of the baseline's time, e.g. 0.1")
    if not args.record and (args.commit or args.command or args.note):
        ap.error("--commit, --command and --note go with --record")
    if args.kind is not None and (not args.kind or os.sep in args.kind or args.kind.startswith(".")):
        ap.error(f"--kind {args.kind!r}: a machine kind's name, e.g. nvidia-h200-x2")
    return args


def baseline_path(args):
    if args.baseline:
        return args.baseline
    return os.path.normpath(os.path.join(baseline_rows.records_dir(), args.kind + ".jsonl"))


def read_run(args):
    rows = []
    for path in args.runs:
        rows += baseline_rows.read_rows(path, commit=args.commit, command=args.command,
                                        note=args.note)
    return rows


def record(args, path):
    commit = args.commit or baseline_rows.git_commit(
        os.path.dirname(os.path.abspath(__file__)))
    rows = read_run(args)
    for r in rows:
        if args.commit or not r.get("commit"):
            r["commit"] = commit
        if not r["commit"]:
            raise baseline_rows.RowError("no commit known: give --commit")
    if not os.path.exists(path):
        print(f"{path}: new baseline file")
    baseline_rows.append_rows(path, rows)
    print(f"recorded {len(rows)} row(s) into {path} (commit {rows[0]['commit']})")
    return 0


def nccl_part(new, old):
    if new.get("nccl_time_us") and old.get("nccl_time_us"):
        return (f"; NCCL in the same runs {new['nccl_time_us']:.3f} against "
                f"{old['nccl_time_us']:.3f} us ({new['nccl_time_us'] / old['nccl_time_us']:.3f}x)")
    return ""


def check(args, path):
    if not os.path.exists(path):
        raise baseline_rows.RowError(f"{path}: no such baseline (record one with --record)")
    base = {}
    for r in baseline_rows.read_rows(path):
        base[baseline_rows.key(r)] = r
    rows = read_run(args)
    shown = os.path.relpath(path)
    print(f"baseline {shown if not shown.startswith('..') else path}, band {args.band:.0%}")
    regressions, faster, within, missing = [], [], [], []
    for r in rows:
        k = baseline_rows.key(r)
        old = base.get(k)
        if old is None:
            missing.append(k)
            continue
        ratio = r["time_us"] / old["time_us"]
        line = (f"{baseline_rows.describe(k)}: {r['time_us']:.3f} us against "
                f"{old['time_us']:.3f} us ({ratio:.3f}x, baseline {old['commit']})"
                f"{nccl_part(r, old)}")
        if old.get("algorithm") and r.get("algorithm") and old["algorithm"] != r["algorithm"]:
            line += f"; algorithm {old['algorithm']} -> {r['algorithm']}"
        if ratio > 1 + args.band:
            regressions.append(line)
        elif ratio < 1 - args.band:
            faster.append(line)
        else:
            within.append(line)
    for line in regressions:
        print("REGRESSION  " + line)
    for line in faster:
        print("faster      " + line)
    for k in missing:
        print("no baseline " + baseline_rows.describe(k))
    print(f"{len(rows)} row(s): {len(within)} within the band, {len(faster)} faster, "
          f"{len(regressions)} regressed, {len(missing)} without a baseline")
    return 1 if regressions else 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    path = baseline_path(args)
    try:
        return record(args, path) if args.record else check(args, path)
    except baseline_rows.RowError as e:
        print(f"check-baseline.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
