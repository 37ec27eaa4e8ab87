/* The sampler as it was before it was vectorized (workers/sample/sampler.c
 * at 6bf2f59), kept verbatim but for names as the oracle of
 * tests/test_sampler_exact.c: the new sampler must pick the very same
 * tokens. Parameter validation is left out: callers pass params that
 * tp_sampler_params_validate accepted. */
#include "sampler_oracle.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    float l; /* logit after penalties; ranks the candidates */
    float w; /* unnormalized probability exp((l - max) / temperature) */
    int32_t id;
};

struct oracle_sampler {
    tp_sampler_params p;
    int vocab;
    int32_t *ban;
    /* penalty window: ring of the last `window` tokens and their counts */
    int32_t *ring;
    size_t ring_len, ring_pos;
    int32_t *counts;
    uint32_t *stamp; /* per id: last call that applied its penalty */
    uint32_t call;
    size_t n_accepted;
    uint64_t stream; /* mixed seed */
    float *work;
    struct cand *cand;
};

/* SplitMix64 (Steele, Lea, Flood 2014): output n is mix(seed + n * gamma). */
#define SPLITMIX_GAMMA 0x9e3779b97f4a7c15ull

static uint64_t splitmix_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) for generated token number n. */
static double draw(const oracle_sampler *s, size_t n)
{
    uint64_t x = splitmix_mix(s->stream + ((uint64_t)n + 1) * SPLITMIX_GAMMA);
    return (double)(x >> 11) * 0x1.0p-53;
}

void oracle_sampler_free(oracle_sampler *s)
{
    if (!s)
        return;
    free(s->ban);
    free(s->ring);
    free(s->counts);
    free(s->stamp);
    free(s->work);
    free(s->cand);
    free(s);
}

static void push_history(oracle_sampler *s, int32_t token)
{
    size_t w = (size_t)s->p.penalty_window;
    if (w == 0)
        return;
    if (s->ring_len == w)
        s->counts[s->ring[s->ring_pos]]--;
    else
        s->ring_len++;
    s->ring[s->ring_pos] = token;
    s->counts[token]++;
    s->ring_pos = (s->ring_pos + 1) % w;
}

int oracle_sampler_new(const tp_sampler_params *p, int vocab_size, const int32_t *prompt_ids,
                       size_t n_prompt, oracle_sampler **out, tp_err *err)
{
    if (!out)
        return tp_err_set(err, TP_EINVAL, "sampler: out must not be NULL");
    *out = NULL;
    if (n_prompt && !prompt_ids)
        return tp_err_set(err, TP_EINVAL, "prompt_ids is NULL but n_prompt is %zu", n_prompt);
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt_ids[i] < 0 || prompt_ids[i] >= vocab_size)
            return tp_err_set(err, TP_ERANGE, "prompt_ids[%zu] = %d is outside [0, %d)", i,
                              (int)prompt_ids[i], vocab_size);
    oracle_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return tp_err_set(err, TP_ENOMEM, "sampler: out of memory");
    s->p = *p;
    s->vocab = vocab_size;
    s->stream = splitmix_mix(p->seed);
    size_t v = (size_t)vocab_size, w = (size_t)p->penalty_window;
    s->ban = malloc(sizeof *s->ban * (p->n_ban ? p->n_ban : 1));
    s->ring = malloc(sizeof *s->ring * (w ? w : 1));
    s->counts = calloc(v, sizeof *s->counts);
    s->stamp = calloc(v, sizeof *s->stamp);
    s->work = malloc(sizeof *s->work * v);
    s->cand = malloc(sizeof *s->cand * v);
    if (!s->ban || !s->ring || !s->counts || !s->stamp || !s->work || !s->cand) {
        oracle_sampler_free(s);
        return tp_err_set(err, TP_ENOMEM, "sampler: out of memory for vocab %d", vocab_size);
    }
    if (p->n_ban)
        memcpy(s->ban, p->ban_ids, sizeof *s->ban * p->n_ban);
    s->p.ban_ids = s->ban;
    for (size_t i = 0; i < n_prompt; i++)
        push_history(s, prompt_ids[i]);
    *out = s;
    return 0;
}

int oracle_sampler_accept(oracle_sampler *s, int32_t token, tp_err *err)
{
    if (token < 0 || token >= s->vocab)
        return tp_err_set(err, TP_ERANGE, "accepted token %d is outside [0, %d)", (int)token,
                          s->vocab);
    push_history(s, token);
    s->n_accepted++;
    return 0;
}

/* Steps 1-2: copy logits into work with penalties and bans applied. */
static void prepare_logits(oracle_sampler *s, const float *logits)
{
    float *x = s->work;
    for (int i = 0; i < s->vocab; i++)
        x[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    const tp_sampler_params *p = &s->p;
    bool penalize = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
                    p->frequency_penalty != 0.0f;
    if (++s->call == 0) { /* stamps wrapped: forget them all */
        memset(s->stamp, 0, sizeof *s->stamp * (size_t)s->vocab);
        s->call = 1;
    }
    for (size_t k = 0; penalize && k < s->ring_len; k++) {
        int32_t t = s->ring[k];
        if (s->stamp[t] == s->call)
            continue; /* each distinct token is penalized once */
        s->stamp[t] = s->call;
        if (x[t] > 0.0f)
            x[t] /= p->repetition_penalty;
        else
            x[t] *= p->repetition_penalty;
        x[t] -= p->presence_penalty + p->frequency_penalty * (float)s->counts[t];
    }
    if (s->n_accepted < (size_t)p->min_tokens)
        for (size_t k = 0; k < p->n_ban; k++)
            x[p->ban_ids[k]] = -INFINITY;
}

static int argmax(const float *x, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (x[i] > -INFINITY && (best < 0 || x[i] > x[best]))
            best = i;
    return best;
}

/* a ranks before b: higher logit (so at least as probable), or the same
 * logit and a lower id. */
static bool ranks_before(const struct cand *a, const struct cand *b)
{
    return a->l > b->l || (a->l == b->l && a->id < b->id);
}

static void swap(struct cand *a, struct cand *b)
{
    struct cand t = *a;
    *a = *b;
    *b = t;
}

/* Partition c[lo, hi) around a median-of-three pivot; returns the pivot's
 * final index: everything before it ranks before it. */
static size_t partition(struct cand *c, size_t lo, size_t hi)
{
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (ranks_before(&c[mid], &c[lo]))
        swap(&c[mid], &c[lo]);
    if (ranks_before(&c[last], &c[lo]))
        swap(&c[last], &c[lo]);
    if (ranks_before(&c[mid], &c[last]))
        swap(&c[mid], &c[last]); /* median now at last */
    size_t store = lo;
    for (size_t i = lo; i < last; i++)
        if (ranks_before(&c[i], &c[last]))
            swap(&c[i], &c[store++]);
    swap(&c[store], &c[last]);
    return store;
}

static void insertion_sort(struct cand *c, size_t lo, size_t hi)
{
    for (size_t i = lo + 1; i < hi; i++)
        for (size_t j = i; j > lo && ranks_before(&c[j], &c[j - 1]); j--)
            swap(&c[j], &c[j - 1]);
}

/* The smallest m such that the m best of c[0, n) weigh >= target, with
 * c reordered so those are c[0, m). */
static size_t select_top_mass(struct cand *c, size_t n, double target)
{
    size_t lo = 0, hi = n;
    double acc = 0.0; /* weight of c[0, lo), all ranked before c[lo, n) */
    while (hi - lo > 16) {
        size_t m = partition(c, lo, hi);
        double upper = 0.0;
        for (size_t i = lo; i <= m; i++)
            upper += c[i].w;
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

static float weight(float l, float max, float inv_t)
{
    float d = l - max;
    /* d == 0 is special-cased so a tiny temperature (inv_t = inf) gives 1,
     * not NaN. */
    return d == 0.0f ? 1.0f : expf(d * inv_t);
}

static void heap_sift_down(struct cand *h, size_t n, size_t i)
{
    for (;;) { /* min-heap by rank: the root is the worst kept candidate */
        size_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && ranks_before(&h[c], &h[c + 1]))
            c++;
        if (!ranks_before(&h[i], &h[c]))
            return;
        swap(&h[i], &h[c]);
        i = c;
    }
}

/* The k best finite logits of work[] into cand[0, k) with a k-heap: one
 * comparison for most tokens, and exp only for the k kept. */
static size_t gather_top_k(oracle_sampler *s, size_t k, float max, float inv_t)
{
    struct cand *h = s->cand;
    size_t n = 0;
    for (int i = 0; i < s->vocab; i++) {
        struct cand c = {s->work[i], 0.0f, i};
        if (!(c.l > -INFINITY))
            continue;
        if (n < k) {
            h[n++] = c;
            for (size_t j = n - 1; j > 0 && ranks_before(&h[(j - 1) / 2], &h[j]); j = (j - 1) / 2)
                swap(&h[j], &h[(j - 1) / 2]);
        } else if (ranks_before(&c, &h[0])) {
            h[0] = c;
            heap_sift_down(h, n, 0);
        }
    }
    size_t kept = 0;
    for (size_t j = 0; j < n; j++) {
        h[j].w = weight(h[j].l, max, inv_t);
        if (h[j].w > 0.0f)
            h[kept++] = h[j];
    }
    return kept;
}

static size_t gather_all(oracle_sampler *s, float max, float inv_t)
{
    size_t n = 0;
    for (int i = 0; i < s->vocab; i++) {
        float w = weight(s->work[i], max, inv_t);
        if (w > 0.0f) /* an underflowed weight can never be drawn */
            s->cand[n++] = (struct cand){s->work[i], w, i};
    }
    return n;
}

/* Step 4 on work[]; returns the number of candidates kept in s->cand. */
static size_t filter_candidates(oracle_sampler *s, float max)
{
    const tp_sampler_params *p = &s->p;
    float inv_t = 1.0f / p->temperature;
    size_t n = p->top_k > 0 && p->top_k < s->vocab ? gather_top_k(s, (size_t)p->top_k, max, inv_t)
                                                    : gather_all(s, max, inv_t);
    if (p->top_p < 1.0f && n > 1) {
        double total = 0.0;
        for (size_t i = 0; i < n; i++)
            total += s->cand[i].w;
        /* llama2.c's cut: tokens lighter than (1 - top_p) * total / (n - 1)
         * weigh less than (1 - top_p) * total together as long as the
         * heaviest (w = 1) is not among them, so the top-p set lies among the
         * others. Capping the cut at 1 keeps the heaviest when top_p < 1/n
         * (llama2.c then keeps nothing). */
        double cut = (1.0 - (double)p->top_p) * total / (double)(n - 1);
        if (cut > 1.0)
            cut = 1.0;
        size_t kept = 0;
        for (size_t i = 0; i < n; i++)
            if (s->cand[i].w >= cut)
                s->cand[kept++] = s->cand[i];
        n = select_top_mass(s->cand, kept, (double)p->top_p * total);
    }
    if (p->min_p > 0.0f) {
        size_t kept = 0; /* the most likely token has w == 1 */
        for (size_t i = 0; i < n; i++)
            if (s->cand[i].w >= p->min_p)
                s->cand[kept++] = s->cand[i];
        n = kept;
    }
    return n;
}

int oracle_sampler_sample(oracle_sampler *s, const float *logits, int32_t *token_out, tp_err *err)
{
    prepare_logits(s, logits);
    int best = argmax(s->work, s->vocab);
    if (best < 0)
        return tp_err_set(err, TP_ERANGE,
                          "no token can be sampled: every logit is -inf, NaN or banned");
    if (s->p.temperature == 0.0f || isinf(s->work[best])) {
        *token_out = best;
        return 0;
    }
    size_t n = filter_candidates(s, s->work[best]);
    if (n == 0) { /* cannot happen: the most likely token always survives */
        *token_out = best;
        return 0;
    }
    double total = 0.0;
    for (size_t i = 0; i < n; i++)
        total += s->cand[i].w;
    double r = draw(s, s->n_accepted) * total, acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += s->cand[i].w;
        if (r < acc) {
            *token_out = s->cand[i].id;
            return 0;
        }
    }
    *token_out = s->cand[n - 1].id; /* r rounded up to total */
    return 0;
}
