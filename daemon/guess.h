/* Speculative decoding's guesses at the broker (guess.c). */
#ifndef TOKPIPED_GUESS_H
#define TOKPIPED_GUESS_H

#include "state.h"

/* At admission: the job's speculative mode and n_max, else the config's. */
void guess_init(broker *b, bjob *j);

/* The guesses j's decode item verifies in this step (into j->guess). */
uint32_t guess_plan(broker *b, bjob *j, uint32_t seq_len, uint32_t running, uint32_t budget);

/* got candidates came for j's verify item: keep the positions of the
 * guesses taken, adapt the controller, count. No-op without guesses. */
void guess_settle(broker *b, bjob *j, uint32_t got);

/* A result's rows by job: a verify item's candidates follow each other
 * (chain: a sampled result), and when they end its guesses are settled.
 * Returns the running job of the row (slot, in phase `phase` of this step,
 * as step.c's step_job), or NULL; slot UINT32_MAX settles the last. The
 * caller counts the job's rows in got and sets j. */
typedef struct guess_rows {
    bjob *j;
    uint32_t got;
} guess_rows;

bjob *guess_row_job(broker *b, guess_rows *rj, uint32_t slot, uint64_t step, int phase, bool chain);

#endif
