#!/usr/bin/python3
"""Every third-party module the tests and scripts use must come from a
package scripts/install-deps.sh installs, so a fresh machine passes
`make check` (issue 21: numpy and jinja2 were only there by chance).

Python: the imports of every .py file under tests/ and scripts/ (read with
ast, so imports inside functions count), less the standard library
(sys.stdlib_module_names) and the files' own modules, are looked up in
DEBIAN below; the package must be in install-deps.sh's PKGS list. A module
not in the table is itself an error: add its Debian package to both.

Node: the modules tests/support/*.cjs require(), less node's built-ins
and relative paths, must be ones a test installs itself with
`npm install ... NAME@VERSION` (the openai client is, into $BUILD/npm).

Usage: scripts/check-test-deps.py [--root DIR]   (exit 1 naming each gap)"""
import argparse
import ast
import os
import re
import sys

# import name -> the Debian 12 package that provides it
DEBIAN = {
    "zmq": "python3-zmq",
    "msgpack": "python3-msgpack",
    "numpy": "python3-numpy",
    "jinja2": "python3-jinja2",
    "markupsafe": "python3-markupsafe",
    "sentencepiece": "python3-sentencepiece",
    "jsonschema": "python3-jsonschema",
    "yaml": "python3-yaml",
}

# node's built-in modules (require("fs") or require("node:fs"))
NODE_BUILTINS = {
    "assert", "buffer", "child_process", "crypto", "events", "fs", "http", "https", "net", "os", "path",
    "process", "readline", "stream", "string_decoder", "timers", "url", "util", "zlib",
}


def py_files(root):
    for top in ("tests", "scripts"):
        for d, _, names in os.walk(os.path.join(root, top)):
            for n in sorted(names):
                if n.endswith(".py"):
                    yield os.path.join(d, n)


def imports_of(path):
    """Top-level names of the absolute imports in one file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def installed_packages(root):
    """The words of the PKGS=( ... ) list and PKGS+=(...) lines of install-deps.sh."""
    with open(os.path.join(root, "scripts", "install-deps.sh"), encoding="utf-8") as f:
        text = f.read()
    pkgs = set()
    for body in re.findall(r"PKGS\+?=\(([^)]*)\)", text):
        for line in body.splitlines():
            pkgs.update(line.split("#", 1)[0].split())
    return pkgs


def python_gaps(root):
    files = list(py_files(root))
    local = {os.path.splitext(os.path.basename(p))[0] for p in files}
    pkgs = installed_packages(root)
    gaps = []
    for path in files:
        rel = os.path.relpath(path, root)
        for mod in sorted(set(imports_of(path))):
            if mod in sys.stdlib_module_names or mod in local:
                continue
            deb = DEBIAN.get(mod)
            if deb is None:
                gaps.append("%s imports '%s': no Debian package known for it (add it to DEBIAN in %s "
                            "and to scripts/install-deps.sh)" % (rel, mod, os.path.basename(__file__)))
            elif deb not in pkgs:
                gaps.append("%s imports '%s': its package %s is not in scripts/install-deps.sh" % (rel, mod, deb))
    return gaps


def node_gaps(root):
    support = os.path.join(root, "tests", "support")
    npm = set()
    for d in ("tests", os.path.join("tests", "support")):
        d_abs = os.path.join(root, d)
        for n in sorted(os.listdir(d_abs)) if os.path.isdir(d_abs) else []:
            if n.endswith(".py"):
                with open(os.path.join(d_abs, n), encoding="utf-8") as f:
                    for line in f:
                        if "npm" in line and "install" in line:
                            npm.update(re.findall(r'"((?:@[\w.-]+/)?[\w.-]+)@[^"]+"', line))
    gaps = []
    for n in sorted(os.listdir(support)) if os.path.isdir(support) else []:
        if not n.endswith(".cjs"):
            continue
        with open(os.path.join(support, n), encoding="utf-8") as f:
            text = f.read()
        for mod in sorted(set(re.findall(r"""require\(\s*["']([^"']+)["']\s*\)""", text))):
            if mod.startswith((".", "/", "node:")) or mod.split("/")[0] in NODE_BUILTINS:
                continue
            name = "/".join(mod.split("/")[:2]) if mod.startswith("@") else mod.split("/")[0]
            if name not in npm:
                gaps.append("tests/support/%s requires '%s': no test installs it (npm install %s@VERSION)"
                            % (n, mod, name))
    return gaps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="the repository to check (default: this one)")
    root = ap.parse_args().root
    gaps = python_gaps(root) + node_gaps(root)
    for g in gaps:
        print("check-test-deps: " + g, file=sys.stderr)
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
