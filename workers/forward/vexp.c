/* The portable e^x of vexp.h: its steps one at a time, in its order. */
#include "vexp.h"

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
__attribute__((target("avx2"))) static void swiglu_avx2(const float *g, const float *u, float *out, size_t n)
{
    size_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 val = _mm256_loadu_ps(g + i);
        __m256 e = tp_vexp8_avx2(_mm256_xor_ps(val, sign));
        val = _mm256_mul_ps(val, _mm256_div_ps(one, _mm256_add_ps(one, e)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(val, _mm256_loadu_ps(u + i)));
    }
    swiglu_scalar(g + i, u + i, out + i, n - i);
}
#endif

void tp_swiglu(const float *g, const float *u, float *out, size_t n, bool lanes)
{
#if defined(__x86_64__) || defined(__i386__)
    if (lanes) {
        swiglu_avx2(g, u, out, n);
        return;
    }
#endif
    (void)lanes;
    swiglu_scalar(g, u, out, n);
}
