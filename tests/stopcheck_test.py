"""bin/tokpipe stopcheck against Python itself.

* UTF-8: random bytes split into random pieces come back as exactly
  bytes.decode("utf-8", "replace") (the maximal-subpart rule), and the chunks
  always concatenate to the text.
* Stop strings: a brute-force Python reference (scan the whole text after
  every piece; earliest end, then longest) gives the same text, finish reason,
  matched string and token count.
* The harness itself: one output line per input line, errors don't stop it.
"""
import json
import os
import random
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from tpdaemon import MODELS, TOKPIPE, tokenize  # noqa: E402


def stopcheck(lines, *args):
    p = subprocess.run([TOKPIPE, "stopcheck", *args], input="".join(l + "\n" for l in lines),
                       capture_output=True, text=True, timeout=60)
    return p.returncode, [json.loads(l) for l in p.stdout.splitlines()]


def reference(pieces, stops):
    """Final text, finish reason, matched stop and accepted tokens."""
    t = b""
    for count, p in enumerate(pieces):
        u = t + p
        for end in range(len(t) + 1, len(u) + 1):
            hits = [s for s in stops if u[:end].endswith(s)]
            if hits:
                s = max(hits, key=len)
                return u[:end - len(s)].decode("utf-8", "replace"), "stop_string", s, count
        t = u
    return t.decode("utf-8", "replace"), "cancelled", None, len(pieces)


class StopcheckTest(unittest.TestCase):
    def test_invalid_utf8_is_replaced_like_python(self):
        rng = random.Random(7)
        alphabet = [b"a", b" ", "é".encode(), "中".encode(), "😀".encode(),
                    b"\x80", b"\xbf", b"\xc0", b"\xc2", b"\xe0\x80", b"\xed\xa0\x80",
                    b"\xf0\x9f", b"\xf4\x90", b"\xff", b"\xe4\xb8"]
        cases, blobs = [], []
        for _ in range(2000):
            blob = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
            cuts = sorted(rng.sample(range(len(blob) + 1), min(len(blob) + 1, rng.randint(0, 4))))
            bounds = [0] + cuts + [len(blob)]
            pieces = [{"hex": blob[a:b].hex()} for a, b in zip(bounds, bounds[1:])]
            cases.append(json.dumps({"pieces": pieces}))
            blobs.append(blob)
        rc, out = stopcheck(cases)
        self.assertEqual(rc, 0)
        self.assertEqual(len(out), len(cases))
        for blob, res in zip(blobs, out):
            want = blob.decode("utf-8", "replace")
            self.assertEqual(res["text"], want, "bytes %s" % blob.hex())
            self.assertEqual("".join(res["chunks"]), res["text"])
            self.assertEqual(res["finish_reason"], "cancelled")

    def test_stop_strings_match_a_python_reference(self):
        rng = random.Random(11)
        words = ["a", "b", "ab", "ba", " ", "中", "é", "\n", "END", "ING"]
        cases, expect = [], []
        for _ in range(3000):
            pieces = ["".join(rng.choice(words) for _ in range(rng.randint(0, 3)))
                      for _ in range(rng.randint(0, 8))]
            text = "".join(pieces)
            stops = []
            for _ in range(rng.randint(1, 3)):
                if text and rng.random() < 0.7:
                    i = rng.randrange(len(text))
                    stops.append(text[i:i + rng.randint(1, 5)])
                else:
                    stops.append("".join(rng.choice(words) for _ in range(2)))
            cases.append(json.dumps({"pieces": pieces, "stop": stops}, ensure_ascii=False))
            expect.append(reference([p.encode() for p in pieces], [s.encode() for s in stops]))
        rc, out = stopcheck(cases)
        self.assertEqual(rc, 0)
        for case, res, (text, why, matched, count) in zip(cases, out, expect):
            self.assertEqual(res["text"], text, case)
            self.assertEqual(res["finish_reason"], why, case)
            self.assertEqual(res["matched"], matched.decode() if matched else None, case)
            self.assertEqual(res["completion_tokens"], count, case)
            self.assertEqual("".join(res["chunks"]), res["text"], case)

    def test_bad_lines_give_errors_and_the_rest_still_runs(self):
        rc, out = stopcheck(['{"pieces": ["a"], "stop": [""]}', "not json",
                             '{"pieces": ["x"], "stops": ["x"]}',
                             '{"pieces": [{"hex": "6"}]}', '{"pieces": ["ok"], "max_tokens": 0}',
                             '{"pieces": ["Hel", "lo wor", "ld"], "stop": ["o w"]}'])
        self.assertEqual(rc, 1)
        self.assertEqual(len(out), 6)
        self.assertIn("stop[0]", out[0]["error"])
        self.assertIn("JSON", out[1]["error"])
        self.assertIn("stops", out[2]["error"])
        self.assertIn("pieces[0].hex", out[3]["error"])
        self.assertIn("max_tokens", out[4]["error"])
        self.assertEqual(out[5], {"chunks": ["Hel", "l"], "text": "Hell",
                                  "finish_reason": "stop_string", "matched": "o w",
                                  "completion_tokens": 1})

    def test_ids_eos_and_limits(self):
        rc, out = stopcheck([
            '{"pieces": ["a", {"text": "b", "id": 7}], "stop_token_ids": [7]}',
            '{"pieces": ["a", {"text": "", "id": 2}], "eos_token_id": 2}',
            '{"pieces": ["a", {"text": "", "id": 2}, "c"], "eos_token_id": 2, "ignore_eos": true}',
            '{"pieces": ["a", "b", "c"], "max_tokens": 2}',
        ])
        self.assertEqual(rc, 0)
        self.assertEqual([o["finish_reason"] for o in out], ["stop_token", "eos", "cancelled", "length"])
        self.assertEqual([o["matched"] for o in out], [7, 2, None, None])
        self.assertEqual([o["text"] for o in out], ["a", "a", "ac", "ab"])

    def test_tokens_mode_uses_the_tokenizer(self):
        tok = os.path.join(MODELS, "tokenizer.bin")
        rc, out = stopcheck(['{"tokens": [9038, 2501, 263, 931, 2], "stop": ["xyz"]}',
                             '{"tokens": [9038, 2501], "prompt_last_id": 263}',
                             '{"tokens": [32000]}',
                             '{"tokens": [9038, 2, 2501], "stop": ["</s>"], "ignore_eos": true}'],
                            "--tokenizer", tok)
        self.assertEqual(out[0]["text"], "Once upon a time")
        self.assertEqual(out[0]["finish_reason"], "eos")
        self.assertEqual(out[1]["text"], " Once upon")
        self.assertIn("tokens[0]", out[2]["error"])
        # a stop string naming a control token becomes a stop id
        self.assertEqual((out[3]["finish_reason"], out[3]["matched"]), ("stop_token", 2))
        self.assertEqual(rc, 1)

    def test_tokens_mode_reads_a_gguf_vocabulary_like_the_tokenizer_bin(self):
        cases = ['{"tokens": [9038, 2501, 263, 931, 29892, 727, 2], "stop": ["ime,"]}',
                 '{"tokens": [9038, 2501, 263, 931, 2]}',
                 '{"tokens": [403, 407, 261, 378, 2], "stop": ["xyz"]}']
        pairs = [("tokenizer.bin", "llama.cpp-vocab/ggml-vocab-llama-spm.gguf", cases[:2]),
                 ("tok512.bin", "stories260K.gguf", cases[2:])]
        for bin_name, gguf_name, lines in pairs:
            rc_bin, want = stopcheck(lines, "--tokenizer", os.path.join(MODELS, bin_name))
            rc, got = stopcheck(lines, "--tokenizer", os.path.join(MODELS, gguf_name))
            self.assertEqual((rc, rc_bin), (0, 0), got)
            self.assertEqual(got, want, gguf_name)
        self.assertEqual((want[0]["text"], got[0]["finish_reason"]), (got[0]["text"], "eos"))

    def test_trace_shows_bytes_and_held_back_prefix(self):
        rc, out = stopcheck(['{"pieces": ["Hi ", "upo", "n a"], "stop": ["upon a"], "trace": true}'])
        steps = out[0]["steps"]
        self.assertEqual([s["bytes"] for s in steps], ["Hi ".encode().hex(), b"upo".hex(), b"n a".hex()])
        self.assertEqual([s["held"] for s in steps], ["", b"upo".hex(), ""])
        self.assertEqual([s["accepted"] for s in steps], [True, True, False])
        self.assertEqual(steps[-1]["finish"], "stop_string")
        self.assertEqual(out[0]["text"], "Hi ")

    def test_help(self):
        p = subprocess.run([TOKPIPE, "stopcheck", "--help"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0)
        self.assertIn("pieces", p.stdout)
        self.assertIn("include_stop_str_in_output", p.stdout)


def gguf_token_bytes(path, ids):
    """Each id's bytes, decoded one per line (a lone id decodes the same in
    any context for byte-level BPE)."""
    p = subprocess.run([TOKPIPE, "tokenize", "--tokenizer", path, "--decode"],
                       input="".join("%d\n" % i for i in ids).encode(), capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    out = []
    for line in p.stdout.split(b"\n")[:-1]:
        out.append(line.replace(b"\\n", b"\n").replace(b"\\t", b"\t").replace(b"\\\\", b"\\"))
    return out


class StopsOnByteLevelBpe(unittest.TestCase):
    """Stop strings that end inside a multi-byte character split over
    several GPT-2 tokens: the stop stage and its hold-back work on the raw
    bytes the BPE pieces decode to, so the reference above holds unchanged."""

    VOCAB = os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-gpt-2.gguf")
    TEXT = "I like \U0001f999 and \u65e5\u672c\u8a9e text, \u00e9t\u00e9 \U0001f680!\n\u0416\u0416 end"

    def test_stop_strings_ending_inside_multibyte_bpe_tokens(self):
        ids = tokenize(self.VOCAB, self.TEXT)
        pieces = gguf_token_bytes(self.VOCAB, ids)
        data = self.TEXT.encode()
        self.assertEqual(b"".join(pieces), data)
        # token boundaries; a character split over tokens has a boundary
        # strictly inside it
        bounds, pos = set(), 0
        for p in pieces:
            pos += len(p)
            bounds.add(pos)
        split_chars = [i for i in range(len(data)) if (data[i] & 0xC0) == 0x80 and i in bounds]
        self.assertTrue(split_chars, "the text has a character split over tokens")
        stops, chars = [], [m for m in range(len(data) + 1) if m == len(data) or (data[m] & 0xC0) != 0x80]
        for end in chars[1:]:
            if end not in bounds:  # the stop ends inside a token
                for start in (c for c in chars if end - 6 <= c < end):
                    stops.append(data[start:end].decode())
        self.assertGreater(len(stops), 10)
        cases = [json.dumps({"tokens": ids, "stop": [s]}) for s in stops]
        cases += [json.dumps({"tokens": ids, "stop": stops[k:k + 3]}) for k in range(0, len(stops), 3)]
        rc, out = stopcheck(cases, "--tokenizer", self.VOCAB)
        self.assertEqual(rc, 0)
        for case, got in zip(cases, out):
            st = [s.encode() for s in json.loads(case)["stop"]]
            text, reason, matched, count = reference(pieces, st)
            self.assertEqual(got["text"], text, case)
            self.assertEqual(got["finish_reason"], reason, case)
            self.assertEqual(got["matched"], matched.decode(), case)
            self.assertEqual(got["completion_tokens"], count, case)
            self.assertEqual("".join(got["chunks"]), got["text"])


if __name__ == "__main__":
    unittest.main()
