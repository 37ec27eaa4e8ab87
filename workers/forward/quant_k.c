/* k-quants: Q4_K, Q5_K, Q6_K super-blocks of 256 columns. A 64-column
 * chunk c is quarter c % 4 of super-block c / 4. */
#include "quant.h"
#include "quant_avx.h"

#include <math.h>
#include <string.h>

#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210

/* The 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes
 * (ggml's get_scale_min_k4). */
static void k4_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Lane scales of the two sub-blocks of chunk quarter j: d * sc and
 * -(dmin * m), each a float product computed once. */
static void k4_lane_scales(const uint8_t *sb, int j, float s[2], float mn[2])
{
    float d = tp_f16_to_f32(tp_qrd16(sb)), dmin = tp_f16_to_f32(tp_qrd16(sb + 2));
    for (int h = 0; h < 2; h++) {
        int sc, m;
        k4_scale_min(2 * j + h, sb + 4, &sc, &m);
        s[h] = d * (float)sc;
        mn[h] = -(dmin * (float)m);
    }
}

static void unpack_k45(const uint8_t *row, int c, bool five, int8_t w[64], float ws[16], float wm[16])
{
    const uint8_t *sb = row + (size_t)(c / 4) * (five ? Q5_K_BYTES : Q4_K_BYTES);
    int j = c % 4;
    const uint8_t *qs = sb + (five ? 48 : 16) + 32 * j, *qh = sb + 16;
    for (int l = 0; l < 32; l++) {
        int lo = qs[l] & 0xf, hi = qs[l] >> 4;
        if (five) {
            lo |= ((qh[l] >> (2 * j)) & 1) << 4;
            hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
        }
        w[l] = (int8_t)lo;
        w[32 + l] = (int8_t)hi;
    }
    float s[2], mn[2];
    k4_lane_scales(sb, j, s, mn);
    for (int l = 0; l < 16; l++) {
        ws[l] = s[l / 8];
        wm[l] = mn[l / 8];
    }
}

void tp_qunpack_q4_k(const uint8_t *row, int c, int n, int8_t w[64], float ws[16], float wm[16])
{
    (void)n;
    unpack_k45(row, c, false, w, ws, wm);
}

void tp_qunpack_q5_k(const uint8_t *row, int c, int n, int8_t w[64], float ws[16], float wm[16])
{
    (void)n;
    unpack_k45(row, c, true, w, ws, wm);
}

/* Q6_K: half h (128 columns) of a super-block uses ql[64h..], qh[32h..]
 * and scales[8h..]; its first 64 columns are the low nibbles of those 64
 * ql bytes with qh bits 0-1 (columns 0..31) and 2-3 (32..63), the next 64
 * the high nibbles with bits 4-5 and 6-7. Scale per 16 columns. */
void tp_qunpack_q6_k(const uint8_t *row, int c, int n, int8_t w[64], float ws[16], float wm[16])
{
    (void)n;
    const uint8_t *sb = row + (size_t)(c / 4) * Q6_K_BYTES;
    int h = (c % 4) / 2, sub = c % 2;
    const uint8_t *ql = sb + 64 * h, *qh = sb + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(sb + 192) + 8 * h + 4 * sub;
    float d = tp_f16_to_f32(tp_qrd16(sb + 208));
    for (int e = 0; e < 64; e++) {
        int lo = sub ? ql[e] >> 4 : ql[e] & 0xf;
        int hb = (qh[e % 32] >> (4 * sub + 2 * (e / 32))) & 3;
        w[e] = (int8_t)((lo | hb << 4) - 32);
    }
    for (int l = 0; l < 16; l++) {
        ws[l] = d * (float)sc[l / 4];
        wm[l] = 0.0f;
    }
}

/* ---- AVX-512 kernels over panels (quant_avx.h) ----
 * Q4_K and Q5_K: 4 or 5 bits with a min per 32 columns; Q6_K: 6 bits,
 * offset 32, a scale per 16 columns. */
TP_QPANEL_APPLY(TP_QPANEL_DEFINE, q4_k, TP_QPANEL_Q4_K)
TP_QPANEL_APPLY(TP_QPANEL_DEFINE, q5_k, TP_QPANEL_Q5_K)
TP_QPANEL_APPLY(TP_QPANEL_DEFINE, q6_k, TP_QPANEL_Q6_K)

void tp_qrows_k_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    switch (w->type) {
    case TP_GGML_Q4_K: q4_k_rows(w, a, y, ldy, r0, r1); break;
    case TP_GGML_Q5_K: q5_k_rows(w, a, y, ldy, r0, r1); break;
    case TP_GGML_Q6_K: q6_k_rows(w, a, y, ldy, r0, r1); break;
    default: break;
    }
}

/* ---- quantizers: straightforward min/max rules, not ggml's iterative
 * search (any valid block loads anywhere; the error is a little larger) ---- */

static void put16(uint8_t *p, float v)
{
    uint16_t h = tp_f32_to_f16(v);
    memcpy(p, &h, 2);
}

static void quantize_k45(const float *x, int n, uint8_t *out, bool five)
{
    int top = five ? 31 : 15;
    size_t bytes = five ? Q5_K_BYTES : Q4_K_BYTES;
    for (int b = 0; b < n / 256; b++, x += 256, out += bytes) {
        float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            float mn = 0.0f, mx = 0.0f; /* the min is never above 0: w = d*sc*q - dmin*m, m >= 0 */
            for (int i = 0; i < 32; i++) {
                mn = fminf(mn, x[32 * j + i]);
                mx = fmaxf(mx, x[32 * j + i]);
            }
            scale[j] = (mx - mn) / (float)top;
            mins[j] = -mn;
            max_scale = fmaxf(max_scale, scale[j]);
            max_min = fmaxf(max_min, mins[j]);
        }
        memset(out, 0, bytes);
        float d = max_scale / 63.0f, dmin = max_min / 63.0f;
        put16(out, d);
        put16(out + 2, dmin);
        d = tp_f16_to_f32(tp_qrd16(out)); /* quantize against the stored values */
        dmin = tp_f16_to_f32(tp_qrd16(out + 2));
        int ls[8], lm[8];
        for (int j = 0; j < 8; j++) {
            ls[j] = d > 0.0f ? tp_qround(scale[j] / d, 0, 63) : 0;
            lm[j] = dmin > 0.0f ? tp_qround(mins[j] / dmin, 0, 63) : 0;
        }
        uint8_t *sc = out + 4;
        for (int j = 0; j < 8; j++) {
            if (j < 4) {
                sc[j] = (uint8_t)ls[j];
                sc[j + 4] = (uint8_t)lm[j];
            } else {
                sc[j + 4] = (uint8_t)((ls[j] & 0xf) | ((lm[j] & 0xf) << 4));
                sc[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
                sc[j] |= (uint8_t)((lm[j] >> 4) << 6);
            }
        }
        uint8_t q[256];
        for (int j = 0; j < 8; j++) {
            float ds = d * (float)ls[j], dm = dmin * (float)lm[j];
            for (int i = 0; i < 32; i++)
                q[32 * j + i] = (uint8_t)(ds > 0.0f ? tp_qround((x[32 * j + i] + dm) / ds, 0, top) : 0);
        }
        uint8_t *qh = out + 16, *qs = out + (five ? 48 : 16);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                int lo = q[64 * j + l], hi = q[64 * j + 32 + l];
                qs[32 * j + l] = (uint8_t)((lo & 0xf) | (hi & 0xf) << 4);
                if (five)
                    qh[l] |= (uint8_t)(((lo >> 4) & 1) << (2 * j) | ((hi >> 4) & 1) << (2 * j + 1));
            }
    }
}

void tp_quantize_q4_k(const float *x, int n, uint8_t *out) { quantize_k45(x, n, out, false); }
void tp_quantize_q5_k(const float *x, int n, uint8_t *out) { quantize_k45(x, n, out, true); }

void tp_quantize_q6_k(const float *x, int n, uint8_t *out)
{
    for (int b = 0; b < n / 256; b++, x += 256, out += Q6_K_BYTES) {
        float scale[16], amax_s = 0.0f;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f, max = 0.0f;
            for (int i = 0; i < 16; i++)
                if (fabsf(x[16 * j + i]) > amax) {
                    amax = fabsf(x[16 * j + i]);
                    max = x[16 * j + i];
                }
            scale[j] = max / -32.0f; /* the largest magnitude maps to -32 exactly */
            amax_s = fmaxf(amax_s, fabsf(scale[j]));
        }
        memset(out, 0, Q6_K_BYTES);
        put16(out + 208, amax_s / 127.0f);
        float d = tp_f16_to_f32(tp_qrd16(out + 208));
        int8_t *sc = (int8_t *)(out + 192);
        uint8_t q[256];
        for (int j = 0; j < 16; j++) {
            sc[j] = (int8_t)(d > 0.0f ? tp_qround(scale[j] / d, -127, 127) : 0);
            float ds = d * (float)sc[j];
            for (int i = 0; i < 16; i++)
                q[16 * j + i] = (uint8_t)(ds != 0.0f ? tp_qround(x[16 * j + i] / ds, -32, 31) + 32 : 32);
        }
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = out + 64 * h, *qh = out + 128 + 32 * h;
            const uint8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                int q1 = qq[l], q2 = qq[l + 32], q3 = qq[l + 64], q4 = qq[l + 96];
                ql[l] = (uint8_t)((q1 & 0xf) | (q3 & 0xf) << 4);
                ql[l + 32] = (uint8_t)((q2 & 0xf) | (q4 & 0xf) << 4);
                qh[l] = (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
        }
    }
}
