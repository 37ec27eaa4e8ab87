"""`tokpipe tokenize` against Debian's SentencePiece (the reference the
llama2.c tokenizer reproduces) on random and unicode-heavy text, plus the
--decode round trip and the command's errors."""
import os
import random
import subprocess
import unittest

import sentencepiece

MODELS = os.environ.get("TP_MODELS", "../shared/models")
TOKPIPE = os.path.join(os.environ.get("TP_BIN_DIR", "bin"), "tokpipe")

# Characters drawn for random text: ASCII, whitespace runs, accents,
# CJK, emoji (4-byte UTF-8), combining marks, and rarely-seen symbols that
# force byte fallback.
ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
            + [" "] * 12 + ["\n", "\t", "  ", "\\", ".", ",", "'", "!", "?", "-"]
            + list("éüßñçøåæœ") + list("日本語中文한국어") + ["😀", "🦙", "👍🏽"]
            + ["\u0301", "\u200b", "€", "ǅ", "\U0001d11e", "\x7f", "\x01"])
# Not drawn: U+2581 itself. SentencePiece reads a literal "▁" in the input as
# a space; llama2.c (and tokpipe) treat it as an ordinary character.


def escape(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def random_texts(seed, count):
    rng = random.Random(seed)
    texts = ["", " ", "Once upon a time", "  leading", "trailing  ", "\n\n", "a\tb"]
    while len(texts) < count:
        texts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 60))))
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

    def test_llama_cpp_vectors_match_with_the_vocab_only_gguf(self):
        base = os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-llama-spm.gguf")
        with open(base + ".inp", encoding="utf-8") as f:
            inputs = f.read().split("\n__ggml_vocab_test__\n")[:-1]
        with open(base + ".out", encoding="utf-8") as f:
            want = f.read().split("\n")[:-1]
        self.assertEqual(len(inputs), 46)
        self.assertEqual(len(want), len(inputs))
        out = tokpipe(["--tokenizer", base], "".join(escape(t) + "\n" for t in inputs))
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        got = out.stdout.decode().split("\n")[:-1]
        for text, g, w in zip(inputs, got, want):
            self.assertEqual(g.split(), w.split(), f"text {text!r}")

    def test_non_sentencepiece_gguf_vocab_is_refused_by_name(self):
        out = tokpipe(["--tokenizer", os.path.join(MODELS, "llama.cpp-vocab",
                                                   "ggml-vocab-gpt-2.gguf")], "hi\n")
        self.assertEqual(out.returncode, 1)
        self.assertIn("tokenizer.ggml.model 'gpt2' is not supported", out.stderr.decode())

    def test_gguf_file_supplies_its_embedded_vocabulary(self):
        out = tokpipe(["--tokenizer", os.path.join(MODELS, "stories260K.gguf"), "--bos"],
                      "Once upon a time\n")
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        self.assertEqual(out.stdout.decode(), "1 403 407 261 378\n")


if __name__ == "__main__":
    unittest.main()
