"""Speculative decoding in `tokpipe run`: with --speculative ngram, and with
--speculative draft (stories260K as its own draft model: most guesses
taken; a random model with its vocabulary: almost none), every job's
tokens, text, logprobs, finish reason and streamed output are the same
bytes as without it, over many seeds, prompts and sampling settings (greedy,
temperature with top-k/p, penalties, logit_bias, min_tokens, stops, a JSON
schema, logprobs), in batches where some jobs verify guesses and others
decode plainly; and guesses were really verified and accepted (draft_tokens,
draft_accepted), so the equality is not that of two plain runs."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

MODEL = os.path.join(MODELS, "stories260K.bin")
TOK = os.path.join(MODELS, "tok512.bin")
PROMPTS = ["Once upon a time", "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
           "Lily and Tom went to the park", "One day, one day, one day", "The big red ball",
           "Tim had a dog named Spot. Spot was a good dog. Tim had a dog named"]
REPEAT = "the boy ran to the tree and the boy ran to the tree and the boy ran to the"


NGRAM = ["--speculative", "ngram"]


def run(args, spec, mode=NGRAM):
    extra = [*mode, "--draft-max", str(spec)] if spec else []
    p = subprocess.run([TOKPIPE, "run", "--model", MODEL, "--tokenizer", TOK, *args, *extra],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"tokpipe run {' '.join(args + extra)} failed ({p.returncode}): {p.stderr}")
    return p.stdout


def run_json(args, spec, mode=NGRAM):
    return [json.loads(line) for line in run([*args, "--json"], spec, mode).splitlines() if line.strip()]


def random_draft_model(tmp):
    """A random llama of stories260K's vocabulary (512), 1/8 of its width:
    a draft model whose guesses are almost never taken."""
    path = os.path.join(tmp, "draft-random.gguf")
    subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--vocab-from", os.path.join(MODELS, "stories260K.gguf"),
                    "--shape", "32x2", "--seed", "7", "--out", path], check=True, capture_output=True, timeout=120)
    return path


@unittest.skipUnless(os.path.exists(TOKPIPE), "bin/tokpipe not built")
class SpeculationChangesNothing(unittest.TestCase):
    MODE = NGRAM
    TAKES = True   # its guesses are often right: some must have been taken

    def setUp(self):
        self.drafted = self.accepted = 0

    def same(self, args, prompts=PROMPTS, spec=8):
        """Spec on (draft-max spec) and off give the same JSON but for the
        draft counts; returns the speculating run's results."""
        pa = [a for p in prompts for a in ("--prompt", p)]
        if "--seed" not in args:
            args = [*args, "--seed", "1"]  # a random one is reported, and differs run to run
        off = run_json([*pa, *args], 0)
        on = run_json([*pa, *args], spec, self.MODE)
        self.assertEqual(len(on), len(off))
        for a, b in zip(on, off):
            self.assertNotIn("draft_tokens", b, "a run without --speculative reports draft counts")
            d, acc = a["draft_tokens"], a["draft_accepted"]
            self.assertLessEqual(acc, d)
            self.drafted += d
            self.accepted += acc
            a = {k: v for k, v in a.items() if k not in ("draft_tokens", "draft_accepted")}
            self.assertEqual(a, b, f"speculation changed the result of prompt {b.get('prompt')!r} ({args})")
        return on

    def tearDown(self):
        # every case speculated and had guesses taken: the equality is earned
        if (self.drafted or self.accepted) and self.TAKES:
            self.assertGreater(self.accepted, 0, "no guess was ever accepted")

    def test_greedy_over_prompts_and_draft_sizes(self):
        for spec in (1, 3, 8, 16):
            self.same(["--temperature", "0", "--max-tokens", "120"], spec=spec)
        self.assertGreater(self.drafted, 0)
        if self.TAKES:
            self.assertGreater(self.accepted, 0)

    def test_sampling_with_top_k_p_over_seeds(self):
        for seed in range(12):
            self.same(["--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--seed", str(seed),
                       "--max-tokens", "80"])
        if self.TAKES:
            self.assertGreater(self.accepted, 0)

    def test_hot_sampling_min_p_and_typical(self):
        for seed in range(6):
            self.same(["--temperature", "1.3", "--min-p", "0.05", "--seed", str(seed), "--max-tokens", "60"])
            self.same(["--temperature", "0.9", "--typical-p", "0.8", "--seed", str(seed), "--max-tokens", "60"])

    def test_penalties_and_logit_bias(self):
        for seed in range(6):
            self.same(["--temperature", "0.7", "--seed", str(seed), "--repetition-penalty", "1.2",
                       "--presence-penalty", "0.5", "--frequency-penalty", "0.3", "--penalty-window", "16",
                       "--max-tokens", "80"])
            self.same(["--temperature", "0", "--logit-bias", "262=5", "--logit-bias", "400=-100",
                       "--logit-bias", "11=2.5", "--seed", str(seed), "--max-tokens", "60"])

    def test_min_tokens_eos_and_length(self):
        for seed in range(6):
            self.same(["--temperature", "0.8", "--seed", str(seed), "--min-tokens", "30", "--max-tokens", "200"])
            self.same(["--temperature", "0", "--ignore-eos", "--seed", str(seed), "--max-tokens", str(7 + seed)])

    def test_stops_inside_accepted_runs(self):
        """Stop strings drawn from the plain run's own text at many places:
        a stop that ends inside a run of accepted guesses ends the job there."""
        [plain] = run_json(["--prompt", REPEAT, "--temperature", "0", "--max-tokens", "150"], 0)
        text = plain["text"]
        stopped = 0
        for cut in range(6, min(len(text), 150), 9):
            stop = text[cut - 4:cut]
            if not stop.strip():
                continue
            for inc in ([], ["--include-stop"]):
                [r] = self.same(["--temperature", "0", "--max-tokens", "150", "--stop", stop, *inc], [REPEAT])
                stopped += r["finish_reason"] == "stop_string"
        self.assertGreater(stopped, 5)
        for seed in range(4):
            self.same(["--temperature", "0.7", "--seed", str(seed), "--stop", "the", "--stop", ".",
                       "--stop-id", "13", "--min-tokens", "3", "--max-tokens", "100"])

    def test_logprobs_and_top_logprobs(self):
        for seed in range(4):
            self.same(["--temperature", "0.8", "--seed", str(seed), "--logprobs", "--top-logprobs", "5",
                       "--max-tokens", "60"])
            self.same(["--temperature", "0.8", "--seed", str(seed), "--top-logprobs", "3", "--logprobs-mode",
                       "processed", "--repetition-penalty", "1.1", "--max-tokens", "60"])

    def test_json_schema_grammar(self):
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                    "ages": {"type": "array", "items": {"type": "integer"}}},
                  "required": ["name", "ages"]}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(schema, f)
        try:
            for seed in range(5):
                self.same(["--json-schema", f.name, "--temperature", "0.9", "--seed", str(seed),
                           "--max-tokens", "80"], PROMPTS[:3])
            self.same(["--json-schema", f.name, "--temperature", "0", "--max-tokens", "80"], PROMPTS[:3])
        finally:
            os.unlink(f.name)

    def test_repetitive_prompt_accepts_most_guesses(self):
        [r] = self.same(["--temperature", "0", "--max-tokens", "100", "--ignore-eos"], [REPEAT])
        if self.TAKES:
            self.assertGreater(r["draft_accepted"], 10, f"the guesser took few guesses: {r}")

    def test_streamed_text_is_the_same(self):
        for seed in range(4):
            args = ["--prompt", PROMPTS[seed], "--temperature", "0.6", "--seed", str(seed), "--max-tokens", "90",
                    "--stop", "dog"]
            self.assertEqual(run(args, 8, self.MODE), run(args, 0))

    def test_draft_without_a_model_names_it(self):
        p = subprocess.run([TOKPIPE, "run", "--model", MODEL, "--tokenizer", TOK, "--prompt", "x",
                            "--speculative", "draft"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("draft model", p.stderr)
        p = subprocess.run([TOKPIPE, "run", "--model", MODEL, "--tokenizer", TOK, "--prompt", "x",
                            "--draft-max", "17"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--draft-max", p.stderr)


class DraftModelChangesNothing(SpeculationChangesNothing):
    """The same cases with a draft model: stories260K drafting for itself
    (greedy guesses a greedy job takes all of)."""
    MODE = ["--speculative", "draft", "--draft-model", MODEL]

    def test_greedy_self_draft_takes_every_guess(self):
        [r] = self.same(["--temperature", "0", "--max-tokens", "100", "--ignore-eos"], [PROMPTS[0]])
        self.assertEqual(r["draft_accepted"], r["draft_tokens"], f"a model drafting for itself missed: {r}")
        self.assertGreater(r["draft_tokens"], 50)


class RandomDraftModelChangesNothing(SpeculationChangesNothing):
    """... and a random model of the same vocabulary: its guesses are
    wrong, the controller backs off, the output stays the same."""
    TAKES = False

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.MODE = ["--speculative", "draft", "--draft-model", random_draft_model(cls.tmp.name)]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()


@unittest.skipUnless(os.path.exists(TOKPIPE), "bin/tokpipe not built")
class DraftModelRefusals(unittest.TestCase):
    def test_draft_model_of_another_vocabulary_is_refused_naming_both_sizes(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "v600.bin")
            subprocess.run([TOKPIPE, "mkmodel", "--shape", "32x2", "--vocab", "600", "--seed", "3", "--out", path],
                           check=True, capture_output=True, timeout=120)
            p = subprocess.run([TOKPIPE, "run", "--model", MODEL, "--tokenizer", TOK, "--prompt", "x",
                                "--speculative", "draft", "--draft-model", path], capture_output=True, text=True,
                               timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("600", p.stderr)
        self.assertIn("512", p.stderr)
        self.assertIn("vocabulary", p.stderr)


@unittest.skipUnless(os.path.exists(TOKPIPE), "bin/tokpipe not built")
class HybridModelsDoNotGuess(unittest.TestCase):
    """A hybrid model (qwen35: Gated DeltaNet layers, whose recurrent state
    cannot roll back past a step's start) never verifies guesses: with
    --speculative ngram its output is the same bytes and it drafts 0."""

    def test_qwen35_with_speculative_ngram_drafts_nothing(self):
        spm = os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-llama-spm.gguf")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "qwen35.gguf")
            subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--vocab-from", spm, "--seed", "7", "--out",
                            path, "--arch", "qwen35", "--shape", "64x8x4x2", "--head-dim", "32"],
                           check=True, capture_output=True, timeout=120)
            args = [TOKPIPE, "run", "--model", path, "--prompt", REPEAT, "--prompt", PROMPTS[1],
                    "--temperature", "0", "--max-tokens", "40", "--ignore-eos", "--seed", "1"]
            for extra in ([], ["--json"]):
                off = subprocess.run([*args, *extra], capture_output=True, timeout=120)
                on = subprocess.run([*args, *extra, "--speculative", "ngram"], capture_output=True, timeout=120)
                self.assertEqual(off.returncode, 0, off.stderr)
                self.assertEqual(on.returncode, 0, on.stderr)
                if not extra:
                    self.assertEqual(on.stdout, off.stdout)
                    continue
                offj = [json.loads(line) for line in off.stdout.splitlines() if line.strip()]
                onj = [json.loads(line) for line in on.stdout.splitlines() if line.strip()]
                self.assertEqual(len(onj), 2)
                for a, b in zip(onj, offj):
                    self.assertEqual((a["draft_tokens"], a["draft_accepted"]), (0, 0))
                    self.assertEqual({k: v for k, v in a.items() if k not in ("draft_tokens", "draft_accepted")}, b)


if __name__ == "__main__":
    unittest.main()
