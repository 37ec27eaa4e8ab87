/* make bench: what structured output costs in throughput. Jobs generated in
 * this process with the stage libraries the workers use — one batched
 * forward step per token over every running sequence, then per sequence
 * the sample stage's work: the grammar mask (tp_gmatch_mask, cached per
 * state in the engine the jobs share), the masked row
 * (tp_grammar_apply_mask) and the sampler on it — against the same jobs
 * unconstrained, in the same run. JSON mode (tp_jschema_json_mode_gbnf),
 * temperature 1 with a seed per job, 32 concurrent jobs and 1 job, on
 * stories260K (vocabulary 512: a decode step of 16 sequences takes about a
 * millisecond, so the mask must cost a few microseconds) and on a random
 * stories260K-shaped model with Qwen3's 151,669-token vocabulary (every
 * masked row is 151k floats).
 *
 * Same lengths: every job samples exactly GEN tokens on both sides. The
 * unconstrained job ignores EOS; a constrained one whose document is
 * complete before GEN tokens (an accepted end of generation, or a closed
 * object that admits nothing more) starts the next document at once (its
 * matcher back at the start), as a client submitting the next JSON job
 * would, so both sides run the same steps with the same batch sizes.
 * Warm engines: one pass of each side runs first (a sample worker keeps
 * its engines; bench_grammar times cold masks). Figures are medians of
 * SAMPLES passes, the two sides alternating; times are the thread's CPU
 * time (everything runs on it; the machine is shared). Targets (issue 17): ratio >= 0.9 at 32 jobs, >= 0.95 at 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"
#include "tokpipe/model.h"
#include "tokpipe/sampler.h"
#include "tokpipe/synth.h"
#include "tokpipe/tokenizer.h"
#include "support/timing.h"

#define MAX_JOBS 32
#define PROMPT_MAX 16
#define GEN 96
#define SAMPLES 5

static void die(const char *what, const tp_err *e)
{
    fprintf(stderr, "bench_constrained: %s: %s\n", what, e ? e->msg : "failed");
    exit(1);
}

typedef struct bjob {
    int seq, n_fed, n_out;
    int32_t ids[PROMPT_MAX + GEN];
    tp_sampler *smp;
    tp_gmatch *gm;
    int docs;
} bjob;

typedef struct setup {
    const char *name;
    tp_model *model;
    tp_forward *fwd;
    int vocab;
    int32_t prompt[PROMPT_MAX];
    int n_prompt;
    tp_gcache *gc;
    char *gbnf;
    float *logits, *row;
    uint64_t *mask;
    tp_fwd_item *items;
    int *slot_of;
} setup;

/* One pass of n_jobs jobs; returns generated tokens per CPU second;
 * *g_us: CPU microseconds per token spent on the grammar (mask, masked
 * row, accept, next document). */
static double run(setup *S, int n_jobs, bool constrained, int *docs, double *g_us)
{
    double tg = 0;
    static bjob jobs[MAX_JOBS];
    tp_err e;
    double t0 = bench_cpu_now();
    for (int j = 0; j < n_jobs; j++) {
        bjob *J = &jobs[j];
        memset(J, 0, sizeof *J);
        if (tp_forward_seq_open(S->fwd, &J->seq, &e))
            die("seq_open", &e);
        memcpy(J->ids, S->prompt, (size_t)S->n_prompt * sizeof *J->ids);
        tp_sampler_params sp = tp_sampler_params_default();
        sp.temperature = 1.0f;
        sp.seed = 1000 + (uint64_t)j;
        if (tp_sampler_new(&sp, S->vocab, J->ids, (size_t)S->n_prompt, &J->smp, &e))
            die("sampler", &e);
        if (constrained && tp_gcache_matcher(S->gc, S->gbnf, strlen(S->gbnf), &J->gm, &e))
            die("grammar", &e);
    }
    int left = n_jobs;
    while (left) {
        int n = 0;
        for (int j = 0; j < n_jobs; j++) {
            bjob *J = &jobs[j];
            if (J->n_out == GEN)
                continue;
            int total = S->n_prompt + J->n_out;
            int nt = total - J->n_fed;
            S->items[n] = (tp_fwd_item){J->seq, J->n_fed, J->ids + J->n_fed, nt, false};
            S->slot_of[n++] = j;
            J->n_fed += nt;
        }
        if (tp_forward_step(S->fwd, S->items, n, S->logits, &e))
            die("forward", &e);
        for (int i = 0; i < n; i++) {
            bjob *J = &jobs[S->slot_of[i]];
            const float *l = S->logits + (size_t)i * (size_t)S->vocab;
            int32_t c;
            double a = bench_cpu_now();
            if (J->gm) {
                if (tp_gmatch_mask(J->gm, S->mask, &e))
                    die("mask", &e);
                tp_grammar_apply_mask(S->mask, l, S->row, S->vocab);
                l = S->row;
            }
            tg += bench_cpu_now() - a;
            if (tp_sampler_sample(J->smp, l, &c, &e) || tp_sampler_accept(J->smp, c, &e))
                die("sample", &e);
            a = bench_cpu_now();
            if (J->gm && tp_gmatch_accept(J->gm, c, &e))
                die("grammar accept", &e);
            J->ids[S->n_prompt + J->n_out++] = c;
            if (J->gm && tp_gmatch_done(J->gm)) {
                /* the document is whole: the next one starts */
                tp_gcache_release(S->gc, J->gm);
                J->gm = NULL;
                J->docs++;
                if (tp_gcache_matcher(S->gc, S->gbnf, strlen(S->gbnf), &J->gm, &e))
                    die("grammar", &e);
            }
            tg += bench_cpu_now() - a;
            if (J->n_out == GEN)
                left--;
        }
    }
    double dt = bench_cpu_now() - t0;
    *g_us = tg / ((double)n_jobs * GEN) * 1e6;
    *docs = 0;
    for (int j = 0; j < n_jobs; j++) {
        *docs += jobs[j].docs;
        tp_sampler_free(jobs[j].smp);
        tp_gcache_release(S->gc, jobs[j].gm);
        tp_forward_seq_close(S->fwd, jobs[j].seq);
    }
    return (double)n_jobs * GEN / dt;
}

static void bench_model(setup *S, const tp_tokenizer *tok)
{
    tp_err e;
    const int32_t *eog32;
    int n_eog = tp_tokenizer_eog_ids(tok, &eog32);
    int eog[16];
    for (int i = 0; i < n_eog && i < 16; i++)
        eog[i] = eog32[i];
    if (tp_gcache_new(tok, eog, n_eog < 16 ? n_eog : 16, NULL, NULL, 4, &S->gc, &e) ||
        tp_jschema_json_mode_gbnf(&S->gbnf, &e))
        die("grammar cache", &e);
    S->vocab = tp_model_get_config(S->model)->vocab_size;
    if (tp_forward_new(S->model, MAX_JOBS, PROMPT_MAX + GEN + 1, MAX_JOBS * PROMPT_MAX, &S->fwd, &e))
        die("forward", &e);
    S->logits = malloc((size_t)MAX_JOBS * (size_t)S->vocab * sizeof *S->logits);
    S->row = malloc((size_t)S->vocab * sizeof *S->row);
    S->mask = malloc(tp_gmask_words(S->vocab) * sizeof *S->mask);
    S->items = calloc(MAX_JOBS, sizeof *S->items);
    S->slot_of = calloc(MAX_JOBS, sizeof *S->slot_of);
    if (!S->logits || !S->row || !S->mask || !S->items || !S->slot_of)
        die("out of memory", NULL);
    static const int batch[] = {MAX_JOBS, 1};
    for (int b = 0; b < 2; b++) {
        int nj = batch[b], docs = 0;
        double fr[SAMPLES], co[SAMPLES], ratio[SAMPLES], gu[SAMPLES], g0;
        run(S, nj, false, &docs, &g0);   /* warm: forward buffers, the engine's masks */
        run(S, nj, true, &docs, &g0);
        for (int k = 0; k < SAMPLES; k++) {
            fr[k] = run(S, nj, false, &docs, &g0);
            co[k] = run(S, nj, true, &docs, &gu[k]);
            ratio[k] = co[k] / fr[k];
        }
        double f = bench_median(fr, SAMPLES), c = bench_median(co, SAMPLES), r = bench_median(ratio, SAMPLES);
        double g = bench_median(gu, SAMPLES);
        printf("  %2d jobs x %d tokens: unconstrained %.0f tok/s, JSON mode %.0f tok/s (%d documents completed "
               "in the last pass): ratio %.3f (target >= %.2f); the grammar's own work %.2f us per token = "
               "%.1f%% of an unconstrained token's %.0f us\n",
               nj, GEN, f, c, docs, r, nj > 1 ? 0.9 : 0.95, g, g * f / 1e4, 1e6 / f);
    }
    /* what a constrained job holds, and what its grammar's jobs share */
    tp_gmatch *m;
    if (tp_gcache_matcher(S->gc, S->gbnf, strlen(S->gbnf), &m, &e))
        die("grammar", &e);
    printf("  memory: per constrained job %zu bytes (its matcher; the stage's one mask and masked row are shared: "
           "%zu + %zu bytes); JSON mode engine (DFA + masks, shared) %.2f MB\n",
           tp_gmatch_memory(m), tp_gmask_words(S->vocab) * 8, (size_t)S->vocab * sizeof(float),
           tp_gengine_memory(tp_gmatch_engine(m)) / 1e6);
    tp_gcache_release(S->gc, m);
    tp_forward_free(S->fwd);
    tp_gcache_free(S->gc);
    free(S->gbnf), free(S->logits), free(S->row), free(S->mask), free(S->items), free(S->slot_of);
}

static void prompt_of(setup *S, const tp_tokenizer *tok, const char *text)
{
    int ids[64];
    size_t n;
    tp_err e;
    if (tp_tokenizer_encode(tok, text, strlen(text), false, ids, 64, &n, &e))
        die("encode", &e);
    S->n_prompt = n < PROMPT_MAX ? (int)n : PROMPT_MAX;
    for (int i = 0; i < S->n_prompt; i++)
        S->prompt[i] = ids[i];
}

int main(int argc, char **argv)
{
    /* an argument runs one model only ("stories260K" or "qwen3"), e.g. under a profiler */
    const char *only = argc > 1 ? argv[1] : "";
    const char *models = getenv("TP_MODELS") ? getenv("TP_MODELS") : "../shared/models";
    char path[4096], tpath[4096];
    tp_err e;
    printf("structured output throughput: in process, forward + mask + sampler, 1 thread, CPU time\n");
    /* stories260K with its tokenizer */
    if (!*only || !strcmp(only, "stories260K")) {
        setup S = {.name = "stories260K"};
        tp_tokenizer *tok;
        snprintf(path, sizeof path, "%s/stories260K.bin", models);
        snprintf(tpath, sizeof tpath, "%s/tok512.bin", models);
        if (tp_model_load(path, &S.model, &e) || tp_tokenizer_open(tpath, 512, &tok, &e)) {
            printf("stories260K: skipped (%s)\n", e.msg);
        } else {
            printf("stories260K (vocabulary 512):\n");
            prompt_of(&S, tok, "Once upon a time, the answer was");
            bench_model(&S, tok);
            tp_tokenizer_free(tok);
            tp_model_free(S.model);
        }
    }
    /* a random stories260K-shaped qwen2 model with Qwen3's vocabulary */
    if (!*only || !strcmp(only, "qwen3")) {
        setup S = {.name = "qwen3-vocab"};
        char vocab[4096], dir[] = "/tmp/tp_bench_constrained.XXXXXX";
        snprintf(vocab, sizeof vocab, "%s/hf-vocab/qwen3-vocab.gguf", models);
        tp_synth_shape sh;
        tp_synth_gguf o = {.arch = "qwen2", .vocab_from = vocab};
        if (access(vocab, R_OK) || !mkdtemp(dir)) {
            printf("qwen3 vocabulary: skipped (no %s)\n", vocab);
            return 0;
        }
        snprintf(path, sizeof path, "%s/q.gguf", dir);
        tp_tokenizer *tok;
        if (tp_synth_parse_shape("stories260K", &sh, &e) || tp_synth_write_gguf(path, &sh, 3, &o, &e) ||
            tp_model_load(path, &S.model, &e) || tp_tokenizer_open(path, 0, &tok, &e))
            die("random qwen3-vocabulary model", &e);
        unlink(path);
        rmdir(dir);
        printf("random stories260K-shaped model, Qwen3 vocabulary (151,669):\n");
        prompt_of(&S, tok, "Hi, here is the JSON:");
        bench_model(&S, tok);
        tp_tokenizer_free(tok);
        tp_model_free(S.model);
    }
    return 0;
}
