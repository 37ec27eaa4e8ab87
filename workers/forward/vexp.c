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
