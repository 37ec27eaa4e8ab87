/* Speculative decoding's guesses at the broker (guess.c). */
#ifndef TOKPIPED_GUESS_H
#define TOKPIPED_GUESS_H

#include "state.h"

/* The speculative mode p asks for, else the config's. */
tp_spec_mode guess_mode(const tp_config *cfg, const tp_params *p);

/* At admission: the job's speculative mode and n_max, else the config's. */
void guess_init(broker *b, bjob *j);

/* How many guesses j may verify in this step: 0 unless it decodes and
 * the model and kernel verify, else its controller's k (tp_spec_want: a
 * paused job's wait counts down) within what its max_tokens, context
 * (seq_len) and the step's budget leave. For a draft job draft.c asks it
 * once per position, before the step. */
int guess_want(broker *b, bjob *j, uint32_t seq_len, uint32_t running, uint32_t budget);

/* The guesses j's decode item verifies in this step (into j->guess). */
uint32_t guess_plan(broker *b, bjob *j, uint32_t seq_len, uint32_t running, uint32_t budget);

/* Jobs decoding at forward worker wi (guess_plan's running). */
uint32_t guess_running(broker *b, int wi);

/* build_step's item n of j (its tokens end at b->cols.tokens + at) becomes
 * a verify item: the decode token, then the guesses guess_plan makes (a
 * prefill, e.g. after a lost worker, verifies nothing: guesses of a
 * dropped step are forgotten here). Returns the tokens it added. */
uint32_t guess_item(broker *b, bjob *j, uint32_t n, uint32_t at, bool prefill, uint32_t seq_len, uint32_t running,
                    uint32_t budget);

/* STOP_STEP's draft columns, for FINISH: row k of d (2 * n ints; NULL, out
 * of memory: none) gets j's guesses verified and taken so far. Returns
 * whether j speculates. */
bool guess_draft_row(int32_t *d, uint32_t n, uint32_t k, const bjob *j);

/* Puts d's k rows on s (d NULL: no job of the message speculates, none). */
void guess_draft_cols(tp_m_stop_step *s, int32_t *d, uint32_t n, uint32_t k);

/* got candidates came for j's verify item: keep the positions of the
 * guesses taken, adapt the controller, count. No-op without guesses. */
void guess_settle(broker *b, bjob *j, uint32_t got);

/* A result's rows by job: a verify item's candidates follow each other
 * (chain: a sampled result), and when they end its guesses are settled.
 * Returns the running job of the row (slot, in phase `phase` of this step,
 * as step.c's step_job), or NULL; slot UINT32_MAX settles the last. The
 * caller counts the job's rows with guess_row_seen. */
typedef struct guess_rows {
    bjob *j;
    uint32_t got;
} guess_rows;

bjob *guess_row_job(broker *b, guess_rows *rj, uint32_t slot, uint64_t step, int phase, bool chain);

/* Counts a row of rj's job j; at its first, the job's progress to stage si
 * (jobs_progress). */
void guess_row_seen(guess_rows *rj, bjob *j, int si);

/* send_sample's row k, of job j (before c->slots[k] is set): t counts the
 * rows of a verify item, which follow each other; the guess column gets
 * guess t (the token fed after row t), -1 none. Returns whether it has one. */
bool guess_sample_row(bcols *c, uint32_t k, const bjob *j, uint32_t *t);

#endif
