"""Chat jobs end to end: a conversation sent as SUBMIT messages (tokpipe
generate --message) is rendered with the chat template by the tokenize
worker, and the job ends on the template's end-of-turn token without its
text. tokpipe run --message (in process) gives the same job.

The model is a random-weight GGUF with the Phi-3 vocabulary whose weights
the test then sets so that greedy decoding is known: every layer adds
nothing (attn_output and ffn_down are zero), every token embeds to e0 except
"▁Hello" (e1), and the output matrix maps e0 to "▁Hello" and e1 to a chosen
end token X. So after any prompt the model says " Hello" and then X, and
after X it would say " Hello" again: a job that did not stop on X would run
to max_tokens with " Hello Hello ...". X is <|end|> (in the vocabulary's
end-of-generation set: the job ends as eos) or <|placeholder1|> with a
template that ends turns with it (not in that set: the end-of-turn rule
must add it as a stop id, the job ends as stop_token)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import gguf_tiny  # noqa: E402
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

PHI3_VOCAB = os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-phi-3.gguf")
PHI35_TEMPLATE = os.path.join(MODELS, "chat-templates", "microsoft-Phi-3.5-mini-instruct.jinja")
END, PLACEHOLDER1 = 32007, 32002   # <|end|>, <|placeholder1|> in the Phi-3 vocabulary
MAX_TOKENS = 6


def forced_model(path, end_id):
    subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--arch", "llama", "--vocab-from", PHI3_VOCAB,
                    "--shape", "64x2x4", "--seed", "11", "--separate-output", "--out", path],
                   check=True, capture_output=True, timeout=120)
    meta, tensors, _, _, _ = gguf_tiny.read_gguf(path)
    hello = meta["tokenizer.ggml.tokens"].index("\u2581Hello")
    with open(path, "r+b") as f:
        def put(name, array):
            gguf_tiny.write_tensor(f, tensors, name, array)
        dim, vocab = tensors["token_embd.weight"][1]
        emb = np.zeros((vocab, dim))
        emb[:, 0] = 1.0
        emb[hello] = 0.0
        emb[hello, 1] = 1.0
        put("token_embd.weight", emb)
        out = np.zeros((vocab, dim))
        out[hello, 0] = 10.0
        out[end_id, 1] = 10.0
        put("output.weight", out)
        for name, (_, ne, _, _) in tensors.items():
            if name.endswith("attn_output.weight") or name.endswith("ffn_down.weight"):
                put(name, np.zeros(ne[::-1]))
    return hello


class Daemon(tpdaemon.Daemon):
    def __init__(self, model, template):
        super().__init__("shutdown:\n  drain_timeout_ms: 60000\n", model=model, tokenizer="", chat_template=template,
                         prefix="tp-chat-", stop_timeout_s=90, ready=True)

    def generate(self, *args):
        p = subprocess.run([TOKPIPE, "generate", "--config", self.config, "--json", "--temperature", "0",
                            "--max-tokens", str(MAX_TOKENS), *args], capture_output=True, timeout=120)
        return p.returncode, p.stdout.decode(), p.stderr.decode()


def run_inprocess(model, template, *args):
    p = subprocess.run([TOKPIPE, "run", "--model", model, "--chat-template", template, "--json", "--seed", "1",
                        "--temperature", "0", "--max-tokens", str(MAX_TOKENS), *args],
                       capture_output=True, timeout=120)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


CONVERSATION = ["--message", "system=You are brief.", "--message", "user=Say hello",
                "--message", "assistant=Hello", "--message", "user=Again"]


class ChatJobsEndOnTheTemplatesEndOfTurnToken(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tp-chat-models-")
        cls.end_model = os.path.join(cls.dir, "phi3-end.gguf")
        cls.ph_model = os.path.join(cls.dir, "phi3-placeholder.gguf")
        cls.hello = forced_model(cls.end_model, END)
        forced_model(cls.ph_model, PLACEHOLDER1)
        cls.ph_template = os.path.join(cls.dir, "placeholder.jinja")
        with open(PHI35_TEMPLATE, encoding="utf-8") as f, open(cls.ph_template, "w", encoding="utf-8") as g:
            g.write(f.read().replace("<|end|>", "<|placeholder1|>"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def check_job(self, rc, out, err, reason, matched):
        self.assertEqual(rc, 0, err)
        j = json.loads(out)
        self.assertEqual(j["finish_reason"], reason, out)
        self.assertEqual(j["matched"], matched, out)
        self.assertEqual(j["tokens"], [self.hello], out)
        self.assertEqual(j["text"], " Hello")
        self.assertNotIn("<|", j["text"])
        self.assertEqual(j["completion_tokens"], 1)
        return j

    def rendered(self, template):
        conv = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hello"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}]
        p = subprocess.run([TOKPIPE, "chat-template", "--template", template, "--bos-token", "<s>",
                            "--eos-token", "<|endoftext|>"],
                           input=json.dumps(conv).encode(), capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout.decode()

    def test_end_token_in_the_end_of_generation_set_ends_the_job_as_eos(self):
        d = Daemon(self.end_model, PHI35_TEMPLATE)
        try:
            got = self.check_job(*d.generate(*CONVERSATION), "eos", END)
        finally:
            d.stop()
        ref = self.check_job(*run_inprocess(self.end_model, PHI35_TEMPLATE, *CONVERSATION), "eos", END)
        self.assertEqual(got["prompt_tokens"], ref["prompt_tokens"])
        # the rendered prompt was tokenized with its control tokens whole:
        # <|system|> ... <|end|> ... <|assistant|>: 4 turns + generation prompt
        text = self.rendered(PHI35_TEMPLATE)
        self.assertTrue(text.endswith("<|assistant|>\n"))
        self.assertLess(got["prompt_tokens"], len(text) // 2, "control tokens were not parsed whole")

    def test_end_token_outside_that_set_becomes_a_stop_id_and_ends_the_job_as_stop_token(self):
        d = Daemon(self.ph_model, self.ph_template)
        try:
            got = self.check_job(*d.generate(*CONVERSATION), "stop_token", PLACEHOLDER1)
            # with a logit_bias (kept in the same block the end-of-turn ids are added to)
            biased = self.check_job(*d.generate(*CONVERSATION, "--logit-bias", "100=-100", "--logit-bias", "7=-50"),
                                    "stop_token", PLACEHOLDER1)
            self.assertEqual(biased["tokens"], got["tokens"])
            # the same model on a plain prompt has no end-of-turn rule: it runs to length
            rc, out, err = d.generate("--prompt", "Say hello")
            self.assertEqual(rc, 0, err)
            plain = json.loads(out)
            self.assertEqual(plain["finish_reason"], "length", out)
            self.assertIn(PLACEHOLDER1, plain["tokens"], out)
        finally:
            d.stop()
        ref = self.check_job(*run_inprocess(self.ph_model, self.ph_template, *CONVERSATION), "stop_token",
                             PLACEHOLDER1)
        self.assertEqual(got["prompt_tokens"], ref["prompt_tokens"])

    def test_a_template_that_raises_fails_the_job_with_its_message(self):
        d = Daemon(self.end_model, os.path.join(MODELS, "chat-templates", "google-gemma-2-2b-it.jinja"))
        try:
            rc, out, err = d.generate("--message", "system=not supported by gemma", "--message", "user=Hi")
            self.assertEqual(rc, 1, out)
            # PROTOCOL.md: the FINISH error starts with "messages: " (generate prints "failed: ERROR")
            self.assertIn("failed: messages: ", err)
            self.assertIn("System role not supported", err)
        finally:
            d.stop()

    def test_a_daemon_whose_model_has_no_template_fails_messages_jobs_saying_what_to_set(self):
        d = Daemon(os.path.join(MODELS, "stories260K.gguf"), "")
        try:
            rc, out, err = d.generate("--message", "user=Hi")
            self.assertEqual(rc, 1, out)
            self.assertIn("failed: messages: no usable chat template", err)
            self.assertIn("model.chat_template", err)
            rc, out, err = d.generate("--prompt", "Once upon a time")   # prompts still work
            self.assertEqual(rc, 0, err)
        finally:
            d.stop()

    def test_messages_file_equals_message_flags_and_bad_files_name_the_field(self):
        conv = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hello"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}]
        path = os.path.join(self.dir, "conv.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"messages": conv}, f)
        flags = run_inprocess(self.end_model, PHI35_TEMPLATE, *CONVERSATION)
        from_file = run_inprocess(self.end_model, PHI35_TEMPLATE, "--messages", path)
        self.assertEqual(from_file[0], 0, from_file[2])
        self.assertEqual(json.loads(from_file[1]), json.loads(flags[1]))
        with open(path, "w", encoding="utf-8") as f:
            json.dump([{"role": "user", "content": "Hi", "weight": "bob"}], f)
        rc, out, err = run_inprocess(self.end_model, PHI35_TEMPLATE, "--messages", path)
        self.assertEqual(rc, 2, out)
        self.assertIn("messages[0].weight: unknown key", err)
        rc, out, err = run_inprocess(self.end_model, PHI35_TEMPLATE, "--message", "no-equals-sign")
        self.assertEqual(rc, 2, out)
        self.assertIn("ROLE=TEXT", err)
        rc, out, err = run_inprocess(self.end_model, PHI35_TEMPLATE, "--message", "user=a", "--prompt", "b")
        self.assertEqual(rc, 2, out)
        self.assertIn("not both", err)

    def test_a_model_without_a_template_refuses_messages_clearly(self):
        p = subprocess.run([TOKPIPE, "run", "--model", os.path.join(MODELS, "stories260K.bin"), "--tokenizer",
                            os.path.join(MODELS, "tok512.bin"), "--message", "user=Hi"], capture_output=True,
                           timeout=60, text=True)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("--message/--messages", p.stderr)
        self.assertIn("--chat-template", p.stderr)


if __name__ == "__main__":
    unittest.main()
