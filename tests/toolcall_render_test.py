"""A second turn of a tool conversation -- the assistant's tool_calls as
OpenAI sends them (arguments a JSON string, content null) and the tool's
result -- rendered by tokpiped (`tokpipe chat-template --openai`, the
tokenize stage's own code) equals jinja2 rendering the conversation the way
a Hugging Face user passes it, for every template with tool support in
../shared/models/chat-templates. What "the way a Hugging Face user passes
it" means per template is written below from reading each template (which
of them serialise the arguments and so take an object), not from tokpiped.
A template without tool support refuses tools with a message naming them;
tools with integers past 2^53 reach the template exactly."""
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_test import BOS, EOS, TEMPLATES, WEATHER_TOOL, oracle_env  # noqa: E402
from tpdaemon import TOKPIPE  # noqa: E402

# template -> does it want a call's arguments as an object (it applies
# tojson to them or iterates them) rather than OpenAI's string?
TOOL_TEMPLATES = {
    "Qwen-Qwen2.5-7B-Instruct": True,                         # arguments | tojson
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": False,   # "is string": printed as it is
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": False,
    "meta-llama-Llama-3.1-8B-Instruct": True,                 # arguments | tojson
    "meta-llama-Llama-3.2-3B-Instruct": True,
    "meta-llama-Llama-3.3-70B-Instruct": True,
    "mistralai-Mistral-Nemo-Instruct-2407": True,             # tool_call.function | tojson
    "meetkai-functionary-medium-v3.1": False,                 # '...' + arguments
    "meetkai-functionary-medium-v3.2": False,
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": True,    # arguments | tojson
    "CohereForAI-c4ai-command-r-plus-tool_use": True,         # arguments | tojson(indent=4)
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": False,        # '...' + arguments
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": False,
    "llama-cpp-deepseek-r1": False,
    "fireworks-ai-llama-3-firefunction-v2": False,
    "openai-gpt-oss-120b": True,                              # arguments | tojson (harmony)
}
NO_TOOLS = ["google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct"]

ARGS = "{\"city\": \"Paris\", \"days\": 3}"
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Local time",
                                              "parameters": {"type": "object", "properties": {
                                                  "tz": {"type": "string", "description": "Time zone"}},
                                                  "required": ["tz"]}}}


def second_turn():
    """OpenAI's shape: what a client sends after running the model's calls."""
    return {
        "messages": [
            {"role": "system", "content": "You can look things up."},
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}},
                {"id": "call67890", "type": "function",
                 "function": {"name": "get_time", "arguments": "{\"tz\": \"Europe/Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21}"},
            {"role": "tool", "tool_call_id": "call67890", "name": "get_time", "content": "14:05"},
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
    }


def as_hf(req, object_args, null_content):
    """The conversation as a Hugging Face user hands it to apply_chat_template:
    content None, or "" for templates that fail on None (Qwen3's)."""
    out = json.loads(json.dumps(req))
    for m in out["messages"]:
        if m.get("content") is None and not null_content:
            m["content"] = ""
        for c in m.get("tool_calls", []):
            if object_args:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def expected(name, req, object_args):
    """jinja2's rendering (content None where the template takes it), or
    the exception jinja2 raised."""
    last = None
    for null_content in (True, False):
        hf = as_hf(req, object_args, null_content)
        if name == "fireworks-ai-llama-3-firefunction-v2":
            # its template reads the tools as `functions` (JSON text)
            hf["functions"] = json.dumps(req["tools"])
            hf["datetime"] = "<now>"
        try:
            return jinja(name, hf), None
        except Exception as e:  # noqa: BLE001 -- jinja2 fails: so must tokpipe
            last = e
    return None, last


def jinja(name, variables):
    with open(os.path.join(TEMPLATES, name + ".jinja"), encoding="utf-8") as f:
        src = f.read()
    t = oracle_env().from_string(src)
    return t.render(bos_token=BOS, eos_token=EOS, add_generation_prompt=True, **variables)


def tokpipe_openai(name, req):
    return subprocess.run([TOKPIPE, "chat-template", "--template", os.path.join(TEMPLATES, name + ".jinja"),
                           "--bos-token", BOS, "--eos-token", EOS, "--openai"],
                          input=json.dumps(req).encode(), capture_output=True, timeout=60)


def no_clock(text):
    """Firefunction prints the time of rendering."""
    return re.sub(r"Today is [^.\n]*\.", "Today is <now>.", text)


class ToolConversationsRenderAsJinja2(unittest.TestCase):
    def check(self, name, req, object_args, call_names):
        want, exc = expected(name, req, object_args)
        p = tokpipe_openai(name, req)
        if exc is not None:
            self.assertEqual(p.returncode, 1, "jinja2 raised %r, tokpipe rendered" % exc)
            if hasattr(exc, "message") and exc.message:
                self.assertIn(str(exc.message), p.stderr.decode())
            return False
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        got = p.stdout.decode()
        self.assertEqual(no_clock(got), no_clock(want))
        for n in call_names:
            self.assertIn(n, got)   # the calls reached the prompt
        return True

    def test_second_turn_with_calls_and_results_equals_jinja2(self):
        rendered = 0
        for name, object_args in TOOL_TEMPLATES.items():
            with self.subTest(template=name, calls=2):
                rendered += self.check(name, second_turn(), object_args, ["get_weather", "get_time"])
            with self.subTest(template=name, calls=1):
                one = second_turn()
                del one["messages"][2]["tool_calls"][1]
                del one["messages"][4]
                ok = self.check(name, one, object_args, ["get_weather", "Paris"])
                # that one applies tojson to a generator (tools | map): jinja2
                # raises, and so does tokpipe (checked above)
                self.assertEqual(ok, name != "llama-cpp-deepseek-r1")
        self.assertGreaterEqual(rendered, 10)   # parallel calls: all but the Llama 3.x templates

    def test_reasoning_effort_reaches_the_template_as_openai_passes_it(self):
        # gpt-oss's harmony writes "Reasoning: <effort>" (default medium)
        name = "openai-gpt-oss-120b"
        if not os.path.exists(os.path.join(TEMPLATES, name + ".jinja")):
            self.skipTest(name + " not in " + TEMPLATES)
        conv = [{"role": "user", "content": "What is 2 + 2?"}]
        for effort in ("low", "medium", "high", None):
            req = {"messages": conv}
            if effort:
                req["reasoning_effort"] = effort
            p = tokpipe_openai(name, req)
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            want = jinja(name, dict(req))
            self.assertEqual(p.stdout.decode(), want)
            self.assertIn("Reasoning: %s" % (effort or "medium"), want)

    def test_a_template_without_tool_support_refuses_tools(self):
        for name in NO_TOOLS:
            req = {"messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER_TOOL]}
            p = tokpipe_openai(name, req)
            self.assertEqual(p.returncode, 1, name)
            self.assertIn("tools: the model's chat template has no tool support", p.stderr.decode())

    def test_malformed_tools_and_arguments_are_named(self):
        name = "Qwen-Qwen2.5-7B-Instruct"
        bad_tool = {"messages": [{"role": "user", "content": "Hi"}],
                    "tools": [WEATHER_TOOL, {"type": "function", "function": {"name": "has space"}}]}
        p = tokpipe_openai(name, bad_tool)
        self.assertEqual(p.returncode, 1)
        self.assertIn("tools[1].function.name", p.stderr.decode())
        bad_args = second_turn()
        bad_args["messages"][2]["tool_calls"][0]["function"]["arguments"] = "{not json"
        p = tokpipe_openai(name, bad_args)
        self.assertEqual(p.returncode, 1)
        self.assertIn("messages[2].tool_calls[0].arguments: not a JSON object", p.stderr.decode())

    def test_integers_past_2_53_in_tool_schemas_render_exactly(self):
        body = ('{"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function", "function": '
                '{"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"n": {"type": '
                '"integer", "maximum": 9007199254740993, "minimum": -9223372036854775807}}}}}]}')
        name = "Qwen-Qwen2.5-7B-Instruct"
        want = jinja(name, json.loads(body))
        self.assertIn("9007199254740993", want)
        p = subprocess.run([TOKPIPE, "chat-template", "--template", os.path.join(TEMPLATES, name + ".jinja"),
                            "--bos-token", BOS, "--eos-token", EOS, "--openai"],
                           input=body.encode(), capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(p.stdout.decode(), want)
        # and the plain renderer, given the same variables
        p = subprocess.run([TOKPIPE, "chat-template", "--template", os.path.join(TEMPLATES, name + ".jinja"),
                            "--bos-token", BOS, "--eos-token", EOS], input=body.encode(), capture_output=True,
                           timeout=60)
        self.assertEqual(p.stdout.decode(), want)


class NulInContentIsKept(unittest.TestCase):
    def test_nul_in_a_message_renders_as_jinja2_does(self):
        conv = [{"role": "user", "content": "Tell me a story\u0000 about a dragon"}]
        for name in ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "google-gemma-2-2b-it"]:
            want = jinja(name, {"messages": conv})
            self.assertIn("\u0000 about a dragon", want)
            p = subprocess.run([TOKPIPE, "chat-template", "--template", os.path.join(TEMPLATES, name + ".jinja"),
                                "--bos-token", BOS, "--eos-token", EOS], input=json.dumps(conv).encode(),
                               capture_output=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            self.assertEqual(p.stdout.decode(), want, name)


if __name__ == "__main__":
    unittest.main()
