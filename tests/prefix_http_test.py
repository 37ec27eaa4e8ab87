"""The prefix cache over HTTP (bin/tokpipe-http spawned by the real
tokpiped on stories260K): usage.prompt_tokens_details.cached_tokens on every
completion, streamed (the usage chunk) or not: 0 on a cold cache, then the
whole 16-token pages of the prompt before its last token; the text never
changes with a hit; /metrics counts the hits."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from http_gateway_test import Daemon, metric, post, request, run_json, stream, wait_idle  # noqa: E402

PROMPT = ("Once upon a time there was a little girl named Lily. She loved to play outside in the sun "
          "with her friends. One day she saw a big red ball in the park")


class PrefixCacheOverHttp(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return Daemon()

    def test_cached_tokens_on_every_response_and_the_text_never_changes(self):
        p = {"max_tokens": 20, "temperature": 0}
        want = run_json(PROMPT, p)
        st, cold, _ = post(self.port, dict(p, prompt=PROMPT))
        self.assertEqual(st, 200, cold)
        n = cold["usage"]["prompt_tokens"]
        self.assertEqual(n, want["prompt_tokens"])
        self.assertGreater(n, 32, "the prompt must span whole pages")
        self.assertEqual(cold["usage"]["prompt_tokens_details"], {"cached_tokens": 0})
        self.assertEqual(cold["choices"][0]["text"], want["text"])
        wait_idle(self.port)
        st, warm, _ = post(self.port, dict(p, prompt=PROMPT))
        self.assertEqual(st, 200, warm)
        pages = (n - 1) // 16 * 16   # the last prompt token is always computed
        self.assertEqual(warm["usage"]["prompt_tokens_details"]["cached_tokens"], pages)
        self.assertEqual(warm["choices"][0]["text"], want["text"])
        self.assertEqual(warm["usage"]["prompt_tokens"], n)
        events = stream(self.port, dict(p, prompt=PROMPT, stream_options={"include_usage": True}))
        usage = events[-2]["usage"]
        self.assertEqual(usage["prompt_tokens_details"], {"cached_tokens": pages})
        self.assertEqual("".join(e["choices"][0]["text"] for e in events[:-2] if e["choices"]), want["text"])
        _, m, _ = request(self.port, "GET", "/metrics")
        text = m.decode()
        self.assertGreaterEqual(metric(text, "tokpipe_prefix_cache_hit_tokens_total"), 2 * pages)
        self.assertGreater(metric(text, "tokpipe_prefix_cache_hit_rate"), 0)
        self.assertGreater(metric(text, "tokpipe_prefix_cache_bytes"), 0)


if __name__ == "__main__":
    unittest.main()
