/* run.c's forward pass for one token (see llama2c_run.h). */
#include "llama2c_run.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct l2c {
    const l2c_weights *w;
    int max_pos, kv_dim, head_size;
    float *x, *xb, *xb2, *hb, *hb2, *q, *att, *logits;
    float *key_cache, *value_cache; /* [layer][pos][kv_dim] */
};

l2c *l2c_new(const l2c_weights *w, int max_pos)
{
    l2c *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->w = w;
    s->max_pos = max_pos;
    s->head_size = w->dim / w->n_heads;
    s->kv_dim = s->head_size * w->n_kv_heads;
    size_t d = (size_t)w->dim, h = (size_t)w->hidden_dim;
    size_t kv = (size_t)w->n_layers * (size_t)max_pos * (size_t)s->kv_dim;
    s->x = calloc(d, sizeof(float));
    s->xb = calloc(d, sizeof(float));
    s->xb2 = calloc(d, sizeof(float));
    s->hb = calloc(h, sizeof(float));
    s->hb2 = calloc(h, sizeof(float));
    s->q = calloc(d, sizeof(float));
    s->att = calloc((size_t)w->n_heads * (size_t)max_pos, sizeof(float));
    s->logits = calloc((size_t)w->vocab_size, sizeof(float));
    s->key_cache = calloc(kv, sizeof(float));
    s->value_cache = calloc(kv, sizeof(float));
    if (!s->x || !s->xb || !s->xb2 || !s->hb || !s->hb2 || !s->q || !s->att || !s->logits || !s->key_cache ||
        !s->value_cache) {
        l2c_free(s);
        return NULL;
    }
    return s;
}

void l2c_free(l2c *s)
{
    if (!s)
        return;
    free(s->x); free(s->xb); free(s->xb2); free(s->hb); free(s->hb2); free(s->q); free(s->att);
    free(s->logits); free(s->key_cache); free(s->value_cache);
    free(s);
}

void l2c_set_threads(int n) { omp_set_num_threads(n); }

const char *l2c_wait_policy(void)
{
    const char *p = getenv("OMP_WAIT_POLICY");
    return p && *p ? p : "(default)";
}

static void rms(float *o, const float *x, const float *g, int n, float eps)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++)
        o[i] = g[i] * (inv * x[i]);
}

static void soft(float *x, int n)
{
    float mx = x[0], sum = 0.0f;
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

/* out[r] = W[r] . in for r < rows: run.c's loop, rows shared by OpenMP. */
static void mv(float *out, const float *in, const float *W, int cols, int rows)
{
    int r;
#pragma omp parallel for private(r)
    for (r = 0; r < rows; r++) {
        const float *wr = W + (size_t)r * (size_t)cols;
        float acc = 0.0f;
        for (int c = 0; c < cols; c++)
            acc += wr[c] * in[c];
        out[r] = acc;
    }
}

const float *l2c_forward(l2c *s, int token, int pos)
{
    const l2c_weights *w = s->w;
    int dim = w->dim, kv_dim = s->kv_dim, hs = s->head_size, hidden = w->hidden_dim;
    int group = w->n_heads / w->n_kv_heads;
    memcpy(s->x, w->token_embedding + (size_t)token * (size_t)dim, (size_t)dim * sizeof(float));
    for (int l = 0; l < w->n_layers; l++) {
        rms(s->xb, s->x, w->rms_att[l], dim, w->norm_eps);
        size_t lo = (size_t)l * (size_t)s->max_pos * (size_t)kv_dim;
        float *kpos = s->key_cache + lo + (size_t)pos * (size_t)kv_dim;
        float *vpos = s->value_cache + lo + (size_t)pos * (size_t)kv_dim;
        mv(s->q, s->xb, w->wq[l], dim, dim);
        mv(kpos, s->xb, w->wk[l], dim, kv_dim);
        mv(vpos, s->xb, w->wv[l], dim, kv_dim);
        /* RoPE on interleaved pairs; keys only within kv_dim */
        for (int i = 0; i < dim; i += 2) {
            float freq = 1.0f / powf(w->rope_theta, (float)(i % hs) / (float)hs);
            float a = (float)pos * freq, c = cosf(a), sn = sinf(a);
            for (int which = 0; which < (i < kv_dim ? 2 : 1); which++) {
                float *v = which ? kpos : s->q;
                float v0 = v[i], v1 = v[i + 1];
                v[i] = v0 * c - v1 * sn;
                v[i + 1] = v0 * sn + v1 * c;
            }
        }
        int h;
#pragma omp parallel for private(h)
        for (h = 0; h < w->n_heads; h++) {
            const float *qh = s->q + (size_t)h * (size_t)hs;
            float *att = s->att + (size_t)h * (size_t)s->max_pos;
            size_t hoff = (size_t)(h / group) * (size_t)hs;
            for (int t = 0; t <= pos; t++) {
                const float *k = s->key_cache + lo + (size_t)t * (size_t)kv_dim + hoff;
                float sc = 0.0f;
                for (int i = 0; i < hs; i++)
                    sc += qh[i] * k[i];
                att[t] = sc / sqrtf((float)hs);
            }
            soft(att, pos + 1);
            float *o = s->xb + (size_t)h * (size_t)hs;
            memset(o, 0, (size_t)hs * sizeof(float));
            for (int t = 0; t <= pos; t++) {
                const float *v = s->value_cache + lo + (size_t)t * (size_t)kv_dim + hoff;
                for (int i = 0; i < hs; i++)
                    o[i] += att[t] * v[i];
            }
        }
        mv(s->xb2, s->xb, w->wo[l], dim, dim);
        for (int i = 0; i < dim; i++)
            s->x[i] += s->xb2[i];
        rms(s->xb, s->x, w->rms_ffn[l], dim, w->norm_eps);
        mv(s->hb, s->xb, w->w1[l], dim, hidden);
        mv(s->hb2, s->xb, w->w3[l], dim, hidden);
        for (int i = 0; i < hidden; i++) {
            float g = s->hb[i];
            s->hb[i] = g * (1.0f / (1.0f + expf(-g))) * s->hb2[i];
        }
        mv(s->xb, s->hb, w->w2[l], hidden, dim);
        for (int i = 0; i < dim; i++)
            s->x[i] += s->xb[i];
    }
    rms(s->x, s->x, w->rms_final, dim, w->norm_eps);
    mv(s->logits, s->x, w->wcls, dim, w->vocab_size);
    return s->logits;
}
