/* make bench: speed of typed (F16 ... Q6_K) weights against F32 on random
 * stories15M / stories110M shaped models, in the same run: single-stream
 * decode tok/s per type as a ratio to F32, batched aggregate decode at 8,
 * 32 and 64 sequences, a 128-token prefill, and the memory each model
 * takes (resident bytes after load: the kernels' packed copies and panels,
 * F16/BF16 weights read in place, the file's pages of copied weights given
 * back).
 *
 * The models are written by `tokpipe mkmodel`'s generator and `tokpipe
 * quantize` (from $BIN, default bin/), in a temporary directory. One
 * compute thread. Types are measured in turn within each sample (paired),
 * and each figure is the median of SAMPLES. Times are the thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID), not wall time: on a shared,
 * oversubscribed machine the wall clock mostly measures the other tenants,
 * while CPU time still feels their cache and memory-bandwidth pressure. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/synth.h"
#include "support/decode.h"
#include "support/timing.h" /* bench_cpu_now, bench_median, bench_list_has */

#define SAMPLES 3
#define PROMPT_LEN 16
#define DECODE_TOKENS 24
#define BATCH_STEPS 6
#define PREFILL_LEN 128
#define MAX_POS 160
#define MAX_SEQS 64

static const char *const TYPES[] = {"F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_0", "Q5_1",
                                    "Q4_K_M", "Q4_K", "Q5_K", "Q4_0", "Q4_1"};
#define NT (sizeof TYPES / sizeof TYPES[0])
static const int BATCHES[] = {8, 32, 64};

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_quant: %s: %s\n", what, msg);
    exit(1);
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

typedef struct entry {
    const char *type;
    char path[512];
    tp_model *m;
    tp_forward *f;
    long mem_kb;
    double decode[SAMPLES], prefill[SAMPLES], batched[3][SAMPLES];
} entry;

/* Decode tokens/s of one sequence after a PROMPT_LEN prefill. */
static double run_decode(entry *e)
{
    tp_err err;
    double r = bench_decode_rate(e->f, tp_model_get_config(e->m)->vocab_size, PROMPT_LEN, DECODE_TOKENS, bench_cpu_now, &err);
    if (r < 0)
        die("decode", err.msg);
    return r;
}

static double run_prefill(entry *e)
{
    tp_err err;
    double r = bench_prefill_rate(e->f, tp_model_get_config(e->m)->vocab_size, PREFILL_LEN, bench_cpu_now, &err);
    if (r < 0)
        die("prefill", err.msg);
    return r;
}

/* Aggregate decode tokens/s of n sequences stepping together. */
static double run_batched(entry *e, int n)
{
    int V = tp_model_get_config(e->m)->vocab_size, sid[MAX_SEQS], toks[MAX_SEQS][PROMPT_LEN];
    tp_err err;
    tp_fwd_item items[MAX_SEQS];
    float *logits = malloc(sizeof(float) * V * n);
    if (!logits)
        die("batched", "out of memory");
    for (int s = 0; s < n; s++) {
        if (tp_forward_seq_open(e->f, &sid[s], &err))
            die("batched", err.msg);
        for (int i = 0; i < PROMPT_LEN; i++)
            toks[s][i] = bench_tok_of(i + 31 * s, V);
    }
    for (int s0 = 0; s0 < n; s0 += 8) { /* prefill 8 sequences per step */
        int k = n - s0 < 8 ? n - s0 : 8;
        for (int s = 0; s < k; s++)
            items[s] = (tp_fwd_item){sid[s0 + s], 0, toks[s0 + s], PROMPT_LEN, false};
        if (tp_forward_step(e->f, items, k, logits, &err))
            die("batched prefill", err.msg);
    }
    double t0 = bench_cpu_now();
    for (int step = 0; step < BATCH_STEPS; step++) {
        for (int s = 0; s < n; s++)
            items[s] = (tp_fwd_item){sid[s], PROMPT_LEN + step, &toks[s][step], 1, false};
        if (tp_forward_step(e->f, items, n, logits, &err))
            die("batched", err.msg);
    }
    double dt = bench_cpu_now() - t0;
    for (int s = 0; s < n; s++)
        tp_forward_seq_close(e->f, sid[s]);
    free(logits);
    return (double)n * BATCH_STEPS / dt;
}

static void shape_run(const char *shape, const char *bin, const char *dir)
{
    tp_synth_shape sh;
    tp_err err;
    if (tp_synth_parse_shape(shape, &sh, &err))
        die(shape, err.msg);
    sh.seq_len = MAX_POS;
    char src[600], cmd[2048];
    snprintf(src, sizeof src, "%s/%s.bin", dir, shape);
    FILE *fp = fopen(src, "wb");
    if (!fp || tp_synth_write_model(fp, &sh, 1, NULL, NULL, &err) || fclose(fp))
        die("write model", err.msg);
    entry e[NT];
    memset(e, 0, sizeof e);
    /* $TP_BENCH_TYPES (comma-separated) narrows the run for kernel work;
     * F32, the baseline, is always measured */
    const char *only = getenv("TP_BENCH_TYPES");
    size_t n = 0;
    for (size_t k = 0; k < NT; k++) {
        if (k && only && !bench_list_has(only, TYPES[k]))
            continue;
        size_t i = n++;
        e[i].type = TYPES[k];
        snprintf(e[i].path, sizeof e[i].path, "%s/%s-%s.gguf", dir, shape, e[i].type);
        snprintf(cmd, sizeof cmd, "%s/tokpipe quantize %s %s --type %s --quiet", bin, src, e[i].path, e[i].type);
        if (system(cmd) != 0)
            die("quantize", cmd);
    }
    /* one model resident at a time for the memory figure, then all kept */
    for (size_t i = 0; i < n; i++) {
        long before = rss_kb();
        if (tp_model_load(e[i].path, &e[i].m, &err) ||
            tp_forward_new(e[i].m, MAX_SEQS, MAX_POS, PREFILL_LEN, &e[i].f, &err))
            die(e[i].path, err.msg);
        run_decode(&e[i]); /* warm: touches every weight page */
        e[i].mem_kb = rss_kb() - before;
    }
    for (int s = 0; s < SAMPLES; s++)
        for (size_t i = 0; i < n; i++) {
            e[i].decode[s] = run_decode(&e[i]);
            e[i].prefill[s] = run_prefill(&e[i]);
            for (int b = 0; b < 3; b++)
                e[i].batched[b][s] = run_batched(&e[i], BATCHES[b]);
        }
    double f32_dec = bench_median(e[0].decode, SAMPLES), f32_pre = bench_median(e[0].prefill, SAMPLES);
    double f32_b[3];
    for (int b = 0; b < 3; b++)
        f32_b[b] = bench_median(e[0].batched[b], SAMPLES);
    printf("%s (dim %d, hidden %d, %d layers, vocab %d), 1 thread, CPU time, median of %d:\n", shape, sh.dim,
           sh.hidden_dim, sh.n_layers, sh.vocab_size, SAMPLES);
    printf("  %-7s %9s %7s %11s %7s %9s  %s\n", "type", "decode/s", "x F32", "prefill/s", "x F32", "mem MB",
           "batched aggregate tok/s (x F32) at 8 / 32 / 64 seqs");
    for (size_t i = 0; i < n; i++) {
        double d = bench_median(e[i].decode, SAMPLES), p = bench_median(e[i].prefill, SAMPLES);
        printf("  %-7s %9.1f %6.2fx %11.1f %6.2fx %9.1f ", e[i].type, d, d / f32_dec, p, p / f32_pre,
               (double)e[i].mem_kb / 1024.0);
        for (int b = 0; b < 3; b++) {
            double v = bench_median(e[i].batched[b], SAMPLES);
            printf(" %7.0f (%.2fx)", v, v / f32_b[b]);
        }
        printf("\n");
    }
    for (size_t i = 0; i < n; i++) {
        tp_forward_free(e[i].f);
        tp_model_free(e[i].m);
        remove(e[i].path);
    }
    remove(src);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--help")) {
        printf("usage: bench_quant [SHAPE...]   (default: stories15M stories110M; needs $BIN/tokpipe;\n"
               "  $TP_BENCH_TYPES=Q8_0,Q4_0 measures only those types besides F32)\n");
        return 0;
    }
    const char *bin = getenv("BIN");
    char dir[] = "/tmp/tp-bench-quant-XXXXXX";
    if (!mkdtemp(dir))
        die("mkdtemp", "failed");
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1)
        for (int i = 1; i < argc; i++)
            shape_run(argv[i], bin ? bin : "bin", dir);
    else {
        shape_run("stories15M", bin ? bin : "bin", dir);
        shape_run("stories110M", bin ? bin : "bin", dir);
    }
    rmdir(dir);
    return 0;
}
