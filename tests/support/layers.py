#!/usr/bin/python3
"""Which file of a C directory calls which, and is there a circle?

    layers.py DIR [--max-lines N]

Reads every DIR/*.c (comments, strings and preprocessor lines stripped),
finds the functions each file defines (not `static`: those stay in their
file) and the names each function body mentions. File A depends on file B
when a body in A names a function defined in B, called or passed as a
pointer. Exits 1, printing each circle with the calls that close it, when
some file depends on itself through others (A -> B -> ... -> A), or when a
file is longer than N lines; else prints the floors, lowest first, and
exits 0. No compiler needed: the daemon's sources are plain C11 without
function-like macros that hide calls.
"""
import os
import re
import sys

TOKEN = re.compile(r"[A-Za-z_]\w*|\S")


def strip(src):
    """The source without comments, literals and preprocessor lines."""
    out, i, n = [], 0, len(src)
    at_line_start = True
    while i < n:
        c = src[i]
        if at_line_start and c == "#":
            # a directive, with its continuation lines
            while i < n and src[i] != "\n":
                i += 2 if src[i] == "\\" else 1
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
            continue
        if src.startswith("//", i):
            while i < n and src[i] != "\n":
                i += 1
            continue
        if c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(" 0 ")
            i = j + 1
            at_line_start = False
            continue
        out.append(c)
        if c == "\n":
            at_line_start = True
        elif not c.isspace():
            at_line_start = False
        i += 1
    return "".join(out)


def match(toks, i, open_, close):
    """Index of the token closing the one at i."""
    depth = 0
    for k in range(i, len(toks)):
        if toks[k] == open_:
            depth += 1
        elif toks[k] == close:
            depth -= 1
            if depth == 0:
                return k
    return len(toks) - 1


def functions(src):
    """[(name, is_static, set of identifiers in the body)] of one file."""
    toks = TOKEN.findall(strip(src))
    found, i, stmt_start = [], 0, 0
    while i < len(toks):
        t = toks[i]
        if t in (";", "}"):
            stmt_start = i + 1
        elif t == "{":
            # a brace at file level that is no function body (struct, enum,
            # initializer): skip it whole
            i = match(toks, i, "{", "}")
            stmt_start = i + 1
        elif re.match(r"[A-Za-z_]", t) and i + 1 < len(toks) and toks[i + 1] == "(":
            close = match(toks, i + 1, "(", ")")
            if close + 1 < len(toks) and toks[close + 1] == "{":
                end = match(toks, close + 1, "{", "}")
                body = {x for x in toks[close + 2:end] if re.match(r"[A-Za-z_]", x)}
                found.append((t, "static" in toks[stmt_start:i], body))
                i = end
                stmt_start = i + 1
            else:
                i = close
        i += 1
    return found


def graph(directory):
    """{file: {callee file: set of 'caller -> callee'}} and line counts."""
    files = sorted(f for f in os.listdir(directory) if f.endswith(".c"))
    defs, bodies, lines = {}, {}, {}
    for f in files:
        with open(os.path.join(directory, f), encoding="utf-8", errors="replace") as fh:
            src = fh.read()
        lines[f] = src.count("\n")
        bodies[f] = functions(src)
        for name, static, _ in bodies[f]:
            if not static:
                defs.setdefault(name, f)
    edges = {f: {} for f in files}
    for f in files:
        local = {name for name, _, _ in bodies[f]}
        for name, _, body in bodies[f]:
            for ident in body:
                g = defs.get(ident)
                if g and g != f and ident not in local:
                    edges[f].setdefault(g, set()).add(f"{name} -> {ident}")
    return edges, lines


def circles(edges):
    """Strongly connected groups of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def floors(edges):
    """Each file's floor: 0 calls no other file, else 1 + its highest callee's."""
    memo = {}

    def floor(v):
        if v not in memo:
            memo[v] = 0
            memo[v] = 1 + max((floor(w) for w in edges[v]), default=-1)
        return memo[v]

    return {v: floor(v) for v in edges}


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    directory, max_lines = argv[1], None
    if len(argv) == 4 and argv[2] == "--max-lines":
        max_lines = int(argv[3])
    elif len(argv) != 2:
        print("usage: layers.py DIR [--max-lines N]", file=sys.stderr)
        return 2
    edges, lines = graph(directory)
    bad = False
    for group in circles(edges):
        bad = True
        print("circle: " + " <-> ".join(group))
        for a in group:
            for b in group:
                for call in sorted(edges[a].get(b, ())):
                    print(f"  {a} calls {b}: {call}")
    if max_lines is not None:
        for f, n in sorted(lines.items()):
            if n > max_lines:
                bad = True
                print(f"{f}: {n} lines, the limit is {max_lines}")
    if bad:
        return 1
    fl = floors(edges)
    for level in range(max(fl.values(), default=-1) + 1):
        names = sorted(f for f, v in fl.items() if v == level)
        print(f"floor {level}: " + " ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
