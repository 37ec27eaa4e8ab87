/* qwen3moe: Qwen3 mixture-of-experts models, Qwen3-30B-A3B and kin
 * (llama.cpp's src/models/qwen3moe.cpp; LLM_ARCH_QWEN3MOE in
 * llama-model.cpp). qwen3's attention (per-head Q/K RMSNorm, NEOX RoPE,
 * head size from attention.key_length, the epsilon required) and, for
 * the FFN, experts only: the router blk.N.ffn_gate_inp [dim, n_expert]
 * and blk.N.ffn_{gate,up,down}_exps [dim, expert_ff, n_expert] (down:
 * [expert_ff, dim, n_expert]). expert_count and expert_used_count must be
 * given (> 0); one expert's width is expert_feed_forward_length, default
 * feed_forward_length / expert_used_count. llama.cpp's build_moe_ffn with
 * softmax gating and the top-k weights renormalised (norm_w): the
 * forward's workers/forward/moe.c. */
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
    TP_AT_MAT("ffn_gate_inp.weight", TP_SZ_EMBD, TP_SZ_EXPERTS, wr, TP_AT_MOE),
    TP_AT_EXPS("ffn_gate_exps.weight", TP_SZ_EMBD, TP_SZ_FF_EXP, w1_exps),
    TP_AT_EXPS("ffn_down_exps.weight", TP_SZ_FF_EXP, TP_SZ_EMBD, w2_exps),
    TP_AT_EXPS("ffn_up_exps.weight", TP_SZ_EMBD, TP_SZ_FF_EXP, w3_exps),
};

const tp_arch tp_arch_qwen3moe = {
    .name = "qwen3moe",
    .id = TP_ARCH_QWEN3MOE,
    .rope = TP_ROPE_NEOX,
    .flags = TP_ARCHF_HEAD_DIM_KEY | TP_ARCHF_QK_NORM | TP_ARCHF_EPS_REQUIRED | TP_ARCHF_MOE |
             TP_ARCHF_EXPERT_FF_KEY,
    .rope_base = 10000.0,
    .context = 2048,
    .block = BLOCK,
    .n_block = sizeof BLOCK / sizeof BLOCK[0],
    .mk_rope_base = 1000000.0f,
    .mk_norm_eps = 1e-6f,
    .mk_experts = 8,
    .mk_experts_used = 2,
};
