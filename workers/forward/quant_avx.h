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
 * long enough that the out-of-order window covers only a few cache lines
 * in flight, a third of what a plain read keeps going. So the kernels ask
 * tens of KB ahead into L2 (T1: L2 tracks more misses than L1; a short
 * run into L1 is no better than none). */
#define TP_QPF 32768
#define TP_QPF_RUN 32768 /* the K types: ahead in the order the range is read (TP_QPANEL_DEFINE) */
#define TP_QPF_HINT _MM_HINT_T1
#define TP_QTB 6 /* tokens per tile: 2 rows x 6 accumulators + the unpacked chunks stay in registers */
/* The token loops must be unrolled for the accumulators to live in
 * registers (gcc -O2 does not unroll by itself). */
#if defined(TP_NO_UNROLL) /* sanitizer and fuzz builds: fully unrolled tiles took clang minutes per file */
#define TP_QUNROLL
#elif defined(__clang__)
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

/* Quad k (0..7) of a panel block: 16 rows x 4 columns of unsigned quants
 * (quant.h's layouts; blocks are 32-byte aligned, loads unaligned). */
TP_QTARGET static inline __attribute__((always_inline)) __m512i tp_pquad(const uint8_t *blk, int k, const int BITS)
{
    if (BITS == 8)
        return _mm512_loadu_si512((const void *)(blk + 64 * k));
    __m512i v = _mm512_loadu_si512((const void *)(blk + 64 * (k / 2)));
    if (k % 2)
        v = _mm512_srli_epi16(v, 4);
    v = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
    if (BITS == 5) {
        uint64_t hb;
        memcpy(&hb, blk + 256 + 8 * k, 8);
        v = _mm512_mask_add_epi8(v, (__mmask64)hb, v, _mm512_set1_epi8(16));
    }
    if (BITS == 6) {
        __m512i h = _mm512_loadu_si512((const void *)(blk + 256 + 64 * (k / 4)));
        int sh = 2 * (k % 4); /* bits sh, sh+1 of each byte to bits 4, 5 */
        h = sh <= 4 ? _mm512_slli_epi16(h, (unsigned)(4 - sh)) : _mm512_srli_epi16(h, (unsigned)(sh - 4));
        v = _mm512_or_si512(v, _mm512_and_si512(h, _mm512_set1_epi8(0x30)));
    }
    return v;
}

/* The 16 scales (halves) number i after a block's quants. */
TP_QTARGET static inline __attribute__((always_inline)) __m512 tp_pscale(const uint8_t *sc, int i)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(sc + 32 * i)));
}

/* A K type's scales of sub-block s of block j (0..7) of a super-block
 * (head: TP_QPANEL_KHEAD), the products the scalar path makes: d * sc and
 * (-dmin) * m (Q4_K, Q5_K) or d * sc (Q6_K, 16-column sub-blocks). */
TP_QTARGET static inline __attribute__((always_inline)) __m512 tp_kscale(const uint8_t *head, int j, int s,
                                                                        const int HASMIN, __m512 *wm)
{
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)head));
    if (!HASMIN) {
        __m128i sc = _mm_loadu_si128((const void *)(head + 32 + 16 * (2 * j + s)));
        return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
    }
    __m128i sc = _mm_loadu_si128((const void *)(head + 64 + 16 * j));
    __m128i m = _mm_loadu_si128((const void *)(head + 192 + 16 * j));
    __m512 nmin = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(head + 32)));
    *wm = _mm512_mul_ps(nmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(m)));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)));
}

/* The AVX-512 form of quant.h's canonical order over a panel, per type:
 * BITS, the offset 2^SH (0: none) of the unsigned quants, SUB columns per
 * sub-block, HASMIN, SCB bytes per scale (2: halves after each block; 0: a
 * K type's super-block head). A tile is G row groups (16 rows each) x T tokens:
 * per quad one vpdpbusd per (group, token), the weights loaded once for T
 * tokens and each token's 4 activation quants broadcast once for G
 * groups; per sub-block one convert and multiply-add per (group, token). */
#define TP_QPANEL_DEFINE(NAME, BITS, SH, SUB, HASMIN, SCB)                                                          \
    TP_QTARGET static inline __attribute__((always_inline)) void NAME##_ptile(                                 \
        const tp_qpanel *p, int g0, const tp_qact *a, int t0, float *y, size_t ldy, int r0, int r1,            \
        const int G, const int T)                                                                              \
    {                                                                                                          \
        __m512 acc[4][TP_QTB];                                                                                 \
        TP_QUNROLL for (int g = 0; g < G; g++)                                                                 \
            TP_QUNROLL for (int t = 0; t < T; t++)                                                             \
                acc[g][t] = _mm512_setzero_ps();                                                               \
        const int nb = p->blocks, cols = a->cols;                                                              \
        const size_t bb = p->block_bytes, gb = p->group_bytes;                                                 \
        const size_t qbytes = TP_QPANEL_QUANT_BYTES(BITS), ksb = TP_QPANEL_KSB_BYTES(BITS);                   \
        const uint8_t *base = p->data + (size_t)g0 * gb;                                                       \
        /* see TP_QPF. The K types: the bytes TP_QPF_RUN ahead in the order the range's tiles read */         \
        /* them (these G groups block by block, then the next G), a block's share of each group (a */         \
        /* super-block's eighth) per block, none past the range's last group. The others: each */           \
        /* group's own stream TP_QPF ahead. (Measured on Zen 4, one thread, matrices in random */           \
        /* order: the run order took K types from 18-24 GB/s, by shape, to 24-25; Q8_0 lost 3%.) */         \
        const size_t share = gb / (size_t)nb;                                                                  \
        const int ahead = (int)(TP_QPF_RUN / ((size_t)G * share)), gend = (r1 + 15) / 16;                      \
        for (int b = 0; b < nb; b++) {                                                                         \
            /* K types: block b % 8 of super-block b / 8, after its head */                                     \
            const uint8_t *head = base + (size_t)(b / 8) * ksb;                                                \
            const uint8_t *blk = (SCB) ? base + (size_t)b * bb : head + TP_QPANEL_KHEAD + (size_t)(b % 8) * qbytes; \
            if (SCB) {                                                                                         \
                TP_QUNROLL for (int g = 0; g < G; g++)                                                         \
                    for (size_t o = 0; o < bb; o += 64)                                                        \
                        _mm_prefetch((const char *)blk + (size_t)g * gb + o + TP_QPF, TP_QPF_HINT);            \
            } else {                                                                                           \
                int fb = b + ahead, fg = g0;                                                                   \
                for (; fb >= nb; fb -= nb)                                                                     \
                    fg += G;                                                                                   \
                TP_QUNROLL for (int g = 0; g < G; g++)                                                         \
                    if (fg + g < gend)                                                                         \
                        for (size_t o = (size_t)fb * share / 64 * 64; o < (size_t)(fb + 1) * share; o += 64)   \
                            _mm_prefetch((const char *)p->data + (size_t)(fg + g) * gb + o, TP_QPF_HINT);      \
            }                                                                                                  \
            TP_QUNROLL for (int s = 0; s < 32 / (SUB); s++) {                                                  \
                __m512i ia[4][TP_QTB];                                                                         \
                TP_QUNROLL for (int t = 0; t < T; t++) {                                                       \
                    size_t tt = (size_t)(t0 + t);                                                              \
                    __m512i init = _mm512_setzero_si512();                                                     \
                    if ((SH) && (SUB) == 32)                                                                   \
                        init = _mm512_slli_epi32(_mm512_set1_epi32(a->nsum32[tt * (size_t)nb + (size_t)b]),   \
                                                 (SH));                                                        \
                    if ((SH) && (SUB) == 16)                                                                   \
                        init = _mm512_slli_epi32(                                                              \
                            _mm512_set1_epi32(a->nsum16[tt * 2 * (size_t)nb + 2 * (size_t)b + (size_t)s]), (SH)); \
                    TP_QUNROLL for (int g = 0; g < G; g++)                                                     \
                        ia[g][t] = init;                                                                       \
                }                                                                                              \
                TP_QUNROLL for (int k = s * (SUB) / 4; k < (s + 1) * (SUB) / 4; k++) {                         \
                    __m512i u[4];                                                                              \
                    TP_QUNROLL for (int g = 0; g < G; g++)                                                     \
                        u[g] = tp_pquad(blk + (size_t)g * gb, k, (BITS));                                      \
                    TP_QUNROLL for (int t = 0; t < T; t++) {                                                   \
                        int32_t x4;                                                                            \
                        memcpy(&x4, a->q + (size_t)(t0 + t) * (size_t)cols + 32 * (size_t)b + 4 * (size_t)k, 4); \
                        __m512i xb = _mm512_set1_epi32(x4);                                                    \
                        TP_QUNROLL for (int g = 0; g < G; g++)                                                 \
                            ia[g][t] = _mm512_dpbusd_epi32(ia[g][t], u[g], xb);                                \
                    }                                                                                          \
                }                                                                                              \
                __m512 ws[4], wm[4];                                                                           \
                TP_QUNROLL for (int g = 0; g < G; g++) {                                                       \
                    if (!(SCB)) {                                                                              \
                        ws[g] = tp_kscale(head + (size_t)g * gb, b % 8, s, (HASMIN), &wm[g]);                  \
                        continue;                                                                              \
                    }                                                                                          \
                    ws[g] = tp_pscale(blk + (size_t)g * gb + qbytes, s);                                     \
                    if (HASMIN)                                                                                \
                        wm[g] = tp_pscale(blk + (size_t)g * gb + qbytes, 1);                                 \
                }                                                                                              \
                TP_QUNROLL for (int t = 0; t < T; t++) {                                                       \
                    size_t tb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;                                     \
                    __m512 dx = _mm512_set1_ps(a->dx[tb]);                                                     \
                    TP_QUNROLL for (int g = 0; g < G; g++) {                                                   \
                        acc[g][t] = _mm512_fmadd_ps(_mm512_mul_ps(ws[g], dx), _mm512_cvtepi32_ps(ia[g][t]),    \
                                                    acc[g][t]);                                                \
                        if (HASMIN)                                                                            \
                            acc[g][t] = _mm512_fmadd_ps(_mm512_mul_ps(wm[g], dx), _mm512_set1_ps(a->sum[tb]),  \
                                                        acc[g][t]);                                            \
                    }                                                                                          \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        TP_QUNROLL for (int g = 0; g < G; g++) {                                                               \
            int lo = 16 * (g0 + g), a0 = r0 > lo ? r0 - lo : 0, a1 = r1 - lo < 16 ? r1 - lo : 16;              \
            __mmask16 m = (__mmask16)(((1u << a1) - 1) & ~((1u << a0) - 1));                                   \
            TP_QUNROLL for (int t = 0; t < T; t++)                                                             \
                _mm512_mask_storeu_ps(y + (size_t)t * ldy + (size_t)lo, m, acc[g][t]);                         \
        }                                                                                                      \
    }                                                                                                          \
    TP_QTARGET static void NAME##_rows(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)   \
    {                                                                                                          \
        const tp_qpanel *p = w->panel;                                                                         \
        size_t ld = (size_t)ldy;                                                                               \
        int g1 = (r1 + 15) / 16;                                                                               \
        for (int g = r0 / 16; g < g1;) {                                                                       \
            if (a->n_tok == 1) { /* decode: 2 streams (4 ran slower: the prefetcher keeps up with fewer) */    \
                int n = g1 - g >= 2 ? 2 : 1;                                                                   \
                if (n == 2) NAME##_ptile(p, g, a, 0, y, ld, r0, r1, 2, 1);                                      \
                else NAME##_ptile(p, g, a, 0, y, ld, r0, r1, 1, 1);                                             \
                g += n;                                                                                        \
                continue;                                                                                      \
            }                                                                                                  \
            int two = g1 - g >= 2;                                                                             \
            for (int t0 = 0; t0 < a->n_tok;) {                                                                 \
                int tb = a->n_tok - t0 < TP_QTB ? a->n_tok - t0 : TP_QTB;                                      \
                float *yt = y + (size_t)t0 * ld;                                                               \
                switch (tb * 2 + two) {                                                                        \
                case 2: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 1, 1); break;                                \
                case 3: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 2, 1); break;                                \
                case 4: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 1, 2); break;                                \
                case 5: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 2, 2); break;                                \
                case 6: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 1, 3); break;                                \
                case 7: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 2, 3); break;                                \
                case 8: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 1, 4); break;                                \
                case 9: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 2, 4); break;                                \
                case 10: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 1, 5); break;                               \
                case 11: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 2, 5); break;                               \
                case 12: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 1, 6); break;                               \
                default: NAME##_ptile(p, g, a, t0, yt, ld, r0, r1, 2, 6); break;                               \
                }                                                                                              \
                t0 += tb;                                                                                      \
            }                                                                                                  \
            g += two ? 2 : 1;                                                                                  \
        }                                                                                                      \
    }

#endif
