/* make bench: how single-stream (batch 1) decode scales with threads, per
 * weight type, against what the memory can deliver to that many threads.
 *
 * A decode step streams every weight once, so its ceiling at T threads is
 * the DRAM read bandwidth T threads get. This measures that bandwidth in
 * the same run (a streaming read of a buffer far larger than any cache,
 * each thread over its own slice, first touched by that thread) at the same
 * thread counts, and reports decode as tok/s, as GB/s of weights streamed
 * (tok/s x the bytes of the matrices a token reads) and as the ratio of
 * that to the probe: the figure to compare across machines.
 *
 * Models: random stories110M-shaped weights from `tokpipe mkmodel`'s
 * generator, converted with `tokpipe quantize` ($BIN, default bin/), in a
 * temporary directory. With the Llama 2 vocabulary of ../shared/models
 * ($TP_MODELS) the files are llama.cpp-loadable GGUF, and llama.cpp decodes
 * the same files beside tokpipe at every thread count (support/llamacpp.h:
 * its own llama-bench, built from source as its docs build it, threads as
 * that build runs them), the same workload: PROMPT_LEN tokens of context,
 * then batch-1 decode steps; and a PREFILL_LEN-token prompt in one step
 * (what the many-token kernels do; llama-bench's pp test beside it).
 * Samples interleave thread counts, types and the two programs (paired;
 * which goes first alternates), each figure is the median of SAMPLES;
 * times are wall clock (threads run in parallel), so a busy machine shows:
 * the load average is printed. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/synth.h"
#include "support/decode.h"
#include "support/llamacpp.h"
#include "support/timing.h" /* bench_now, bench_median, bench_list_has */

#define SAMPLES 5
#define PROMPT_LEN 8
#define PREFILL_LEN 128 /* the prefill table's prompt, one step */
#define MAX_POS 160
#define PROBE_BYTES ((size_t)1 << 30) /* 1 GiB: 30x a 32 MB L3 */
#define MAX_T 64

/* the first N_DEFAULT unless $TP_BENCH_TYPES names others */
static const char *const TYPES[] = {"F32", "F16", "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K"};
#define NT (sizeof TYPES / sizeof TYPES[0])
#define N_DEFAULT 5

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_threads: %s: %s\n", what, msg);
    exit(1);
}

/* ---- the DRAM read probe -------------------------------------------- */

typedef struct probe {
    uint64_t *buf;
    size_t words; /* per thread */
    int threads, passes;
    pthread_barrier_t start, touched;
    uint64_t sink[MAX_T * 8];
} probe;

typedef struct probe_arg {
    probe *p;
    int i;
    bool touch;
} probe_arg;

/* Eight independent sums over a cache line per iteration: no dependency
 * chain longer than the line, so the loads, not the adds, set the pace. */
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *w, size_t n)
{
    typedef long long v4 __attribute__((vector_size(32)));
    v4 a = {0, 0, 0, 0}, b = a;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        v4 x, y;
        memcpy(&x, w + i, 32);
        memcpy(&y, w + i + 4, 32);
        a += x;
        b += y;
    }
    a += b;
    return (uint64_t)(a[0] + a[1] + a[2] + a[3]);
}

static uint64_t sum_plain(const uint64_t *w, size_t n)
{
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += w[i + k];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void *probe_thread(void *arg)
{
    probe_arg *a = arg;
    probe *p = a->p;
    uint64_t *w = p->buf + (size_t)a->i * p->words;
    bool avx2 = __builtin_cpu_supports("avx2");
    if (a->touch) /* first touch by the reader: pages near its core */
        for (size_t k = 0; k < p->words; k++)
            w[k] = k ^ (uint64_t)a->i;
    pthread_barrier_wait(&p->touched);
    pthread_barrier_wait(&p->start);
    uint64_t s = 0;
    for (int k = 0; k < p->passes; k++)
        s += avx2 ? sum_avx2(w, p->words) : sum_plain(w, p->words);
    p->sink[a->i * 8] = s;
    return NULL;
}

/* GB/s that t threads read from a fresh PROBE_BYTES buffer (1 pass after
 * the touch, so nothing of it is in a cache). */
static double probe_gbs(int t)
{
    probe p;
    memset(&p, 0, sizeof p);
    p.threads = t;
    p.words = PROBE_BYTES / sizeof(uint64_t) / (size_t)t / 8 * 8;
    p.passes = 2;
    p.buf = mmap(NULL, PROBE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p.buf == MAP_FAILED)
        die("probe", "cannot map 1 GiB");
    pthread_barrier_init(&p.touched, NULL, (unsigned)t + 1);
    pthread_barrier_init(&p.start, NULL, (unsigned)t + 1);
    pthread_t th[MAX_T];
    probe_arg args[MAX_T];
    for (int i = 0; i < t; i++) {
        args[i] = (probe_arg){&p, i, true};
        if (pthread_create(&th[i], NULL, probe_thread, &args[i]))
            die("probe", "cannot start a thread");
    }
    pthread_barrier_wait(&p.touched);
    double t0 = bench_now();
    pthread_barrier_wait(&p.start);
    for (int i = 0; i < t; i++)
        pthread_join(th[i], NULL);
    double dt = bench_now() - t0;
    pthread_barrier_destroy(&p.touched);
    pthread_barrier_destroy(&p.start);
    munmap(p.buf, PROBE_BYTES);
    return (double)p.words * sizeof(uint64_t) * (double)t * p.passes / dt / 1e9;
}

/* ---- decode --------------------------------------------------------- */

typedef struct entry {
    const char *type;
    char path[512];
    tp_model *m;
    tp_forward *f;
    double bytes; /* of the matrices one token reads */
} entry;

static double wmat_bytes(const tp_wmat *w) { return (double)w->rows * (double)w->row_bytes; }

static double token_bytes(const tp_model *m)
{
    const tp_model_weights *w = tp_model_get_weights(m);
    double b = wmat_bytes(&w->m.wcls);
    for (int l = 0; l < tp_model_get_config(m)->n_layers; l++) {
        const tp_layer_weights *lw = &w->layers[l];
        b += wmat_bytes(&lw->m.wq) + wmat_bytes(&lw->m.wk) + wmat_bytes(&lw->m.wv) + wmat_bytes(&lw->m.wo) +
             wmat_bytes(&lw->m.w1) + wmat_bytes(&lw->m.w2) + wmat_bytes(&lw->m.w3);
    }
    return b;
}

/* Wall tokens/s of one sequence decoding n tokens after a short prompt. */
static double run_decode(entry *e, int threads, int n)
{
    tp_err err;
    if (tp_forward_set_threads(e->f, threads, &err))
        die("threads", err.msg);
    double r = bench_decode_rate(e->f, tp_model_get_config(e->m)->vocab_size, PROMPT_LEN, n, bench_now, &err);
    if (r < 0)
        die("decode", err.msg);
    return r;
}

/* Tokens per second of a new sequence's PREFILL_LEN-token prompt taken in
 * one step, wall clock. */
static double run_prefill(entry *e, int threads)
{
    tp_err err;
    if (tp_forward_set_threads(e->f, threads, &err))
        die("threads", err.msg);
    double r = bench_prefill_rate(e->f, tp_model_get_config(e->m)->vocab_size, PREFILL_LEN, bench_now, &err);
    if (r < 0)
        die("prefill", err.msg);
    return r;
}

static void cpu_name(char *out, size_t n)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(out, n, "unknown CPU");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            const char *c = strchr(line, ':');
            if (c) {
                snprintf(out, n, "%s", c + 2);
                out[strcspn(out, "\n")] = 0;
            }
            break;
        }
    if (f)
        fclose(f);
}

static double loadavg(void)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double l = -1;
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

/* CPU seconds the whole machine has spent busy (steal included: a core the
 * hypervisor gave away is as taken) minus this process's and its waited-for
 * children's (llama-bench): what other processes took. The load average
 * cannot tell them from the bench's own threads. */
static double others_cpu_s(void)
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    if (!f)
        return 0;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7]);
    fclose(f);
    if (n != 8)
        return 0;
    double busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK), own = 0;
    struct rusage ru[2];
    getrusage(RUSAGE_SELF, &ru[0]);
    getrusage(RUSAGE_CHILDREN, &ru[1]);
    for (int k = 0; k < 2; k++)
        own += (double)ru[k].ru_utime.tv_sec + ru[k].ru_utime.tv_usec / 1e6 + (double)ru[k].ru_stime.tv_sec +
               ru[k].ru_stime.tv_usec / 1e6;
    return busy - own;
}

/* A sample during which other processes took more than QUIET of a CPU is
 * taken again, a second later, up to TRIES times: both programs' threads
 * wait for each other at every matmul, so a core someone else holds
 * stalls a step, llama.cpp's spinning threads most (on 2 vCPUs with one
 * busy its Q8_0 fell from ~150 to ~1 tok/s). A pair is redone whole, so
 * neither program is favoured. */
#define QUIET 0.10
#define TRIES 8
static int redone, kept_busy;

static bool quiet_since(double others0, double wall0, int tries)
{
    double busy = (others_cpu_s() - others0) / (bench_now() - wall0);
    if (busy <= QUIET)
        return true;
    if (tries + 1 >= TRIES) {
        kept_busy++;
        return true;
    }
    redone++;
    sleep(1);
    return false;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--help")) {
        printf("usage: bench_threads [SHAPE]   (default stories110M; needs $BIN/tokpipe)\n"
               "  batch-1 decode per type at 1, 2, ... all CPUs (powers of two and the count), as tok/s,\n"
               "  GB/s of weights and the ratio to a DRAM read probe at the same thread count.\n"
               "  $TP_BENCH_THREADS=1,2,4 picks the thread counts; $TP_BENCH_TOKENS the tokens per sample;\n"
               "  $TP_BENCH_TYPES=Q8_0,F16 the types (default F32,F16,Q8_0,Q4_0,Q4_K_M; also Q5_K_M, Q6_K).\n"
               "  With $TP_MODELS (../shared/models) holding the Llama 2 vocabulary, llama.cpp (its\n"
               "  llama-bench, built on first use into build/llamacpp from the source node-llama-cpp\n"
               "  ships) decodes the same files beside it at every thread count: llama.cpp tok/s and\n"
               "  tokpipe / llama.cpp. A second table: a 128-token prompt in one step (prefill), the same way.\n"
               "  $TP_LLAMACPP=0: tokpipe alone; $TP_LLAMA_BENCH=PATH: a llama-bench built elsewhere\n"
               "  ($TP_LLAMA_COMMIT, $TP_LLAMA_BUILD: what it is), as scripts/device-bench.sh runs it.\n");
        return 0;
    }
    const char *shape = argc > 1 ? argv[1] : "stories110M", *bin = getenv("BIN");
    bin = bin ? bin : "bin";
    setvbuf(stdout, NULL, _IOLBF, 0);
    int ncpu = tp_forward_default_threads(), counts[MAX_T], nc = 0;
    const char *tl = getenv("TP_BENCH_THREADS");
    if (tl)
        for (const char *p = tl; *p && nc < MAX_T;) {
            int t = atoi(p);
            if (t >= 1 && t <= TP_FORWARD_MAX_THREADS && t <= MAX_T)
                counts[nc++] = t;
            p += strcspn(p, ",");
            p += *p == ',';
        }
    else {
        for (int t = 1; t < ncpu && nc < MAX_T - 1; t *= 2)
            counts[nc++] = t;
        counts[nc++] = ncpu;
    }
    if (!nc)
        die("TP_BENCH_THREADS", "no thread count in 1..64");
    const char *tk = getenv("TP_BENCH_TOKENS");
    int tokens = tk && atoi(tk) > 0 ? atoi(tk) : 16;

    tp_synth_shape sh;
    tp_err err;
    if (tp_synth_parse_shape(shape, &sh, &err))
        die(shape, err.msg);
    sh.seq_len = MAX_POS;
    char dir[] = "/tmp/tp-bench-threads-XXXXXX", src[600], cmd[2048], vocab[1024];
    if (!mkdtemp(dir))
        die("mkdtemp", "failed");
    /* A GGUF with a real vocabulary when there is one (llama.cpp loads no
     * model without); else a llama2.c checkpoint, tokpipe alone. */
    const char *models = getenv("TP_MODELS");
    snprintf(vocab, sizeof vocab, "%s/llama.cpp-vocab/ggml-vocab-llama-spm.gguf", models ? models : "../shared/models");
    bool gguf = access(vocab, R_OK) == 0;
    if (gguf) {
        snprintf(src, sizeof src, "%s/%s.gguf", dir, shape);
        snprintf(cmd, sizeof cmd, "%s/tokpipe mkmodel --format gguf --arch llama --vocab-from %s --shape %s --seed 1 --out %s",
                 bin, vocab, shape, src);
        if (system(cmd) != 0)
            die("mkmodel", cmd);
    } else {
        snprintf(src, sizeof src, "%s/%s.bin", dir, shape);
        FILE *fp = fopen(src, "wb");
        if (!fp || tp_synth_write_model(fp, &sh, 1, NULL, NULL, &err) || fclose(fp))
            die("write model", err.msg);
    }
    bench_llamacpp lc;
    memset(&lc, 0, sizeof lc);
    bool have_lc = false;
    if (!gguf)
        snprintf(lc.why, sizeof lc.why, "no %.600s (a GGUF vocabulary for llama.cpp's files)", vocab);
    else
        have_lc = bench_llamacpp_open(&lc) == 0;
    const char *types = getenv("TP_BENCH_TYPES");
    entry e[NT];
    memset(e, 0, sizeof e);
    size_t ne = 0;
    for (size_t k = 0; k < NT; k++)
        if (types ? bench_list_has(types, TYPES[k]) : k < N_DEFAULT)
            e[ne++].type = TYPES[k];
    if (!ne)
        die("TP_BENCH_TYPES", "no known type (F32, F16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K)");
    for (size_t i = 0; i < ne; i++) {
        snprintf(e[i].path, sizeof e[i].path, "%s/%s-%s.gguf", dir, shape, e[i].type);
        snprintf(cmd, sizeof cmd, "%s/tokpipe quantize %s %s --type %s --quiet", bin, src, e[i].path, e[i].type);
        if (system(cmd) != 0)
            die("quantize", cmd);
        if (tp_model_load(e[i].path, &e[i].m, &err) || tp_forward_new(e[i].m, 1, MAX_POS, PREFILL_LEN, &e[i].f, &err))
            die(e[i].path, err.msg);
        e[i].bytes = token_bytes(e[i].m);
        /* warm: every weight page touched, and the KV pages a sample
         * writes (a page's first write faults it in: llama.cpp clears its
         * cache when it makes it, outside its timing too) */
        run_decode(&e[i], 1, tokens);
    }
    remove(src);

    double probe[MAX_T][SAMPLES], tps[MAX_T][NT][SAMPLES], lcs[MAX_T][NT][SAMPLES], load0 = loadavg();
    double pre[MAX_T][NT][SAMPLES], lcpre[MAX_T][NT][SAMPLES];
    double others0 = others_cpu_s(), wall0 = bench_now();
    for (int s = 0; s < SAMPLES; s++)
        for (int c = 0; c < nc; c++) {
            /* progress: a many-core run of a large shape takes minutes */
            fprintf(stderr, "bench_threads: sample %d of %d, %d thread%s, %.0f s\n", s + 1, SAMPLES, counts[c],
                    counts[c] > 1 ? "s" : "", bench_now() - wall0);
            for (int k = 0;; k++) {
                double o0 = others_cpu_s(), w0 = bench_now();
                probe[c][s] = probe_gbs(counts[c]);
                if (quiet_since(o0, w0, k))
                    break;
            }
            for (size_t i = 0; i < ne; i++)
                for (int k = 0;; k++) {
                    double o0 = others_cpu_s(), w0 = bench_now();
                    for (int turn = 0; turn < 2; turn++) /* tokpipe first on even samples */
                        if (turn == (s & 1)) {
                            tps[c][i][s] = run_decode(&e[i], counts[c], tokens);
                            pre[c][i][s] = run_prefill(&e[i], counts[c]);
                        } else if (have_lc) { /* a failure: lc.why says why; no ratio rather than half of one */
                            lcs[c][i][s] = bench_llamacpp_decode(&lc, e[i].path, counts[c], PROMPT_LEN, tokens);
                            lcpre[c][i][s] = bench_llamacpp_prefill(&lc, e[i].path, counts[c], PREFILL_LEN);
                            have_lc = lcs[c][i][s] > 0 && lcpre[c][i][s] > 0;
                        }
                    if (quiet_since(o0, w0, k))
                        break;
                }
        }
    double others = (others_cpu_s() - others0) / (bench_now() - wall0); /* in CPUs */
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    printf("%s batch-1 decode, %s, %d CPUs, load average %.2f -> %.2f\n"
           "  other processes took %.0f%% of a CPU over the run; %d samples taken again for them (over %.0f%%)\n"
           "  wall clock, %d samples of %d tokens per cell (median; best in brackets); GB/s: tok/s x the weights\n"
           "  a token reads; /probe: that over the DRAM read probe at the same thread count (median of its %d)\n",
           shape, cpu, ncpu, load0, loadavg(), others * 100, redone, QUIET * 100, SAMPLES, tokens, SAMPLES);
    if (kept_busy)
        printf("  BUSY MACHINE: %d samples stayed busy after %d tries; figures on as many threads as there\n"
               "  are cores are then not the programs' speed, and their ratios say nothing: rerun quiet\n",
               kept_busy, TRIES);
    printf("  %-7s %8s %7s %17s %7s %7s %8s %9s %8s\n", "type", "MB/token", "threads", "tok/s", "GB/s", "/probe",
           "speed-up", "llama.cpp", "ratio");
    for (size_t i = 0; i < ne; i++) {
        double t1 = bench_median(tps[0][i], SAMPLES);
        for (int c = 0; c < nc; c++) {
            double t = bench_median(tps[c][i], SAMPLES), best = 0, g = t * e[i].bytes / 1e9;
            for (int k = 0; k < SAMPLES; k++)
                best = tps[c][i][k] > best ? tps[c][i][k] : best;
            char mb[16] = "";
            if (!c)
                snprintf(mb, sizeof mb, "%.0f", e[i].bytes / 1e6);
            printf("  %-7s %8s %7d %7.1f (%7.1f) %7.1f %7.2f %7.2fx", c ? "" : e[i].type, mb, counts[c], t, best, g,
                   g / bench_median(probe[c], SAMPLES), t / t1);
            if (have_lc) {
                double l = bench_median(lcs[c][i], SAMPLES);
                printf(" %9.1f %7.2fx", l, t / l);
            }
            printf("\n");
        }
    }
    printf("  %d-token prefill (one step), tok/s:\n  %-7s %7s %9s %9s %8s\n", PREFILL_LEN, "type", "threads",
           "tokpipe", "llama.cpp", "ratio");
    for (size_t i = 0; i < ne; i++)
        for (int c = 0; c < nc; c++) {
            double t = bench_median(pre[c][i], SAMPLES), l = have_lc ? bench_median(lcpre[c][i], SAMPLES) : 0;
            printf("  %-7s %7d %9.1f", c ? "" : e[i].type, counts[c], t);
            if (have_lc)
                printf(" %9.1f %7.2fx", l, t / l);
            printf("\n");
        }
    printf("  DRAM read probe (GB/s):");
    for (int c = 0; c < nc; c++)
        printf(" %d thread%s %.1f", counts[c], counts[c] > 1 ? "s" : "", bench_median(probe[c], SAMPLES));
    printf("\n");
    if (have_lc)
        printf("  llama.cpp: its llama-bench at commit %.7s (the source %s ships), built with\n"
               "  %s; `llama-bench -p 0 -n %d -d %d -t THREADS -r 1`\n"
               "  on the same files (%d decode steps after %d tokens of context; its defaults: the default\n"
               "  build's OpenMP threads, which spin between steps, so a busy core costs it much), one run\n"
               "  per sample; its tok/s median of %d, ratio: tokpipe / llama.cpp. Prefill: `llama-bench -p %d\n"
               "  -n 0` (one batch), beside tokpipe's prompt in one forward step, paired the same way.\n",
               lc.commit, BENCH_LLAMACPP_NPM, lc.build, tokens, PROMPT_LEN, tokens, PROMPT_LEN, SAMPLES,
               PREFILL_LEN);
    else
        printf("  llama.cpp: not measured: %s\n", lc.why);
    for (size_t i = 0; i < ne; i++) {
        tp_forward_free(e[i].f);
        tp_model_free(e[i].m);
        remove(e[i].path);
    }
    rmdir(dir);
    return 0;
}
