"""`tokpipe run`: in-process generation checked against llama2.c's published
reference output for stories260K, across both model formats, and for batch
invariance. The reference (text and ids) is read from ../shared/models/README.md,
which records what karpathy/llama2.c run.c printed for the same model."""
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

BIN_MODEL = os.path.join(MODELS, "stories260K.bin")
GGUF_MODEL = os.path.join(MODELS, "stories260K.gguf")
TOK = os.path.join(MODELS, "tok512.bin")


def reference():
    """(text after the prompt, generated ids) from the models README."""
    with open(os.path.join(MODELS, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Reference output (stories260K, greedy)", 1)[1]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    text, ids = blocks[0], [int(x) for x in blocks[1].split()]
    assert text.startswith("Once upon a time")
    return text[len("Once upon a time"):].rstrip("\n"), ids


def run(*args, check=True):
    p = subprocess.run([TOKPIPE, "run", *args], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"tokpipe run {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def run_json(*args):
    out = run(*args, "--json").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


PROMPTS = ["Once upon a time", "The cat", "Lily and Tom went to the park", "One day",
           "The big red ball", "She was sad because", "Tim had a dog named", "In the sky"]


@unittest.skipUnless(os.path.exists(TOKPIPE), "bin/tokpipe not built")
class RunMatchesLlama2c(unittest.TestCase):
    def test_greedy_text_equals_llama2c_reference(self):
        text, ids = reference()
        p = run("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "Once upon a time",
                "--temperature", "0", "--max-tokens", str(len(ids)))
        self.assertEqual(p.stdout.rstrip("\n"), text, "streamed text differs from llama2.c run.c")

    def test_greedy_ids_and_json_fields(self):
        _, ids = reference()
        [r] = run_json("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "Once upon a time",
                       "--temperature", "0", "--max-tokens", str(len(ids)))
        self.assertEqual(r["tokens"], ids)
        self.assertEqual(r["prompt"], "Once upon a time")
        self.assertEqual(r["finish_reason"], "length")
        self.assertEqual(r["prompt_tokens"], 5)
        self.assertEqual(r["completion_tokens"], len(ids))

    def test_gguf_gives_the_same_tokens_with_its_embedded_tokenizer(self):
        _, ids = reference()
        [r] = run_json("--model", GGUF_MODEL, "--prompt", "Once upon a time",
                       "--temperature", "0", "--max-tokens", str(len(ids)))
        self.assertEqual(r["tokens"], ids)

    def test_openblas_kernel_gives_the_reference_ids_too(self):
        _, ids = reference()
        [r] = run_json("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "Once upon a time",
                       "--temperature", "0", "--max-tokens", str(len(ids)), "--kernel", "openblas")
        self.assertEqual(r["tokens"], ids)


@unittest.skipUnless(os.path.exists(TOKPIPE), "bin/tokpipe not built")
class RunThreadsAndKvType(unittest.TestCase):
    def test_any_thread_count_gives_the_reference_ids(self):
        _, ids = reference()
        for threads in ["1", "3", "0"]:
            [r] = run_json("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "Once upon a time",
                           "--temperature", "0", "--max-tokens", str(len(ids)), "--threads", threads)
            self.assertEqual(r["tokens"], ids, f"--threads {threads}")

    def test_kv_f16_gives_the_f32_greedy_text(self):
        text, ids = reference()
        p = run("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "Once upon a time",
                "--temperature", "0", "--max-tokens", str(len(ids)), "--kv-type", "f16")
        self.assertEqual(p.stdout.rstrip("\n"), text)

    def test_kv_f16_batch_of_8_equals_each_alone_on_2_threads(self):
        args = ["--model", BIN_MODEL, "--tokenizer", TOK, "--max-tokens", "60", "--kv-type", "f16",
                "--temperature", "0.9", "--seed", "7"]
        together = run_json(*args, "--threads", "2", *sum((["--prompt", p] for p in PROMPTS), []))
        for p, r in zip(PROMPTS, together):
            [alone] = run_json(*args, "--threads", "1", "--prompt", p)
            self.assertEqual(r["tokens"], alone["tokens"], f"batched != alone for {p!r}")


@unittest.skipUnless(os.path.exists(TOKPIPE), "bin/tokpipe not built")
class RunIsBatchInvariant(unittest.TestCase):
    def check(self, *sampling):
        args = ["--model", BIN_MODEL, "--tokenizer", TOK, "--max-tokens", "60", *sampling]
        together = run_json(*args, *sum((["--prompt", p] for p in PROMPTS), []))
        self.assertEqual([r["prompt"] for r in together], PROMPTS, "results not in prompt order")
        for p, r in zip(PROMPTS, together):
            [alone] = run_json(*args, "--prompt", p)
            self.assertEqual(r["tokens"], alone["tokens"], f"batched != alone for {p!r}")
            self.assertEqual(r["text"], alone["text"])

    def test_greedy_batch_of_8_equals_each_alone(self):
        self.check("--temperature", "0")

    def test_seeded_sampling_batch_of_8_equals_each_alone(self):
        self.check("--temperature", "0.9", "--top-p", "0.9", "--seed", "42")


@unittest.skipUnless(os.path.exists(TOKPIPE), "bin/tokpipe not built")
class RunStopsAndErrors(unittest.TestCase):
    def test_stop_string_cuts_text_before_the_stop(self):
        text, _ = reference()
        [r] = run_json("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "Once upon a time",
                       "--temperature", "0", "--max-tokens", "200", "--stop", "Lily")
        self.assertEqual(r["finish_reason"], "stop_string")
        self.assertEqual(r["text"], text[:text.index("Lily")])

    def test_bad_parameters_are_rejected_naming_the_field(self):
        for flag, value, field in [("--temperature", "-1", "temperature"),
                                   ("--top-p", "1.5", "top_p"),
                                   ("--top-k", "-2", "top_k"),
                                   ("--max-tokens", "0", "max_tokens")]:
            p = run("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "x", flag, value,
                    check=False)
            self.assertNotEqual(p.returncode, 0, f"{flag} {value} accepted")
            self.assertIn(field, p.stderr, f"error for {flag} {value} does not name {field}")

    def test_unknown_kernel_is_rejected_naming_it(self):
        p = run("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "x", "--kernel", "blas",
                check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("'blas'", p.stderr)

    def test_bad_threads_and_kv_type_are_rejected_naming_the_flag(self):
        for flag, value in [("--threads", "-1"), ("--threads", "257"), ("--threads", "two"),
                            ("--kv-type", "bf16")]:
            p = run("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "x", flag, value,
                    check=False)
            self.assertNotEqual(p.returncode, 0, f"{flag} {value} accepted")
            self.assertIn(f"'{value}'", p.stderr, f"error for {flag} {value} does not name the value")
        p = run("--model", BIN_MODEL, "--tokenizer", TOK, "--prompt", "x", "--threads", "two",
                check=False)
        self.assertIn("--threads", p.stderr)

    def test_missing_model_file_is_a_clear_error(self):
        p = run("--model", "/nonexistent/model.bin", "--tokenizer", TOK, "--prompt", "x",
                check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("/nonexistent/model.bin", p.stderr)


if __name__ == "__main__":
    unittest.main()
