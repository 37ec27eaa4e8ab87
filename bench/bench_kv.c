/* make bench: KV cache bytes a sequence holds per position of context at
 * 4k context (tp_fwd_kv_stats), against the same model keeping every
 * position of every layer.
 *
 * gemma3: Gemma 3 1B's KV geometry (26 blocks, five of six sliding with a
 * window of 512, one KV head of 256, RoPE bases 1e6 / 10000) on a narrow
 * random model (dim 128, one query head: the KV does not depend on them),
 * against the same weights with a window of 4096, the whole context (no
 * block then lets anything go). qwen35: 24 blocks, 18 Gated DeltaNet,
 * against a dense qwen3 of the same shape. The files are what
 * `tokpipe mkmodel --format gguf --arch gemma3 --shape 128x26x1x1 --head-dim
 * 256 --sliding-window 512 --seq-len 4096 ...` writes (the same writer).
 * One sequence, the prompt prefilled in chunks of 512 (max_batch_tokens,
 * as the default config), then 16 decode steps; the held bytes are read
 * after the last step, at CONTEXT positions. f32 KV; f16 halves every
 * figure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/synth.h"
#include "support/timing.h"

#define CONTEXT 4096
#define CHUNK 512
#define DECODE 16
#define VOCAB_FILE "llama.cpp-vocab/ggml-vocab-llama-spm.gguf"

typedef struct kv_model {
    const char *label, *shape;
    tp_synth_gguf o;
} kv_model;

static void die(const char *what, const tp_err *e)
{
    fprintf(stderr, "bench_kv: %s: %s\n", what, e->msg);
    exit(1);
}

/* Held bytes at CONTEXT positions of one sequence, and the whole pool. */
static void measure(const kv_model *km, const char *dir, const char *vocab, size_t *held, size_t *pool, double *secs)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    tp_synth_shape s;
    tp_err e;
    if (tp_synth_parse_shape(km->shape, &s, &e))
        die("shape", &e);
    s.seq_len = CONTEXT;
    tp_synth_gguf o = km->o;
    o.vocab_from = vocab;
    tp_model *m;
    tp_forward *f;
    if (tp_synth_write_gguf(path, &s, 1, &o, &e) || tp_model_load(path, &m, &e) ||
        tp_forward_new(m, 1, CONTEXT, CHUNK, &f, &e))
        die(km->label, &e);
    unlink(path);
    int V = tp_model_get_config(m)->vocab_size, seq, *toks = malloc(sizeof(int) * CONTEXT);
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (!toks || !logits)
        exit(1);
    for (int i = 0; i < CONTEXT; i++)
        toks[i] = 1 + (i * 7919 + 13) % (V - 1);
    double t0 = bench_now();
    if (tp_forward_seq_open(f, &seq, &e))
        die("seq_open", &e);
    int pos = 0;
    while (pos < CONTEXT - DECODE) {
        int n = CONTEXT - DECODE - pos < CHUNK ? CONTEXT - DECODE - pos : CHUNK;
        tp_fwd_item it = {seq, pos, toks + pos, n, pos + n < CONTEXT - DECODE};
        if (tp_forward_step(f, &it, 1, logits, &e))
            die("prefill", &e);
        pos += n;
    }
    for (; pos < CONTEXT; pos++) {
        tp_fwd_item it = {seq, pos, toks + pos, 1, false};
        if (tp_forward_step(f, &it, 1, logits, &e))
            die("decode", &e);
    }
    *secs = bench_now() - t0;
    tp_fwd_kv_stats st;
    tp_forward_kv_stats(f, &st);
    *held = tp_forward_seq_kv_bytes(f, seq);
    *pool = st.pool_bytes;
    if (st.held_bytes != *held) /* one sequence: all that is held */
        fprintf(stderr, "bench_kv: %s: the forward holds %zu bytes, the sequence %zu\n", km->label,
                st.held_bytes, *held);
    free(toks);
    free(logits);
    tp_forward_free(f);
    tp_model_free(m);
}

int main(void)
{
    const char *models = getenv("TP_MODELS");
    char vocab[1024], dir[] = "/tmp/tp_bench_kv.XXXXXX";
    snprintf(vocab, sizeof vocab, "%s/%s", models ? models : "../shared/models", VOCAB_FILE);
    if (!mkdtemp(dir)) {
        perror("bench_kv: mkdtemp");
        return 1;
    }
    /* pairs: the model, then its baseline */
    const kv_model km[4] = {
        {"gemma3 window 512", "128x26x1x1", {.arch = "gemma3", .head_dim = 256, .sliding_window = 512}},
        {"gemma3 no window", "128x26x1x1", {.arch = "gemma3", .head_dim = 256, .sliding_window = CONTEXT}},
        {"qwen35 (18 of 24 DeltaNet)", "128x24x1x1", {.arch = "qwen35", .head_dim = 128}},
        {"qwen3 dense", "128x24x1x1", {.arch = "qwen3", .head_dim = 128}},
    };
    printf("KV bytes a sequence holds per position of context at %d positions (f32 KV; prefill in chunks of "
           "%d, then %d decode steps)\n", CONTEXT, CHUNK, DECODE);
    for (int p = 0; p < 4; p += 2) {
        size_t held[2], pool[2];
        double secs[2];
        for (int k = 0; k < 2; k++)
            measure(&km[p + k], dir, vocab, &held[k], &pool[k], &secs[k]);
        for (int k = 0; k < 2; k++)
            printf("  %-28s %9.1f bytes/position (%6.2f MB held, pool %7.2f MB mapped, %.1f s)\n",
                   km[p + k].label, (double)held[k] / CONTEXT, (double)held[k] / 1e6, (double)pool[k] / 1e6,
                   secs[k]);
        printf("  %-28s %9.3fx the baseline's bytes\n", "", (double)held[0] / (double)held[1]);
    }
    rmdir(dir);
    return 0;
}
