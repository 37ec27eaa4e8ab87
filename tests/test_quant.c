/* Typed weights (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K, MXFP4): the kernels' batch invariance, row-range splits and scalar ==
 * AVX-512 bits, closeness to a float reference, the half/bfloat16
 * conversions, and whole-model runs of the llama.cpp-written stories260K
 * files (F16 greedy == F32 greedy; batch invariance for 1 to 4 threads).
 * Dequantization against ggml's block definitions is checked by an
 * independent numpy reader in tests/quant_test.py. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/forward.h"
#include "tokpipe/gguf.h"
#include "../workers/forward/kernels.h"
#include "../workers/forward/quant.h"
#include "support/batch_runs.h"

static const uint32_t TYPES[] = {TP_GGML_F16, TP_GGML_BF16, TP_GGML_Q8_0, TP_GGML_Q4_0, TP_GGML_Q4_1,
                                 TP_GGML_Q5_0, TP_GGML_Q5_1, TP_GGML_Q4_K, TP_GGML_Q5_K, TP_GGML_Q6_K,
                                 TP_GGML_MXFP4};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

static void fill(float *x, size_t n, unsigned seed, float scale)
{
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = scale * (float)((int)(s >> 8) - (1 << 23)) / (float)(1 << 23);
    }
}

/* A typed matrix quantized from W (rows x cols); data is malloc'ed. */
static tp_wmat make_wmat(uint32_t type, const float *W, int rows, int cols)
{
    const tp_ggml_type_info *ti = tp_ggml_type(type);
    assert_non_null(ti);
    size_t rb = (size_t)cols / ti->block_elems * ti->block_bytes;
    uint8_t *d = malloc(rb * (size_t)rows);
    assert_non_null(d);
    for (int r = 0; r < rows; r++)
        tp_quant_row(type, W + (size_t)r * cols, cols, d + rb * (size_t)r);
    tp_wmat w = {type, rows, cols, rb, d, NULL};
    assert_int_equal(tp_qpanel_build(&w, NULL), 0); /* the layout of the level active (isa.h) */
    /* the panel is the one the level's kernels read, so they are the ones
     * checked: AVX-512's 16 rows with VNNI, AVX2's 4 or 8, none portable */
    tp_isa isa = tp_isa_active();
    if (w.panel && (isa == TP_ISA_PORTABLE || (w.panel->group_rows == 16) != tp_isa_have_vnni()))
        fail_msg("%s: a panel of %d rows under the %s kernels", ti->name, w.panel->group_rows, tp_isa_name(isa));
    return w;
}

/* ---- conversions ------------------------------------------------------- */

static void every_half_converts_to_float_and_back_exactly(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tp_f16_to_f32((uint16_t)h);
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (!nan && tp_f32_to_f16(f) != h)
            fail_msg("half %04x -> %a -> %04x", h, f, tp_f32_to_f16(f));
        if (nan && f == f)
            fail_msg("half NaN %04x became %a", h, f);
        float b = tp_bf16_to_f32((uint16_t)h);
        bool bnan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        if (!bnan && tp_f32_to_bf16(b) != h)
            fail_msg("bfloat16 %04x -> %a -> %04x", h, b, tp_f32_to_bf16(b));
    }
    /* ties go to even; past the largest half is infinity */
    assert_int_equal(tp_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(tp_f32_to_f16(1.0f + 0x3p-11f), 0x3c02);
    assert_int_equal(tp_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(tp_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(tp_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
}

/* ---- kernels ----------------------------------------------------------- */

static void check_type_tokens(uint32_t type, int rows, int cols, int T)
{
    const char *tn = tp_ggml_type(type)->name;
    float *W = malloc(sizeof(float) * rows * cols), *X = malloc(sizeof(float) * T * cols);
    float *Y = malloc(sizeof(float) * T * rows), *Ys = malloc(sizeof(float) * T * rows);
    float *Y1 = malloc(sizeof(float) * rows), *deq = malloc(sizeof(float) * cols);
    fill(W, (size_t)rows * cols, 3 + type, 0.1f);
    fill(X, (size_t)T * cols, 11 + type, 1.0f);
    X[5] = 0.0f; /* blocks with zeros and a constant block */
    for (int k = 0; k < 32; k++)
        W[k] = 0.25f;
    tp_wmat w = make_wmat(type, W, rows, cols);
    tp_qact a;
    assert_int_equal(tp_qact_init(&a, T, cols), 0);
    bool avx = tp_isa_active() >= TP_ISA_AVX2;
    tp_qact_prepare(&a, type, X, cols, T, cols);
    tp_qmatmul_rows(&w, &a, Y, rows, 0, rows, avx);
    /* the portable path gives the same bits */
    tp_qmatmul_rows(&w, &a, Ys, rows, 0, rows, false);
    if (memcmp(Y, Ys, sizeof(float) * T * rows))
        fail_msg("%s %dx%d: the scalar and %s paths differ", tn, rows, cols, tp_isa_name(tp_isa_active()));
    /* the file's blocks (no panel) give the same bits as the panel */
    tp_wmat wf = w;
    wf.panel = NULL;
    tp_qmatmul_rows(&wf, &a, Ys, rows, 0, rows, avx);
    if (memcmp(Y, Ys, sizeof(float) * T * rows))
        fail_msg("%s %dx%d: the file's blocks and the panel differ", tn, rows, cols);
    /* any split by rows gives the same bits */
    for (int split = 1; split < rows; split += 7) {
        memset(Ys, 0, sizeof(float) * T * rows);
        tp_qmatmul_rows(&w, &a, Ys, rows, split, rows, avx);
        tp_qmatmul_rows(&w, &a, Ys, rows, 0, split, avx);
        if (memcmp(Y, Ys, sizeof(float) * T * rows))
            fail_msg("%s %dx%d: rows split at %d differ from the whole call", tn, rows, cols, split);
    }
    /* each token alone, and every prefix of the batch, gives its row's bits */
    for (int n = 1; n <= T; n++) {
        tp_qact_prepare(&a, type, X, cols, n, cols);
        tp_qmatmul_rows(&w, &a, Ys, rows, 0, rows, avx);
        if (memcmp(Y, Ys, sizeof(float) * n * rows))
            fail_msg("%s %dx%d: a batch of %d tokens differs from the batch of %d", tn, rows, cols, n, T);
        for (int p = 0; p < 2; p++) {
            tp_qact_prepare(&a, type, X + (size_t)(n - 1) * cols, cols, 1, cols);
            tp_qmatmul_rows(&w, &a, Y1, rows, 0, rows, p == 0 && avx);
            if (memcmp(Y1, Y + (size_t)(n - 1) * rows, sizeof(float) * rows))
                fail_msg("%s %dx%d: token %d alone (%s) differs from the batch", tn, rows, cols, n - 1,
                         p ? "scalar" : "default path");
        }
    }
    /* close to the dequantized weights times the exact activations; the
     * activations' own 8-bit rounding bounds the difference */
    double werr = 0;
    for (int r = 0; r < rows; r++) {
        tp_wmat_dequant_row(&w, r, deq);
        for (int k = 0; k < cols; k++)
            werr = fmax(werr, fabs((double)deq[k] - W[(size_t)r * cols + k]));
        for (int t = 0; t < T; t++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < cols; k++) {
                ref += (double)deq[k] * X[(size_t)t * cols + k];
                mag += fabs((double)deq[k]) * fabs(X[(size_t)t * cols + k]);
            }
            double tol = (type == TP_GGML_F16 || type == TP_GGML_BF16 ? 1e-5 : 1.0 / 127) * mag + 1e-6;
            if (fabs(Y[(size_t)t * rows + r] - ref) > tol)
                fail_msg("%s: y[%d][%d] = %g, dequantized reference %g (tolerance %g)", tn, t, r,
                         Y[(size_t)t * rows + r], ref, tol);
        }
    }
    /* the quantizer's own error: half a step of the coarsest type */
    double bound = type == TP_GGML_F16 ? 1e-4 : type == TP_GGML_BF16 ? 1e-3 : 0.1 * 2 / 7;
    if (werr > bound)
        fail_msg("%s: dequantized weights are %g from the originals (bound %g)", tn, werr, bound);
    tp_qact_free(&a);
    tp_qpanel_free(&w);
    free((void *)w.data);
    free(W); free(X); free(Y); free(Ys); free(Y1); free(deq);
}

/* Activation quantization: the AVX-512, AVX2 and scalar paths give the
 * same quants, scales and sums, NaN, infinities, zeros and ties included. */
static void activation_quantization_paths_agree(void **state)
{
    (void)state;
    bool avx512 = tp_isa_cpu() >= TP_ISA_AVX512, avx2 = tp_isa_cpu() >= TP_ISA_AVX2;
    if (!avx2)
        skip();
    enum { T = 9, C = 4096 };
    float *X = malloc(sizeof(float) * T * C);
    fill(X, (size_t)T * C, 5, 3.0f);
    for (int i = 0; i < C; i += 97)
        X[i] = 0.0f;
    for (int i = 0; i < 32; i++) /* a block of zeros and one of equal values */
        X[64 + i] = 0.0f, X[96 + i] = -1.5f;
    X[200] = NAN, X[300] = INFINITY, X[301] = -INFINITY, X[400] = -NAN;
    for (int i = 0; i < 32; i++) /* halves: x * (127 / max) lands on .5 */
        X[512 + i] = (float)(i - 16) * 0.5f, X[544 + i] = 127.0f - (float)i;
    tp_qact a, b;
    assert_int_equal(tp_qact_init(&a, T, C), 0);
    assert_int_equal(tp_qact_init(&b, T, C), 0);
    tp_qact_prepare_path(&a, TP_GGML_Q8_0, X, C, T, C, QACT_SCALAR);
    for (int path = QACT_AVX2; path <= (avx512 ? QACT_AVX512 : QACT_AVX2); path++) {
        memset(b.q, 0x55, (size_t)T * C);
        tp_qact_prepare_path(&b, TP_GGML_Q8_0, X, C, T, C, path);
        assert_memory_equal(a.q, b.q, (size_t)T * C);
        assert_memory_equal(a.dx, b.dx, sizeof(float) * T * C / 32);
        assert_memory_equal(a.sum, b.sum, sizeof(float) * T * C / 32);
        assert_memory_equal(a.nsum32, b.nsum32, sizeof(int32_t) * T * C / 32);
        assert_memory_equal(a.nsum16, b.nsum16, sizeof(int32_t) * T * C / 16);
    }
    tp_qact_free(&a);
    tp_qact_free(&b);
    free(X);
}

/* Activations prepared in pieces (block ranges of a row, in any order)
 * and rows gathered from another preparation give tp_qact_prepare's
 * bytes: what the MoE FFN does for down's input (in the gate/up job) and
 * for gate and up's (a token's row copied to its experts' rows). */
static void activation_pieces_and_gathers_equal_one_preparation(void **state)
{
    (void)state;
    enum { T = 5, C = 320, NB = C / 32 };
    float *X = malloc(sizeof(float) * T * C);
    fill(X, (size_t)T * C, 8, 2.0f);
    X[33] = NAN;
    tp_qact whole, parts, tok, g;
    assert_int_equal(tp_qact_init(&whole, T, C), 0);
    assert_int_equal(tp_qact_init(&parts, T, C), 0);
    assert_int_equal(tp_qact_init(&tok, T, C), 0);
    assert_int_equal(tp_qact_init(&g, 2 * T, C), 0);
    tp_qact_prepare(&whole, TP_GGML_MXFP4, X, C, T, C);
    tp_qact_layout(&parts, TP_GGML_MXFP4, X, C, T, C);
    for (int t = T - 1; t >= 0; t--) /* pieces of 3, 1 and 6 blocks, the last first */
        tp_qact_prepare_blocks(&parts, t, 4, NB), tp_qact_prepare_blocks(&parts, t, 3, 4),
            tp_qact_prepare_blocks(&parts, t, 0, 3);
    assert_int_equal(parts.n_tok, T);
    assert_memory_equal(whole.q, parts.q, (size_t)T * C);
    assert_memory_equal(whole.dx, parts.dx, sizeof(float) * T * NB);
    assert_memory_equal(whole.sum, parts.sum, sizeof(float) * T * NB);
    assert_memory_equal(whole.nsum32, parts.nsum32, sizeof(int32_t) * T * NB);
    assert_memory_equal(whole.nsum16, parts.nsum16, sizeof(int32_t) * T * 2 * NB);
    /* rows 4 0 0 3 1 2 ... gathered equal those rows prepared */
    int from[2 * T];
    float *Xg = malloc(sizeof(float) * 2 * T * C);
    for (int i = 0; i < 2 * T; i++) {
        from[i] = (i * 4 + i / 3) % T;
        memcpy(Xg + (size_t)i * C, X + (size_t)from[i] * C, sizeof(float) * C);
    }
    tp_qact_prepare(&tok, TP_GGML_MXFP4, X, C, T, C);
    tp_qact_gather(&g, &tok, from, 2 * T);
    tp_qact ref;
    assert_int_equal(tp_qact_init(&ref, 2 * T, C), 0);
    tp_qact_prepare(&ref, TP_GGML_MXFP4, Xg, C, 2 * T, C);
    assert_int_equal(g.n_tok, 2 * T);
    assert_int_equal(g.cols, C);
    assert_memory_equal(ref.q, g.q, (size_t)2 * T * C);
    assert_memory_equal(ref.dx, g.dx, sizeof(float) * 2 * T * NB);
    assert_memory_equal(ref.sum, g.sum, sizeof(float) * 2 * T * NB);
    assert_memory_equal(ref.nsum32, g.nsum32, sizeof(int32_t) * 2 * T * NB);
    assert_memory_equal(ref.nsum16, g.nsum16, sizeof(int32_t) * 2 * T * 2 * NB);
    tp_qact_free(&whole); tp_qact_free(&parts); tp_qact_free(&tok); tp_qact_free(&g); tp_qact_free(&ref);
    free(X); free(Xg);
}

/* ---- MXFP4 against ggml's reference (ggml-quants.c), transcribed ---- */

static const int8_t GGML_KVALUES_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ggml_e8m0_to_fp32_half */
static float ggml_e8m0_half(uint8_t x)
{
    uint32_t bits = x < 2 ? 0x00200000u << x : (uint32_t)(x - 1) << 23;
    float r;
    memcpy(&r, &bits, 4);
    return r;
}

/* dequantize_row_mxfp4 */
static void ggml_dequantize_row_mxfp4(const uint8_t *x, float *y, int k)
{
    for (int i = 0; i < k / 32; i++) {
        const uint8_t *blk = x + 17 * i;
        const float d = ggml_e8m0_half(blk[0]);
        for (int j = 0; j < 16; ++j) {
            const int8_t x0 = GGML_KVALUES_MXFP4[blk[1 + j] & 0x0F];
            const int8_t x1 = GGML_KVALUES_MXFP4[blk[1 + j] >> 4];
            y[i * 32 + j + 0] = x0 * d;
            y[i * 32 + j + 16] = x1 * d;
        }
    }
}

/* quantize_row_mxfp4_ref with best_index_mxfp4 */
static void ggml_quantize_row_mxfp4(const float *x, uint8_t *y, int k)
{
    for (int i = 0; i < k / 32; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[i * 32 + j]))
                amax = fabsf(x[i * 32 + j]);
        const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = ggml_e8m0_half(e);
        uint8_t *blk = y + 17 * i;
        blk[0] = e;
        for (int j = 0; j < 16; ++j) {
            int idx[2];
            for (int h = 0; h < 2; h++) {
                float v = x[i * 32 + 16 * h + j];
                int best = 0;
                float best_err = fabsf(GGML_KVALUES_MXFP4[0] * d - v);
                for (int q = 1; q < 16; q++) {
                    float err = fabsf(GGML_KVALUES_MXFP4[q] * d - v);
                    if (err < best_err) {
                        best = q;
                        best_err = err;
                    }
                }
                idx[h] = best;
            }
            blk[1 + j] = (uint8_t)(idx[0] | idx[1] << 4);
        }
    }
}

/* Every scale byte (subnormal 2^-128 and 2^-127 to 2^126) with every code
 * in both nibbles: the dequantized bits are ggml's; the quantizer writes
 * ggml's bytes; the scale is the power of two E8M0 says. */
static void mxfp4_dequantizes_and_quantizes_as_ggml(void **state)
{
    (void)state;
    enum { COLS = 256 * 32 };
    uint8_t *blocks = malloc(256 * 17);
    float *ours = malloc(sizeof(float) * COLS), *ref = malloc(sizeof(float) * COLS);
    uint32_t s = 7;
    for (int e = 0; e < 256; e++) {
        blocks[17 * e] = (uint8_t)e;
        for (int j = 0; j < 16; j++) {
            s = s * 1664525u + 1013904223u;
            blocks[17 * e + 1 + j] = j < 16 && e % 2 ? (uint8_t)(j | (15 - j) << 4) : (uint8_t)(s >> 24);
        }
        if (ggml_e8m0_half((uint8_t)e) != ldexpf(1.0f, e - 128))
            fail_msg("e8m0 %d is not 2^%d", e, e - 128);
        if (tp_e8m0_to_f32_half((uint8_t)e) != ggml_e8m0_half((uint8_t)e))
            fail_msg("e8m0 %d: %a, ggml %a", e, tp_e8m0_to_f32_half((uint8_t)e), ggml_e8m0_half((uint8_t)e));
    }
    tp_wmat w = {TP_GGML_MXFP4, 1, COLS, 256 * 17, blocks, NULL};
    tp_wmat_dequant_row(&w, 0, ours);
    ggml_dequantize_row_mxfp4(blocks, ref, COLS);
    for (int i = 0; i < COLS; i++) {
        uint32_t a, b;
        memcpy(&a, &ours[i], 4);
        memcpy(&b, &ref[i], 4);
        if (a != b)
            fail_msg("mxfp4 element %d (e %d): %a, ggml %a", i, i / 32, ours[i], ref[i]);
    }
    /* the quantizer: wide ranges, zeros, ties between codes */
    float *x = malloc(sizeof(float) * 64 * 32);
    fill(x, 64 * 32, 9, 1.0f);
    for (int b = 0; b < 64; b++)
        for (int j = 0; j < 32; j++)
            x[32 * b + j] *= ldexpf(1.0f, b - 40);
    for (int j = 0; j < 32; j++)
        x[j] = 0.0f, x[32 + j] = 0.5f * (float)(j - 16);
    uint8_t *q1 = malloc(64 * 17), *q2 = malloc(64 * 17);
    tp_quant_row(TP_GGML_MXFP4, x, 64 * 32, q1);
    ggml_quantize_row_mxfp4(x, q2, 64 * 32);
    assert_memory_equal(q1, q2, 64 * 17);
    free(x); free(q1); free(q2);
    free(blocks); free(ours); free(ref);
}

/* MXFP4's vector kernels against the portable path on raw blocks: scale
 * bytes 0 (2^-128, subnormal) to 229, random codes, and tokens whose
 * activation scales fall from 2^-7 to 2^-103, so that d * dx is subnormal
 * (rounded) or zero for the small scales: the AVX-512 panel computes it
 * as dx scaled by a power of two, which must round as the product does.
 * 37 rows (a partial group of 16), 10 blocks (a partial line of scales). */
static void mxfp4_kernels_agree_on_subnormal_and_large_scales(void **state)
{
    (void)state;
    enum { ROWS = 37, COLS = 320, T = 13, RB = COLS / 32 * 17 };
    uint8_t *d = malloc((size_t)ROWS * RB);
    uint32_t s = 3;
    for (int i = 0; i < ROWS * RB; i++) {
        s = s * 1664525u + 1013904223u;
        int r = i / RB, b = i % RB / 17; /* a row's scales within 2^10: a small term is not lost in the sum */
        d[i] = (uint8_t)(i % RB % 17 ? s >> 24 : (uint32_t)(r * 11 % 221 + b));
    }
    float *X = malloc(sizeof(float) * T * COLS), *Ys = malloc(sizeof(float) * T * ROWS);
    float *Yv = malloc(sizeof(float) * T * ROWS);
    fill(X, (size_t)T * COLS, 4, 1.0f);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < COLS; k++)
            X[t * COLS + k] = ldexpf(X[t * COLS + k], -8 * t);
    tp_qact a;
    assert_int_equal(tp_qact_init(&a, T, COLS), 0);
    tp_qact_prepare(&a, TP_GGML_MXFP4, X, COLS, T, COLS);
    tp_wmat w = {TP_GGML_MXFP4, ROWS, COLS, RB, d, NULL};
    tp_qmatmul_rows(&w, &a, Ys, ROWS, 0, ROWS, false);
    tp_isa before = tp_isa_active();
    for (tp_isa level = TP_ISA_AVX2; level <= TP_ISA_AVX512 && level <= tp_isa_cpu(); level++) {
        tp_isa_cap_for_tests(level);
        assert_int_equal(tp_qpanel_build(&w, NULL), 0);
        memset(Yv, 0x55, sizeof(float) * T * ROWS);
        tp_qmatmul_rows(&w, &a, Yv, ROWS, 0, ROWS, true);
        for (int i = 0; i < T * ROWS; i++)
            if (memcmp(&Ys[i], &Yv[i], 4))
                fail_msg("mxfp4 %s: token %d row %d: %a, portable %a", tp_isa_name(level), i / ROWS, i % ROWS,
                         Yv[i], Ys[i]);
        tp_qpanel_free(&w);
    }
    tp_isa_cap_for_tests(before);
    tp_qact_free(&a);
    free(d); free(X); free(Ys); free(Yv);
}

static void check_type(uint32_t type, int rows, int cols) { check_type_tokens(type, rows, cols, 13); }

/* Every type's kernels at one vector level (isa.h), against the portable
 * path and themselves: the level is capped so a CPU with AVX-512 checks
 * its AVX2 kernels too; a level the CPU lacks is skipped, visibly. */
static void every_type_at_level(tp_isa level)
{
    if (tp_isa_cpu() < level) {
        print_message("skipped: this CPU has no %s\n", tp_isa_name(level));
        skip();
    }
    tp_isa before = tp_isa_active();
    tp_isa_cap_for_tests(level);
    for (size_t i = 0; i < N_TYPES; i++) {
        uint32_t be = tp_ggml_type(TYPES[i])->block_elems;
        check_type(TYPES[i], 37, 512);
        if (be < 256) /* an odd number of 32-column blocks: the half chunk */
            check_type(TYPES[i], 21, 288);
        if (be == 1) {
            check_type(TYPES[i], 9, 172);
            /* wide rows that the AVX2 kernel takes in column passes, a tail
             * past the last whole 16, more tokens than its token block */
            check_type_tokens(TYPES[i], 6, 2072, 53);
        }
    }
    tp_isa_cap_for_tests(before);
}

static void every_type_is_batch_split_and_path_invariant_portable(void **state)
{
    (void)state;
    every_type_at_level(TP_ISA_PORTABLE);
}

static void every_type_is_batch_split_and_path_invariant_with_avx2(void **state)
{
    (void)state;
    every_type_at_level(TP_ISA_AVX2);
}

static void every_type_is_batch_split_and_path_invariant_with_avx512(void **state)
{
    (void)state;
    every_type_at_level(TP_ISA_AVX512);
}

/* ---- whole models ------------------------------------------------------ */

/* Greedy ids after PROMPT, n of them. */
static void greedy_ids(const char *name, bool scalar, int *ids, int n)
{
    static const int prompt[5] = {1, 403, 407, 261, 378};
    tp_model *m = load_real(name);
    int V = tp_model_get_config(m)->vocab_size;
    tp_err e;
    tp_forward *f;
    assert_int_equal(tp_forward_new(m, 1, 0, 8, &f, &e), 0);
    if (scalar)
        tp_forward_use_scalar_for_tests(f);
    int sid;
    assert_int_equal(tp_forward_seq_open(f, &sid, &e), 0);
    float *logits = malloc(sizeof(float) * V);
    tp_fwd_item it = {sid, 0, prompt, 5, false};
    assert_int_equal(tp_forward_step(f, &it, 1, logits, &e), 0);
    for (int k = 0; k < n; k++) {
        ids[k] = argmax(logits, V);
        tp_fwd_item d = {sid, 5 + k, &ids[k], 1, false};
        if (k + 1 < n)
            assert_int_equal(tp_forward_step(f, &d, 1, logits, &e), 0);
    }
    free(logits);
    tp_forward_free(f);
    tp_model_free(m);
}

static void f16_file_from_llama_cpp_gives_the_f32_greedy_ids(void **state)
{
    (void)state;
    int n = 200, a[200], b[200], c[200];
    greedy_ids("stories260K.gguf", false, a, n);
    greedy_ids("gguf-quant/stories260K-f16.gguf", false, b, n);
    greedy_ids("gguf-quant/stories260K-f16.gguf", true, c, n);
    for (int k = 0; k < n; k++)
        if (a[k] != b[k] || a[k] != c[k])
            fail_msg("greedy id %d: F32 %d, F16 %d (scalar path %d)", k, a[k], b[k], c[k]);
}

/* Q8_0 / Q4_0 change the weights: their text may leave F32's after a
 * while, but it must start the same (the first ids are confident) and
 * never be degenerate. */
static void q8_0_and_q4_0_files_from_llama_cpp_start_like_f32(void **state)
{
    (void)state;
    int n = 100, a[100], b[100];
    greedy_ids("stories260K.gguf", false, a, n);
    const char *files[] = {"gguf-quant/stories260K-q8_0.gguf", "gguf-quant/stories260K-q4_0.gguf"};
    const int want_same[] = {40, 12};
    for (int i = 0; i < 2; i++) {
        greedy_ids(files[i], false, b, n);
        for (int k = 0; k < want_same[i]; k++)
            if (a[k] != b[k])
                fail_msg("%s: greedy id %d is %d, F32 gives %d", files[i], k, b[k], a[k]);
        int distinct = 0;
        for (int k = 0; k < n; k++) {
            bool seen = false;
            for (int j = 0; j < k; j++)
                seen = seen || b[j] == b[k];
            distinct += !seen;
        }
        if (distinct < 25)
            fail_msg("%s: only %d distinct ids in %d greedy tokens", files[i], distinct, n);
    }
}

static void batch_invariance(const char *name)
{
    tp_model *m = load_real(name);
    int V = tp_model_get_config(m)->vocab_size;
    size_t n = (size_t)NSEQ * (DECODE + 1) * V;
    float *alone = malloc(sizeof(float) * n), *batched = calloc(n, sizeof(float));
    for (int scalar = 0; scalar < 2; scalar++) {
        run_alone(m, alone, V, 1, scalar, TP_KV_F32);
        /* batch 1 on several threads (Q/K/V and gate/up one job each, cut
         * over the threads): the bits of one thread */
        for (int threads = 2; threads <= 3; threads++) {
            run_alone(m, batched, V, threads, scalar, TP_KV_F32);
            for (size_t off = 0; off < n; off += (size_t)V)
                if (memcmp(alone + off, batched + off, sizeof(float) * V))
                    fail_msg("%s, %s: batch-1 logits row %zu on %d threads differ from 1 thread", name,
                             scalar ? "scalar" : "vector", off / (size_t)V, threads);
        }
        for (int threads = 1; threads <= 4; threads++) {
            memset(batched, 0, sizeof(float) * n);
            run_batched(m, batched, V, threads, scalar, TP_KV_F32);
            for (int s = 0; s < NSEQ; s++)
                for (int k = 0; k <= DECODE; k++) {
                    size_t off = ((size_t)s * (DECODE + 1) + k) * V;
                    if (memcmp(alone + off, batched + off, sizeof(float) * V))
                        fail_msg("%s, %s, %d thread(s): sequence %d, logits row %d: batched differs from alone",
                                 name, scalar ? "scalar" : "vector", threads, s, k);
                }
        }
    }
    free(alone);
    free(batched);
    tp_model_free(m);
}

static void llama_cpp_quantized_files_are_batch_invariant(void **state)
{
    (void)state;
    batch_invariance("gguf-quant/stories260K-f16.gguf");
    batch_invariance("gguf-quant/stories260K-q8_0.gguf");
    batch_invariance("gguf-quant/stories260K-q4_0.gguf");
}

/* Files written by `tokpipe quantize` (every type) when the test runner
 * made them (TP_QUANT_DIR, see tests/quant_test.py); skipped otherwise. */
static void quantize_outputs_of_every_type_are_batch_invariant(void **state)
{
    (void)state;
    const char *dir = getenv("TP_QUANT_DIR");
    if (!dir)
        skip();
    const char *names[] = {"F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
                           "Q4_K_M", "Q5_K_M"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, names[i]);
        batch_invariance(path);
    }
}

static void openblas_kernel_is_refused_for_typed_weights(void **state)
{
    (void)state;
    tp_model *m = load_real("gguf-quant/stories260K-q8_0.gguf");
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 1, 0, 8, &f, &e), 0);
    assert_int_equal(tp_forward_set_kernel(f, TP_FWD_KERNEL_OPENBLAS, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "F32"));
    assert_int_equal(tp_forward_kernel(f), TP_FWD_KERNEL_INVARIANT);
    tp_forward_free(f);
    tp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_half_converts_to_float_and_back_exactly),
        cmocka_unit_test(every_type_is_batch_split_and_path_invariant_portable),
        cmocka_unit_test(every_type_is_batch_split_and_path_invariant_with_avx2),
        cmocka_unit_test(every_type_is_batch_split_and_path_invariant_with_avx512),
        cmocka_unit_test(activation_quantization_paths_agree),
        cmocka_unit_test(activation_pieces_and_gathers_equal_one_preparation),
        cmocka_unit_test(mxfp4_dequantizes_and_quantizes_as_ggml),
        cmocka_unit_test(mxfp4_kernels_agree_on_subnormal_and_large_scales),
        cmocka_unit_test(f16_file_from_llama_cpp_gives_the_f32_greedy_ids),
        cmocka_unit_test(q8_0_and_q4_0_files_from_llama_cpp_start_like_f32),
        cmocka_unit_test(llama_cpp_quantized_files_are_batch_invariant),
        cmocka_unit_test(quantize_outputs_of_every_type_are_batch_invariant),
        cmocka_unit_test(openblas_kernel_is_refused_for_typed_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
