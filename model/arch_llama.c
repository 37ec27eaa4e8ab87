/* llama: Llama 1-3 and llama2.c's GGUF exports (llama.cpp's
 * src/models/llama.cpp; LLM_ARCH_LLAMA in llama-model.cpp). Q/K rows come
 * permuted by the converter so adjacent pairs rotate (rope type NORM);
 * Q/K/V biases are optional; Llama 3's RoPE scaling (rope_freqs.weight or
 * rope.scaling.* keys) the loader reads for every architecture. With
 * llama.expert_count > 0 (Mixtral) the FFN is a mixture of experts, as
 * llama.cpp's llama.cpp builds it: the router blk.N.ffn_gate_inp and
 * 3-D blk.N.ffn_{gate,up,down}_exps of feed_forward_length each, softmax
 * gating with the top expert_used_count weights renormalised (the path
 * of qwen3moe); the dense ffn_gate/ffn_up/ffn_down are then absent. */
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
    TP_AT_MAT("ffn_gate.weight", TP_SZ_EMBD, TP_SZ_FF, w1, TP_AT_DENSE),
    TP_AT_MAT("ffn_down.weight", TP_SZ_FF, TP_SZ_EMBD, w2, TP_AT_DENSE),
    TP_AT_MAT("ffn_up.weight", TP_SZ_EMBD, TP_SZ_FF, w3, TP_AT_DENSE),
    TP_AT_MAT("ffn_gate_inp.weight", TP_SZ_EMBD, TP_SZ_EXPERTS, wr, TP_AT_MOE),
    TP_AT_EXPS("ffn_gate_exps.weight", TP_SZ_EMBD, TP_SZ_FF_EXP, w1_exps),
    TP_AT_EXPS("ffn_down_exps.weight", TP_SZ_FF_EXP, TP_SZ_EMBD, w2_exps),
    TP_AT_EXPS("ffn_up_exps.weight", TP_SZ_EMBD, TP_SZ_FF_EXP, w3_exps),
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
