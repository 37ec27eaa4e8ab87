/* make bench: decode and prefill speed of the batched forward on random
 * stories15M / stories110M shaped models, against a llama2.c baseline
 * measured in the same run.
 *
 * The baseline (bench/baseline/llama2c_run.c) is run.c's algorithm built as
 * llama2.c's authors build it for speed: -O3 -march=native -ffast-math,
 * OpenMP over matmul rows and attention heads, one sequence and one token
 * at a time (llama2.c has no batching, so its aggregate rate at any batch
 * is its single-stream rate). Its OpenMP threads wait passively
 * (OMP_WAIT_POLICY=passive, set by re-exec unless the environment sets a
 * policy): the default spinning policy collapsed by up to 700x on this
 * shared VM (research/limits.md 0.1), which would flatter us.
 *
 * On 1 and then 2 threads (both sides), batch-1 samples of the baseline,
 * the forward's default batch-invariant kernel and its opt-in OpenBLAS
 * kernel take turns sample by sample, so the ratios are paired; batched
 * steps compare the two kernels the same way. Matmul GFLOP/s (2 x weights
 * x tok/s) is printed to compare with the FMA peak (about 260 GFLOP/s per
 * core here, research/limits.md). Then the KV cache in f16 against f32 at
 * long contexts. OPENBLAS_CORETYPE=SkylakeX is set (by re-exec) on AVX-512
 * CPUs unless already set. */
#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/synth.h"
#include "baseline/llama2c_run.h"
#include "support/blas_env.h"
#include "support/timing.h"

#define PROMPT_LEN 16
#define MAX_POS 160
#define MAX_BATCH 128
#define PREFILL_LEN 128
#define SAMPLES 5 /* each figure is the median of this many timed runs */
#define NK 2      /* kernels compared: invariant, openblas */
#define MAX_THREADS 2
#define KV_BATCH 8 /* sequences of the kv_type comparison */

static const tp_fwd_kernel KERNELS[NK] = {TP_FWD_KERNEL_INVARIANT, TP_FWD_KERNEL_OPENBLAS};

static void die(const char *what, const tp_err *e)
{
    fprintf(stderr, "bench_forward: %s: %s\n", what, e->msg);
    exit(1);
}

static void use_kernel(tp_forward *f, tp_fwd_kernel k)
{
    tp_err e;
    if (tp_forward_set_kernel(f, k, &e))
        die("set_kernel", &e);
}

/* After an OpenBLAS call on 2 threads its pool thread keeps spinning for
 * 2^28 TSC ticks (OpenBLAS's THREAD_TIMEOUT; 0.1 s at this machine's 2.6 GHz
 * TSC) before it sleeps; wait that out so the next sample does not share
 * its vCPU with the spinner. */
static void settle(const tp_forward *f, tp_fwd_kernel k)
{
    if (k == TP_FWD_KERNEL_OPENBLAS && tp_forward_threads(f) > 1)
        nanosleep(&(struct timespec){0, 150 * 1000 * 1000}, NULL);
}

/* ---- the llama2.c baseline --------------------------------------------- */

typedef struct baseline {
    l2c_weights w;
    const float *ptrs[9][256]; /* per-layer pointer arrays behind w */
    l2c *s;
} baseline;

static baseline *baseline_new(const tp_model *m)
{
    const tp_model_config *c = tp_model_get_config(m);
    const tp_model_weights *mw = tp_model_get_weights(m);
    baseline *b = calloc(1, sizeof *b);
    if (!b || c->n_layers > 256) {
        fprintf(stderr, "bench_forward: baseline: out of memory or too many layers\n");
        exit(1);
    }
    l2c_weights *w = &b->w;
    *w = (l2c_weights){c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                       c->rope_theta, c->norm_eps, mw->token_embedding, mw->rms_final, mw->wcls,
                       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    const float ***slots[9] = {&w->rms_att, &w->rms_ffn, &w->wq, &w->wk, &w->wv, &w->wo, &w->w1, &w->w2, &w->w3};
    for (int l = 0; l < c->n_layers; l++) {
        const tp_layer_weights *lw = &mw->layers[l];
        const float *per[9] = {lw->rms_att, lw->rms_ffn, lw->wq, lw->wk, lw->wv, lw->wo, lw->w1, lw->w2, lw->w3};
        for (int i = 0; i < 9; i++)
            b->ptrs[i][l] = per[i];
    }
    for (int i = 0; i < 9; i++)
        *slots[i] = b->ptrs[i];
    if (!(b->s = l2c_new(w, MAX_POS))) {
        fprintf(stderr, "bench_forward: baseline: out of memory\n");
        exit(1);
    }
    for (int p = 0; p < PROMPT_LEN; p++)
        l2c_forward(b->s, 1 + p * 7, p);
    return b;
}

static void baseline_free(baseline *b)
{
    l2c_free(b->s);
    free(b);
}

/* One timed sample: steps tokens from the same positions every sample. */
static double baseline_sample(baseline *b, int steps)
{
    volatile float sink = 0;
    double t0 = bench_now();
    for (int i = 0; i < steps; i++)
        sink += l2c_forward(b->s, 100 + i, PROMPT_LEN + i)[0];
    (void)sink;
    return steps / (bench_now() - t0);
}

/* ---- the batched forward ----------------------------------------------- */

/* Decode tok/s of each kernel (tps[k]): B sequences after a prompt, steps
 * decode steps per sample, the kernels (and the baseline, when given, for
 * base_steps tokens) taking turns sample by sample. */
static void fwd_decode(tp_forward *f, int B, int steps, float *logits, double *tps_out, baseline *base,
                       int base_steps, double *base_out)
{
    tp_err e;
    int sid[MAX_BATCH], prompt[PROMPT_LEN], toks[MAX_BATCH];
    tp_fwd_item items[MAX_BATCH];
    for (int i = 0; i < PROMPT_LEN; i++)
        prompt[i] = 1 + i * 7;
    for (int b = 0; b < B; b++) {
        if (tp_forward_seq_open(f, &sid[b], &e))
            die("seq_open", &e);
        tp_fwd_item it = {sid[b], 0, prompt, PROMPT_LEN, true};
        if (tp_forward_step(f, &it, 1, NULL, &e))
            die("prefill", &e);
    }
    double tps[NK][SAMPLES], btps[SAMPLES];
    for (int k = -1; k < SAMPLES; k++) { /* sample -1 warms up */
        if (base) {
            double v = baseline_sample(base, base_steps);
            if (k >= 0)
                btps[k] = v;
        }
        for (int ki = 0; ki < NK; ki++) {
            use_kernel(f, KERNELS[ki]);
            double t0 = bench_now();
            for (int s = 0; s < steps; s++) {
                for (int b = 0; b < B; b++) { /* every sample decodes the same positions */
                    toks[b] = 100 + b + s;
                    items[b] = (tp_fwd_item){sid[b], PROMPT_LEN + s, &toks[b], 1, false};
                }
                if (tp_forward_step(f, items, B, logits, &e))
                    die("decode", &e);
            }
            if (k >= 0)
                tps[ki][k] = (double)B * steps / (bench_now() - t0);
            settle(f, KERNELS[ki]);
        }
    }
    for (int b = 0; b < B; b++)
        tp_forward_seq_close(f, sid[b]);
    for (int ki = 0; ki < NK; ki++)
        tps_out[ki] = bench_median(tps[ki], SAMPLES);
    if (base)
        *base_out = bench_median(btps, SAMPLES);
}

/* Prefill tok/s of each kernel: one PREFILL_LEN-token chunk per sample,
 * kernels taking turns. */
static void fwd_prefill(tp_forward *f, float *logits, double *tps_out)
{
    tp_err e;
    int toks[PREFILL_LEN];
    for (int i = 0; i < PREFILL_LEN; i++)
        toks[i] = (i * 31) % 1000;
    double tps[NK][SAMPLES];
    for (int r = 0; r < SAMPLES; r++)
        for (int ki = 0; ki < NK; ki++) {
            use_kernel(f, KERNELS[ki]);
            int sid;
            if (tp_forward_seq_open(f, &sid, &e))
                die("seq_open", &e);
            tp_fwd_item it = {sid, 0, toks, PREFILL_LEN, false};
            double t0 = bench_now();
            if (tp_forward_step(f, &it, 1, logits, &e))
                die("prefill", &e);
            tps[ki][r] = PREFILL_LEN / (bench_now() - t0);
            tp_forward_seq_close(f, sid);
            settle(f, KERNELS[ki]);
        }
    for (int ki = 0; ki < NK; ki++)
        tps_out[ki] = bench_median(tps[ki], SAMPLES);
}

/* KV_BATCH sequences on f after a prompt of long_pos tokens (fed in
 * PREFILL_LEN chunks); their ids go to sid. */
static void kv_prefill(tp_forward *f, int long_pos, int *sid)
{
    tp_err e;
    int *prompt = malloc(sizeof(int) * (size_t)long_pos);
    if (!prompt) {
        fprintf(stderr, "bench_forward: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < long_pos; i++)
        prompt[i] = 1 + (i * 13) % 500;
    for (int b = 0; b < KV_BATCH; b++) {
        if (tp_forward_seq_open(f, &sid[b], &e))
            die("seq_open", &e);
        for (int p = 0; p < long_pos; p += PREFILL_LEN) {
            int n = long_pos - p < PREFILL_LEN ? long_pos - p : PREFILL_LEN;
            tp_fwd_item it = {sid[b], p, prompt + p, n, true};
            if (tp_forward_step(f, &it, 1, NULL, &e))
                die("prefill", &e);
        }
    }
    free(prompt);
}

/* Decode tok/s of KV_BATCH sequences at positions long_pos.. with the KV
 * cache in f32 (tps[0]) and f16 (tps[1]): two instances on max_threads
 * threads, taking turns sample by sample. */
static void kv_decode(const tp_model *m, int long_pos, int steps, int threads, float *logits, double *tps_out)
{
    tp_err e;
    tp_forward *f[2];
    int sid[2][KV_BATCH], toks[KV_BATCH];
    for (int i = 0; i < 2; i++) {
        if (tp_forward_new(m, KV_BATCH, long_pos + steps, PREFILL_LEN, &f[i], &e) ||
            tp_forward_set_kv_type(f[i], i ? TP_KV_F16 : TP_KV_F32, &e) ||
            tp_forward_set_threads(f[i], threads, &e))
            die("kv forward", &e);
        kv_prefill(f[i], long_pos, sid[i]);
    }
    double tps[2][SAMPLES];
    tp_fwd_item items[KV_BATCH];
    for (int k = -1; k < SAMPLES; k++)
        for (int i = 0; i < 2; i++) {
            double t0 = bench_now();
            for (int s = 0; s < steps; s++) {
                for (int b = 0; b < KV_BATCH; b++) {
                    toks[b] = 100 + b + s;
                    items[b] = (tp_fwd_item){sid[i][b], long_pos + s, &toks[b], 1, false};
                }
                if (tp_forward_step(f[i], items, KV_BATCH, logits, &e))
                    die("decode", &e);
            }
            if (k >= 0)
                tps[i][k] = (double)KV_BATCH * steps / (bench_now() - t0);
        }
    for (int i = 0; i < 2; i++) {
        tps_out[i] = bench_median(tps[i], SAMPLES);
        tp_forward_free(f[i]);
    }
}

static double matmul_weights(const tp_model_config *c)
{
    double d = c->dim, kv = c->kv_dim, h = c->hidden_dim;
    return c->n_layers * (2 * d * d + 2 * d * kv + 3 * d * h) + (double)c->vocab_size * d;
}

static void print_row(const char *what, const double *tps, double base, double weights)
{
    printf("  %-30s %8.1f tok/s  %5.2fx llama2.c  %6.1f GFLOP/s | openblas kernel %8.1f (%.2fx)\n", what,
           tps[0], tps[0] / base, 2 * weights * tps[0] / 1e9, tps[1], tps[1] / tps[0]);
}

static void bench_shape(const char *name, int steps_scale, int long_pos)
{
    tp_synth_shape sh;
    tp_err e;
    void *buf;
    size_t size;
    if (tp_synth_parse_shape(name, &sh, &e) || tp_synth_build_model(&sh, 1, &buf, &size, &e))
        die(name, &e);
    tp_model *m;
    tp_forward *f;
    if (tp_model_from_memory(buf, size, &m, &e))
        die("model", &e);
    if (tp_forward_new(m, MAX_BATCH, MAX_POS, PREFILL_LEN > MAX_BATCH ? PREFILL_LEN : MAX_BATCH, &f, &e))
        die("forward_new", &e);
    double weights = matmul_weights(tp_model_get_config(m));
    float *logits = malloc(sizeof(float) * MAX_BATCH * sh.vocab_size);
    baseline *base = baseline_new(m);
    printf("%s (%.1f MB f32 weights), decode at positions %d..%d, medians of %d samples\n", name, size / 1e6,
           PROMPT_LEN, PROMPT_LEN + 4 * steps_scale, SAMPLES);
    const int Bs[] = {8, 32, 64, 128}, nB = 4;
    double tps[NK];
    char what[64];
    for (int th = 1; th <= MAX_THREADS; th++) {
        if (tp_forward_set_threads(f, th, &e))
            die("threads", &e);
        l2c_set_threads(th);
        openblas_set_num_threads(th);
        double b1;
        fwd_decode(f, 1, 4 * steps_scale, logits, tps, base, 4 * steps_scale, &b1);
        printf(" %d thread(s): llama2.c baseline %.1f tok/s (%.1f GFLOP/s)\n", th, b1, 2 * weights * b1 / 1e9);
        print_row("decode batch   1:", tps, b1, weights);
        for (int i = 0; i < nB; i++) {
            fwd_decode(f, Bs[i], steps_scale, logits, tps, NULL, 0, NULL);
            snprintf(what, sizeof what, "decode batch %3d:", Bs[i]);
            print_row(what, tps, b1, weights);
        }
        fwd_prefill(f, logits, tps);
        snprintf(what, sizeof what, "prefill %d:", PREFILL_LEN);
        print_row(what, tps, b1, weights);
    }
    baseline_free(base);
    tp_forward_free(f);
    /* KV cache in f16 against f32 at long contexts, on the last thread count */
    int steps = 2 * steps_scale;
    double kv[2];
    kv_decode(m, long_pos, steps, MAX_THREADS, logits, kv);
    printf(" %d thread(s), batch %d at positions %d..%d: kv_type f32 %.1f tok/s, f16 %.1f tok/s (%.2fx)\n",
           MAX_THREADS, KV_BATCH, long_pos, long_pos + steps, kv[0], kv[1], kv[1] / kv[0]);
    free(logits);
    tp_model_free(m);
    free(buf);
}

int main(int argc, char **argv)
{
    (void)argc;
    /* libgomp reads its wait policy when it loads: set it by re-exec */
    if (!getenv("OMP_WAIT_POLICY")) {
        if (setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
            execv("/proc/self/exe", argv);
        fprintf(stderr, "bench_forward: re-exec with OMP_WAIT_POLICY=passive failed: %s\n", strerror(errno));
    }
    bench_blas_coretype(argv);
    openblas_set_num_threads(1);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("bench_forward (OPENBLAS_CORETYPE=%s; OpenBLAS reports core %s; llama2.c baseline with "
           "OMP_WAIT_POLICY=%s; ratios are against the baseline on the same thread count, measured in turn "
           "with tokpipe's batch 1)\n", ct ? ct : "(unset)", openblas_get_corename(), l2c_wait_policy());
    bench_shape("stories15M", 8, 192);
    bench_shape("stories110M", 2, 384);
    return 0;
}
