/* qwen35: Qwen 3.5 dense models, 0.8B to 27B (llama.cpp's
 * src/models/qwen35.cpp; LLM_ARCH_QWEN35 in llama-model.cpp). A hybrid:
 * layer l is a Gated DeltaNet layer unless (l + 1) % full_attention_interval
 * == 0 (default 4: three of every four), the others a gated full
 * attention. Every block: x += mixer(RMSNorm(x, attn_norm)); x +=
 * FFN(RMSNorm(x, post_attention_norm)) with a SwiGLU FFN.
 *
 * Full attention: attn_q gives per head its query and its gate (2 *
 * head_size * heads rows, interleaved head by head), Q and K heads
 * RMS-normed (attn_q_norm / attn_k_norm), RoPE NEOX-style on the first
 * rope.dimension_count elements of each head (llama.cpp's IMROPE: with a
 * text's positions equal in every section it is NEOX over n_rot), the
 * attention's output times sigmoid(gate), then attn_output.
 *
 * Gated DeltaNet (workers/forward/deltanet.h has the recurrence):
 * attn_qkv [dim, conv_dim] mixes q, k, v (key_dim, key_dim, value_dim;
 * key_dim = ssm.state_size * ssm.group_count, value_dim = state_size *
 * ssm.time_step_rank = ssm.inner_size), a causal depthwise conv1d
 * (ssm_conv1d [conv_kernel, conv_dim]) and SiLU over them, attn_gate
 * [dim, value_dim] the output norm's gate z, ssm_beta / ssm_alpha [dim,
 * v_heads], ssm_dt.bias and ssm_a (-exp(A_log), as the converter stores
 * it) [v_heads], ssm_norm [state_size], ssm_out [value_dim, dim]. The
 * epsilon has no default. */
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
    TP_AT_MAT("ffn_gate.weight", TP_SZ_EMBD, TP_SZ_FF, w1, 0),
    TP_AT_MAT("ffn_down.weight", TP_SZ_FF, TP_SZ_EMBD, w2, 0),
    TP_AT_MAT("ffn_up.weight", TP_SZ_EMBD, TP_SZ_FF, w3, 0),
};

const tp_arch tp_arch_qwen35 = {
    .name = "qwen35",
    .id = TP_ARCH_QWEN35,
    .rope = TP_ROPE_NEOX,
    .flags = TP_ARCHF_HEAD_DIM_KEY | TP_ARCHF_QK_NORM | TP_ARCHF_EPS_REQUIRED | TP_ARCHF_HYBRID |
             TP_ARCHF_ATTN_GATE | TP_ARCHF_ROPE_DIM,
    .rope_base = 10000.0,
    .context = 2048,
    .block = BLOCK,
    .n_block = sizeof BLOCK / sizeof BLOCK[0],
    .mk_rope_base = 10000000.0f,
    .mk_norm_eps = 1e-6f,
    .mk_rope_quarters = 1, /* 64 of 256 */
};
