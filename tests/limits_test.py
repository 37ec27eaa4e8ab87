"""Every documented limit, at the limit and one past it, over ZeroMQ (the
wire of protocol/PROTOCOL.md, pyzmq + msgpack) and over HTTP (the gateway
tokpiped spawns): each request is served or gets a 4xx naming the field;
no worker is ever lost; and afterwards a reference job still equals
`tokpipe run` (issue 21).

Limits (config/tokpipe.yaml defaults, PROTOCOL.md "Limits"):
limits.max_prompt_bytes 1 MiB (prompt text; roles + contents of messages),
prompt token ids 1048576 (and the model's context, 512 for stories260K),
limits.max_stop_strings 1024 distinct strings of limits.max_stop_len 1024
bytes, limits.max_stop_ids 1024, logit_bias 1024 entries,
limits.max_tokens 4096, top_logprobs 20, messages 4096 turns, a SUBMIT
header 4 MiB.

Findings it holds down: a prompt of exactly limits.max_prompt_bytes
(2^20 + 1 ids with BOS) took the tokenize stage down on every try; a text
prompt or conversation over the context was an HTTP 500 (a 200 and an
error event when streamed) and counted as a failed job; a prompt over
4 MiB was a 400 naming no field; `top_n` was missing from TOKEN and
STATUS_REPLY when top_logprobs was 0."""
import http.client
import json
import os
import struct
import subprocess
import sys
import unittest


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

MODEL, TOKENIZER = tpdaemon.STORIES, tpdaemon.TOK512
TEMPLATE = os.path.join(MODELS, "chat-templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
MIB = 1 << 20
CONTEXT = 512          # stories260K's seq_len
CMD_ERROR = 0x7F


def ids_frame(ids):
    return struct.pack("<%di" % len(ids), *ids)


class Limits(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon(chat_template=TEMPLATE, prefix="tp-limits-", sub_all=True)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sub = cls.d.sub
        cls.n_jobs = 0

    def setUp(self):
        self.lost = self.stats().get("workers_lost", 0)

    def tearDown(self):
        st = self.stats()
        self.assertEqual(st.get("workers_lost", 0), self.lost, "a worker was lost\n" + self.d.log_text())

    # ---- helpers ----

    @classmethod
    def get(cls, path):
        c = http.client.HTTPConnection("127.0.0.1", cls.port, timeout=60)
        c.request("GET", path)
        try:
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post(self, body, path="/v1/completions"):
        """(status, parsed JSON or the raw bytes of a 200 stream)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        try:
            r = c.getresponse()
            data = r.read()
        finally:
            c.close()
        if r.getheader("Content-Type", "").startswith("text/event-stream"):
            return r.status, data
        return r.status, json.loads(data)

    def stats(self):
        cmd, st, _ = self.d.call(tpdaemon.CMD_STATS, {})
        return st

    def submit(self, hdr, *payload):
        """SUBMIT over ZeroMQ: (reply command, reply, tokens, finish); tokens
        and finish only when the ACK is 200."""
        Limits.n_jobs += 1
        job = "lim-%d-%d" % (os.getpid(), Limits.n_jobs)
        cmd, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, dict(hdr, job_id=job), *payload, timeout_ms=30000)
        if cmd != tpdaemon.CMD_ACK or ack["status"] != 200:
            return cmd, ack, [], None
        tokens, fin = self.sub.collect(job, timeout_s=120)
        return cmd, ack, tokens, fin

    def assert_refused(self, cmd, ack, field, statuses=(400, 413)):
        self.assertIn(cmd, (tpdaemon.CMD_ACK, CMD_ERROR), ack)
        self.assertIn(ack["status"], statuses, ack)
        self.assertIn(field, ack.get("field", "") + " " + ack.get("error", ""), ack)

    def assert_served(self, cmd, ack, fin):
        self.assertEqual((cmd, ack["status"]), (tpdaemon.CMD_ACK, 200), ack)
        self.assertNotEqual(fin["reason"], "error", fin)

    def assert_http_error(self, status, body, want_status, param):
        self.assertEqual(status, want_status, body)
        self.assertEqual(body["error"]["param"], param, body)

    # ---- prompt text: limits.max_prompt_bytes ----

    def test_prompt_of_exactly_max_prompt_bytes_is_refused_for_the_context_not_a_worker_crash(self):
        before = self.stats()
        cmd, ack, tokens, fin = self.submit({"prompt": "a" * MIB, "params": {"max_tokens": 4}})
        self.assertEqual(ack["status"], 200)   # text: tokenized after the ACK
        self.assertEqual(tokens, [])
        self.assertEqual((fin["reason"], fin["error_code"]), ("error", "context_length_exceeded"))
        self.assertEqual((fin["prompt_tokens"], fin["context_length"]), (MIB + 1, CONTEXT))
        self.assertTrue(fin["error"].startswith("prompt: %d tokens" % (MIB + 1)), fin)
        after = self.stats()
        # the client's error: a rejected request, not a job that failed
        self.assertEqual(after["jobs_rejected"], before["jobs_rejected"] + 1)
        self.assertEqual(after["finish"].get("error", 0), before["finish"].get("error", 0))
        self.assertEqual(after["jobs_finished"], before["jobs_finished"])
        cmd, ack, _, _ = self.submit({"prompt": "a" * (MIB + 1), "params": {"max_tokens": 4}})
        self.assert_refused(cmd, ack, "prompt", (413,))

    def test_http_prompt_at_over_and_far_over_max_prompt_bytes_names_prompt(self):
        st, body = self.post({"prompt": "a" * MIB, "max_tokens": 4})
        self.assert_http_error(st, body, 400, "prompt")
        self.assertEqual(body["error"]["code"], "context_length_exceeded")
        self.assertIn("%d tokens, the model's context holds %d" % (MIB + 1, CONTEXT), body["error"]["message"])
        for size in (MIB + 1, 5 * MIB):   # 5 MiB: more than one SUBMIT header holds
            st, body = self.post({"prompt": "a" * size, "max_tokens": 4})
            self.assert_http_error(st, body, 413, "prompt")
            self.assertIn("prompt: %d bytes, the limit is %d" % (size, MIB), body["error"]["message"])

    def test_http_text_prompt_over_the_context_is_a_400_streamed_or_not_and_chat_names_messages(self):
        long_prompt = "Once upon a time " * 150
        for stream in (False, True):
            st, body = self.post({"prompt": long_prompt, "max_tokens": 4, "stream": stream})
            self.assert_http_error(st, body, 400, "prompt")
            self.assertEqual(body["error"]["code"], "context_length_exceeded")
            self.assertRegex(body["error"]["message"], r"^prompt: \d+ tokens, the model's context holds 512$")
            st, body = self.post({"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 4,
                                  "stream": stream}, "/v1/chat/completions")
            self.assert_http_error(st, body, 400, "messages")
            self.assertEqual(body["error"]["code"], "context_length_exceeded")
            self.assertRegex(body["error"]["message"], r"^messages: \d+ tokens, the model's context holds 512$")
        # a stream that fits still streams
        st, data = self.post({"prompt": "Once upon a time", "max_tokens": 4, "stream": True})
        self.assertEqual(st, 200)
        self.assertTrue(data.endswith(b"data: [DONE]\n\n"), data)

    # ---- prompt token ids: 1048576 and the context ----

    def test_prompt_ids_at_the_context_and_the_protocol_cap(self):
        cmd, ack, tokens, fin = self.submit({"params": {"max_tokens": 1}}, ids_frame([1] + [403] * (CONTEXT - 2)))
        self.assert_served(cmd, ack, fin)
        cmd, ack, _, _ = self.submit({"params": {"max_tokens": 1}}, ids_frame([1] + [403] * (CONTEXT - 1)))
        self.assert_refused(cmd, ack, "prompt", (400,))
        self.assertEqual(ack["error_code"], "context_length_exceeded")
        cmd, ack, _, _ = self.submit({"params": {"max_tokens": 1}}, ids_frame([403] * MIB))
        self.assert_refused(cmd, ack, "prompt", (400,))
        self.assertEqual((ack["prompt_tokens"], ack["context_length"]), (MIB, CONTEXT))
        cmd, ack, _, _ = self.submit({"params": {"max_tokens": 1}}, ids_frame([403] * (MIB + 1)))
        self.assert_refused(cmd, ack, "prompt")

    def test_http_prompt_ids_at_the_context_and_the_cap(self):
        st, body = self.post({"prompt": [1] + [403] * (CONTEXT - 2), "max_tokens": 1})
        self.assertEqual(st, 200, body)
        st, body = self.post({"prompt": [403] * MIB, "max_tokens": 1})
        self.assert_http_error(st, body, 400, "prompt")
        self.assertEqual(body["error"]["code"], "context_length_exceeded")
        st, body = self.post({"prompt": [403] * (MIB + 1), "max_tokens": 1})
        self.assert_http_error(st, body, 413, "prompt")

    # ---- stop strings, stop ids, logit_bias, max_tokens, top_logprobs ----

    def test_stop_strings_and_ids_at_and_past_their_limits(self):
        many = ["%04d" % i + "x" * 1020 for i in range(1024)]   # 1024 distinct of 1024 bytes
        cmd, ack, _, fin = self.submit({"prompt": "Once", "params": {"max_tokens": 4, "stop": many}})
        self.assert_served(cmd, ack, fin)
        cmd, ack, _, _ = self.submit({"prompt": "Once", "params": {"max_tokens": 4, "stop": many + ["one more"]}})
        self.assert_refused(cmd, ack, "stop")
        cmd, ack, _, _ = self.submit({"prompt": "Once", "params": {"max_tokens": 4, "stop": ["y" * 1025]}})
        self.assert_refused(cmd, ack, "stop")
        ids = list(range(3, 3 + 1024))
        cmd, ack, _, fin = self.submit({"prompt": "Once", "params": {"max_tokens": 4, "stop_token_ids": ids}})
        # ids 3..1026 reach past stories260K's 512-token vocabulary: refused naming the id
        self.assert_refused(cmd, ack, "stop_token_ids")
        ids = [3 + i % 500 for i in range(1024)]
        cmd, ack, _, fin = self.submit({"prompt": "Once", "params": {"max_tokens": 4, "stop_token_ids": ids}})
        self.assert_served(cmd, ack, fin)
        cmd, ack, _, _ = self.submit({"prompt": "Once", "params": {"max_tokens": 4, "stop_token_ids": ids + [3]}})
        self.assert_refused(cmd, ack, "stop_token_ids")

    def test_http_stop_strings_past_the_limits_and_the_header_name_stop(self):
        st, body = self.post({"prompt": "Once", "max_tokens": 4, "stop": ["x" * 1024]})
        self.assertEqual(st, 200, body)
        st, body = self.post({"prompt": "Once", "max_tokens": 4, "stop": ["x" * 1025]})
        self.assert_http_error(st, body, 413, "stop[0]")
        # 4096 copies of one 1024-byte string: every per-field limit holds
        # (one distinct string), the SUBMIT header (4 MiB) does not
        st, body = self.post({"prompt": "Once", "max_tokens": 4, "stop": ["x" * 1024] * 4096})
        self.assert_http_error(st, body, 413, "stop")

    def test_logit_bias_max_tokens_and_top_logprobs_at_and_past_their_limits(self):
        # stories260K has 512 tokens: the whole vocabulary is served, 1024
        # entries must name an id outside it, 1025 are past the cap
        full = {str(i): 0.25 for i in range(512)}
        cmd, ack, _, fin = self.submit({"prompt": "Once", "params": {"max_tokens": 4, "logit_bias": full}})
        self.assert_served(cmd, ack, fin)
        for n in (1024, 1025):
            over = {str(i): 0.0 for i in range(n)}
            cmd, ack, _, _ = self.submit({"prompt": "Once", "params": {"max_tokens": 4, "logit_bias": over}})
            self.assert_refused(cmd, ack, "logit_bias")
        cmd, ack, _, fin = self.submit({"prompt": "Once", "params": {"max_tokens": 4096, "temperature": 0,
                                                                      "ignore_eos": True}})
        self.assert_served(cmd, ack, fin)   # served: the context ends it first
        self.assertEqual(fin["reason"], "length")
        cmd, ack, _, _ = self.submit({"prompt": "Once", "params": {"max_tokens": 4097}})
        self.assert_refused(cmd, ack, "max_tokens")
        cmd, ack, tokens, fin = self.submit({"prompt": "Once", "params": {"max_tokens": 2, "logprobs": True,
                                                                           "top_logprobs": 20}})
        self.assert_served(cmd, ack, fin)
        self.assertEqual({t["top_n"] for t in tokens}, {20})
        cmd, ack, _, _ = self.submit({"prompt": "Once", "params": {"max_tokens": 2, "logprobs": True,
                                                                    "top_logprobs": 21}})
        self.assert_refused(cmd, ack, "top_logprobs")
        st, body = self.post({"prompt": "Once", "max_tokens": 2, "logit_bias": over})
        self.assert_http_error(st, body, 400, "logit_bias")

    def test_top_n_is_present_when_logprobs_are_asked_with_top_logprobs_zero_or_left_out(self):
        for params in ({"logprobs": True, "top_logprobs": 0}, {"logprobs": True}):
            cmd, ack, tokens, fin = self.submit({"prompt": "Once", "params": dict(params, max_tokens=3)})
            self.assert_served(cmd, ack, fin)
            self.assertTrue(tokens)
            for t in tokens:
                self.assertEqual(t.get("top_n"), 0, t)
                self.assertEqual(len(t["lp"]), len(t["ids"]))
            cmd, rep, pl = self.d.call(tpdaemon.CMD_STATUS, {"job_id": fin["job_id"]})
            self.assertEqual(rep.get("top_n"), 0, rep)
        # a job that ends before any token (over the context): STATUS too
        cmd, ack, tokens, fin = self.submit({"prompt": "Once upon a time " * 150,
                                            "params": {"max_tokens": 3, "logprobs": True, "top_logprobs": 2}})
        self.assertEqual((tokens, fin["reason"]), ([], "error"))
        cmd, rep, pl = self.d.call(tpdaemon.CMD_STATUS, {"job_id": fin["job_id"]})
        self.assertEqual(rep.get("top_n"), 2, rep)
        cmd, ack, tokens, fin = self.submit({"prompt": "Once", "params": {"max_tokens": 3}})
        self.assertNotIn("top_n", tokens[0])
        cmd, rep, pl = self.d.call(tpdaemon.CMD_STATUS, {"job_id": fin["job_id"]})
        self.assertNotIn("top_n", rep)

    # ---- messages: roles + contents within limits.max_prompt_bytes, 4096 turns ----

    def test_messages_at_and_past_their_limits(self):
        content = "a" * (MIB - len("user"))
        cmd, ack, tokens, fin = self.submit({"messages": [{"role": "user", "content": content}],
                                            "params": {"max_tokens": 4}})
        self.assertEqual(ack["status"], 200)
        self.assertEqual(tokens, [])
        # rendered by the template it no longer fits what one prompt may be
        self.assertEqual((fin["reason"], fin.get("error_code")), ("error", "prompt_too_large"))
        self.assertRegex(fin["error"], r"^messages: the conversation renders to \d+ bytes, a prompt holds %d$" % MIB)
        cmd, ack, _, _ = self.submit({"messages": [{"role": "user", "content": content + "a"}],
                                      "params": {"max_tokens": 4}})
        self.assert_refused(cmd, ack, "messages", (413,))
        turns = [{"role": "user", "content": "hi"}] * 4096
        cmd, ack, tokens, fin = self.submit({"messages": turns, "params": {"max_tokens": 4}})
        self.assertEqual(ack["status"], 200)
        self.assertEqual((fin["reason"], fin.get("error_code")), ("error", "context_length_exceeded"))
        self.assertTrue(fin["error"].startswith("messages: "), fin)
        cmd, ack, _, _ = self.submit({"messages": turns + [{"role": "user", "content": "hi"}],
                                      "params": {"max_tokens": 4}})
        self.assert_refused(cmd, ack, "messages")
        st, body = self.post({"messages": [{"role": "user", "content": content}], "max_tokens": 4},
                             "/v1/chat/completions")
        self.assert_http_error(st, body, 400, "messages")
        st, body = self.post({"messages": [{"role": "user", "content": content + "a"}], "max_tokens": 4},
                             "/v1/chat/completions")
        self.assert_http_error(st, body, 413, "messages")
        st, body = self.post({"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 4},
                             "/v1/chat/completions")
        self.assertEqual(st, 200, body)

    def metrics(self):
        st, data = self.get("/metrics")
        self.assertEqual(st, 200)
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                key, val = line.rsplit(" ", 1)
                out[key] = float(val)
        return out

    def test_a_conversation_rendered_past_the_prompt_limit_is_a_rejection_not_a_failed_job(self):
        # 1 MiB of roles + contents (limits.max_prompt_bytes) is accepted;
        # the template's turn markers take its rendering past the 1 MiB one
        # prompt may be: the client's error, as a prompt past the context is
        content = "a" * (MIB - len("user"))
        before = self.stats()
        cmd, ack, tokens, fin = self.submit({"messages": [{"role": "user", "content": content}],
                                            "params": {"max_tokens": 4}})
        self.assertEqual(ack["status"], 200)
        self.assertEqual((tokens, fin["seq"]), ([], 0))
        self.assertEqual((fin["reason"], fin.get("error_code")), ("error", "prompt_too_large"), fin)
        rendered = len("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                       "<|im_end|>\n<|im_start|>user\n" + content + "<|im_end|>\n<|im_start|>assistant\n")
        self.assertEqual(fin["error"], "messages: the conversation renders to %d bytes, a prompt holds %d"
                         % (rendered, MIB))
        after = self.stats()
        self.assertEqual(after.get("jobs_rejected", 0), before.get("jobs_rejected", 0) + 1, "counted as a rejection")
        self.assertEqual(after["finish"].get("error", 0), before["finish"].get("error", 0),
                         "counted as a failed job")
        self.assertEqual(after.get("jobs_finished", 0), before.get("jobs_finished", 0))
        # over HTTP, streamed or not: a 400 naming messages, the length and
        # the limit; /metrics counts a rejection, not an error finish
        for stream in (False, True):
            m0 = self.metrics()
            st, body = self.post({"messages": [{"role": "user", "content": content}], "max_tokens": 4,
                                  "stream": stream}, "/v1/chat/completions")
            self.assert_http_error(st, body, 400, "messages")
            self.assertEqual(body["error"]["code"], "prompt_too_large", body)
            self.assertEqual(body["error"]["type"], "invalid_request_error", body)
            self.assertEqual(body["error"]["message"], fin["error"])
            m1 = self.metrics()
            self.assertEqual(m1["tokpipe_jobs_rejected_total"], m0["tokpipe_jobs_rejected_total"] + 1)
            err = 'tokpipe_jobs_finished_total{reason="error"}'
            self.assertEqual(m1.get(err, 0), m0.get(err, 0), "counted as a failed job in /metrics")

    # ---- afterwards ----

    def test_zz_after_every_limit_each_stage_still_has_its_worker_and_a_job_equals_run(self):
        st = self.stats()
        for stage in tpdaemon.STAGES:
            self.assertEqual(st["workers"].get(stage), 1, st["workers"])
        cmd, ack, tokens, fin = self.submit({"prompt": "Once upon a time",
                                            "params": {"max_tokens": 24, "temperature": 0}})
        self.assert_served(cmd, ack, fin)
        out = subprocess.run([TOKPIPE, "run", "--model", MODEL, "--tokenizer", TOKENIZER, "--json",
                              "--prompt", "Once upon a time", "--max-tokens", "24", "--temperature", "0"],
                             capture_output=True, text=True, timeout=120, check=True)
        ref = json.loads(out.stdout.splitlines()[0])
        self.assertEqual([i for t in tokens for i in t["ids"]], ref["tokens"])
        self.assertEqual("".join(t["text"] for t in tokens) + fin.get("text", ""), ref["text"])


if __name__ == "__main__":
    unittest.main()
