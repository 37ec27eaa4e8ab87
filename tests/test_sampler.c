/* tp_sampler: greedy, distributions under temperature/top-k/top-p/min-p
 * measured over many seeded draws against a plain softmax oracle, penalties,
 * bans, seeds and parameter validation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/sampler.h"

#define MAXV 1024

/* ---- oracle: softmax and sorted-prefix sets, written out plainly ------- */

static void softmax(const float *logits, int n, double temp, double *p)
{
    double m = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] > m)
            m = logits[i];
    for (int i = 0; i < n; i++)
        sum += p[i] = exp((logits[i] - m) / temp);
    for (int i = 0; i < n; i++)
        p[i] /= sum;
}

/* Zero every p[i] where keep[i] is false, then renormalize. */
static void restrict_to(double *p, const bool *keep, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += p[i] = keep[i] ? p[i] : 0.0;
    for (int i = 0; i < n; i++)
        p[i] /= sum;
}

/* keep = the m most probable (ties: lower id) with m minimal such that
 * their mass >= top_p; by repeated scans for the next best, no sorting. */
static void top_p_set(const double *p, int n, double top_p, bool *keep)
{
    memset(keep, 0, sizeof *keep * n);
    double mass = 0;
    while (mass < top_p) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!keep[i] && (best < 0 || p[i] > p[best]))
                best = i;
        if (best < 0)
            break;
        keep[best] = true;
        mass += p[best];
    }
}

/* ---- helpers ----------------------------------------------------------- */

static tp_sampler *make(const tp_sampler_params *p, int vocab, const int32_t *prompt, size_t n)
{
    tp_sampler *s = NULL;
    tp_err err;
    tp_err_clear(&err);
    if (tp_sampler_new(p, vocab, prompt, n, &s, &err))
        fail_msg("tp_sampler_new: %s", err.msg);
    return s;
}

static int32_t sample(tp_sampler *s, const float *logits)
{
    int32_t t = -1;
    tp_err err;
    tp_err_clear(&err);
    if (tp_sampler_sample(s, logits, &t, &err))
        fail_msg("tp_sampler_sample: %s", err.msg);
    return t;
}

/* Draw n tokens (accepting each, so the random stream advances) and count. */
static void histogram(const tp_sampler_params *p, const float *logits, int vocab, int n,
                      int *counts)
{
    tp_sampler *s = make(p, vocab, NULL, 0);
    memset(counts, 0, sizeof *counts * vocab);
    for (int i = 0; i < n; i++) {
        int32_t t = sample(s, logits);
        assert_in_range(t, 0, vocab - 1);
        counts[t]++;
        assert_int_equal(tp_sampler_accept(s, t, NULL), 0);
    }
    tp_sampler_free(s);
}

/* Each observed frequency within 5 standard deviations of want (and
 * probability-0 tokens never drawn). */
static void assert_frequencies(const int *counts, const double *want, int vocab, int n,
                               const char *what)
{
    for (int i = 0; i < vocab; i++) {
        double f = (double)counts[i] / n;
        double tol = 5 * sqrt(want[i] * (1 - want[i]) / n) + 1e-9;
        if (want[i] == 0 && counts[i] != 0)
            fail_msg("%s: token %d has probability 0 but was drawn %d times", what, i,
                     counts[i]);
        if (fabs(f - want[i]) > tol)
            fail_msg("%s: token %d drawn with frequency %.4f, want %.4f +- %.4f", what, i, f,
                     want[i], tol);
    }
}

static const float LOGITS8[8] = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f, -0.5f, 0.2f};

/* ---- greedy ------------------------------------------------------------ */

static void greedy_picks_the_first_maximum_and_leaves_logits_alone(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = 0;
    float logits[5] = {1.0f, 3.0f, -2.0f, 3.0f, 2.0f};
    float copy[5];
    memcpy(copy, logits, sizeof copy);
    tp_sampler *s = make(&p, 5, NULL, 0);
    assert_int_equal(sample(s, logits), 1);
    assert_memory_equal(logits, copy, sizeof copy);
    tp_sampler_free(s);
}

static void greedy_skips_nan_logits(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = 0;
    float logits[3] = {NAN, 1.0f, 0.5f};
    tp_sampler *s = make(&p, 3, NULL, 0);
    assert_int_equal(sample(s, logits), 1);
    tp_sampler_free(s);
}

/* ---- distributions ----------------------------------------------------- */

static void temperature_one_draws_follow_softmax(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    p.seed = 7;
    enum { N = 40000 };
    int counts[8];
    double want[8];
    histogram(&p, LOGITS8, 8, N, counts);
    softmax(LOGITS8, 8, 1.0, want);
    assert_frequencies(counts, want, 8, N, "T=1");
}

static void temperature_sharpens_below_one_and_flattens_above(void **state)
{
    (void)state;
    const double temps[3] = {0.5, 1.0, 2.0};
    double top_freq[3];
    enum { N = 30000 };
    for (int k = 0; k < 3; k++) {
        tp_sampler_params p = tp_sampler_params_default();
        p.temperature = (float)temps[k];
        p.seed = 11 + k;
        int counts[8];
        double want[8];
        histogram(&p, LOGITS8, 8, N, counts);
        softmax(LOGITS8, 8, temps[k], want);
        assert_frequencies(counts, want, 8, N, "temperature");
        top_freq[k] = (double)counts[2] / N;
    }
    if (!(top_freq[0] > top_freq[1] + 0.1 && top_freq[1] > top_freq[2] + 0.1))
        fail_msg("most likely token's frequency at T=0.5/1/2: %.3f %.3f %.3f, want decreasing",
                 top_freq[0], top_freq[1], top_freq[2]);
}

static void top_k_only_picks_the_k_best(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    p.top_k = 3;
    p.seed = 3;
    enum { N = 30000 };
    int counts[8];
    double want[8];
    histogram(&p, LOGITS8, 8, N, counts);
    softmax(LOGITS8, 8, 1.0, want);
    bool keep[8] = {false, true, true, false, false, true, false, false}; /* 2.0, 1.5, 1.0 */
    restrict_to(want, keep, 8);
    assert_frequencies(counts, want, 8, N, "top_k=3");
}

static void top_p_keeps_the_smallest_set_reaching_the_mass(void **state)
{
    (void)state;
    /* probabilities 0.5 0.25 0.15 0.1: 0.75 < 0.8 <= 0.9, so 3 tokens stay */
    const float logits[4] = {logf(0.5f), logf(0.25f), logf(0.15f), logf(0.1f)};
    tp_sampler_params p = tp_sampler_params_default();
    p.top_p = 0.8f;
    p.seed = 5;
    enum { N = 30000 };
    int counts[4];
    double want[4];
    histogram(&p, logits, 4, N, counts);
    softmax(logits, 4, 1.0, want);
    restrict_to(want, (bool[]){true, true, true, false}, 4);
    assert_frequencies(counts, want, 4, N, "top_p=0.8");
}

/* Two tied maxima and top_p below 1/n: the set is just the lower id (a cut
 * taken from llama2.c would otherwise drop every token). */
static void tiny_top_p_with_tied_maxima_keeps_the_lower_id(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    p.top_p = 0.05f;
    int counts[3];
    histogram(&p, (float[]){2.0f, 2.0f, 0.0f}, 3, 200, counts);
    assert_int_equal(counts[0], 200);
}

/* A large vocabulary, so the set is found by partitioning, not by the
 * small-range sort; the oracle finds it by repeated scans. */
static void top_p_on_a_large_vocabulary_matches_the_sorted_prefix(void **state)
{
    (void)state;
    enum { V = 1000, N = 60000 };
    static float logits[V];
    uint64_t x = 12345;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = (float)((x >> 40) % 4000) / 1000.0f; /* [0, 4), with ties */
    }
    static double want[V];
    static bool keep[V];
    static int counts[V];
    softmax(logits, V, 1.0, want);
    top_p_set(want, V, 0.3, keep);
    restrict_to(want, keep, V);
    tp_sampler_params p = tp_sampler_params_default();
    p.top_p = 0.3f;
    p.seed = 99;
    histogram(&p, logits, V, N, counts);
    assert_frequencies(counts, want, V, N, "top_p=0.3 over 1000 tokens");
}

static void min_p_drops_tokens_below_the_threshold(void **state)
{
    (void)state;
    /* probabilities .5 .3 .1 .06 .04; min_p .15 -> threshold .075 */
    const float logits[5] = {logf(0.5f), logf(0.3f), logf(0.1f), logf(0.06f), logf(0.04f)};
    tp_sampler_params p = tp_sampler_params_default();
    p.min_p = 0.15f;
    p.seed = 8;
    enum { N = 30000 };
    int counts[5];
    double want[5];
    histogram(&p, logits, 5, N, counts);
    softmax(logits, 5, 1.0, want);
    restrict_to(want, (bool[]){true, true, true, false, false}, 5);
    assert_frequencies(counts, want, 5, N, "min_p=0.15");
}

static void top_k_top_p_and_min_p_combine(void **state)
{
    (void)state;
    /* top_k 4 keeps ids 2,5,1,3 (mass renormalized); top_p then the
     * smallest prefix >= 0.9 of those; min_p .3 drops < .3 * p(2). */
    tp_sampler_params p = tp_sampler_params_default();
    p.top_k = 4;
    p.top_p = 0.9f;
    p.min_p = 0.3f;
    p.seed = 21;
    enum { N = 30000 };
    int counts[8];
    double want[8];
    bool keep[8];
    histogram(&p, LOGITS8, 8, N, counts);
    softmax(LOGITS8, 8, 1.0, want);
    restrict_to(want, (bool[]){false, true, true, true, false, true, false, false}, 8);
    top_p_set(want, 8, 0.9, keep);
    double pmax = want[2];
    for (int i = 0; i < 8; i++)
        keep[i] = keep[i] && want[i] >= 0.3 * pmax;
    restrict_to(want, keep, 8);
    assert_frequencies(counts, want, 8, N, "top_k+top_p+min_p");
}

/* ---- penalties and bans ------------------------------------------------ */

static int greedy_with(tp_sampler_params p, const float *logits, int vocab,
                       const int32_t *prompt, size_t n)
{
    p.temperature = 0;
    tp_sampler *s = make(&p, vocab, prompt, n);
    int t = sample(s, logits);
    tp_sampler_free(s);
    return t;
}

static void repetition_penalty_divides_positive_and_multiplies_negative_logits(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    p.repetition_penalty = 1.2f;
    int32_t seen0[] = {0};
    /* 2.0 / 1.2 = 1.67 < 1.9 */
    assert_int_equal(greedy_with(p, (float[]){2.0f, 1.9f, -1.0f}, 3, seen0, 1), 1);
    assert_int_equal(greedy_with(p, (float[]){2.0f, 1.5f, -1.0f}, 3, seen0, 1), 0);
    /* -1.0 * 1.2 = -1.2 < -1.1 */
    assert_int_equal(greedy_with(p, (float[]){-1.0f, -1.1f}, 2, seen0, 1), 1);
    p.repetition_penalty = 1.0f;
    assert_int_equal(greedy_with(p, (float[]){2.0f, 1.9f, -1.0f}, 3, seen0, 1), 0);
}

static void presence_and_frequency_penalties_subtract_as_openai(void **state)
{
    (void)state;
    int32_t three0[] = {0, 0, 0};
    const float logits[2] = {3.0f, 2.5f};
    tp_sampler_params p = tp_sampler_params_default();
    p.frequency_penalty = 0.2f; /* 3 - 3*0.2 = 2.4 < 2.5 */
    assert_int_equal(greedy_with(p, logits, 2, three0, 3), 1);
    p.frequency_penalty = 0.1f; /* 2.7 */
    assert_int_equal(greedy_with(p, logits, 2, three0, 3), 0);
    p.frequency_penalty = 0;
    p.presence_penalty = 0.6f; /* once, whatever the count: 2.4 */
    assert_int_equal(greedy_with(p, logits, 2, three0, 3), 1);
    p.presence_penalty = 0.4f; /* 2.6 */
    assert_int_equal(greedy_with(p, logits, 2, three0, 3), 0);
    p.presence_penalty = -1.0f; /* a negative penalty encourages: 2.5 + 1 > 3 */
    assert_int_equal(greedy_with(p, logits, 2, (int32_t[]){1}, 1), 1);
}

static void penalty_window_looks_only_at_the_last_tokens(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = 0;
    p.presence_penalty = 1.0f;
    p.penalty_window = 2;
    const float logits[4] = {3.0f, 2.5f, 0.0f, 0.0f};
    tp_sampler *s = make(&p, 4, (int32_t[]){0, 2, 3}, 3); /* 0 is out of the window */
    assert_int_equal(sample(s, logits), 0);
    assert_int_equal(tp_sampler_accept(s, 0, NULL), 0); /* window now {3, 0} */
    assert_int_equal(sample(s, logits), 1);
    assert_int_equal(tp_sampler_accept(s, 2, NULL), 0); /* {0, 2} */
    assert_int_equal(sample(s, logits), 1);
    assert_int_equal(tp_sampler_accept(s, 3, NULL), 0); /* {2, 3} */
    assert_int_equal(sample(s, logits), 0);
    tp_sampler_free(s);
    p.penalty_window = 0; /* no window: penalties see nothing */
    assert_int_equal(greedy_with(p, logits, 4, (int32_t[]){0}, 1), 0);
}

static void ban_ids_are_never_picked_before_min_tokens(void **state)
{
    (void)state;
    const float logits[4] = {0.0f, 1.0f, 5.0f, 4.0f}; /* 2 plays EOS, 3 a stop id */
    int32_t ban[] = {2, 3};
    tp_sampler_params p = tp_sampler_params_default();
    p.min_tokens = 2;
    p.ban_ids = ban;
    p.n_ban = 2;
    p.seed = 4;
    tp_sampler *s = make(&p, 4, NULL, 0);
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 200; k++) { /* same call repeated: sample is pure */
            int32_t t = sample(s, logits);
            if (t == 2 || t == 3)
                fail_msg("banned id %d picked after %d accepted tokens", t, i);
        }
        assert_int_equal(tp_sampler_accept(s, 1, NULL), 0);
    }
    int seen_eos = 0;
    for (int k = 0; k < 200; k++) {
        int32_t t = sample(s, logits);
        seen_eos += t == 2;
        assert_int_equal(tp_sampler_accept(s, t, NULL), 0);
    }
    if (seen_eos < 100)
        fail_msg("after min_tokens the banned id 2 (p ~ 0.7) came only %d times in 200",
                 seen_eos);
    tp_sampler_free(s);
}

static void no_possible_token_is_an_error(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    p.min_tokens = 1;
    p.ban_ids = (int32_t[]){0};
    p.n_ban = 1;
    tp_sampler *s = make(&p, 2, NULL, 0);
    int32_t t;
    tp_err err;
    assert_int_equal(tp_sampler_sample(s, (float[]){1.0f, -INFINITY}, &t, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "no token can be sampled"));
    tp_sampler_free(s);
}

/* ---- seeds ------------------------------------------------------------- */

static void run_sequence(uint64_t seed, int32_t *out, int n)
{
    float logits[100];
    for (int i = 0; i < 100; i++)
        logits[i] = (float)(i % 7) * 0.1f;
    tp_sampler_params p = tp_sampler_params_default();
    p.seed = seed;
    p.top_p = 0.95f;
    tp_sampler *s = make(&p, 100, (int32_t[]){5, 6}, 2);
    for (int i = 0; i < n; i++) {
        out[i] = sample(s, logits);
        assert_int_equal(tp_sampler_accept(s, out[i], NULL), 0);
    }
    tp_sampler_free(s);
}

static void same_seed_gives_the_same_sequence_and_other_seeds_differ(void **state)
{
    (void)state;
    int32_t a[50], b[50], c[50];
    run_sequence(42, a, 50);
    run_sequence(42, b, 50);
    run_sequence(43, c, 50);
    assert_memory_equal(a, b, sizeof a);
    int same = 0;
    for (int i = 0; i < 50; i++)
        same += a[i] == c[i];
    if (same > 10)
        fail_msg("seeds 42 and 43 agree on %d of 50 draws over ~100 tokens", same);
}

static void interleaved_samplers_do_not_affect_each_other(void **state)
{
    (void)state;
    int32_t alone[30];
    run_sequence(7, alone, 30);
    float logits[100];
    for (int i = 0; i < 100; i++)
        logits[i] = (float)(i % 7) * 0.1f;
    tp_sampler_params p = tp_sampler_params_default();
    p.seed = 7;
    p.top_p = 0.95f;
    tp_sampler_params q = p;
    q.seed = 8;
    tp_sampler *s = make(&p, 100, (int32_t[]){5, 6}, 2);
    tp_sampler *other = make(&q, 100, NULL, 0);
    for (int i = 0; i < 30; i++) {
        for (int k = 0; k < 3; k++)
            assert_int_equal(tp_sampler_accept(other, sample(other, logits), NULL), 0);
        int32_t t = sample(s, logits);
        assert_int_equal(t, alone[i]);
        assert_int_equal(tp_sampler_accept(s, t, NULL), 0);
    }
    tp_sampler_free(s);
    tp_sampler_free(other);
}

static void rebuilt_sampler_continues_the_same_sequence(void **state)
{
    (void)state;
    int32_t full[40];
    run_sequence(77, full, 40);
    float logits[100];
    for (int i = 0; i < 100; i++)
        logits[i] = (float)(i % 7) * 0.1f;
    tp_sampler_params p = tp_sampler_params_default();
    p.seed = 77;
    p.top_p = 0.95f;
    tp_sampler *s = make(&p, 100, (int32_t[]){5, 6}, 2);
    for (int i = 0; i < 25; i++)
        assert_int_equal(tp_sampler_accept(s, full[i], NULL), 0);
    assert_int_equal(tp_sampler_n_accepted(s), 25);
    for (int i = 25; i < 40; i++) {
        assert_int_equal(sample(s, logits), full[i]);
        assert_int_equal(tp_sampler_accept(s, full[i], NULL), 0);
    }
    tp_sampler_free(s);
}

/* ---- validation -------------------------------------------------------- */

static void assert_invalid(tp_sampler_params p, const char *want)
{
    tp_err err;
    tp_err_clear(&err);
    if (tp_sampler_params_validate(&p, 512, &err) == 0)
        fail_msg("params accepted, want error '%s'", want);
    if (!strstr(err.msg, want))
        fail_msg("error '%s' does not contain '%s'", err.msg, want);
    tp_sampler *s = NULL;
    assert_int_not_equal(tp_sampler_new(&p, 512, NULL, 0, &s, NULL), 0);
    assert_null(s);
}

static void validation_errors_name_the_field(void **state)
{
    (void)state;
    tp_sampler_params d = tp_sampler_params_default(), p;
    assert_int_equal(tp_sampler_params_validate(&d, 512, NULL), 0);
#define BAD(field, value, msg) (p = d, p.field = value, assert_invalid(p, msg))
    BAD(temperature, -1.0f, "temperature must be >= 0 and finite, got -1");
    BAD(temperature, NAN, "temperature");
    BAD(top_k, -1, "top_k must be >= 0, got -1");
    BAD(top_p, 0.0f, "top_p must be in (0, 1], got 0");
    BAD(top_p, 1.5f, "top_p must be in (0, 1], got 1.5");
    BAD(min_p, 2.0f, "min_p must be in [0, 1], got 2");
    BAD(repetition_penalty, 0.0f, "repetition_penalty must be > 0");
    BAD(presence_penalty, 3.0f, "presence_penalty must be in [-2, 2], got 3");
    BAD(frequency_penalty, -2.5f, "frequency_penalty must be in [-2, 2], got -2.5");
    BAD(penalty_window, -1, "penalty_window");
    BAD(min_tokens, -1, "min_tokens must be >= 0, got -1");
    p = d;
    p.ban_ids = (int32_t[]){2, 512};
    p.n_ban = 2;
    assert_invalid(p, "ban_ids[1] = 512 is outside [0, 512)");
#undef BAD
}

static void new_and_accept_reject_ids_outside_the_vocabulary(void **state)
{
    (void)state;
    tp_sampler_params p = tp_sampler_params_default();
    tp_sampler *s = NULL;
    tp_err err;
    assert_int_equal(tp_sampler_new(&p, 10, (int32_t[]){1, 10}, 2, &s, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "prompt_ids[1] = 10"));
    s = make(&p, 10, NULL, 0);
    assert_int_equal(tp_sampler_accept(s, -1, &err), TP_ERANGE);
    assert_int_equal(tp_sampler_n_accepted(s), 0);
    tp_sampler_free(s);
    tp_sampler_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_picks_the_first_maximum_and_leaves_logits_alone),
        cmocka_unit_test(greedy_skips_nan_logits),
        cmocka_unit_test(temperature_one_draws_follow_softmax),
        cmocka_unit_test(temperature_sharpens_below_one_and_flattens_above),
        cmocka_unit_test(top_k_only_picks_the_k_best),
        cmocka_unit_test(top_p_keeps_the_smallest_set_reaching_the_mass),
        cmocka_unit_test(tiny_top_p_with_tied_maxima_keeps_the_lower_id),
        cmocka_unit_test(top_p_on_a_large_vocabulary_matches_the_sorted_prefix),
        cmocka_unit_test(min_p_drops_tokens_below_the_threshold),
        cmocka_unit_test(top_k_top_p_and_min_p_combine),
        cmocka_unit_test(repetition_penalty_divides_positive_and_multiplies_negative_logits),
        cmocka_unit_test(presence_and_frequency_penalties_subtract_as_openai),
        cmocka_unit_test(penalty_window_looks_only_at_the_last_tokens),
        cmocka_unit_test(ban_ids_are_never_picked_before_min_tokens),
        cmocka_unit_test(no_possible_token_is_an_error),
        cmocka_unit_test(same_seed_gives_the_same_sequence_and_other_seeds_differ),
        cmocka_unit_test(interleaved_samplers_do_not_affect_each_other),
        cmocka_unit_test(rebuilt_sampler_continues_the_same_sequence),
        cmocka_unit_test(validation_errors_name_the_field),
        cmocka_unit_test(new_and_accept_reject_ids_outside_the_vocabulary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
