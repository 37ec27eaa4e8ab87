/* Attention's AVX2 loops (attn_avx2.h). half is a constant in each
 * instantiation of the inline bodies. */
#include "attn_avx2.h"
#include "quant.h" /* tp_f16_to_f32 */
#include "tokpipe/forward.h" /* TP_KV_PAGE */

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define ATTN_AVX2 __attribute__((target("avx2,f16c"), always_inline)) static inline

/* Eight values from element i of a block, as exact floats. */
ATTN_AVX2 __m256 load8(const void *blk, size_t i, const bool half)
{
    if (half)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)blk + i)));
    return _mm256_loadu_ps((const float *)blk + i);
}

static inline float elem(const void *blk, size_t i, bool half)
{
    return half ? tp_f16_to_f32(((const uint16_t *)blk)[i]) : ((const float *)blk)[i];
}

/* Scores of nb (1..4) whole key blocks into s: eight chains (two a block)
 * in flight. */
ATTN_AVX2 void scores_blocks(float *s, const float *qh, const void *const *kb, int hs, float scale, const int nb,
                             const bool half)
{
    __m256 a[8];
    #pragma GCC unroll 8
    for (int j = 0; j < 2 * nb; j++)
        a[j] = _mm256_setzero_ps();
    for (int i = 0; i < hs; i++) {
        __m256 q = _mm256_set1_ps(qh[i]);
        #pragma GCC unroll 8
        for (int j = 0; j < 2 * nb; j++)
            a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(q, load8(kb[j / 2], (size_t)i * TP_KV_PAGE + 8 * (j % 2), half)));
    }
    #pragma GCC unroll 8
    for (int j = 0; j < 2 * nb; j++)
        _mm256_storeu_ps(s + 8 * j, _mm256_div_ps(a[j], _mm256_set1_ps(scale)));
}

ATTN_AVX2 void scores(float *att, const float *qh, const void *const *kblk, int hs, int n, float scale,
                      const bool half)
{
    int nblk = (n + TP_KV_PAGE - 1) / TP_KV_PAGE;
    float s[4 * TP_KV_PAGE]; /* positions past n in the last block: computed, not stored */
    for (int b = 0; b < nblk;) {
        int nb = nblk - b < 4 ? nblk - b : 4;
        switch (nb) {
        case 4: scores_blocks(s, qh, kblk + b, hs, scale, 4, half); break;
        case 3: scores_blocks(s, qh, kblk + b, hs, scale, 3, half); break;
        case 2: scores_blocks(s, qh, kblk + b, hs, scale, 2, half); break;
        default: scores_blocks(s, qh, kblk + b, hs, scale, 1, half); break;
        }
        int t0 = TP_KV_PAGE * b, m = n - t0 < TP_KV_PAGE * nb ? n - t0 : TP_KV_PAGE * nb;
        memcpy(att + t0, s, (size_t)m * sizeof(float));
        b += nb;
    }
}

/* Elements [i0, i0 + 8 nc) of the weighted sum: nc (1..8) chains. */
ATTN_AVX2 void weighted_chunks(float *oh, const float *att, const void *const *vblk, int hs, int n, int i0,
                               const int nc, const bool half)
{
    __m256 o[8];
    #pragma GCC unroll 8
    for (int j = 0; j < nc; j++)
        o[j] = _mm256_setzero_ps();
    for (int t = 0; t < n; t++) {
        size_t v = (size_t)(t % TP_KV_PAGE) * (size_t)hs + (size_t)i0;
        __m256 a = _mm256_set1_ps(att[t]);
        #pragma GCC unroll 8
        for (int j = 0; j < nc; j++)
            o[j] = _mm256_add_ps(o[j], _mm256_mul_ps(a, load8(vblk[t / TP_KV_PAGE], v + 8 * (size_t)j, half)));
    }
    #pragma GCC unroll 8
    for (int j = 0; j < nc; j++)
        _mm256_storeu_ps(oh + i0 + 8 * j, o[j]);
}

ATTN_AVX2 void weighted(float *oh, const float *att, const void *const *vblk, int hs, int n, const bool half)
{
    int i0 = 0;
    for (; i0 + 64 <= hs; i0 += 64)
        weighted_chunks(oh, att, vblk, hs, n, i0, 8, half);
    switch ((hs - i0) / 8) { /* the whole chunks left, in one pass */
    case 7: weighted_chunks(oh, att, vblk, hs, n, i0, 7, half); break;
    case 6: weighted_chunks(oh, att, vblk, hs, n, i0, 6, half); break;
    case 5: weighted_chunks(oh, att, vblk, hs, n, i0, 5, half); break;
    case 4: weighted_chunks(oh, att, vblk, hs, n, i0, 4, half); break;
    case 3: weighted_chunks(oh, att, vblk, hs, n, i0, 3, half); break;
    case 2: weighted_chunks(oh, att, vblk, hs, n, i0, 2, half); break;
    case 1: weighted_chunks(oh, att, vblk, hs, n, i0, 1, half); break;
    default: break;
    }
    for (int i = i0 + (hs - i0) / 8 * 8; i < hs; i++) {
        float o = 0.0f;
        for (int t = 0; t < n; t++)
            o += att[t] * elem(vblk[t / TP_KV_PAGE], (size_t)(t % TP_KV_PAGE) * (size_t)hs + (size_t)i, half);
        oh[i] = o;
    }
}

__attribute__((target("avx2,f16c"))) void tp_attn_scores_avx2(float *att, const float *qh, const void *const *kblk,
                                                               int hs, int n, float scale, bool half)
{
    if (half)
        scores(att, qh, kblk, hs, n, scale, true);
    else
        scores(att, qh, kblk, hs, n, scale, false);
}

__attribute__((target("avx2,f16c"))) void tp_attn_weighted_avx2(float *oh, const float *att, const void *const *vblk,
                                                                int hs, int n, bool half)
{
    if (half)
        weighted(oh, att, vblk, hs, n, true);
    else
        weighted(oh, att, vblk, hs, n, false);
}
