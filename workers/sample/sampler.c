/* Token sampler (see sampler.h for the order of operations). The passes
 * over the vocabulary are in sample_kernels.c: they read the logits in
 * place (penalties and bans touch only ids marked in bitmaps), the exp runs
 * only where a token can survive the filters, and with AVX-512 where it
 * must run over everything. Selection of the top-k and top-p sets uses a
 * k-heap and quickselect on a total order (probability descending, then id
 * ascending), so a call costs O(vocab) expected, not a sort. */
#include "tokpipe/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "sample_kernels.h"

struct tp_sampler {
    tp_sampler_params p;
    int vocab;
    int32_t *ban;
    uint16_t *banned; /* bitmap of ban ids */
    /* penalty window: ring of the last `window` tokens and their counts */
    int32_t *ring;
    size_t ring_len, ring_pos;
    int32_t *counts;
    uint16_t *hist; /* bitmap: counts[id] > 0 */
    size_t n_accepted;
    uint64_t stream; /* mixed seed */
    bool avx512;
    float *work;  /* weights of the whole vocabulary */
    double *acc;  /* their running sum before each block of 16 ids */
    tp_smp_cand *cand;
    uint16_t *biased; /* bitmap of logit_bias ids; NULL without logit_bias */
    uint16_t *marks;  /* biased | banned: what the passes test while bans apply */
    float *bias;      /* per id (vocab entries) when biased */
    struct typ_cand *typ; /* typical_p < 1 only: candidates with their score */
};

/* A candidate of the typical set and its distance from the entropy. */
typedef struct typ_cand {
    double score;
    tp_smp_cand c;
} typ_cand;

/* SplitMix64 (Steele, Lea, Flood 2014): output n is mix(seed + n * gamma). */
#define SPLITMIX_GAMMA 0x9e3779b97f4a7c15ull

static uint64_t splitmix_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) for generated token number n. */
static double draw(const tp_sampler *s, size_t n)
{
    uint64_t x = splitmix_mix(s->stream + ((uint64_t)n + 1) * SPLITMIX_GAMMA);
    return (double)(x >> 11) * 0x1.0p-53;
}

tp_sampler_params tp_sampler_params_default(void)
{
    return (tp_sampler_params){
        .temperature = TP_SAMPLER_DEFAULT_TEMPERATURE,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_window = TP_SAMPLER_DEFAULT_PENALTY_WINDOW,
        .seed = 0,
        .min_tokens = 0,
        .ban_ids = NULL,
        .n_ban = 0,
        .typical_p = 1.0f,
        .bias_ids = NULL,
        .bias_values = NULL,
        .n_bias = 0,
    };
}

static int check_floats(const tp_sampler_params *p, tp_err *err)
{
    /* Written as !(in range) so NaN is rejected too. */
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return tp_err_set(err, TP_ERANGE, "temperature must be >= 0 and finite, got %g",
                          p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return tp_err_set(err, TP_ERANGE, "top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->typical_p > 0.0f && p->typical_p <= 1.0f))
        return tp_err_set(err, TP_ERANGE, "typical_p must be in (0, 1], got %g", p->typical_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return tp_err_set(err, TP_ERANGE, "min_p must be in [0, 1], got %g", p->min_p);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return tp_err_set(err, TP_ERANGE, "repetition_penalty must be > 0 and finite, got %g",
                          p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return tp_err_set(err, TP_ERANGE, "presence_penalty must be in [-2, 2], got %g",
                          p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return tp_err_set(err, TP_ERANGE, "frequency_penalty must be in [-2, 2], got %g",
                          p->frequency_penalty);
    return 0;
}

int tp_sampler_params_validate(const tp_sampler_params *p, int vocab_size, tp_err *err)
{
    if (!p)
        return tp_err_set(err, TP_EINVAL, "sampler params must not be NULL");
    if (vocab_size < 1)
        return tp_err_set(err, TP_ERANGE, "vocab_size must be >= 1, got %d", vocab_size);
    int rc = check_floats(p, err);
    if (rc)
        return rc;
    if (p->top_k < 0)
        return tp_err_set(err, TP_ERANGE, "top_k must be >= 0, got %d", p->top_k);
    if (p->penalty_window < 0 || p->penalty_window > TP_SAMPLER_MAX_PENALTY_WINDOW)
        return tp_err_set(err, TP_ERANGE, "penalty_window must be in [0, %d], got %d",
                          TP_SAMPLER_MAX_PENALTY_WINDOW, p->penalty_window);
    if (p->min_tokens < 0)
        return tp_err_set(err, TP_ERANGE, "min_tokens must be >= 0, got %d", p->min_tokens);
    if (p->n_ban && !p->ban_ids)
        return tp_err_set(err, TP_EINVAL, "ban_ids is NULL but n_ban is %zu", p->n_ban);
    for (size_t i = 0; i < p->n_ban; i++)
        if (p->ban_ids[i] < 0 || p->ban_ids[i] >= vocab_size)
            return tp_err_set(err, TP_ERANGE, "ban_ids[%zu] = %d is outside [0, %d)", i,
                              (int)p->ban_ids[i], vocab_size);
    if (p->n_bias && (!p->bias_ids || !p->bias_values))
        return tp_err_set(err, TP_EINVAL, "logit_bias is NULL but n_bias is %zu", p->n_bias);
    for (size_t i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= vocab_size)
            return tp_err_set(err, TP_ERANGE, "logit_bias: token id %d is outside [0, %d)",
                              (int)p->bias_ids[i], vocab_size);
        float b = p->bias_values[i];
        if (!(b >= -TP_SAMPLER_MAX_BIAS && b <= TP_SAMPLER_MAX_BIAS))
            return tp_err_set(err, TP_ERANGE, "logit_bias[%d] must be in [-100, 100], got %g",
                              (int)p->bias_ids[i], b);
    }
    return 0;
}

void tp_sampler_free(tp_sampler *s)
{
    if (!s)
        return;
    free(s->ban);
    free(s->ring);
    free(s->counts);
    free(s->hist);
    free(s->banned);
    free(s->work);
    free(s->acc);
    free(s->cand);
    free(s->biased);
    free(s->marks);
    free(s->bias);
    free(s->typ);
    free(s);
}

static void push_history(tp_sampler *s, int32_t token)
{
    size_t w = (size_t)s->p.penalty_window;
    if (w == 0)
        return;
    if (s->ring_len == w) {
        int32_t old = s->ring[s->ring_pos];
        if (--s->counts[old] == 0)
            s->hist[old >> 4] &= (uint16_t)~(1u << (old & 15));
    } else {
        s->ring_len++;
    }
    s->ring[s->ring_pos] = token;
    if (s->counts[token]++ == 0)
        s->hist[token >> 4] |= (uint16_t)(1u << (token & 15));
    s->ring_pos = (s->ring_pos + 1) % w;
}

int tp_sampler_new(const tp_sampler_params *p, int vocab_size, const int32_t *prompt_ids,
                   size_t n_prompt, tp_sampler **out, tp_err *err)
{
    if (!out)
        return tp_err_set(err, TP_EINVAL, "sampler: out must not be NULL");
    *out = NULL;
    int rc = tp_sampler_params_validate(p, vocab_size, err);
    if (rc)
        return rc;
    if (n_prompt && !prompt_ids)
        return tp_err_set(err, TP_EINVAL, "prompt_ids is NULL but n_prompt is %zu", n_prompt);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt_ids[i] < 0 || prompt_ids[i] >= vocab_size)
            return tp_err_set(err, TP_ERANGE, "prompt_ids[%zu] = %d is outside [0, %d)", i,
                              (int)prompt_ids[i], vocab_size);
    tp_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return tp_err_set(err, TP_ENOMEM, "sampler: out of memory");
    s->p = *p;
    s->vocab = vocab_size;
    s->stream = splitmix_mix(p->seed);
    size_t v = (size_t)vocab_size, w = (size_t)p->penalty_window;
    s->ban = malloc(sizeof *s->ban * (p->n_ban ? p->n_ban : 1));
    s->ring = malloc(sizeof *s->ring * (w ? w : 1));
    size_t blocks = (v + 15) / 16;
    s->counts = calloc(v, sizeof *s->counts);
    s->hist = calloc(blocks, sizeof *s->hist);
    s->banned = calloc(blocks, sizeof *s->banned);
    s->work = malloc(sizeof *s->work * v);
    s->acc = malloc(sizeof *s->acc * (blocks + 1));
    s->cand = malloc(sizeof *s->cand * v);
    if (!s->ban || !s->ring || !s->counts || !s->hist || !s->banned || !s->work || !s->acc ||
        !s->cand) {
        tp_sampler_free(s);
        return tp_err_set(err, TP_ENOMEM, "sampler: out of memory for vocab %d", vocab_size);
    }
    if (p->n_ban)
        memcpy(s->ban, p->ban_ids, sizeof *s->ban * p->n_ban);
    s->p.ban_ids = s->ban;
    for (size_t i = 0; i < p->n_ban; i++)
        s->banned[s->ban[i] >> 4] |= (uint16_t)(1u << (s->ban[i] & 15));
    if (p->n_bias) {
        s->biased = calloc(blocks, sizeof *s->biased);
        s->marks = calloc(blocks, sizeof *s->marks);
        s->bias = calloc(v, sizeof *s->bias);
    }
    if (p->typical_p < 1.0f)
        s->typ = malloc(sizeof *s->typ * v);
    if ((p->n_bias && (!s->biased || !s->marks || !s->bias)) || (p->typical_p < 1.0f && !s->typ)) {
        tp_sampler_free(s);
        return tp_err_set(err, TP_ENOMEM, "sampler: out of memory for vocab %d", vocab_size);
    }
    for (size_t i = 0; i < p->n_bias; i++) {
        int32_t t = p->bias_ids[i];
        if (s->biased[t >> 4] & (1u << (t & 15))) {
            tp_sampler_free(s);
            return tp_err_set(err, TP_EINVAL, "logit_bias: token id %d given twice", (int)t);
        }
        s->biased[t >> 4] |= (uint16_t)(1u << (t & 15));
        s->bias[t] = p->bias_values[i];
    }
    for (size_t b = 0; s->marks && b < blocks; b++)
        s->marks[b] = s->biased[b] | s->banned[b];
    s->p.bias_ids = NULL; /* borrowed from the caller: kept in s->bias instead */
    s->p.bias_values = NULL;
    s->avx512 = tp_smp_have_avx512();
    for (size_t i = 0; i < n_prompt; i++)
        push_history(s, prompt_ids[i]);
    *out = s;
    return 0;
}

int tp_sampler_accept(tp_sampler *s, int32_t token, tp_err *err)
{
    if (token < 0 || token >= s->vocab)
        return tp_err_set(err, TP_ERANGE, "accepted token %d is outside [0, %d)", (int)token,
                          s->vocab);
    push_history(s, token);
    s->n_accepted++;
    return 0;
}

size_t tp_sampler_n_accepted(const tp_sampler *s) { return s->n_accepted; }

/* This call's view of the logits: which marks (penalties, bans) apply. */
static tp_smp_view view_of(const tp_sampler *s, const float *logits)
{
    const tp_sampler_params *p = &s->p;
    bool penalize = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
                    p->frequency_penalty != 0.0f;
    bool ban = s->n_accepted < (size_t)p->min_tokens && p->n_ban;
    return (tp_smp_view){
        .logits = logits,
        .vocab = s->vocab,
        .hist = penalize && s->ring_len ? s->hist : NULL,
        .ban = s->bias ? (ban ? s->marks : s->biased) : ban ? s->banned : NULL,
        .counts = s->counts,
        .rep = p->repetition_penalty,
        .presence = p->presence_penalty,
        .frequency = p->frequency_penalty,
        .bias = s->bias,
        .biased = s->biased,
        .banned = ban ? s->banned : NULL,
    };
}

static void swap(tp_smp_cand *a, tp_smp_cand *b)
{
    tp_smp_cand t = *a;
    *a = *b;
    *b = t;
}

/* Partition c[lo, hi) around a median-of-three pivot; returns the pivot's
 * final index: everything before it ranks before it. */
static size_t partition(tp_smp_cand *c, size_t lo, size_t hi)
{
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (tp_smp_ranks_before(&c[mid], &c[lo]))
        swap(&c[mid], &c[lo]);
    if (tp_smp_ranks_before(&c[last], &c[lo]))
        swap(&c[last], &c[lo]);
    if (tp_smp_ranks_before(&c[mid], &c[last]))
        swap(&c[mid], &c[last]); /* median now at last */
    size_t store = lo;
    for (size_t i = lo; i < last; i++)
        if (tp_smp_ranks_before(&c[i], &c[last]))
            swap(&c[i], &c[store++]);
    swap(&c[store], &c[last]);
    return store;
}

static void insertion_sort(tp_smp_cand *c, size_t lo, size_t hi)
{
    for (size_t i = lo + 1; i < hi; i++)
        for (size_t j = i; j > lo && tp_smp_ranks_before(&c[j], &c[j - 1]); j--)
            swap(&c[j], &c[j - 1]);
}

/* The weight of c[lo, hi). exact: no sum of these weights rounds (see
 * sums_are_exact), so any order gives the one-by-one sum, and four chains
 * run in parallel. */
static double weigh(const tp_smp_cand *c, size_t lo, size_t hi, bool exact)
{
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = lo;
    for (; exact && i + 4 <= hi; i += 4) {
        s0 += c[i].w;
        s1 += c[i + 1].w;
        s2 += c[i + 2].w;
        s3 += c[i + 3].w;
    }
    for (; i < hi; i++)
        s0 += c[i].w;
    return exact ? (s0 + s1) + (s2 + s3) : s0;
}

/* True if no sum of weights >= cut (floats) whose exact total is at most
 * `total` can round in double: each is a multiple of 2^(E-24), where 2^(E-1)
 * <= cut, so every partial sum is too, and it stays below 2^(E+29), 53 bits
 * of those units (the margin covers total's own rounding). */
static bool sums_are_exact(double cut, double total)
{
    int e;
    frexp(cut, &e);
    return cut > 0.0 && total * (1.0 + 0x1p-20) < ldexp(1.0, e + 29);
}

/* The smallest m such that the m best of c[0, n) weigh >= target, with
 * c reordered so those are c[0, m). exact: as for weigh. */
static size_t select_top_mass(tp_smp_cand *c, size_t n, double target, bool exact)
{
    size_t lo = 0, hi = n;
    double acc = 0.0; /* weight of c[0, lo), all ranked before c[lo, n) */
    while (hi - lo > 16) {
        size_t m = partition(c, lo, hi);
        double upper = weigh(c, lo, m + 1, exact);
        if (acc + upper >= target) {
            hi = m + 1;
        } else {
            acc += upper;
            lo = m + 1;
        }
    }
    insertion_sort(c, lo, hi);
    for (size_t i = lo; i < hi; i++) {
        acc += c[i].w;
        if (acc >= target)
            return i + 1;
    }
    return hi; /* rounding left the target out of reach: keep everything */
}

/* llama2.c's cut: tokens lighter than (1 - top_p) * total / (n - 1) weigh
 * less than (1 - top_p) * total together as long as the heaviest (w = 1)
 * is not among them, so the top-p set lies among the others. Capping the
 * cut at 1 keeps the heaviest when top_p < 1/n (llama2.c then keeps
 * nothing). total is the weight of all n candidates summed in id order. */
static double top_p_cut(float top_p, double total, size_t n)
{
    double cut = (1.0 - (double)top_p) * total / (double)(n - 1);
    return cut > 1.0 ? 1.0 : cut;
}

/* min-p over s->cand[0, n) (the most likely token has w == 1). */
static size_t keep_min_p(tp_sampler *s, size_t n)
{
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (s->cand[i].w >= s->p.min_p)
            s->cand[kept++] = s->cand[i];
    return kept;
}

/* Draw from s->cand[0, n) in proportion to w, in that order. */
static int32_t draw_cand(const tp_sampler *s, size_t n)
{
    double total = 0.0;
    for (size_t i = 0; i < n; i++)
        total += s->cand[i].w;
    double r = draw(s, s->n_accepted) * total, acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += s->cand[i].w;
        if (r < acc)
            return s->cand[i].id;
    }
    return s->cand[n - 1].id; /* r rounded up to total */
}

/* The same draw over every token in id order, from the weights and block
 * sums of tp_smp_weights: the first block whose running sum passes r, then
 * the token inside it. Zero weights leave the running sum unchanged, so
 * this picks the token draw_cand would from the positive weights. */
static int32_t draw_all(const tp_sampler *s, double total, int last_pos)
{
    double r = draw(s, s->n_accepted) * total;
    size_t lo = 0, hi = ((size_t)s->vocab + 15) / 16; /* first block with acc[b + 1] > r */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->acc[mid + 1] > r)
            hi = mid;
        else
            lo = mid + 1;
    }
    double acc = s->acc[lo];
    for (int t = (int)lo * 16; t < s->vocab && t < (int)lo * 16 + 16; t++) {
        acc += s->work[t];
        if (r < acc)
            return t;
    }
    return last_pos; /* r rounded up to total */
}

static int no_token(tp_err *err)
{
    return tp_err_set(err, TP_ERANGE, "no token can be sampled: every logit is -inf, NaN or banned");
}

/* top_k < vocab: the k best by one heap pass, exp only for those. */
static int sample_top_k(tp_sampler *s, const tp_smp_view *v, int32_t *token_out, tp_err *err)
{
    const tp_sampler_params *p = &s->p;
    size_t n = tp_smp_top_k(v, (size_t)p->top_k, s->cand, s->avx512), best = 0;
    if (n == 0)
        return no_token(err);
    for (size_t i = 1; i < n; i++)
        if (tp_smp_ranks_before(&s->cand[i], &s->cand[best]))
            best = i;
    int32_t best_id = s->cand[best].id;
    float max = s->cand[best].l, inv_t = 1.0f / p->temperature;
    if (isinf(max)) {
        *token_out = best_id;
        return 0;
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        s->cand[i].w = tp_smp_weight(s->cand[i].l, max, inv_t);
        if (s->cand[i].w > 0.0f)
            s->cand[kept++] = s->cand[i];
    }
    n = kept;
    if (p->top_p < 1.0f && n > 1) {
        double total = 0.0;
        for (size_t i = 0; i < n; i++)
            total += s->cand[i].w;
        double cut = top_p_cut(p->top_p, total, n);
        kept = 0;
        for (size_t i = 0; i < n; i++)
            if (s->cand[i].w >= cut)
                s->cand[kept++] = s->cand[i];
        n = select_top_mass(s->cand, kept, (double)p->top_p * total, false);
    }
    if (p->min_p > 0.0f)
        n = keep_min_p(s, n);
    *token_out = n ? draw_cand(s, n) : best_id; /* n == 0 cannot happen: best survives */
    return 0;
}

/* No top-k: weights of the whole vocabulary unless min-p alone filters. */
static int32_t sample_all(tp_sampler *s, const tp_smp_view *v, int32_t best, float max)
{
    const tp_sampler_params *p = &s->p;
    float inv_t = 1.0f / p->temperature;
    size_t n;
    if (p->top_p == 1.0f && p->min_p > 0.0f) {
        n = tp_smp_min_p(v, max, inv_t, p->min_p, s->cand, s->avx512);
        return n ? draw_cand(s, n) : best;
    }
    size_t n_pos;
    int last_pos;
    double total = tp_smp_weights(v, max, inv_t, s->work, s->acc, &n_pos, &last_pos, s->avx512);
    if (p->top_p == 1.0f)
        return draw_all(s, total, last_pos);
    if (n_pos > 1) {
        double cut = top_p_cut(p->top_p, total, n_pos);
        n = tp_smp_gather(v, s->work, cut, s->cand, s->avx512);
        n = select_top_mass(s->cand, n, (double)p->top_p * total, sums_are_exact(cut, total));
    } else {
        n = tp_smp_gather(v, s->work, 0.0, s->cand, s->avx512);
    }
    if (p->min_p > 0.0f)
        n = keep_min_p(s, n);
    return n ? draw_cand(s, n) : best;
}

static int by_rank(const void *a, const void *b)
{
    const tp_smp_cand *x = a, *y = b;
    return tp_smp_ranks_before(x, y) ? -1 : tp_smp_ranks_before(y, x) ? 1 : 0;
}

static int by_typicality(const void *a, const void *b)
{
    const typ_cand *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? -1 : 1;
    return by_rank(&x->c, &y->c);
}

/* typical_p < 1: the filters one after another over sorted candidates
 * (llama.cpp's order: top-k, typical, top-p, min-p). O(vocab log vocab)
 * per call: only jobs that ask for typical_p take this path. */
static int32_t sample_typical(tp_sampler *s, const tp_smp_view *v, int32_t best, float max)
{
    const tp_sampler_params *p = &s->p;
    float inv_t = 1.0f / p->temperature;
    size_t n_pos;
    int last_pos;
    tp_smp_weights(v, max, inv_t, s->work, s->acc, &n_pos, &last_pos, s->avx512);
    size_t n = tp_smp_gather(v, s->work, 0.0, s->cand, s->avx512);
    qsort(s->cand, n, sizeof *s->cand, by_rank);
    if (p->top_k > 0 && (size_t)p->top_k < n)
        n = (size_t)p->top_k;
    double total = 0.0, ent = 0.0;
    for (size_t i = 0; i < n; i++)
        total += s->cand[i].w;
    for (size_t i = 0; i < n; i++) {
        double q = s->cand[i].w / total;
        ent -= q > 0.0 ? q * log(q) : 0.0;
    }
    for (size_t i = 0; i < n; i++)
        s->typ[i] = (typ_cand){fabs(-log(s->cand[i].w / total) - ent), s->cand[i]};
    qsort(s->typ, n, sizeof *s->typ, by_typicality);
    size_t kept = 0;
    double mass = 0.0;
    while (kept < n && (kept == 0 || mass < (double)p->typical_p * total))
        mass += s->typ[kept].c.w, s->cand[kept] = s->typ[kept].c, kept++;
    n = kept;
    qsort(s->cand, n, sizeof *s->cand, by_rank);
    if (p->top_p < 1.0f) {
        double sum = 0.0, acc = 0.0;
        for (size_t i = 0; i < n; i++)
            sum += s->cand[i].w;
        for (kept = 0; kept < n && (kept == 0 || acc < (double)p->top_p * sum); kept++)
            acc += s->cand[kept].w;
        n = kept;
    }
    if (p->min_p > 0.0f && n > 0) {
        float top = s->cand[0].w;
        kept = 0;
        for (size_t i = 0; i < n; i++)
            if (s->cand[i].w >= p->min_p * top)
                s->cand[kept++] = s->cand[i];
        n = kept;
    }
    return n ? draw_cand(s, n) : best;
}

int tp_sampler_sample(tp_sampler *s, const float *logits, int32_t *token_out, tp_err *err)
{
    tp_smp_view v = view_of(s, logits);
    const tp_sampler_params *p = &s->p;
    if (p->temperature != 0.0f && p->typical_p < 1.0f) {
        int best = tp_smp_argmax(&v, s->avx512);
        if (best < 0)
            return no_token(err);
        float max = tp_smp_value(&v, best);
        *token_out = isinf(max) ? best : sample_typical(s, &v, best, max);
        return 0;
    }
    if (p->temperature != 0.0f && p->top_k > 0 && p->top_k < s->vocab)
        return sample_top_k(s, &v, token_out, err);
    int best = tp_smp_argmax(&v, s->avx512);
    if (best < 0)
        return no_token(err);
    float max = tp_smp_value(&v, best);
    *token_out = p->temperature == 0.0f || isinf(max) ? best : sample_all(s, &v, best, max);
    return 0;
}

void tp_sampler_set_avx512(tp_sampler *s, bool on)
{
    s->avx512 = on && tp_smp_have_avx512();
}

/* (l - max) / T - log_total, with l == max giving 0 even where the product
 * would be inf * 0 (a tiny temperature, or +inf logits), as the sampler's
 * weights do. */
static float logprob_of(float l, float max, float inv_t, double log_total)
{
    if (!(l > -INFINITY))
        return -INFINITY;
    double d = l == max ? 0.0 : (double)((l - max) * inv_t);
    return (float)(d - log_total);
}

int tp_sampler_logprobs(tp_sampler *s, const float *logits, tp_logprobs_mode mode, int32_t token,
                        size_t n_top, float *token_logprob, tp_logprob *top, size_t *n_out, tp_err *err)
{
    if (token < 0 || token >= s->vocab)
        return tp_err_set(err, TP_ERANGE, "logprobs: token %d is outside [0, %d)", (int)token, s->vocab);
    tp_smp_view v = mode == TP_LOGPROBS_PROCESSED ? view_of(s, logits)
                                                  : (tp_smp_view){.logits = logits, .vocab = s->vocab};
    float inv_t = mode == TP_LOGPROBS_PROCESSED && s->p.temperature > 0.0f ? 1.0f / s->p.temperature : 1.0f;
    int best = tp_smp_argmax(&v, s->avx512);
    if (best < 0)
        return no_token(err);
    float max = tp_smp_value(&v, best);
    double log_total;
    if (isinf(max)) {
        /* +inf logits share all the mass (the sampler picks the first) */
        size_t n_inf = 0;
        for (int t = best; t < s->vocab; t++)
            n_inf += tp_smp_value(&v, t) == max;
        log_total = log((double)n_inf);
    } else {
        size_t n_pos;
        int last_pos;
        /* log p(t) = (l_t - max) / T - log sum_u exp((l_u - max) / T): the
         * sum is the sampler's own weight pass, the numbers it draws by */
        log_total = log(tp_smp_weights(&v, max, inv_t, s->work, s->acc, &n_pos, &last_pos, s->avx512));
    }
    *token_logprob = logprob_of(tp_smp_value(&v, token), max, inv_t, log_total);
    size_t k = n_top < (size_t)s->vocab ? n_top : (size_t)s->vocab;
    size_t n = k ? tp_smp_top_k(&v, k, s->cand, s->avx512) : 0;
    qsort(s->cand, n, sizeof *s->cand, by_rank);
    for (size_t i = 0; i < n; i++)
        top[i] = (tp_logprob){s->cand[i].id, logprob_of(s->cand[i].l, max, inv_t, log_total)};
    *n_out = n;
    return 0;
}
