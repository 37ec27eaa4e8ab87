"""tool_choice for every tool-call family: random-weight models carrying
real vocabularies (../shared/models/hf-vocab), each with a chat template of
the family, run in process (`tokpipe run`) under tool_choice required, a
named function, auto and none. Required and named must give calls that
name an offered function (the named one) and whose arguments validate
against its schema (python3-jsonschema); none gives no call; auto, with the
trigger token pushed by a logit bias, a valid call (the lazy grammar holds
what follows the marker). Through the daemon (Qwen3 vocabulary), the same
seed gives the same tokens as `tokpipe run` under required and auto, and
the streamed HTTP deltas assembled equal the message."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import jsonschema

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE  # noqa: E402
from http_gateway_test import request  # noqa: E402
from toolcall_job_test import BOUNDED, chain_model, sse_events  # noqa: E402

TEMPLATES = os.path.join(MODELS, "chat-templates")
VOCABS = {"qwen3": ("qwen3-vocab.gguf", "qwen2"), "llama3": ("llama3-vocab.gguf", "llama3"),
          "deepseek": ("deepseek-v3-vocab.gguf", "llama")}
# family -> (vocabulary, template file; None: the vocabulary's own)
FAMILIES = {
    "hermes": ("qwen3", None),
    "llama3": ("llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja"),
    "mistral": ("llama3", "mistralai-Mistral-Nemo-Instruct-2407.jinja"),
    "functionary_v3.1": ("llama3", "meetkai-functionary-medium-v3.1.jinja"),
    "functionary_v3.2": ("llama3", "meetkai-functionary-medium-v3.2.jinja"),
    "command_r7b": ("llama3", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"),
    "command_r_plus": ("llama3", "CohereForAI-c4ai-command-r-plus-tool_use.jinja"),
    "deepseek_r1": ("deepseek", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
    "firefunction_v2": ("llama3", "fireworks-ai-llama-3-firefunction-v2.jinja"),
}
# the families whose trigger is one token of their vocabulary: auto is
# tested by pushing that token
ONE_TOKEN_TRIGGER = {"hermes": "<tool_call>"}
# templates such as Functionary's and Command R+'s print each tool's and
# each parameter's description
TOOLS = [{"type": "function", "function": dict(
    t["function"], description="Look up " + t["function"]["name"],
    parameters=dict(t["function"]["parameters"], properties={
        k: dict(v, description="the " + k) for k, v in t["function"]["parameters"]["properties"].items()}))}
    for t in BOUNDED]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED}


class EveryFamily(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tp-tcfam-")
        cls.models = {}
        for name, (vocab, arch) in VOCABS.items():
            path = os.path.join(cls.dir, name + ".gguf")
            subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--arch", arch, "--vocab-from",
                            os.path.join(MODELS, "hf-vocab", vocab), "--shape", "64x2x4", "--seed", "7",
                            "--seq-len", "4096", "--out", path, "--quiet"], check=True, capture_output=True,
                           timeout=300)
            cls.models[name] = path
        # DeepSeek R1's prompt opens the thinking and a required call comes
        # after it ends: a model whose greedy path thinks "Hmm." and closes
        ds = os.path.join(MODELS, "hf-vocab", VOCABS["deepseek"][0])
        start = tpdaemon.tokenize(ds, "<｜Assistant｜><think>\n", "--special")[-1]
        end = tpdaemon.tokenize(ds, "<｜end▁of▁sentence｜>", "--special")[0]
        cls.models["deepseek"] = os.path.join(cls.dir, "deepseek-thinks.gguf")
        chain_model(cls.models["deepseek"], start, tpdaemon.tokenize(ds, "Hmm.</think>", "--special"), end, vocab=ds)
        cls.tools = os.path.join(cls.dir, "tools.json")
        with open(cls.tools, "w") as f:
            json.dump(TOOLS, f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_family(self, family, *args):
        vocab, template = FAMILIES[family]
        cmd = [TOKPIPE, "run", "--model", self.models[vocab], "--json", "--temperature", "0", "--max-tokens", "160",
               "--seed", "1", "--message", "user=Weather in Paris?", "--tools", self.tools, *args]
        if template:
            cmd += ["--chat-template", os.path.join(TEMPLATES, template)]
        p = subprocess.run(cmd, capture_output=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        return json.loads(p.stdout)

    def check_calls(self, r, only=None):
        self.assertEqual(r["finish_reason"], "tool_calls", r)
        self.assertNotIn("<", r.get("reasoning_content", ""))   # no call text in the thinking
        calls = r["tool_calls"]
        self.assertGreaterEqual(len(calls), 1)
        for c in calls:
            name = c["function"]["name"]
            self.assertIn(name, SCHEMAS)
            if only:
                self.assertEqual(name, only)
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[name])
        self.assertEqual(len({c["id"] for c in calls}), len(calls))
        return calls

    def test_required_named_and_none_in_every_family(self):
        for family in FAMILIES:
            with self.subTest(family=family):
                r = self.run_family(family, "--tool-choice", "required", "--no-parallel-tool-calls")
                self.assertEqual(len(self.check_calls(r)), 1)
                r = self.run_family(family, "--tool-choice", "get_time", "--no-parallel-tool-calls")
                self.check_calls(r, only="get_time")
                # parallel: every call whole (the random model may call until max_tokens)
                r = self.run_family(family, "--tool-choice", "get_weather", "--max-tokens", "400")
                if r.get("finish_detail") != "max_tokens":
                    self.check_calls(r, only="get_weather")
                r = self.run_family(family, "--tool-choice", "none")
                self.assertNotIn("tool_calls", r)
                self.assertNotEqual(r["finish_reason"], "tool_calls")

    def bias(self, family, text):
        vocab, _ = FAMILIES[family]
        ids = tpdaemon.tokenize(self.models[vocab], text, "--special")
        self.assertEqual(len(ids), 1, ids)
        return "%d=100" % ids[0]

    def test_auto_holds_the_call_once_its_marker_comes(self):
        for family in ONE_TOKEN_TRIGGER:
            with self.subTest(family=family):
                push = self.bias(family, ONE_TOKEN_TRIGGER[family])
                r = self.run_family(family, "--logit-bias", push, "--no-parallel-tool-calls")
                self.assertEqual(len(self.check_calls(r)), 1)
                # without the lazy grammar (none) the pushed marker leads nowhere valid
                r = self.run_family(family, "--logit-bias", push, "--tool-choice", "none")
                self.assertNotIn("tool_calls", r)


class DaemonAgreesWithRun(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon(model=cls.model, tokenizer="", prefix="tp-tcfam-")

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tp-tcfam-d-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.model = os.path.join(cls.dir, "qwen3.gguf")
        subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--arch", "qwen2", "--vocab-from",
                        os.path.join(MODELS, "hf-vocab", "qwen3-vocab.gguf"), "--shape", "64x2x4", "--seed", "7",
                        "--out", cls.model, "--quiet"], check=True, capture_output=True, timeout=300)
        cls.tools = os.path.join(cls.dir, "tools.json")
        with open(cls.tools, "w") as f:
            json.dump(BOUNDED, f)
        super().setUpClass()

    def both(self, *args):
        common = ["--json", "--temperature", "0", "--max-tokens", "120", "--seed", "5", "--message",
                  "user=Weather in Paris?", "--tools", self.tools, *args]
        out = []
        for cmd in ([TOKPIPE, "run", "--model", self.model], [TOKPIPE, "generate", "--config", self.d.config]):
            p = subprocess.run(cmd + common, capture_output=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            out.append(json.loads(p.stdout))
        return out

    def test_same_tokens_and_calls_in_process_and_through_the_daemon(self):
        tid = tpdaemon.tokenize(self.model, "<tool_call>", "--special")[0]
        for args in (["--tool-choice", "required"], ["--tool-choice", "get_time", "--no-parallel-tool-calls"],
                     ["--logit-bias", "%d=100" % tid, "--no-parallel-tool-calls"]):
            with self.subTest(args=args):
                run, gen = self.both(*args)
                self.assertEqual(run["tokens"], gen["tokens"])
                self.assertEqual(run["finish_reason"], gen["finish_reason"])
                strip = lambda r: [c["function"] for c in r.get("tool_calls", [])]  # noqa: E731
                self.assertEqual(strip(run), strip(gen))
                self.assertTrue(strip(gen), gen)

    def test_streamed_deltas_assemble_to_the_message(self):
        for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
            body = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": BOUNDED,
                    "tool_choice": choice, "temperature": 0, "max_tokens": 120, "seed": 3}
            st, whole, _ = request(self.port, "POST", "/v1/chat/completions", json.dumps(body).encode(),
                                   {"Content-Type": "application/json"})
            self.assertEqual(st, 200, whole)
            msg = json.loads(whole)["choices"][0]["message"]
            st, streamed, _ = request(self.port, "POST", "/v1/chat/completions",
                                      json.dumps(dict(body, stream=True)).encode(),
                                      {"Content-Type": "application/json"})
            self.assertEqual(st, 200, streamed)
            calls, content = {}, ""
            for ev in sse_events(streamed):
                for c in ev["choices"]:
                    content += c["delta"].get("content") or ""
                    for t in c["delta"].get("tool_calls") or []:
                        if "id" in t:
                            self.assertNotIn(t["index"], calls)
                            calls[t["index"]] = {"name": t["function"]["name"], "arguments": ""}
                        calls[t["index"]]["arguments"] += t["function"]["arguments"]
            self.assertEqual(content, msg["content"] or "")
            self.assertEqual([calls[k] for k in sorted(calls)], [c["function"] for c in msg["tool_calls"]])
            for c in msg["tool_calls"]:
                jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])


if __name__ == "__main__":
    unittest.main()
