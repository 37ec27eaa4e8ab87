"""tokpipe grammar --json-schema against python3-jsonschema (Draft 2020-12,
formats checked).

* The 2020-12 cases (tests/support/jschema_2020_12.json, which the C suite
  test runs through the grammar) say valid exactly where jsonschema does.
* Random sentences of each compiled grammar (a small GBNF generator here,
  sharing nothing with the compiler) are JSON that jsonschema validates,
  with object keys in the schema's `properties` order, dates and times that
  are real calendar days and clock times, and bounded whitespace.
* Refused schemas exit 2 naming the keyword.
"""
import datetime
import json
import os
import random
import re
import subprocess
import sys
import unittest

import jsonschema

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from tpdaemon import TOKPIPE  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
V = jsonschema.Draft202012Validator


def compile_schema(schema):
    p = subprocess.run([TOKPIPE, "grammar", "--json-schema", "-"], input=json.dumps(schema),
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


# ---- a random sentence generator for GBNF (llama.cpp's dialect) ----------

TOKEN = re.compile(r'''\s*(?:(?P<name>[A-Za-z0-9_-]+)\s*(?P<def>::=)?|(?P<lit>"(?:\\.|[^"\\])*")|(?P<cls>\[(?:\\.|[^\]\\])*\])|(?P<op>[()|*+?])|(?P<rep>\{\d+(?:,\d*)?\}))''')


def unescape(body):
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            e = body[i + 1]
            n = {"x": 2, "u": 4, "U": 8}.get(e)
            if n:
                out.append(chr(int(body[i + 2:i + 2 + n], 16)))
                i += 2 + n
                continue
            out.append({"n": "\n", "t": "\t", "r": "\r"}.get(e, e))
            i += 2
            continue
        out.append(c)
        i += 1
    return out


def parse_class(text):
    body = unescape_marked(text[1:-1])
    neg = bool(body) and body[0] == ("^", False)
    if neg:
        body = body[1:]
    ranges, i = [], 0
    while i < len(body):
        lo = body[i][0]
        if i + 2 < len(body) and body[i + 1] == ("-", False):
            ranges.append((ord(lo), ord(body[i + 2][0])))
            i += 3
        else:
            ranges.append((ord(lo), ord(lo)))
            i += 1
    return ("cls", neg, ranges)


def unescape_marked(body):
    """Characters with a flag: escaped (so '^' or '-' lose their meaning)."""
    out, i = [], 0
    while i < len(body):
        if body[i] == "\\":
            ch = unescape(body[i:i + 2 + {"x": 2, "u": 4, "U": 8}.get(body[i + 1], 0)])
            step = 2 + {"x": 2, "u": 4, "U": 8}.get(body[i + 1], 0)
            out.append((ch[0], True))
            i += step
        else:
            out.append((body[i], False))
            i += 1
    return out


def parse_gbnf(text):
    text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    toks, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = TOKEN.match(text, pos)
        if not m:
            raise ValueError("cannot read GBNF at %r" % text[pos:pos + 40])
        toks.append(m)
        pos = m.end()
    rules, i = {}, 0

    def alts(i):
        out = []
        while True:
            seq, i = sequence(i)
            out.append(seq)
            if i < len(toks) and toks[i].group("op") == "|":
                i += 1
                continue
            return ("alt", out), i

    def sequence(i):
        items = []
        while i < len(toks):
            t = toks[i]
            if t.group("name") and t.group("def"):
                break
            if t.group("op") in ("|", ")"):
                break
            if t.group("name"):
                node = ("ref", t.group("name"))
                i += 1
            elif t.group("lit"):
                node = ("lit", "".join(unescape(t.group("lit")[1:-1])))
                i += 1
            elif t.group("cls"):
                node = parse_class(t.group("cls"))
                i += 1
            elif t.group("op") == "(":
                node, i = alts(i + 1)
                assert toks[i].group("op") == ")"
                i += 1
            else:
                raise ValueError("unexpected %r" % t.group(0))
            if i < len(toks) and (toks[i].group("op") in ("*", "+", "?") or toks[i].group("rep")):
                q = toks[i].group("op") or toks[i].group("rep")
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(q, (None, None))
                if lo is None:
                    a = q[1:-1].split(",")
                    lo = int(a[0])
                    hi = lo if len(a) == 1 else (int(a[1]) if a[1] else None)
                node = ("rep", node, lo, hi)
                i += 1
            items.append(node)
        return ("seq", items), i

    while i < len(toks):
        t = toks[i]
        assert t.group("name") and t.group("def"), t.group(0)
        body, i = alts(i + 1)
        rules[t.group("name")] = body
    return rules


POOL = [chr(c) for c in range(0x20, 0x7F)] + list("éü日本😀\t\n") + ["\x01", "\u2028"]


class Gen:
    def __init__(self, rules, rng):
        self.rules, self.rng = rules, rng
        self.cost = {k: 10 ** 9 for k in rules}
        for _ in range(60):   # shortest-sentence lengths, to end deep recursion
            for k, v in rules.items():
                self.cost[k] = min(self.cost[k], self.c(v))

    def c(self, n):
        k = n[0]
        if k == "lit":
            return len(n[1])
        if k == "cls":
            return 1
        if k == "ref":
            return self.cost[n[1]]
        if k == "seq":
            return sum(self.c(x) for x in n[1])
        if k == "alt":
            return min(self.c(x) for x in n[1])
        return self.c(n[1]) * n[2]

    def char(self, neg, ranges):
        inside = lambda c: any(lo <= ord(c) <= hi for lo, hi in ranges)
        if neg:
            return self.rng.choice([c for c in POOL if not inside(c)])
        lo, hi = self.rng.choice(ranges)
        hi = min(hi, lo + 300)
        while True:
            c = self.rng.randint(lo, hi)
            if not 0xD800 <= c <= 0xDFFF:
                return chr(c)

    def gen(self, n, depth, out):
        k = n[0]
        deep = depth > 14
        if k == "lit":
            out.append(n[1])
        elif k == "cls":
            out.append(self.char(n[1], n[2]))
        elif k == "ref":
            self.gen(self.rules[n[1]], depth + 1, out)
        elif k == "seq":
            for x in n[1]:
                self.gen(x, depth, out)
        elif k == "alt":
            opts = n[1]
            if deep:
                best = min(self.c(x) for x in opts)
                opts = [x for x in opts if self.c(x) == best]
            self.gen(self.rng.choice(opts), depth, out)
        else:
            lo, hi = n[2], n[3]
            top = lo if deep else (lo + 3 if hi is None else min(hi, lo + 3))
            for _ in range(self.rng.randint(lo, top)):
                self.gen(n[1], depth + 1, out)

    def sentence(self):
        out = []
        self.gen(self.rules["root"], 0, out)
        return "".join(out)


# ---- checks the Debian jsonschema cannot do (date-time, time) -------------

def check_time(s):
    m = re.fullmatch(r"(\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-]\d\d:\d\d)", s)
    assert m, s
    h, mi, sec = int(m[1]), int(m[2]), int(m[3])
    assert h < 24 and mi < 60 and (sec < 60 or (h, mi, sec) == (23, 59, 60)), s
    if m[5] not in "Zz":
        assert int(m[5][1:3]) < 24 and int(m[5][4:6]) < 60, s


def check_formats(schema, value):
    """date-time and time by hand; the rest jsonschema's FORMAT_CHECKER does."""
    if isinstance(schema, dict) and isinstance(value, str):
        f = schema.get("format")
        if f == "date-time":
            d, t = re.split("[Tt]", value)
            datetime.date.fromisoformat(d)
            check_time(t)
        elif f == "time":
            check_time(value)


SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "born": {"type": "string", "format": "date"},
        "seen": {"type": "string", "format": "date-time"},
        "at": {"type": "string", "format": "time"},
        "id": {"type": "string", "format": "uuid"},
        "ip": {"type": "string", "format": "ipv4"},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"}},
     "required": ["name", "age", "born", "seen", "id"], "additionalProperties": False},
    {"type": "object", "properties": {"v": {"type": "integer"}, "meta": {"type": "object"}},
     "required": ["v"]},
    {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": ["integer", "null"], "minimum": -50, "exclusiveMaximum": 50},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["value"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}},
                "required": ["kind", "r"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "integer"}, "h": {"type": "integer"}},
                "required": ["kind", "w", "h"], "additionalProperties": False}]},
    {"type": "array", "prefixItems": [{"type": "string", "pattern": "^(yes|no)$"}, {"type": "boolean"}],
     "items": {"type": "number"}, "minItems": 2, "maxItems": 6},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "required": ["a"]},
               {"properties": {"b": {"const": [1, {"x": None}]}}, "required": ["b"]}]},
    {"type": "object", "properties": {
        "email": {"type": "string", "format": "email", "maxLength": 20},
        "ip": {"type": "string", "format": "ipv4", "minLength": 13},
        "day": {"type": "string", "format": "date", "pattern": "-02-"},
        "at": {"type": "string", "format": "time", "maxLength": 12},
        "code": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "minLength": 3, "maxLength": 7}},
     "required": ["email", "ip", "day", "at", "code"], "additionalProperties": False},
    {},
]


def key_order_ok(schema, value):
    """Keys of each object come in the order its schema's properties name them."""
    if isinstance(value, dict) and isinstance(schema, dict) and "properties" in schema:
        order = list(schema["properties"])
        known = [k for k in value if k in order]
        return known == sorted(known, key=order.index) and all(
            key_order_ok(schema["properties"][k], value[k]) for k in known)
    return True


class JsonschemaOracleTest(unittest.TestCase):
    def test_the_2020_12_cases_agree_with_jsonschema(self):
        with open(os.path.join(HERE, "support", "jschema_2020_12.json")) as f:
            cases = json.load(f)
        for case in cases:
            v = V(case["schema"], format_checker=V.FORMAT_CHECKER)
            for t in case["tests"]:
                self.assertEqual(v.is_valid(t["data"]), t["valid"],
                                 "%s / %s: the case file disagrees with jsonschema" % (case["description"], t["description"]))

    def test_random_sentences_of_compiled_grammars_validate(self):
        rng = random.Random(11)
        with open(os.path.join(HERE, "support", "jschema_2020_12.json")) as f:
            schemas = SCHEMAS + [c["schema"] for c in json.load(f)]
        total = 0
        for schema in schemas:
            rc, gbnf, err = compile_schema(schema)
            self.assertEqual(rc, 0, "%s refused: %s" % (json.dumps(schema), err))
            gen = Gen(parse_gbnf(gbnf), rng)
            v = V(schema, format_checker=V.FORMAT_CHECKER)
            for _ in range(150):
                s = gen.sentence()
                self.assertEqual(s, s.strip(), "whitespace around the root value: %r" % s)
                self.assertIsNone(re.search(r"[ \t]{22}", s), "unbounded whitespace: %r" % s)
                try:
                    value = json.loads(s)
                except ValueError as e:
                    self.fail("not JSON (%s): %r from %s" % (e, s, json.dumps(schema)))
                errors = [e.message for e in v.iter_errors(value)]
                self.assertEqual(errors, [], "%r does not validate against %s" % (s, json.dumps(schema)))
                self.assertTrue(key_order_ok(schema, value), "keys out of schema order: %r" % s)
                if isinstance(value, dict) and "properties" in schema:
                    for k, sub in schema["properties"].items():
                        if k in value:
                            check_formats(sub, value[k])
                total += 1
        self.assertGreater(total, 3000)

    def test_refusals_name_the_keyword_and_exit_2(self):
        for schema, word in [({"not": {}}, "'not'"), ({"type": "string", "format": "hostname"}, "hostname"),
                             ({"type": "array", "uniqueItems": True}, "uniqueItems"),
                             ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
                             ({"$ref": "#"}, "left recursion"),
                             ({"properties": {"a": {"items": {"type": "strnig"}}}},
                              '(at "/properties/a/items/type": "strnig")')]:
            rc, out, err = compile_schema(schema)
            self.assertEqual(rc, 2, json.dumps(schema))
            self.assertEqual(out, "")
            self.assertIn(word, err)


if __name__ == "__main__":
    unittest.main()
