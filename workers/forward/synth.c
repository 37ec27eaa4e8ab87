/* Seeded random llama2.c checkpoints and synthetic tokenizers. */
#include "tokpipe/synth.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_FLOATS (1 << 16)
#define MAX_SHAPE_DIM (1 << 16)

typedef struct named_shape {
    const char *name;
    tp_synth_shape s;
} named_shape;

static const named_shape NAMED[] = {
    {"stories15M", {288, 768, 6, 6, 6, 32000, 256}},
    {"stories42M", {512, 1376, 8, 8, 8, 32000, 1024}},
    {"stories110M", {768, 2048, 12, 12, 12, 32000, 1024}},
    {"stories260K", {64, 172, 5, 8, 4, 512, 512}},
};

static int llama_hidden(int dim)
{
    int h = 2 * (4 * dim) / 3;
    return (h + 31) / 32 * 32;
}

static int default_heads(int dim)
{
    return dim % 64 == 0 ? dim / 64 : dim % 48 == 0 ? dim / 48 : 1;
}

static int parse_dims(const char *spec, int *v, int *n, tp_err *err)
{
    const char *p = spec;
    *n = 0;
    while (*n < 4) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > MAX_SHAPE_DIM)
            return tp_err_set(err, TP_EINVAL, "shape '%s': expected a name (stories15M, stories42M, "
                              "stories110M, stories260K) or DIMxLAYERS[xHEADS[xKV_HEADS]] with numbers 1..%d",
                              spec, MAX_SHAPE_DIM);
        v[(*n)++] = (int)x;
        if (*end == '\0')
            return 0;
        if (*end != 'x')
            break;
        p = end + 1;
    }
    return tp_err_set(err, TP_EINVAL, "shape '%s': expected DIMxLAYERS[xHEADS[xKV_HEADS]]", spec);
}

int tp_synth_parse_shape(const char *spec, tp_synth_shape *out, tp_err *err)
{
    for (size_t i = 0; i < sizeof NAMED / sizeof NAMED[0]; i++)
        if (!strcmp(spec, NAMED[i].name)) {
            *out = NAMED[i].s;
            return 0;
        }
    int v[4], n;
    int rc = parse_dims(spec, v, &n, err);
    if (rc)
        return rc;
    if (n < 2)
        return tp_err_set(err, TP_EINVAL, "shape '%s': expected at least DIMxLAYERS", spec);
    tp_synth_shape s = {v[0], llama_hidden(v[0]), v[1], n > 2 ? v[2] : default_heads(v[0]), 0, 32000, 1024};
    s.n_kv_heads = n > 3 ? v[3] : s.n_heads;
    if (s.dim % s.n_heads || (s.dim / s.n_heads) % 2)
        return tp_err_set(err, TP_EINVAL, "shape '%s': dim %d must split into %d heads of an even size", spec,
                          s.dim, s.n_heads);
    if (s.n_kv_heads > s.n_heads || s.n_heads % s.n_kv_heads)
        return tp_err_set(err, TP_EINVAL, "shape '%s': %d heads must be a multiple of %d kv heads", spec,
                          s.n_heads, s.n_kv_heads);
    *out = s;
    return 0;
}

/* The checkpoint as a list of tensors in file order: count and fan-in. */
typedef struct seg {
    uint64_t n;
    int fan_in; /* 0: RMSNorm weights (ones) or freq_cis (zeros, fan_in -1) */
} seg;

static int segments(const tp_synth_shape *s, seg *out)
{
    uint64_t d = (uint64_t)s->dim, L = (uint64_t)s->n_layers, h = (uint64_t)s->hidden_dim;
    uint64_t kvd = d / (uint64_t)s->n_heads * (uint64_t)s->n_kv_heads, hs = d / (uint64_t)s->n_heads;
    seg list[] = {
        {(uint64_t)s->vocab_size * d, s->dim}, {L * d, 0}, {L * d * d, s->dim}, {L * kvd * d, s->dim},
        {L * kvd * d, s->dim}, {L * d * d, s->dim}, {L * d, 0}, {L * h * d, s->dim},
        {L * d * h, s->hidden_dim}, {L * h * d, s->dim}, {d, 0}, {(uint64_t)s->seq_len * hs, -1},
    };
    memcpy(out, list, sizeof list);
    return (int)(sizeof list / sizeof list[0]);
}

uint64_t tp_synth_model_bytes(const tp_synth_shape *s)
{
    seg sg[16];
    int n = segments(s, sg);
    uint64_t total = 28;
    for (int i = 0; i < n; i++)
        total += 4 * sg[i].n;
    return total;
}

typedef struct rng {
    uint64_t s;
} rng;

static float next_uniform(rng *r) /* [-1, 1) */
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (float)((double)(r->s >> 40) / (double)(1 << 23) - 1.0);
}

static void fill_chunk(float *buf, size_t n, int fan_in, rng *r)
{
    float scale = fan_in > 0 ? 0.5f / sqrtf((float)fan_in) : 0.0f;
    for (size_t i = 0; i < n; i++)
        buf[i] = fan_in > 0 ? next_uniform(r) * scale : fan_in == 0 ? 1.0f : 0.0f;
}

/* Emit the checkpoint through a sink: a FILE or a memory cursor. */
typedef struct sink {
    FILE *fp;
    uint8_t *mem;
    uint64_t done, total;
    tp_synth_progress progress;
    void *ctx;
} sink;

static int put(sink *k, const void *p, size_t n, tp_err *err)
{
    if (k->fp) {
        if (fwrite(p, 1, n, k->fp) != n)
            return tp_err_set(err, TP_EIO, "mkmodel: write failed after %llu bytes",
                              (unsigned long long)k->done);
    } else {
        memcpy(k->mem + k->done, p, n);
    }
    k->done += n;
    if (k->progress)
        k->progress(k->done, k->total, k->ctx);
    return 0;
}

static int emit(sink *k, const tp_synth_shape *s, uint64_t seed, tp_err *err)
{
    int32_t hdr[7] = {s->dim, s->hidden_dim, s->n_layers, s->n_heads, s->n_kv_heads, s->vocab_size, s->seq_len};
    int rc = put(k, hdr, sizeof hdr, err);
    float *buf = malloc(CHUNK_FLOATS * sizeof(float));
    if (!buf)
        return tp_err_set(err, TP_ENOMEM, "mkmodel: out of memory");
    rng r = {seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull};
    if (!r.s)
        r.s = 1;
    seg sg[16];
    int n = segments(s, sg);
    for (int i = 0; i < n && !rc; i++)
        for (uint64_t left = sg[i].n; left && !rc;) {
            size_t c = left < CHUNK_FLOATS ? (size_t)left : CHUNK_FLOATS;
            fill_chunk(buf, c, sg[i].fan_in, &r);
            rc = put(k, buf, c * sizeof(float), err);
            left -= c;
        }
    free(buf);
    return rc;
}

int tp_synth_write_model(FILE *fp, const tp_synth_shape *s, uint64_t seed, tp_synth_progress progress,
                         void *ctx, tp_err *err)
{
    sink k = {fp, NULL, 0, tp_synth_model_bytes(s), progress, ctx};
    return emit(&k, s, seed, err);
}

int tp_synth_build_model(const tp_synth_shape *s, uint64_t seed, void **buf, size_t *size, tp_err *err)
{
    uint64_t total = tp_synth_model_bytes(s);
    if (total > SIZE_MAX)
        return tp_err_set(err, TP_ENOMEM, "mkmodel: %llu bytes do not fit in memory",
                          (unsigned long long)total);
    uint8_t *mem = malloc((size_t)total);
    if (!mem)
        return tp_err_set(err, TP_ENOMEM, "mkmodel: cannot allocate %llu bytes", (unsigned long long)total);
    sink k = {NULL, mem, 0, total, NULL, NULL};
    int rc = emit(&k, s, seed, err);
    if (rc) {
        free(mem);
        return rc;
    }
    *buf = mem;
    *size = (size_t)total;
    return 0;
}

/* The i-th extra piece: printable ASCII first, then " " + letters in
 * base 26, lengths growing, so all pieces are distinct. */
static int extra_piece(int i, char *out)
{
    if (i < 95) {
        out[0] = (char)(' ' + i);
        return 1;
    }
    i -= 95;
    int len = 1;
    long span = 26;
    while (i >= span) {
        i -= (int)span;
        span *= 26;
        len++;
    }
    out[0] = ' ';
    for (int j = len; j >= 1; j--) {
        out[j] = (char)('a' + i % 26);
        i /= 26;
    }
    return len + 1;
}

int tp_synth_write_tokenizer(FILE *fp, int vocab_size, tp_err *err)
{
    if (vocab_size < 259 + 95 || vocab_size > (1 << 22))
        return tp_err_set(err, TP_EINVAL, "mkmodel: tokenizer vocab_size %d outside %d..%d", vocab_size,
                          259 + 95, 1 << 22);
    int32_t max_len = 16;
    bool ok = fwrite(&max_len, 4, 1, fp) == 1;
    for (int id = 0; id < vocab_size && ok; id++) {
        char piece[32];
        int len;
        float score = 0.0f;
        if (id == 0)
            len = snprintf(piece, sizeof piece, "<unk>");
        else if (id == 1)
            len = snprintf(piece, sizeof piece, "\n<s>\n");
        else if (id == 2)
            len = snprintf(piece, sizeof piece, "\n</s>\n");
        else if (id < 259)
            len = snprintf(piece, sizeof piece, "<0x%02X>", id - 3);
        else {
            len = extra_piece(id - 259, piece);
            score = -(float)(id - 259);
        }
        int32_t l = len;
        ok = fwrite(&score, 4, 1, fp) == 1 && fwrite(&l, 4, 1, fp) == 1 && fwrite(piece, 1, (size_t)len, fp) == (size_t)len;
    }
    return ok ? 0 : tp_err_set(err, TP_EIO, "mkmodel: writing the tokenizer failed");
}
