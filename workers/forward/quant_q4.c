/* Q4_0, Q4_1, Q5_0, Q5_1 weights: blocks of 32 quants of 4 or 5 bits.
 * In a block, columns 0..15 are the low nibbles of qs[0..15] and columns
 * 16..31 their high nibbles; Q5 types keep column j's fifth bit in bit j
 * of the 32-bit qh. _0 types are symmetric (q - 8, q - 16), _1 types
 * add a min m. */
#include "quant.h"
#include "quant_avx.h"

#include <math.h>
#include <string.h>

typedef struct qfmt {
    size_t bytes;   /* per block */
    int has_m, has_h; /* min after d; 32-bit qh before qs */
    int off;        /* subtracted from the unsigned quant */
} qfmt;

static const qfmt F_Q4_0 = {18, 0, 0, 8}, F_Q4_1 = {20, 1, 0, 0}, F_Q5_0 = {22, 0, 1, 16},
                  F_Q5_1 = {24, 1, 1, 0};

static void unpack_generic(const qfmt *f, const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16],
                           float wm[16])
{
    int nb = n_cols - 64 * c >= 64 ? 2 : 1;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)(2 * c + b) * f->bytes;
        float d = tp_f16_to_f32(tp_qrd16(blk));
        float m = f->has_m ? tp_f16_to_f32(tp_qrd16(blk + 2)) : 0.0f;
        const uint8_t *qs = blk + 2 + (f->has_m ? 2 : 0) + (f->has_h ? 4 : 0);
        uint32_t qh = 0;
        if (f->has_h)
            memcpy(&qh, blk + 2 + (f->has_m ? 2 : 0), 4);
        for (int j = 0; j < 32; j++) {
            int q = j < 16 ? qs[j] & 0xf : qs[j - 16] >> 4;
            q |= (int)((qh >> j) & 1) << 4;
            w[32 * b + j] = (int8_t)(q - f->off);
        }
        for (int l = 0; l < 8; l++) {
            ws[8 * b + l] = d;
            wm[8 * b + l] = m;
        }
    }
}

void tp_qunpack_q4_0(const uint8_t *row, int c, int n, int8_t w[64], float ws[16], float wm[16])
{
    unpack_generic(&F_Q4_0, row, c, n, w, ws, wm);
}
void tp_qunpack_q4_1(const uint8_t *row, int c, int n, int8_t w[64], float ws[16], float wm[16])
{
    unpack_generic(&F_Q4_1, row, c, n, w, ws, wm);
}
void tp_qunpack_q5_0(const uint8_t *row, int c, int n, int8_t w[64], float ws[16], float wm[16])
{
    unpack_generic(&F_Q5_0, row, c, n, w, ws, wm);
}
void tp_qunpack_q5_1(const uint8_t *row, int c, int n, int8_t w[64], float ws[16], float wm[16])
{
    unpack_generic(&F_Q5_1, row, c, n, w, ws, wm);
}

/* Two blocks' nibbles as 64 unsigned bytes in column order: each block's
 * 16 bytes twice, the second copy shifted right by 4, then masked. */
TP_QTARGET static inline __attribute__((always_inline)) __m512i nibbles(const uint8_t *qs0, const uint8_t *qs1,
                                                                        int full)
{
    __m128i a = _mm_loadu_si128((const void *)qs0);
    __m128i b = full ? _mm_loadu_si128((const void *)qs1) : _mm_setzero_si128();
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(a, a)), _mm256_set_m128i(b, b), 1);
    const __m512i sh = _mm512_set_epi64(0x0004000400040004ll, 0x0004000400040004ll, 0, 0,
                                        0x0004000400040004ll, 0x0004000400040004ll, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi16(v, sh), _mm512_set1_epi8(0x0f));
}

#define VUNPACK(NAME, BYTES, HAS_M, HAS_H)                                                                   \
    TP_QTARGET static inline __attribute__((always_inline)) void NAME(const uint8_t *row, int c, int full,  \
                                                                      __m512i *u, __m512 *ws, __m512 *wm,   \
                                                                      tp_qstate *st)                        \
    {                                                                                                        \
        (void)st;                                                                                            \
        const uint8_t *b0 = row + (size_t)(2 * c) * (BYTES), *b1 = b0 + (BYTES);                             \
        size_t qo = 2 + ((HAS_M) ? 2 : 0) + ((HAS_H) ? 4 : 0);                                               \
        *u = nibbles(b0 + qo, b1 + qo, full);                                                                \
        if (HAS_H) {                                                                                         \
            uint32_t h0, h1 = 0;                                                                             \
            memcpy(&h0, b0 + 2 + ((HAS_M) ? 2 : 0), 4);                                                      \
            if (full)                                                                                        \
                memcpy(&h1, b1 + 2 + ((HAS_M) ? 2 : 0), 4);                                                  \
            __mmask64 k = (__mmask64)h0 | (__mmask64)h1 << 32;                                               \
            *u = _mm512_mask_add_epi8(*u, k, *u, _mm512_set1_epi8(16));                                      \
        }                                                                                                    \
        *ws = tp_qhalves(tp_qh2f(b0), full ? tp_qh2f(b1) : 0.0f);                                            \
        if (HAS_M)                                                                                           \
            *wm = tp_qhalves(tp_qh2f(b0 + 2), full ? tp_qh2f(b1 + 2) : 0.0f);                                \
    }

VUNPACK(vunpack_q4_0, 18, 0, 0)
VUNPACK(vunpack_q4_1, 20, 1, 0)
VUNPACK(vunpack_q5_0, 22, 0, 1)
VUNPACK(vunpack_q5_1, 24, 1, 1)

TP_QROWS_DEFINE(q4_0, vunpack_q4_0, 3, 0)
TP_QROWS_DEFINE(q4_1, vunpack_q4_1, 0, 1)
TP_QROWS_DEFINE(q5_0, vunpack_q5_0, 4, 0)
TP_QROWS_DEFINE(q5_1, vunpack_q5_1, 0, 1)

void tp_qrows_q4_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    switch (w->type) {
    case TP_GGML_Q4_0: q4_0_rows(w, a, y, ldy, r0, r1); break;
    case TP_GGML_Q4_1: q4_1_rows(w, a, y, ldy, r0, r1); break;
    case TP_GGML_Q5_0: q5_0_rows(w, a, y, ldy, r0, r1); break;
    case TP_GGML_Q5_1: q5_1_rows(w, a, y, ldy, r0, r1); break;
    default: break;
    }
}

/* ---- quantizers (ggml's reference rules) ---- */

static void put16(uint8_t *p, float v)
{
    uint16_t h = tp_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Symmetric: d = (the value of largest magnitude) / -levels/2, so that
 * value maps to the lowest quant exactly. */
static void quantize_sym(const qfmt *f, const float *x, int n, uint8_t *out)
{
    int half = f->off, top = 2 * f->off - 1;
    for (int b = 0; b < n / 32; b++, x += 32, out += f->bytes) {
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[i]) > amax) {
                amax = fabsf(x[i]);
                max = x[i];
            }
        float d = max / (float)-half, id = d != 0.0f ? 1.0f / d : 0.0f;
        put16(out, d);
        uint32_t qh = 0;
        uint8_t *qs = out + 2 + (f->has_h ? 4 : 0);
        for (int j = 0; j < 16; j++) {
            int q0 = tp_qround(x[j] * id + (float)half, 0, top);
            int q1 = tp_qround(x[j + 16] * id + (float)half, 0, top);
            qs[j] = (uint8_t)((q0 & 0xf) | (q1 & 0xf) << 4);
            qh |= (uint32_t)((q0 >> 4) & 1) << j | (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        if (f->has_h)
            memcpy(out + 2, &qh, 4);
    }
}

/* With a min: m = min(x), d = (max - min) / (levels - 1). */
static void quantize_min(const qfmt *f, const float *x, int n, uint8_t *out)
{
    int top = f->has_h ? 31 : 15;
    for (int b = 0; b < n / 32; b++, x += 32, out += f->bytes) {
        float mn = x[0], mx = x[0];
        for (int i = 1; i < 32; i++) {
            mn = fminf(mn, x[i]);
            mx = fmaxf(mx, x[i]);
        }
        float d = (mx - mn) / (float)top, id = d != 0.0f ? 1.0f / d : 0.0f;
        put16(out, d);
        put16(out + 2, mn);
        uint32_t qh = 0;
        uint8_t *qs = out + 4 + (f->has_h ? 4 : 0);
        for (int j = 0; j < 16; j++) {
            int q0 = tp_qround((x[j] - mn) * id, 0, top);
            int q1 = tp_qround((x[j + 16] - mn) * id, 0, top);
            qs[j] = (uint8_t)((q0 & 0xf) | (q1 & 0xf) << 4);
            qh |= (uint32_t)((q0 >> 4) & 1) << j | (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        if (f->has_h)
            memcpy(out + 4, &qh, 4);
    }
}

void tp_quantize_q4_0(const float *x, int n, uint8_t *out) { quantize_sym(&F_Q4_0, x, n, out); }
void tp_quantize_q5_0(const float *x, int n, uint8_t *out) { quantize_sym(&F_Q5_0, x, n, out); }
void tp_quantize_q4_1(const float *x, int n, uint8_t *out) { quantize_min(&F_Q4_1, x, n, out); }
void tp_quantize_q5_1(const float *x, int n, uint8_t *out) { quantize_min(&F_Q5_1, x, n, out); }
