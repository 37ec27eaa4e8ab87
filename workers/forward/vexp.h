/* Private to the forward stage (and its tests): e^x for SwiGLU and the
 * attention softmax, the same bits from a portable function and from
 * eight AVX2 lanes.
 *
 * Why not libm's expf: the vector path cannot call it eight lanes at a
 * time and still give the portable path's bits, and one expf per hidden
 * unit and per attended position was a tenth of a decode step's work
 * outside the matmuls, all of it scalar. So both paths take the same
 * double-precision steps, each an IEEE operation with one rounding (no
 * fused multiply-adds, which a portable build cannot count on):
 *
 *   y = x * log2(e), clamped to [-200, 200]     (past that: 0 or inf)
 *   k = floor(y + 0.5), f = y - k (exact), t = f * ln 2
 *   p = e^t as its Taylor polynomial to t^9 by Horner (|t| <= 0.35:
 *       the truncation is below 1e-11, far under a float's half ulp)
 *   e^x = (float)(p * 2^k)   (the scaling exact; one rounding to float)
 *
 * Within one ulp of the correctly rounded result (almost always equal to
 * it); NaN in, NaN out (x + x). */
#ifndef TOKPIPE_FORWARD_VEXP_H
#define TOKPIPE_FORWARD_VEXP_H

#include <stdbool.h>
#include <stddef.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define TP_VEXP_LOG2E 0x1.71547652b82fep0
#define TP_VEXP_LN2 0x1.62e42fefa39efp-1
#define TP_VEXP_LIMIT 200.0

/* The Taylor coefficients 1/9! .. 1/0!, as the doubles nearest them. */
#define TP_VEXP_C9 (1.0 / 362880.0)
#define TP_VEXP_C8 (1.0 / 40320.0)
#define TP_VEXP_C7 (1.0 / 5040.0)
#define TP_VEXP_C6 (1.0 / 720.0)
#define TP_VEXP_C5 (1.0 / 120.0)
#define TP_VEXP_C4 (1.0 / 24.0)
#define TP_VEXP_C3 (1.0 / 6.0)
#define TP_VEXP_C2 0.5
#define TP_VEXP_C1 1.0
#define TP_VEXP_C0 1.0
/* Horner's order after C9: one list for both paths */
#define TP_VEXP_HORNER                                                                                   \
    {TP_VEXP_C8, TP_VEXP_C7, TP_VEXP_C6, TP_VEXP_C5, TP_VEXP_C4, TP_VEXP_C3, TP_VEXP_C2, TP_VEXP_C1, TP_VEXP_C0}

/* The portable e^x. */
float tp_vexp(float x);

/* SwiGLU: out[i] = silu(g[i]) * u[i] for i < n, e^x as tp_vexp; lanes:
 * eight a time in AVX2 (the caller's CPU has it; in AVX-512 where
 * tp_isa_active() allows), the same bits. */
void tp_swiglu(const float *g, const float *u, float *out, size_t n, bool lanes);
/* gpt-oss's SwiGLU (ggml's swiglu_oai, vexp.c), the same way: out[i] from
 * g[i] and u[i], eight lanes a time where lanes, the same bits. */
void tp_swiglu_oai(const float *g, const float *u, float *out, size_t n, bool lanes);

#if defined(__x86_64__) || defined(__i386__)
/* Four lanes of the steps above, in double. */
__attribute__((target("avx2"), always_inline)) static inline __m128 tp_vexp4_avx2(__m128 x)
{
    __m256d y = _mm256_mul_pd(_mm256_cvtps_pd(x), _mm256_set1_pd(TP_VEXP_LOG2E));
    y = _mm256_max_pd(_mm256_min_pd(y, _mm256_set1_pd(TP_VEXP_LIMIT)), _mm256_set1_pd(-TP_VEXP_LIMIT));
    __m256d k = _mm256_floor_pd(_mm256_add_pd(y, _mm256_set1_pd(0.5)));
    __m256d t = _mm256_mul_pd(_mm256_sub_pd(y, k), _mm256_set1_pd(TP_VEXP_LN2));
    static const double c[] = TP_VEXP_HORNER;
    __m256d p = _mm256_set1_pd(TP_VEXP_C9);
    #pragma GCC unroll 9
    for (int i = 0; i < 9; i++)
        p = _mm256_add_pd(_mm256_mul_pd(p, t), _mm256_set1_pd(c[i]));
    __m256i e = _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(k)),
                                                   _mm256_set1_epi64x(1023)),
                                  52);
    return _mm256_cvtpd_ps(_mm256_mul_pd(p, _mm256_castsi256_pd(e)));
}

/* Eight lanes; a NaN lane gives x + x, as tp_vexp does. */
__attribute__((target("avx2"), always_inline)) static inline __m256 tp_vexp8_avx2(__m256 x)
{
    __m256 ordered = _mm256_cmp_ps(x, x, _CMP_ORD_Q), xs = _mm256_and_ps(x, ordered); /* NaN lanes: 0 */
    __m256 r = _mm256_set_m128(tp_vexp4_avx2(_mm256_extractf128_ps(xs, 1)), tp_vexp4_avx2(_mm256_castps256_ps128(xs)));
    return _mm256_blendv_ps(_mm256_add_ps(x, x), r, ordered);
}

/* Eight lanes in one vector of eight doubles (AVX-512F): the steps of
 * tp_vexp4_avx2, the same IEEE operations, so the same bits, in half the
 * instructions; a NaN lane gives x + x. */
__attribute__((target("avx512f"), always_inline)) static inline __m256 tp_vexp8_avx512(__m256 x)
{
    __m256 ordered = _mm256_cmp_ps(x, x, _CMP_ORD_Q), xs = _mm256_and_ps(x, ordered); /* NaN lanes: 0 */
    __m512d y = _mm512_mul_pd(_mm512_cvtps_pd(xs), _mm512_set1_pd(TP_VEXP_LOG2E));
    y = _mm512_max_pd(_mm512_min_pd(y, _mm512_set1_pd(TP_VEXP_LIMIT)), _mm512_set1_pd(-TP_VEXP_LIMIT));
    __m512d k = _mm512_roundscale_pd(_mm512_add_pd(y, _mm512_set1_pd(0.5)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512d t = _mm512_mul_pd(_mm512_sub_pd(y, k), _mm512_set1_pd(TP_VEXP_LN2));
    static const double c[] = TP_VEXP_HORNER;
    __m512d p = _mm512_set1_pd(TP_VEXP_C9);
    #pragma GCC unroll 9
    for (int i = 0; i < 9; i++)
        p = _mm512_add_pd(_mm512_mul_pd(p, t), _mm512_set1_pd(c[i]));
    __m512i e = _mm512_slli_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(k)),
                                                   _mm512_set1_epi64(1023)),
                                  52);
    __m256 r = _mm512_cvtpd_ps(_mm512_mul_pd(p, _mm512_castsi512_pd(e)));
    return _mm256_blendv_ps(_mm256_add_ps(x, x), r, ordered);
}
#endif

#endif
