/* F16 and BF16 weights: converted to f32 in the kernel (exactly), then
 * one FMA chain per column lane (quant.h's order for float types). */
#include "quant.h"
#include "quant_avx.h"

/* 16 columns starting at k as f32 (masked to the row's end). */
TP_QTARGET static inline __attribute__((always_inline)) __m512 load16(const uint8_t *row, int k, __mmask16 m,
                                                                      int bf)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * (size_t)k);
    if (bf)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

TP_QTARGET static inline __attribute__((always_inline)) void tile(const uint8_t *row, int cols, const tp_qact *a,
                                                                  int t0, float *y, size_t ldy, int bf,
                                                                  const int TB)
{
    __m512 acc[TP_QTB];
    TP_QUNROLL for (int t = 0; t < TB; t++)
        acc[t] = _mm512_setzero_ps();
    for (int k = 0; k < cols; k += 16) {
        _mm_prefetch((const char *)row + 2 * (size_t)k + TP_QPF, TP_QPF_HINT); /* see quant_avx.h */
        __mmask16 m = cols - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - k)) - 1);
        __m512 wv = load16(row, k, m, bf);
        TP_QUNROLL for (int t = 0; t < TB; t++) {
            __m512 x = _mm512_maskz_loadu_ps(m, a->x + (size_t)(t0 + t) * (size_t)a->ldx + (size_t)k);
            acc[t] = _mm512_mask3_fmadd_ps(x, wv, acc[t], m);
        }
    }
    TP_QUNROLL for (int t = 0; t < TB; t++)
        y[(size_t)t * ldy] = tp_qreduce16(acc[t]);
}

#define TILE_CASE(n) \
    case n: tile(row, w->cols, a, t0, yt, ld, bf, n); break;

TP_QTARGET void tp_qrows_f16_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    int bf = w->type == TP_GGML_BF16;
    size_t ld = (size_t)ldy;
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int t0 = 0; t0 < a->n_tok;) {
            int tb = a->n_tok - t0 < TP_QTB ? a->n_tok - t0 : TP_QTB;
            float *yt = y + (size_t)t0 * ld + (size_t)r;
            switch (tb) {
                TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4)
                TILE_CASE(5)
            default: tile(row, w->cols, a, t0, yt, ld, bf, 6); break;
            }
            t0 += tb;
        }
    }
}
