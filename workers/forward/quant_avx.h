/* Private to quant_*.c: the AVX-512 (VNNI) form of quant.h's canonical
 * order for integer types, instantiated per type by TP_QROWS_DEFINE. */
#ifndef TOKPIPE_FORWARD_QUANT_AVX_H
#define TOKPIPE_FORWARD_QUANT_AVX_H

#include "quant.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TP_QTARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
/* Decode streams the weights from DRAM, and a chunk's work holds the core
 * long enough that the out-of-order window covers only ~10 cache lines in
 * flight: without software prefetch a Q8_0 row stream ran at 8 GB/s where
 * a plain read runs at 24. Asking 16 KB ahead into L2 (T1: L2 tracks more
 * misses than L1) gave 21-24 GB/s on a Zen 4; 2 KB into L1 gave 8-9. */
#define TP_QPF 16384
#define TP_QPF_HINT _MM_HINT_T1
#define TP_QTB 6 /* tokens per tile: 2 rows x 6 accumulators + the unpacked chunks stay in registers */
/* The token loops must be unrolled for the accumulators to live in
 * registers (gcc -O2 does not unroll by itself). */
#if defined(__clang__)
#define TP_QUNROLL _Pragma("unroll")
#else
#define TP_QUNROLL _Pragma("GCC unroll 8")
#endif

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

/* Per-row scratch an UNPACK may keep between the chunks of one row (the
 * k-quants decode a super-block's 8 scales once, at its first chunk). */
typedef struct tp_qstate {
    float s[8], m[8];
} tp_qstate;

/* UNPACK(row, c, full, &u, &ws, &wm, &st): chunk c as unsigned quants u (the
 * signed quant plus 2^SH), lane scales ws and mins wm. full: 64 columns
 * (else 32: must not read past the row's first block of the chunk). */
#define TP_QROWS_DEFINE(NAME, UNPACK, SH, HASMIN)                                                          \
    /* R rows (1, 2, or 4 with one token: the activation loads are shared) x TB tokens */                                     \
    TP_QTARGET static inline __attribute__((always_inline)) void NAME##_tile(                              \
        const uint8_t *row0, size_t rstride, int cols, const tp_qact *a, int t0, float *y, size_t ldy,     \
        const int R, const int TB)                                                                         \
    {                                                                                                      \
        __m512 acc[4][TP_QTB];                                                                             \
        TP_QUNROLL for (int i = 0; i < R; i++)                                                             \
            TP_QUNROLL for (int t = 0; t < TB; t++)                                                        \
                acc[i][t] = _mm512_setzero_ps();                                                           \
        int nch = (cols + 63) / 64;                                                                        \
        size_t lanes = (size_t)cols / 4;                                                                   \
        tp_qstate st[4];                                                                                   \
        size_t cbytes = rstride / (size_t)nch; /* about a chunk's bytes */                                 \
        const __m512i offb = _mm512_set1_epi8((char)((1 << (SH)) & 0xff));                                 \
        for (int c = 0; c < nch; c++) {                                                                    \
            int full = cols - 64 * c >= 64;                                                                \
            __mmask16 lm = full ? (__mmask16)0xffff : (__mmask16)0x00ff;                                   \
            __mmask64 bm = full ? ~0ull : 0xffffffffull;                                                   \
            __m512i u[4];                                                                                  \
            __m512 ws[4], wm[4];                                                                           \
            TP_QUNROLL for (int i = 0; i < R; i++) {                                                       \
                /* TP_QPF bytes ahead of this row's chunk: past the row's end that is the rows read   \
                 * next, so every byte of the matrix is asked for once, whatever R */                      \
                _mm_prefetch((const char *)row0 + (size_t)i * rstride + (size_t)c * cbytes + TP_QPF,       \
                             TP_QPF_HINT);                                                                 \
                _mm_prefetch((const char *)row0 + (size_t)i * rstride + (size_t)c * cbytes + TP_QPF + 64,  \
                             TP_QPF_HINT);                                                                 \
                wm[i] = _mm512_setzero_ps();                                                               \
                UNPACK(row0 + (size_t)i * rstride, c, full, &u[i], &ws[i], &wm[i], &st[i]);                \
            }                                                                                              \
            TP_QUNROLL for (int t = 0; t < TB; t++) {                                                      \
                size_t tt = (size_t)(t0 + t);                                                              \
                __m512i xq = _mm512_maskz_loadu_epi8(bm, a->q + tt * (size_t)cols + 64 * (size_t)c);       \
                __m512 dx = _mm512_maskz_loadu_ps(lm, a->dl + tt * lanes + 16 * (size_t)c);                \
                __m512i ncorr = _mm512_setzero_si512();                                                    \
                __m512 xsf = _mm512_setzero_ps();                                                          \
                if (SH) /* -2^SH * (each lane's activation sum), exact: the dot products start from it */  \
                    ncorr = _mm512_sub_epi32(_mm512_setzero_si512(),                                       \
                                             _mm512_dpbusd_epi32(_mm512_setzero_si512(), offb, xq));       \
                if (HASMIN)                                                                                \
                    xsf = _mm512_cvtepi32_ps(                                                              \
                        _mm512_maskz_loadu_epi32(lm, a->s4 + tt * lanes + 16 * (size_t)c));                \
                TP_QUNROLL for (int i = 0; i < R; i++) {                                                   \
                    __m512i p = _mm512_dpbusd_epi32(ncorr, u[i], xq);                                      \
                    acc[i][t] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(ws[i], dx), _mm512_cvtepi32_ps(p),     \
                                                      acc[i][t], lm);                                      \
                    if (HASMIN)                                                                            \
                        acc[i][t] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(wm[i], dx), xsf, acc[i][t], lm);   \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        TP_QUNROLL for (int i = 0; i < R; i++)                                                             \
            TP_QUNROLL for (int t = 0; t < TB; t++)                                                        \
                y[(size_t)t * ldy + (size_t)i] = tp_qreduce16(acc[i][t]);                                  \
    }                                                                                                      \
    TP_QTARGET static void NAME##_rows(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1) \
    {                                                                                                      \
        size_t ld = (size_t)ldy;                                                                           \
        for (int r = r0; r < r1; r += 2) {                                                                 \
            const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;                      \
            int two = r1 - r >= 2;                                                                         \
            if (a->n_tok == 1 && r1 - r >= 4) { /* decode: 4 rows share each activation load */           \
                NAME##_tile(row, w->row_bytes, w->cols, a, 0, y + (size_t)r, ld, 4, 1);                     \
                r += 2;                                                                                    \
                continue;                                                                                  \
            }                                                                                              \
            for (int t0 = 0; t0 < a->n_tok;) {                                                             \
                int tb = a->n_tok - t0 < TP_QTB ? a->n_tok - t0 : TP_QTB;                                  \
                float *yt = y + (size_t)t0 * ld + (size_t)r;                                               \
                size_t rs = w->row_bytes;                                                                  \
                int cols = w->cols;                                                                        \
                switch (tb * 2 + two) {                                                                    \
                case 2: NAME##_tile(row, rs, cols, a, t0, yt, ld, 1, 1); break;                            \
                case 3: NAME##_tile(row, rs, cols, a, t0, yt, ld, 2, 1); break;                            \
                case 4: NAME##_tile(row, rs, cols, a, t0, yt, ld, 1, 2); break;                            \
                case 5: NAME##_tile(row, rs, cols, a, t0, yt, ld, 2, 2); break;                            \
                case 6: NAME##_tile(row, rs, cols, a, t0, yt, ld, 1, 3); break;                            \
                case 7: NAME##_tile(row, rs, cols, a, t0, yt, ld, 2, 3); break;                            \
                case 8: NAME##_tile(row, rs, cols, a, t0, yt, ld, 1, 4); break;                            \
                case 9: NAME##_tile(row, rs, cols, a, t0, yt, ld, 2, 4); break;                            \
                case 10: NAME##_tile(row, rs, cols, a, t0, yt, ld, 1, 5); break;                           \
                case 11: NAME##_tile(row, rs, cols, a, t0, yt, ld, 2, 5); break;                           \
                case 12: NAME##_tile(row, rs, cols, a, t0, yt, ld, 1, 6); break;                           \
                default: NAME##_tile(row, rs, cols, a, t0, yt, ld, 2, 6); break;                           \
                }                                                                                          \
                t0 += tb;                                                                                  \
            }                                                                                              \
        }                                                                                                  \
    }

#endif
