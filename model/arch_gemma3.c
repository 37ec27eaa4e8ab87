/* gemma3: Gemma 3 text models (llama.cpp's src/models/gemma3.cpp;
 * LLM_ARCH_GEMMA3 in llama-model.cpp). Per block: RMSNorm, Q/K/V, each Q
 * and K head RMS-normed (attn_q_norm / attn_k_norm [head_size]), NEOX
 * RoPE, Q times f_attention_scale (1 / sqrt(head_size); 1 / sqrt(dim /
 * heads) for the 27B's 62 blocks, as gemma_pytorch's config), attention,
 * the output RMS-normed again (post_attention_norm) before the residual
 * add; the FFN the same way round (ffn_norm, GELU(gate) * up, down,
 * post_ffw_norm). Token embeddings are scaled by sqrt(dim) first. The head
 * size is attention.key_length (1B: 256 where dim / heads is 288).
 *
 * With attention.sliding_window (llama.cpp reads it as optional; without
 * it or with 0 no layer slides), five layers of six (l % 6 < 5) see only
 * the window's last positions (LLAMA_SWA_TYPE_STANDARD: a key at p0 is
 * hidden from a query at p1 when p1 - p0 >= window) and turn with RoPE
 * base 10000 unscaled (rope_freq_base_train_swa); the sixth sees the
 * whole context with rope.freq_base and the file's RoPE scaling.
 * final_logit_softcapping is optional, default none. The norm weights are
 * used as stored: llama.cpp's converter already added Gemma's 1 (HF's
 * x * (1 + w)). The epsilon has no default. */
#include "arch.h"

static const tp_arch_tensor BLOCK[] = {
    TP_AT_VEC("attn_norm.weight", TP_SZ_EMBD, rms_att, 0),
    TP_AT_MAT("attn_q.weight", TP_SZ_EMBD, TP_SZ_Q, wq, 0),
    TP_AT_MAT("attn_k.weight", TP_SZ_EMBD, TP_SZ_KV, wk, 0),
    TP_AT_MAT("attn_v.weight", TP_SZ_EMBD, TP_SZ_KV, wv, 0),
    TP_AT_MAT("attn_output.weight", TP_SZ_Q, TP_SZ_EMBD, wo, 0),
    TP_AT_VEC("post_attention_norm.weight", TP_SZ_EMBD, rms_att_post, 0),
    TP_AT_VEC("attn_k_norm.weight", TP_SZ_HEAD, k_norm, 0),
    TP_AT_VEC("attn_q_norm.weight", TP_SZ_HEAD, q_norm, 0),
    TP_AT_VEC("ffn_norm.weight", TP_SZ_EMBD, rms_ffn, 0),
    TP_AT_MAT("ffn_gate.weight", TP_SZ_EMBD, TP_SZ_FF, w1, 0),
    TP_AT_MAT("ffn_up.weight", TP_SZ_EMBD, TP_SZ_FF, w3, 0),
    TP_AT_MAT("ffn_down.weight", TP_SZ_FF, TP_SZ_EMBD, w2, 0),
    TP_AT_VEC("post_ffw_norm.weight", TP_SZ_EMBD, rms_ffn_post, 0),
};

const tp_arch tp_arch_gemma3 = {
    .name = "gemma3",
    .id = TP_ARCH_GEMMA3,
    .rope = TP_ROPE_NEOX,
    .flags = TP_ARCHF_HEAD_DIM_KEY | TP_ARCHF_QK_NORM | TP_ARCHF_EPS_REQUIRED | TP_ARCHF_EMBD_SCALE |
             TP_ARCHF_POST_NORMS | TP_ARCHF_GELU | TP_ARCHF_Q_SCALE | TP_ARCHF_FINAL_SOFTCAP,
    .rope_base = 10000.0,
    .context = 2048,
    .swa_pattern = 6,
    .swa_window = 0,
    .swa_rope_base = 10000.0,
    .final_softcap = 0.0,
    .big_layers = 62,
    .block = BLOCK,
    .n_block = sizeof BLOCK / sizeof BLOCK[0],
    .mk_rope_base = 1000000.0f,
    .mk_norm_eps = 1e-6f,
    .mk_sliding_window = 512,
};
