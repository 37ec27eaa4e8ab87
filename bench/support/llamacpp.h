/* llama.cpp as a paired baseline for the decode and prefill benches, built the way its
 * authors build it: its own llama-bench, compiled from source with cmake
 * (Release, GGML_NATIVE=ON: -O3 -march=native), so that on any thread
 * count it runs with llama.cpp's own thread pool and defaults. The source
 * is the git bundle that the pinned npm package node-llama-cpp ships
 * (llama/gitRelease.bundle): fetched once with `npm pack`, built once into
 * $TP_BUILD_DIR/llamacpp/COMMIT (build/llamacpp), then reused. Both programs
 * read the same GGUF file. */
#ifndef BENCH_SUPPORT_LLAMACPP_H
#define BENCH_SUPPORT_LLAMACPP_H

/* The npm package holding the source, pinned so that figures compare
 * across runs; the build's flags, as the benches print them. */
#define BENCH_LLAMACPP_NPM "node-llama-cpp@3.22.1"
#define BENCH_LLAMACPP_CMAKE "-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON"

typedef struct bench_llamacpp {
    char bench[4200]; /* the llama-bench built */
    char batched[4200]; /* the llama-batched-bench built beside it */
    char greedy[4200];  /* bench/oracle/llamacpp_greedy built against it */
    char commit[41];  /* llama.cpp's commit, from the bundle */
    char build[512];  /* how it was built, as the benches print it */
    char why[1024];   /* why not available, or why a run failed */
} bench_llamacpp;

/* 0 when llama-bench can run here (fetching and building it if it is not
 * yet: minutes, once), else -1 with lc->why. $TP_LLAMACPP=0 turns it off.
 * $TP_LLAMA_BENCH names a llama-bench built elsewhere instead, for a
 * machine with no compiler (scripts/device-bench.sh carries one):
 * $TP_LLAMA_COMMIT and $TP_LLAMA_BUILD say what it is, for the printout. */
int bench_llamacpp_open(bench_llamacpp *lc);

/* llama.cpp's tokens per second for one sequence on threads threads, as
 * llama-bench measures it: tokens decode steps (batch 1, logits of each)
 * after a depth-token context, neither model load nor the context timed.
 * One llama-bench run, one sample. Negative with lc->why on failure. */
double bench_llamacpp_decode(bench_llamacpp *lc, const char *gguf, int threads, int depth, int tokens);

/* The same for a tokens-token prompt processed at once (llama-bench's pp
 * test, one batch as its default -b allows): tokens over its time. */
double bench_llamacpp_prefill(bench_llamacpp *lc, const char *gguf, int threads, int tokens);

/* llama.cpp's decode tokens per second over seqs sequences decoding at once
 * (llama-batched-bench's S_TG: each sequence a prompt-token prompt, then
 * tokens steps of one token each, all sequences in every step). */
double bench_llamacpp_batched(bench_llamacpp *lc, const char *gguf, int threads, int seqs, int prompt, int tokens);

/* Build the greedy oracle src (bench/oracle/llamacpp_greedy.c) against the
 * llama.cpp lc opened (its headers and libllama): 0, or -1 with lc->why. */
int bench_llamacpp_oracle_open(bench_llamacpp *lc, const char *src);

/* llama.cpp's greedy continuation of the n-token prompt ids: steps argmax
 * ids, their log-probabilities and their logits' lead over the runner-up
 * (F32 KV cache). 0, or -1 with lc->why. */
int bench_llamacpp_greedy(bench_llamacpp *lc, const char *gguf, const int *ids, int n, int steps, int *out_ids,
                          double *out_lp, double *out_lead);

#endif
