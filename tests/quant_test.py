"""Quantized weights against an independent reference: the GGUF reader of
tests/support/gguf_tiny.py (written from the GGUF spec) and numpy
dequantizers written here from ggml's published block definitions
(ggml-common.h block_q8_0 ... block_q6_K, dequantize_row_*),
applied to llama.cpp-written files (../shared/models/gguf-quant) and to
files `tokpipe quantize` writes, compared bit for bit with what tokpipe's
own dequantizer writes (`tokpipe quantize FILE OUT --type F32`). So reader
and writer cannot share a misreading. Also: headers other GGUF readers
expect, llama.cpp's Q4_K_M choice per tensor, and batch invariance of
`tokpipe run` for every type (8 prompts together == each alone, greedy and
seeded, 1 and 2 threads), plus the C logits-level check on these files."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import gguf_tiny  # noqa: E402
from tpdaemon import MODELS, TOKPIPE, tokpipe  # noqa: E402

BUILD = os.environ.get("TP_BUILD_DIR", "build")
QDIR = os.path.join(MODELS, "gguf-quant")

# ggml type id -> (name, elements per block, bytes per block)
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 8: ("Q8_0", 32, 34),
         2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24),
         12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 39: ("MXFP4", 32, 17)}
FTYPE = {"F32": 0, "F16": 1, "BF16": 32, "Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9,
         "Q4_K": 14, "Q5_K": 16, "Q6_K": 18, "Q4_K_M": 15, "Q5_K_M": 17, "MXFP4": 38}

# ---- GGUF files (the header read by tests/support/gguf_tiny.py) -----------


class Reader(gguf_tiny.Gguf):
    """A GGUF file's header (tests/support/gguf_tiny.py) and its tensors'
    bytes in every type below."""

    def raw(self, name):
        for n, dims, typ, off in self.tensors:
            if n == name:
                _, be, bb = TYPES[typ]
                count = int(np.prod(dims))
                nbytes = count // be * bb
                start = self.data_start + off
                return typ, dims, self.buf[start:start + nbytes]
        raise KeyError(name)

    def types(self):
        return {n: TYPES[t][0] for n, _, t, _ in self.tensors}


# ---- dequantizers from ggml's block definitions ---------------------------

F32 = np.float32


def f16(b):
    return np.frombuffer(b.tobytes(), dtype="<f2").astype(F32)


def blocks(raw, nbytes):
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, nbytes)


def scale_min_k4(j, q):
    """ggml get_scale_min_k4 over all blocks at once (q: [n, 12])."""
    q = q.astype(np.int32)
    if j < 4:
        return q[:, j] & 63, q[:, j + 4] & 63
    return ((q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4),
            (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4))


def dequant(typ, raw):
    name = TYPES[typ][0]
    if name == "F32":
        return np.frombuffer(raw, dtype="<f4").copy()
    if name == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(F32)
    if name == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(F32)
    if name == "Q8_0":
        b = blocks(raw, 34)
        d = f16(b[:, 0:2])
        return (b[:, 2:].view(np.int8).astype(F32) * d[:, None]).ravel()
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        size = TYPES[typ][2]
        b = blocks(raw, size)
        d = f16(b[:, 0:2])
        has_m, has_h = name.endswith("_1"), name.startswith("Q5")
        m = f16(b[:, 2:4]) if has_m else None
        o = 4 if has_m else 2
        qh = b[:, o:o + 4].copy().view("<u4")[:, 0].astype(np.int64) if has_h else None
        qs = b[:, o + (4 if has_h else 0):].astype(np.int64)
        j = np.arange(16)
        x0, x1 = qs & 0xF, qs >> 4
        if has_h:  # ggml: xh_0 = ((qh >> j) << 4) & 0x10, xh_1 = (qh >> (j + 12)) & 0x10
            x0 = x0 | (((qh[:, None] >> j) << 4) & 0x10)
            x1 = x1 | ((qh[:, None] >> (j + 12)) & 0x10)
        if not has_m:
            off = 16 if has_h else 8
            x0, x1 = x0 - off, x1 - off
        x = np.concatenate([x0, x1], axis=1).astype(F32)
        y = x * d[:, None]
        if has_m:
            y = y + m[:, None]
        return y.ravel()
    if name in ("Q4_K", "Q5_K"):
        five = name == "Q5_K"
        b = blocks(raw, 176 if five else 144)
        d, dmin = f16(b[:, 0:2]), f16(b[:, 2:4])
        sc = b[:, 4:16]
        qh = b[:, 16:48].astype(np.int64) if five else None
        ql = b[:, 48:176] if five else b[:, 16:144]
        out = []
        for jj in range(4):
            q = ql[:, 32 * jj:32 * jj + 32].astype(np.int64)
            for h in range(2):
                s, mm = scale_min_k4(2 * jj + h, sc)
                d1, m1 = d * s.astype(F32), dmin * mm.astype(F32)
                v = (q & 0xF) if h == 0 else (q >> 4)
                if five:
                    v = v + np.where(qh & (1 << (2 * jj + h)), 16, 0)
                out.append(d1[:, None] * v.astype(F32) - m1[:, None])
        return np.concatenate(out, axis=1).ravel()
    if name == "Q6_K":
        b = blocks(raw, 210)
        d = f16(b[:, 208:210])
        sc = b[:, 192:208].view(np.int8).astype(F32)
        out = np.zeros((b.shape[0], 256), dtype=F32)
        for n in range(2):
            ql = b[:, 64 * n:64 * n + 64].astype(np.int64)
            qh = b[:, 128 + 32 * n:128 + 32 * n + 32].astype(np.int64)
            s = sc[:, 8 * n:8 * n + 8]
            for l in range(32):
                i = l // 16
                q1 = ((ql[:, l] & 0xF) | (((qh[:, l] >> 0) & 3) << 4)) - 32
                q2 = ((ql[:, l + 32] & 0xF) | (((qh[:, l] >> 2) & 3) << 4)) - 32
                q3 = ((ql[:, l] >> 4) | (((qh[:, l] >> 4) & 3) << 4)) - 32
                q4 = ((ql[:, l + 32] >> 4) | (((qh[:, l] >> 6) & 3) << 4)) - 32
                for k, (q, si) in enumerate(((q1, i), (q2, i + 2), (q3, i + 4), (q4, i + 6))):
                    out[:, 128 * n + l + 32 * k] = (d * s[:, si]) * q.astype(F32)
        return out.ravel()
    if name == "MXFP4":
        # block_mxfp4: e (E8M0), qs[16]; kvalues_mxfp4 (E2M1 doubled) at
        # GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128), low nibbles first
        b = blocks(raw, 17)
        kv = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=F32)
        d = np.ldexp(np.ones(b.shape[0], dtype=F32), b[:, 0].astype(np.int32) - 128).astype(F32)
        qs = b[:, 1:].astype(np.int64)
        x = np.concatenate([kv[qs & 0xF], kv[qs >> 4]], axis=1)
        return (x * d[:, None]).ravel()
    raise ValueError(name)


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@unittest.skipUnless(os.path.exists(TOKPIPE), "bin/tokpipe not built")
class QuantizedWeights(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        # dim 256: rows fit the 256 block, except ffn_down's (hidden 704),
        # which fall back as llama-quantize does
        cls.src_bin = os.path.join(cls.dir, "r256.bin")
        tokpipe("mkmodel", "--shape", "256x2", "--vocab", "512", "--seq-len", "128", "--seed", "9",
                "--out", cls.src_bin, "--quiet")
        cls.vocab = os.path.join(MODELS, "stories260K.gguf")
        cls.src = os.path.join(cls.dir, "r256-f32.gguf")
        tokpipe("quantize", cls.src_bin, cls.src, "--type", "F32", "--vocab-from", cls.vocab, "--quiet")
        cls.files = {}
        for t in FTYPE:
            if t == "F32":
                continue
            out = os.path.join(cls.dir, t + ".gguf")
            tokpipe("quantize", cls.src, out, "--type", t, "--quiet")
            cls.files[t] = out

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check_against_tokpipe(self, path):
        """numpy's dequantization of every tensor == tokpipe's (bitwise)."""
        out = os.path.join(self.dir, "deq.gguf")
        tokpipe("quantize", path, out, "--type", "F32", "--quiet")
        q, f = Reader(path), Reader(out)
        seen = set()
        for name, dims, typ, _ in q.tensors:
            t2, dims2, raw2 = f.raw(name)
            self.assertEqual((dims2, t2), (dims, 0), name)
            mine = dequant(typ, q.raw(name)[2])
            theirs = np.frombuffer(raw2, dtype="<f4")
            self.assertTrue(same_bits(mine, theirs),
                            "%s %s (%s): numpy and tokpipe dequantize differently (max diff %g)"
                            % (os.path.basename(path), name, TYPES[typ][0],
                               float(np.max(np.abs(mine - theirs)))))
            seen.add(TYPES[typ][0])
        return seen

    def test_llama_cpp_files_dequantize_as_ggml_defines(self):
        for kind in ("f16", "q8_0", "q4_0"):
            path = os.path.join(QDIR, "stories260K-%s.gguf" % kind)
            seen = self.check_against_tokpipe(path)
            self.assertIn(kind.upper(), seen)
            listed = os.path.join(QDIR, "mixquant-%s.tensors.txt" % kind)
            if os.path.exists(listed):
                types = Reader(path).types()
                with open(listed) as f:
                    for line in f:
                        name, _, rest = line.partition(" ")
                        self.assertEqual(types[name], rest.split("->")[1].strip().upper(), name)

    def test_tokpipe_quantize_outputs_dequantize_as_ggml_defines_and_stay_close(self):
        ref = Reader(self.src)
        for t, path in self.files.items():
            seen = self.check_against_tokpipe(path)
            base = t.split("_M")[0] if t.endswith("_M") else t
            self.assertIn(base, seen, t)
            r = Reader(path)
            for name, dims, typ, _ in r.tensors:
                want = dequant(0, ref.raw(name)[2])
                got = dequant(typ, r.raw(name)[2])
                err = float(np.max(np.abs(got - want)))
                # a few steps of the coarsest grid (4 bits over the range)
                bound = {"F16": 1e-3, "BF16": 1e-2, "MXFP4": 0.3}.get(TYPES[typ][0], 0.25) * float(np.max(np.abs(want)))
                self.assertLessEqual(err, bound + 1e-7, "%s %s (%s)" % (t, name, TYPES[typ][0]))

    def test_headers_follow_gguf_conventions(self):
        for t, path in self.files.items():
            r = Reader(path)
            self.assertEqual(r.version, 3)
            self.assertEqual(r.alignment, 32)
            self.assertEqual(r.data_start % 32, 0)
            for name, _, _, off in r.tensors:
                self.assertEqual(off % 32, 0, name)
            self.assertEqual(r.kv["general.file_type"], FTYPE[t], t)
            self.assertEqual(r.kv["general.quantization_version"], 2, t)
            self.assertEqual(r.kv["general.architecture"], "llama")
            self.assertEqual(len(r.kv["tokenizer.ggml.tokens"]), 512)
            self.assertEqual(len(r.buf), r.data_start + max(
                off + int(np.prod(d)) // TYPES[ty][1] * TYPES[ty][2] for _, d, ty, off in r.tensors))

    def test_q4_k_m_picks_types_per_tensor_as_llama_cpp(self):
        types = Reader(self.files["Q4_K_M"]).types()
        self.assertEqual(types["token_embd.weight"], "Q4_K")
        self.assertEqual(types["output_norm.weight"], "F32")
        # 2 layers: use_more_bits(i, 2) is true for layer 1 only (i >= 7*2/8)
        self.assertEqual(types["blk.0.attn_v.weight"], "Q4_K")
        self.assertEqual(types["blk.1.attn_v.weight"], "Q6_K")
        self.assertEqual(types["blk.1.ffn_down.weight"], "Q8_0")  # Q6_K, rows of 704: Q8_0
        self.assertEqual(types["blk.0.ffn_down.weight"], "Q5_0")  # Q4_K, rows of 704: Q5_0
        self.assertEqual(types["blk.0.ffn_gate.weight"], "Q4_K")
        # rows not a whole 256 block (stories260K: dim 64) fall back as llama-quantize
        out = os.path.join(self.dir, "s260-q4km.gguf")
        tokpipe("quantize", self.vocab, out, "--type", "Q4_K_M", "--quiet")
        types = Reader(out).types()
        self.assertEqual(types["blk.0.attn_q.weight"], "Q5_0")
        # ffn_down rows of 172: Q4_K -> Q5_0, Q6_K (layer 2) -> Q8_0, neither fits: F16
        self.assertEqual(types["blk.0.ffn_down.weight"], "F16")
        self.assertEqual(types["blk.2.ffn_down.weight"], "F16")
        self.assertEqual(types["output.weight"] if "output.weight" in types else "Q8_0", "Q8_0")

    def test_unknown_type_is_refused_by_name(self):
        p = subprocess.run([TOKPIPE, "quantize", self.src, os.path.join(self.dir, "x.gguf"), "--type", "Q2_K"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("Q2_K", p.stderr)

    def run_json(self, path, prompts, *extra):
        args = ["run", "--model", path, "--json", "--max-tokens", "12", *extra]
        for pr in prompts:
            args += ["--prompt", pr]
        out = tokpipe(*args).stdout
        return [json.loads(line)["tokens"] for line in out.splitlines() if line.strip()]

    def test_every_type_runs_batch_invariant(self):
        # 8 prompts; the C test below checks the logits of 8 sequences
        # bitwise on both kernel paths, so here the even types take the first
        # half alone and the odd ones the second half (time on a shared machine)
        prompts = ["Once upon a time", "The cat", "Lily and Tom went to the park", "One day",
                   "The big red ball", "She was sad because", "Tim had a dog named", "In the sky"]
        for n, (t, path) in enumerate(self.files.items()):
            half = prompts[4 * (n % 2):4 * (n % 2) + 4]
            alone_of = {p: None for p in half}
            for mode in (["--temperature", "0"], ["--temperature", "0.9", "--seed", "5"]):
                for p in alone_of:
                    alone_of[p] = self.run_json(path, [p], *mode)[0]
                for threads in ("1", "2"):
                    together = self.run_json(path, prompts, *mode, "--threads", threads)
                    for i, p in enumerate(prompts):
                        if p in alone_of:
                            self.assertEqual(together[i], alone_of[p], "%s %s, %s thread(s), prompt %r: "
                                             "batched differs from alone" % (t, " ".join(mode), threads, p))

    def test_logits_of_every_type_are_batch_invariant_in_c(self):
        exe = os.path.join(BUILD, "tests", "test_quant")
        if not os.path.exists(exe):
            self.skipTest("build/tests/test_quant not built")
        env = dict(os.environ, TP_QUANT_DIR=self.dir)
        p = subprocess.run([exe], capture_output=True, text=True, timeout=600, env=env)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-2000:])
        self.assertIn("[       OK ] quantize_outputs_of_every_type_are_batch_invariant", p.stdout)


if __name__ == "__main__":
    unittest.main()
