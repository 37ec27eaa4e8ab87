/* Private to the forward stage (and its tests): the packed matmul kernel.
 *
 * Why not OpenBLAS: its sgemm gives a row different bits depending on how
 * many rows are in the call, and sgemv differs from sgemm, so a sequence's
 * logits would depend on the batch it ran in (measured; see forward.c). This
 * kernel computes every output element as one sequential chain of FMAs over
 * k = 0..K-1 starting from 0, whatever the number of tokens, so results are
 * bit-identical for any batch composition, and it equals fmaf() in a loop. */
#ifndef TOKPIPE_FORWARD_KERNELS_H
#define TOKPIPE_FORWARD_KERNELS_H

#include <stdbool.h>
#include <stddef.h>

#define TP_PANEL 16 /* rows per packed panel: one 512-bit register */

/* The scalar (portable) loops: the build targets any x86-64, so fmaf
 * would be a libm call; a clone for CPUs with FMA, picked at load
 * (function multiversioning), inlines it. Same bits: fmaf is fused
 * either way. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TP_SCALAR_CLONES __attribute__((target_clones("fma", "default")))
#else
#define TP_SCALAR_CLONES
#endif

/* W[rows][cols] repacked in panels of 16 rows (padded with zeros), panels
 * grouped by 4 (2, 1 at the end) and each group stored [k][group rows], so
 * the kernel streams one contiguous run of weights. */
typedef struct tp_packed {
    float *p;
    int rows, cols, panels;
} tp_packed;

/* Pack n_parts row-major matrices stacked vertically (same cols). Returns 0
 * or TP_ENOMEM; out->p is freed with tp_packed_free. */
int tp_pack(const float *const *parts, const int *part_rows, int n_parts, int cols, tp_packed *out);
void tp_packed_free(tp_packed *w);

/* y[t*ldy + r] = sum_k x[t*ldx + k] * W[r][k] for t < n_tok, r < rows, each
 * as fmaf(x, w, acc) over k in order from acc = 0. Uses AVX-512, else
 * AVX2 with FMA, as tp_isa_active() allows (same bits as the scalar path). */
void tp_matmul(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy);

/* The same restricted to panels [pg0, pg1) (output rows pg0*16 up to
 * min(pg1*16, rows)); pg0 and pg1 must be 0, a multiple of 4 or panels (a
 * group boundary). Lets threads split a matmul by rows with bits identical
 * to the whole call. simd: the vector kernel tp_isa_active() allows
 * (AVX-512, else AVX2 + FMA); false: the scalar path. Same bits either way. */
void tp_matmul_panels(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy, int pg0,
                      int pg1, bool simd);

/* Output rows a split of one matmul may start at: a panel group (see
 * tp_pack). */
#define TP_MATMUL_ROW_ALIGN (4 * TP_PANEL)

/* The same by output rows, the form the compute pool calls (pool.h): rows
 * [r0, r1) of y, r0 a multiple of TP_MATMUL_ROW_ALIGN and r1 one too or
 * w->rows. Every row's bits equal those of the whole call. */
void tp_matmul_rows(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy, int r0, int r1,
                    bool simd);

/* The scalar path, always available (tests compare the two). */
void tp_matmul_scalar(const tp_packed *w, const float *x, int ldx, int n_tok, float *y, int ldy);


/* Tests only: make a tp_forward use the portable scalar paths (what a CPU
 * without AVX-512 runs) from now on. Defined in forward.c. */
struct tp_forward;
void tp_forward_use_scalar_for_tests(struct tp_forward *f);

/* Tests only: give every pooled job as many parts as the threads and the
 * rows allow, however small (splits of the tiny test models are otherwise
 * not worth a thread). */
void tp_forward_split_all_for_tests(struct tp_forward *f);

#endif
