/* Private to the forward stage (and its tests): batch-1 attention's two
 * loops with AVX2 for a CPU without AVX-512, over an f32 cache or a half
 * one (kv16.h; F16C converts exactly), in the portable kernels' operations
 * and order (a product, then a sum, never fused): their bits.
 *
 * Layout (forward.c): a KV page holds 16 positions; in it a head's keys
 * are one block [head_size][16] and its values [16][head_size]. kblk[b] /
 * vblk[b] is the head's block of page b of the sequence (the block table
 * resolved). Four key blocks and 64 value elements a pass: with a block or
 * 32 elements (four chains) the adds' latency, not the loads, set the pace. */
#ifndef TOKPIPE_FORWARD_ATTN_AVX2_H
#define TOKPIPE_FORWARD_ATTN_AVX2_H

#include <stdbool.h>

/* att[t] = (q . key_t) / scale for t < n: each score one chain of products
 * summed over the head's elements from 0. half: the blocks hold halves. */
void tp_attn_scores_avx2(float *att, const float *qh, const void *const *kblk, int hs, int n, float scale,
                         bool half);

/* oh[i] = sum over t < n of att[t] * value_t[i], each element one chain
 * over t from 0. */
void tp_attn_weighted_avx2(float *oh, const float *att, const void *const *vblk, int hs, int n, bool half);

#endif
