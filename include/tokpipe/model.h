/* Decoder model weights: llama2.c checkpoints and GGUF v3 files of the
 * `llama` (Llama 1-3, incl. Llama 3's RoPE scaling, and Mixtral's experts),
 * `qwen2`, `qwen3`, `phi3`, `qwen3moe`, `gemma2`, `gemma3`, `qwen35`, `qwen35moe` and `gpt-oss` architectures (model/arch_*.c, one file each; model/archs.c lists them).
 *
 * A tp_model is the validated, read-only view of one weights file: its
 * shape (tp_model_config), pointers to every weight tensor (into an mmap of
 * the file, never copied), the end-of-sequence ids, an identity string and,
 * for GGUF, the embedded vocabulary. Read-only after load: one model may be
 * shared by any number of tp_forward instances and threads.
 *
 * Every header field, count, string length, tensor offset, size and shape is
 * checked against the file size with overflow-safe arithmetic; a bad file
 * gives TP_EFORMAT (or TP_EIO) with a message naming the field. */
#ifndef TOKPIPE_MODEL_H
#define TOKPIPE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/tokenizer.h"

typedef struct tp_model tp_model;

typedef enum tp_model_format {
    TP_MODEL_LLAMA2C = 1, /* karpathy/llama2.c legacy (version 0) checkpoint */
    TP_MODEL_GGUF = 2,    /* GGUF v3, an architecture of model/archs.c; F32, F16,
                           * BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4 */
} tp_model_format;

typedef enum tp_model_arch {
    TP_ARCH_LLAMA = 1, /* llama2.c checkpoints and GGUF "llama" */
    TP_ARCH_QWEN2 = 2, /* GGUF "qwen2": Q/K/V biases, NEOX RoPE */
    TP_ARCH_QWEN3 = 3, /* GGUF "qwen3": Q/K RMSNorm per head, NEOX RoPE, head_size from key_length */
    TP_ARCH_PHI3 = 4,  /* GGUF "phi3": fused attn_qkv and gate/up ffn_up, NEOX RoPE */
    TP_ARCH_GEMMA3 = 5, /* GGUF "gemma3": scaled embeddings, post-norms, GELU, Q/K norms, sliding windows */
    TP_ARCH_GEMMA2 = 6, /* GGUF "gemma2": gemma3 without Q/K norms, with soft-capping */
    TP_ARCH_QWEN3MOE = 7, /* GGUF "qwen3moe": qwen3's attention, a mixture of experts FFN */
    TP_ARCH_QWEN35 = 8, /* GGUF "qwen35": Gated DeltaNet layers, every full_attn_interval-th a gated attention */
    TP_ARCH_QWEN35MOE = 9, /* GGUF "qwen35moe": qwen35's layers, experts and a gated shared expert for the FFN */
    TP_ARCH_GPTOSS = 10,  /* GGUF "gpt-oss": sinks, biases, alternating windows, YaRN, experts */
} tp_model_arch;

/* The FFN's gate activation: SwiGLU's SiLU or GELU (tanh approximation). */
typedef enum tp_ffn_act {
    TP_FFN_SILU = 0,
    TP_FFN_GELU_TANH = 1,
    /* gpt-oss (ggml's swiglu_oai): g = min(g, 7), u = clamp(u, -7, 7),
     * out = g / (1 + e^(-1.702 g)) * (u + 1) */
    TP_FFN_SWIGLU_OAI = 2,
} tp_ffn_act;

/* Which elements of a head RoPE rotates together (llama.cpp's rope types).
 * ADJACENT: (2i, 2i+1), llama.cpp LLAMA_ROPE_TYPE_NORM, as llama2.c and
 * GGUF llama files (their converter permutes Q/K rows for it). NEOX:
 * (i, i + head_size/2), LLAMA_ROPE_TYPE_NEOX, as qwen2. Pair i turns by
 * pos * rope_theta^(-2i/head_size) / rope_freqs[i] in both. */
typedef enum tp_rope_style {
    TP_ROPE_ADJACENT = 0,
    TP_ROPE_NEOX = 1,
} tp_rope_style;

typedef struct tp_model_config {
    int dim;          /* model width */
    int hidden_dim;   /* SwiGLU FFN width */
    int n_layers;
    int n_heads;
    int n_kv_heads;   /* < n_heads: grouped-query attention */
    int vocab_size;
    int seq_len;      /* maximum context the model was built for */
    int head_size;    /* dim / n_heads, or {arch}.attention.key_length (qwen3) */
    int q_dim;        /* head_size * n_heads: wq's rows, wo's columns (== dim
                       * unless key_length says otherwise) */
    int kv_dim;       /* head_size * n_kv_heads */
    float norm_eps;   /* RMSNorm epsilon (1e-5 for llama2.c) */
    float rope_theta; /* RoPE base (10000 for llama2.c) */
    bool shared_classifier; /* output weights = token embedding */
    tp_model_arch arch;
    tp_rope_style rope_style;
    bool attn_bias;   /* bq/bk/bv present (qwen2) */
    bool qk_norm;     /* q_norm/k_norm: RMSNorm of each Q and K head before RoPE (qwen3) */
    /* Gemma (model/arch_gemma3.c, arch_gemma2.c); zero for the others */
    bool embd_scale;  /* token embeddings times sqrtf(dim) */
    bool post_norms;  /* rms_att_post / rms_ffn_post: RMSNorm of the attention's and
                       * the FFN's output before each residual add */
    tp_ffn_act ffn_act;
    float attn_scale; /* Q times this before the scores (llama.cpp's f_attention_scale);
                       * 0: scores divided by sqrt(head_size) */
    float attn_softcap, final_softcap; /* 0, or a score / a logit s becomes c * tanh(s / c) */
    int swa_window;   /* 0, or a sliding layer's query at p sees keys p - swa_window + 1 .. p */
    int swa_pattern;  /* layer l slides when l % swa_pattern < swa_pattern - 1 */
    float rope_theta_swa;  /* sliding layers' RoPE base */
    bool rope_swa_scaled;  /* rope_freqs also slow the sliding layers' pairs (not gemma3's) */
    /* A mixture of experts FFN (qwen3moe; llama with llama.expert_count,
     * Mixtral) when n_expert > 0: each token's FFN is the weighted sum of
     * n_expert_used of n_expert SwiGLU experts of width expert_ff (the
     * router's softmax, its top n_expert_used renormalised to sum 1:
     * workers/forward/moe.h); hidden_dim is then unused. */
    int n_expert;       /* {arch}.expert_count, 0: a dense FFN */
    int n_expert_used;  /* {arch}.expert_used_count */
    int expert_ff;      /* one expert's hidden width */
    /* gpt-oss: the top n_expert_used router logits first, then a softmax
     * over those alone (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT);
     * false: the softmax over all, the top k renormalised */
    bool moe_softmax_topk;
    /* YaRN RoPE ({arch}.rope.scaling.type yarn; ggml's rope_yarn): with
     * yarn_factor > 0, pair j turns by theta_i (1 - r_j) + theta_e r_j
     * where theta_e = pos * base^(-2j/head_size), theta_i = theta_e /
     * yarn_factor and r_j is ggml's ramp between the correction dims of
     * yarn_beta_fast and yarn_beta_slow rotations in yarn_orig_ctx; cos
     * and sin are scaled by yarn_attn_factor * (1 + 0.1 ln yarn_factor).
     * Every layer but sliding ones that turn unscaled (rope_swa_scaled false). */
    float yarn_factor;
    int yarn_orig_ctx;
    float yarn_beta_fast, yarn_beta_slow, yarn_attn_factor;
    /* qwen35moe's shared expert: a SwiGLU FFN of width shexp_ff every
     * token takes beside its routed experts, its output times
     * sigmoid(x . shexp_gate) added after theirs (moe.h); 0: none */
    int shexp_ff;       /* {arch}.expert_shared_feed_forward_length */
    /* RoPE turns the first rope_dim elements of each head (llama.cpp's
     * n_rot, rope.dimension_count; == head_size but for partial RoPE, as
     * qwen35's 64 of 256), pair frequencies theta^(-2i/rope_dim) */
    int rope_dim;
    /* LongRoPE (Phi-3.5, Phi-4-mini: rope_factors_long / _short.weight):
     * a forward serving more than rope_orig_ctx positions divides each
     * pair's frequency by rope_long's factor, else by rope_short's (as
     * llama.cpp chooses by n_ctx); cos and sin of every layer are scaled
     * by rope_attn_factor ({arch}.rope.scaling.attn_factor, default 1) */
    int rope_orig_ctx;
    float rope_attn_factor;
    /* qwen35's gated attention: wq's rows are, per head, its query then
     * its gate (2 * q_dim rows); the attention's output is multiplied by
     * sigmoid(gate) before wo */
    bool attn_gate;
    /* Hybrid models (qwen35, model/arch_qwen35.c): layer l is a Gated
     * DeltaNet layer (linear attention with a recurrent state per
     * sequence, workers/forward/deltanet.h) unless (l + 1) %
     * full_attn_interval == 0; 0: no DeltaNet layer. */
    int full_attn_interval;
    int ssm_conv_kernel; /* {arch}.ssm.conv_kernel: the causal conv1d's width */
    int ssm_head_dim;    /* {arch}.ssm.state_size: a key / value head's size */
    int ssm_k_heads;     /* {arch}.ssm.group_count: Q / K heads */
    int ssm_v_heads;     /* {arch}.ssm.time_step_rank: V heads (a multiple of the K heads) */
    /* {arch}.pooling_type (llama.cpp's enum llama_pooling_type): how an
     * embedding model pools its hidden states into one vector;
     * TP_POOL_NONE when the file does not say (a generative model) */
    int pooling;
} tp_model_config;

/* Whether layer l of c is a Gated DeltaNet (recurrent) layer. */
bool tp_model_layer_recurrent(const tp_model_config *c, int l);


/* Pooling of hidden states into an embedding (the GGUF's pooling_type
 * numbers; llama.cpp's LLAMA_POOLING_TYPE_*). */
enum { TP_POOL_NONE = 0, TP_POOL_MEAN = 1, TP_POOL_CLS = 2, TP_POOL_LAST = 3 };

/* Whether layer l of c attends through a sliding window (swa_window). */
bool tp_model_layer_slides(const tp_model_config *c, int l);

/* One weight matrix [rows][cols] as the file stores it: ggml type
 * (TP_GGML_* of ggml_types.h: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K), rows of row_bytes each, contiguous, borrowed from the file
 * (the model never copies or converts them; the forward stage packs or
 * repacks the ones its kernels read). cols is a multiple of the type's
 * block. workers/forward/quant.h reads them. */
struct tp_qpanel;
typedef struct tp_wmat {
    uint32_t type;
    int rows, cols;
    size_t row_bytes;
    const void *data;
    /* the forward stage's repacked copy for its AVX-512 kernels
     * (workers/forward/quant.h), NULL until it makes one */
    struct tp_qpanel *panel;
} tp_wmat;

/* Row-major [rows][cols] float weights of one layer, borrowed from the file.
 * The float pointers are NULL for a matrix that is not F32; the typed view
 * (.m) is always filled. Norm vectors are always F32. */
typedef struct tp_layer_weights {
    const float *rms_att; /* [dim] */
    const float *wq;      /* [q_dim][dim] */
    const float *wk;      /* [kv_dim][dim] */
    const float *wv;      /* [kv_dim][dim] */
    const float *wo;      /* [dim][q_dim] */
    const float *rms_ffn; /* [dim] */
    const float *w1;      /* [hidden][dim] (gate) */
    const float *w2;      /* [dim][hidden] (down) */
    const float *w3;      /* [hidden][dim] (up) */
    const float *bq, *bk, *bv; /* [q_dim], [kv_dim], [kv_dim]; NULL without attn_bias */
    const float *q_norm, *k_norm; /* [head_size] each; NULL without qk_norm */
    const float *rms_att_post, *rms_ffn_post; /* [dim] each; NULL without post_norms */
    /* experts (n_expert > 0; else NULL, and w1, w2, w3 are the FFN):
     * the router [n_expert][dim] (wr F32, else NULL; m.wr always), and
     * per expert e its gate w1_exps[e] [expert_ff][dim], down w2_exps[e]
     * [dim][expert_ff], up w3_exps[e] [expert_ff][dim]: views of the
     * file's 3-D blk.N.ffn_{gate,down,up}_exps, arrays owned by the model */
    const float *wr;
    const tp_wmat *w1_exps, *w2_exps, *w3_exps;
    /* gpt-oss; NULL for the others: attention sinks [n_heads] (a learned
     * logit per head that joins each softmax's denominator), the output
     * projection's bias [dim], the router's bias [n_expert] and the
     * experts' biases: gate and up [n_expert][expert_ff], down [n_expert][dim] */
    const float *sinks, *bo, *br, *b1_exps, *b2_exps, *b3_exps;
    /* the shared expert (shexp_ff > 0; else NULL): its gate w1_shexp and
     * up w3_shexp [shexp_ff][dim], down w2_shexp [dim][shexp_ff], and the
     * vector of its sigmoid gate, shexp_gate [dim] (F32) */
    const float *w1_shexp, *w2_shexp, *w3_shexp, *shexp_gate;
    /* a Gated DeltaNet layer (tp_model_layer_recurrent; else NULL, and
     * wq .. wo NULL too): with key_dim = ssm_head_dim * ssm_k_heads,
     * value_dim = ssm_head_dim * ssm_v_heads and conv_dim = 2 key_dim +
     * value_dim, wqkv_lin [conv_dim][dim] (q, k, v mixed, before the
     * conv), wz [value_dim][dim] (the output norm's gate), wbeta and
     * walpha [ssm_v_heads][dim], wssm_out [dim][value_dim]; ssm_conv1d
     * [conv_dim][ssm_conv_kernel], ssm_dt (alpha's bias) and ssm_a
     * (-exp(A_log)) [ssm_v_heads], ssm_norm [ssm_head_dim] */
    const float *wqkv_lin, *wz, *wbeta, *walpha, *wssm_out;
    const float *ssm_conv1d, *ssm_dt, *ssm_a, *ssm_norm;
    struct { tp_wmat wq, wk, wv, wo, w1, w2, w3, wr, wqkv_lin, wz, wbeta, walpha, wssm_out;
             tp_wmat w1_shexp, w2_shexp, w3_shexp; } m;
} tp_layer_weights;

typedef struct tp_model_weights {
    const float *token_embedding; /* [vocab][dim] */
    const tp_layer_weights *layers; /* [n_layers] */
    const float *rms_final;       /* [dim] */
    const float *wcls;            /* [vocab][dim]; == token_embedding if shared */
    /* [head_size / 2] divisors of each RoPE pair's frequency (Llama 3 and
     * linear scaling: the file's rope_freqs.weight, or computed from its
     * rope.scaling.* keys); NULL = all 1. */
    const float *rope_freqs;
    /* [rope_dim / 2] LongRoPE's divisors for long and short contexts (see
     * rope_orig_ctx), or NULL; rope_freqs wins where both are given */
    const float *rope_long, *rope_short;
    struct { tp_wmat token_embedding, wcls; } m; /* typed views, always filled */
} tp_model_weights;

/* True if every matrix of the model is F32 (llama2.c checkpoints always). */
bool tp_model_all_f32(const tp_model *m);

/* For weights a caller has copied (packed, repacked): the file's pages
 * wholly inside [p, p + n) leave the process's memory; they are read from
 * the file again if touched. No-op for a model not mapped from a file. */
void tp_model_drop_pages(const tp_model *m, const void *p, size_t n);

#define TP_MODEL_MAX_EOS 4

/* Llama 3.1's RoPE scaling (Meta's rope_type "llama3") as the divisors of
 * the head_size / 2 pair frequencies theta^(-2i/head_size): pairs whose
 * wavelength is under orig_ctx / high keep theirs (1), those over
 * orig_ctx / low are slowed by factor, the band between is blended. What
 * llama.cpp's converter stores as rope_freqs.weight; the loader computes
 * it from rope.scaling.* keys, mkmodel writes it. */
void tp_rope_llama3_divisors(int head_size, double theta, double factor, double low, double high,
                             double orig_ctx, float *out);

/* YaRN (model.h's yarn_* of c, c->yarn_factor > 0) for pairs of base
 * theta as ggml's rope_yarn computes it, in f32: ramp[j] (head_size / 2 of
 * them) the share of pair j's unscaled angle (1: extrapolated, 0:
 * interpolated, ggml's rope_yarn_ramp between the floor and ceiling of
 * the correction dims), *mscale what cos and sin are multiplied by. */
void tp_rope_yarn(const tp_model_config *c, float theta, float *ramp, float *mscale);

/* Open and mmap path (read-only), detect the format from its first bytes and
 * validate it. On success *out is owned by the caller (tp_model_free). */
int tp_model_load(const char *path, tp_model **out, tp_err *err);

/* The GGUF architectures tp_model_load reads, ", " between them (for
 * --help and refusals: the one table, model/archs.c). */
void tp_model_arch_names(char *buf, size_t cap);

/* Same from a caller-owned buffer (which must stay valid and unchanged while
 * the model lives and be 4-byte aligned). For fuzzing and tests. */
int tp_model_from_memory(const void *data, size_t size, tp_model **out, tp_err *err);

void tp_model_free(tp_model *m);

tp_model_format tp_model_get_format(const tp_model *m);
const tp_model_config *tp_model_get_config(const tp_model *m);
const tp_model_weights *tp_model_get_weights(const tp_model *m);

/* A short string that identifies the weights: format, shape, file size and
 * a hash of the first and last bytes, e.g.
 * "llama2c dim=64 hidden=172 layers=5 heads=8 kv_heads=4 vocab=512 seq=512 size=1056540 h=..."
 * Borrowed; valid while m lives. */
const char *tp_model_identity(const tp_model *m);

/* The ids that end a generated sequence. For llama2.c TinyStories models
 * {1 (BOS), 2 (EOS)}: run.c stops when BOS is sampled. For GGUF, the
 * tokenizer.ggml.bos_token_id the file names (not a default) and its EOS id,
 * without duplicates; {2} for a GGUF file without a vocabulary. Returns the
 * count (0..TP_MODEL_MAX_EOS); *ids is borrowed. */
int tp_model_eos_ids(const tp_model *m, const int **ids);

/* The embedded vocabulary (vocab.h: the one reader of tokenizer.ggml.*):
 * 0 and *out borrowed (valid while m lives) for GGUF files that carry
 * tokenizer.ggml.tokens; TP_ENOTFOUND otherwise (llama2.c checkpoints keep
 * their tokenizer in a separate file). */
struct tp_gguf_vocab;
int tp_model_vocab_get(const tp_model *m, const struct tp_gguf_vocab **out, tp_err *err);

/* A tokenizer built from the embedded vocabulary; *out is owned by the
 * caller and independent of m. TP_ENOTFOUND without an embedded
 * vocabulary; TP_EFORMAT if tokenizer.ggml.model is neither "llama" nor
 * "gpt2". Vocabulary files: tp_tokenizer_open. */
int tp_model_tokenizer(const tp_model *m, tp_tokenizer **out, tp_err *err);

#endif
