"""POST /v1/responses (OpenAI's Responses API) as a front door onto the
chat job, and its stored responses: the official `openai` npm client
(client.responses, installed into $BUILD/npm as http_openai_node_test
does) against tokpipe-http spawned by the real tokpiped.

On stories260K with a chat template: a response gives the tokens the same
conversation gives at /v1/chat/completions (greedy and seeded), streamed
equals non-streamed, a previous_response_id chain is the chat conversation
of its turns and its second turn's prompt comes from the prefix cache
(usage.input_tokens_details.cached_tokens), GET and DELETE of stored
responses and their LRU bound (http.responses_max_count), text.format
json_schema, refusals naming the field.
On a model that thinks and calls a tool (toolcall_job_test's chain model):
reasoning and function_call items, streamed and not, and a two-turn tool
loop with function_call_output, continued by previous_response_id or sent
again whole: the same tokens as the chat conversation."""
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
from http_gateway_test import MODEL, TEMPLATE, TOK, metric, post, request, wait_idle  # noqa: E402
from http_openai_node_test import MODULES, ensure_client  # noqa: E402
import toolcall_job_test as tc  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "openai_responses.cjs")
MAX_STORED = 4   # http.responses_max_count of these daemons


def run_client(port, steps):
    inp = json.dumps({"base": "http://127.0.0.1:%d/v1" % port, "steps": steps})
    p = subprocess.run(["node", SCRIPT], input=inp, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, NODE_PATH=MODULES))
    if p.returncode != 0:
        raise AssertionError(p.stderr)
    return json.loads(p.stdout)


def items(r, kind):
    return [i for i in r["output"] if i["type"] == kind]


def text_of(r):
    return "".join(c["text"] for m in items(r, "message") for c in m["content"] if c["type"] == "output_text")


def without_ids(output):
    """Output items without their ids (each response numbers its own, each
    job draws its calls') and what the client adds (parsed_arguments)."""
    return [{k: v for k, v in i.items() if k not in ("id", "call_id", "parsed_arguments")} for i in output]


def counts(usage):
    """usage less what the prefix cache's state decides"""
    return {k: v for k, v in usage.items() if k != "input_tokens_details"}


class ResponsesOnStories(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon("  responses_max_count: %d\n" % MAX_STORED, model=MODEL, tokenizer=TOK,
                                   chat_template=TEMPLATE, prefix="tp-resp-")

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(TEMPLATE):
            raise unittest.SkipTest("no chat template in the models")
        why = ensure_client()
        if why:
            raise unittest.SkipTest(why)
        super().setUpClass()

    SYSTEM = "You tell stories."
    USER = "Once upon a time"

    def chat(self, messages, **kw):
        st, r, _ = post(self.port, dict({"model": "m", "messages": messages}, **kw), path="/v1/chat/completions")
        self.assertEqual(st, 200, r)
        return r

    def check_same(self, r, chat):
        """A response against the chat completion of the same conversation."""
        self.assertIsNone(r.get("error"), r)
        want = chat["choices"][0]
        self.assertEqual(r["object"], "response")
        self.assertTrue(r["id"].startswith("resp_"), r["id"])
        self.assertEqual(text_of(r), want["message"]["content"])
        self.assertEqual(r["status"], "incomplete" if want["finish_reason"] == "length" else "completed", r)
        if r["status"] == "incomplete":
            self.assertEqual(r["incomplete_details"], {"reason": "max_output_tokens"})
        u = r["usage"]
        self.assertEqual((u["input_tokens"], u["output_tokens"]),
                         (chat["usage"]["prompt_tokens"], chat["usage"]["completion_tokens"]))
        self.assertEqual(u["total_tokens"], u["input_tokens"] + u["output_tokens"])

    def check_stream(self, s, r):
        """A streamed response against the non-streamed one of the same request."""
        self.assertNotIn("error", s, s)
        kinds = [e["type"] for e in s["events"]]
        self.assertEqual(kinds[:2], ["response.created", "response.in_progress"])
        last = s["events"][-1]
        self.assertEqual(last["type"], "response.incomplete" if r["status"] == "incomplete" else "response.completed")
        self.assertEqual([e["sequence_number"] for e in s["events"]], list(range(len(kinds))))
        self.assertEqual(s["text"], text_of(r))
        final = last["response"]
        self.assertEqual(without_ids(final["output"]), without_ids(r["output"]))
        for k in ("status", "incomplete_details", "model", "instructions", "max_output_tokens"):
            self.assertEqual(final[k], r[k], k)
        self.assertEqual(counts(final["usage"]), counts(r["usage"]))
        if final["status"] == "completed":   # the client's accumulator keeps response.completed's
            self.assertEqual(text_of(s["response"]), text_of(r))

    def test_a_response_gives_the_chat_completions_tokens_streamed_and_not(self):
        msgs = [{"role": "system", "content": self.SYSTEM}, {"role": "user", "content": self.USER}]
        greedy = self.chat(msgs, max_tokens=30, temperature=0)
        seeded = self.chat(msgs, max_tokens=30, temperature=0.9, seed=7)
        stopped = self.chat([{"role": "user", "content": self.USER}], max_tokens=300, temperature=0)
        bodies = {
            "greedy": {"instructions": self.SYSTEM, "input": self.USER, "max_output_tokens": 30, "temperature": 0},
            "seeded": {"instructions": self.SYSTEM, "max_output_tokens": 30, "temperature": 0.9, "seed": 7,
                       "input": [{"role": "user", "content": [{"type": "input_text", "text": self.USER}]}]},
            "long": {"input": [{"type": "message", "role": "user", "content": self.USER}], "max_output_tokens": 300,
                     "temperature": 0},
        }
        steps = []
        for n, b in bodies.items():
            b = dict(b, model="stories260K")
            steps += [{"name": n, "kind": "create", "body": b}, {"name": n + "_stream", "kind": "stream", "body": b}]
        got = run_client(self.port, steps)
        for n, chat in (("greedy", greedy), ("seeded", seeded), ("long", stopped)):
            self.check_same(got[n], chat)
            self.check_stream(got[n + "_stream"], got[n])
        self.assertEqual(got["greedy"]["instructions"], self.SYSTEM)
        st, text, _ = request(self.port, "GET", "/metrics")
        self.assertGreaterEqual(metric(text.decode(), "tokpipe_http_responses_total",
                                       'endpoint="/v1/responses",code="2xx"'), 6)

    def test_previous_response_id_continues_the_conversation_from_the_prefix_cache(self):
        system = ("Once upon a time there was a little girl named Lily. She loved to play outside in the sun "
                  "with her friends. One day she saw a big red ball in the park.")
        first = {"model": "m", "instructions": system, "input": self.USER, "max_output_tokens": 12, "temperature": 0}
        got = run_client(self.port, [{"name": "one", "kind": "create", "body": first}])
        one = got["one"]
        self.assertIsNone(one.get("error"), one)
        wait_idle(self.port)
        then = {"model": "m", "instructions": system, "input": "And then?", "max_output_tokens": 12, "temperature": 0}
        more = {"model": "m", "instructions": system, "input": [{"role": "user", "content": "The end."}],
                "max_output_tokens": 8, "temperature": 0}
        got = run_client(self.port, [
            {"name": "two", "kind": "create", "body": dict(then, previous_response_id=one["id"])},
            {"name": "two_stream", "kind": "stream", "body": dict(then, previous_response_id=one["id"])},
            {"name": "three", "kind": "create", "body": more, "prev": "two"}])
        two, three = got["two"], got["three"]
        self.assertEqual(two["previous_response_id"], one["id"])
        # the chat conversation of the same turns
        conv = [{"role": "system", "content": system}, {"role": "user", "content": self.USER},
                {"role": "assistant", "content": text_of(one)}, {"role": "user", "content": "And then?"}]
        self.check_same(two, self.chat(conv, max_tokens=12, temperature=0))
        self.check_stream(got["two_stream"], two)
        # its input items: the conversation it continued (the first turn, its answer) and its own input
        st, out, _ = request(self.port, "GET", "/v1/responses/%s/input_items" % two["id"])
        self.assertEqual(st, 200, out)
        listed = json.loads(out)
        self.assertEqual([(i["type"], i["role"], i["content"][0]["text"]) for i in listed["data"]],
                         [("message", "user", self.USER), ("message", "assistant", text_of(one)),
                          ("message", "user", "And then?")])
        self.assertEqual((listed["object"], listed["has_more"], listed["first_id"]),
                         ("list", False, listed["data"][0]["id"]))
        conv += [{"role": "assistant", "content": text_of(two)}, {"role": "user", "content": "The end."}]
        self.check_same(three, self.chat(conv, max_tokens=8, temperature=0))
        # the second turn's prompt begins with the first's: whole pages of it come from the prefix cache
        n = one["usage"]["input_tokens"]
        self.assertGreater(n, 32, "the prompt must span whole pages")
        for r in (two, got["two_stream"]["events"][-1]["response"], three):
            self.assertGreaterEqual(r["usage"]["input_tokens_details"]["cached_tokens"], (n - 1) // 16 * 16, r["usage"])

    def test_stored_responses_are_read_deleted_and_bounded_least_recently_used_first(self):
        body = {"model": "m", "input": self.USER, "max_output_tokens": 3, "temperature": 0}
        steps = [{"name": "unstored", "kind": "create", "body": dict(body, store=False)},
                 {"name": "unstored_get", "kind": "retrieve", "of": "unstored"}]
        names = ["r%d" % i for i in range(MAX_STORED + 1)]
        for i, n in enumerate(names[:MAX_STORED]):
            steps.append({"name": n, "kind": "create", "body": body})
        steps += [{"name": "r0_get", "kind": "retrieve", "of": "r0"},   # r0 is now the most recently used
                  {"name": names[-1], "kind": "create", "body": body},    # so r1 goes
                  {"name": "r1_get", "kind": "retrieve", "of": "r1"},
                  {"name": "r1_next", "kind": "create", "body": dict(body, input="x"), "prev": "r1"},
                  {"name": "r2_get", "kind": "retrieve", "of": "r2"},
                  {"name": "r0_del", "kind": "del", "of": "r0"},
                  {"name": "r0_gone", "kind": "retrieve", "of": "r0"},
                  {"name": "r0_del_again", "kind": "del", "of": "r0"}]
        got = run_client(self.port, steps)
        self.assertIs(got["unstored"]["store"], False)
        self.assertEqual(got["unstored_get"]["error"]["status"], 404, got["unstored_get"])
        self.assertEqual(got["r0_get"]["id"], got["r0"]["id"])
        self.assertEqual(without_ids(got["r0_get"]["output"]), without_ids(got["r0"]["output"]))
        self.assertEqual(got["r0_get"]["usage"], got["r0"]["usage"])
        self.assertEqual(got["r1_get"]["error"]["status"], 404, got["r1_get"])
        e = got["r1_next"]["error"]
        self.assertEqual((e["status"], e["body"]["param"]), (400, "previous_response_id"), e)
        self.assertEqual(got["r2_get"]["id"], got["r2"]["id"])
        self.assertIsNone(got["r0_del"].get("error"), got["r0_del"])
        self.assertEqual(got["r0_gone"]["error"]["status"], 404)
        self.assertEqual(got["r0_del_again"]["error"]["status"], 404)
        st, out, _ = request(self.port, "PUT", "/v1/responses/" + got["r2"]["id"], b"{}")
        self.assertEqual(st, 405, out)
        st, out, _ = request(self.port, "GET", "/v1/responses/" + got["r2"]["id"] + "/nope")
        self.assertEqual(st, 404, out)

    def test_text_format_json_schema_holds_the_output_to_the_schema(self):
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                                   "age": {"type": "integer", "minimum": 0, "maximum": 99}},
                  "required": ["name", "age"], "additionalProperties": False}
        steps = []
        for seed in range(3):
            b = {"model": "m", "input": "Tell me about a person.", "max_output_tokens": 200, "temperature": 1.0,
                 "seed": seed, "text": {"format": {"type": "json_schema", "name": "person", "schema": schema,
                                                   "strict": True}}}
            steps += [{"name": "s%d" % seed, "kind": "create", "body": b},
                      {"name": "s%d_stream" % seed, "kind": "stream", "body": b}]
        got = run_client(self.port, steps)
        done = 0
        for seed in range(3):
            r = got["s%d" % seed]
            self.assertIsNone(r.get("error"), r)
            self.assertEqual(r["text"]["format"]["name"], "person")
            self.check_stream(got["s%d_stream" % seed], r)
            chat = self.chat([{"role": "user", "content": "Tell me about a person."}], max_tokens=200,
                             temperature=1.0, seed=seed, response_format={"type": "json_schema", "json_schema": {
                                 "name": "person", "schema": schema, "strict": True}})
            self.check_same(r, chat)
            if r["status"] == "completed":
                jsonschema.validate(json.loads(text_of(r)), schema)
                done += 1
        self.assertGreater(done, 0, "no document finished within max_output_tokens")

    def test_refusals_name_the_field(self):
        bad = {
            "top_p": ({"input": "hi", "top_p": 1.5}, "top_p"),
            "max_output_tokens": ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
            "no_input": ({"instructions": "x"}, "input"),
            "item_type": ({"input": [{"type": "image", "url": "x"}]}, "input[0]"),
            "part_type": ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                          "input[0].content[0]"),
            "role": ({"input": [{"role": "tool", "content": "x"}]}, "input[0]"),
            "unknown": ({"input": "hi", "frequency_penalty": 1}, "frequency_penalty"),
            "tool_type": ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
            "format": ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format"),
            "schema": ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
            "effort": ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning"),
            "previous": ({"input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id"),
            "truncation": ({"input": "hi", "truncation": "auto"}, "truncation"),
            "call_output": ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),
        }
        got = run_client(self.port, [{"name": n, "kind": "create", "body": dict(b, model="m")}
                                     for n, (b, _) in bad.items()])
        for n, (_, field) in bad.items():
            e = got[n].get("error")
            self.assertIsNotNone(e, (n, got[n]))
            self.assertEqual((e["status"], e["body"]["type"]), (400, "invalid_request_error"), (n, e))
            self.assertEqual(e["body"]["param"], field, (n, e))
        # a prompt past the context: 400 context_length_exceeded, as chat
        st, r, _ = post(self.port, {"input": "Once upon a time " * 150, "max_output_tokens": 4}, path="/v1/responses")
        self.assertEqual((st, r["error"]["code"], r["error"]["param"]), (400, "context_length_exceeded", "input"), r)


class ResponsesWithAToolCallingModel(tpdaemon.HttpDaemonCase):
    TOOLS = [dict(t["function"], type="function") for t in tc.TOOLS]
    BOUNDED = [dict(t["function"], type="function") for t in tc.BOUNDED]

    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon("", model=cls.model, tokenizer="", prefix="tp-resp-tools-")

    @classmethod
    def setUpClass(cls):
        why = ensure_client()
        if why:
            raise unittest.SkipTest(why)
        cls.dir = tempfile.mkdtemp(prefix="tp-resp-tools-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.model = os.path.join(cls.dir, "qwen3-calls.gguf")
        chain = tpdaemon.tokenize(tc.QWEN3, tc.OUTPUT, "--special")
        start = tpdaemon.tokenize(tc.QWEN3, "<|im_start|>assistant\n", "--special")[-1]
        end = tpdaemon.tokenize(tc.QWEN3, "<|im_end|>", "--special")[0]
        tc.chain_model(cls.model, start, chain, end)
        super().setUpClass()

    def body(self, **kw):
        return dict({"model": "m", "max_output_tokens": 64, "temperature": 0, "tools": self.TOOLS,
                     "input": tc.USER, "reasoning": {"effort": "low"}}, **kw)

    def check_call(self, r):
        self.assertEqual(r["status"], "completed", r)
        self.assertEqual([i["type"] for i in r["output"]], ["reasoning", "function_call"], r)
        self.assertEqual(r["output"][0]["content"], [{"type": "reasoning_text", "text": tc.THOUGHT}])
        call = r["output"][1]
        self.assertEqual((call["name"], json.loads(call["arguments"]), call["status"]),
                         ("get_weather", {"city": "Paris"}, "completed"))
        return call

    def test_the_client_runs_the_tool_loop_streamed_and_not(self):
        got = run_client(self.port, [
            {"name": "loop", "kind": "loop", "body": self.body(), "result": "{\"temp\": 21}"},
            {"name": "stream", "kind": "stream", "body": self.body()},
            {"name": "required", "kind": "create", "body": self.body(tools=self.BOUNDED, max_output_tokens=200,
                                                                     tool_choice="required")},
            {"name": "named", "kind": "create", "body": self.body(tools=self.BOUNDED, max_output_tokens=200,
                                                                  tool_choice={"type": "function", "name": "get_time"},
                                                                  parallel_tool_calls=False)},
            {"name": "none", "kind": "create", "body": self.body(tool_choice="none")},
        ])
        loop = got["loop"]
        self.assertNotIn("error", loop, loop)
        call = self.check_call(loop["first"])
        self.assertEqual(loop["first"]["usage"]["output_tokens"] > 0, True)
        # the second turn is the chat job of the same conversation, continued or sent again
        chat_msgs = [{"role": "user", "content": tc.USER},
                     {"role": "assistant", "content": None, "tool_calls": [{"id": call["call_id"], "type": "function",
                      "function": {"name": "get_weather", "arguments": call["arguments"]}}]},
                     {"role": "tool", "tool_call_id": call["call_id"], "content": "{\"temp\": 21}"}]
        st, chat, _ = post(self.port, {"messages": chat_msgs, "tools": tc.TOOLS, "max_tokens": 64, "temperature": 0},
                           path="/v1/chat/completions")
        self.assertEqual(st, 200, chat)
        want = chat["choices"][0]["message"]
        for name in ("second", "resent"):
            r = loop[name]
            self.assertIsNone(r.get("error"), (name, r))
            self.assertEqual(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"], name)
            self.assertEqual(r["usage"]["output_tokens"], chat["usage"]["completion_tokens"], name)
            self.assertEqual([(i["name"], i["arguments"]) for i in items(r, "function_call")],
                             [(c["function"]["name"], c["function"]["arguments"]) for c in want.get("tool_calls") or []])
            self.assertEqual(text_of(r), want["content"] or "")
        self.assertGreater(loop["second"]["usage"]["input_tokens_details"]["cached_tokens"], 0)
        st, out, _ = request(self.port, "GET", "/v1/responses/%s/input_items" % loop["second"]["id"])
        listed = json.loads(out)["data"]
        self.assertEqual([i["type"] for i in listed], ["message", "function_call", "function_call_output"], listed)
        self.assertEqual((listed[1]["call_id"], listed[1]["name"], listed[1]["arguments"]),
                         (call["call_id"], "get_weather", call["arguments"]))
        self.assertEqual((listed[2]["call_id"], listed[2]["output"]), (call["call_id"], "{\"temp\": 21}"))
        # streamed: the typed events build the same response
        s = got["stream"]
        self.assertNotIn("error", s, s)
        self.check_call(s["response"])
        self.assertEqual((s["reasoning"], json.loads(s["args"])), (tc.THOUGHT, {"city": "Paris"}))
        kinds = [e["type"] for e in s["events"]]
        for k in ("response.reasoning_text.delta", "response.function_call_arguments.delta",
                  "response.function_call_arguments.done", "response.output_item.done"):
            self.assertIn(k, kinds)
        self.assertEqual(kinds[-1], "response.completed")
        self.assertEqual(without_ids(s["response"]["output"]), without_ids(loop["first"]["output"]))
        self.assertEqual(counts(s["response"]["usage"]), counts(loop["first"]["usage"]))
        # required / named: held to calls of the offered functions
        schemas = {t["name"]: t["parameters"] for t in self.BOUNDED}
        for name in ("required", "named"):
            r = got[name]
            self.assertIsNone(r.get("error"), r)
            calls = items(r, "function_call")
            self.assertGreaterEqual(len(calls), 1, r)
            for c in calls:
                jsonschema.validate(json.loads(c["arguments"]), schemas[c["name"]])
        self.assertEqual([c["name"] for c in items(got["named"], "function_call")], ["get_time"])
        # none: the call's text stays text
        self.assertEqual(items(got["none"], "function_call"), [])
        self.assertIn("get_weather", text_of(got["none"]))


if __name__ == "__main__":
    unittest.main()
