/* make bench: what the GGUF architectures cost against the plain Llama 2
 * forward. The same stories15M-sized random weights (288 wide, 6 layers,
 * 6 heads, vocabulary 32000) as a llama2.c checkpoint (the baseline), and
 * as GGUF llama, Llama 3 (RoPE frequency divisors) and qwen2 (Q/K/V
 * biases, NEOX RoPE) files written by the GGUF writer; decode steps of 8
 * sequences and a 128-token prefill, models measured in turn within each
 * sample so the ratios are paired. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/synth.h"
#include "support/timing.h"

#define N_MODELS 4
#define BATCH 8
#define PROMPT 16
#define DECODE_STEPS 48
#define PREFILL 128
#define MAX_POS (PREFILL + 8)
#define SAMPLES 9
#define VOCAB_FILE "llama.cpp-vocab/ggml-vocab-llama-spm.gguf"

static const char *const NAMES[N_MODELS] = {"llama2.c", "gguf llama", "gguf llama3", "gguf qwen2"};

static void die(const char *what, const tp_err *e)
{
    fprintf(stderr, "bench_arch: %s: %s\n", what, e->msg);
    exit(1);
}

static double decode(tp_forward *f, float *logits, int vocab)
{
    int seq[BATCH], toks[BATCH][PROMPT];
    tp_fwd_item it[BATCH];
    tp_err e;
    for (int b = 0; b < BATCH; b++) {
        if (tp_forward_seq_open(f, &seq[b], &e))
            die("seq_open", &e);
        for (int i = 0; i < PROMPT; i++)
            toks[b][i] = (b * 131 + i * 17) % vocab;
        it[b] = (tp_fwd_item){seq[b], 0, toks[b], PROMPT, false};
    }
    if (tp_forward_step(f, it, BATCH, logits, &e))
        die("prefill", &e);
    double t0 = bench_now();
    for (int s = 0; s < DECODE_STEPS; s++) {
        for (int b = 0; b < BATCH; b++)
            it[b] = (tp_fwd_item){seq[b], PROMPT + s, &toks[b][s % PROMPT], 1, false};
        if (tp_forward_step(f, it, BATCH, logits, &e))
            die("decode", &e);
    }
    double dt = bench_now() - t0;
    for (int b = 0; b < BATCH; b++)
        tp_forward_seq_close(f, seq[b]);
    return BATCH * DECODE_STEPS / dt;
}

static double prefill(tp_forward *f, float *logits, int vocab)
{
    int seq, toks[PREFILL];
    tp_err e;
    for (int i = 0; i < PREFILL; i++)
        toks[i] = (i * 29 + 3) % vocab;
    if (tp_forward_seq_open(f, &seq, &e))
        die("seq_open", &e);
    tp_fwd_item it = {seq, 0, toks, PREFILL, false};
    double t0 = bench_now();
    if (tp_forward_step(f, &it, 1, logits, &e))
        die("prefill", &e);
    double dt = bench_now() - t0;
    tp_forward_seq_close(f, seq);
    return PREFILL / dt;
}

int main(void)
{
    const char *models = getenv("TP_MODELS");
    char vocab_path[1024], dir[] = "/tmp/tp_bench_arch.XXXXXX", path[N_MODELS][1100];
    snprintf(vocab_path, sizeof vocab_path, "%s/%s", models ? models : "../shared/models", VOCAB_FILE);
    if (!mkdtemp(dir)) {
        perror("bench_arch: mkdtemp");
        return 1;
    }
    tp_synth_shape s;
    tp_err e;
    if (tp_synth_parse_shape("stories15M", &s, &e))
        die("shape", &e);
    s.seq_len = MAX_POS;
    snprintf(path[0], sizeof path[0], "%s/llama2c.bin", dir);
    FILE *fp = fopen(path[0], "wb");
    if (!fp || tp_synth_write_model(fp, &s, 1, NULL, NULL, &e) || fclose(fp))
        die("llama2.c model", &e);
    const char *arch[N_MODELS] = {NULL, "llama", "llama3", "qwen2"};
    for (int m = 1; m < N_MODELS; m++) {
        snprintf(path[m], sizeof path[m], "%s/%s.gguf", dir, arch[m]);
        tp_synth_gguf o = {.arch = arch[m], .vocab_from = vocab_path};
        if (tp_synth_write_gguf(path[m], &s, 1, &o, &e))
            die(arch[m], &e);
    }
    tp_model *model[N_MODELS];
    tp_forward *fwd[N_MODELS];
    for (int m = 0; m < N_MODELS; m++) {
        if (tp_model_load(path[m], &model[m], &e) ||
            tp_forward_new(model[m], BATCH, MAX_POS, PREFILL, &fwd[m], &e))
            die(path[m], &e);
        unlink(path[m]);
    }
    rmdir(dir);
    float *logits = malloc(sizeof(float) * BATCH * (size_t)s.vocab_size);
    if (!logits)
        return 1;
    double dec[N_MODELS][SAMPLES], pre[N_MODELS][SAMPLES];
    for (int k = 0; k < SAMPLES; k++)
        for (int m = 0; m < N_MODELS; m++) {
            dec[m][k] = decode(fwd[m], logits, s.vocab_size);
            pre[m][k] = prefill(fwd[m], logits, s.vocab_size);
        }
    printf("stories15M shape, vocabulary %d, invariant kernel, 1 thread, median of %d (ratios: median of "
           "each sample's ratio to its own llama2.c run)\n", s.vocab_size, SAMPLES);
    for (int m = 0; m < N_MODELS; m++) {
        double rd[SAMPLES], rp[SAMPLES]; /* paired: this sample's llama2.c run is the baseline */
        for (int k = 0; k < SAMPLES; k++) {
            rd[k] = dec[m][k] / dec[0][k];
            rp[k] = pre[m][k] / pre[0][k];
        }
        double d = bench_median(dec[m], SAMPLES), p = bench_median(pre[m], SAMPLES);
        printf("  %-12s decode %d seqs %8.1f tok/s (%.2fx llama2.c)   prefill %d %8.1f tok/s (%.2fx)\n", NAMES[m],
               BATCH, d, bench_median(rd, SAMPLES), PREFILL, p, bench_median(rp, SAMPLES));
        tp_forward_free(fwd[m]);
        tp_model_free(model[m]);
    }
    free(logits);
    return 0;
}
