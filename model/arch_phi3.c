/* phi3: Phi-3 / Phi-3.5 / Phi-4 dense models (llama.cpp's src/models/phi3.cpp;
 * LLM_ARCH_PHI3 in llama-model.cpp). llama's computation with two fused
 * matrices as the converter writes them: blk.N.attn_qkv [dim, q_dim + 2
 * kv_dim] (Q rows, then K, then V) and blk.N.ffn_up [dim, 2 hidden] (the
 * gate's rows, then the up projection's: llama.cpp's LLM_FFN_SWIGLU
 * silu(first half) * second half). NEOX RoPE, no biases, the epsilon
 * required. llama.cpp turns Phi's sliding window off (it reads
 * attention.sliding_window and sets no window), so the key is left to be
 * ignored. Phi-3.5-mini and Phi-4-mini carry LongRoPE (rope_factors_long /
 * _short.weight, rope.scaling.attn_factor: model.h rope_orig_ctx), and
 * Phi-4-mini turns 96 of a head's 128 (rope.dimension_count). */
#include "arch.h"

static const tp_arch_tensor BLOCK[] = {
    TP_AT_VEC("attn_norm.weight", TP_SZ_EMBD, rms_att, 0),
    TP_AT_FUSED3("attn_qkv.weight", TP_SZ_EMBD, TP_SZ_Q, wq, TP_SZ_KV, wk, TP_SZ_KV, wv),
    TP_AT_MAT("attn_output.weight", TP_SZ_Q, TP_SZ_EMBD, wo, 0),
    TP_AT_VEC("ffn_norm.weight", TP_SZ_EMBD, rms_ffn, 0),
    TP_AT_MAT("ffn_down.weight", TP_SZ_FF, TP_SZ_EMBD, w2, 0),
    TP_AT_FUSED2("ffn_up.weight", TP_SZ_EMBD, TP_SZ_FF, w1, TP_SZ_FF, w3),
};

const tp_arch tp_arch_phi3 = {
    .name = "phi3",
    .id = TP_ARCH_PHI3,
    .rope = TP_ROPE_NEOX,
    .flags = TP_ARCHF_EPS_REQUIRED | TP_ARCHF_ROPE_DIM | TP_ARCHF_LONGROPE,
    .rope_base = 10000.0,
    .context = 2048,
    .block = BLOCK,
    .n_block = sizeof BLOCK / sizeof BLOCK[0],
    .mk_rope_base = 10000.0f,
    .mk_norm_eps = 1e-5f,
};
