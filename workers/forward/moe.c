/* The mixture-of-experts FFN (moe.h): routing, the grouping of a step's
 * tokens by expert, the experts' matmuls on the pool, the weighted sum,
 * and a shared expert's gated output after it (qwen35moe). */
#include "moe.h"
#include "tokpipe/forward.h"
#include "tokpipe/ggml_types.h"
#include "kernels.h"
#include "quant.h"
#include "vexp.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Typed matmuls split at multiples of this (forward.c's TYPED_ROW_ALIGN). */
#define TYPED_ALIGN 16
/* What one SwiGLU element costs in multiply-adds (forward.c's SWIGLU_MACS). */
#define SWIGLU_MACS 16
/* llama.cpp clamps the top-k weights' sum at F16's smallest normal. */
#define MIN_WEIGHT_SUM 6.103515625e-5f

/* One of gate, up, down (or the router) of a layer: per expert (one
 * for the router) the file's view with its panel, or a packed F32 copy. */
typedef struct exp_mat {
    int n;
    tp_wmat *w;    /* [n] */
    tp_packed *p;  /* [n] when F32 */
    int kind;      /* typed: 0 integer (quantized input), 1 F16/BF16 (float input) */
} exp_mat;

typedef struct moe_layer {
    exp_mat router, gate, up, down;
    /* gpt-oss's biases (model.h), else NULL */
    const float *br, *b_gate, *b_up, *b_down;
    exp_mat sh_gate, sh_up, sh_down; /* the shared expert (n 1), when shexp_ff */
    const float *sh_vec;             /* [dim] its sigmoid gate's weights */
} moe_layer;

struct tp_moe {
    const tp_model *model;
    int dim, ne, k, ff, max_tok;
    bool topk_softmax; /* gpt-oss's gating (model.h's moe_softmax_topk) */
    bool oai;          /* swiglu_oai, not SwiGLU */
    moe_layer *layers;
    uint8_t *panels; /* the typed matrices' panels (tp_qpanel_map), or NULL */
    size_t panels_len;
    tp_qact qx[2];  /* the router's / gate and up's input by kind: [T * k][dim] */
    tp_qact qt;     /* gate and up's integer input per token: [T][dim], gathered into qx[0] */
    int *src;       /* [T * k] the token of each grouped row */
    bool qd_in_job; /* down's integer input quantized in the gate/up job, as its SwiGLU is made */
    tp_qact qd[2];  /* down's input by kind: [T * k][ff] */
    float *logits;  /* [T][ne], then the router's probabilities */
    int *sel;       /* [T][k] experts by rank */
    float *wt;      /* [T][k] their weights */
    int *row;       /* [T][k] the gathered row of (token, rank) */
    int *cnt, *off, *active, *start; /* [ne]: rows of each expert, first row; active experts, their job rows */
    int n_active;
    float *xg;      /* [T * k][dim] each row's input, grouped by expert */
    float *h;       /* [T * k][2 ff] gate, up */
    float *a;       /* [T * k][ff] SwiGLU */
    float *y;       /* [T * k][dim] the expert's output */
    /* the shared expert (sff > 0): every token's rows in token order */
    int sff;
    tp_qact qs[2];  /* down's input by kind: [T][sff] */
    float *hs;      /* [T][2 sff] gate, up */
    float *as;      /* [T][sff] SwiGLU */
    float *ys;      /* [T][dim] its output, before the gate */
};

/* ---- setup ------------------------------------------------------------- */

static int mat_init(exp_mat *m, const tp_wmat *src, int n, const tp_model *model)
{
    m->n = n;
    m->w = calloc((size_t)n, sizeof *m->w);
    if (!m->w)
        return TP_ENOMEM;
    memcpy(m->w, src, (size_t)n * sizeof *m->w);
    m->kind = src->type == TP_GGML_F16 || src->type == TP_GGML_BF16;
    if (src->type == TP_GGML_F32) {
        m->p = calloc((size_t)n, sizeof *m->p);
        if (!m->p)
            return TP_ENOMEM;
        for (int e = 0; e < n; e++) {
            const float *d = m->w[e].data;
            if (tp_pack(&d, &m->w[e].rows, 1, m->w[e].cols, &m->p[e]))
                return TP_ENOMEM;
            tp_model_drop_pages(model, d, m->w[e].row_bytes * (size_t)m->w[e].rows);
        }
        return 0;
    }
    return 0;
}

/* A layer's typed matrices: e < 0 the router and the shared expert's,
 * else expert e's gate, up and down (the kernels' prefetches stop at a
 * matrix's end, so the order is free). */
static int layer_mats(moe_layer *L, int e, exp_mat **out)
{
    int n = 0;
    if (e < 0) {
        out[n++] = &L->router;
        out[n++] = &L->sh_gate;
        out[n++] = &L->sh_up;
        out[n++] = &L->sh_down;
        return n;
    }
    out[n++] = &L->gate;
    out[n++] = &L->up;
    out[n++] = &L->down;
    return n;
}

/* A layer's typed matrices that take a panel, as jobs at the next
 * offsets (job NULL: only counted). */
static void layer_jobs(tp_moe *m, moe_layer *L, tp_qpanel_job *job, int *n, size_t *off)
{
    for (int e = -1; e < m->ne; e++) {
        exp_mat *mats[4];
        int nm = layer_mats(L, e, mats);
        for (int i = 0; i < nm; i++) {
            exp_mat *mt = mats[i];
            int k = e < 0 ? 0 : e;
            if (!mt->w || mt->p || k >= mt->n)
                continue;
            size_t b = tp_qpanel_bytes(&mt->w[k]);
            if (!b)
                continue;
            if (job)
                job[*n] = (tp_qpanel_job){&mt->w[k], *off};
            ++*n;
            *off += b;
        }
    }
}

/* The typed matrices' panels, all in one mapping of huge pages (decode
 * reads a few experts' panels of each layer: under 4 KB pages, most of
 * its lines were TLB misses), built on every CPU the process may use;
 * then the file's pages of those matrices may go. */
static int make_panels(tp_moe *m, int n_layers)
{
    size_t total = 0;
    int n = 0;
    for (int l = 0; l < n_layers; l++)
        layer_jobs(m, &m->layers[l], NULL, &n, &total);
    if (!n)
        return 0;
    tp_qpanel_job *job = malloc(sizeof *job * (size_t)n);
    m->panels = job ? tp_qpanel_map(total, &m->panels_len) : NULL;
    if (!m->panels) {
        free(job);
        return TP_ENOMEM;
    }
    size_t off = 0;
    n = 0;
    for (int l = 0; l < n_layers; l++)
        layer_jobs(m, &m->layers[l], job, &n, &off);
    int rc = tp_qpanel_build_jobs(job, n, m->panels, tp_forward_default_threads());
    for (int i = 0; !rc && i < n; i++)
        tp_model_drop_pages(m->model, job[i].w->data, job[i].w->row_bytes * (size_t)job[i].w->rows);
    free(job);
    return rc;
}

static void mat_free(exp_mat *m)
{
    for (int e = 0; e < m->n; e++) {
        if (m->p)
            tp_packed_free(&m->p[e]);
        if (m->w)
            tp_qpanel_free(&m->w[e]);
    }
    free(m->w);
    free(m->p);
}

int tp_moe_new(const tp_model *model, int max_tokens, bool panels, tp_moe **out)
{
    *out = NULL;
    const tp_model_config *c = tp_model_get_config(model);
    if (!c->n_expert)
        return 0;
    tp_moe *m = calloc(1, sizeof *m);
    if (!m)
        return TP_ENOMEM;
    m->model = model;
    m->dim = c->dim;
    m->ne = c->n_expert;
    m->k = c->n_expert_used;
    m->ff = c->expert_ff;
    m->max_tok = max_tokens;
    m->topk_softmax = c->moe_softmax_topk;
    m->oai = c->ffn_act == TP_FFN_SWIGLU_OAI;
    m->sff = c->shexp_ff;
    size_t T = (size_t)max_tokens, R = T * (size_t)m->k, d = (size_t)m->dim, ff = (size_t)m->ff;
    size_t ne = (size_t)m->ne;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    int rc = m->layers ? 0 : TP_ENOMEM;
    bool int_in = false, int_down = false, int_sh = false;
    const tp_model_weights *w = tp_model_get_weights(model);
    for (int l = 0; !rc && l < c->n_layers; l++) {
        const tp_layer_weights *lw = &w->layers[l];
        moe_layer *L = &m->layers[l];
        L->br = lw->br;
        L->b_gate = lw->b1_exps;
        L->b_up = lw->b3_exps;
        L->b_down = lw->b2_exps;
        rc = mat_init(&L->router, &lw->m.wr, 1, model);
        if (!rc) rc = mat_init(&L->gate, lw->w1_exps, m->ne, model);
        if (!rc) rc = mat_init(&L->up, lw->w3_exps, m->ne, model);
        if (!rc) rc = mat_init(&L->down, lw->w2_exps, m->ne, model);
        if (!rc) {
            int_in = int_in || (!L->router.p && !L->router.kind) || (!L->gate.p && !L->gate.kind) ||
                     (!L->up.p && !L->up.kind);
            int_down = int_down || (!L->down.p && !L->down.kind);
        }
        if (!rc && m->sff) {
            L->sh_vec = lw->shexp_gate;
            rc = mat_init(&L->sh_gate, &lw->m.w1_shexp, 1, model);
            if (!rc) rc = mat_init(&L->sh_up, &lw->m.w3_shexp, 1, model);
            if (!rc) rc = mat_init(&L->sh_down, &lw->m.w2_shexp, 1, model);
            if (!rc) {
                int_in = int_in || (!L->sh_gate.p && !L->sh_gate.kind) || (!L->sh_up.p && !L->sh_up.kind);
                int_sh = int_sh || (!L->sh_down.p && !L->sh_down.kind);
            }
        }
    }
    if (!rc && panels)
        rc = make_panels(m, c->n_layers);
    if (!rc && int_sh) rc = tp_qact_init(&m->qs[0], max_tokens, m->sff);
    if (!rc && m->sff) {
        size_t sff = (size_t)m->sff;
        m->hs = malloc(T * 2 * sff * sizeof *m->hs);
        m->as = malloc(T * sff * sizeof *m->as);
        m->ys = malloc(T * d * sizeof *m->ys);
        if (!m->hs || !m->as || !m->ys)
            rc = TP_ENOMEM;
    }
    if (!rc && int_in) rc = tp_qact_init(&m->qx[0], (int)R, m->dim);
    if (!rc && int_in) rc = tp_qact_init(&m->qt, max_tokens, m->dim);
    if (!rc && int_down) rc = tp_qact_init(&m->qd[0], (int)R, m->ff);
    if (!rc) {
        m->logits = malloc(T * ne * sizeof *m->logits);
        m->sel = malloc(R * sizeof *m->sel);
        m->wt = malloc(R * sizeof *m->wt);
        m->row = malloc(R * sizeof *m->row);
        m->src = malloc(R * sizeof *m->src);
        m->cnt = malloc(ne * sizeof *m->cnt);
        m->off = malloc(ne * sizeof *m->off);
        m->active = malloc(ne * sizeof *m->active);
        m->start = malloc((ne + 1) * sizeof *m->start);
        m->xg = malloc(R * d * sizeof *m->xg);
        m->h = malloc(R * 2 * ff * sizeof *m->h);
        m->a = malloc(R * ff * sizeof *m->a);
        m->y = malloc(R * d * sizeof *m->y);
        if (!m->logits || !m->sel || !m->wt || !m->row || !m->src || !m->cnt || !m->off || !m->active ||
            !m->start || !m->xg || !m->h || !m->a || !m->y)
            rc = TP_ENOMEM;
    }
    if (rc) {
        tp_moe_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void tp_moe_free(tp_moe *m)
{
    if (!m)
        return;
    if (m->layers)
        for (int l = 0; l < tp_model_get_config(m->model)->n_layers; l++) {
            mat_free(&m->layers[l].router);
            mat_free(&m->layers[l].gate);
            mat_free(&m->layers[l].up);
            mat_free(&m->layers[l].down);
            mat_free(&m->layers[l].sh_gate);
            mat_free(&m->layers[l].sh_up);
            mat_free(&m->layers[l].sh_down);
        }
    free(m->layers);
    if (m->panels) /* after the panels' own frees above */
        munmap(m->panels, m->panels_len);
    tp_qact_free(&m->qx[0]);
    tp_qact_free(&m->qt);
    tp_qact_free(&m->qd[0]);
    tp_qact_free(&m->qs[0]);
    free(m->hs); free(m->as); free(m->ys);
    free(m->logits); free(m->sel); free(m->wt); free(m->row); free(m->src); free(m->cnt); free(m->off);
    free(m->active); free(m->start); free(m->xg); free(m->h); free(m->a); free(m->y);
    free(m);
}

void tp_moe_last_choice(const tp_moe *m, int t, const int **experts, const float **weights)
{
    *experts = m->sel + (size_t)t * (size_t)m->k;
    *weights = m->wt + (size_t)t * (size_t)m->k;
}

/* ---- a step ------------------------------------------------------------ */

static int parts_for(const tp_moe_run *r, double macs)
{
    double p = macs / (double)(r->part_min < 1 ? 1 : r->part_min);
    int n = tp_pool_threads(r->pool);
    return p >= n ? n : p < 1 ? 1 : (int)p;
}

static int align_of(const exp_mat *m) { return m->p ? TP_MATMUL_ROW_ALIGN : TYPED_ALIGN; }

/* Rows [lo, hi) of expert e's matrix over its n input rows from t0 (x:
 * [.][ldx] F32; qa: the typed input by kind), into y ([n][ldy]). */
static void mat_rows(const exp_mat *m, int e, const float *x, int ldx, const tp_qact *qa, int t0, int n, float *y,
                     int ldy, int lo, int hi, const tp_moe_run *r)
{
    if (m->p) {
        tp_matmul_rows(&m->p[e], x + (size_t)t0 * (size_t)ldx, ldx, n, y, ldy, lo, hi, r->simd);
        return;
    }
    tp_qact v = tp_qact_rows(&qa[m->kind], t0, n);
    tp_qmatmul_rows(&m->w[e], &v, y, ldy, lo, hi, r->qsimd);
}

/* Prepare a typed matrix's input x ([n][cols]) in qa[kind]. */
static void prepare(const exp_mat *m, tp_qact *qa, const float *x, int n, int cols)
{
    if (!m->p)
        tp_qact_prepare(&qa[m->kind], m->w[0].type, x, cols, n, cols);
}

/* Prepare gate's or up's input (the grouped rows xg of the T tokens x) in
 * qa: integer types quantize each token's row once and copy it to its k
 * grouped rows (the bits of quantizing xg: each row its token's copy). */
static void prepare_grouped(tp_moe *m, const exp_mat *mat, const float *x, int T)
{
    if (mat->p)
        return;
    if (mat->kind) {
        tp_qact_prepare(&m->qx[1], mat->w[0].type, m->xg, m->dim, T * m->k, m->dim);
        return;
    }
    tp_qact_prepare(&m->qt, mat->w[0].type, x, m->dim, T, m->dim);
    tp_qact_gather(&m->qx[0], &m->qt, m->src, T * m->k);
}

typedef struct router_job {
    const tp_moe *m;
    const exp_mat *mat;
    const float *x;
    int n_tok;
    const tp_moe_run *r;
} router_job;

static void router_rows(void *arg, int r0, int r1, int worker)
{
    (void)worker;
    const router_job *j = arg;
    mat_rows(j->mat, 0, j->x, j->m->dim, j->m->qx, 0, j->n_tok, j->m->logits, j->m->ne, r0, r1, j->r);
}

/* Softmax over the experts (e^x by tp_vexp, the sum in index order), the
 * top k by probability (ties: the lower index), their weights renormalised. */
/* The top k router logits (ties: the lower index), then their softmax
 * alone (gpt-oss: llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT),
 * e^x by tp_vexp and the sum in rank order. */
static void route_token_topk(tp_moe *m, int t)
{
    const float *p = m->logits + (size_t)t * (size_t)m->ne;
    int *sel = m->sel + (size_t)t * (size_t)m->k;
    float *wt = m->wt + (size_t)t * (size_t)m->k;
    for (int r = 0; r < m->k; r++) {
        int best = -1;
        for (int e = 0; e < m->ne; e++) {
            bool taken = false;
            for (int q = 0; q < r && !taken; q++)
                taken = sel[q] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        sel[r] = best;
    }
    float max = p[sel[0]], sum = 0;
    for (int r = 0; r < m->k; r++) {
        wt[r] = tp_vexp(p[sel[r]] - max);
        sum += wt[r];
    }
    for (int r = 0; r < m->k; r++)
        wt[r] /= sum;
}

static void route_token(tp_moe *m, int t)
{
    if (m->topk_softmax) {
        route_token_topk(m, t);
        return;
    }
    float *p = m->logits + (size_t)t * (size_t)m->ne;
    int *sel = m->sel + (size_t)t * (size_t)m->k;
    float *wt = m->wt + (size_t)t * (size_t)m->k;
    float max = p[0], sum = 0;
    for (int e = 1; e < m->ne; e++)
        if (p[e] > max)
            max = p[e];
    for (int e = 0; e < m->ne; e++) {
        p[e] = tp_vexp(p[e] - max);
        sum += p[e];
    }
    for (int e = 0; e < m->ne; e++)
        p[e] /= sum;
    float wsum = 0;
    for (int r = 0; r < m->k; r++) {
        int best = -1;
        for (int e = 0; e < m->ne; e++) {
            bool taken = false;
            for (int q = 0; q < r && !taken; q++)
                taken = sel[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) /* strictly: an equal later one stays behind */
                best = e;
        }
        sel[r] = best;
        wt[r] = p[best];
        wsum += wt[r];
    }
    if (wsum < MIN_WEIGHT_SUM)
        wsum = MIN_WEIGHT_SUM;
    for (int r = 0; r < m->k; r++)
        wt[r] /= wsum;
}

/* Group the rows (token, rank) by expert, token order within one; copy
 * each row's input. */
static void group(tp_moe *m, const float *x, int T)
{
    int k = m->k;
    memset(m->cnt, 0, (size_t)m->ne * sizeof *m->cnt);
    for (int i = 0; i < T * k; i++)
        m->cnt[m->sel[i]]++;
    m->n_active = 0;
    for (int e = 0, o = 0; e < m->ne; o += m->cnt[e++]) {
        m->off[e] = o;
        if (m->cnt[e])
            m->active[m->n_active++] = e;
    }
    int *next = m->start; /* scratch until the jobs set it */
    memcpy(next, m->off, (size_t)m->ne * sizeof *next);
    size_t d = (size_t)m->dim;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < k; r++) {
            int g = next[m->sel[t * k + r]]++;
            m->row[t * k + r] = g;
            m->src[g] = t;
            memcpy(m->xg + (size_t)g * d, x + (size_t)t * d, d * sizeof(float));
        }
}

/* Each active expert's rows of a job at start[i], rows of rows each,
 * aligned; returns the job's rows. */
static int layout(tp_moe *m, int rows, int align)
{
    int s = 0;
    for (int i = 0; i < m->n_active; i++) {
        m->start[i] = s;
        s += (rows + align - 1) / align * align;
    }
    m->start[m->n_active] = s;
    return s;
}

typedef struct exp_job {
    tp_moe *m;
    const moe_layer *L;
    const tp_moe_run *r;
} exp_job;

/* y += b over n floats; eight lanes at a time where the CPU has AVX2 (the
 * same sums: gcc -O2 left this loop scalar, a twentieth of gpt-oss's
 * decode outside the matmuls). */
__attribute__((target("avx2"))) static void add_bias_avx2(float *y, const float *b, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++)
        y[i] += b[i];
}

static void add_bias(float *y, const float *b, int n, bool simd)
{
    if (simd) {
        add_bias_avx2(y, b, n);
        return;
    }
    for (int i = 0; i < n; i++)
        y[i] += b[i];
}

/* The piece [lo, hi) of active expert i's rows (of rows) that job rows
 * [r0, r1) cover; false when none. */
static bool piece(const tp_moe *m, int i, int rows, int r0, int r1, int *lo, int *hi)
{
    *lo = r0 > m->start[i] ? r0 - m->start[i] : 0;
    *hi = r1 - m->start[i] < rows ? r1 - m->start[i] : rows;
    return *lo < *hi;
}

/* Ask for n floats at p into L2 (an expert's biases: a few KB of
 * another expert's each time, from DRAM, read after its matmuls; asked
 * for before them, they arrive meanwhile). */
static void prefetch_floats(const float *p, int n)
{
    for (int i = 0; i < n; i += 16)
        _mm_prefetch((const char *)(p + i), _MM_HINT_T1);
}

/* Gate and up rows [lo, hi) of each expert over its tokens, then their
 * SwiGLU: no wait between the matmuls and the SwiGLU. */
static void up_rows(void *arg, int r0, int r1, int worker)
{
    (void)worker;
    const exp_job *j = arg;
    tp_moe *m = j->m;
    int ff = m->ff, lo, hi;
    for (int i = 0; i < m->n_active && m->start[i] < r1; i++) {
        if (!piece(m, i, ff, r0, r1, &lo, &hi))
            continue;
        int e = m->active[i], t0 = m->off[e], n = m->cnt[e];
        float *h = m->h + (size_t)t0 * 2 * (size_t)ff;
        if (j->L->b_gate)
            prefetch_floats(j->L->b_gate + (size_t)e * (size_t)ff + lo, hi - lo);
        if (j->L->b_up)
            prefetch_floats(j->L->b_up + (size_t)e * (size_t)ff + lo, hi - lo);
        mat_rows(&j->L->gate, e, m->xg, m->dim, m->qx, t0, n, h, 2 * ff, lo, hi, j->r);
        mat_rows(&j->L->up, e, m->xg, m->dim, m->qx, t0, n, h + ff, 2 * ff, lo, hi, j->r);
        for (int g = 0; g < n; g++) {
            float *hg = h + (size_t)g * 2 * (size_t)ff;
            float *ag = m->a + (size_t)(t0 + g) * (size_t)ff;
            if (j->L->b_gate) /* gpt-oss's biases, row by row */
                add_bias(hg + lo, j->L->b_gate + (size_t)e * (size_t)ff + lo, hi - lo, j->r->simd);
            if (j->L->b_up)
                add_bias(hg + ff + lo, j->L->b_up + (size_t)e * (size_t)ff + lo, hi - lo, j->r->simd);
            if (m->oai)
                tp_swiglu_oai(hg + lo, hg + ff + lo, ag + lo, (size_t)(hi - lo), j->r->simd);
            else
                tp_swiglu(hg + lo, hg + ff + lo, ag + lo, (size_t)(hi - lo), j->r->simd);
            if (m->qd_in_job) /* lo and hi are multiples of 32 then (tp_moe_ffn) */
                tp_qact_prepare_blocks(&m->qd[0], t0 + g, lo / 32, hi / 32);
        }
    }
}

static void down_rows(void *arg, int r0, int r1, int worker)
{
    (void)worker;
    const exp_job *j = arg;
    tp_moe *m = j->m;
    int lo, hi;
    for (int i = 0; i < m->n_active && m->start[i] < r1; i++) {
        if (!piece(m, i, m->dim, r0, r1, &lo, &hi))
            continue;
        int e = m->active[i], t0 = m->off[e];
        float *y = m->y + (size_t)t0 * (size_t)m->dim;
        if (j->L->b_down)
            prefetch_floats(j->L->b_down + (size_t)e * (size_t)m->dim + lo, hi - lo);
        mat_rows(&j->L->down, e, m->a, m->ff, m->qd, t0, m->cnt[e], y, m->dim, lo, hi, j->r);
        for (int g = 0; j->L->b_down && g < m->cnt[e]; g++)
            add_bias(y + (size_t)g * (size_t)m->dim + lo, j->L->b_down + (size_t)e * (size_t)m->dim + lo, hi - lo,
                     j->r->simd);
    }
}

/* The shared expert over all T tokens (one matrix each, every row of a
 * token its own: row-invariant as the routed experts'): gate and up rows
 * [r0, r1) then their SwiGLU; down rows [r0, r1). */
typedef struct sh_job {
    tp_moe *m;
    const moe_layer *L;
    const float *x;
    int T;
    const tp_moe_run *r;
} sh_job;

static void sh_up_rows(void *arg, int r0, int r1, int worker)
{
    (void)worker;
    const sh_job *j = arg;
    tp_moe *m = j->m;
    int sff = m->sff;
    if (r1 > sff)
        r1 = sff;
    if (r0 >= r1)
        return;
    mat_rows(&j->L->sh_gate, 0, j->x, m->dim, m->qx, 0, j->T, m->hs, 2 * sff, r0, r1, j->r);
    mat_rows(&j->L->sh_up, 0, j->x, m->dim, m->qx, 0, j->T, m->hs + sff, 2 * sff, r0, r1, j->r);
    for (int t = 0; t < j->T; t++) {
        const float *ht = m->hs + (size_t)t * 2 * (size_t)sff;
        float *at = m->as + (size_t)t * (size_t)sff;
        tp_swiglu(ht + r0, ht + sff + r0, at + r0, (size_t)(r1 - r0), j->r->simd);
    }
}

static void sh_down_rows(void *arg, int r0, int r1, int worker)
{
    (void)worker;
    const sh_job *j = arg;
    tp_moe *m = j->m;
    if (r1 > m->dim)
        r1 = m->dim;
    if (r0 < r1)
        mat_rows(&j->L->sh_down, 0, m->as, m->sff, m->qs, 0, j->T, m->ys, m->dim, r0, r1, j->r);
}

static int round_up(int n, int a) { return (n + a - 1) / a * a; }

typedef struct sum_job {
    const tp_moe *m;
    float *out;
    const float *x;      /* the FFN's input, for the shared expert's gate */
    const float *sh_vec; /* NULL without a shared expert */
} sum_job;

/* Tokens [t0, t1): the weighted outputs in rank order, each product
 * rounded, then added (the build keeps them apart: -ffp-contract=off);
 * then the shared expert's output times sigmoid(x . sh_vec) (the dot in
 * index order, one token's alone), rounded, added last, as llama.cpp's
 * ggml_add(moe_out, ffn_shexp * gate). */
static void sum_rows(void *arg, int t0, int t1, int worker)
{
    (void)worker;
    const sum_job *j = arg;
    const tp_moe *m = j->m;
    size_t d = (size_t)m->dim;
    for (int t = t0; t < t1; t++) {
        float *o = j->out + (size_t)t * d;
        const int *row = m->row + (size_t)t * (size_t)m->k;
        const float *wt = m->wt + (size_t)t * (size_t)m->k;
        const float *y0 = m->y + (size_t)row[0] * d;
        for (size_t i = 0; i < d; i++)
            o[i] = wt[0] * y0[i];
        for (int r = 1; r < m->k; r++) {
            const float *y = m->y + (size_t)row[r] * d;
            float w = wt[r];
            for (size_t i = 0; i < d; i++) {
                float term = w * y[i];
                o[i] = o[i] + term;
            }
        }
        if (!j->sh_vec)
            continue;
        const float *xt = j->x + (size_t)t * d, *ys = m->ys + (size_t)t * d;
        float dot = 0;
        for (size_t i = 0; i < d; i++) {
            float p = xt[i] * j->sh_vec[i];
            dot = dot + p;
        }
        float g = 1.0f / (1.0f + tp_vexp(-dot));
        for (size_t i = 0; i < d; i++) {
            float term = g * ys[i];
            o[i] = o[i] + term;
        }
    }
}

void tp_moe_ffn(tp_moe *m, const tp_moe_run *r, int l, const float *x, int T, float *out)
{
    const moe_layer *L = &m->layers[l];
    int R = T * m->k;
    double d = m->dim, ff = m->ff;
    /* route */
    router_job rj = {m, &L->router, x, T, r};
    prepare(&L->router, m->qx, x, T, m->dim);
    tp_pool_run(r->pool, m->ne, align_of(&L->router), parts_for(r, (double)m->ne * d * T), router_rows, &rj);
    for (int t = 0; L->br && t < T; t++) /* gpt-oss: the router's bias */
        add_bias(m->logits + (size_t)t * (size_t)m->ne, L->br, m->ne, r->simd);
    for (int t = 0; t < T; t++)
        route_token(m, t);
    group(m, x, T);
    /* gate, up, SwiGLU (and down's integer input, a block of 32 at a
     * time: pieces aligned to 32): experts and rows split together */
    exp_job j = {m, L, r};
    prepare_grouped(m, &L->gate, x, T);
    if (!L->up.p && (L->gate.p || L->up.kind != L->gate.kind))
        prepare_grouped(m, &L->up, x, T);
    int align = align_of(&L->gate) > align_of(&L->up) ? align_of(&L->gate) : align_of(&L->up);
    m->qd_in_job = !L->down.p && !L->down.kind;
    if (m->qd_in_job) {
        tp_qact_layout(&m->qd[0], L->down.w[0].type, m->a, m->ff, R, m->ff);
        align = align % 32 ? 32 : align; /* 16 (typed) or 64 (packed F32) */
    }
    int rows = layout(m, m->ff, align);
    tp_pool_run(r->pool, rows, align, parts_for(r, 2.0 * ff * d * R + (double)R * ff * SWIGLU_MACS), up_rows, &j);
    /* down */
    if (!m->qd_in_job)
        prepare(&L->down, m->qd, m->a, R, m->ff);
    rows = layout(m, m->dim, align_of(&L->down));
    tp_pool_run(r->pool, rows, align_of(&L->down), parts_for(r, ff * d * R), down_rows, &j);
    /* the shared expert: every token, after the routed ones (qx, qs free again) */
    if (m->sff) {
        sh_job sh = {m, L, x, T, r};
        double sff = m->sff;
        prepare(&L->sh_gate, m->qx, x, T, m->dim);
        if (!L->sh_up.p && (L->sh_gate.p || L->sh_up.kind != L->sh_gate.kind))
            prepare(&L->sh_up, m->qx, x, T, m->dim);
        int a = align_of(&L->sh_gate) > align_of(&L->sh_up) ? align_of(&L->sh_gate) : align_of(&L->sh_up);
        tp_pool_run(r->pool, round_up(m->sff, a), a, parts_for(r, 2.0 * sff * d * T + T * sff * SWIGLU_MACS),
                    sh_up_rows, &sh);
        prepare(&L->sh_down, m->qs, m->as, T, m->sff);
        a = align_of(&L->sh_down);
        tp_pool_run(r->pool, round_up(m->dim, a), a, parts_for(r, sff * d * T), sh_down_rows, &sh);
    }
    /* combine */
    sum_job sj = {m, out, x, m->sff ? L->sh_vec : NULL};
    tp_pool_run(r->pool, T, 1, parts_for(r, (double)R * d * SWIGLU_MACS), sum_rows, &sj);
}
