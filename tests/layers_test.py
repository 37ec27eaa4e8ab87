"""The daemon's files call only downward (tests/support/layers.py): no file
of daemon/ calls a function of a file that, directly or around a loop,
calls it, and none is over 700 lines. The checker itself is tried on two
fixtures: the same three files with a circle and without. The model room
(model/) sits below the stages: it includes only public headers and its
own, and its internal arch.h is read by nobody above it."""
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


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


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
