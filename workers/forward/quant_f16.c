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

/* R rows x TB tokens: R * TB independent FMA chains (one chain waits 4
 * cycles per FMA; a row alone left decode latency-bound), each row's
 * converted weights shared by TB tokens. */
TP_QTARGET static inline __attribute__((always_inline)) void tile(const uint8_t *row0, size_t rstride, int cols,
                                                                  const tp_qact *a, int t0, float *y, size_t ldy,
                                                                  int bf, const int R, const int TB)
{
    __m512 acc[4][TP_QTB];
    TP_QUNROLL for (int i = 0; i < R; i++)
        TP_QUNROLL for (int t = 0; t < TB; t++)
            acc[i][t] = _mm512_setzero_ps();
    for (int k = 0; k < cols; k += 16) {
        __mmask16 m = cols - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - k)) - 1);
        __m512 wv[4];
        TP_QUNROLL for (int i = 0; i < R; i++) {
            const uint8_t *row = row0 + (size_t)i * rstride;
            _mm_prefetch((const char *)row + 2 * (size_t)k + TP_QPF, TP_QPF_HINT); /* see quant_avx.h */
            wv[i] = load16(row, k, m, bf);
        }
        TP_QUNROLL for (int t = 0; t < TB; t++) {
            __m512 x = _mm512_maskz_loadu_ps(m, a->x + (size_t)(t0 + t) * (size_t)a->ldx + (size_t)k);
            TP_QUNROLL for (int i = 0; i < R; i++)
                acc[i][t] = _mm512_mask3_fmadd_ps(x, wv[i], acc[i][t], m);
        }
    }
    TP_QUNROLL for (int i = 0; i < R; i++)
        TP_QUNROLL for (int t = 0; t < TB; t++)
            y[(size_t)t * ldy + (size_t)i] = tp_qreduce16(acc[i][t]);
}

#define TILE_CASE(n)                                                                                        \
    case 2 * n: tile(row, rs, w->cols, a, t0, yt, ld, bf, 1, n); break;                                     \
    case 2 * n + 1: tile(row, rs, w->cols, a, t0, yt, ld, bf, 2, n); break;

TP_QTARGET void tp_qrows_f16_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    int bf = w->type == TP_GGML_BF16;
    size_t ld = (size_t)ldy, rs = w->row_bytes;
    for (int r = r0; r < r1;) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rs;
        if (a->n_tok == 1 && r1 - r >= 4) {
            tile(row, rs, w->cols, a, 0, y + (size_t)r, ld, bf, 4, 1);
            r += 4;
            continue;
        }
        int two = r1 - r >= 2;
        for (int t0 = 0; t0 < a->n_tok;) {
            int tb = a->n_tok - t0 < TP_QTB ? a->n_tok - t0 : TP_QTB;
            float *yt = y + (size_t)t0 * ld + (size_t)r;
            switch (tb * 2 + two) {
                TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6)
            default: break; /* tb is 1..TP_QTB */
            }
            t0 += tb;
        }
        r += two ? 2 : 1;
    }
}
