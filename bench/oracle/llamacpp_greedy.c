/* llama.cpp as the oracle of a forward pass: greedy decoding through its C
 * API (llama.h), for bench_oracle. Built at bench time against the
 * llama.cpp that support/llamacpp.c builds (not part of tokpipe's build).
 *
 *   llamacpp_greedy MODEL.gguf STEPS ID,ID,...   (the prompt's token ids)
 *
 * prints one line per step: the argmax id, its log-probability (the logit
 * minus the log-sum-exp of the row, in double) and its lead over the
 * runner-up's logit (a near tie explains a different argmax), after the prompt in
 * one batch and then one token at a time. The KV cache is F32 (llama.cpp's
 * default F16 would round what tokpipe keeps exactly); no sampler. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: llamacpp_greedy MODEL.gguf STEPS ID,ID,...\n");
        return 2;
    }
    int steps = atoi(argv[2]), n = 0, cap = 1;
    for (const char *p = argv[3]; *p; p++)
        cap += *p == ',';
    llama_token *toks = malloc(sizeof *toks * (size_t)cap);
    for (char *p = argv[3]; *p;) {
        toks[n++] = (llama_token)strtol(p, &p, 10);
        if (*p == ',')
            p++;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llamacpp_greedy: cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + steps + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)(n + 1);
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.n_threads = cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llamacpp_greedy: cannot make a context\n");
        return 1;
    }
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_get_one(toks, n);
    for (int s = 0; s < steps; s++) {
        if (llama_decode(ctx, b)) {
            fprintf(stderr, "llamacpp_greedy: llama_decode failed at step %d\n", s);
            return 1;
        }
        const float *l = llama_get_logits_ith(ctx, -1);
        int best = 0, second = -1;
        for (int i = 1; i < nv; i++)
            if (l[i] > l[best]) {
                second = best;
                best = i;
            } else if (second < 0 || l[i] > l[second]) {
                second = i;
            }
        double sum = 0;
        for (int i = 0; i < nv; i++)
            sum += exp((double)l[i] - (double)l[best]);
        printf("%d %.9g %.9g\n", best, -log(sum), (double)l[best] - (double)l[second]);
        toks[0] = best;
        b = llama_batch_get_one(toks, 1);
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
