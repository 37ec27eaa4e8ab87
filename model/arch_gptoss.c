/* gpt-oss: OpenAI's gpt-oss-20b and gpt-oss-120b (llama.cpp's
 * src/models/openai-moe-iswa.cpp; LLM_ARCH_OPENAI_MOE, GGUF name
 * "gpt-oss"). Per block: RMSNorm, attention with biases on Q, K, V and
 * the output (blk.N.attn_{q,k,v,output}.bias), NEOX RoPE with YaRN
 * scaling (rope.scaling.type yarn: model.c), scores times 1 / sqrt(head
 * size) (attention.key_length: 64, where dim / heads is 45), and a
 * learned sink per head (blk.N.attn_sinks.weight [n_heads]) that joins
 * the softmax's denominator (forward.c); every other layer slides (l % 2
 * == 0, the window attention.sliding_window, 128). Then the pre-FFN norm,
 * which the converter names post_attention_norm, and experts only: a
 * router with a bias, its top expert_used_count logits softmaxed
 * (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT), each expert's gate and
 * up with biases through swiglu_oai, its down with a bias
 * (workers/forward/moe.c). llama.cpp requires the epsilon, the expert
 * width (expert_feed_forward_length) and the window. */
#include "arch.h"

static const tp_arch_tensor BLOCK[] = {
    TP_AT_VEC("attn_norm.weight", TP_SZ_EMBD, rms_att, 0),
    TP_AT_MAT("attn_q.weight", TP_SZ_EMBD, TP_SZ_Q, wq, 0),
    TP_AT_VEC("attn_q.bias", TP_SZ_Q, bq, 0),
    TP_AT_MAT("attn_k.weight", TP_SZ_EMBD, TP_SZ_KV, wk, 0),
    TP_AT_VEC("attn_k.bias", TP_SZ_KV, bk, 0),
    TP_AT_MAT("attn_v.weight", TP_SZ_EMBD, TP_SZ_KV, wv, 0),
    TP_AT_VEC("attn_v.bias", TP_SZ_KV, bv, 0),
    TP_AT_MAT("attn_output.weight", TP_SZ_Q, TP_SZ_EMBD, wo, 0),
    TP_AT_VEC("attn_output.bias", TP_SZ_EMBD, bo, 0),
    TP_AT_VEC("attn_sinks.weight", TP_SZ_HEADS, sinks, 0),
    TP_AT_VEC("post_attention_norm.weight", TP_SZ_EMBD, rms_ffn, 0),
    TP_AT_MAT("ffn_gate_inp.weight", TP_SZ_EMBD, TP_SZ_EXPERTS, wr, TP_AT_MOE),
    TP_AT_VEC("ffn_gate_inp.bias", TP_SZ_EXPERTS, br, TP_AT_MOE),
    TP_AT_EXPS("ffn_gate_exps.weight", TP_SZ_EMBD, TP_SZ_FF_EXP, w1_exps),
    TP_AT_F32_2D("ffn_gate_exps.bias", TP_SZ_FF_EXP, TP_SZ_EXPERTS, b1_exps, TP_AT_MOE),
    TP_AT_EXPS("ffn_down_exps.weight", TP_SZ_FF_EXP, TP_SZ_EMBD, w2_exps),
    TP_AT_F32_2D("ffn_down_exps.bias", TP_SZ_EMBD, TP_SZ_EXPERTS, b2_exps, TP_AT_MOE),
    TP_AT_EXPS("ffn_up_exps.weight", TP_SZ_EMBD, TP_SZ_FF_EXP, w3_exps),
    TP_AT_F32_2D("ffn_up_exps.bias", TP_SZ_FF_EXP, TP_SZ_EXPERTS, b3_exps, TP_AT_MOE),
};

const tp_arch tp_arch_gptoss = {
    .name = "gpt-oss",
    .id = TP_ARCH_GPTOSS,
    .rope = TP_ROPE_NEOX,
    .flags = TP_ARCHF_HEAD_DIM_KEY | TP_ARCHF_EPS_REQUIRED | TP_ARCHF_MOE | TP_ARCHF_EXPERT_FF_KEY |
             TP_ARCHF_OAI_MOE,
    .rope_base = 10000.0,
    .context = 2048,
    .swa_pattern = 2,
    .swa_window = 128,
    .swa_rope_base = 0.0,
    .block = BLOCK,
    .n_block = sizeof BLOCK / sizeof BLOCK[0],
    .mk_rope_base = 150000.0f,
    .mk_norm_eps = 1e-5f,
    .mk_sliding_window = 128,
    .mk_experts = 8,
    .mk_experts_used = 4,
    .mk_yarn_factor = 32.0f,
    .mk_yarn_orig_ctx = 4096,
    .mk_output = true,
};
