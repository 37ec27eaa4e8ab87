/* make bench: llama.cpp as the oracle of every architecture (issues 33 and
 * 38: "greedy ids and per-token logprobs equal llama.cpp's on files it
 * loads"). Per architecture a small random-weight GGUF written by
 * `tokpipe mkmodel --arch A` (Llama 2 vocabulary), converted by `tokpipe
 * quantize`; a prompt of PROMPT tokens (more than twice the sliding window
 * where there is one) then STEPS greedy steps, by tokpipe's forward pass in
 * process and by llama.cpp through its C API (bench/oracle/
 * llamacpp_greedy.c, built against the llama.cpp support/llamacpp.h
 * builds; F32 KV cache on both sides), tokpipe fed llama.cpp's ids so
 * that both see the same context at every step. F32 must agree to the
 * token with logprobs within float rounding; quantized types to the token,
 * but for near ties (random weights make some: the two programs round
 * differently, so an argmax whose lead is under their logprob difference
 * may flip, and is reported as such). The suite's
 * own oracle, which CI runs, is the float64 reference of
 * tests/arch_ref_test.py; this is the comparison with the program people
 * use. Exit status 1 when a file's ids differ. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "support/decode.h"
#include "support/llamacpp.h"
#include "support/mkgguf.h"
#include "support/timing.h"

#define PROMPT 100
#define STEPS 32
#define WINDOW "32"
#define VOCAB_FILE "llama.cpp-vocab/ggml-vocab-llama-spm.gguf"

typedef struct ocase {
    const char *arch, *shape, *flags, *types;
} ocase;

static const ocase CASES[] = {
    {"llama", "256x4x4x2", "", "F32,Q8_0,Q4_K_M"},
    {"qwen2", "256x4x4x2", "", "F32,Q8_0"},
    {"qwen3", "256x4x4x2", "--head-dim 64", "F32,Q8_0,Q4_K_M"},
    {"phi3", "256x4", "--longrope 64 --rope-dim 48", "F32,Q8_0,Q4_K_M"}, /* Phi-3.5 / Phi-4-mini */
    {"gemma3", "256x6x4x2", "--sliding-window " WINDOW " --rope-linear 8", "F32,Q8_0,Q4_K_M"}, /* 4B-27B */
    {"gemma2", "256x4x4x2", "--sliding-window " WINDOW, "F32,Q8_0"},
    {"mixtral", "256x4", "--experts 4 --experts-used 2", "F32,Q8_0,Q4_K_M"},
    {"qwen3moe", "256x4x4x2", "--experts 8 --experts-used 2 --expert-ff 256", "F32,Q8_0,Q4_K_M"},
    {"qwen35", "256x4x4x2", "", "F32,Q8_0,Q4_K_M"},
    {"qwen35moe", "256x4x4x2", "--experts 8 --experts-used 2 --expert-ff 256 --shared-ff 256", "F32,Q8_0"},
    {"gpt-oss", "256x4x4x2", "--experts 8 --experts-used 4 --expert-ff 256 --sliding-window " WINDOW,
     "F32,Q8_0,MXFP4_MOE"},
};
#define NCASES (sizeof CASES / sizeof CASES[0])

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_oracle: %s: %s\n", what, msg);
    exit(1);
}

/* tokpipe along llama.cpp's path: after the prompt it is fed llama.cpp's
 * greedy ids (want), so that every step compares the same context even
 * past a step where the two argmaxes differ. Per step: tokpipe's argmax
 * (ids), the log-probability tokpipe gives want's token (lp, computed as
 * llamacpp_greedy does) and how far tokpipe's own choice leads it (lead:
 * 0 where they agree; a near tie where both programs' rounding can flip
 * the order). */
static void tokpipe_along(const char *path, const int *prompt, const int *want, int *ids, double *lp, double *lead)
{
    tp_model *m;
    tp_forward *f;
    tp_err e;
    if (tp_model_load(path, &m, &e) || tp_forward_new(m, 1, PROMPT + STEPS + 16, PROMPT, &f, &e))
        die(path, e.msg);
    int nv = tp_model_get_config(m)->vocab_size, sid;
    float *l = malloc(sizeof(float) * (size_t)nv);
    if (!l || tp_forward_seq_open(f, &sid, &e))
        die(path, "out of memory");
    tp_fwd_item it = {sid, 0, prompt, PROMPT, false};
    for (int s = 0; s < STEPS; s++) {
        if (tp_forward_step(f, &it, 1, l, &e))
            die(path, e.msg);
        int best = 0;
        for (int i = 1; i < nv; i++)
            if (l[i] > l[best])
                best = i;
        double sum = 0;
        for (int i = 0; i < nv; i++)
            sum += exp((double)l[i] - (double)l[best]);
        ids[s] = best;
        lp[s] = (double)l[want[s]] - (double)l[best] - log(sum);
        lead[s] = (double)l[best] - (double)l[want[s]];
        it = (tp_fwd_item){sid, PROMPT + s, &want[s], 1, false};
    }
    free(l);
    tp_forward_free(f);
    tp_model_free(m);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--help")) {
        printf("usage: bench_oracle   (needs $BIN/tokpipe, $TP_MODELS/" VOCAB_FILE " and llama.cpp)\n"
               "  greedy ids and logprobs of tokpipe and llama.cpp on the same random-weight file, per\n"
               "  architecture and type; $TP_BENCH_MODELS=a,b picks architectures.\n");
        return 0;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *bin = getenv("BIN"), *models = getenv("TP_MODELS"), *pick = getenv("TP_BENCH_MODELS");
    bin = bin ? bin : "bin";
    char vocab[1024], dir[] = "/tmp/tp-bench-oracle-XXXXXX", src[700];
    snprintf(vocab, sizeof vocab, "%s/" VOCAB_FILE, models ? models : "../shared/models");
    bench_llamacpp lc;
    memset(&lc, 0, sizeof lc);
    if (access(vocab, R_OK)) {
        printf("bench_oracle: skipped: no %s (the vocabulary llama.cpp's files need)\n", vocab);
        return 0;
    }
    if (bench_llamacpp_open(&lc) || bench_llamacpp_oracle_open(&lc, "bench/oracle/llamacpp_greedy.c")) {
        printf("bench_oracle: skipped: llama.cpp unavailable: %s\n", lc.why);
        return 0;
    }
    if (!mkdtemp(dir))
        die("mkdtemp", "failed");
    printf("bench_oracle: tokpipe against llama.cpp %.7s through its C API, random weights, Llama 2 vocabulary;\n"
           "  a %d-token prompt (sliding windows of " WINDOW "), %d greedy steps, F32 KV cache\n",
           lc.commit, PROMPT, STEPS);
    int prompt[PROMPT], bad = 0;
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = bench_tok_of(i, 32000);
    prompt[0] = 1;
    for (size_t k = 0; k < NCASES; k++) {
        const ocase *c = &CASES[k];
        if (pick && !bench_list_has(pick, c->arch))
            continue;
        snprintf(src, sizeof src, "%s/%s.gguf", dir, c->arch);
        bench_mkgguf(bin, c->arch, vocab, c->shape, c->flags, "--seq-len 512 --seed 7", src);
        char types[64];
        snprintf(types, sizeof types, "%s", c->types);
        for (char *t = strtok(types, ","); t; t = strtok(NULL, ",")) {
            char path[800];
            snprintf(path, sizeof path, "%s/%s-%s.gguf", dir, c->arch, t);
            bench_quantize(bin, src, t, path);
            int a[STEPS], b[STEPS];
            double la[STEPS], lb[STEPS], lead[STEPS], gb[STEPS];
            if (bench_llamacpp_greedy(&lc, path, prompt, PROMPT, STEPS, b, lb, gb)) {
                printf("  %-10s %-9s llama.cpp failed: %s\n", c->arch, t, lc.why);
                bad = 1;
                remove(path);
                continue;
            }
            tokpipe_along(path, prompt, b, a, la, lead);
            int same = 0, worst_at = -1;
            double dlp = 0, tie = 0;
            for (int k = 0; k < STEPS; k++) {
                dlp = fmax(dlp, fabs(la[k] - lb[k]));
                same += a[k] == b[k];
                if (a[k] != b[k] && lead[k] > tie)
                    tie = lead[k], worst_at = k;
            }
            /* a different argmax is a near tie when tokpipe's own choice
             * leads llama.cpp's by less than the two programs' logprobs
             * differ anywhere (their rounding, not their arithmetic) */
            bool real = worst_at >= 0 && tie > fmax(dlp, strcmp(t, "F32") ? 0 : 1e-3);
            printf("  %-10s %-9s argmax %2d/%d equal, logprobs within %.2e", c->arch, t, same, STEPS, dlp);
            if (worst_at >= 0)
                printf("; step %d: tokpipe's %d leads llama.cpp's %d (lead %.2g there) by %.2g: %s", worst_at,
                       a[worst_at], b[worst_at], gb[worst_at], tie, real ? "DIFFERENT" : "a near tie");
            printf("\n");
            bad |= real;
            remove(path);
        }
        remove(src);
    }
    rmdir(dir);
    return bad;
}
