/* Worker choice (choose.c): the worker to take a job, -1 when none has
 * room. */
#ifndef TOKPIPED_CHOOSE_H
#define TOKPIPED_CHOOSE_H

#include "state.h"

int choose_tokenize(broker *b, bool alone);
int choose_forward(broker *b);
bool choose_forward_can_take(broker *b, int i);   /* a forward worker with room for a new job */
int choose_sample(broker *b, int f);
int choose_stop(broker *b);
int choose_draft(broker *b);   /* the least loaded draft worker with room, -1 none */

#endif
