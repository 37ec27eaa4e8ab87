/* qwen35moe: Qwen 3.5 mixture-of-experts models, Qwen3.5-35B-A3B and kin
 * (llama.cpp's src/models/qwen35moe.cpp; LLM_ARCH_QWEN35MOE in
 * llama-model.cpp). qwen35's hybrid layers (model/arch_qwen35.c: Gated
 * DeltaNet, every full_attention_interval-th a gated full attention),
 * each with a mixture of experts for its FFN, as qwen3moe's (the router
 * ffn_gate_inp [dim, n_expert], ffn_{gate,up,down}_exps; softmax gating,
 * the top expert_used_count renormalised: build_moe_ffn's norm_w is
 * true for this architecture) plus a shared expert every token takes:
 * ffn_{gate,up}_shexp [dim, shexp_ff], ffn_down_shexp [shexp_ff, dim] and
 * its gate ffn_gate_inp_shexp [dim]; the FFN is
 *
 *   routed(x) + sigmoid(x . gate_inp_shexp) * down(silu(gate x) * up x)
 *
 * (workers/forward/moe.h). expert_count and expert_used_count must be
 * given; expert_feed_forward_length defaults to feed_forward_length /
 * expert_used_count, expert_shared_feed_forward_length to
 * feed_forward_length. */
#include "arch.h"

static const tp_arch_tensor BLOCK[] = {
    TP_AT_VEC("attn_norm.weight", TP_SZ_EMBD, rms_att, 0),
    TP_AT_MAT("attn_q.weight", TP_SZ_EMBD, TP_SZ_Q2, wq, TP_AT_FULL_ATTN),
    TP_AT_MAT("attn_k.weight", TP_SZ_EMBD, TP_SZ_KV, wk, TP_AT_FULL_ATTN),
    TP_AT_MAT("attn_v.weight", TP_SZ_EMBD, TP_SZ_KV, wv, TP_AT_FULL_ATTN),
    TP_AT_MAT("attn_output.weight", TP_SZ_Q, TP_SZ_EMBD, wo, TP_AT_FULL_ATTN),
    TP_AT_VEC("attn_q_norm.weight", TP_SZ_HEAD, q_norm, TP_AT_FULL_ATTN),
    TP_AT_VEC("attn_k_norm.weight", TP_SZ_HEAD, k_norm, TP_AT_FULL_ATTN),
    TP_AT_MAT("attn_qkv.weight", TP_SZ_EMBD, TP_SZ_SSM_CONV, wqkv_lin, TP_AT_RECURRENT),
    TP_AT_MAT("attn_gate.weight", TP_SZ_EMBD, TP_SZ_SSM_V, wz, TP_AT_RECURRENT),
    /* F32 [conv_kernel, conv_dim]: a row of kernel weights per channel */
    {"ssm_conv1d.weight", TP_SZ_SSM_K, TP_SZ_SSM_CONV, TP_AT_RECURRENT, offsetof(tp_layer_weights, ssm_conv1d), 0,
     0, {{0, 0, 0}}},
    TP_AT_VEC("ssm_dt.bias", TP_SZ_SSM_VH, ssm_dt, TP_AT_RECURRENT),
    TP_AT_VEC("ssm_a", TP_SZ_SSM_VH, ssm_a, TP_AT_RECURRENT),
    TP_AT_MAT("ssm_beta.weight", TP_SZ_EMBD, TP_SZ_SSM_VH, wbeta, TP_AT_RECURRENT),
    TP_AT_MAT("ssm_alpha.weight", TP_SZ_EMBD, TP_SZ_SSM_VH, walpha, TP_AT_RECURRENT),
    TP_AT_VEC("ssm_norm.weight", TP_SZ_SSM_HEAD, ssm_norm, TP_AT_RECURRENT),
    TP_AT_MAT("ssm_out.weight", TP_SZ_SSM_V, TP_SZ_EMBD, wssm_out, TP_AT_RECURRENT),
    TP_AT_VEC("post_attention_norm.weight", TP_SZ_EMBD, rms_ffn, 0),
    TP_AT_MAT("ffn_gate_inp.weight", TP_SZ_EMBD, TP_SZ_EXPERTS, wr, TP_AT_MOE),
    TP_AT_EXPS("ffn_gate_exps.weight", TP_SZ_EMBD, TP_SZ_FF_EXP, w1_exps),
    TP_AT_EXPS("ffn_down_exps.weight", TP_SZ_FF_EXP, TP_SZ_EMBD, w2_exps),
    TP_AT_EXPS("ffn_up_exps.weight", TP_SZ_EMBD, TP_SZ_FF_EXP, w3_exps),
    TP_AT_VEC("ffn_gate_inp_shexp.weight", TP_SZ_EMBD, shexp_gate, TP_AT_MOE),
    TP_AT_MAT("ffn_gate_shexp.weight", TP_SZ_EMBD, TP_SZ_FF_SHEXP, w1_shexp, TP_AT_MOE),
    TP_AT_MAT("ffn_down_shexp.weight", TP_SZ_FF_SHEXP, TP_SZ_EMBD, w2_shexp, TP_AT_MOE),
    TP_AT_MAT("ffn_up_shexp.weight", TP_SZ_EMBD, TP_SZ_FF_SHEXP, w3_shexp, TP_AT_MOE),
};

const tp_arch tp_arch_qwen35moe = {
    .name = "qwen35moe",
    .id = TP_ARCH_QWEN35MOE,
    .rope = TP_ROPE_NEOX,
    .flags = TP_ARCHF_HEAD_DIM_KEY | TP_ARCHF_QK_NORM | TP_ARCHF_EPS_REQUIRED | TP_ARCHF_HYBRID |
             TP_ARCHF_ATTN_GATE | TP_ARCHF_ROPE_DIM | TP_ARCHF_MOE | TP_ARCHF_EXPERT_FF_KEY | TP_ARCHF_SHEXP,
    .rope_base = 10000.0,
    .context = 2048,
    .block = BLOCK,
    .n_block = sizeof BLOCK / sizeof BLOCK[0],
    .mk_rope_base = 10000000.0f,
    .mk_norm_eps = 1e-6f,
    .mk_rope_quarters = 1,
    .mk_experts = 8,
    .mk_experts_used = 2,
};
