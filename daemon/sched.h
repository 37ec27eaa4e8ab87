/* One pass of the schedule (recover, admit, steps) and where stage
 * results go (sched.c). */
#ifndef TOKPIPED_SCHED_H
#define TOKPIPED_SCHED_H

#include "state.h"

void sched_run(broker *b);
void sched_on_result(broker *b, int wi, const tp_msg *m);

#endif
