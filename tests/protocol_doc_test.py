"""protocol/PROTOCOL.md stays complete: every header key, command and finish
reason the codec knows (read from protocol/schema.c, protocol/names.c and
include/tokpipe/protocol.h) is documented, so a client written from the
document alone can use all of them."""
import re
import unittest

DOC = open("protocol/PROTOCOL.md", encoding="utf-8").read()
SCHEMA = open("protocol/schema.c", encoding="utf-8").read()
HEADER = open("include/tokpipe/protocol.h", encoding="utf-8").read()
NAMES = open("protocol/names.c", encoding="utf-8").read()


class ProtocolDoc(unittest.TestCase):
    def test_every_header_key_is_documented(self):
        keys = set(re.findall(r'\.key = "([a-z_]+)"', SCHEMA))
        keys |= set(re.findall(r'F_(?:U32|U64|I32|I64|BOOL|STR|JOBID)\("([a-z_]+)"', SCHEMA))
        keys |= set(re.findall(r'COUNT\("([a-z_]+)"', SCHEMA))
        self.assertGreater(len(keys), 60, "schema keys not found: the regex is stale")
        missing = sorted(k for k in keys if "`%s`" % k not in DOC and not re.search(r"[{ ,]%s[:,}?]" % k, DOC))
        self.assertEqual(missing, [], "keys the codec accepts but PROTOCOL.md does not name")

    def test_every_command_is_documented_with_its_byte(self):
        cmds = re.findall(r"TP_CMD_([A-Z_]+) = (0x[0-9A-F]{2})", HEADER)
        self.assertGreater(len(cmds), 25)
        for name, byte in cmds:
            self.assertIn("`%s`" % byte.lower().replace("0x", "0x"), DOC.lower(), "command byte %s (%s)" % (byte, name))
            self.assertIn(name, DOC, "command %s" % name)

    def test_every_status_code_and_reason_is_documented(self):
        for code in re.findall(r"TP_ST_[A-Z_]+ = (\d+)", HEADER):
            self.assertRegex(DOC, r"\| %s \|" % code)
        reasons = re.search(r"reason_names\[TP_REASON_COUNT\] = \{(.*?)\}", NAMES, re.S).group(1)
        for r in re.findall(r'"([a-z_]+)"', reasons):
            self.assertIn("`%s`" % r, DOC)

    def test_caps_in_the_doc_match_the_header(self):
        self.assertIn("#define TP_PROTO_MAX_OBJECTS 65536", HEADER)
        self.assertIn("| msgpack objects in one header | 65536 |", DOC)
        self.assertIn("#define TP_PROTO_MAX_JOB_ID 64", HEADER)
        self.assertIn("| job id | 1–64 bytes", DOC)
        self.assertIn("#define TP_PROTO_MAX_STOP 4096", HEADER)
        self.assertIn("| stop strings per job | 4096", DOC)


if __name__ == "__main__":
    unittest.main()
