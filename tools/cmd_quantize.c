/* tokpipe quantize: rewrite a model's weights as GGUF in another ggml
 * type (or a llama.cpp-style per-tensor mix), from a llama2.c checkpoint
 * or a GGUF file of any type tokpipe reads. */
#include "tools.h"
#include "tokpipe/ggml_types.h"
#include "tokpipe/gguf.h"
#include "tokpipe/gguf_write.h"
#include "tokpipe/model.h"
#include "../workers/forward/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

const char cmd_quantize_summary[] = "write a model as GGUF in F16, BF16, Q8_0, Q4_0, ..., Q4_K_M, Q5_K_M";

/* llama.cpp's llama_ftype numbers (general.file_type). */
enum {
    FT_ALL_F32 = 0, FT_F16 = 1, FT_Q4_0 = 2, FT_Q4_1 = 3, FT_Q8_0 = 7, FT_Q5_0 = 8, FT_Q5_1 = 9,
    FT_Q6_K = 18, FT_Q4_K_S = 14, FT_Q4_K_M = 15, FT_Q5_K_S = 16, FT_Q5_K_M = 17, FT_BF16 = 32,
    FT_MXFP4_MOE = 38,
};

typedef struct target {
    const char *name;
    uint32_t type;     /* the type of most 2-D tensors */
    uint32_t ftype;    /* general.file_type */
    bool mix_m;        /* llama.cpp's _M rules: output Q6_K, some attn_v / ffn_down Q6_K */
    bool experts_only; /* type only for 3-D expert tensors, Q8_0 elsewhere (MXFP4_MOE) */
} target;

static const target TARGETS[] = {
    {"F32", TP_GGML_F32, FT_ALL_F32, false, false},   {"F16", TP_GGML_F16, FT_F16, false, false},
    {"BF16", TP_GGML_BF16, FT_BF16, false, false},    {"Q8_0", TP_GGML_Q8_0, FT_Q8_0, false, false},
    {"Q4_0", TP_GGML_Q4_0, FT_Q4_0, false, false},    {"Q4_1", TP_GGML_Q4_1, FT_Q4_1, false, false},
    {"Q5_0", TP_GGML_Q5_0, FT_Q5_0, false, false},    {"Q5_1", TP_GGML_Q5_1, FT_Q5_1, false, false},
    {"Q4_K", TP_GGML_Q4_K, FT_Q4_K_S, false, false},  {"Q5_K", TP_GGML_Q5_K, FT_Q5_K_S, false, false},
    {"Q6_K", TP_GGML_Q6_K, FT_Q6_K, false, false},    {"Q4_K_M", TP_GGML_Q4_K, FT_Q4_K_M, true, false},
    {"Q5_K_M", TP_GGML_Q5_K, FT_Q5_K_M, true, false},  {"MXFP4", TP_GGML_MXFP4, FT_MXFP4_MOE, false, false},
    {"MXFP4_MOE", TP_GGML_MXFP4, FT_MXFP4_MOE, false, true},
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tokpipe quantize IN OUT --type TYPE [--vocab-from FILE.gguf] [--quiet]\n"
            "\n"
            "Reads IN (a llama2.c checkpoint, or a GGUF model in any type tokpipe reads) and\n"
            "writes OUT as GGUF v3 (alignment 32, general.file_type and\n"
            "general.quantization_version set, every metadata key of a GGUF input kept).\n"
            "Vectors (norms, biases) stay F32. A matrix whose rows are not a whole number of\n"
            "the type's blocks falls back as llama-quantize does: Q4_K -> Q5_0, Q5_K -> Q5_1,\n"
            "Q6_K -> Q8_0, then F16.\n"
            "\n"
            "  --type TYPE          F32 (dequantize), F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,\n"
            "                       Q4_K, Q5_K, Q6_K: every matrix in that type (llama-quantize\n"
            "                       --pure); Q4_K_M, Q5_K_M: llama.cpp's mixes (output.weight\n"
            "                       Q6_K; attn_v and ffn_down Q6_K in the first and last eighth\n"
            "                       of the layers and every third between; the rest Q4_K/Q5_K);\n"
            "                       MXFP4: every matrix MXFP4; MXFP4_MOE: llama.cpp's gpt-oss\n"
            "                       mix (the 3-D expert tensors MXFP4, the other matrices Q8_0)\n"
            "  --vocab-from FILE    copy FILE's tokenizer.* metadata into OUT (a llama2.c input\n"
            "                       has no vocabulary of its own; without it OUT needs\n"
            "                       --tokenizer at run time)\n"
            "  --quiet              no summary on stderr\n");
}

/* One output tensor: its source (a typed matrix view, rows x cols) and
 * the bytes written. */
typedef struct otensor {
    char name[64];
    int n_dims;
    uint64_t ne[4];
    tp_wmat src;      /* rows = product of ne[1..], cols = ne[0] */
    uint32_t type;
    void *data;
    size_t nbytes;
} otensor;

typedef struct job {
    otensor *t;
    int n, cap;
    int n_layers;
} job;

static int add_src(job *j, const char *name, int n_dims, const uint64_t *ne, tp_wmat src)
{
    if (j->n == j->cap) {
        int cap = j->cap ? 2 * j->cap : 64;
        otensor *t = realloc(j->t, (size_t)cap * sizeof *t);
        if (!t)
            return -1;
        j->t = t;
        j->cap = cap;
    }
    otensor *o = &j->t[j->n++];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", name);
    o->n_dims = n_dims;
    for (int d = 0; d < 4; d++)
        o->ne[d] = d < n_dims ? ne[d] : 1;
    o->src = src;
    return 0;
}

static bool fits(uint32_t type, uint64_t cols)
{
    const tp_ggml_type_info *t = tp_ggml_type(type);
    return t && cols % t->block_elems == 0;
}

/* llama.cpp's use_more_bits(i_layer, n_layers). */
static bool more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static int layer_of(const char *name)
{
    int l = -1;
    return sscanf(name, "blk.%d.", &l) == 1 ? l : -1;
}

/* The type of one tensor (llama.cpp's llama_tensor_get_type for the _M
 * mixes, then its fallback for rows that do not fit the block). */
static uint32_t pick_type(const target *tg, const otensor *o, int n_layers)
{
    /* llama-quantize leaves the MoE router (ffn_gate_inp) in F32, and a
     * DeltaNet layer's conv kernel (ssm_conv1d: the loader reads it as F32
     * rows of conv_kernel weights) */
    if (o->n_dims < 2 || strstr(o->name, "ffn_gate_inp.weight") || strstr(o->name, "ssm_conv1d.weight"))
        return TP_GGML_F32;
    /* llama-quantize quantizes only names ending in "weight": gpt-oss's
     * 2-D expert biases (ffn_*_exps.bias) stay F32 */
    size_t nl = strlen(o->name);
    if (nl < 6 || strcmp(o->name + nl - 6, "weight"))
        return TP_GGML_F32;
    uint32_t t = tg->type;
    if (tg->experts_only && o->n_dims < 3)
        t = TP_GGML_Q8_0;
    if (tg->mix_m) {
        /* llama.cpp matches "ffn_down": the experts' ffn_down_exps and ffn_down_shexp too */
        bool down = strstr(o->name, "ffn_down.weight") != NULL || strstr(o->name, "ffn_down_exps.weight") != NULL ||
                    strstr(o->name, "ffn_down_shexp.weight") != NULL, v = strstr(o->name, "attn_v.weight") != NULL;
        if (!strcmp(o->name, "output.weight"))
            t = fits(TP_GGML_Q6_K, o->ne[0]) ? TP_GGML_Q6_K : TP_GGML_Q8_0;
        else if ((down || v) && more_bits(layer_of(o->name), n_layers))
            t = TP_GGML_Q6_K;
    }
    if (!fits(t, o->ne[0])) {
        t = t == TP_GGML_Q4_K ? TP_GGML_Q5_0 : t == TP_GGML_Q5_K ? TP_GGML_Q5_1
          : t == TP_GGML_Q6_K || t == TP_GGML_MXFP4 ? TP_GGML_Q8_0 : t;
        if (!fits(t, o->ne[0]))
            t = TP_GGML_F16;
    }
    return t;
}

static int quantize_tensor(otensor *o, float *row)
{
    const tp_ggml_type_info *ti = tp_ggml_type(o->type);
    size_t rb = (size_t)o->ne[0] / ti->block_elems * ti->block_bytes;
    o->nbytes = rb * (size_t)o->src.rows;
    o->data = malloc(o->nbytes ? o->nbytes : 1);
    if (!o->data)
        return -1;
    for (int r = 0; r < o->src.rows; r++) {
        tp_wmat_dequant_row(&o->src, r, row);
        tp_quant_row(o->type, row, o->src.cols, (uint8_t *)o->data + rb * (size_t)r);
    }
    return 0;
}

static tp_wmat vec_view(const float *p, int n)
{
    return (tp_wmat){TP_GGML_F32, 1, n, (size_t)n * 4, p, NULL};
}

/* The tensors of a llama2.c checkpoint under llama.cpp's GGUF names. */
static int llama2c_tensors(const tp_model *m, job *j)
{
    const tp_model_config *c = tp_model_get_config(m);
    const tp_model_weights *w = tp_model_get_weights(m);
    char name[64];
    int rc = 0;
#define MAT(nm, wm) \
    rc = rc ? rc : add_src(j, nm, 2, (uint64_t[]){(uint64_t)(wm).cols, (uint64_t)(wm).rows}, wm)
#define VEC(nm, p, n) rc = rc ? rc : add_src(j, nm, 1, (uint64_t[]){(uint64_t)(n)}, vec_view(p, n))
    MAT("token_embd.weight", w->m.token_embedding);
    VEC("output_norm.weight", w->rms_final, c->dim);
    if (!c->shared_classifier)
        MAT("output.weight", w->m.wcls);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const tp_layer_weights *lw = &w->layers[l];
        struct { const char *s; const tp_wmat *wm; const float *v; } t[] = {
            {"attn_norm", NULL, lw->rms_att}, {"attn_q", &lw->m.wq, NULL}, {"attn_k", &lw->m.wk, NULL},
            {"attn_v", &lw->m.wv, NULL},      {"attn_output", &lw->m.wo, NULL},
            {"ffn_norm", NULL, lw->rms_ffn},  {"ffn_gate", &lw->m.w1, NULL}, {"ffn_down", &lw->m.w2, NULL},
            {"ffn_up", &lw->m.w3, NULL},
        };
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, t[i].s);
            if (t[i].wm)
                MAT(name, *t[i].wm);
            else
                VEC(name, t[i].v, c->dim);
        }
    }
#undef MAT
#undef VEC
    j->n_layers = c->n_layers;
    return rc;
}

static int llama2c_metadata(const tp_model *m, tp_gguf_writer *w, tp_err *err)
{
    const tp_model_config *c = tp_model_get_config(m);
    int rc = tp_gguf_set_str(w, "general.architecture", "llama", err);
    if (!rc) rc = tp_gguf_set_str(w, "general.name", "llama2.c checkpoint", err);
    if (!rc) rc = tp_gguf_set_u32(w, "llama.context_length", (uint32_t)c->seq_len, err);
    if (!rc) rc = tp_gguf_set_u32(w, "llama.embedding_length", (uint32_t)c->dim, err);
    if (!rc) rc = tp_gguf_set_u32(w, "llama.feed_forward_length", (uint32_t)c->hidden_dim, err);
    if (!rc) rc = tp_gguf_set_u32(w, "llama.block_count", (uint32_t)c->n_layers, err);
    if (!rc) rc = tp_gguf_set_u32(w, "llama.attention.head_count", (uint32_t)c->n_heads, err);
    if (!rc) rc = tp_gguf_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads, err);
    if (!rc) rc = tp_gguf_set_u32(w, "llama.rope.dimension_count", (uint32_t)c->head_size, err);
    if (!rc) rc = tp_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps, err);
    if (!rc) rc = tp_gguf_set_f32(w, "llama.rope.freq_base", c->rope_theta, err);
    return rc;
}

/* Every tensor of a GGUF file, as typed views of its mmap. */
static int gguf_tensors(const tp_gguf *g, job *j, tp_err *err)
{
    int64_t nl = 0;
    tp_gguf_str arch;
    char key[96];
    if (tp_gguf_get_str(g, "general.architecture", &arch, NULL) == 0 && arch.len < 64) {
        snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.ptr);
        tp_gguf_get_int(g, key, &nl, NULL);
    }
    j->n_layers = (int)nl;
    for (uint64_t i = 0; i < tp_gguf_n_tensors(g); i++) {
        const tp_gguf_tensor *t = tp_gguf_tensor_at(g, i);
        if (t->type != TP_GGML_F32 && !tp_quant_type_ok(t->type))
            return tp_err_set(err, TP_EFORMAT, "tensor '%.*s' has ggml type %s, which tokpipe cannot read",
                              (int)(t->name.len > 64 ? 64 : t->name.len), t->name.ptr,
                              tp_ggml_type(t->type) ? tp_ggml_type(t->type)->name : "unknown");
        if (t->name.len >= 64 || t->dims[0] > INT32_MAX)
            return tp_err_set(err, TP_EFORMAT, "tensor %llu: name or row too long", (unsigned long long)i);
        uint64_t rows = t->dims[1] * t->dims[2] * t->dims[3];
        if (rows > INT32_MAX)
            return tp_err_set(err, TP_EFORMAT, "tensor '%.*s' has too many rows", (int)t->name.len, t->name.ptr);
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        tp_wmat src = {t->type, (int)rows, (int)t->dims[0], (size_t)(t->nbytes / rows), t->data, NULL};
        if (add_src(j, name, (int)t->n_dims, t->dims, src))
            return tp_err_set(err, TP_ENOMEM, "out of memory");
    }
    return 0;
}

static int map_file(const char *path, void **map, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) || st.st_size <= 0) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    *size = (size_t)st.st_size;
    *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    return *map == MAP_FAILED ? -1 : 0;
}

static int run(const char *in, const char *out, const target *tg, const char *vocab_from, bool quiet)
{
    tp_err err = {0};
    job j = {0};
    tp_model *model = NULL;
    tp_gguf *g = NULL;
    tp_gguf_writer *w = NULL;
    void *map = NULL;
    size_t size = 0;
    float *row = NULL;
    int rc = 1;
    if (map_file(in, &map, &size)) {
        fprintf(stderr, "tokpipe quantize: cannot read %s: %s\n", in, strerror(errno));
        return 1;
    }
    bool is_gguf = size >= 4 && !memcmp(map, "GGUF", 4);
    if (tp_gguf_writer_new(&w, &err))
        goto fail;
    if (is_gguf) {
        /* load as a model first: the same validation as the worker */
        if (tp_model_load(in, &model, &err) || tp_gguf_parse(map, size, &g, &err) || gguf_tensors(g, &j, &err) ||
            tp_gguf_copy_kv_from_file(w, in, "", &err)) /* "": every key */
            goto fail;
    } else {
        if (tp_model_load(in, &model, &err))
            goto fail;
        if (llama2c_tensors(model, &j)) {
            tp_err_set(&err, TP_ENOMEM, "out of memory");
            goto fail;
        }
        if (llama2c_metadata(model, w, &err))
            goto fail;
    }
    if (vocab_from && tp_gguf_copy_kv_from_file(w, vocab_from, "tokenizer.", &err))
        goto fail;
    if (tp_gguf_set_u32(w, "general.file_type", tg->ftype, &err) ||
        tp_gguf_set_u32(w, "general.quantization_version", 2, &err))
        goto fail;
    int max_cols = 1;
    for (int i = 0; i < j.n; i++)
        max_cols = j.t[i].src.cols > max_cols ? j.t[i].src.cols : max_cols;
    row = malloc((size_t)max_cols * sizeof(float));
    if (!row) {
        tp_err_set(&err, TP_ENOMEM, "out of memory");
        goto fail;
    }
    int counts[64] = {0};
    for (int i = 0; i < j.n; i++) {
        otensor *o = &j.t[i];
        o->type = pick_type(tg, o, j.n_layers);
        if (quantize_tensor(o, row)) {
            tp_err_set(&err, TP_ENOMEM, "out of memory quantizing %s", o->name);
            goto fail;
        }
        counts[o->type < 64 ? o->type : 0]++;
        if (tp_gguf_add_tensor(w, o->name, o->type, o->n_dims, o->ne, o->data, o->nbytes, &err))
            goto fail;
    }
    if (tp_gguf_write(w, out, &err))
        goto fail;
    if (!quiet) {
        fprintf(stderr, "tokpipe quantize: wrote %s (%s, %d tensors:", out, tg->name, j.n);
        for (int t = 0; t < 64; t++)
            if (counts[t])
                fprintf(stderr, " %d %s", counts[t], tp_ggml_type((uint32_t)t)->name);
        fprintf(stderr, ")\n");
    }
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "tokpipe quantize: %s\n", err.msg[0] ? err.msg : "failed");
    for (int i = 0; i < j.n; i++)
        free(j.t[i].data);
    free(j.t);
    free(row);
    tp_gguf_writer_free(w);
    tp_gguf_free(g);
    tp_model_free(model);
    munmap(map, size);
    return rc;
}

int cmd_quantize(int argc, char **argv)
{
    static const struct option opts[] = {
        {"type", required_argument, 0, 't'}, {"vocab-from", required_argument, 0, 'V'},
        {"quiet", no_argument, 0, 'q'},      {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *type = NULL, *vocab_from = NULL;
    bool quiet = false;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 't': type = optarg; break;
        case 'V': vocab_from = optarg; break;
        case 'q': quiet = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (argc - optind != 2 || !type) {
        fprintf(stderr, "tokpipe quantize: need IN, OUT and --type TYPE\n");
        usage(stderr);
        return 2;
    }
    const target *tg = NULL;
    for (size_t i = 0; i < sizeof TARGETS / sizeof TARGETS[0]; i++)
        if (!strcasecmp(type, TARGETS[i].name))
            tg = &TARGETS[i];
    if (!tg) {
        fprintf(stderr, "tokpipe quantize: unknown --type '%s' (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                "Q4_K, Q5_K, Q6_K, Q4_K_M, Q5_K_M, MXFP4, MXFP4_MOE)\n", type);
        return 2;
    }
    return run(argv[optind], argv[optind + 1], tg, vocab_from, quiet);
}
