/* Speculative decoding: what to guess and how much of it to verify.
 *
 * A guess costs nothing to exactness: the forward stage computes the job's
 * next token and the k guessed ones in one verify step (tp_fwd_item's
 * all_logits), the sampler samples each position exactly as it would
 * without speculation (same logits bits, same processing, same random draw
 * for that position) and keeps positions while the sampled token equals
 * the guess, plus the first one that differs; the rest is rolled back
 * (tp_forward_seq_truncate). Tokens, text, logprobs and finish are thus
 * the same with speculation on or off; only the number of steps changes.
 *
 * This module holds the guesser (prompt lookup: an n-gram of the job's own
 * tokens) and the per-job controller that picks k: it grows while guesses
 * are accepted, shrinks to what was accepted, and pauses a job whose
 * guesses keep failing (so a workload where nothing is accepted pays
 * almost nothing), and no job speculates in a step that is already
 * compute-bound (a large batch). */
#ifndef TOKPIPE_SPEC_H
#define TOKPIPE_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"

#define TP_SPEC_MAX_DRAFT 16      /* n_max's ceiling: guesses per verify step */
#define TP_SPEC_DEFAULT_N_MAX 8   /* n_max when a job or the config names none */
#define TP_SPEC_NGRAM_MIN 2       /* the shortest n-gram that proposes a guess */
#define TP_SPEC_NGRAM_MAX 8       /* longer matches are not looked for */
#define TP_SPEC_BATCH_MAX 8       /* decoding jobs in a step beyond which nobody speculates */
#define TP_SPEC_PAUSE_MIN 4       /* steps a failing job waits before guessing again... */
#define TP_SPEC_PAUSE_MAX 64      /* ...doubling after each failed try up to this */

typedef enum tp_spec_mode { TP_SPEC_OFF = 0, TP_SPEC_NGRAM = 1, TP_SPEC_DRAFT = 2 } tp_spec_mode;

/* "off", "ngram", "draft", and back; TP_EINVAL naming a bad name. */
const char *tp_spec_mode_name(tp_spec_mode m);
int tp_spec_mode_parse(const char *name, tp_spec_mode *out, tp_err *err);

/* Prompt lookup. ids[0, n) are the job's tokens (prompt, then output).
 * Finds the longest suffix of them, TP_SPEC_NGRAM_MIN..TP_SPEC_NGRAM_MAX
 * tokens, that also occurs earlier (the most recent such occurrence on a
 * tie) and writes what followed that occurrence into out[0, max_out),
 * continuing periodically when the match runs into the suffix itself (a
 * repeated phrase repeats). Returns the number written: 0 when nothing
 * matches. O(n * TP_SPEC_NGRAM_MAX), no allocation. */
size_t tp_ngram_guess(const int32_t *ids, size_t n, size_t max_out, int32_t *out);

/* One job's controller (a plain value: the caller embeds it). */
typedef struct tp_spec {
    int n_max;         /* 1..TP_SPEC_MAX_DRAFT; 0 = off */
    int k;             /* guesses asked for next time */
    int wait;          /* steps left before the next try (a paused job) */
    int pause;         /* the next pause's length */
    uint64_t drafted;  /* guesses verified */
    uint64_t accepted; /* of those, accepted */
    uint64_t verifies; /* verify steps */
} tp_spec;

/* n_max 0 (or a mode of off) leaves it off: tp_spec_want is always 0. */
void tp_spec_init(tp_spec *s, int n_max);

/* How many guesses to ask for in this step (0: a plain decode step), at
 * most room (what the job may still generate, minus the step's own token,
 * and what its KV slot and the step's budget hold). batch_decoding: the
 * jobs decoding in this step; past TP_SPEC_BATCH_MAX the step is
 * compute-bound and nobody speculates. Counts down a paused job's wait. */
int tp_spec_want(tp_spec *s, int batch_decoding, int room);

/* The outcome of a verify step: drafted guesses were sent, the first
 * accepted of them matched (0..drafted). Adapts k and pauses. */
void tp_spec_result(tp_spec *s, int drafted, int accepted);

#endif
