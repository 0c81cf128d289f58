"""Benchmark rows in the schema of benches/records/*.jsonl (see benches/records/README.md).

Imported by scripts/check-baseline.py, scripts/plot-baseline.py and scripts/perf-ab.py; not
a command. Standard library only.

A row is one measurement: one collective, data type, size, rank count, host count and
launch mode (plain or CUDA graph) on one machine kind, our time with NCCL's from the same
run where there was one. The baseline of a machine kind is benches/records/<kind>.jsonl.
"""

import json
import os
import subprocess

# Every field of a row, in the order rows are written; `note` only when there is one.
FIELDS = (
    "op", "dtype", "size", "ranks", "hosts", "hosts_simulated", "algorithm", "graph",
    "time_us", "busbw_gbps", "nccl_time_us", "nccl_version", "command", "commit", "date",
    "note",
)
# Optional: how two simulated hosts were joined, where a file holds more than one way
# (`loopback`, `netns`, `shm`; scripts/host-vs-mpi.py writes it). Rows without it (older
# ones) are matched among themselves.
LINK = "link"
REQUIRED = (
    "op", "dtype", "size", "ranks", "hosts", "hosts_simulated", "graph", "time_us",
    "command", "commit", "date",
)
OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "sendrecv")

# The tool's flags whose value is a file: a recorded command leaves them out.
OUTPUT_FLAGS = ("--json", "--plot", "--dump-params")


class RowError(Exception):
    """A file that holds no rows of this schema, or a malformed row."""


def key(row):
    """What a new row is matched on against the baseline."""
    return (row["op"], row["dtype"], row["size"], row["ranks"], row["hosts"],
            row["hosts_simulated"], row["graph"], row.get(LINK))


def describe(k):
    """A key as a short line: `allreduce float 8 B, 2 ranks, 1 host, graph`."""
    op, dtype, size, ranks, hosts, simulated, graph, link = k
    where = f"{hosts} {'simulated ' if simulated else ''}host{'s' if hosts != 1 else ''}"
    over = f" over {link}" if link else ""
    return (f"{op} {dtype} {size} B, {ranks} ranks, {where}{over}, "
            f"{'graph' if graph else 'plain'}")


def bus_factor(op, ranks):
    """nccl-tests' bus bandwidth factor (tools/perf/src/report.rs, bus_factor)."""
    n = max(ranks, 1)
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def busbw(op, size, ranks, time_us):
    """Bus bandwidth in GB/s of `size` bytes in `time_us`."""
    return size / time_us / 1e3 * bus_factor(op, ranks) if time_us > 0 else 0.0


def public_command(argv):
    """The tool's command line without its output files (`--json out.json`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in OUTPUT_FLAGS:
            skip = True
            continue
        if a.split("=", 1)[0] in OUTPUT_FLAGS:
            continue
        out.append(a)
    return " ".join(out)


def simulated_hosts(argv):
    """N of `--simulate-hosts N` in a command line, or None."""
    for i, a in enumerate(argv):
        if a == "--simulate-hosts" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--simulate-hosts="):
            return int(a.split("=", 1)[1])
    return None


def check_row(row, where):
    """Raises RowError unless `row` has every required field with a value of its type."""
    if not isinstance(row, dict):
        raise RowError(f"{where}: not a JSON object")
    missing = [f for f in REQUIRED if f not in row]
    if missing:
        raise RowError(f"{where}: missing {', '.join(missing)}")
    if row["op"] not in OPS:
        raise RowError(f"{where}: op {row['op']!r} is none of {', '.join(OPS)}")
    for f in ("size", "ranks", "hosts"):
        if not isinstance(row[f], int) or isinstance(row[f], bool) or row[f] < 1:
            raise RowError(f"{where}: {f} must be a positive integer, not {row[f]!r}")
    for f in ("graph", "hosts_simulated"):
        if not isinstance(row[f], bool):
            raise RowError(f"{where}: {f} must be true or false, not {row[f]!r}")
    t = row["time_us"]
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0:
        raise RowError(f"{where}: time_us must be a positive number, not {t!r}")
    nt = row.get("nccl_time_us")
    if nt is not None and (not isinstance(nt, (int, float)) or not nt > 0):
        raise RowError(f"{where}: nccl_time_us must be a positive number or null, not {nt!r}")
    return row


def rows_from_report(report, path, commit=None, command=None, note=None):
    """The out-of-place rows of one `mscclpp-perf --json` report."""
    try:
        argv = list(report["command_line"])
        nranks = int(report["nranks"])
        graph = int(report["graph_launches"]) > 0
        sim = simulated_hosts(argv)
        hosts = sim if sim else max(len(set(report["hosts"])), 1)
        out = []
        for r in report["rows"]:
            for place in ("out_of_place", "in_place"):
                wrong = r["mscclpp"][place].get("wrong")
                if wrong:
                    raise RowError(f"{path}: {r['bytes']} B {place.replace('_', '-')}: "
                                   f"{wrong} wrong elements; a wrong result is no measurement")
            ours = r["mscclpp"]["out_of_place"]
            nccl = (r.get("nccl") or {}).get("out_of_place")
            row = {
                "op": report["collective"],
                "dtype": r.get("dtype", report["dtype"]),
                "size": int(r["bytes"]),
                "ranks": nranks,
                "hosts": hosts,
                "hosts_simulated": sim is not None,
                "algorithm": r.get("algo"),
                "graph": graph,
                "time_us": round(float(ours["time_us"]), 3),
                "busbw_gbps": round(float(ours["busbw_gbps"]), 3),
                "nccl_time_us": round(float(nccl["time_us"]), 3) if nccl else None,
                "nccl_version": report.get("nccl_version") if nccl else None,
                "command": command or public_command(argv),
                "commit": commit or "",
                "date": report["date"],
            }
            if note:
                row["note"] = note
            out.append(check_row(row, f"{path}: row of {r.get('bytes')} B"))
        return out
    except (KeyError, TypeError, ValueError) as e:
        raise RowError(f"{path}: not a complete mscclpp-perf --json report ({e!r})") from e


def read_rows(path, commit=None, command=None, note=None):
    """Rows of `path`: an `mscclpp-perf --json` report, or JSON lines of this schema."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise RowError(f"{path}: {e.strerror}") from e
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and "rows" in whole:
        if whole.get("tool") != "mscclpp-perf":
            raise RowError(f"{path}: a JSON report, but not from mscclpp-perf")
        return rows_from_report(whole, path, commit, command, note)
    if isinstance(whole, dict):
        # One row on one line is also valid JSON lines.
        return [check_row(whole, f"{path}:1")]
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise RowError(f"{path}:{n}: not JSON ({e.msg})") from e
        rows.append(check_row(row, f"{path}:{n}"))
    if not rows:
        raise RowError(f"{path}: no rows")
    return rows


def ordered(row):
    """`row` with its fields in FIELDS order, `note` left out when empty."""
    out = {f: row.get(f) for f in FIELDS if f != "note"}
    if row.get("note"):
        out["note"] = row["note"]
    return out


def append_rows(path, rows):
    """Appends `rows` to the JSON lines file `path` (created if missing)."""
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(ordered(r)) + "\n")


def git_commit(repo_dir):
    """The short hash of HEAD in `repo_dir`, `+dirty` if the tree has changes; '' outside git."""
    try:
        head = subprocess.run(["git", "-C", repo_dir, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo_dir, "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return ""


def records_dir():
    """benches/records/ of this repository."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benches", "records")
