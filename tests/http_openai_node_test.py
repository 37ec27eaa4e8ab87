"""The official OpenAI client from npm ("openai", under Debian's nodejs)
against tokpipe-http spawned by the real tokpiped: completions and streams
give exactly the text and token counts of `tokpipe run` (greedy, seeded,
stops, n > 1), and a refusal reaches the client as OpenAI's error shape;
the client reads logprobs of both endpoints, streamed and not, equal to
`tokpipe run --json`'s.
The client is installed into $BUILD/npm by this test (never committed);
without nodejs/npm or the npm registry the test says so and is skipped."""
import json
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from http_gateway_test import BIN, MODEL, TEMPLATE, TOK, VOCAB, Daemon, lp_of, run_json  # noqa: E402

NPM_DIR = os.path.abspath(os.path.join(os.environ.get("TP_BUILD_DIR", "build"), "npm"))
MODULES = os.path.join(NPM_DIR, "node_modules")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "openai_client.cjs")
LP_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "openai_logprobs.cjs")


def ensure_client():
    """None when the openai package is there (installing it if needed), else why not."""
    if not shutil.which("node") or not shutil.which("npm"):
        return "nodejs/npm not installed"
    if os.path.exists(os.path.join(MODULES, "openai", "package.json")):
        return None
    os.makedirs(NPM_DIR, exist_ok=True)
    p = subprocess.run(["npm", "install", "--prefix", NPM_DIR, "--no-audit", "--no-fund", "--silent", "openai@4"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return "npm install openai failed (no registry?): " + (p.stderr or p.stdout)[-300:]
    return None


class OfficialOpenAIClient(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return Daemon()

    @classmethod
    def setUpClass(cls):
        why = ensure_client()
        if why:
            raise unittest.SkipTest(why)
        super().setUpClass()

    def client(self, requests, script=SCRIPT, port=None):
        inp = json.dumps({"base": "http://127.0.0.1:%d/v1" % (port or self.d.port), "requests": requests})
        p = subprocess.run(["node", script], input=inp, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, NODE_PATH=MODULES))
        self.assertEqual(p.returncode, 0, p.stderr)
        return [json.loads(line) for line in p.stdout.splitlines()]

    def test_completions_and_streams_equal_tokpipe_run(self):
        cases = [
            ("Once upon a time", {"max_tokens": 40, "temperature": 0}, 1),
            ("Once upon a time", {"max_tokens": 60, "temperature": 0, "stop": [" girl"]}, 1),
            ("The cat", {"max_tokens": 50, "temperature": 0.9, "seed": 7, "stop": ["."]}, 3),
            ("Lily found a box", {"max_tokens": 30, "temperature": 1.0, "seed": 11, "stop": ["the ", "Lily"]}, 2),
        ]
        got = self.client([dict(p, model="stories260K", prompt=prompt, n=n) for prompt, p, n in cases])
        reasons = {"length": "length", "stop_string": "stop", "stop_token": "stop", "eos": "stop"}
        for (prompt, p, n), r in zip(cases, got):
            self.assertNotIn("error", r, r)
            self.assertEqual(len(r["choices"]), n)
            total = 0
            for j in range(n):
                want = run_json(prompt, p, j)
                total += want["completion_tokens"]
                c = r["choices"][j]
                self.assertEqual(c["text"], want["text"], (prompt, p, j))
                self.assertEqual(c["finish_reason"], reasons[want["finish_reason"]])
                if want["finish_reason"] == "stop_string":
                    self.assertEqual(c["stop_reason"], want["matched"])
                self.assertEqual(r["stream_texts"][j], want["text"], (prompt, p, j, "streamed"))
                self.assertEqual(r["stream_finish"][j], c["finish_reason"])
            self.assertEqual(r["usage"]["completion_tokens"], total)
            self.assertEqual(r["stream_usage"], r["usage"])

    def test_refusals_reach_the_client_as_openai_errors(self):
        [bad, chat, long] = self.client([
            {"model": "stories260K", "prompt": "x", "top_p": 1.5},
            {"model": "stories260K", "messages": [{"role": "user", "content": "hi"}]},
            {"model": "stories260K", "prompt": "Once upon a time " * 150, "max_tokens": 4},
        ])
        # over the context: the client's error (a 5xx would be retried)
        self.assertEqual(long["error"]["status"], 400, long)
        self.assertEqual((long["error"]["param"], long["error"]["code"]), ("prompt", "context_length_exceeded"))
        self.assertEqual(bad["error"]["status"], 400, bad)
        self.assertEqual(bad["error"]["param"], "top_p")
        self.assertEqual(chat["error"]["status"], 400, chat)
        self.assertEqual(chat["error"]["param"], "messages")

    def test_the_client_reads_completion_logprobs_equal_to_tokpipe_run(self):
        p = {"max_tokens": 30, "temperature": 0.9, "seed": 7, "logprobs": 3}
        [r] = self.client([dict(p, model="stories260K", prompt="The cat", n=2)], LP_SCRIPT)
        self.assertNotIn("error", r, r)
        for j in range(2):
            want = run_json("The cat", p, j)
            lp = r["logprobs"][j]
            self.assertEqual(r["texts"][j], want["text"])
            self.assertEqual(lp["tokens"], [VOCAB[e["id"]].decode("utf-8", "replace") for e in want["logprobs"]])
            for got, e in zip(lp["token_logprobs"], want["logprobs"]):
                self.assertAlmostEqual(got, lp_of(e["logprob"]), places=6)
            self.assertEqual("".join(lp["tokens"]), r["texts"][j])
            self.assertEqual(r["stream_logprobs"][j], lp)
            self.assertEqual(r["stream_texts"][j], r["texts"][j])

    def test_the_client_reads_chat_logprobs_equal_to_tokpipe_run(self):
        d = Daemon(chat_template=TEMPLATE)
        try:
            msgs = [{"role": "user", "content": "Once upon a time"}]
            body = {"model": "stories260K", "messages": msgs, "max_tokens": 25, "temperature": 0.8, "seed": 5,
                    "logprobs": True, "top_logprobs": 2}
            [r] = self.client([body], LP_SCRIPT, d.port)
            self.assertNotIn("error", r, r)
            args = [os.path.join(BIN, "tokpipe"), "run", "--model", MODEL, "--tokenizer", TOK, "--json",
                    "--chat-template", TEMPLATE, "--max-tokens", "25", "--temperature", "0.8", "--seed", "5",
                    "--top-logprobs", "2", "--message", "user=Once upon a time"]
            want = json.loads(subprocess.run(args, capture_output=True, text=True, timeout=120,
                                             check=True).stdout.splitlines()[0])
            content = r["logprobs"][0]["content"]
            self.assertEqual(r["texts"][0], want["text"])
            self.assertEqual([bytes(x["bytes"]) for x in content], [VOCAB[e["id"]] for e in want["logprobs"]])
            for got, e in zip(content, want["logprobs"]):
                self.assertAlmostEqual(got["logprob"], lp_of(e["logprob"]), places=6)
                self.assertEqual([a["token"] for a in got["top_logprobs"]],
                                 [VOCAB[a["id"]].decode("utf-8", "replace") for a in e["top"]])
            self.assertEqual(r["stream_logprobs"][0], r["logprobs"][0])
            self.assertEqual(r["stream_texts"][0], r["texts"][0])
        finally:
            d.stop()


if __name__ == "__main__":
    unittest.main()
