/* Sampler passes over the vocabulary, AVX-512 and scalar (see
 * sample_kernels.h). Blocks of 16 ids; ids past the vocabulary read as
 * -inf and are never written. */
#include "sample_kernels.h"
#include "tokpipe/isa.h"

#include <immintrin.h>
#include <string.h>

#define BLOCK 16

static bool marked(const uint16_t *bits, int t)
{
    return bits && (bits[t >> 4] >> (t & 15) & 1u);
}

float tp_smp_value(const tp_smp_view *v, int t)
{
    float x = v->logits[t];
    if (isnan(x))
        x = -INFINITY;
    if (marked(v->hist, t)) {
        /* CTRL's repetition penalty, then OpenAI's presence/frequency. */
        if (x > 0.0f)
            x /= v->rep;
        else
            x *= v->rep;
        x -= v->presence + v->frequency * (float)v->counts[t];
    }
    if (marked(v->ban, t)) {
        if (!v->bias) {
            x = -INFINITY;
        } else {
            if (marked(v->biased, t))
                x = v->bias[t] <= TP_SAMPLER_BAN_BIAS ? -INFINITY : x + v->bias[t];
            if (marked(v->banned, t))
                x = -INFINITY;
        }
    }
    return x;
}

/* Bits of the ids of block b whose value is not the raw logit's. */
static unsigned special_bits(const tp_smp_view *v, int b)
{
    return (v->hist ? v->hist[b] : 0u) | (v->ban ? v->ban[b] : 0u);
}

static int block_len(const tp_smp_view *v, int i)
{
    return v->vocab - i < BLOCK ? v->vocab - i : BLOCK;
}

/* Values of ids [i, i + n) into x (scalar passes): NaN stays NaN for
 * unmarked ids; every pass treats NaN like -inf (it never compares >). */
static void block_values(const tp_smp_view *v, int i, int n, float *x)
{
    memcpy(x, v->logits + i, sizeof *x * (size_t)n);
    for (unsigned m = special_bits(v, i / BLOCK); m; m &= m - 1)
        x[__builtin_ctz(m)] = tp_smp_value(v, i + __builtin_ctz(m));
}

/* Offer c (value above -inf) to the heap of at most k, a min-heap by rank
 * (the root is the worst kept). The sifts move a hole instead of swapping:
 * the same positions as swapping c along the path, half the stores. */
__attribute__((always_inline)) static inline void heap_offer(tp_smp_cand *h, size_t *n, size_t k,
                                                              tp_smp_cand c)
{
    size_t i;
    if (*n < k) {
        for (i = (*n)++; i > 0 && tp_smp_ranks_before(&h[(i - 1) / 2], &c); i = (i - 1) / 2)
            h[i] = h[(i - 1) / 2];
    } else if (tp_smp_ranks_before(&c, &h[0])) {
        for (i = 0;;) {
            size_t ch = 2 * i + 1;
            if (ch >= *n)
                break;
            if (ch + 1 < *n && tp_smp_ranks_before(&h[ch], &h[ch + 1]))
                ch++;
            if (!tp_smp_ranks_before(&c, &h[ch]))
                break;
            h[i] = h[ch];
            i = ch;
        }
    } else {
        return;
    }
    h[i] = c;
}

/* ---- scalar passes ------------------------------------------------------- */

static int argmax_scalar(const tp_smp_view *v)
{
    float x[BLOCK], best_x = -INFINITY;
    int best = -1;
    for (int i = 0; i < v->vocab; i += BLOCK) {
        int n = block_len(v, i);
        block_values(v, i, n, x);
        for (int j = 0; j < n; j++)
            if (x[j] > best_x)
                best_x = x[j], best = i + j;
    }
    return best;
}

static size_t top_k_scalar(const tp_smp_view *v, size_t k, tp_smp_cand *h)
{
    float x[BLOCK];
    size_t n = 0;
    for (int i = 0; i < v->vocab; i += BLOCK) {
        int len = block_len(v, i);
        block_values(v, i, len, x);
        for (int j = 0; j < len; j++)
            if (x[j] > -INFINITY)
                heap_offer(h, &n, k, (tp_smp_cand){x[j], 0.0f, i + j});
    }
    return n;
}

static double weights_scalar(const tp_smp_view *v, float max, float inv_t, float *w, double *acc,
                             size_t *n_pos, int *last_pos)
{
    float x[BLOCK];
    double sum = 0.0;
    for (int i = 0; i < v->vocab; i += BLOCK) {
        int n = block_len(v, i);
        block_values(v, i, n, x);
        acc[i / BLOCK] = sum;
        for (int j = 0; j < n; j++) {
            w[i + j] = x[j] > -INFINITY ? tp_smp_weight(x[j], max, inv_t) : 0.0f;
            sum += w[i + j];
            if (w[i + j] > 0.0f)
                ++*n_pos, *last_pos = i + j;
        }
    }
    return sum;
}

static size_t gather_scalar(const tp_smp_view *v, const float *w, double cut, tp_smp_cand *out)
{
    size_t n = 0;
    for (int t = 0; t < v->vocab; t++)
        if (w[t] > 0.0f && w[t] >= cut)
            out[n++] = (tp_smp_cand){tp_smp_value(v, t), w[t], t};
    return n;
}

/* Ids whose scaled logit (l - max) * inv_t is below this cannot reach
 * min_p: exp(log(min_p) - 0.01) is 1% below min_p, far more than expf's
 * and logf's error. Below 2^-100 the margin could meet subnormal weights
 * (expf rounds to 2^-149 there), so every id is weighed. */
static float min_p_floor(float min_p)
{
    return min_p >= 0x1p-100f ? logf(min_p) - 0.01f : -INFINITY;
}

static size_t min_p_scalar(const tp_smp_view *v, float max, float inv_t, float min_p,
                           tp_smp_cand *out)
{
    float x[BLOCK], floor_x = min_p_floor(min_p);
    size_t n = 0;
    for (int i = 0; i < v->vocab; i += BLOCK) {
        int len = block_len(v, i);
        block_values(v, i, len, x);
        for (int j = 0; j < len; j++) {
            float d = x[j] - max;
            if (!(d == 0.0f || d * inv_t >= floor_x))
                continue;
            float w = tp_smp_weight(x[j], max, inv_t);
            if (w >= min_p)
                out[n++] = (tp_smp_cand){x[j], w, i + j};
        }
    }
    return n;
}

/* ---- AVX-512 ------------------------------------------------------------- */

/* glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, from ARM's optimized
 * routines, unchanged since glibc 2.28) as its FMA build __expf_fma, which
 * glibc selects on every CPU with AVX-512, computes it, 8 lanes at a time:
 * x*N/ln2 = k + r, 2^(k/N) from a 32-entry table, a cubic in r, all in
 * double, FMAs exactly where that build has them. The table and constants
 * are glibc's __exp2f_data. Checked against this libm's expf for all 2^32
 * inputs and in tests/test_sampler_exact.c on a strided subset. */
static const uint64_t EXP2F_TAB[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
#define EXPF_INVLN2N 0x1.71547652b82fep+5 /* N / ln 2, N = 32 */
#define EXPF_SHIFT 0x1.8p+52
#define EXPF_C0 0x1.c6af84b912394p-20 /* poly_scaled of __exp2f_data */
#define EXPF_C1 0x1.ebfce50fac4f3p-13
#define EXPF_C2 0x1.62e42ff0c52d6p-6
#define EXPF_UFLOW -0x1.9fe368p6f    /* below: glibc returns 0 */
#define EXPF_MAY_UFLOW -0x1.9d1d9ep6f /* below: __math_may_uflowf's 0x1.4p-75f^2 */
#define EXPF_OFLOW 0x1.62e42ep6f     /* above: +inf */

typedef struct exp_tab {
    __m512i t[4];
} exp_tab;

__attribute__((target("avx512f"))) static inline exp_tab exp_tab_load(void)
{
    exp_tab e;
    for (int i = 0; i < 4; i++)
        e.t[i] = _mm512_loadu_si512(EXP2F_TAB + 8 * i);
    return e;
}

__attribute__((target("avx512f"))) static inline __m512d exp_core(__m512d xd, const exp_tab *e)
{
    const __m512d shift = _mm512_set1_pd(EXPF_SHIFT), inv = _mm512_set1_pd(EXPF_INVLN2N);
    __m512d kd = _mm512_fmadd_pd(inv, xd, shift);
    __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, shift);
    __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    __m512i lo = _mm512_permutex2var_epi64(e->t[0], ki, e->t[1]);
    __m512i hi = _mm512_permutex2var_epi64(e->t[2], ki, e->t[3]);
    __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
    __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(EXPF_C0), r, _mm512_set1_pd(EXPF_C1));
    __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(EXPF_C2), r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    return _mm512_mul_pd(y, s);
}

__attribute__((target("avx512f"))) static inline __m512 exp16(__m512 x, const exp_tab *e)
{
    __m256 xlo = _mm512_castps512_ps256(x);
    __m256 xhi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    __m256 ylo = _mm512_cvtpd_ps(exp_core(_mm512_cvtps_pd(xlo), e));
    __m256 yhi = _mm512_cvtpd_ps(exp_core(_mm512_cvtps_pd(xhi), e));
    __m512 y = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(ylo)), _mm256_castps_pd(yhi), 1));
    /* Almost every block lies in the plain range: one test instead of four
     * blends. NaN fails it (ordered compares). */
    __mmask16 plain = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXPF_MAY_UFLOW), _CMP_GE_OQ) &
                      _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXPF_OFLOW), _CMP_LE_OQ);
    if (plain == 0xFFFF)
        return y;
    __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXPF_UFLOW), _CMP_LT_OQ);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXPF_MAY_UFLOW), _CMP_LT_OQ) & ~zero;
    __mmask16 big = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXPF_OFLOW), _CMP_GT_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    y = _mm512_mask_mov_ps(y, zero, _mm512_setzero_ps());
    y = _mm512_mask_mov_ps(y, tiny, _mm512_set1_ps(0x1.4p-75f * 0x1.4p-75f));
    y = _mm512_mask_mov_ps(y, big, _mm512_set1_ps(INFINITY));
    return _mm512_mask_add_ps(y, nan, x, x);
}

static __mmask16 lanes(int n)
{
    return n >= BLOCK ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* Values of block [i, i + 16); lanes past the vocabulary are -inf. */
__attribute__((target("avx512f"))) static inline __m512 load16(const tp_smp_view *v, int i)
{
    int n = block_len(v, i);
    __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), lanes(n), v->logits + i);
    unsigned m = special_bits(v, i / BLOCK);
    if (m) {
        float tmp[BLOCK];
        _mm512_storeu_ps(tmp, x);
        for (; m; m &= m - 1)
            tmp[__builtin_ctz(m)] = tp_smp_value(v, i + __builtin_ctz(m));
        x = _mm512_loadu_ps(tmp);
    }
    return x;
}

__attribute__((target("avx512f"))) static int argmax_avx512(const tp_smp_view *v)
{
    /* Per lane the first maximum of its ids (strictly greater replaces, so
     * NaN never enters); then the lowest id among lanes holding the max. */
    __m512 best = _mm512_set1_ps(-INFINITY);
    __m512i best_id = _mm512_set1_epi32(-1);
    __m512i id = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int i = 0; i < v->vocab; i += BLOCK) {
        __m512 x = load16(v, i);
        __mmask16 gt = _mm512_cmp_ps_mask(x, best, _CMP_GT_OQ);
        best_id = _mm512_mask_mov_epi32(best_id, gt, id);
        best = _mm512_max_ps(x, best); /* NaN x keeps best; a short chain */
        id = _mm512_add_epi32(id, _mm512_set1_epi32(BLOCK));
    }
    float mx = _mm512_reduce_max_ps(best);
    if (!(mx > -INFINITY))
        return -1;
    __mmask16 at_max = _mm512_cmp_ps_mask(best, _mm512_set1_ps(mx), _CMP_EQ_OQ);
    return _mm512_mask_reduce_min_epi32(at_max, best_id);
}

__attribute__((target("avx512f"))) static size_t top_k_avx512(const tp_smp_view *v, size_t k,
                                                              tp_smp_cand *h)
{
    /* Once the heap is full only an id above the root's value can enter
     * (every kept id is lower, so an equal value ranks after the root), and
     * the root only rises: lanes not above it at the block's start are
     * skipped, the others offered in id order as the scalar pass does. */
    size_t n = 0;
    float x[BLOCK];
    for (int i = 0; i < v->vocab; i += BLOCK) {
        __m512 xv = load16(v, i);
        float floor_x = n < k ? -INFINITY : h[0].l;
        __mmask16 m = _mm512_cmp_ps_mask(xv, _mm512_set1_ps(floor_x), _CMP_GT_OQ);
        if (!m)
            continue;
        _mm512_storeu_ps(x, xv);
        for (; m; m &= m - 1) {
            int j = __builtin_ctz(m);
            heap_offer(h, &n, k, (tp_smp_cand){x[j], 0.0f, i + j});
        }
    }
    return n;
}

/* Weights of one block as tp_smp_weight computes them, 0 for NaN. d == 0
 * needs its own case only when inv_t is infinite (0 * inf); elsewhere
 * expf(0) is 1 already. */
__attribute__((target("avx512f"))) static inline __m512 weight16(__m512 x, __m512 max, __m512 inv_t,
                                                                 bool inf_t, const exp_tab *e)
{
    __m512 d = _mm512_sub_ps(x, max);
    __m512 w = exp16(_mm512_mul_ps(d, inv_t), e);
    if (inf_t)
        w = _mm512_mask_mov_ps(w, _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_EQ_OQ),
                               _mm512_set1_ps(1.0f));
    return _mm512_max_ps(w, _mm512_setzero_ps()); /* NaN w gives the second operand */
}

/* Adds w[i, i + n) to *sum one by one in id order: that rounding is what
 * the draw has always used, so this chain of dependent adds stays. */
static void sum_block(const float *w, int i, int n, double *sum, double *acc)
{
    double s = *sum;
    acc[i / BLOCK] = s;
    for (int j = 0; j < n; j++)
        s += w[i + j];
    *sum = s;
}

__attribute__((target("avx512f"))) static double weights_avx512(const tp_smp_view *v, float max,
                                                                float inv_t, float *w, double *acc,
                                                                size_t *n_pos, int *last_pos)
{
    exp_tab e = exp_tab_load();
    __m512 vmax = _mm512_set1_ps(max), vinv = _mm512_set1_ps(inv_t);
    double sum = 0.0;
    int i = 0;
    for (; i < v->vocab; i += BLOCK) {
        int n = block_len(v, i);
        __m512 wv = weight16(load16(v, i), vmax, vinv, isinf(inv_t), &e);
        _mm512_mask_storeu_ps(w + i, lanes(n), wv);
        unsigned pos = _mm512_cmp_ps_mask(wv, _mm512_setzero_ps(), _CMP_GT_OQ) & lanes(n);
        if (pos)
            *n_pos += (size_t)__builtin_popcount(pos), *last_pos = i + 31 - __builtin_clz(pos);
        /* The sum runs one block behind: reading back a block just stored
         * waits for the store; the block before is already in the cache. */
        if (i)
            sum_block(w, i - BLOCK, BLOCK, &sum, acc);
    }
    i -= BLOCK;
    sum_block(w, i, v->vocab - i, &sum, acc);
    return sum;
}

__attribute__((target("avx512f"))) static size_t gather_avx512(const tp_smp_view *v, const float *w,
                                                               double cut, tp_smp_cand *out)
{
    /* w >= cut in double is w >= the least float not below cut. */
    float cut_f = (float)cut;
    if ((double)cut_f < cut)
        cut_f = nextafterf(cut_f, INFINITY);
    __m512 vcut = _mm512_set1_ps(cut_f);
    size_t n = 0;
    float x[BLOCK];
    for (int i = 0; i < v->vocab; i += BLOCK) {
        __mmask16 in = lanes(block_len(v, i));
        __m512 wv = _mm512_maskz_loadu_ps(in, w + i);
        __mmask16 m = _mm512_cmp_ps_mask(wv, vcut, _CMP_GE_OQ) &
                      _mm512_cmp_ps_mask(wv, _mm512_setzero_ps(), _CMP_GT_OQ) & in;
        if (!m)
            continue;
        _mm512_storeu_ps(x, load16(v, i));
        for (; m; m &= m - 1) {
            int j = __builtin_ctz(m);
            out[n++] = (tp_smp_cand){x[j], w[i + j], i + j};
        }
    }
    return n;
}

__attribute__((target("avx512f"))) static size_t min_p_avx512(const tp_smp_view *v, float max,
                                                              float inv_t, float min_p,
                                                              tp_smp_cand *out)
{
    exp_tab e = exp_tab_load();
    __m512 vmax = _mm512_set1_ps(max), vinv = _mm512_set1_ps(inv_t), vmin_p = _mm512_set1_ps(min_p);
    __m512 vfloor = _mm512_set1_ps(min_p_floor(min_p));
    size_t n = 0;
    float x[BLOCK], w[BLOCK];
    for (int i = 0; i < v->vocab; i += BLOCK) {
        __m512 xv = load16(v, i);
        __m512 d = _mm512_sub_ps(xv, vmax);
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_mul_ps(d, vinv), vfloor, _CMP_GE_OQ) |
                      _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_EQ_OQ);
        if (!m)
            continue;
        __m512 wv = weight16(xv, vmax, vinv, isinf(inv_t), &e);
        m &= _mm512_cmp_ps_mask(wv, vmin_p, _CMP_GE_OQ);
        _mm512_storeu_ps(x, xv);
        _mm512_storeu_ps(w, wv);
        for (; m; m &= m - 1) {
            int j = __builtin_ctz(m);
            out[n++] = (tp_smp_cand){x[j], w[j], i + j};
        }
    }
    return n;
}

__attribute__((target("avx512f"))) static void expf_avx512(const float *x, float *y, size_t n)
{
    exp_tab e = exp_tab_load();
    for (size_t i = 0; i < n; i += BLOCK) {
        __mmask16 in = lanes(n - i < BLOCK ? (int)(n - i) : BLOCK);
        _mm512_mask_storeu_ps(y + i, in, exp16(_mm512_maskz_loadu_ps(in, x + i), &e));
    }
}

/* ---- dispatch ------------------------------------------------------------ */

bool tp_smp_have_avx512(void)
{
    return tp_isa_active() >= TP_ISA_AVX512;
}

int tp_smp_argmax(const tp_smp_view *v, bool avx512)
{
    return avx512 ? argmax_avx512(v) : argmax_scalar(v);
}

size_t tp_smp_top_k(const tp_smp_view *v, size_t k, tp_smp_cand *heap, bool avx512)
{
    return avx512 ? top_k_avx512(v, k, heap) : top_k_scalar(v, k, heap);
}

double tp_smp_weights(const tp_smp_view *v, float max, float inv_t, float *w, double *acc,
                      size_t *n_pos, int *last_pos, bool avx512)
{
    *n_pos = 0;
    *last_pos = -1;
    double total = avx512 ? weights_avx512(v, max, inv_t, w, acc, n_pos, last_pos)
                          : weights_scalar(v, max, inv_t, w, acc, n_pos, last_pos);
    acc[(v->vocab + BLOCK - 1) / BLOCK] = total;
    return total;
}

size_t tp_smp_gather(const tp_smp_view *v, const float *w, double cut, tp_smp_cand *out,
                     bool avx512)
{
    return avx512 ? gather_avx512(v, w, cut, out) : gather_scalar(v, w, cut, out);
}

size_t tp_smp_min_p(const tp_smp_view *v, float max, float inv_t, float min_p, tp_smp_cand *out,
                    bool avx512)
{
    return avx512 ? min_p_avx512(v, max, inv_t, min_p, out)
                  : min_p_scalar(v, max, inv_t, min_p, out);
}

void tp_smp_expf(const float *x, float *y, size_t n, bool avx512)
{
    if (avx512) {
        expf_avx512(x, y, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        y[i] = expf(x[i]);
}
