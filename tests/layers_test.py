"""The daemon's files call only downward (tests/support/layers.py): no file
of daemon/ calls a function of a file that, directly or around a loop,
calls it, and none is over 700 lines. The checker itself is tried on two
fixtures: the same three files with a circle and without.

The library's low layers include only downward: common/ nothing of the
project above it, protocol/ itself and common/, config/ itself and
common/, net/ (the protocol on sockets) those three; each public header
counts as a file of the layer that owns it. The model room (model/) sits
below the stages: it includes only public headers and its own, and its
internal arch.h is read by nobody above it."""
import glob
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHECK = os.path.join(HERE, "support", "layers.py")
FIXTURE = os.path.join(HERE, "support", "layers_fixture")


def check(directory, *args):
    r = subprocess.run([sys.executable, CHECK, directory, *args], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


# Which layer owns each public header of the low layers, and what each
# layer may include. A header not listed belongs to a layer above these.
OWNER = {"buf": "common", "error": "common", "rand": "common", "utf8": "common", "isa": "common",
         "limits": "common", "heap": "common", "proc": "common", "protocol": "protocol", "config": "config", "zwire": "net", "zsec": "net"}
MAY_INCLUDE = {"common": {"common"}, "protocol": {"common", "protocol"}, "config": {"common", "config"},
               "net": {"common", "protocol", "config", "net"}}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def upward_includes():
    """(file, header, its layer) for every include that goes up."""
    files = []
    for layer in MAY_INCLUDE:
        d = os.path.join(ROOT, layer)
        files += [(os.path.join(d, f), layer) for f in sorted(os.listdir(d)) if f.endswith((".c", ".h"))]
    files += [(os.path.join(ROOT, "include", "tokpipe", h + ".h"), layer) for h, layer in OWNER.items()]
    bad = []
    for path, layer in files:
        with open(path, encoding="utf-8") as f:
            for inc in INCLUDE.findall(f.read()):
                if "/" not in inc:  # the layer's own private header, beside it
                    continue
                name = os.path.splitext(os.path.basename(inc))[0]
                owner = OWNER.get(name, "a layer above") if inc.startswith("tokpipe/") else "outside the library"
                if owner not in MAY_INCLUDE[layer]:
                    bad.append((os.path.relpath(path, ROOT), inc, owner))
    return bad


class Includes(unittest.TestCase):
    def test_common_protocol_config_and_net_include_only_downward(self):
        self.assertEqual(upward_includes(), [], "files including a header of a layer above theirs")

    def test_every_header_owned_here_exists(self):
        for h in OWNER:
            self.assertTrue(os.path.exists(os.path.join(ROOT, "include", "tokpipe", h + ".h")), h)


class Layers(unittest.TestCase):
    def test_daemon_has_no_circle_and_no_file_over_700_lines(self):
        rc, out = check(os.path.join(ROOT, "daemon"), "--max-lines", "700")
        self.assertEqual(rc, 0, out)
        # broker.c is the top floor (only main.c above it), the job table near the ground
        floors = {f: int(line.split(":")[0].split()[1]) for line in out.splitlines() for f in line.split(":")[1].split()}
        self.assertEqual(max(floors, key=floors.get), "main.c", out)
        self.assertEqual(floors["broker.c"], floors["main.c"] - 1, out)
        for low in ("jobs.c", "joblp.c", "metrics.c", "log.c", "outbox.c"):
            self.assertLessEqual(floors[low], 1, out)

    def test_each_daemon_file_includes_only_the_headers_of_floors_under_it(self):
        rc, out = check(os.path.join(ROOT, "daemon"))
        self.assertEqual(rc, 0, out)
        floors = {f: int(line.split(":")[0].split()[1]) for line in out.splitlines() for f in line.split(":")[1].split()}
        source_of = {"route.h": "route_prefix.c", "outbox.h": "outbox.c"}  # a header named for its floor, not its file
        d = os.path.join(ROOT, "daemon")
        headers = [h for h in os.listdir(d) if h.endswith(".h")]
        self.assertNotIn("broker.h", [h for h in headers if len(open(os.path.join(d, h)).read()) > 4000],
                         "broker.h holds the top floor's functions only")
        for f, floor in floors.items():
            with open(os.path.join(d, f), encoding="utf-8") as fh:
                incs = [i for i in INCLUDE.findall(fh.read()) if "/" not in i]
            for inc in incs:
                src = source_of.get(inc, inc[:-2] + ".c")
                # jobs.h is the job table's, whose files are jobs.c, joblp.c and jobfields.c
                if inc == "state.h" or src == f or src not in floors or (inc == "jobs.h" and f.startswith("job")):
                    continue
                self.assertLess(floors[src], floor, "%s (floor %d) includes %s of %s (floor %d)"
                                % (f, floor, inc, src, floors[src]))
        # the broker's state is in state.h; every floor's functions in its own header
        for c in floors:
            h = {"route_prefix.c": "route.h"}.get(c, c[:-2] + ".h")
            if c not in ("main.c", "joblp.c", "jobfields.c"):
                self.assertIn(h, headers, "%s has no header of its own" % c)

    def test_a_circle_is_found_and_named_with_its_calls(self):
        rc, out = check(os.path.join(FIXTURE, "circle"))
        self.assertEqual(rc, 1, out)
        self.assertIn("circle: loop.c <-> notify.c <-> table.c", out)
        self.assertIn("table.c calls notify.c: table_put -> notify_changed", out)
        self.assertIn("notify.c calls loop.c: notify_changed -> loop_wake", out)
        self.assertIn("loop.c calls table.c: loop_run -> table_put", out)

    def test_the_same_files_without_the_circle_pass_with_their_floors(self):
        rc, out = check(os.path.join(FIXTURE, "floors"))
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.splitlines(), ["floor 0: notify.c table.c", "floor 1: loop.c"])

    def test_a_file_over_the_line_limit_fails(self):
        rc, out = check(os.path.join(FIXTURE, "floors"), "--max-lines", "5")
        self.assertEqual(rc, 1, out)
        self.assertIn("loop.c: 10 lines, the limit is 5", out)


class ModelRoom(unittest.TestCase):
    def includes(self, path):
        with open(path, encoding="utf-8") as f:
            return INCLUDE.findall(f.read())

    def test_model_includes_only_public_headers_and_its_own(self):
        files = glob.glob(os.path.join(ROOT, "model", "*.[ch]"))
        self.assertTrue(files, "model/ has sources")
        for path in files:
            for inc in self.includes(path):
                ok = inc.startswith("tokpipe/") or os.path.exists(os.path.join(ROOT, "model", inc))
                self.assertTrue(ok, "%s includes \"%s\", which is neither a public header nor model/'s"
                                % (os.path.relpath(path, ROOT), inc))

    def test_nothing_above_model_reads_its_internal_header(self):
        for top in ("common", "protocol", "config", "workers", "daemon", "http", "tools"):
            for path in glob.glob(os.path.join(ROOT, top, "**", "*.[ch]"), recursive=True):
                for inc in self.includes(path):
                    self.assertNotIn("model/", inc, "%s reaches into model/'s internals with \"%s\""
                                     % (os.path.relpath(path, ROOT), inc))


if __name__ == "__main__":
    unittest.main()
