"""A producer and a subscriber written from protocol/PROTOCOL.md alone
(tests/support/tpdaemon.py: pyzmq + msgpack, no tokpipe code), run end to
end against the real daemon: $TP_BIN_DIR/tokpiped with a temporary config
on the stories260K model.

Skips (with a message) only when the daemon binary is not built yet.
"""
import json
import os
import struct
import subprocess
import sys
import time
import unittest

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE, ids_of  # noqa: E402

PROMPT = "Once upon a time"
MAX_TOKENS = 40


class ProtocolEndToEnd(tpdaemon.DaemonCase):
    CONFIG = "limits:\n  finished_ttl_ms: 60000\n"
    PREFIX = "tp-proto-"

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(os.path.join(MODELS, "stories260K.bin")):
            raise unittest.SkipTest("stories260K.bin not found under TP_MODELS=%s" % MODELS)
        super().setUpClass()

    def run_job(self, job, params, prompt=PROMPT):
        self.sub.subscribe(job)
        time.sleep(0.2)  # let the subscription reach the broker's XPUB
        cmd, ack, _ = self.prod.call(0x01, {"job_id": job, "prompt": prompt, "params": params})
        self.assertEqual((cmd, ack["status"]), (0x02, 200), ack)
        self.assertEqual(ack["job_id"], job)
        return self.sub.collect(job)

    def check_stream(self, job, tokens, fin):
        seqs = [t["seq"] for t in tokens] + [fin["seq"]]
        self.assertEqual(seqs, list(range(len(seqs))), "event seq must be 0,1,2,... with FINISH last")
        ids = [i for t in tokens for i in t["ids"]]
        indexes = [t["index"] for t in tokens]
        self.assertEqual(indexes, [sum(len(t["ids"]) for t in tokens[:k]) for k in range(len(tokens))])
        text = "".join(t["text"] for t in tokens) + fin["text"]
        self.assertEqual(fin["completion_tokens"], len(ids))
        self.assertEqual(fin["text_len"], len(text.encode()))
        self.assertGreater(fin["prompt_tokens"], 0)
        self.assertLessEqual(fin["ttft_us"], fin["total_us"])
        self.assertLessEqual(fin["queue_us"], fin["total_us"])
        return text, ids

    def test_1_greedy_job_streams_and_status_agrees(self):
        tokens, fin = self.run_job("py-greedy", {"max_tokens": MAX_TOKENS, "temperature": 0})
        text, ids = self.check_stream("py-greedy", tokens, fin)
        self.assertIn(fin["reason"], ("length", "eos"))
        if fin["reason"] == "length":
            self.assertEqual(len(ids), MAX_TOKENS)
        cmd, st, pl = self.prod.call(0x04, {"job_id": "py-greedy"})
        self.assertEqual((cmd, st["status"], st["state"]), (0x05, 200, "finished"))
        self.assertEqual(st["text"], text)
        self.assertEqual(ids_of(pl[0]), ids)
        self.assertEqual(st["reason"], fin["reason"])
        type(self).greedy_text = text

    def test_2_stop_string_cuts_the_same_greedy_text(self):
        text = getattr(type(self), "greedy_text", None)
        if not text or len(text) < 8:
            self.skipTest("greedy job did not produce enough text")
        stop = text[len(text) // 2:len(text) // 2 + 3]
        tokens, fin = self.run_job("py-stop", {"max_tokens": MAX_TOKENS, "temperature": 0, "stop": [stop]})
        got, _ = self.check_stream("py-stop", tokens, fin)
        self.assertEqual(fin["reason"], "stop_string")
        self.assertEqual(fin["matched"], stop)
        self.assertEqual(got, text[:text.index(stop)])

    def test_3_malformed_requests_get_error_replies_and_the_daemon_goes_on(self):
        self.prod.send_raw([b"JOB9", b"\x06", msgpack.packb({})])
        cmd, rep, _ = self.prod.recv()
        self.assertEqual((cmd, rep["status"]), (0x7F, 505))
        self.prod.send_raw([b"JOB1", b"\x66", msgpack.packb({"req": 5})])
        cmd, rep, _ = self.prod.recv()
        self.assertEqual((cmd, rep["status"]), (0x7F, 501))
        self.prod.send_raw([b"JOB1", b"\x01", b"\xdd\x00\x98\x96\x80"])  # array32 of 10^7 in 5 bytes
        cmd, rep, _ = self.prod.recv()
        self.assertEqual((cmd, rep["status"]), (0x7F, 400))
        cmd, rep, _ = self.prod.call(0x01, {"job_id": "py-bad", "prompt": "x", "params": {"top_p": 1.5}})
        self.assertIn(cmd, (0x7F, 0x02))
        self.assertEqual(rep["status"], 400)
        self.assertIn("params.top_p", rep["error"])
        cmd, rep, _ = self.prod.call(0x01, {"job_id": "py-ids"}, b"\x01\x00\x00")  # not a multiple of 4
        self.assertEqual(rep["status"], 400)
        self.assertIn("prompt_ids", rep["error"])
        cmd, rep, _ = self.prod.call(0x03, {"job_id": "py-never-submitted"})
        self.assertEqual((cmd, rep["status"]), (0x02, 404))
        # Still serving: a token-id prompt job runs to completion.
        self.sub.subscribe("py-after")
        time.sleep(0.2)
        cmd, ack, _ = self.prod.call(0x01, {"job_id": "py-after", "params": {"max_tokens": 5, "temperature": 0}},
                                     struct.pack("<3i", 1, 403, 407))
        self.assertEqual(ack["status"], 200, ack)
        tokens, fin = self.sub.collect("py-after")
        self.check_stream("py-after", tokens, fin)
        self.assertEqual(fin["prompt_tokens"], 3)
        cmd, stats, _ = self.prod.call(0x06, {})
        self.assertEqual(cmd, 0x07)
        self.assertGreaterEqual(stats["malformed_front"], 3)

    def test_4_tokpipe_generate_matches_the_python_producer(self):
        text = getattr(type(self), "greedy_text", None)
        if text is None:
            self.skipTest("greedy job did not run")
        p = subprocess.run([TOKPIPE, "generate", "--config", self.daemon.config, "--prompt", PROMPT,
                            "--max-tokens", str(MAX_TOKENS), "--temperature", "0", "--json"],
                           capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        line = json.loads(p.stdout)
        self.assertEqual(line["text"], text)
        self.assertEqual(line["prompt"], PROMPT)

    def test_5_tokpipe_generate_equals_tokpipe_run_token_for_token(self):
        """Concurrent jobs of different lengths and stop settings through the
        daemon give exactly the in-process `tokpipe run --json` lines."""
        model = os.path.join(MODELS, "stories260K.bin")
        tok = os.path.join(MODELS, "tok512.bin")
        prompts = ["Once upon a time", "Lily and Tom", "The dog", "One day"]
        cases = [
            ["--temperature", "0", "--max-tokens", "30"],
            ["--temperature", "1", "--top-p", "0.9", "--seed", "7", "--max-tokens", "25", "--stop", "."],
            ["--temperature", "0.8", "--top-k", "20", "--seed", "3", "--max-tokens", "40", "--stop-id", "13",
             "--min-tokens", "5", "--repetition-penalty", "1.2"],
        ]
        for extra in cases:
            args = sum((["--prompt", p] for p in prompts), []) + extra + ["--json"]
            run = subprocess.run([TOKPIPE, "run", "--model", model, "--tokenizer", tok] + args,
                                 capture_output=True, timeout=120)
            if run.returncode != 0:
                self.skipTest("tokpipe run failed: %s" % run.stderr.decode()[-300:])
            gen = subprocess.run([TOKPIPE, "generate", "--config", self.daemon.config] + args,
                                 capture_output=True, timeout=120)
            self.assertEqual(gen.returncode, 0, gen.stderr.decode())
            want = [json.loads(l) for l in run.stdout.decode().splitlines()]
            got = [json.loads(l) for l in gen.stdout.decode().splitlines()]
            if "--seed" not in extra:   # each side drew its own random seed (greedy: unused)
                for line in want + got:
                    line.pop("seed")
            self.assertEqual(got, want, "generate differs from run for %s" % " ".join(extra))

    def test_7_a_req_socket_producer_gets_its_delimiter_back(self):
        req = self.ctx.socket(zmq.REQ)
        req.linger = 0
        req.connect(self.daemon.front)
        try:
            req.send_multipart([b"JOB1", b"\x06", msgpack.packb({"req": 42})])
            self.assertTrue(req.poll(5000), "no reply to a REQ producer\n" + self.daemon.log_text())
            magic, cmd, hdr = req.recv_multipart()[:3]
            self.assertEqual((magic, cmd), (b"JOB1", b"\x07"))
            self.assertEqual(msgpack.unpackb(hdr)["req"], 42)
        finally:
            req.close()

    def test_8_a_plain_subscriber_hears_heartbeats_of_one_incarnation(self):
        def beats(sock, n, timeout_s):
            got, end = [], time.time() + timeout_s
            while len(got) < n and time.time() < end:
                if sock.poll(100):
                    f = sock.recv_multipart()
                    self.assertEqual((f[0], f[1], f[2], len(f)), (b"@heartbeat", b"EVT1", b"\x03", 4))
                    got.append((time.time(), msgpack.unpackb(f[3])))
            return got
        a = self.ctx.socket(zmq.SUB)
        b = self.ctx.socket(zmq.SUB)
        try:
            a.connect(self.daemon.events)
            a.setsockopt(zmq.SUBSCRIBE, b"@heartbeat")
            got = beats(a, 3, 5)  # one at once, then one per second
            self.assertEqual(len(got), 3, "heartbeats: %s\n%s" % (got, self.daemon.log_text()))
            hb = [h for _, h in got]
            self.assertEqual(len({h["incarnation"] for h in hb}), 1, hb)
            self.assertEqual([h["interval_ms"] for h in hb], [1000] * 3)
            self.assertEqual([h["liveness"] for h in hb], [3] * 3)
            self.assertTrue(all(x["uptime_ms"] < y["uptime_ms"] for x, y in zip(hb, hb[1:])), hb)
            gap = got[2][0] - got[1][0]
            self.assertTrue(0.5 < gap < 2.0, "periodic heartbeats %.2f s apart, configured 1 s" % gap)
            # a second subscriber is answered at once, not at the next interval
            t0 = time.time()
            b.connect(self.daemon.events)
            b.setsockopt(zmq.SUBSCRIBE, b"@heartbeat")
            first = beats(b, 1, 3)
            self.assertEqual(len(first), 1)
            self.assertLess(first[0][0] - t0, 0.5)
            self.assertEqual(first[0][1]["incarnation"], hb[0]["incarnation"])
        finally:
            a.close()
            b.close()

    def test_9_a_late_subscriber_catches_up_from_status(self):
        """STATUS_REPLY's recipe: subscribe (heartbeat last), STATUS, then
        append the events after last_seq: the final text, exactly."""
        job = "py-late"
        cmd, ack, _ = self.prod.call(0x01, {"job_id": job, "prompt": PROMPT, "params": {
            "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stop": [" girlzz"]}})
        self.assertEqual(ack["status"], 200, ack)
        while True:  # the job is under way before anyone listens
            _, st, pl = self.prod.call(0x04, {"job_id": job})
            if st["completion_tokens"] >= 20 or st["state"] == "finished":
                break
        sub = self.ctx.socket(zmq.SUB)
        try:
            sub.linger = 0
            sub.connect(self.daemon.events)
            sub.setsockopt(zmq.SUBSCRIBE, job.encode())
            sub.setsockopt(zmq.SUBSCRIBE, b"@heartbeat")
            while sub.recv_multipart()[0] != b"@heartbeat":
                pass
            _, st, pl = self.prod.call(0x04, {"job_id": job})
            self.assertEqual(st["completion_tokens"], len(ids_of(pl[0])))
            text, ids, last, state = st["text"], ids_of(pl[0]), st["last_seq"], st["state"]
            while state != "finished":
                self.assertTrue(sub.poll(5000), "events stopped before FINISH")
                f = sub.recv_multipart()
                if f[0] != job.encode():
                    continue
                ev = msgpack.unpackb(f[3])
                if ev["seq"] <= last:
                    continue  # already in the STATUS reply
                self.assertEqual(ev["seq"], last + 1, "lost events")
                last = ev["seq"]
                text += ev["text"]
                if f[2] == b"\x01":
                    ids += ids_of(f[4])
                else:
                    state = "finished"
        finally:
            sub.close()
        _, fin, pl = self.prod.call(0x04, {"job_id": job})
        self.assertEqual(fin["state"], "finished")
        self.assertEqual(text, fin["text"])
        self.assertEqual(ids, ids_of(pl[0]))
        self.assertEqual(len(ids), 400)

    def test_6_the_python_client_printed_in_protocol_md_works(self):
        doc = open("protocol/PROTOCOL.md", encoding="utf-8").read()
        part = doc[doc.index("A complete producer + subscriber in Python"):doc.index("## 6.")]
        code = "\n".join(l[4:] for l in part.splitlines() if l.startswith("    "))
        script = "FRONT = %r\nEVENTS = %r\n%s" % (self.daemon.front, self.daemon.events,
                                                  code.replace("demo-1", "doc-example"))
        p = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertRegex(p.stdout.decode(), r"(length|eos|stop_string) \d+\n$")


    def test_a_submit_refused_for_its_frames_counts_as_submitted_and_rejected(self):
        """STATS jobs_submitted counts every SUBMIT, those answered with ERROR
        because they could not be decoded included (the command byte said
        SUBMIT): too many frames, or no header."""
        _, before, _ = self.prod.call(0x06, {})
        self.prod.send_raw([b"JOB1", b"\x01", msgpack.packb({"prompt": "x"})] + [b""] * 10)
        cmd, rep, _ = self.prod.recv()
        self.assertEqual((cmd, rep["status"]), (0x7F, 413))
        self.prod.send_raw([b"JOB1", b"\x01"])
        cmd, rep, _ = self.prod.recv()
        self.assertEqual((cmd, rep["status"]), (0x7F, 400))
        _, after, _ = self.prod.call(0x06, {})
        for key in ("jobs_submitted", "jobs_rejected"):
            self.assertEqual(after.get(key, 0) - before.get(key, 0), 2, key)

if __name__ == "__main__":
    unittest.main()
