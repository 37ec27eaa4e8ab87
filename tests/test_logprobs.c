/* tp_sampler_logprobs, logit_bias and typical_p on real logits: the
 * stories260K checkpoint (vocabulary 512) run greedily from BOS, so every
 * check sees the spread of a trained model. Oracles are written out here in
 * double precision (a log-softmax, a sort), never the sampler's own code. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/sampler.h"

#define ROWS 12

typedef struct rows {
    int vocab;
    float *l; /* ROWS x vocab logits of consecutive greedy positions */
} rows;

static int setup(void **state)
{
    const char *dir = getenv("TP_MODELS");
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K.bin", dir ? dir : "../shared/models");
    tp_model *m;
    tp_forward *f;
    tp_err e;
    if (tp_model_load(path, &m, &e) || tp_forward_new(m, 1, 0, 8, &f, &e))
        fail_msg("%s: %s", path, e.msg);
    rows *r = calloc(1, sizeof *r);
    r->vocab = tp_model_get_config(m)->vocab_size;
    r->l = malloc(sizeof *r->l * ROWS * (size_t)r->vocab);
    int sid, tok = 1;
    assert_int_equal(tp_forward_seq_open(f, &sid, &e), 0);
    for (int p = 0; p < ROWS; p++) {
        float *row = r->l + (size_t)p * r->vocab;
        tp_fwd_item it = {sid, p, &tok, 1, false};
        assert_int_equal(tp_forward_step(f, &it, 1, row, &e), 0);
        tok = 0;
        for (int t = 1; t < r->vocab; t++)
            if (row[t] > row[tok])
                tok = t;
    }
    tp_forward_free(f);
    tp_model_free(m);
    *state = r;
    return 0;
}

static int teardown(void **state)
{
    rows *r = *state;
    free(r->l);
    free(r);
    return 0;
}

static tp_sampler *make(const tp_sampler_params *p, int vocab)
{
    tp_sampler *s = NULL;
    tp_err e;
    if (tp_sampler_new(p, vocab, NULL, 0, &s, &e))
        fail_msg("tp_sampler_new: %s", e.msg);
    return s;
}

/* Oracle: log_softmax(l / temp) in double. */
static void log_softmax(const float *l, int n, double temp, double *out)
{
    double m = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        m = l[i] > m ? l[i] : m;
    for (int i = 0; i < n; i++)
        sum += exp((l[i] - m) / temp);
    for (int i = 0; i < n; i++)
        out[i] = (l[i] - m) / temp - log(sum);
}

static void greedy_picks_equal_the_top_logprob(void **state)
{
    rows *r = *state;
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = 0.0f;
    tp_sampler *s = make(&p, r->vocab);
    tp_logprob top[5];
    for (int i = 0; i < ROWS; i++) {
        const float *row = r->l + (size_t)i * r->vocab;
        int32_t t;
        float lp;
        size_t n;
        assert_int_equal(tp_sampler_sample(s, row, &t, NULL), 0);
        assert_int_equal(tp_sampler_logprobs(s, row, TP_LOGPROBS_RAW, t, 5, &lp, top, &n, NULL), 0);
        assert_int_equal(n, 5);
        if (top[0].id != t)
            fail_msg("row %d: greedy picked %d, the top logprob is id %d", i, t, top[0].id);
        assert_float_equal(lp, top[0].logprob, 0.0f);
        for (size_t k = 1; k < n; k++)
            if (top[k].logprob > top[k - 1].logprob)
                fail_msg("row %d: alternatives out of order at %zu", i, k);
        assert_int_equal(tp_sampler_accept(s, t, NULL), 0);
    }
    tp_sampler_free(s);
}

static void the_full_distribution_sums_to_one_and_matches_a_double_log_softmax(void **state)
{
    rows *r = *state;
    tp_sampler_params p = tp_sampler_params_default();
    tp_sampler *s = make(&p, r->vocab);
    tp_logprob *all = malloc(sizeof *all * (size_t)r->vocab);
    double *want = malloc(sizeof *want * (size_t)r->vocab);
    for (int i = 0; i < ROWS; i++) {
        const float *row = r->l + (size_t)i * r->vocab;
        float lp;
        size_t n, n20;
        tp_logprob top20[TP_SAMPLER_MAX_TOP_LOGPROBS];
        /* the test hook: ask for every token, not just the wire's 20 */
        assert_int_equal(tp_sampler_logprobs(s, row, TP_LOGPROBS_RAW, 7, (size_t)r->vocab, &lp, all, &n, NULL), 0);
        assert_int_equal(n, r->vocab);
        log_softmax(row, r->vocab, 1.0, want);
        double sum = 0.0;
        for (size_t k = 0; k < n; k++) {
            sum += exp(all[k].logprob);
            if (fabs(all[k].logprob - want[all[k].id]) > 1e-4)
                fail_msg("row %d id %d: logprob %.6f, double oracle %.6f", i, all[k].id, all[k].logprob,
                         want[all[k].id]);
        }
        if (fabs(sum - 1.0) > 1e-4)
            fail_msg("row %d: the %d probabilities sum to %.7f", i, r->vocab, sum);
        assert_float_equal(lp, want[7], 1e-4);
        assert_int_equal(tp_sampler_logprobs(s, row, TP_LOGPROBS_RAW, 7, 20, &lp, top20, &n20, NULL), 0);
        double part = 0.0;
        for (size_t k = 0; k < n20; k++) {
            part += exp(top20[k].logprob);
            assert_int_equal(top20[k].id, all[k].id); /* the top 20 are the head of the whole ranking */
        }
        if (!(part <= 1.0 + 1e-6))
            fail_msg("row %d: the top 20 weigh %.7f > 1", i, part);
    }
    free(all);
    free(want);
    tp_sampler_free(s);
}

static void processed_logprobs_follow_temperature_and_bias(void **state)
{
    rows *r = *state;
    const float *row = r->l + 3 * (size_t)r->vocab;
    int32_t ids[] = {5};
    float vals[] = {2.5f};
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = 0.7f;
    p.bias_ids = ids;
    p.bias_values = vals;
    p.n_bias = 1;
    tp_sampler *s = make(&p, r->vocab);
    float *biased = malloc(sizeof *biased * (size_t)r->vocab);
    double *want = malloc(sizeof *want * (size_t)r->vocab);
    memcpy(biased, row, sizeof *biased * (size_t)r->vocab);
    biased[5] += 2.5f;
    log_softmax(biased, r->vocab, 0.7, want);
    float lp, raw;
    size_t n;
    tp_logprob top[3];
    assert_int_equal(tp_sampler_logprobs(s, row, TP_LOGPROBS_PROCESSED, 5, 3, &lp, top, &n, NULL), 0);
    assert_float_equal(lp, want[5], 1e-4);
    log_softmax(row, r->vocab, 1.0, want);
    assert_int_equal(tp_sampler_logprobs(s, row, TP_LOGPROBS_RAW, 5, 0, &raw, top, &n, NULL), 0);
    assert_int_equal(n, 0);
    assert_float_equal(raw, want[5], 1e-4);
    free(biased);
    free(want);
    tp_sampler_free(s);
}

/* Draw 300 tokens at temperature 1 from each row with one bias set. */
static void draw_with_bias(const rows *r, int32_t id, float bias, int *hits, int *draws)
{
    tp_sampler_params p = tp_sampler_params_default();
    p.bias_ids = &id;
    p.bias_values = &bias;
    p.n_bias = 1;
    *hits = *draws = 0;
    for (uint64_t seed = 1; seed <= 25; seed++) {
        p.seed = seed;
        tp_sampler *s = make(&p, r->vocab);
        for (int i = 0; i < ROWS; i++) {
            int32_t t;
            assert_int_equal(tp_sampler_sample(s, r->l + (size_t)i * r->vocab, &t, NULL), 0);
            *hits += t == id;
            ++*draws;
            assert_int_equal(tp_sampler_accept(s, t, NULL), 0);
        }
        tp_sampler_free(s);
    }
}

static void logit_bias_minus_100_never_picks_the_id_and_plus_100_always_does(void **state)
{
    rows *r = *state;
    /* the greedy pick of row 0 is the id most worth banning */
    const float *row = r->l;
    int32_t fav = 0;
    for (int t = 1; t < r->vocab; t++)
        fav = row[t] > row[fav] ? t : fav;
    int hits, draws;
    draw_with_bias(r, fav, -100.0f, &hits, &draws);
    if (hits)
        fail_msg("bias -100 on id %d: picked %d times in %d draws", fav, hits, draws);
    draw_with_bias(r, 77, 100.0f, &hits, &draws);
    if (hits != draws)
        fail_msg("bias +100 on id 77: picked %d times in %d draws", hits, draws);
    /* greedy sees the bias too */
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = 0.0f;
    int32_t id = fav;
    float b = -100.0f;
    p.bias_ids = &id, p.bias_values = &b, p.n_bias = 1;
    tp_sampler *s = make(&p, r->vocab);
    int32_t t;
    assert_int_equal(tp_sampler_sample(s, row, &t, NULL), 0);
    assert_int_not_equal(t, fav);
    tp_sampler_free(s);
}

/* Bans (below min_tokens) and biases on a vocabulary of 4: each applies
 * where it should, alone and together. */
static void logit_bias_and_min_tokens_bans_combine(void **state)
{
    (void)state;
    const float l[4] = {3.0f, 2.0f, 1.0f, 0.0f};
    int32_t ban[] = {0}, ids[] = {2, 1};
    float vals[] = {1.5f, -100.0f};
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = 0.0f;
    p.min_tokens = 1, p.ban_ids = ban, p.n_ban = 1;
    p.bias_ids = ids, p.bias_values = vals, p.n_bias = 2;
    tp_sampler *s = make(&p, 4);
    int32_t t;
    assert_int_equal(tp_sampler_sample(s, l, &t, NULL), 0);
    assert_int_equal(t, 2);   /* 0 banned, 1 biased away, 2 at 2.5 */
    assert_int_equal(tp_sampler_accept(s, 2, NULL), 0);
    assert_int_equal(tp_sampler_sample(s, l, &t, NULL), 0);
    assert_int_equal(t, 0);   /* the ban is over; the bias on 2 (2.5) stays below 3 */
    float lp;
    size_t n;
    tp_logprob top[4];
    assert_int_equal(tp_sampler_logprobs(s, l, TP_LOGPROBS_PROCESSED, 1, 4, &lp, top, &n, NULL), 0);
    assert_true(isinf(lp) && lp < 0);   /* processed: -100 is a ban */
    assert_int_equal(n, 3);
    assert_int_equal(tp_sampler_logprobs(s, l, TP_LOGPROBS_RAW, 1, 4, &lp, top, &n, NULL), 0);
    assert_true(isfinite(lp));          /* raw: the model's own view */
    assert_int_equal(n, 4);
    tp_sampler_free(s);
}

static void logit_bias_and_typical_p_are_validated_naming_the_field(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    tp_sampler *s = NULL;
    tp_err e;
    p.typical_p = 0.0f;
    assert_int_equal(tp_sampler_new(&p, 16, NULL, 0, &s, &e), TP_ERANGE);
    assert_non_null(strstr(e.msg, "typical_p"));
    p = tp_sampler_params_default();
    int32_t ids[2] = {3, 3};
    float vals[2] = {1.0f, 2.0f};
    p.bias_ids = ids, p.bias_values = vals, p.n_bias = 2;
    assert_int_equal(tp_sampler_new(&p, 16, NULL, 0, &s, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "logit_bias"));
    ids[1] = 16;
    assert_int_equal(tp_sampler_new(&p, 16, NULL, 0, &s, &e), TP_ERANGE);
    assert_non_null(strstr(e.msg, "logit_bias"));
    ids[1] = 4;
    vals[0] = 100.5f;
    assert_int_equal(tp_sampler_new(&p, 16, NULL, 0, &s, &e), TP_ERANGE);
    assert_non_null(strstr(e.msg, "logit_bias[3]"));
    assert_null(s);
}

/* Oracle of the typical set: probabilities in double, sorted by distance
 * from the entropy (ties by rank), the smallest prefix of mass >= tau. */
static void typical_set(const float *l, int n, double tau, bool *keep)
{
    double *lp = malloc(sizeof *lp * (size_t)n), ent = 0.0;
    log_softmax(l, n, 1.0, lp);
    for (int i = 0; i < n; i++)
        ent -= exp(lp[i]) * lp[i];
    memset(keep, 0, sizeof *keep * (size_t)n);
    double mass = 0.0;
    while (mass < tau) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            if (keep[i])
                continue;
            double d = fabs(-lp[i] - ent), db = best < 0 ? INFINITY : fabs(-lp[best] - ent);
            if (best < 0 || d < db || (d == db && l[i] > l[best]))
                best = i;
        }
        keep[best] = true;
        mass += exp(lp[best]);
    }
    free(lp);
}

static void typical_p_draws_only_from_the_locally_typical_set(void **state)
{
    rows *r = *state;
    bool *keep = malloc(sizeof *keep * (size_t)r->vocab);
    tp_sampler_params p = tp_sampler_params_default();
    p.typical_p = 0.5f;
    int outside = 0, typical_not_top = 0;
    for (int i = 0; i < ROWS; i++) {
        const float *row = r->l + (size_t)i * r->vocab;
        typical_set(row, r->vocab, 0.5, keep);
        int best = 0;
        for (int t = 1; t < r->vocab; t++)
            best = row[t] > row[best] ? t : best;
        for (uint64_t seed = 1; seed <= 40; seed++) {
            p.seed = seed;
            tp_sampler *s = make(&p, r->vocab);
            int32_t t;
            assert_int_equal(tp_sampler_sample(s, row, &t, NULL), 0);
            outside += !keep[t];
            typical_not_top += t != best;
            tp_sampler_free(s);
        }
    }
    if (outside)
        fail_msg("typical_p 0.5: %d of %d draws outside the oracle's typical set", outside, ROWS * 40);
    if (!typical_not_top)
        fail_msg("typical_p 0.5 only ever drew the argmax: the filter did nothing visible");
    free(keep);
}

static void logprobs_of_infinite_logits_and_a_tiny_temperature_are_not_nan(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = 1e-45f;   /* 1 / T overflows to inf */
    tp_sampler *s = make(&p, 4);
    float lp;
    size_t n;
    tp_logprob top[4];
    const float l[4] = {0.5f, 2.0f, 1.0f, -INFINITY};
    assert_int_equal(tp_sampler_logprobs(s, l, TP_LOGPROBS_PROCESSED, 1, 4, &lp, top, &n, NULL), 0);
    assert_true(lp == 0.0f);              /* all the mass on the maximum */
    assert_int_equal(n, 3);               /* -inf is not a possible token */
    assert_true(isinf(top[1].logprob) && top[1].logprob < 0);
    const float inf2[4] = {INFINITY, 1.0f, INFINITY, 0.0f};
    assert_int_equal(tp_sampler_logprobs(s, inf2, TP_LOGPROBS_RAW, 0, 2, &lp, top, &n, NULL), 0);
    assert_float_equal(lp, -logf(2.0f), 1e-6);   /* two +inf logits share the mass */
    assert_int_equal(top[1].id, 2);
    assert_float_equal(top[1].logprob, -logf(2.0f), 1e-6);
    tp_sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_picks_equal_the_top_logprob),
        cmocka_unit_test(the_full_distribution_sums_to_one_and_matches_a_double_log_softmax),
        cmocka_unit_test(processed_logprobs_follow_temperature_and_bias),
        cmocka_unit_test(logit_bias_minus_100_never_picks_the_id_and_plus_100_always_does),
        cmocka_unit_test(logit_bias_and_min_tokens_bans_combine),
        cmocka_unit_test(logit_bias_and_typical_p_are_validated_naming_the_field),
        cmocka_unit_test(typical_p_draws_only_from_the_locally_typical_set),
        cmocka_unit_test(logprobs_of_infinite_logits_and_a_tiny_temperature_are_not_nan),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
