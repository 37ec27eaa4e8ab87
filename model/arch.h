/* The GGUF architectures the loader knows, one file each (model/arch_*.c,
 * as llama.cpp's src/models/<arch>.cpp), listed once in model/archs.c.
 *
 * An architecture is data: its name (general.architecture, and the prefix
 * of its {arch}.* keys), the hyper-parameter defaults llama.cpp's
 * load_hparams gives its keys, the tensors of one block with their shapes
 * in the model's sizes (llama.cpp's load_tensors), and the flags the
 * forward reads (RoPE kind, Q/K norms, ...; tp_model_config). Adding one
 * is a new arch_NAME.c and a line in archs.c's table; mkmodel writes a
 * random file of it from the same description.
 *
 * Internal to model/: the loader (model.c) and the writer of random
 * files (synth_gguf.c) read it; nothing above model/ does. */
#ifndef TOKPIPE_MODEL_ARCH_H
#define TOKPIPE_MODEL_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/model.h"

/* A size a tensor's shape is given in, resolved from the config. */
typedef enum tp_arch_size {
    TP_SZ_NONE = 0, /* ne1 of a vector */
    TP_SZ_EMBD,     /* dim: {arch}.embedding_length */
    TP_SZ_Q,        /* q_dim: head_size * n_heads */
    TP_SZ_KV,       /* kv_dim: head_size * n_kv_heads */
    TP_SZ_FF,       /* hidden_dim: {arch}.feed_forward_length */
    TP_SZ_HEAD,     /* head_size */
    TP_SZ_FF_EXP,   /* expert_ff: one expert's hidden width (model.h) */
    TP_SZ_EXPERTS,  /* n_expert: {arch}.expert_count */
    TP_SZ_HEADS,    /* n_heads: {arch}.attention.head_count (gpt-oss's sinks) */
    TP_SZ_Q2,       /* 2 q_dim: a gated query's rows (qwen35) */
    TP_SZ_SSM_CONV, /* conv_dim: 2 key_dim + value_dim of a DeltaNet layer */
    TP_SZ_SSM_V,    /* value_dim: ssm_head_dim * ssm_v_heads */
    TP_SZ_SSM_VH,   /* ssm_v_heads */
    TP_SZ_SSM_HEAD, /* ssm_head_dim */
    TP_SZ_SSM_K,    /* ssm_conv_kernel */
    TP_SZ_FF_SHEXP, /* shexp_ff: the shared expert's hidden width (model.h) */
    TP_SZ_COUNT
} tp_arch_size;

enum {
    TP_AT_MATRIX = 1u << 0,   /* a weight matrix: any type of tp_ggml_matrix_type_ok (else F32) */
    TP_AT_OPTIONAL = 1u << 1, /* llama.cpp's TENSOR_NOT_REQUIRED; mkmodel leaves it out */
    /* a 3-D [ne0, ne1, n_expert] (ne2 TP_SZ_EXPERTS) matrix of experts (llama.cpp's
     * ffn_*_exps): typed is the offsetof a const tp_wmat * field, which
     * the loader points at n_expert views of [ne1][ne0], one an expert */
    TP_AT_EXPERTS = 1u << 2,
    TP_AT_DENSE = 1u << 3, /* only in a model without experts (expert_count 0) */
    TP_AT_MOE = 1u << 4,   /* only in a model with experts */
    /* hybrid models (TP_ARCHF_HYBRID): only in a Gated DeltaNet layer /
     * only in a full-attention layer (tp_model_layer_recurrent) */
    TP_AT_RECURRENT = 1u << 5,
    TP_AT_FULL_ATTN = 1u << 6,
};

/* Rows of a fused matrix that one field views (phi3's attn_qkv: wq, wk,
 * wv; its ffn_up: gate then up). */
typedef struct tp_arch_part {
    uint8_t rows; /* tp_arch_size */
    size_t f32, typed;
} tp_arch_part;

#define TP_AT_MAX_PARTS 3

/* One tensor of block N, "blk.N.<name>", GGUF shape [ne0, ne1] (ne0 the
 * width of a row). f32 / typed: offsetof the tp_layer_weights fields it
 * fills (typed: its tp_wmat; matrices only). A fused matrix (n_parts > 0)
 * has as many rows as its parts together and fills each part's fields
 * with a view of its rows, in order. */
typedef struct tp_arch_tensor {
    const char *name;
    uint8_t ne0, ne1; /* tp_arch_size */
    uint8_t flags;    /* TP_AT_* */
    size_t f32, typed;
    uint8_t n_parts;
    tp_arch_part parts[TP_AT_MAX_PARTS];
} tp_arch_tensor;

#define TP_AT_MAT(nm, a, b, field, fl)                                                                  \
    { nm, a, b, TP_AT_MATRIX | (fl), offsetof(tp_layer_weights, field), offsetof(tp_layer_weights, m.field), \
      0, {{0, 0, 0}} }
#define TP_AT_VEC(nm, a, field, fl) { nm, a, TP_SZ_NONE, fl, offsetof(tp_layer_weights, field), 0, 0, {{0, 0, 0}} }
/* An F32 tensor [ne1][ne0] that is not a weight matrix (gpt-oss's expert
 * biases, [n_expert][width]). */
#define TP_AT_F32_2D(nm, a, b, field, fl) { nm, a, b, fl, offsetof(tp_layer_weights, field), 0, 0, {{0, 0, 0}} }
#define TP_AT_PART(r, field) { r, offsetof(tp_layer_weights, field), offsetof(tp_layer_weights, m.field) }
#define TP_AT_FUSED2(nm, a, r0, f0, r1, f1)                                                              \
    { nm, a, TP_SZ_NONE, TP_AT_MATRIX, 0, 0, 2, {TP_AT_PART(r0, f0), TP_AT_PART(r1, f1)} }
#define TP_AT_FUSED3(nm, a, r0, f0, r1, f1, r2, f2)                                                      \
    { nm, a, TP_SZ_NONE, TP_AT_MATRIX, 0, 0, 3, {TP_AT_PART(r0, f0), TP_AT_PART(r1, f1), TP_AT_PART(r2, f2)} }

/* The experts of a MoE FFN: the router ffn_gate_inp [dim, n_expert] (a
 * matrix of any type, as llama.cpp reads it) and three 3-D expert
 * tensors, in a model with experts only. */
#define TP_AT_EXPS(nm, a, b, field)                                                                       \
    { nm, a, b, TP_AT_MATRIX | TP_AT_EXPERTS | TP_AT_MOE, 0, offsetof(tp_layer_weights, field), 0, {{0, 0, 0}} }

/* The model's sizes by tp_arch_size (sizes[TP_SZ_NONE] is 0). */
typedef struct tp_arch_sizes {
    int v[TP_SZ_COUNT];
} tp_arch_sizes;

/* (The expert sizes are 0; tp_arch_sizes_moe sets them.) */
tp_arch_sizes tp_arch_sizes_of(int dim, int q_dim, int kv_dim, int hidden_dim, int head_size);
void tp_arch_sizes_moe(tp_arch_sizes *z, int n_expert, int expert_ff);
/* (TP_SZ_HEADS is 0 too; this sets it.) */
void tp_arch_sizes_heads(tp_arch_sizes *z, int n_heads);

/* The shared expert's width (0 without one). */
void tp_arch_sizes_shexp(tp_arch_sizes *z, int shexp_ff);

/* The sizes of a hybrid model's DeltaNet layers (model.h). */
void tp_arch_sizes_ssm(tp_arch_sizes *z, const tp_model_config *c);

/* Whether block entry t is in a model with (moe) or without experts, in
 * a Gated DeltaNet layer (recurrent) or not. */
bool tp_arch_tensor_in(const tp_arch_tensor *t, bool moe, bool recurrent);

/* The shape of t in those sizes: ne1 0 for a vector; a fused matrix's ne1
 * is its parts' rows together. */
void tp_arch_shape(const tp_arch_tensor *t, const tp_arch_sizes *z, int *ne0, int *ne1);
/* ne2 of t: n_expert for a 3-D expert tensor, else 0. */
int tp_arch_ne2(const tp_arch_tensor *t, const tp_arch_sizes *z);

enum {
    /* head_size from {arch}.attention.key_length (default dim / n_heads),
     * which may differ from dim / n_heads; without it a key_length other
     * than dim / n_heads is refused */
    TP_ARCHF_HEAD_DIM_KEY = 1u << 0,
    /* blk.N.attn_q_norm / attn_k_norm: RMSNorm of each Q and K head */
    TP_ARCHF_QK_NORM = 1u << 1,
    /* {arch}.attention.layer_norm_rms_epsilon must be given (llama.cpp's
     * get_key without a default) */
    TP_ARCHF_EPS_REQUIRED = 1u << 2,
    /* Gemma: token embeddings times sqrt(dim) (llama.cpp's inp_scaled) */
    TP_ARCHF_EMBD_SCALE = 1u << 3,
    /* blk.N.post_attention_norm / post_ffw_norm: RMSNorm of the attention's
     * and the FFN's output before each residual add */
    TP_ARCHF_POST_NORMS = 1u << 4,
    /* the FFN's gate through GELU (tanh approximation), not SiLU
     * (LLM_FFN_GELU, LLM_FFN_PAR) */
    TP_ARCHF_GELU = 1u << 5,
    /* Q times llama.cpp's f_attention_scale before the scores: 1 /
     * sqrt(head_size), or 1 / sqrt(dim / heads) for the kind's largest
     * model (big_layers) */
    TP_ARCHF_Q_SCALE = 1u << 6,
    /* {arch}.attn_logit_softcapping: scores become c * tanh(score / c) */
    TP_ARCHF_ATTN_SOFTCAP = 1u << 7,
    /* {arch}.final_logit_softcapping: logits become c * tanh(logit / c) */
    TP_ARCHF_FINAL_SOFTCAP = 1u << 8,
    /* experts required ({arch}.expert_count > 0, expert_used_count > 0):
     * llama.cpp's "n_expert must be > 0" */
    TP_ARCHF_MOE = 1u << 9,
    /* one expert's width is {arch}.expert_feed_forward_length, default
     * feed_forward_length / expert_used_count (llama.cpp's n_ff_exp);
     * without the flag it is feed_forward_length (llama's Mixtral) */
    TP_ARCHF_EXPERT_FF_KEY = 1u << 10,
    /* Gated DeltaNet layers beside full-attention ones (qwen35): the
     * {arch}.ssm.* keys (conv_kernel, inner_size, state_size,
     * time_step_rank, group_count) required, full_attention_interval
     * (default 4) */
    TP_ARCHF_HYBRID = 1u << 11,
    /* wq gives each head's query and its output gate (model.h attn_gate) */
    TP_ARCHF_ATTN_GATE = 1u << 12,
    /* rope.dimension_count may be less than the head size (partial RoPE) */
    TP_ARCHF_ROPE_DIM = 1u << 13,
    /* a shared expert beside the routed ones (qwen35moe): its width
     * {arch}.expert_shared_feed_forward_length, default
     * feed_forward_length (llama.cpp's n_ff_shexp) */
    TP_ARCHF_SHEXP = 1u << 14,
    /* gpt-oss's experts: swiglu_oai (TP_FFN_SWIGLU_OAI) and the softmax
     * over the top k router logits (tp_model_config.moe_softmax_topk) */
    TP_ARCHF_OAI_MOE = 1u << 15,
    /* LongRoPE: the optional rope_factors_long / rope_factors_short.weight
     * and rope.scaling.attn_factor (phi3; model.h rope_orig_ctx) */
    TP_ARCHF_LONGROPE = 1u << 16,
};

typedef struct tp_arch {
    const char *name;    /* general.architecture, the {arch}. key prefix */
    tp_model_arch id;
    tp_rope_style rope;  /* llama.cpp's llama_model_rope_type for it */
    unsigned flags;      /* TP_ARCHF_* */
    /* defaults of keys a file may leave out */
    double norm_eps;     /* attention.layer_norm_rms_epsilon */
    double rope_base;    /* rope.freq_base */
    int context;         /* context_length */
    /* sliding-window attention (llama.cpp's LLAMA_SWA_TYPE_STANDARD and
     * set_swa_pattern): with a window, layer l slides when swa_pattern &&
     * l % swa_pattern < swa_pattern - 1. swa_window: attention.sliding_window's
     * default; 0: the key may be absent, and then no layer slides (gemma3) */
    int swa_pattern, swa_window;
    double swa_rope_base; /* sliding layers' RoPE base, unscaled (gemma3's
                           * 10000); 0: the global base and scaling */
    double attn_softcap, final_softcap; /* the softcapping keys' defaults */
    int big_layers;       /* TP_ARCHF_Q_SCALE: block_count of the 27B */
    const tp_arch_tensor *block; /* the tensors of one block */
    int n_block;
    /* mkmodel: what a typical model of the kind writes (Meta's / Qwen's
     * published configs), for random files */
    float mk_rope_base, mk_norm_eps;
    int mk_sliding_window;
    int mk_experts, mk_experts_used; /* mkmodel's defaults for a MoE kind (0: dense) */
    float mk_yarn_factor;  /* > 0: mkmodel writes rope.scaling.type yarn with this factor */
    int mk_yarn_orig_ctx;  /* and rope.scaling.original_context_length */
    bool mk_output;        /* mkmodel always writes output.weight (llama.cpp requires it) */
    int mk_rope_quarters;  /* TP_ARCHF_ROPE_DIM: mkmodel turns this many quarters of a head (0: all) */
} tp_arch;

/* The table (model/archs.c), in the order "supported: ..." lists them. */
extern const tp_arch *const tp_archs[];
extern const int tp_n_archs;

/* The architecture named name[0..len), or NULL. */
const tp_arch *tp_arch_find(const char *name, size_t len);

/* Its names for refusals and --help: tp_model_arch_names (model.h). */

#endif
