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

/* The AVX-512 kernels over panels (quant_avx.h): 4 or 5 bits, offset 8 or
 * 16 for the symmetric types, a min for the _1 types. */
TP_QPANEL_APPLY(TP_QPANEL_DEFINE, q4_0, TP_QPANEL_Q4_0)
TP_QPANEL_APPLY(TP_QPANEL_DEFINE, q4_1, TP_QPANEL_Q4_1)
TP_QPANEL_APPLY(TP_QPANEL_DEFINE, q5_0, TP_QPANEL_Q5_0)
TP_QPANEL_APPLY(TP_QPANEL_DEFINE, q5_1, TP_QPANEL_Q5_1)

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
