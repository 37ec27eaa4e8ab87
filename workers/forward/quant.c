/* Typed-weight matmuls: activation quantization, the portable (scalar)
 * path in the canonical order of quant.h, dispatch and dequantization. */
#include "quant.h"
#include "tokpipe/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    switch (type) {
    case TP_GGML_F16: case TP_GGML_BF16: case TP_GGML_Q8_0: case TP_GGML_Q4_0: case TP_GGML_Q4_1:
    case TP_GGML_Q5_0: case TP_GGML_Q5_1: case TP_GGML_Q4_K: case TP_GGML_Q5_K: case TP_GGML_Q6_K:
        return true;
    default:
        return false;
    }
}

static bool is_float_type(uint32_t type) { return type == TP_GGML_F16 || type == TP_GGML_BF16; }

int tp_qact_init(tp_qact *a, int max_tok, int max_cols)
{
    memset(a, 0, sizeof *a);
    size_t n = (size_t)max_tok * (size_t)((max_cols + 63) / 64 * 64);
    a->q = malloc(n ? n : 1);
    a->dl = malloc((n / 4 + 1) * sizeof(float));
    a->s4 = malloc((n / 4 + 1) * sizeof(int32_t));
    if (!a->q || !a->dl || !a->s4) {
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
    free(a->dl);
    free(a->s4);
    memset(a, 0, sizeof *a);
}

/* One token's row to int8 per block of 32 (ggml's Q8_0 rule, rounding to
 * nearest even). */
static void quantize_act_row(const float *x, int cols, int8_t *q, float *dl, int32_t *s4)
{
    for (int b = 0; b < cols / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(xb[i]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) {
            float v = nearbyintf(xb[i] * id);
            /* a non-finite activation (hostile weights) must not reach an
             * int conversion */
            int qi = v == v ? (v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v) : 0;
            q[b * 32 + i] = (int8_t)qi;
        }
        for (int l = 0; l < 8; l++) {
            dl[b * 8 + l] = d;
            const int8_t *ql = q + b * 32 + l * 4;
            s4[b * 8 + l] = ql[0] + ql[1] + ql[2] + ql[3];
        }
    }
}

void tp_qact_prepare(tp_qact *a, uint32_t wtype, const float *x, int ldx, int n_tok, int cols)
{
    a->n_tok = n_tok;
    a->cols = cols;
    a->x = x;
    a->ldx = ldx;
    a->is_float = is_float_type(wtype);
    if (a->is_float)
        return;
    for (int t = 0; t < n_tok; t++)
        quantize_act_row(x + (size_t)t * (size_t)ldx, cols, a->q + (size_t)t * (size_t)cols,
                         a->dl + (size_t)t * (size_t)(cols / 4), a->s4 + (size_t)t * (size_t)(cols / 4));
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
    default: return NULL;
    }
}

static void qrows_int_scalar(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    bool has_min;
    tp_qunpack_fn unpack = unpack_fn(w->type, &has_min);
    int cols = w->cols, nch = (cols + 63) / 64, lanes = cols / 4;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int t = 0; t < a->n_tok; t++) {
            const int8_t *xq = a->q + (size_t)t * (size_t)cols;
            const float *dl = a->dl + (size_t)t * (size_t)lanes;
            const int32_t *s4 = a->s4 + (size_t)t * (size_t)lanes;
            float acc[16] = {0};
            for (int c = 0; c < nch; c++) {
                int8_t wq[64];
                float ws[16], wm[16];
                unpack(row, c, cols, wq, ws, wm);
                int nl = cols - 64 * c >= 64 ? 16 : 8;
                for (int l = 0; l < nl; l++) {
                    int e = 64 * c + 4 * l;
                    int32_t p = 0;
                    for (int i = 0; i < 4; i++)
                        p += (int32_t)wq[4 * l + i] * (int32_t)xq[e + i];
                    float dx = dl[e / 4];
                    acc[l] = fmaf(ws[l] * dx, (float)p, acc[l]);
                    if (has_min)
                        acc[l] = fmaf(wm[l] * dx, (float)s4[e / 4], acc[l]);
                }
            }
            y[(size_t)t * (size_t)ldy + (size_t)r] = reduce16(acc);
        }
    }
}

void tp_qrows_f16_scalar(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    bool bf = w->type == TP_GGML_BF16;
    int cols = w->cols;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int t = 0; t < a->n_tok; t++) {
            const float *x = a->x + (size_t)t * (size_t)a->ldx;
            float acc[16] = {0};
            for (int k = 0; k < cols; k++) {
                uint16_t h;
                memcpy(&h, row + 2 * (size_t)k, 2);
                acc[k % 16] = fmaf(x[k], bf ? tp_bf16_to_f32(h) : tp_f16_to_f32(h), acc[k % 16]);
            }
            y[(size_t)t * (size_t)ldy + (size_t)r] = reduce16(acc);
        }
    }
}

bool tp_quant_have_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

void tp_qmatmul_rows(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1, bool avx512)
{
    if (r0 >= r1 || a->n_tok <= 0)
        return;
    switch (w->type) {
    case TP_GGML_F16:
    case TP_GGML_BF16:
        if (avx512)
            tp_qrows_f16_avx512(w, a, y, ldy, r0, r1);
        else
            tp_qrows_f16_scalar(w, a, y, ldy, r0, r1);
        return;
    case TP_GGML_Q8_0:
        if (avx512) {
            tp_qrows_q8_avx512(w, a, y, ldy, r0, r1);
            return;
        }
        break;
    case TP_GGML_Q4_0: case TP_GGML_Q4_1: case TP_GGML_Q5_0: case TP_GGML_Q5_1:
        if (avx512) {
            tp_qrows_q4_avx512(w, a, y, ldy, r0, r1);
            return;
        }
        break;
    case TP_GGML_Q4_K: case TP_GGML_Q5_K: case TP_GGML_Q6_K:
        if (avx512) {
            tp_qrows_k_avx512(w, a, y, ldy, r0, r1);
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
    default: return;
    }
}
