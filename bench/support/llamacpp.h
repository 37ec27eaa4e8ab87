/* llama.cpp as a paired baseline for the decode benches: its prebuilt CPU
 * build from npm (node-llama-cpp ships the CPU backends llama.cpp's release
 * build makes, one per x86-64 level, and ggml loads the best this CPU runs),
 * installed on first use into $TP_BUILD_DIR/npm (build/npm) the way the
 * tests install the openai client, and driven by
 * bench/support/llamacpp_decode.mjs. Both programs then read the same GGUF
 * file. */
#ifndef BENCH_SUPPORT_LLAMACPP_H
#define BENCH_SUPPORT_LLAMACPP_H

#include <stdbool.h>

/* The npm packages, pinned so that figures compare across runs. */
#define BENCH_LLAMACPP_NPM "node-llama-cpp@3.22.1"
#define BENCH_LLAMACPP_NPM_CPU "@node-llama-cpp/linux-x64@3.22.1"

typedef struct bench_llamacpp {
    char modules[4200]; /* node_modules holding node-llama-cpp */
    char script[4096];
    char backend[64]; /* the CPU backend ggml loaded, once a run said */
    char why[1024];   /* why not available, or why a run failed */
} bench_llamacpp;

/* 0 when llama.cpp can run here (installing it if it is not yet), else -1
 * with lc->why. $TP_LLAMACPP=0 turns it off; $TP_LLAMACPP_SCRIPT names the
 * script (default bench/support/llamacpp_decode.mjs, from the repository
 * root, where make bench runs). */
int bench_llamacpp_open(bench_llamacpp *lc);

/* llama.cpp's tokens per second for one sequence on threads threads:
 * tokens decode steps (logits and a greedy pick each) after a prompt_len
 * prompt, wall clock. Negative with lc->why on failure. */
double bench_llamacpp_decode(bench_llamacpp *lc, const char *gguf, int threads, int prompt_len, int tokens);

#endif
