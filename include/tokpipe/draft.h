/* Speculative decoding's draft model: a small model with the target's
 * vocabulary proposes the next k tokens of many jobs at once, greedily.
 *
 * The guesses cost nothing to exactness (spec.h): the target verifies
 * them and keeps only those equal to what it samples, so a draft model
 * changes the speed alone. It keeps, per job, a sequence of its own in a
 * tp_forward over the draft model (the KV of the job's tokens), which the
 * caller feeds incrementally: each call says up to which position the
 * sequence is still the job's (the rest, its own guesses that were not
 * taken, is rolled back) and gives the tokens after it.
 *
 * Greedy: guess i + 1 is the argmax (lowest id on a tie) of the draft's
 * logits after guess i; the guesses of all items of a call advance
 * together, one batched forward step per guess, so k guesses of n jobs
 * cost k steps of n rows, not n * k. */
#ifndef TOKPIPE_DRAFT_H
#define TOKPIPE_DRAFT_H

#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/forward.h"

/* One job's share of a call. */
typedef struct tp_draft_item {
    int seq_id;             /* an open sequence of the drafter's tp_forward */
    int pos;                /* its first pos positions are the job's: the rest is dropped */
    const int32_t *tokens;  /* n_tokens >= 1 ids fed at pos: the job's tokens after them */
    int n_tokens;
    int k;                  /* guesses wanted, 1..TP_SPEC_MAX_DRAFT */
} tp_draft_item;

/* Propose for n items on f (the draft model's tp_forward; f's step budget
 * splits a long feed into chunks). Item i's guesses go to
 * guesses[i * TP_SPEC_MAX_DRAFT ...], their number to ngot[i]: k, or 0 for
 * an item that cannot be served (pos past the sequence's length, or the
 * sequence's room at its slot too small for its tokens and k - 1 guesses:
 * such an item is left as it was). After the call each served sequence
 * holds pos + n_tokens + k - 1 positions (the last guess is never fed).
 * Errors of the step itself (out of memory) fail the call with err. */
int tp_draft_propose(tp_forward *f, const tp_draft_item *items, int n, int32_t *guesses, int *ngot, tp_err *err);

/* The refusal of a draft model whose vocabulary is not the target's
 * (draft_vocab != target_vocab): TP_EINVAL naming both sizes and what
 * (e.g. the draft model's path), else 0. */
int tp_draft_vocab_check(int target_vocab, int draft_vocab, const char *what, tp_err *err);

/* Whether draft may draft for a target of target_vocab tokens: its
 * vocabulary (tp_draft_vocab_check), and not a hybrid model (its
 * recurrent state cannot roll back the guesses not taken): TP_EINVAL
 * naming what, else 0. */
int tp_draft_check(int target_vocab, const tp_model *draft, const char *what, tp_err *err);

#endif
