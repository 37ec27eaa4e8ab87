/* make bench: N concurrent jobs through the daemon (tokpiped + one worker
 * process per stage, and the fused forward+sample deployment) against the
 * same jobs generated in this process with the same stage libraries, on a
 * random stories15M-shaped model (`tokpipe mkmodel`). Reports aggregate
 * tokens/s, time to first token and inter-token latency (p50, p99) and the
 * pipeline / in-process throughput ratio (target >= 0.85 at 32 jobs).
 *
 * Both sides run the same jobs: the same prompt ids, greedy, ignore_eos,
 * max_tokens, with per-step token budget and prefill chunk equal to the
 * daemon's config. The in-process baseline runs in the same minute,
 * alternating with the pipeline samples; each figure is a median. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tokpipe/detok.h"
#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/sampler.h"
#include "tokpipe/stop.h"
#include "tokpipe/tokenizer.h"
#include "tokpipe/zwire.h"
#include "support/bdaemon.h"
#include "support/rand.h"
#include "support/timing.h"

#define PROMPT_LEN 16
#define MAX_TOKENS 64
#define BUDGET 512      /* = batching.max_batch_tokens */
#define CHUNK 128       /* = batching.prefill_chunk */
#define SAMPLES 3
#define MAX_JOBS 64

typedef struct run_stats {
    double tok_s;
    double ttft_p50, ttft_p99, itl_p50, itl_p99;   /* ms */
} run_stats;

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

/* token arrival times per job -> stats */
static run_stats summarize(double t0, double t_end, double (*times)[MAX_TOKENS], const int *n_tok, int n_jobs)
{
    static double ttft[MAX_JOBS], itl[MAX_JOBS * MAX_TOKENS];
    size_t ni = 0;
    long total = 0;
    for (int j = 0; j < n_jobs; j++) {
        ttft[j] = (times[j][0] - t0) * 1e3;
        for (int k = 1; k < n_tok[j]; k++)
            itl[ni++] = (times[j][k] - times[j][k - 1]) * 1e3;
        total += n_tok[j];
    }
    run_stats s = {.tok_s = (double)total / (t_end - t0)};
    s.ttft_p50 = pct(ttft, (size_t)n_jobs, 0.5);
    s.ttft_p99 = pct(ttft, (size_t)n_jobs, 0.99);
    s.itl_p50 = pct(itl, ni, 0.5);
    s.itl_p99 = pct(itl, ni, 0.99);
    return s;
}

static int32_t prompts[MAX_JOBS][PROMPT_LEN];

/* ---- in-process: the same stage libraries in one loop -------------------- */

typedef struct ijob {
    int seq, n_fed, n_out;
    int32_t ids[PROMPT_LEN + MAX_TOKENS];
    tp_sampler *smp;
    tp_detok *dt;
    tp_stop *stop;
    bool done;
} ijob;

static int in_process(const tp_model *m, const tp_tokenizer *tok, int n_jobs, run_stats *out)
{
    tp_err e;
    tp_forward *f;
    int vocab = tp_model_get_config(m)->vocab_size;
    if (tp_forward_new(m, n_jobs, PROMPT_LEN + MAX_TOKENS, BUDGET, &f, &e)) {
        fprintf(stderr, "bench: %s\n", e.msg);
        return -1;
    }
    static ijob jobs[MAX_JOBS];
    static double times[MAX_JOBS][MAX_TOKENS];
    static int n_tok[MAX_JOBS];
    float *logits = malloc((size_t)n_jobs * (size_t)vocab * sizeof *logits);
    tp_fwd_item *items = calloc((size_t)n_jobs, sizeof *items);
    int *slot_of = calloc((size_t)n_jobs, sizeof *slot_of);
    double t0 = bench_now();
    for (int j = 0; j < n_jobs; j++) {
        ijob *J = &jobs[j];
        memset(J, 0, sizeof *J);
        tp_forward_seq_open(f, &J->seq, &e);
        memcpy(J->ids, prompts[j], sizeof prompts[j]);
        tp_sampler_params sp = tp_sampler_params_default();
        sp.temperature = 0;
        tp_sampler_new(&sp, vocab, J->ids, PROMPT_LEN, &J->smp, &e);
        tp_detok_new(tok, J->ids[PROMPT_LEN - 1], &J->dt, &e);
        tp_stop_config sc = {.max_tokens = MAX_TOKENS, .ignore_eos = true, .vocab_size = vocab};
        tp_stop_new(&sc, &J->stop, &e);
        n_tok[j] = 0;
    }
    int left = n_jobs;
    while (left) {
        int n = 0, budget = BUDGET;
        for (int j = 0; j < n_jobs && budget > 0; j++) {
            ijob *J = &jobs[j];
            if (J->done)
                continue;
            int total = PROMPT_LEN + J->n_out;
            int nt = J->n_fed < PROMPT_LEN ? PROMPT_LEN - J->n_fed : total - J->n_fed;
            if (nt > CHUNK)
                nt = CHUNK;
            if (nt > budget)
                nt = budget;
            items[n] = (tp_fwd_item){J->seq, J->n_fed, J->ids + J->n_fed, nt, J->n_fed + nt < total};
            slot_of[n++] = j;
            J->n_fed += nt;
            budget -= nt;
        }
        if (tp_forward_step(f, items, n, logits, &e)) {
            fprintf(stderr, "bench: %s\n", e.msg);
            return -1;
        }
        double t = bench_now();
        for (int i = 0; i < n; i++) {
            if (items[i].skip_logits)
                continue;
            ijob *J = &jobs[slot_of[i]];
            int32_t c;
            tp_sampler_sample(J->smp, logits + (size_t)i * (size_t)vocab, &c, &e);
            size_t nb;
            const uint8_t *b = tp_detok_bytes(J->dt, c, &nb, &e);
            tp_stop_step st;
            tp_stop_feed(J->stop, c, b, nb, &st);
            if (st.accepted) {
                tp_sampler_accept(J->smp, c, &e);
                tp_detok_accept(J->dt, c, &e);
                J->ids[PROMPT_LEN + J->n_out++] = c;
                times[slot_of[i]][n_tok[slot_of[i]]++] = t;
            }
            if (st.finish != TP_FINISH_NONE) {
                J->done = true;
                left--;
            }
        }
    }
    *out = summarize(t0, bench_now(), times, n_tok, n_jobs);
    for (int j = 0; j < n_jobs; j++) {
        tp_sampler_free(jobs[j].smp);
        tp_detok_free(jobs[j].dt);
        tp_stop_free(jobs[j].stop);
    }
    tp_forward_free(f);
    free(logits);
    free(items);
    free(slot_of);
    return 0;
}

/* ---- through the daemon ------------------------------------------------------ */

typedef struct arrivals {
    double (*times)[MAX_TOKENS];
    int *n_tok;
} arrivals;

static void on_event(void *ctx, int j, const tp_msg *ev, double t)
{
    arrivals *a = ctx;
    if (ev->cmd == TP_CMD_TOKEN && a->n_tok[j] < MAX_TOKENS)
        a->times[j][a->n_tok[j]++] = t;
}

static int pipeline(bench_daemon *d, int n_jobs, const char *prefix, run_stats *out)
{
    static double times[MAX_JOBS][MAX_TOKENS];
    static int n_tok[MAX_JOBS];
    memset(n_tok, 0, sizeof n_tok);
    double t0 = bench_now();
    for (int j = 0; j < n_jobs; j++)
        if (bench_daemon_submit(d, prefix, j, prompts[j], PROMPT_LEN, MAX_TOKENS))
            return -1;
    arrivals a = {times, n_tok};
    if (bench_daemon_events(d, prefix, n_jobs, 20000, on_event, &a))
        return -1;
    *out = summarize(t0, bench_now(), times, n_tok, n_jobs);
    return 0;
}

/* ---- main ------------------------------------------------------------------------ */

static int med_cmp(const void *a, const void *b)
{
    return bench_cmp_double(&((const run_stats *)a)->tok_s, &((const run_stats *)b)->tok_s);
}

static void print_row(const char *what, int n, const run_stats *s, double base)
{
    printf("  %-26s jobs %2d  %8.0f tok/s  TTFT p50 %7.2f p99 %7.2f ms  ITL p50 %6.2f p99 %6.2f ms", what, n,
           s->tok_s, s->ttft_p50, s->ttft_p99, s->itl_p50, s->itl_p99);
    if (base > 0)
        printf("  ratio %.2f", s->tok_s / base);
    printf("\n");
}

int main(void)
{
    const char *bin = getenv("BIN") ? getenv("BIN") : "bin";
    char dir[] = "/tmp/tpbench-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s/tokpipe mkmodel --shape stories15M --seed 1 --out %s/m.bin --tokenizer-out %s/tok.bin --quiet", bin,
             dir, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_pipeline: mkmodel failed\n");
        return 1;
    }
    tp_err e;
    char mpath[256], tpath[256];
    snprintf(mpath, sizeof mpath, "%s/m.bin", dir);
    snprintf(tpath, sizeof tpath, "%s/tok.bin", dir);
    tp_model *m;
    tp_tokenizer *tok;
    if (tp_model_load(mpath, &m, &e) || tp_tokenizer_load(tpath, 32000, &tok, &e)) {
        fprintf(stderr, "bench_pipeline: %s\n", e.msg);
        return 1;
    }
    uint64_t x = 88172645463325252ull;
    for (int j = 0; j < MAX_JOBS; j++) {
        bench_random_ids(&x, prompts[j], PROMPT_LEN);
        prompts[j][0] = 1;   /* BOS */
    }
    /* the default deployment first; each other row changes one setting */
    const struct variant {
        const char *name;
        const char *yaml;   /* appended to the batching: section */
        bool fused;
    } variants[] = {
        {"default (4 proc., 2 mb)", "  micro_batches: 2\n", false},
        {"4 processes, 1 microbatch", "  micro_batches: 1\n", false},
        {"4 proc., no decode-ahead", "  micro_batches: 2\n  decode_ahead: false\n", false},
        {"forward+sample, 1 microb.", "  micro_batches: 1\n", true},
        {"forward+sample, 2 microb.", "  micro_batches: 2\n", true},
    };
    const int jobs[] = {1, 8, 32};
    printf("bench_pipeline: stories15M-shaped random model, prompt %d, %d tokens per job, greedy; medians of %d\n",
           PROMPT_LEN, MAX_TOKENS, SAMPLES);
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        char cfg[256], front[256], events[256];
        snprintf(cfg, sizeof cfg, "%s/c%zu.yaml", dir, v);
        FILE *f = fopen(cfg, "w");
        fprintf(f, "runtime_dir: %s/rt%zu\nmodel:\n  path: %s\n  tokenizer: %s\nkv:\n  slots: %d\n"
                   "batching:\n  max_num_seqs: %d\n  max_batch_tokens: %d\n  prefill_chunk: %d\n"
                   "%sworkers:\n  binary: %s/tokpipe-worker\n%s",
                dir, v, mpath, tpath, MAX_JOBS, MAX_JOBS, BUDGET, CHUNK, variants[v].yaml, bin,
                variants[v].fused ? "  fuse: [\"forward,sample\"]\n" : "");
        fclose(f);
        snprintf(front, sizeof front, "ipc://%s/rt%zu/front.sock", dir, v);
        snprintf(events, sizeof events, "ipc://%s/rt%zu/events.sock", dir, v);
        bench_daemon d;
        if (bench_daemon_start(&d, bin, cfg, front, events)) {
            fprintf(stderr, "bench_pipeline: daemon did not start\n");
            return 1;
        }
        run_stats warm;
        pipeline(&d, 2, "warm", &warm);
        printf("%s vs in-process:\n", variants[v].name);
        for (size_t k = 0; k < sizeof jobs / sizeof jobs[0]; k++) {
            run_stats ip[SAMPLES], pl[SAMPLES];
            for (int s = 0; s < SAMPLES; s++) {
                char prefix[32];
                snprintf(prefix, sizeof prefix, "b%zu-%d-%d", v, jobs[k], s);
                if (in_process(m, tok, jobs[k], &ip[s]) || pipeline(&d, jobs[k], prefix, &pl[s]))
                    return 1;
            }
            qsort(ip, SAMPLES, sizeof ip[0], med_cmp);
            qsort(pl, SAMPLES, sizeof pl[0], med_cmp);
            print_row("in-process", jobs[k], &ip[SAMPLES / 2], 0);
            print_row(variants[v].name, jobs[k], &pl[SAMPLES / 2], ip[SAMPLES / 2].tok_s);
        }
        bench_daemon_stop(&d);
    }
    tp_tokenizer_free(tok);
    tp_model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return 0;
}
