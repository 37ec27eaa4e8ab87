"""scripts/check-test-deps.py: every third-party module the tests import
comes from a package scripts/install-deps.sh installs (issue 21: numpy and
jinja2 did not, and a fresh Debian 12 failed `make check`). The repository
itself passes; small made-up trees show that each kind of gap fails,
naming the file, the module and the package."""
import os
import subprocess
import tempfile
import textwrap
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CHECK = os.path.join(ROOT, "scripts", "check-test-deps.py")


def check(root=ROOT):
    p = subprocess.run(["/usr/bin/python3", CHECK, "--root", root], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr


class Tree:
    """A throwaway repository layout: files {path: text}."""

    def __init__(self, files):
        self.tmp = tempfile.TemporaryDirectory(prefix="tp-deps-")
        for path, text in files.items():
            full = os.path.join(self.tmp.name, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(textwrap.dedent(text))

    def __enter__(self):
        return self.tmp.name

    def __exit__(self, *exc):
        self.tmp.cleanup()


DEPS = 'PKGS=(\n  python3 python3-zmq   # comment\n  python3-msgpack\n)\ntrue || PKGS+=(npm)\n'


class CheckTestDeps(unittest.TestCase):
    def test_the_repository_installs_every_module_its_tests_import(self):
        rc, err = check()
        self.assertEqual(rc, 0, err)

    def test_a_module_whose_package_is_not_installed_fails_naming_both(self):
        with Tree({"scripts/install-deps.sh": DEPS,
                   "tests/a_test.py": "import zmq\nimport os\n\ndef f():\n    import numpy as np\n"}) as root:
            rc, err = check(root)
        self.assertEqual(rc, 1)
        self.assertIn("tests/a_test.py imports 'numpy'", err)
        self.assertIn("python3-numpy is not in scripts/install-deps.sh", err)
        self.assertNotIn("zmq", err)

    def test_an_unknown_third_party_module_fails_naming_it(self):
        with Tree({"scripts/install-deps.sh": DEPS,
                   "tests/support/helper.py": "from requests.adapters import HTTPAdapter\n",
                   "tests/b_test.py": "import helper\nfrom msgpack import packb\nimport json, http.client\n"}) as root:
            rc, err = check(root)
        self.assertEqual(rc, 1)
        self.assertIn("tests/support/helper.py imports 'requests': no Debian package known", err)
        self.assertNotIn("helper'", err)   # a local module is not third-party
        self.assertEqual(err.count("check-test-deps:"), 1, err)

    def test_stdlib_local_and_relative_imports_pass(self):
        with Tree({"scripts/install-deps.sh": DEPS,
                   "scripts/tool.py": "import argparse, ast\nfrom . import x\n",
                   "tests/support/mine.py": "X = 1\n",
                   "tests/c_test.py": "import mine\nimport concurrent.futures\nimport zmq\n"}) as root:
            rc, err = check(root)
        self.assertEqual((rc, err), (0, ""))

    def test_a_node_module_no_test_installs_fails(self):
        files = {"scripts/install-deps.sh": DEPS,
                 "tests/support/client.cjs": 'const fs = require("node:fs");\nconst A = require("openai");\n'
                                             'const B = require("left-pad");\nconst C = require("./local");\n',
                 "tests/n_test.py": 'CMD = ["npm", "install", "--prefix", "x", "openai@4"]\n'}
        with Tree(files) as root:
            rc, err = check(root)
        self.assertEqual(rc, 1)
        self.assertIn("tests/support/client.cjs requires 'left-pad'", err)
        self.assertNotIn("'openai'", err)
        self.assertNotIn("./local", err)


if __name__ == "__main__":
    unittest.main()
