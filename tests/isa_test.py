"""A job gives the same bytes on every CPU path: `tokpipe run` under each
vector level this CPU has (TP_ISA caps it: portable, avx2, avx512), sampled
with logprobs, on the real stories260K in every weight type llama.cpp wrote
and on a random model in the K-quant mixes and a random gpt-oss in
MXFP4 (its experts, or every matrix), both KV cache types. This is
what lets a job move between workers on different CPUs (recovery, a
cluster of mixed hosts) without its stream changing."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

PROMPTS = ["Once upon a time", "The little dog", "Tom and Lily went to the park"]


def cpu_levels():
    """The levels this CPU can run, lowest first."""
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = set()
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    levels = ["portable"]
    if {"avx2", "fma", "f16c"} <= flags:
        levels.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl"} <= flags:
            levels.append("avx512")
    return levels


def run_at(level, model, *extra):
    env = dict(os.environ, TP_ISA=level)
    args = [TOKPIPE, "run", "--model", model, "--json", "--max-tokens", "48", "--temperature", "0.9",
            "--top-k", "40", "--seed", "11", "--logprobs", "--top-logprobs", "3", "--threads", "2"]
    for p in PROMPTS:
        args += ["--prompt", p]
    p = subprocess.run(args + list(extra), capture_output=True, env=env, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"TP_ISA={level} tokpipe run {model} failed: {p.stderr.decode(errors='replace')}")
    return p.stdout


class EveryCpuPathGivesTheSameBytes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.levels = cpu_levels()
        q = os.path.join(MODELS, "gguf-quant")
        cls.models = [os.path.join(MODELS, "stories260K.gguf")] + [
            os.path.join(q, f"stories260K-{t}.gguf") for t in ("f16", "q8_0", "q4_0")]
        # 256-column rows, so the K types are K types (stories260K's 64 fall back)
        base = os.path.join(cls.tmp.name, "rand.gguf")
        subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--arch", "llama", "--vocab-from",
                        os.path.join(MODELS, "stories260K.gguf"), "--shape", "256x2x4x2",
                        "--seq-len", "256", "--seed", "5", "--out", base],
                       check=True, capture_output=True, timeout=120)
        for t in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q4_1", "Q5_0"):
            out = os.path.join(cls.tmp.name, f"rand-{t}.gguf")
            subprocess.run([TOKPIPE, "quantize", base, out, "--type", t, "--quiet"],
                           check=True, capture_output=True, timeout=120)
            cls.models.append(out)
        # gpt-oss (sinks, YaRN, windows, its experts) with MXFP4 experts, and all in MXFP4
        oss = os.path.join(cls.tmp.name, "oss.gguf")
        subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--arch", "gpt-oss", "--vocab-from",
                        os.path.join(MODELS, "stories260K.gguf"), "--shape", "128x2x4x2", "--head-dim", "32",
                        "--experts", "8", "--experts-used", "3", "--expert-ff", "128", "--sliding-window", "8",
                        "--seq-len", "256", "--seed", "5", "--out", oss],
                       check=True, capture_output=True, timeout=120)
        for t in ("MXFP4_MOE", "MXFP4"):
            out = os.path.join(cls.tmp.name, f"oss-{t}.gguf")
            subprocess.run([TOKPIPE, "quantize", oss, out, "--type", t, "--quiet"],
                           check=True, capture_output=True, timeout=120)
            cls.models.append(out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_cpu_has_a_vector_level_or_says_so(self):
        if len(self.levels) == 1:
            self.skipTest("this CPU has no AVX2: only the portable path runs here")
        self.assertIn("avx2", self.levels)

    def test_every_level_gives_the_portable_bytes(self):
        for model in self.models:
            for kv in ("f32", "f16"):
                with self.subTest(model=os.path.basename(model), kv=kv):
                    want = run_at("portable", model, "--kv-type", kv)
                    self.assertGreater(len(want), 100)
                    for level in self.levels[1:]:
                        got = run_at(level, model, "--kv-type", kv)
                        self.assertEqual(got, want, f"{os.path.basename(model)}, kv {kv}: "
                                         f"TP_ISA={level} differs from the portable path")

    def test_an_unknown_level_is_named_and_ignored(self):
        env = dict(os.environ, TP_ISA="sse9")
        p = subprocess.run([TOKPIPE, "run", "--model", self.models[0], "--prompt", "Hi", "--max-tokens", "4",
                            "--temperature", "0"], capture_output=True, env=env, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(b"TP_ISA ignored: isa 'sse9' is not one of portable, avx2, avx512", p.stderr)


if __name__ == "__main__":
    unittest.main()
