/* Lost workers: moving and replaying jobs, poison jobs (recover.c). */
#ifndef TOKPIPED_RECOVER_H
#define TOKPIPED_RECOVER_H

#include "state.h"

void recover_run(broker *b, int64_t now);
/* died: the worker's process ended (its connection closed, or it said
 * DISCONNECT), which is what a job that crashes workers does, or it hung
 * in the middle of a task (bworker.hung: past its step deadline, or silent
 * while it owed an answer); a re-registered worker's loss, or a silent
 * one's that owed nothing, counts against no job (recover.c). */
void recover_worker_lost(broker *b, int wi, const char *cause, bool died);
void recover_lose(broker *b, int wi, const char *why, bool died);
void recover_reap(broker *b);
void recover_lost_finish(broker *b, int64_t now);

#endif
