"""STATUS of a running job whose output is split: the real daemon serves a
random-weight model (Qwen3 vocabulary and template) whose greedy output is
a thinking part, then tool calls without end:
    <think>Look it up.</think><tool_call>{...}</tool_call><tool_call>{...
Asked while the calls stream, STATUS answers the reasoning and the calls
exactly as the TOKEN deltas up to its last_seq built them, and they are a
prefix of what FINISH (after CANCEL) returns: each call but the last
whole, the last one's arguments a prefix of its final arguments."""
import json
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpdaemon  # noqa: E402
from toolcall_job_test import CALL, OUTPUT, QWEN3, THOUGHT, TOOLS, USER, chain_model  # noqa: E402

CMD_CANCEL = 0x03
MAX_TOKENS = 30000   # far more than the test waits for: the job runs until cancelled


def built(tokens, last_seq=None):
    """The reasoning and the calls as the TOKEN deltas (up to last_seq) build them."""
    reasoning, calls = "", []
    for t in tokens:
        if last_seq is not None and t["seq"] > last_seq:
            break
        reasoning += t.get("reasoning", "")
        for d in t.get("tool_calls", []):
            if not calls or calls[-1]["id"] != d["id"]:
                calls.append({"id": d["id"], "name": d["name"], "arguments": ""})
            calls[-1]["arguments"] += d.get("arguments", "")
    return reasoning, calls


class StatusOfARunningJob(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tp-tcstatus-")
        cls.model = os.path.join(cls.dir, "qwen3-calls.gguf")
        chain = tpdaemon.tokenize(QWEN3, OUTPUT, "--special")
        start = tpdaemon.tokenize(QWEN3, "<|im_start|>assistant\n", "--special")[-1]
        end = tpdaemon.tokenize(QWEN3, "<|im_end|>", "--special")[0]
        open_call = tpdaemon.tokenize(QWEN3, "<tool_call>", "--special")
        assert len(open_call) == 1 and len(set(chain)) == len(chain), (open_call, chain)
        chain_model(cls.model, start, chain, end, loop_to=chain.index(open_call[0]), seq_len=MAX_TOKENS + 512)
        cls.d = tpdaemon.Daemon("limits:\n  max_tokens: %d\n" % MAX_TOKENS, model=cls.model, tokenizer="",
                                prefix="tp-tcstatus-", stop_timeout_s=90, ready=True)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_status_mid_job_is_a_prefix_of_finish(self):
        sub = self.d.subscriber("tc-status")
        self.addCleanup(sub.sock.close, 0)
        _, ack, _ = self.d.call(tpdaemon.CMD_SUBMIT, {
            "job_id": "tc-status", "messages": [{"role": "user", "content": USER}], "tools": json.dumps(TOOLS),
            "params": {"max_tokens": MAX_TOKENS, "temperature": 0.0}})
        self.assertEqual(ack["status"], 200, ack)
        # wait until the deltas have opened a second call, the first whole
        tokens = []
        while len(built(tokens)[1]) < 2:
            self.assertTrue(sub.sock.poll(60000), "no TOKEN event\n" + self.d.log_text())
            f = sub.sock.recv_multipart()
            if f[0] == b"tc-status":
                self.assertEqual(f[2], b"\x01", "the job finished before its second call")
                tokens.append(tpdaemon.msgpack.unpackb(f[3]))
        _, st, _ = self.d.call(tpdaemon.CMD_STATUS, {"job_id": "tc-status"})
        self.assertEqual((st["status"], st["state"]), (200, "running"), st)
        _, ack, _ = self.d.call(CMD_CANCEL, {"job_id": "tc-status"})
        self.assertEqual(ack["status"], 200, ack)
        rest, fin = sub.collect("tc-status")
        tokens += rest
        self.assertEqual(fin["reason"], "cancelled", fin)
        # what STATUS said is what the events up to its last_seq said
        reasoning, calls = built(tokens, st["last_seq"])
        self.assertEqual(st["reasoning_content"], reasoning)
        self.assertEqual(st["tool_calls"], calls)
        # ... and a prefix of FINISH's: the thinking whole, each call but
        # the last one whole, the last one's arguments begun
        self.assertEqual(st["reasoning_content"], THOUGHT)
        self.assertEqual(fin["reasoning_content"], THOUGHT)
        now, final = st["tool_calls"], fin["tool_calls"]
        self.assertGreaterEqual(len(now), 2)
        self.assertGreater(len(final), len(now) - 1)
        self.assertEqual(now[:-1], final[:len(now) - 1])
        last, same = now[-1], final[len(now) - 1]
        self.assertEqual((last["id"], last["name"]), (same["id"], same["name"]))
        self.assertTrue(same["arguments"].startswith(last["arguments"]), (last, same))
        args = json.loads(CALL)["arguments"]
        for c in final[:-1]:
            self.assertEqual((c["name"], json.loads(c["arguments"])), ("get_weather", args))
        self.assertEqual(len({c["id"] for c in final}), len(final))
        self.assertEqual(fin["text"], "")


if __name__ == "__main__":
    unittest.main()
