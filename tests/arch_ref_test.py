"""tokpipe's forward pass against an independent numpy reference
(tests/support/gguf_tiny.py: its own GGUF reader, float64 RMSNorm, RoPE of
each architecture's kind, grouped-query attention, SwiGLU, biases) on the
real stories260K.gguf and on random-weight llama, Llama 3, Mixtral (llama
with experts), qwen2, qwen3, phi3, qwen3moe, gemma3, gemma2, qwen35, qwen35moe and gpt-oss models written
by `tokpipe mkmodel`.

Tolerance: tokpipe computes in float32, the reference in float64; every
logit of every sampled position must agree within 1e-5 * (1 + max |logit|)
of that row (observed: 2e-7 to 1.2e-6). Each test also checks that the
mistake it guards against (the other RoPE kind, no biases, no Llama 3
scaling, no Q/K norm, Phi-3's gate and up swapped, the experts' top-k weights
not renormalised or one expert too few; for Gemma no sliding window, the
global RoPE base on sliding layers, no post-norms, SiLU for GELU, no
soft-capping; for gpt-oss no sinks, no YaRN, the softmax over all experts,
SiLU for swiglu_oai, no window) moves the logits by more than ten times
that, so it can fail;
Llama 3 scaling only slows low-frequency pairs, so its test runs a prompt
of several hundred tokens, and Gemma's runs one of more than twice the
window."""
import os
import re
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import gguf_tiny  # noqa: E402
from tpdaemon import MODELS, tokpipe  # noqa: E402

SPM = os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-llama-spm.gguf")
GPT2 = os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-gpt-2.gguf")
REL_TOL = 1e-5
KV_LINE = re.compile(r"kv held after the last step (?P<held>\d+) bytes at (?P<pos>\d+) positions .* a page of 16 "
                     r"positions (?P<page>\d+) bytes, a window part (?P<part>\d+) bytes \(window (?P<window>\d+)\)")
PROMPT = "Once upon a time, in a land far away"


class ForwardMatchesNumpyReference(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def mkmodel(self, name, *args, vocab=SPM):
        path = os.path.join(self.tmp.name, name + ".gguf")
        tokpipe("mkmodel", "--format", "gguf", "--vocab-from", vocab, "--seed", "7", "--out", path, *args)
        return path

    def dump(self, path, n=5, prompt=PROMPT):
        out = os.path.join(self.tmp.name, "logits.bin")
        p = tokpipe("run", "--model", path, "--prompt", prompt, "--max-tokens", str(n), "--temperature", "0",
                    "--ignore-eos", "--dump-logits", out, "--kv-stats")
        m = KV_LINE.search(p.stderr)
        self.assertIsNotNone(m, "tokpipe run --kv-stats: " + p.stderr)
        self.kv = {k: int(v) for k, v in m.groupdict().items()}
        model = gguf_tiny.Model(path)
        vocab = model.w["token_embd.weight"].shape[0]
        rows = gguf_tiny.read_dump(out, vocab)
        self.assertEqual(len(rows), n, "one logits row per sampled token")
        ids = rows[-1][0]
        for i, (ctx, _) in enumerate(rows):
            self.assertEqual(ctx, ids[:len(ctx)], "row %d: the contexts grow by one token" % i)
        return model, ids, rows

    def worst(self, ref, rows):
        """Largest error of any row, relative to 1 + that row's largest logit."""
        return max(np.max(np.abs(ref[len(ctx) - 1] - got)) / (1 + np.max(np.abs(ref[len(ctx) - 1])))
                   for ctx, got in rows)

    def check(self, path, wrong=None, prompt=PROMPT, wrongs=None):
        """wrongs: {name: reference with that mistake}, each of which must
        miss tokpipe's logits by more than ten times the tolerance."""
        model, ids, rows = self.dump(path, prompt=prompt)
        ref = model.logits(ids)
        err = self.worst(ref, rows)
        self.assertLess(err, REL_TOL, "%s: tokpipe's logits differ from the reference by %.3g" % (path, err))
        for name, bad_ref in (wrongs or {}).items() if not wrong else {"mistake": wrong}.items():
            bad = self.worst(bad_ref(model, ids), rows)
            self.assertGreater(bad, 10 * REL_TOL, "%s: the reference cannot tell %s apart" % (path, name))
        return model, ids

    def test_stories260k_gguf_matches(self):
        self.check(os.path.join(MODELS, "stories260K.gguf"),
                   wrong=lambda m, ids: m.logits(ids, neox=True))

    def test_llama_with_grouped_query_attention_and_separate_output_matches(self):
        path = self.mkmodel("llama", "--arch", "llama", "--shape", "64x2x4x2", "--separate-output")
        model, _ = self.check(path, wrong=lambda m, ids: m.logits(ids, neox=True))
        self.assertIn("output.weight", model.w)
        self.assertNotIn("blk.0.attn_q.bias", model.w)

    def test_llama3_rope_scaling_tensor_matches(self):
        path = self.mkmodel("llama3", "--arch", "llama3", "--shape", "128x2x4x1", "--separate-output")

        def unscaled(m, ids):
            m.freq_div = np.ones_like(m.freq_div)
            return m.logits(ids)
        model, _ = self.check(path, wrong=unscaled, prompt=" ".join([PROMPT] * 40))
        div = model.w["rope_freqs.weight"]
        self.assertTrue(np.any(div == 1.0) and np.any(div == 8.0) and np.any((div > 1) & (div < 8)),
                        "the shape exercises all three bands of the scaling: %s" % div)
        self.assertEqual(model.theta, 500000.0)

    def test_llama3_rope_scaling_keys_match(self):
        path = self.mkmodel("llama3k", "--arch", "llama3", "--shape", "128x2x4x1", "--rope-scaling-keys")
        model, _ = self.check(path)
        self.assertNotIn("rope_freqs.weight", model.w)
        self.assertEqual(model.meta["llama.rope.scaling.type"], "llama3")
        self.assertGreater(np.max(model.freq_div), 1.0)

    def test_qwen2_with_biases_and_neox_rope_matches(self):
        path = self.mkmodel("qwen2", "--arch", "qwen2", "--shape", "64x2x4x2")

        def no_bias(m, ids):
            for k in [k for k in m.w if k.endswith(".bias")]:
                del m.w[k]
            return m.logits(ids)
        model, _ = self.check(path, wrong=lambda m, ids: m.logits(ids, neox=False))
        self.check(path, wrong=no_bias)
        self.assertIn("blk.1.attn_v.bias", model.w)
        self.assertNotIn("output.weight", model.w)

    def test_qwen2_with_a_byte_level_bpe_vocabulary_matches(self):
        path = self.mkmodel("qwen2bpe", "--arch", "qwen2", "--shape", "64x2x4x2", vocab=GPT2)
        model, _ = self.check(path, wrong=lambda m, ids: m.logits(ids, neox=False))
        self.assertEqual(model.w["token_embd.weight"].shape[0], 50257)

    def test_qwen3_with_qk_norm_and_a_head_size_of_its_own_matches(self):
        # heads of 32 where dim / heads is 16: wq widens to 128, wo narrows back
        path = self.mkmodel("qwen3", "--arch", "qwen3", "--shape", "64x2x4x2", "--head-dim", "32")
        model, _ = self.check(path, wrong=lambda m, ids: m.logits(ids, qk_norm=False))
        self.check(path, wrong=lambda m, ids: m.logits(ids, neox=False))
        self.assertEqual(model.hs, 32)
        self.assertEqual(model.w["blk.0.attn_q.weight"].shape, (128, 64))
        self.assertEqual(model.w["blk.1.attn_output.weight"].shape, (64, 128))
        self.assertEqual(model.w["blk.1.attn_k_norm.weight"].shape, (32,))
        self.assertNotIn("blk.0.attn_q.bias", model.w)
        self.assertEqual(model.meta["qwen3.attention.key_length"], 32)

    def test_qwen3_with_heads_of_dim_over_heads_and_a_byte_level_vocabulary_matches(self):
        path = self.mkmodel("qwen3bpe", "--arch", "qwen3", "--shape", "64x2x4x1", vocab=GPT2)
        model, _ = self.check(path, wrong=lambda m, ids: m.logits(ids, qk_norm=False))
        self.assertEqual(model.hs, 16)

    def test_phi3_with_fused_qkv_and_gate_up_matches(self):
        path = self.mkmodel("phi3", "--arch", "phi3", "--shape", "64x2x4x2", "--separate-output")
        model, _ = self.check(path, wrong=lambda m, ids: m.logits(ids, up_first=True))
        self.check(path, wrong=lambda m, ids: m.logits(ids, neox=False))
        # [dim, q + 2 kv] and [dim, 2 hidden] as llama.cpp's converter writes them
        self.assertEqual(model.w["blk.0.attn_qkv.weight"].shape, (64 + 2 * 32, 64))
        hidden = model.meta["phi3.feed_forward_length"]
        self.assertEqual(model.w["blk.1.ffn_up.weight"].shape, (2 * hidden, 64))
        self.assertNotIn("blk.0.ffn_gate.weight", model.w)
        self.assertNotIn("blk.0.attn_q.weight", model.w)

    @staticmethod
    def altered(**attrs):
        """A reference with the model's attributes changed for one call."""
        def run(m, ids):
            saved = {k: getattr(m, k) for k in attrs}
            try:
                for k, v in attrs.items():
                    setattr(m, k, v(m) if callable(v) else v)
                return m.logits(ids)
            finally:
                for k, v in saved.items():
                    setattr(m, k, v)
        return run

    def test_phi3_longrope_and_partial_rope_match(self):
        """Phi-3.5 / Phi-4-mini as converted: LongRoPE factors, the
        attention factor, 96 of 128 turned (here 12 of 16). The file's
        context (1024) is past its original one (64): the long factors."""
        path = self.mkmodel("phi3long", "--arch", "phi3", "--shape", "64x2x4x2", "--longrope", "64",
                            "--rope-dim", "12")
        model, _ = self.check(path, wrongs={
            "the short factors": self.altered(freq_div=lambda m: m.longrope[1]),
            "no factors": self.altered(freq_div=lambda m: np.ones(6)),
            "no attention factor": self.altered(rope_attn=1.0),
            "the whole head turned": self.altered(rot=16, freq_div=lambda m: np.ones(8)),
        })
        self.assertEqual(model.w["rope_factors_long.weight"].shape, (6,))
        self.assertAlmostEqual(model.meta["phi3.rope.scaling.attn_factor"], (1 + np.log(16) / np.log(64)) ** 0.5,
                               places=6)
        # within the original context: the short factors, no attention factor
        path = self.mkmodel("phi3short", "--arch", "phi3", "--shape", "64x2x4x2", "--longrope", "1024")
        self.check(path, wrongs={"the long factors": self.altered(freq_div=lambda m: m.longrope[0])})

    # Gemma's prompt: more than twice the test models' window of 16 tokens
    LONG = " ".join([PROMPT] * 5)
    GEMMA_WRONGS = {
        "no sliding window": lambda m, ids: m.logits(ids, window=False),
        "the global RoPE base on sliding layers": lambda m, ids: m.logits(ids, local_theta=False),
        "no post-norms": lambda m, ids: m.logits(ids, post_norm=False),
        "SiLU for GELU": lambda m, ids: m.logits(ids, gelu=False),
        "no Q/K norms": lambda m, ids: m.logits(ids, qk_norm=False),
    }

    def assert_window_kept(self, window, n_slide, n_full, kv_dim):
        """After the last decode step the sliding layers keep the parts of
        the pages from the window of that step's query on (forward.h's
        rule: at most 2 for a window of 16 or less), the others every page;
        less than keeping every position."""
        kv = self.kv
        self.assertEqual(kv["window"], window)
        self.assertEqual(kv["page"], 2 * 4 * 16 * kv_dim * n_full)
        self.assertEqual(kv["part"], 2 * 4 * 16 * kv_dim * n_slide)
        pages = (kv["pos"] + 15) // 16
        self.assertGreater(kv["pos"], 2 * window + 16, "the job outgrows the window twice and a page")
        parts = (kv["held"] - pages * kv["page"]) // kv["part"]
        self.assertEqual(kv["held"], pages * kv["page"] + parts * kv["part"])
        self.assertLessEqual(parts, 2, "sliding layers keep only their window's pages")
        self.assertLess(parts, pages)

    def test_gemma3_with_sliding_windows_post_norms_and_gelu_matches(self):
        # six blocks: 0-4 slide (window 16, base 10000), 5 sees everything (base 1e6)
        path = self.mkmodel("gemma3", "--arch", "gemma3", "--shape", "64x6x4x2", "--head-dim", "32",
                            "--sliding-window", "16")
        model, ids = self.check(path, prompt=self.LONG, wrongs=self.GEMMA_WRONGS)
        self.assertGreater(len(ids), 2 * 16 + 5, "the prompt outgrows the window twice")
        self.assertEqual(model.meta["gemma3.attention.sliding_window"], 16)
        self.assertEqual(model.theta, 1000000.0)
        self.assertEqual(model.w["blk.5.post_ffw_norm.weight"].shape, (64,))
        self.assertEqual(model.w["blk.0.post_attention_norm.weight"].shape, (64,))
        self.assertEqual(model.w["blk.0.attn_q_norm.weight"].shape, (32,))
        self.assertNotIn("gemma3.final_logit_softcapping", model.meta)
        self.assert_window_kept(16, 5, 1, 2 * 32)

    def test_gemma3_4b_and_up_with_linear_rope_scaling_on_the_global_layers_matches(self):
        """Gemma 3 4B-27B: rope.scaling.type linear, factor 8, which slows
        the global layers' positions only (llama.cpp's
        rope_freq_scale_train_swa = 1: the sliding ones turn as before)."""
        path = self.mkmodel("gemma3lin", "--arch", "gemma3", "--shape", "64x6x4x2", "--head-dim", "32",
                            "--sliding-window", "16", "--rope-linear", "8")
        model, _ = self.check(path, prompt=self.LONG, wrongs={
            "no scaling": self.altered(freq_div=lambda m: np.ones(16)),
            "the sliding layers scaled too": self.altered(local_theta=None),
        })
        self.assertEqual(model.meta["gemma3.rope.scaling.type"], "linear")
        self.assertEqual(list(model.freq_div), [8.0] * 16)

    def test_gemma3_with_a_window_wider_than_the_prompt_and_a_byte_level_vocabulary_matches(self):
        path = self.mkmodel("gemma3bpe", "--arch", "gemma3", "--shape", "64x2x4x1", vocab=GPT2)
        # mkmodel writes its typical 512: the prompt stays inside it
        model, _ = self.check(path, wrongs={"no post-norms": lambda m, ids: m.logits(ids, post_norm=False)})
        self.assertEqual(model.window, 512)

    def test_gemma2_with_soft_capping_and_alternating_windows_matches(self):
        path = self.mkmodel("gemma2", "--arch", "gemma2", "--shape", "64x4x4x2", "--sliding-window", "16")
        wrongs = dict(self.GEMMA_WRONGS)
        del wrongs["no Q/K norms"], wrongs["the global RoPE base on sliding layers"]
        wrongs["no soft-capping"] = lambda m, ids: m.logits(ids, softcap=False)
        model, _ = self.check(path, prompt=self.LONG, wrongs=wrongs)
        self.assertEqual(model.attn_cap, 50.0)
        self.assertEqual(model.final_cap, 30.0)
        self.assertNotIn("blk.0.attn_q_norm.weight", model.w)
        self.assert_window_kept(16, 2, 2, 2 * 16)

    def test_qwen3moe_experts_match(self):
        path = self.mkmodel("qwen3moe", "--arch", "qwen3moe", "--shape", "64x2x4x2", "--head-dim", "32",
                            "--experts", "8", "--experts-used", "3", "--expert-ff", "64")
        model, _ = self.check(path, wrong=lambda m, ids: m.logits(ids, renorm=False))
        self.check(path, wrong=lambda m, ids: m.logits(ids, top=2))
        # llama.cpp's shapes: the router [dim, n_expert], experts [dim, ff, n_expert]
        self.assertEqual(model.w["blk.0.ffn_gate_inp.weight"].shape, (8, 64))
        self.assertEqual(model.w["blk.1.ffn_gate_exps.weight"].shape, (8, 64, 64))
        self.assertEqual(model.w["blk.1.ffn_down_exps.weight"].shape, (8, 64, 64))
        self.assertEqual(model.meta["qwen3moe.expert_feed_forward_length"], 64)
        self.assertNotIn("blk.0.ffn_gate.weight", model.w)

    def test_qwen3moe_equal_router_scores_take_the_lower_experts(self):
        path = self.mkmodel("qwen3moe_ties", "--arch", "qwen3moe", "--shape", "64x2x4x2", "--experts", "8",
                            "--experts-used", "3", "--expert-ff", "64")
        # a zero router in block 0: every expert scores the same for every token
        _, tensors, _, _, _ = gguf_tiny.read_gguf(path)
        with open(path, "r+b") as f:
            gguf_tiny.write_tensor(f, tensors, "blk.0.ffn_gate_inp.weight", np.zeros((8, 64)))
        self.check(path, wrong=lambda m, ids: m.logits(ids, ties_high=True))

    def test_mixtral_llama_with_experts_matches(self):
        path = self.mkmodel("mixtral", "--arch", "mixtral", "--shape", "64x2x4x2", "--expert-ff", "96")
        model, _ = self.check(path, wrong=lambda m, ids: m.logits(ids, renorm=False))
        self.check(path, wrong=lambda m, ids: m.logits(ids, neox=True))
        self.assertEqual(model.arch, "llama")
        self.assertEqual((model.meta["llama.expert_count"], model.meta["llama.expert_used_count"]), (8, 2))
        self.assertEqual(model.w["blk.0.ffn_up_exps.weight"].shape, (8, 96, 64))
        self.assertNotIn("blk.0.ffn_up.weight", model.w)

    def test_gpt_oss_matches(self):
        # a window of 4 so the sliding layers hide most of the (long) prompt
        path = self.mkmodel("gpt-oss", "--arch", "gpt-oss", "--shape", "64x2x4x2", "--head-dim", "32",
                            "--experts", "8", "--experts-used", "3", "--expert-ff", "64", "--sliding-window", "4")
        wrongs = {
            "no sinks": lambda m, ids: m.logits(ids, sinks=False),
            "no YaRN": lambda m, ids: m.logits(ids, yarn=False),
            "the softmax over all experts": lambda m, ids: m.logits(ids, softmax_all=True),
            "SiLU for swiglu_oai": lambda m, ids: m.logits(ids, plain_swiglu=True),
            "no sliding window": lambda m, ids: m.logits(ids, window=False),
            "adjacent-pair RoPE": lambda m, ids: m.logits(ids, neox=False),
        }
        model, _ = self.check(path, prompt=self.LONG, wrongs=wrongs)
        meta = model.meta
        self.assertEqual(meta["gpt-oss.rope.scaling.type"], "yarn")
        self.assertEqual((meta["gpt-oss.rope.scaling.factor"], meta["gpt-oss.rope.scaling.original_context_length"]),
                         (32.0, 4096))
        self.assertEqual(meta["gpt-oss.attention.sliding_window"], 4)
        # llama.cpp's shapes: sinks [n_head], expert biases [ff, n_expert]
        self.assertEqual(model.w["blk.0.attn_sinks.weight"].shape, (4,))
        self.assertEqual(model.w["blk.1.ffn_gate_exps.bias"].shape, (8, 64))
        self.assertEqual(model.w["blk.1.ffn_down_exps.bias"].shape, (8, 64))
        self.assertEqual(model.w["blk.0.attn_output.bias"].shape, (64,))
        self.assertNotIn("blk.0.ffn_norm.weight", model.w)
        self.assert_window_kept(4, 1, 1, 2 * 32)

    def test_qwen35_gated_deltanet_and_gated_attention_match(self):
        """Qwen 3.5: six Gated DeltaNet layers and two gated attention ones
        (every fourth), value heads twice the key heads, partial RoPE."""
        path = self.mkmodel("qwen35", "--arch", "qwen35", "--shape", "64x8x4x2", "--head-dim", "32")
        model, _ = self.check(path, wrongs={
            "no attention gate": lambda m, ids: m.logits(ids, attn_gate=False),
            "no gate on the DeltaNet's norm": lambda m, ids: m.logits(ids, gate_norm=False),
            "a plain linear attention for the delta rule": lambda m, ids: m.logits(ids, delta=False),
            "a RoPE over the whole head": self.altered(rot=lambda m: m.hs, freq_div=lambda m: np.ones(m.hs // 2)),
        })
        self.assertEqual(model.meta["qwen35.rope.dimension_count"], 8)
        self.assertEqual((model.ssm_kh, model.ssm_vh, model.ssm_hd), (2, 4, 32))
        self.assertEqual(model.w["blk.0.ssm_conv1d.weight"].shape, (2 * 64 + 128, 4))
        self.assertEqual(model.w["blk.3.attn_q.weight"].shape, (2 * 4 * 32, 64))
        self.assertNotIn("blk.3.attn_qkv.weight", model.w)
        self.assertNotIn("blk.0.attn_q.weight", model.w)
        # KV for the two attention blocks only (3 and 7): the DeltaNet ones keep their state instead
        self.assertEqual((self.kv["page"], self.kv["part"]), (2 * 4 * 16 * 2 * 32 * 2, 0))
        self.assertEqual(self.kv["held"], (self.kv["pos"] + 15) // 16 * self.kv["page"])

    def test_qwen35moe_experts_and_gated_shared_expert_match(self):
        """Qwen 3.5 MoE: qwen35's hybrid layers, each FFN 8 experts (3 a
        token, renormalised) and a shared expert wider than one of them,
        gated by sigmoid(x . ffn_gate_inp_shexp)."""
        path = self.mkmodel("qwen35moe", "--arch", "qwen35moe", "--shape", "64x4x4x2", "--head-dim", "32",
                            "--experts", "8", "--experts-used", "3", "--expert-ff", "64", "--shared-ff", "96")
        model, _ = self.check(path, wrongs={
            "no shared expert": lambda m, ids: m.logits(ids, shexp=False),
            "a shared expert without its sigmoid gate": lambda m, ids: m.logits(ids, shexp_gate=False),
            "the top-k weights not renormalised": lambda m, ids: m.logits(ids, renorm=False),
            "no attention gate": lambda m, ids: m.logits(ids, attn_gate=False),
        })
        # llama.cpp's shapes: the shared expert [dim, shexp_ff], its gate [dim]
        self.assertEqual(model.meta["qwen35moe.expert_shared_feed_forward_length"], 96)
        self.assertEqual(model.w["blk.0.ffn_gate_shexp.weight"].shape, (96, 64))
        self.assertEqual(model.w["blk.0.ffn_down_shexp.weight"].shape, (64, 96))
        self.assertEqual(model.w["blk.3.ffn_gate_inp_shexp.weight"].shape, (64,))
        self.assertEqual(model.w["blk.3.ffn_up_exps.weight"].shape, (8, 64, 64))
        self.assertNotIn("blk.0.ffn_gate.weight", model.w)
        self.assertIn("blk.0.ssm_conv1d.weight", model.w)

    def test_qwen35_with_a_long_prompt_and_its_own_vocabulary_matches(self):
        path = self.mkmodel("qwen35_bpe", "--arch", "qwen35", "--shape", "64x4x4x4",
                            vocab=os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-qwen35.gguf"))
        self.check(path, prompt=PROMPT * 6)


if __name__ == "__main__":
    unittest.main()
