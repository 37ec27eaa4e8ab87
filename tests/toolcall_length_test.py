"""A tool call cut by max_tokens is no finished call: the job ends as
`length`, as OpenAI answers, never `tool_calls`. The real daemon and
gateway serve a random-weight model (Qwen3 vocabulary and template, see
toolcall_job_test.chain_model) whose greedy output is calls without end:
    <tool_call>{...}</tool_call><tool_call>{...}</tool_call><tool_call>{...
max_tokens cuts the third call inside its arguments. Under tool_choice
auto, required and a named function (parallel calls allowed; the call
grammar takes the model's calls as they are), streamed and not, over
ZeroMQ (FINISH, `tokpipe generate --json`), HTTP and `tokpipe run
--json`: finish_reason is `length`, the two calls before the cut are
whole (their arguments the JSON the model wrote), and the cut call's
arguments are what was generated of them (a prefix, not JSON), as its
streamed deltas were; FINISH says `tool_calls_cut`. A stop string that
cuts a call leaves the job `stop_string` (OpenAI's `stop`), never
`tool_calls` either."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpdaemon  # noqa: E402
from tpdaemon import TOKPIPE  # noqa: E402
from http_gateway_test import request  # noqa: E402
from toolcall_job_test import CALL, QWEN3, TOOLS, USER, chain_model, sse_events  # noqa: E402

OUTPUT = "<tool_call>" + CALL + "</tool_call>"
ARGS = '{"city":"Paris"}'            # each call's arguments, as the model writes them
WHOLE = 2                            # calls before the cut
# (tool_choice over SUBMIT, its name, the gateway's tool_choice, generate/run's --tool-choice)
CHOICES = [("auto", None, "auto", "auto"),
           ("required", None, "required", "required"),
           ("function", "get_weather", {"type": "function", "function": {"name": "get_weather"}}, "get_weather")]


class ACallCutByMaxTokens(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon("", model=cls.model, tokenizer="", prefix="tp-tclen-")

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tp-tclen-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.model = os.path.join(cls.dir, "qwen3-calls-forever.gguf")
        chain = tpdaemon.tokenize(QWEN3, OUTPUT, "--special")
        start = tpdaemon.tokenize(QWEN3, "<|im_start|>assistant\n", "--special")[-1]
        end = tpdaemon.tokenize(QWEN3, "<|im_end|>", "--special")[0]
        assert len(set(chain)) == len(chain) and start not in chain, chain
        chain_model(cls.model, start, chain, end, loop_to=0, seq_len=2048)
        # the cut: WHOLE calls, then the next one up to the token that ends
        # with its first key, `{"city` (its name is whole: it streamed)
        dec = subprocess.run([TOKPIPE, "tokenize", "--tokenizer", QWEN3, "--special", "--decode"],
                             input="".join(" ".join(map(str, chain[:n])) + "\n" for n in range(1, len(chain) + 1)),
                             capture_output=True, text=True, timeout=60, check=True).stdout.split("\n")
        cut = OUTPUT[:OUTPUT.index(ARGS) + len('{"city')]
        into = 1 + next(n for n, text in enumerate(dec) if text.startswith(cut))
        cls.max_tokens = WHOLE * len(chain) + into
        cls.chain = chain
        cls.tools_file = os.path.join(cls.dir, "tools.json")
        with open(cls.tools_file, "w") as f:
            json.dump(TOOLS, f)
        super().setUpClass()

    def check_calls(self, calls, how, whole=WHOLE):
        """calls: [(name, arguments)]: `whole` whole calls, then the cut one."""
        self.assertEqual(len(calls), whole + 1, "%s: %r" % (how, calls))
        for name, args in calls[:whole]:
            self.assertEqual(name, "get_weather", how)
            self.assertEqual(args, ARGS, "%s: a call before the cut is not whole" % how)
            json.loads(args)
        name, args = calls[whole]
        self.assertEqual(name, "get_weather", how)
        self.assertTrue(ARGS.startswith(args) and len(args) > 1 and args != ARGS,
                        "%s: the cut call's arguments %r are not a begun prefix of %r" % (how, args, ARGS))
        with self.assertRaises(ValueError, msg="%s: the cut arguments %r parse as JSON" % (how, args)):
            json.loads(args)

    def finish(self, choice, name, job, **params):
        """SUBMIT over ZeroMQ: (TOKEN events, FINISH)."""
        sub = self.d.subscriber(job)
        self.addCleanup(sub.sock.close, 0)
        submit = {"job_id": job, "messages": [{"role": "user", "content": USER}], "tools": json.dumps(TOOLS),
                  "tool_choice": choice, "params": dict({"temperature": 0.0}, **params)}
        if name:
            submit["tool_choice_name"] = name
        _, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, submit)
        self.assertEqual(ack["status"], 200, ack)
        return sub.collect(job)

    def generate(self, choice, *args):
        p = subprocess.run([TOKPIPE, "generate", "--config", self.d.config, "--json", "--temperature", "0",
                            "--message", "user=" + USER, "--tools", self.tools_file, "--tool-choice", choice, *args],
                           capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        return json.loads(p.stdout)

    def run_json(self, choice, *args):
        p = subprocess.run([TOKPIPE, "run", "--model", self.model, "--json", "--temperature", "0",
                            "--message", "user=" + USER, "--tools", self.tools_file, "--tool-choice", choice, *args],
                           capture_output=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        return json.loads(p.stdout)

    def chat(self, tool_choice, **kw):
        body = dict({"model": "m", "messages": [{"role": "user", "content": USER}], "tools": TOOLS,
                     "tool_choice": tool_choice, "temperature": 0}, **kw)
        st, out, _ = request(self.port, "POST", "/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
        self.assertEqual(st, 200, out)
        return out

    def chat_streamed(self, tool_choice, **kw):
        """The finish_reasons of the streamed chat and its calls as the deltas build them."""
        calls, finish = {}, []
        for ev in sse_events(self.chat(tool_choice, stream=True, **kw)):
            for c in ev["choices"]:
                for t in c["delta"].get("tool_calls") or []:
                    k = calls.setdefault(t["index"], ["", ""])
                    k[0] += t["function"].get("name") or ""
                    k[1] += t["function"].get("arguments") or ""
                if c.get("finish_reason"):
                    finish.append(c["finish_reason"])
        return finish, [tuple(calls[i]) for i in sorted(calls)]

    @staticmethod
    def pairs(calls):
        return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]

    def test_finish_over_zeromq_is_length_and_says_a_call_is_cut(self):
        for choice, name, _, _ in CHOICES:
            with self.subTest(tool_choice=choice):
                tokens, fin = self.finish(choice, name, "tclen-" + choice, max_tokens=self.max_tokens)
                self.assertEqual((fin["reason"], fin.get("detail")), ("length", "max_tokens"), fin)
                self.assertEqual(fin["completion_tokens"], self.max_tokens)
                self.assertEqual([i for t in tokens for i in t["ids"]],
                                 (self.chain * (WHOLE + 1))[:self.max_tokens], "the model did not keep calling")
                self.check_calls([(c["name"], c["arguments"]) for c in fin["tool_calls"]], "FINISH " + choice)
                self.assertIs(fin.get("tool_calls_cut"), True, "FINISH does not say a call is cut: %r" % fin)

    def test_generate_json_says_length(self):
        for _, _, _, choice in CHOICES:
            with self.subTest(tool_choice=choice):
                j = self.generate(choice, "--max-tokens", str(self.max_tokens))
                self.assertEqual((j["finish_reason"], j.get("finish_detail")), ("length", "max_tokens"),
                                 "generate --json: a call cut mid-arguments is reported as finished")
                self.check_calls(self.pairs(j["tool_calls"]), "generate " + choice)

    def test_run_json_says_length(self):
        for _, _, _, choice in CHOICES:
            with self.subTest(tool_choice=choice):
                r = self.run_json(choice, "--max-tokens", str(self.max_tokens))
                self.assertEqual((r["finish_reason"], r.get("finish_detail")), ("length", "max_tokens"),
                                 "run --json: a call cut mid-arguments is reported as finished")
                self.assertEqual(r["tokens"], (self.chain * (WHOLE + 1))[:self.max_tokens])
                self.check_calls(self.pairs(r["tool_calls"]), "run " + choice)

    def test_http_says_length(self):
        for _, _, choice, _ in CHOICES:
            with self.subTest(tool_choice=choice):
                ch = json.loads(self.chat(choice, max_tokens=self.max_tokens))["choices"][0]
                self.assertEqual(ch["finish_reason"], "length",
                                 "HTTP: a call cut mid-arguments is reported as finished")
                self.check_calls(self.pairs(ch["message"]["tool_calls"]), "HTTP %r" % (choice,))

    def test_http_streamed_says_length(self):
        for _, _, choice, _ in CHOICES:
            with self.subTest(tool_choice=choice):
                finish, calls = self.chat_streamed(choice, max_tokens=self.max_tokens)
                self.assertEqual(finish, ["length"], "HTTP streamed: a call cut mid-arguments is reported as finished")
                self.check_calls(calls, "HTTP streamed %r" % (choice,))

    def test_a_call_a_stop_string_cuts_is_not_finished(self):
        # "Paris" first comes in the first call's arguments: the stop
        # string cuts them at {"city":" -- the job stopped, its call did not
        for choice, name, oai, cli in CHOICES:
            with self.subTest(tool_choice=choice):
                _, fin = self.finish(choice, name, "tcstop-" + choice, max_tokens=200, stop=["Paris"])
                self.assertEqual((fin["reason"], fin["matched"]), ("stop_string", "Paris"), fin)
                self.check_calls([(c["name"], c["arguments"]) for c in fin["tool_calls"]], "FINISH " + choice, 0)
                self.assertIs(fin.get("tool_calls_cut"), True, "FINISH does not say a call is cut: %r" % fin)
                for how, j in (("generate", self.generate(cli, "--max-tokens", "200", "--stop", "Paris")),
                               ("run", self.run_json(cli, "--max-tokens", "200", "--stop", "Paris"))):
                    self.assertEqual(j["finish_reason"], "stop_string",
                                     "%s --json: a call a stop string cut is reported as finished" % how)
                    self.check_calls(self.pairs(j["tool_calls"]), how + " " + choice, 0)
                ch = json.loads(self.chat(oai, max_tokens=200, stop=["Paris"]))["choices"][0]
                self.assertEqual(ch["finish_reason"], "stop", "HTTP: a call a stop string cut is reported as finished")
                self.check_calls(self.pairs(ch["message"]["tool_calls"]), "HTTP %r" % (oai,), 0)
                finish, calls = self.chat_streamed(oai, max_tokens=200, stop=["Paris"])
                self.assertEqual(finish, ["stop"], "HTTP streamed: a call a stop string cut is reported as finished")
                self.check_calls(calls, "HTTP streamed %r" % (oai,), 0)


if __name__ == "__main__":
    unittest.main()
