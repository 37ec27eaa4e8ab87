/* Typed-weight matmuls: activation quantization, the portable (scalar)
 * path in the canonical order of quant.h, dispatch and dequantization. */
#include <cpuid.h>
#include "quant.h"
#include "kernels.h" /* TP_SCALAR_CLONES */
#include "tokpipe/error.h"
#include "tokpipe/isa.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

float tp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalize */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tp_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or 0 */
        if (ax < 0x33000000u)
            return sign;
        uint32_t man = (ax & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(ax >> 23); /* 14..24: the value is man * 2^(E - 126) halves' units */
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1); /* round to nearest even on the 13 dropped bits */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float tp_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tp_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

bool tp_quant_type_ok(uint32_t type)
{
    return type != TP_GGML_F32 && tp_ggml_matrix_type_ok(type); /* one list: the model's */
}

static bool is_float_type(uint32_t type) { return type == TP_GGML_F16 || type == TP_GGML_BF16; }

int tp_qact_init(tp_qact *a, int max_tok, int max_cols)
{
    memset(a, 0, sizeof *a);
    size_t n = (size_t)max_tok * (size_t)((max_cols + 63) / 64 * 64);
    a->q = malloc(n ? n : 1);
    a->dx = malloc((n / 32 + 1) * sizeof(float));
    a->sum = malloc((n / 32 + 1) * sizeof(float));
    a->nsum32 = malloc((n / 32 + 1) * sizeof(int32_t));
    a->nsum16 = malloc((n / 16 + 1) * sizeof(int32_t));
    if (!a->q || !a->dx || !a->sum || !a->nsum32 || !a->nsum16) {
        tp_qact_free(a);
        return TP_ENOMEM;
    }
    a->cap = n;
    return 0;
}

void tp_qact_free(tp_qact *a)
{
    if (!a)
        return;
    free(a->q);
    free(a->dx);
    free(a->sum);
    free(a->nsum32);
    free(a->nsum16);
    memset(a, 0, sizeof *a);
}

static bool have_avx2(void);

/* Block b's scale d and sums of its two halves' quants h into the arrays
 * tp_qact keeps (both paths below). */
static inline void block_stats(int b, float d, const int32_t h[2], float *dx, float *sum, int32_t *nsum32,
                               int32_t *nsum16)
{
    dx[b] = d;
    sum[b] = (float)(h[0] + h[1]);
    nsum32[b] = -(h[0] + h[1]);
    nsum16[2 * b] = -h[0];
    nsum16[2 * b + 1] = -h[1];
}

/* One token's row to int8 per block of 32 (ggml's Q8_0 rule, rounding to
 * nearest even), with each block's scale and sums. */
static void quantize_act_row(const float *x, int cols, int8_t *q, float *dx, float *sum, int32_t *nsum32,
                             int32_t *nsum16)
{
    for (int b = 0; b < cols / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) {
            float v = fabsf(xb[i]);
            amax = v > amax ? v : amax; /* as fmaxf, but a NaN is skipped the same way */
        }
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int32_t h[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            float v = nearbyintf(xb[i] * id);
            /* a non-finite activation (hostile weights) must not reach an
             * int conversion */
            int qi = v == v ? (v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v) : 0;
            q[b * 32 + i] = (int8_t)qi;
            h[i / 16] += qi;
        }
        block_stats(b, d, h, dx, sum, nsum32, nsum16);
    }
}

/* quantize_act_row with AVX-512: the same IEEE operations per element
 * (a maximum, one division, a product rounded to nearest even), so the
 * same bits. */
__attribute__((target("avx512f,avx512bw"))) static void
quantize_act_row_avx512(const float *x, int cols, int8_t *q, float *dx, float *sum, int32_t *nsum32,
                        int32_t *nsum16)
{
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    for (int b = 0; b < cols / 32; b++) {
        __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        /* max_ps(v, m) is v > m ? v : m: a NaN is skipped as in the scalar loop */
        __m512 a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x0), absmask));
        __m512 a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x1), absmask));
        __m512 m = _mm512_max_ps(a0, _mm512_max_ps(a1, _mm512_setzero_ps()));
        float amax = _mm512_reduce_max_ps(m);
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        int32_t h[2];
        for (int k = 0; k < 2; k++) {
            __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(k ? x1 : x0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __mmask16 ok = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
            __m512i qi = _mm512_maskz_cvtps_epi32(ok, _mm512_min_ps(_mm512_max_ps(v, lo), hi));
            _mm_storeu_si128((__m128i *)(q + 32 * b + 16 * k), _mm512_cvtepi32_epi8(qi));
            h[k] = _mm512_reduce_add_epi32(qi);
        }
        block_stats(b, d, h, dx, sum, nsum32, nsum16);
    }
}

/* quantize_act_row with AVX2 (the same operations per element as the
 * AVX-512 one above, 8 lanes at a time): the same bits. */
__attribute__((target("avx2"))) static void quantize_act_row_avx2(const float *x, int cols, int8_t *q, float *dx,
                                                                 float *sum, int32_t *nsum32, int32_t *nsum16)
{
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    /* packs interleave 128-bit lanes: this puts the 32 quants back in order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < cols / 32; b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 32 * b + 8 * k);
            /* max_ps(a, m) is a > m ? a : m: a NaN is skipped as in the scalar loop */
            m = _mm256_max_ps(_mm256_and_ps(v[k], absmask), m);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i qi[4];
        for (int k = 0; k < 4; k++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m256i ok = _mm256_castps_si256(_mm256_cmp_ps(r, r, _CMP_ORD_Q));
            qi[k] = _mm256_and_si256(_mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi)), ok);
        }
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), _mm256_permutevar8x32_epi32(p, order));
        int32_t h[2];
        for (int k = 0; k < 2; k++) {
            __m256i s8 = _mm256_add_epi32(qi[2 * k], qi[2 * k + 1]);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            h[k] = _mm_cvtsi128_si32(s4);
        }
        block_stats(b, d, h, dx, sum, nsum32, nsum16);
    }
}

typedef void (*qact_row_fn)(const float *, int, int8_t *, float *, float *, int32_t *, int32_t *);

static qact_row_fn qact_row(int path)
{
    return path == QACT_AVX512 ? quantize_act_row_avx512 : path == QACT_AVX2 ? quantize_act_row_avx2 : quantize_act_row;
}

static int qact_path(void)
{
    tp_isa isa = tp_isa_active();
    return isa >= TP_ISA_AVX512 ? QACT_AVX512 : isa >= TP_ISA_AVX2 ? QACT_AVX2 : QACT_SCALAR;
}

void tp_qact_prepare(tp_qact *a, uint32_t wtype, const float *x, int ldx, int n_tok, int cols)
{
    tp_qact_prepare_path(a, wtype, x, ldx, n_tok, cols, qact_path());
}

void tp_qact_layout(tp_qact *a, uint32_t wtype, const float *x, int ldx, int n_tok, int cols)
{
    a->n_tok = n_tok;
    a->cols = cols;
    a->x = x;
    a->ldx = ldx;
    a->is_float = is_float_type(wtype);
}

/* Each block's quants, scale and sums depend on its 32 values alone (every
 * path above), so a block range of a row is the row's computation cut. */
static void prepare_blocks(tp_qact *a, int t, int b0, int b1, qact_row_fn row)
{
    size_t nb = (size_t)a->cols / 32, r = (size_t)t * nb;
    row(a->x + (size_t)t * (size_t)a->ldx + 32 * (size_t)b0, 32 * (b1 - b0), a->q + 32 * (r + (size_t)b0),
        a->dx + r + b0, a->sum + r + b0, a->nsum32 + r + b0, a->nsum16 + 2 * (r + (size_t)b0));
}

void tp_qact_prepare_blocks(tp_qact *a, int t, int b0, int b1)
{
    if (!a->is_float && b0 < b1)
        prepare_blocks(a, t, b0, b1, qact_row(qact_path()));
}

void tp_qact_prepare_path(tp_qact *a, uint32_t wtype, const float *x, int ldx, int n_tok, int cols, int path)
{
    tp_qact_layout(a, wtype, x, ldx, n_tok, cols);
    if (a->is_float)
        return;
    for (int t = 0; t < n_tok; t++)
        prepare_blocks(a, t, 0, cols / 32, qact_row(path));
}

void tp_qact_gather(tp_qact *dst, const tp_qact *src, const int *from, int n)
{
    *dst = (tp_qact){n, src->cols, src->is_float, NULL, 0, dst->q, dst->dx, dst->sum, dst->nsum32, dst->nsum16,
                     dst->cap};
    size_t cols = (size_t)src->cols, nb = cols / 32;
    for (int i = 0; i < n; i++) {
        size_t t = (size_t)from[i];
        memcpy(dst->q + (size_t)i * cols, src->q + t * cols, cols);
        memcpy(dst->dx + (size_t)i * nb, src->dx + t * nb, nb * sizeof *dst->dx);
        memcpy(dst->sum + (size_t)i * nb, src->sum + t * nb, nb * sizeof *dst->sum);
        memcpy(dst->nsum32 + (size_t)i * nb, src->nsum32 + t * nb, nb * sizeof *dst->nsum32);
        memcpy(dst->nsum16 + (size_t)i * 2 * nb, src->nsum16 + t * 2 * nb, 2 * nb * sizeof *dst->nsum16);
    }
}

tp_qact tp_qact_rows(const tp_qact *a, int t0, int n)
{
    tp_qact v = *a;
    size_t t = (size_t)t0, nb = (size_t)a->cols / 32;
    v.n_tok = n;
    v.x = a->x ? a->x + t * (size_t)a->ldx : NULL;
    if (!a->is_float) {
        v.q = a->q + t * (size_t)a->cols;
        v.dx = a->dx + t * nb;
        v.sum = a->sum + t * nb;
        v.nsum32 = a->nsum32 + t * nb;
        v.nsum16 = a->nsum16 + t * 2 * nb;
    }
    v.cap = 0; /* a view: not to be prepared or freed */
    return v;
}

/* The fixed reduction tree of quant.h. */
static float reduce16(const float a[16])
{
    float a8[8], a4[4], a2[2];
    for (int i = 0; i < 8; i++)
        a8[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++)
        a4[i] = a8[i] + a8[i + 4];
    for (int i = 0; i < 2; i++)
        a2[i] = a4[i] + a4[i + 2];
    return a2[0] + a2[1];
}

static tp_qunpack_fn unpack_fn(uint32_t type, bool *has_min)
{
    *has_min = type == TP_GGML_Q4_1 || type == TP_GGML_Q5_1 || type == TP_GGML_Q4_K || type == TP_GGML_Q5_K;
    switch (type) {
    case TP_GGML_Q8_0: return tp_qunpack_q8_0;
    case TP_GGML_Q4_0: return tp_qunpack_q4_0;
    case TP_GGML_Q4_1: return tp_qunpack_q4_1;
    case TP_GGML_Q5_0: return tp_qunpack_q5_0;
    case TP_GGML_Q5_1: return tp_qunpack_q5_1;
    case TP_GGML_Q4_K: return tp_qunpack_q4_k;
    case TP_GGML_Q5_K: return tp_qunpack_q5_k;
    case TP_GGML_Q6_K: return tp_qunpack_q6_k;
    case TP_GGML_MXFP4: return tp_qunpack_mxfp4;
    default: return NULL;
    }
}

/* Tokens a scalar pass takes together: each weight block is unpacked once
 * for all of them (once per token, unpacking was most of the time). */
#define SCALAR_TOKENS 8

TP_SCALAR_CLONES static void qrows_int_scalar(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    bool has_min;
    tp_qunpack_fn unpack = unpack_fn(w->type, &has_min);
    int sub = w->type == TP_GGML_Q6_K ? 16 : 32;
    int cols = w->cols, nch = (cols + 63) / 64, nb = cols / 32;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int t0 = 0; t0 < a->n_tok; t0 += SCALAR_TOKENS) {
            int nt = a->n_tok - t0 < SCALAR_TOKENS ? a->n_tok - t0 : SCALAR_TOKENS;
            float acc[SCALAR_TOKENS] = {0};
            for (int c = 0; c < nch; c++) {
                int8_t wq[64];
                float ws[16], wm[16];
                unpack(row, c, cols, wq, ws, wm);
                int n = cols - 64 * c >= 64 ? 64 : 32;
                for (int k = 0; k < nt; k++) {
                    size_t t = (size_t)(t0 + k);
                    const int8_t *xq = a->q + t * (size_t)cols;
                    const float *dx = a->dx + t * (size_t)nb, *sum = a->sum + t * (size_t)nb;
                    for (int e0 = 0; e0 < n; e0 += sub) {
                        int col = 64 * c + e0;
                        int32_t p = 0;
                        for (int i = 0; i < sub; i++)
                            p += (int32_t)wq[e0 + i] * (int32_t)xq[col + i];
                        float d = dx[col / 32];
                        acc[k] = fmaf(ws[e0 / 4] * d, (float)p, acc[k]);
                        if (has_min)
                            acc[k] = fmaf(wm[e0 / 4] * d, sum[col / 32], acc[k]);
                    }
                }
            }
            for (int k = 0; k < nt; k++)
                y[(size_t)(t0 + k) * (size_t)ldy + (size_t)r] = acc[k];
        }
    }
}

/* ---- AVX2 (CPUs without AVX-512 VNNI): the canonical order of quant.h,
 * vectorised where it is exact. Integer dot products of a sub-block are
 * exact in any order; float lanes are the 16 of the scalar path, two
 * registers of 8. So the bits are those of the scalar path. ---- */

/* A block's f16 scale, converted by the CPU (F16C: exact, as
 * tp_f16_to_f32; and no call out of AVX code in the inner loop). */
__attribute__((target("avx2,f16c"))) static inline float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The integer kernels below take four rows at a time, row k in lane k.
 * The scalar order is one chain of fused multiply-adds per row, a block
 * (or a 16-column sub-block) after another; one row alone waits on that
 * chain (an FMA's latency a link) more than on its integer work. Four
 * rows' chains side by side in one register keep each row's order, so
 * the bits are the scalar path's, and the four exact integer products of
 * a block are reduced by one horizontal tree. A range's last rows, when
 * fewer than four, repeat its first row in the spare lanes.
 *
 * Decode streams every weight once and these kernels do little work per
 * byte, so on their own the loads wait on DRAM; and four rows read side by
 * side are four streams a few hundred bytes apart, which the hardware
 * prefetcher follows worse than one. So the kernels ask for the memory
 * ahead themselves, as one run (at least AVX2_PREFETCH_RUN bytes, and at
 * least the next four rows, ahead) as fast as they consume their own.
 * Past the end of a range the run touches the next rows: harmless. */
#define AVX2_PREFETCH_RUN 4096

/* The run ahead of a group of rows (four, or a panel's group): from its
 * start, lines are asked for as far ahead as the group has been read. */
typedef struct pf_run {
    const char *next, *base; /* next line to ask for; where the run starts */
} pf_run;

/* The run exactly ahead bytes ahead of start: for a panel (one
 * contiguous stream) whose kernel does so little work per byte (F16, Q8_0)
 * that a nearer run keeps fewer lines in flight and serves it better; the
 * types that unpack their quants keep the longer run. */
#define F16_PANEL_AHEAD 1024
#define Q80_PANEL_AHEAD 1536

static inline pf_run pf_run_ahead(const void *start, size_t ahead)
{
    const char *b = (const char *)start + ahead;
    return (pf_run){b, b};
}

/* The run for a group of group bytes starting at start: at least
 * AVX2_PREFETCH_RUN bytes and at least the group itself ahead. */
static inline pf_run pf_run_at(const void *start, size_t group)
{
    return pf_run_ahead(start, group < AVX2_PREFETCH_RUN ? AVX2_PREFETCH_RUN : group);
}

/* Ask for the run up to done bytes into it (done: the bytes of the group
 * read so far; asking again for less does nothing). */
static inline void pf_run_to(pf_run *r, size_t done)
{
    while (r->next < r->base + done) {
        _mm_prefetch(r->next, _MM_HINT_T1);
        r->next += 64;
    }
}

typedef struct rows4 {
    const uint8_t *p[4]; /* each row's first block */
    size_t stride;       /* from a row's block to its next */
    int n;               /* rows of the four that are real */
    pf_run pf;
} rows4;

/* Rows r.. (up to four, below r1) of w, each block of bb bytes: in the
 * file, or in w's AVX2 panel where the blocks of four rows alternate
 * (tp_qpanel group_rows 4: Q4_1, Q5_0, Q5_1, F16, BF16), a row's
 * blocks 4 bb apart. */
static inline rows4 rows4_at(const tp_wmat *w, int r, int r1, size_t bb)
{
    rows4 q;
    q.n = r1 - r < 4 ? r1 - r : 4;
    bool panel = w->panel && w->panel->group_rows == 4;
    q.stride = panel ? 4 * bb : bb;
    for (int k = 0; k < 4; k++) {
        size_t row = (size_t)(r + (k < q.n ? k : 0));
        q.p[k] = panel ? w->panel->data + row / 4 * w->panel->group_bytes + row % 4 * bb
                       : (const uint8_t *)w->data + row * w->row_bytes;
    }
    q.pf = pf_run_at(q.p[0], 4 * w->row_bytes);
    return q;
}

__attribute__((target("avx2"))) static inline void rows4_store(const rows4 *q, __m128 acc, float *y)
{
    if (q->n == 4) {
        _mm_storeu_ps(y, acc);
        return;
    }
    float v[4];
    _mm_storeu_ps(v, acc);
    memcpy(y, v, sizeof(float) * (size_t)q->n);
}

/* [P0, P1, P2, P3] from four rows' 8-lane partial sums: row k's first
 * four lanes summed in lane k of the low half and its last four in lane k
 * of the high half. Unpacks and adds, not horizontal adds: a vphaddd is
 * three micro-ops, two of them shuffles on one port, which a tree of them
 * makes the kernels' bottleneck; integer sums are exact in any order. */
__attribute__((target("avx2"), always_inline)) static inline __m256i hsum4_halves(__m256i p0, __m256i p1, __m256i p2,
                                                                                __m256i p3)
{
    __m256i u01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
    __m256i u23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(u01, u23), _mm256_unpackhi_epi64(u01, u23));
}

__attribute__((target("avx2"), always_inline)) static inline __m128i hsum4(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
    __m256i h = hsum4_halves(p0, p1, p2, p3);
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* The f16 at the same offset of four rows, as floats (F16C: exact). */
__attribute__((target("avx2,f16c"), always_inline)) static inline __m128 half4(const rows4 *q, size_t off)
{
    uint16_t h0, h1, h2, h3;
    memcpy(&h0, q->p[0] + off, 2);
    memcpy(&h1, q->p[1] + off, 2);
    memcpy(&h2, q->p[2] + off, 2);
    memcpy(&h3, q->p[3] + off, 2);
    return _mm_cvtph_ps(_mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(_mm_cvtsi32_si128(h0), h1, 1), h2, 2), h3, 3));
}

/* 8-lane partial sums of q . x over 32 pairs, q unsigned (at most 63) and
 * x signed: maddubs's pairs stay inside int16 (2 * 63 * 127). Sums of
 * integer products are exact in any order. */
__attribute__((target("avx2"), always_inline)) static inline __m256i dot32u_parts(__m256i q, __m256i x)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1));
}

/* A Q4_0 block's 16 bytes of nibbles as 32 unsigned quants in column
 * order (low nibbles are columns 0..15, high ones 16..31). */
__attribute__((target("avx2"), always_inline)) static inline __m256i nibbles32(const uint8_t *qs)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
}

/* A Q5 block's 32 fifth bits (bit j: column j) as 0x10 in byte j. */
__attribute__((target("avx2"), always_inline)) static inline __m256i fifth_bits(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i byte_of = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), byte_of);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(0x10));
}

/* The 32-column block types (ggml's first ones), a block of each:
 * f16 d, [f16 m,] [u32 qh,] quants: Q8_0 int8 (34 bytes), Q4_0 nibbles
 * less 8 (18), Q4_1 nibbles + m (20), Q5_0 five bits less 16 (22), Q5_1
 * five bits + m (24). In a block, columns 0..15 are the low nibbles,
 * 16..31 the high ones. */
typedef enum { LEG_Q8_0, LEG_Q4_0, LEG_Q4_1, LEG_Q5_0, LEG_Q5_1 } legacy_kind;
static const size_t LEG_BYTES[] = {34, 18, 20, 22, 24}; /* a block of each */

/* Prefill and batched decode run a matmul over several tokens: the kernels
 * take up to TOK_TILE of them per pass over a block of rows, so the work
 * that depends on the weights alone (loading, unpacking nibbles, scales)
 * is done once per block for all of them. Each token keeps its own
 * accumulator and its own order: the bits of one token at a time. */
#define TOK_TILE 4

/* A block of four rows' quants ready for any number of tokens. Q8_0: v
 * the quants' magnitudes, s the quants (their signs go onto x); Q5_0,
 * Q5_1: v the unsigned quants; Q4_0, Q4_1 (two rows a register, see
 * nib4_prep): v the low and high nibbles of rows 0 and 1, then 2 and 3. */
typedef struct w4 {
    __m256i v[4], s[4];
} w4;

/* Q4_0/Q4_1: two rows share a register, each in one half: their low
 * nibbles (columns 0..15) meet x's first 16 quants and their high nibbles
 * x's last 16, the two products add as int16 (at most 4 * 15 * 127), and
 * two horizontal adds and an unpack finish the four sums: fewer shuffles
 * than a register per row, which is what bounded these kernels. v01, v23:
 * rows 0 and 1's 16 bytes of nibbles, then 2 and 3's. */
__attribute__((target("avx2"), always_inline)) static inline w4 nib4_prep(__m256i v01, __m256i v23)
{
    const __m256i low = _mm256_set1_epi8(0x0f);
    w4 w;
    w.v[0] = _mm256_and_si256(v01, low);
    w.v[1] = _mm256_and_si256(_mm256_srli_epi16(v01, 4), low);
    w.v[2] = _mm256_and_si256(v23, low);
    w.v[3] = _mm256_and_si256(_mm256_srli_epi16(v23, 4), low);
    return w;
}

/* [P0, P1, P2, P3] of nib4_prep's rows with the activations x. */
__attribute__((target("avx2"), always_inline)) static inline __m128i nib4_dot(const w4 *w, const int8_t *x)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)x));
    __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(x + 16)));
    __m256i s[2];
    for (int i = 0; i < 2; i++) { /* row 2i in the low half, 2i + 1 high */
        __m256i lo = _mm256_maddubs_epi16(w->v[2 * i], xlo), hi = _mm256_maddubs_epi16(w->v[2 * i + 1], xhi);
        s[i] = _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones);
    }
    __m256i h = _mm256_hadd_epi32(s[0], s[1]); /* [r0 r0 r2 r2 | r1 r1 r3 r3] */
    h = _mm256_hadd_epi32(h, h);               /* [r0 r2 r0 r2 | r1 r3 r1 r3] */
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Two rows' 16 bytes at off in one register, the first in the low half. */
__attribute__((target("avx2"), always_inline)) static inline __m256i pair16(const uint8_t *a, const uint8_t *b)
{
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                   _mm_loadu_si128((const __m128i *)b), 1);
}

/* Block o (its first byte) of four rows of a kind, ready (w4). */
__attribute__((target("avx2"), always_inline)) static inline w4 legacy_prep(const rows4 *q, size_t o,
                                                                           const legacy_kind kind)
{
    w4 w;
    if (kind == LEG_Q4_0 || kind == LEG_Q4_1) {
        size_t qs = o + (kind == LEG_Q4_1 ? 4 : 2);
        return nib4_prep(pair16(q->p[0] + qs, q->p[1] + qs), pair16(q->p[2] + qs, q->p[3] + qs));
    }
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const uint8_t *blk = q->p[k] + o;
        if (kind == LEG_Q8_0) {
            w.s[k] = _mm256_loadu_si256((const __m256i *)(blk + 2));
            w.v[k] = _mm256_sign_epi8(w.s[k], w.s[k]);
        } else {
            bool m = kind == LEG_Q5_1;
            w.v[k] = _mm256_or_si256(nibbles32(blk + 6 + (m ? 2 : 0)), fifth_bits(blk + 2 + (m ? 2 : 0)));
        }
    }
    return w;
}

/* [P0, P1, P2, P3]: the block's exact integer products with the
 * activations x (32 quants), unsigned quants but for Q8_0. Q8_0's are
 * signed and maddubs takes an unsigned and a signed operand: |q| (made
 * once, legacy_prep) and x carrying q's sign; a pair is then at most
 * 2 * 128 * 127 (x is never -128: activations are quantized to +-127),
 * inside int16. */
__attribute__((target("avx2"), always_inline)) static inline __m128i legacy_dot4(const w4 *w, const int8_t *x32,
                                                                               const legacy_kind kind)
{
    if (kind == LEG_Q4_0 || kind == LEG_Q4_1)
        return nib4_dot(w, x32);
    __m256i x = _mm256_loadu_si256((const __m256i *)x32), p[4];
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        p[k] = dot32u_parts(w->v[k], kind == LEG_Q8_0 ? _mm256_sign_epi8(x, w->s[k]) : x);
    return hsum4(p[0], p[1], p[2], p[3]);
}

/* A panel kernel's pass over one group of rows for a tile of tokens:
 * grp the group, pf its prefetch run, y + row0 its first row's output,
 * only lanes [lo, hi) stored, tokens from t0 (how many: the function's). */
typedef void (*panel_tile_fn)(const uint8_t *grp, pf_run *pf, const tp_qact *a, float *y, int ldy, int row0, int lo,
                              int hi, int t0);

/* Rows [r0, r1) from a panel of n-row groups: TOK_TILE tokens a pass
 * (tile[0]), the rest one a pass (tile[1]). */
static void panel_groups(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1, int n,
                         const panel_tile_fn tile[2])
{
    const tp_qpanel *pn = w->panel;
    for (int g = r0 / n; n * g < r1; g++) {
        const uint8_t *grp = pn->data + (size_t)g * pn->group_bytes;
        int lo = r0 - n * g > 0 ? r0 - n * g : 0, hi = r1 - n * g < n ? r1 - n * g : n, t = 0;
        /* once a group: later tokens find it cached. Four rows' bytes
         * ahead, as the four-row kernels run: a whole eight-row group
         * ahead took Q8_0's and Q4_0's decode from 0.95 of the DRAM probe
         * to 0.85 (one thread, Zen 3); a quarter of one was worse again.
         * Q8_0 nearer still (Q80_PANEL_AHEAD). */
        pf_run pf = w->type == TP_GGML_Q8_0 ? pf_run_ahead(grp, Q80_PANEL_AHEAD) : pf_run_at(grp, pn->group_bytes / 2);
        for (; t + TOK_TILE <= a->n_tok; t += TOK_TILE)
            tile[0](grp, &pf, a, y, ldy, n * g, lo, hi, t);
        for (; t < a->n_tok; t++)
            tile[1](grp, &pf, a, y, ldy, n * g, lo, hi, t);
    }
}

/* The two instantiations of a tile kernel K(grp, pf, a, y, ldy, row0, lo,
 * hi, t0, nt) for panel_groups, as NAME_tiles. */
#define PANEL_TILES(NAME, K)                                                                                       \
    __attribute__((target("avx2,fma,f16c"))) static void NAME##_4(const uint8_t *grp, pf_run *pf, const tp_qact *a,  \
                                                                  float *y, int ldy, int row0, int lo, int hi, int t0) \
    {                                                                                                              \
        K(grp, pf, a, y, ldy, row0, lo, hi, t0, TOK_TILE);                                                         \
    }                                                                                                              \
    __attribute__((target("avx2,fma,f16c"))) static void NAME##_1(const uint8_t *grp, pf_run *pf, const tp_qact *a,  \
                                                                  float *y, int ldy, int row0, int lo, int hi, int t0) \
    {                                                                                                              \
        K(grp, pf, a, y, ldy, row0, lo, hi, t0, 1);                                                                \
    }                                                                                                              \
    static const panel_tile_fn NAME##_tiles[2] = {NAME##_4, NAME##_1};


/* Those types straight from the file's blocks. Q4_0 and Q5_0 multiply the
 * unsigned quants and take 8 or 16 x the block's quant sum off after: the
 * same integer, without the sign trick. Per block and row, as the scalar
 * path: acc += (d * dx) * p, then, with a min, acc += (m * dx) * sum. kind
 * is a constant in each instantiation, and nt (tokens from t0, at most
 * TOK_TILE). */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
legacy_tile(rows4 *q, const tp_qact *a, float *y, int ldy, int r, int t0, const int nt, const legacy_kind kind)
{
    static const int off[] = {0, 8, 0, 16, 0};
    const size_t bb = LEG_BYTES[kind];
    const bool has_min = kind == LEG_Q4_1 || kind == LEG_Q5_1;
    int cols = a->cols, nb = cols / 32;
    __m128 acc[TOK_TILE];
    #pragma GCC unroll 4
    for (int tt = 0; tt < nt; tt++)
        acc[tt] = _mm_setzero_ps();
    for (int b = 0; b < nb; b++) {
        size_t o = (size_t)b * q->stride;
        pf_run_to(&q->pf, 4 * bb * (size_t)(b + 1));
        w4 w = legacy_prep(q, o, kind);
        __m128 d = half4(q, o), m = has_min ? half4(q, o + 2) : d;
        #pragma GCC unroll 4
        for (int tt = 0; tt < nt; tt++) {
            size_t t = (size_t)(t0 + tt), tb = t * (size_t)nb + (size_t)b;
            __m128i s = legacy_dot4(&w, a->q + t * (size_t)cols + 32 * (size_t)b, kind);
            if (off[kind])
                s = _mm_add_epi32(s, _mm_set1_epi32(off[kind] * a->nsum32[tb]));
            __m128 dxb = _mm_set1_ps(a->dx[tb]);
            acc[tt] = _mm_fmadd_ps(_mm_mul_ps(d, dxb), _mm_cvtepi32_ps(s), acc[tt]);
            if (has_min)
                acc[tt] = _mm_fmadd_ps(_mm_mul_ps(m, dxb), _mm_set1_ps(a->sum[tb]), acc[tt]);
        }
    }
    for (int tt = 0; tt < nt; tt++)
        rows4_store(q, acc[tt], y + (size_t)(t0 + tt) * (size_t)ldy + (size_t)r);
}

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
legacy_rows(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1, const legacy_kind kind)
{
    for (int r = r0; r < r1; r += 4) {
        rows4 q = rows4_at(w, r, r1, LEG_BYTES[kind]);
        int t = 0;
        for (; t + TOK_TILE <= a->n_tok; t += TOK_TILE)
            legacy_tile(&q, a, y, ldy, r, t, TOK_TILE, kind);
        for (; t < a->n_tok; t++)
            legacy_tile(&q, a, y, ldy, r, t, 1, kind);
    }
}


/* Four rows by eight values each (row k's in s[k]) to eight vectors of
 * four, value j's in out[j] (lane k: row k). */
__attribute__((target("avx2"), always_inline)) static inline void transpose4x8(const __m256 s[4], __m128 out[8])
{
    __m256 t0 = _mm256_unpacklo_ps(s[0], s[1]), t1 = _mm256_unpackhi_ps(s[0], s[1]);
    __m256 t2 = _mm256_unpacklo_ps(s[2], s[3]), t3 = _mm256_unpackhi_ps(s[2], s[3]);
    __m256 u[4] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xee), _mm256_shuffle_ps(t1, t3, 0x44),
                   _mm256_shuffle_ps(t1, t3, 0xee)};
    for (int j = 0; j < 4; j++) {
        out[j] = _mm256_castps256_ps128(u[j]);
        out[j + 4] = _mm256_extractf128_ps(u[j], 1);
    }
}

/* Eight bytes as eight floats. */
__attribute__((target("avx2"), always_inline)) static inline __m256 u8x8_ps(uint64_t v)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v)));
}

__attribute__((target("avx2"), always_inline)) static inline __m256 i8x8_ps(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* A Q4_K super-block's eight 6-bit scales and eight 6-bit mins (12
 * bytes: sub-blocks 0..3 in the low six bits of bytes 0..3 and 4..7, 4..7
 * in the nibbles of bytes 8..11 with their top two bits in the top bits of
 * bytes 0..7), as quant_k.c reads them, a byte each. */
static inline void q4k_scales(const uint8_t *k, uint64_t *sc, uint64_t *m)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, k, 4);
    memcpy(&w1, k + 4, 4);
    memcpy(&w2, k + 8, 4);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    *sc = (uint64_t)sc_hi << 32 | sc_lo;
    *m = (uint64_t)m_hi << 32 | m_lo;
}

/* Q4_K (144-byte super-blocks of 256: f16 d, f16 dmin, 12 bytes of 6-bit
 * scales and mins, 128 bytes of nibbles), Q5_K (176: the same with 32
 * bytes of fifth bits before the nibbles, bit 2j + h of byte l for column
 * l of sub-block 2j + h) and Q6_K (210: ql[128], qh[64], int8 scales[16],
 * f16 d) straight from the file, as quant_k.c's unpacking reads them: the
 * same quants, the same float scale products (d * sc, then x dx;
 * -(dmin * m), then x dx), four rows in the lanes. All multiply unsigned
 * quants (Q6_K's q + 32) and Q6_K takes 32 x the activation sums off as
 * integers. bits is a constant in each instantiation. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
k_rows(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1, const int bits)
{
    const bool q6 = bits == 6, q5 = bits == 5;
    const size_t sbytes = q6 ? 210 : q5 ? 176 : 144, qs_at = q5 ? 48 : 16;
    int cols = w->cols, nb = cols / 32, nsb = cols / 256;
    const __m256i low = _mm256_set1_epi8(0x0f), three = _mm256_set1_epi8(3), bit4 = _mm256_set1_epi8(0x10);
    for (int r = r0; r < r1; r += 4) {
        rows4 q = rows4_at(w, r, r1, sbytes);
        for (int t = 0; t < a->n_tok; t++) {
            const int8_t *xq = a->q + (size_t)t * (size_t)cols;
            const float *dx = a->dx + (size_t)t * (size_t)nb, *sum = a->sum + (size_t)t * (size_t)nb;
            const int32_t *nsum16 = a->nsum16 + (size_t)t * 2 * (size_t)nb;
            __m128 acc = _mm_setzero_ps();
            for (int i = 0; i < nsb; i++) {
                if (q6) {
                    size_t o = (size_t)i * q.stride;
                    pf_run_to(&q.pf, 4 * sbytes * (size_t)(i + 1));
                    __m128 d = half4(&q, o + 208), s[16];
                    __m256 lo[4], hi[4];
                    #pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        const int8_t *sc = (const int8_t *)(q.p[k] + o + 192);
                        lo[k] = i8x8_ps(sc);
                        hi[k] = i8x8_ps(sc + 8);
                    }
                    transpose4x8(lo, s);
                    transpose4x8(hi, s + 8);
                    for (int j = 0; j < 16; j++)
                        s[j] = _mm_mul_ps(d, s[j]);
                    for (int h = 0; h < 2; h++)
                        for (int sub = 0; sub < 2; sub++)
                            for (int half = 0; half < 2; half++) {
                                int col = 256 * i + 128 * h + 64 * sub + 32 * half, b = col / 32;
                                __m256i x = _mm256_loadu_si256((const __m256i *)(xq + col)), p[4];
                                #pragma GCC unroll 4
                                for (int k = 0; k < 4; k++) {
                                    const uint8_t *sb = q.p[k] + o;
                                    __m256i ql = _mm256_loadu_si256((const __m256i *)(sb + 64 * h + 32 * half));
                                    __m256i qh = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * h));
                                    __m256i n = sub ? _mm256_and_si256(_mm256_srli_epi16(ql, 4), low) : _mm256_and_si256(ql, low);
                                    __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 4 * sub + 2 * half), three);
                                    p[k] = dot32u_parts(_mm256_or_si256(n, _mm256_slli_epi16(hb, 4)), x);
                                }
                                /* q - 32: 32 x each 16-column half's quant sum off (nsum16 is minus it) */
                                __m256i s2 = _mm256_add_epi32(
                                    hsum4_halves(p[0], p[1], p[2], p[3]),
                                    _mm256_set_m128i(_mm_set1_epi32(32 * nsum16[2 * b + 1]), _mm_set1_epi32(32 * nsum16[2 * b])));
                                __m256 pf = _mm256_cvtepi32_ps(s2);
                                int j = 8 * h + 4 * sub + 2 * half;
                                __m128 dxb = _mm_set1_ps(dx[b]);
                                acc = _mm_fmadd_ps(_mm_mul_ps(s[j], dxb), _mm256_castps256_ps128(pf), acc);
                                acc = _mm_fmadd_ps(_mm_mul_ps(s[j + 1], dxb), _mm256_extractf128_ps(pf, 1), acc);
                            }
                } else {
                    size_t o = (size_t)i * q.stride;
                    pf_run_to(&q.pf, 4 * sbytes * (size_t)(i + 1));
                    __m128 d = half4(&q, o), dmin = half4(&q, o + 2), sv[8], mv[8];
                    __m256 scs[4], mins[4];
                    #pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        uint64_t sc, m;
                        q4k_scales(q.p[k] + o + 4, &sc, &m);
                        scs[k] = u8x8_ps(sc);
                        mins[k] = u8x8_ps(m);
                    }
                    transpose4x8(scs, sv);
                    transpose4x8(mins, mv);
                    const __m128 neg = _mm_set1_ps(-0.0f);
                    for (int j = 0; j < 4; j++) {
                        __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + 256 * i + 64 * j));
                        __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + 256 * i + 64 * j + 32));
                        __m256i p0[4], p1[4];
                        #pragma GCC unroll 4
                        for (int k = 0; k < 4; k++) {
                            __m256i qq = _mm256_loadu_si256((const __m256i *)(q.p[k] + o + qs_at + 32 * j));
                            __m256i lo = _mm256_and_si256(qq, low), hi = _mm256_and_si256(_mm256_srli_epi16(qq, 4), low);
                            if (q5) { /* bits 2j and 2j + 1 of each byte to bit 4 */
                                __m256i qh = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(q.p[k] + o + 16)),
                                                              _mm_cvtsi32_si128(2 * j));
                                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4));
                                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit4));
                            }
                            p0[k] = dot32u_parts(lo, x0);
                            p1[k] = dot32u_parts(hi, x1);
                        }
                        __m128i s[2] = {hsum4(p0[0], p0[1], p0[2], p0[3]), hsum4(p1[0], p1[1], p1[2], p1[3])};
                        for (int hh = 0; hh < 2; hh++) {
                            int jj = 2 * j + hh, b = 8 * i + jj;
                            __m128 dxb = _mm_set1_ps(dx[b]);
                            __m128 ws = _mm_mul_ps(_mm_mul_ps(d, sv[jj]), dxb);
                            __m128 wm = _mm_mul_ps(_mm_xor_ps(_mm_mul_ps(dmin, mv[jj]), neg), dxb);
                            acc = _mm_fmadd_ps(ws, _mm_cvtepi32_ps(s[hh]), acc);
                            acc = _mm_fmadd_ps(wm, _mm_set1_ps(sum[b]), acc);
                        }
                    }
                }
            }
            rows4_store(&q, acc, y + (size_t)t * (size_t)ldy + (size_t)r);
        }
    }
}

/* The AVX2 K-type panels (tp_qpanel group_rows 8): a super-block
 * of eight rows with the scales split out of the file's packing and set
 * sub-block-major, so the kernel reads sub-block j's eight scales as one
 * 8-byte load where the file path unpacks four rows' bit fields and
 * transposes them every super-block. Eight rows in the lanes of a 256-bit
 * accumulator: half the float work of four, and two of the rows' chains
 * of multiply-adds per instruction. Same quants, same float products in
 * the same order as the file path: the same bits.
 *
 * Q4_K (ROWS8_Q4K_BLOCK): f16 d[8], f16 -dmin[8] (negating is exact, and
 * (-dmin) * m is -(dmin * m) to the bit), u8 sc[8 sub][8 rows], u8
 * m[8][8], then per 64 columns j 256 bytes of nibbles: the file's
 * qs[32 j..32 j + 31] of the eight rows interleaved four bytes at a time,
 * as Q4_0's panel (ROWS8_Q40_BLOCK): row k's qs[32 j + 4 i..] in dword
 * lane k of register i, so a sub-block's eight row sums come out in their
 * lanes without horizontal adds. Q5_K (ROWS8_Q5K_BLOCK): Q4_K's block, then
 * the rows' qh[32] interleaved the same way (the fifth bits of register
 * i's quants in register i). Q6_K (ROWS8_Q6K_BLOCK): f16 d[8], int8
 * sc[16][8], then per 128 columns h the eight rows' ql[64 h..64 h + 63]
 * (512 bytes) and qh[32 h..32 h + 31] (256), each interleaved so: its
 * half sub-blocks' row sums in their lanes too (row-major rows took 20 of
 * a chunk's 45 instructions a token to sum across lanes). Both as big as
 * the file's, but for Q4_K's and Q5_K's 32 bytes (unpacked scales: 2.8 %
 * and 2.3 %). */
#define ROWS8_Q4K_BLOCK 1184
#define ROWS8_Q5K_BLOCK 1440
#define ROWS8_Q6K_BLOCK 1680

/* Eight bytes (unsigned or signed) as eight floats. */
__attribute__((target("avx2"), always_inline)) static inline __m256 u8x8_at(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

__attribute__((target("avx2,f16c"), always_inline)) static inline __m256 half8_at(const uint8_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* One block's exact integer sums s, scaled: acc + (d * dx) * s, the
 * scalar path's multiply-add. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 block_fma(__m256 acc, __m256 d, float dx,
                                                                                __m256i s)
{
    return _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx)), _mm256_cvtepi32_ps(s), acc);
}

/* Lanes [lo, hi) of a group's eight results to y (row 8 g + k at y[k]). */
__attribute__((target("avx2"), always_inline)) static inline void rows8_store(__m256 acc, float *y, int lo, int hi)
{
    if (lo == 0 && hi == 8) {
        _mm256_storeu_ps(y, acc);
        return;
    }
    float v[8];
    _mm256_storeu_ps(v, acc);
    memcpy(y + lo, v + lo, sizeof(float) * (size_t)(hi - lo));
}

/* A tile's nt tokens' results from t0 (panel kernels: row0's group). */
__attribute__((target("avx2"), always_inline)) static inline void
rows8_store_tile(const __m256 acc[TOK_TILE], int nt, float *y, int ldy, int t0, int row0, int lo, int hi)
{
    #pragma GCC unroll 4
    for (int tt = 0; tt < nt; tt++)
        rows8_store(acc[tt], y + (size_t)(t0 + tt) * (size_t)ldy + (size_t)row0, lo, hi);
}

/* Eight rows' exact sums over 32 columns, row k in lane k: w[r] holds
 * the rows' unsigned quants of columns 4r..4r + 3, row k's in dword lane
 * k, and x's quad r is broadcast to every lane. span (a constant: 8 or 4)
 * maddubs are summed as int16 before widening: for 4-bit quants (at most
 * 15) pairs are at most 2 * 15 * 127 and eight sum to 30480; 5-bit ones
 * (at most 31) take four at a time (31496). */
__attribute__((target("avx2"), always_inline)) static inline __m256i rows8_dot32(const __m256i w[8], const int8_t *x,
                                                                              const int span)
{
    __m256i s = _mm256_setzero_si256();
    #pragma GCC unroll 2
    for (int r0 = 0; r0 < 8; r0 += span) {
        __m256i s16 = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int r = r0; r < r0 + span; r++) {
            int32_t xr;
            memcpy(&xr, x + 4 * r, 4);
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[r], _mm256_set1_epi32(xr)));
        }
        __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
        s = r0 ? _mm256_add_epi32(s, s32) : s32;
    }
    return s;
}

/* Q4_0's AVX2 panel (tp_qpanel group_rows 8): a block of eight rows is
 * their f16 scales d[8], then four registers, row k's qs[4j..4j+3] in
 * dword lane k of register j (the low nibbles are columns 4j.., the high
 * ones 16 + 4j..). So each row's integer sum over the block comes out in
 * its own lane with no horizontal adds (rows8_dot32): about two thirds of
 * the file path's instructions a block and row, which bound Q4_0's decode
 * on AVX2; the bytes are the file's. */
#define ROWS8_Q40_BLOCK 144

/* Q4_0 from its panel, nt tokens from t0 (a constant in each instantiation,
 * at most TOK_TILE). Lanes of a group outside [lo, hi) are computed and not
 * stored. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
q40_panel_tile(const uint8_t *grp, pf_run *pf, const tp_qact *a, float *y, int ldy, int row0, int lo, int hi, int t0,
               const int nt)
{
    int cols = a->cols, nb = cols / 32;
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256 acc[TOK_TILE];
    #pragma GCC unroll 4
    for (int tt = 0; tt < nt; tt++)
        acc[tt] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = grp + (size_t)b * ROWS8_Q40_BLOCK;
        pf_run_to(pf, ROWS8_Q40_BLOCK * (size_t)(b + 1));
        __m256 d = half8_at(blk);
        __m256i w[8]; /* low nibbles: columns 4j..; high: 16 + 4j.. = 4 (j + 4).. */
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i qq = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j));
            w[j] = _mm256_and_si256(qq, low);
            w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(qq, 4), low);
        }
        #pragma GCC unroll 4
        for (int tt = 0; tt < nt; tt++) {
            size_t t = (size_t)(t0 + tt), tb = t * (size_t)nb + (size_t)b;
            __m256i s = _mm256_add_epi32(rows8_dot32(w, a->q + t * (size_t)cols + 32 * (size_t)b, 8),
                                         _mm256_set1_epi32(8 * a->nsum32[tb]));
            acc[tt] = block_fma(acc[tt], d, a->dx[tb], s);
        }
    }
    rows8_store_tile(acc, nt, y, ldy, t0, row0, lo, hi);
}

PANEL_TILES(q40_panel, q40_panel_tile)

/* Q8_0's AVX2 panel (tp_qpanel group_rows 8), as Q4_0's: f16 d[8], then
 * eight registers, row k's q[4j..4j + 3] in dword lane k of register j.
 * The quants are signed and maddubs takes one unsigned operand: |q| meets
 * x carrying q's sign (pairs at most 2 * 128 * 127; x is never -128), so
 * each register's products are widened on their own. Registers outside,
 * tokens inside: |q| is made once for all the tokens. */
#define ROWS8_Q80_BLOCK 272

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
q80_panel_tile(const uint8_t *grp, pf_run *pf, const tp_qact *a, float *y, int ldy, int row0, int lo, int hi, int t0,
               const int nt)
{
    int cols = a->cols, nb = cols / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TOK_TILE];
    #pragma GCC unroll 4
    for (int tt = 0; tt < nt; tt++)
        acc[tt] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = grp + (size_t)b * ROWS8_Q80_BLOCK;
        pf_run_to(pf, ROWS8_Q80_BLOCK * (size_t)(b + 1));
        __m256i s[TOK_TILE];
        #pragma GCC unroll 4
        for (int tt = 0; tt < nt; tt++)
            s[tt] = _mm256_setzero_si256();
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j)), u = _mm256_sign_epi8(q, q);
            #pragma GCC unroll 4
            for (int tt = 0; tt < nt; tt++) {
                int32_t xr;
                memcpy(&xr, a->q + (size_t)(t0 + tt) * (size_t)cols + 32 * (size_t)b + 4 * (size_t)j, 4);
                __m256i p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(_mm256_set1_epi32(xr), q));
                s[tt] = _mm256_add_epi32(s[tt], _mm256_madd_epi16(p, ones));
            }
        }
        __m256 d = half8_at(blk);
        #pragma GCC unroll 4
        for (int tt = 0; tt < nt; tt++)
            acc[tt] = block_fma(acc[tt], d, a->dx[(size_t)(t0 + tt) * (size_t)nb + (size_t)b], s[tt]);
    }
    rows8_store_tile(acc, nt, y, ldy, t0, row0, lo, hi);
}

PANEL_TILES(q80_panel, q80_panel_tile)

__attribute__((target("avx2,fma,f16c"))) static void qrows_legacy_avx2(const tp_wmat *w, const tp_qact *a, float *y,
                                                                      int ldy, int r0, int r1)
{
    switch (w->type) {
    case TP_GGML_Q8_0:
        if (w->panel && w->panel->group_rows == 8)
            panel_groups(w, a, y, ldy, r0, r1, 8, q80_panel_tiles);
        else
            legacy_rows(w, a, y, ldy, r0, r1, LEG_Q8_0);
        break;
    case TP_GGML_Q4_0:
        if (w->panel && w->panel->group_rows == 8)
            panel_groups(w, a, y, ldy, r0, r1, 8, q40_panel_tiles);
        else
            legacy_rows(w, a, y, ldy, r0, r1, LEG_Q4_0);
        break;
    case TP_GGML_Q4_1: legacy_rows(w, a, y, ldy, r0, r1, LEG_Q4_1); break;
    case TP_GGML_Q5_0: legacy_rows(w, a, y, ldy, r0, r1, LEG_Q5_0); break;
    case TP_GGML_Q5_1: legacy_rows(w, a, y, ldy, r0, r1, LEG_Q5_1); break;
    default: break;
    }
}

/* Q4_K (five false) or Q5_K from its panel for nt tokens from t0 (both
 * constants in each instantiation, nt at most TOK_TILE). A 64-column
 * chunk is two sub-blocks, low nibbles then high: each sub-block's eight
 * registers made ready once for all the tokens, which take it in their
 * own order (sub-block by sub-block); each row's sum in its lane
 * (rows8_dot32). Q5_K's block (ROWS8_Q5K_BLOCK) is Q4_K's, then the
 * eight rows' qh[32] interleaved as the nibbles are: bit sub of its
 * register r is the fifth bit of the quants in register r. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
k45_panel_tile(const uint8_t *grp, pf_run *pf, const tp_qact *a, float *y, int ldy, int row0, int lo, int hi, int t0,
               const int nt, const bool five)
{
    int cols = a->cols, nb = cols / 32, nsb = cols / 256;
    const size_t bb = five ? ROWS8_Q5K_BLOCK : ROWS8_Q4K_BLOCK;
    const __m256i low = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
    __m256 acc[TOK_TILE];
    #pragma GCC unroll 4
    for (int tt = 0; tt < nt; tt++)
        acc[tt] = _mm256_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const uint8_t *sb = grp + (size_t)i * bb;
        pf_run_to(pf, bb * (size_t)(i + 1));
        __m256 d = half8_at(sb), nm = half8_at(sb + 16);
        for (int sub = 0; sub < 8; sub++) {
            const uint8_t *qs = sb + 160 + 256 * (sub / 2);
            __m256i wq[8];
            #pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                __m256i qq = _mm256_loadu_si256((const __m256i *)(qs + 32 * r));
                wq[r] = _mm256_and_si256(sub % 2 ? _mm256_srli_epi16(qq, 4) : qq, low);
                if (five) { /* bit sub of each byte to bit 4: within the byte either way */
                    __m256i u = _mm256_loadu_si256((const __m256i *)(sb + ROWS8_Q4K_BLOCK + 32 * r));
                    u = sub <= 4 ? _mm256_slli_epi16(u, 4 - sub) : _mm256_srli_epi16(u, sub - 4);
                    wq[r] = _mm256_or_si256(wq[r], _mm256_and_si256(u, bit4));
                }
            }
            __m256 ws = _mm256_mul_ps(d, u8x8_at(sb + 32 + 8 * sub));
            __m256 wm = _mm256_mul_ps(nm, u8x8_at(sb + 96 + 8 * sub));
            #pragma GCC unroll 4
            for (int tt = 0; tt < nt; tt++) {
                size_t t = (size_t)(t0 + tt), tb = t * (size_t)nb + 8 * (size_t)i + (size_t)sub;
                __m256i s = rows8_dot32(wq, a->q + t * (size_t)cols + 256 * (size_t)i + 32 * (size_t)sub, five ? 4 : 8);
                __m256 dxb = _mm256_set1_ps(a->dx[tb]);
                acc[tt] = _mm256_fmadd_ps(_mm256_mul_ps(ws, dxb), _mm256_cvtepi32_ps(s), acc[tt]);
                acc[tt] = _mm256_fmadd_ps(_mm256_mul_ps(wm, dxb), _mm256_set1_ps(a->sum[tb]), acc[tt]);
            }
        }
    }
    rows8_store_tile(acc, nt, y, ldy, t0, row0, lo, hi);
}

/* Q6_K from its panel. A 128-column half h is four 32-column chunks c:
 * ql register r + 8 (c & 1), its low nibbles for c < 2 and high ones
 * after, with qh register r's bits 2c..2c + 1 as bits 4..5, are row k's
 * quants (q + 32, at most 63) of the chunk's columns 4r..4r + 3 in lane k.
 * Registers 0..3 are the chunk's first 16-column sub-block, 4..7 its
 * second: two maddubs pairs summed stay inside int16 (2 * 2 * 63 * 127). */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
q6k_panel_tile(const uint8_t *grp, pf_run *pf, const tp_qact *a, float *y, int ldy, int row0, int lo, int hi, int t0,
               const int nt)
{
    int cols = a->cols, nb = cols / 32, nsb = cols / 256;
    const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
    __m256 acc[TOK_TILE];
    #pragma GCC unroll 4
    for (int tt = 0; tt < nt; tt++)
        acc[tt] = _mm256_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const uint8_t *sb = grp + (size_t)i * ROWS8_Q6K_BLOCK;
        pf_run_to(pf, ROWS8_Q6K_BLOCK * (size_t)(i + 1));
        __m256 d = half8_at(sb);
        for (int h = 0; h < 2; h++)
            #pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                int col = 256 * i + 128 * h + 32 * c, b = col / 32;
                const uint8_t *ql = sb + 144 + 768 * h + 256 * (c & 1), *qh = sb + 144 + 768 * h + 512;
                __m256i wq[8];
                #pragma GCC unroll 8
                for (int r = 0; r < 8; r++) {
                    __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * r));
                    __m256i u = _mm256_loadu_si256((const __m256i *)(qh + 32 * r));
                    __m256i n = _mm256_and_si256(c >= 2 ? _mm256_srli_epi16(l, 4) : l, low);
                    /* qh's bits 2c..2c + 1 to bits 4..5: within each byte either way */
                    __m256i hb = c < 2 ? _mm256_slli_epi16(u, 4 - 2 * c) : c == 2 ? u : _mm256_srli_epi16(u, 2);
                    wq[r] = _mm256_or_si256(n, _mm256_and_si256(hb, two));
                }
                int j = 8 * h + 2 * c;
                __m256 w0 = _mm256_mul_ps(d, i8x8_ps((const int8_t *)sb + 16 + 8 * j));
                __m256 w1 = _mm256_mul_ps(d, i8x8_ps((const int8_t *)sb + 24 + 8 * j));
                #pragma GCC unroll 4
                for (int tt = 0; tt < nt; tt++) {
                    size_t t = (size_t)(t0 + tt), tb = t * (size_t)nb + (size_t)b;
                    const int8_t *x = a->q + t * (size_t)cols + (size_t)col;
                    __m256i s[4];
                    #pragma GCC unroll 4
                    for (int p = 0; p < 4; p++) {
                        int32_t x0, x1;
                        memcpy(&x0, x + 8 * p, 4);
                        memcpy(&x1, x + 8 * p + 4, 4);
                        s[p] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(wq[2 * p], _mm256_set1_epi32(x0)),
                                                                  _mm256_maddubs_epi16(wq[2 * p + 1], _mm256_set1_epi32(x1))),
                                                 ones);
                    }
                    /* q - 32: 32 x each 16-column half's quant sum off (nsum16 is minus it) */
                    __m256i s0 = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_set1_epi32(32 * a->nsum16[2 * tb]));
                    __m256i s1 = _mm256_add_epi32(_mm256_add_epi32(s[2], s[3]), _mm256_set1_epi32(32 * a->nsum16[2 * tb + 1]));
                    __m256 dxb = _mm256_set1_ps(a->dx[tb]);
                    acc[tt] = _mm256_fmadd_ps(_mm256_mul_ps(w0, dxb), _mm256_cvtepi32_ps(s0), acc[tt]);
                    acc[tt] = _mm256_fmadd_ps(_mm256_mul_ps(w1, dxb), _mm256_cvtepi32_ps(s1), acc[tt]);
                }
            }
    }
    rows8_store_tile(acc, nt, y, ldy, t0, row0, lo, hi);
}

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
q4k_panel_tile(const uint8_t *grp, pf_run *pf, const tp_qact *a, float *y, int ldy, int row0, int lo, int hi, int t0,
               const int nt)
{
    k45_panel_tile(grp, pf, a, y, ldy, row0, lo, hi, t0, nt, false);
}

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
q5k_panel_tile(const uint8_t *grp, pf_run *pf, const tp_qact *a, float *y, int ldy, int row0, int lo, int hi, int t0,
               const int nt)
{
    k45_panel_tile(grp, pf, a, y, ldy, row0, lo, hi, t0, nt, true);
}

PANEL_TILES(q4k_panel, q4k_panel_tile)
PANEL_TILES(q5k_panel, q5k_panel_tile)
PANEL_TILES(q6k_panel, q6k_panel_tile)

__attribute__((target("avx2,fma,f16c"))) static void qrows_k_avx2(const tp_wmat *w, const tp_qact *a, float *y,
                                                                 int ldy, int r0, int r1)
{
    bool panel8 = w->panel && w->panel->group_rows == 8;
    if (panel8)
        panel_groups(w, a, y, ldy, r0, r1, 8,
                     w->type == TP_GGML_Q6_K   ? q6k_panel_tiles
                     : w->type == TP_GGML_Q5_K ? q5k_panel_tiles
                                               : q4k_panel_tiles);
    else if (w->type == TP_GGML_Q6_K)
        k_rows(w, a, y, ldy, r0, r1, 6);
    else if (w->type == TP_GGML_Q5_K)
        k_rows(w, a, y, ldy, r0, r1, 5);
    else
        k_rows(w, a, y, ldy, r0, r1, 4);
}

/* F16/BF16 weights converted exactly (vcvtph2ps; a bf16 is the top half
 * of its float), 4 rows at a time (rows4) for 8 independent FMA chains. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256 half8_avx2(const uint8_t *p, bool bf)
{
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return bf ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

/* One row's result from its two 8-lane chains (columns k % 16 < 8 in lo):
 * the columns past the last whole 16 as the scalar path, then quant.h's
 * tree, as reduce16. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline float
f16_finish(__m256 lo, __m256 hi, const uint8_t *row, const float *x, int full, int cols, const bool bf)
{
    float acc[16];
    _mm256_storeu_ps(acc, lo);
    _mm256_storeu_ps(acc + 8, hi);
    for (int k = full; k < cols; k++) {
        uint16_t h;
        memcpy(&h, row + 2 * (size_t)k, 2);
        float wk = bf ? tp_bf16_to_f32(h) : half_at(row + 2 * (size_t)k);
        acc[k % 16] = fmaf(x[k], wk, acc[k % 16]);
    }
    __m256 s8 = _mm256_add_ps(_mm256_loadu_ps(acc), _mm256_loadu_ps(acc + 8));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(s2) + _mm_cvtss_f32(_mm_shuffle_ps(s2, s2, 1));
}

/* Four rows' results from their two chains each (lo[i], hi[i]: row i), when
 * the columns end on a whole 16: f16_finish's tree (lanes j + (j + 8),
 * then j + (j + 4), then 0 + 2 and 1 + 3, then those two) for the four
 * at once, the same additions of the same pairs; row i in lane i. */
__attribute__((target("avx2"), always_inline)) static inline __m128 f16_finish4(const __m256 lo[4], const __m256 hi[4])
{
    __m256 x0 = _mm256_add_ps(lo[0], hi[0]), x1 = _mm256_add_ps(lo[1], hi[1]);
    __m256 x2 = _mm256_add_ps(lo[2], hi[2]), x3 = _mm256_add_ps(lo[3], hi[3]);
    /* [s4 of row 0 | s4 of row 1], [row 2 | row 3] */
    __m256 p01 = _mm256_add_ps(_mm256_permute2f128_ps(x0, x1, 0x20), _mm256_permute2f128_ps(x0, x1, 0x31));
    __m256 p23 = _mm256_add_ps(_mm256_permute2f128_ps(x2, x3, 0x20), _mm256_permute2f128_ps(x2, x3, 0x31));
    /* [u0 v0 u2 v2 | u1 v1 u3 v3]: u = s4[0] + s4[2], v = s4[1] + s4[3] */
    __m256 uv = _mm256_add_ps(_mm256_shuffle_ps(p01, p23, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(p01, p23, _MM_SHUFFLE(3, 2, 3, 2)));
    /* [r0 r2 r0 r2 | r1 r3 r1 r3]: r = u + v */
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(uv, uv, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(uv, uv, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
}

/* A group's results for one token (x its activations) to yr[0..q->n):
 * four rows at once when the columns end on a whole 16, else row by row
 * (the tail and the tree: f16_finish). The same bits either way. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
f16_store_rows(const rows4 *q, const __m256 lo[4], const __m256 hi[4], const float *x, int cols, float *yr,
               const bool bf)
{
    int full = cols / 16 * 16;
    if (q->n == 4 && full == cols) {
        _mm_storeu_ps(yr, f16_finish4(lo, hi));
        return;
    }
    for (int i = 0; i < q->n; i++)
        yr[i] = f16_finish(lo[i], hi[i], q->p[i], x, full, cols, bf);
}

/* Several tokens (prefill, batched decode): a group's four rows by nt
 * tokens from t0 (nt a constant, at most 3) over columns [k0, k1), one of a
 * row's two 8-lane chains at a time (half: columns k % 16 < 8, or the
 * others), so that twelve accumulators, a converted row register and the
 * tokens' three x registers fit the sixteen. Each x load and each
 * conversion then serves three or four multiply-adds. acc carries the
 * chains from the columns before k0: each (row, token, half) keeps its
 * chain whatever the column ranges, so the same bits. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
f16_tile(const rows4 *q, const tp_qact *a, int t0, const int nt, int half, int k0, int k1, __m256 acc[4][3],
         const bool bf)
{
    const float *x = a->x + (size_t)t0 * (size_t)a->ldx + 8 * half;
    size_t ldx = (size_t)a->ldx;
    __m256 c[4][3]; /* in registers for the loop: acc is memory */
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        #pragma GCC unroll 3
        for (int tt = 0; tt < nt; tt++)
            c[i][tt] = k0 ? acc[i][tt] : _mm256_setzero_ps();
    size_t o = (size_t)k0 / 16 * q->stride + 16 * (size_t)half;
    for (int k = k0; k < k1; k += 16, o += q->stride) {
        __m256 xv[3];
        #pragma GCC unroll 3
        for (int tt = 0; tt < nt; tt++)
            xv[tt] = _mm256_loadu_ps(x + (size_t)tt * ldx + k);
        #pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m256 wv = half8_avx2(q->p[i] + o, bf);
            #pragma GCC unroll 3
            for (int tt = 0; tt < nt; tt++)
                c[i][tt] = _mm256_fmadd_ps(xv[tt], wv, c[i][tt]);
        }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        #pragma GCC unroll 3
        for (int tt = 0; tt < nt; tt++)
            acc[i][tt] = c[i][tt];
}

/* A tile's chains: [half][row][token]. */
typedef struct f16_acc {
    __m256 c[2][4][3];
} f16_acc;

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
f16_tile_cols(const rows4 *q, const tp_qact *a, int t0, const int nt, int k0, int k1, f16_acc *acc, const bool bf)
{
    f16_tile(q, a, t0, nt, 0, k0, k1, acc->c[0], bf);
    f16_tile(q, a, t0, nt, 1, k0, k1, acc->c[1], bf);
}

/* Tokens a block (F16_TOKENS) and columns a pass (F16_COLS). A tile's
 * reads over F16_COLS columns, its four rows (8 KB) and three tokens' x
 * (12 KB), stay in L1 for the second half and the next tile, where whole
 * rows of a wider matrix did not (ffn_down's 2048 columns: 16 KB of rows
 * and 24 KB of x a tile). The chains wait in acc between passes; a
 * narrower matrix is one pass. */
#define F16_TOKENS 48
#define F16_COLS 1024

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
f16_block(const rows4 *q, const tp_qact *a, float *y, int ldy, int r, int t0, int t1, const bool bf)
{
    f16_acc acc[F16_TOKENS / 3]; /* the first pass starts the chains */
    int full = a->cols / 16 * 16, tiles = (t1 - t0 + 2) / 3;
    for (int k0 = 0; k0 < full || k0 == 0; k0 += F16_COLS) { /* one pass even with no whole 16 */
        int k1 = full - k0 < F16_COLS ? full : k0 + F16_COLS;
        for (int i = 0; i < tiles; i++) {
            int t = t0 + 3 * i, nt = t1 - t < 3 ? t1 - t : 3;
            if (nt == 3)
                f16_tile_cols(q, a, t, 3, k0, k1, &acc[i], bf);
            else if (nt == 2)
                f16_tile_cols(q, a, t, 2, k0, k1, &acc[i], bf);
            else
                f16_tile_cols(q, a, t, 1, k0, k1, &acc[i], bf);
            if (k1 == full) /* the tile's last pass */
                for (int tt = 0; tt < nt; tt++) {
                    const __m256 lo[4] = {acc[i].c[0][0][tt], acc[i].c[0][1][tt], acc[i].c[0][2][tt], acc[i].c[0][3][tt]};
                    const __m256 hi[4] = {acc[i].c[1][0][tt], acc[i].c[1][1][tt], acc[i].c[1][2][tt], acc[i].c[1][3][tt]};
                    f16_store_rows(q, lo, hi, a->x + (size_t)(t + tt) * (size_t)a->ldx, a->cols,
                                   y + (size_t)(t + tt) * (size_t)ldy + (size_t)r, bf);
                }
        }
    }
}

/* bf is a constant in each instantiation: no branch in the inner loop,
 * and the 8 accumulators stay in registers. One token (decode) takes four
 * rows a pass; more, f16_block's tiles of three. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
f16_rows_avx2(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1, const bool bf)
{
    int cols = w->cols, full = cols / 16 * 16;
    if (a->n_tok > 1) {
        /* Groups inside the block of tokens: its activations (F16_TOKENS
         * x cols floats) stay in L2 while the range's groups stream past.
         * Groups outside swept every token's x once a group, more than L2
         * holds in a long prompt: by 128 tokens, 2048 x 768 65 -> 82
         * GFLOP/s, 768 x 2048 65 -> 76 (Zen 3, one thread). */
        for (int t = 0; t < a->n_tok; t += F16_TOKENS)
            for (int r = r0; r < r1; r += 4) {
                rows4 q = rows4_at(w, r, r1, 32); /* a block: 16 columns */
                pf_run_to(&q.pf, 128 * (size_t)(full / 16));
                f16_block(&q, a, y, ldy, r, t, a->n_tok - t < F16_TOKENS ? a->n_tok : t + F16_TOKENS, bf);
            }
        return;
    }
    for (int r = r0; r < r1; r += 4) {
        rows4 q = rows4_at(w, r, r1, 32); /* a block: 16 columns */
        if (w->panel && w->panel->group_rows == 4) /* the group's rows are one stream */
            q.pf = pf_run_ahead(q.p[0], F16_PANEL_AHEAD);
        const uint8_t *const *row = q.p;
        const float *x = a->x;
        __m256 l0 = _mm256_setzero_ps(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;
        for (int k = 0; k < full; k += 16) {
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
            size_t o = (size_t)(k / 16) * q.stride;
            pf_run_to(&q.pf, 128 * (size_t)(k / 16 + 1));
            l0 = _mm256_fmadd_ps(x0, half8_avx2(row[0] + o, bf), l0);
            h0 = _mm256_fmadd_ps(x1, half8_avx2(row[0] + o + 16, bf), h0);
            l1 = _mm256_fmadd_ps(x0, half8_avx2(row[1] + o, bf), l1);
            h1 = _mm256_fmadd_ps(x1, half8_avx2(row[1] + o + 16, bf), h1);
            l2 = _mm256_fmadd_ps(x0, half8_avx2(row[2] + o, bf), l2);
            h2 = _mm256_fmadd_ps(x1, half8_avx2(row[2] + o + 16, bf), h2);
            l3 = _mm256_fmadd_ps(x0, half8_avx2(row[3] + o, bf), l3);
            h3 = _mm256_fmadd_ps(x1, half8_avx2(row[3] + o + 16, bf), h3);
        }
        const __m256 lo[4] = {l0, l1, l2, l3}, hi[4] = {h0, h1, h2, h3};
        f16_store_rows(&q, lo, hi, x, cols, y + r, bf);
    }
}

__attribute__((target("avx2,fma,f16c"))) static void qrows_f16_avx2(const tp_wmat *w, const tp_qact *a, float *y,
                                                                    int ldy, int r0, int r1)
{
    if (w->type == TP_GGML_BF16)
        f16_rows_avx2(w, a, y, ldy, r0, r1, true);
    else
        f16_rows_avx2(w, a, y, ldy, r0, r1, false);
}

/* F16C through CPUID: clang (the fuzz build) has no "f16c" for
 * __builtin_cpu_supports, gcc does; both ship cpuid.h. */
bool tp_quant_have_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* The AVX2 kernels (AVX2, FMA and F16C: tp_isa.h's level). */
static bool have_avx2(void) { return tp_isa_active() >= TP_ISA_AVX2; }

TP_SCALAR_CLONES void tp_qrows_f16_scalar(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    bool bf = w->type == TP_GGML_BF16;
    int cols = w->cols;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int t0 = 0; t0 < a->n_tok; t0 += SCALAR_TOKENS) {
            int nt = a->n_tok - t0 < SCALAR_TOKENS ? a->n_tok - t0 : SCALAR_TOKENS;
            float acc[SCALAR_TOKENS][16] = {{0}};
            for (int k0 = 0; k0 < cols; k0 += 256) {
                int kn = cols - k0 < 256 ? cols - k0 : 256;
                float wf[256];
                for (int k = 0; k < kn; k++) {
                    uint16_t h;
                    memcpy(&h, row + 2 * (size_t)(k0 + k), 2);
                    wf[k] = bf ? tp_bf16_to_f32(h) : tp_f16_to_f32(h);
                }
                for (int j = 0; j < nt; j++) {
                    const float *x = a->x + (size_t)(t0 + j) * (size_t)a->ldx + k0;
                    for (int k = 0; k < kn; k++)   /* k0 is a multiple of 16: lane (k0 + k) % 16 */
                        acc[j][k % 16] = fmaf(x[k], wf[k], acc[j][k % 16]);
                }
            }
            for (int j = 0; j < nt; j++)
                y[(size_t)(t0 + j) * (size_t)ldy + (size_t)r] = reduce16(acc[j]);
        }
    }
}

/* The AVX-512 kernels of the typed matrices: VNNI too. */
static bool have_avx512(void) { return tp_isa_have_vnni(); }

void tp_qmatmul_rows(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1, bool simd)
{
    if (r0 >= r1 || a->n_tok <= 0)
        return;
    bool avx512 = simd && have_avx512(), avx2 = simd && !avx512 && have_avx2();
    switch (w->type) {
    case TP_GGML_F16:
    case TP_GGML_BF16:
        if (avx512)
            tp_qrows_f16_avx512(w, a, y, ldy, r0, r1);
        else if (avx2)
            qrows_f16_avx2(w, a, y, ldy, r0, r1);
        else
            tp_qrows_f16_scalar(w, a, y, ldy, r0, r1);
        return;
    case TP_GGML_Q8_0: case TP_GGML_Q4_0: case TP_GGML_Q4_1: case TP_GGML_Q5_0: case TP_GGML_Q5_1:
        if (avx512 && w->panel && w->panel->group_rows == 16) {
            if (w->type == TP_GGML_Q8_0)
                tp_qrows_q8_avx512(w, a, y, ldy, r0, r1);
            else
                tp_qrows_q4_avx512(w, a, y, ldy, r0, r1);
            return;
        }
        if (simd && have_avx2()) {
            qrows_legacy_avx2(w, a, y, ldy, r0, r1);
            return;
        }
        break;
    case TP_GGML_Q4_K: case TP_GGML_Q5_K: case TP_GGML_Q6_K:
        if (avx512 && w->panel && w->panel->group_rows == 16) {
            tp_qrows_k_avx512(w, a, y, ldy, r0, r1);
            return;
        }
        if (simd && have_avx2()) {
            qrows_k_avx2(w, a, y, ldy, r0, r1);
            return;
        }
        break;
    case TP_GGML_MXFP4: /* from its panel of the level's rows; AVX2 without one reads the file's blocks */
        if (avx512 && w->panel && w->panel->group_rows == 16) {
            tp_qrows_mxfp4_avx512(w, a, y, ldy, r0, r1);
            return;
        }
        if (simd && have_avx2()) {
            if (w->panel && w->panel->group_rows == 8)
                tp_qrows_mxfp4_avx2_panel(w, a, y, ldy, r0, r1);
            else
                tp_qrows_mxfp4_avx2(w, a, y, ldy, r0, r1);
            return;
        }
        break;
    default:
        return;
    }
    qrows_int_scalar(w, a, y, ldy, r0, r1);
}

void tp_wmat_dequant_row(const tp_wmat *w, int r, float *out)
{
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
    int cols = w->cols;
    if (w->type == TP_GGML_F32 || w->type == TP_GGML_F16 || w->type == TP_GGML_BF16) {
        for (int k = 0; k < cols; k++) {
            uint16_t h;
            if (w->type == TP_GGML_F32) {
                memcpy(&out[k], row + 4 * (size_t)k, 4);
                continue;
            }
            memcpy(&h, row + 2 * (size_t)k, 2);
            out[k] = w->type == TP_GGML_F16 ? tp_f16_to_f32(h) : tp_bf16_to_f32(h);
        }
        return;
    }
    bool has_min;
    tp_qunpack_fn unpack = unpack_fn(w->type, &has_min);
    if (!unpack)
        return;
    for (int c = 0; c < (cols + 63) / 64; c++) {
        int8_t wq[64];
        float ws[16], wm[16];
        unpack(row, c, cols, wq, ws, wm);
        int n = cols - 64 * c >= 64 ? 64 : 32;
        for (int i = 0; i < n; i++) {
            float v = ws[i / 4] * (float)wq[i];
            out[64 * c + i] = has_min ? v + wm[i / 4] : v;
        }
    }
}

void tp_quant_row(uint32_t type, const float *x, int n, void *out)
{
    uint8_t *o = out;
    switch (type) {
    case TP_GGML_F32: memcpy(o, x, (size_t)n * 4); return;
    case TP_GGML_F16:
    case TP_GGML_BF16:
        for (int i = 0; i < n; i++) {
            uint16_t h = type == TP_GGML_F16 ? tp_f32_to_f16(x[i]) : tp_f32_to_bf16(x[i]);
            memcpy(o + 2 * (size_t)i, &h, 2);
        }
        return;
    case TP_GGML_Q8_0: tp_quantize_q8_0(x, n, o); return;
    case TP_GGML_Q4_0: tp_quantize_q4_0(x, n, o); return;
    case TP_GGML_Q4_1: tp_quantize_q4_1(x, n, o); return;
    case TP_GGML_Q5_0: tp_quantize_q5_0(x, n, o); return;
    case TP_GGML_Q5_1: tp_quantize_q5_1(x, n, o); return;
    case TP_GGML_Q4_K: tp_quantize_q4_k(x, n, o); return;
    case TP_GGML_Q5_K: tp_quantize_q5_k(x, n, o); return;
    case TP_GGML_Q6_K: tp_quantize_q6_k(x, n, o); return;
    case TP_GGML_MXFP4: tp_quantize_mxfp4(x, n, o); return;
    default: return;
    }
}

/* ---- panels (quant.h's layouts) ---- */

static tp_qpanel_fmt fmt_make(int bits, int sh, int sub, int has_min, int scale_bytes)
{
    return (tp_qpanel_fmt){bits, sh ? 1 << sh : 0, sub, has_min, scale_bytes, TP_QPANEL_QUANT_BYTES(bits)};
}

bool tp_qpanel_format(uint32_t type, tp_qpanel_fmt *f)
{
    switch (type) {
    case TP_GGML_Q8_0: *f = TP_QPANEL_APPLY(fmt_make, TP_QPANEL_Q8_0); return true;
    case TP_GGML_Q4_0: *f = TP_QPANEL_APPLY(fmt_make, TP_QPANEL_Q4_0); return true;
    case TP_GGML_Q5_0: *f = TP_QPANEL_APPLY(fmt_make, TP_QPANEL_Q5_0); return true;
    case TP_GGML_Q4_1: *f = TP_QPANEL_APPLY(fmt_make, TP_QPANEL_Q4_1); return true;
    case TP_GGML_Q5_1: *f = TP_QPANEL_APPLY(fmt_make, TP_QPANEL_Q5_1); return true;
    case TP_GGML_Q4_K: *f = TP_QPANEL_APPLY(fmt_make, TP_QPANEL_Q4_K); return true;
    case TP_GGML_Q5_K: *f = TP_QPANEL_APPLY(fmt_make, TP_QPANEL_Q5_K); return true;
    case TP_GGML_Q6_K: *f = TP_QPANEL_APPLY(fmt_make, TP_QPANEL_Q6_K); return true;
    default: return false;
    }
}

/* Scale number i of a panel block (after its quants), a half: v came from
 * one, so exact both ways. */
static void put_scale(const tp_qpanel_fmt *f, uint8_t *blk, int i, float v)
{
    uint16_t h = tp_f32_to_f16(v);
    memcpy(blk + f->quant_bytes + 2 * (size_t)i, &h, 2);
}

/* Row r's scales of the file's K super-block src into a head of n rows
 * (the AVX2 eight-row blocks, ROWS8_*, and the AVX-512 panels' heads,
 * TP_QPANEL_KHEAD): f16 d[n], then Q4_K's and Q5_K's f16 -dmin[n] (negating
 * is exact), u8 sc[8 sub-blocks][n] and u8 m[8][n], or Q6_K's int8
 * sc[16][n]. */
static void put_k_head(uint32_t type, const uint8_t *src, uint8_t *dst, int n, int r)
{
    if (type == TP_GGML_Q6_K) { /* ql[128], qh[64], sc[16], d */
        memcpy(dst + 2 * r, src + 208, 2);
        for (int j = 0; j < 16; j++)
            dst[2 * n + n * j + r] = src[192 + j];
        return;
    }
    uint16_t dmin;
    memcpy(dst + 2 * r, src, 2);
    memcpy(&dmin, src + 2, 2);
    dmin ^= 0x8000;
    memcpy(dst + 2 * n + 2 * r, &dmin, 2);
    uint64_t sc, m;
    q4k_scales(src + 4, &sc, &m);
    for (int j = 0; j < 8; j++) {
        dst[4 * n + n * j + r] = (uint8_t)(sc >> 8 * j);
        dst[12 * n + n * j + r] = (uint8_t)(m >> 8 * j);
    }
}

/* Row r (of 16 in its group) of block b into the group's panel bytes (a K
 * type's scales: put_k_head). */
static void panel_put_row(const tp_qpanel_fmt *f, uint8_t *blk, int r, const int8_t *wq, const float *ws,
                          const float *wm)
{
    for (int k = 0; k < 8; k++)
        for (int j = 0; j < 4; j++) {
            unsigned u = (unsigned)(wq[4 * k + j] + f->off);
            size_t byte = (size_t)(4 * r + j);
            if (f->bits == 8) {
                blk[64 * k + byte] = (uint8_t)u;
                continue;
            }
            blk[64 * (k / 2) + byte] |= (uint8_t)((u & 15) << (4 * (k % 2)));
            if (f->bits == 5 && (u & 16))
                blk[256 + 8 * k + byte / 8] |= (uint8_t)(1u << (byte % 8));
            if (f->bits == 6)
                blk[256 + 64 * (k / 4) + byte] |= (uint8_t)((u >> 4) << (2 * (k % 4)));
        }
    if (!f->scale_bytes)
        return;
    int n = 32 / f->sub; /* the sub-blocks' scales, then the min */
    for (int s = 0; s < n; s++)
        put_scale(f, blk, 16 * s + r, ws[s * f->sub / 4]);
    if (f->has_min)
        put_scale(f, blk, 16 * n + r, wm[0]);
}

/* Row k's n bytes of quants src into an eight-row interleaved layout at
 * dst: its bytes 4i..4i + 3 in dword lane k of the 32-byte register i. */
static void put_quads(uint8_t *dst, const uint8_t *src, size_t n, int k)
{
    for (size_t i = 0; i < n / 4; i++)
        memcpy(dst + 32 * i + 4 * (size_t)k, src + 4 * i, 4);
}

/* Row k of a group's super-block in the eight-row K layouts (ROWS8_*),
 * from the file's super-block src. */
static void rows8_put_k(uint32_t type, const uint8_t *src, uint8_t *blk, int k)
{
    put_k_head(type, src, blk, 8, k);
    if (type == TP_GGML_Q4_K || type == TP_GGML_Q5_K) { /* Q5_K: qh[32] between the scales and qs */
        bool five = type == TP_GGML_Q5_K;
        put_quads(blk + 160, src + (five ? 48 : 16), 128, k);
        if (five)
            put_quads(blk + ROWS8_Q4K_BLOCK, src + 16, 32, k);
        return;
    }
    for (int h = 0; h < 2; h++) { /* Q6_K */
        put_quads(blk + 144 + 768 * h, src + 64 * h, 64, k);
        put_quads(blk + 144 + 768 * h + 512, src + 128 + 32 * h, 32, k);
    }
}

/* Row k's file block src (fb bytes) into its place in block blk of a
 * group of an AVX2 panel (tp_qpanel, group_rows 4 or 8). */
static void avx2_put(uint32_t type, const uint8_t *src, size_t fb, uint8_t *blk, int k)
{
    if (type == TP_GGML_Q4_K || type == TP_GGML_Q5_K || type == TP_GGML_Q6_K) {
        rows8_put_k(type, src, blk, k);
    } else if (type == TP_GGML_Q4_0 || type == TP_GGML_Q8_0) { /* ROWS8_Q40_BLOCK, ROWS8_Q80_BLOCK */
        memcpy(blk + 2 * k, src, 2);
        put_quads(blk + 16, src + 2, fb - 2, k);
    } else {
        memcpy(blk + fb * (size_t)k, src, fb);
    }
}

/* A panel's shape: groups of group_rows rows, each blocks blocks of
 * block_bytes; file_block: the file's bytes behind one row's block (AVX2
 * only: a block there is one of the file's, or 16 columns of F16/BF16);
 * bytes in all. */
typedef struct panel_shape {
    int group_rows, blocks;
    size_t file_block, block_bytes, group_bytes, bytes;
} panel_shape;

/* Bytes of a block (super-block) of eight rows in the AVX2 layout of its
 * own that type has, or 0 for a type in the file's blocks of four rows. */
static size_t rows8_block_bytes(uint32_t type)
{
    switch (type) {
    case TP_GGML_Q4_K: return ROWS8_Q4K_BLOCK;
    case TP_GGML_Q5_K: return ROWS8_Q5K_BLOCK;
    case TP_GGML_Q6_K: return ROWS8_Q6K_BLOCK;
    case TP_GGML_Q4_0: return ROWS8_Q40_BLOCK;
    case TP_GGML_Q8_0: return ROWS8_Q80_BLOCK;
    default: return 0;
    }
}

/* False for a matrix without a panel on this CPU. */
static bool panel_geometry(const tp_wmat *w, tp_qpanel_fmt *f, panel_shape *sh)
{
    if (w->type == TP_GGML_MXFP4) { /* quant_mxfp4.c's panels: 16 rows a group, or 8 for AVX2 */
        if (!have_avx2() || w->cols % 32)
            return false;
        sh->group_rows = have_avx512() ? 16 : 8;
        sh->file_block = 0;
        sh->blocks = w->cols / 32;
        sh->block_bytes = 16 * (size_t)sh->group_rows;
        sh->group_bytes = tp_mxfp4_panel_group_bytes(sh->blocks, sh->group_rows);
        sh->bytes = sh->group_bytes * (size_t)((w->rows + sh->group_rows - 1) / sh->group_rows);
        return true;
    }
    if (!have_avx512()) { /* AVX2: a group's rows side by side, block by block */
        const tp_ggml_type_info *ti = tp_ggml_type(w->type);
        bool half = w->type == TP_GGML_F16 || w->type == TP_GGML_BF16;
        size_t rows8 = rows8_block_bytes(w->type);
        if (!have_avx2() || !ti || !tp_quant_type_ok(w->type) || (half && w->cols % 16))
            return false;
        sh->group_rows = rows8 ? 8 : 4;
        sh->file_block = half ? 32 : ti->block_bytes;
        sh->block_bytes = rows8 ? rows8 : 4 * sh->file_block;
        sh->blocks = (int)(w->row_bytes / sh->file_block);
        size_t groups = (size_t)((w->rows + sh->group_rows - 1) / sh->group_rows);
        /* whole cache lines, so the panel after it in a mapping starts on one */
        sh->group_bytes = sh->block_bytes * (size_t)sh->blocks;
        sh->bytes = (sh->group_bytes * groups + 63) / 64 * 64;
        return true;
    }
    if (!tp_qpanel_format(w->type, f))
        return false;
    sh->group_rows = 16;
    sh->file_block = 0;
    sh->block_bytes = f->quant_bytes + 16 * (size_t)f->scale_bytes * (size_t)(32 / f->sub + f->has_min);
    sh->blocks = w->cols / 32;
    sh->group_bytes = f->scale_bytes ? sh->block_bytes * (size_t)sh->blocks
                                     : TP_QPANEL_KSB_BYTES(f->bits) * (size_t)(w->cols / 256);
    sh->bytes = sh->group_bytes * (size_t)((w->rows + 15) / 16);
    return true;
}

/* Block b's quants in a group of a 16-row panel. */
static uint8_t *panel_block(const tp_qpanel_fmt *f, const tp_qpanel *p, uint8_t *grp, int b)
{
    if (f->scale_bytes)
        return grp + (size_t)b * p->block_bytes;
    return grp + (size_t)(b / 8) * TP_QPANEL_KSB_BYTES(f->bits) + TP_QPANEL_KHEAD + (size_t)(b % 8) * f->quant_bytes;
}

size_t tp_qpanel_bytes(const tp_wmat *w)
{
    tp_qpanel_fmt f;
    panel_shape sh;
    return panel_geometry(w, &f, &sh) ? sh.bytes : 0;
}

int tp_qpanel_build(tp_wmat *w, void *mem)
{
    tp_qpanel_fmt f;
    panel_shape sh;
    if (w->panel || !panel_geometry(w, &f, &sh))
        return 0;
    bool has_min;
    tp_qunpack_fn unpack = unpack_fn(w->type, &has_min);
    tp_qpanel *p = calloc(1, sizeof *p);
    if (!p)
        return TP_ENOMEM;
    p->type = w->type;
    p->group_rows = sh.group_rows;
    p->groups = (w->rows + sh.group_rows - 1) / sh.group_rows;
    p->blocks = sh.blocks;
    p->block_bytes = sh.block_bytes;
    p->group_bytes = sh.group_bytes;
    p->bytes = sh.bytes;
    if (!mem) { /* anonymous zeroed memory, page-aligned */
        mem = mmap(NULL, sh.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) {
            free(p);
            return TP_ENOMEM;
        }
        p->owned = true;
    }
    p->data = mem;
    if (w->type == TP_GGML_MXFP4) { /* rows past the last stay zero: code 0 */
        for (int r = 0; r < w->rows; r++)
            tp_mxfp4_panel_put_row(p->data + (size_t)(r / sh.group_rows) * p->group_bytes, p->blocks, sh.group_rows,
                                   r % sh.group_rows, (const uint8_t *)w->data + (size_t)r * w->row_bytes);
        w->panel = p;
        return 0;
    }
    if (sh.group_rows < 16) { /* AVX2; past the last row, the group's first row again */
        for (int g = 0; g < p->groups; g++)
            for (int k = 0; k < sh.group_rows; k++) {
                int r = sh.group_rows * g + k < w->rows ? sh.group_rows * g + k : sh.group_rows * g;
                const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
                for (int b = 0; b < p->blocks; b++)
                    avx2_put(w->type, row + sh.file_block * (size_t)b, sh.file_block,
                             p->data + (size_t)g * p->group_bytes + (size_t)b * sh.block_bytes, k);
            }
        w->panel = p;
        return 0;
    }
    for (int r = 0; r < w->rows; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        uint8_t *grp = p->data + (size_t)(r / 16) * p->group_bytes;
        for (int c = 0; c < (w->cols + 63) / 64; c++) {
            int8_t wq[64];
            float ws[16], wm[16];
            unpack(row, c, w->cols, wq, ws, wm);
            for (int h = 0; h < 2 && 64 * c + 32 * h < w->cols; h++)
                panel_put_row(&f, panel_block(&f, p, grp, 2 * c + h), r % 16, wq + 32 * h, ws + 8 * h, wm + 8 * h);
        }
        if (!f.scale_bytes) /* a K type's scales, as the file has them */
            for (int i = 0; i < w->cols / 256; i++)
                put_k_head(w->type, row + (size_t)i * tp_ggml_type(w->type)->block_bytes,
                           grp + (size_t)i * TP_QPANEL_KSB_BYTES(f.bits), 16, r % 16);
    }
    /* rows past the last: zero quants (u = off) and, for the K types, zero
     * scales, so they add nothing */
    for (int r = w->rows; r < 16 * p->groups; r++) {
        int8_t wq[32] = {0};
        float ws[8] = {0}, wm[8] = {0};
        uint8_t *grp = p->data + (size_t)(r / 16) * p->group_bytes;
        for (int b = 0; b < p->blocks; b++)
            panel_put_row(&f, panel_block(&f, p, grp, b), r % 16, wq, ws, wm);
    }
    w->panel = p;
    return 0;
}

typedef struct panel_work {
    const tp_qpanel_job *job;
    int n;
    uint8_t *base;
    atomic_int next, failed;
} panel_work;

static void *panel_worker(void *arg)
{
    panel_work *pw = arg;
    for (int i; (i = atomic_fetch_add(&pw->next, 1)) < pw->n;) {
        const tp_qpanel_job *j = &pw->job[pw->n - 1 - i];
        if (tp_qpanel_build(j->w, pw->base + j->off))
            atomic_store(&pw->failed, 1);
    }
    return NULL;
}

int tp_qpanel_build_jobs(const tp_qpanel_job *job, int n, uint8_t *base, int threads)
{
    panel_work pw = {job, n, base, 0, 0};
    int nt = threads - 1 < n - 1 ? threads - 1 : n - 1, started = 0;
    pthread_t *th = nt > 0 ? malloc(sizeof *th * (size_t)nt) : NULL;
    for (; th && started < nt; started++) /* fewer threads if some cannot start */
        if (pthread_create(&th[started], NULL, panel_worker, &pw))
            break;
    panel_worker(&pw);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    return atomic_load(&pw.failed) ? TP_ENOMEM : 0;
}

uint8_t *tp_qpanel_map(size_t len, size_t *len_out)
{
    size_t huge = (size_t)2 << 20;
    len = (len + huge - 1) / huge * huge;
    void *m = mmap(NULL, len + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1)), *end = (uint8_t *)m + len + huge;
    if (a > (uint8_t *)m)
        munmap(m, (size_t)(a - (uint8_t *)m));
    if (end > a + len)
        munmap(a + len, (size_t)(end - (a + len)));
#ifdef MADV_HUGEPAGE
    madvise(a, len, MADV_HUGEPAGE);
#endif
    *len_out = len;
    return a;
}

void tp_qpanel_free(tp_wmat *w)
{
    if (!w || !w->panel)
        return;
    if (w->panel->owned)
        munmap(w->panel->data, w->panel->bytes);
    free(w->panel);
    w->panel = NULL;
}
