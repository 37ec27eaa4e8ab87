/* make bench: nanoseconds per token of tp_sampler_sample (+ accept) for
 * greedy, temperature 1 over the full distribution, top-k 40, top-p 0.9,
 * min-p 0.05 and repetition penalty 1.1 over 64 tokens at temperature 0.8,
 * against a straightforward reference measured in the same run: llama2.c's
 * sample() (copy, divide by temperature, softmax over the whole vocabulary,
 * qsort for top-p; plus a qsort for top-k, a filter for min-p and a loop over
 * the window for the penalty, as llama2.c-style code adds them).
 *
 * Logits come from real forward passes: the stories260K checkpoint (vocab
 * 512) and a random-weight stories15M-shaped model (vocab 32000, built in
 * memory like `tokpipe mkmodel`). A random model's logits are nearly flat
 * (std ~0.3: top-p 0.9 keeps most of the vocabulary, the worst case); the
 * "peaked" set multiplies them by 10, the spread of a trained model's
 * logits (stories260K's std is printed for comparison). Each figure is the
 * median of several samples, tokpipe and reference alternating. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/sampler.h"
#include "tokpipe/synth.h"
#include "support/timing.h"

#define ROWS 16      /* logit rows per set: 16 consecutive decode positions */
#define SAMPLES 7    /* each figure is the median of this many timed runs */
#define WINDOW 64
#define SAMPLE_NS 20e6 /* aim: one timed run lasts ~20 ms */

typedef struct logit_set {
    const char *name;
    int vocab;
    float *rows;        /* ROWS x vocab */
    int32_t ids[ROWS];  /* the greedy tokens that produced the rows */
} logit_set;

typedef struct config {
    const char *name;
    float temperature, top_p, min_p, rep;
    int top_k;
} config;

static const config CONFIGS[] = {
    {"greedy", 0.0f, 1.0f, 0.0f, 1.0f, 0},
    {"temperature 1", 1.0f, 1.0f, 0.0f, 1.0f, 0},
    {"top-k 40", 1.0f, 1.0f, 0.0f, 1.0f, 40},
    {"top-p 0.9", 1.0f, 0.9f, 0.0f, 1.0f, 0},
    {"min-p 0.05", 1.0f, 1.0f, 0.05f, 1.0f, 0},
    {"rep 1.1/64, temp 0.8", 0.8f, 1.0f, 0.0f, 1.1f, 0},
};
#define N_CONFIGS (sizeof CONFIGS / sizeof CONFIGS[0])

static void die(const char *what, const tp_err *e)
{
    fprintf(stderr, "bench_sample: %s: %s\n", what, e ? e->msg : "out of memory");
    exit(1);
}

/* ---- logits from real forward passes ------------------------------------- */

/* Greedy decode from BOS, keeping the logits of ROWS consecutive steps. */
static void decode_rows(const tp_model *m, logit_set *set)
{
    tp_err e;
    tp_forward *f;
    int seq, v = set->vocab;
    if (tp_forward_new(m, 1, ROWS + 1, 1, &f, &e) || tp_forward_seq_open(f, &seq, &e))
        die("forward", &e);
    set->rows = malloc(sizeof(float) * ROWS * (size_t)v);
    if (!set->rows)
        die("rows", NULL);
    int tok = 1; /* BOS */
    for (int r = 0; r < ROWS; r++) {
        tp_fwd_item it = {.seq_id = seq, .pos = r, .tokens = &tok, .n_tokens = 1};
        float *row = set->rows + (size_t)r * v;
        if (tp_forward_step(f, &it, 1, row, &e))
            die("forward step", &e);
        int best = 0;
        for (int i = 1; i < v; i++)
            best = row[i] > row[best] ? i : best;
        set->ids[r] = tok = best;
    }
    tp_forward_free(f);
}

static void load_sets(logit_set sets[3])
{
    tp_err e;
    tp_model *m;
    const char *dir = getenv("TP_MODELS") ? getenv("TP_MODELS") : "../shared/models";
    char path[512];
    snprintf(path, sizeof path, "%s/stories260K.bin", dir);
    if (tp_model_load(path, &m, &e))
        die(path, &e);
    sets[0] = (logit_set){.name = "stories260K", .vocab = 512};
    decode_rows(m, &sets[0]);
    tp_model_free(m);

    tp_synth_shape sh;
    void *buf;
    size_t size;
    if (tp_synth_parse_shape("stories15M", &sh, &e) || tp_synth_build_model(&sh, 1, &buf, &size, &e) ||
        tp_model_from_memory(buf, size, &m, &e))
        die("stories15M-shaped model", &e);
    sets[1] = (logit_set){.name = "15M random", .vocab = sh.vocab_size};
    decode_rows(m, &sets[1]);
    tp_model_free(m);
    free(buf);

    size_t n = (size_t)ROWS * (size_t)sh.vocab_size;
    sets[2] = sets[1];
    sets[2].name = "15M peaked x10";
    sets[2].rows = malloc(sizeof(float) * n);
    if (!sets[2].rows)
        die("rows", NULL);
    for (size_t i = 0; i < n; i++)
        sets[2].rows[i] = sets[1].rows[i] * 10.0f;
}

/* Mean over rows of (std of the logits, probability of the top token). */
static void describe(const logit_set *set, double *std, double *top)
{
    *std = *top = 0;
    for (int r = 0; r < ROWS; r++) {
        const float *x = set->rows + (size_t)r * set->vocab;
        double s = 0, s2 = 0, mx = -INFINITY, z = 0;
        for (int i = 0; i < set->vocab; i++) {
            s += x[i], s2 += (double)x[i] * x[i];
            mx = x[i] > mx ? x[i] : mx;
        }
        for (int i = 0; i < set->vocab; i++)
            z += exp(x[i] - mx);
        double mean = s / set->vocab;
        *std += sqrt(s2 / set->vocab - mean * mean) / ROWS;
        *top += 1.0 / z / ROWS;
    }
}

/* ---- the reference: llama2.c's sample() and straightforward additions ---- */

typedef struct prob_index {
    float prob;
    int index;
} prob_index;

static int cmp_prob(const void *a, const void *b)
{
    float x = ((const prob_index *)a)->prob, y = ((const prob_index *)b)->prob;
    return (x < y) - (x > y);
}

typedef struct ref_sampler {
    const config *c;
    int vocab;
    float *x;
    prob_index *pi;
    int32_t hist[WINDOW];
    int n_hist;
    uint64_t rng;
} ref_sampler;

static float ref_coin(ref_sampler *r)
{
    r->rng ^= r->rng >> 12, r->rng ^= r->rng << 25, r->rng ^= r->rng >> 27;
    return (float)((r->rng * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static void ref_penalize(ref_sampler *r)
{
    for (int k = 0; k < r->n_hist; k++) {
        int t = r->hist[k], seen = 0;
        for (int j = 0; j < k; j++)
            seen |= r->hist[j] == t;
        if (!seen)
            r->x[t] = r->x[t] > 0 ? r->x[t] / r->c->rep : r->x[t] * r->c->rep;
    }
}

static void ref_softmax(float *x, int n)
{
    float mx = x[0], sum = 0;
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++)
        sum += x[i] = expf(x[i] - mx);
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

/* Draw from pi[0, n) in proportion to prob (llama2.c's sample_topp tail). */
static int ref_draw(ref_sampler *r, int n)
{
    float mass = 0, cdf = 0;
    for (int i = 0; i < n; i++)
        mass += r->pi[i].prob;
    float u = ref_coin(r) * mass;
    for (int i = 0; i < n; i++) {
        cdf += r->pi[i].prob;
        if (u < cdf)
            return r->pi[i].index;
    }
    return r->pi[n - 1].index;
}

static int ref_sample(ref_sampler *r, const float *logits)
{
    const config *c = r->c;
    int v = r->vocab, n = 0;
    memcpy(r->x, logits, sizeof(float) * (size_t)v);
    if (c->rep != 1.0f)
        ref_penalize(r);
    if (c->temperature == 0.0f) {
        int best = 0;
        for (int i = 1; i < v; i++)
            best = r->x[i] > r->x[best] ? i : best;
        return best;
    }
    for (int i = 0; i < v; i++)
        r->x[i] /= c->temperature;
    ref_softmax(r->x, v);
    float cutoff = c->top_p < 1.0f ? (1.0f - c->top_p) / (float)(v - 1) : 0.0f;
    for (int i = 0; i < v; i++)
        if (r->x[i] >= cutoff)
            r->pi[n++] = (prob_index){r->x[i], i};
    if (c->top_k > 0 || c->top_p < 1.0f)
        qsort(r->pi, (size_t)n, sizeof *r->pi, cmp_prob);
    if (c->top_k > 0 && c->top_k < n)
        n = c->top_k;
    if (c->top_p < 1.0f) {
        float cum = 0;
        for (int i = 0; i < n; i++)
            if ((cum += r->pi[i].prob) > c->top_p) {
                n = i + 1;
                break;
            }
    }
    if (c->min_p > 0.0f) {
        int kept = 0;
        float floor_p = c->min_p * r->pi[0].prob;
        for (int i = 0; i < n; i++)
            if (r->pi[i].prob >= floor_p)
                r->pi[kept++] = r->pi[i];
        n = kept;
    }
    return ref_draw(r, n);
}

/* ---- timing ------------------------------------------------------------- */

/* ns per token of reps passes over the rows with a fresh sampler whose
 * prompt is the set's greedy tokens (the penalty window starts full). */
static double run_tokpipe_lp(const logit_set *set, const config *c, int top, int reps);

static double run_tokpipe(const logit_set *set, const config *c, int reps)
{
    return run_tokpipe_lp(set, c, -1, reps);
}

/* top < 0: logprobs off (what every job that does not ask pays); else
 * sample, then the raw logprob of the pick and the top `top` alternatives. */
static double run_tokpipe_lp(const logit_set *set, const config *c, int top, int reps)
{
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = c->temperature, p.top_k = c->top_k, p.top_p = c->top_p, p.min_p = c->min_p;
    p.repetition_penalty = c->rep, p.penalty_window = WINDOW, p.seed = 42;
    int32_t prompt[WINDOW];
    for (int i = 0; i < WINDOW; i++)
        prompt[i] = set->ids[i % ROWS];
    tp_sampler *s;
    tp_err e;
    if (tp_sampler_new(&p, set->vocab, prompt, WINDOW, &s, &e))
        die("tp_sampler_new", &e);
    double t0 = bench_now();
    for (int k = 0; k < reps; k++)
        for (int r = 0; r < ROWS; r++) {
            int32_t t;
            const float *row = set->rows + (size_t)r * set->vocab;
            if (tp_sampler_sample(s, row, &t, &e))
                die("tp_sampler_sample", &e);
            if (top >= 0) {
                tp_logprob alt[TP_SAMPLER_MAX_TOP_LOGPROBS];
                float lp;
                size_t n;
                if (tp_sampler_logprobs(s, row, TP_LOGPROBS_RAW, t, (size_t)top, &lp, alt, &n, &e))
                    die("tp_sampler_logprobs", &e);
            }
            if (tp_sampler_accept(s, t, &e))
                die("tp_sampler_accept", &e);
        }
    double ns = (bench_now() - t0) * 1e9 / ((double)reps * ROWS);
    tp_sampler_free(s);
    return ns;
}

static double run_reference(const logit_set *set, const config *c, int reps)
{
    ref_sampler r = {.c = c, .vocab = set->vocab, .rng = 42};
    r.x = malloc(sizeof(float) * (size_t)set->vocab);
    r.pi = malloc(sizeof(prob_index) * (size_t)set->vocab);
    if (!r.x || !r.pi)
        die("reference", NULL);
    for (int i = 0; i < WINDOW; i++)
        r.hist[i] = set->ids[i % ROWS];
    r.n_hist = WINDOW;
    double t0 = bench_now();
    volatile int sink = 0;
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < ROWS; i++) {
            int t = ref_sample(&r, set->rows + (size_t)i * set->vocab);
            memmove(r.hist, r.hist + 1, sizeof r.hist - sizeof r.hist[0]);
            r.hist[WINDOW - 1] = t;
            sink += t;
        }
    double ns = (bench_now() - t0) * 1e9 / ((double)reps * ROWS);
    free(r.x);
    free(r.pi);
    return ns;
}

/* What logprobs cost per token, against the same sampler with them off,
 * all measured alternating in this run: "off" twice shows the noise. */
static void bench_logprobs(const logit_set *set)
{
    static const int tops[] = {-1, 0, 5, 20, -1};
    static const char *const names[] = {"off", "on, top 0", "on, top 5", "on, top 20", "off again"};
    enum { NT = sizeof tops / sizeof *tops };
    for (int ci = 0; ci < 2; ci++) {
        const config *c = &CONFIGS[ci]; /* greedy, temperature 1 */
        double t[NT][SAMPLES];
        int reps[NT];
        for (int k = 0; k < NT; k++)
            reps[k] = (int)(SAMPLE_NS / (run_tokpipe_lp(set, c, tops[k], 1) * ROWS)) + 1;
        for (int s = 0; s < SAMPLES; s++)
            for (int k = 0; k < NT; k++)
                t[k][s] = run_tokpipe_lp(set, c, tops[k], reps[k]);
        double off = bench_median(t[0], SAMPLES);
        printf("  logprobs, %-12s %10s %12s\n", c->name, "ns/token", "vs off");
        for (int k = 0; k < NT; k++) {
            double m = k ? bench_median(t[k], SAMPLES) : off;
            printf("    %-20s %10.0f %+11.0f\n", names[k], m, m - off);
        }
    }
}

static void bench_set(const logit_set *set)
{
    double std, top;
    describe(set, &std, &top);
    printf("%s: vocab %d, logit std %.2f, top token p %.3f (means over %d rows)\n", set->name,
           set->vocab, std, top, ROWS);
    printf("  %-22s %12s %14s %8s\n", "", "tokpipe ns", "reference ns", "ratio");
    for (size_t i = 0; i < N_CONFIGS; i++) {
        const config *c = &CONFIGS[i];
        /* Each side repeats until a run lasts ~SAMPLE_NS, so a fast one is
         * not timed over a handful of calls (first-touch page faults). */
        int reps_ref = (int)(SAMPLE_NS / (run_reference(set, c, 1) * ROWS)) + 1;
        int reps_ours = (int)(SAMPLE_NS / (run_tokpipe(set, c, 1) * ROWS)) + 1;
        double ours[SAMPLES], ref[SAMPLES];
        for (int s = 0; s < SAMPLES; s++) {
            ref[s] = run_reference(set, c, reps_ref);
            ours[s] = run_tokpipe(set, c, reps_ours);
        }
        double o = bench_median(ours, SAMPLES), b = bench_median(ref, SAMPLES);
        printf("  %-22s %12.0f %14.0f %7.1fx\n", c->name, o, b, b / o);
    }
    bench_logprobs(set);
}

int main(void)
{
    logit_set sets[3];
    load_sets(sets);
    printf("bench_sample: ns per token (sample + accept), medians of %d; ratio = reference / tokpipe;"
           " sampler passes: %s\n",
           SAMPLES, __builtin_cpu_supports("avx512f") ? "AVX-512" : "scalar (no avx512f)");
    for (int i = 0; i < 3; i++)
        bench_set(&sets[i]);
    free(sets[0].rows);
    free(sets[1].rows);
    free(sets[2].rows);
    return 0;
}
