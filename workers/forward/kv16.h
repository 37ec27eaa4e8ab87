/* Private to the forward stage (and its tests): the KV cache in IEEE half
 * precision (kv_type f16), which halves the bytes attention reads per
 * position.
 *
 * Same layouts as the f32 cache (forward.c): a KV page holds 16 positions;
 * in it a KV head's keys are one block [head_size][16] and its values
 * [16][head_size]. The kernels take the head's blocks of a sequence in
 * position order (kblk[t / 16], vblk[t / 16]: the block table resolved).
 * Values are rounded to half once, when stored (round to nearest even,
 * quant.h's tp_f32_to_f16, equal to the hardware's vcvtps2ph); every later read
 * converts exactly, and the scores and weighted sums keep the f32 path's
 * fixed order of multiply-then-add, so a sequence's logits still depend only
 * on its own tokens: batch and chunked-prefill invariance hold as with f32. */
#ifndef TOKPIPE_FORWARD_KV16_H
#define TOKPIPE_FORWARD_KV16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The AVX-512 kernels below need F, BW and VL (masked 16-bit loads:
 * tp_isa_active() at TP_ISA_AVX512). Each gives the portable kernel's bits:
 * a product rounded, then added (no FMA), in the same order. */

/* att[t] = (q . key_t) / scale for t < n, one chain per score over the
 * head's elements in order; key_t's element i at kblk[t / 16][i * 16 + t % 16]. */
void tp_kv16_scores_avx512(float *att, const float *qh, const uint16_t *const *kblk, int hs, int n, float scale);
/* oh[i] = sum over t < n of att[t] * value_t[i], one chain per element
 * over t in order; value_t at vblk[t / 16] + (t % 16) * hs. */
void tp_kv16_weighted_sum_avx512(float *oh, const float *att, const uint16_t *const *vblk, int hs, int n);

/* The portable versions (plain multiply-adds, as forward.c's scalar f32
 * attention; attn_avx2.h gives their bits with AVX2). */
void tp_kv16_scores_scalar(float *att, const float *qh, const uint16_t *const *kblk, int hs, int n, float scale);
void tp_kv16_weighted_sum_scalar(float *oh, const float *att, const uint16_t *const *vblk, int hs, int n);

#endif
