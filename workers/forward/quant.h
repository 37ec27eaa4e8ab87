/* Private to the forward stage (and its tests and tools): matmuls over
 * typed weights (tp_wmat) read in place from the file, with ggml's block
 * layouts (ggml-common.h):
 *
 *   F16   IEEE half per element          BF16  bfloat16 per element
 *   Q8_0  32: f16 d, int8 qs[32]                       w = d * q
 *   Q4_0  32: f16 d, u8 qs[16] (nibbles)              w = d * (q - 8)
 *   Q4_1  32: f16 d, f16 m, u8 qs[16]                 w = d * q + m
 *   Q5_0  32: f16 d, u32 qh, u8 qs[16]                w = d * (q - 16)
 *   Q5_1  32: f16 d, f16 m, u32 qh, u8 qs[16]         w = d * q + m
 *   Q4_K 256: f16 d, f16 dmin, u8 scales[12] (6-bit scale and min of 8
 *             sub-blocks of 32), u8 qs[128]           w = d*sc*q - dmin*m
 *   Q5_K 256: as Q4_K plus u8 qh[32] (fifth bits) before qs
 *   Q6_K 256: u8 ql[128], u8 qh[64], int8 scales[16] (per 16), f16 d
 *                                                     w = d * sc * (q - 32)
 *
 * BATCH INVARIANCE. Every output element y[t][r] is computed from row r of
 * the weights and row t of the activations alone, by an order that depends
 * only on the number of columns: never on how many tokens are in the call,
 * nor on which rows the call covers. So a token's outputs are bit-identical
 * whatever else is in its step, and a matmul split by output rows among
 * threads (tp_qmatmul_rows on [r0, r1) pieces) gives the bits of the whole
 * call. The scalar and AVX-512 paths give the same bits too: both follow
 * this canonical order.
 *
 * The canonical order (integer types). The activations of each token are
 * quantized per block of 32 to int8 with one f32 scale (as ggml's Q8_0:
 * d = max|x| / 127, q = round-to-nearest-even(x / d)). Columns are taken 64
 * at a time ("chunk") as 16 lanes of 4 consecutive columns. Per lane, the
 * integer dot product p of the 4 weight quants with the 4 activation quants
 * is exact; the lane's float accumulator takes
 *     acc = fmaf(ws * dx, (float)p, acc)
 * and, for types with a min (Q4_1, Q5_1, Q4_K, Q5_K),
 *     acc = fmaf(wm * dx, (float)s, acc)     (s: sum of the 4 act. quants)
 * where ws (wm) is the weight scale (min) covering those columns as a
 * float product computed once (e.g. d * sc for Q4_K, -(dmin * m) for its
 * min) and dx the activation block's scale. The 16 accumulators start at 0
 * and are summed at the end by a fixed tree: a[i] + a[i+8], then +4, +2,
 * +1. A last half chunk (32 columns) leaves lanes 8..15 untouched.
 *
 * Float types (F16, BF16): lanes are single columns, 16 per chunk;
 * acc[l] = fmaf(x, w, acc[l]) in chunk order (weights converted exactly to
 * f32 in the kernel; AVX512-BF16's dot product is not used: it rounds
 * pairs of products differently than fmaf, which would give up equality
 * with the scalar path), the same tree at the end.
 *
 * Not repacked: the weights are read where the file has them (no second
 * copy of the model in memory, and a typed model loads instantly); rows of
 * one block-row are contiguous and streamed once per call, which is what
 * single-stream decode is bound by. */
#ifndef TOKPIPE_FORWARD_QUANT_H
#define TOKPIPE_FORWARD_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/gguf.h"
#include "tokpipe/model.h"

/* Activations prepared for one typed matmul (per call: quantized once, then
 * read by any number of row ranges, from any thread). */
typedef struct tp_qact {
    int n_tok, cols;
    bool is_float;   /* F16/BF16 weights: x is used as is */
    const float *x;  /* float types: [n_tok][ldx] (borrowed) */
    int ldx;
    int8_t *q;       /* integer types: [n_tok][cols] quants */
    float *dl;       /* [n_tok][cols / 4] the scale of each lane's block */
    int32_t *s4;     /* [n_tok][cols / 4] the sum of each lane's 4 quants */
    size_t cap;      /* elements of q allocated */
} tp_qact;

/* True for the types the typed kernels take (all of gguf.h's but F32). */
bool tp_quant_type_ok(uint32_t type);

/* Scratch for activations of up to max_tok tokens of up to max_cols
 * columns. 0 or TP_ENOMEM; free with tp_qact_free (zeroed struct ok). */
int tp_qact_init(tp_qact *a, int max_tok, int max_cols);
void tp_qact_free(tp_qact *a);

/* Prepare x ([n_tok][ldx], cols used) for weights of type wtype. n_tok and
 * cols must fit the init sizes; cols a multiple of 32 for integer types.
 * Depends only on each token's own row. */
void tp_qact_prepare(tp_qact *a, uint32_t wtype, const float *x, int ldx, int n_tok, int cols);

/* THE ROW-RANGE ENTRY POINT. y[t * ldy + r] = W[r] . x[t] for t < a->n_tok
 * and r0 <= r < r1, with w->cols == a->cols and a prepared for w->type.
 * Any split of [0, rows) into ranges, run in any order or concurrently on
 * disjoint ranges, writes the same bits as one call over [0, rows); so does
 * any n_tok (see the canonical order above). avx512 selects the AVX-512
 * (VNNI) path, which needs tp_quant_have_avx512(); same bits either way.
 * Reads a and w only. */
void tp_qmatmul_rows(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1, bool avx512);

/* The CPU has what the AVX-512 typed kernels use (F, BW, VL, VNNI). */
bool tp_quant_have_avx512(void);

/* Row r of w as floats (cols of them), exactly as ggml's dequantize_row_*
 * computes them (f32 arithmetic, no fused multiply-add). */
void tp_wmat_dequant_row(const tp_wmat *w, int r, float *out);

/* Quantize n floats (a multiple of the type's block) into type's blocks at
 * out (the type's block bytes per block). F32, F16, BF16 and every integer
 * type above. For `tokpipe quantize`. */
void tp_quant_row(uint32_t type, const float *x, int n, void *out);

/* IEEE half / bfloat16 <-> float (round to nearest even), portable. */
float tp_f16_to_f32(uint16_t h);
uint16_t tp_f32_to_f16(float f);
float tp_bf16_to_f32(uint16_t h);
uint16_t tp_f32_to_bf16(float f);

/* ---- per-family entry points (quant_f16.c, quant_q8.c, quant_q4.c,
 * quant_k.c); tp_qmatmul_rows dispatches to them. ---- */

/* Scalar view of one 64-column chunk c of a row of an integer type: the
 * signed weight quants of its (up to) 64 columns, and per lane its weight
 * scale ws and min wm (0 for types without a min). n_cols: the row's
 * columns (a last half chunk has 32). */
typedef void (*tp_qunpack_fn)(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);

void tp_qunpack_q8_0(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);
void tp_qunpack_q4_0(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);
void tp_qunpack_q4_1(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);
void tp_qunpack_q5_0(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);
void tp_qunpack_q5_1(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);
void tp_qunpack_q4_k(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);
void tp_qunpack_q5_k(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);
void tp_qunpack_q6_k(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);

/* AVX-512 row ranges per family (same contract as tp_qmatmul_rows). */
void tp_qrows_f16_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
void tp_qrows_q8_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
void tp_qrows_q4_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
void tp_qrows_k_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
void tp_qrows_f16_scalar(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);

/* Quantizers per family (float -> blocks), n a multiple of the block. */
void tp_quantize_q8_0(const float *x, int n, uint8_t *out);
void tp_quantize_q4_0(const float *x, int n, uint8_t *out);
void tp_quantize_q4_1(const float *x, int n, uint8_t *out);
void tp_quantize_q5_0(const float *x, int n, uint8_t *out);
void tp_quantize_q5_1(const float *x, int n, uint8_t *out);
void tp_quantize_q4_k(const float *x, int n, uint8_t *out);
void tp_quantize_q5_k(const float *x, int n, uint8_t *out);
void tp_quantize_q6_k(const float *x, int n, uint8_t *out);

#endif
