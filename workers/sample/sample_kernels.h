/* Passes of the sampler over the vocabulary (internal to workers/sample;
 * tests include it to check the vector paths against the scalar ones).
 *
 * Every pass reads the caller's logits as they are and applies NaN -> -inf,
 * penalties and bans on the fly: those change only the ids marked in two
 * bitmaps (one bit per id), so a block of 16 ids with no mark is used
 * straight from the logits, and the vocabulary is never copied.
 *
 * Each pass has an AVX-512 version and a scalar one (avx512 = false, or a
 * CPU without avx512f) with identical results: same values, same order of
 * floating-point operations, first maximum and lower id winning ties. The
 * vector exp reproduces glibc's expf bit for bit (see sample_kernels.c). */
#ifndef TOKPIPE_SAMPLE_KERNELS_H
#define TOKPIPE_SAMPLE_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/sampler.h"

typedef struct tp_smp_cand {
    float l; /* logit after penalties; ranks the candidates */
    float w; /* unnormalized probability exp((l - max) / temperature) */
    int32_t id;
} tp_smp_cand;

/* One call's view of the logits. hist marks ids in the penalty window (NULL:
 * no penalty this call), ban the banned ids (NULL: no ban this call); bit
 * t & 15 of word t >> 4. */
typedef struct tp_smp_view {
    const float *logits;
    int vocab;
    const uint16_t *hist;
    const uint16_t *ban;
    const int32_t *counts; /* occurrences in the window, per id */
    float rep, presence, frequency;
    /* With a logit bias (bias != NULL), ban marks the biased ids too, so the
     * passes still test two bitmaps per block and a job without a bias
     * runs exactly the code it ran before; banned then says which marks
     * are bans (NULL: none this call). */
    const float *bias;      /* per id, read where biased is marked; NULL: no logit bias */
    const uint16_t *biased;
    const uint16_t *banned;
} tp_smp_view;

/* The logit of id t after NaN -> -inf, penalties, logit bias (a bias of
 * TP_SAMPLER_BAN_BIAS or less gives -inf) and bans. */
float tp_smp_value(const tp_smp_view *v, int t);

/* exp((l - max) * inv_t) as the sampler has always computed it; d == 0 is
 * special-cased so a tiny temperature (inv_t = inf) gives 1, not NaN. */
static inline float tp_smp_weight(float l, float max, float inv_t)
{
    float d = l - max;
    return d == 0.0f ? 1.0f : expf(d * inv_t);
}

/* a ranks before b: higher logit, or the same logit and a lower id. */
static inline bool tp_smp_ranks_before(const tp_smp_cand *a, const tp_smp_cand *b)
{
    return a->l > b->l || (a->l == b->l && a->id < b->id);
}

bool tp_smp_have_avx512(void);

/* The first id with the largest value above -inf, or -1 if there is none. */
int tp_smp_argmax(const tp_smp_view *v, bool avx512);

/* The k best ids above -inf (by tp_smp_ranks_before) into heap[0, n), in
 * the layout a min-heap by rank gets when offered every id in order; w is
 * left 0. Returns n (< k only if fewer ids are above -inf). */
size_t tp_smp_top_k(const tp_smp_view *v, size_t k, tp_smp_cand *heap, bool avx512);

/* The weight of every id into w[0, vocab) (0 for -inf/NaN), given the
 * finite maximum. Returns their sum accumulated in id order in double;
 * acc[b] is that sum before block b (ids 16b..), acc[n_blocks] the total.
 * *n_pos counts the positive weights, *last_pos is the last such id. */
double tp_smp_weights(const tp_smp_view *v, float max, float inv_t, float *w, double *acc,
                      size_t *n_pos, int *last_pos, bool avx512);

/* Candidates {value, w[t], t} for every id with w[t] > 0 and w[t] >= cut,
 * in id order. Returns their number. */
size_t tp_smp_gather(const tp_smp_view *v, const float *w, double cut, tp_smp_cand *out,
                     bool avx512);

/* Candidates for every id whose weight is >= min_p (> 0), in id order;
 * computes the weight only of ids that can reach min_p. */
size_t tp_smp_min_p(const tp_smp_view *v, float max, float inv_t, float min_p, tp_smp_cand *out,
                    bool avx512);

/* y[i] = expf(x[i]) for n floats; with avx512 by the vector exp. */
void tp_smp_expf(const float *x, float *y, size_t n, bool avx512);

/* Tests: make s use the scalar passes (false) or the AVX-512 ones (true,
 * honoured only if the CPU has avx512f). */
void tp_sampler_set_avx512(tp_sampler *s, bool on);

#endif
