"""Speculative decoding over the wire: a job's events with
`params.speculative` are the same as without it, event by event (seq, ids,
text deltas, logprob columns), and so is FINISH but for its timings and
draft counts; over many seeds and stop settings. With prompt lookup
(ngram), and with a draft model run by draft workers (mode draft):
stories260K drafting for itself (most guesses taken) and a random model
of its vocabulary (almost none), also when the draft worker is killed
in the middle of a job."""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402

PROMPT = "The cat sat on the mat. The cat sat on the mat. The cat sat on the"
# cached_tokens: the second job of a pair takes the first one's prompt from the prefix cache
VOLATILE = {"queue_us", "ttft_us", "total_us", "pin", "job_id", "draft_tokens", "draft_accepted", "cached_tokens"}


def strip(f):
    return {k: v for k, v in f.items() if k not in VOLATILE}


class SpeculationKeepsTheStream(tpdaemon.DaemonCase):
    PREFIX = "tp-spec-stream-"
    SPEC = {"mode": "ngram"}
    TAKES = True   # some guesses must have been taken
    SEEDS = 3

    def submit(self, job, params, prompt=PROMPT):
        cmd, ack, _ = self.prod.call(0x01, {"job_id": job, "prompt": prompt, "params": params})
        self.assertEqual(ack["status"], 200, ack)

    def events(self, job, params, prompt=PROMPT):
        self.submit(job, params, prompt)
        tokens, fin = self.sub.collect(job)
        for t in tokens:
            t.pop("job_id", None)
            t.pop("pin", None)
        return tokens, fin

    def test_events_are_the_same_with_and_without_speculation(self):
        drafted = accepted = 0
        for topic in ("plain-", "spec-", "@heartbeat"):
            self.sub.subscribe(topic)
        self.sub.wait_heartbeat(self.daemon.log_text)
        cases = [{"temperature": 0, "max_tokens": 120, "ignore_eos": True},
                 {"temperature": 0, "max_tokens": 120, "stop": [" cat."], "include_stop_str_in_output": True},
                 {"temperature": 0.8, "top_k": 30, "max_tokens": 100, "stop": ["the"], "min_tokens": 4,
                  "logprobs": True, "top_logprobs": 3},
                 {"temperature": 1.0, "top_p": 0.9, "max_tokens": 150, "stop": [" dog", "."],
                  "repetition_penalty": 1.1}]
        for n, base in enumerate(cases):
            for seed in range(self.SEEDS):
                p = dict(base, seed=seed)
                plain_t, plain_f = self.events("plain-%d-%d" % (n, seed), p)
                spec_t, spec_f = self.events("spec-%d-%d" % (n, seed), dict(p, speculative=self.SPEC))
                self.assertEqual(spec_t, plain_t, (n, seed))
                drafted += spec_f.get("draft_tokens", 0)
                accepted += spec_f.get("draft_accepted", 0)
                self.assertNotIn("draft_tokens", plain_f)
                self.assertEqual(strip(spec_f), strip(plain_f), (n, seed))
        self.assertGreater(drafted, 0)
        if self.TAKES:
            self.assertGreater(accepted, 0)
        self.assertLessEqual(accepted, drafted)


class DraftModelKeepsTheStream(SpeculationKeepsTheStream):
    """Mode draft, its draft workers running DRAFT_MODEL (a path, or a
    callable making one in a temporary directory before the daemon
    starts): stories260K as its own draft model, whose guesses greedy jobs
    take nearly all of."""
    PREFIX = "tp-spec-draft-"
    SPEC = {"mode": "draft"}
    SEEDS = 4
    DRAFT_MODEL = tpdaemon.STORIES

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(cls.tmp.cleanup)
        path = cls.DRAFT_MODEL(cls.tmp.name) if callable(cls.DRAFT_MODEL) else cls.DRAFT_MODEL
        cls.CONFIG = "speculative:\n  draft_model: %s\nworkers:\n  draft: 1\n" % path
        super().setUpClass()
        cls.daemon.wait_worker("draft")

    def test_draft_worker_killed_in_the_middle_of_a_job(self):
        """kill -9 of the draft worker after a job's first tokens: the job
        goes on (without guesses, then with a new draft worker's, fed its
        sequence from the start) to the same events as without
        speculation; the next job drafts on the new worker."""
        for topic in ("kplain-", "kspec-", "knext-", "@heartbeat"):
            self.sub.subscribe(topic)
        self.sub.wait_heartbeat(self.daemon.log_text)
        for seed, temp in ((1, 0), (2, 0.8)):
            p = {"temperature": temp, "max_tokens": 500, "ignore_eos": True, "seed": seed}
            plain_t, plain_f = self.events("kplain-%d" % seed, p, "Once upon a time")
            job = "kspec-%d" % seed
            t0 = time.monotonic()
            self.submit(job, dict(p, speculative=self.SPEC), "Once upon a time")
            pid = tpdaemon.worker_pid(self.daemon.proc.pid, "draft")
            self.assertIsNotNone(pid)
            first = None
            while first is None:
                self.assertTrue(self.sub.sock.poll(20000), self.daemon.log_text())
                f = self.sub.sock.recv_multipart()
                if f[0] == job.encode():
                    self.assertEqual(f[2], b"\x01", "the job finished before its first token was seen")
                    first = f
            os.kill(pid, signal.SIGKILL)
            killed_after_us = (time.monotonic() - t0) * 1e6
            rest, fin = self.sub.collect(job)
            print("\n  %s: draft worker killed %.0f us after SUBMIT; the job ran %d us" % (job, killed_after_us,
                                                                                      fin["total_us"]))
            self.assertGreater(fin["total_us"], killed_after_us, "the job ended before the kill")
            self.assertEqual(len(rest) + 1, len(plain_t), "events lost or added across the kill")
            spec_t = [dict(t) for t in rest]
            for t in spec_t:
                t.pop("job_id", None)
                t.pop("pin", None)
            self.assertEqual(spec_t, plain_t[1:], seed)
            self.assertEqual(strip(fin), strip(plain_f), seed)
            self.daemon.wait_worker("draft", but=pid)
        # the new worker serves: a greedy job after it takes guesses again
        _, fin = self.events("knext-0", {"temperature": 0, "max_tokens": 120, "ignore_eos": True,
                                         "speculative": self.SPEC}, "Once upon a time")
        self.assertGreater(fin.get("draft_tokens", 0), 0, fin)
        if self.TAKES:
            self.assertGreater(fin.get("draft_accepted", 0), 20, fin)
        self.assertIn("lost", self.daemon.log_text(100000))


def random_draft_model(tmp):
    """A random llama of stories260K's vocabulary, 1/8 its width."""
    path = os.path.join(tmp, "draft-random.gguf")
    subprocess.run([tpdaemon.TOKPIPE, "mkmodel", "--format", "gguf", "--vocab-from",
                    os.path.join(tpdaemon.MODELS, "stories260K.gguf"), "--shape", "32x2", "--seed", "7",
                    "--out", path], check=True, capture_output=True, timeout=120)
    return path


class RandomDraftKeepsTheStream(DraftModelKeepsTheStream):
    """A random draft model: its guesses are wrong, the job backs off."""
    DRAFT_MODEL = staticmethod(random_draft_model)
    TAKES = False


class DraftModelOfAnotherVocabulary(unittest.TestCase):
    def test_tokpiped_refuses_it_at_start_naming_both_sizes(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "v600.bin")
            subprocess.run([tpdaemon.TOKPIPE, "mkmodel", "--shape", "32x2", "--vocab", "600", "--seed", "3", "--out",
                            path], check=True, capture_output=True, timeout=120)
            d = tpdaemon.Daemon("speculative:\n  draft_model: %s\n" % path, prefix="tp-spec-vocab-")
            try:
                self.assertNotEqual(d.proc.wait(30), 0, "tokpiped started with a draft model of 600 tokens")
                log = d.log_text()
            finally:
                d.stop()
        self.assertIn("600", log)
        self.assertIn("512", log)
        self.assertIn("vocabulary", log)


if __name__ == "__main__":
    unittest.main()
