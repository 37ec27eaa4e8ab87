/* Model loading: llama2.c checkpoints and GGUF v3 files of the
 * architectures of model/archs.c, mmap'ed. What differs between
 * architectures is in their model/arch_*.c; this file reads what they
 * name. */
#include "tokpipe/model.h"
#include "tokpipe/ggml_types.h"
#include "tokpipe/gguf.h"
#include "tokpipe/vocab.h"
#include "arch.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Shape limits: far above any model this project runs, low enough that every
 * size computed from them fits in 64 bits without overflow checks. */
#define MAX_DIM (1 << 16)
#define MAX_HIDDEN (1 << 18)
#define MAX_LAYERS 1024
#define MAX_VOCAB (1 << 22)
#define MAX_SEQ (1 << 20)
#define MAX_EXPERTS 512 /* llama.cpp's LLAMA_MAX_EXPERTS */
#define MAX_CONV_KERNEL 16 /* a DeltaNet conv1d's width (Qwen 3.5: 4) */
#define MAX_SSM_HEAD 1024  /* a DeltaNet head's size (Qwen 3.5: 128) */
#define MAX_SSM_HEADS 1024
#define LLAMA2C_HEADER_BYTES 28
#define LLAMA2C_V1_MAGIC 0x616b3432u /* "ak42": newer llama2.c export versions */
#define HASH_BYTES 4096
#define MAX_KEY 96
/* Llama 3's defaults for the rope.scaling keys it may leave out (the values
 * of Meta's Llama 3.1 release, which llama.cpp's converter also assumes). */
#define LLAMA3_FACTOR 8.0
#define LLAMA3_LOW_FREQ_FACTOR 1.0
#define LLAMA3_HIGH_FREQ_FACTOR 4.0
#define LLAMA3_ORIG_CONTEXT 8192

struct tp_model {
    tp_model_format format;
    tp_model_config cfg;
    tp_model_weights w;
    tp_layer_weights *layers;
    void *map;
    size_t map_size;
    const uint8_t *data;
    size_t size;
    int eos[TP_MODEL_MAX_EOS];
    int n_eos;
    char identity[256];
    tp_gguf *gguf;
    tp_gguf_vocab vocab;   /* spec.n 0 when the file has none */
    char arch_name[16];    /* GGUF metadata prefix: "llama", "qwen2", ... */
    const tp_arch *arch;   /* GGUF: its entry in model/archs.c */
    float *rope_freqs;     /* [rope_dim / 2] or NULL */
    float *rope_long, *rope_short; /* LongRoPE's [rope_dim / 2], or NULL */
    bool *tensor_used;     /* GGUF: which directory entries the loader took */
    tp_wmat *exps;         /* [n_layers][3][n_expert] the experts' views, or NULL */
};

static int check_range(const char *field, long long v, long long lo, long long hi, tp_err *err)
{
    if (v < lo || v > hi)
        return tp_err_set(err, TP_EFORMAT, "model header: %s = %lld is outside %lld..%lld", field, v, lo,
                          hi);
    return 0;
}

/* Shared shape rules for both formats. */
static int validate_config(tp_model_config *c, tp_err *err)
{
    int rc = check_range("dim", c->dim, 1, MAX_DIM, err);
    if (!rc) rc = check_range("hidden_dim", c->hidden_dim, 1, MAX_HIDDEN, err);
    if (!rc) rc = check_range("n_layers", c->n_layers, 1, MAX_LAYERS, err);
    if (!rc) rc = check_range("n_heads", c->n_heads, 1, c->dim, err);
    if (!rc) rc = check_range("n_kv_heads", c->n_kv_heads, 1, c->n_heads, err);
    if (!rc) rc = check_range("vocab_size", c->vocab_size, 1, MAX_VOCAB, err);
    if (!rc) rc = check_range("seq_len", c->seq_len, 1, MAX_SEQ, err);
    if (rc)
        return rc;
    if (c->head_size) { /* given by the file (attention.key_length) */
        if ((rc = check_range("head size", c->head_size, 1, MAX_HIDDEN / c->n_heads, err)))
            return rc;
    } else if (c->dim % c->n_heads) {
        return tp_err_set(err, TP_EFORMAT, "model header: dim %d is not a multiple of n_heads %d", c->dim,
                          c->n_heads);
    } else {
        c->head_size = c->dim / c->n_heads;
    }
    if (c->n_heads % c->n_kv_heads)
        return tp_err_set(err, TP_EFORMAT, "model header: n_heads %d is not a multiple of n_kv_heads %d",
                          c->n_heads, c->n_kv_heads);
    c->q_dim = c->head_size * c->n_heads;
    if (c->head_size % 2)
        return tp_err_set(err, TP_EFORMAT, "model header: head size %d is odd (RoPE rotates pairs)",
                          c->head_size);
    c->kv_dim = c->head_size * c->n_kv_heads;
    if (!c->rope_dim)
        c->rope_dim = c->head_size;
    if (c->rope_dim < 2 || c->rope_dim > c->head_size || c->rope_dim % 2)
        return tp_err_set(err, TP_EFORMAT, "model header: RoPE dimension count %d is not an even number in "
                          "2..%d (the head size)", c->rope_dim, c->head_size);
    if (!(c->norm_eps > 0 && c->norm_eps < 1))
        return tp_err_set(err, TP_EFORMAT, "model header: RMSNorm epsilon %g is outside (0, 1)",
                          (double)c->norm_eps);
    if (!(c->rope_theta > 1 && c->rope_theta < 1e12f))
        return tp_err_set(err, TP_EFORMAT, "model header: RoPE theta %g is outside (1, 1e12)",
                          (double)c->rope_theta);
    return 0;
}

static int alloc_layers(tp_model *m, tp_err *err)
{
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers)
        return tp_err_set(err, TP_ENOMEM, "model: out of memory for %d layers", m->cfg.n_layers);
    m->w.layers = m->layers;
    return 0;
}

/* ---- llama2.c ---------------------------------------------------------- */

static uint64_t llama2c_floats(const tp_model_config *c)
{
    uint64_t d = (uint64_t)c->dim, L = (uint64_t)c->n_layers, h = (uint64_t)c->hidden_dim;
    uint64_t V = (uint64_t)c->vocab_size, kvd = (uint64_t)c->kv_dim;
    uint64_t n = V * d + L * d + L * d * d + 2 * L * d * kvd + L * d * d + L * d + 3 * L * h * d + d;
    n += (uint64_t)c->seq_len * (uint64_t)c->head_size; /* legacy freq_cis_real + imag */
    if (!c->shared_classifier)
        n += V * d;
    return n;
}

static int llama2c_header(tp_model *m, tp_err *err)
{
    if (m->size < LLAMA2C_HEADER_BYTES)
        return tp_err_set(err, TP_EFORMAT, "llama2.c: file is %zu bytes, shorter than the 28-byte header",
                          m->size);
    int32_t h[7];
    memcpy(h, m->data, sizeof h);
    if ((uint32_t)h[0] == LLAMA2C_V1_MAGIC)
        return tp_err_set(err, TP_EFORMAT, "llama2.c: versioned export (magic ak42) is not supported; "
                          "export the legacy version 0 format");
    tp_model_config *c = &m->cfg;
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    c->shared_classifier = h[5] > 0;
    c->vocab_size = h[5] == INT32_MIN ? INT32_MIN : abs(h[5]);
    c->seq_len = h[6];
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->arch = TP_ARCH_LLAMA;
    c->rope_style = TP_ROPE_ADJACENT;
    return validate_config(c, err);
}

static tp_wmat f32_view(const float *p, int rows, int cols)
{
    return (tp_wmat){TP_GGML_F32, rows, cols, (size_t)cols * sizeof(float), p, NULL};
}

static void llama2c_views(tp_model *m)
{
    const tp_model_config *c = &m->cfg;
    int d = c->dim, kvd = c->kv_dim, h = c->hidden_dim;
    for (int l = 0; l < c->n_layers; l++) {
        tp_layer_weights *lw = &m->layers[l];
        lw->m.wq = f32_view(lw->wq, d, d);
        lw->m.wk = f32_view(lw->wk, kvd, d);
        lw->m.wv = f32_view(lw->wv, kvd, d);
        lw->m.wo = f32_view(lw->wo, d, d);
        lw->m.w1 = f32_view(lw->w1, h, d);
        lw->m.w2 = f32_view(lw->w2, d, h);
        lw->m.w3 = f32_view(lw->w3, h, d);
    }
    m->w.m.token_embedding = f32_view(m->w.token_embedding, c->vocab_size, d);
    m->w.m.wcls = f32_view(m->w.wcls, c->vocab_size, d);
}

static int llama2c_open(tp_model *m, tp_err *err)
{
    int rc = llama2c_header(m, err);
    if (rc)
        return rc;
    const tp_model_config *c = &m->cfg;
    uint64_t want = LLAMA2C_HEADER_BYTES + 4 * llama2c_floats(c);
    if (want != m->size)
        return tp_err_set(err, TP_EFORMAT,
                          "llama2.c: file is %zu bytes but its header (dim=%d hidden=%d layers=%d heads=%d "
                          "kv_heads=%d vocab=%d seq=%d) needs exactly %llu",
                          m->size, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                          c->shared_classifier ? c->vocab_size : -c->vocab_size, c->seq_len,
                          (unsigned long long)want);
    if ((rc = alloc_layers(m, err)))
        return rc;
    const float *p = (const float *)(m->data + LLAMA2C_HEADER_BYTES);
    size_t d = (size_t)c->dim, L = (size_t)c->n_layers, hd = (size_t)c->hidden_dim;
    size_t kvd = (size_t)c->kv_dim;
    m->w.token_embedding = p;
    p += (size_t)c->vocab_size * d;
    /* The file stores each tensor kind for all layers together. */
    for (size_t l = 0; l < L; l++) m->layers[l].rms_att = p + l * d;
    p += L * d;
    for (size_t l = 0; l < L; l++) m->layers[l].wq = p + l * d * d;
    p += L * d * d;
    for (size_t l = 0; l < L; l++) m->layers[l].wk = p + l * d * kvd;
    p += L * d * kvd;
    for (size_t l = 0; l < L; l++) m->layers[l].wv = p + l * d * kvd;
    p += L * d * kvd;
    for (size_t l = 0; l < L; l++) m->layers[l].wo = p + l * d * d;
    p += L * d * d;
    for (size_t l = 0; l < L; l++) m->layers[l].rms_ffn = p + l * d;
    p += L * d;
    for (size_t l = 0; l < L; l++) m->layers[l].w1 = p + l * hd * d;
    p += L * hd * d;
    for (size_t l = 0; l < L; l++) m->layers[l].w2 = p + l * hd * d;
    p += L * hd * d;
    for (size_t l = 0; l < L; l++) m->layers[l].w3 = p + l * hd * d;
    p += L * hd * d;
    m->w.rms_final = p;
    p += d;
    p += (size_t)c->seq_len * (size_t)c->head_size; /* skip legacy freq_cis arrays */
    m->w.wcls = c->shared_classifier ? m->w.token_embedding : p;
    llama2c_views(m);
    m->eos[0] = 1; /* TinyStories: a sampled BOS starts a new story, run.c stops */
    m->eos[1] = 2;
    m->n_eos = 2;
    if (c->vocab_size <= 2)
        m->n_eos = c->vocab_size - 1 > 0 ? 1 : 0;
    return 0;
}

/* ---- GGUF -------------------------------------------------------------- */

static int gguf_int(const tp_gguf *g, const char *key, int64_t def, bool required, int *out, tp_err *err)
{
    int64_t v = def;
    int rc = tp_gguf_get_int(g, key, &v, err);
    if (rc == TP_ENOTFOUND && !required) {
        tp_err_clear(err);
        rc = 0;
    }
    if (rc)
        return rc;
    if (v < INT32_MIN || v > INT32_MAX)
        return tp_err_set(err, TP_EFORMAT, "gguf: %s = %lld does not fit in 32 bits", key, (long long)v);
    *out = (int)v;
    return 0;
}

static int gguf_float(const tp_gguf *g, const char *key, double def, float *out, tp_err *err)
{
    double v = def;
    int rc = tp_gguf_get_float(g, key, &v, err);
    if (rc == TP_ENOTFOUND)
        tp_err_clear(err);
    else if (rc)
        return rc;
    *out = (float)v;
    return 0;
}

static const char *akey(const tp_model *m, const char *suffix, char *buf)
{
    snprintf(buf, MAX_KEY, "%s.%s", m->arch_name, suffix);
    return buf;
}

static int tensor_index(const tp_gguf *g, const tp_gguf_tensor *t)
{
    return (int)(t - tp_gguf_tensor_at(g, 0));
}

/* A tensor of shape [ne0] (ne1 == 0) or [ne0, ne1] of a type this loader
 * reads (F32, or any typed-kernel type when matrix); marks it used.
 * Unknown types are refused by name. Missing: TP_ENOTFOUND if optional,
 * else TP_EFORMAT. */
static int gguf_find(tp_model *m, const tp_gguf *g, const char *name, int ne0, int ne1, int ne2, bool optional,
                     bool matrix, const tp_gguf_tensor **out, tp_err *err)
{
    const tp_gguf_tensor *t = tp_gguf_tensor_find(g, name);
    if (!t)
        return optional ? TP_ENOTFOUND : tp_err_set(err, TP_EFORMAT, "gguf: tensor '%s' is missing", name);
    if (t->type != TP_GGML_F32 && !(matrix && tp_ggml_matrix_type_ok(t->type))) {
        const tp_ggml_type_info *ti = tp_ggml_type(t->type);
        return tp_err_set(err, TP_EFORMAT, "gguf: tensor '%s' has ggml type %s (%u), which tokpipe does not "
                          "read %s", name, ti ? ti->name : "unknown", t->type,
                          matrix ? "(it reads f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K)"
                                 : "for a vector (only f32)");
    }
    uint32_t want_dims = ne2 ? 3 : ne1 ? 2 : 1;
    bool ok = t->n_dims == want_dims && t->dims[0] == (uint64_t)ne0 && (!ne1 || t->dims[1] == (uint64_t)ne1) &&
              (!ne2 || t->dims[2] == (uint64_t)ne2);
    if (!ok && ne2)
        return tp_err_set(err, TP_EFORMAT,
                          "gguf: tensor '%s' has shape [%llu, %llu, %llu] (%u dims), expected [%d, %d, %d]", name,
                          (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
                          (unsigned long long)t->dims[2], t->n_dims, ne0, ne1, ne2);
    if (!ok)
        return tp_err_set(err, TP_EFORMAT,
                          "gguf: tensor '%s' has shape [%llu, %llu] (%u dims), expected [%d, %d]", name,
                          (unsigned long long)t->dims[0], (unsigned long long)t->dims[1], t->n_dims, ne0,
                          ne1 ? ne1 : 1);
    if (t->type == TP_GGML_F32 && (uintptr_t)t->data % 4)
        return tp_err_set(err, TP_EFORMAT, "gguf: tensor '%s' data is not 4-byte aligned", name);
    if (m->tensor_used)
        m->tensor_used[tensor_index(g, t)] = true;
    *out = t;
    return 0;
}

/* A float tensor (vectors: norms, biases, rope_freqs): F32 only, as every
 * quantizer leaves them. */
static int gguf_tensor_opt(tp_model *m, const tp_gguf *g, const char *name, int ne0, int ne1, bool optional,
                           const float **out, tp_err *err)
{
    const tp_gguf_tensor *t;
    int rc = gguf_find(m, g, name, ne0, ne1, 0, optional, false, &t, err);
    if (!rc)
        *out = t->data;
    return rc;
}

/* A matrix [ne1 rows][ne0 cols] of any type this reader knows, read in
 * place; *f32 is set too when it is F32 (else NULL). */
static int gguf_matrix_opt(tp_model *m, const tp_gguf *g, const char *name, int ne0, int ne1, bool optional,
                           tp_wmat *wm, const float **f32, tp_err *err)
{
    const tp_gguf_tensor *t;
    int rc = gguf_find(m, g, name, ne0, ne1, 0, optional, true, &t, err);
    if (rc)
        return rc;
    *wm = (tp_wmat){t->type, ne1, ne0, (size_t)(t->nbytes / (uint64_t)ne1), t->data, NULL};
    *f32 = t->type == TP_GGML_F32 ? t->data : NULL;
    return 0;
}

/* A 3-D matrix of experts [ne2][ne1 rows][ne0 cols] (any matrix type,
 * one for all experts as ggml stores it) as ne2 views of [ne1][ne0], read
 * in place: expert e's rows follow expert e - 1's. */
static int gguf_experts(tp_model *m, const tp_gguf *g, const char *name, int ne0, int ne1, int ne2, tp_wmat *out,
                        tp_err *err)
{
    const tp_gguf_tensor *t;
    int rc = gguf_find(m, g, name, ne0, ne1, ne2, false, true, &t, err);
    if (rc)
        return rc;
    size_t row_bytes = (size_t)(t->nbytes / ((uint64_t)ne1 * (uint64_t)ne2));
    for (int e = 0; e < ne2; e++)
        out[e] = (tp_wmat){t->type, ne1, ne0, row_bytes,
                           (const uint8_t *)t->data + (size_t)e * (size_t)ne1 * row_bytes, NULL};
    return 0;
}

static int gguf_matrix(tp_model *m, const tp_gguf *g, const char *name, int ne0, int ne1, tp_wmat *wm,
                       const float **f32, tp_err *err)
{
    return gguf_matrix_opt(m, g, name, ne0, ne1, false, wm, f32, err);
}

static int gguf_tensor(tp_model *m, const tp_gguf *g, const char *name, int ne0, int ne1, const float **out,
                       tp_err *err)
{
    return gguf_tensor_opt(m, g, name, ne0, ne1, false, out, err);
}

static int gguf_arch(tp_model *m, const tp_gguf *g, tp_err *err)
{
    tp_gguf_str arch;
    int rc = tp_gguf_get_str(g, "general.architecture", &arch, err);
    if (rc)
        return rc;
    const tp_arch *a = tp_arch_find(arch.ptr, arch.len);
    if (!a) {
        char names[256];
        tp_model_arch_names(names, sizeof names);
        return tp_err_set(err, TP_EFORMAT, "gguf: general.architecture '%.*s' is not supported (supported: %s)",
                          (int)(arch.len > 64 ? 64 : arch.len), arch.ptr, names);
    }
    m->arch = a;
    snprintf(m->arch_name, sizeof m->arch_name, "%s", a->name);
    m->cfg.arch = a->id;
    m->cfg.rope_style = a->rope;
    m->cfg.qk_norm = (a->flags & TP_ARCHF_QK_NORM) != 0;
    m->cfg.embd_scale = (a->flags & TP_ARCHF_EMBD_SCALE) != 0;
    m->cfg.post_norms = (a->flags & TP_ARCHF_POST_NORMS) != 0;
    m->cfg.ffn_act = (a->flags & TP_ARCHF_GELU) ? TP_FFN_GELU_TANH : TP_FFN_SILU;
    if (a->flags & TP_ARCHF_OAI_MOE) {
        m->cfg.ffn_act = TP_FFN_SWIGLU_OAI;
        m->cfg.moe_softmax_topk = true;
    }
    m->cfg.attn_gate = (a->flags & TP_ARCHF_ATTN_GATE) != 0;
    return 0;
}

bool tp_model_layer_recurrent(const tp_model_config *c, int l)
{
    return c->full_attn_interval > 0 && (l + 1) % c->full_attn_interval != 0;
}

/* A hybrid model's DeltaNet sizes, as llama.cpp's load_hparams reads
 * LLM_ARCH_QWEN35's: the ssm.* keys required, full_attention_interval
 * default 4. A value head is a key head's size (inner_size = state_size
 * * time_step_rank), and the value heads a multiple of the key heads. */
static int gguf_hybrid(tp_model *m, const tp_gguf *g, tp_err *err)
{
    tp_model_config *c = &m->cfg;
    char k[MAX_KEY];
    int inner = 0;
    int rc = gguf_int(g, akey(m, "ssm.conv_kernel", k), 0, true, &c->ssm_conv_kernel, err);
    if (!rc) rc = check_range(k, c->ssm_conv_kernel, 2, MAX_CONV_KERNEL, err);
    if (!rc) rc = gguf_int(g, akey(m, "ssm.state_size", k), 0, true, &c->ssm_head_dim, err);
    if (!rc) rc = check_range(k, c->ssm_head_dim, 1, MAX_SSM_HEAD, err);
    if (!rc) rc = gguf_int(g, akey(m, "ssm.group_count", k), 0, true, &c->ssm_k_heads, err);
    if (!rc) rc = check_range(k, c->ssm_k_heads, 1, MAX_SSM_HEADS, err);
    if (!rc) rc = gguf_int(g, akey(m, "ssm.time_step_rank", k), 0, true, &c->ssm_v_heads, err);
    if (!rc) rc = check_range(k, c->ssm_v_heads, 1, MAX_SSM_HEADS, err);
    if (!rc) rc = gguf_int(g, akey(m, "ssm.inner_size", k), 0, true, &inner, err);
    if (!rc) rc = gguf_int(g, akey(m, "full_attention_interval", k), 4, false, &c->full_attn_interval, err);
    if (!rc) rc = check_range(k, c->full_attn_interval, 1, MAX_LAYERS, err);
    if (rc)
        return rc;
    if (inner != c->ssm_head_dim * c->ssm_v_heads)
        return tp_err_set(err, TP_EFORMAT, "gguf: %s.ssm.inner_size %d != state_size %d * time_step_rank %d",
                          m->arch_name, inner, c->ssm_head_dim, c->ssm_v_heads);
    if (c->ssm_v_heads % c->ssm_k_heads)
        return tp_err_set(err, TP_EFORMAT, "gguf: %s.ssm.time_step_rank %d is not a multiple of group_count %d",
                          m->arch_name, c->ssm_v_heads, c->ssm_k_heads);
    return 0;
}

bool tp_model_layer_slides(const tp_model_config *c, int l)
{
    return c->swa_window > 0 && c->swa_pattern > 0 && l % c->swa_pattern < c->swa_pattern - 1;
}

static int softcap(const tp_gguf *g, const char *key, double dflt, float *out, tp_err *err)
{
    int rc = gguf_float(g, key, dflt, out, err);
    if (!rc && !(*out >= 0 && *out < 1e9f))
        rc = tp_err_set(err, TP_EFORMAT, "gguf: %s = %g is not 0 (none) or positive", key, (double)*out);
    return rc;
}

/* Gemma's keys, as llama.cpp's load_hparams reads them (model/arch.h):
 * the sliding window and its pattern, the sliding layers' RoPE base, the
 * scale of Q and the soft-capping. */
static int gguf_gemma(tp_model *m, const tp_gguf *g, tp_err *err)
{
    tp_model_config *c = &m->cfg;
    const tp_arch *a = m->arch;
    char k[MAX_KEY];
    int rc = 0;
    if (a->swa_pattern) {
        int w = a->swa_window;
        if ((rc = gguf_int(g, akey(m, "attention.sliding_window", k), a->swa_window, false, &w, err)))
            return rc;
        if (w < 0 || (w == 0 && a->swa_window)) /* gemma2's 0 would hide every key, even a query's own */
            return tp_err_set(err, TP_EFORMAT, "gguf: %s = %d is not a window", k, w);
        if (w > 0) {
            c->swa_window = w;
            c->swa_pattern = a->swa_pattern;
            c->rope_theta_swa = a->swa_rope_base ? (float)a->swa_rope_base : c->rope_theta;
            c->rope_swa_scaled = !a->swa_rope_base;
        }
    }
    if (a->flags & TP_ARCHF_Q_SCALE) /* gemma_pytorch's query_pre_attn_scalar, as llama.cpp derives it */
        c->attn_scale = c->n_layers == a->big_layers ? 1.0f / sqrtf((float)(c->dim / c->n_heads))
                                                     : 1.0f / sqrtf((float)c->head_size);
    if (a->flags & TP_ARCHF_ATTN_SOFTCAP)
        rc = softcap(g, akey(m, "attn_logit_softcapping", k), a->attn_softcap, &c->attn_softcap, err);
    if (!rc && (a->flags & TP_ARCHF_FINAL_SOFTCAP))
        rc = softcap(g, akey(m, "final_logit_softcapping", k), a->final_softcap, &c->final_softcap, err);
    return rc;
}

/* Experts as llama.cpp's load_hparams reads them: expert_count and
 * expert_used_count (default 0), at most LLAMA_MAX_EXPERTS, used <= count;
 * an architecture that needs them refuses 0, one without expert tensors
 * refuses experts. One expert's width: expert_feed_forward_length (default
 * feed_forward_length / expert_used_count) where the architecture reads
 * it, else feed_forward_length. */
static int gguf_experts_config(tp_model *m, const tp_gguf *g, tp_err *err)
{
    tp_model_config *c = &m->cfg;
    const tp_arch *a = m->arch;
    char k[MAX_KEY];
    int rc = gguf_int(g, akey(m, "expert_count", k), 0, false, &c->n_expert, err);
    if (!rc) rc = gguf_int(g, akey(m, "expert_used_count", k), 0, false, &c->n_expert_used, err);
    if (!rc) rc = check_range(akey(m, "expert_count", k), c->n_expert, 0, MAX_EXPERTS, err);
    if (rc)
        return rc;
    if (!c->n_expert) {
        if (a->flags & TP_ARCHF_MOE)
            return tp_err_set(err, TP_EFORMAT, "gguf: %s.expert_count must be > 0 for %s", m->arch_name,
                              m->arch_name);
        c->n_expert_used = 0;
        return 0;
    }
    bool has_moe = false;
    for (int i = 0; i < a->n_block; i++)
        has_moe = has_moe || (a->block[i].flags & TP_AT_MOE);
    if (!has_moe)
        return tp_err_set(err, TP_EFORMAT, "gguf: %s.expert_count %d: the %s architecture has no experts",
                          m->arch_name, c->n_expert, m->arch_name);
    if ((rc = check_range(akey(m, "expert_used_count", k), c->n_expert_used, 1, c->n_expert, err)))
        return rc;
    c->expert_ff = c->hidden_dim;
    if (a->flags & TP_ARCHF_EXPERT_FF_KEY)
        rc = gguf_int(g, akey(m, "expert_feed_forward_length", k), c->hidden_dim / c->n_expert_used, false,
                      &c->expert_ff, err);
    if (!rc)
        rc = check_range("expert feed_forward_length", c->expert_ff, 1, MAX_HIDDEN, err);
    if (!rc && (a->flags & TP_ARCHF_SHEXP)) /* llama.cpp's n_ff_shexp, else n_ff */
        rc = gguf_int(g, akey(m, "expert_shared_feed_forward_length", k), c->hidden_dim, false, &c->shexp_ff, err);
    if (!rc && (a->flags & TP_ARCHF_SHEXP))
        rc = check_range("expert shared feed_forward_length", c->shexp_ff, 1, MAX_HIDDEN, err);
    return rc;
}

static int gguf_config(tp_model *m, const tp_gguf *g, tp_err *err)
{
    int rc = gguf_arch(m, g, err);
    if (rc)
        return rc;
    tp_model_config *c = &m->cfg;
    const tp_arch *a = m->arch;
    char k[MAX_KEY];
    rc = gguf_int(g, akey(m, "embedding_length", k), 0, true, &c->dim, err);
    if (!rc) rc = gguf_int(g, akey(m, "feed_forward_length", k), 0, true, &c->hidden_dim, err);
    if (!rc) rc = gguf_int(g, akey(m, "block_count", k), 0, true, &c->n_layers, err);
    if (!rc) rc = gguf_int(g, akey(m, "attention.head_count", k), 0, true, &c->n_heads, err);
    if (!rc) rc = gguf_int(g, akey(m, "attention.head_count_kv", k), c->n_heads, false, &c->n_kv_heads, err);
    if (!rc) rc = gguf_int(g, akey(m, "context_length", k), a->context, false, &c->seq_len, err);
    if (!rc && (a->flags & TP_ARCHF_EPS_REQUIRED)) {
        double eps = 0;
        rc = tp_gguf_get_float(g, akey(m, "attention.layer_norm_rms_epsilon", k), &eps, err);
        c->norm_eps = (float)eps;
    } else if (!rc) {
        rc = gguf_float(g, akey(m, "attention.layer_norm_rms_epsilon", k), a->norm_eps, &c->norm_eps, err);
    }
    if (!rc) rc = gguf_float(g, akey(m, "rope.freq_base", k), a->rope_base, &c->rope_theta, err);
    if (!rc && (a->flags & TP_ARCHF_HEAD_DIM_KEY))
        rc = gguf_int(g, akey(m, "attention.key_length", k), 0, false, &c->head_size, err);
    if (!rc && (a->flags & TP_ARCHF_ROPE_DIM))
        rc = gguf_int(g, akey(m, "rope.dimension_count", k), 0, false, &c->rope_dim, err);
    if (!rc && (a->flags & TP_ARCHF_HYBRID))
        rc = gguf_hybrid(m, g, err);
    if (!rc)
        rc = gguf_experts_config(m, g, err);
    if (!rc)
        rc = gguf_int(g, akey(m, "pooling_type", k), TP_POOL_NONE, false, &c->pooling, err);
    if (!rc && (c->pooling < TP_POOL_NONE || c->pooling > TP_POOL_LAST))
        c->pooling = TP_POOL_NONE;   /* rank (a reranker's head) and others: not an embedding we compute */
    if (rc)
        return rc;
    const tp_gguf_tensor *emb = tp_gguf_tensor_find(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2 || emb->dims[1] > MAX_VOCAB)
        return tp_err_set(err, TP_EFORMAT, "gguf: tensor 'token_embd.weight' is missing or not [dim, vocab]");
    c->vocab_size = (int)emb->dims[1];
    c->shared_classifier = tp_gguf_tensor_find(g, "output.weight") == NULL;
    if ((rc = validate_config(c, err)))
        return rc;
    /* The keys default to the head size; other values are other
     * architectures (partial RoPE, value heads of another size, and
     * head_dim != dim / n_heads where the architecture does not read it). */
    const char *same[] = {"rope.dimension_count", "attention.key_length", "attention.value_length"};
    for (size_t i = (a->flags & TP_ARCHF_ROPE_DIM) ? 1 : 0; i < sizeof same / sizeof same[0]; i++) {
        int v = c->head_size;
        if ((rc = gguf_int(g, akey(m, same[i], k), c->head_size, false, &v, err)))
            return rc;
        if (v != c->head_size)
            return tp_err_set(err, TP_EFORMAT, "gguf: %s %d != head size %d (%s) is not supported", k, v,
                              c->head_size, (a->flags & TP_ARCHF_HEAD_DIM_KEY) ? "attention.key_length"
                                            : "embedding_length / head_count");
    }
    return gguf_gemma(m, g, err);
}

static bool str_is(tp_gguf_str s, const char *z)
{
    return s.len == strlen(z) && !memcmp(s.ptr, z, s.len);
}

static int positive(const char *key, double v, tp_err *err)
{
    if (!(v > 0 && v < 1e9))
        return tp_err_set(err, TP_EFORMAT, "gguf: %s = %g is not a positive number", key, v);
    return 0;
}

/* ggml_rope_yarn_corr_dim: the dimension whose pair turns n_rot times in
 * n_ctx_orig positions */
static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base)
{
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2 * 3.14159265358979323846f)) / (2 * logf(base));
}

void tp_rope_yarn(const tp_model_config *c, float theta, float *ramp, float *mscale)
{
    int n = c->head_size;
    float lo = floorf(yarn_corr_dim(n, c->yarn_orig_ctx, c->yarn_beta_fast, theta));
    float hi = ceilf(yarn_corr_dim(n, c->yarn_orig_ctx, c->yarn_beta_slow, theta));
    lo = lo > 0 ? lo : 0;
    hi = hi < (float)(n - 1) ? hi : (float)(n - 1);
    for (int j = 0; j < n / 2; j++) {
        float y = ((float)j - lo) / fmaxf(0.001f, hi - lo);
        ramp[j] = 1 - fminf(1, fmaxf(0, y));
    }
    *mscale = c->yarn_attn_factor * (1.0f + 0.1f * logf(c->yarn_factor));
}

void tp_rope_llama3_divisors(int head_size, double theta, double factor, double low, double high,
                             double orig_ctx, float *out)
{
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < head_size / 2; i++) {
        double wavelen = 2 * pi / pow(theta, -2.0 * i / head_size);
        if (wavelen < orig_ctx / high)
            out[i] = 1.0f;
        else if (wavelen > orig_ctx / low)
            out[i] = (float)factor;
        else {
            double smooth = (orig_ctx / wavelen - low) / (high - low);
            out[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

/* YaRN from {arch}.rope.scaling.* keys as llama.cpp reads them (model.h):
 * factor (freq_scale = 1 / factor), original_context_length (default the
 * context length), yarn_beta_fast (32), yarn_beta_slow (1),
 * yarn_attn_factor (1). */
static int gguf_yarn(tp_model *m, const tp_gguf *g, tp_err *err)
{
    tp_model_config *c = &m->cfg;
    char k[MAX_KEY];
    int rc = gguf_float(g, akey(m, "rope.scaling.factor", k), 0.0, &c->yarn_factor, err);
    if (!rc && !(c->yarn_factor >= 1.0f && c->yarn_factor < 1e6f))
        return tp_err_set(err, TP_EFORMAT, "gguf: %s = %g: YaRN needs a factor >= 1", k, (double)c->yarn_factor);
    if (!rc) rc = gguf_int(g, akey(m, "rope.scaling.original_context_length", k), c->seq_len, false,
                           &c->yarn_orig_ctx, err);
    if (!rc) rc = check_range(k, c->yarn_orig_ctx, 1, 1 << 24, err);
    if (!rc) rc = gguf_float(g, akey(m, "rope.scaling.yarn_beta_fast", k), 32.0, &c->yarn_beta_fast, err);
    if (!rc) rc = positive(k, c->yarn_beta_fast, err);
    if (!rc) rc = gguf_float(g, akey(m, "rope.scaling.yarn_beta_slow", k), 1.0, &c->yarn_beta_slow, err);
    if (!rc) rc = positive(k, c->yarn_beta_slow, err);
    if (!rc) rc = gguf_float(g, akey(m, "rope.scaling.yarn_attn_factor", k), 1.0, &c->yarn_attn_factor, err);
    if (!rc) rc = positive(k, c->yarn_attn_factor, err);
    return rc;
}

/* Llama 3 scaling from {arch}.rope.scaling.* keys, with Meta's defaults. */
static int llama3_factors(tp_model *m, const tp_gguf *g, float *ff, tp_err *err)
{
    char k[MAX_KEY];
    float factor = 0, lo = 0, hi = 0;
    int orig = 0;
    int rc = gguf_float(g, akey(m, "rope.scaling.factor", k), LLAMA3_FACTOR, &factor, err);
    if (!rc) rc = positive(k, factor, err);
    if (!rc) rc = gguf_float(g, akey(m, "rope.scaling.low_freq_factor", k), LLAMA3_LOW_FREQ_FACTOR, &lo, err);
    if (!rc) rc = positive(k, lo, err);
    if (!rc) rc = gguf_float(g, akey(m, "rope.scaling.high_freq_factor", k), LLAMA3_HIGH_FREQ_FACTOR, &hi, err);
    if (!rc) rc = positive(k, hi, err);
    if (!rc) rc = gguf_int(g, akey(m, "rope.scaling.original_context_length", k), LLAMA3_ORIG_CONTEXT, false,
                           &orig, err);
    if (!rc) rc = positive(k, orig, err);
    if (rc)
        return rc;
    if (!(hi > lo))
        return tp_err_set(err, TP_EFORMAT, "gguf: %s.rope.scaling.high_freq_factor %g must exceed "
                          "low_freq_factor %g", m->arch_name, (double)hi, (double)lo);
    tp_rope_llama3_divisors(m->cfg.head_size, m->cfg.rope_theta, factor, lo, hi, orig, ff);
    return 0;
}

/* Positive finite divisors of a float tensor, copied (the file's may be
 * unaligned); *out NULL when the optional tensor is absent. */
static int rope_divisors(tp_model *m, const tp_gguf *g, const char *name, int half, float **out, tp_err *err)
{
    const float *t = NULL;
    *out = NULL;
    int rc = gguf_tensor_opt(m, g, name, half, 0, true, &t, err);
    if (rc == TP_ENOTFOUND) {
        tp_err_clear(err);
        return 0;
    }
    if (rc)
        return rc;
    if (!(*out = malloc((size_t)half * sizeof **out)))
        return tp_err_set(err, TP_ENOMEM, "model: out of memory");
    for (int i = 0; i < half; i++) {
        float v;
        memcpy(&v, t + i, 4);
        if (!(v > 0 && isfinite(v)))
            return tp_err_set(err, TP_EFORMAT, "gguf: %s[%d] = %g is not positive", name, i, (double)v);
        (*out)[i] = v;
    }
    return 0;
}

/* LongRoPE (Phi-3.5, Phi-4-mini; model.h rope_orig_ctx): the two factor
 * sets as llama.cpp loads them (both optional, one tensor each for all
 * layers), the original context (default: the model's) and the attention
 * factor. */
static int gguf_longrope(tp_model *m, const tp_gguf *g, tp_err *err)
{
    char k[MAX_KEY];
    tp_model_config *c = &m->cfg;
    c->rope_attn_factor = 1.0f;
    c->rope_orig_ctx = c->seq_len;
    if (!(m->arch->flags & TP_ARCHF_LONGROPE))
        return 0;
    int half = c->rope_dim / 2;
    int rc = rope_divisors(m, g, "rope_factors_long.weight", half, &m->rope_long, err);
    if (!rc) rc = rope_divisors(m, g, "rope_factors_short.weight", half, &m->rope_short, err);
    if (!rc) rc = gguf_float(g, akey(m, "rope.scaling.attn_factor", k), 1.0, &c->rope_attn_factor, err);
    if (!rc) rc = positive(k, c->rope_attn_factor, err);
    if (!rc) rc = gguf_int(g, akey(m, "rope.scaling.original_context_length", k), c->seq_len, false,
                           &c->rope_orig_ctx, err);
    if (!rc && c->rope_orig_ctx < 1)
        rc = tp_err_set(err, TP_EFORMAT, "gguf: %s = %d is not a positive context", k, c->rope_orig_ctx);
    m->w.rope_long = m->rope_long;
    m->w.rope_short = m->rope_short;
    return rc;
}

/* RoPE frequency divisors: llama.cpp stores Llama 3's as the tensor
 * rope_freqs.weight (what it uses even when the keys say llama3); files
 * may instead carry {arch}.rope.scaling.type = llama3 (with its factors),
 * linear (one factor, or the older {arch}.rope.scale_linear) or yarn (its
 * keys in the config: the forward blends each pair's angle and scales cos
 * and sin, model.h); LongRoPE's (longrope, su) are its tensors, read by
 * gguf_longrope, for the architectures that have them. Other kinds are
 * refused by name. */
static int gguf_rope_scaling(tp_model *m, const tp_gguf *g, tp_err *err)
{
    char k[MAX_KEY];
    int half = m->cfg.rope_dim / 2; /* llama.cpp's n_rot / 2 pairs */
    int rc = gguf_longrope(m, g, err);
    if (!rc)
        rc = rope_divisors(m, g, "rope_freqs.weight", half, &m->rope_freqs, err);
    if (rc)
        return rc;
    tp_gguf_str type = {"none", 4};
    rc = tp_gguf_get_str(g, akey(m, "rope.scaling.type", k), &type, err);
    if (rc == TP_ENOTFOUND)
        tp_err_clear(err);
    else if (rc)
        return rc;
    float linear = 1.0f;
    if ((rc = gguf_float(g, akey(m, "rope.scale_linear", k), 1.0, &linear, err)) || (rc = positive(k, linear, err)))
        return rc;
    bool llama3 = str_is(type, "llama3");
    if (str_is(type, "yarn")) {
        if ((rc = gguf_yarn(m, g, err)))
            return rc;
    } else if (str_is(type, "linear")) {
        if ((rc = gguf_float(g, akey(m, "rope.scaling.factor", k), 1.0, &linear, err)) ||
            (rc = positive(k, linear, err)))
            return rc;
    } else if ((m->arch->flags & TP_ARCHF_LONGROPE) && (str_is(type, "longrope") || str_is(type, "su"))) {
        /* the factors are the tensors gguf_longrope read */
    } else if (!llama3 && !str_is(type, "none")) {
        return tp_err_set(err, TP_EFORMAT, "gguf: %s.rope.scaling.type '%.*s' is not supported (none, linear, "
                          "llama3, yarn)", m->arch_name, (int)(type.len > 32 ? 32 : type.len), type.ptr);
    }
    if (!m->rope_freqs && !llama3 && linear == 1.0f)
        return 0;
    if (!m->rope_freqs) {
        if (!(m->rope_freqs = malloc((size_t)half * sizeof *m->rope_freqs)))
            return tp_err_set(err, TP_ENOMEM, "model: out of memory");
        if (llama3 && (rc = llama3_factors(m, g, m->rope_freqs, err)))
            return rc;
        for (int i = 0; !llama3 && i < half; i++)
            m->rope_freqs[i] = 1.0f;
    }
    for (int i = 0; i < half; i++)
        m->rope_freqs[i] *= linear;
    m->w.rope_freqs = m->rope_freqs;
    return 0;
}

/* Block l's tensors as its architecture lists them (model/arch_*.c). */
static int gguf_layer(tp_model *m, const tp_gguf *g, int l, tp_layer_weights *lw, tp_err *err)
{
    char name[96];
    const tp_model_config *c = &m->cfg;
    tp_arch_sizes z = tp_arch_sizes_of(c->dim, c->q_dim, c->kv_dim, c->hidden_dim, c->head_size);
    tp_arch_sizes_moe(&z, c->n_expert, c->expert_ff);
    tp_arch_sizes_heads(&z, c->n_heads);
    tp_arch_sizes_shexp(&z, c->shexp_ff);
    tp_arch_sizes_ssm(&z, c);
    bool recurrent = tp_model_layer_recurrent(c, l);
    int n_exps = 0;
    for (int i = 0; i < m->arch->n_block; i++) {
        const tp_arch_tensor *t = &m->arch->block[i];
        if (!tp_arch_tensor_in(t, c->n_expert > 0, recurrent))
            continue;
        snprintf(name, sizeof name, "blk.%d.%s", l, t->name);
        /* GGUF dims are [cols, rows]: ne0 is the input width of a matrix. */
        int ne0, ne1;
        tp_arch_shape(t, &z, &ne0, &ne1);
        if (t->flags & TP_AT_EXPERTS) {
            if (n_exps == 3) /* a bug in an arch file: three expert tensors a block */
                return tp_err_set(err, TP_EFORMAT, "gguf: more than three expert tensors in block %d", l);
            tp_wmat *views = m->exps + ((size_t)l * 3 + (size_t)n_exps++) * (size_t)c->n_expert;
            int rc = gguf_experts(m, g, name, ne0, ne1, tp_arch_ne2(t, &z), views, err);
            if (rc)
                return rc;
            *(const tp_wmat **)((char *)lw + t->typed) = views;
            continue;
        }
        bool optional = t->flags & TP_AT_OPTIONAL;
        tp_wmat whole;
        const float *whole_f32;
        const float **dst = t->n_parts ? &whole_f32 : (const float **)((char *)lw + t->f32);
        tp_wmat *wdst = t->n_parts ? &whole : (tp_wmat *)((char *)lw + t->typed);
        int rc = (t->flags & TP_AT_MATRIX) ? gguf_matrix_opt(m, g, name, ne0, ne1, optional, wdst, dst, err)
                                           : gguf_tensor_opt(m, g, name, ne0, ne1, optional, dst, err);
        if (rc == TP_ENOTFOUND && optional)
            continue;
        if (rc)
            return rc;
        /* a fused matrix: each part views its rows (any type: rows are
         * whole blocks, row_bytes apart) */
        for (int p = 0, row = 0; p < t->n_parts; p++) {
            int rows = z.v[t->parts[p].rows];
            tp_wmat *part = (tp_wmat *)((char *)lw + t->parts[p].typed);
            *part = whole;
            part->rows = rows;
            part->data = (const uint8_t *)whole.data + (size_t)row * whole.row_bytes;
            *(const float **)((char *)lw + t->parts[p].f32) = whole_f32 ? whole_f32 + (size_t)row * ne0 : NULL;
            row += rows;
        }
    }
    if (lw->bq || lw->bk || lw->bv)
        m->cfg.attn_bias = true;
    if (m->cfg.qk_norm && !recurrent && (!lw->q_norm || !lw->k_norm)) /* a bug in an arch file: the flag needs both */
        return tp_err_set(err, TP_EFORMAT, "gguf: block %d has no attn_q_norm / attn_k_norm", l);
    if (m->cfg.post_norms && (!lw->rms_att_post || !lw->rms_ffn_post))
        return tp_err_set(err, TP_EFORMAT, "gguf: block %d has no post_attention_norm / post_ffw_norm", l);
    if (c->n_expert && (!lw->w1_exps || !lw->w2_exps || !lw->w3_exps || !lw->m.wr.data)) /* likewise */
        return tp_err_set(err, TP_EFORMAT, "gguf: block %d has no router or expert tensors", l);
    if (c->shexp_ff && (!lw->m.w1_shexp.data || !lw->m.w2_shexp.data || !lw->m.w3_shexp.data || !lw->shexp_gate))
        return tp_err_set(err, TP_EFORMAT, "gguf: block %d has no shared expert tensors", l); /* likewise */
    return 0;
}

/* A tensor the loader did not take would be silently left out of the
 * computation (a bias, a norm of another architecture): refuse the file. */
static int gguf_no_unused(const tp_model *m, const tp_gguf *g, tp_err *err)
{
    for (uint64_t i = 0; i < tp_gguf_n_tensors(g); i++)
        if (!m->tensor_used[i]) {
            const tp_gguf_tensor *t = tp_gguf_tensor_at(g, i);
            return tp_err_set(err, TP_EFORMAT, "gguf: tensor '%.*s' is not used by the %s architecture",
                              (int)(t->name.len > 64 ? 64 : t->name.len), t->name.ptr, m->arch_name);
        }
    return 0;
}

static int gguf_weights(tp_model *m, const tp_gguf *g, tp_err *err)
{
    const tp_model_config *c = &m->cfg;
    m->tensor_used = calloc(tp_gguf_n_tensors(g) + 1, sizeof *m->tensor_used);
    if (!m->tensor_used)
        return tp_err_set(err, TP_ENOMEM, "model: out of memory");
    int rc = alloc_layers(m, err);
    if (!rc && c->n_expert) {
        m->exps = calloc((size_t)c->n_layers * 3 * (size_t)c->n_expert, sizeof *m->exps);
        if (!m->exps)
            rc = tp_err_set(err, TP_ENOMEM, "model: out of memory for %d experts' views", c->n_expert);
    }
    if (!rc) rc = gguf_matrix(m, g, "token_embd.weight", c->dim, c->vocab_size, &m->w.m.token_embedding,
                              &m->w.token_embedding, err);
    if (!rc) rc = gguf_tensor(m, g, "output_norm.weight", c->dim, 0, &m->w.rms_final, err);
    for (int l = 0; !rc && l < c->n_layers; l++)
        rc = gguf_layer(m, g, l, &m->layers[l], err);
    if (!rc)
        rc = gguf_rope_scaling(m, g, err);
    if (rc)
        return rc;
    /* llama.cpp's llama2.c converter keeps wq/wk in llama2.c's interleaved
     * RoPE layout (rope type NORM), so no un-permuting is needed; the test
     * suite checks the GGUF gives the .bin's tokens. */
    if (c->shared_classifier) {
        m->w.wcls = m->w.token_embedding;
        m->w.m.wcls = m->w.m.token_embedding;
    } else if ((rc = gguf_matrix(m, g, "output.weight", c->dim, c->vocab_size, &m->w.m.wcls, &m->w.wcls,
                                 err))) {
        return rc;
    }
    return gguf_no_unused(m, g, err);
}

/* The file's vocabulary, from the one reader (vocab.c). A sampled BOS ends
 * a TinyStories story; but a vocabulary without a BOS (Qwen's) gets
 * SentencePiece's default id 1 nowhere, and a BPE vocabulary's default
 * is none: only ids the file names end generation. */
static int gguf_vocab(tp_model *m, const tp_gguf *g, tp_err *err)
{
    int V = m->cfg.vocab_size;
    int rc = tp_gguf_vocab_read(g, &m->vocab, err);
    if (rc == TP_ENOTFOUND) { /* weights only: the tokenizer is a separate file */
        tp_err_clear(err);
        m->n_eos = 0;
        if (V > 2)
            m->eos[m->n_eos++] = 2;
        return 0;
    }
    if (rc) {
        char msg[TP_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err ? err->msg : "");
        return tp_err_set(err, rc, "gguf: %s", msg);
    }
    const tp_vocab_spec *v = &m->vocab.spec;
    if (v->n != V)
        return tp_err_set(err, TP_EFORMAT, "gguf: tokenizer.ggml.tokens has %d entries, the model has %d", v->n, V);
    m->n_eos = 0;
    if (m->vocab.bos_given && v->bos_id >= 0)
        m->eos[m->n_eos++] = v->bos_id;
    if (v->eos_id >= 0 && (!m->n_eos || v->eos_id != v->bos_id))
        m->eos[m->n_eos++] = v->eos_id;
    return 0;
}

static int gguf_open(tp_model *m, tp_err *err)
{
    int rc = tp_gguf_parse(m->data, m->size, &m->gguf, err);
    if (!rc) rc = gguf_config(m, m->gguf, err);
    if (!rc) rc = gguf_weights(m, m->gguf, err);
    if (!rc) rc = gguf_vocab(m, m->gguf, err);
    return rc;
}

/* ---- common ------------------------------------------------------------ */

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void make_identity(tp_model *m)
{
    size_t n = m->size < HASH_BYTES ? m->size : HASH_BYTES;
    uint64_t h = fnv1a(0xcbf29ce484222325ull, m->data, n);
    h = fnv1a(h, m->data + m->size - n, n);
    const tp_model_config *c = &m->cfg;
    snprintf(m->identity, sizeof m->identity,
             "%s%s%s dim=%d hidden=%d layers=%d heads=%d kv_heads=%d vocab=%d seq=%d size=%zu h=%016llx",
             m->format == TP_MODEL_GGUF ? "gguf" : "llama2c", m->arch_name[0] ? " " : "", m->arch_name, c->dim, c->hidden_dim, c->n_layers,
             c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len, m->size, (unsigned long long)h);
    if (c->n_expert) { /* after h: identities of dense models stay as they were */
        size_t n = strlen(m->identity);
        snprintf(m->identity + n, sizeof m->identity - n, " experts=%d/%d/%d", c->n_expert, c->n_expert_used,
                 c->expert_ff);
        n = strlen(m->identity);
        if (c->shexp_ff)
            snprintf(m->identity + n, sizeof m->identity - n, " shexp=%d", c->shexp_ff);
    }
}

int tp_model_from_memory(const void *data, size_t size, tp_model **out, tp_err *err)
{
    *out = NULL;
    if ((uintptr_t)data % 4)
        return tp_err_set(err, TP_EINVAL, "model: buffer is not 4-byte aligned");
    tp_model *m = calloc(1, sizeof *m);
    if (!m)
        return tp_err_set(err, TP_ENOMEM, "model: out of memory");
    m->data = data;
    m->size = size;
    bool gguf = size >= 4 && !memcmp(data, "GGUF", 4);
    m->format = gguf ? TP_MODEL_GGUF : TP_MODEL_LLAMA2C;
    int rc = gguf ? gguf_open(m, err) : llama2c_open(m, err);
    if (rc) {
        tp_model_free(m);
        return rc;
    }
    make_identity(m);
    *out = m;
    return 0;
}

static int map_file(const char *path, void **map, size_t *size, tp_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tp_err_set(err, TP_EIO, "model: cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        return tp_err_set(err, TP_EIO, "model: %s is not a non-empty regular file", path);
    }
    *size = (size_t)st.st_size;
    *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (*map == MAP_FAILED)
        return tp_err_set(err, TP_EIO, "model: cannot mmap %s: %s", path, strerror(errno));
    return 0;
}

int tp_model_load(const char *path, tp_model **out, tp_err *err)
{
    *out = NULL;
    void *map = NULL;
    size_t size = 0;
    int rc = map_file(path, &map, &size, err);
    if (rc)
        return rc;
    rc = tp_model_from_memory(map, size, out, err);
    if (rc) {
        munmap(map, size);
        if (err) {
            char msg[TP_ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", err->msg);
            tp_err_set(err, rc, "%s: %s", path, msg);
        }
        return rc;
    }
    (*out)->map = map;
    (*out)->map_size = size;
    return 0;
}

void tp_model_free(tp_model *m)
{
    if (!m)
        return;
    tp_gguf_free(m->gguf);
    free(m->layers);
    free(m->exps);
    free(m->rope_freqs);
    free(m->rope_long);
    free(m->rope_short);
    free(m->tensor_used);
    tp_gguf_vocab_release(&m->vocab);
    if (m->map)
        munmap(m->map, m->map_size);
    free(m);
}

tp_model_format tp_model_get_format(const tp_model *m) { return m->format; }
const tp_model_config *tp_model_get_config(const tp_model *m) { return &m->cfg; }
const tp_model_weights *tp_model_get_weights(const tp_model *m) { return &m->w; }
const char *tp_model_identity(const tp_model *m) { return m->identity; }

void tp_model_drop_pages(const tp_model *m, const void *p, size_t n)
{
    uintptr_t lo = (uintptr_t)m->map, hi = lo + m->map_size, a = (uintptr_t)p, b = a + n;
    if (!m->map || a < lo || b > hi)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    a = (a + page - 1) & ~(page - 1);
    b &= ~(page - 1);
    if (b > a) /* a private read-only file mapping: dropped pages are the file's again */
        madvise((void *)a, b - a, MADV_DONTNEED);
}

bool tp_model_all_f32(const tp_model *m)
{
    const tp_model_weights *w = &m->w;
    if (w->m.token_embedding.type != TP_GGML_F32 || w->m.wcls.type != TP_GGML_F32)
        return false;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const tp_wmat *v[] = {&w->layers[l].m.wq, &w->layers[l].m.wk, &w->layers[l].m.wv, &w->layers[l].m.wo,
                              &w->layers[l].m.w1, &w->layers[l].m.w2, &w->layers[l].m.w3};
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
            if (v[i]->type != TP_GGML_F32)
                return false;
        if (m->cfg.n_expert && (w->layers[l].m.wr.type != TP_GGML_F32 ||
                                w->layers[l].w1_exps[0].type != TP_GGML_F32 ||
                                w->layers[l].w2_exps[0].type != TP_GGML_F32 ||
                                w->layers[l].w3_exps[0].type != TP_GGML_F32))
            return false; /* one type a 3-D tensor: its first expert's */
        if (m->cfg.shexp_ff && (w->layers[l].m.w1_shexp.type != TP_GGML_F32 ||
                                w->layers[l].m.w2_shexp.type != TP_GGML_F32 ||
                                w->layers[l].m.w3_shexp.type != TP_GGML_F32))
            return false;
    }
    return true;
}

int tp_model_eos_ids(const tp_model *m, const int **ids)
{
    *ids = m->eos;
    return m->n_eos;
}

int tp_model_tokenizer(const tp_model *m, tp_tokenizer **out, tp_err *err)
{
    *out = NULL;
    const tp_gguf_vocab *v;
    int rc = tp_model_vocab_get(m, &v, err);
    return rc ? rc : tp_gguf_vocab_tokenizer(v, out, err);
}

int tp_model_vocab_get(const tp_model *m, const tp_gguf_vocab **out, tp_err *err)
{
    *out = NULL;
    if (!m->vocab.spec.n)
        return tp_err_set(err, TP_ENOTFOUND, "model: %s file has no embedded vocabulary",
                          m->format == TP_MODEL_GGUF ? "this GGUF" : "a llama2.c");
    *out = &m->vocab;
    return 0;
}
