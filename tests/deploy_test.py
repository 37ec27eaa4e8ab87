"""deploy/: the systemd units pass `systemd-analyze verify` (which exits 0
even on problems, so any output fails the test), with ExecStart pointed at
the programs just built. `make install` into a DESTDIR gives a tree whose
programs run and whose units name the installed paths and verify."""
import os
import re
import shutil
import subprocess
import tempfile
import unittest

BIN = os.path.abspath(os.environ.get("TP_BIN_DIR", "bin"))
UNITS = ["tokpiped.service", "tokpipe-worker@.service", "tokpipe.target", "tokpipe-http.service"]
PROGRAMS = ["tokpiped", "tokpipe-worker", "tokpipe", "tokpipe-http"]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def built_unit(d, unit, name=None):
    """deploy/UNIT written into directory d (as name), its programs the ones
    just built; returns the unit's text as shipped."""
    text = read(os.path.join("deploy", unit))
    with open(os.path.join(d, name or unit), "w", encoding="utf-8") as f:
        f.write(text.replace("/usr/local/bin/", BIN + "/"))
    return text


def verify_units(test, d):
    """systemd-analyze verify the units written in directory d."""
    shutil.copy(os.path.join(d, "tokpipe-worker@.service"), os.path.join(d, "tokpipe-worker@forward.0.service"))
    p = subprocess.run(["systemd-analyze", "verify", "tokpiped.service", "tokpipe.target",
                        "tokpipe-worker@forward.0.service", "tokpipe-http.service"],
                       cwd=d, capture_output=True, text=True, timeout=60)
    test.assertEqual(p.returncode, 0, p.stderr)
    test.assertEqual(p.stdout + p.stderr, "", "systemd-analyze complained")


@unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
class DeployUnits(unittest.TestCase):
    def test_units_verify_without_any_complaint(self):
        with tempfile.TemporaryDirectory() as d:
            for u in UNITS:
                text = built_unit(d, u)
                if u.endswith(".service"):
                    self.assertIn("/usr/local/bin/", text, u)
            verify_units(self, d)

    def test_every_service_unit_scores_an_exposure_of_2_or_less(self):
        # issue 9: each unit is hardened to OK on systemd's own scale; a new
        # unit in deploy/ is checked too, so it cannot ship unhardened
        units = sorted(u for u in os.listdir("deploy") if u.endswith(".service"))
        self.assertGreaterEqual(len(units), 2)
        with tempfile.TemporaryDirectory() as d:
            for u in units:
                name = u.replace("@.service", "@x.service")
                built_unit(d, u, name)
                path = os.path.join(d, name)
                p = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", path],
                                   capture_output=True, text=True, timeout=60)
                m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", p.stdout + p.stderr)
                self.assertIsNotNone(m, "no score for %s: %s" % (u, p.stdout + p.stderr))
                self.assertLessEqual(float(m.group(1)), 2.0, "%s scores %s" % (u, m.group(1)))

    def test_broker_unit_is_notify_and_runs_without_spawning(self):
        text = read("deploy/tokpiped.service")
        self.assertIn("Type=notify", text)
        self.assertIn("--no-spawn", text)
        self.assertIn("RuntimeDirectory=tokpipe", text)

    def test_worker_finds_the_broker_sockets_in_the_shared_runtime_directory(self):
        # runtime_dir "" resolves to $RUNTIME_DIRECTORY, set only by RuntimeDirectory=;
        # without it a worker would look in its own private /tmp
        for u in ["tokpiped.service", "tokpipe-worker@.service"]:
            text = read("deploy/" + u)
            self.assertIn("RuntimeDirectory=tokpipe\n", text, u)
            self.assertIn("RuntimeDirectoryPreserve=yes\n", text, u)
        self.assertIn('runtime_dir: ""', read("config/tokpipe.yaml"))

    def test_worker_accepts_the_instance_name_as_its_stage_list(self):
        p = subprocess.run([os.path.join(BIN, "tokpipe-worker"), "--stage", "forward:smaple.0"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown stage 'smaple'", p.stderr)


def make(*args):
    """`make ARGS` in the repository with the programs already built in BIN;
    the make running the tests must not leak its jobserver or variables."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "BIN", "BUILD", "SAN")}
    return subprocess.run(["make", "--no-print-directory", "BIN=" + BIN, *args],
                          capture_output=True, text=True, timeout=60, env=env)


class MakeInstall(unittest.TestCase):
    """`make install DESTDIR=<tmp> PREFIX=/usr` and `make uninstall`."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        self.install()

    def tearDown(self):
        self.tmp.cleanup()

    def install(self, target="install"):
        p = make(target, "DESTDIR=" + self.root, "PREFIX=/usr")
        self.assertEqual(p.returncode, 0, "make %s failed:\n%s%s" % (target, p.stdout, p.stderr))
        return p

    def path(self, rel):
        return os.path.join(self.root, rel.lstrip("/"))

    def test_programs_land_in_bindir_and_answer_help(self):
        for prog in PROGRAMS:
            exe = self.path("/usr/bin/" + prog)
            self.assertTrue(os.access(exe, os.X_OK), exe + " is not an installed executable")
            p = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 0, prog + " --help: " + p.stderr)
            self.assertIn("usage: " + prog, p.stdout, prog + " --help printed no usage line")

    def test_config_and_protocol_doc_are_installed(self):
        self.assertEqual(read(self.path("/etc/tokpipe/tokpipe.yaml")), read("config/tokpipe.yaml"))
        self.assertEqual(read(self.path("/usr/share/doc/tokpipe/PROTOCOL.md")), read("protocol/PROTOCOL.md"))
        self.assertIn("u tokpipe ", read(self.path("/usr/lib/sysusers.d/tokpipe.conf")))

    def test_units_name_the_installed_programs_and_config(self):
        for u in UNITS:
            text = read(self.path("/usr/lib/systemd/system/" + u))
            self.assertNotIn("/usr/local", text, u + " still names /usr/local")
            for exe in re.findall(r"^ExecStart=(\S+)", text, re.M):
                self.assertTrue(os.access(self.path(exe), os.X_OK), "%s: ExecStart %s not installed" % (u, exe))
            for conf in re.findall(r"--config (\S+)", text):
                self.assertTrue(os.path.isfile(self.path(conf)), "%s: --config %s not installed" % (u, conf))
        self.assertIn("ExecStart=/usr/bin/tokpiped --config /etc/tokpipe/tokpipe.yaml",
                      read(self.path("/usr/lib/systemd/system/tokpiped.service")))

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
    def test_installed_units_verify(self):
        with tempfile.TemporaryDirectory() as d:
            for u in UNITS:
                text = read(self.path("/usr/lib/systemd/system/" + u))
                # the programs are under DESTDIR, not yet at /usr/bin
                text = re.sub(r"^ExecStart=/", "ExecStart=" + self.root + "/", text, flags=re.M)
                with open(os.path.join(d, u), "w", encoding="utf-8") as f:
                    f.write(text)
            verify_units(self, d)

    def test_reinstall_keeps_an_edited_config_and_ships_dist(self):
        conf = self.path("/etc/tokpipe/tokpipe.yaml")
        with open(conf, "a", encoding="utf-8") as f:
            f.write("# edited by the operator\n")
        edited = read(conf)
        self.install()
        self.assertEqual(read(conf), edited, "make install overwrote an existing tokpipe.yaml")
        self.assertEqual(read(conf + ".dist"), read("config/tokpipe.yaml"))

    def test_uninstall_removes_everything_but_an_edited_config(self):
        conf = self.path("/etc/tokpipe/tokpipe.yaml")
        with open(conf, "a", encoding="utf-8") as f:
            f.write("# edited by the operator\n")
        self.install("uninstall")
        left = sorted(os.path.relpath(os.path.join(dp, n), self.root)
                      for dp, _, names in os.walk(self.root) for n in names)
        self.assertEqual(left, ["etc/tokpipe/tokpipe.yaml"], "uninstall left files behind")

    def test_uninstall_removes_an_untouched_config(self):
        self.install("uninstall")
        left = [os.path.join(dp, n) for dp, _, names in os.walk(self.root) for n in names]
        self.assertEqual(left, [], "uninstall left files behind")


class HostConfigs(unittest.TestCase):
    """deploy/host-config.sh renders deploy/host.yaml.in for each role of a
    multi-host deployment (README "Several hosts"; deploy/netns-cluster.sh
    and tests/netns_cluster_test.py run them): every placeholder filled,
    and a client's file is one tokpipe reads (it then only misses a broker)."""

    def test_every_role_renders_a_config_tokpipe_reads(self):
        with tempfile.TemporaryDirectory() as d:
            for name in ["broker", "client", "worker"]:
                subprocess.run([os.path.join(BIN, "tokpipe"), "keygen", "--out", os.path.join(d, name)],
                               check=True, capture_output=True, timeout=30)
            for role in ["broker", "worker", "client"]:
                p = subprocess.run(["deploy/host-config.sh", role, "127.0.0.1", d, "/m/model.gguf"],
                                   capture_output=True, text=True, timeout=30)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertNotIn("@", p.stdout, role)
                self.assertIn("back: tcp://127.0.0.1:5556", p.stdout, role)
                with open(os.path.join(d, role + ".yaml"), "w", encoding="utf-8") as f:
                    f.write(p.stdout)
            p = subprocess.run([os.path.join(BIN, "tokpipe"), "stats", "--timeout", "200",
                                "--config", os.path.join(d, "client.yaml")], capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("no reply from tcp://127.0.0.1:5555", p.stderr)

    def test_a_bad_role_is_refused(self):
        p = subprocess.run(["deploy/host-config.sh", "gateway", "127.0.0.1", "/etc/tokpipe"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2)
        self.assertIn("ROLE is broker, worker or client", p.stderr)


if __name__ == "__main__":
    unittest.main()
