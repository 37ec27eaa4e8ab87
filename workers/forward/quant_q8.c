/* Q8_0 weights: blocks of 32 int8 quants with one f16 scale (34 bytes). */
#include "quant.h"
#include "quant_avx.h"

#include <math.h>
#include <string.h>

#define Q8_0_BYTES 34

void tp_qunpack_q8_0(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16])
{
    int nb = n_cols - 64 * c >= 64 ? 2 : 1;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)(2 * c + b) * Q8_0_BYTES;
        float d = tp_f16_to_f32(tp_qrd16(blk));
        memcpy(w + 32 * b, blk + 2, 32);
        for (int l = 0; l < 8; l++) {
            ws[8 * b + l] = d;
            wm[8 * b + l] = 0.0f;
        }
    }
}

/* The AVX-512 kernel over panels (quant_avx.h): the quants plus 128. */
TP_QPANEL_APPLY(TP_QPANEL_DEFINE, q8_0, TP_QPANEL_Q8_0)

void tp_qrows_q8_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    q8_0_rows(w, a, y, ldy, r0, r1);
}

/* ggml's quantize_row_q8_0_ref: d = max|x| / 127, q = round(x / d). */
void tp_quantize_q8_0(const float *x, int n, uint8_t *out)
{
    for (int b = 0; b < n / 32; b++, x += 32, out += Q8_0_BYTES) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = tp_f32_to_f16(d);
        memcpy(out, &dh, 2);
        for (int i = 0; i < 32; i++)
            out[2 + i] = (uint8_t)(int8_t)tp_qround(x[i] * id, -127, 127);
    }
}
