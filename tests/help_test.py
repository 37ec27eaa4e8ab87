"""Every option a program accepts is named in its --help: the options are
read from the sources (string literals compared against argv, getopt_long
tables, and the shared flag parsers each command calls), so a new flag
without a help line fails here."""
import glob
import os
import re
import subprocess
import unittest

BIN = os.path.abspath(os.environ.get("TP_BIN_DIR", "bin"))
SHARED = {  # function a command calls -> the file whose flags it then accepts
    "genopts_parse_one": "tools/genopts.c",
    "tp_client_parse_arg": "tools/client.c",
    "tp_client_cmd_parse": "tools/client.c",
}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def options_in(text):
    opts = set(re.findall(r'"(--[a-z][a-z0-9-]*)"', text))
    opts |= {"--" + o for o in re.findall(r'\{"([a-z][a-z0-9-]*)",\s*(?:no|required|optional)_argument', text)}
    return opts - {"--help"}


def accepted(path):
    text = read(path)
    opts = options_in(text)
    for fn, src in SHARED.items():
        if fn + "(" in text and src != path:
            opts |= options_in(read(src))
    return opts


def help_text(*argv):
    p = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout


class HelpNamesEveryOption(unittest.TestCase):
    def check(self, argv, source):
        opts = accepted(source)
        rc, out = help_text(*argv)
        name = " ".join(os.path.basename(a) for a in argv)
        self.assertEqual(rc, 0, name + " --help failed")
        missing = sorted(o for o in opts if not re.search(re.escape(o) + r"(?![a-z0-9-])", out))
        self.assertEqual(missing, [], "%s accepts options its --help does not name" % name)

    def test_daemon(self):
        self.assertIn("--no-spawn", accepted("daemon/main.c"), "option scan found nothing: regex stale")
        self.check([os.path.join(BIN, "tokpiped")], "daemon/main.c")

    def test_gateway(self):
        self.assertIn("--port", accepted("http/main.c"), "option scan found nothing: regex stale")
        self.check([os.path.join(BIN, "tokpipe-http")], "http/main.c")

    def test_worker(self):
        self.check([os.path.join(BIN, "tokpipe-worker")], "workers/worker_main.c")

    def test_keygen_help_names_the_key_lists_of_each_role(self):
        """README "CURVE": client keys go to client_keys, worker keys to
        worker_keys (authorized_keys is the old setting tokpiped warns about)."""
        rc, out = help_text(os.path.join(BIN, "tokpipe"), "keygen")
        self.assertEqual(rc, 0)
        self.assertIn("security.client_keys", out)
        self.assertIn("security.worker_keys", out)

    def test_every_subcommand(self):
        cmds = sorted(re.match(r"tools/cmd_(\w+)\.c", p).group(1) for p in glob.glob("tools/cmd_*.c"))
        self.assertIn("run", cmds)
        rc, top = help_text(os.path.join(BIN, "tokpipe"))
        self.assertEqual(rc, 0)
        for c in cmds:
            with self.subTest(command=c):
                self.assertRegex(top, r"\n  %s " % c.replace("_", "-"), "tokpipe --help does not list " + c)
                self.check([os.path.join(BIN, "tokpipe"), c], "tools/cmd_%s.c" % c)


if __name__ == "__main__":
    unittest.main()
