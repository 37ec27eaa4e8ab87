"""Every name the library exports is the project's: a global symbol of
libtokpipe.a starts with tp_ (the public API and what the layers share) or
with the prefix of one module's private header, so no generic name
(truthy, dict_get, u8_len) can clash with a program's or another
library's when the library is linked."""
import os
import subprocess
import unittest

BUILD = os.environ.get("TP_BUILD_DIR", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "build"))

# A private header's functions, shared by its module's files only.
MODULE_PREFIXES = {
    "tc_": "workers/toolcall/tc_internal.h",
    "cv_": "workers/chat/chat_value.h",
    "jgb_": "workers/grammar/jschema_int.h", "jcs_": "workers/grammar/jschema_int.h",
    "js_": "workers/grammar/jschema_int.h", "jdfa_": "workers/grammar/jschema_int.h",
    "jnfa_": "workers/grammar/jschema_int.h", "fmt_": "workers/grammar/jschema_fmt.h",
    "rx_": "workers/grammar/jschema_int.h",
    "schema_": "protocol/schema.h", "mp_": "protocol/schema.h",
}


def exported(lib):
    out = subprocess.run(["nm", "-g", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDRBVW":
            names.add(parts[2])
    return names


class Symbols(unittest.TestCase):
    def test_every_exported_symbol_has_the_projects_prefix(self):
        lib = os.path.join(BUILD, "libtokpipe.a")
        names = exported(lib)
        self.assertGreater(len(names), 500, "too few symbols: is %s the library?" % lib)
        # compiler-made names (sanitizers, ODR indicators) start with "__"
        bad = sorted(n for n in names if not n.startswith(("tp_", "__")) and not n.startswith(tuple(MODULE_PREFIXES)))
        self.assertEqual(bad, [], "exported without tp_ or a module's prefix")

    def test_module_prefixes_name_real_headers(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for prefix, header in MODULE_PREFIXES.items():
            self.assertTrue(os.path.exists(os.path.join(root, header)), "%s: %s" % (prefix, header))


if __name__ == "__main__":
    unittest.main()
