/* Private to quant_*.c: the AVX-512 (VNNI) form of quant.h's canonical
 * order for integer types, instantiated per type by TP_QROWS_DEFINE. */
#ifndef TOKPIPE_FORWARD_QUANT_AVX_H
#define TOKPIPE_FORWARD_QUANT_AVX_H

#include "quant.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TP_QTARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
#define TP_QTB 8 /* tokens per tile: 8 accumulators + the unpacked chunk stay in registers */

static inline uint16_t tp_qrd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* v rounded half away from zero (roundf, as ggml's quantizers) and clamped
 * to lo..hi; NaN gives 0 (never an undefined conversion). */
static inline int tp_qround(float v, int lo, int hi)
{
    if (!(v == v))
        return 0;
    v = roundf(v);
    return v < (float)lo ? lo : v > (float)hi ? hi : (int)v;
}

/* The tree of quant.h: a[i] + a[i+8], then +4, +2, +1. */
TP_QTARGET static inline float tp_qreduce16(__m512 v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 a8 = _mm256_add_ps(lo, hi);
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
    __m128 a1 = _mm_add_ss(a2, _mm_shuffle_ps(a2, a2, 1));
    return _mm_cvtss_f32(a1);
}

TP_QTARGET static inline float tp_qh2f(const uint8_t *p)
{
    return _cvtsh_ss(tp_qrd16(p));
}

/* lanes 0..7 = a, 8..15 = b */
TP_QTARGET static inline __m512 tp_qhalves(float a, float b)
{
    return _mm512_mask_blend_ps((__mmask16)0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

/* UNPACK(row, c, full, &u, &ws, &wm): chunk c as unsigned quants u (the
 * signed quant plus 2^SH), lane scales ws and mins wm. full: 64 columns
 * (else 32: must not read past the row's first block of the chunk). */
#define TP_QROWS_DEFINE(NAME, UNPACK, SH, HASMIN)                                                          \
    TP_QTARGET static inline __attribute__((always_inline)) void NAME##_tile(                              \
        const uint8_t *row, int cols, const tp_qact *a, int t0, float *y, size_t ldy, const int TB)        \
    {                                                                                                      \
        __m512 acc[TP_QTB];                                                                                \
        for (int t = 0; t < TB; t++)                                                                       \
            acc[t] = _mm512_setzero_ps();                                                                  \
        int nch = (cols + 63) / 64;                                                                        \
        size_t lanes = (size_t)cols / 4;                                                                   \
        for (int c = 0; c < nch; c++) {                                                                    \
            int full = cols - 64 * c >= 64;                                                                \
            __mmask16 lm = full ? (__mmask16)0xffff : (__mmask16)0x00ff;                                   \
            __mmask64 bm = full ? ~0ull : 0xffffffffull;                                                   \
            __m512i u;                                                                                     \
            __m512 ws, wm = _mm512_setzero_ps();                                                           \
            UNPACK(row, c, full, &u, &ws, &wm);                                                            \
            for (int t = 0; t < TB; t++) {                                                                 \
                size_t tt = (size_t)(t0 + t);                                                              \
                __m512i xq = _mm512_maskz_loadu_epi8(bm, a->q + tt * (size_t)cols + 64 * (size_t)c);       \
                __m512 dx = _mm512_maskz_loadu_ps(lm, a->dl + tt * lanes + 16 * (size_t)c);                \
                __m512i xs = _mm512_maskz_loadu_epi32(lm, a->s4 + tt * lanes + 16 * (size_t)c);            \
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xq);                            \
                if (SH)                                                                                    \
                    p = _mm512_sub_epi32(p, _mm512_slli_epi32(xs, SH));                                    \
                acc[t] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(ws, dx), _mm512_cvtepi32_ps(p), acc[t], lm);  \
                if (HASMIN)                                                                                \
                    acc[t] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(wm, dx), _mm512_cvtepi32_ps(xs), acc[t],  \
                                                   lm);                                                    \
            }                                                                                              \
        }                                                                                                  \
        for (int t = 0; t < TB; t++)                                                                       \
            y[(size_t)t * ldy] = tp_qreduce16(acc[t]);                                                     \
    }                                                                                                      \
    TP_QTARGET static void NAME##_rows(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1) \
    {                                                                                                      \
        size_t ld = (size_t)ldy;                                                                           \
        for (int r = r0; r < r1; r++) {                                                                    \
            const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;                      \
            for (int t0 = 0; t0 < a->n_tok;) {                                                             \
                int tb = a->n_tok - t0 < TP_QTB ? a->n_tok - t0 : TP_QTB;                                  \
                float *yt = y + (size_t)t0 * ld + (size_t)r;                                               \
                switch (tb) {                                                                              \
                case 1: NAME##_tile(row, w->cols, a, t0, yt, ld, 1); break;                                \
                case 2: NAME##_tile(row, w->cols, a, t0, yt, ld, 2); break;                                \
                case 3: NAME##_tile(row, w->cols, a, t0, yt, ld, 3); break;                                \
                case 4: NAME##_tile(row, w->cols, a, t0, yt, ld, 4); break;                                \
                case 5: NAME##_tile(row, w->cols, a, t0, yt, ld, 5); break;                                \
                case 6: NAME##_tile(row, w->cols, a, t0, yt, ld, 6); break;                                \
                case 7: NAME##_tile(row, w->cols, a, t0, yt, ld, 7); break;                                \
                default: NAME##_tile(row, w->cols, a, t0, yt, ld, 8); break;                               \
                }                                                                                          \
                t0 += tb;                                                                                  \
            }                                                                                              \
        }                                                                                                  \
    }

#endif
