/* make bench: speculative decoding's two figures, as ratios measured in
 * this run.
 *
 * 1. The cost of one verify step of k+1 positions against one decode step,
 *    batch 1, on memory-bound shapes (random f32 stories42M / stories110M:
 *    weight bytes per token decide a decode step). Paired: the two steps
 *    take turns at the same position (rolled back after each), median of
 *    the per-sample ratios. Printed for k+1 = 2..9; the target is k+1 = 5
 *    <= 1.25.
 * 2. Prompt lookup end to end on a "rewrite this text" workload: the
 *    prompt holds a text and its opening again, to be continued
 *    (stories260K, the one trained model here, retells it only loosely:
 *    the figure is as good as the model copies), greedy, 200 tokens, with
 *    speculation on and off taking turns; the tokens must be equal. stories260K is far too small to be
 *    memory-bound (its weights live in L2, a verify step costs about k+1
 *    decode steps), so its wall-clock ratio is printed as measured and,
 *    beside it, the speedup the same verify steps give on the memory-bound
 *    shape: plain steps / sum over verify steps of part 1's cost ratio for
 *    that step's size.
 * 3. The cost where nothing is accepted: sampling at temperature 1 on the
 *    random memory-bound shape with a guesser that proposes whenever the
 *    controller asks and is always wrong, speculation on against off,
 *    paired; the target is <= 3%.
 *    And greedy on the same shape, whose random weights fall into a loop:
 *    the wall-clock speedup where most guesses are taken.
 * 4. A draft model (mode draft): on the memory-bound shape with a random
 *    draft of about 1/8 its size and the same vocabulary
 *    (TP_BENCH_DRAFT_SHAPE, default stories15M: 1/7.3 of stories110M's
 *    weights), the measured cost of a draft step against a target decode
 *    step, and from part 1's verify costs the speedup a draft of this cost
 *    gives at acceptance 0.5, 0.7 and 0.9 (per guess, independent: a verify
 *    step of k guesses yields (1 - a^(k+1)) / (1 - a) tokens and costs k
 *    draft steps and one verify step of k + 1; the best k); the time with
 *    nothing accepted (the random draft guessing for sampling at
 *    temperature 1, its guesses always wrong) against off, paired (target
 *    >= 0.97x of off's speed); and acceptance measured on the one trained
 *    model, stories260K, drafting for itself (its greedy guesses are its
 *    own choices; sampled ones are not) and drafted for by a random model
 *    of its vocabulary.
 *
 * Environment: TP_BENCH_SHAPES (default stories42M,stories110M),
 * TP_BENCH_THREADS (default: the forward's default), TP_MODELS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokpipe/draft.h"
#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/sampler.h"
#include "tokpipe/spec.h"
#include "tokpipe/synth.h"
#include "support/timing.h"

#define SAMPLES 7
#define REPS 8          /* steps per sample and kind */
#define PROMPT 64
#define MAX_POS 320
#define MAX_K1 9        /* verify sizes 2..MAX_K1 */
#define GEN 200
#define TEXT 150

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_spec: %s: %s\n", what, why);
    exit(1);
}

static int threads(void)
{
    const char *t = getenv("TP_BENCH_THREADS");
    return t && atoi(t) > 0 ? atoi(t) : tp_forward_default_threads();
}

/* ---- 1. the verify step's cost ------------------------------------------- */

/* Seconds of REPS steps of n tokens at pos (rolled back after each). */
static double steps(tp_forward *f, int sid, int pos, int n, int vocab, float *rows)
{
    int toks[MAX_K1];
    for (int i = 0; i < n; i++)
        toks[i] = 3 + (i * 7919 + pos) % (vocab - 3);
    tp_err e;
    tp_fwd_item it = {sid, pos, toks, n, false};
    float *all[1] = {rows};
    double t0 = bench_now();
    for (int r = 0; r < REPS; r++) {
        if (tp_forward_step_verify(f, &it, 1, rows, n > 1 ? all : NULL, &e))
            die("step", e.msg);
        tp_forward_seq_truncate(f, sid, pos);
    }
    return bench_now() - t0;
}

typedef struct gen_run {
    int32_t out[GEN];
    int steps;               /* forward steps */
    int sizes[MAX_K1 + 1];   /* verify steps by positions (1: plain) */
    int drafted, accepted;   /* guesses verified, taken */
    double secs;
} gen_run;

static void generate(tp_forward *f, int vocab, const int32_t *prompt, int n, int n_max, float temp, bool wrong,
                     tp_forward *draft, gen_run *g);

/* 3: on the shape's forward, sampling with speculation on (guesses always
 * wrong) and off; 4: a draft model's figures there. */
static void nothing_accepted(tp_forward *f, int vocab, const char *shape);
static void draft_model(tp_forward *f, int vocab, const char *shape, const double *cost);

/* A random model of shape (vocab > 0: that vocabulary size, seed: its
 * weights) and a forward of one sequence over it. */
static tp_model *synth_forward(const char *shape, int vocab, int seed, tp_forward **f)
{
    tp_synth_shape sh;
    tp_err e;
    if (tp_synth_parse_shape(shape, &sh, &e))
        die(shape, e.msg);
    sh.seq_len = MAX_POS;
    if (vocab > 0)
        sh.vocab_size = vocab;
    char path[] = "/tmp/tp-bench-spec-XXXXXX";
    int fd = mkstemp(path);
    FILE *fp = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!fp || tp_synth_write_model(fp, &sh, (uint64_t)seed, NULL, NULL, &e) || fclose(fp))
        die("write model", e.msg);
    tp_model *m;
    if (tp_model_load(path, &m, &e) || tp_forward_new(m, 1, MAX_POS, PROMPT, f, &e) ||
        tp_forward_set_threads(*f, threads(), &e))
        die(path, e.msg);
    remove(path);
    return m;
}

/* cost[n] for n = 2..MAX_K1: a verify step of n positions / a decode step. */
static void verify_cost(const char *shape, double *cost, bool last)
{
    tp_forward *f;
    tp_model *m = synth_forward(shape, 0, 1, &f);
    tp_err e;
    int vocab = tp_model_get_config(m)->vocab_size, sid, toks[PROMPT];
    float *rows = malloc(sizeof *rows * MAX_K1 * (size_t)vocab);
    if (!rows)
        die("rows", "out of memory");
    for (int i = 0; i < PROMPT; i++)
        toks[i] = 3 + (i * 31) % (vocab - 3);
    tp_fwd_item it = {0, 0, toks, PROMPT, true};
    if (tp_forward_seq_open(f, &sid, &e) || (it.seq_id = sid, tp_forward_step(f, &it, 1, NULL, &e)))
        die("prompt", e.msg);
    steps(f, sid, PROMPT, 1, vocab, rows); /* warm */
    steps(f, sid, PROMPT, MAX_K1, vocab, rows);
    for (int n = 2; n <= MAX_K1; n++) {
        double r[SAMPLES];
        for (int s = 0; s < SAMPLES; s++) {
            double one = steps(f, sid, PROMPT, 1, vocab, rows);
            double ver = steps(f, sid, PROMPT, n, vocab, rows);
            one = (one + steps(f, sid, PROMPT, 1, vocab, rows)) / 2;
            r[s] = ver / one;
        }
        cost[n] = bench_median(r, SAMPLES);
    }
    printf("  %-12s %d threads: verify step / decode step, batch 1:", shape, threads());
    for (int n = 2; n <= MAX_K1; n++)
        printf(" %d:%.2f", n, cost[n]);
    printf("   (k+1 = 5: %.2f, target <= 1.25)\n", cost[5]);
    tp_forward_seq_close(f, sid);
    if (last) {
        nothing_accepted(f, vocab, shape);
        draft_model(f, vocab, shape, cost);
    }
    free(rows);
    tp_forward_free(f);
    tp_model_free(m);
}

/* ---- 2. prompt lookup on a rewrite workload ------------------------------ */


/* Generation of GEN tokens after ids[0, n) (temperature temp, seed 7), with prompt lookup of
 * at most n_max guesses (0: off), or draft's guesses (a tp_forward of a
 * draft model, its sequence 0 free); the same loop as tokpipe run's. */
static void generate(tp_forward *f, int vocab, const int32_t *prompt, int n, int n_max, float temp, bool wrong,
                     tp_forward *draft, gen_run *g)
{
    tp_err e;
    int32_t *ids = malloc(sizeof *ids * (size_t)(n + GEN + MAX_K1));
    float *rows = malloc(sizeof *rows * MAX_K1 * (size_t)vocab);
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = temp;
    p.seed = 7;
    tp_sampler *s;
    int sid;
    if (!ids || !rows || tp_sampler_new(&p, vocab, prompt, (size_t)n, &s, &e) || tp_forward_seq_open(f, &sid, &e))
        die("generate", "setup failed");
    memcpy(ids, prompt, sizeof *ids * (size_t)n);
    memset(g, 0, sizeof *g);
    tp_spec sp;
    tp_spec_init(&sp, n_max);
    size_t len = (size_t)n, fed = 0, dfed = 0;
    int dsid = -1;
    if (draft && tp_forward_seq_open(draft, &dsid, &e))
        die("draft", e.msg);
    int made = 0;
    double t0 = bench_now();
    while (made < GEN) {
        int32_t toks[MAX_K1];
        int k = 0;
        if (fed == len - 1) {
            int want = tp_spec_want(&sp, 1, GEN - made - 1 < MAX_K1 - 1 ? GEN - made - 1 : MAX_K1 - 1);
            k = want && !draft ? (int)tp_ngram_guess(ids, len, (size_t)want, toks + 1) : 0;
            if (want && draft) {   /* the draft model, fed what it does not hold yet */
                tp_draft_item di = {dsid, (int)dfed, ids + dfed, (int)(len - dfed), want};
                if (tp_draft_propose(draft, &di, 1, toks + 1, &k, &e))
                    die("draft", e.msg);
                dfed = len;
            }
            for (int i = 0; wrong && i < want; i++, k = want)   /* a guesser that is always wrong */
                toks[1 + i] = (ids[len - 1] + 1 + i) % vocab;
        }
        tp_fwd_item it;
        float *all[1] = {rows};
        if (k) {
            toks[0] = ids[len - 1];
            it = (tp_fwd_item){sid, (int)fed, (const int *)toks, k + 1, false};
        } else {
            it = (tp_fwd_item){sid, (int)fed, (const int *)(ids + fed), (int)(len - fed), false};
        }
        if (tp_forward_step_verify(f, &it, 1, rows, k ? all : NULL, &e))
            die("step", e.msg);
        g->steps++;
        g->sizes[k + 1]++;
        fed = (size_t)it.pos + (k ? 1 : (size_t)it.n_tokens);
        int taken = 0;
        for (int i = 0; i <= k && made < GEN; i++) {
            int32_t c;
            if (tp_sampler_sample(s, rows + (size_t)i * vocab, &c, &e) || tp_sampler_accept(s, c, &e))
                die("sample", e.msg);
            ids[len++] = g->out[made++] = c;
            if (i == k || c != toks[1 + i])
                break;
            taken++;
            fed++;
        }
        if (k) {
            tp_spec_result(&sp, k, taken);
            tp_forward_seq_truncate(f, sid, (int)fed);
            dfed += (size_t)(taken < k - 1 ? taken : k - 1);   /* its guesses the target took */
        }
    }
    g->secs = bench_now() - t0;
    g->drafted = (int)sp.drafted;
    g->accepted = (int)sp.accepted;
    if (draft)
        tp_forward_seq_close(draft, dsid);
    tp_forward_seq_close(f, sid);
    tp_sampler_free(s);
    free(ids);
    free(rows);
}

/* SAMPLES paired runs of GEN tokens after prompt[0, n), speculation off
 * and on (n_max; wrong, draft as generate's), whose tokens must be equal:
 * the median of off's time / on's (the speedup); *on and *off the last. */
static double paired(tp_forward *f, int vocab, const int32_t *prompt, int n, int n_max, float temp, bool wrong,
                     tp_forward *draft, gen_run *on, gen_run *off, const char *what)
{
    double r[SAMPLES];
    for (int s = 0; s < SAMPLES; s++) {
        generate(f, vocab, prompt, n, 0, temp, false, NULL, off);
        generate(f, vocab, prompt, n, n_max, temp, wrong, draft, on);
        if (memcmp(on->out, off->out, sizeof on->out))
            die(what, "speculation changed the tokens");
        r[s] = off->secs / on->secs;
    }
    return bench_median(r, SAMPLES);   /* (odd SAMPLES: 1 / it is the median of on / off) */
}

static void nothing_accepted(tp_forward *f, int vocab, const char *shape)
{
    /* sampling at temperature 1 from random weights (nearly uniform over
     * the vocabulary), and a guesser that proposes whenever the controller
     * asks, always wrong: the worst case the controller's pauses bound */
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = 3 + (i % 8 * 7919) % (vocab - 3);
    gen_run on, off;
    generate(f, vocab, prompt, PROMPT, 0, 1.0f, false, NULL, &off); /* warm */
    double none = 1 / paired(f, vocab, prompt, PROMPT, TP_SPEC_DEFAULT_N_MAX, 1.0f, true, NULL, &on, &off,
                             "nothing accepted");
    int verify = 0;
    for (int n = 2; n <= MAX_K1; n++)
        verify += on.sizes[n];
    int taken = GEN - on.steps;
    printf("  %-12s nothing accepted (random weights, temperature 1, wrong guesses, %d tokens): %d verify steps, "
           "%d guesses taken; time with / without speculation %.3f (target <= 1.03)\n",
           shape, GEN, verify, taken, none);
    /* and greedy: random weights fall into a loop, whose repeats prompt
     * lookup proposes; wall-clock speedup on the memory-bound shape */
    double loop = paired(f, vocab, prompt, PROMPT, TP_SPEC_DEFAULT_N_MAX, 0, false, NULL, &on, &off, "greedy loop");
    printf("  %-12s repetitive output (random weights, greedy: it loops, %d tokens): %d steps with prompt lookup vs "
           "%d without, speedup %.2fx\n", shape, GEN, on.steps, off.steps, loop);
}

/* ---- 4. a draft model ---------------------------------------------------- */

static double pow_k(double a, int k)
{
    double p = 1;
    while (k-- > 0)
        p *= a;
    return p;
}

/* Acceptance of stories260K's guesses for itself and of a random draft of
 * its vocabulary: greedy and sampled, GEN tokens after an opening. */
static void draft_acceptance(void)
{
    const char *dir = getenv("TP_MODELS");
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K.bin", dir ? dir : "../shared/models");
    tp_model *m, *dm;
    tp_forward *f, *self, *rnd;
    tp_err e;
    if (tp_model_load(path, &m, &e) || tp_forward_new(m, 1, 0, 512, &f, &e) || tp_forward_new(m, 1, 0, 512, &self, &e))
        die(path, e.msg);
    dm = synth_forward("32x2", 512, 7, &rnd);
    int vocab = tp_model_get_config(m)->vocab_size;
    const int32_t opening[] = {1, 365, 1211 % 512, 304, 403, 407, 261, 378};
    tp_forward *drafts[2] = {self, rnd};
    const char *names[2] = {"stories260K drafting for itself", "a random 32x2 draft of its vocabulary"};
    for (int d = 0; d < 2; d++) {
        gen_run on, off;
        printf("  draft acceptance on stories260K, %s:", names[d]);
        for (int t = 0; t < 2; t++) {
            float temp = t ? 0.8f : 0;
            generate(f, vocab, opening, 8, 0, temp, false, NULL, &off);
            generate(f, vocab, opening, 8, TP_SPEC_DEFAULT_N_MAX, temp, false, drafts[d], &on);
            if (memcmp(on.out, off.out, sizeof on.out))
                die("draft acceptance", "speculation changed the tokens");
            printf(" %s %d of %d guesses taken (%.2f), %.2f tokens per step;", t ? "temperature 0.8" : "greedy",
                   on.accepted, on.drafted, on.drafted ? (double)on.accepted / on.drafted : 0.0,
                   (double)GEN / on.steps);
        }
        printf("\n");
    }
    tp_forward_free(rnd);
    tp_model_free(dm);
    tp_forward_free(self);
    tp_forward_free(f);
    tp_model_free(m);
}

static void draft_model(tp_forward *f, int vocab, const char *shape, const double *cost)
{
    const char *dshape = getenv("TP_BENCH_DRAFT_SHAPE");
    dshape = dshape ? dshape : "stories15M";
    tp_forward *d;
    tp_model *dm = synth_forward(dshape, vocab, 2, &d);
    size_t tw = 0, dw = 0;   /* (weights: what a memory-bound step reads) */
    const tp_model_config *tc = tp_model_get_config(tp_forward_model(f)), *dc = tp_model_get_config(dm);
    tw = (size_t)tc->n_layers * (size_t)tc->dim * (size_t)(4 * tc->dim + 3 * tc->hidden_dim) + (size_t)tc->vocab_size * tc->dim;
    dw = (size_t)dc->n_layers * (size_t)dc->dim * (size_t)(4 * dc->dim + 3 * dc->hidden_dim) + (size_t)dc->vocab_size * dc->dim;
    /* the cost of a draft step: one token on the draft, paired with one on
     * the target, both at position PROMPT of a prompt */
    int toks[PROMPT], ts, ds;
    tp_err e;
    float *rows = malloc(sizeof *rows * MAX_K1 * (size_t)vocab);
    for (int i = 0; i < PROMPT; i++)
        toks[i] = 3 + (i * 31) % (vocab - 3);
    tp_fwd_item it = {0, 0, toks, PROMPT, true};
    if (!rows || tp_forward_seq_open(f, &ts, &e) || tp_forward_seq_open(d, &ds, &e) ||
        (it.seq_id = ts, tp_forward_step(f, &it, 1, NULL, &e)) || (it.seq_id = ds, tp_forward_step(d, &it, 1, NULL, &e)))
        die("draft", e.msg);
    double r[SAMPLES];
    steps(d, ds, PROMPT, 1, vocab, rows); /* warm */
    for (int s = 0; s < SAMPLES; s++) {
        double one = steps(f, ts, PROMPT, 1, vocab, rows), dr = steps(d, ds, PROMPT, 1, vocab, rows);
        one = (one + steps(f, ts, PROMPT, 1, vocab, rows)) / 2;
        r[s] = dr / one;
    }
    tp_forward_seq_close(f, ts);
    tp_forward_seq_close(d, ds);
    double cd = bench_median(r, SAMPLES);
    printf("  %-12s draft %s (%.2f of its weights, same vocabulary): draft step / decode step %.3f\n", shape, dshape,
           (double)dw / (double)tw, cd);
    /* the speedup at acceptance a: tokens per verify step over its cost
     * in decode steps (k draft steps, one verify step of k + 1), best k */
    printf("    speedup it would give (from these costs), acceptance per guess:");
    for (int i = 0; i < 3; i++) {
        double a = (double[]){0.5, 0.7, 0.9}[i], best = 0;
        int bk = 0;
        for (int k = 1; k + 1 <= MAX_K1; k++) {
            double tokens = (1 - pow_k(a, k + 1)) / (1 - a), sp = tokens / (k * cd + cost[k + 1]);
            if (sp > best)
                best = sp, bk = k;
        }
        printf(" %.1f: %.2fx (k = %d);", a, best, bk);
    }
    printf("\n");
    /* nothing accepted: the random draft's guesses for sampling at
     * temperature 1 are always wrong; on against off, paired */
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = 3 + (i % 8 * 7919) % (vocab - 3);
    gen_run on, off;
    double speed = paired(f, vocab, prompt, PROMPT, TP_SPEC_DEFAULT_N_MAX, 1.0f, false, d, &on, &off,
                          "draft, nothing accepted");
    printf("    nothing accepted (random draft, temperature 1, %d tokens): %d guesses, %d taken; speed with / without "
           "the draft %.3fx (target >= 0.97)\n", GEN, on.drafted, on.accepted, speed);
    free(rows);
    tp_forward_free(d);
    tp_model_free(dm);
}

static void rewrite(const double *cost)
{
    const char *dir = getenv("TP_MODELS");
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K.bin", dir ? dir : "../shared/models");
    tp_model *m;
    tp_forward *f;
    tp_err e;
    if (tp_model_load(path, &m, &e) || tp_forward_new(m, 1, 0, 512, &f, &e))
        die(path, e.msg);
    int vocab = tp_model_get_config(m)->vocab_size;
    /* the text: the model's own story after an opening; the workload: the
     * text, then the opening again, to be continued (retold) */
    const int32_t opening[] = {1, 365, 1211 % 512, 304, 403, 407, 261, 378};
    int no = (int)(sizeof opening / sizeof *opening);
    gen_run text, on, off;
    generate(f, vocab, opening, no, 0, 0, false, NULL, &text);
    int32_t prompt[TEXT + 2 * 8];
    memcpy(prompt, opening, sizeof opening);
    memcpy(prompt + no, text.out, sizeof *prompt * TEXT);
    memcpy(prompt + no + TEXT, opening + 1, sizeof *prompt * (size_t)(no - 1));
    int np = no + TEXT + no - 1;
    double measured = paired(f, vocab, prompt, np, TP_SPEC_DEFAULT_N_MAX, 0, false, NULL, &on, &off, "rewrite"),
           projected = 0;
    for (int n = 1; n <= MAX_K1; n++)
        projected += on.sizes[n] * (n == 1 ? 1.0 : cost[n]);
    int accepted = GEN - on.steps;
    printf("  rewrite workload (stories260K, greedy, %d tokens): %d steps with prompt lookup vs %d without "
           "(%.2f tokens per step, %d guesses taken)\n",
           GEN, on.steps, off.steps, (double)GEN / on.steps, accepted);
    printf("    end-to-end speedup, measured on stories260K (compute-bound, not the target's shape): %.2fx\n",
           measured);
    printf("    the same steps on the memory-bound shape (part 1's costs): %.2fx (target >= 1.8)\n",
           off.steps / projected);
    tp_forward_free(f);
    tp_model_free(m);
}

int main(void)
{
    const char *shapes = getenv("TP_BENCH_SHAPES");
    char list[256];
    snprintf(list, sizeof list, "%s", shapes ? shapes : "stories42M,stories110M");
    double cost[MAX_K1 + 1] = {0};
    char *save, *next, *sh = strtok_r(list, ",", &save);
    for (; sh; sh = next) {
        next = strtok_r(NULL, ",", &save);
        verify_cost(sh, cost, next == NULL); /* the last shape's costs project part 2 */
    }
    rewrite(cost);
    draft_acceptance();
    return 0;
}
