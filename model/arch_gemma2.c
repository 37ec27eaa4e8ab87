/* gemma2: Gemma 2 models (llama.cpp's src/models/gemma2.cpp; LLM_ARCH_GEMMA2
 * in llama-model.cpp). gemma3's block (model/arch_gemma3.c) without the
 * Q/K norms, with soft-capping: each attention score s becomes c * tanh(s /
 * c), c = attn_logit_softcapping (default 50), and each final logit the
 * same with final_logit_softcapping (default 30). Every other layer
 * slides (l % 2 == 0), the window attention.sliding_window (default 4096),
 * with the global RoPE base and scaling; Q times 1 / sqrt(head_size), or 1
 * / sqrt(dim / heads) for the 27B's 46 blocks. The epsilon has no
 * default. */
#include "arch.h"

static const tp_arch_tensor BLOCK[] = {
    TP_AT_VEC("attn_norm.weight", TP_SZ_EMBD, rms_att, 0),
    TP_AT_MAT("attn_q.weight", TP_SZ_EMBD, TP_SZ_Q, wq, 0),
    TP_AT_MAT("attn_k.weight", TP_SZ_EMBD, TP_SZ_KV, wk, 0),
    TP_AT_MAT("attn_v.weight", TP_SZ_EMBD, TP_SZ_KV, wv, 0),
    TP_AT_MAT("attn_output.weight", TP_SZ_Q, TP_SZ_EMBD, wo, 0),
    TP_AT_VEC("post_attention_norm.weight", TP_SZ_EMBD, rms_att_post, 0),
    TP_AT_VEC("ffn_norm.weight", TP_SZ_EMBD, rms_ffn, 0),
    TP_AT_MAT("ffn_gate.weight", TP_SZ_EMBD, TP_SZ_FF, w1, 0),
    TP_AT_MAT("ffn_up.weight", TP_SZ_EMBD, TP_SZ_FF, w3, 0),
    TP_AT_MAT("ffn_down.weight", TP_SZ_FF, TP_SZ_EMBD, w2, 0),
    TP_AT_VEC("post_ffw_norm.weight", TP_SZ_EMBD, rms_ffn_post, 0),
};

const tp_arch tp_arch_gemma2 = {
    .name = "gemma2",
    .id = TP_ARCH_GEMMA2,
    .rope = TP_ROPE_NEOX,
    .flags = TP_ARCHF_HEAD_DIM_KEY | TP_ARCHF_EPS_REQUIRED | TP_ARCHF_EMBD_SCALE | TP_ARCHF_POST_NORMS |
             TP_ARCHF_GELU | TP_ARCHF_Q_SCALE | TP_ARCHF_ATTN_SOFTCAP | TP_ARCHF_FINAL_SOFTCAP,
    .rope_base = 10000.0,
    .context = 2048,
    .swa_pattern = 2,
    .swa_window = 4096,
    .swa_rope_base = 0.0,
    .attn_softcap = 50.0,
    .final_softcap = 30.0,
    .big_layers = 46,
    .block = BLOCK,
    .n_block = sizeof BLOCK / sizeof BLOCK[0],
    .mk_rope_base = 10000.0f,
    .mk_norm_eps = 1e-6f,
    .mk_sliding_window = 4096,
};
