/* The vectorized sampler picks exactly the tokens the sampler did before
 * (tests/support/sampler_oracle.c, the old implementation kept as the
 * oracle), for random logits (Gaussian of several spreads, ties, spikes,
 * NaN, +-inf, huge and subnormal values) and random parameters (every
 * filter, penalties, windows, bans, min_tokens, seeds), on the AVX-512 and
 * the scalar passes; and its vector exp equals libm's expf bit for bit. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../workers/sample/sample_kernels.h"
#include "support/sampler_oracle.h"
#include "tokpipe/sampler.h"

#define CASES 1500
#define STEPS 12
#define MAX_PROMPT 200
#define MAX_BAN 6

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd64(void)
{
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

static int pick(int n) { return (int)(rnd64() % (uint64_t)n); }

static double unif(void) { return (double)(rnd64() >> 11) * 0x1.0p-53; }

static float gauss(void)
{
    return (float)(sqrt(-2.0 * log(1.0 - unif())) * cos(6.283185307179586 * unif()));
}

#define PICK(arr) (arr)[pick((int)(sizeof(arr) / sizeof((arr)[0])))]

/* ---- random logits ------------------------------------------------------- */

static const float SPECIALS[] = {FLT_MAX, -FLT_MAX, 1e30f, -1e30f, 0x1p-149f, -0x1p-149f,
                                 1e-40f, 0.0f, -0.0f, 88.0f, -104.0f};

static void random_logits(float *x, int v, int mode, float spread, double p_nan, double p_ninf,
                          double p_pinf)
{
    for (int i = 0; i < v; i++) {
        switch (mode) {
        case 0: x[i] = spread * gauss(); break;
        case 1: x[i] = (float)(pick(4) - 1); break;              /* many ties */
        case 2: x[i] = 3.0f * gauss() + (pick(50) ? 0.0f : 15.0f); break; /* peaked */
        default: x[i] = pick(4) ? spread * gauss() : PICK(SPECIALS); break;
        }
        double u = unif();
        if (u < p_nan)
            x[i] = NAN;
        else if (u < p_nan + p_ninf)
            x[i] = -INFINITY;
        else if (u < p_nan + p_ninf + p_pinf)
            x[i] = INFINITY;
    }
}

typedef struct logit_gen {
    int mode;
    float spread;
    double p_nan, p_ninf, p_pinf;
} logit_gen;

static logit_gen random_gen(void)
{
    static const float spreads[] = {0.01f, 0.3f, 1.0f, 3.0f, 30.0f};
    logit_gen g = {.mode = pick(4), .spread = PICK(spreads)};
    if (pick(3) == 0)
        g.p_nan = 0.02;
    if (pick(3) == 0)
        g.p_ninf = pick(4) ? 0.1 : 1.0; /* sometimes nothing can be sampled */
    if (pick(10) == 0)
        g.p_pinf = 0.002;
    return g;
}

/* ---- random parameters --------------------------------------------------- */

static tp_sampler_params random_params(int v, int32_t *ban)
{
    static const float temps[] = {0.0f, 0.0f, 1e-40f, 1e-30f, 1e-6f, 0.1f, 0.5f, 0.8f, 1.0f, 1.0f, 1.5f, 4.0f};
    static const float top_ps[] = {1.0f, 1.0f, 1.0f, 0.99f, 0.9f, 0.5f, 0.1f, 1e-4f};
    static const float min_ps[] = {0.0f, 0.0f, 0.0f, 0.01f, 0.05f, 0.3f, 1.0f, 1e-35f, 1e-44f};
    static const float reps[] = {1.0f, 1.0f, 1.1f, 0.7f, 2.0f};
    static const float presences[] = {0.0f, 0.0f, 0.5f, -1.5f, 2.0f};
    static const float freqs[] = {0.0f, 0.0f, 0.3f, -0.2f};
    static const int windows[] = {0, 1, 8, 64, 300};
    static const int min_tokens[] = {0, 0, 2, 100};
    const int top_ks[] = {0, 0, 0, 1, 2, 5, 40, v > 1 ? v - 1 : 1, v, v + 3};
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = PICK(temps);
    p.top_k = PICK(top_ks);
    p.top_p = PICK(top_ps);
    p.min_p = PICK(min_ps);
    p.repetition_penalty = PICK(reps);
    p.presence_penalty = PICK(presences);
    p.frequency_penalty = PICK(freqs);
    p.penalty_window = PICK(windows);
    p.min_tokens = PICK(min_tokens);
    p.seed = rnd64();
    p.n_ban = (size_t)pick(MAX_BAN + 1);
    for (size_t i = 0; i < p.n_ban; i++)
        ban[i] = i && pick(4) == 0 ? ban[i - 1] : pick(v); /* duplicates too */
    p.ban_ids = ban;
    return p;
}

static void describe(char *buf, size_t n, const tp_sampler_params *p, int v, const logit_gen *g)
{
    snprintf(buf, n,
             "vocab %d mode %d spread %g nan %g -inf %g +inf %g | temp %g top_k %d top_p %g min_p %g "
             "rep %g pres %g freq %g window %d min_tokens %d n_ban %zu seed %llu",
             v, g->mode, (double)g->spread, g->p_nan, g->p_ninf, g->p_pinf, (double)p->temperature,
             p->top_k, (double)p->top_p, (double)p->min_p, (double)p->repetition_penalty,
             (double)p->presence_penalty, (double)p->frequency_penalty, p->penalty_window,
             p->min_tokens, p->n_ban, (unsigned long long)p->seed);
}

/* ---- one case: both samplers, STEPS tokens -------------------------------- */

static void run_case(int v, bool avx512, float *logits, int32_t *prompt)
{
    int32_t ban[MAX_BAN];
    tp_sampler_params p = random_params(v, ban);
    logit_gen g = random_gen();
    size_t n_prompt = (size_t)pick(MAX_PROMPT + 1);
    int pool = pick(2) ? v : (v < 8 ? v : 8); /* a small pool makes repeats */
    for (size_t i = 0; i < n_prompt; i++)
        prompt[i] = pick(pool);
    tp_sampler *s = NULL;
    oracle_sampler *o = NULL;
    tp_err err;
    assert_int_equal(tp_sampler_new(&p, v, prompt, n_prompt, &s, &err), 0);
    assert_int_equal(oracle_sampler_new(&p, v, prompt, n_prompt, &o, &err), 0);
    tp_sampler_set_avx512(s, avx512);
    bool same_logits = pick(4) == 0;
    random_logits(logits, v, g.mode, g.spread, g.p_nan, g.p_ninf, g.p_pinf);
    for (int step = 0; step < STEPS; step++) {
        if (!same_logits && step)
            random_logits(logits, v, g.mode, g.spread, g.p_nan, g.p_ninf, g.p_pinf);
        int32_t got = -1, want = -1;
        int rc_got = tp_sampler_sample(s, logits, &got, &err);
        int rc_want = oracle_sampler_sample(o, logits, &want, &err);
        if (rc_got != rc_want || got != want) {
            char what[512];
            describe(what, sizeof what, &p, v, &g);
            fail_msg("%s, step %d: sampler gave %d (rc %d), the old sampler %d (rc %d) [%s]",
                     avx512 ? "avx512" : "scalar", step, (int)got, rc_got, (int)want, rc_want, what);
        }
        int32_t t = rc_want == 0 ? want : pick(v);
        assert_int_equal(tp_sampler_accept(s, t, &err), 0);
        assert_int_equal(oracle_sampler_accept(o, t, &err), 0);
    }
    tp_sampler_free(s);
    oracle_sampler_free(o);
}

static void run_cases(bool avx512)
{
    static const int vocabs[] = {1, 2, 3, 5, 15, 16, 17, 33, 100, 512, 513, 1000, 4097};
    float *logits = malloc(sizeof(float) * 32000);
    int32_t *prompt = malloc(sizeof(int32_t) * MAX_PROMPT);
    assert_non_null(logits);
    assert_non_null(prompt);
    for (int c = 0; c < CASES; c++)
        run_case(c % 25 == 0 ? 32000 : PICK(vocabs), avx512, logits, prompt);
    free(logits);
    free(prompt);
}

static void avx512_sampler_picks_the_old_samplers_tokens(void **state)
{
    (void)state;
    if (!tp_smp_have_avx512())
        skip();
    rng = 0x243F6A8885A308D3ull;
    run_cases(true);
}

static void scalar_sampler_picks_the_old_samplers_tokens(void **state)
{
    (void)state;
    rng = 0x13198A2E03707344ull;
    run_cases(false);
}

/* ---- the vector exp --------------------------------------------------------- */

/* Compare the vector exp with expf on n bit patterns from first by stride. */
static void check_expf(uint32_t first, uint32_t stride, uint32_t n)
{
    enum { CHUNK = 4096 };
    static float x[CHUNK], y[CHUNK];
    for (uint32_t done = 0; done < n;) {
        uint32_t m = n - done < CHUNK ? n - done : CHUNK;
        for (uint32_t i = 0; i < m; i++) {
            uint32_t bits = first + (done + i) * stride;
            memcpy(&x[i], &bits, sizeof bits);
        }
        tp_smp_expf(x, y, m, true);
        for (uint32_t i = 0; i < m; i++) {
            float want = expf(x[i]);
            if (memcmp(&want, &y[i], sizeof want))
                fail_msg("vector exp(%a) = %a, libm expf gives %a", (double)x[i], (double)y[i],
                         (double)want);
        }
        done += m;
    }
}

static void vector_exp_equals_libm_expf(void **state)
{
    (void)state;
    if (!tp_smp_have_avx512())
        skip();
    /* Every 251st float, and every float around the edges glibc's expf
     * treats apart; TP_EXHAUSTIVE=1: all 2^32 (about 20 s). */
    const char *all = getenv("TP_EXHAUSTIVE");
    if (all && !strcmp(all, "1")) {
        check_expf(0, 1, 0x80000000u);
        check_expf(0x80000000u, 1, 0x80000000u);
    }
    check_expf(0, 251, (uint32_t)(0x100000000ull / 251));
    static const float edges[] = {0.0f, -0.0f, 88.0f, -88.0f, 0x1.62e42ep6f, -0x1.9fe368p6f,
                                  -0x1.9d1d9ep6f, -87.33654f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        uint32_t bits;
        memcpy(&bits, &edges[i], sizeof bits);
        check_expf(bits - 20000, 1, 40000);
    }
}

/* ---- a pass at its edge ------------------------------------------------ */

/* The top-p cut is a double; weights are floats: a weight equal to the cut
 * stays, one a hair (less than a float step) below it goes, on both paths. */
static void gather_compares_float_weights_with_the_double_cut(void **state)
{
    (void)state;
    const float f = 0.1f;
    const float logits[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float w[4] = {nextafterf(f, 0.0f), f, nextafterf(f, 1.0f), 0.0f};
    tp_smp_view v = {.logits = logits, .vocab = 4};
    tp_smp_cand out[4];
    for (int avx512 = 0; avx512 <= (int)tp_smp_have_avx512(); avx512++) {
        size_t n = tp_smp_gather(&v, w, (double)f, out, avx512);
        if (n != 2 || out[0].id != 1 || out[1].id != 2)
            fail_msg("%s: cut = the weight 0.1f kept %zu tokens, want ids 1 and 2",
                     avx512 ? "avx512" : "scalar", n);
        n = tp_smp_gather(&v, w, nextafter((double)f, 1.0), out, avx512);
        if (n != 1 || out[0].id != 2)
            fail_msg("%s: cut just above 0.1f kept %zu tokens, want id 2 only",
                     avx512 ? "avx512" : "scalar", n);
        n = tp_smp_gather(&v, w, 0.0, out, avx512);
        if (n != 3)
            fail_msg("%s: cut 0 kept %zu tokens, want the 3 positive weights",
                     avx512 ? "avx512" : "scalar", n);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(vector_exp_equals_libm_expf),
        cmocka_unit_test(gather_compares_float_weights_with_the_double_cut),
        cmocka_unit_test(avx512_sampler_picks_the_old_samplers_tokens),
        cmocka_unit_test(scalar_sampler_picks_the_old_samplers_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
