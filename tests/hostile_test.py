"""Hostile clients against the real daemon (pyzmq + msgpack, no tokpipe
code): each attack of issue 9 is acted out, then a reference job must still
stream exactly the text it gives on an undisturbed daemon, and the broker's
resident memory must stay under the bound the README states.

Skips (with a message) only when the daemon binary is not built yet.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from tpdaemon import BIN, TOKPIPED, Producer  # noqa: E402

# README "What a client can cost the broker": the bound stated there.
RSS_BOUND_MB = 100


def sanitized():
    """Is tokpiped an ASan build? Its allocator keeps redzones and a
    quarantine of freed memory, so memory bounds are checked as growth,
    with room for that overhead."""
    try:
        with open(TOKPIPED, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


ASAN_SLACK = 3 if sanitized() else 1
SLOW_SUBSCRIBERS = 21
FLOOD_JOBS = 1500


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS for pid %d" % pid)


def Daemon(**kw):
    env = dict(os.environ)
    if ASAN_SLACK > 1:   # no quarantine: freed memory is reused, as in the real build
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=0"
    return tpdaemon.Daemon(env=env, prefix="tp-hostile-", stop_timeout_s=15, **kw)


class Client:
    """One DEALER producer plus one SUB that reads every event."""

    def __init__(self, ctx, d):
        self.d = d
        self.prod = Producer(ctx, d.front, d.log_text)
        self.sub = ctx.socket(zmq.SUB)
        self.sub.linger = 0
        self.sub.rcvhwm = 0
        self.sub.connect(d.events)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.text, self.finish = {}, {}

    @property
    def req(self):
        return self.prod.req

    def call(self, cmd, hdr, timeout_ms=10000):
        return self.prod.call(cmd, hdr, timeout_ms=timeout_ms)[1]

    def submit(self, job, **params):
        return self.call(0x01, {"job_id": job, "prompt": "Once upon a time", "params": params})

    def pump(self, timeout_ms):
        """Read events for up to timeout_ms; True if any arrived."""
        got = False
        while self.sub.poll(timeout_ms):
            timeout_ms = 0
            f = self.sub.recv_multipart()
            if f[0] == b"@heartbeat":
                continue
            job, hdr = f[0].decode(), msgpack.unpackb(f[3])
            if f[2] == b"\x01":
                self.text[job] = self.text.get(job, "") + hdr.get("text", "")
            elif f[2] == b"\x02":
                self.finish[job] = hdr
            got = True
        return got

    def wait_finished(self, jobs, timeout_s=120):
        end = time.time() + timeout_s
        while time.time() < end and not all(j in self.finish for j in jobs):
            self.pump(100)
        missing = [j for j in jobs if j not in self.finish]
        if missing:
            raise AssertionError("%d jobs never finished (first %s)\n%s" % (len(missing), missing[0],
                                                                           self.d.log_text()))

    def wait_ready(self):
        # a heartbeat shows the subscription is in place (no slow joiner);
        # the first SUBMIT may meet 503 while workers register
        if not self.sub.poll(10000):
            raise AssertionError("no heartbeat from the broker\n" + self.d.log_text())
        end = time.time() + 30
        while time.time() < end:
            rep = self.submit("warmup", max_tokens=1, temperature=0)
            if rep["status"] == 200:
                self.wait_finished(["warmup"])
                return
            time.sleep(0.1)
        raise AssertionError("daemon never accepted a job\n" + self.d.log_text())

    def reference(self, tag):
        """A greedy job's streamed text and final FINISH."""
        job = "ref-%d" % self.req
        rep = self.submit(job, max_tokens=60, temperature=0, stop=["ball"])
        if rep["status"] != 200:
            raise AssertionError("reference job refused: %r\n%s" % (rep, self.d.log_text()))
        self.wait_finished([job], 60)
        return self.text.get(job, ""), self.finish[job]["reason"]


@unittest.skipUnless(os.access(TOKPIPED, os.X_OK), "tokpiped not built (run make)")
class HostileClients(unittest.TestCase):
    def setUp(self):
        self.ctx = zmq.Context()
        self.d = Daemon()
        self.c = Client(self.ctx, self.d)
        self.c.wait_ready()
        self.want = self.c.reference("before")

    def tearDown(self):
        self.ctx.destroy(linger=0)
        self.d.stop()

    def assert_still_serving(self, tag):
        self.assertEqual(self.c.reference(tag), self.want, "reference job changed after " + tag)

    def test_subscribers_that_never_read_cost_a_bounded_amount(self):
        base = rss_mb(self.d.proc.pid)
        slow = []
        for _ in range(SLOW_SUBSCRIBERS):
            s = self.ctx.socket(zmq.SUB)
            s.rcvhwm = 1
            s.setsockopt(zmq.RCVBUF, 4096)
            s.connect(self.d.events)
            s.setsockopt(zmq.SUBSCRIBE, b"")
            slow.append(s)
        time.sleep(0.3)
        peak, sent, jobs = base, 0, []
        while sent < FLOOD_JOBS:
            job = "flood-%d" % sent
            rep = self.c.submit(job, max_tokens=48, temperature=1.0, seed=sent)
            if rep["status"] == 429:
                self.c.pump(20)
                continue
            self.assertEqual(rep["status"], 200, rep)
            jobs.append(job)
            sent += 1
            if sent % 100 == 0:
                self.c.pump(0)
                peak = max(peak, rss_mb(self.d.proc.pid))
        self.c.wait_finished(jobs, 300)
        peak = max(peak, rss_mb(self.d.proc.pid))
        print("\nbroker RSS: %.1f MB idle, %.1f MB peak with %d subscribers that never read and %d jobs"
              % (base, peak, SLOW_SUBSCRIBERS, FLOOD_JOBS))
        if ASAN_SLACK == 1:
            self.assertLess(peak, RSS_BOUND_MB, "broker grew to %.1f MB (from %.1f)" % (peak, base))
        self.assertLess(peak - base, RSS_BOUND_MB * ASAN_SLACK, "broker grew by %.1f MB (from %.1f)" % (peak - base, base))
        self.assert_still_serving("slow subscribers")
        for s in slow:
            s.close(0)

    def test_oversize_subscriptions_are_dropped_not_stored(self):
        base = rss_mb(self.d.proc.pid)
        # the attacker runs in its own process: libzmq 4.3.4 on the
        # attacking side may crash when the broker drops such a connection
        attack = ("import sys, time, zmq\n"
                  "s = zmq.Context().socket(zmq.SUB)\n"
                  "s.connect(sys.argv[1])\n"
                  "s.setsockopt(zmq.SUBSCRIBE, b'x' * int(sys.argv[2]))\n"
                  "time.sleep(30)\n")
        for size in (1 << 20, 1 << 20, 1 << 20, 1 << 20, 16 << 20):
            p = subprocess.Popen([sys.executable, "-c", attack, self.d.events, str(size)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(0.5)
                t0 = time.time()
                self.assert_still_serving("a %d-byte subscription" % size)
                self.assertLess(time.time() - t0, 5.0, "broker stalled by a %d-byte subscription" % size)
            finally:
                p.kill()
                p.wait()
        grown = rss_mb(self.d.proc.pid) - base
        print("\nbroker RSS grew %.1f MB over 4 x 1 MiB + 1 x 16 MiB subscriptions" % grown)
        self.assertLess(grown, 16 * ASAN_SLACK, "oversize subscriptions were stored (%.1f MB)" % grown)

    def test_floats_that_float32_cannot_hold_are_refused_like_the_command_line(self):
        # checked as doubles, used as floats: these used to be ACKed 200 and
        # then fail the job
        cases = [("top_p", "--top-p", 1e-300), ("temperature", "--temperature", 1e300),
                 ("repetition_penalty", "--repetition-penalty", 1e300),
                 ("repetition_penalty", "--repetition-penalty", 1e-300),
                 ("min_p", "--min-p", -1e-300)]
        for key, flag, v in cases:
            rep = self.c.submit("f-%d" % self.c.req, **{key: v})
            self.assertEqual(rep["status"], 400, "%s=%g: %r" % (key, v, rep))
            self.assertEqual(rep.get("field"), "params." + key, rep)
            wire = rep["error"].split(": ", 1)[1]
            p = subprocess.run([os.path.join(BIN, "tokpipe"), "run", "--model", tpdaemon.STORIES,
                                "--tokenizer", tpdaemon.TOK512, "--prompt", "hi",
                                flag, repr(v)], capture_output=True, text=True, timeout=30)
            self.assertNotEqual(p.returncode, 0, "run accepted %s %r" % (flag, v))
            self.assertIn(key + ": " + wire, p.stderr, "run and SUBMIT disagree on %s %r" % (flag, v))
        self.assert_still_serving("float32 refusals")

    def test_forged_events_are_neither_forwarded_nor_believed(self):
        # a process that reaches the publish socket (here: the same user on
        # ipc) sends a FINISH for a running job without the job's pin
        pub = self.ctx.socket(zmq.PUB)
        pub.linger = 0
        pub.connect("ipc://" + os.path.join(self.d.dir, "publish.sock"))
        time.sleep(0.3)
        job = "victim"
        self.assertEqual(self.c.submit(job, max_tokens=200, temperature=0)["status"], 200)
        forged = {"job_id": job, "seq": 1, "reason": "stop_string", "matched": "x", "text": "FORGED",
                  "prompt_tokens": 1, "completion_tokens": 1, "text_len": 6, "queue_us": 0, "ttft_us": 0,
                  "total_us": 0}
        for pin in (None, 12345):
            hdr = dict(forged) if pin is None else dict(forged, pin=pin)
            pub.send_multipart([job.encode(), b"EVT1", b"\x02", msgpack.packb(hdr)])
        self.c.wait_finished([job], 60)
        fin = self.c.finish[job]
        self.assertNotIn("FORGED", fin.get("text", "") + self.c.text.get(job, ""))
        self.assertEqual(fin["reason"], "length", fin)
        st = self.c.call(0x06, {})
        self.assertGreaterEqual(st.get("events_refused", 0), 2, st)
        status = self.c.call(0x04, {"job_id": job})
        self.assertNotIn("FORGED", status.get("text", ""))
        pub.close(0)

    def fake_ready(self, **over):
        """READY from a new worker connection; the broker's first answer."""
        hdr = {"stages": ["sample"], "instance": "rogue", "incarnation": 7, "capacity": 4, "heartbeat_ms": 1000,
               "model_id": self.model_id(), "vocab_size": 512, "bos_id": 1, "eos_id": 2, "seq_len": 512,
               "max_batch_tokens": 0}
        hdr.update(over)
        d = self.ctx.socket(zmq.DEALER)
        d.linger = 0
        d.connect("ipc://" + os.path.join(self.d.dir, "back.sock"))
        d.send_multipart([b"WRK1", b"\x01", msgpack.packb(hdr)])
        self.assertTrue(d.poll(5000), "no answer to READY %r" % over)
        f = d.recv_multipart()
        d.close(0)
        return f[1], msgpack.unpackb(f[2])

    def model_id(self):
        # what a real worker of this model sends, as INFO reports it
        rep = self.c.call(0x08, {})
        self.assertEqual(rep["status"], 200, rep)
        return rep["model_id"]

    def test_ready_is_validated_field_by_field(self):
        # the real model id is accepted (WELCOME), anything else refused by name
        cmd, rep = self.fake_ready()
        self.assertEqual(cmd, b"\x02", "a READY matching the model was refused: %r" % rep)
        bad = [({"model_id": ""}, "empty model_id"), ({"model_id": "x" * 40}, "differs"),
               ({"vocab_size": 1 << 20}, "vocab_size"), ({"seq_len": (1 << 32) - 1}, "seq_len"),
               ({"capacity": 1 << 30}, "capacity"), ({"max_batch_tokens": 1 << 30}, "max_batch_tokens")]
        for over, word in bad:
            cmd, rep = self.fake_ready(**over)
            self.assertEqual(cmd, b"\x04", "READY %r was not refused: %r" % (over, rep))
            self.assertIn(word, rep.get("reason", ""), over)
        self.assert_still_serving("bad READYs")

    def test_a_job_id_long_subscription_still_gets_its_events(self):
        # the cap must not cut legitimate topics: a 64-byte job id
        job = "j" * 64
        s = self.ctx.socket(zmq.SUB)
        s.linger = 0
        s.connect(self.d.events)
        s.setsockopt(zmq.SUBSCRIBE, job.encode())
        time.sleep(0.2)
        self.assertEqual(self.c.submit(job, max_tokens=8, temperature=0)["status"], 200)
        got_finish = False
        end = time.time() + 30
        while time.time() < end and not got_finish:
            if s.poll(200):
                f = s.recv_multipart()
                self.assertEqual(f[0], job.encode())
                got_finish = f[2] == b"\x02"
        self.assertTrue(got_finish, "a subscriber of a 64-byte job id got no FINISH")


@unittest.skipUnless(os.access(TOKPIPED, os.X_OK), "tokpiped not built (run make)")
class BrokenModels(unittest.TestCase):
    def test_a_corrupt_model_stops_tokpiped_at_start_naming_it(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad = os.path.join(tmp, "bad.bin")
            with open(tpdaemon.STORIES, "rb") as f:
                data = bytearray(f.read())
            data[0:4] = (64 * 1024).to_bytes(4, "little")   # dim far beyond the file
            with open(bad, "wb") as f:
                f.write(data)
            cfg = os.path.join(tmp, "c.yaml")
            with open(cfg, "w") as f:
                f.write("runtime_dir: %s\nmodel:\n  path: %s\n" % (json.dumps(tmp), json.dumps(bad)))
            p = subprocess.run([TOKPIPED, "--config", cfg], capture_output=True, text=True, timeout=30)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(bad, p.stderr)

    def test_workers_that_cannot_load_are_given_up_and_generate_says_so(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad = os.path.join(tmp, "vocab.bin")
            with open(bad, "wb") as f:
                f.write(b"not a vocabulary")
            d = Daemon(tokenizer=bad)
            try:
                tokpipe = os.path.join(BIN, "tokpipe")
                cfg = ["--front", d.front, "--events", d.events]
                deadline = time.time() + 30
                failed = []
                # tokenize and stop load the vocabulary: both fail
                while time.time() < deadline and not {"tokenize", "stop"} <= set(failed):
                    time.sleep(0.5)
                    p = subprocess.run([tokpipe, "stats", "--json"] + cfg, capture_output=True, text=True, timeout=10)
                    if p.returncode == 0:
                        failed = json.loads(p.stdout).get("stages_failed", [])
                self.assertEqual(sorted(failed), ["stop", "tokenize"], "tokpiped never gave up on the failing workers\n" + d.log_text())
                self.assertIn("not starting it again", d.log_text())
                t0 = time.time()
                p = subprocess.run([tokpipe, "generate", "--prompt", "hi", "--max-tokens", "4"] + cfg,
                                   capture_output=True, text=True, timeout=30)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("no longer restarted", p.stderr)
                self.assertLess(time.time() - t0, 5, "generate waited instead of saying the stage failed")
            finally:
                d.stop()


if __name__ == "__main__":
    unittest.main()
