/* Seeded random GGUF models of the architectures of model/archs.c (and
 * Llama 3: llama with its RoPE scaling), with a vocabulary copied from
 * another GGUF file. The tensors written are the ones the architecture's
 * file lists as required, in its order, under its shapes. */
#include "tokpipe/synth.h"
#include "tokpipe/gguf.h"
#include "tokpipe/gguf_write.h"
#include "tokpipe/model.h"
#include "arch.h"

#include <stdio.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME_MAX_LEN 64
/* Llama 3.1's published rope_scaling (Meta's config.json). */
#define L3_FACTOR 8.0
#define L3_LOW 1.0
#define L3_HIGH 4.0
#define L3_ORIG_CTX 8192

/* What --arch names: an architecture of the table, llama3, or mixtral
 * (llama with experts). n_expert 0: dense. */
typedef struct arch_defaults {
    const tp_arch *arch;
    float theta, eps;
    bool llama3;
    int n_expert, n_expert_used, expert_ff;
    int shexp_ff; /* TP_ARCHF_SHEXP: the shared expert's width */
} arch_defaults;

/* The sizes of a random model: heads of dim / n_heads (a shape may name
 * another head size for architectures that read attention.key_length). */
typedef struct sizes {
    int d, h, hs, q, kvd;
} sizes;

static sizes sizes_of(const tp_synth_shape *s, const tp_synth_gguf *o)
{
    int hs = o->head_dim ? o->head_dim : s->dim / s->n_heads;
    return (sizes){s->dim, s->hidden_dim, hs, hs * s->n_heads, hs * s->n_kv_heads};
}

typedef struct rng {
    uint64_t s;
} rng;

static float uniform(rng *r) /* [-1, 1) */
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (float)((double)(r->s >> 40) / (double)(1 << 23) - 1.0);
}

/* How many tokens the vocabulary file has (tokenizer.ggml.tokens). */
static int vocab_size_of(const char *path, int *n, tp_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tp_err_set(err, TP_EIO, "mkmodel: cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        return tp_err_set(err, TP_EIO, "mkmodel: %s is not a non-empty regular file", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return tp_err_set(err, TP_EIO, "mkmodel: cannot mmap %s: %s", path, strerror(errno));
    tp_gguf *g = NULL;
    tp_gguf_str *toks = NULL;
    uint64_t count = 0;
    int rc = tp_gguf_parse(map, (size_t)st.st_size, &g, err);
    if (!rc)
        rc = tp_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &count, err);
    if (!rc && (count < 3 || count > (1 << 22)))
        rc = tp_err_set(err, TP_EFORMAT, "mkmodel: %s has %llu tokens (3..%d usable)", path,
                        (unsigned long long)count, 1 << 22);
    if (!rc)
        *n = (int)count;
    free(toks);
    tp_gguf_free(g);
    munmap(map, (size_t)st.st_size);
    return rc;
}

typedef struct builder {
    tp_gguf_writer *w;
    float *buf;     /* every tensor, back to back (the writer borrows them) */
    size_t used, cap;
    rng r;
} builder;

enum fill { MATRIX, NORM, BIAS, DECAY };

/* llama.cpp's converter: norms near 1, biases and matrices near 0; a
 * DeltaNet's conv kernel like a matrix, its ssm_a (-exp(A_log)) negative
 * (a decay e^(softplus(.) * a) below 1). */
static enum fill fill_of(const tp_arch_tensor *t)
{
    size_t n = strlen(t->name);
    if ((t->flags & TP_AT_MATRIX) || !strcmp(t->name, "ssm_conv1d.weight"))
        return MATRIX;
    if (!strcmp(t->name, "ssm_a"))
        return DECAY;
    return n > 5 && !strcmp(t->name + n - 5, ".bias") ? BIAS : NORM;
}

static int tensor(builder *b, const char *name, int ne0, int ne1, int ne2, enum fill fill, tp_err *err)
{
    size_t n = (size_t)ne0 * (size_t)(ne1 ? ne1 : 1) * (size_t)(ne2 ? ne2 : 1);
    if (n > b->cap - b->used)
        return tp_err_set(err, TP_EINVAL, "mkmodel: tensor budget exceeded at %s", name); /* a bug here */
    float *p = b->buf + b->used;
    float scale = fill == MATRIX ? 0.5f / sqrtf((float)ne0) : fill == NORM ? 0.25f : 0.5f;
    for (size_t i = 0; i < n; i++)
        p[i] = (fill == NORM ? 1.0f : fill == DECAY ? -1.0f : 0.0f) + scale * uniform(&b->r);
    b->used += n;
    uint64_t ne[3] = {(uint64_t)ne0, (uint64_t)ne1, (uint64_t)ne2};
    return tp_gguf_add_tensor(b->w, name, 0 /* F32 */, ne2 ? 3 : ne1 ? 2 : 1, ne, p, n * sizeof(float), err);
}

/* A hybrid kind's DeltaNet layers (TP_ARCHF_HYBRID): heads of the
 * attention's head size, as many value heads as query heads and key
 * heads as KV heads (Qwen 3.5's 4B: 16 and 32 of 128, 16 and 4 of 256),
 * a conv of 4, and full attention every SYNTH_FULL_ATTN-th layer. */
#define SYNTH_CONV_KERNEL 4
#define SYNTH_FULL_ATTN 4

static tp_model_config ssm_of(const tp_synth_shape *s, const arch_defaults *a, const tp_synth_gguf *o)
{
    tp_model_config c = {0};
    if (!(a->arch->flags & TP_ARCHF_HYBRID))
        return c;
    c.ssm_head_dim = sizes_of(s, o).hs;
    c.ssm_k_heads = s->n_kv_heads;
    c.ssm_v_heads = s->n_heads;
    c.ssm_conv_kernel = SYNTH_CONV_KERNEL;
    c.full_attn_interval = SYNTH_FULL_ATTN;
    return c;
}

/* Partial RoPE (TP_ARCHF_ROPE_DIM): a quarter of the head, as Qwen 3.5
 * (64 of 256), at least one pair. */
static int rope_dim_of(const sizes *z, const arch_defaults *a, const tp_synth_gguf *o)
{
    if (o->rope_dim)
        return o->rope_dim;
    if (!(a->arch->flags & TP_ARCHF_ROPE_DIM) || !a->arch->mk_rope_quarters)
        return z->hs;
    int r = z->hs * a->arch->mk_rope_quarters / 4 / 2 * 2;
    return r < 2 ? 2 : r;
}

/* LongRoPE's factors (o->longrope_orig): short ones near 1, long ones
 * growing to 40 over the pairs, the shape of Phi-3.5-mini's lists. */
static float longrope_factor(int i, int half, bool lng)
{
    float x = (float)i / (float)(half > 1 ? half - 1 : 1);
    return lng ? 1.0f + 39.0f * x * x : 1.0f + 0.1f * x;
}

static tp_arch_sizes arch_sizes(const tp_synth_shape *s, const arch_defaults *a, const tp_synth_gguf *o)
{
    sizes z = sizes_of(s, o);
    tp_arch_sizes az = tp_arch_sizes_of(z.d, z.q, z.kvd, z.h, z.hs);
    tp_arch_sizes_moe(&az, a->n_expert, a->expert_ff);
    tp_arch_sizes_heads(&az, s->n_heads);
    tp_arch_sizes_shexp(&az, a->shexp_ff);
    tp_model_config c = ssm_of(s, a, o);
    tp_arch_sizes_ssm(&az, &c);
    return az;
}

static size_t total_floats(const tp_synth_shape *s, int vocab, const arch_defaults *ad, const tp_synth_gguf *o)
{
    sizes z = sizes_of(s, o);
    tp_arch_sizes az = arch_sizes(s, ad, o);
    const tp_arch *a = ad->arch;
    tp_model_config ssm = ssm_of(s, ad, o);
    size_t layers = 0;
    for (int l = 0; l < s->n_layers; l++)
        for (int i = 0; i < a->n_block; i++) {
            int ne0, ne1, ne2 = tp_arch_ne2(&a->block[i], &az);
            if (!tp_arch_tensor_in(&a->block[i], ad->n_expert > 0, tp_model_layer_recurrent(&ssm, l)))
                continue;
            tp_arch_shape(&a->block[i], &az, &ne0, &ne1);
            layers += (size_t)ne0 * (size_t)(ne1 ? ne1 : 1) * (size_t)(ne2 ? ne2 : 1);
        }
    size_t d = (size_t)z.d, V = (size_t)vocab;
    return V * d * (o->separate_output || ad->arch->mk_output ? 2 : 1) + d + (size_t)z.hs / 2 * 3 + layers;
}

static int metadata(builder *b, const tp_synth_shape *s, const arch_defaults *a, const tp_synth_gguf *o,
                    tp_err *err)
{
    char k[96];
    const char *p = a->arch->name;
    sizes z = sizes_of(s, o);
    int rc = tp_gguf_set_str(b->w, "general.architecture", p, err);
    if (!rc) rc = tp_gguf_set_str(b->w, "general.name", "tokpipe mkmodel random weights", err);
    if (!rc) rc = tp_gguf_set_u32(b->w, "general.file_type", 0 /* all F32 */, err);
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", p, suffix), k)
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("context_length"), (uint32_t)s->seq_len, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("embedding_length"), (uint32_t)s->dim, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("block_count"), (uint32_t)s->n_layers, err);
    /* an architecture without expert_feed_forward_length (llama) sizes its experts by this */
    int ff = a->n_expert && !(a->arch->flags & TP_ARCHF_EXPERT_FF_KEY) ? a->expert_ff : s->hidden_dim;
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("feed_forward_length"), (uint32_t)ff, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("attention.head_count"), (uint32_t)s->n_heads, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("attention.head_count_kv"), (uint32_t)s->n_kv_heads, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("rope.dimension_count"), (uint32_t)rope_dim_of(&z, a, o), err);
    tp_model_config ssm = ssm_of(s, a, o);
    if (!rc && ssm.full_attn_interval) { /* as llama.cpp's converter writes Qwen 3.5's */
        rc = tp_gguf_set_u32(b->w, KEY("ssm.conv_kernel"), (uint32_t)ssm.ssm_conv_kernel, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("ssm.state_size"), (uint32_t)ssm.ssm_head_dim, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("ssm.group_count"), (uint32_t)ssm.ssm_k_heads, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("ssm.time_step_rank"), (uint32_t)ssm.ssm_v_heads, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("ssm.inner_size"),
                                      (uint32_t)(ssm.ssm_head_dim * ssm.ssm_v_heads), err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("full_attention_interval"), (uint32_t)ssm.full_attn_interval, err);
        /* llama.cpp requires IMROPE's sections (Qwen 3.5: 11, 11, 10 of 32 pairs); a text turns
         * every section by its position alike */
        int half = rope_dim_of(&z, a, o) / 2, s0 = (half + 2) / 3;
        int32_t sec[4] = {s0, s0 < half - s0 ? s0 : half - s0, 0, 0};
        sec[2] = half - sec[0] - sec[1];
        if (!rc) rc = tp_gguf_set_arr_i32(b->w, KEY("rope.dimension_sections"), sec, 4, err);
    }
    if (!rc && (a->arch->flags & TP_ARCHF_HEAD_DIM_KEY)) { /* as the converter writes head_dim */
        rc = tp_gguf_set_u32(b->w, KEY("attention.key_length"), (uint32_t)z.hs, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("attention.value_length"), (uint32_t)z.hs, err);
    }
    if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.freq_base"), a->theta, err);
    if (!rc) rc = tp_gguf_set_f32(b->w, KEY("attention.layer_norm_rms_epsilon"), a->eps, err);
    if (!rc && a->arch->swa_pattern) /* as the converter writes Gemma's sliding_window */
        rc = tp_gguf_set_u32(b->w, KEY("attention.sliding_window"),
                             (uint32_t)(o->sliding_window ? o->sliding_window : a->arch->mk_sliding_window), err);
    if (!rc && (a->arch->flags & TP_ARCHF_ATTN_SOFTCAP))
        rc = tp_gguf_set_f32(b->w, KEY("attn_logit_softcapping"), (float)a->arch->attn_softcap, err);
    if (!rc && (a->arch->flags & TP_ARCHF_FINAL_SOFTCAP) && a->arch->final_softcap > 0)
        rc = tp_gguf_set_f32(b->w, KEY("final_logit_softcapping"), (float)a->arch->final_softcap, err);
    if (!rc && a->llama3 && o->rope_scaling_keys) {
        rc = tp_gguf_set_str(b->w, KEY("rope.scaling.type"), "llama3", err);
        if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.scaling.factor"), (float)L3_FACTOR, err);
        if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.scaling.low_freq_factor"), (float)L3_LOW, err);
        if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.scaling.high_freq_factor"), (float)L3_HIGH, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("rope.scaling.original_context_length"), L3_ORIG_CTX, err);
    }
    if (!rc && a->arch->mk_yarn_factor > 0) { /* gpt-oss's config.json rope_scaling, converted */
        rc = tp_gguf_set_str(b->w, KEY("rope.scaling.type"), "yarn", err);
        if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.scaling.factor"), a->arch->mk_yarn_factor, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("rope.scaling.original_context_length"),
                                      (uint32_t)a->arch->mk_yarn_orig_ctx, err);
    }
    if (!rc && o->rope_linear > 0) {
        rc = tp_gguf_set_str(b->w, KEY("rope.scaling.type"), "linear", err);
        if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.scaling.factor"), o->rope_linear, err);
    }
    if (!rc && o->longrope_orig) { /* convert_hf_to_gguf.py's Phi3MiniModel */
        double scale = (double)s->seq_len / o->longrope_orig;
        float attn = scale > 1 ? (float)sqrt(1 + log(scale) / log((double)o->longrope_orig)) : 1.0f;
        rc = tp_gguf_set_f32(b->w, KEY("rope.scaling.attn_factor"), attn, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("rope.scaling.original_context_length"),
                                      (uint32_t)o->longrope_orig, err);
    }
    if (!rc && a->n_expert) { /* as llama.cpp's converter writes them */
        rc = tp_gguf_set_u32(b->w, KEY("expert_count"), (uint32_t)a->n_expert, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("expert_used_count"), (uint32_t)a->n_expert_used, err);
        if (!rc && (a->arch->flags & TP_ARCHF_EXPERT_FF_KEY))
            rc = tp_gguf_set_u32(b->w, KEY("expert_feed_forward_length"), (uint32_t)a->expert_ff, err);
        if (!rc && a->shexp_ff)
            rc = tp_gguf_set_u32(b->w, KEY("expert_shared_feed_forward_length"), (uint32_t)a->shexp_ff, err);
    }
    if (!rc && o->pooling > 0)
        rc = tp_gguf_set_u32(b->w, KEY("pooling_type"), (uint32_t)o->pooling, err);
#undef KEY
    if (!rc)
        rc = tp_gguf_copy_kv_from_file(b->w, o->vocab_from, "tokenizer.", err);
    return rc;
}

static int tensors(builder *b, const tp_synth_shape *s, int V, const arch_defaults *a, const tp_synth_gguf *o,
                   tp_err *err)
{
    sizes z = sizes_of(s, o);
    int d = z.d, hs = z.hs;
    int rc = tensor(b, "token_embd.weight", d, V, 0, MATRIX, err);
    if (!rc) rc = tensor(b, "output_norm.weight", d, 0, 0, NORM, err);
    if (!rc && (o->separate_output || a->arch->mk_output))
        rc = tensor(b, "output.weight", d, V, 0, MATRIX, err);
    if (!rc && a->llama3 && !o->rope_scaling_keys) {
        float *ff = b->buf + b->used;
        tp_rope_llama3_divisors(hs, a->theta, L3_FACTOR, L3_LOW, L3_HIGH, L3_ORIG_CTX, ff);
        b->used += (size_t)hs / 2;
        uint64_t ne = (uint64_t)hs / 2;
        rc = tp_gguf_add_tensor(b->w, "rope_freqs.weight", 0, 1, &ne, ff, ne * sizeof(float), err);
    }
    for (int k = 0; !rc && o->longrope_orig && k < 2; k++) {
        int half = rope_dim_of(&z, a, o) / 2;
        float *ff = b->buf + b->used;
        for (int i = 0; i < half; i++)
            ff[i] = longrope_factor(i, half, k == 0);
        b->used += (size_t)half;
        uint64_t ne = (uint64_t)half;
        rc = tp_gguf_add_tensor(b->w, k == 0 ? "rope_factors_long.weight" : "rope_factors_short.weight", 0, 1, &ne,
                                ff, ne * sizeof(float), err);
    }
    char name[NAME_MAX_LEN];
    tp_arch_sizes az = arch_sizes(s, a, o);
    tp_model_config ssm = ssm_of(s, a, o);
    for (int l = 0; !rc && l < s->n_layers; l++)
        for (int i = 0; !rc && i < a->arch->n_block; i++) {
            const tp_arch_tensor *t = &a->arch->block[i];
            if ((t->flags & TP_AT_OPTIONAL) ||
                !tp_arch_tensor_in(t, a->n_expert > 0, tp_model_layer_recurrent(&ssm, l)))
                continue;
            snprintf(name, sizeof name, "blk.%d.%s", l, t->name);
            int ne0, ne1;
            tp_arch_shape(t, &az, &ne0, &ne1);
            rc = tensor(b, name, ne0, ne1, tp_arch_ne2(t, &az), fill_of(t), err);
        }
    return rc;
}

/* --arch: a name of the table (its typical RoPE base and epsilon), llama3
 * or mixtral (llama, 8 experts, 2 used); o's expert counts over the
 * kind's. */
static int pick_arch(const char *flag, const tp_synth_shape *s, const tp_synth_gguf *o, arch_defaults *out,
                     tp_err *err)
{
    bool llama3 = flag && !strcmp(flag, "llama3"), mixtral = flag && !strcmp(flag, "mixtral");
    const tp_arch *a = llama3 || mixtral ? tp_arch_find("llama", 5) : flag ? tp_arch_find(flag, strlen(flag)) : NULL;
    if (!a) {
        char names[256];
        size_t n = (size_t)snprintf(names, sizeof names, "llama, llama3");
        for (int i = 0; i < tp_n_archs && n < sizeof names; i++)
            if (strcmp(tp_archs[i]->name, "llama"))
                n += (size_t)snprintf(names + n, sizeof names - n, ", %s", tp_archs[i]->name);
        if (n < sizeof names)
            snprintf(names + n, sizeof names - n, ", mixtral");
        return tp_err_set(err, TP_EINVAL, "mkmodel: architecture '%s' is not one of %s", flag ? flag : "(none)",
                          names);
    }
    *out = (arch_defaults){a, llama3 ? 500000.0f : a->mk_rope_base, a->mk_norm_eps, llama3, 0, 0, 0, 0};
    if (o->shexp_ff && !(a->flags & TP_ARCHF_SHEXP))
        return tp_err_set(err, TP_EINVAL, "mkmodel: --arch %s has no shared expert (--shared-ff)", flag);
    int ne = mixtral ? 8 : a->mk_experts, used = mixtral ? 2 : a->mk_experts_used;
    if (o->n_expert)
        ne = o->n_expert;
    if (o->n_expert_used)
        used = o->n_expert_used;
    if (!ne)
        return o->n_expert_used || o->expert_ff
                   ? tp_err_set(err, TP_EINVAL, "mkmodel: --experts-used / --expert-ff need experts (--experts)")
                   : 0;
    bool moe_ok = false;
    for (int i = 0; i < a->n_block; i++)
        moe_ok = moe_ok || (a->block[i].flags & TP_AT_MOE);
    if (!moe_ok || llama3)
        return tp_err_set(err, TP_EINVAL, "mkmodel: --arch %s has no experts", flag);
    if (ne < 1 || ne > 512 || used < 1 || used > ne)
        return tp_err_set(err, TP_EINVAL, "mkmodel: %d experts, %d used: want 1 <= used <= experts <= 512", ne,
                          used);
    out->n_expert = ne;
    out->n_expert_used = used;
    out->expert_ff = o->expert_ff ? o->expert_ff : s->hidden_dim;
    if (a->flags & TP_ARCHF_SHEXP) /* Qwen3.5-35B-A3B's shared expert is as wide as one routed */
        out->shexp_ff = o->shexp_ff ? o->shexp_ff : out->expert_ff;
    return 0;
}

int tp_synth_write_gguf(const char *path, const tp_synth_shape *s, uint64_t seed, const tp_synth_gguf *o,
                        tp_err *err)
{
    arch_defaults ad = {NULL, 0, 0, false, 0, 0, 0, 0};
    int rc = pick_arch(o->arch, s, o, &ad, err);
    if (rc)
        return rc;
    const arch_defaults *a = &ad;
    if (!o->vocab_from)
        return tp_err_set(err, TP_EINVAL, "mkmodel: a GGUF model needs a vocabulary file (--vocab-from)");
    if (o->head_dim && (!(a->arch->flags & TP_ARCHF_HEAD_DIM_KEY) || o->head_dim < 2 || o->head_dim % 2 ||
                        o->head_dim > 4096))
        return tp_err_set(err, TP_EINVAL, "mkmodel: --head-dim %d: %s", o->head_dim,
                          (a->arch->flags & TP_ARCHF_HEAD_DIM_KEY) ? "must be even, 2..4096"
                          : "this architecture's head size is dim / heads (it does not read key_length)");
    if (o->sliding_window && (!a->arch->swa_pattern || o->sliding_window < 1))
        return tp_err_set(err, TP_EINVAL, "mkmodel: --sliding-window %d: %s", o->sliding_window,
                          a->arch->swa_pattern ? "must be positive" : "this architecture has no sliding window");
    sizes z = sizes_of(s, o);
    if (o->rope_dim && (!(a->arch->flags & TP_ARCHF_ROPE_DIM) || o->rope_dim < 2 || o->rope_dim % 2 ||
                        o->rope_dim > z.hs))
        return tp_err_set(err, TP_EINVAL, "mkmodel: --rope-dim %d: %s %d", o->rope_dim,
                          (a->arch->flags & TP_ARCHF_ROPE_DIM) ? "must be even, 2.. the head size"
                                                               : "this architecture turns the whole head of",
                          z.hs);
    bool factor_ok = o->rope_linear >= 1 && o->rope_linear <= 1e6;
    if (o->rope_linear && (!factor_ok || a->llama3 || a->arch->mk_yarn_factor > 0))
        return tp_err_set(err, TP_EINVAL, "mkmodel: --rope-linear %g: %s", (double)o->rope_linear,
                          factor_ok ? "this architecture's files scale RoPE their own way" : "must be 1 or more");
    if (o->longrope_orig && !(a->arch->flags & TP_ARCHF_LONGROPE))
        return tp_err_set(err, TP_EINVAL, "mkmodel: --longrope: only phi3 files carry LongRoPE");
    int V = 0;
    rc = vocab_size_of(o->vocab_from, &V, err);
    if (rc)
        return rc;
    builder b = {NULL, NULL, 0, total_floats(s, V, a, o), {seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull}};
    if (!b.r.s)
        b.r.s = 1;
    b.buf = malloc(b.cap * sizeof(float));
    if (!b.buf)
        return tp_err_set(err, TP_ENOMEM, "mkmodel: cannot allocate %zu floats", b.cap);
    rc = tp_gguf_writer_new(&b.w, err);
    if (!rc) rc = metadata(&b, s, a, o, err);
    if (!rc) rc = tensors(&b, s, V, a, o, err);
    if (!rc) rc = tp_gguf_write(b.w, path, err);
    tp_gguf_writer_free(b.w);
    free(b.buf);
    return rc;
}
