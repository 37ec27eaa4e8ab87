/* The step cycle: building STEPs, consuming results (step.c). */
#ifndef TOKPIPED_STEP_H
#define TOKPIPED_STEP_H

#include "state.h"

void step_run(broker *b);
void step_on_result(broker *b, int wi, const tp_msg *m);
void step_free(broker *b);

#endif
