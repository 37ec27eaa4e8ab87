"""Structured output over HTTP, against the real tokpiped (which spawns the
gateway) on stories260K: response_format json_schema / json_object / text on
/v1/completions and /v1/chat/completions, llama.cpp's `grammar` and
`json_schema` fields. Finished documents validate with python3-jsonschema
(Draft 2020-12, formats checked) with keys in the schema's order; greedy
output equals `tokpipe run --json-schema`; streamed deltas concatenate to the
non-streamed text; a max_tokens cut says grammar_complete false; a bad
schema, a bad grammar or two constraints are 400 naming the request field;
the README's curl example works as pasted."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from http_gateway_test import BIN, MODEL, TEMPLATE, TOK, Daemon, post, sse_events  # noqa: E402

import http.client  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
V = jsonschema.Draft202012Validator

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pet": {"enum": ["cat", "dog", None]},
    "id": {"type": "string", "format": "uuid"},
    "born": {"type": "string", "format": "date"}},
    "required": ["name", "age", "id"], "additionalProperties": False}


def in_order(schema, value):
    order = list(schema["properties"])
    keys = list(value)
    return keys == sorted(keys, key=order.index)


def stream_text(port, body, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=json.dumps(dict(body, stream=True)), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    events = sse_events([r.read()])
    c.close()
    assert events[-1] == "[DONE]"
    parts, final = [], None
    for e in events[:-1]:
        for ch in e["choices"]:
            parts.append(ch["delta"].get("content", "") if "delta" in ch else ch["text"])
            if ch["finish_reason"] is not None:
                final = ch
    return "".join(parts), final


class StructuredOutputOverHttp(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return Daemon(chat_template=TEMPLATE)

    def text_of(self, r, chat):
        c = r["choices"][0]
        return c["message"]["content"] if chat else c["text"]

    def test_json_schema_on_both_endpoints_gives_valid_documents_in_key_order(self):
        rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        v = V(PERSON, format_checker=V.FORMAT_CHECKER)
        for path, chat in (("/v1/completions", False), ("/v1/chat/completions", True)):
            for seed in range(6):
                body = {"max_tokens": 400, "temperature": 1.0, "seed": seed, "response_format": rf}
                if chat:
                    body["messages"] = [{"role": "user", "content": "Tell me about a person."}]
                else:
                    body["prompt"] = "Once upon a time"
                st, r, _ = post(self.port, body, path=path)
                self.assertEqual(st, 200, r)
                c = r["choices"][0]
                text = self.text_of(r, chat)
                self.assertEqual(c["finish_reason"], "stop", (path, seed, text))
                self.assertIs(c["grammar_complete"], True)
                doc = json.loads(text)
                self.assertEqual([e.message for e in v.iter_errors(doc)], [], text)
                self.assertTrue(in_order(PERSON, doc), text)
                self.assertEqual(text, text.strip())

    def test_a_format_with_lengths_or_a_pattern_gives_valid_documents(self):
        # Pydantic's EmailStr with max_length writes format and maxLength together
        schema = {"type": "object", "properties": {
            "email": {"type": "string", "format": "email", "maxLength": 24},
            "day": {"type": "string", "format": "date", "pattern": "^20[0-4]"},
            "ip": {"type": "string", "format": "ipv4", "minLength": 12},
            "code": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "minLength": 3, "maxLength": 9}},
            "required": ["email", "day", "ip", "code"], "additionalProperties": False}
        v = V(schema, format_checker=V.FORMAT_CHECKER)
        email = re.compile(r"^([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*|\"[ !#-\[\]-~]+\")@"
                           r"([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9.]+\])$")
        done = 0
        for seed in range(6):
            st, r, _ = post(self.port, {"prompt": "Once upon a time", "max_tokens": 600, "temperature": 1.0, "seed": seed,
                                        "response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": schema}}})
            self.assertEqual(st, 200, r)
            c = r["choices"][0]
            if c["finish_reason"] != "stop":
                self.assertIs(c["grammar_complete"], False)
                continue
            doc = json.loads(c["text"])
            self.assertEqual([e.message for e in v.iter_errors(doc)], [], c["text"])
            self.assertLessEqual(len(doc["email"]), 24, c["text"])
            self.assertRegex(doc["email"], email)
            self.assertGreaterEqual(len(doc["ip"]), 12, c["text"])
            done += 1
        self.assertGreater(done, 0, "no document finished within max_tokens")

    def test_greedy_equals_tokpipe_run_and_streamed_equals_non_streamed(self):
        schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 500},
                                                   "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
                  "required": ["a", "b"], "additionalProperties": False}
        body = {"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
        st, r, _ = post(self.port, body)
        self.assertEqual(st, 200, r)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(schema, f)
        try:
            out = subprocess.run([os.path.join(BIN, "tokpipe"), "run", "--model", MODEL, "--tokenizer", TOK, "--json",
                                  "--prompt", "Once upon a time", "--max-tokens", "200", "--temperature", "0",
                                  "--json-schema", f.name], capture_output=True, text=True, timeout=120, check=True)
        finally:
            os.unlink(f.name)
        want = json.loads(out.stdout.splitlines()[0])
        self.assertEqual(r["choices"][0]["text"], want["text"])
        V(schema).validate(json.loads(want["text"]))
        for seed in (1, 2):
            b = dict(body, temperature=0.9, seed=seed)
            st, r, _ = post(self.port, b)
            text, final = stream_text(self.port, b, "/v1/completions")
            self.assertEqual(text, r["choices"][0]["text"])
            self.assertEqual(final["grammar_complete"], r["choices"][0]["grammar_complete"])

    def test_json_object_text_and_llama_cpp_fields(self):
        st, r, _ = post(self.port, {"prompt": "Once", "max_tokens": 2000, "temperature": 0,
                                    "response_format": {"type": "json_object"}})
        self.assertEqual(st, 200, r)
        c = r["choices"][0]
        if c["finish_reason"] == "stop":
            self.assertIsInstance(json.loads(c["text"]), dict)
            self.assertIs(c["grammar_complete"], True)
        else:
            self.assertIs(c["grammar_complete"], False)
            self.assertTrue(c["text"].startswith("{"), c["text"])
        # text: no constraint, no grammar_complete
        st, r, _ = post(self.port, {"prompt": "Once", "max_tokens": 10, "response_format": {"type": "text"}})
        self.assertEqual(st, 200, r)
        self.assertNotIn("grammar_complete", r["choices"][0])
        # llama.cpp's grammar (GBNF) and json_schema ({} = any JSON value)
        st, r, _ = post(self.port, {"prompt": "Once", "max_tokens": 20, "grammar": 'root ::= "yes" | "no" | [0-9]{2}'})
        self.assertEqual(st, 200, r)
        self.assertRegex(r["choices"][0]["text"], r"^(yes|no|[0-9]{2})$")
        for seed in range(4):
            st, r, _ = post(self.port, {"prompt": "Once", "max_tokens": 300, "seed": seed, "json_schema": {"type": ["integer", "boolean"]}})
            self.assertEqual(st, 200, r)
            self.assertIsInstance(json.loads(r["choices"][0]["text"]), (int, bool))
        st, r, _ = post(self.port, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 300, "seed": 5,
                                    "json_schema": {}}, path="/v1/chat/completions")
        self.assertEqual(st, 200, r)
        if r["choices"][0]["finish_reason"] == "stop":
            json.loads(r["choices"][0]["message"]["content"])

    def test_a_max_tokens_cut_is_a_valid_prefix_marked_incomplete(self):
        st, r, _ = post(self.port, {"prompt": "Once", "max_tokens": 4, "temperature": 0,
                                    "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}})
        self.assertEqual(st, 200, r)
        c = r["choices"][0]
        self.assertEqual(c["finish_reason"], "length")
        self.assertIs(c["grammar_complete"], False)
        self.assertTrue(c["text"].startswith("{"), c["text"])

    def test_bad_constraints_are_400_naming_the_field(self):
        cases = [
            ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"not": {}}}}},
             "response_format", "'not'"),
            ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": "uri"}}}},
             "response_format", "format 'uri'"),
            ({"prompt": "x", "json_schema": {"type": "array", "uniqueItems": True}}, "json_schema", "uniqueItems"),
            ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "properties": {"a": {"type": "array", "items": {"type": "strnig"}}}}}}},
             "response_format", '(at "/properties/a/items/type": "strnig")'),
            ({"prompt": "x", "grammar": "root ::= undefined-rule"}, "grammar", "undefined-rule"),
            ({"prompt": "x", "grammar": "root ::= \"a\" <|im_end|>"}, "grammar",
             "token <|im_end|> is not a special token of the model's vocabulary"),
            ({"prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {}}, "json_schema", "grammar and json_schema"),
            ({"prompt": "x", "response_format": {"type": "yaml"}}, "response_format", "yaml"),
        ]
        for body, param, word in cases:
            for path in ("/v1/completions", "/v1/chat/completions"):
                b = dict(body)
                if path.endswith("chat/completions"):
                    del b["prompt"]
                    b["messages"] = [{"role": "user", "content": "x"}]
                st, r, _ = post(self.port, b, path=path)
                self.assertEqual(st, 400, (b, r))
                self.assertEqual(r["error"]["param"], param, (b, r))
                self.assertIn(word, r["error"]["message"], (b, r))

    def test_the_readme_curl_example_works_as_pasted(self):
        with open(os.path.join(HERE, "..", "README.md")) as f:
            readme = f.read()
        m = re.search(r"<!-- structured-output-curl -->\n```sh\n(.*?)```", readme, re.S)
        self.assertIsNotNone(m, "README has no structured output curl example")
        cmd = m.group(1).replace("127.0.0.1:8080", "127.0.0.1:%d" % self.port)
        out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        r = json.loads(out.stdout)
        c = r["choices"][0]
        doc = json.loads(c["message"]["content"] if "message" in c else c["text"])
        self.assertIsInstance(doc, dict)
        self.assertIs(c["grammar_complete"], True)


if __name__ == "__main__":
    unittest.main()
