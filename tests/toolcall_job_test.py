"""Tool calls end to end: a model that calls a tool, served by the real
daemon and gateway. The model is a random-weight GGUF with the Qwen3
vocabulary (and its chat template) whose weights the test sets so that
greedy decoding is known: every layer adds nothing, so the next token
depends on the current one only, and the embeddings and output matrix
chain "\\n" (the generation prompt's last token) -> the tokens of
    <think>Look it up.</think><tool_call>{"name": ...}</tool_call>
-> <|im_end|>. So the output is a thinking part and one call, and the
daemon's stop stage must return them apart: FINISH reasoning_content and
tool_calls (over ZeroMQ, `tokpipe generate --json`, HTTP streamed and
not, and the official openai npm client's tool loop), no call text in any
content delta, and with tool_choice none the call text as content."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import jsonschema
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_tiny  # noqa: E402
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE  # noqa: E402
from http_gateway_test import request  # noqa: E402
from http_openai_node_test import MODULES, ensure_client  # noqa: E402

QWEN3 = os.path.join(MODELS, "hf-vocab", "qwen3-vocab.gguf")
THOUGHT = "Look it up."
CALL = '{"name": "get_weather","arguments":{"city":"Paris"}}'
OUTPUT = "<think>" + THOUGHT + "</think><tool_call>" + CALL + "</tool_call>"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
USER = "Weather in Paris?"
# schemas whose every value is bounded, so that a random model held to them ends
BOUNDED = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False}}}, {"type": "function", "function": {
    "name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}, "hours": {"type": "integer", "minimum": 0,
                                                                                  "maximum": 23},
                                         "exact": {"type": "boolean"}},
        "required": ["zone", "hours"], "additionalProperties": False}}}]
TOOLS_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "openai_tools.cjs")


def chain_model(path, start, chain, end, vocab=QWEN3, loop_to=None, seq_len=None):
    """Greedy decoding after `start` gives chain, then end (loop_to: then
    chain[loop_to:] again and again)."""
    subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--arch", "llama", "--vocab-from", vocab,
                    "--shape", "64x2x4", "--seed", "5", "--separate-output", "--out", path]
                   + (["--seq-len", str(seq_len)] if seq_len else []),
                   check=True, capture_output=True, timeout=300)
    _, tensors, _, _, _ = gguf_tiny.read_gguf(path)
    dim, vocab = tensors["token_embd.weight"][1]
    assert len(chain) + 2 <= dim
    emb = np.zeros((vocab, dim))
    emb[:, dim - 1] = 1.0            # any other token: straight to the end
    out = np.zeros((vocab, dim))
    out[end, dim - 1] = 10.0
    for k, tok in enumerate([start] + chain):
        emb[tok] = 0.0
        emb[tok, k] = 1.0
        after = end if loop_to is None else chain[loop_to]
        out[chain[k] if k < len(chain) else after, k] = 10.0
    with open(path, "r+b") as f:
        def put(name, array):
            gguf_tiny.write_tensor(f, tensors, name, array)
        put("token_embd.weight", emb)
        put("output.weight", out)
        for name, (_, ne, _, _) in tensors.items():
            if name.endswith("attn_output.weight") or name.endswith("ffn_down.weight"):
                put(name, np.zeros(ne[::-1]))


def sse_events(body):
    return [json.loads(line[6:]) for line in body.decode().split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


class ModelThatCallsATool(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon("shutdown:\n  drain_timeout_ms: 60000\n", model=cls.model, tokenizer="",
                                   prefix="tp-tools-")

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tp-tools-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.model = os.path.join(cls.dir, "qwen3-calls.gguf")
        cls.chain = tpdaemon.tokenize(QWEN3, OUTPUT, "--special")
        start = tpdaemon.tokenize(QWEN3, "<|im_start|>assistant\n", "--special")[-1]
        end = tpdaemon.tokenize(QWEN3, "<|im_end|>", "--special")[0]
        assert len(set(cls.chain)) == len(cls.chain) and start not in cls.chain, cls.chain
        chain_model(cls.model, start, cls.chain, end)
        cls.end = end
        cls.tools_file = os.path.join(cls.dir, "tools.json")
        with open(cls.tools_file, "w") as f:
            json.dump(TOOLS, f)
        super().setUpClass()

    def generate(self, *args):
        p = subprocess.run([TOKPIPE, "generate", "--config", self.d.config, "--json", "--temperature", "0",
                            "--max-tokens", "64", "--message", "user=" + USER, *args],
                           capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        return json.loads(p.stdout)

    def check_call(self, calls):
        self.assertEqual(len(calls), 1, calls)
        c = calls[0]
        self.assertEqual(c["type"], "function")
        self.assertEqual(c["function"]["name"], "get_weather")
        self.assertEqual(json.loads(c["function"]["arguments"]), {"city": "Paris"})
        self.assertEqual(c["function"]["arguments"], '{"city":"Paris"}')   # as the model wrote it
        self.assertTrue(c["id"].startswith("call_") and len(c["id"]) == 29, c["id"])

    def test_generate_returns_the_call_and_the_thinking_apart(self):
        j = self.generate("--tools", self.tools_file)
        self.assertEqual(j["tokens"], self.chain)   # the end token ends it, unshown
        self.assertEqual(j["finish_reason"], "tool_calls")   # as an OpenAI gateway says
        self.assertEqual(j["text"], "")
        self.assertEqual(j["reasoning_content"], THOUGHT)
        self.check_call(j["tool_calls"])
        # every call gets its own id
        again = self.generate("--tools", self.tools_file)
        self.assertNotEqual(again["tool_calls"][0]["id"], j["tool_calls"][0]["id"])
        # tokpipe run, in process, splits the same way
        p = subprocess.run([TOKPIPE, "run", "--model", self.model, "--json", "--temperature", "0", "--max-tokens",
                            "64", "--message", "user=" + USER, "--tools", self.tools_file], capture_output=True,
                           timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        r = json.loads(p.stdout)
        self.assertEqual((r["text"], r["reasoning_content"], r["prompt_tokens"]), ("", THOUGHT, j["prompt_tokens"]))
        self.assertEqual((r["finish_reason"], r["tokens"]), ("tool_calls", j["tokens"]))
        self.check_call(r["tool_calls"])

    def test_tool_choice_none_leaves_the_call_text_as_content(self):
        j = self.generate("--tools", self.tools_file, "--tool-choice", "none")
        self.assertEqual(j["text"], "<tool_call>" + CALL + "</tool_call>")
        self.assertEqual(j["reasoning_content"], THOUGHT)
        self.assertNotIn("tool_calls", j)
        # without tools too (and the thinking is apart for every chat job)
        j = self.generate()
        self.assertNotIn("tool_calls", j)
        self.assertIn("<tool_call>", j["text"])

    def test_zeromq_events_carry_reasoning_deltas_and_finish_the_calls(self):
        sub = self.d.subscriber("zmq-tools")
        cmd, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, {
            "job_id": "zmq-tools", "messages": [{"role": "user", "content": USER}], "tools": json.dumps(TOOLS),
            "params": {"max_tokens": 64, "temperature": 0.0}})
        self.assertEqual(ack["status"], 200, ack)
        tokens, fin = sub.collect("zmq-tools")
        self.assertEqual("".join(t["text"] for t in tokens) + fin["text"], "")
        self.assertEqual("".join(t.get("reasoning", "") for t in tokens), THOUGHT)
        self.assertEqual(fin["reasoning_content"], THOUGHT)
        self.assertEqual(fin["text_len"], 0)
        self.assertEqual(len(fin["tool_calls"]), 1)
        c = fin["tool_calls"][0]
        self.assertEqual((c["name"], c["arguments"]), ("get_weather", '{"city":"Paris"}'))
        self.assertNotIn("tool_calls_cut", fin)   # the call is whole
        # the call streamed in TOKEN deltas as it was generated: its first
        # delta once the name was whole, then its arguments piece by piece
        built, pieces = {}, 0
        for t in tokens:
            for d in t.get("tool_calls", []):
                k = built.setdefault(d["id"], {"name": d["name"], "arguments": ""})
                self.assertEqual(k["name"], d["name"])
                k["arguments"] += d.get("arguments", "")
                pieces += 1
        self.assertEqual(list(built), [c["id"]])
        self.assertEqual(built[c["id"]], {"name": "get_weather", "arguments": c["arguments"]})
        self.assertGreater(pieces, 3)
        # STATUS reports them, and the thinking
        cmd, st, _ = self.d.call(tpdaemon.CMD_STATUS, {"job_id": "zmq-tools"})
        self.assertEqual(st["status"], 200, st)
        self.assertEqual(st["reasoning_content"], THOUGHT)
        self.assertEqual(st["tool_calls"], fin["tool_calls"])
        # a named function that is not offered, and a second constraint, are refused by name
        cmd, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, {
            "messages": [{"role": "user", "content": USER}], "tools": json.dumps(TOOLS), "tool_choice": "function",
            "tool_choice_name": "get_time"})
        self.assertEqual(ack["status"], 400, ack)
        self.assertEqual(ack["field"], "tool_choice")
        self.assertIn("'get_time' is not one of the offered tools", ack["error"])
        cmd, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, {
            "messages": [{"role": "user", "content": USER}], "tools": json.dumps(TOOLS), "tool_choice": "required",
            "params": {"json_mode": True}})
        self.assertEqual(ack["status"], 400, ack)
        self.assertIn("cannot go with a grammar, json_schema or json_mode", ack["error"])
        # the lazy grammar's trigger is the broker's to set
        cmd, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, {
            "messages": [{"role": "user", "content": USER}], "tools": json.dumps(TOOLS),
            "params": {"grammar": "root ::= \"x\"", "grammar_trigger": "<tool_call>"}})
        self.assertEqual((ack["status"], ack["field"]), (400, "params.grammar_trigger"), ack)
        # and so is the compiled grammar: params.grammar is always the producer's own text
        cmd, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, {"prompt": "Hi", "params": {"gbnf": "root ::= \"x\""}})
        self.assertEqual((ack["status"], ack["field"]), (400, "params.gbnf"), ack)
        cmd, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, {
            "messages": [{"role": "user", "content": USER}], "tool_choice": "auto"})
        self.assertEqual(ack["status"], 400, ack)
        self.assertIn("tool_choice: only with tools", ack["error"])

    def test_a_nul_in_a_message_keeps_the_rest_of_the_message(self):
        sub = tpdaemon.Subscriber(self.d.zmq(), self.d.events)
        sub.subscribe("@heartbeat")
        counts = {}
        for name, text in (("nul-cut", "Tell me a story"), ("nul-kept", "Tell me a story\u0000 about a dragon")):
            sub.subscribe(name)
            sub.wait_heartbeat(self.d.log_text)
            cmd, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, {
                "job_id": name, "messages": [{"role": "user", "content": text}],
                "params": {"max_tokens": 1, "temperature": 0.0}})
            self.assertEqual(ack["status"], 200, ack)
            counts[name] = sub.collect(name)[1]["prompt_tokens"]
        # the rendered prompt is tokenized whole: the NUL and " about a
        # dragon" (at least " about", " a", " dragon") are in it
        self.assertGreaterEqual(counts["nul-kept"] - counts["nul-cut"], 4, counts)

    def chat(self, **kw):
        body = dict({"model": "m", "messages": [{"role": "user", "content": USER}], "tools": TOOLS,
                     "temperature": 0}, **kw)
        return request(self.port, "POST", "/v1/chat/completions", json.dumps(body).encode(),
                       {"Content-Type": "application/json"})

    def test_http_returns_tool_calls_streamed_and_not(self):
        st, body, _ = self.chat()
        self.assertEqual(st, 200, body)
        r = json.loads(body)
        ch = r["choices"][0]
        self.assertEqual(ch["finish_reason"], "tool_calls")
        self.assertIsNone(ch["message"]["content"])
        self.assertEqual(ch["message"]["reasoning_content"], THOUGHT)
        self.check_call(ch["message"]["tool_calls"])
        st, body, _ = self.chat(stream=True)
        self.assertEqual(st, 200, body)
        content, reasoning, calls, finish = "", "", {}, None
        for ev in sse_events(body):
            for c in ev["choices"]:
                d = c["delta"]
                content += d.get("content") or ""
                reasoning += d.get("reasoning_content") or ""
                for t in d.get("tool_calls") or []:
                    k = calls.setdefault(t["index"], {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                    k["id"] = t.get("id") or k["id"]
                    k["function"]["name"] += t["function"].get("name") or ""
                    k["function"]["arguments"] += t["function"].get("arguments") or ""
                finish = c.get("finish_reason") or finish
        self.assertEqual(content, "")
        self.assertEqual(reasoning, THOUGHT)
        self.assertEqual(finish, "tool_calls")
        self.check_call([calls[0]])
        # as OpenAI streams calls: a first chunk with index, id, type, name
        # and arguments "", then the arguments in pieces
        chunks = [t for ev in sse_events(body) for c in ev["choices"] for t in c["delta"].get("tool_calls") or []]
        self.assertEqual(chunks[0], {"index": 0, "id": calls[0]["id"], "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}})
        self.assertGreater(len(chunks), 3)
        for t in chunks[1:]:
            self.assertEqual(set(t), {"index", "function"})
            self.assertEqual(set(t["function"]), {"arguments"})
        # the assembled deltas equal the message (but the id)
        msg = ch["message"]["tool_calls"][0]
        self.assertEqual(calls[0]["function"], msg["function"])
        # refusals name the field
        st, body, _ = self.chat(tool_choice={"type": "function", "function": {"name": "get_time"}})
        self.assertEqual(st, 400, body)
        self.assertEqual(json.loads(body)["error"]["param"], "tool_choice")
        self.assertIn("get_time", json.loads(body)["error"]["message"])
        st, body, _ = self.chat(tool_choice="required", response_format={"type": "json_object"})
        self.assertEqual(st, 400, body)
        self.assertIn("json_mode", json.loads(body)["error"]["message"])
        loose = [{"type": "function", "function": {"name": "scale", "parameters": {
            "type": "object", "properties": {"k": {"type": "number", "minimum": 0.5}}}}}]
        st, body, _ = self.chat(tools=loose, tool_choice="required")
        self.assertEqual(st, 400, body)
        msg = json.loads(body)["error"]["message"]
        self.assertIn("scale", msg)
        self.assertIn("minimum", msg)
        st, body, _ = self.chat(tool_choice="anything")
        self.assertEqual(st, 400, body)
        st, body, _ = self.chat(tools=[{"type": "function", "function": {"name": "bad name"}}])
        self.assertEqual(st, 400, body)
        self.assertEqual(json.loads(body)["error"]["param"], "tools")

    def constrained_calls(self, **kw):
        """A chat whose output the grammar holds to calls: each call names
        an offered function and its arguments validate against its schema."""
        st, body, _ = self.chat(tools=BOUNDED, max_tokens=200, **kw)
        self.assertEqual(st, 200, body)
        ch = json.loads(body)["choices"][0]
        self.assertEqual(ch["finish_reason"], "tool_calls", ch)
        calls = ch["message"]["tool_calls"]
        self.assertGreaterEqual(len(calls), 1, ch)
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED}
        for c in calls:
            self.assertIn(c["function"]["name"], schemas)
            jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])
        self.assertEqual(len({c["id"] for c in calls}), len(calls))
        return calls

    def test_required_and_named_tool_choice_hold_the_output_to_a_call(self):
        # the model would think first; required makes it call from the first token
        self.constrained_calls(tool_choice="required")
        calls = self.constrained_calls(tool_choice="required", parallel_tool_calls=False)
        self.assertEqual(len(calls), 1)
        for name in ("get_weather", "get_time"):
            calls = self.constrained_calls(tool_choice={"type": "function", "function": {"name": name}},
                                           parallel_tool_calls=False)
            self.assertEqual([c["function"]["name"] for c in calls], [name])
        # over ZeroMQ, with tool_choice "function" and its name
        sub = self.d.subscriber("zmq-named")
        cmd, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, {
            "job_id": "zmq-named", "messages": [{"role": "user", "content": USER}], "tools": json.dumps(BOUNDED),
            "tool_choice": "function", "tool_choice_name": "get_time",
            "params": {"max_tokens": 200, "temperature": 0.0, "parallel_tool_calls": False}})
        self.assertEqual(ack["status"], 200, ack)
        _, fin = sub.collect("zmq-named")
        self.assertEqual(len(fin["tool_calls"]), 1, fin)
        self.assertEqual(fin["tool_calls"][0]["name"], "get_time")
        jsonschema.validate(json.loads(fin["tool_calls"][0]["arguments"]), BOUNDED[1]["function"]["parameters"])

    def test_official_openai_client_runs_the_tool_loop(self):
        why = ensure_client()
        if why:
            self.skipTest(why)
        inp = json.dumps({"base": "http://127.0.0.1:%d/v1" % self.port, "model": "m", "tools": TOOLS, "bounded": BOUNDED,
                          "user": USER})
        p = subprocess.run(["node", TOOLS_SCRIPT], input=inp, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, NODE_PATH=MODULES))
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        first = out["first"]["choices"][0]
        self.assertEqual(first["finish_reason"], "tool_calls", out)
        self.check_call(first["message"]["tool_calls"])
        s = out["streamed"]
        self.assertEqual((s["content"], s["reasoning"], s["finish"]), ("", THOUGHT, "tool_calls"))
        self.check_call(s["calls"])
        self.assertNotEqual(s["calls"][0]["id"], first["message"]["tool_calls"][0]["id"])
        # the client's stream helper builds the same message from the deltas
        h = out["helper"]
        self.assertEqual(h["finish"], "tool_calls", h)
        self.check_call(h["message"]["tool_calls"])
        self.assertEqual(h["message"]["tool_calls"][0]["function"], first["message"]["tool_calls"][0]["function"])
        self.assertIn(h["message"]["content"], (None, ""))
        self.assertGreater(h["fragments"], 1)
        # the second turn (assistant calls + tool result) is accepted and answered
        self.assertIn("choices", out["second"], out["second"])
        self.assertIn(out["second"]["choices"][0]["finish_reason"], ("tool_calls", "stop"))
        none = out["none"]["choices"][0]
        self.assertEqual(none["finish_reason"], "stop")
        self.assertIn("<tool_call>", none["message"]["content"])
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED}
        for step in ("required", "named"):
            ch = out[step]["choices"][0]
            self.assertEqual(ch["finish_reason"], "tool_calls", out[step])
            for c in ch["message"]["tool_calls"]:
                jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])
        self.assertEqual([c["function"]["name"] for c in out["named"]["choices"][0]["message"]["tool_calls"]],
                         ["get_time"])
        self.assertEqual(out["unknown"]["error"]["status"], 400)
        self.assertEqual(out["unknown"]["error"]["param"], "tool_choice")


if __name__ == "__main__":
    unittest.main()
