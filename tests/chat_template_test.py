"""`tokpipe chat-template` against python3-jinja2 rendering every real chat
template in shared/models/chat-templates (at least each one that
shared/models/SHA256SUMS lists) the way Hugging Face transformers does (sandboxed environment, trim_blocks, lstrip_blocks, loopcontrols,
raise_exception, strftime_now, a tojson keeping key order and non-ASCII).

For every template, conversation and add_generation_prompt value the
rendered prompt must equal jinja2's byte for byte; where jinja2 raises, the
renderer must fail too (with the same message for raise_exception). A
refusal ("unsupported construct") is allowed only where the test lists it."""
import datetime
import glob
import json
import os
import subprocess
import sys
import unittest

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

TEMPLATES = os.path.join(MODELS, "chat-templates")
BOS, EOS = "<BOS>", "<EOS>"

MUST_RENDER = [
    "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "google-gemma-2-2b-it",
    "microsoft-Phi-3.5-mini-instruct", "mistralai-Mistral-Nemo-Instruct-2407",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "llama-cpp-deepseek-r1",
]


def oracle_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def msg(role, content, **kw):
    m = {"role": role, "content": content}
    m.update(kw)
    return m


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "description": "Temperature unit", "default": "celsius"},
                "days": {"type": "integer", "description": "Forecast days", "maximum": 7},
            },
            "required": ["city"],
        },
    },
}
CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CALL_STR = {"id": "call12345", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}

# A schema with what the newer templates walk: nested objects, arrays with
# items, enums, nullable, a key whose case sorts differently (dictsort is
# case-insensitive), and a tool without parameters.
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documents",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "filters": {"type": "object", "description": "Narrowing",
                            "properties": {"year": {"type": "integer", "description": "Year"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
                            "required": ["year"]},
                "sort": {"type": "string", "enum": ["relevance", "date"]},
                "Strict": {"type": "boolean", "description": "Exact match only"},
                "limit": {"type": "number", "nullable": True},
            },
            "required": ["query"],
        },
    },
}
TIME_TOOL = {"type": "function",
             "function": {"name": "get_time", "description": "The current time",
                          "parameters": {"type": "object", "properties": {}}}}
CALL_SEARCH = {"id": "call00001", "type": "function",
               "function": {"name": "search_docs",
                            "arguments": {"query": "llamas", "filters": {"year": 2024, "tags": ["a", "b"]},
                                          "Strict": True, "limit": 2.5}}}
CALL_TIME = {"id": "call00002", "type": "function", "function": {"name": "get_time", "arguments": {}}}

CONVERSATIONS = {
    "user_only": {"messages": [msg("user", "Hello!")]},
    "system_user": {"messages": [msg("system", "You are terse."), msg("user", "What is 2+2?")]},
    "multi_turn": {"messages": [msg("system", "Be kind."), msg("user", "Hi"),
                                msg("assistant", "Hello, how can I help?"),
                                msg("user", "Tell me a joke.")]},
    "ends_with_assistant": {"messages": [msg("user", "Hi"), msg("assistant", "Hello."),
                                         msg("user", "Bye"), msg("assistant", "Goodbye.")]},
    "special_chars": {"messages": [
        msg("user", "  quotes ' \" and \\ backslash\n\ttab {{ not a tag }} {% raw %} <b>&amp;</b>  "),
        msg("assistant", "日本語 🦙 ünïcödé\u00a0nbsp <|eot_id|> <|im_end|>"),
        msg("user", "\n\nlines\r\nwith crlf\n\n")]},
    "empty_content": {"messages": [msg("system", ""), msg("user", ""), msg("assistant", ""),
                                   msg("user", "")]},
    "think": {"messages": [msg("user", "Solve x"),
                           msg("assistant", "<think>reasoning</think>\n\nThe answer is 4."),
                           msg("user", "Thanks")]},
    "system_only": {"messages": [msg("system", "Only a system message.")]},
    "not_alternating": {"messages": [msg("user", "a"), msg("user", "b")]},
    "no_messages": {"messages": []},
    "tools": {"messages": [msg("system", "Use tools."), msg("user", "Weather in Paris?")],
              "tools": [WEATHER_TOOL]},
    "tool_calls": {"messages": [
        msg("user", "Weather in Paris?"),
        msg("assistant", None, tool_calls=[CALL]),
        msg("tool", "{\"temp\": 21}", tool_call_id="call12345"),
        msg("assistant", "It is 21 degrees."),
        msg("user", "Thanks")], "tools": [WEATHER_TOOL]},
    "tool_calls_str": {"messages": [
        msg("user", "Weather in Paris?"),
        msg("assistant", None, tool_calls=[CALL_STR]),
        msg("tool", "{\"temp\": 21}", tool_call_id="call12345"),
        msg("user", "Thanks")], "tools": [WEATHER_TOOL]},
    "extra_vars": {"messages": [msg("user", "Hi")], "date_string": "01 Jan 2025",
                   "functions": "[{\"name\": \"f\"}]", "datetime": "2025-01-01",
                   "documents": [{"title": "Doc", "text": "Body"}]},
    # Thinking: reasoning_content on assistant turns (Qwen3, Qwen3.5, Gemma 4),
    # two tool calls in one turn and their two responses, thinking switched on
    # by each template's own variable.
    "reasoning_tool_turns": {"messages": [
        msg("system", "Use tools when useful."),
        msg("user", "Find llama docs and tell me the time."),
        msg("assistant", "", reasoning_content="I should search and ask the clock.",
            tool_calls=[CALL_SEARCH, CALL_TIME]),
        msg("tool", "{\"hits\": 2}", tool_call_id="call00001"),
        msg("tool", "12:00", tool_call_id="call00002"),
        msg("assistant", "Found 2 docs; it is 12:00.", reasoning_content="Both answered.")],
        "tools": [SEARCH_TOOL, TIME_TOOL], "enable_thinking": True, "thinking": True},
    # An agent turn in progress: the last message is a tool response.
    "after_tool_response": {"messages": [
        msg("user", "Weather in Paris?"),
        msg("assistant", "", reasoning_content="Call the tool.", tool_calls=[CALL]),
        msg("tool", "{\"temp\": 21}", tool_call_id="call12345")],
        "tools": [WEATHER_TOOL], "enable_thinking": True},
    "thinking_off": {"messages": [
        msg("user", "Solve x"),
        msg("assistant", "The answer is 4.", reasoning_content="x = 4"),
        msg("user", "Thanks")], "enable_thinking": False, "thinking": False},
    # gpt-oss harmony: a developer message, reasoning_effort, model_identity,
    # builtin tools, the assistant's thinking field.
    "harmony_developer": {"messages": [
        msg("developer", "Answer in French."), msg("user", "Hi"),
        msg("assistant", "Bonjour", thinking="The user greets me."),
        msg("user", "Weather in Paris?")],
        "tools": [WEATHER_TOOL, SEARCH_TOOL], "reasoning_effort": "high",
        "model_identity": "You are tokpipe.", "builtin_tools": ["browser", "python"]},
    "harmony_tool_call": {"messages": [
        msg("user", "Weather in Paris?"),
        msg("assistant", "", thinking="Use get_weather.", tool_calls=[CALL]),
        msg("tool", "{\"temp\": 21}", tool_call_id="call12345", name="get_weather")],
        "tools": [WEATHER_TOOL], "reasoning_effort": "low"},
    # SmolLM3 reads /no_think and /think out of the system prompt.
    "system_no_think": {"messages": [msg("system", "Be brief. /no_think"), msg("user", "Hi")]},
    # Content as a list of parts (Qwen3.5, Gemma 4, Mistral Small 3.2).
    "content_parts": {"messages": [
        msg("user", [{"type": "text", "text": "Look at this"}, {"type": "image"}]),
        msg("assistant", [{"type": "text", "text": "A llama."}]),
        msg("user", [{"type": "text", "text": "Thanks"}])]},
    # Gemma's native form: tool responses carried on the assistant message.
    "tool_responses_inline": {"messages": [
        msg("user", "Weather in Paris?"),
        msg("assistant", "", tool_calls=[CALL],
            tool_responses=[{"name": "get_weather", "response": {"temp": 21, "Unit": "C"}}]),
        msg("user", "Thanks")], "tools": [WEATHER_TOOL]},
}

# Where the renderer may refuse although jinja2 renders: (template, conversation).
ALLOWED_REFUSALS = set()


def listed_templates():
    """The chat templates shared/models/SHA256SUMS lists, by name."""
    names = []
    with open(os.path.join(MODELS, "SHA256SUMS"), encoding="utf-8") as f:
        for line in f:
            path = line.split(None, 1)[1].strip().lstrip("*") if len(line.split(None, 1)) == 2 else ""
            if path.startswith("chat-templates/") and path.endswith(".jinja"):
                names.append(path[len("chat-templates/"):-len(".jinja")])
    return sorted(names)


def present_templates():
    return sorted(os.path.basename(p)[:-len(".jinja")] for p in glob.glob(os.path.join(TEMPLATES, "*.jinja")))


def oracle(env, source, conv, gen):
    vars_ = dict(conv)
    try:
        out = env.from_string(source).render(add_generation_prompt=gen, bos_token=BOS,
                                             eos_token=EOS, **vars_)
        return "ok", out
    except TemplateError as e:
        if type(e) is TemplateError:
            return "raise", str(e)
        return "error", "%s: %s" % (type(e).__name__, e)
    except Exception as e:  # TypeError and friends: jinja2 fails, so must we
        return "error", "%s: %s" % (type(e).__name__, e)


def ours(path, conv, gen):
    args = [TOKPIPE, "chat-template", "--template", path, "--bos-token", BOS, "--eos-token", EOS]
    if not gen:
        args.append("--no-generation-prompt")
    p = subprocess.run(args, input=json.dumps(conv).encode("utf-8"), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "surrogateescape"), p.stderr.decode("utf-8", "replace")


class ChatTemplatesRenderAsJinja2Does(unittest.TestCase):
    def test_every_listed_template_is_there(self):
        # The manifest follows the directory: a template added with its sum
        # is expected from then on, one listed but gone fails here.
        listed = listed_templates()
        present = set(present_templates())
        self.assertGreaterEqual(len(listed), len(MUST_RENDER), "SHA256SUMS lists too few chat templates")
        for name in listed:
            self.assertIn(name, present, "listed in SHA256SUMS but missing from " + TEMPLATES)
        for name in MUST_RENDER:
            self.assertIn(name, present, name + " missing from " + TEMPLATES)

    def test_every_template_equals_jinja2_for_every_conversation(self):
        env = oracle_env()
        rendered, checked = {}, {}
        for name in present_templates():
            path = os.path.join(TEMPLATES, name + ".jinja")
            with open(path, encoding="utf-8") as f:
                source = f.read()
            for cname, conv in sorted(CONVERSATIONS.items()):
                for gen in (True, False):
                    with self.subTest(template=name, conversation=cname, generation_prompt=gen):
                        kind, want = oracle(env, source, conv, gen)
                        rc, got, err = ours(path, conv, gen)
                        if kind == "ok":
                            if rc != 0 and "unsupported construct" in err and (name, cname) in ALLOWED_REFUSALS:
                                checked[name] = checked.get(name, 0) + 1
                                continue
                            self.assertEqual(rc, 0, "jinja2 renders, tokpipe fails: " + err)
                            self.assertEqual(got, want)
                            rendered[name] = rendered.get(name, 0) + 1
                        else:
                            self.assertNotEqual(rc, 0, "jinja2 fails (%s), tokpipe renders %r" % (want, got[:200]))
                            if kind == "raise":
                                self.assertIn("raise_exception: " + want, err)
                        checked[name] = checked.get(name, 0) + 1
        # Every template present and listed went through every case, and
        # each one rendered something: none skipped, none refused outright.
        for name in sorted(set(present_templates()) | set(listed_templates())):
            self.assertEqual(checked.get(name, 0), 2 * len(CONVERSATIONS), name + ": not every case checked")
            self.assertGreater(rendered.get(name, 0), 0, name + " never rendered")

    def test_dictsort_arguments_equal_jinja2(self):
        # by key or value, case-insensitive by default, reverse keeping equal
        # keys in dict order (Python's sorted is stable both ways), errors
        # where Python cannot order or the argument is wrong.
        d = '{"b": 2, "A": 3, "a": 1, "C": 1, "\u00c9t\u00e9": 0, "\u00e9a": 5, "_x": 4}'
        cases = ["{{ %s | dictsort }}" % d,
                 "{{ %s | dictsort(true) }}" % d,
                 "{{ %s | dictsort(case_sensitive=true) }}" % d,
                 "{{ %s | dictsort(false, 'value') }}" % d,
                 "{{ %s | dictsort(by='value', reverse=true) }}" % d,
                 "{{ %s | dictsort(reverse=true) }}" % d,
                 "{{ {'x': 'B', 'y': 'a', 'z': 'b'} | dictsort(by='value') }}",
                 "{{ {'x': 'B', 'y': 'a', 'z': 'b'} | dictsort(true, 'value', true) }}",
                 "{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}={{ v }};{% endfor %}",
                 "{{ {} | dictsort }}|{{ {'one': 1} | dictsort }}",
                 "{{ {'a': 1, 'b': 'x'} | dictsort(by='value') }}",
                 "{{ {'a': [1, 2], 'b': [1]} | dictsort(by='value') }}",
                 "{{ {'a': 1} | dictsort(by='size') }}",
                 "{{ [1, 2] | dictsort }}",
                 "{{ nothing | dictsort }}"]
        env = oracle_env()
        for source in cases:
            with self.subTest(source=source):
                path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "tp_chat_dictsort_%d.jinja" % os.getpid())
                with open(path, "w", encoding="utf-8") as f:
                    f.write(source)
                try:
                    kind, want = oracle(env, source, {"messages": []}, True)
                    rc, got, err = ours(path, {"messages": []}, True)
                finally:
                    os.unlink(path)
                if kind == "ok":
                    self.assertEqual(rc, 0, "jinja2 renders %r, tokpipe fails: %s" % (want, err))
                    self.assertEqual(got, want)
                else:
                    self.assertNotEqual(rc, 0, "jinja2 fails (%s), tokpipe renders %r" % (want, got))
                    self.assertNotIn("unsupported construct", err)

    def test_a_refused_construct_is_named_with_its_line(self):
        cases = [("a\n{% include 'x' %}", "line 2", "statement 'include'"),
                 ("{{ x | wordwrap }}", "line 1", "filter 'wordwrap'"),
                 ("\n\n{% if x is divisible %}{% endif %}", "line 3", "test 'divisible'"),
                 ("{% for x in y recursive %}{% endfor %}", "line 1", "recursive for loop")]
        for source, line, what in cases:
            with self.subTest(source=source):
                path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "tp_chat_refused_%d.jinja" % os.getpid())
                with open(path, "w", encoding="utf-8") as f:
                    f.write(source)
                try:
                    rc, out, err = ours(path, {"messages": []}, True)
                finally:
                    os.unlink(path)
                self.assertEqual(rc, 1)
                self.assertEqual(out, "")
                self.assertIn(line, err)
                self.assertIn("unsupported construct: " + what, err)

    def test_a_conversation_that_is_not_a_list_is_refused(self):
        path = os.path.join(TEMPLATES, "microsoft-Phi-3.5-mini-instruct.jinja")
        p = subprocess.run([TOKPIPE, "chat-template", "--template", path], input=b'{"messages": 3}',
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"messages", p.stderr)


if __name__ == "__main__":
    unittest.main()
