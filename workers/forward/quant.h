/* Private to the forward stage (and its tests and tools): matmuls over
 * typed weights (tp_wmat) in ggml's block layouts (ggml-common.h), read
 * from the file or from a repacked panel (below):
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
 *   MXFP4 32: u8 e (E8M0), u8 qs[16] (E2M1 codes)    w = kv[q] * 2^(e - 128)
 *             (quant_mxfp4.c: panels of its own, 16 rows for AVX-512, 8 for AVX2)
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
 * quantized per block of 32 to int8 with one f32 scale dx (as ggml's Q8_0:
 * dx = max|x| / 127, q = round-to-nearest-even(x / dx)). A row is taken
 * one sub-block at a time, in column order: 32 columns, or 16 for Q6_K
 * (whose scales are per 16). Per sub-block, the integer dot product P of
 * the signed weight quants with the activation quants is exact, and the
 * row's one float accumulator (starting at 0) takes
 *     acc = fmaf(ws * dx, (float)P, acc)
 * and, for types with a min (Q4_1, Q5_1, Q4_K, Q5_K),
 *     acc = fmaf(wm * dx, (float)S, acc)     (S: sum of the 32 act. quants)
 * where ws (wm) is the sub-block's weight scale (min) as a float product
 * computed once (e.g. d * sc for Q4_K, -(dmin * m) for its min). y = acc.
 * Integer sums per sub-block leave one multiply-add per 32 weights, which
 * is what lets VNNI outrun f32 (an 8-bit multiply-add per lane).
 *
 * Float types (F16, BF16): lanes are single columns, 16 per chunk;
 * acc[l] = fmaf(x, w, acc[l]) in chunk order (weights converted exactly to
 * f32 in the kernel; AVX512-BF16's dot product is not used: it rounds
 * pairs of products differently than fmaf, which would give up equality
 * with the scalar path), then a fixed tree: a[i] + a[i+8], +4, +2, +1.
 *
 * Layouts. The scalar path reads the weights where the file has them. The
 * AVX-512 path reads a panel (tp_qpanel_build, made once at load): 16 rows
 * side by side, each block of 32 columns as 8 vectors of 16 rows x 4
 * columns (one vpdpbusd each: 64 multiply-adds) packed at the type's bit
 * width, then the sub-blocks' 16 scales (and mins) as halves, where the
 * file has halves (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1). The K types keep their
 * scales as the file does, a super-block's at its head (TP_QPANEL_KHEAD:
 * the 16 rows' f16 d, then Q4_K's and Q5_K's -dmin and 6-bit scales and
 * mins a byte each, Q6_K's int8 scales), and the kernel makes the float
 * products d * sc and (-dmin) * m the scalar path makes. The panel is what
 * decode streams, so it keeps the file's width: Q8_0 and Q4_0 panels are
 * exactly as big as their files, the K types' within 3 % (f32 products
 * took a third more for Q4_K, and decode ran a third slower). */
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
    float *dx;       /* [n_tok][cols / 32] each block's scale */
    float *sum;      /* [n_tok][cols / 32] each block's sum of quants, as a float */
    int32_t *nsum32; /* [n_tok][cols / 32] minus each block's sum of quants */
    int32_t *nsum16; /* [n_tok][cols / 16] minus each half block's sum */
    size_t cap;      /* elements of q allocated */
} tp_qact;

/* A typed matrix repacked for the AVX-512 path (quant.h's layouts, group_rows 16): row
 * group g (rows 16g..16g+15; past the last row, zero weights) at
 * data + g * group_bytes, its blocks of 32 columns block_bytes apart (K
 * types: super-blocks of TP_QPANEL_KSB_BYTES, blocks within them).
 * On a CPU with AVX2 but not AVX-512 the panel (group_rows 4) is the file's
 * blocks of 4 rows side by side: group g (rows 4g..4g+3; past the last row
 * the group's first row again), block b of row 4g + k at
 * data + g * group_bytes + b * block_bytes + k * (block_bytes / 4), so the
 * four rows the AVX2 kernels read together are one stream (in the
 * forward's huge-page mapping). F16/BF16 blocks are 16 columns (when the
 * row is whole blocks). Q8_0, Q4_0, Q4_K, Q5_K and Q6_K take eight rows a
 * group (group_rows), a block (Q8_0, Q4_0) or super-block of the eight at
 * data + g * group_bytes + i * block_bytes in layouts of their own
 * (quant.c: ROWS8_Q80_BLOCK, ROWS8_Q40_BLOCK, ROWS8_Q4K_BLOCK,
 * ROWS8_Q5K_BLOCK, ROWS8_Q6K_BLOCK): scales together and split out of the
 * file's packing, and the quants interleaved four bytes a row. MXFP4's
 * panels, of 16 rows (AVX-512) or 8 (AVX2), are quant_mxfp4.c's own:
 * block_bytes of codes a block, then the group's scales. */
typedef struct tp_qpanel {
    uint32_t type;
    int groups, blocks;
    size_t block_bytes, group_bytes, bytes;
    uint8_t *data; /* 32-byte aligned; blocks too */
    bool owned;    /* data is the panel's own mapping */
    int group_rows; /* 16: the AVX-512 layout; 4 or 8 (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, MXFP4): AVX2's */
} tp_qpanel;

/* Bytes of w's panel (a multiple of 32), 0 for a type without one (F32;
 * F16/BF16 under AVX-512) or under TP_ISA_PORTABLE. The layout is the one
 * of the level tp_isa_active() gives now (AVX-512 with VNNI, else AVX2). */
size_t tp_qpanel_bytes(const tp_wmat *w);

/* Build w->panel (no-op when tp_qpanel_bytes is 0) into mem, 32-byte
 * aligned with tp_qpanel_bytes zeroed bytes, or, mem NULL, into memory of
 * its own. 0 or TP_ENOMEM. The panel takes about the file's bytes. */
int tp_qpanel_build(tp_wmat *w, void *mem);
void tp_qpanel_free(tp_wmat *w);

/* A panel to build: w's, at off in a mapping. */
typedef struct tp_qpanel_job {
    tp_wmat *w;
    size_t off;
} tp_qpanel_job;

/* Build the jobs' panels at base + off (tp_qpanel_build), handed out one
 * at a time, the last job first (put the largest last), on the calling
 * thread and up to threads - 1 more: repacking is about 3 ns a weight on
 * one Zen 4 core, seconds for a 7B model. 0 or TP_ENOMEM. */
int tp_qpanel_build_jobs(const tp_qpanel_job *job, int n, uint8_t *base, int threads);

/* Zeroed anonymous memory for panels of len bytes in all: *len_out (len
 * rounded up to 2 MB) bytes, 2 MB aligned, huge pages asked for (decode
 * streams the panels every token; a TLB miss per 4 KB, and the hardware
 * prefetchers' stop at each 4 KB page, saved). NULL when out of memory;
 * the caller munmaps it (after tp_qpanel_free of the panels inside). */
uint8_t *tp_qpanel_map(size_t len, size_t *len_out);

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
/* The same with the path chosen (QACT_AVX512 needs AVX-512 F and BW,
 * QACT_AVX2 AVX2): the same bits on every path; tests compare them. */
enum { QACT_SCALAR, QACT_AVX2, QACT_AVX512 };
void tp_qact_prepare_path(tp_qact *a, uint32_t wtype, const float *x, int ldx, int n_tok, int cols, int path);

/* Preparation in pieces: tp_qact_layout sets a up for x as
 * tp_qact_prepare does, quantizing nothing; tp_qact_prepare_blocks then
 * quantizes blocks [b0, b1) (of 32 columns) of token t. Pieces in any
 * order, on any threads (disjoint ones at once), give tp_qact_prepare's
 * bits: a block's quants, scale and sums are its own. */
void tp_qact_layout(tp_qact *a, uint32_t wtype, const float *x, int ldx, int n_tok, int cols);
void tp_qact_prepare_blocks(tp_qact *a, int t, int b0, int b1);

/* dst's row i = src's prepared integer row from[i], for i < n (n within
 * dst's init size; src's cols): what preparing those rows of x would
 * give. For the experts' grouped rows, each a copy of its token's. */
void tp_qact_gather(tp_qact *dst, const tp_qact *src, const int *from, int n);

/* Tokens [t0, t0 + n) of prepared activations a, as activations of their
 * own (borrowing a's buffers): what preparing those rows alone gives,
 * since preparation depends on each token's row only. For the experts of
 * a MoE FFN, each reading its tokens' rows of one preparation. */
tp_qact tp_qact_rows(const tp_qact *a, int t0, int n);

/* THE ROW-RANGE ENTRY POINT. y[t * ldy + r] = W[r] . x[t] for t < a->n_tok
 * and r0 <= r < r1, with w->cols == a->cols and a prepared for w->type.
 * Any split of [0, rows) into ranges, run in any order or concurrently on
 * disjoint ranges, writes the same bits as one call over [0, rows); so does
 * any n_tok (see the canonical order above). simd selects the vector
 * path tp_isa_active() allows: AVX-512 (with VNNI) and, for integer types,
 * a panel in its layout; else AVX2 (its panel, or the file's blocks);
 * false: the scalar path. Same bits either way. Reads a and w only. */
void tp_qmatmul_rows(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1, bool simd);

/* The CPU converts halves (F16C; by cpuid: clang's __builtin_cpu_supports
 * does not know the feature). */
bool tp_quant_have_f16c(void);

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
void tp_qunpack_mxfp4(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16]);

/* MXFP4's scale byte as ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128). */
float tp_e8m0_to_f32_half(uint8_t e);
/* MXFP4 rows (tp_qmatmul_rows' contract): AVX2 from the file's blocks or
 * from the panel of eight rows (group_rows 8), AVX-512 from the panel of
 * sixteen (quant_mxfp4.c's layout). */
void tp_qrows_mxfp4_avx2(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
void tp_qrows_mxfp4_avx2_panel(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
void tp_qrows_mxfp4_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
/* That panel of n (8 or 16) rows a group: a group's bytes for rows of
 * blocks blocks of 32 columns (a multiple of 64), and row r (< n) of a
 * group from the file's row. */
size_t tp_mxfp4_panel_group_bytes(int blocks, int n);
void tp_mxfp4_panel_put_row(uint8_t *grp, int blocks, int n, int r, const uint8_t *row);

/* AVX-512 row ranges per family (same contract as tp_qmatmul_rows; the
 * integer ones read w->panel). */
void tp_qrows_f16_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
void tp_qrows_q8_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
void tp_qrows_q4_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);
void tp_qrows_k_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1);

/* Panel formats of the integer types, the one place they are written: bits
 * per quant as stored (8, 4, 5 or 6), SH (the unsigned quant is the signed
 * one plus 2^SH; 0: none), sub-block columns (32 or 16), a min (0/1), bytes
 * per scale (2: halves after each block, as the file has them; 0: a K
 * type's, at its super-block's head, TP_QPANEL_KHEAD). The
 * AVX-512 kernels are instantiated from them (TP_QPANEL_APPLY with
 * TP_QPANEL_DEFINE) and the panel builder reads them (tp_qpanel_format). */
#define TP_QPANEL_Q8_0 8, 7, 32, 0, 2
#define TP_QPANEL_Q4_0 4, 3, 32, 0, 2
#define TP_QPANEL_Q5_0 5, 4, 32, 0, 2
#define TP_QPANEL_Q4_1 4, 0, 32, 1, 2
#define TP_QPANEL_Q5_1 5, 0, 32, 1, 2
#define TP_QPANEL_Q4_K 4, 0, 32, 1, 0
#define TP_QPANEL_Q5_K 5, 0, 32, 1, 0
#define TP_QPANEL_Q6_K 6, 5, 16, 0, 0
/* F(args..., the format's five values): expands a format macro first */
#define TP_QPANEL_APPLY(F, ...) F(__VA_ARGS__)
/* Bytes of the packed quants of 16 rows x 32 columns: 8-bit 512; 4-bit 256
 * (quads 2m and 2m+1 in the low and high nibbles of vector m); 5-bit adds
 * a 64-bit mask of the fifth bits per quad; 6-bit adds two vectors of
 * 2-bit fields (quad k in vector k / 4, bits 2 (k % 4) and up). */
#define TP_QPANEL_QUANT_BYTES(BITS) ((BITS) == 8 ? 512 : (BITS) == 4 ? 256 : (BITS) == 5 ? 320 : 384)
/* A K type's super-block of 16 rows x 256 columns: this head, then its
 * eight blocks' quants. Q4_K, Q5_K: f16 d[16], f16 -dmin[16] (negating is
 * exact), u8 sc[8 sub-blocks][16 rows], u8 m[8][16]; Q6_K: f16 d[16], int8
 * sc[16][16], 32 bytes unused (blocks on whole cache lines). */
#define TP_QPANEL_KHEAD 320
#define TP_QPANEL_KSB_BYTES(BITS) (TP_QPANEL_KHEAD + 8 * TP_QPANEL_QUANT_BYTES(BITS))

/* Panel geometry of an integer type (the format above, the offset as a
 * number). False for other types. */
typedef struct tp_qpanel_fmt {
    int bits, off, sub, has_min;
    int scale_bytes;    /* 2: the file's scales are halves and stay so; 0: a K type's head */
    size_t quant_bytes; /* per group block: the packed quants */
} tp_qpanel_fmt;
bool tp_qpanel_format(uint32_t type, tp_qpanel_fmt *f);
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
void tp_quantize_mxfp4(const float *x, int n, uint8_t *out);

#endif
