"""Speculative decoding over HTTP: `speculative: {mode, n_max}` (and
llama.cpp's flat `speculative.n_max`) in the body of the OpenAI and
Anthropic endpoints reaches the job; the answer is the same as without it
(and as `tokpipe run`'s), streamed or not, and llama.cpp's `timings` says
how many guesses were verified and taken (draft_n, draft_n_accepted);
`draft` without a draft model and unknown keys are 400s naming the field."""
import http.client
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402

MODELS = os.path.abspath(os.environ.get("TP_MODELS", "../shared/models"))
BIN = os.path.abspath(os.environ.get("TP_BIN_DIR", "bin"))
MODEL = os.path.join(MODELS, "stories260K.bin")
TOK = os.path.join(MODELS, "tok512.bin")
TEMPLATE = os.path.join(MODELS, "chat-templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
PROMPT = "The cat sat on the mat. The cat sat on the mat. The cat sat on the"


def post(port, body, path="/v1/completions"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read()
    c.close()
    if body.get("stream"):
        return r.status, [json.loads(b[6:]) for b in out.split(b"\n\n") if b.startswith(b"data: {")]
    return r.status, json.loads(out)


def run_text(max_tokens, spec):
    args = [os.path.join(BIN, "tokpipe"), "run", "--model", MODEL, "--tokenizer", TOK, "--json", "--prompt", PROMPT,
            "--temperature", "0", "--max-tokens", str(max_tokens), "--ignore-eos"]
    if spec:
        args += ["--speculative", "ngram"]
    return json.loads(subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout)["text"]


class SpeculativeOverHttp(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon(model=MODEL, tokenizer=TOK, chat_template=TEMPLATE)

    BODY = {"prompt": PROMPT, "max_tokens": 90, "temperature": 0, "ignore_eos": True}

    def test_completion_with_speculation_equals_run_and_reports_timings(self):
        want = run_text(90, False)
        self.assertEqual(run_text(90, True), want)
        st, plain = post(self.port, self.BODY)
        self.assertEqual(st, 200, plain)
        self.assertNotIn("timings", plain)
        st, r = post(self.port, dict(self.BODY, speculative={"mode": "ngram", "n_max": 6}))
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["text"], want)
        self.assertEqual(plain["choices"][0]["text"], want)
        t = r["timings"]
        self.assertGreater(t["draft_n_accepted"], 0, t)
        self.assertLessEqual(t["draft_n_accepted"], t["draft_n"])
        self.assertEqual(t["predicted_n"], 90)
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("GET", "/metrics")
        m = dict(line.rsplit(" ", 1) for line in c.getresponse().read().decode().splitlines()
                 if line.startswith("tokpipe_spec_"))
        c.close()
        self.assertGreater(float(m["tokpipe_spec_accepted_total"]), 0, m)
        self.assertGreater(float(m["tokpipe_spec_verify_tokens_total"]), float(m["tokpipe_spec_verify_steps_total"]))

    def test_flat_n_max_is_taken(self):
        st, r = post(self.port, dict(self.BODY, **{"speculative.n_max": 3, "speculative.n_min": 0,
                                                   "speculative.p_min": 0.75, "speculative": {"mode": "ngram"}}))
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["text"], run_text(90, False))

    def test_streamed_chat_with_speculation_equals_plain(self):
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 60, "temperature": 0.7, "seed": 5}
        st, plain = post(self.port, body, "/v1/chat/completions")
        self.assertEqual(st, 200, plain)
        st, events = post(self.port, dict(body, stream=True, speculative={"mode": "ngram"}), "/v1/chat/completions")
        self.assertEqual(st, 200, events)
        text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
        self.assertEqual(text, plain["choices"][0]["message"]["content"])

    def test_anthropic_messages_take_it(self):
        body = {"model": "x", "max_tokens": 50, "temperature": 0, "messages": [{"role": "user", "content": PROMPT}]}
        st, plain = post(self.port, body, "/v1/messages")
        self.assertEqual(st, 200, plain)
        st, r = post(self.port, dict(body, speculative={"mode": "ngram", "n_max": 4}), "/v1/messages")
        self.assertEqual(st, 200, r)
        self.assertEqual(r["content"], plain["content"])

    def test_bad_speculative_fields_are_400s_naming_them(self):
        st, r = post(self.port, dict(self.BODY, speculative={"mode": "draft"}))
        self.assertEqual(st, 400, r)
        self.assertIn("draft model", r["error"]["message"])
        self.assertIn("speculative.mode", r["error"]["param"] or r["error"]["message"])
        for bad, param in (({"mode": "eagle"}, "speculative.mode"), ({"n_max": 17}, "speculative.n_max"),
                           ({"k": 1}, "speculative.k"), ("ngram", "speculative")):
            st, r = post(self.port, dict(self.BODY, speculative=bad))
            self.assertEqual(st, 400, (bad, r))
            self.assertEqual(r["error"]["param"], param, r)


class DraftModelOverHttp(tpdaemon.HttpDaemonCase):
    """Mode draft with stories260K drafting for itself: n choices, stops,
    streamed or not, the same as without speculation; timings counts."""

    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon("speculative:\n  draft_model: %s\n" % MODEL, model=MODEL, tokenizer=TOK,
                                   chat_template=TEMPLATE)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.d.wait_worker("draft")

    def test_n_choices_with_stops_equal_plain_streamed_or_not(self):
        drafted = 0
        for seed in range(4):
            body = {"prompt": PROMPT, "max_tokens": 80, "temperature": 0.8 if seed else 0, "seed": seed, "n": 3,
                    "stop": [" dog", "mat."], "logprobs": 2}
            st, plain = post(self.port, body)
            self.assertEqual(st, 200, plain)
            st, r = post(self.port, dict(body, speculative={"mode": "draft", "n_max": 4 + seed}))
            self.assertEqual(st, 200, r)
            self.assertEqual(len(r["choices"]), 3)
            for a, b in zip(r["choices"], plain["choices"]):
                self.assertEqual(a, b, seed)
            drafted += r["timings"]["draft_n"]
            self.assertLessEqual(r["timings"]["draft_n_accepted"], r["timings"]["draft_n"])
            stream = dict(body, stream=True, stream_options={"include_usage": True})
            st, ev = post(self.port, dict(stream, speculative={"mode": "draft"}))
            self.assertEqual(st, 200, ev)
            st, pev = post(self.port, stream)
            self.assertEqual(st, 200, pev)
            # each choice's chunks in order (the choices' interleaving is the jobs' race)
            by_index = lambda es: [[c for e in es for c in e.get("choices", []) if c["index"] == i]  # noqa: E731
                                   for i in range(3)]
            self.assertEqual(by_index(ev), by_index(pev), seed)
            self.assertIn("timings", ev[-1])  # the usage chunk, last
            self.assertNotIn("timings", pev[-1])
        self.assertGreater(drafted, 0)

    def test_greedy_self_draft_takes_its_guesses(self):
        body = dict(SpeculativeOverHttp.BODY, speculative={"mode": "draft"})
        st, r = post(self.port, body)
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["text"], run_text(90, False))
        self.assertGreater(r["timings"]["draft_n_accepted"], 40, r["timings"])


if __name__ == "__main__":
    unittest.main()
