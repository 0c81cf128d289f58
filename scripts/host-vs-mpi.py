#!/usr/bin/env python3
"""The Host backend's all-reduce against Open MPI's MPI_Allreduce, same machine, same run.

Builds benches/mpi/allreduce.c with mpicc (Debian: apt-get install openmpi-bin
libopenmpi-dev), then runs `rounds` interleaved rounds of both over a size sweep, 2 ranks:

  shm       one host: ours over shared memory, MPI with its default transports (vader);
  loopback  two hosts on loopback: ours with --simulate-hosts 2 (TCP between the hosts),
            MPI with --mca btl tcp,self.
  netns     two hosts as two network namespaces joined by a veth pair (needs root): each
            rank runs inside its own namespace, so every byte between them crosses the
            link; ours with a host id per namespace, MPI with --mca btl tcp,self on the
            link's subnet. The namespaces are removed at the end, also on failure.

Both bind each rank to a core (mpirun --bind-to core, the perf tool's --bind cpus).
Prints, per link and size, the median time of each and MPI's time / ours (above 1: ours
is faster), with the per-round range of that ratio. Any wrong element fails the run.
With --record FILE the medians are appended as rows of benches/records/ (see its
README). Needs a release build of the perf tool: cargo build --release -p mscclpp-perf.
"""

import argparse
import contextlib
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_SOURCE = os.path.join(ROOT, "benches", "mpi", "allreduce.c")


def size_arg(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def run(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited with {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


class Namespaces:
    """Two network namespaces joined by a veth pair, 10.<net>.0.1 and .2; removed on exit."""

    def __init__(self):
        self.tag = f"hvm{os.getpid() % 100000}"
        self.net = 64 + os.getpid() % 128
        self.made = []

    def name(self, h):
        return f"{self.tag}h{h}"

    def addr(self, h):
        return f"10.{self.net}.0.{h + 1}"

    def subnet(self):
        return f"10.{self.net}.0.0/24"

    def __enter__(self):
        try:
            for h in range(2):
                run(["ip", "netns", "add", self.name(h)], 60)
                self.made.append(self.name(h))
            run(["ip", "link", "add", f"{self.tag}v0", "netns", self.name(0), "type", "veth",
                 "peer", "name", f"{self.tag}v1", "netns", self.name(1)], 60)
            for h in range(2):
                ns = ["ip", "-n", self.name(h)]
                run(ns + ["addr", "add", f"{self.addr(h)}/24", "dev", f"{self.tag}v{h}"], 60)
                run(ns + ["link", "set", f"{self.tag}v{h}", "up"], 60)
                run(ns + ["link", "set", "lo", "up"], 60)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        # Deleting a namespace deletes the veth end in it, and with it its peer.
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made = []


CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1


def enter_namespace(prefix, argv):
    """Runs as an MPI rank's wrapper (`--enter-namespace PREFIX exe args`): moves into
    network namespace PREFIX<rank> (the rank from mpirun's OMPI_COMM_WORLD_RANK) and execs
    `exe`. mpirun's PMIx server listens on the first namespace's 127.0.0.1, which the rank
    could not reach from inside its own: a relay process listens on the same port there and
    forwards each connection to the server (a socket belongs to the namespace it was made
    in). The relay dies with the rank."""
    import ctypes
    import select
    import signal
    import socket
    libc = ctypes.CDLL(None, use_errno=True)

    def setns(fd):
        if libc.setns(fd, CLONE_NEWNET) != 0:
            sys.exit(f"error: setns: {os.strerror(ctypes.get_errno())}")

    rank = os.environ.get("OMPI_COMM_WORLD_RANK")
    if rank is None:
        sys.exit("error: --enter-namespace runs under mpirun (no OMPI_COMM_WORLD_RANK)")
    name = prefix + rank
    uri = next((v for k, v in sorted(os.environ.items()) if k.startswith("PMIX_SERVER_URI")),
               None)
    if uri is None or "tcp4://127.0.0.1:" not in uri:
        sys.exit(f"error: --enter-namespace runs under mpirun (PMIx over TCP), not {uri!r}")
    port = int(uri.rsplit(":", 1)[1])
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    setns(target)
    listener = socket.create_server(("127.0.0.1", port))
    if os.fork() == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        pairs = {}
        while True:
            ready, _, _ = select.select([listener] + list(pairs), [], [])
            for s in ready:
                if s is listener:
                    inner, _ = listener.accept()
                    setns(home)
                    outer = socket.create_connection(("127.0.0.1", port))
                    setns(target)
                    pairs[inner], pairs[outer] = outer, inner
                    continue
                data = s.recv(1 << 16)
                if data:
                    pairs[s].sendall(data)
                    continue
                other = pairs.pop(s)
                pairs.pop(other, None)
                s.close()
                other.close()
    listener.close()
    os.execvp(argv[0], argv)


def ours_in_namespaces(cmd, a):
    """Runs the perf tool's two ranks by hand, rank r in namespace r bound to a core of its
    own, the bootstrap root at rank 0's address; returns rank 0's output."""
    ns = a.namespaces
    cpus = sorted(os.sched_getaffinity(0))
    port = random.randint(20000, 60000)
    procs = []
    for r in range(2):
        env = dict(os.environ, MSCCLPP_RANK=str(r), MSCCLPP_NRANKS="2",
                   MSCCLPP_LOCAL_RANK="0", MSCCLPP_BOOTSTRAP=f"{ns.addr(0)}:{port}",
                   MSCCLPP_HOST_ID=f"{ns.tag}-host{r}")
        pin = ["taskset", "-c", str(cpus[r * len(cpus) // 2])]
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns.name(r)] + pin + cmd,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=a.timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, p in enumerate(procs):
        if p.returncode != 0:
            sys.exit(f"error: rank {r} of {' '.join(cmd)} in {ns.name(r)} exited with "
                     f"{p.returncode}:\n{outs[r][0]}\n{outs[r][1]}")
    return outs[0][0]


def ours(perf, link, a):
    cmd = [perf, "--nranks", "2", "-b", str(a.min), "-e", str(a.max), "-f", str(a.factor),
           "-n", str(a.iters), "-w", str(a.warmup)]
    if link == "loopback":
        cmd += ["--simulate-hosts", "2"]
    if link == "netns":
        # Each rank started by hand (MSCCLPP_RANK), so no --nranks.
        cmd = cmd[:1] + cmd[3:]
        out = ours_in_namespaces(cmd, a)
    else:
        out = run(cmd, a.timeout)
    times = {}
    for line in out.splitlines():
        f = line.split()
        # size count type redop algo time algbw busbw #wrong (out-of-place, then in-place)
        if len(f) >= 9 and f[0].isdigit():
            if int(f[8]) != 0:
                sys.exit(f"error: ours gave {f[8]} wrong elements at {f[0]} B ({link})")
            times[int(f[0])] = float(f[5])
    return cmd, times


def public_mpi_command(cmd):
    """`cmd` as a record shows it: the benchmark by name, and the namespace wrapper (its
    interpreter, path and namespace names are this machine's) as the script's option."""
    if "--enter-namespace" in cmd:
        # The interpreter and the script's path come before the option.
        head = cmd[:cmd.index("--enter-namespace") - 2]
        head += ["scripts/host-vs-mpi.py", "--enter-namespace", "NS"]
        head = [("10.N.0.0/24" if h.startswith("10.") else h) for h in head]
    else:
        head = cmd[:-6]
    return " ".join(head + ["mpi-allreduce"] + cmd[-5:])


def mpi(exe, link, a):
    # Bound a core per rank, as mpirun does by default for two ranks and as the perf tool
    # binds its ranks (`--bind cpus`).
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "core", "-np", "2"]
    if link == "loopback":
        cmd += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]
    elif link == "netns":
        ns = a.namespaces
        cmd += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", ns.subnet(),
                # The wrapper appends the rank to the namespaces' common prefix.
                sys.executable, os.path.abspath(__file__), "--enter-namespace", ns.name("")]
    cmd += [exe, str(a.min), str(a.max), str(a.factor), str(a.iters), str(a.warmup)]
    times = {}
    for line in run(cmd, a.timeout).splitlines():
        f = line.split()
        if len(f) == 3 and f[0].isdigit():
            if int(f[2]) != 0:
                sys.exit(f"error: MPI gave {f[2]} wrong elements at {f[0]} B ({link})")
            times[int(f[0])] = float(f[1])
    return cmd, times


def main():
    if len(sys.argv) > 3 and sys.argv[1] == "--enter-namespace":
        enter_namespace(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--links", default="shm,loopback", help="comma-separated: shm, loopback, netns")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("-b", "--min", type=size_arg, default=8)
    ap.add_argument("-e", "--max", type=size_arg, default=32 << 20)
    ap.add_argument("-f", "--factor", type=int, default=16)
    ap.add_argument("-n", "--iters", type=int, default=200)
    ap.add_argument("-w", "--warmup", type=int, default=20)
    ap.add_argument("--perf", default=os.path.join(ROOT, "target", "release", "mscclpp-perf"))
    ap.add_argument("--timeout", type=int, default=600, help="seconds per command")
    ap.add_argument("--record", metavar="FILE", help="append the medians as rows to FILE")
    a = ap.parse_args()
    links = a.links.split(",")
    for link in links:
        if link not in ("shm", "loopback", "netns"):
            sys.exit(f"error: unknown link {link!r} (shm, loopback, netns)")
    if not os.access(a.perf, os.X_OK):
        sys.exit(f"error: no perf tool at {a.perf}: cargo build --release -p mscclpp-perf")
    if not shutil.which("mpicc") or not shutil.which("mpirun"):
        sys.exit("error: Open MPI not found: apt-get install openmpi-bin libopenmpi-dev")
    exe = os.path.join(ROOT, "target", "mpi-allreduce")
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    run(["mpicc", "-O2", "-o", exe, MPI_SOURCE], a.timeout)
    version = run(["mpirun", "--version"], 60).splitlines()[0].strip()

    with contextlib.ExitStack() as stack:
        a.namespaces = stack.enter_context(Namespaces()) if "netns" in links else None
        measure(a, links, exe, version)


def measure(a, links, exe, version):
    ours_t = {l: [] for l in links}
    mpi_t = {l: [] for l in links}
    commands = {}
    for r in range(a.rounds):
        # Interleaved, and the order flipped every round, so a slow spell of the machine
        # does not fall on one side.
        for link in links:
            pair = [("ours", ours, a.perf, ours_t), ("mpi", mpi, exe, mpi_t)]
            for name, fn, binary, acc in (pair if r % 2 == 0 else pair[::-1]):
                cmd, t = fn(binary, link, a)
                commands[(name, link)] = cmd
                acc[link].append(t)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)

    commit = run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], 60).strip()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = []
    # Our settings in the environment are part of the command a row records.
    settings = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MSCCLPP_"))
    print(f"# {version}; {a.rounds} rounds; time = median over rounds (us)")
    print(f"{'link':>9} {'size':>10} {'ours':>10} {'mpi':>10} {'mpi/ours':>9}  per round")
    for link in links:
        for size in sorted(ours_t[link][0]):
            o = [t[size] for t in ours_t[link]]
            m = [t[size] for t in mpi_t[link]]
            ratios = [mm / oo for mm, oo in zip(m, o)]
            om, mm = statistics.median(o), statistics.median(m)
            print(f"{link:>9} {size:>10} {om:>10.2f} {mm:>10.2f} {mm / om:>9.3f}  "
                  f"{min(ratios):.3f}-{max(ratios):.3f}")
            rows.append({
                "op": "allreduce", "dtype": "float", "size": size, "ranks": 2,
                "hosts": 1 if link == "shm" else 2, "hosts_simulated": link != "shm",
                "link": link,
                "algorithm": None, "graph": False, "time_us": round(om, 3),
                "busbw_gbps": None, "mpi_time_us": round(mm, 3), "mpi_version": version,
                "mpi_command": public_mpi_command(commands[("mpi", link)]),
                "command": " ".join(settings + ["mscclpp-perf"] + commands[("ours", link)][1:]),
                "commit": commit, "date": date,
                "note": f"scripts/host-vs-mpi.py --links {link}: median of {a.rounds} "
                        f"interleaved rounds, out-of-place; MPI/ours per round "
                        f"{min(ratios):.3f}-{max(ratios):.3f}"
                        + ("; each rank in its own namespace" if link == "netns" else ""),
            })
    if a.record:
        with open(a.record, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"appended {len(rows)} rows to {a.record}", file=sys.stderr)


if __name__ == "__main__":
    main()
