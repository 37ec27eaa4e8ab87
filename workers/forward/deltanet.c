/* Gated DeltaNet layers and their per-sequence state (deltanet.h). */
#include "deltanet.h"
#include "vexp.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DN_HEAD 1024 /* model.c's MAX_SSM_HEAD */

struct tp_deltanet {
    tp_model_config c;
    int n_rec;          /* DeltaNet layers */
    int *rec_index;     /* [n_layers] a layer's index among them, or -1 */
    int slots, max_tokens;
    int conv_dim, key_dim, value_dim, hd, kh, vh, kw;
    size_t conv_n, s_n; /* floats of one layer's conv state, of its S */
    size_t slot_n;      /* floats of a slot's state: every layer's conv and S */
    /* A slot's state is in buf[cur[slot]]; its last step's start, when
     * saved_pos >= 0, in the other: a step's first token reads the start
     * (buf[from[slot]]) and writes the other, so keeping the start costs
     * no copy of S (copying it took 3-4% of a Qwen 3.5 decode, on one
     * thread while the others waited). */
    float *buf[2];      /* [slots][slot_n] each */
    uint8_t *cur, *from; /* [slots] */
    int *saved_pos;     /* [slots] that start, -1: none */
    float *proj;        /* [max_tokens][conv_dim + value_dim + 2 vh] */
    float *conv;        /* [max_tokens][conv_dim] q, k (normed, q scaled) and v after the conv */
    float *out;         /* [max_tokens][value_dim] */
    int *run_start;     /* [max_tokens + 1] first token of each sequence's run in a step */
    int *run_snap;      /* [max_tokens] the run's token after which the state is kept, or -1 */
    float *kept;        /* [slots][slot_n] the state kept at a page boundary this step */
    int *kept_at;       /* [slots] its position, -1: none */
    float **snap;       /* [n_pages] a cache page's snapshot, or NULL */
    int n_pages, n_snaps, max_snaps;
    tp_isa isa;         /* the vector level of the state's two passes (same bits at each) */
};

/* n floats of zeros, 64-byte aligned (head_run streams S's rows). */
static float *state_alloc(size_t n)
{
    size_t bytes = ((n + 1) * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

int tp_deltanet_new(const tp_model_config *c, int kv_slots, int max_tokens, tp_deltanet **out)
{
    *out = NULL;
    if (c->full_attn_interval <= 0)
        return 0;
    tp_deltanet *dn = calloc(1, sizeof *dn);
    if (!dn)
        return TP_ENOMEM;
    dn->c = *c;
    dn->isa = tp_isa_active();
    dn->slots = kv_slots;
    dn->max_tokens = max_tokens;
    dn->hd = c->ssm_head_dim;
    dn->kh = c->ssm_k_heads;
    dn->vh = c->ssm_v_heads;
    dn->kw = c->ssm_conv_kernel;
    dn->key_dim = dn->hd * dn->kh;
    dn->value_dim = dn->hd * dn->vh;
    dn->conv_dim = 2 * dn->key_dim + dn->value_dim;
    dn->rec_index = malloc((size_t)c->n_layers * sizeof(int));
    if (!dn->rec_index) {
        free(dn);
        return TP_ENOMEM;
    }
    for (int l = 0; l < c->n_layers; l++)
        dn->rec_index[l] = tp_model_layer_recurrent(c, l) ? dn->n_rec++ : -1;
    dn->conv_n = (size_t)(dn->kw - 1) * (size_t)dn->conv_dim;
    dn->s_n = (size_t)dn->vh * (size_t)dn->hd * (size_t)dn->hd;
    dn->slot_n = (size_t)dn->n_rec * (dn->conv_n + dn->s_n);
    size_t T = (size_t)max_tokens;
    for (int b = 0; b < 2; b++)
        dn->buf[b] = state_alloc((size_t)kv_slots * dn->slot_n);
    dn->cur = calloc((size_t)kv_slots + 1, 1);
    dn->from = calloc((size_t)kv_slots + 1, 1);
    dn->saved_pos = malloc((size_t)kv_slots * sizeof(int));
    dn->proj = malloc(T * (size_t)tp_deltanet_proj_width(dn) * sizeof(float));
    dn->conv = malloc(T * (size_t)dn->conv_dim * sizeof(float));
    dn->out = malloc(T * (size_t)dn->value_dim * sizeof(float));
    dn->run_start = malloc((T + 1) * sizeof(int));
    dn->run_snap = malloc((T + 1) * sizeof(int));
    dn->kept = malloc((size_t)kv_slots * dn->slot_n * sizeof(float) + 1);
    dn->kept_at = malloc((size_t)kv_slots * sizeof(int));
    if (!dn->run_snap || !dn->kept || !dn->kept_at || !dn->buf[0] || !dn->buf[1] || !dn->cur || !dn->from || !dn->saved_pos || !dn->proj || !dn->conv || !dn->out || !dn->run_start) {
        tp_deltanet_free(dn);
        return TP_ENOMEM;
    }
    for (int i = 0; i < kv_slots; i++)
        dn->saved_pos[i] = dn->kept_at[i] = -1;
    *out = dn;
    return 0;
}

void tp_deltanet_free(tp_deltanet *dn)
{
    if (!dn)
        return;
    free(dn->rec_index);
    free(dn->buf[0]);
    free(dn->buf[1]);
    free(dn->cur);
    free(dn->from);
    free(dn->saved_pos);
    free(dn->proj);
    free(dn->conv);
    free(dn->out);
    free(dn->run_start);
    free(dn->run_snap);
    free(dn->kept);
    free(dn->kept_at);
    for (int i = 0; dn->snap && i < dn->n_pages; i++)
        free(dn->snap[i]);
    free(dn->snap);
    free(dn);
}

static float *slot_state(const tp_deltanet *dn, float *base, int slot)
{
    return base + (size_t)slot * dn->slot_n;
}

static float *cur_state(const tp_deltanet *dn, int slot) { return slot_state(dn, dn->buf[dn->cur[slot]], slot); }

bool tp_deltanet_can_start(const tp_deltanet *dn, int slot, int pos, int len)
{
    return pos == len || pos == 0 || pos == dn->saved_pos[slot];
}

void tp_deltanet_start(tp_deltanet *dn, int slot, int pos, int len)
{
    int c = dn->cur[slot];
    dn->kept_at[slot] = -1;
    dn->from[slot] = (uint8_t)c; /* in place, unless: */
    if (pos == 0) { /* zeros (a step from 0 starts from zeros again) */
        memset(cur_state(dn, slot), 0, dn->slot_n * sizeof(float));
        dn->saved_pos[slot] = -1;
        return;
    }
    if (pos != len)              /* a retried step: from its start, kept in the other buffer */
        dn->from[slot] = (uint8_t)(1 - c);
    else if (dn->saved_pos[slot] != pos) { /* a new step: its start stays where it is */
        dn->cur[slot] = (uint8_t)(1 - c);
        dn->saved_pos[slot] = pos;
    }
    if (dn->from[slot] != dn->cur[slot]) /* the conv windows move in place: copied (S is not) */
        for (int r = 0; r < dn->n_rec; r++)
            memcpy(cur_state(dn, slot) + (size_t)r * dn->conv_n,
                   slot_state(dn, dn->buf[dn->from[slot]], slot) + (size_t)r * dn->conv_n, dn->conv_n * sizeof(float));
}

void tp_deltanet_reset(tp_deltanet *dn, int slot)
{
    memset(cur_state(dn, slot), 0, dn->slot_n * sizeof(float));
    dn->saved_pos[slot] = -1;
}

int tp_deltanet_proj_width(const tp_deltanet *dn) { return dn->conv_dim + dn->value_dim + 2 * dn->vh; }
float *tp_deltanet_proj(tp_deltanet *dn) { return dn->proj; }
float *tp_deltanet_out(tp_deltanet *dn) { return dn->out; }

/* x * (1 / (1 + e^-x)), as the forward's SwiGLU */
static float silu(float x) { return x * (1.0f / (1.0f + tp_vexp(-x))); }

/* The sum of squares of x[0..n) in index order. */
static float sum_sq(const float *x, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += x[i] * x[i];
    return s;
}

/* Channels [0, n) of conv_head's conv and SiLU, eight at a time, the
 * same bits (the same products and sums in the same order; e^x as
 * tp_vexp); the conv state's rows are C apart. Returns the channels done. */
__attribute__((target("avx2"))) static int conv_avx2(const float *w, const float *cs, const float *in, float *out,
                                                     int n, int C, int kw)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(kw));
    int ch = 0;
    for (; ch + 8 <= n; ch += 8) {
        const float *wc = w + (size_t)ch * (size_t)kw;
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < kw - 1; j++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(cs + (size_t)j * (size_t)C + ch),
                                                   _mm256_i32gather_ps(wc + j, idx, 4)));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(in + ch), _mm256_i32gather_ps(wc + kw - 1, idx, 4)));
        __m256 e = tp_vexp8_avx2(_mm256_xor_ps(acc, sign));
        _mm256_storeu_ps(out + ch, _mm256_mul_ps(acc, _mm256_div_ps(one, _mm256_add_ps(one, e))));
    }
    return ch;
}

/* Conv head u's channels [u hd, (u + 1) hd) for one token of a sequence
 * whose conv state (the previous kw - 1 inputs, oldest first, rows of
 * conv_dim) is cs: the causal conv and SiLU into out [conv_dim], then,
 * for q and k heads, the L2 norm; cs's channels move on by this token's
 * input. Channels are independent and a norm is one head's, so heads can
 * run on any thread in any order with the same bits. */
static void conv_head(const tp_deltanet *dn, const float *w, float *cs, const float *in, float *out, int u)
{
    int kw = dn->kw, C = dn->conv_dim, hd = dn->hd, c0 = u * hd;
    w += (size_t)c0 * (size_t)kw;
    cs += c0;
    in += c0;
    out += c0;
    for (int ch = dn->isa >= TP_ISA_AVX2 ? conv_avx2(w, cs, in, out, hd, C, kw) : 0; ch < hd; ch++) {
        const float *wc = w + (size_t)ch * (size_t)kw;
        float acc = 0;
        for (int j = 0; j < kw - 1; j++)
            acc += cs[(size_t)j * (size_t)C + ch] * wc[j];
        acc += in[ch] * wc[kw - 1];
        out[ch] = silu(acc);
    }
    for (int j = 0; j + 1 < kw; j++)
        memcpy(cs + (size_t)j * (size_t)C, j + 2 < kw ? cs + (size_t)(j + 1) * (size_t)C : in,
               (size_t)hd * sizeof(float));
    if (u >= 2 * dn->kh)
        return;
    /* q and k heads: x / max(|x|, eps) (ggml_l2_norm); q then times
     * 1 / sqrt(head_dim) (build_delta_net's scale) */
    float nrm = sqrtf(sum_sq(out, hd)), eps = dn->c.norm_eps;
    float sc = 1.0f / (nrm > eps ? nrm : eps);
    for (int i = 0; i < hd; i++)
        out[i] *= sc;
    if (u < dn->kh) {
        float qscale = 1.0f / sqrtf((float)hd);
        for (int i = 0; i < hd; i++)
            out[i] *= qscale;
    }
}

/* The delta rule over a head's state S [hd][hd] in two passes:
 *
 *   decay_read:  kv = (decay Sin)^T k                  (reads Sin)
 *   write_read:  S = decay Sin + k kv^T;  o = S^T q     (reads Sin, writes S)
 *
 * Sin is S itself after a run's first token; the first reads the step's
 * start (another buffer). The decayed products are made in both passes
 * (the same bits), so the first pass writes nothing: a decode token reads
 * its start once from memory and writes S once (the state is evicted by
 * the weights between tokens; a write pass in decay_read cost a read for
 * ownership of S as well: the passes took 11% of a one-thread decode of
 * the bench's qwen35, now 6%).
 * Every column c is its own chain: a product then a sum (never fused),
 * rows in order, so the portable loop and the AVX2 / AVX-512 lanes give
 * the same bits (the vector paths run several columns at once, rows outer
 * so that S is read in order). nt: S's rows are stored past the caches
 * (the run's last token: the next read is a token later, after the
 * weights went through them); needs S 64-byte aligned and hd % 16 == 0. */
/* Columns [c0, hd): the portable path (c0 0), and a vector path's tail. */
static void decay_read_from(const float *Sin, int hd, int c0, float decay, const float *k, float *kv)
{
    for (int c = c0; c < hd; c++)
        kv[c] = 0;
    for (int r = 0; r < hd; r++) {
        const float *in = Sin + (size_t)r * (size_t)hd;
        for (int c = c0; c < hd; c++) {
            float x = in[c] * decay;
            kv[c] += x * k[r];
        }
    }
}

static void write_read_from(const float *Sin, float *S, int hd, int c0, float decay, const float *k, const float *kv,
                            const float *q, float *o)
{
    for (int c = c0; c < hd; c++)
        o[c] = 0;
    for (int r = 0; r < hd; r++) {
        const float *in = Sin + (size_t)r * (size_t)hd;
        float *row = S + (size_t)r * (size_t)hd;
        for (int c = c0; c < hd; c++) {
            float x = in[c] * decay;
            x = x + k[r] * kv[c];
            row[c] = x;
            o[c] += x * q[r];
        }
    }
}

/* The vector paths: W floats of type V a vector (P the intrinsics'
 * prefix), NB vectors of columns at once (AVX2: 32 columns; AVX-512: 128,
 * a Qwen 3.5 head), then one, then the portable tail. write_read's pf: the
 * next head's start state, asked for a row at a time meanwhile (this pass
 * reads its own from L2), or NULL; nt: S's rows stored past the caches. */
#define DN_PASSES(SFX, TARGET, V, W, NB, P)                                                                  \
    __attribute__((target(TARGET))) static void decay_read_##SFX(const float *Sin, int hd, float decay,      \
                                                                 const float *k, float *kv)                  \
    {                                                                                                        \
        V d = P##_set1_ps(decay);                                                                            \
        int c = 0;                                                                                           \
        for (; c + W * NB <= hd; c += W * NB) {                                                              \
            V acc[NB];                                                                                       \
            for (int i = 0; i < NB; i++)                                                                     \
                acc[i] = P##_setzero_ps();                                                                   \
            for (int r = 0; r < hd; r++) {                                                                   \
                const float *p = Sin + (size_t)r * (size_t)hd + c;                                           \
                V kr = P##_set1_ps(k[r]);                                                                    \
                for (int i = 0; i < NB; i++)                                                                 \
                    acc[i] = P##_add_ps(acc[i], P##_mul_ps(P##_mul_ps(P##_loadu_ps(p + W * i), d), kr));     \
            }                                                                                                \
            for (int i = 0; i < NB; i++)                                                                     \
                P##_storeu_ps(kv + c + W * i, acc[i]);                                                       \
        }                                                                                                    \
        for (; c + W <= hd; c += W) {                                                                        \
            V acc = P##_setzero_ps();                                                                        \
            for (int r = 0; r < hd; r++)                                                                     \
                acc = P##_add_ps(acc, P##_mul_ps(P##_mul_ps(P##_loadu_ps(Sin + (size_t)r * (size_t)hd + c), d), \
                                                 P##_set1_ps(k[r])));                                        \
            P##_storeu_ps(kv + c, acc);                                                                      \
        }                                                                                                    \
        decay_read_from(Sin, hd, c, decay, k, kv);                                                           \
    }                                                                                                        \
    __attribute__((target(TARGET))) static void write_read_##SFX(const float *Sin, float *S, int hd,         \
                                                                 float decay, const float *k,                \
                                                                 const float *kv, const float *q, float *o,  \
                                                                 bool nt, const float *pf)                   \
    {                                                                                                        \
        V d = P##_set1_ps(decay);                                                                            \
        int c = 0;                                                                                           \
        for (; c + W * NB <= hd; c += W * NB) {                                                              \
            V acc[NB], v[NB];                                                                                \
            for (int i = 0; i < NB; i++) {                                                                   \
                acc[i] = P##_setzero_ps();                                                                   \
                v[i] = P##_loadu_ps(kv + c + W * i);                                                         \
            }                                                                                                \
            for (int r = 0; r < hd; r++) {                                                                   \
                const float *in = Sin + (size_t)r * (size_t)hd + c;                                          \
                float *p = S + (size_t)r * (size_t)hd + c;                                                   \
                if (pf)                                                                                      \
                    for (int i = 0; i < NB * W; i += 16) /* a cache line each */                             \
                        _mm_prefetch((const char *)(pf + (size_t)r * (size_t)hd + c + i), _MM_HINT_T1);      \
                V kr = P##_set1_ps(k[r]), qr = P##_set1_ps(q[r]);                                            \
                for (int i = 0; i < NB; i++) {                                                               \
                    V x = P##_mul_ps(P##_loadu_ps(in + W * i), d);                                           \
                    x = P##_add_ps(x, P##_mul_ps(kr, v[i]));                                                 \
                    if (nt)                                                                                  \
                        P##_stream_ps(p + W * i, x);                                                         \
                    else                                                                                     \
                        P##_storeu_ps(p + W * i, x);                                                         \
                    acc[i] = P##_add_ps(acc[i], P##_mul_ps(x, qr));                                          \
                }                                                                                            \
            }                                                                                                \
            for (int i = 0; i < NB; i++)                                                                     \
                P##_storeu_ps(o + c + W * i, acc[i]);                                                        \
        }                                                                                                    \
        for (; c + W <= hd; c += W) {                                                                        \
            V acc = P##_setzero_ps(), v = P##_loadu_ps(kv + c);                                              \
            for (int r = 0; r < hd; r++) {                                                                   \
                float *p = S + (size_t)r * (size_t)hd + c;                                                   \
                V x = P##_mul_ps(P##_loadu_ps(Sin + (size_t)r * (size_t)hd + c), d);                         \
                x = P##_add_ps(x, P##_mul_ps(P##_set1_ps(k[r]), v));                                         \
                if (nt)                                                                                      \
                    P##_stream_ps(p, x);                                                                     \
                else                                                                                         \
                    P##_storeu_ps(p, x);                                                                     \
                acc = P##_add_ps(acc, P##_mul_ps(x, P##_set1_ps(q[r])));                                     \
            }                                                                                                \
            P##_storeu_ps(o + c, acc);                                                                       \
        }                                                                                                    \
        write_read_from(Sin, S, hd, c, decay, k, kv, q, o);                                                  \
    }
DN_PASSES(avx2, "avx2", __m256, 8, 4, _mm256)
DN_PASSES(avx512, "avx512f", __m512, 16, 8, _mm512)

void tp_deltanet_set_isa(tp_deltanet *dn, tp_isa isa) { dn->isa = isa; }

typedef struct unit_job {
    tp_deltanet *dn;
    const tp_layer_weights *lw;
    int rec;          /* the layer's index among the DeltaNet layers */
    const int *tok_slot;
    int n_runs;
} unit_job;

/* y[c] = norm[c] * (ss * o[c]) * silu(z[c]) for c in [0, n), eight at a
 * time, the same bits as the loop in head_run; returns the columns done. */
__attribute__((target("avx2"))) static int gate_avx2(const float *norm, float ss, const float *o, const float *z,
                                                     float *y, int n)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f), s = _mm256_set1_ps(ss);
    int c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 zc = _mm256_loadu_ps(z + c);
        __m256 e = tp_vexp8_avx2(_mm256_xor_ps(zc, sign));
        __m256 sz = _mm256_mul_ps(zc, _mm256_div_ps(one, _mm256_add_ps(one, e)));
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(norm + c), _mm256_mul_ps(s, _mm256_loadu_ps(o + c)));
        _mm256_storeu_ps(y + c, _mm256_mul_ps(v, sz));
    }
    return c;
}

/* Where, in a slot's state (a buffer's, the kept one's, a snapshot's),
 * DeltaNet layer rec's conv state is (h < 0) or its head h's S. */
static size_t part_at(const tp_deltanet *dn, int rec, int h)
{
    if (h < 0)
        return (size_t)rec * dn->conv_n;
    return (size_t)dn->n_rec * dn->conv_n + (size_t)rec * dn->s_n + (size_t)h * (size_t)dn->hd * (size_t)dn->hd;
}

/* Head h's S of DeltaNet layer rec in buffer b of slot. */
static float *head_state(const tp_deltanet *dn, int b, int slot, int rec, int h)
{
    return slot_state(dn, dn->buf[b], slot) + part_at(dn, rec, h);
}

/* Value head h of one sequence's run of tokens [t0, t1): the delta rule
 * token by token, then the gated output norm. first: t0 is the step's
 * first token of the sequence, which reads the step's start state. pf:
 * the next head's start state, to ask for meanwhile (NULL: none). nt:
 * the last token's S may be stored past the caches (none reads it this
 * step). */
static void head_run(const unit_job *j, int t0, int t1, int h, bool first, bool nt, const float *pf)
{
    if (t0 >= t1) /* a snapshot after the run's last token: tok_slot[t0] is past the step's */
        return;
    tp_deltanet *dn = j->dn;
    const tp_layer_weights *lw = j->lw;
    int hd = dn->hd, pw = tp_deltanet_proj_width(dn), slot = j->tok_slot[t0];
    float *S = head_state(dn, dn->cur[slot], slot, j->rec, h);
    const float *Sin = first ? head_state(dn, dn->from[slot], slot, j->rec, h) : S;
    nt = nt && dn->isa >= TP_ISA_AVX2 && hd % 16 == 0 && ((uintptr_t)S & 63) == 0;
    float kv[MAX_DN_HEAD], o[MAX_DN_HEAD];
    for (int t = t0; t < t1; t++) {
        const float *p = dn->proj + (size_t)t * (size_t)pw, *x = dn->conv + (size_t)t * (size_t)dn->conv_dim;
        const float *z = p + dn->conv_dim, *b = z + dn->value_dim, *a = b + dn->vh;
        const float *q = x + (size_t)(h % dn->kh) * (size_t)hd, *k = q + dn->key_dim,
                    *v = x + 2 * (size_t)dn->key_dim + (size_t)h * (size_t)hd;
        float ab = a[h] + lw->ssm_dt[h];
        float sp = ab > 20.0f ? ab : (float)log1p((double)tp_vexp(ab)); /* softplus, as torch's threshold */
        float decay = tp_vexp(sp * lw->ssm_a[h]);
        float beta = 1.0f / (1.0f + tp_vexp(-b[h]));
        if (dn->isa >= TP_ISA_AVX512)
            decay_read_avx512(Sin, hd, decay, k, kv);
        else if (dn->isa >= TP_ISA_AVX2)
            decay_read_avx2(Sin, hd, decay, k, kv);
        else
            decay_read_from(Sin, hd, 0, decay, k, kv);
        for (int c = 0; c < hd; c++)
            kv[c] = (v[c] - kv[c]) * beta;
        bool last = t == t1 - 1;
        if (dn->isa >= TP_ISA_AVX512)
            write_read_avx512(Sin, S, hd, decay, k, kv, q, o, last && nt, last ? pf : NULL);
        else if (dn->isa >= TP_ISA_AVX2)
            write_read_avx2(Sin, S, hd, decay, k, kv, q, o, last && nt, last ? pf : NULL);
        else
            write_read_from(Sin, S, hd, 0, decay, k, kv, q, o);
        Sin = S;
        /* RMSNorm(o, ssm_norm) * silu(z) */
        float ss = 1.0f / sqrtf(sum_sq(o, hd) / (float)hd + dn->c.norm_eps);
        float *y = dn->out + (size_t)t * (size_t)dn->value_dim + (size_t)h * (size_t)hd;
        const float *zh = z + (size_t)h * (size_t)hd;
        for (int c = dn->isa >= TP_ISA_AVX2 ? gate_avx2(lw->ssm_norm, ss, o, zh, y, hd) : 0; c < hd; c++)
            y[c] = lw->ssm_norm[c] * (ss * o[c]) * silu(zh[c]);
    }
}

/* The state kept this step: slot's conv state of layer rec, S of head h
 * of layer rec (h < 0: the conv state). */
static float *kept_part(tp_deltanet *dn, int slot, int rec, int h)
{
    return slot_state(dn, dn->kept, slot) + part_at(dn, rec, h);
}

static void units(void *arg, int u0, int u1, int worker)
{
    (void)worker;
    const unit_job *j = arg;
    tp_deltanet *dn = j->dn;
    for (int u = u0; u < u1; u++) {
        int r = u / dn->vh, h = u % dn->vh;
        int t0 = dn->run_start[r], t1 = dn->run_start[r + 1], ts = dn->run_snap[r], slot = j->tok_slot[t0];
        const float *pf = NULL;
        if (u + 1 < u1) {
            int rn = (u + 1) / dn->vh, sn = j->tok_slot[dn->run_start[rn]];
            pf = head_state(dn, dn->from[sn], sn, j->rec, (u + 1) % dn->vh);
        }
        if (ts < 0) {
            head_run(j, t0, t1, h, true, true, pf);
            continue;
        }
        head_run(j, t0, ts + 1, h, true, false, NULL);
        memcpy(kept_part(dn, slot, j->rec, h), head_state(dn, dn->cur[slot], slot, j->rec, h),
               (size_t)dn->hd * (size_t)dn->hd * sizeof(float));
        head_run(j, ts + 1, t1, h, false, true, pf);
    }
    _mm_sfence(); /* the state's streamed stores, before the pool's barrier makes it others' */
}

typedef struct conv_job {
    tp_deltanet *dn;
    const float *w; /* the layer's ssm_conv1d */
    int rec;
    const int *tok_slot, *tok_pos;
    int n_tok;
} conv_job;

/* Conv heads [u0, u1) of every token in order (a sequence's tokens move
 * its conv state along); after the token at which the step keeps its
 * sequence's state (kept_at, set before), the heads' part of it is kept. */
static void conv_heads(void *arg, int u0, int u1, int worker)
{
    (void)worker;
    const conv_job *j = arg;
    tp_deltanet *dn = j->dn;
    int pw = tp_deltanet_proj_width(dn), C = dn->conv_dim, hd = dn->hd;
    for (int t = 0; t < j->n_tok; t++) {
        int slot = j->tok_slot[t];
        float *cs = cur_state(dn, slot) + part_at(dn, j->rec, -1);
        for (int u = u0; u < u1; u++)
            conv_head(dn, j->w, cs, dn->proj + (size_t)t * (size_t)pw, dn->conv + (size_t)t * (size_t)C, u);
        if (dn->kept_at[slot] == j->tok_pos[t] + 1) {
            float *k = kept_part(dn, slot, j->rec, -1);
            size_t c0 = (size_t)u0 * (size_t)hd;
            for (int r = 0; r + 1 < dn->kw; r++)
                memcpy(k + (size_t)r * (size_t)C + c0, cs + (size_t)r * (size_t)C + c0,
                       (size_t)(u1 - u0) * (size_t)hd * sizeof(float));
        }
    }
}

void tp_deltanet_layer(tp_deltanet *dn, tp_pool *pool, int max_threads, const tp_layer_weights *lw, int l,
                       const int *tok_slot, const int *tok_pos, int n_tok)
{
    int rec = dn->rec_index[l], n_runs = 0;
    for (int t = 0; t < n_tok; t++) {
        if (!t || tok_slot[t] != tok_slot[t - 1]) {
            dn->run_start[n_runs] = t;
            dn->run_snap[n_runs++] = -1;
        }
        if ((tok_pos[t] + 1) % TP_DN_PAGE == 0 && dn->snap) { /* the last boundary of the run wins */
            dn->run_snap[n_runs - 1] = t;
            dn->kept_at[tok_slot[t]] = tok_pos[t] + 1;
        }
    }
    dn->run_start[n_runs] = n_tok;
    conv_job cj = {dn, lw->ssm_conv1d, rec, tok_slot, tok_pos, n_tok};
    tp_pool_run(pool, dn->conv_dim / dn->hd, 1, max_threads, conv_heads, &cj);
    unit_job j = {dn, lw, rec, tok_slot, n_runs};
    tp_pool_run(pool, n_runs * dn->vh, 1, max_threads, units, &j);
}

int tp_deltanet_pages(tp_deltanet *dn, int n_pages, size_t budget)
{
    for (int i = 0; dn->snap && i < dn->n_pages; i++)
        free(dn->snap[i]);
    free(dn->snap);
    dn->snap = calloc((size_t)n_pages + 1, sizeof *dn->snap);
    if (!dn->snap)
        return TP_ENOMEM;
    dn->n_pages = n_pages;
    dn->n_snaps = 0;
    size_t one = dn->slot_n * sizeof(float), most = one ? budget / one : 0;
    dn->max_snaps = most > (size_t)n_pages ? n_pages : (int)most;
    return 0;
}

void tp_deltanet_page_drop(tp_deltanet *dn, int page)
{
    if (!dn->snap || page < 0 || page >= dn->n_pages || !dn->snap[page])
        return;
    free(dn->snap[page]);
    dn->snap[page] = NULL;
    dn->n_snaps--;
}

int tp_deltanet_kept_at(const tp_deltanet *dn, int slot) { return dn->kept_at[slot]; }

void tp_deltanet_keep(tp_deltanet *dn, int slot, int page)
{
    if (!dn->snap || page < 0 || page >= dn->n_pages || dn->kept_at[slot] < 0)
        return;
    if (!dn->snap[page]) {
        if (dn->n_snaps >= dn->max_snaps || !(dn->snap[page] = malloc(dn->slot_n * sizeof(float))))
            return; /* over the budget: this prefix will be computed again */
        dn->n_snaps++;
    }
    memcpy(dn->snap[page], dn->kept + (size_t)slot * dn->slot_n, dn->slot_n * sizeof(float));
}

bool tp_deltanet_has(const tp_deltanet *dn, int page)
{
    return dn->snap && page >= 0 && page < dn->n_pages && dn->snap[page];
}

void tp_deltanet_restore(tp_deltanet *dn, int slot, int page)
{
    memcpy(cur_state(dn, slot), dn->snap[page], dn->slot_n * sizeof(float));
    dn->saved_pos[slot] = -1;
}
