/* make bench: decode and prefill speed of the batched forward on random
 * stories15M / stories110M shaped models, against a naive per-sequence
 * matvec forward (llama2.c's run.c structure) measured in the same run.
 *
 * The forward runs its default batch-invariant kernel and the opt-in
 * OpenBLAS kernel, sample by sample in turn on the same instance (so both
 * see the same machine state and the ratio is paired), on one thread (the
 * default) and then with two. The baselines run OpenBLAS sgemv with one
 * thread (and llama2.c's plain C matmul loop). OPENBLAS_CORETYPE=SkylakeX
 * is set (by re-exec) on AVX-512 CPUs unless already set. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokpipe/forward.h"
#include "tokpipe/synth.h"
#include "support/blas_env.h"
#include "support/timing.h"

#define PROMPT_LEN 16
#define MAX_POS 160
#define MAX_BATCH 128
#define PREFILL_LEN 128
#define SAMPLES 5 /* each figure is the median of this many timed runs */
#define NK 2      /* kernels compared: invariant, openblas */

static const tp_fwd_kernel KERNELS[NK] = {TP_FWD_KERNEL_INVARIANT, TP_FWD_KERNEL_OPENBLAS};

static void die(const char *what, const tp_err *e)
{
    fprintf(stderr, "bench_forward: %s: %s\n", what, e->msg);
    exit(1);
}

/* ---- naive baseline: one sequence, one token, matvec per weight -------- */

typedef void (*matvec_fn)(float *y, const float *W, const float *x, int rows, int cols);

static void matvec_c(float *y, const float *W, const float *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) { /* llama2.c run.c matmul */
        float v = 0.0f;
        for (int k = 0; k < cols; k++)
            v += W[(size_t)r * cols + k] * x[k];
        y[r] = v;
    }
}

static void matvec_blas(float *y, const float *W, const float *x, int rows, int cols)
{
    cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, cols, 1.0f, W, cols, x, 1, 0.0f, y, 1);
}

typedef struct naive {
    const tp_model_config *c;
    const tp_model_weights *w;
    float *x, *xb, *xb2, *q, *hb, *hb2, *att, *logits, *kc, *vc;
} naive;

static void nrms(float *o, const float *x, const float *w, int n)
{
    float ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    ss = 1.0f / sqrtf(ss / n + 1e-5f);
    for (int i = 0; i < n; i++)
        o[i] = w[i] * ss * x[i];
}

static void naive_step(naive *s, int token, int pos, matvec_fn mv)
{
    const tp_model_config *c = s->c;
    int d = c->dim, kvd = c->kv_dim, hs = c->head_size, hd = c->hidden_dim;
    memcpy(s->x, s->w->token_embedding + (size_t)token * d, d * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        const tp_layer_weights *lw = &s->w->layers[l];
        float *k = s->kc + ((size_t)l * MAX_POS + pos) * kvd, *v = s->vc + ((size_t)l * MAX_POS + pos) * kvd;
        nrms(s->xb, s->x, lw->rms_att, d);
        mv(s->q, lw->wq, s->xb, d, d);
        mv(k, lw->wk, s->xb, kvd, d);
        mv(v, lw->wv, s->xb, kvd, d);
        for (int i = 0; i < d; i += 2) {
            float f = 1.0f / powf(10000.0f, (float)(i % hs) / hs), cs = cosf(pos * f), sn = sinf(pos * f);
            for (int r = 0; r < (i < kvd ? 2 : 1); r++) {
                float *vec = r ? k : s->q, a = vec[i], b = vec[i + 1];
                vec[i] = a * cs - b * sn;
                vec[i + 1] = a * sn + b * cs;
            }
        }
        for (int h = 0; h < c->n_heads; h++) {
            int g = h / (c->n_heads / c->n_kv_heads);
            float mx = -1e30f, sum = 0;
            for (int t = 0; t <= pos; t++) {
                const float *kt = s->kc + ((size_t)l * MAX_POS + t) * kvd + g * hs;
                float a = 0;
                for (int i = 0; i < hs; i++)
                    a += s->q[h * hs + i] * kt[i];
                s->att[t] = a / sqrtf(hs);
                mx = s->att[t] > mx ? s->att[t] : mx;
            }
            for (int t = 0; t <= pos; t++)
                sum += s->att[t] = expf(s->att[t] - mx);
            float *o = s->xb + h * hs;
            memset(o, 0, hs * sizeof(float));
            for (int t = 0; t <= pos; t++) {
                const float *vt = s->vc + ((size_t)l * MAX_POS + t) * kvd + g * hs;
                for (int i = 0; i < hs; i++)
                    o[i] += s->att[t] / sum * vt[i];
            }
        }
        mv(s->xb2, lw->wo, s->xb, d, d);
        for (int i = 0; i < d; i++)
            s->x[i] += s->xb2[i];
        nrms(s->xb, s->x, lw->rms_ffn, d);
        mv(s->hb, lw->w1, s->xb, hd, d);
        mv(s->hb2, lw->w3, s->xb, hd, d);
        for (int i = 0; i < hd; i++)
            s->hb[i] = s->hb[i] / (1.0f + expf(-s->hb[i])) * s->hb2[i];
        mv(s->xb2, lw->w2, s->hb, d, hd);
        for (int i = 0; i < d; i++)
            s->x[i] += s->xb2[i];
    }
    nrms(s->xb, s->x, s->w->rms_final, d);
    mv(s->logits, s->w->wcls, s->xb, c->vocab_size, d);
}

/* Decode tok/s of the naive forward: prompt then steps tokens, timed. */
static double naive_decode(const tp_model *m, matvec_fn mv, int steps)
{
    const tp_model_config *c = tp_model_get_config(m);
    naive s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.w = tp_model_get_weights(m);
    size_t d = c->dim, h = c->hidden_dim, kv = (size_t)c->n_layers * MAX_POS * c->kv_dim;
    s.x = malloc(d * 4); s.xb = malloc(d * 4); s.xb2 = malloc(d * 4); s.q = malloc(d * 4);
    s.hb = malloc(h * 4); s.hb2 = malloc(h * 4); s.att = malloc(MAX_POS * 4);
    s.logits = malloc((size_t)c->vocab_size * 4); s.kc = calloc(kv, 4); s.vc = calloc(kv, 4);
    for (int p = 0; p < PROMPT_LEN; p++)
        naive_step(&s, 1 + p, p, mv);
    double tps[SAMPLES];
    for (int k = 0; k < SAMPLES; k++) { /* every sample decodes the same positions */
        double t0 = bench_now();
        for (int i = 0; i < steps; i++)
            naive_step(&s, 100 + i, PROMPT_LEN + i, mv);
        tps[k] = steps / (bench_now() - t0);
    }
    free(s.x); free(s.xb); free(s.xb2); free(s.q); free(s.hb); free(s.hb2); free(s.att);
    free(s.logits); free(s.kc); free(s.vc);
    return bench_median(tps, SAMPLES);
}

/* ---- the batched forward ----------------------------------------------- */

static void use_kernel(tp_forward *f, tp_fwd_kernel k)
{
    tp_err e;
    if (tp_forward_set_kernel(f, k, &e))
        die("set_kernel", &e);
}

/* After an OpenBLAS call on 2 threads its pool thread keeps spinning for
 * 2^28 TSC ticks (OpenBLAS's THREAD_TIMEOUT; 0.1 s at this machine's 2.6 GHz
 * TSC) before it sleeps; wait that out so the next sample (the invariant
 * kernel's own second thread) does not share its vCPU with the spinner. */
static void settle(const tp_forward *f, tp_fwd_kernel k)
{
    if (k == TP_FWD_KERNEL_OPENBLAS && tp_forward_threads(f) == 2)
        nanosleep(&(struct timespec){0, 150 * 1000 * 1000}, NULL);
}

/* Decode tok/s of each kernel (tps[k]): B sequences after a prompt, steps
 * decode steps per sample, the kernels taking turns sample by sample. */
static void fwd_decode(tp_forward *f, int B, int steps, float *logits, double *tps_out)
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
    double tps[NK][SAMPLES];
    for (int k = -1; k < SAMPLES; k++) /* sample -1 warms up */
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
    for (int b = 0; b < B; b++)
        tp_forward_seq_close(f, sid[b]);
    for (int ki = 0; ki < NK; ki++)
        tps_out[ki] = bench_median(tps[ki], SAMPLES);
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

static void print_pair(const char *what, const double *tps, double b1, double naive)
{
    printf("  %-34s %8.1f tok/s  (%.2fx batch 1, %.2fx naive sgemv)\n", what, tps[0], tps[0] / b1,
           tps[0] / naive);
    printf("  %-34s %8.1f tok/s  (%.2fx invariant)\n", "  openblas kernel:", tps[1], tps[1] / tps[0]);
}

static void bench_shape(const char *name, int steps_scale)
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
    float *logits = malloc(sizeof(float) * MAX_BATCH * sh.vocab_size);
    printf("%s (%.1f MB f32 weights), decode at positions %d..%d, medians of %d samples\n", name,
           size / 1e6, PROMPT_LEN, PROMPT_LEN + 4 * steps_scale, SAMPLES);
    openblas_set_num_threads(1); /* process-wide; the forward's OpenBLAS kernel may have set 2 */
    double naive_blas = naive_decode(m, matvec_blas, 4 * steps_scale);
    double naive_c = naive_decode(m, matvec_c, steps_scale);
    printf("  baseline naive matvec, OpenBLAS sgemv: %8.1f tok/s\n", naive_blas);
    printf("  baseline naive matvec, run.c C loop:   %8.1f tok/s\n", naive_c);
    const int Bs[] = {1, 8, 32, 64, 128}, nB = 5;
    double b1 = 0, tps[NK];
    char what[64];
    for (int i = 0; i < nB; i++) {
        int B = Bs[i];
        fwd_decode(f, B, B == 1 ? 4 * steps_scale : steps_scale, logits, tps);
        if (B == 1)
            b1 = tps[0];
        snprintf(what, sizeof what, "tokpipe decode batch %3d, invariant:", B);
        print_pair(what, tps, b1, naive_blas);
    }
    fwd_prefill(f, logits, tps);
    snprintf(what, sizeof what, "tokpipe prefill %d, invariant:", PREFILL_LEN);
    print_pair(what, tps, b1, naive_blas);
    /* Opt-in second compute thread (passive wait; for the OpenBLAS kernel
     * OpenBLAS's own pool): the process owns both vCPUs here, which a
     * deployed forward worker may not. */
    if (tp_forward_set_threads(f, 2, &e))
        die("threads", &e);
    for (int i = 2; i < nB; i++) {
        fwd_decode(f, Bs[i], steps_scale, logits, tps);
        snprintf(what, sizeof what, "2 threads, batch %3d, invariant:", Bs[i]);
        print_pair(what, tps, b1, naive_blas);
    }
    fwd_prefill(f, logits, tps);
    snprintf(what, sizeof what, "2 threads, prefill %d, invariant:", PREFILL_LEN);
    print_pair(what, tps, b1, naive_blas);
    free(logits);
    tp_forward_free(f);
    tp_model_free(m);
    free(buf);
}

int main(int argc, char **argv)
{
    (void)argc;
    bench_blas_coretype(argv);
    openblas_set_num_threads(1);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("bench_forward (OPENBLAS_CORETYPE=%s; OpenBLAS reports core %s; batch-1 ratios are against the "
           "invariant kernel on 1 thread)\n", ct ? ct : "(unset)", openblas_get_corename());
    bench_shape("stories15M", 8);
    bench_shape("stories110M", 2);
    return 0;
}
