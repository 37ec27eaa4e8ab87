/* Seeded random GGUF models of the llama / Llama 3 / qwen2 architectures,
 * with a vocabulary copied from another GGUF file. */
#include "tokpipe/synth.h"
#include "tokpipe/gguf.h"
#include "tokpipe/gguf_write.h"
#include "tokpipe/model.h"

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

typedef struct arch_defaults {
    const char *flag, *gguf_arch;
    float theta, eps;
    bool bias, llama3;
} arch_defaults;

static const arch_defaults ARCHES[] = {
    {"llama", "llama", 10000.0f, 1e-5f, false, false},
    {"llama3", "llama", 500000.0f, 1e-5f, false, true},
    {"qwen2", "qwen2", 1000000.0f, 1e-6f, true, false},
};

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

enum fill { MATRIX, NORM, BIAS };

static int tensor(builder *b, const char *name, int ne0, int ne1, enum fill fill, tp_err *err)
{
    size_t n = (size_t)ne0 * (size_t)(ne1 ? ne1 : 1);
    if (n > b->cap - b->used)
        return tp_err_set(err, TP_EINVAL, "mkmodel: tensor budget exceeded at %s", name); /* a bug here */
    float *p = b->buf + b->used;
    float scale = fill == MATRIX ? 0.5f / sqrtf((float)ne0) : fill == NORM ? 0.25f : 0.5f;
    for (size_t i = 0; i < n; i++)
        p[i] = (fill == NORM ? 1.0f : 0.0f) + scale * uniform(&b->r);
    b->used += n;
    uint64_t ne[2] = {(uint64_t)ne0, (uint64_t)ne1};
    return tp_gguf_add_tensor(b->w, name, 0 /* F32 */, ne1 ? 2 : 1, ne, p, n * sizeof(float), err);
}

static size_t total_floats(const tp_synth_shape *s, int vocab, const tp_synth_gguf *o)
{
    size_t d = (size_t)s->dim, h = (size_t)s->hidden_dim, hs = d / (size_t)s->n_heads;
    size_t kvd = hs * (size_t)s->n_kv_heads, V = (size_t)vocab;
    size_t layer = 2 * d + 2 * d * d + 2 * kvd * d + 3 * h * d + d + 2 * kvd;
    return V * d * (o->separate_output ? 2 : 1) + d + hs / 2 + (size_t)s->n_layers * layer;
}

static int metadata(builder *b, const tp_synth_shape *s, const arch_defaults *a, const tp_synth_gguf *o,
                    tp_err *err)
{
    char k[96];
    const char *p = a->gguf_arch;
    int rc = tp_gguf_set_str(b->w, "general.architecture", p, err);
    if (!rc) rc = tp_gguf_set_str(b->w, "general.name", "tokpipe mkmodel random weights", err);
    if (!rc) rc = tp_gguf_set_u32(b->w, "general.file_type", 0 /* all F32 */, err);
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", p, suffix), k)
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("context_length"), (uint32_t)s->seq_len, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("embedding_length"), (uint32_t)s->dim, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("block_count"), (uint32_t)s->n_layers, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("feed_forward_length"), (uint32_t)s->hidden_dim, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("attention.head_count"), (uint32_t)s->n_heads, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("attention.head_count_kv"), (uint32_t)s->n_kv_heads, err);
    if (!rc) rc = tp_gguf_set_u32(b->w, KEY("rope.dimension_count"), (uint32_t)(s->dim / s->n_heads), err);
    if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.freq_base"), a->theta, err);
    if (!rc) rc = tp_gguf_set_f32(b->w, KEY("attention.layer_norm_rms_epsilon"), a->eps, err);
    if (!rc && a->llama3 && o->rope_scaling_keys) {
        rc = tp_gguf_set_str(b->w, KEY("rope.scaling.type"), "llama3", err);
        if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.scaling.factor"), (float)L3_FACTOR, err);
        if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.scaling.low_freq_factor"), (float)L3_LOW, err);
        if (!rc) rc = tp_gguf_set_f32(b->w, KEY("rope.scaling.high_freq_factor"), (float)L3_HIGH, err);
        if (!rc) rc = tp_gguf_set_u32(b->w, KEY("rope.scaling.original_context_length"), L3_ORIG_CTX, err);
    }
#undef KEY
    if (!rc)
        rc = tp_gguf_copy_kv_from_file(b->w, o->vocab_from, "tokenizer.", err);
    return rc;
}

static int tensors(builder *b, const tp_synth_shape *s, int V, const arch_defaults *a, const tp_synth_gguf *o,
                   tp_err *err)
{
    int d = s->dim, h = s->hidden_dim, hs = s->dim / s->n_heads, kvd = hs * s->n_kv_heads;
    int rc = tensor(b, "token_embd.weight", d, V, MATRIX, err);
    if (!rc) rc = tensor(b, "output_norm.weight", d, 0, NORM, err);
    if (!rc && o->separate_output)
        rc = tensor(b, "output.weight", d, V, MATRIX, err);
    if (!rc && a->llama3 && !o->rope_scaling_keys) {
        float *ff = b->buf + b->used;
        tp_rope_llama3_divisors(hs, a->theta, L3_FACTOR, L3_LOW, L3_HIGH, L3_ORIG_CTX, ff);
        b->used += (size_t)hs / 2;
        uint64_t ne = (uint64_t)hs / 2;
        rc = tp_gguf_add_tensor(b->w, "rope_freqs.weight", 0, 1, &ne, ff, ne * sizeof(float), err);
    }
    struct { const char *name; int ne0, ne1; enum fill fill; bool bias; } L[] = {
        {"attn_norm.weight", d, 0, NORM, false},   {"attn_q.weight", d, d, MATRIX, false},
        {"attn_k.weight", d, kvd, MATRIX, false},  {"attn_v.weight", d, kvd, MATRIX, false},
        {"attn_q.bias", d, 0, BIAS, true},         {"attn_k.bias", kvd, 0, BIAS, true},
        {"attn_v.bias", kvd, 0, BIAS, true},       {"attn_output.weight", d, d, MATRIX, false},
        {"ffn_norm.weight", d, 0, NORM, false},    {"ffn_gate.weight", d, h, MATRIX, false},
        {"ffn_down.weight", h, d, MATRIX, false},  {"ffn_up.weight", d, h, MATRIX, false},
    };
    char name[NAME_MAX_LEN];
    for (int l = 0; !rc && l < s->n_layers; l++)
        for (size_t i = 0; !rc && i < sizeof L / sizeof L[0]; i++) {
            if (L[i].bias && !a->bias)
                continue;
            snprintf(name, sizeof name, "blk.%d.%s", l, L[i].name);
            rc = tensor(b, name, L[i].ne0, L[i].ne1, L[i].fill, err);
        }
    return rc;
}

int tp_synth_write_gguf(const char *path, const tp_synth_shape *s, uint64_t seed, const tp_synth_gguf *o,
                        tp_err *err)
{
    const arch_defaults *a = NULL;
    for (size_t i = 0; i < sizeof ARCHES / sizeof ARCHES[0]; i++)
        if (o->arch && !strcmp(o->arch, ARCHES[i].flag))
            a = &ARCHES[i];
    if (!a)
        return tp_err_set(err, TP_EINVAL, "mkmodel: architecture '%s' is not one of llama, llama3, qwen2",
                          o->arch ? o->arch : "(none)");
    if (!o->vocab_from)
        return tp_err_set(err, TP_EINVAL, "mkmodel: a GGUF model needs a vocabulary file (--vocab-from)");
    int V = 0;
    int rc = vocab_size_of(o->vocab_from, &V, err);
    if (rc)
        return rc;
    builder b = {NULL, NULL, 0, total_floats(s, V, o), {seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull}};
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
