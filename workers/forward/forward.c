/* Batched Llama forward: one matmul per weight per step, KV pool.
 *
 * The arithmetic follows llama2.c's run.c (RMSNorm, RoPE on interleaved
 * pairs, grouped-query attention, SwiGLU), per token. Only the matmuls see
 * the whole batch. By default they use the fixed-order kernel of kernels.c:
 * OpenBLAS sgemm was measured to give a row different bits depending on the
 * number of rows in the call (and sgemv differs from sgemm), which would
 * make a sequence's tokens depend on its batch mates. OpenBLAS is the
 * opt-in alternative (tp_forward_set_kernel) for throughput at large
 * batches. */
#include "tokpipe/forward.h"
#include "tokpipe/isa.h"
#include "attn_avx2.h"
#include "blas.h"
#include "deltanet.h"
#include "kernels.h"
#include "kv16.h"
#include "moe.h"
#include "pool.h"
#include "prefix_cache.h"
#include "quant.h"
#include "vexp.h"

#include <immintrin.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_BATCH_TOKENS_LIMIT 65536
#define MAX_SLOTS_LIMIT 65536
/* Multiply-adds a job must have per thread to be worth waking one: 1 MB
 * of f32 weights at batch 1. A passive wake costs microseconds (tens on a
 * loaded host), as much as a few hundred thousand multiply-adds, so
 * smaller jobs stay on the calling thread (research/limits.md 0.1). */
#define PART_MIN_MACS 262144
/* What one SwiGLU element (an e^x and a division) costs, in
 * multiply-adds of a matmul, for the same threshold. */
#define SWIGLU_MACS 16
/* PART_MIN_MACS over this for work between matmuls (parts_between). */
#define HELD_PART_DIV 16
/* A typed multiply-add counts as a whole f32 one for PART_MIN_MACS, on
 * the VNNI panels too, though their arithmetic is cheaper: at batch 1 a
 * part's time is the weights it streams, and a weight is a weight. (Counted
 * as less, large models' smaller matrices were left on too few threads.) */
/* Row ranges of a typed (quantized) matmul split start at multiples of
 * this: any split gives the same bits (quant.h), this keeps row blocks
 * whole and a range's output rows on whole cache lines. */
#define TYPED_ROW_ALIGN 16
#define ATT_HEADS 4 /* query heads of one key-value head attended together (attend): 16 chains in flight */
#define CLS_CHUNK 16 /* rows of logits computed at once when some items skip them */

/* A weight group with a typed (non-F32) matrix: each matrix on its own,
 * writing its columns of the output; typed ones through quant.h (from
 * their panel or the file), F32 ones packed. n == 0: the group is all F32 and uses
 * the group's packed matrix instead. */
typedef struct typed_part {
    tp_wmat w;
    tp_packed p; /* p.p set: an F32 part, packed */
    int col;     /* first output column */
} typed_part;

typedef struct typed_group {
    int n;
    typed_part part[3];
} typed_group;

/* A Gated DeltaNet layer (deltanet.h) packs wqkv_lin and wz as qkv,
 * wbeta and walpha as ba, wssm_out as wo. */
typedef struct packed_layer {
    tp_packed qkv; /* rows: q (dim), k (kv_dim), v (kv_dim) */
    tp_packed wo;
    tp_packed ba;
    tp_packed w13; /* rows: w1 (hidden), w3 (hidden) */
    tp_packed w2;
    typed_group tqkv, two, tw13, tw2, tba;
} packed_layer;

typedef struct scratch {
    float *x;      /* [T][dim] residual stream */
    float *xb;     /* [T][dim] normed input / attention output */
    float *qkv;    /* [T][dim + 2 kv_dim] */
    float *h13;    /* [T][2 hidden], or [T][dim] if wider */
    float *proj;   /* [T][max(dim, hidden)] output of wo / w2, and hidden for w2 */
    float *att;    /* [threads][ATT_HEADS][max_pos] attention scores, rows of a pool worker */
    const void **blk; /* [threads][2 pages_per_seq] a head's key and value blocks, per pool worker */
    float *cls_in; /* [T][dim] final-normed rows that want logits */
    float *cls_out; /* [CLS_CHUNK][vocab] */
    int *tok_slot; /* [T] */
    int *tok_pos;  /* [T] */
} scratch;

struct tp_forward {
    const tp_model *model;
    tp_model_config c;
    packed_layer *layers;
    tp_packed cls;
    typed_group tcls;
    tp_qact qact;   /* activations of the current typed matmul */
    void *panels;   /* the integer parts' panels (make_panels) */
    size_t panels_len;
    bool qavx512;   /* typed kernels' AVX-512 path (needs VNNI too): panels */
    bool simd, qsimd; /* f32 / typed matmuls: the CPU's vector kernels (AVX-512 or AVX2); simd
                       * also SwiGLU's and the softmax's e^x in AVX2 lanes (vexp.h: the portable bits) */
    int slots, max_pos, max_tokens;
    int kv_pos; /* max_pos rounded up to a multiple of TP_KV_PAGE */
    /* Paged KV (prefix_cache.h): pages of TP_KV_PAGE (16) positions, each
     * holding every layer: keys [page][layer][kv_head][head_size][16] (one
     * vector load gives a head element for 16 positions; a head's block is
     * one contiguous run), values [page][layer][kv_head][16][head_size].
     * A sequence's block table lists its pages in position order; pages of
     * a cached prefix are shared by reference between sequences. */
    void *kcache, *vcache; /* float, or uint16_t halves with kv_type f16 (kv16.h) */
    size_t pool_bytes; /* of each of kcache and vcache */
    int pps;           /* pages per sequence: kv_pos / TP_KV_PAGE */
    int n_pages;       /* slots * pps + extra_pages */
    int extra_pages;   /* pages beyond what the slots can hold: cache only */
    size_t page_elems; /* values per page in each of kcache and vcache */
    bool cache_on;     /* prefix cache wanted (tp_forward_set_prefix_cache) */
    tp_pcache *pc;
    int *table;        /* [slot][pps] page ids, -1 = none */
    int32_t *seq_tok;  /* [slot][kv_pos] the token at each position (page keys) */
    int *n_pub;        /* per slot: leading pages offered to the cache */
    /* Layers and where their KV lives. A page holds only the layers that
     * keep every position (a DeltaNet layer keeps none: its memory is its
     * state, deltanet.h); sliding layers keep theirs in the page's window
     * part (prefix_cache.h), [part][layer][kv_head]... as a page, which a
     * sequence lets go once no query of its can see the page (claims). */
    int *kv_index;     /* [layer] its place among the page's or the part's layers; -1: no KV */
    bool *kv_part;     /* [layer] its KV in window parts */
    int window;        /* swa_window when some layer's KV is in parts, else 0 */
    void *kpart, *vpart; /* the parts' keys and values, as kcache / vcache */
    size_t part_pool_bytes; /* of each of kpart and vpart */
    size_t part_elems; /* values per part in each */
    int part_pps;      /* parts one sequence may claim at once (alloc_pool) */
    int n_parts;       /* slots * part_pps + extra_pages, 0 without sliding layers */
    int *sw_from;      /* per slot: blocks from here on claim their parts (earlier ones let go) */
    int *walk;         /* [pps] seq_reuse's scratch: the cached pages found */
    bool keep_windows; /* tests: sliding layers' KV in the page, never let go (the old way) */
    tp_kv_type kv_type;
    bool kv16_avx512;  /* the f16 attention kernels' AVX-512 path */
    bool kv16_avx2;    /* else AVX2 (attn_avx2.h: the portable bits) */
    float *rope_cos, *rope_sin; /* [max_pos][head_size / 2] */
    float *rope_cos_swa, *rope_sin_swa; /* the same for sliding layers (rope_theta_swa), or NULL */
    int *seq_len;   /* per slot; -1 = free */
    int *seen;      /* per slot, step validation marks */
    tp_isa isa;     /* chosen once (tp_isa_active): every step of this instance uses one path */
    bool avx512;    /* isa >= TP_ISA_AVX512 */
    tp_fwd_kernel kernel;
    tp_blas blas;   /* loaded at the first OpenBLAS opt-in */
    float *cls_all; /* OpenBLAS kernel only: [min(slots, max_tokens)][vocab] */
    tp_pool *pool;  /* compute threads (1 = none started) */
    tp_moe *moe;    /* the experts of a MoE model (moe.h), else NULL */
    tp_deltanet *dn; /* a hybrid model's DeltaNet layers and states (deltanet.h), else NULL */
    float *gate;    /* attn_gate: [max_tokens][q_dim] each head's output gate */
    long long part_min; /* PART_MIN_MACS; tests lower it to split everything */
    scratch s;
};

/* ---- setup ------------------------------------------------------------- */

/* Pack a group of n matrices stacked by rows: all F32 into one packed
 * matrix as always; otherwise F32 parts are packed each alone and typed
 * parts are read from the file (F16/BF16, and integer types on the scalar
 * path) or from their panel (make_panels). */
static int pack_group(const tp_wmat *const *m, int n, tp_packed *packed, typed_group *tg)
{
    bool all_f32 = true;
    for (int i = 0; i < n; i++)
        all_f32 = all_f32 && m[i]->type == TP_GGML_F32;
    if (all_f32) {
        const float *parts[3];
        int rows[3];
        for (int i = 0; i < n; i++) {
            parts[i] = m[i]->data;
            rows[i] = m[i]->rows;
        }
        return tp_pack(parts, rows, n, m[0]->cols, packed);
    }
    tg->n = n;
    for (int i = 0, col = 0; i < n; col += m[i++]->rows) {
        typed_part *p = &tg->part[i];
        p->w = *m[i];
        p->col = col;
        if (m[i]->type == TP_GGML_F32) {
            const float *d = m[i]->data;
            if (tp_pack(&d, &m[i]->rows, 1, m[i]->cols, &p->p))
                return TP_ENOMEM;
        }
    }
    return 0;
}

static void typed_group_free(typed_group *tg)
{
    for (int i = 0; i < tg->n; i++) {
        tp_packed_free(&tg->part[i].p);
        tp_qpanel_free(&tg->part[i].w);
    }
}

static int pack_layer(const tp_layer_weights *lw, packed_layer *pl)
{
    const tp_wmat *qkv[3] = {&lw->m.wq, &lw->m.wk, &lw->m.wv};
    const tp_wmat *w13[2] = {&lw->m.w1, &lw->m.w3};
    const tp_wmat *wo = &lw->m.wo, *w2 = &lw->m.w2;
    if (lw->wqkv_lin || lw->m.wqkv_lin.data) { /* a DeltaNet layer */
        const tp_wmat *in[2] = {&lw->m.wqkv_lin, &lw->m.wz}, *ba[2] = {&lw->m.wbeta, &lw->m.walpha};
        qkv[0] = in[0];
        qkv[1] = in[1];
        wo = &lw->m.wssm_out;
        int rc = pack_group(ba, 2, &pl->ba, &pl->tba);
        if (!rc) rc = pack_group(qkv, 2, &pl->qkv, &pl->tqkv);
        if (!rc) rc = pack_group(&wo, 1, &pl->wo, &pl->two);
        if (!rc) rc = pack_group(w13, 2, &pl->w13, &pl->tw13);
        if (!rc) rc = pack_group(&w2, 1, &pl->w2, &pl->tw2);
        return rc;
    }
    int rc = pack_group(qkv, 3, &pl->qkv, &pl->tqkv);
    if (!rc) rc = pack_group(&wo, 1, &pl->wo, &pl->two);
    if (lw->w1_exps) /* experts instead of w1, w2, w3: moe.c */
        return rc;
    if (!rc) rc = pack_group(w13, 2, &pl->w13, &pl->tw13);
    if (!rc) rc = pack_group(&w2, 1, &pl->w2, &pl->tw2);
    return rc;
}

/* A group's integer parts as jobs, each at the next offset. */
static void panel_jobs(typed_group *g, tp_qpanel_job *job, int *n, size_t *total)
{
    for (int k = 0; k < g->n; k++) {
        size_t b = tp_qpanel_bytes(&g->part[k].w);
        if (b) {
            job[(*n)++] = (tp_qpanel_job){&g->part[k].w, *total};
            *total += b;
        }
    }
}

/* Panels for the integer parts (quant.h), all in one mapping laid out in
 * the order a step reads them (the kernels' prefetch past the end of one
 * panel runs into the next one read): decode streams them every token, and
 * huge pages save a TLB miss per 4 KB (the small matrices alone would each
 * be under a huge page). */
static int make_panels(tp_forward *f)
{
    tp_qpanel_job *job = malloc(sizeof *job * (size_t)(3 * (5 * f->c.n_layers + 1)));
    if (!job)
        return TP_ENOMEM;
    int nj = 0;
    size_t total = 0;
    for (int l = 0; l < f->c.n_layers; l++) {
        packed_layer *pl = &f->layers[l];
        panel_jobs(&pl->tqkv, job, &nj, &total);
        panel_jobs(&pl->tba, job, &nj, &total);
        panel_jobs(&pl->two, job, &nj, &total);
        panel_jobs(&pl->tw13, job, &nj, &total);
        panel_jobs(&pl->tw2, job, &nj, &total);
    }
    panel_jobs(&f->tcls, job, &nj, &total);
    int rc = 0;
    if (total) {
        size_t len;
        uint8_t *a = tp_qpanel_map(total, &len);
        if (!a) {
            rc = TP_ENOMEM;
        } else {
            f->panels = a;
            f->panels_len = len;
            rc = tp_qpanel_build_jobs(job, nj, a, tp_forward_default_threads());
        }
    }
    free(job);
    return rc;
}

/* The typed kernels read panels (quant.h): AVX-512's, or AVX2's. */
static bool uses_panels(const tp_forward *f) { return f->qavx512 || f->qsimd; }

/* The kernels read packed f32 copies and panels, so the file's pages of
 * those matrices can leave memory (a matrix read again from the file, by
 * the scalar path or an embedding lookup, brings its pages back). */
static void drop_if_copied(const tp_forward *f, const tp_wmat *m)
{
    if (m->type == TP_GGML_F32 || (uses_panels(f) && tp_qpanel_bytes(m)))
        tp_model_drop_pages(f->model, m->data, m->row_bytes * (size_t)m->rows);
}

static void drop_copied(const tp_forward *f)
{
    const tp_model_weights *w = tp_model_get_weights(f->model);
    for (int l = 0; l < f->c.n_layers; l++) {
        const tp_layer_weights *lw = &w->layers[l];
        const tp_wmat *m[12] = {&lw->m.wq, &lw->m.wk, &lw->m.wv, &lw->m.wo, &lw->m.w1, &lw->m.w2,
                                &lw->m.w3, &lw->m.wqkv_lin, &lw->m.wz, &lw->m.wbeta, &lw->m.walpha,
                                &lw->m.wssm_out};
        for (int i = 0; i < 12; i++)
            if (m[i]->data)
                drop_if_copied(f, m[i]);
    }
    drop_if_copied(f, &w->m.wcls);
}

static int pack_weights(tp_forward *f)
{
    const tp_model_weights *w = tp_model_get_weights(f->model);
    f->layers = calloc((size_t)f->c.n_layers, sizeof *f->layers);
    if (!f->layers)
        return TP_ENOMEM;
    for (int l = 0; l < f->c.n_layers; l++)
        if (pack_layer(&w->layers[l], &f->layers[l]))
            return TP_ENOMEM;
    if (!tp_model_all_f32(f->model)) {
        int wide = f->c.dim > f->c.hidden_dim ? f->c.dim : f->c.hidden_dim;
        if (f->c.q_dim > wide) /* wo's input */
            wide = f->c.q_dim;
        if (f->c.ssm_head_dim * f->c.ssm_v_heads > wide) /* wssm_out's */
            wide = f->c.ssm_head_dim * f->c.ssm_v_heads;
        if (tp_qact_init(&f->qact, f->max_tokens, wide))
            return TP_ENOMEM;
    }
    const tp_wmat *cls = &w->m.wcls;
    int rc = pack_group(&cls, 1, &f->cls, &f->tcls);
    if (!rc && uses_panels(f))
        rc = make_panels(f);
    if (!rc)
        drop_copied(f);
    return rc;
}

/* RoPE tables computed as run.c does per position, once; a model's
 * frequency divisors (Llama 3 scaling) slow each pair as llama.cpp's
 * freq_factors do. */
static int rope_table(const tp_forward *f, float theta, const float *ff, bool scaled, float **cos_out,
                      float **sin_out)
{
    int hs = f->c.rope_dim, half = hs / 2; /* partial RoPE: the first rope_dim of a head */
    size_t n = (size_t)f->max_pos * (size_t)half;
    float *co = *cos_out = malloc(n * sizeof(float)), *si = *sin_out = malloc(n * sizeof(float));
    bool yarn = scaled && f->c.yarn_factor > 0;
    float *ramp = yarn ? malloc((size_t)half * sizeof(float)) : NULL, mscale = 1.0f;
    if (!co || !si || (yarn && !ramp)) {
        free(ramp);
        return TP_ENOMEM;
    }
    if (ramp) /* YaRN (model.h): ggml's rope_yarn, the ramp per pair computed once */
        tp_rope_yarn(&f->c, theta, ramp, &mscale);
    if (f->c.rope_attn_factor > 0 && f->c.rope_attn_factor != 1.0f) /* ggml's attn_factor: LongRoPE's */
        mscale *= f->c.rope_attn_factor;
    for (int pos = 0; pos < f->max_pos; pos++)
        for (int j = 0; j < half; j++) {
            float freq = 1.0f / powf(theta, (float)(2 * j) / (float)hs);
            float val = (float)pos * freq;
            if (ff)
                val = (float)pos * (freq / ff[j]);
            if (ramp)
                val = (val / f->c.yarn_factor) * (1 - ramp[j]) + val * ramp[j];
            co[(size_t)pos * half + j] = cosf(val) * mscale;
            si[(size_t)pos * half + j] = sinf(val) * mscale;
        }
    free(ramp);
    return 0;
}

/* Sliding layers may turn with a base of their own, unscaled (gemma3's
 * rope_freq_base_train_swa): a second table. */
static int make_rope(tp_forward *f)
{
    const tp_model_weights *w = tp_model_get_weights(f->model);
    /* LongRoPE: the factors of the context this forward serves, fixed for
     * its life so a sequence's keys all turned alike (llama.cpp: by n_ctx) */
    const float *ff = w->rope_freqs ? w->rope_freqs : f->max_pos > f->c.rope_orig_ctx ? w->rope_long : w->rope_short;
    int rc = rope_table(f, f->c.rope_theta, ff, true, &f->rope_cos, &f->rope_sin);
    if (!rc && f->c.swa_window)
        rc = rope_table(f, f->c.rope_theta_swa, f->c.rope_swa_scaled ? ff : NULL, f->c.rope_swa_scaled,
                        &f->rope_cos_swa, &f->rope_sin_swa);
    return rc;
}

static int alloc_scratch(tp_forward *f)
{
    size_t T = (size_t)f->max_tokens, d = (size_t)f->c.dim, h = (size_t)f->c.hidden_dim;
    size_t q = (size_t)f->c.q_dim, qkv = q * (f->c.attn_gate ? 2 : 1) + 2 * (size_t)f->c.kv_dim;
    size_t wide = d > h ? d : h;
    scratch *s = &f->s;
    s->x = malloc(T * d * sizeof(float));
    /* xb: a token's normed x [dim], or its heads' attention [q_dim] */
    s->xb = malloc(T * (q > d ? q : d) * sizeof(float));
    s->qkv = malloc(T * qkv * sizeof(float));
    /* h13 also takes w2's [T][dim] output (ffn_block): a model may have
     * hidden < dim / 2 */
    s->h13 = malloc(T * (2 * h > d ? 2 * h : d) * sizeof(float));
    s->proj = malloc(T * wide * sizeof(float));
    s->cls_in = malloc(T * d * sizeof(float));
    s->cls_out = malloc((size_t)CLS_CHUNK * (size_t)f->c.vocab_size * sizeof(float));
    s->tok_slot = malloc(T * sizeof(int));
    s->tok_pos = malloc(T * sizeof(int));
    if (f->c.attn_gate && !(f->gate = malloc(T * q * sizeof(float))))
        return TP_ENOMEM;
    bool ok = s->x && s->xb && s->qkv && s->h13 && s->proj && s->cls_in && s->cls_out && s->tok_slot &&
              s->tok_pos;
    return ok ? 0 : TP_ENOMEM;
}

/* Sort the layers: which keep KV in the page, which in the window part
 * (sliding layers, when a sequence can outgrow the window: else their
 * parts would never be let go), which none (DeltaNet). */
static int layout_layers(tp_forward *f)
{
    int L = f->c.n_layers, n_page = 0, n_part = 0;
    free(f->kv_index);
    free(f->kv_part);
    f->kv_index = malloc((size_t)L * sizeof *f->kv_index);
    f->kv_part = calloc((size_t)L, sizeof *f->kv_part);
    if (!f->kv_index || !f->kv_part)
        return TP_ENOMEM;
    bool parts = f->c.swa_window > 0 && f->c.swa_window < f->max_pos && !f->keep_windows;
    for (int l = 0; l < L; l++) {
        if (tp_model_layer_recurrent(&f->c, l))
            f->kv_index[l] = -1;
        else if (parts && tp_model_layer_slides(&f->c, l))
            f->kv_part[l] = true, f->kv_index[l] = n_part++;
        else
            f->kv_index[l] = n_page++;
    }
    f->page_elems = (size_t)n_page * (size_t)f->c.kv_dim * TP_KV_PAGE;
    f->part_elems = (size_t)n_part * (size_t)f->c.kv_dim * TP_KV_PAGE;
    f->window = n_part ? f->c.swa_window : 0;
    /* A sequence claims the parts of blocks first_block(q) .. its last,
     * q its last step's first position (what a retry or a verify's
     * rollback may still ask for): at most W - 1 positions before q and
     * the step's n after it, n <= max_batch_tokens, over whole pages:
     * floor((n + W - 2) / 16) + 2 blocks. */
    int n = f->max_tokens < f->max_pos ? f->max_tokens : f->max_pos;
    long most = n_part ? ((long)n + f->window - 2) / TP_KV_PAGE + 2 : 0;
    f->part_pps = most > f->pps ? f->pps : (int)most;
    return 0;
}

static void *map_pool(size_t bytes)
{
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void unmap_pool(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes ? bytes : 1);
}

/* DeltaNet snapshots may take what the pool took when every layer had its
 * KV in the page (a dense model's pool of this shape). */
static size_t snap_budget(const tp_forward *f)
{
    size_t es = f->kv_type == TP_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    return 2 * (size_t)f->n_pages * (size_t)f->c.n_layers * (size_t)f->c.kv_dim * TP_KV_PAGE * es;
}

/* Map the key and value caches for kv_type t; the old ones stay until the
 * new ones are had. */
static int map_kv(tp_forward *f, tp_kv_type t, tp_err *err)
{
    /* slots, layers, max_pos and kv_dim are each bounded, so this product
     * cannot overflow 64 bits; mmap still checks it against memory. */
    size_t esize = t == TP_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    uint64_t n = (uint64_t)f->n_pages * (uint64_t)f->page_elems;
    if (n > SIZE_MAX / esize)
        return tp_err_set(err, TP_ENOMEM, "forward: KV pool of %llu values is too large",
                          (unsigned long long)n);
    /* Anonymous maps: page aligned (a 64-byte key row never straddles into
     * another page) and lazily zeroed, so untouched slots cost no RAM. */
    size_t bytes = (size_t)n * esize;
    int n_parts = f->part_elems ? f->slots * f->part_pps + f->extra_pages : 0;
    size_t pbytes = (size_t)n_parts * f->part_elems * esize; /* at most n_pages pages' worth: fits too */
    void *k = map_pool(bytes), *v = map_pool(bytes), *kp = map_pool(pbytes), *vp = map_pool(pbytes);
    tp_pcache *pc = k && v && kp && vp ? tp_pcache_new(f->n_pages, f->cache_on) : NULL;
    if (pc && tp_pcache_set_parts(pc, n_parts)) {
        tp_pcache_free(pc);
        pc = NULL;
    }
    if (!pc) {
        unmap_pool(k, bytes);
        unmap_pool(v, bytes);
        unmap_pool(kp, pbytes);
        unmap_pool(vp, pbytes);
        return tp_err_set(err, TP_ENOMEM, "forward: cannot allocate a KV pool of %d slots x %d positions "
                          "(%.1f MB, kv_type %s)", f->slots, f->max_pos, 2.0 * (double)(bytes + pbytes) / 1e6,
                          tp_kv_type_name(t));
    }
    unmap_pool(f->kcache, f->pool_bytes);
    unmap_pool(f->vcache, f->pool_bytes);
    unmap_pool(f->kpart, f->part_pool_bytes);
    unmap_pool(f->vpart, f->part_pool_bytes);
    f->kcache = k;
    f->vcache = v;
    f->pool_bytes = bytes;
    f->kpart = kp;
    f->vpart = vp;
    f->part_pool_bytes = pbytes;
    f->n_parts = n_parts;
    f->kv_type = t;
    /* a new pool: cached pages of the old one are gone */
    tp_pcache_free(f->pc);
    f->pc = pc;
    if (f->dn && tp_deltanet_pages(f->dn, f->n_pages, snap_budget(f))) /* and so are their states */
        return tp_err_set(err, TP_ENOMEM, "forward: out of memory for %d pages' DeltaNet snapshots", f->n_pages);
    return 0;
}

static int alloc_pool(tp_forward *f, tp_err *err)
{
    f->pps = f->kv_pos / TP_KV_PAGE;
    f->n_pages = f->slots * f->pps;
    f->cache_on = true;
    if (layout_layers(f))
        return tp_err_set(err, TP_ENOMEM, "forward: out of memory");
    int rc = map_kv(f, TP_KV_F32, err);
    if (rc)
        return rc;
    size_t n = (size_t)f->slots;
    f->seq_len = malloc(n * sizeof(int));
    f->seen = calloc(n, sizeof(int));
    f->table = malloc(n * (size_t)f->pps * sizeof *f->table);
    f->seq_tok = malloc(n * (size_t)f->kv_pos * sizeof *f->seq_tok);
    f->n_pub = calloc(n, sizeof *f->n_pub);
    f->sw_from = calloc(n, sizeof *f->sw_from);
    f->walk = malloc((size_t)f->pps * sizeof *f->walk);
    if (!f->seq_len || !f->seen || !f->table || !f->seq_tok || !f->n_pub || !f->sw_from || !f->walk)
        return tp_err_set(err, TP_ENOMEM, "forward: out of memory for %d sequence slots", f->slots);
    for (int i = 0; i < f->slots; i++)
        f->seq_len[i] = -1;
    for (size_t i = 0; i < n * (size_t)f->pps; i++)
        f->table[i] = -1;
    return 0;
}

const char *tp_kv_type_name(tp_kv_type t)
{
    switch (t) {
    case TP_KV_F32: return "f32";
    case TP_KV_F16: return "f16";
    }
    return "unknown";
}

int tp_kv_type_parse(const char *name, tp_kv_type *out, tp_err *err)
{
    const tp_kv_type all[] = {TP_KV_F32, TP_KV_F16};
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(name, tp_kv_type_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    return tp_err_set(err, TP_EINVAL, "forward: unknown kv_type '%s' (want f32 or f16)", name ? name : "(null)");
}

static int first_open(const tp_forward *f)
{
    for (int i = 0; i < f->slots; i++)
        if (f->seq_len[i] >= 0)
            return i;
    return -1;
}

int tp_forward_set_kv_type(tp_forward *f, tp_kv_type t, tp_err *err)
{
    if (t != TP_KV_F32 && t != TP_KV_F16)
        return tp_err_set(err, TP_EINVAL, "forward: unknown kv_type %d (want f32 or f16)", (int)t);
    if (t == f->kv_type)
        return 0;
    int open = first_open(f);
    if (open >= 0)
        return tp_err_set(err, TP_ESTATE, "forward: kv_type can change only while no sequence is open "
                          "(sequence %d is)", open);
    return map_kv(f, t, err);
}

int tp_forward_set_prefix_cache(tp_forward *f, bool on, int extra_pages, tp_err *err)
{
    if (extra_pages < 0 || extra_pages > TP_FORWARD_MAX_EXTRA_PAGES)
        return tp_err_set(err, TP_EINVAL, "forward: prefix cache extra pages %d outside 0..%d", extra_pages,
                          TP_FORWARD_MAX_EXTRA_PAGES);
    int open = first_open(f);
    if (open >= 0)
        return tp_err_set(err, TP_ESTATE, "forward: the prefix cache can change only while no sequence is open "
                          "(sequence %d is)", open);
    bool old_on = f->cache_on;
    int old_extra = f->extra_pages;
    f->cache_on = on;
    f->extra_pages = on ? extra_pages : 0;
    f->n_pages = f->slots * f->pps + f->extra_pages;
    int rc = map_kv(f, f->kv_type, err);
    if (rc) {
        f->cache_on = old_on;
        f->extra_pages = old_extra;
        f->n_pages = f->slots * f->pps + old_extra;
    }
    return rc;
}

bool tp_forward_prefix_cache(const tp_forward *f) { return f->cache_on; }

size_t tp_forward_page_bytes(const tp_forward *f)
{
    return 2 * (f->page_elems + f->part_elems) * (f->kv_type == TP_KV_F16 ? sizeof(uint16_t) : sizeof(float));
}

void tp_forward_kv_stats(const tp_forward *f, tp_fwd_kv_stats *out)
{
    size_t es = f->kv_type == TP_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    tp_pcache_stats st;
    tp_pcache_get_stats(f->pc, &st);
    *out = (tp_fwd_kv_stats){
        .page_bytes = 2 * f->page_elems * es,
        .part_bytes = 2 * f->part_elems * es,
        .pages_held = st.pages_used,
        .parts_held = (uint32_t)tp_pcache_parts_claimed(f->pc),
        .parts_total = (uint32_t)f->n_parts,
        .pages_total = (uint32_t)f->n_pages,
        .window = f->window,
    };
    out->held_bytes = out->pages_held * out->page_bytes + out->parts_held * out->part_bytes;
    out->pool_bytes = 2 * (f->pool_bytes + f->part_pool_bytes);
}

size_t tp_forward_seq_kv_bytes(const tp_forward *f, int seq_id)
{
    if (seq_id < 0 || seq_id >= f->slots || f->seq_len[seq_id] < 0)
        return 0;
    size_t es = f->kv_type == TP_KV_F16 ? sizeof(uint16_t) : sizeof(float), pages = 0, parts = 0;
    const int *t = f->table + (size_t)seq_id * (size_t)f->pps;
    for (int b = 0; b < f->pps; b++)
        if (t[b] >= 0) {
            pages++;
            parts += f->n_parts && b >= f->sw_from[seq_id];
        }
    return 2 * es * (pages * f->page_elems + parts * f->part_elems);
}

void tp_forward_prefix_stats(const tp_forward *f, tp_fwd_prefix_stats *out)
{
    tp_pcache_stats st;
    tp_pcache_get_stats(f->pc, &st);
    *out = (tp_fwd_prefix_stats){
        .enabled = f->cache_on,
        .lookups = st.lookups,
        .hits = st.hits,
        .hit_tokens = st.hit_tokens,
        .prefill_tokens = st.prefill_tokens,
        .evictions = st.evictions,
        .pages_total = st.pages_total,
        .pages_used = st.pages_used,
        .pages_cached = st.pages_cached,
        .page_tokens = TP_KV_PAGE,
        .page_bytes = tp_forward_page_bytes(f),
    };
}

tp_kv_type tp_forward_kv_type(const tp_forward *f) { return f->kv_type; }

int tp_forward_new(const tp_model *model, int kv_slots, int max_pos, int max_batch_tokens,
                   tp_forward **out, tp_err *err)
{
    *out = NULL;
    const tp_model_config *c = tp_model_get_config(model);
    if (max_pos == 0)
        max_pos = c->seq_len;
    if (kv_slots < 1 || kv_slots > MAX_SLOTS_LIMIT)
        return tp_err_set(err, TP_EINVAL, "forward: kv_slots %d outside 1..%d", kv_slots, MAX_SLOTS_LIMIT);
    if (max_pos < 1 || max_pos > c->seq_len)
        return tp_err_set(err, TP_EINVAL, "forward: max_pos %d outside 1..%d (the model's seq_len)", max_pos,
                          c->seq_len);
    if (max_batch_tokens < 1 || max_batch_tokens > MAX_BATCH_TOKENS_LIMIT)
        return tp_err_set(err, TP_EINVAL, "forward: max_batch_tokens %d outside 1..%d", max_batch_tokens,
                          MAX_BATCH_TOKENS_LIMIT);
    tp_forward *f = calloc(1, sizeof *f);
    if (!f)
        return tp_err_set(err, TP_ENOMEM, "forward: out of memory");
    f->model = model;
    f->c = *c;
    f->slots = kv_slots;
    f->max_pos = max_pos;
    f->max_tokens = max_batch_tokens;
    f->kv_pos = (max_pos + TP_KV_PAGE - 1) / TP_KV_PAGE * TP_KV_PAGE;
    f->part_min = PART_MIN_MACS;
    f->isa = tp_isa_active();
    f->avx512 = f->isa >= TP_ISA_AVX512;
    f->kv16_avx512 = f->avx512;
    f->qavx512 = f->avx512 && tp_isa_have_vnni();
    f->simd = f->isa >= TP_ISA_AVX2;
    f->kv16_avx2 = f->simd;
    f->qsimd = f->simd;
    int rc = alloc_pool(f, err);
    if (!rc && (pack_weights(f) || make_rope(f) || alloc_scratch(f) ||
                tp_moe_new(model, max_batch_tokens, uses_panels(f), &f->moe) ||
                tp_deltanet_new(c, kv_slots, max_batch_tokens, &f->dn) ||
                (f->dn && tp_deltanet_pages(f->dn, f->n_pages, snap_budget(f)))))
        rc = tp_err_set(err, TP_ENOMEM, "forward: out of memory packing weights or allocating scratch");
    if (!rc)
        rc = tp_forward_set_threads(f, 1, err);
    if (rc) {
        tp_forward_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

void tp_forward_free(tp_forward *f)
{
    if (!f)
        return;
    tp_pool_free(f->pool);
    tp_moe_free(f->moe);
    tp_deltanet_free(f->dn);
    free(f->gate);
    if (f->layers)
        for (int l = 0; l < f->c.n_layers; l++) {
            tp_packed_free(&f->layers[l].qkv);
            tp_packed_free(&f->layers[l].wo);
            tp_packed_free(&f->layers[l].w13);
            tp_packed_free(&f->layers[l].w2);
            typed_group_free(&f->layers[l].tqkv);
            typed_group_free(&f->layers[l].two);
            typed_group_free(&f->layers[l].tw13);
            typed_group_free(&f->layers[l].tw2);
            tp_packed_free(&f->layers[l].ba);
            typed_group_free(&f->layers[l].tba);
        }
    free(f->layers);
    tp_packed_free(&f->cls);
    typed_group_free(&f->tcls);
    if (f->panels)
        munmap(f->panels, f->panels_len);
    tp_qact_free(&f->qact);
    unmap_pool(f->kcache, f->pool_bytes);
    unmap_pool(f->vcache, f->pool_bytes);
    unmap_pool(f->kpart, f->part_pool_bytes);
    unmap_pool(f->vpart, f->part_pool_bytes);
    tp_pcache_free(f->pc);
    free(f->kv_index);
    free(f->kv_part);
    free(f->sw_from);
    free(f->walk);
    free(f->table);
    free(f->seq_tok);
    free(f->n_pub);
    free(f->cls_all);
    tp_blas_close(&f->blas);
    free(f->rope_cos);
    free(f->rope_sin);
    free(f->rope_cos_swa);
    free(f->rope_sin_swa);
    free(f->seq_len);
    free(f->seen);
    scratch *s = &f->s;
    free(s->x); free(s->xb); free(s->qkv); free(s->h13); free(s->proj); free(s->att); free(s->blk);
    free(s->cls_in); free(s->cls_out); free(s->tok_slot); free(s->tok_pos);
    free(f);
}

/* ---- compute threads --------------------------------------------------- */

int tp_forward_default_threads(void)
{
    cpu_set_t set;
    long n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    else /* more CPUs than a cpu_set_t holds: the mask cannot be read so */
        n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > TP_FORWARD_MAX_THREADS ? TP_FORWARD_MAX_THREADS : (int)n;
}

int tp_forward_set_threads(tp_forward *f, int n_threads, tp_err *err)
{
    if (n_threads < 1 || n_threads > TP_FORWARD_MAX_THREADS)
        return tp_err_set(err, TP_EINVAL, "forward: threads %d outside 1..%d", n_threads, TP_FORWARD_MAX_THREADS);
    if (f->pool && tp_pool_threads(f->pool) == n_threads)
        return 0;
    float *att = malloc((size_t)n_threads * ATT_HEADS * (size_t)f->max_pos * sizeof(float));
    const void **blk = malloc((size_t)n_threads * 2 * (size_t)f->pps * sizeof *blk);
    if (!att || !blk) {
        free(att);
        free(blk);
        return tp_err_set(err, TP_ENOMEM, "forward: out of memory for attention scratch of %d threads",
                          n_threads);
    }
    tp_pool *pool;
    int rc = tp_pool_new(n_threads, &pool, err);
    if (rc) {
        free(att);
        free(blk);
        return rc;
    }
    tp_pool_free(f->pool);
    free(f->s.att);
    free(f->s.blk);
    f->pool = pool;
    f->s.att = att;
    f->s.blk = blk;
    return 0;
}

int tp_forward_threads(const tp_forward *f) { return f->pool ? tp_pool_threads(f->pool) : 1; }

tp_isa tp_forward_isa(const tp_forward *f) { return f->isa; }

void tp_forward_split_all_for_tests(tp_forward *f) { f->part_min = 1; }

/* Sliding layers' KV kept in the page for every position, as before
 * window parts: the reference the window rule must equal. Only while no
 * sequence is open; a new pool (the cache's pages are gone). */
int tp_forward_keep_windows_for_tests(tp_forward *f, tp_err *err)
{
    if (first_open(f) >= 0)
        return tp_err_set(err, TP_ESTATE, "forward: a sequence is open");
    f->keep_windows = true;
    if (layout_layers(f))
        return tp_err_set(err, TP_ENOMEM, "forward: out of memory");
    return map_kv(f, f->kv_type, err);
}

void tp_forward_use_scalar_for_tests(tp_forward *f)
{
    f->isa = TP_ISA_PORTABLE;
    f->avx512 = false;
    f->kv16_avx512 = false;
    f->kv16_avx2 = false;
    f->qavx512 = false;
    f->simd = false;
    f->qsimd = false;
    if (f->dn)
        tp_deltanet_set_isa(f->dn, TP_ISA_PORTABLE);
}

/* ---- matmul backends --------------------------------------------------- */

const char *tp_fwd_kernel_name(tp_fwd_kernel k)
{
    switch (k) {
    case TP_FWD_KERNEL_INVARIANT: return "invariant";
    case TP_FWD_KERNEL_OPENBLAS: return "openblas";
    }
    return "unknown";
}

int tp_fwd_kernel_parse(const char *name, tp_fwd_kernel *out, tp_err *err)
{
    const tp_fwd_kernel all[] = {TP_FWD_KERNEL_INVARIANT, TP_FWD_KERNEL_OPENBLAS};
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(name, tp_fwd_kernel_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    return tp_err_set(err, TP_EINVAL, "forward: unknown kernel '%s' (want invariant or openblas)",
                      name ? name : "(null)");
}

int tp_forward_set_kernel(tp_forward *f, tp_fwd_kernel k, tp_err *err)
{
    if (k != TP_FWD_KERNEL_INVARIANT && k != TP_FWD_KERNEL_OPENBLAS)
        return tp_err_set(err, TP_EINVAL, "forward: unknown kernel %d (want invariant or openblas)", (int)k);
    if (k == TP_FWD_KERNEL_OPENBLAS && !tp_model_all_f32(f->model))
        return tp_err_set(err, TP_EINVAL, "forward: the openblas kernel needs F32 weights; this model has "
                          "F16 or quantized matrices (use the invariant kernel)");
    if (k == TP_FWD_KERNEL_OPENBLAS && !f->cls_all) {
        /* rows wanting logits <= items <= min(slots, tokens): one seq once */
        int rows = f->slots < f->max_tokens ? f->slots : f->max_tokens;
        float *buf = malloc((size_t)rows * (size_t)f->c.vocab_size * sizeof(float));
        if (!buf)
            return tp_err_set(err, TP_ENOMEM, "forward: out of memory for %d rows of logits", rows);
        int rc = tp_blas_open(&f->blas, err);
        if (rc) {
            free(buf);
            return rc;
        }
        f->cls_all = buf;
    }
    f->kernel = k;
    return 0;
}

tp_fwd_kernel tp_forward_kernel(const tp_forward *f) { return f->kernel; }

const char *tp_forward_blas_core(const tp_forward *f)
{
    return f->blas.lib ? f->blas.get_corename() : NULL;
}

/* y[t][r] = W[r] . x[t] through OpenBLAS: one call for all n_tok rows. */
static void blas_matmul(const tp_forward *f, const float *w, int rows, int cols, const float *x, int ldx,
                        int n_tok, float *y, int ldy)
{
    if (n_tok == 1)
        f->blas.sgemv(CblasRowMajor, CblasNoTrans, rows, cols, 1.0f, w, cols, x, 1, 0.0f, y, 1);
    else
        f->blas.sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tok, rows, cols, 1.0f, x, ldx, w, cols, 0.0f,
                      y, ldy);
}

/* Threads worth waking for a job of macs multiply-adds. */
static int parts_for(const tp_forward *f, double macs)
{
    double p = macs / (double)f->part_min;
    int n = tp_forward_threads(f);
    return p >= n ? n : p < 1 ? 1 : (int)p;
}

/* The same for the work between two matmuls of a step (attention,
 * SwiGLU): the helpers are still spinning from the matmul before
 * (tp_pool_hold), so a part costs a cache line or two, not a wake-up.
 * Left on the calling thread, that work is what the others wait for: at
 * batch 1 it was a tenth of a 110M Q8_0 step, which caps 2 threads at
 * 1.8x and 16 at 7x. */
static int parts_between(const tp_forward *f, double macs)
{
    long long min = f->part_min / HELD_PART_DIV;
    double p = macs / (double)(min < 1 ? 1 : min);
    int n = tp_forward_threads(f);
    return p >= n ? n : p < 1 ? 1 : (int)p;
}

typedef struct mm_job {
    const tp_packed *w;
    const float *x;
    float *y;
    int ldx, n_tok, ldy;
    bool simd;
} mm_job;

static void mm_rows(void *arg, int r0, int r1, int worker)
{
    (void)worker;
    const mm_job *j = arg;
    tp_matmul_rows(j->w, j->x, j->ldx, j->n_tok, j->y, j->ldy, r0, r1, j->simd);
}

/* One matmul of the step, split by output rows (panel groups) over the
 * pool: every row is computed as in a single call, so the bits do not
 * depend on the thread count. Batch 1 splits too: a decode step is a
 * matvec that streams every weight once, and every core's share of the
 * memory bandwidth helps it. */
static void matmul(tp_forward *f, const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy)
{
    mm_job j = {w, x, y, ldx, n_tok, ldy, f->simd};
    int parts = parts_for(f, (double)w->rows * w->cols * n_tok);
    tp_pool_run(f->pool, w->rows, TP_MATMUL_ROW_ALIGN, parts, mm_rows, &j);
}

/* A weight group (matrices stacked in one packed tp_packed, sharing cols):
 * the packed kernel over the whole group, or with OpenBLAS one call per
 * matrix writing its own columns of y. */
static void group_matmul(tp_forward *f, const tp_packed *pw, const float *const *parts, const int *rows,
                         int n_parts, const float *x, int ldx, int n_tok, float *y, int ldy)
{
    if (f->kernel != TP_FWD_KERNEL_OPENBLAS) {
        matmul(f, pw, x, ldx, n_tok, y, ldy);
        return;
    }
    for (int i = 0, col = 0; i < n_parts; col += rows[i++])
        blas_matmul(f, parts[i], rows[i], pw->cols, x, ldx, n_tok, y + col, ldy);
}

/* Consecutive typed parts of a group that share one preparation of the
 * input, as one pool job: part k's rows sit at [start[k], start[k] +
 * rows) of the job's row space, starts rounded up to TYPED_ROW_ALIGN, so a
 * range of the job is an aligned range of each part it covers. One wake-up
 * and one wait for Q, K and V (or gate and up) instead of one per matrix. */
typedef struct qmm_job {
    const typed_part *part;
    int n, start[4];
    const tp_qact *a;
    float *y;
    int ldy;
    bool simd;
} qmm_job;

static void qmm_rows(void *arg, int r0, int r1, int worker)
{
    (void)worker;
    const qmm_job *j = arg;
    for (int k = 0; k < j->n; k++) {
        const typed_part *p = &j->part[k];
        int lo = r0 - j->start[k], hi = r1 - j->start[k];
        if (lo < 0)
            lo = 0;
        if (hi > p->w.rows)
            hi = p->w.rows;
        if (lo < hi)
            tp_qmatmul_rows(&p->w, j->a, j->y + p->col, j->ldy, lo, hi, j->simd);
    }
}

/* Typed parts [0, n) of one kind over activations already prepared in
 * f->qact: their rows split over the pool as for f32 (tp_qmatmul_rows
 * gives the same bits for any split; ranges of TYPED_ROW_ALIGN rows keep
 * the kernels' row blocks whole). */
static void typed_rows(tp_forward *f, const typed_part *part, int n, int n_tok, float *y, int ldy)
{
    qmm_job j = {.part = part, .n = n, .a = &f->qact, .y = y, .ldy = ldy, .simd = f->qsimd};
    double macs = 0;
    int rows = 0;
    for (int k = 0; k < n; k++) {
        const tp_wmat *w = &part[k].w;
        j.start[k] = rows;
        rows += (w->rows + TYPED_ROW_ALIGN - 1) / TYPED_ROW_ALIGN * TYPED_ROW_ALIGN;
        macs += (double)w->rows * w->cols * n_tok;
    }
    tp_pool_run(f->pool, rows, TYPED_ROW_ALIGN, parts_for(f, macs), qmm_rows, &j);
}

/* The kind of input a typed part needs: 0 integer (quantized), 1 float
 * (F16/BF16 read x as is). */
static int typed_kind(const typed_part *p) { return p->w.type == TP_GGML_F16 || p->w.type == TP_GGML_BF16; }

/* A group with typed matrices: each part writes its own columns of y.
 * The parts share their input, so integer types share one quantization
 * of it (on this thread; the activation format does not depend on the
 * weight type), and a run of parts of one kind is one pool job. */
static void typed_group_matmul(tp_forward *f, const typed_group *tg, const float *x, int ldx, int n_tok, float *y,
                               int ldy)
{
    for (int i = 0; i < tg->n;) {
        const typed_part *p = &tg->part[i];
        if (p->p.p) {
            matmul(f, &p->p, x, ldx, n_tok, y + p->col, ldy);
            i++;
            continue;
        }
        int n = 1;
        while (i + n < tg->n && !tg->part[i + n].p.p && typed_kind(&tg->part[i + n]) == typed_kind(p))
            n++;
        tp_qact_prepare(&f->qact, p->w.type, x, ldx, n_tok, p->w.cols);
        typed_rows(f, p, n, n_tok, y, ldy);
        i += n;
    }
}

/* A layer's weight group: typed when it has a non-F32 matrix (never with
 * OpenBLAS: set_kernel refuses such models), else as group_matmul. */
static void layer_matmul(tp_forward *f, const tp_packed *pw, const typed_group *tg, const float *const *parts,
                         const int *rows, int n_parts, const float *x, int ldx, int n_tok, float *y, int ldy)
{
    if (tg->n)
        typed_group_matmul(f, tg, x, ldx, n_tok, y, ldy);
    else
        group_matmul(f, pw, parts, rows, n_parts, x, ldx, n_tok, y, ldy);
}

/* ---- sequences --------------------------------------------------------- */

int tp_forward_seq_open(tp_forward *f, int *seq_id, tp_err *err)
{
    for (int i = 0; i < f->slots; i++)
        if (f->seq_len[i] < 0) {
            f->seq_len[i] = 0;
            f->sw_from[i] = 0;
            if (f->dn)
                tp_deltanet_reset(f->dn, i);
            *seq_id = i;
            return 0;
        }
    return tp_err_set(err, TP_EFULL, "forward: KV pool full: all %d sequence slots are in use", f->slots);
}

static int *seq_table(const tp_forward *f, int seq)
{
    return f->table + (size_t)seq * (size_t)f->pps;
}

/* Let go of seq's pages from block `from` on, and of their window parts
 * (cached ones stay cached). */
static void drop_pages(tp_forward *f, int seq, int from)
{
    int *t = seq_table(f, seq);
    for (int b = from; b < f->pps; b++)
        if (t[b] >= 0) {
            if (f->n_parts && b >= f->sw_from[seq])
                tp_pcache_part_release(f->pc, t[b]);
            tp_pcache_unref(f->pc, t[b]);
            t[b] = -1;
        }
    if (f->n_pub[seq] > from)
        f->n_pub[seq] = from;
    if (f->sw_from[seq] > from) /* pages written there again claim their parts */
        f->sw_from[seq] = from;
}

/* THE WINDOW RULE. A sliding layer's query at q sees positions q - W + 1
 * .. q, so of the pages it reads the first is first_block(q). A sequence
 * claims the window parts of its blocks from first_block(q) on, q the
 * first position of its last step (tp_forward_step): later steps, a retry
 * of that step and a verify's rollback (tp_forward_seq_truncate, never
 * before the step's start) all query at q or after, and never read the
 * parts of earlier blocks, which are let go. A step going back further
 * (other than to 0, a restart) is refused: the keys it would need are
 * gone. Exact: what a query reads is what it read with every part kept. */
static int first_block(const tp_forward *f, int q)
{
    int first = q - f->window + 1;
    return first > 0 ? first / TP_KV_PAGE : 0;
}

/* May seq (parts let go before block sw_from) resume at pos? */
static bool window_kept(const tp_forward *f, int seq, int pos)
{
    return !f->n_parts || pos == 0 || first_block(f, pos) >= f->sw_from[seq];
}

/* Let go of seq's parts of the blocks before `to`. */
static void release_parts(tp_forward *f, int seq, int to)
{
    if (!f->n_parts || to <= f->sw_from[seq])
        return;
    const int *t = seq_table(f, seq);
    for (int b = f->sw_from[seq]; b < to; b++)
        if (t[b] >= 0)
            tp_pcache_part_release(f->pc, t[b]);
    f->sw_from[seq] = to;
}

int tp_forward_seq_close(tp_forward *f, int seq_id)
{
    if (seq_id < 0 || seq_id >= f->slots || f->seq_len[seq_id] < 0)
        return TP_ENOTFOUND;
    drop_pages(f, seq_id, 0);
    f->seq_len[seq_id] = -1;
    return 0;
}

/* Whether the cache may be used: its pages hold the invariant kernel's
 * bits, which OpenBLAS would not reproduce (tp_forward_set_kernel). */
static bool cache_usable(const tp_forward *f)
{
    return f->cache_on && f->kernel == TP_FWD_KERNEL_INVARIANT;
}

int tp_forward_seq_reuse(tp_forward *f, int seq_id, int pos, const int *tokens, int n_tokens, bool keep_last)
{
    if (seq_id < 0 || seq_id >= f->slots || f->seq_len[seq_id] < 0 || !tokens || n_tokens < 1)
        return 0;
    /* only where every full page before pos is in the cache's chain: the
     * next page's key is (the page before it, its tokens). A partly filled
     * last page (a chunk that ended inside it) may be swapped for a cached
     * page whose first positions hold the same tokens: those positions'
     * bits are the same (a position's KV depends only on the tokens up to
     * it), the rest is taken. */
    int in = pos % TP_KV_PAGE;
    if (!cache_usable(f) || pos != f->seq_len[seq_id] || f->n_pub[seq_id] * TP_KV_PAGE != pos - in)
        return 0;
    int limit = keep_last ? n_tokens - 1 : n_tokens, got = 0;
    if (limit > f->max_pos - pos)
        limit = f->max_pos - pos;
    if (limit < TP_KV_PAGE - in)
        return 0;
    int *t = seq_table(f, seq_id);
    int32_t *rec = f->seq_tok + (size_t)seq_id * (size_t)f->kv_pos;
    /* The cached pages that follow, walk[k] for block b0 + k; a hit may
     * end after page k only where what the next query needs is there: on
     * a hybrid the DeltaNet state at its end (deltanet.h); with sliding
     * layers the window parts of the pages its window reaches (the cache
     * keeps a released part only until its memory is needed: prefix_cache.h).
     * The sequence's own pages before b0 that the window reaches are
     * claimed (window_kept), so only the cached ones are looked at. */
    int b0 = pos / TP_KV_PAGE, k = 0, best = 0, best_k = 0, prev = b0 ? t[b0 - 1] : -1;
    for (int take = TP_KV_PAGE - in, n = 0; n + take <= limit; n += take, take = TP_KV_PAGE, k++) {
        int p0 = pos + n, b = p0 / TP_KV_PAGE;
        for (int i = 0; i < take; i++)
            rec[p0 + i] = tokens[n + i];
        if ((prev = tp_pcache_lookup(f->pc, prev, rec + (size_t)b * TP_KV_PAGE)) < 0)
            break;
        f->walk[k] = prev;
        bool ok = !f->dn || tp_deltanet_has(f->dn, prev);
        int fb = first_block(f, p0 + take);
        for (int j = fb > b0 ? fb - b0 : 0; ok && f->n_parts && j <= k; j++)
            ok = tp_pcache_part(f->pc, f->walk[j]) >= 0;
        if (ok) {
            best = n + take;
            best_k = k + 1;
        }
    }
    got = best;
    for (int j = 0; j < best_k; j++) {
        int b = b0 + j, p = f->walk[j];
        tp_pcache_ref(f->pc, p);
        if (t[b] >= 0) { /* the partly filled page the hit replaces */
            if (f->n_parts && b >= f->sw_from[seq_id])
                tp_pcache_part_release(f->pc, t[b]);
            tp_pcache_unref(f->pc, t[b]);
        }
        t[b] = p;
        f->n_pub[seq_id] = b + 1;
    }
    if (got && f->n_parts) { /* claims as after a step at pos + got: the next query is there */
        int fb = first_block(f, pos + got);
        for (int b = f->sw_from[seq_id]; b < (fb < b0 ? fb : b0); b++)
            tp_pcache_part_release(f->pc, t[b]);
        for (int b = fb > b0 ? fb : b0; b < b0 + best_k; b++)
            tp_pcache_part_claim(f->pc, t[b]); /* has one: takes nothing */
        if (fb > f->sw_from[seq_id])
            f->sw_from[seq_id] = fb;
    }
    f->seq_len[seq_id] = pos + got;
    if (f->dn && got)
        tp_deltanet_restore(f->dn, seq_id, t[(pos + got) / TP_KV_PAGE - 1]);
    tp_pcache_count_lookup(f->pc, got);
    tp_pcache_count_prefill(f->pc, got);
    return got;
}

bool tp_forward_seq_same_pages(const tp_forward *f, int a, int b, int pos)
{
    if (!cache_usable(f) || a < 0 || b < 0 || a >= f->slots || b >= f->slots || f->seq_len[a] != pos ||
        f->seq_len[b] != pos || pos % TP_KV_PAGE)
        return false;
    int nb = pos / TP_KV_PAGE;
    return f->n_pub[a] == nb && f->n_pub[b] == nb &&
           !memcmp(seq_table(f, a), seq_table(f, b), (size_t)nb * sizeof(int));
}

int tp_forward_seq_truncate(tp_forward *f, int seq_id, int len)
{
    if (seq_id < 0 || seq_id >= f->slots || f->seq_len[seq_id] < 0)
        return TP_ENOTFOUND;
    if (len < 0 || len > f->seq_len[seq_id])
        return TP_EINVAL;
    if (f->dn && len != f->seq_len[seq_id]) /* the recurrent state cannot go back (deltanet.h) */
        return TP_EINVAL;
    if (!window_kept(f, seq_id, len)) /* its window's parts were let go (first_block) */
        return TP_EINVAL;
    drop_pages(f, seq_id, (len + TP_KV_PAGE - 1) / TP_KV_PAGE);
    if (f->n_pub[seq_id] > len / TP_KV_PAGE)
        f->n_pub[seq_id] = len / TP_KV_PAGE;
    f->seq_len[seq_id] = len;
    return 0;
}

int tp_forward_seq_length(const tp_forward *f, int seq_id)
{
    if (seq_id < 0 || seq_id >= f->slots)
        return -1;
    return f->seq_len[seq_id];
}

int tp_forward_max_positions(const tp_forward *f) { return f->max_pos; }
int tp_forward_max_batch_tokens(const tp_forward *f) { return f->max_tokens; }
int tp_forward_kv_slots(const tp_forward *f) { return f->slots; }
const tp_model *tp_forward_model(const tp_forward *f) { return f->model; }

/* ---- per-token math (run.c) ------------------------------------------- */

/* The sum of x[0..n) (square: of their squares) in eight chains (element
 * i in chain i % 8) and a fixed tree, the same on every path: one chain
 * is n adds in a row, each waiting for the last, on the calling thread
 * while the other threads wait. */
static inline float sum8(const float *x, int n, const bool square)
{
    float a[8] = {0};
    int i0 = 0;
    for (; i0 + 8 <= n; i0 += 8)
        for (int j = 0; j < 8; j++)
            a[j] += square ? x[i0 + j] * x[i0 + j] : x[i0 + j];
    for (int j = 0; i0 + j < n; j++)
        a[j] += square ? x[i0 + j] * x[i0 + j] : x[i0 + j];
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static void rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
    float ss = sum8(x, n, true);
    ss /= (float)n;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

/* The softmax's three passes in lanes, at two widths: W floats of type V
 * a vector (P the intrinsics' prefix), VEXP8 the width's e^x of eight
 * floats (vexp.h: AVX2's four-double halves, AVX-512's one eight-double
 * vector). Each gives the portable loop's bits (see max_from, exp_shifted,
 * div_all). */
#define SOFTMAX_LANES(SFX, TARGET, V, W, P, VEXP8)                                                         \
    __attribute__((target(TARGET))) static float max_from_##SFX(const float *x, int n, float m)            \
    {                                                                                                      \
        V v = P##_set1_ps(m);                                                                              \
        int i = 0;                                                                                         \
        for (; i + W <= n; i += W)                                                                         \
            v = P##_max_ps(P##_loadu_ps(x + i), v);                                                        \
        float l[W];                                                                                        \
        P##_storeu_ps(l, v);                                                                               \
        for (int j = 0; j < W; j++)                                                                        \
            if (l[j] > m)                                                                                  \
                m = l[j];                                                                                  \
        for (; i < n; i++)                                                                                 \
            if (x[i] > m)                                                                                  \
                m = x[i];                                                                                  \
        return m;                                                                                          \
    }                                                                                                      \
    __attribute__((target(TARGET))) static void exp_shifted_##SFX(float *x, int n, float max)              \
    {                                                                                                      \
        int i = 0;                                                                                         \
        for (; i + 8 <= n; i += 8)                                                                         \
            _mm256_storeu_ps(x + i, VEXP8(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(max))));    \
        for (; i < n; i++)                                                                                 \
            x[i] = tp_vexp(x[i] - max);                                                                    \
    }                                                                                                      \
    __attribute__((target(TARGET))) static void div_all_##SFX(float *x, int n, float s)                    \
    {                                                                                                      \
        V v = P##_set1_ps(s);                                                                              \
        int i = 0;                                                                                         \
        for (; i + W <= n; i += W)                                                                         \
            P##_storeu_ps(x + i, P##_div_ps(P##_loadu_ps(x + i), v));                                      \
        for (; i < n; i++)                                                                                 \
            x[i] /= s;                                                                                     \
    }
SOFTMAX_LANES(avx512, "avx512f", __m512, 16, _mm512, tp_vexp8_avx512)
SOFTMAX_LANES(avx2, "avx2", __m256, 8, _mm256, tp_vexp8_avx2)

/* The largest of m and x[0..n) by "x[i] > m: take it" in index order: a
 * NaN m stays, a NaN x[i] is passed over. The lanes take the same rule
 * (maxps(x, m) is x > m ? x : m), each over its share; only a max of
 * zero can come out with another sign than the loop's, and e^(x - max)
 * is the same bits for either (x - (+-0) is x, or +-0, and e^-0 is
 * e^+0). */
static float max_from(const tp_forward *f, const float *x, int n, float m)
{
    if (f->avx512)
        return max_from_avx512(x, n, m);
    if (f->simd)
        return max_from_avx2(x, n, m);
    for (int i = 0; i < n; i++)
        if (x[i] > m)
            m = x[i];
    return m;
}

/* x[i] = e^(x[i] - max) for i in [0, n), as tp_vexp in every lane. */
static void exp_shifted(const tp_forward *f, float *x, int n, float max)
{
    if (f->avx512)
        exp_shifted_avx512(x, n, max);
    else if (f->simd)
        exp_shifted_avx2(x, n, max);
    else
        for (int i = 0; i < n; i++)
            x[i] = tp_vexp(x[i] - max);
}

/* x[i] /= s over [0, n), in lanes where f has them (each an IEEE
 * divide: the same bits). */
static void div_all(const tp_forward *f, float *x, int n, float s)
{
    if (f->avx512)
        div_all_avx512(x, n, s);
    else if (f->simd)
        div_all_avx2(x, n, s);
    else
        for (int i = 0; i < n; i++)
            x[i] /= s;
}

/* The softmax of x[0..n), the sum by sum8. With an attention sink
 * (gpt-oss; sink non-NULL) the sink's logit joins the max and the
 * denominator, e^(sink - max), and weighs no value. */
static void softmax(const tp_forward *f, float *x, int n, const float *sink)
{
    float max = max_from(f, x, n, sink ? *sink : x[0]);
    exp_shifted(f, x, n, max);
    float sum = sum8(x, n, false);
    if (sink)
        sum += tp_vexp(*sink - max);
    div_all(f, x, n, sum);
}

/* Rotate the heads of vec (n = heads * head_size) for position pos in
 * layer `layer`: pairs (2j, 2j+1) or, for NEOX models, (j, j + head_size/2)
 * (model.h); a sliding layer by its own table where it has one. */
static void rope(const tp_forward *f, float *vec, int n, int pos, int layer)
{
    int half = f->c.rope_dim / 2;
    bool swa = f->rope_cos_swa && tp_model_layer_slides(&f->c, layer);
    const float *cs = (swa ? f->rope_cos_swa : f->rope_cos) + (size_t)pos * half;
    const float *sn = (swa ? f->rope_sin_swa : f->rope_sin) + (size_t)pos * half;
    if (f->c.rope_style == TP_ROPE_NEOX) {
        for (int h = 0; h < n; h += f->c.head_size)
            for (int j = 0; j < half; j++) {
                float v0 = vec[h + j], v1 = vec[h + j + half];
                vec[h + j] = v0 * cs[j] - v1 * sn[j];
                vec[h + j + half] = v0 * sn[j] + v1 * cs[j];
            }
        return;
    }
    /* head by head: a division per pair for its frequency index cost more
     * than the rotation (the serial gap before attention, where the other
     * threads wait) */
    for (int h = 0; h < n; h += f->c.head_size)
        for (int j = 0; j < half; j++) {
            float v0 = vec[h + 2 * j], v1 = vec[h + 2 * j + 1];
            vec[h + 2 * j] = v0 * cs[j] - v1 * sn[j];
            vec[h + 2 * j + 1] = v0 * sn[j] + v1 * cs[j];
        }
}

/* Where KV head g's block of layer `layer` for page p's positions is:
 * its offset (in values, the same for keys and values, both kv_dim * 16
 * values per layer) in *k and *v, the page's own caches or, for a sliding
 * layer, those of the page's window part (which the caller claims). */
static size_t block_offset(const tp_forward *f, int p, int layer, int g, uint8_t **k, uint8_t **v)
{
    size_t in = ((size_t)f->kv_index[layer] * (size_t)f->c.kv_dim + (size_t)g * (size_t)f->c.head_size) *
                TP_KV_PAGE;
    if (f->kv_part[layer]) {
        *k = f->kpart;
        *v = f->vpart;
        return (size_t)tp_pcache_part(f->pc, p) * f->part_elems + in;
    }
    *k = f->kcache;
    *v = f->vcache;
    return (size_t)p * f->page_elems + in;
}

/* Write one position's keys and values (kv_dim floats each) into a
 * sequence's layer of the cache, rounded to half with kv_type f16. */
static void store_kv(const tp_forward *f, int layer, int slot, int pos, const float *k, const float *v)
{
    size_t hs = (size_t)f->c.head_size, in = (size_t)(pos % TP_KV_PAGE);
    int p = seq_table(f, slot)[pos / TP_KV_PAGE];
    for (int g = 0; g < f->c.n_kv_heads; g++) {
        uint8_t *kc, *vc;
        size_t off = block_offset(f, p, layer, g, &kc, &vc), ko = off + in, vo = off + in * hs;
        const float *kg = k + (size_t)g * hs, *vg = v + (size_t)g * hs;
        if (f->kv_type == TP_KV_F16) {
            uint16_t *kd = (uint16_t *)(void *)kc + ko, *vd = (uint16_t *)(void *)vc + vo;
            for (size_t j = 0; j < hs; j++) {
                kd[j * 16] = tp_f32_to_f16(kg[j]);
                vd[j] = tp_f32_to_f16(vg[j]);
            }
        } else {
            float *kd = (float *)(void *)kc + ko, *vd = (float *)(void *)vc + vo;
            for (size_t j = 0; j < hs; j++)
                kd[j * 16] = kg[j];
            memcpy(vd, vg, hs * sizeof(float));
        }
    }
}

/* Ask for the lines store_kv will write for one position: a key is one
 * element in each of head_size lines (its block holds 16 positions
 * side by side), lines attention last touched a whole step ago, out of
 * cache. Stored cold, their misses come one after another on the calling
 * thread while the other threads wait for attention; asked for before
 * the QKV matmul, they arrive while it runs. */
static void prefetch_kv(const tp_forward *f, int layer, int slot, int pos)
{
    size_t hs = (size_t)f->c.head_size, in = (size_t)(pos % TP_KV_PAGE);
    size_t es = f->kv_type == TP_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    size_t kstep = 64 / (TP_KV_PAGE * es) ? 64 / (TP_KV_PAGE * es) : 1; /* key rows a line */
    int p = seq_table(f, slot)[pos / TP_KV_PAGE];
    for (int g = 0; g < f->c.n_kv_heads; g++) {
        uint8_t *kc, *vc;
        size_t off = block_offset(f, p, layer, g, &kc, &vc);
        const char *kd = (const char *)kc + (off + in) * es, *vd = (const char *)vc + (off + in * hs) * es;
        for (size_t j = 0; j < hs; j += kstep)
            __builtin_prefetch(kd + j * TP_KV_PAGE * es, 1, 3);
        for (size_t b = 0; b < hs * es; b += 64)
            __builtin_prefetch(vd + b, 1, 3);
    }
}

/* Ask for a norm's weights one pool job before rmsnorm reads them: they
 * are read once a step, so a whole step's weights have gone through the
 * caches since, and rmsnorm runs on the calling thread while the others
 * wait. The same for biases (gpt-oss's, added after their matmul). */
static void prefetch_norm(const float *w, int n)
{
    for (int j = 0; j < n; j += 16)
        __builtin_prefetch(w + j, 0, 3);
}

/* A query head's KV blocks (kv head g of layer `layer`) of a sequence,
 * the pages from page0 holding positions up to end - 1, resolved through
 * its block table into kb / vb (one pointer per page, in position order,
 * kb[0] for page0). */
static void head_blocks(const tp_forward *f, int layer, int slot, int g, int page0, int end, const void **kb,
                        const void **vb)
{
    const int *t = seq_table(f, slot);
    size_t es = f->kv_type == TP_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    for (int b = page0; b * TP_KV_PAGE < end; b++) {
        uint8_t *kc, *vc;
        size_t off = block_offset(f, t[b], layer, g, &kc, &vc) * es;
        kb[b - page0] = kc + off;
        vb[b - page0] = vc + off;
    }
}

/* Attention of one query head qh over n positions (key and value blocks
 * kb / vb), in two halves around the softmax: the scores (att, n floats)
 * and the weighted sum of the values (head_size floats to oh). Each score
 * and output element has a fixed summation order that depends only on
 * head_size and n, never on the batch, the pages or which thread runs the
 * head. */
static void scores_scalar(float *att, const float *qh, const float *const *kb, int hs, int n, float scale)
{
    for (int t = 0; t < n; t++) {
        const float *k = kb[t / TP_KV_PAGE] + t % TP_KV_PAGE;
        float score = 0.0f;
        for (int i = 0; i < hs; i++)
            score += qh[i] * k[(size_t)i * TP_KV_PAGE];
        att[t] = score / scale;
    }
}

static void weighted_sum_scalar(float *oh, const float *att, const float *const *vb, int hs, int n)
{
    memset(oh, 0, (size_t)hs * sizeof(float));
    for (int t = 0; t < n; t++) {
        const float *v = vb[t / TP_KV_PAGE] + (size_t)(t % TP_KV_PAGE) * hs;
        float a = att[t];
        for (int i = 0; i < hs; i++)
            oh[i] += a * v[i];
    }
}

/* Scores of positions 0..n-1 for G (1..ATT_HEADS) query heads that share
 * their keys (grouped-query attention), 64 positions at a time: the keys
 * are read once for the G heads, and the G x 4 chains in flight hide the
 * adds' latency (one head alone has 4). Each score is one chain over the
 * head's elements from 0, each product rounded and then added as
 * scores_scalar does (an FMA would round once: other bits, and a job moved
 * to a host without AVX-512 would change its stream), then divided by
 * scale. Head g's query at qh + g hs, its scores at att + g lda.
 * kb[t / 16] is the key block [hs][16] holding position t. */
__attribute__((target("avx512f"), always_inline)) static inline void scores_g(float *att, size_t lda, const float *qh,
                                                                              const float *const *kb, int hs, int n,
                                                                              float scale, const int G)
{
    __m512 sc = _mm512_set1_ps(scale);
    for (int t0 = 0; t0 < n; t0 += 64) {
        __mmask16 m[4];
        for (int j = 0; j < 4; j++) {
            int left = n - t0 - 16 * j;
            m[j] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        /* Blocks past n point at the group's first block: a fully masked
         * load must still name memory that is mapped and touched, or it
         * costs a fault-suppression assist of hundreds of cycles. */
        const float *const *b = kb + t0 / 16;
        const float *r0 = b[0], *r1 = m[1] ? b[1] : r0, *r2 = m[2] ? b[2] : r0, *r3 = m[3] ? b[3] : r0;
        /* the next four blocks, a row of each per row read here: the cache
         * is mostly out of the caches by the time a decode step reads it
         * (the weights went through them), and a block is 4 KB at most
         * heads, where the hardware's prefetch stops */
        int nblk = (n + 15) / 16, nx = nblk - t0 / 16 - 4;
        const float *p0 = nx > 0 ? b[4] : NULL, *p1 = nx > 1 ? b[5] : p0, *p2 = nx > 2 ? b[6] : p0,
                    *p3 = nx > 3 ? b[7] : p0;
        __m512 a[ATT_HEADS][4];
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            a[g][0] = a[g][1] = a[g][2] = a[g][3] = _mm512_setzero_ps();
        for (int i = 0; i < hs; i++, r0 += 16, r1 += 16, r2 += 16, r3 += 16) {
            if (p0) {
                size_t o = (size_t)i * 16;
                _mm_prefetch((const char *)(p0 + o), _MM_HINT_T0);
                _mm_prefetch((const char *)(p1 + o), _MM_HINT_T0);
                _mm_prefetch((const char *)(p2 + o), _MM_HINT_T0);
                _mm_prefetch((const char *)(p3 + o), _MM_HINT_T0);
            }
            __m512 k0 = _mm512_maskz_loadu_ps(m[0], r0), k1 = _mm512_maskz_loadu_ps(m[1], r1),
                   k2 = _mm512_maskz_loadu_ps(m[2], r2), k3 = _mm512_maskz_loadu_ps(m[3], r3);
            #pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                __m512 q = _mm512_set1_ps(qh[(size_t)g * (size_t)hs + (size_t)i]);
                a[g][0] = _mm512_add_ps(a[g][0], _mm512_mul_ps(q, k0));
                a[g][1] = _mm512_add_ps(a[g][1], _mm512_mul_ps(q, k1));
                a[g][2] = _mm512_add_ps(a[g][2], _mm512_mul_ps(q, k2));
                a[g][3] = _mm512_add_ps(a[g][3], _mm512_mul_ps(q, k3));
            }
        }
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            float *o = att + (size_t)g * lda + t0;
            _mm512_mask_storeu_ps(o, m[0], _mm512_div_ps(a[g][0], sc));
            _mm512_mask_storeu_ps(o + 16, m[1], _mm512_div_ps(a[g][1], sc));
            _mm512_mask_storeu_ps(o + 32, m[2], _mm512_div_ps(a[g][2], sc));
            _mm512_mask_storeu_ps(o + 48, m[3], _mm512_div_ps(a[g][3], sc));
        }
    }
}

/* For G heads (1..ATT_HEADS) sharing their values: head g's oh[i] (at
 * oh + g hs) = sum over t of att[g lda + t] * v_t[i], each element one
 * chain of multiply-then-add over t from 0 (weighted_sum_scalar's bits),
 * kept in registers 64 elements at a time, the values read once for the G
 * heads; v_t at vb[t / 16] + (t % 16) * hs. */
__attribute__((target("avx512f"), always_inline)) static inline void weighted_sum_g(float *oh, const float *att,
                                                                                    size_t lda,
                                                                                    const float *const *vb, int hs,
                                                                                    int n, const int G)
{
    for (int c0 = 0; c0 < hs; c0 += 64) {
        __mmask16 m[4];
        for (int j = 0; j < 4; j++) {
            int left = hs - c0 - 16 * j;
            m[j] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        size_t o1 = m[1] ? 16 : 0, o2 = m[2] ? 32 : 0, o3 = m[3] ? 48 : 0; /* as in scores_g() */
        __m512 a[ATT_HEADS][4];
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            a[g][0] = a[g][1] = a[g][2] = a[g][3] = _mm512_setzero_ps();
        for (int t = 0; t < n; t++) {
            const float *v = vb[t >> 4] + (size_t)(t & 15) * (size_t)hs + c0;
            if (t + 16 < n) { /* the same row of the next block (see scores_g) */
                const char *pv = (const char *)(vb[(t >> 4) + 1] + (size_t)(t & 15) * (size_t)hs + c0);
                _mm_prefetch(pv, _MM_HINT_T0);
                if (m[1])
                    _mm_prefetch(pv + 64, _MM_HINT_T0);
                if (m[2])
                    _mm_prefetch(pv + 128, _MM_HINT_T0);
                if (m[3])
                    _mm_prefetch(pv + 192, _MM_HINT_T0);
            }
            __m512 v0 = _mm512_maskz_loadu_ps(m[0], v), v1 = _mm512_maskz_loadu_ps(m[1], v + o1),
                   v2 = _mm512_maskz_loadu_ps(m[2], v + o2), v3 = _mm512_maskz_loadu_ps(m[3], v + o3);
            #pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                __m512 w = _mm512_set1_ps(att[(size_t)g * lda + (size_t)t]);
                a[g][0] = _mm512_add_ps(a[g][0], _mm512_mul_ps(w, v0));
                a[g][1] = _mm512_add_ps(a[g][1], _mm512_mul_ps(w, v1));
                a[g][2] = _mm512_add_ps(a[g][2], _mm512_mul_ps(w, v2));
                a[g][3] = _mm512_add_ps(a[g][3], _mm512_mul_ps(w, v3));
            }
        }
        #pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            float *o = oh + (size_t)g * (size_t)hs + c0;
            _mm512_mask_storeu_ps(o, m[0], a[g][0]);
            _mm512_mask_storeu_ps(o + 16, m[1], a[g][1]);
            _mm512_mask_storeu_ps(o + 32, m[2], a[g][2]);
            _mm512_mask_storeu_ps(o + 48, m[3], a[g][3]);
        }
    }
}

/* The G-head kernels above for G as a run-time count. */
__attribute__((target("avx512f"))) static void scores_heads(float *att, size_t lda, const float *qh,
                                                            const float *const *kb, int hs, int n, float scale, int G)
{
    switch (G) {
    case 4: scores_g(att, lda, qh, kb, hs, n, scale, 4); break;
    case 3: scores_g(att, lda, qh, kb, hs, n, scale, 3); break;
    case 2: scores_g(att, lda, qh, kb, hs, n, scale, 2); break;
    default: scores_g(att, lda, qh, kb, hs, n, scale, 1); break;
    }
}

__attribute__((target("avx512f"))) static void weighted_sum_heads(float *oh, const float *att, size_t lda,
                                                                  const float *const *vb, int hs, int n, int G)
{
    switch (G) {
    case 4: weighted_sum_g(oh, att, lda, vb, hs, n, 4); break;
    case 3: weighted_sum_g(oh, att, lda, vb, hs, n, 3); break;
    case 2: weighted_sum_g(oh, att, lda, vb, hs, n, 2); break;
    default: weighted_sum_g(oh, att, lda, vb, hs, n, 1); break;
    }
}

typedef struct att_job {
    const tp_forward *f;
    int layer;
} att_job;

/* x[i] = c * tanh(x[i] / c) for i in [0, n) (Gemma 2's soft-capping),
 * tanh(y) as 2 / (1 + e^-2y) - 1 with vexp.h's e^x: the same bits on every
 * path and host. */
static void softcap(float *x, int n, float c)
{
    for (int i = 0; i < n; i++)
        x[i] = c * (2.0f / (1.0f + tp_vexp(-2.0f * (x[i] / c))) - 1.0f);
}

/* Between the scores and the weighted sum: soft-capping, then the softmax
 * over the visible positions [lo, n) (with the head's sink where the
 * model has them: sink non-NULL); the hidden ones weigh 0 (a value times
 * +-0 adds nothing: the sum's bits are those of starting at lo). */
static void scores_to_weights(const tp_forward *f, float *att, int lo, int n, const float *sink)
{
    if (f->c.attn_softcap)
        softcap(att + lo, n - lo, f->c.attn_softcap);
    softmax(f, att + lo, n - lo, sink);
    for (int t = 0; t < lo; t++)
        att[t] = 0.0f;
}

/* Query heads h .. h + G - 1 of one token (G <= ATT_HEADS, one key-value
 * head's) over its sequence's cache, f32 or (kv16.h) half keys and values:
 * the same layout and summation order either way, halves converted
 * exactly as they are read. A head's bits do not depend on G (the f32
 * AVX-512 path reads the keys and values once for the G heads; the others
 * take them one by one). A sliding layer reads from the page that holds
 * its window's first position. att: G rows of max_pos. */
static void attend(const tp_forward *f, int layer, int slot, int pos, int h, int G, const float *q, float *out,
                   float *att, const void **blk)
{
    int hs = f->c.head_size, kv_mul = f->c.n_heads / f->c.n_kv_heads;
    int first = tp_model_layer_slides(&f->c, layer) ? pos - f->c.swa_window + 1 : 0;
    int page0 = first > 0 ? first / TP_KV_PAGE : 0, base = page0 * TP_KV_PAGE;
    int n = pos + 1 - base, lo = first > base ? first - base : 0; /* positions base .. pos, visible from lo */
    const void **kb = blk, **vb = blk + f->pps;
    head_blocks(f, layer, slot, h / kv_mul, page0, pos + 1, kb, vb);
    const float *sinks = tp_model_get_weights(f->model)->layers[layer].sinks;
    /* Gemma scales Q instead (attention_block): dividing by 1 is exact */
    float scale = f->c.attn_scale ? 1.0f : sqrtf((float)hs);
    size_t lda = (size_t)f->max_pos;
    if (f->kv_type == TP_KV_F32 && f->avx512) {
        scores_heads(att, lda, q + (size_t)h * hs, (const float *const *)kb, hs, n, scale, G);
        for (int g = 0; g < G; g++)
            scores_to_weights(f, att + (size_t)g * lda, lo, n, sinks ? sinks + h + g : NULL);
        weighted_sum_heads(out + (size_t)h * hs, att, lda, (const float *const *)vb, hs, n, G);
        return;
    }
    for (int g = 0; g < G; g++) {
        const float *qh = q + (size_t)(h + g) * hs, *sink = sinks ? sinks + h + g : NULL;
        float *oh = out + (size_t)(h + g) * hs;
        if (f->kv_type == TP_KV_F16) {
            const uint16_t *const *k16 = (const uint16_t *const *)kb, *const *v16 = (const uint16_t *const *)vb;
            if (f->kv16_avx512) {
                tp_kv16_scores_avx512(att, qh, k16, hs, n, scale);
                scores_to_weights(f, att, lo, n, sink);
                tp_kv16_weighted_sum_avx512(oh, att, v16, hs, n);
            } else if (f->kv16_avx2) {
                tp_attn_scores_avx2(att, qh, kb, hs, n, scale, true);
                scores_to_weights(f, att, lo, n, sink);
                tp_attn_weighted_avx2(oh, att, vb, hs, n, true);
            } else {
                tp_kv16_scores_scalar(att, qh, k16, hs, n, scale);
                scores_to_weights(f, att, lo, n, sink);
                tp_kv16_weighted_sum_scalar(oh, att, v16, hs, n);
            }
        } else if (f->simd) { /* AVX2 */
            tp_attn_scores_avx2(att, qh, kb, hs, n, scale, false);
            scores_to_weights(f, att, lo, n, sink);
            tp_attn_weighted_avx2(oh, att, vb, hs, n, false);
        } else {
            scores_scalar(att, qh, (const float *const *)kb, hs, n, scale);
            scores_to_weights(f, att, lo, n, sink);
            weighted_sum_scalar(oh, att, (const float *const *)vb, hs, n);
        }
    }
}

/* Units [u0, u1) of a step's attention, unit u = (token u / n_heads, head
 * u % n_heads): what the pool splits. Neighbouring heads of a token that
 * share a key-value head go together (up to ATT_HEADS), within the range:
 * the same bits however the range is cut. */
static void attend_units(void *arg, int u0, int u1, int worker)
{
    const att_job *j = arg;
    const tp_forward *f = j->f;
    const scratch *s = &f->s;
    size_t q = (size_t)f->c.q_dim, qs = q * (f->c.attn_gate ? 2 : 1) + 2 * (size_t)f->c.kv_dim;
    float *att = s->att + (size_t)worker * ATT_HEADS * (size_t)f->max_pos;
    const void **blk = s->blk + (size_t)worker * 2 * (size_t)f->pps;
    int nh = f->c.n_heads, kv_mul = nh / f->c.n_kv_heads;
    for (int u = u0; u < u1;) {
        int t = u / nh, h = u % nh, G = 1;
        while (G < ATT_HEADS && u + G < u1 && (h + G) / kv_mul == h / kv_mul) /* never past the token's heads */
            G++;
        attend(f, j->layer, s->tok_slot[t], s->tok_pos[t], h, G, s->qkv + (size_t)t * qs, s->xb + (size_t)t * q,
               att, blk);
        u += G;
    }
}

/* ---- the step ---------------------------------------------------------- */

/* Item i's verify rows (tp_forward_step_verify), or NULL. */
#define ROWS(all, i) ((all) ? (all)[i] : NULL)

static int check_item(tp_forward *f, const tp_fwd_item *it, int i, tp_err *err)
{
    if (it->seq_id < 0 || it->seq_id >= f->slots || f->seq_len[it->seq_id] < 0)
        return tp_err_set(err, TP_ENOTFOUND, "forward: item %d: sequence %d is not open", i, it->seq_id);
    if (f->seen[it->seq_id])
        return tp_err_set(err, TP_EINVAL, "forward: item %d: sequence %d appears twice in one step", i,
                          it->seq_id);
    f->seen[it->seq_id] = 1;
    if (it->n_tokens < 1 || !it->tokens)
        return tp_err_set(err, TP_EINVAL, "forward: item %d: n_tokens %d (need >= 1 and a token array)", i,
                          it->n_tokens);
    int len = f->seq_len[it->seq_id];
    if (it->pos < 0 || it->pos > len)
        return tp_err_set(err, TP_EINVAL, "forward: item %d: pos %d outside 0..%d (sequence %d's length)", i,
                          it->pos, len, it->seq_id);
    if (!window_kept(f, it->seq_id, it->pos))
        return tp_err_set(err, TP_EINVAL, "forward: item %d: pos %d: sequence %d's sliding layers let go of "
                          "positions before %d (a step may go back to 0 or within its last step)", i, it->pos,
                          it->seq_id, f->sw_from[it->seq_id] * TP_KV_PAGE);
    if (f->dn && !tp_deltanet_can_start(f->dn, it->seq_id, it->pos, len))
        return tp_err_set(err, TP_EINVAL, "forward: item %d: pos %d: sequence %d's DeltaNet state is at %d and "
                          "can go back only to 0 or its last step's start", i, it->pos, it->seq_id, len);
    if (it->n_tokens > f->max_pos - it->pos)
        return tp_err_set(err, TP_EFULL, "forward: item %d: sequence %d needs %lld positions, its KV slot "
                          "holds %d", i, it->seq_id, (long long)it->pos + it->n_tokens, f->max_pos);
    for (int j = 0; j < it->n_tokens; j++)
        if (it->tokens[j] < 0 || it->tokens[j] >= f->c.vocab_size)
            return tp_err_set(err, TP_EINVAL, "forward: item %d: token %d is %d, outside 0..%d", i, j,
                              it->tokens[j], f->c.vocab_size - 1);
    return 0;
}

static int check_items(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits,
                       float *const *all, int *n_tok, tp_err *err)
{
    if (n_items < 0 || (n_items > 0 && !items))
        return tp_err_set(err, TP_EINVAL, "forward: bad item list (%d items)", n_items);
    long long total = 0;
    int rc = 0;
    for (int i = 0; i < n_items && !rc; i++) {
        rc = check_item(f, &items[i], i, err);
        if (!rc && !items[i].skip_logits && !ROWS(all, i) && !logits)
            rc = tp_err_set(err, TP_EINVAL, "forward: item %d wants logits but the logits buffer is NULL", i);
        if (!rc && ROWS(all, i) && f->kernel != TP_FWD_KERNEL_INVARIANT)
            rc = tp_err_set(err, TP_EINVAL, "forward: item %d: a verify step needs the invariant "
                            "kernel", i);
        if (!rc && ROWS(all, i) && f->dn)
            rc = tp_err_set(err, TP_EINVAL, "forward: item %d: no verify step on a hybrid model (its "
                            "recurrent state cannot be rolled back)", i);
        total += rc ? 0 : items[i].n_tokens;
    }
    for (int i = 0; i < n_items; i++)
        if (items[i].seq_id >= 0 && items[i].seq_id < f->slots)
            f->seen[items[i].seq_id] = 0;
    if (!rc && total > f->max_tokens)
        rc = tp_err_set(err, TP_ERANGE, "forward: %lld tokens in one step, more than max_batch_tokens %d",
                        total, f->max_tokens);
    *n_tok = (int)total;
    return rc;
}

static void embed(tp_forward *f, const tp_fwd_item *items, int n_items)
{
    const tp_wmat *emb = &tp_model_get_weights(f->model)->m.token_embedding;
    size_t d = (size_t)f->c.dim;
    int t = 0;
    for (int i = 0; i < n_items; i++)
        for (int j = 0; j < items[i].n_tokens; j++, t++) {
            float *x = f->s.x + (size_t)t * d;
            tp_wmat_dequant_row(emb, items[i].tokens[j], x); /* one row, any type */
            if (f->c.embd_scale) /* Gemma: llama.cpp's ggml_scale by sqrtf(n_embd) */
                for (size_t k = 0; k < d; k++)
                    x[k] *= sqrtf((float)d);
            f->s.tok_slot[t] = items[i].seq_id;
            f->s.tok_pos[t] = items[i].pos + j;
        }
}

static void add_rows(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

static void attention_block(tp_forward *f, int l, int T)
{
    const tp_model_config *c = &f->c;
    const tp_layer_weights *lw = &tp_model_get_weights(f->model)->layers[l];
    scratch *s = &f->s;
    size_t d = (size_t)c->dim, kvd = (size_t)c->kv_dim, qd = (size_t)c->q_dim;
    size_t qr = c->attn_gate ? 2 * qd : qd, qs = qr + 2 * kvd; /* a gated query's rows hold its gates */
    for (int t = 0; t < T; t++)
        rmsnorm(s->xb + t * d, s->x + t * d, lw->rms_att, c->dim, c->norm_eps);
    if (T <= 4) /* decode: a prompt's chunk writes whole lines in a row */
        for (int t = 0; t < T; t++)
            prefetch_kv(f, l, s->tok_slot[t], s->tok_pos[t]);
    if (c->attn_bias) {
        if (lw->bq) prefetch_norm(lw->bq, (int)qd);
        if (lw->bk) prefetch_norm(lw->bk, (int)kvd);
        if (lw->bv) prefetch_norm(lw->bv, (int)kvd);
    }
    const float *qkv_w[3] = {lw->wq, lw->wk, lw->wv};
    const int qkv_rows[3] = {(int)qr, c->kv_dim, c->kv_dim};
    layer_matmul(f, &f->layers[l].qkv, &f->layers[l].tqkv, qkv_w, qkv_rows, 3, s->xb, c->dim, T, s->qkv,
                 (int)qs);
    /* Store every token's k and v before any attention, so a prefill token
     * sees the earlier tokens of its own chunk. */
    for (int t = 0; t < T; t++) {
        float *q = s->qkv + t * qs, *k = q + qr, *v = k + kvd;
        if (c->attn_gate) /* per head [query, gate]: the gates aside, the queries packed */
            for (int h = 0; h < c->n_heads; h++) {
                size_t hs = (size_t)c->head_size;
                memcpy(f->gate + t * qd + h * hs, q + (2 * h + 1) * hs, hs * sizeof(float));
                memmove(q + h * hs, q + 2 * h * hs, hs * sizeof(float));
            }
        if (c->attn_bias) {
            if (lw->bq) add_rows(q, lw->bq, qd);
            if (lw->bk) add_rows(k, lw->bk, kvd);
            if (lw->bv) add_rows(v, lw->bv, kvd);
        }
        if (c->qk_norm) /* qwen3: each head RMS-normed before RoPE (model/arch_qwen3.c) */
            for (int h = 0; h < c->n_heads; h++) {
                float *qh = q + (size_t)h * c->head_size;
                rmsnorm(qh, qh, lw->q_norm, c->head_size, c->norm_eps);
                if (h < c->n_kv_heads) {
                    float *kh = k + (size_t)h * c->head_size;
                    rmsnorm(kh, kh, lw->k_norm, c->head_size, c->norm_eps);
                }
            }
        rope(f, q, c->q_dim, s->tok_pos[t], l);
        rope(f, k, c->kv_dim, s->tok_pos[t], l);
        if (c->attn_scale) /* Gemma: Q scaled after RoPE (llama.cpp's f_attention_scale) */
            for (size_t i = 0; i < qd; i++)
                q[i] *= c->attn_scale;
        store_kv(f, l, s->tok_slot[t], s->tok_pos[t], k, v);
    }
    double macs = 0; /* scores and weighted sums: 2 * head_size per position per head, and an e^x */
    for (int t = 0; t < T; t++)
        macs += (2.0 * c->head_size + SWIGLU_MACS) * (s->tok_pos[t] + 1) * c->n_heads;
    att_job aj = {f, l};
    prefetch_norm(lw->rms_ffn, c->dim);
    tp_pool_run(f->pool, T * c->n_heads, 1, parts_between(f, macs), attend_units, &aj);
    if (c->attn_gate) /* qwen35: the output times sigmoid(gate) */
        for (size_t i = 0; i < (size_t)T * qd; i++)
            s->xb[i] *= 1.0f / (1.0f + tp_vexp(-f->gate[i]));
    if (lw->bo)
        prefetch_norm(lw->bo, c->dim);
    layer_matmul(f, &f->layers[l].wo, &f->layers[l].two, &lw->wo, &c->dim, 1, s->xb, c->q_dim, T, s->proj,
                 c->dim);
    if (lw->bo) /* gpt-oss: the output projection's bias */
        for (int t = 0; t < T; t++)
            add_rows(s->proj + t * d, lw->bo, d);
    if (c->post_norms) /* Gemma: the attention's output normed before the residual add */
        for (int t = 0; t < T; t++)
            rmsnorm(s->proj + t * d, s->proj + t * d, lw->rms_att_post, c->dim, c->norm_eps);
    add_rows(s->x, s->proj, (size_t)T * d);
}

/* A Gated DeltaNet layer (deltanet.h): the projections here, the
 * recurrence in deltanet.c, then ssm_out and the residual add. */
static void deltanet_block(tp_forward *f, int l, int T)
{
    const tp_model_config *c = &f->c;
    const tp_layer_weights *lw = &tp_model_get_weights(f->model)->layers[l];
    scratch *s = &f->s;
    size_t d = (size_t)c->dim;
    int vd = c->ssm_head_dim * c->ssm_v_heads, cd = vd + 2 * c->ssm_head_dim * c->ssm_k_heads;
    int pw = tp_deltanet_proj_width(f->dn);
    float *proj = tp_deltanet_proj(f->dn);
    for (int t = 0; t < T; t++)
        rmsnorm(s->xb + t * d, s->x + t * d, lw->rms_att, c->dim, c->norm_eps);
    const float *in_w[2] = {lw->wqkv_lin, lw->wz}, *ba_w[2] = {lw->wbeta, lw->walpha};
    const int in_rows[2] = {cd, vd}, ba_rows[2] = {c->ssm_v_heads, c->ssm_v_heads};
    layer_matmul(f, &f->layers[l].qkv, &f->layers[l].tqkv, in_w, in_rows, 2, s->xb, c->dim, T, proj, pw);
    layer_matmul(f, &f->layers[l].ba, &f->layers[l].tba, ba_w, ba_rows, 2, s->xb, c->dim, T, proj + cd + vd, pw);
    /* per (token, value head): the state's three passes and a norm */
    double macs = (double)T * c->ssm_v_heads * (4.0 * c->ssm_head_dim * c->ssm_head_dim);
    tp_deltanet_layer(f->dn, f->pool, parts_between(f, macs), lw, l, s->tok_slot, s->tok_pos, T);
    layer_matmul(f, &f->layers[l].wo, &f->layers[l].two, &lw->wssm_out, &c->dim, 1, tp_deltanet_out(f->dn), vd,
                 T, s->proj, c->dim);
    add_rows(s->x, s->proj, (size_t)T * d);
}

typedef struct swiglu_job {
    const float *h13; /* [T][2 hidden]: gate, then up */
    float *out;       /* [T][hidden] */
    size_t h;
    bool vexp8;       /* e^x eight lanes a time (the same bits): the forward's simd */
    bool gelu;        /* the gate through GELU (Gemma), not SiLU */
} swiglu_job;

/* out = gelu(g) * u over n elements, GELU's tanh approximation (ggml's
 * and gemma_pytorch's) 0.5 g (1 + tanh(a)), a = sqrt(2 / pi) (g + 0.044715
 * g^3), computed as g * (1 / (1 + e^-2a)), the same function, with
 * vexp.h's e^x: the same bits on every path and host. */
static void geglu_scalar(const float *g, const float *u, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float val = g[i], a = 0.7978845608028654f * (val + 0.044715f * val * val * val);
        val *= 1.0f / (1.0f + tp_vexp(-2.0f * a));
        out[i] = val * u[i];
    }
}

/* Elements [e0, e1) of the flattened [T][hidden] output, a token's run
 * at a time. */
static void swiglu_range(void *arg, int e0, int e1, int worker)
{
    (void)worker;
    const swiglu_job *j = arg;
    for (size_t e = (size_t)e0; e < (size_t)e1;) {
        size_t t = e / j->h, i = e % j->h, end = (t + 1) * j->h < (size_t)e1 ? (t + 1) * j->h : (size_t)e1;
        const float *g = j->h13 + t * 2 * j->h + i;
        if (j->gelu)
            geglu_scalar(g, g + j->h, j->out + e, end - e);
        else
            tp_swiglu(g, g + j->h, j->out + e, end - e, j->vexp8);
        e = end;
    }
}

/* Gate, up and SwiGLU as one pool job over the hidden units: a range
 * computes its rows of the gate and of the up matrix, then their SwiGLU,
 * so no thread waits for another between the matmul and the SwiGLU (one
 * synchronisation point a layer fewer: with many threads at batch 1 each
 * one is a wait for the slowest). Every element is what the matmul and
 * swiglu_range give apart: the same bits. */
typedef struct ffn_up_job {
    qmm_job q; /* gate and up typed (q.n 2, both starting at row 0), else */
    mm_job m;  /* the packed f32 w13: gate rows, then up rows from hidden */
    swiglu_job sj;
} ffn_up_job;

static void ffn_up_rows(void *arg, int r0, int r1, int worker)
{
    const ffn_up_job *j = arg;
    int h = (int)j->sj.h;
    if (j->q.n) {
        qmm_rows((void *)&j->q, r0, r1, worker);
    } else {
        mm_rows((void *)&j->m, r0, r1, worker);
        mm_rows((void *)&j->m, h + r0, h + r1, worker);
    }
    for (int t = 0; t < j->m.n_tok; t++)
        swiglu_range((void *)&j->sj, t * h + r0, t * h + r1, worker);
}

/* The fused job when the layer's gate and up allow it: both typed, of one
 * kind, gate's columns first; or packed f32 with hidden a multiple of the
 * packed row split (up's rows then start on one). OpenBLAS, mixed groups:
 * apart. */
static bool ffn_up_fused(tp_forward *f, int l, int T, int h)
{
    const packed_layer *pl = &f->layers[l];
    const tp_model_config *c = &f->c;
    scratch *s = &f->s;
    ffn_up_job j = {.m = {.x = s->xb, .y = s->h13, .ldx = c->dim, .n_tok = T, .ldy = 2 * h, .simd = f->simd},
                    .sj = {s->h13, s->proj, (size_t)h, f->simd, c->ffn_act == TP_FFN_GELU_TANH}};
    int align;
    if (pl->tw13.n == 2 && !pl->tw13.part[0].p.p && !pl->tw13.part[1].p.p &&
        typed_kind(&pl->tw13.part[0]) == typed_kind(&pl->tw13.part[1]) && pl->tw13.part[0].col == 0 &&
        pl->tw13.part[1].col == h && pl->tw13.part[0].w.rows == h && pl->tw13.part[1].w.rows == h) {
        j.q = (qmm_job){.part = pl->tw13.part, .n = 2, .a = &f->qact, .y = s->h13, .ldy = 2 * h, .simd = f->qsimd};
        align = TYPED_ROW_ALIGN;
        tp_qact_prepare(&f->qact, pl->tw13.part[0].w.type, s->xb, c->dim, T, c->dim);
    } else if (pl->tw13.n == 0 && f->kernel != TP_FWD_KERNEL_OPENBLAS && h % TP_MATMUL_ROW_ALIGN == 0) {
        j.m.w = &pl->w13;
        align = TP_MATMUL_ROW_ALIGN;
    } else {
        return false;
    }
    double macs = 2.0 * h * c->dim * T + (double)T * h * SWIGLU_MACS;
    tp_pool_run(f->pool, h, align, parts_for(f, macs), ffn_up_rows, &j);
    return true;
}

static void ffn_block(tp_forward *f, int l, int T)
{
    const tp_model_config *c = &f->c;
    const tp_model_weights *mw = tp_model_get_weights(f->model);
    const tp_layer_weights *lw = &mw->layers[l];
    scratch *s = &f->s;
    size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim;
    for (int t = 0; t < T; t++)
        rmsnorm(s->xb + t * d, s->x + t * d, lw->rms_ffn, c->dim, c->norm_eps);
    if (f->moe) { /* experts (moe.h), their weighted sum into h13 as [T][dim] */
        tp_moe_run r = {f->pool, f->part_min, f->simd, f->qsimd};
        tp_moe_ffn(f->moe, &r, l, s->xb, T, s->h13);
        prefetch_norm(l + 1 < c->n_layers ? mw->layers[l + 1].rms_att : mw->rms_final, c->dim);
        add_rows(s->x, s->h13, (size_t)T * d);
        return;
    }
    /* SwiGLU, packed [T][hidden] into proj: an e^x per element, a share of
     * a batched step big enough to split too (elementwise: same bits); with
     * the matmul's rows where it can */
    if (!ffn_up_fused(f, l, T, (int)h)) {
        const float *w13[2] = {lw->w1, lw->w3};
        const int w13_rows[2] = {c->hidden_dim, c->hidden_dim};
        layer_matmul(f, &f->layers[l].w13, &f->layers[l].tw13, w13, w13_rows, 2, s->xb, c->dim, T, s->h13,
                     (int)(2 * h));
        swiglu_job sj = {s->h13, s->proj, h, f->simd, c->ffn_act == TP_FFN_GELU_TANH};
        tp_pool_run(f->pool, T * (int)h, 64, parts_between(f, (double)T * (double)h * SWIGLU_MACS), swiglu_range,
                    &sj);
    }
    prefetch_norm(l + 1 < c->n_layers ? mw->layers[l + 1].rms_att : mw->rms_final, c->dim);
    /* w2 reads proj ([T][hidden]) and writes into h13, reused as [T][dim]. */
    layer_matmul(f, &f->layers[l].w2, &f->layers[l].tw2, &lw->w2, &c->dim, 1, s->proj, c->hidden_dim, T, s->h13,
                 c->dim);
    if (c->post_norms)
        for (int t = 0; t < T; t++)
            rmsnorm(s->h13 + t * d, s->h13 + t * d, lw->rms_ffn_post, c->dim, c->norm_eps);
    add_rows(s->x, s->h13, (size_t)T * d);
}

/* The classifier as one OpenBLAS call over every row that wants logits,
 * straight into logits when no item skips them. */
static void classify_blas(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits, int rows)
{
    const float *wcls = tp_model_get_weights(f->model)->wcls;
    size_t V = (size_t)f->c.vocab_size;
    float *out = rows == n_items ? logits : f->cls_all;
    blas_matmul(f, wcls, f->c.vocab_size, f->c.dim, f->s.cls_in, f->c.dim, rows, out, (int)V);
    if (out == logits)
        return;
    for (int i = 0, k = 0; i < n_items; i++)
        if (!items[i].skip_logits)
            memcpy(logits + (size_t)i * V, f->cls_all + (size_t)k++ * V, V * sizeof(float));
}

static void cls_matmul(tp_forward *f, const float *x, int n, float *y, int ldy)
{
    if (f->tcls.n)
        typed_group_matmul(f, &f->tcls, x, f->c.dim, n, y, ldy);
    else
        matmul(f, &f->cls, x, f->c.dim, n, y, ldy);
}

/* Where the next classifier row goes, walking the items in the order their
 * rows were made: a verify item's rows in turn, else the step's row i. */
static float *next_dst(const tp_fwd_item *items, float *logits, float *const *all, size_t V, int *i, int *j)
{
    while (!ROWS(all, *i) && items[*i].skip_logits)
        ++*i;
    const tp_fwd_item *it = &items[*i];
    if (!ROWS(all, *i))
        return logits + (size_t)(*i)++ * V;
    float *dst = all[*i] + (size_t)(*j)++ * V;
    if (*j == it->n_tokens) {
        ++*i;
        *j = 0;
    }
    return dst;
}

static void classify(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits, float *const *all)
{
    scratch *s = &f->s;
    size_t d = (size_t)f->c.dim, V = (size_t)f->c.vocab_size;
    const float *rms_final = tp_model_get_weights(f->model)->rms_final;
    int rows = 0, t = 0;
    bool verify = false;
    for (int i = 0; i < n_items; i++) {
        /* a verify item's every row: each rmsnorm and classifier row is the
         * one a single-token step gives that position (rows never interact) */
        int first = ROWS(all, i) ? 0 : items[i].skip_logits ? items[i].n_tokens : items[i].n_tokens - 1;
        for (int j = first; j < items[i].n_tokens; j++)
            rmsnorm(s->cls_in + (size_t)rows++ * d, s->x + (size_t)(t + j) * d, rms_final, f->c.dim,
                    f->c.norm_eps);
        verify |= ROWS(all, i) != NULL;
        t += items[i].n_tokens;
    }
    if (!rows)
        return;
    if (f->kernel == TP_FWD_KERNEL_OPENBLAS) { /* no verify items (check_items) */
        classify_blas(f, items, n_items, logits, rows);
        return;
    }
    /* Rows of items that want logits are contiguous in the output when none
     * skips; otherwise compute CLS_CHUNK rows at a time into scratch and
     * scatter (same bits: rows never interact in the kernel). */
    if (rows == n_items && !verify) {
        cls_matmul(f, s->cls_in, rows, logits, (int)V);
        return;
    }
    int i = 0, j = 0;
    for (int r = 0; r < rows;) {
        int n = rows - r < CLS_CHUNK ? rows - r : CLS_CHUNK;
        cls_matmul(f, s->cls_in + (size_t)r * d, n, s->cls_out, (int)V);
        for (int k = 0; k < n; k++)
            memcpy(next_dst(items, logits, all, V, &i, &j), s->cls_out + (size_t)k * V, V * sizeof(float));
        r += n;
    }
}

/* Embeddings: the items' final-normed hidden states pooled as pools[i]
 * asks (NULL: none). -1: out of memory (the pooled vectors untouched). */
static int pool(tp_forward *f, const tp_fwd_item *items, int n_items, const tp_fwd_pool *pools)
{
    if (!pools)
        return 0;
    size_t d = (size_t)f->c.dim;
    const float *rms_final = tp_model_get_weights(f->model)->rms_final;
    float *h = NULL;
    for (int i = 0, t0 = 0; i < n_items; t0 += items[i++].n_tokens) {
        const tp_fwd_item *it = &items[i];
        const tp_fwd_pool *pl = &pools[i];
        if (pl->pool == TP_POOL_NONE || !pl->pooled)
            continue;
        if (!h && !(h = malloc(d * sizeof *h)))
            return -1;
        int from = it->n_tokens - 1, to = it->n_tokens;   /* LAST */
        if (pl->pool == TP_POOL_MEAN)
            from = 0;
        else if (pl->pool == TP_POOL_CLS)
            from = 0, to = it->pos == 0 ? 1 : 0;
        for (int k = from; k < to; k++) {
            rmsnorm(h, f->s.x + (size_t)(t0 + k) * d, rms_final, f->c.dim, f->c.norm_eps);
            for (size_t j = 0; j < d; j++)
                pl->pooled[j] = pl->pool == TP_POOL_MEAN ? pl->pooled[j] + h[j] : h[j];
        }
    }
    free(h);
    return 0;
}

/* Give item `it` writable pages for its positions and record its tokens.
 * A page it writes that is shared (cached, or held by another sequence:
 * only after a rewind) is replaced by a private copy of it; pages past the
 * item's end (a rewind) are let go. Cannot run out of pages: the pool has
 * a page for every position of every slot, and a page nobody holds is
 * free or evictable (prefix_cache.h). */
/* Copy page (or part) `from`'s bytes to `to` in the caches k and v, n bytes a page. */
static void copy_page(uint8_t *k, uint8_t *v, size_t n, int to, int from)
{
    memcpy(k + (size_t)to * n, k + (size_t)from * n, n);
    memcpy(v + (size_t)to * n, v + (size_t)from * n, n);
}

static int prepare_pages(tp_forward *f, const tp_fwd_item *it, bool verify)
{
    int seq = it->seq_id, end = it->pos + it->n_tokens, *t = seq_table(f, seq);
    size_t es = f->kv_type == TP_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    if (it->pos == 0 && f->sw_from[seq] > 0) /* a restart after parts were let go: every page anew */
        drop_pages(f, seq, 0);
    release_parts(f, seq, first_block(f, it->pos)); /* the window rule: the step's first query decides */
    drop_pages(f, seq, (end + TP_KV_PAGE - 1) / TP_KV_PAGE);
    if (f->n_pub[seq] > it->pos / TP_KV_PAGE)
        f->n_pub[seq] = it->pos / TP_KV_PAGE;
    for (int b = it->pos / TP_KV_PAGE; b <= (end - 1) / TP_KV_PAGE; b++) {
        int old = t[b], old_part = -1; /* b >= sw_from: a held page's part is claimed */
        if (old >= 0 && !tp_pcache_shared(f->pc, old))
            continue;
        if (old >= 0) {
            old_part = tp_pcache_part(f->pc, old);
            if (f->n_parts)
                tp_pcache_part_release(f->pc, old);
            tp_pcache_unref(f->pc, old);
        }
        int p = tp_pcache_alloc(f->pc);
        if (p < 0 || (f->n_parts && tp_pcache_part_claim(f->pc, p) < 0))
            return TP_EFULL;
        if (f->dn) /* its positions are rewritten: a state kept at its end is not theirs */
            tp_deltanet_page_drop(f->dn, p);
        /* unreferenced first, so an old page (part) nobody else holds may
         * come back as p (p's part) itself with its bytes intact */
        if (old >= 0 && b * TP_KV_PAGE < it->pos) {
            if (p != old)
                copy_page(f->kcache, f->vcache, f->page_elems * es, p, old);
            if (f->n_parts && tp_pcache_part(f->pc, p) != old_part)
                copy_page(f->kpart, f->vpart, f->part_elems * es, tp_pcache_part(f->pc, p), old_part);
        }
        t[b] = p;
    }
    int32_t *rec = f->seq_tok + (size_t)seq * (size_t)f->kv_pos;
    for (int j = 0; j < it->n_tokens; j++)
        rec[it->pos + j] = it->tokens[j];
    if ((it->n_tokens > 1 || it->skip_logits) && !verify) /* a verify step is decode */
        tp_pcache_count_prefill(f->pc, it->n_tokens);
    return 0;
}

/* Offer seq's newly full pages to the cache, in order (a page's key names
 * the page before it); a page the cache already holds is swapped for the
 * cached one, which holds the same bits. */
static void publish_pages(tp_forward *f, int seq)
{
    if (!cache_usable(f))
        return;
    int *t = seq_table(f, seq);
    const int32_t *rec = f->seq_tok + (size_t)seq * (size_t)f->kv_pos;
    for (int b = f->n_pub[seq]; b < f->seq_len[seq] / TP_KV_PAGE; b++) {
        int p = tp_pcache_publish(f->pc, t[b], b ? t[b - 1] : -1, rec + (size_t)b * TP_KV_PAGE);
        if (p != t[b]) {
            if (f->n_parts && b >= f->sw_from[seq]) /* the same bits: keep what is there, or bring ours */
                tp_pcache_part_move(f->pc, t[b], p);
            tp_pcache_unref(f->pc, t[b]);
            t[b] = p;
        }
        f->n_pub[seq] = b + 1;
    }
    int kept = f->dn ? tp_deltanet_kept_at(f->dn, seq) : -1;
    if (kept > 0 && kept / TP_KV_PAGE <= f->n_pub[seq]) /* the state at that page's end, for prefix hits */
        tp_deltanet_keep(f->dn, seq, t[kept / TP_KV_PAGE - 1]);
}

int tp_forward_step(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits, tp_err *err)
{
    return tp_forward_step_full(f, items, n_items, logits, NULL, NULL, err);
}

int tp_forward_step_verify(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits,
                           float *const *all, tp_err *err)
{
    return tp_forward_step_full(f, items, n_items, logits, all, NULL, err);
}

int tp_forward_step_pooled(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits,
                           const tp_fwd_pool *pools, tp_err *err)
{
    return tp_forward_step_full(f, items, n_items, logits, NULL, pools, err);
}

int tp_forward_step_full(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits,
                         float *const *all, const tp_fwd_pool *pools, tp_err *err)
{
    int T = 0;
    int rc = check_items(f, items, n_items, logits, all, &T, err);
    if (rc || T == 0)
        return rc;
    for (int i = 0; i < n_items; i++)
        if (prepare_pages(f, &items[i], ROWS(all, i) != NULL))
            return tp_err_set(err, TP_EFULL, "forward: no free KV page for item %d (every page is held)", i);
    if (f->kernel == TP_FWD_KERNEL_OPENBLAS) /* process-wide: set it for this instance every step */
        f->blas.set_num_threads(tp_forward_threads(f));
    embed(f, items, n_items);
    tp_pool_hold(f->pool, true); /* helpers spin between this step's jobs, then sleep */
    if (f->dn)
        for (int i = 0; i < n_items; i++)
            tp_deltanet_start(f->dn, items[i].seq_id, items[i].pos, f->seq_len[items[i].seq_id]);
    for (int l = 0; l < f->c.n_layers; l++) {
        if (f->dn && tp_model_layer_recurrent(&f->c, l))
            deltanet_block(f, l, T);
        else
            attention_block(f, l, T);
        ffn_block(f, l, T);
    }
    if (pool(f, items, n_items, pools))
        rc = tp_err_set(err, TP_ENOMEM, "forward: out of memory for an embedding");
    classify(f, items, n_items, logits, all);
    for (int i = 0; i < n_items && f->c.final_softcap; i++) /* Gemma 2 */
        if (ROWS(all, i))
            softcap(all[i], items[i].n_tokens * f->c.vocab_size, f->c.final_softcap);
        else if (!items[i].skip_logits)
            softcap(logits + (size_t)i * f->c.vocab_size, f->c.vocab_size, f->c.final_softcap);
    tp_pool_hold(f->pool, false);
    for (int i = 0; i < n_items; i++) {
        f->seq_len[items[i].seq_id] = items[i].pos + items[i].n_tokens;
        publish_pages(f, items[i].seq_id);
    }
    return rc;
}
