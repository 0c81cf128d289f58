#!/usr/bin/env python3
"""Checks that the top-level modules of a crate form layers: no import cycle among them.

Usage: scripts/check-layers.py [--allow CRATE_SRC:FROM:TO ...] CRATE_SRC [CRATE_SRC ...]
       (e.g. host/src device/src)

Every `crate::<module>` path in a file of another top-level module is an edge (a `use` or
an inline path; comments and string literals are skipped). Tests may use any module: files
named `tests.rs`, `*_tests.rs` or `tests_*.rs` and a file's `#[cfg(test)] mod` at its end
are left out.

`--allow host/src:FROM:TO` leaves out one edge still to be removed (a redesign's list,
shrinking; empty now); an allowed edge that no longer exists is an error too, so
that the list cannot go stale. A cycle is printed with one
file and line per edge, and the exit status is 1. Prints the layers (each module after
everything it uses) when there is none.
"""

import re
import sys
from pathlib import Path

# `crate::module` (a `use` or an inline path), or `crate::{` opening a group.
PATH = re.compile(r"\bcrate::(\{|[a-z_][a-z0-9_]*)")


def group_heads(text, start):
    """The first segment of each item of the `{...}` group opening at `start` (nested
    groups and line breaks allowed): `{a::X, b::{Y, Z}}` gives a and b."""
    heads, depth, item, i = [], 0, "", start
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
            if depth > 1:
                item += c
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
            item += c
        elif c == "," and depth == 1:
            heads.append(item)
            item = ""
        else:
            item += c
        i += 1
    heads.append(item)
    return [h.strip().split("::")[0].strip() for h in heads if h.strip()]


def strip(text):
    """The text without comments and string literals (kept line for line)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"' or (c == "r" and re.match(r'r#*"', text[i:i + 8]) and not text[i - 1:i].isalnum()):
            m = re.match(r'r(#*)"', text[i:])
            if m:
                end = '"' + m.group(1)
                j = text.find(end, i + len(m.group(0)))
                j = n if j < 0 else j + len(end)
            else:
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def top_module(src, path):
    rel = path.relative_to(src)
    if len(rel.parts) == 1:
        return rel.stem  # lib.rs or a one-file module
    return rel.parts[0]


def edges(src):
    found = {}
    for path in sorted(src.rglob("*.rs")):
        me = top_module(src, path)
        name = path.stem
        if me in ("lib", "main") or name == "tests" or name.endswith("_tests") or name.startswith("tests_"):
            continue
        text = strip(path.read_text())
        test_mod = re.search(r"^\s*#\[cfg\(test\)\]\s*\n\s*(pub(\([a-z]+\))?\s+)?mod\s", text, re.M)
        if test_mod:
            text = text[:test_mod.start()]
        for m in PATH.finditer(text):
            names = group_heads(text, m.start(1)) if m.group(1) == "{" else [m.group(1)]
            lineno = text.count("\n", 0, m.start()) + 1
            for other in names:
                is_module = (src / f"{other}.rs").exists() or (src / other).is_dir()
                if other != me and is_module:
                    found.setdefault((me, other), f"{path}:{lineno}")
    return found


def cycles(nodes, found):
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {n: sorted(b for (a, b) in found if a == n) for n in nodes}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return out


def layers(nodes, found):
    done, order = set(), []
    while len(done) < len(nodes):
        layer = sorted(n for n in nodes if n not in done
                       and all(b in done for (a, b) in found if a == n))
        order.append(layer)
        done |= set(layer)
    return order


def main(args):
    allowed = set()
    while args[:1] == ["--allow"] and len(args) > 1:
        parts = args[1].split(":")
        if len(parts) != 3:
            print(f"--allow {args[1]}: expected CRATE_SRC:FROM:TO", file=sys.stderr)
            return 2
        allowed.add(tuple(parts))
        args = args[2:]
    if not args:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    bad = False
    for (crate, a, b) in sorted(allowed):
        if crate not in args:
            print(f"--allow {crate}:{a}:{b}: {crate} is not checked", file=sys.stderr)
            bad = True
    for arg in args:
        src = Path(arg)
        found = edges(src)
        for (crate, a, b) in sorted(allowed):
            if crate == arg:
                if (a, b) in found:
                    print(f"{src}: allowed for now: {a} -> {b}  ({found.pop((a, b))})")
                else:
                    print(f"{src}: {a} -> {b} is allowed but no longer there: drop it")
                    bad = True
        nodes = sorted({a for a, _ in found} | {b for _, b in found})
        comps = cycles(nodes, found)
        if comps:
            bad = True
            for comp in comps:
                print(f"{src}: import cycle among {', '.join(comp)}:")
                for (a, b), at in sorted(found.items()):
                    if a in comp and b in comp:
                        print(f"  {a} -> {b}  ({at})")
        else:
            print(f"{src}: no import cycle; layers, bottom first:")
            for layer in layers(nodes, found):
                print(f"  {' '.join(layer)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
