"""bin/tokpipe-http against the real tokpiped (which spawns it) on stories260K:
completions and SSE streams give exactly the text and token counts of
`tokpipe run --json` for the same parameters (greedy, seeded, stops, n > 1,
token-id prompts); streamed deltas concatenate to the non-streamed text for
every stop case of it_stops; /metrics passes promtool and its counters move;
overload (429 + Retry-After), drain (503), a client that disconnects (its
jobs cancelled), bad JSON / fields (400 naming the field), API keys (401);
logprobs of both endpoints equal run --json's (texts from the tokenizer
file read here), streamed == not, 501 without a readable vocabulary.
Clients: Python's standard library and curl -N."""
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from tpdaemon import free_port  # noqa: E402,F401

MODELS = os.path.abspath(os.environ.get("TP_MODELS", "../shared/models"))
BIN = os.path.abspath(os.environ.get("TP_BIN_DIR", "bin"))
MODEL = os.path.join(MODELS, "stories260K.bin")
TOK = os.path.join(MODELS, "tok512.bin")
MAX_JOBS = 70   # limits.max_concurrent_jobs of the test daemon


def run_json(prompt, p, seed_offset=0):
    """tokpipe run --json for one prompt and the request's parameters."""
    args = [os.path.join(BIN, "tokpipe"), "run", "--model", MODEL, "--tokenizer", TOK, "--json",
            "--prompt", prompt, "--max-tokens", str(p["max_tokens"]),
            "--temperature", str(p.get("temperature", 1.0))]
    if "seed" in p:
        args += ["--seed", str(p["seed"] + seed_offset)]
    for s in p.get("stop", []):
        args += ["--stop", s]
    for i in p.get("stop_token_ids", []):
        args += ["--stop-id", str(i)]
    if p.get("min_tokens"):
        args += ["--min-tokens", str(p["min_tokens"])]
    if p.get("ignore_eos"):
        args += ["--ignore-eos"]
    if p.get("include_stop_str_in_output"):
        args += ["--include-stop"]
    for i, b in p.get("logit_bias", {}).items():
        args += ["--logit-bias", "%s=%g" % (i, b)]
    if "typical_p" in p:
        args += ["--typical-p", str(p["typical_p"])]
    if p.get("logprobs") is not None and p.get("logprobs") is not False:
        args += ["--top-logprobs", str(p.get("top_logprobs", 0) if p["logprobs"] is True else p["logprobs"])]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out.splitlines()[0])


def vocab_bytes(path=TOK):
    """Each id's bytes in generated text, read from the llama2.c tokenizer.bin
    itself: <0xNN> is that byte, <unk>/<s>/</s> (ids 0-2) add nothing."""
    out = []
    with open(path, "rb") as f:
        f.read(4)   # max_token_length
        while True:
            head = f.read(8)
            if len(head) < 8:
                break
            n = int.from_bytes(head[4:8], "little")
            out.append(f.read(n))
    for i, b in enumerate(out):
        if i < 3:
            out[i] = b""
        elif len(b) == 6 and b.startswith(b"<0x") and b.endswith(b">"):
            out[i] = bytes([int(b[3:5], 16)])
    return out


VOCAB = vocab_bytes()


def expected_entries(want, text):
    """The tokens of a tokpipe run --json result whose bytes the text carries
    wholly (README: a stop string's cut drops the token it cuts)."""
    tb = text.encode()
    entries, end = [], 0
    for e in want["logprobs"]:
        b = VOCAB[e["id"]]
        if tb[end:end + len(b)] != b or end + len(b) > len(tb):
            break
        entries.append(e)
        end += len(b)
    if want["finish_reason"] != "stop_string":
        assert len(entries) == len(want["logprobs"]), "run's tokens do not spell its text"
    return entries


def lp_of(v):
    return -9999.0 if v is None else v


class Daemon(tpdaemon.HttpDaemon):
    """tokpiped and its gateway with this file's limits: MAX_JOBS, and a
    drain long enough for the drain test's stream."""

    def __init__(self, extra="", healthy=True, chat_template=None):
        super().__init__("limits:\n  max_concurrent_jobs: %d\nshutdown:\n  drain_timeout_ms: 60000\n" % MAX_JOBS
                         + extra, healthy=healthy, model=MODEL, tokenizer=TOK, chat_template=chat_template)


def request(port, method, path, body=None, headers=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, out, r


def post(port, body, path="/v1/completions", headers=None):
    st, out, r = request(port, "POST", path, body, headers)
    return st, json.loads(out), r


def sse_events(lines):
    """The data: payloads of an SSE byte stream, as parsed JSON (or '[DONE]')."""
    events, buf = [], b""
    for line in lines:
        buf += line
    for block in buf.split(b"\n\n"):
        if not block.strip():
            continue
        assert block.startswith(b"data: "), block
        payload = block[6:].decode()
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def stream(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    assert r.getheader("Content-Type").startswith("text/event-stream")
    events = sse_events([r.read()])
    c.close()
    return events


def texts_of(events, n):
    """Per choice: the deltas, the final chunk."""
    deltas, final = [[] for _ in range(n)], [None] * n
    for e in events[:-1]:
        for ch in e["choices"]:
            if ch["finish_reason"] is None:
                deltas[ch["index"]].append(ch["text"])
            else:
                final[ch["index"]] = ch
    return deltas, final


def wait_idle(port, timeout=120):
    """Until the broker has no active job (a test's jobs must not leak into the next one's counts)."""
    deadline = time.time() + timeout
    while True:
        _, m, _ = request(port, "GET", "/metrics")
        if metric(m.decode(), "tokpipe_jobs_active") == 0:
            return
        if time.time() > deadline:
            raise AssertionError("jobs still active after %d s" % timeout)
        time.sleep(0.05)


def promtool_check(test, text):
    """/metrics passes `promtool check metrics` (when installed), except
    that the inference gateway's vllm: names carry the colon it lints
    against: those names are what the endpoint picker reads."""
    if not shutil.which("promtool"):
        return
    p = subprocess.run(["promtool", "check", "metrics"], input=text if isinstance(text, bytes) else text.encode(),
                       capture_output=True, text=False)
    out = (p.stdout + p.stderr).decode()
    rest = [l for l in out.splitlines() if not re.match(r"^vllm:\w+ metric names should not contain ':'$", l)]
    test.assertEqual(rest, [], out)
    test.assertIn(p.returncode, (0, 3), out)   # 3: lint problems (only the colons, above)


def metric(text, name, labels=""):
    key = name + ("{" + labels + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    raise AssertionError("no sample %s in /metrics" % key)


class GatewayAnswersLikeTokpipeRun(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return Daemon()

    def setUp(self):
        wait_idle(self.port)   # the jobs a test cancelled must not be refused or counted in the next

    def check_like_run(self, prompt, p, choice, offset=0):
        want = run_json(prompt, p, offset)
        self.assertEqual(choice["text"], want["text"], (prompt, p))
        reason = {"length": "length", "stop_string": "stop", "stop_token": "stop", "eos": "stop"}
        self.assertEqual(choice["finish_reason"], reason[want["finish_reason"]], (prompt, p, want))
        if want["finish_reason"] == "stop_string":
            self.assertEqual(choice["stop_reason"], want["matched"])
        if want["finish_reason"] == "stop_token":
            self.assertEqual(choice["stop_reason"], want["matched"])
        return want

    def test_greedy_completion_equals_tokpipe_run(self):
        p = {"max_tokens": 40, "temperature": 0}
        st, r, _ = post(self.port, dict(p, model="stories260K", prompt="Once upon a time"))
        self.assertEqual(st, 200, r)
        self.assertEqual(r["object"], "text_completion")
        self.assertTrue(r["id"].startswith("cmpl-"))
        self.assertIsInstance(r["created"], int)
        want = self.check_like_run("Once upon a time", p, r["choices"][0])
        self.assertEqual(r["usage"]["completion_tokens"], want["completion_tokens"])
        self.assertEqual(r["usage"]["prompt_tokens"], want["prompt_tokens"])
        self.assertEqual(r["usage"]["total_tokens"], want["prompt_tokens"] + want["completion_tokens"])

    def test_n_choices_use_seed_plus_index_and_each_equals_tokpipe_run(self):
        p = {"max_tokens": 50, "temperature": 0.9, "seed": 41, "stop": ["."]}
        st, r, _ = post(self.port, dict(p, prompt="The cat", n=3))
        self.assertEqual(st, 200, r)
        self.assertEqual([c["index"] for c in r["choices"]], [0, 1, 2])
        total = 0
        for j, c in enumerate(r["choices"]):
            total += self.check_like_run("The cat", p, c, j)["completion_tokens"]
        self.assertEqual(r["usage"]["completion_tokens"], total)
        self.assertGreater(len({c["text"] for c in r["choices"]}), 1, "n seeds gave one sample")

    def test_logit_bias_and_typical_p_reach_the_sampler(self):
        greedy = run_json("Once upon a time", {"max_tokens": 20, "temperature": 0})
        # ban the greedy run's first token: a different text, the same as tokpipe run's
        p = {"max_tokens": 20, "temperature": 0, "logit_bias": {str(greedy["tokens"][0]): -100}}
        st, r, _ = post(self.port, dict(p, prompt="Once upon a time"))
        self.assertEqual(st, 200, r)
        self.assertNotEqual(r["choices"][0]["text"], greedy["text"])
        self.check_like_run("Once upon a time", p, r["choices"][0])
        p = {"max_tokens": 30, "temperature": 1.0, "seed": 3, "typical_p": 0.5}
        st, r, _ = post(self.port, dict(p, prompt="Once upon a time"))
        self.assertEqual(st, 200, r)
        self.check_like_run("Once upon a time", p, r["choices"][0])
        st, r, _ = post(self.port, {"prompt": "x", "logit_bias": {"99999": 1}})
        self.assertEqual(st, 400, r)
        self.assertTrue(r["error"]["param"].startswith("logit_bias"), r)

    def test_prompt_lists_and_token_ids_give_one_choice_each(self):
        # "Once upon a time" as the ids tokpipe tokenizes it to (BOS first)
        out = subprocess.run([os.path.join(BIN, "tokpipe"), "tokenize", "--tokenizer", TOK, "--bos"],
                             input="Once upon a time\n", capture_output=True, text=True, check=True).stdout
        ids = [int(x) for x in out.split()]
        p = {"max_tokens": 20, "temperature": 0}
        st, r, _ = post(self.port, dict(p, prompt=["Lily found a box", "One day"]))
        self.assertEqual(st, 200, r)
        self.check_like_run("Lily found a box", p, r["choices"][0])
        self.check_like_run("One day", p, r["choices"][1])
        st, r2, _ = post(self.port, dict(p, prompt=ids))
        self.assertEqual(st, 200, r2)
        st, r1, _ = post(self.port, dict(p, prompt="Once upon a time"))
        self.assertEqual(r2["choices"][0]["text"], r1["choices"][0]["text"])
        self.assertEqual(r2["usage"], r1["usage"])

    def stop_cases(self):
        probe = run_json("Once upon a time", {"max_tokens": 60, "temperature": 0.9, "seed": 5})
        text, ids = probe["text"], probe["tokens"]
        mid, early = text[12:17], text[2:4]
        base = {"temperature": 0.9, "seed": 5, "max_tokens": 60}
        return [
            dict(base, stop_token_ids=[ids[6]]),
            dict(base, stop=[mid]),
            dict(base, stop=[mid], include_stop_str_in_output=True),
            dict(base, min_tokens=8, stop=[early]),
            {"temperature": 0.8, "seed": 9, "max_tokens": 80, "stop": ["the ", "a b", "Lily", "xyzzy"]},
            {"temperature": 1.0, "seed": 1, "max_tokens": 7},
            {"temperature": 0, "max_tokens": 400},
            {"temperature": 1.0, "seed": 21, "max_tokens": 300, "stop": ["\n"]},
            {"temperature": 1.0, "seed": 8, "max_tokens": 40, "ignore_eos": True, "stop": ["."]},
        ]

    def test_streamed_deltas_concatenate_to_the_completion_for_every_stop_case(self):
        reasons = set()
        for p in self.stop_cases():
            body = dict(p, prompt="Once upon a time")
            st, whole, _ = post(self.port, body)
            self.assertEqual(st, 200, whole)
            want = self.check_like_run("Once upon a time", p, whole["choices"][0])
            reasons.add(want["finish_reason"])
            events = stream(self.port, dict(body, stream_options={"include_usage": True}))
            self.assertEqual(events[-1], "[DONE]")
            usage = events[-2]
            self.assertEqual(usage["choices"], [])
            self.assertEqual(usage["usage"], whole["usage"], p)
            deltas, final = texts_of(events[:-1], 1)
            # deltas only grow the text: a byte a stop removes would make the
            # concatenation differ from the final text
            self.assertEqual("".join(deltas[0]), whole["choices"][0]["text"], p)
            self.assertNotIn("", deltas[0], "an empty delta was sent")
            self.assertEqual(final[0]["finish_reason"], whole["choices"][0]["finish_reason"])
            self.assertEqual(final[0]["stop_reason"], whole["choices"][0]["stop_reason"])
        self.assertTrue({"stop_string", "stop_token", "length"} <= reasons, reasons)

    def check_legacy_logprobs(self, lp, want, text, n_top, p):
        entries = expected_entries(want, text)
        strs = [VOCAB[e["id"]].decode("utf-8", "replace") for e in entries]
        self.assertEqual(lp["tokens"], strs, p)
        self.assertEqual(len(lp["token_logprobs"]), len(entries))
        for got, e in zip(lp["token_logprobs"], entries):
            self.assertAlmostEqual(got, lp_of(e["logprob"]), places=6)
        offs, n = [], 0
        for t in strs:
            offs.append(n)
            n += len(t)
        self.assertEqual(lp["text_offset"], offs, p)
        for got, e in zip(lp["top_logprobs"], entries):
            top = {}
            for a in e["top"][:n_top] + [e]:
                top.setdefault(VOCAB[a["id"]].decode("utf-8", "replace"), lp_of(a["logprob"]))
            self.assertEqual(sorted(got), sorted(top), p)
            for k in top:
                self.assertAlmostEqual(got[k], top[k], places=6)
        joined = "".join(strs)
        if want["finish_reason"] == "stop_string":
            self.assertTrue(text.startswith(joined), (text, joined))
        else:
            self.assertEqual(joined, text, p)

    def test_completion_logprobs_equal_tokpipe_run_streamed_and_not(self):
        cases = [dict(c, logprobs=k % 6) for k, c in enumerate(self.stop_cases())]
        cases.append({"temperature": 0, "max_tokens": 30, "logprobs": 5, "logit_bias": {"432": -100}})
        cut = 0
        for p in cases:
            body = dict(p, prompt="Once upon a time")
            st, whole, _ = post(self.port, body)
            self.assertEqual(st, 200, whole)
            want = self.check_like_run("Once upon a time", p, whole["choices"][0])
            c = whole["choices"][0]
            self.check_legacy_logprobs(c["logprobs"], want, c["text"], p["logprobs"], p)
            cut += len(c["logprobs"]["tokens"]) < want["completion_tokens"]
            events = stream(self.port, body)
            got = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            text = ""
            for e in events[:-1]:
                ch = e["choices"][0]
                if ch["finish_reason"] is not None:
                    self.assertIsNone(ch["logprobs"])
                    continue
                text += ch["text"]
                for k in got:
                    got[k] += ch["logprobs"][k]
                # a chunk's entries end inside the text sent so far
                self.assertTrue(text.startswith("".join(got["tokens"])), (text, got["tokens"]))
            self.assertEqual(text, c["text"])
            self.assertEqual(got, c["logprobs"], p)
        self.assertGreater(cut, 0, "no case had a stop string cut a token")
        st, r, _ = post(self.port, {"prompt": "x", "logprobs": 6})
        self.assertEqual((st, r["error"]["param"]), (400, "logprobs"), r)
        self.assertIn("[0, 5]", r["error"]["message"])
        st, r, _ = post(self.port, {"prompt": "x", "top_logprobs": 2})
        self.assertEqual((st, r["error"]["param"]), (400, "top_logprobs"), r)

    def test_logprobs_follow_an_empty_prompt_and_an_id_prompt(self):
        # after BOS alone a SentencePiece token loses its leading space: the
        # entries must still spell the text
        for prompt in ([1], [1, 403]):
            p = {"temperature": 0.7, "seed": 2, "max_tokens": 25, "logprobs": 1}
            st, r, _ = post(self.port, dict(p, prompt=prompt))
            self.assertEqual(st, 200, r)
            c = r["choices"][0]
            self.assertEqual("".join(c["logprobs"]["tokens"]), c["text"], prompt)
            self.assertEqual(len(c["logprobs"]["tokens"]), r["usage"]["completion_tokens"])

    def test_curl_streams_the_same_text(self):
        body = {"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0.9, "seed": 5, "stop": [" the"],
                "stream": True}
        out = subprocess.run(["curl", "-sN", "--max-time", "60", "-H", "Content-Type: application/json",
                              "-d", json.dumps(body), "http://127.0.0.1:%d/v1/completions" % self.port],
                             capture_output=True, check=True).stdout
        events = sse_events([out])
        self.assertEqual(events[-1], "[DONE]")
        deltas, final = texts_of(events, 1)
        want = run_json("Once upon a time", body)
        self.assertEqual("".join(deltas[0]), want["text"])
        out = subprocess.run(["curl", "-s", "--max-time", "60", "-d", json.dumps(dict(body, stream=False)),
                              "http://127.0.0.1:%d/v1/completions" % self.port], capture_output=True,
                             check=True).stdout
        self.assertEqual(json.loads(out)["choices"][0]["text"], want["text"])

    def test_metrics_pass_promtool_and_counters_move(self):
        wait_idle(self.port)
        st, before, _ = request(self.port, "GET", "/metrics")
        self.assertEqual(st, 200)
        promtool_check(self, before)
        before = before.decode()
        st, r, _ = post(self.port, {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0,
                                    "stop": [" girl"]})
        self.assertEqual(st, 200, r)
        _, after, _ = request(self.port, "GET", "/metrics")
        after = after.decode()
        for name, labels, delta in [("tokpipe_jobs_submitted_total", "", 1),
                                    ("tokpipe_jobs_finished_total", 'reason="stop_string"', 1),
                                    ("tokpipe_tokens_generated_total", "", r["usage"]["completion_tokens"]),
                                    ("tokpipe_stop_string_triggers_total", 'stop=" girl"', 1)]:
            old = metric(before, name, labels) if (name + "{" + labels) in before or not labels else 0
            self.assertGreaterEqual(metric(after, name, labels) - old, delta, name)
        self.assertEqual(metric(after, "tokpipe_workers", 'stage="forward"'), 1)
        # the broker's histograms and gauges (STATS) reach /metrics
        n = r["usage"]["completion_tokens"]
        for name, delta in [("tokpipe_time_to_first_token_seconds_count", 1),
                            ("tokpipe_e2e_request_latency_seconds_count", 1),
                            ("tokpipe_queue_time_seconds_count", 1),
                            ("tokpipe_inter_token_latency_seconds_count", n - 1)]:
            self.assertGreaterEqual(metric(after, name) - metric(before, name), delta, name)
            self.assertEqual(metric(after, name[:-6] + "_bucket", 'le="+Inf"'), metric(after, name), name)
        self.assertEqual(metric(after, "tokpipe_kv_slots_capacity"), 64)
        self.assertIn("tokpipe_jobs_running", after)
        # and `tokpipe stats` shows the same histograms
        out = subprocess.run([os.path.join(BIN, "tokpipe"), "stats", "--json", "--config", self.d.config],
                             capture_output=True, text=True, check=True).stdout
        st = json.loads(out)
        self.assertEqual(st["histograms"]["ttft_us"]["count"],
                         metric(after, "tokpipe_time_to_first_token_seconds_count"))
        self.assertEqual(sum(st["histograms"]["e2e_us"]["buckets"]), st["histograms"]["e2e_us"]["count"])
        # README: /metrics has everything `tokpipe stats` has, the event counters included
        for key, name in [("events_duplicate", "tokpipe_events_duplicate_total"),
                          ("events_refused", "tokpipe_events_refused_total"),
                          ("jobs_poisoned", "tokpipe_jobs_poisoned_total"),
                          ("workers_hung", "tokpipe_workers_hung_total"),
                          ("replies_refused", "tokpipe_replies_refused_total")]:
            self.assertEqual(metric(after, name), st.get(key, 0), name)

    def test_stop_string_labels_are_capped_and_the_rest_folded(self):
        # 60 jobs, each stopped by its own 3-byte stop string (a different
        # slice of the greedy text): more distinct strings than labels
        base = {"max_tokens": 80, "temperature": 0}
        text = run_json("Once upon a time", base)["text"]
        stops = [p for p in dict.fromkeys(text[i:i + 3] for i in range(len(text) - 3))][:60]
        self.assertGreater(len(stops), 50, "the text has too few distinct pieces")
        _, before, _ = request(self.port, "GET", "/metrics")
        jobs = [{"prompt": "Once upon a time", "stop": [p]} for p in stops]
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            results = list(ex.map(lambda b: post(self.port, dict(base, **b)), jobs))
        matched = [res[1]["choices"][0]["stop_reason"] for res in results]
        self.assertEqual(matched, stops)
        _, after, _ = request(self.port, "GET", "/metrics")
        after = after.decode()
        labels = [l for l in after.splitlines() if l.startswith("tokpipe_stop_string_triggers_total{")]
        self.assertLessEqual(len(labels), 50)
        self.assertGreaterEqual(metric(after, "tokpipe_stop_triggers_other_total"), len(stops) - 50)
        total = sum(float(l.split()[-1]) for l in labels) + metric(after, "tokpipe_stop_triggers_other_total")
        old = [l for l in before.decode().splitlines() if l.startswith("tokpipe_stop_string_triggers_total{")]
        old_total = sum(float(l.split()[-1]) for l in old) + metric(before.decode(), "tokpipe_stop_triggers_other_total")
        self.assertEqual(total - old_total, len(stops), "a trigger was lost from the string counters")
        promtool_check(self, after)

    def test_health_and_models(self):
        st, body, _ = request(self.port, "GET", "/health")
        self.assertEqual(st, 200)
        self.assertEqual(json.loads(body)["status"], "ok")
        st, body, _ = request(self.port, "GET", "/v1/models")
        self.assertEqual(json.loads(body)["data"][0]["id"], "stories260K")

    def test_bad_requests_are_400_naming_the_field(self):
        cases = [(b"{not json", None), ({"prompt": "x", "top_p": 1.5}, "top_p"),
                 ({"prompt": "x", "max_token": 5}, "max_token"), ({"prompt": "x", "temperature": "hot"}, "temperature"),
                 ({"prompt": "x", "stop_token_ids": [99999]}, "stop_token_ids[0]"), ({"max_tokens": 5}, "prompt"),
                 ({"prompt": "x", "n": 0}, "n"), ({"prompt": [1, "a"]}, "prompt[1]")]
        for body, param in cases:
            st, r, _ = post(self.port, body)
            self.assertEqual(st, 400, (body, r))
            self.assertEqual(r["error"]["param"], param, (body, r))
            self.assertEqual(r["error"]["type"], "invalid_request_error")
            if param:
                self.assertIn(param.split("[")[0], r["error"]["message"])
        st, r, _ = post(self.port, {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                        path="/v1/chat/completions")
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["param"], "messages")
        # a turn the SUBMIT encoder refuses is named too, without the encoder's preamble
        st, r, _ = post(self.port, {"messages": [{"role": "u" * 65, "content": "hi"}]}, path="/v1/chat/completions")
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["param"], "messages[0].role", r)
        self.assertTrue(r["error"]["message"].startswith("messages[0].role: "), r)
        st, _, _ = request(self.port, "GET", "/v1/completions")
        self.assertEqual(st, 405)
        st, body, _ = request(self.port, "GET", "/v2/nothing")
        self.assertEqual(st, 404)
        self.assertIn("error", json.loads(body))

    def test_overload_is_429_with_retry_after(self):
        st, r, resp = post(self.port, {"prompt": "Once", "n": MAX_JOBS + 10, "max_tokens": 100,
                                       "ignore_eos": True})
        self.assertEqual(st, 429, r)
        self.assertEqual(resp.getheader("Retry-After"), "1")
        self.assertEqual(r["error"]["type"], "rate_limit_error")

    def test_a_client_that_disconnects_cancels_its_jobs(self):
        wait_idle(self.port)
        _, m, _ = request(self.port, "GET", "/metrics")
        before = metric(m.decode(), "tokpipe_jobs_finished_total", 'reason="cancelled"')
        s = socket.create_connection(("127.0.0.1", self.port))
        body = json.dumps({"prompt": "Once upon a time", "n": 60, "max_tokens": 450, "ignore_eos": True,
                           "temperature": 1.0, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            self.assertTrue(chunk, "stream closed before the first event")
            got += chunk
        s.close()
        deadline = time.time() + 60
        text = self.metrics_once_cancelled(before, deadline)
        self.assertGreaterEqual(metric(text, "tokpipe_http_client_disconnects_total"), 1)
        wait_idle(self.port)

    def test_metrics_carry_what_a_kubernetes_inference_gateway_reads(self):
        # issue 37: the endpoint picker of the Gateway API Inference
        # Extension reads vllm:num_requests_waiting, vllm:num_requests_running
        # and vllm:kv_cache_usage_perc (a fraction) by default
        wait_idle(self.port)
        _, m, _ = request(self.port, "GET", "/metrics")
        idle = m.decode()
        for name in ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                     "vllm:gpu_cache_usage_perc"]:
            self.assertIn("# TYPE %s gauge\n" % name, idle, name)
            self.assertEqual(metric(idle, name), 0, name)
        self.assertEqual(metric(idle, "tokpipe_kv_bytes_held"), 0)
        s = socket.create_connection(("127.0.0.1", self.port))
        body = json.dumps({"prompt": "Once upon a time", "n": 4, "max_tokens": 450, "ignore_eos": True,
                           "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            self.assertTrue(chunk, "stream closed before the first event")
            got += chunk
        _, m, _ = request(self.port, "GET", "/metrics")
        busy = m.decode()
        s.close()
        promtool_check(self, busy)
        self.assertEqual(metric(busy, "vllm:num_requests_running"), metric(busy, "tokpipe_jobs_running"))
        self.assertEqual(metric(busy, "vllm:num_requests_waiting"), metric(busy, "tokpipe_jobs_waiting"))
        self.assertGreaterEqual(metric(busy, "vllm:num_requests_running"), 1, "a streaming job is not running")
        use = metric(busy, "tokpipe_kv_slots_used") / metric(busy, "tokpipe_kv_slots_capacity")
        self.assertAlmostEqual(metric(busy, "vllm:kv_cache_usage_perc"), use, places=5)
        self.assertAlmostEqual(metric(busy, "vllm:gpu_cache_usage_perc"), use, places=5)
        self.assertGreater(use, 0, "the running jobs hold no KV slot")
        self.assertLessEqual(use, 1)
        held = metric(busy, "tokpipe_kv_bytes_held")
        self.assertGreater(held, 0, "the running jobs hold no KV bytes")
        self.assertLessEqual(held, metric(busy, "tokpipe_kv_bytes_capacity"))
        wait_idle(self.port)

    def metrics_once_cancelled(self, before, deadline):
        """The /metrics text once more than `before` jobs finished cancelled."""
        while True:
            _, m, _ = request(self.port, "GET", "/metrics")
            text = m.decode()
            if metric(text, "tokpipe_jobs_finished_total", 'reason="cancelled"') > before:
                return text
            self.assertLess(time.time(), deadline, "no job was cancelled after the client left")
            time.sleep(0.05)

    def test_a_client_that_leaves_before_a_whole_completion_cancels_its_jobs(self):
        # not streamed: nothing is written until the end, so the gateway
        # watches the waiting connection for the hang-up itself
        wait_idle(self.port)
        _, m, _ = request(self.port, "GET", "/metrics")
        before = metric(m.decode(), "tokpipe_jobs_finished_total", 'reason="cancelled"')
        gone = metric(m.decode(), "tokpipe_http_client_disconnects_total")
        s = socket.create_connection(("127.0.0.1", self.port))
        body = json.dumps({"prompt": "Once upon a time", "n": 60, "max_tokens": 450, "ignore_eos": True,
                           "temperature": 1.0}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.time() + 60
        while True:   # wait until its jobs run, then leave
            _, m, _ = request(self.port, "GET", "/metrics")
            if metric(m.decode(), "tokpipe_jobs_running") > 0:
                break
            self.assertLess(time.time(), deadline, "the jobs never ran")
        s.close()
        text = self.metrics_once_cancelled(before, deadline)
        self.assertEqual(metric(text, "tokpipe_http_client_disconnects_total"), gone + 1)
        wait_idle(self.port)


@unittest.skipUnless(os.path.exists(os.path.join(BIN, "tokpipe-http")), "bin/tokpipe-http not built")
class GatewayKeysAndDrain(unittest.TestCase):
    def test_api_keys_and_a_draining_broker(self):
        d = Daemon()
        try:
            # a standalone gateway (as deploy/tokpipe-http.service runs it) with API keys
            keys = os.path.join(d.dir, "keys")
            with open(keys, "w") as f:
                f.write("# operators\nsk-test-123 alice\n\nsk-other\n")
            os.chmod(keys, stat.S_IRUSR | stat.S_IWUSR)
            cfg2 = os.path.join(d.dir, "gw.yaml")
            port2 = free_port()
            with open(d.config) as f, open(cfg2, "w") as g:
                g.write(f.read().replace("http:\n  port: %d\n" % d.port,
                                         "http:\n  port: %d\n  api_key_file: %s\n" % (port2, json.dumps(keys))))
            gw = subprocess.Popen([os.path.join(BIN, "tokpipe-http"), "--config", cfg2],
                                  stderr=subprocess.PIPE)
            try:
                self.assertTrue(tpdaemon.wait_health(port2, 30, gone=lambda: gw.poll() is not None),
                                "standalone gateway not up")
                body = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}
                st, r, resp = post(port2, body)
                self.assertEqual(st, 401, r)
                self.assertEqual(resp.getheader("WWW-Authenticate"), "Bearer")
                st, r, _ = post(port2, body, headers={"Authorization": "Bearer sk-wrong"})
                self.assertEqual(st, 401, r)
                st, r, _ = post(port2, body, headers={"Authorization": "Bearer sk-other"})
                self.assertEqual(st, 200, r)
                st, r, _ = post(port2, body, headers={"Authorization": "Bearer sk-test-123"})
                self.assertEqual(st, 200, r)
                # Anthropic's clients send x-api-key; /v1/messages answers in its error shape
                st, r, _ = post(port2, body, headers={"x-api-key": "sk-other"})
                self.assertEqual(st, 200, r)
                st, r, _ = post(port2, {"max_tokens": 5}, path="/v1/messages", headers={"x-api-key": "sk-wrong"})
                self.assertEqual((st, r["type"], r["error"]["type"]), (401, "error", "authentication_error"), r)
            finally:
                gw.send_signal(signal.SIGTERM)
                self.assertEqual(gw.wait(30), 0, gw.stderr.read())
                gw.stderr.close()

            # drain: a long stream keeps the broker draining; a new request is 503
            c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=120)
            c.request("POST", "/v1/completions", body=json.dumps(
                {"prompt": "Once", "n": 40, "max_tokens": 450, "ignore_eos": True, "stream": True}),
                headers={"Content-Type": "application/json"})
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            self.assertTrue(r.read(6).startswith(b"data: "))
            d.proc.send_signal(signal.SIGTERM)
            deadline = time.time() + 30
            while True:
                st, body, _ = post(d.port, {"prompt": "Once", "max_tokens": 5})
                if st == 503:
                    break
                self.assertEqual(st, 200, body)   # SIGTERM not seen yet
                self.assertLess(time.time(), deadline, "never answered 503 while draining")
            self.assertRegex(body["error"]["message"], "shutting down|drain")
            rest = r.read()   # the running stream still completes
            self.assertTrue(rest.rstrip().endswith(b"data: [DONE]"), rest[-200:])
            c.close()
        finally:
            d.stop()


TEMPLATE = os.path.join(MODELS, "chat-templates", "Qwen-Qwen2.5-7B-Instruct.jinja")


@unittest.skipUnless(os.path.exists(os.path.join(BIN, "tokpipe-http")) and os.path.exists(TEMPLATE),
                     "bin/tokpipe-http not built or no chat template in the models")
class GatewayChat(unittest.TestCase):
    def test_chat_completions_equal_tokpipe_run_with_the_same_template(self):
        d = Daemon(chat_template=TEMPLATE)
        try:
            msgs = [{"role": "system", "content": "You tell stories."},
                    {"role": "user", "content": "Once upon a time"}]
            body = {"model": "stories260K", "messages": msgs, "max_tokens": 30, "temperature": 0}
            st, r, _ = post(d.port, body, path="/v1/chat/completions")
            self.assertEqual(st, 200, r)
            self.assertEqual(r["object"], "chat.completion")
            self.assertTrue(r["id"].startswith("chatcmpl-"))
            c = r["choices"][0]
            self.assertEqual(c["message"]["role"], "assistant")
            args = [os.path.join(BIN, "tokpipe"), "run", "--model", MODEL, "--tokenizer", TOK, "--json",
                    "--chat-template", TEMPLATE, "--max-tokens", "30", "--temperature", "0"]
            for m in msgs:
                args += ["--message", "%s=%s" % (m["role"], m["content"])]
            want = json.loads(subprocess.run(args, capture_output=True, text=True, timeout=120,
                                             check=True).stdout.splitlines()[0])
            self.assertEqual(c["message"]["content"], want["text"])
            self.assertEqual(r["usage"]["completion_tokens"], want["completion_tokens"])
            self.assertEqual(r["usage"]["prompt_tokens"], want["prompt_tokens"])
            # streamed: chat.completion.chunk deltas concatenate to the same text
            conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=120)
            conn.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True)),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.assertEqual(resp.status, 200)
            events = sse_events([resp.read()])
            conn.close()
            self.assertEqual(events[-1], "[DONE]")
            text = "".join(ch["delta"].get("content", "") for e in events[:-1] for ch in e["choices"])
            self.assertEqual(text, want["text"])
            self.assertTrue(all(e["object"] == "chat.completion.chunk" for e in events[:-1]))
            # README "Chat": every delta carries role: assistant, the finishing chunk's too
            self.assertEqual([ch["delta"].get("role") for e in events[:-1] for ch in e["choices"]],
                             ["assistant"] * sum(len(e["choices"]) for e in events[:-1]))
            self.check_chat_logprobs(d, msgs, args)
        finally:
            d.stop()


    def check_chat_logprobs(self, d, msgs, args):
        """logprobs: true + top_logprobs: each content item equals tokpipe run's
        entry (token text, bytes from the vocabulary file), streamed == not."""
        body = {"messages": msgs, "max_tokens": 30, "temperature": 0.8, "seed": 4, "logprobs": True,
                "top_logprobs": 3}
        st, r, _ = post(d.port, body, path="/v1/chat/completions")
        self.assertEqual(st, 200, r)
        run = args[:]
        run[run.index("--temperature") + 1] = "0.8"
        run += ["--seed", "4", "--top-logprobs", "3"]
        want = json.loads(subprocess.run(run, capture_output=True, text=True, timeout=120,
                                         check=True).stdout.splitlines()[0])
        c = r["choices"][0]
        self.assertEqual(c["message"]["content"], want["text"])
        content = c["logprobs"]["content"]
        self.assertEqual(len(content), want["completion_tokens"])
        for got, e in zip(content, want["logprobs"]):
            b = VOCAB[e["id"]]
            self.assertEqual(bytes(got["bytes"]), b)
            self.assertEqual(got["token"], b.decode("utf-8", "replace"))
            self.assertAlmostEqual(got["logprob"], lp_of(e["logprob"]), places=6)
            self.assertEqual([bytes(a["bytes"]) for a in got["top_logprobs"]], [VOCAB[a["id"]] for a in e["top"]])
            for ga, ea in zip(got["top_logprobs"], e["top"]):
                self.assertAlmostEqual(ga["logprob"], lp_of(ea["logprob"]), places=6)
        self.assertEqual(b"".join(bytes(x["bytes"]) for x in content), want["text"].encode())
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=120)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True)),
                     headers={"Content-Type": "application/json"})
        events = sse_events([conn.getresponse().read()])
        conn.close()
        streamed = [x for e in events[:-1] for ch in e["choices"] if ch["logprobs"]
                    for x in ch["logprobs"]["content"]]
        self.assertEqual(streamed, content)
        for bad, param in (({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21},
                           "top_logprobs"), ({"logprobs": 2}, "logprobs")):
            st, r, _ = post(d.port, dict({"messages": msgs}, **bad), path="/v1/chat/completions")
            self.assertEqual((st, r["error"]["param"]), (400, param), r)


@unittest.skipUnless(os.path.exists(os.path.join(BIN, "tokpipe-http")), "bin/tokpipe-http not built")
class GatewayWithoutAVocabulary(unittest.TestCase):
    def test_logprobs_are_501_naming_the_field_and_the_rest_still_served(self):
        # no broker either: a request without logprobs reaches the bridge and
        # times out (503), so the 501 comes from the gateway alone
        d = tempfile.mkdtemp(prefix="tp-http-novocab-")
        port = free_port()
        cfg = os.path.join(d, "tokpipe.yaml")
        with open(cfg, "w") as f:
            f.write("runtime_dir: %s\n" % json.dumps(os.path.join(d, "rt")))
            f.write("model:\n  path: %s\n  tokenizer: %s\n" % (json.dumps(MODEL), json.dumps(os.path.join(d, "none.bin"))))
            f.write("http:\n  port: %d\n  timeout_ms: 300\n" % port)
        log = open(os.path.join(d, "log"), "wb")
        proc = subprocess.Popen([os.path.join(BIN, "tokpipe-http"), "--config", cfg], stdout=log, stderr=log)
        try:
            deadline = time.time() + 30
            while True:
                try:
                    st, r, _ = post(port, {"prompt": "x", "logprobs": 1})
                    break
                except OSError:
                    if time.time() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.05)
            self.assertEqual((st, r["error"]["param"]), (501, "logprobs"), r)
            self.assertIn("none.bin", r["error"]["message"])
            st, r, _ = post(port, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True},
                            path="/v1/chat/completions")
            self.assertEqual(st, 501, r)
            st, r, _ = post(port, {"prompt": "x"})
            self.assertEqual(st, 503, r)
            self.assertIn("timeout_ms", r["error"]["message"])
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
            shutil.rmtree(d, ignore_errors=True)


@unittest.skipUnless(os.path.exists(os.path.join(BIN, "tokpipe-http")), "bin/tokpipe-http not built")
class GatewayWithoutAStopWorker(unittest.TestCase):
    def test_health_and_completions_are_503_naming_the_missing_stage(self):
        d = Daemon(extra="workers:\n  stop: 0\n", healthy=False)
        try:
            # the other workers register while they load (a slow machine's
            # forward worker may come after the gateway's first answer)
            deadline = time.time() + 60
            while True:
                st, body, _ = request(d.port, "GET", "/health")
                h = json.loads(body)
                if h.get("missing") == ["stop"] or time.time() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(st, 503)
            self.assertEqual(h["missing"], ["stop"])
            self.assertIn("stop", h["message"])
            self.assertEqual(h["workers"]["forward"], 1)
            st, r, _ = post(d.port, {"prompt": "Once", "max_tokens": 5})
            self.assertEqual(st, 503, r)
            self.assertIn("stop", r["error"]["message"])
            self.assertEqual(r["error"]["type"], "service_unavailable")
        finally:
            d.stop()


if __name__ == "__main__":
    unittest.main()
