/* The batch-invariance workload test_forward and test_quant share: eight
 * greedy sequences of different prompt lengths, decoded alone and all
 * together (joining one per step, prompts in chunks of 3), so their logits
 * can be compared bit for bit. */
#ifndef TESTS_BATCH_RUNS_H
#define TESTS_BATCH_RUNS_H

#include <stdbool.h>

#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "greedy.h"

#define NSEQ 8
#define DECODE 6

extern const int PROMPTS[NSEQ][12];
extern const int PLEN[NSEQ];

/* $TP_MODELS/name (or name itself when absolute); fails the test if it
 * does not load. */
tp_model *load_real(const char *name);

/* out[s][k] (V logits each): sequence s after its prompt (k = 0) and after
 * each of DECODE greedy steps; each sequence alone in a pool of its own. */
void run_alone(tp_model *m, float *out, int V, int threads, bool scalar, tp_kv_type kv);

/* The same rows with all NSEQ sequences in one pool: sequence s joins at
 * step s, its prompt goes in chunks of 3 (non-final chunks skip logits), so
 * most steps mix prefill chunks of some sequences with decode steps of
 * others. */
void run_batched(tp_model *m, float *out, int V, int threads, bool scalar, tp_kv_type kv);

#endif
