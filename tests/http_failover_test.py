"""Process story: failover an HTTP client never sees (issue 37 item 4).
A primary and a backup tokpiped on loopback (as standby_test.py), workers
that know both, and tokpipe-http configured with both (endpoints.* and
standby.peer_*). Streaming chat completions, greedy and seeded, are in
flight when the primary is killed: the gateway hears its heartbeats stop,
submits each open job to the backup under the same id and seed, drops the
events it already forwarded, and every stream ends byte-identical (its
content, finish and usage) to an undisturbed run; a non-streamed request
just completes. /metrics counts the resumed streams."""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "support"))
sys.path.insert(0, HERE)
import tpdaemon  # noqa: E402
import standby_test as sb  # noqa: E402

TEMPLATE = os.path.join(tpdaemon.MODELS, "chat-templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
MAX_TOKENS = 400
REQUESTS = [  # (stream, the sampling fields)
    (True, {"temperature": 0}),
    (True, {"temperature": 0.8, "seed": 5}),
    (True, {"temperature": 0}),
    (True, {"temperature": 1.0, "top_p": 0.9, "seed": 11}),
    (False, {"temperature": 0.8, "seed": 3}),
]
PROMPTS = ["Once upon a time", "The cat sat", "Lily and Ben", "One day, a little bird", "Tom had a ball"]


def body_of(k):
    stream, sampling = REQUESTS[k]
    b = {"model": "stories260K", "messages": [{"role": "user", "content": PROMPTS[k]}],
         "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    b.update(sampling)
    return b


class Call(threading.Thread):
    """POST one chat completion; a stream is read event by event: content
    (concatenated deltas), finish_reason, usage; first_at/done_at times."""

    def __init__(self, port, k, body=None):
        super().__init__(daemon=True)
        self.port, self.k = port, k
        self.body = body or body_of(k)
        self.stream = self.body["stream"]
        self.status = None
        self.chunk_at = []   # when each streamed chunk came
        self.content, self.finish, self.usage, self.error = "", None, None, None
        self.chunks = 0
        self.done_at = None

    def run(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            c.request("POST", "/v1/chat/completions", json.dumps(self.body),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            self.status = r.status
            if not self.stream:
                j = json.loads(r.read())
                ch = j["choices"][0]
                self.content, self.finish, self.usage = ch["message"]["content"], ch["finish_reason"], j["usage"]
            else:
                while True:
                    line = r.readline()
                    if not line:
                        break
                    line = line.decode().rstrip("\n")
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        self.error = ev["error"]
                    if ev.get("usage"):
                        self.usage = ev["usage"]
                    for ch in ev.get("choices", []):
                        self.content += ch.get("delta", {}).get("content") or ""
                        self.chunks += 1
                        self.chunk_at.append(time.time())
                        if ch.get("finish_reason"):
                            self.finish = ch["finish_reason"]
            c.close()
        except Exception as e:  # noqa: BLE001 (said in the assertion)
            self.error = repr(e)
        self.done_at = time.time()

    def result(self):
        """What an undisturbed run repeats: not usage's cached_tokens, which is
        how much of the prompt the serving worker's prefix cache held (a
        second run of the same prompt finds more of it there)."""
        usage = dict(self.usage or {})
        usage.pop("prompt_tokens_details", None)
        return {"status": self.status, "content": self.content, "finish": self.finish, "usage": usage,
                "error": self.error}


def run_all(port, kill=None, bodies=None):
    bodies = bodies or [body_of(k) for k in range(len(REQUESTS))]
    calls = [Call(port, k, b) for k, b in enumerate(bodies)]
    for c in calls:
        c.start()
    killed_at = None
    if kill:
        # every stream under way (some content out) and none done
        end = time.time() + 30
        while time.time() < end and not all(c.chunks >= 3 for c in calls if c.stream):
            time.sleep(0.01)
        killed_at = kill()
    for c in calls:
        c.join(90)
    return calls, killed_at


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    m = re.search(r"^%s (\d+)$" % re.escape(name), text, re.M)
    return int(m.group(1)) if m else None


@unittest.skipUnless(os.access(tpdaemon.TOKPIPE_HTTP, os.X_OK) and os.path.exists(TEMPLATE),
                     "bin/tokpipe-http not built or no chat template in the models")
class HttpFailoverTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tp-http-failover-")
        p, b = sb.endpoints(), sb.endpoints()
        self.primary = sb.Broker(self.dir, "primary", p, b)
        self.backup = sb.Broker(self.dir, "backup", b, p)
        for br in (self.primary, self.backup):
            with open(br.config) as f:
                text = f.read()
            text = text.replace("  tokenizer: ", "  chat_template: %s\n  tokenizer: " % json.dumps(TEMPLATE), 1)
            with open(br.config, "w") as f:
                f.write(text)
        self.workers, self.gw = [], None
        self.primary.start()
        self.backup.start()

    def tearDown(self):
        if self.gw and self.gw.poll() is None:
            self.gw.send_signal(signal.SIGTERM)
            try:
                self.gw.wait(10)
            except subprocess.TimeoutExpired:
                self.gw.kill()
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.wait(10)
            except subprocess.TimeoutExpired:
                w.kill()
        self.primary.stop()
        self.backup.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start_gateway(self):
        """tokpipe-http with the primary's endpoints and the backup's as standby.peer_*."""
        with open(self.primary.config) as f:
            text = f.read()
        self.port = tpdaemon.free_port()
        text = text.replace("http:\n  enabled: false\n", "http:\n  enabled: false\n  timeout_ms: 20000\n")
        cfg = os.path.join(self.dir, "gateway.yaml")
        with open(cfg, "w") as f:
            f.write(text.replace("runtime_dir: ", "runtime_dir: %s\n#" % json.dumps(os.path.join(self.dir, "gw")), 1))
        self.gwlog = os.path.join(self.dir, "gateway.log")
        log = open(self.gwlog, "ab")
        self.gw = subprocess.Popen([tpdaemon.TOKPIPE_HTTP, "--config", cfg, "--port", str(self.port)], stdout=log,
                                   stderr=log)
        if not tpdaemon.wait_health(self.port, 30, gone=lambda: self.gw.poll() is not None):
            raise AssertionError("gateway not healthy" + self.diag())
        # STATS goes to both brokers: the passive one's (no workers) is not the answer
        for _ in range(6):
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            c.request("GET", "/health")
            r = c.getresponse()
            self.assertEqual(r.status, 200, r.read())
            r.read()
            c.close()

    def diag(self):
        with open(self.gwlog, "rb") as f:
            gw = f.read().decode(errors="replace")
        return "\n--- gateway\n%s%s" % (gw[-3000:], sb.StandbyTest.diag(self))

    def start_workers(self):
        sb.StandbyTest.start_workers(self)

    def test_primary_killed_mid_stream_every_stream_goes_on_byte_identical(self):
        sb.wait_for(lambda: "-> active" in self.primary.text(), 60, "the primary active")
        sb.wait_for(lambda: "-> passive" in self.backup.text(), 60, "the backup passive")
        self.start_workers()
        sb.wait_for(lambda: sb.StandbyTest.all_stages(self, self.primary), 90, "workers at the primary")
        self.start_gateway()

        t0 = time.time()
        want, _ = run_all(self.port)
        print("failover: undisturbed run %.2f s" % (time.time() - t0), file=sys.stderr)
        for c in want:
            self.assertEqual(c.status, 200, "undisturbed request %d: %s%s" % (c.k, c.result(), self.diag()))
            self.assertIsNone(c.error, c.result())
            self.assertEqual(c.finish, "length", c.result())
            self.assertGreater(c.usage["completion_tokens"], 300, c.result())

        def kill():
            self.primary.kill()
            return time.time()

        t0 = time.time()
        got, killed_at = run_all(self.port, kill)
        print("failover: run with the primary killed %.2f s" % (time.time() - t0), file=sys.stderr)
        streams = [c for c in got if REQUESTS[c.k][0]]
        for c in streams:
            self.assertIsNotNone(c.done_at, "stream %d never ended%s" % (c.k, self.diag()))
            self.assertGreater(c.done_at, killed_at, "stream %d was done before the kill: make it longer" % c.k)
        for g, w in zip(got, want):
            self.assertEqual(g.result(), w.result(), "request %d differs after failover%s" % (g.k, self.diag()))
        self.assertEqual(metric(self.port, "tokpipe_http_streams_resumed_total"), len(streams), self.diag())
        self.assertGreaterEqual(metric(self.port, "tokpipe_http_jobs_resubmitted_total"), len(streams))


if __name__ == "__main__":
    unittest.main()
