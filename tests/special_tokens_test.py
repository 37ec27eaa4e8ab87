"""Special tokens through the real daemon (stories260K + tok512, whose
control tokens are <unk>, BOS "\\n<s>\\n" and EOS "\\n</s>\\n"):

* SUBMIT's parse_special turns control-token texts in the prompt into those
  tokens, and only then: the daemon's prompt token counts equal what
  `tokpipe tokenize --bos [--special]` gives for the same text;
* a stop string naming a control token ("<s>") ends the job on that token,
  and the subscriber sees exactly what `tokpipe stopcheck` says for the same
  candidates (the rule is shared; before, stopcheck fired and the engine
  did not).
"""
import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

TOK = os.path.join(MODELS, "tok512.bin")
# A prompt after which this model starts a new story (BOS) within a few
# dozen tokens for some seeds.
STORY_END = "And they lived happily ever after. The end."


def tokenize(text, *flags):
    return tpdaemon.tokenize(TOK, text, "--bos", *flags)


class SpecialTokensEndToEnd(tpdaemon.DaemonCase):
    CONFIG = "limits:\n  finished_ttl_ms: 60000\n"
    PREFIX = "tp-special-"

    def run_job(self, job, params, prompt, **extra):
        self.sub.subscribe(job)
        time.sleep(0.2)  # let the subscription reach the broker's XPUB
        hdr = dict({"job_id": job, "prompt": prompt, "params": params}, **extra)
        cmd, ack, _ = self.prod.call(0x01, hdr)
        self.assertEqual((cmd, ack["status"]), (0x02, 200), ack)
        tokens, fin = self.sub.collect(job)
        ids = [i for t in tokens for i in t["ids"]]
        text = "".join(t["text"] for t in tokens) + fin["text"]
        return ids, text, fin

    def test_parse_special_makes_control_texts_tokens_only_when_asked(self):
        prompt = "Lily was happy.\n<s>\nOnce upon a time"
        plain, special = tokenize(prompt), tokenize(prompt, "--special")
        self.assertIn(1, special[1:], "the BOS text became the BOS token")
        self.assertNotIn(1, plain[1:], "without --special it stays text")
        params = {"max_tokens": 1, "temperature": 0}
        _, _, off = self.run_job("sp-off", params, prompt)
        _, _, on = self.run_job("sp-on", params, prompt, parse_special=True)
        self.assertEqual(off["prompt_tokens"], len(plain))
        self.assertEqual(on["prompt_tokens"], len(special))

    def test_run_and_generate_pass_parse_special(self):
        prompt = "Lily was happy.\n<s>\nOnce upon a time"
        want = {False: len(tokenize(prompt)), True: len(tokenize(prompt, "--special"))}
        model = os.path.join(MODELS, "stories260K.bin")
        for special in (False, True):
            flag = ["--parse-special"] if special else []
            common = ["--prompt", prompt, "--max-tokens", "1", "--temperature", "0", "--json"] + flag
            run = subprocess.run([TOKPIPE, "run", "--model", model, "--tokenizer", TOK] + common,
                                 capture_output=True, timeout=60)
            self.assertEqual(run.returncode, 0, run.stderr.decode())
            self.assertEqual(json.loads(run.stdout)["prompt_tokens"], want[special], "run %s" % flag)
            gen = subprocess.run([TOKPIPE, "generate", "--front", self.daemon.front, "--events",
                                  self.daemon.events] + common, capture_output=True, timeout=60)
            self.assertEqual(gen.returncode, 0, gen.stderr.decode())
            self.assertEqual(json.loads(gen.stdout)["prompt_tokens"], want[special], "generate %s" % flag)

    def test_stop_string_naming_a_control_token_ends_the_job_as_stopcheck_says(self):
        base = {"temperature": 1.0, "max_tokens": 60, "ignore_eos": True}
        for seed in range(1, 13):
            u_ids, _, u_fin = self.run_job("u%d" % seed, dict(base, seed=seed), STORY_END)
            if 1 in u_ids or 2 in u_ids:
                break
        else:
            self.fail("no seed in 1..12 made the model sample BOS or EOS within 60 tokens")
        params = dict(base, seed=seed, stop=["<s>", "</s>"])
        ids, text, fin = self.run_job("c%d" % seed, params, STORY_END)
        self.assertEqual(fin["reason"], "stop_token")
        self.assertIn(fin["matched"], (1, 2))
        case = {"tokens": u_ids, "prompt_last_id": tokenize(STORY_END)[-1], "stop": ["<s>", "</s>"],
                "eos_token_id": [1, 2], "ignore_eos": True, "max_tokens": 60}
        p = subprocess.run([TOKPIPE, "stopcheck", "--tokenizer", TOK], input=json.dumps(case).encode(),
                           capture_output=True, timeout=30)
        want = json.loads(p.stdout)
        self.assertNotIn("error", want)
        self.assertEqual((fin["reason"], fin["matched"]), (want["finish_reason"], want["matched"]))
        self.assertEqual(text, want["text"])
        self.assertEqual(fin["completion_tokens"], want["completion_tokens"])
        self.assertEqual(ids, u_ids[:len(ids)])


if __name__ == "__main__":
    unittest.main()
