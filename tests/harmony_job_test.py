"""gpt-oss's harmony end to end: a daemon and gateway whose model has a
harmony vocabulary (Llama 2's SentencePiece one with harmony's frame tokens
appended as control tokens, as o200k_harmony has them, and gpt-oss's chat
template) answer chat requests whose output a grammar fixes to harmony text.
The stop stage splits it as OpenAI's API returns gpt-oss's turns: the
analysis channel in reasoning_content, the final channel in content, a
commentary call in tool_calls -- streamed and not, the same; no frame text
in any of them. reasoning_effort reaches the template: each word gives its
own first-token logprob, the default medium's."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_tiny  # noqa: E402
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE  # noqa: E402
from grammar_test import gguf_kv_bytes  # noqa: E402
from http_gateway_test import request  # noqa: E402

SPM = os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-llama-spm.gguf")
TEMPLATE = os.path.join(MODELS, "chat-templates", "openai-gpt-oss-120b.jinja")
FRAME = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|return|>", "<|call|>"]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ANSWER = ("<|channel|>analysis<|message|>Simple question.<|end|><|start|>assistant<|channel|>final<|message|>"
          "Paris is in France.")
CALL = ("<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}")


def gbnf_literal(text):
    return "root ::= " + json.dumps(text)


def sse_events(body):
    return [json.loads(line[6:]) for line in body.decode().split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


@unittest.skipUnless(os.path.exists(TEMPLATE), "no gpt-oss template")
class HarmonyTurnsAsOpenAIReturnsThem(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon("", model=cls.model, tokenizer="", prefix="tp-harmony-")

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tp-harmony-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        g = gguf_tiny.Gguf(SPM)
        kv = {k: v for k, v in g.kv.items() if k.startswith("tokenizer.") or k == "general.architecture"}
        types = {k: g.kv_types[k] for k in kv}
        base = len(kv["tokenizer.ggml.tokens"])
        kv["tokenizer.ggml.tokens"] = (8, kv["tokenizer.ggml.tokens"] + FRAME)
        kv["tokenizer.ggml.scores"] = (6, kv["tokenizer.ggml.scores"] + [0.0] * len(FRAME))
        kv["tokenizer.ggml.token_type"] = (5, kv["tokenizer.ggml.token_type"] + [3] * len(FRAME))
        kv["tokenizer.ggml.eos_token_id"] = base + FRAME.index("<|return|>")
        types["tokenizer.ggml.eos_token_id"] = 4
        with open(TEMPLATE, encoding="utf-8") as f:
            kv["tokenizer.chat_template"] = f.read()
        types["tokenizer.chat_template"] = 8
        vocab = os.path.join(cls.dir, "harmony-vocab.gguf")
        with open(vocab, "wb") as f:
            f.write(gguf_kv_bytes(kv, types))
        cls.model = os.path.join(cls.dir, "harmony.gguf")
        subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--arch", "llama", "--vocab-from", vocab,
                        "--shape", "64x2x4", "--seed", "5", "--out", cls.model],
                       check=True, capture_output=True, timeout=300)
        super().setUpClass()

    def chat(self, **kw):
        body = dict({"model": "m", "messages": [{"role": "user", "content": "Where is Paris?"}],
                     "temperature": 0, "max_tokens": 200}, **kw)
        return request(self.port, "POST", "/v1/chat/completions", json.dumps(body).encode(),
                       {"Content-Type": "application/json"})

    def both(self, **kw):
        """The non-streamed message and the streamed deltas joined."""
        st, body, _ = self.chat(**kw)
        self.assertEqual(st, 200, body)
        msg = json.loads(body)["choices"][0]
        st, body, _ = self.chat(stream=True, **kw)
        self.assertEqual(st, 200, body)
        content, reasoning, calls, finish = "", "", {}, None
        for ev in sse_events(body):
            for c in ev["choices"]:
                d = c["delta"]
                content += d.get("content") or ""
                reasoning += d.get("reasoning_content") or ""
                for t in d.get("tool_calls") or []:
                    k = calls.setdefault(t["index"], {"name": "", "arguments": ""})
                    k["name"] += t["function"].get("name") or ""
                    k["arguments"] += t["function"].get("arguments") or ""
                finish = c.get("finish_reason") or finish
        return msg, (content, reasoning, [calls[i] for i in sorted(calls)], finish)

    def test_analysis_is_reasoning_and_final_is_content(self):
        msg, (content, reasoning, calls, finish) = self.both(grammar=gbnf_literal(ANSWER))
        self.assertEqual(msg["message"]["content"], "Paris is in France.")
        self.assertEqual(msg["message"]["reasoning_content"], "Simple question.")
        self.assertNotIn("tool_calls", msg["message"])
        self.assertEqual((content, reasoning, calls), ("Paris is in France.", "Simple question.", []))
        self.assertEqual(finish, msg["finish_reason"])

    def test_a_commentary_call_is_a_tool_call(self):
        msg, (content, reasoning, calls, finish) = self.both(grammar=gbnf_literal(CALL), tools=TOOLS)
        m = msg["message"]
        self.assertIsNone(m["content"])
        self.assertEqual(m["reasoning_content"], "Use the tool.")
        self.assertEqual(len(m["tool_calls"]), 1)
        self.assertEqual(m["tool_calls"][0]["function"], {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
        self.assertEqual(msg["finish_reason"], "tool_calls")
        self.assertEqual((content, reasoning), ("", "Use the tool."))
        self.assertEqual(calls, [m["tool_calls"][0]["function"]])
        self.assertEqual(finish, "tool_calls")
        # tool_choice none: the call's message is content (the frame's <|start|>assistant dropped), as
        # a call's text is for the other families
        msg, (content, reasoning, calls, _) = self.both(grammar=gbnf_literal(CALL), tools=TOOLS, tool_choice="none")
        self.assertNotIn("tool_calls", msg["message"])
        want = CALL[CALL.index("<|channel|>commentary"):]
        self.assertEqual(msg["message"]["content"], want)
        self.assertEqual((content, reasoning, calls), (want, "Use the tool.", []))

    def test_required_and_named_tool_choice_hold_the_output_to_a_call(self):
        # the random model is held to harmony's call message from its first token
        import copy
        import jsonschema
        from toolcall_job_test import BOUNDED
        BOUNDED = copy.deepcopy(BOUNDED)
        for t in BOUNDED:   # the harmony template prints each tool's description
            t["function"]["description"] = "A tool"
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED}
        for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
            msg, (content, _, calls, finish) = self.both(tools=BOUNDED, tool_choice=choice,
                                                         parallel_tool_calls=False)
            self.assertEqual(msg["finish_reason"], "tool_calls", msg)
            got = msg["message"]["tool_calls"]
            self.assertEqual(len(got), 1, msg)
            f = got[0]["function"]
            self.assertIn(f["name"], schemas)
            if choice != "required":
                self.assertEqual(f["name"], "get_time")
            jsonschema.validate(json.loads(f["arguments"]), schemas[f["name"]])
            self.assertEqual((content, calls, finish), ("", [f], "tool_calls"))

    def test_reasoning_effort_reaches_the_template(self):
        # the first token's logprob: the same prompt gives the same bits, another word another value
        def first(**kw):
            st, body, _ = self.chat(max_tokens=1, logprobs=True, **kw)
            self.assertEqual(st, 200, body)
            return json.loads(body)["choices"][0]["logprobs"]["content"][0]["logprob"]
        lp = {effort: first(reasoning_effort=effort) for effort in ("low", "medium", "high")}
        self.assertEqual(first(), lp["medium"])   # the template's default
        self.assertEqual(first(reasoning_effort="high"), lp["high"])
        self.assertEqual(len(set(lp.values())), 3, lp)
        st, body, _ = self.chat(reasoning_effort="extreme")
        self.assertEqual(st, 400, body)
        self.assertEqual(json.loads(body)["error"]["param"], "reasoning_effort")


if __name__ == "__main__":
    unittest.main()
