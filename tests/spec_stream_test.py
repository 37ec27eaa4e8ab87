"""Speculative decoding over the wire: a job's events with
`params.speculative` are the same as without it, event by event (seq, ids,
text deltas, logprob columns), and so is FINISH but for its timings and
draft counts; over many seeds and stop settings."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402

PROMPT = "The cat sat on the mat. The cat sat on the mat. The cat sat on the"
# cached_tokens: the second job of a pair takes the first one's prompt from the prefix cache
VOLATILE = {"queue_us", "ttft_us", "total_us", "pin", "job_id", "draft_tokens", "draft_accepted", "cached_tokens"}


class SpeculationKeepsTheStream(tpdaemon.DaemonCase):
    PREFIX = "tp-spec-stream-"

    def events(self, job, params):
        cmd, ack, _ = self.prod.call(0x01, {"job_id": job, "prompt": PROMPT, "params": params})
        self.assertEqual(ack["status"], 200, ack)
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
                  "logprobs": True, "top_logprobs": 3}]
        for n, base in enumerate(cases):
            for seed in range(3):
                p = dict(base, seed=seed)
                plain_t, plain_f = self.events("plain-%d-%d" % (n, seed), p)
                spec_t, spec_f = self.events("spec-%d-%d" % (n, seed), dict(p, speculative={"mode": "ngram"}))
                self.assertEqual(spec_t, plain_t, (n, seed))
                drafted += spec_f.get("draft_tokens", 0)
                accepted += spec_f.get("draft_accepted", 0)
                self.assertNotIn("draft_tokens", plain_f)
                strip = lambda f: {k: v for k, v in f.items() if k not in VOLATILE}  # noqa: E731
                self.assertEqual(strip(spec_f), strip(plain_f), (n, seed))
        self.assertGreater(accepted, 0)
        self.assertLessEqual(accepted, drafted)


if __name__ == "__main__":
    unittest.main()
