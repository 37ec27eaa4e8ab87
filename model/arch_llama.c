/* llama: Llama 1-3 and llama2.c's GGUF exports (llama.cpp's
 * src/models/llama.cpp; LLM_ARCH_LLAMA in llama-model.cpp). Q/K rows come
 * permuted by the converter so adjacent pairs rotate (rope type NORM);
 * Q/K/V biases are optional; Llama 3's RoPE scaling (rope_freqs.weight or
 * rope.scaling.* keys) the loader reads for every architecture. */
#include "arch.h"

static const tp_arch_tensor BLOCK[] = {
    TP_AT_VEC("attn_norm.weight", TP_SZ_EMBD, rms_att, 0),
    TP_AT_MAT("attn_q.weight", TP_SZ_EMBD, TP_SZ_Q, wq, 0),
    TP_AT_MAT("attn_k.weight", TP_SZ_EMBD, TP_SZ_KV, wk, 0),
    TP_AT_MAT("attn_v.weight", TP_SZ_EMBD, TP_SZ_KV, wv, 0),
    TP_AT_VEC("attn_q.bias", TP_SZ_Q, bq, TP_AT_OPTIONAL),
    TP_AT_VEC("attn_k.bias", TP_SZ_KV, bk, TP_AT_OPTIONAL),
    TP_AT_VEC("attn_v.bias", TP_SZ_KV, bv, TP_AT_OPTIONAL),
    TP_AT_MAT("attn_output.weight", TP_SZ_Q, TP_SZ_EMBD, wo, 0),
    TP_AT_VEC("ffn_norm.weight", TP_SZ_EMBD, rms_ffn, 0),
    TP_AT_MAT("ffn_gate.weight", TP_SZ_EMBD, TP_SZ_FF, w1, 0),
    TP_AT_MAT("ffn_down.weight", TP_SZ_FF, TP_SZ_EMBD, w2, 0),
    TP_AT_MAT("ffn_up.weight", TP_SZ_EMBD, TP_SZ_FF, w3, 0),
};

const tp_arch tp_arch_llama = {
    .name = "llama",
    .id = TP_ARCH_LLAMA,
    .rope = TP_ROPE_ADJACENT,
    .norm_eps = 1e-5,
    .rope_base = 10000.0,
    .context = 2048,
    .block = BLOCK,
    .n_block = sizeof BLOCK / sizeof BLOCK[0],
    .mk_rope_base = 10000.0f,
    .mk_norm_eps = 1e-5f,
};
