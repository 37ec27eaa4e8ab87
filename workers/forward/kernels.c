/* Packed f32 matmul with a fixed per-element accumulation order. */
#include "kernels.h"
#include "tokpipe/error.h"
#include "tokpipe/isa.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#define UNROLL _Pragma("unroll")
#else
#define UNROLL _Pragma("GCC unroll 8")
#endif

#define NP_MAX 4 /* panels per kernel call: 4 x 16 rows */
#define TB_MAX 6 /* tokens per kernel call: 4 x 6 = 24 accumulators */

/* Panels are stored in groups of 4 (then 2, then 1 for the remainder), each
 * group as [K][np * 16]: the kernel reads one contiguous run per k, a single
 * memory stream. Groups are formed the same way by the packer, the kernel
 * and the scalar path. */
static int group_np(int panels, int pg)
{
    int left = panels - pg;
    return left >= 4 ? 4 : left >= 2 ? 2 : 1;
}

/* Offset of W[r][0] in the packed array and the stride between its k's. */
static size_t row_offset(const tp_packed *w, int r, size_t *kstride)
{
    int p = r / TP_PANEL, pg = 0, np = group_np(w->panels, 0);
    while (p >= pg + np) {
        pg += np;
        np = group_np(w->panels, pg);
    }
    *kstride = (size_t)np * TP_PANEL;
    return (size_t)pg * TP_PANEL * (size_t)w->cols + (size_t)(p - pg) * TP_PANEL + (size_t)(r % TP_PANEL);
}

int tp_pack(const float *const *parts, const int *part_rows, int n_parts, int cols, tp_packed *out)
{
    int rows = 0;
    for (int i = 0; i < n_parts; i++)
        rows += part_rows[i];
    int panels = (rows + TP_PANEL - 1) / TP_PANEL;
    size_t bytes = (size_t)panels * (size_t)cols * TP_PANEL * sizeof(float);
    float *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p)
        return TP_ENOMEM;
    memset(p, 0, bytes);
    *out = (tp_packed){p, rows, cols, panels};
    int r = 0;
    for (int i = 0; i < n_parts; i++)
        for (int pr = 0; pr < part_rows[i]; pr++, r++) {
            const float *src = parts[i] + (size_t)pr * (size_t)cols;
            size_t ks;
            float *dst = p + row_offset(out, r, &ks);
            for (int k = 0; k < cols; k++)
                dst[(size_t)k * ks] = src[k];
        }
    return 0;
}

void tp_packed_free(tp_packed *w)
{
    if (w) {
        free(w->p);
        w->p = NULL;
    }
}

TP_SCALAR_CLONES /* kernels.h */ static void matmul_scalar(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy, int r0,
                          int r1)
{
    for (int r = r0; r < r1; r++) {
        size_t ks;
        const float *pw = w->p + row_offset(w, r, &ks);
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * (size_t)ldx;
            float acc = 0.0f;
            for (int k = 0; k < w->cols; k++)
                acc = fmaf(xt[k], pw[(size_t)k * ks], acc);
            y[(size_t)t * (size_t)ldy + r] = acc;
        }
    }
}

void tp_matmul_scalar(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy)
{
    matmul_scalar(w, x, ldx, n_tok, y, ldy, 0, w->rows);
}

/* One block: NP panels x TB tokens, all of K. Inlined with constant NP/TB so
 * the accumulators live in registers. */
__attribute__((target("avx512f"), always_inline)) static inline void
block(const float *restrict pw, const float *restrict x, size_t ldx, int K,
      float *restrict y, size_t ldy, int rows_left, const int NP, const int TB)
{
    __m512 acc[NP_MAX][TB_MAX];
    UNROLL for (int p = 0; p < NP; p++)
        UNROLL for (int t = 0; t < TB; t++)
            acc[p][t] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m512 wv[NP_MAX];
        UNROLL for (int p = 0; p < NP; p++)
            wv[p] = _mm512_load_ps(pw + (size_t)k * (size_t)(NP * TP_PANEL) + (size_t)p * TP_PANEL);
        UNROLL for (int t = 0; t < TB; t++) {
            __m512 xb = _mm512_set1_ps(x[(size_t)t * ldx + (size_t)k]);
            UNROLL for (int p = 0; p < NP; p++)
                acc[p][t] = _mm512_fmadd_ps(xb, wv[p], acc[p][t]);
        }
    }
    UNROLL for (int p = 0; p < NP; p++) {
        int n = rows_left - p * TP_PANEL;
        __mmask16 m = n >= TP_PANEL ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
        UNROLL for (int t = 0; t < TB; t++)
            _mm512_mask_storeu_ps(y + (size_t)t * ldy + (size_t)p * TP_PANEL, m, acc[p][t]);
    }
}

typedef void (*block_fn)(const float *, const float *, size_t, int, float *, size_t, int);

#define BLOCK_FN(np, tb) \
    __attribute__((target("avx512f"))) static void block_##np##_##tb( \
        const float *pw, const float *x, size_t ldx, int K, float *y, size_t ldy, int rl) \
    { block(pw, x, ldx, K, y, ldy, rl, np, tb); }
#define BLOCK_ROW(np) \
    BLOCK_FN(np, 1) BLOCK_FN(np, 2) BLOCK_FN(np, 3) BLOCK_FN(np, 4) BLOCK_FN(np, 5) BLOCK_FN(np, 6)
BLOCK_ROW(1)
BLOCK_ROW(2)
BLOCK_ROW(4)

static const block_fn blocks[NP_MAX + 1][TB_MAX + 1] = {
    [1] = {NULL, block_1_1, block_1_2, block_1_3, block_1_4, block_1_5, block_1_6},
    [2] = {NULL, block_2_1, block_2_2, block_2_3, block_2_4, block_2_5, block_2_6},
    [4] = {NULL, block_4_1, block_4_2, block_4_3, block_4_4, block_4_5, block_4_6},
};

/* Panel groups outermost: a group (4 x 16 rows x K, one contiguous run)
 * stays in L1/L2 while every token block streams past it, so weights come
 * from memory once per call. */
static void matmul_avx512(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy, int pg0,
                          int pg1)
{
    for (int pg = pg0; pg < pg1;) {
        int np = group_np(w->panels, pg);
        const float *pw = w->p + (size_t)pg * TP_PANEL * (size_t)w->cols;
        int rows_left = w->rows - pg * TP_PANEL;
        /* Equal-sized token blocks (32 -> 6,6,5,5,5,5, not 6x5+2): small
         * blocks have too few independent FMA chains to fill the pipes. */
        int n_blocks = (n_tok + TB_MAX - 1) / TB_MAX;
        for (int b = 0, t0 = 0; b < n_blocks; b++) {
            int tb = (n_tok - t0) / (n_blocks - b) + ((n_tok - t0) % (n_blocks - b) ? 1 : 0);
            blocks[np][tb](pw, x + (size_t)t0 * (size_t)ldx, (size_t)ldx, w->cols,
                           y + (size_t)t0 * (size_t)ldy + (size_t)pg * TP_PANEL, (size_t)ldy, rows_left);
            t0 += tb;
        }
        pg += np;
    }
}

/* The AVX2 kernel for CPUs without AVX-512 (Zen 1-3, Intel desktop
 * parts): the same panels, 8 rows per register, so a panel is two
 * registers. Each output is still one FMA chain over k from 0: the bits
 * of the scalar and AVX-512 paths. NV registers of rows x TB tokens. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
block_avx2(const float *restrict pw, size_t kstride, const float *restrict x, size_t ldx, int K,
           float *restrict y, size_t ldy, int rows_left, const int NV, const int TB)
{
    __m256 acc[8][3];
    UNROLL for (int v = 0; v < NV; v++)
        UNROLL for (int t = 0; t < TB; t++)
            acc[v][t] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *wk = pw + (size_t)k * kstride;
        UNROLL for (int t = 0; t < TB; t++) {
            __m256 xb = _mm256_broadcast_ss(x + (size_t)t * ldx + (size_t)k);
            UNROLL for (int v = 0; v < NV; v++)
                acc[v][t] = _mm256_fmadd_ps(xb, _mm256_load_ps(wk + 8 * v), acc[v][t]);
        }
    }
    UNROLL for (int v = 0; v < NV; v++) {
        int n = rows_left - 8 * v;
        UNROLL for (int t = 0; t < TB; t++) {
            float *yt = y + (size_t)t * ldy + 8 * (size_t)v;
            if (n >= 8) {
                _mm256_storeu_ps(yt, acc[v][t]);
            } else if (n > 0) {
                float tmp[8];
                _mm256_storeu_ps(tmp, acc[v][t]);
                memcpy(yt, tmp, (size_t)n * sizeof(float));
            }
        }
    }
}

#define AVX2_FN(nv, tb) \
    __attribute__((target("avx2,fma"))) static void avx2_##nv##_##tb( \
        const float *pw, size_t ks, const float *x, size_t ldx, int K, float *y, size_t ldy, int rl) \
    { block_avx2(pw, ks, x, ldx, K, y, ldy, rl, nv, tb); }
AVX2_FN(8, 1) AVX2_FN(4, 1) AVX2_FN(2, 1) AVX2_FN(4, 2) AVX2_FN(4, 3) AVX2_FN(2, 2) AVX2_FN(2, 3)

typedef void (*avx2_fn)(const float *, size_t, const float *, size_t, int, float *, size_t, int);

/* Batch 1 takes a whole panel group per pass (up to 8 registers, one
 * stream); more tokens take 4 registers x up to 3 tokens, the group
 * re-read from L1/L2 per block. */
static void matmul_avx2(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy, int pg0,
                        int pg1)
{
    for (int pg = pg0; pg < pg1;) {
        int np = group_np(w->panels, pg), nv = 2 * np;
        size_t ks = (size_t)np * TP_PANEL;
        const float *pw = w->p + (size_t)pg * TP_PANEL * (size_t)w->cols;
        int rows_left = w->rows - pg * TP_PANEL;
        float *yg = y + (size_t)pg * TP_PANEL;
        if (n_tok == 1) {
            avx2_fn fn = nv == 8 ? avx2_8_1 : nv == 4 ? avx2_4_1 : avx2_2_1;
            fn(pw, ks, x, (size_t)ldx, w->cols, yg, (size_t)ldy, rows_left);
        } else {
            int cv = nv < 4 ? nv : 4;
            int n_blocks = (n_tok + 2) / 3;
            for (int v0 = 0; v0 < nv; v0 += cv)
                for (int b = 0, t0 = 0; b < n_blocks; b++) {
                    int tb = (n_tok - t0) / (n_blocks - b) + ((n_tok - t0) % (n_blocks - b) ? 1 : 0);
                    avx2_fn fn = cv == 4 ? (tb == 1 ? avx2_4_1 : tb == 2 ? avx2_4_2 : avx2_4_3)
                                         : (tb == 1 ? avx2_2_1 : tb == 2 ? avx2_2_2 : avx2_2_3);
                    fn(pw + 8 * (size_t)v0, ks, x + (size_t)t0 * (size_t)ldx, (size_t)ldx, w->cols,
                       yg + (size_t)t0 * (size_t)ldy + 8 * (size_t)v0, (size_t)ldy, rows_left - 8 * v0);
                    t0 += tb;
                }
        }
        pg += np;
    }
}

void tp_matmul_panels(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy, int pg0,
                      int pg1, bool simd)
{
    tp_isa isa = simd ? tp_isa_active() : TP_ISA_PORTABLE;
    if (isa >= TP_ISA_AVX512) {
        matmul_avx512(w, x, ldx, n_tok, y, ldy, pg0, pg1);
    } else if (isa >= TP_ISA_AVX2) {
        matmul_avx2(w, x, ldx, n_tok, y, ldy, pg0, pg1);
    } else {
        int r1 = pg1 * TP_PANEL < w->rows ? pg1 * TP_PANEL : w->rows;
        matmul_scalar(w, x, ldx, n_tok, y, ldy, pg0 * TP_PANEL, r1);
    }
}

void tp_matmul_rows(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy, int r0, int r1,
                    bool simd)
{
    int pg1 = r1 >= w->rows ? w->panels : r1 / TP_PANEL;
    tp_matmul_panels(w, x, ldx, n_tok, y, ldy, r0 / TP_PANEL, pg1, simd);
}

void tp_matmul(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy)
{
    tp_matmul_panels(w, x, ldx, n_tok, y, ldy, 0, w->panels, true);
}
