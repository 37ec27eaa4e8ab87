/* Batched Llama forward pass with a fixed per-sequence KV cache pool.
 *
 * One tp_forward_step() advances any mix of sequences: decode steps (one
 * token) and prompt chunks (prefill, many tokens) in the same call. All
 * tokens of the call go through one matmul per weight matrix, so each
 * weight is read once per step. Results are batch invariant: a sequence's
 * logits are bit-identical whatever else is in the call, and feeding a
 * prompt in chunks gives the same bits as feeding it at once or token by
 * token (the kernel's per-element accumulation order never depends on the
 * batch; see workers/forward/kernels.h).
 *
 * Why not OpenBLAS (measured here, OpenBLAS 0.3.21): sgemm gives a row
 * different bits depending on how many rows are in the call, and sgemv
 * differs from sgemm, so a sequence's tokens would depend on its batch
 * mates. The matmuls use a packed AVX-512 kernel instead (equal to fmaf()
 * over k in order; scalar fallback without AVX-512), which also streams
 * weights faster than sgemv at batch 1. OpenBLAS is therefore not on this
 * path and OPENBLAS_CORETYPE does not matter to it: no setenv/re-exec.
 *
 * Single-threaded by default (one compute thread per worker process; see
 * research/limits.md on thread pools collapsing on this machine), with an
 * opt-in passive second thread. A tp_forward is not thread-safe; the
 * tp_model it reads may be shared. */
#ifndef TOKPIPE_FORWARD_H
#define TOKPIPE_FORWARD_H

#include <stdbool.h>
#include <stddef.h>

#include "tokpipe/error.h"
#include "tokpipe/model.h"

typedef struct tp_forward tp_forward;

/* One sequence's share of a step. */
typedef struct tp_fwd_item {
    int seq_id;        /* from tp_forward_seq_open */
    int pos;           /* position of tokens[0]: 0..the sequence's length
                        * (less than the length rewinds: later positions are
                        * overwritten, as for a retry) */
    const int *tokens; /* n_tokens ids in [0, vocab) */
    int n_tokens;      /* >= 1 */
    bool skip_logits;  /* true: no logits (e.g. a non-final prefill chunk) */
} tp_fwd_item;

/* Pack the model's weights for the kernel and allocate the KV pool:
 * kv_slots sequences of up to max_pos positions each (0 = the model's
 * seq_len), and scratch for up to max_batch_tokens tokens per step. The
 * model must outlive the tp_forward. Memory: a copy of the weights plus
 * 2 * kv_slots * n_layers * max_pos * kv_dim floats. *out is owned by the
 * caller (tp_forward_free). */
int tp_forward_new(const tp_model *model, int kv_slots, int max_pos, int max_batch_tokens,
                   tp_forward **out, tp_err *err);

void tp_forward_free(tp_forward *f);

/* Claim a free KV slot for a new sequence (length 0). TP_EFULL if every
 * slot is in use. */
int tp_forward_seq_open(tp_forward *f, int *seq_id, tp_err *err);

/* Release a sequence's slot. TP_ENOTFOUND if seq_id is not open. */
int tp_forward_seq_close(tp_forward *f, int seq_id);

/* Current length (positions filled) of an open sequence, or -1. */
int tp_forward_seq_length(const tp_forward *f, int seq_id);

/* Advance n_items sequences (each at most once per call). logits (may be
 * NULL when every item skips them) receives, in row i, the vocab_size
 * logits after the last token of items[i]; rows of skipped items are left
 * untouched. Every item is validated before any work: an unknown or
 * repeated seq_id, a bad token id, a gap in positions, more than
 * max_batch_tokens tokens in total, or a sequence that would run past its
 * slot's max_pos (TP_EFULL) fails the whole call with a message naming the
 * item, and no sequence changes. On success each sequence's length becomes
 * pos + n_tokens. */
int tp_forward_step(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits, tp_err *err);

/* Use 1 (the default) or 2 compute threads. The second thread sleeps on a
 * condition variable (no spinning) and takes half the rows of each matmul
 * of a step with at least 8 tokens; results stay bit-identical to 1 thread.
 * Worth it only when the process may own both cores. */
int tp_forward_set_threads(tp_forward *f, int n_threads, tp_err *err);
int tp_forward_threads(const tp_forward *f);

int tp_forward_max_positions(const tp_forward *f);
int tp_forward_max_batch_tokens(const tp_forward *f);
int tp_forward_kv_slots(const tp_forward *f);
const tp_model *tp_forward_model(const tp_forward *f);

#endif
