/* Speculative decoding with a draft model, at the broker (drafting.c):
 * asking a job's draft worker for its guesses before its decode step. */
#ifndef TOKPIPED_DRAFTING_H
#define TOKPIPED_DRAFTING_H

#include "state.h"

/* DRAFT to the draft workers, one per worker, for the draft jobs about
 * to decode that have no guesses for their position yet. */
void drafting_run(broker *b);

/* Does a step at forward worker wi wait for guesses? While a job of it
 * awaits its DRAFTED, up to speculative.draft_timeout_ms. */
bool drafting_holds(broker *b, int wi);

/* DRAFTED from worker wi: the guesses its jobs verify in their next step. */
void drafting_on_result(broker *b, int wi, const tp_msg *m);

/* Draft worker wi is lost: its jobs step without guesses until another
 * draft worker is fed their sequence from the start. */
void drafting_lost(broker *b, int wi);

/* j lets go of its draft worker (it ends). */
void drafting_release(broker *b, bjob *j);

#endif
