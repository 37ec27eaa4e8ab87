/* Admission and queues: tokenize dispatch, first pinning (admit.c). */
#ifndef TOKPIPED_ADMIT_H
#define TOKPIPED_ADMIT_H

#include "state.h"

void admit_start(broker *b, bjob *j);
void admit_waiting(broker *b);
void admit_on_tokenized(broker *b, int wi, const tp_msg *m);

#endif
