/* Private to the forward stage (and its tests): the mixture-of-experts FFN
 * of qwen3moe and of llama with experts (Mixtral), as llama.cpp's
 * build_moe_ffn computes it with softmax gating and norm_w:
 *
 *   p = softmax(W_router x)                    over all n_expert experts
 *   the top k = n_expert_used experts by p     (ties: the lower index first)
 *   w_r = p_r / max(sum of the k p, 2^-14)     (llama.cpp clamps the sum at
 *                                               F16's smallest normal)
 *   out = sum over rank r of w_r * down_e(silu(gate_e x) * up_e x)
 *
 * and with a shared expert (qwen35moe, shexp_ff > 0; llama.cpp's
 * qwen35moe build_layer_ffn), after that sum:
 *
 *   out += sigmoid(x . gate_inp_shexp) * down_s(silu(gate_s x) * up_s x)
 *
 * BATCH INVARIANCE, as the dense FFN keeps it. Each token's router logits
 * are a row of a row-invariant matmul (kernels.h, quant.h); its softmax
 * (e^x by tp_vexp; the sum over experts in index order), its top k and
 * weights depend on that row alone. A step's tokens are grouped by expert
 * (a token's row among its expert's rows in token order); each expert's
 * gate, up and down are one row-invariant matmul over its rows, so every
 * weight of an expert is streamed once a step for all the tokens routed
 * to it, and a row's bits do not depend on the others. The k outputs are
 * summed in rank order (descending weight, ties by lower index, as
 * llama.cpp's sorted top-k), each term w_r * y_r rounded, then added:
 * out = ((w_0 y_0 + w_1 y_1) + w_2 y_2) + ...; the shared expert's
 * gate, up and down are each one row-invariant matmul over all the
 * step's tokens, its gate's dot product one token's alone (index order),
 * and g * y_s is rounded, then added last. So a token's bits are the
 * same alone or among any others, for any chunking of its prompt.
 *
 * THREADS. Gate/up (with their SwiGLU) and down are each one pool job
 * whose rows are the active experts' output rows side by side (each
 * expert's aligned to the kernels' row blocks): the pool splits over
 * experts and rows at once, and every row is computed as in one call, so
 * the thread count changes no bit either (the shared expert's jobs split
 * its rows alike). Integer experts' inputs are quantized per block of 32,
 * each block on its own (quant.h): gate and up's once a token, copied to
 * its experts' rows; down's in the gate/up job, by the thread that made
 * the block's SwiGLU (that job's pieces then aligned to 32). */
#ifndef TOKPIPE_FORWARD_MOE_H
#define TOKPIPE_FORWARD_MOE_H

#include <stdbool.h>

#include "tokpipe/model.h"
#include "pool.h"

typedef struct tp_moe tp_moe;

/* How the forward runs a step's jobs. */
typedef struct tp_moe_run {
    tp_pool *pool;
    long long part_min; /* multiply-adds a thread's share must have (forward.c) */
    bool simd, qsimd;   /* f32 / typed kernels' vector paths (same bits) */
} tp_moe_run;

/* The experts of model's layers, ready for steps of up to max_tokens
 * tokens: F32 matrices packed, typed ones given a panel when panels (the
 * forward's typed kernels read panels); the file's pages of what was
 * copied are let go. *out NULL (and 0) for a model without experts;
 * TP_ENOMEM. The model must outlive it. */
int tp_moe_new(const tp_model *model, int max_tokens, bool panels, tp_moe **out);

/* Accepts NULL. */
void tp_moe_free(tp_moe *m);

/* out[t] ([n_tok][dim]) = the FFN of layer l on x[t] ([n_tok][dim], the
 * normed residual) for t < n_tok <= max_tokens. */
void tp_moe_ffn(tp_moe *m, const tp_moe_run *r, int l, const float *x, int n_tok, float *out);

/* Tests: the experts token t of the last tp_moe_ffn chose, by rank, and
 * their weights (k of each). */
void tp_moe_last_choice(const tp_moe *m, int t, const int **experts, const float **weights);

#endif
