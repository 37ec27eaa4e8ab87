"""GGUF files tokpipe writes (tokpipe mkmodel --format gguf, through the
GGUF writer) read back with an independent reader (tests/support/gguf_tiny.py,
written from the GGUF spec): the copied vocabulary metadata equals the
source file's key for key, value for value and type for type, the tensor
directory is what the architecture needs, and every tensor starts at an
aligned offset inside the file."""
import math
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import gguf_tiny  # noqa: E402
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

VOCABS = [os.path.join(MODELS, "llama.cpp-vocab", n) for n in
          ("ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gpt-2.gguf")]


class WrittenGgufReadsBackIndependently(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def mkmodel(self, vocab, *args):
        out = os.path.join(self.tmp.name, "m.gguf")
        p = subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--vocab-from", vocab, "--seed", "3",
                            "--out", out, *args], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        return out

    def test_vocabulary_metadata_is_copied_exactly(self):
        for vocab in VOCABS:
            with self.subTest(vocab=os.path.basename(vocab)):
                src, _, _, _, src_types = gguf_tiny.read_gguf(vocab)
                out = self.mkmodel(vocab, "--arch", "qwen2", "--shape", "64x1x2")
                meta, tensors, _, _, types = gguf_tiny.read_gguf(out)
                tok_keys = sorted(k for k in src if k.startswith("tokenizer."))
                self.assertGreaterEqual(len(tok_keys), 4)
                for k in tok_keys:
                    self.assertEqual(types[k], src_types[k], k)
                    self.assertEqual(meta[k], src[k], k)
                self.assertEqual(sorted(k for k in meta if k.startswith("tokenizer.")), tok_keys)
                n_vocab = len(src["tokenizer.ggml.tokens"])
                self.assertEqual(tensors["token_embd.weight"][1], [64, n_vocab])

    def test_tensor_directory_is_aligned_and_inside_the_file(self):
        vocab = VOCABS[0]
        for arch, extra in (("llama", ["--separate-output"]), ("llama3", []), ("qwen2", [])):
            with self.subTest(arch=arch):
                out = self.mkmodel(vocab, "--arch", arch, "--shape", "96x2x3x1", "--seq-len", "300", *extra)
                meta, tensors, align, data, types = gguf_tiny.read_gguf(out)
                p = meta["general.architecture"] + "."
                self.assertEqual(meta["general.architecture"], "qwen2" if arch == "qwen2" else "llama")
                self.assertEqual((meta[p + "embedding_length"], meta[p + "block_count"],
                                  meta[p + "attention.head_count"], meta[p + "attention.head_count_kv"],
                                  meta[p + "context_length"]), (96, 2, 3, 1, 300))
                self.assertEqual(types[p + "rope.freq_base"], 6)  # f32
                self.assertEqual(align, 32)
                want = {"token_embd.weight", "output_norm.weight"}
                for l in range(2):
                    want |= {"blk.%d.%s.weight" % (l, n) for n in ("attn_norm", "attn_q", "attn_k", "attn_v",
                             "attn_output", "ffn_norm", "ffn_gate", "ffn_down", "ffn_up")}
                    if arch == "qwen2":
                        want |= {"blk.%d.%s.bias" % (l, n) for n in ("attn_q", "attn_k", "attn_v")}
                if arch == "llama3":
                    want.add("rope_freqs.weight")
                if extra:
                    want.add("output.weight")
                self.assertEqual(set(tensors), want)
                end = 0
                for name, (t, ne, off, size) in sorted(tensors.items(), key=lambda kv: kv[1][2]):
                    self.assertEqual(t, 0, name)
                    self.assertEqual(off % align, 0, name + " offset is aligned")
                    self.assertGreaterEqual(off, end, name + " does not overlap the previous tensor")
                    self.assertEqual(size, 4 * math.prod(ne))
                    end = off + size
                self.assertLessEqual(end, len(data))
                self.assertLess(len(data) - end, align, "no trailing garbage past the last tensor's padding")
                self.assertEqual(tensors["blk.0.attn_k.weight"][1], [96, 32])

    def test_mkmodel_refuses_flags_of_the_other_format_by_name(self):
        out = os.path.join(self.tmp.name, "x")
        cases = [
            (["--arch", "qwen2", "--shape", "64x1"], "--arch does not apply to --format llama2c"),
            (["--format", "gguf", "--shape", "64x1"], "--vocab-from"),
            (["--format", "gguf", "--vocab-from", VOCABS[0], "--tokenizer-out", out + ".tok", "--shape", "64x1"],
             "--tokenizer-out does not apply to --format gguf"),
            (["--format", "gguf", "--vocab-from", VOCABS[0], "--arch", "gemma7", "--shape", "64x1"],
             "architecture 'gemma7' is not one of llama, llama3, qwen2"),
            (["--format", "safetensors", "--shape", "64x1"], "--format 'safetensors'"),
            (["--format", "gguf", "--vocab-from", "/nonexistent.gguf", "--shape", "64x1"], "/nonexistent.gguf"),
        ]
        for args, msg in cases:
            with self.subTest(args=args):
                p = subprocess.run([TOKPIPE, "mkmodel", "--seed", "1", "--out", out, *args],
                                   capture_output=True, text=True, timeout=60)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(msg, p.stderr)
                self.assertFalse(os.path.exists(out), "nothing is written on refusal")


if __name__ == "__main__":
    unittest.main()
