/* Half-precision KV cache: attention kernels (kv16.h); the conversions are
 * quant.c's, shared with the F16 weights. */
#include "kv16.h"
#include "quant.h"

#include <immintrin.h>
#include <string.h>

#define KV16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

/* As forward.c's f32 scores(): 64 positions at a time, 4 FMA chains. A
 * block of 16 positions is always whole in memory (a KV page holds 16
 * positions), so partly used blocks are loaded whole and only the stores
 * are masked; blocks wholly past n point at the group's first block
 * instead, as there. */
KV16_TARGET void tp_kv16_scores_avx512(float *att, const float *qh, const uint16_t *const *kblk, int hs, int n,
                                       float scale)
{
    __m512 sc = _mm512_set1_ps(scale);
    for (int t0 = 0; t0 < n; t0 += 64) {
        __mmask16 m[4];
        for (int j = 0; j < 4; j++) {
            int left = n - t0 - 16 * j;
            m[j] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        const uint16_t *const *b = kblk + t0 / 16;
        const uint16_t *r0 = b[0], *r1 = m[1] ? b[1] : r0, *r2 = m[2] ? b[2] : r0, *r3 = m[3] ? b[3] : r0;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < hs; i++, r0 += 16, r1 += 16, r2 += 16, r3 += 16) {
            __m512 q = _mm512_set1_ps(qh[i]);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(q, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r0))));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(q, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r1))));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(q, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r2))));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(q, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r3))));
        }
        _mm512_mask_storeu_ps(att + t0, m[0], _mm512_div_ps(a0, sc));
        _mm512_mask_storeu_ps(att + t0 + 16, m[1], _mm512_div_ps(a1, sc));
        _mm512_mask_storeu_ps(att + t0 + 32, m[2], _mm512_div_ps(a2, sc));
        _mm512_mask_storeu_ps(att + t0 + 48, m[3], _mm512_div_ps(a3, sc));
    }
}

KV16_TARGET void tp_kv16_weighted_sum_avx512(float *oh, const float *att, const uint16_t *const *vblk, int hs,
                                             int n)
{
    for (int c0 = 0; c0 < hs; c0 += 64) {
        __mmask16 m[4];
        for (int j = 0; j < 4; j++) {
            int left = hs - c0 - 16 * j;
            m[j] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        size_t o1 = m[1] ? 16 : 0, o2 = m[2] ? 32 : 0, o3 = m[3] ? 48 : 0;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int t = 0; t < n; t++) {
            __m512 a = _mm512_set1_ps(att[t]);
            const uint16_t *v = vblk[t >> 4] + (size_t)(t & 15) * (size_t)hs + c0;
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(a, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[0], v))));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(a, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[1], v + o1))));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(a, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[2], v + o2))));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(a, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m[3], v + o3))));
        }
        _mm512_mask_storeu_ps(oh + c0, m[0], a0);
        _mm512_mask_storeu_ps(oh + c0 + 16, m[1], a1);
        _mm512_mask_storeu_ps(oh + c0 + 32, m[2], a2);
        _mm512_mask_storeu_ps(oh + c0 + 48, m[3], a3);
    }
}

void tp_kv16_scores_scalar(float *att, const float *qh, const uint16_t *const *kblk, int hs, int n, float scale)
{
    for (int t = 0; t < n; t++) {
        const uint16_t *k = kblk[t / 16] + (size_t)(t % 16);
        float score = 0.0f;
        for (int i = 0; i < hs; i++)
            score += qh[i] * tp_f16_to_f32(k[(size_t)i * 16]);
        att[t] = score / scale;
    }
}

void tp_kv16_weighted_sum_scalar(float *oh, const float *att, const uint16_t *const *vblk, int hs, int n)
{
    memset(oh, 0, (size_t)hs * sizeof(float));
    for (int t = 0; t < n; t++) {
        const uint16_t *v = vblk[t / 16] + (size_t)(t % 16) * (size_t)hs;
        for (int i = 0; i < hs; i++)
            oh[i] += att[t] * tp_f16_to_f32(v[i]);
    }
}
