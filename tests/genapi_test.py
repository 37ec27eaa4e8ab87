"""The generation API end to end on stories260K, through the real daemon
(one process per stage, and forward,sample fused) and against `tokpipe run`
in process: logprobs, logit_bias, typical_p, replayable seeds, explicit
context limits, truncate_prompt_tokens, INFO / `tokpipe info`, and
`tokpipe generate` when one of several prompts is refused with 429.

The producer and subscriber speak the wire from protocol/PROTOCOL.md
(pyzmq + msgpack). Oracles: the model file's own header (vocabulary,
context), `tokpipe run` (the in-process reference), and the events'
invariants."""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE, TOKPIPED  # noqa: E402

MODEL = tpdaemon.STORIES
TOKENIZER = tpdaemon.TOK512
PROMPT = "Once upon a time"


def model_header():
    """llama2.c header: dim, hidden, layers, heads, kv_heads, vocab, seq_len."""
    with open(MODEL, "rb") as f:
        h = struct.unpack("<7i", f.read(28))
    return {"vocab": abs(h[5]), "seq_len": h[6]}


def f32(x):
    """x as the float32 the wire carried (run --json prints floats as doubles)."""
    return struct.unpack("<f", struct.pack("<f", x))[0] if x is not None else None


class Daemon(tpdaemon.Daemon):
    """Ready (every stage has a worker), with a SUB to every event."""

    def __init__(self, extra="", model=MODEL, tokenizer=TOKENIZER):
        super().__init__(extra, model=model, tokenizer=tokenizer, prefix="tp-genapi-", stop_timeout_s=20, ready=True,
                         sub_all=True)
        self.n_jobs = 0

    def submit(self, params, prompt=PROMPT, ids=None):
        """SUBMIT, then collect events until FINISH: (ack, tokens, finish)."""
        self.n_jobs += 1
        job_id = "g-%d-%d" % (os.getpid(), self.n_jobs)
        hdr = {"job_id": job_id, "params": params}
        payload = []
        if ids is None:
            hdr["prompt"] = prompt
        else:
            payload = [struct.pack("<%di" % len(ids), *ids)]
        cmd, ack, _ = self.call(tpdaemon.CMD_SUBMIT, hdr, *payload)
        if ack["status"] != 200:
            return ack, [], None
        try:
            return (ack,) + self.sub.collect(job_id)
        except AssertionError as e:
            raise AssertionError("%s\n%s" % (e, self.log_text()))


def run_json(*args):
    out = subprocess.run([TOKPIPE, "run", "--model", MODEL, "--tokenizer", TOKENIZER, "--json"] + list(args),
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError("tokpipe run %s: %s" % (args, out.stderr))
    return [json.loads(line) for line in out.stdout.splitlines()]


def wire_logprobs(tokens):
    """TOKEN events -> the `run --json` logprobs list (float32 values)."""
    out = []
    for ev in tokens:
        k = ev.get("top_n", 0)
        for i, tid in enumerate(ev["ids"]):
            top = [{"id": ev["top_ids"][i * k + c], "logprob": ev["top_lp"][i * k + c]}
                   for c in range(k) if ev["top_ids"][i * k + c] >= 0]
            out.append({"id": tid, "logprob": ev["lp"][i], "top": top})
    return out


def as_f32(lps):
    return [{"id": e["id"], "logprob": f32(e["logprob"]),
             "top": [{"id": t["id"], "logprob": f32(t["logprob"])} for t in e["top"]]} for e in lps]


class GenerationApi(object):
    """Shared by the separate-process and the fused deployments."""
    EXTRA = ""

    @classmethod
    def setUpClass(cls):
        if not os.access(TOKPIPED, os.X_OK):
            raise unittest.SkipTest("tokpiped is not built")
        cls.d = Daemon(cls.EXTRA)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def test_seeded_logprobs_are_identical_in_process_and_through_the_daemon(self):
        for mode in ("raw", "processed"):
            params = {"seed": 4242, "temperature": 0.9, "top_k": 40, "max_tokens": 24, "logprobs": True,
                      "top_logprobs": 5, "logprobs_mode": mode, "repetition_penalty": 1.2}
            ack, tokens, fin = self.d.submit(params)
            self.assertEqual(ack["status"], 200, ack)
            ref = run_json("--prompt", PROMPT, "--seed", "4242", "--temperature", "0.9", "--top-k", "40",
                           "--max-tokens", "24", "--top-logprobs", "5", "--logprobs-mode", mode,
                           "--repetition-penalty", "1.2")[0]
            ids = [i for ev in tokens for i in ev["ids"]]
            self.assertEqual(ids, ref["tokens"], mode)
            self.assertEqual(as_f32(wire_logprobs(tokens)), as_f32(ref["logprobs"]), mode)
            for e in wire_logprobs(tokens):
                self.assertLessEqual(sum(math.exp(t["logprob"]) for t in e["top"]), 1.0 + 1e-5)
                self.assertEqual(len(e["top"]), 5)

    def test_status_of_a_finished_job_carries_the_logprobs_its_events_did(self):
        ack, tokens, fin = self.d.submit({"seed": 5, "max_tokens": 12, "logprobs": True, "top_logprobs": 4})
        _, st, pl = self.d.call(tpdaemon.CMD_STATUS, {"job_id": fin["job_id"]})
        self.assertEqual((st["state"], st["top_n"]), ("finished", 4))
        ids = tpdaemon.ids_of(pl[0])
        status_lp = dict(tpdaemon.logprob_frames(len(ids), 4, pl[1:4]), ids=ids, top_n=4)
        self.assertEqual(wire_logprobs([status_lp]), wire_logprobs(tokens))
        out = subprocess.run([TOKPIPE, "status", "--json", "--config", self.d.config, fin["job_id"]],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(as_f32(json.loads(out.stdout)["logprobs"]), as_f32(wire_logprobs(tokens)))

    def test_greedy_tokens_are_the_top_logprob_on_the_wire(self):
        ack, tokens, fin = self.d.submit({"temperature": 0, "max_tokens": 16, "logprobs": True, "top_logprobs": 3})
        self.assertEqual(ack["status"], 200, ack)
        for e in wire_logprobs(tokens):
            self.assertEqual(e["id"], e["top"][0]["id"])
            self.assertEqual(e["logprob"], e["top"][0]["logprob"])

    def test_a_job_without_logprobs_has_no_logprob_frames(self):
        ack, tokens, fin = self.d.submit({"temperature": 0, "max_tokens": 4})
        self.assertTrue(tokens)
        for ev in tokens:
            self.assertNotIn("lp", ev)
            self.assertNotIn("top_n", ev)

    def test_a_job_without_seed_replays_with_the_reported_seed(self):
        params = {"temperature": 1.0, "max_tokens": 30, "ignore_eos": True}
        ack, tokens, fin = self.d.submit(params)
        self.assertIn("seed", ack)
        self.assertEqual(fin["seed"], ack["seed"])
        first = [i for ev in tokens for i in ev["ids"]]
        ack2, tokens2, fin2 = self.d.submit(dict(params, seed=ack["seed"]))
        self.assertEqual(ack2["seed"], ack["seed"])
        self.assertEqual([i for ev in tokens2 for i in ev["ids"]], first)
        ref = run_json("--prompt", PROMPT, "--seed", str(ack["seed"]), "--temperature", "1", "--max-tokens", "30",
                       "--ignore-eos")[0]
        self.assertEqual(ref["tokens"], first)
        self.assertEqual(ref["seed"], ack["seed"])

    def test_logit_bias_minus_100_bans_and_plus_100_forces(self):
        ack, tokens, fin = self.d.submit({"temperature": 0, "max_tokens": 1})
        greedy = tokens[0]["ids"][0]
        for seed in range(5):
            ack, tokens, fin = self.d.submit({"temperature": 1.0, "seed": seed, "max_tokens": 8, "ignore_eos": True,
                                              "logit_bias": {str(greedy): -100}})
            self.assertNotIn(greedy, [i for ev in tokens for i in ev["ids"]])
            ack, tokens, fin = self.d.submit({"temperature": 1.0, "seed": seed, "max_tokens": 8, "ignore_eos": True,
                                              "logit_bias": {"77": 100}})
            self.assertEqual([i for ev in tokens for i in ev["ids"]], [77] * 8)

    def test_logit_bias_outside_the_vocabulary_is_refused_naming_the_id(self):
        vocab = model_header()["vocab"]
        ack, _, _ = self.d.submit({"logit_bias": {str(vocab): 1.0}})
        self.assertEqual(ack["status"], 400)
        self.assertEqual(ack["field"], "params.logit_bias.%d" % vocab)

    def test_typical_p_gives_the_same_tokens_as_run(self):
        ack, tokens, fin = self.d.submit({"seed": 9, "typical_p": 0.6, "max_tokens": 20, "temperature": 1.0})
        ref = run_json("--prompt", PROMPT, "--seed", "9", "--typical-p", "0.6", "--max-tokens", "20")[0]
        self.assertEqual([i for ev in tokens for i in ev["ids"]], ref["tokens"])

    def test_a_prompt_that_does_not_fit_is_refused_before_any_token_with_both_counts(self):
        ctx = model_header()["seq_len"]
        long_prompt = "Once upon a time " * 150
        ack, tokens, fin = self.d.submit({"max_tokens": 5}, prompt=long_prompt)
        self.assertEqual(ack["status"], 200)   # text: tokenized after the ACK
        self.assertEqual(tokens, [])
        self.assertEqual(fin["seq"], 0)
        self.assertEqual(fin["reason"], "error")
        self.assertEqual(fin["error_code"], "context_length_exceeded")
        self.assertEqual(fin["context_length"], ctx)
        self.assertGreater(fin["prompt_tokens"], ctx)
        self.assertIn("%d tokens" % fin["prompt_tokens"], fin["error"])
        ack, _, _ = self.d.submit({"max_tokens": 5}, ids=[1] + [403] * (ctx + 10))
        self.assertEqual(ack["status"], 400)
        self.assertEqual(ack["error_code"], "context_length_exceeded")
        self.assertEqual((ack["prompt_tokens"], ack["context_length"]), (ctx + 11, ctx))
        out = subprocess.run([TOKPIPE, "run", "--model", MODEL, "--tokenizer", TOKENIZER, "--prompt", long_prompt],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 1)
        self.assertIn("%d tokens, the model's context holds %d" % (fin["prompt_tokens"], ctx), out.stderr)

    def test_truncate_prompt_tokens_keeps_the_last_tokens(self):
        ctx = model_header()["seq_len"]
        ack, tokens, fin = self.d.submit({"max_tokens": 3, "temperature": 0, "truncate_prompt_tokens": 40},
                                         prompt="Once upon a time " * 150)
        self.assertEqual(fin["reason"], "length", fin)
        self.assertEqual(fin["prompt_tokens"], 40)
        ids = [1] + list(range(300, 300 + ctx))
        ack, tokens, fin = self.d.submit({"max_tokens": 3, "temperature": 0, "truncate_prompt_tokens": 40}, ids=ids)
        ack2, tokens2, fin2 = self.d.submit({"max_tokens": 3, "temperature": 0}, ids=ids[-40:])
        self.assertEqual([i for ev in tokens for i in ev["ids"]], [i for ev in tokens2 for i in ev["ids"]])

    def test_running_into_the_context_is_a_length_finish_with_detail_context(self):
        ctx = model_header()["seq_len"]
        ids = [1] + [403, 407, 261, 378] * ((ctx - 13) // 4)
        ack, tokens, fin = self.d.submit({"max_tokens": 100, "temperature": 0, "ignore_eos": True}, ids=ids)
        self.assertEqual(fin["reason"], "length")
        self.assertEqual(fin["detail"], "context")
        self.assertEqual(fin["context_length"], ctx)
        self.assertEqual(fin["prompt_tokens"] + fin["completion_tokens"], ctx)
        ack, tokens, fin = self.d.submit({"max_tokens": 3, "temperature": 0, "ignore_eos": True}, ids=ids)
        self.assertEqual((fin["reason"], fin["detail"]), ("length", "max_tokens"))
        self.assertNotIn("context_length", fin)
        ref = run_json("--prompt", PROMPT, "--max-tokens", "3", "--temperature", "0", "--ignore-eos")[0]
        self.assertEqual(ref["finish_detail"], "max_tokens")

    def test_copies_of_one_stop_string_count_once_against_the_limit(self):
        _, info, _ = self.d.call(tpdaemon.CMD_INFO, {})
        n = info["limits"]["max_stop_strings"] * 2
        ack, tokens, fin = self.d.submit({"temperature": 0, "max_tokens": 40, "stop": [" girl"] * n})
        self.assertEqual(ack["status"], 200, ack)
        self.assertEqual((fin["reason"], fin["matched"]), ("stop_string", " girl"))
        ack, _, _ = self.d.submit({"stop": ["s%d" % i for i in range(info["limits"]["max_stop_strings"] + 1)]})
        self.assertEqual(ack["status"], 413)
        self.assertIn("distinct strings", ack["error"])

    def test_info_reports_the_model_and_the_limits(self):
        hdr = model_header()
        cmd, info, _ = self.d.call(tpdaemon.CMD_INFO, {})
        self.assertEqual(cmd, tpdaemon.CMD_INFO_REPLY)
        self.assertEqual(info["vocab_size"], hdr["vocab"])
        self.assertEqual(info["context_length"], hdr["seq_len"])
        self.assertIn(info["eos_id"], info["eog_ids"])
        self.assertEqual(info["limits"]["max_top_logprobs"], 20)
        self.assertEqual(info["weight_type"], "f32")
        out = subprocess.run([TOKPIPE, "info", "--json", "--config", self.d.config], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        j = json.loads(out.stdout)
        self.assertEqual((j["vocab_size"], j["context_length"]), (hdr["vocab"], hdr["seq_len"]))
        human = subprocess.run([TOKPIPE, "info", "--config", self.d.config], capture_output=True, text=True,
                               timeout=30).stdout
        self.assertIn("context_length: %d" % hdr["seq_len"], human)
        self.assertIn("limits.max_logit_bias: 1024", human)


class SeparateStages(GenerationApi, unittest.TestCase):
    EXTRA = ""


class FusedForwardSample(GenerationApi, unittest.TestCase):
    EXTRA = "workers:\n  fuse: [\"forward,sample\"]\n"


class InfoOfAGgufModelWithAChatTemplate(unittest.TestCase):
    """A tiny random-weight GGUF carrying phi-3's vocabulary and chat
    template (tokpipe mkmodel --vocab-from): INFO says what the file says."""

    def test_info_reports_the_chat_template_end_ids_and_special_tokens_of_the_file(self):
        if not os.access(TOKPIPED, os.X_OK):
            raise unittest.SkipTest("tokpiped is not built")
        vocab = os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-phi-3.gguf")
        tmp = tempfile.mkdtemp(prefix="tp-genapi-phi-")
        model = os.path.join(tmp, "phi.gguf")
        try:
            subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--arch", "llama", "--vocab-from", vocab,
                            "--shape", "64x2", "--seq-len", "64", "--seed", "1", "--out", model],
                           check=True, capture_output=True, timeout=120)
            d = Daemon(model=model, tokenizer="")
            try:
                out = subprocess.run([TOKPIPE, "info", "--json", "--config", d.config], capture_output=True,
                                     text=True, timeout=30)
                self.assertEqual(out.returncode, 0, out.stderr)
                info = json.loads(out.stdout)
            finally:
                d.stop()
            self.assertTrue(info["chat_template"])
            self.assertEqual(info["vocab_size"], 32064)
            self.assertEqual(info["context_length"], 64)
            self.assertEqual(info["weight_type"], "f32")
            self.assertIn(info["eos_id"], info["eog_ids"])
            pieces = {t["piece"]: t["id"] for t in info["special_tokens"]}
            self.assertIn("<|end|>", pieces)
            self.assertEqual(info["eos_id"], pieces["<|endoftext|>"])   # the file's EOS, not a guessed 2
            self.assertIn(pieces["<|end|>"], info["eog_ids"], "phi-3's end-of-turn ends generation")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class HelpTexts(unittest.TestCase):
    def test_run_and_generate_help_list_every_json_field_and_the_new_flags(self):
        fields = ["prompt", "text", "tokens", "finish_reason", "finish_detail", "matched", "prompt_tokens",
                  "cached_tokens", "completion_tokens", "seed", "logprobs"]
        ref = run_json("--prompt", PROMPT, "--max-tokens", "2", "--logprobs")[0]
        self.assertEqual(sorted(ref), sorted(fields))
        for cmd in ("run", "generate"):
            text = subprocess.run([TOKPIPE, cmd, "--help"], capture_output=True, text=True).stdout
            for f in fields:
                self.assertIn(f, text, "%s --help lacks the --json field %s" % (cmd, f))
            for flag in ("--logprobs", "--top-logprobs", "--logprobs-mode", "--logit-bias", "--typical-p",
                         "--truncate-prompt-tokens"):
                self.assertIn(flag, text, "%s --help lacks %s" % (cmd, flag))


class GeneratePartialRefusal(unittest.TestCase):
    """max_concurrent_jobs 1: of two prompts submitted at once the second is
    refused with 429; --help says the others still run and are printed."""

    def test_generate_prints_the_accepted_job_and_names_the_refused_one(self):
        if not os.access(TOKPIPED, os.X_OK):
            raise unittest.SkipTest("tokpiped is not built")
        help_text = subprocess.run([TOKPIPE, "generate", "--help"], capture_output=True, text=True).stdout
        self.assertIn("the other\nprompts still run to the end and are printed", help_text)
        d = Daemon("limits:\n  max_concurrent_jobs: 1\n")
        try:
            out = subprocess.run([TOKPIPE, "generate", "--config", d.config, "--json", "--temperature", "0",
                                  "--max-tokens", "40", "--ignore-eos", "--prompt", PROMPT, "--prompt", "The dog"],
                                 capture_output=True, text=True, timeout=60)
            lines = [json.loads(l) for l in out.stdout.splitlines()]
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertEqual(len(lines), 2, out.stdout)
            ref = run_json("--prompt", PROMPT, "--temperature", "0", "--max-tokens", "40", "--ignore-eos")[0]
            self.assertEqual(lines[0]["tokens"], ref["tokens"])
            self.assertEqual(lines[0]["finish_reason"], "length")
            self.assertEqual(lines[1]["status"], 429)
            self.assertIn("prompt 2 rejected (429)", out.stderr)
            # nothing was left running: the broker's job table is empty
            deadline = time.time() + 10
            while time.time() < deadline:
                _, st, _ = d.call(tpdaemon.CMD_STATS, {})
                if st.get("jobs_active", 0) == 0:
                    break
                time.sleep(0.05)
            self.assertEqual(st.get("jobs_active", 0), 0)
            # the ACK 429 itself: no request field is at fault, so it names none (PROTOCOL.md:
            # `field` is the offending field's path, optional)
            _, a1, _ = d.call(tpdaemon.CMD_SUBMIT, {"job_id": "busy-1", "prompt": PROMPT,
                                                   "params": {"max_tokens": 2000, "ignore_eos": True}})
            self.assertEqual(a1["status"], 200, a1)
            _, a2, _ = d.call(tpdaemon.CMD_SUBMIT, {"job_id": "busy-2", "prompt": PROMPT})
            d.call(0x03, {"job_id": "busy-1"})   # CANCEL
            self.assertEqual(a2["status"], 429, a2)
            self.assertNotIn("field", a2)
        finally:
            d.stop()


if __name__ == "__main__":
    unittest.main()
