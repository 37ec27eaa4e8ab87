"""deploy/: the systemd units pass `systemd-analyze verify` (which exits 0
even on problems, so any output fails the test), with ExecStart pointed at
the programs just built."""
import os
import shutil
import subprocess
import tempfile
import unittest

BIN = os.path.abspath(os.environ.get("TP_BIN_DIR", "bin"))
UNITS = ["tokpiped.service", "tokpipe-worker@.service", "tokpipe.target"]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


@unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
class DeployUnits(unittest.TestCase):
    def test_units_verify_without_any_complaint(self):
        with tempfile.TemporaryDirectory() as d:
            for u in UNITS:
                text = read(os.path.join("deploy", u))
                if u.endswith(".service"):
                    self.assertIn("/usr/local/bin/", text, u)
                with open(os.path.join(d, u), "w", encoding="utf-8") as f:
                    f.write(text.replace("/usr/local/bin/", BIN + "/"))
            shutil.copy(os.path.join(d, "tokpipe-worker@.service"), os.path.join(d, "tokpipe-worker@forward.0.service"))
            p = subprocess.run(["systemd-analyze", "verify", "tokpiped.service", "tokpipe.target",
                                "tokpipe-worker@forward.0.service"],
                               cwd=d, capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout + p.stderr, "", "systemd-analyze complained")

    def test_broker_unit_is_notify_and_runs_without_spawning(self):
        text = read("deploy/tokpiped.service")
        self.assertIn("Type=notify", text)
        self.assertIn("--no-spawn", text)
        self.assertIn("RuntimeDirectory=tokpipe", text)

    def test_worker_accepts_the_instance_name_as_its_stage_list(self):
        p = subprocess.run([os.path.join(BIN, "tokpipe-worker"), "--stage", "forward:smaple.0"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown stage 'smaple'", p.stderr)


if __name__ == "__main__":
    unittest.main()
