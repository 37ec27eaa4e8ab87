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

/* The quants plus 128 as unsigned bytes (x ^ 0x80), for vpdpbusd. */
TP_QTARGET static inline __attribute__((always_inline)) void
vunpack_q8_0(const uint8_t *row, int c, int full, __m512i *u, __m512 *ws, __m512 *wm,
             tp_qstate *st)
{
    const uint8_t *b0 = row + (size_t)(2 * c) * Q8_0_BYTES;
    if (full) { /* both scales from one load (halves 0 and 17), one vector conversion: exact as the scalar one */
        __m512i v = _mm512_loadu_si512((const void *)b0);
        const __m512i pick = _mm512_set_epi16(17, 17, 17, 17, 17, 17, 17, 17, 0, 0, 0, 0, 0, 0, 0, 0, 17, 17,
                                              17, 17, 17, 17, 17, 17, 0, 0, 0, 0, 0, 0, 0, 0);
        *ws = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(pick, v)));
        __m256i q0 = _mm256_loadu_si256((const void *)(b0 + 2));
        __m256i q1 = _mm256_loadu_si256((const void *)(b0 + Q8_0_BYTES + 2));
        *u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1), _mm512_set1_epi8((char)0x80));
        (void)wm;
        (void)st;
        return;
    }
    __m256i q0 = _mm256_loadu_si256((const void *)(b0 + 2));
    __m256i q1 = full ? _mm256_loadu_si256((const void *)(b0 + Q8_0_BYTES + 2)) : _mm256_setzero_si256();
    *u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1), _mm512_set1_epi8((char)0x80));
    *ws = tp_qhalves(tp_qh2f(b0), full ? tp_qh2f(b0 + Q8_0_BYTES) : 0.0f);
    (void)wm;
    (void)st;
}

TP_QROWS_DEFINE(q8_0, vunpack_q8_0, 7, 0)

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
