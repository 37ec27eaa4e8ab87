/* Synthetic llama2.c checkpoints and tokenizers of real model shapes, with
 * seeded random weights, for benchmarks (speed does not depend on weight
 * values). Used by `tokpipe mkmodel` and bench/bench_forward.c. */
#ifndef TOKPIPE_SYNTH_H
#define TOKPIPE_SYNTH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tokpipe/error.h"

typedef struct tp_synth_shape {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
} tp_synth_shape;

/* Parse a shape: "stories15M" (288, 768, 6 layers, 6/6 heads, 32000, 256),
 * "stories42M" (512, 1376, 8, 8/8, 32000, 1024), "stories110M" (768, 2048,
 * 12, 12/12, 32000, 1024), "stories260K" (64, 172, 5, 8/4, 512, 512), or
 * DIMxLAYERS[xHEADS[xKV_HEADS]]: hidden = llama2.c's rule (2/3 of 4*dim,
 * rounded up to a multiple of 32), heads default to dim/64 (or dim/48 when
 * 64 does not divide dim, else 1), kv_heads to heads, vocab 32000, seq_len
 * 1024. Errors name what is wrong. */
int tp_synth_parse_shape(const char *spec, tp_synth_shape *out, tp_err *err);

/* Bytes of the llama2.c v0 checkpoint for shape s (shared classifier). */
uint64_t tp_synth_model_bytes(const tp_synth_shape *s);

/* Progress callback: bytes written so far of total. */
typedef void (*tp_synth_progress)(uint64_t done, uint64_t total, void *ctx);

/* Write a checkpoint of shape s to fp: weights uniform in +-0.5/sqrt(fan
 * in) from a xorshift generator seeded with seed, RMSNorm weights 1. */
int tp_synth_write_model(FILE *fp, const tp_synth_shape *s, uint64_t seed, tp_synth_progress progress,
                         void *ctx, tp_err *err);

/* The same checkpoint in a malloc'ed buffer (caller frees *buf). */
int tp_synth_build_model(const tp_synth_shape *s, uint64_t seed, void **buf, size_t *size, tp_err *err);

/* A llama2.c tokenizer.bin of vocab_size tokens: <unk>, "\n<s>\n",
 * "\n</s>\n", the 256 byte tokens <0x00>..<0xFF>, then distinct pieces
 * (printable characters, then space-led letter strings) with scores
 * decreasing with id. vocab_size must be at least 259 + 95. */
int tp_synth_write_tokenizer(FILE *fp, int vocab_size, tp_err *err);

/* A random-weight GGUF model (F32 tensors, llama.cpp's names and keys). */
typedef struct tp_synth_gguf {
    const char *arch;        /* an architecture of model/archs.c ("llama":
                              * Llama 2 RoPE, base 10000; "qwen2": Q/K/V
                              * biases, NEOX RoPE, base 1e6; "qwen3": Q/K
                              * norms, base 1e6, ...; "gemma3": base 1e6, local
                              * 10000, window 512) or "llama3"
                              * (general.architecture llama, base 500000,
                              * llama3 RoPE scaling: factor 8, low 1, high 4,
                              * original context 8192) */
    const char *vocab_from;  /* GGUF whose tokenizer.* metadata is copied; its
                              * token count is the vocabulary size (required) */
    bool separate_output;    /* write output.weight (else tied to token_embd) */
    bool rope_scaling_keys;  /* llama3: write llama.rope.scaling.* keys instead
                              * of llama.cpp's rope_freqs.weight tensor */
    int head_dim;            /* 0: dim / n_heads; else the head size, written as
                              * attention.key_length (architectures that read
                              * it: qwen3, gemma2, gemma3) */
    int sliding_window;      /* gemma2, gemma3: attention.sliding_window; 0: the
                              * architecture's typical one (gemma3 512, gemma2 4096) */
    /* experts: 0 gives the architecture's kind (dense, or qwen3moe's and
     * "mixtral"'s (llama with llama.expert_count) 8 experts, 2 used, of
     * the shape's hidden width each); n_expert > 0 on llama writes Mixtral */
    int n_expert, n_expert_used, expert_ff;
    int pooling;             /* > 0: {arch}.pooling_type (TP_POOL_* of model.h), as an
                              * embedding model's converted GGUF says it (Qwen3-Embedding: 3, last) */
    int shexp_ff;            /* qwen35moe: the shared expert's width
                              * (expert_shared_feed_forward_length); 0: expert_ff */
    int rope_dim;            /* partial RoPE (qwen35, phi3): rope.dimension_count;
                              * 0: the architecture's (qwen35 a quarter of a head) */
    float rope_linear;       /* > 1: rope.scaling.type linear with this factor (Gemma 3
                              * 4B-27B: 8, on the global layers only) */
    int longrope_orig;       /* phi3: > 0 writes LongRoPE as Phi-3.5 / Phi-4-mini's
                              * converted files carry it: rope_factors_long / _short,
                              * original_context_length this, attn_factor from it */
} tp_synth_gguf;

/* Write the model of shape s (its vocab_size is ignored) to path: matrix
 * weights uniform in +-0.5/sqrt(fan in), norm weights 1 +- 0.25, biases
 * +-0.5, all from a generator seeded with seed. Errors name what is wrong. */
int tp_synth_write_gguf(const char *path, const tp_synth_shape *s, uint64_t seed, const tp_synth_gguf *o,
                        tp_err *err);

#endif
