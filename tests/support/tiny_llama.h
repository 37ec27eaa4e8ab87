/* Test support: tiny llama2.c checkpoints built in memory, and a naive
 * double-precision reference forward written from the llama2.c run.c
 * description, independent of workers/forward. */
#ifndef TP_TEST_TINY_LLAMA_H
#define TP_TEST_TINY_LLAMA_H

#include <stddef.h>

typedef struct tiny_shape {
    int dim, hidden, layers, heads, kv_heads, vocab, seq_len;
    int separate_classifier; /* write a negative vocab_size and a wcls */
} tiny_shape;

/* A llama2.c v0 checkpoint of that shape with weights uniform in
 * [-scale, scale) from a seeded generator (norm weights around 1).
 * Returns a malloc'ed buffer (caller frees) and its size. */
float *tiny_llama_build(const tiny_shape *s, unsigned seed, float scale, size_t *size);

/* Number of float slots (after the 7-int header) a checkpoint of shape s has. */
size_t tiny_llama_floats(const tiny_shape *s);

/* Reference forward over a whole token sequence from position 0: writes the
 * logits after the last token to logits[vocab]. Reads the checkpoint buffer
 * directly (its own offsets), computes in double. */
void tiny_llama_reference(const float *checkpoint, const int *tokens, int n, double *logits);

#endif
