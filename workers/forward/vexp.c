/* The portable e^x of vexp.h: its steps one at a time, in its order. */
#include "vexp.h"
#include "tokpipe/isa.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* p * t + c must stay two roundings, as in the vector lanes: clang would
 * fuse it where the target has FMA (gcc in ISO C mode does not) */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

float tp_vexp(float x)
{
    if (x != x)
        return x + x;
    double y = (double)x * TP_VEXP_LOG2E;
    y = y < TP_VEXP_LIMIT ? y : TP_VEXP_LIMIT;
    y = y > -TP_VEXP_LIMIT ? y : -TP_VEXP_LIMIT;
    double k = floor(y + 0.5), t = (y - k) * TP_VEXP_LN2;
    static const double c[] = TP_VEXP_HORNER;
    double p = TP_VEXP_C9;
    for (int i = 0; i < 9; i++)
        p = p * t + c[i];
    uint64_t bits = (uint64_t)((int64_t)k + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return (float)(p * scale);
}

/* out = silu(g) * u over n elements: g * (1 / (1 + e^-g)) * u, each e^x
 * tp_vexp's bits, eight lanes a time where lanes (AVX2), the same bits. */
static void swiglu_scalar(const float *g, const float *u, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float val = g[i];
        val *= 1.0f / (1.0f + tp_vexp(-val));
        out[i] = val * u[i];
    }
}

#if defined(__x86_64__) || defined(__i386__)
/* The lanes of both kinds: TARGET's instructions, VEXP8 its e^x. */
#define SWIGLU_LANES(NAME, TARGET, VEXP8)                                                                   \
    __attribute__((target(TARGET))) static void NAME(const float *g, const float *u, float *out, size_t n)  \
    {                                                                                                      \
        size_t i = 0;                                                                                      \
        const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);                            \
        for (; i + 8 <= n; i += 8) {                                                                       \
            __m256 val = _mm256_loadu_ps(g + i);                                                           \
            __m256 e = VEXP8(_mm256_xor_ps(val, sign));                                                    \
            val = _mm256_mul_ps(val, _mm256_div_ps(one, _mm256_add_ps(one, e)));                           \
            _mm256_storeu_ps(out + i, _mm256_mul_ps(val, _mm256_loadu_ps(u + i)));                         \
        }                                                                                                  \
        swiglu_scalar(g + i, u + i, out + i, n - i);                                                       \
    }
SWIGLU_LANES(swiglu_avx2, "avx2", tp_vexp8_avx2)
SWIGLU_LANES(swiglu_avx512, "avx512f", tp_vexp8_avx512)
#endif

/* ggml's swiglu_oai (gpt-oss): the gate clamped above at 7, the up to
 * [-7, 7] (fminf / fmaxf: a NaN gives the bound, as minps / maxps with
 * the bound second); out = g / (1 + e^(-1.702 g)) * (u + 1). */
#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f

static void swiglu_oai_scalar(const float *g, const float *u, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = fminf(g[i], OAI_LIMIT), y = fminf(fmaxf(u[i], -OAI_LIMIT), OAI_LIMIT);
        float glu = x / (1.0f + tp_vexp(OAI_ALPHA * -x));
        out[i] = glu * (y + 1.0f);
    }
}

#if defined(__x86_64__) || defined(__i386__)
#define SWIGLU_OAI_LANES(NAME, TARGET, VEXP8)                                                                   \
    __attribute__((target(TARGET))) static void NAME(const float *g, const float *u, float *out, size_t n)      \
    {                                                                                                          \
        size_t i = 0;                                                                                          \
        const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f), alpha = _mm256_set1_ps(OAI_ALPHA); \
        const __m256 hi = _mm256_set1_ps(OAI_LIMIT), lo = _mm256_set1_ps(-OAI_LIMIT);                          \
        for (; i + 8 <= n; i += 8) {                                                                           \
            __m256 x = _mm256_min_ps(_mm256_loadu_ps(g + i), hi);                                              \
            __m256 y = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(u + i), lo), hi);                           \
            __m256 e = VEXP8(_mm256_mul_ps(alpha, _mm256_xor_ps(x, sign)));                                    \
            __m256 glu = _mm256_div_ps(x, _mm256_add_ps(one, e));                                              \
            _mm256_storeu_ps(out + i, _mm256_mul_ps(glu, _mm256_add_ps(y, one)));                              \
        }                                                                                                      \
        swiglu_oai_scalar(g + i, u + i, out + i, n - i);                                                       \
    }
SWIGLU_OAI_LANES(swiglu_oai_avx2, "avx2", tp_vexp8_avx2)
SWIGLU_OAI_LANES(swiglu_oai_avx512, "avx512f", tp_vexp8_avx512)
#endif

void tp_swiglu_oai(const float *g, const float *u, float *out, size_t n, bool lanes)
{
#if defined(__x86_64__) || defined(__i386__)
    if (lanes) {
        if (tp_isa_active() >= TP_ISA_AVX512)
            swiglu_oai_avx512(g, u, out, n);
        else
            swiglu_oai_avx2(g, u, out, n);
        return;
    }
#endif
    (void)lanes;
    swiglu_oai_scalar(g, u, out, n);
}

void tp_swiglu(const float *g, const float *u, float *out, size_t n, bool lanes)
{
#if defined(__x86_64__) || defined(__i386__)
    if (lanes) {
        if (tp_isa_active() >= TP_ISA_AVX512)
            swiglu_avx512(g, u, out, n);
        else
            swiglu_avx2(g, u, out, n);
        return;
    }
#endif
    (void)lanes;
    swiglu_scalar(g, u, out, n);
}
