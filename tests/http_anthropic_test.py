"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages
API) as a front door onto the chat job: the official Anthropic client from
npm ("@anthropic-ai/sdk", installed into $BUILD/npm by this test, never
committed) against tokpipe-http spawned by the real tokpiped.

On stories260K with a chat template from the config: a message gives the
tokens the same conversation gives at /v1/chat/completions (greedy), the
client's streamed message equals the non-streamed one, stop_sequences ends
with stop_reason stop_sequence and the sequence, max_tokens with
max_tokens; refusals are Anthropic's error shape naming the field (missing
max_tokens among them); count_tokens counts the message's prompt.
On a model that thinks and calls a tool (toolcall_job_test's chain model):
thinking and tool_use blocks, streamed and not, a two-turn tool loop with
tool_result, and tool_choice any / tool held to a call."""
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from http_gateway_test import TEMPLATE, Daemon, metric, post, request, wait_idle  # noqa: E402
from http_openai_node_test import NPM_DIR, MODULES  # noqa: E402
import toolcall_job_test as tc  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "anthropic_client.cjs")


def ensure_sdk():
    """None when @anthropic-ai/sdk is there (installing it if needed), else why not."""
    if not shutil.which("node") or not shutil.which("npm"):
        return "nodejs/npm not installed"
    if os.path.exists(os.path.join(MODULES, "@anthropic-ai", "sdk", "package.json")):
        return None
    os.makedirs(NPM_DIR, exist_ok=True)
    cmd = ["npm", "install", "--prefix", NPM_DIR, "--no-audit", "--no-fund", "--silent", "@anthropic-ai/sdk@1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return "npm install @anthropic-ai/sdk failed (no registry?): " + (p.stderr or p.stdout)[-300:]
    return None


def run_sdk(port, steps, key=None):
    inp = json.dumps({"base": "http://127.0.0.1:%d" % port, "key": key, "steps": steps})
    p = subprocess.run(["node", SCRIPT], input=inp, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, NODE_PATH=MODULES))
    if p.returncode != 0:
        raise AssertionError(p.stderr)
    return json.loads(p.stdout)


def blocks(message, kind):
    return [b for b in message["content"] if b["type"] == kind]


def text_of(message):
    return "".join(b["text"] for b in blocks(message, "text"))


class MessagesOnStories(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return Daemon(chat_template=TEMPLATE)

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(TEMPLATE):
            raise unittest.SkipTest("no chat template in the models")
        why = ensure_sdk()
        if why:
            raise unittest.SkipTest(why)
        super().setUpClass()

    SYSTEM = "You tell stories."
    USER = "Once upon a time"

    def chat(self, **kw):
        body = dict({"model": "stories260K", "messages": [{"role": "system", "content": self.SYSTEM},
                                                          {"role": "user", "content": self.USER}],
                     "temperature": 0}, **kw)
        st, r, _ = post(self.port, body, path="/v1/chat/completions")
        self.assertEqual(st, 200, r)
        return r

    def message(self, **kw):
        return dict({"model": "stories260K", "system": self.SYSTEM, "temperature": 0,
                     "messages": [{"role": "user", "content": self.USER}]}, **kw)

    def check_same(self, name, got, chat, stop_reason):
        """A message (and its stream) against the chat completion of the same request."""
        self.assertNotIn("error", got[name], got[name])
        m = got[name]
        want = chat["choices"][0]
        self.assertEqual((m["type"], m["role"]), ("message", "assistant"))
        self.assertTrue(m["id"].startswith("msg_"), m["id"])
        self.assertEqual(text_of(m), want["message"]["content"], name)
        self.assertEqual(m["usage"]["output_tokens"], chat["usage"]["completion_tokens"])
        self.assertEqual(m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"],
                         chat["usage"]["prompt_tokens"])
        self.assertEqual(m["stop_reason"], stop_reason, m)
        s = got[name + "_stream"]
        self.assertNotIn("error", s, s)
        self.assertEqual(s["text"], text_of(m))
        for k in ("content", "stop_reason", "stop_sequence", "usage", "model", "role", "type"):
            self.assertEqual(s["message"][k], m[k], (name, k))
        kinds = [e["type"] for e in s["events"]]
        self.assertEqual(kinds[0], "message_start")
        self.assertEqual(kinds[-2:], ["message_delta", "message_stop"])
        if text_of(m):
            self.assertIn("content_block_start", kinds)
            self.assertIn("content_block_stop", kinds)
        return m

    def test_messages_give_the_chat_completions_tokens_streamed_and_not(self):
        plain = self.chat(max_tokens=30)
        text = plain["choices"][0]["message"]["content"]
        self.assertGreater(len(text), 12, plain)
        stop = text[8:12]
        stopped = self.chat(max_tokens=30, stop=[stop])
        short = self.chat(max_tokens=3)
        bodies = {"plain": self.message(max_tokens=30), "stop": self.message(max_tokens=30, stop_sequences=[stop]),
                  "short": self.message(max_tokens=3, top_k=1, top_p=1)}
        steps = [{"name": n, "kind": k, "body": dict(b, stream=True) if k == "stream" else b}
                 for n, b in bodies.items() for k in ("create", "stream")]
        for s in steps:
            if s["kind"] == "stream":
                s["name"] += "_stream"
                del s["body"]["stream"]
        steps.append({"name": "count", "kind": "count", "body": {
            "model": "stories260K", "system": self.SYSTEM, "messages": [{"role": "user", "content": self.USER}]}})
        got = run_sdk(self.port, steps)
        m = self.check_same("plain", got, plain, "max_tokens" if plain["choices"][0]["finish_reason"] == "length"
                            else "end_turn")
        self.assertIsNone(m["stop_sequence"])
        m = self.check_same("stop", got, stopped, "stop_sequence")
        self.assertEqual(m["stop_sequence"], stop)
        self.assertEqual(self.check_same("short", got, short, "max_tokens")["usage"]["output_tokens"], 3)
        self.assertEqual(got["count"], {"input_tokens": plain["usage"]["prompt_tokens"]})
        # /metrics counts them under their endpoint
        st, text, _ = request(self.port, "GET", "/metrics")
        self.assertGreaterEqual(metric(text.decode(), "tokpipe_http_responses_total",
                                       'endpoint="/v1/messages",code="2xx"'), 6)
        self.assertGreaterEqual(metric(text.decode(), "tokpipe_http_responses_total",
                                       'endpoint="/v1/messages/count_tokens",code="2xx"'), 1)

    def test_text_blocks_are_the_chat_text_parts(self):
        """system and content as lists of text blocks: the conversation the strings make."""
        body = self.message(max_tokens=20, system=[{"type": "text", "text": self.SYSTEM}],
                            messages=[{"role": "user", "content": [{"type": "text", "text": "Once upon "},
                                                                   {"type": "text", "text": "a time"}]}],
                            metadata={"user_id": "u-1"})
        st, r, _ = post(self.port, body, path="/v1/messages")
        self.assertEqual(st, 200, r)
        self.assertEqual(text_of(r), self.chat(max_tokens=20)["choices"][0]["message"]["content"])

    def test_cache_read_input_tokens_are_the_prefix_cache_hits(self):
        system = ("Once upon a time there was a little girl named Lily. She loved to play outside in the sun "
                  "with her friends. One day she saw a big red ball in the park.")
        body = self.message(max_tokens=10, system=system)
        st, cold, _ = post(self.port, body, path="/v1/messages")
        self.assertEqual(st, 200, cold)
        wait_idle(self.port)
        got = run_sdk(self.port, [{"name": "warm", "kind": "create", "body": body},
                                  {"name": "stream", "kind": "stream", "body": body}])
        n = cold["usage"]["input_tokens"] + cold["usage"]["cache_read_input_tokens"]
        self.assertGreater(n, 32, "the prompt must span whole pages")
        pages = (n - 1) // 16 * 16   # prefix_http_test: the last prompt token is always computed
        for u in (got["warm"]["usage"], got["stream"]["message"]["usage"]):
            self.assertEqual((u["cache_read_input_tokens"], u["input_tokens"]), (pages, n - pages), u)
        self.assertEqual(text_of(got["warm"]), text_of(cold))
        self.assertEqual(got["stream"]["text"], text_of(cold))

    def test_refusals_are_anthropic_errors_naming_the_field(self):
        msgs = [{"role": "user", "content": "hi"}]
        bad = {
            "no_max_tokens": ({"messages": msgs}, "max_tokens"),
            "top_p": ({"messages": msgs, "max_tokens": 5, "top_p": 1.5}, "top_p"),
            "empty_stop": ({"messages": msgs, "max_tokens": 5, "stop_sequences": ["x", ""]}, "stop_sequences[1]"),
            "role": ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 5}, "messages[0].role"),
            "unknown": ({"messages": msgs, "max_tokens": 5, "frequency_penalty": 1}, "frequency_penalty"),
            "image": ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
                       "max_tokens": 5}, "messages[0].content[0].type"),
            "thinking": ({"messages": msgs, "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 10}},
                         "thinking.budget_tokens"),
            "tool_choice": ({"messages": msgs, "max_tokens": 5, "tool_choice": {"type": "some"}}, "tool_choice.type"),
        }
        got = run_sdk(self.port, [{"name": n, "kind": "create", "body": dict(b, model="m")}
                                  for n, (b, _) in bad.items()])
        for n, (_, field) in bad.items():
            e = got[n]["error"]
            self.assertEqual(e["status"], 400, (n, e))
            self.assertEqual(e["body"]["type"], "error", e)
            self.assertEqual(e["body"]["error"]["type"], "invalid_request_error", e)
            self.assertTrue(e["body"]["error"]["message"].startswith(field + ":"), (n, e))
        # the same shape for errors outside the decoder, over plain HTTP
        st, out, r = request(self.port, "GET", "/v1/messages")
        self.assertEqual((st, json.loads(out)["error"]["type"]), (405, "invalid_request_error"), out)
        st, out, r = request(self.port, "POST", "/v1/messages", b"{not json")
        self.assertEqual((st, json.loads(out)["type"]), (400, "error"), out)
        # a number past a double is no missing field (cJSON would read it as null)
        st, out, r = request(self.port, "POST", "/v1/messages",
                             b'{"max_tokens": 1e999, "messages": [{"role": "user", "content": "hi"}]}')
        self.assertEqual(st, 400, out)
        self.assertTrue(json.loads(out)["error"]["message"].startswith("max_tokens: "), out)
        # a prompt past the context: the client's error (400), not a retryable 5xx
        st, r, _ = post(self.port, {"messages": [{"role": "user", "content": "Once upon a time " * 150}],
                                    "max_tokens": 4}, path="/v1/messages")
        self.assertEqual((st, r["error"]["type"]), (400, "invalid_request_error"), r)
        self.assertIn("context", r["error"]["message"])


class MessagesWithAToolCallingModel(tpdaemon.HttpDaemonCase):
    TOOLS = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"]["parameters"]} for t in tc.TOOLS]
    BOUNDED = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in tc.BOUNDED]

    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon("", model=cls.model, tokenizer="", prefix="tp-ant-tools-")

    @classmethod
    def setUpClass(cls):
        why = ensure_sdk()
        if why:
            raise unittest.SkipTest(why)
        # toolcall_job_test's model: greedy, it thinks, then calls get_weather
        cls.dir = tempfile.mkdtemp(prefix="tp-ant-tools-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.model = os.path.join(cls.dir, "qwen3-calls.gguf")
        chain = tpdaemon.tokenize(tc.QWEN3, tc.OUTPUT, "--special")
        start = tpdaemon.tokenize(tc.QWEN3, "<|im_start|>assistant\n", "--special")[-1]
        end = tpdaemon.tokenize(tc.QWEN3, "<|im_end|>", "--special")[0]
        tc.chain_model(cls.model, start, chain, end)
        super().setUpClass()

    def body(self, **kw):
        return dict({"model": "m", "max_tokens": 64, "temperature": 0, "tools": self.TOOLS,
                     "messages": [{"role": "user", "content": tc.USER}]}, **kw)

    def check_use(self, m):
        self.assertEqual(m["stop_reason"], "tool_use", m)
        kinds = [b["type"] for b in m["content"]]
        self.assertEqual(kinds, ["thinking", "tool_use"], m)
        self.assertEqual(m["content"][0]["thinking"], tc.THOUGHT)
        use = m["content"][1]
        self.assertEqual((use["name"], use["input"]), ("get_weather", {"city": "Paris"}))
        return use

    def test_the_sdk_runs_the_tool_loop_streamed_and_not(self):
        got = run_sdk(self.port, [
            {"name": "loop", "kind": "loop", "body": self.body(), "result": "{\"temp\": 21}"},
            {"name": "stream", "kind": "stream", "body": self.body()},
            {"name": "any", "kind": "create", "body": self.body(tools=self.BOUNDED, max_tokens=200,
                                                                 tool_choice={"type": "any"})},
            {"name": "tool", "kind": "create", "body": self.body(tools=self.BOUNDED, max_tokens=200, tool_choice={
                "type": "tool", "name": "get_time", "disable_parallel_tool_use": True})},
            {"name": "none", "kind": "create", "body": self.body(tool_choice={"type": "none"})},
            {"name": "unknown", "kind": "create", "body": self.body(tool_choice={"type": "tool", "name": "nope"})},
        ])
        loop = got["loop"]
        self.assertNotIn("error", loop, loop)
        use = self.check_use(loop["first"])
        self.assertEqual(loop["messages"][-1]["content"][0]["tool_use_id"], use["id"])
        self.assertIn(loop["second"]["stop_reason"], ("tool_use", "end_turn", "max_tokens"), loop["second"])
        # the second turn is the chat job of the same conversation
        chat_msgs = [{"role": "user", "content": tc.USER},
                     {"role": "assistant", "content": None, "tool_calls": [{"id": use["id"], "type": "function",
                      "function": {"name": "get_weather", "arguments": json.dumps(use["input"],
                                                                                  separators=(",", ":"))}}]},
                     {"role": "tool", "tool_call_id": use["id"], "name": "get_weather", "content": "{\"temp\": 21}"}]
        st, body, _ = request(self.port, "POST", "/v1/chat/completions", json.dumps(
            {"messages": chat_msgs, "tools": tc.TOOLS, "max_tokens": 64, "temperature": 0}).encode(),
            {"Content-Type": "application/json"})
        self.assertEqual(st, 200, body)
        chat = json.loads(body)
        m2 = loop["second"]
        self.assertEqual(m2["usage"]["input_tokens"] + m2["usage"]["cache_read_input_tokens"],
                         chat["usage"]["prompt_tokens"])
        self.assertEqual(m2["usage"]["output_tokens"], chat["usage"]["completion_tokens"])
        self.assertEqual([(b["name"], b["input"]) for b in blocks(m2, "tool_use")],
                         [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                          for c in chat["choices"][0]["message"].get("tool_calls") or []])
        # streamed: the client's accumulator builds the same message (but the call's id)
        s = got["stream"]
        self.assertNotIn("error", s, s)
        self.check_use(s["message"])
        self.assertEqual((s["thinking"], s["text"]), (tc.THOUGHT, ""))
        self.assertEqual(json.loads(s["json"]), {"city": "Paris"})
        deltas = {e["delta"]["type"] for e in s["events"] if e["type"] == "content_block_delta"}
        self.assertEqual(deltas, {"thinking_delta", "input_json_delta"})
        starts = [e["content_block"]["type"] for e in s["events"] if e["type"] == "content_block_start"]
        self.assertEqual(starts, ["thinking", "tool_use"])
        su, fu = s["message"]["usage"], loop["first"]["usage"]
        self.assertEqual(su["output_tokens"], fu["output_tokens"])
        self.assertEqual(su["input_tokens"] + su["cache_read_input_tokens"],
                         fu["input_tokens"] + fu["cache_read_input_tokens"])
        # any / tool: held to calls of the offered functions
        schemas = {t["name"]: t["input_schema"] for t in self.BOUNDED}
        for name in ("any", "tool"):
            m = got[name]
            self.assertNotIn("error", m, m)
            self.assertEqual(m["stop_reason"], "tool_use", m)
            uses = blocks(m, "tool_use")
            self.assertGreaterEqual(len(uses), 1, m)
            for u in uses:
                jsonschema.validate(u["input"], schemas[u["name"]])
        self.assertEqual([u["name"] for u in blocks(got["tool"], "tool_use")], ["get_time"])
        # none: the call's text stays text
        self.assertEqual(blocks(got["none"], "tool_use"), [])
        self.assertIn("get_weather", text_of(got["none"]))
        e = got["unknown"]["error"]
        self.assertEqual((e["status"], e["body"]["error"]["type"]), (400, "invalid_request_error"), e)
        self.assertTrue(e["body"]["error"]["message"].startswith("tool_choice"), e)
        self.assertIn("nope", e["body"]["error"]["message"])


if __name__ == "__main__":
    unittest.main()
