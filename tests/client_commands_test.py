"""bin/tokpipe generate/watch/status/cancel/stats against a scripted broker.

The broker here is written from protocol/PROTOCOL.md with pyzmq + msgpack
(independent of the C codec): a ROUTER frontend and an XPUB event socket on
loopback tcp. It ACKs SUBMITs and publishes a scripted TOKEN/FINISH stream
per job once the job's subscription has arrived, so the tests check what the
C client sends and how it handles what it receives, including a lost event
(the client must complete the job from STATUS). It publishes HEARTBEATs on
"@heartbeat" (every interval, and at once to a new subscription) and can
"restart" (a new incarnation that knows no job) or fall silent.
"""
import random
import json
import os
import struct
import subprocess
import sys
import threading
import time
import unittest

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from tpdaemon import TOKPIPE  # noqa: E402

# Scripted output of every job: deltas (text, ids) then the FINISH delta.
DELTAS = [("Hel", [10]), ("lo", [11]), (" wor", [12, 13])]
FINAL_DELTA = "ld"
FINAL_TEXT = "Hello world"
ALL_IDS = [10, 11, 12, 13]


def i32(ids):
    return struct.pack("<%di" % len(ids), *ids)


class FakeBroker(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.ctx = zmq.Context()
        self.front = self.ctx.socket(zmq.ROUTER)
        self.events = self.ctx.socket(zmq.XPUB)
        self.front.linger = 0
        self.events.linger = 0
        self.events.setsockopt(zmq.XPUB_VERBOSE, 1)  # as tokpiped: every subscription gets its heartbeat
        self.front_ep = "tcp://127.0.0.1:%d" % self.front.bind_to_random_port("tcp://127.0.0.1")
        self.events_ep = "tcp://127.0.0.1:%d" % self.events.bind_to_random_port("tcp://127.0.0.1")
        self.subs = set()
        self.jobs = {}          # job id -> submit header
        self.pending = []       # jobs waiting for their subscription
        self.drop_seq = {}      # job id -> seq not to publish (simulated loss)
        self.requests = []      # (cmd, header) of every request
        self.stop_flag = False
        self.lock = threading.Lock()
        self.incarnation = random.getrandbits(64)
        self.t0 = time.time()
        self.interval_ms = 1000
        self.last_beat = 0.0
        self.silent = False     # no heartbeats, no replies: a hung or dead broker
        self.restart_now = False
        self.restarted = False  # after a restart "hold" jobs run too (a resubmitted job finishes)

    def beat(self):
        hdr = {"incarnation": self.incarnation, "uptime_ms": int((time.time() - self.t0) * 1000),
               "interval_ms": self.interval_ms, "liveness": 3}
        self.events.send_multipart([b"@heartbeat", b"EVT1", b"\x03", msgpack.packb(hdr)])
        self.last_beat = time.time()

    def restart(self):
        """What a restarted broker looks like: a new incarnation that knows no job."""
        self.jobs.clear()
        self.pending.clear()
        self.incarnation = random.getrandbits(64)
        self.t0 = time.time()
        self.restarted = True
        self.beat()

    def reply(self, ident, cmd, hdr, *payload):
        self.front.send_multipart([ident, b"JOB1", bytes([cmd]), msgpack.packb(hdr)] + list(payload))

    def publish(self, job):
        seq = 0
        for idx, (text, ids) in enumerate(DELTAS):
            hdr = {"job_id": job, "seq": seq, "index": idx, "text": text}
            if self.drop_seq.get(job) != seq:
                self.events.send_multipart([job.encode(), b"EVT1", b"\x01", msgpack.packb(hdr), i32(ids)])
            seq += 1
        fin = {"job_id": job, "seq": seq, "reason": "stop_string", "matched": "!", "text": FINAL_DELTA,
               "prompt_tokens": 5, "completion_tokens": 4, "text_len": len(FINAL_TEXT),
               "queue_us": 10, "ttft_us": 20, "total_us": 30}
        if self.jobs.get(job, {}).get("prompt") == "fail":
            fin.update(reason="error", matched=None, error="worker forward.0 died")
        self.events.send_multipart([job.encode(), b"EVT1", b"\x02", msgpack.packb(fin)])

    def on_request(self, frames):
        ident, magic, cmd, hdr = frames[0], frames[1], frames[2][0], msgpack.unpackb(frames[3])
        payload = frames[4:]
        with self.lock:
            self.requests.append((cmd, hdr, payload))
        assert magic == b"JOB1"
        req = hdr.get("req", 0)
        if cmd == 0x01:  # SUBMIT
            job = hdr["job_id"]
            self.jobs[job] = hdr
            self.reply(ident, 0x02, {"req": req, "status": 200, "job_id": job})
            if hdr.get("prompt") != "hold" or self.restarted:  # "hold": accepted, never generates
                self.pending.append(job)
        elif cmd == 0x04:  # STATUS
            job = hdr["job_id"]
            if job not in self.jobs:
                self.reply(ident, 0x05, {"req": req, "status": 404, "job_id": job, "state": "unknown",
                                         "prompt_tokens": 0, "completion_tokens": 0, "last_seq": -1})
                return
            self.reply(ident, 0x05, {"req": req, "status": 200, "job_id": job, "state": "finished",
                                     "prompt_tokens": 5, "completion_tokens": 4, "last_seq": 3,
                                     "reason": "stop_string", "matched": "!", "text": FINAL_TEXT,
                                     "queue_us": 10, "ttft_us": 20, "total_us": 30}, i32(ALL_IDS))
        elif cmd == 0x03:  # CANCEL
            job = hdr["job_id"]
            self.reply(ident, 0x02, {"req": req, "status": 409 if job in self.jobs else 404, "job_id": job})
        elif cmd == 0x06:  # STATS
            self.reply(ident, 0x07, {"req": req, "status": 200, "jobs_submitted": len(self.jobs),
                                     "workers": {"tokenize": 1, "forward": 1, "sample": 1, "stop": 1},
                                     "finish": {"stop_string": 2, "eos": 1},
                                     "stop_triggers": [["!", 2, False], [2, 1, False]],
                                     "a_key_from_the_future": 1})

    def run(self):
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.events, zmq.POLLIN)
        while not self.stop_flag:
            ready = dict(poller.poll(20))
            if self.restart_now:
                self.restart_now = False
                self.restart()
            if self.silent:
                continue
            if self.events in ready:
                msg = self.events.recv()
                if msg[:1] == b"\x01":
                    self.subs.add(msg[1:].decode())
                    if b"@heartbeat".startswith(msg[1:]):
                        self.beat()
            if time.time() - self.last_beat >= self.interval_ms / 1000:
                self.beat()
            if self.front in ready:
                self.on_request(self.front.recv_multipart())
            for job in list(self.pending):
                if job in self.subs or "" in self.subs:
                    self.pending.remove(job)
                    self.publish(job)
        self.front.close()
        self.events.close()
        self.ctx.term()

    def wait_sub(self, topic, timeout=5):
        end = time.time() + timeout
        while topic not in self.subs:
            if time.time() > end:
                raise AssertionError("no subscription for %r" % topic)
            time.sleep(0.01)


class ClientCommands(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(TOKPIPE):
            self.skipTest("bin/tokpipe not built")
        self.broker = FakeBroker()
        self.broker.start()
        self.conn = ["--front", self.broker.front_ep, "--events", self.broker.events_ep, "--timeout", "3000"]

    def tearDown(self):
        self.broker.stop_flag = True
        self.broker.join(5)

    def tokpipe(self, *args, timeout=20):
        return subprocess.run([TOKPIPE] + list(args), capture_output=True, timeout=timeout)

    def test_generate_streams_one_prompt_and_sends_the_flags_given(self):
        p = self.tokpipe("generate", "--prompt", "Once", "--max-tokens", "7", "--min-tokens", "1",
                         "--temperature", "0", "--top-k", "3", "--seed", "42", "--stop", "!", "--stop", "\n",
                         "--stop-id", "5", "--ignore-eos", *self.conn)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(p.stdout.decode(), FINAL_TEXT + "\n")
        submits = [h for c, h, _ in self.broker.requests if c == 0x01]
        self.assertEqual(len(submits), 1)
        h = submits[0]
        self.assertEqual(h["prompt"], "Once")
        prm = h["params"]
        self.assertEqual(prm["max_tokens"], 7)
        self.assertEqual(prm["min_tokens"], 1)
        self.assertEqual(prm["temperature"], 0)
        self.assertEqual(prm["top_k"], 3)
        self.assertEqual(prm["seed"], 42)
        self.assertEqual(prm["stop"], ["!", "\n"])
        self.assertEqual(prm["stop_token_ids"], [5])
        self.assertIs(prm["ignore_eos"], True)
        # what the command line left out is the daemon's to default
        for absent in ("top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                       "penalty_window", "include_stop_str_in_output"):
            self.assertNotIn(absent, prm)
        self.assertLessEqual(len(h["job_id"]), 64)

    def test_generate_json_lines_in_prompt_order_recovering_a_lost_event(self):
        # The second job (id ending "-1") loses its seq 1 TOKEN: the client
        # must notice the gap and take the result from STATUS.
        orig = self.broker.publish

        def lossy(job):
            if job.endswith("-1"):
                self.broker.drop_seq[job] = 1
            orig(job)
        self.broker.publish = lossy
        p = self.tokpipe("generate", "--prompt", "A", "--prompt", "B", "--json", *self.conn)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        lines = [json.loads(l) for l in p.stdout.decode().splitlines()]
        self.assertEqual([l["prompt"] for l in lines], ["A", "B"])
        for l in lines:
            self.assertEqual(l["text"], FINAL_TEXT)
            self.assertEqual(l["tokens"], ALL_IDS)
            self.assertEqual(l["finish_reason"], "stop_string")
            self.assertEqual(l["prompt_tokens"], 5)
            self.assertEqual(l["completion_tokens"], 4)
        statuses = [h for c, h, _ in self.broker.requests if c == 0x04]
        self.assertTrue(any(h["job_id"].endswith("-1") for h in statuses), "no STATUS for the gapped job")

    def test_generate_exits_1_naming_a_job_that_failed(self):
        p = self.tokpipe("generate", "--prompt", "ok", "--prompt", "fail", "--json", *self.conn)
        self.assertEqual(p.returncode, 1, p.stderr.decode())
        lines = [json.loads(l) for l in p.stdout.decode().splitlines()]
        self.assertEqual([l["finish_reason"] for l in lines], ["stop_string", "error"])
        self.assertRegex(p.stderr.decode(), r"job \S+-1 \(prompt 2\) failed: worker forward.0 died")

    def test_watch_prints_one_jobs_events_and_exits_after_finish(self):
        w = subprocess.Popen([TOKPIPE, "watch", "job-w", "--json", *self.conn], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            self.broker.wait_sub("job-w")
            ctx = zmq.Context()
            d = ctx.socket(zmq.DEALER)
            d.connect(self.broker.front_ep)
            d.send_multipart([b"JOB1", b"\x01", msgpack.packb({"job_id": "job-w", "prompt": "x"})])
            self.assertEqual(msgpack.unpackb(d.recv_multipart()[2])["status"], 200)
            d.close(0)
            ctx.term()
            out, err = w.communicate(timeout=10)
        finally:
            if w.poll() is None:
                w.kill()
        self.assertEqual(w.returncode, 0, err.decode())
        ev = [json.loads(l) for l in out.decode().splitlines()]
        self.assertEqual([e["event"] for e in ev], ["token"] * 3 + ["finish"])
        self.assertEqual([e["seq"] for e in ev], [0, 1, 2, 3])
        self.assertEqual("".join(e["text"] for e in ev), FINAL_TEXT)
        self.assertEqual(ev[0]["ids"], [10])
        self.assertEqual(ev[3]["matched"], "!")
        self.assertEqual(ev[3]["total_us"], 30)

    def test_watch_of_a_finished_job_exits_at_once(self):
        self.broker.jobs["done-1"] = {}
        p = self.tokpipe("watch", "done-1", *self.conn, timeout=10)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(p.stdout, b"")
        self.assertIn("done-1 already finished", p.stderr.decode())

    def test_watch_says_the_broker_restarted_and_that_its_job_is_lost(self):
        w = subprocess.Popen([TOKPIPE, "watch", "job-r", *self.conn], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        a = subprocess.Popen([TOKPIPE, "watch", "--idle", "1500", *self.conn], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            self.broker.wait_sub("job-r")
            self.broker.wait_sub("")
            end = time.time() + 5  # watch JOB asks STATUS once it heard the first heartbeat
            while not any(c == 0x04 for c, _, _ in self.broker.requests) and time.time() < end:
                time.sleep(0.02)
            time.sleep(0.2)
            self.broker.restart_now = True
            out, err = w.communicate(timeout=10)
            aout, aerr = a.communicate(timeout=10)
        finally:
            for p in (w, a):
                if p.poll() is None:
                    p.kill()
        self.assertEqual(w.returncode, 1, err.decode())
        self.assertIn("tokpiped restarted", err.decode())
        self.assertIn("job-r was lost", err.decode())
        # watching every job: said, and watching goes on (until --idle)
        self.assertEqual(a.returncode, 0, aerr.decode())
        self.assertIn("tokpiped restarted", aerr.decode())

    def test_status_cancel_and_stats(self):
        self.broker.jobs["known"] = {}
        p = self.tokpipe("status", "known", "--json", *self.conn)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        st = json.loads(p.stdout)
        self.assertEqual((st["state"], st["text"], st["tokens"]), ("finished", FINAL_TEXT, ALL_IDS))
        p = self.tokpipe("status", "unknown", *self.conn)
        self.assertEqual(p.returncode, 1)
        self.assertIn("404", p.stderr.decode())
        p = self.tokpipe("cancel", "known", *self.conn)
        self.assertEqual((p.returncode, p.stdout.decode()), (0, "known: already finished\n"))
        p = self.tokpipe("cancel", "nope", *self.conn)
        self.assertEqual(p.returncode, 1)
        p = self.tokpipe("stats", "--json", *self.conn)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        s = json.loads(p.stdout)
        self.assertEqual(s["workers"]["forward"], 1)
        self.assertEqual(s["finish"]["stop_string"], 2)
        self.assertEqual(s["stop_triggers"][1], {"matched": 2, "count": 1, "truncated": False})

    def test_interrupted_generate_cancels_its_running_jobs(self):
        g = subprocess.Popen([TOKPIPE, "generate", "--prompt", "hold", "--prompt", "x", *self.conn],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            end = time.time() + 10
            while len([1 for c, _, _ in self.broker.requests if c == 0x01]) < 2 and time.time() < end:
                time.sleep(0.02)
            time.sleep(0.2)
            g.send_signal(2)  # SIGINT
            out, err = g.communicate(timeout=10)
        finally:
            if g.poll() is None:
                g.kill()
        self.assertEqual(g.returncode, 130, err.decode())
        self.assertIn("cancelled 1 job", err.decode())
        held = [h["job_id"] for c, h, _ in self.broker.requests if c == 0x01 and h["prompt"] == "hold"]
        cancels = [h["job_id"] for c, h, _ in self.broker.requests if c == 0x03]
        self.assertEqual(cancels, held)

    def held_generate(self, *extra):
        """A generate whose one job the broker accepts and never runs."""
        g = subprocess.Popen([TOKPIPE, "generate", "--prompt", "hold", *extra, *self.conn],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        end = time.time() + 10
        while not any(c == 0x01 for c, _, _ in self.broker.requests) and time.time() < end:
            time.sleep(0.02)
        time.sleep(0.1)
        return g

    def end_of(self, g, act):
        """act() on the broker, then g's exit status, stderr and seconds taken."""
        try:
            t0 = time.time()
            act()
            out, err = g.communicate(timeout=10)
            self.last_out = out.decode()
            return g.returncode, err.decode(), time.time() - t0
        finally:
            if g.poll() is None:
                g.kill()

    def test_generate_submits_its_job_again_with_the_same_id_and_seed_to_a_restarted_broker(self):
        g = self.held_generate()
        rc, err, took = self.end_of(g, lambda: setattr(self.broker, "restart_now", True))
        self.assertEqual(rc, 0, err)
        self.assertIn("tokpiped restarted", err)
        submits = [h for c, h, _ in self.broker.requests if c == 0x01]
        self.assertEqual(len(submits), 2, err)
        self.assertEqual(submits[0]["job_id"], submits[1]["job_id"])
        # no --seed given: generate picked one, and sends it again
        self.assertIn("seed", submits[0]["params"])
        self.assertEqual(submits[0]["params"], submits[1]["params"])
        self.assertIn("job %s (prompt 1) is unknown to the restarted tokpiped: submitting it again" %
                      submits[0]["job_id"], err)
        self.assertEqual(self.last_out, FINAL_TEXT + "\n")
        self.assertLess(took, 2.0, "a restart must be noticed at its first heartbeat, not after a timeout")

    def test_generate_gives_up_on_a_silent_broker_after_liveness_and_timeout(self):
        self.broker.interval_ms = 100   # silent for 300 ms = presumed dead
        g = self.held_generate()
        rc, err, took = self.end_of(g, lambda: setattr(self.broker, "silent", True))
        self.assertEqual(rc, 1, err)
        self.assertIn("no heartbeat from tokpiped", err)
        self.assertIn("tokpiped is gone", err)
        # 0.3 s of silence, then STATUS waits --timeout (3 s)
        self.assertLess(took, 5.0)

    def test_endpoints_come_from_the_config_file_and_flags_override_them(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write('endpoints:\n  front: "%s"\n  events: "%s"\n' % (self.broker.front_ep, self.broker.events_ep))
        try:
            p = self.tokpipe("stats", "--json", "--config", f.name, "--timeout", "3000")
            self.assertEqual(p.returncode, 0, p.stderr.decode())
            self.assertEqual(json.loads(p.stdout)["workers"]["stop"], 1)
            p = self.tokpipe("stats", "--config", f.name, "--front", "tcp://127.0.0.1:9", "--timeout", "200")
            self.assertEqual(p.returncode, 1)
            self.assertIn("tcp://127.0.0.1:9", p.stderr.decode())
            p = self.tokpipe("stats", "--config", f.name + ".missing")
            self.assertEqual(p.returncode, 1)
            self.assertIn(".missing", p.stderr.decode())
        finally:
            os.unlink(f.name)

    def test_unreachable_daemon_is_a_clear_timeout_naming_the_endpoint(self):
        p = self.tokpipe("stats", "--front", "tcp://127.0.0.1:9", "--timeout", "200")
        self.assertEqual(p.returncode, 1)
        self.assertIn("no reply from tcp://127.0.0.1:9 within 200 ms", p.stderr.decode())

    def test_bad_flags_are_usage_errors(self):
        p = self.tokpipe("generate", "--prompt", "x", "--top-k", "many")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--top-k", p.stderr.decode())
        # a value the flag parser lets through but a SUBMIT may not carry is bad usage too (--help:
        # exit 2), refused before anything is sent, naming the flag's field
        for flags, field in ((("--max-tokens", "0"), "max_tokens"), (("--min-tokens", "5", "--max-tokens", "2"),
                                                                     "min_tokens")):
            p = self.tokpipe("generate", "--prompt", "x", *flags)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("tokpipe generate: params.%s: " % field, p.stderr.decode())
        p = self.tokpipe("status")
        self.assertEqual(p.returncode, 2)


if __name__ == "__main__":
    unittest.main()
