/* qwen3: Qwen3 dense models (llama.cpp's src/models/qwen3.cpp; LLM_ARCH_QWEN3
 * in llama-model.cpp). llama's block without biases, NEOX RoPE, and each
 * head of Q and K RMS-normed (blk.N.attn_q_norm / attn_k_norm, [head_size],
 * the block's epsilon) after the projection and before RoPE. The head size
 * is attention.key_length (Qwen3-0.6B: 128 where dim / heads is 64), so
 * wq is [dim] -> [head_size * heads] and wo back; the scale of the scores
 * stays 1 / sqrt(head_size). The epsilon has no default in llama.cpp. */
#include "arch.h"

static const tp_arch_tensor BLOCK[] = {
    TP_AT_VEC("attn_norm.weight", TP_SZ_EMBD, rms_att, 0),
    TP_AT_MAT("attn_q.weight", TP_SZ_EMBD, TP_SZ_Q, wq, 0),
    TP_AT_MAT("attn_k.weight", TP_SZ_EMBD, TP_SZ_KV, wk, 0),
    TP_AT_MAT("attn_v.weight", TP_SZ_EMBD, TP_SZ_KV, wv, 0),
    TP_AT_MAT("attn_output.weight", TP_SZ_Q, TP_SZ_EMBD, wo, 0),
    TP_AT_VEC("attn_k_norm.weight", TP_SZ_HEAD, k_norm, 0),
    TP_AT_VEC("attn_q_norm.weight", TP_SZ_HEAD, q_norm, 0),
    TP_AT_VEC("ffn_norm.weight", TP_SZ_EMBD, rms_ffn, 0),
    TP_AT_MAT("ffn_gate.weight", TP_SZ_EMBD, TP_SZ_FF, w1, 0),
    TP_AT_MAT("ffn_down.weight", TP_SZ_FF, TP_SZ_EMBD, w2, 0),
    TP_AT_MAT("ffn_up.weight", TP_SZ_EMBD, TP_SZ_FF, w3, 0),
};

const tp_arch tp_arch_qwen3 = {
    .name = "qwen3",
    .id = TP_ARCH_QWEN3,
    .rope = TP_ROPE_NEOX,
    .flags = TP_ARCHF_HEAD_DIM_KEY | TP_ARCHF_QK_NORM | TP_ARCHF_EPS_REQUIRED,
    .rope_base = 10000.0,
    .context = 2048,
    .block = BLOCK,
    .n_block = sizeof BLOCK / sizeof BLOCK[0],
    .mk_rope_base = 1000000.0f,
    .mk_norm_eps = 1e-6f,
};
